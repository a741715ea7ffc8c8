"""`replset status` formatting, and `replset up` supervising a real three-member set."""

from __future__ import annotations

import datetime
import os
import signal
import subprocess
import sys
from typing import Any

import pytest
from bson import json_util
from bson.timestamp import Timestamp
from pymongo import MongoClient

from replset.cli import MAX_RESTART_DELAY_S, MIN_RESTART_DELAY_S, format_status, restart_delay
from replset.dbpath_lock import EXIT_DBPATH_IN_USE, LOCK_FILE
from tests.support.members import REPO_ROOT, Member, free_port, wait_for
from tests.support.replica_set import ReplicaSet
from tests.support.up_process import Output, free_base_port, gone, listening


def _optime(secs: int, inc: int, term: int = 1) -> dict[str, Any]:
    return {"ts": Timestamp(secs, inc), "t": term}


def _when(secs: int) -> datetime.datetime:
    return datetime.datetime.fromtimestamp(secs, datetime.UTC).replace(tzinfo=None)


# Seen from the primary of a 3-member set started by `replset up`, while the member on 41019 was
# SIGSTOPped and a write had been made after that (field names and values as the server returned them).
PRIMARY_VIEW: dict[str, Any] = {
    "set": "rs0", "date": _when(1795423403), "myState": 1, "term": 1,
    "syncSourceHost": "", "syncSourceId": -1, "heartbeatIntervalMillis": 2000,
    "majorityVoteCount": 2, "writeMajorityCount": 2, "votingMembersCount": 3, "writableVotingMembersCount": 3,
    "optimes": {"lastCommittedOpTime": _optime(1795423387, 3), "lastCommittedWallTime": _when(1795423387),
                "readConcernMajorityOpTime": _optime(1795423387, 3),
                "appliedOpTime": _optime(1795423387, 3), "durableOpTime": _optime(1795423387, 3)},
    "members": [
        {"_id": 0, "name": "127.0.0.1:41017", "health": 1.0, "state": 1, "stateStr": "PRIMARY", "uptime": 29,
         "optime": _optime(1795423387, 3), "optimeDate": _when(1795423387), "syncSourceHost": "",
         "syncSourceId": -1, "infoMessage": "", "electionDate": _when(1795423373), "configVersion": 1,
         "configTerm": 1, "self": True, "lastHeartbeatMessage": ""},
        {"_id": 1, "name": "127.0.0.1:41018", "health": 1.0, "state": 2, "stateStr": "SECONDARY",
         "optime": _optime(1795423387, 3), "optimeDurable": _optime(1795423387, 3),
         "optimeDate": _when(1795423387), "lastHeartbeat": _when(1795423401), "pingMs": 1,
         "lastHeartbeatMessage": "", "syncSourceHost": "127.0.0.1:41017", "syncSourceId": 0,
         "infoMessage": "", "configVersion": 1, "configTerm": 1},
        {"_id": 2, "name": "127.0.0.1:41019", "health": 0.0, "state": 8, "stateStr": "(not reachable/healthy)",
         "optime": _optime(1795423373, 2), "optimeDurable": _optime(1795423373, 2),
         "optimeDate": _when(0), "lastHeartbeat": _when(1795423387), "pingMs": 1,
         "lastHeartbeatMessage": "127.0.0.1:41019: TimeoutError: ", "syncSourceHost": "127.0.0.1:41017",
         "syncSourceId": 0, "infoMessage": "", "configVersion": 1, "configTerm": 1},
    ],
    "ok": 1.0,
}


def test_status_table_from_the_primary() -> None:
    assert format_status(PRIMARY_VIEW).splitlines() == [
        "set:          rs0",
        "term:         1",
        "my state:     PRIMARY (127.0.0.1:41017)",
        "commit point: 1795423387.3 (term 1)",
        "",
        "name               state                    health  optime        lag s  ping ms  sync source"
        "      last heartbeat message",
        "127.0.0.1:41017 *  PRIMARY                       1  1795423387.3      0",
        "127.0.0.1:41018    SECONDARY                     1  1795423387.3      0        1  127.0.0.1:41017",
        "127.0.0.1:41019    (not reachable/healthy)       0  1795423373.2     14        1  127.0.0.1:41017"
        "  127.0.0.1:41019: TimeoutError:",
    ]


def test_status_table_without_a_primary() -> None:
    """A secondary that sees no primary: lag is '-', and a member never heard from shows '-' as optime."""
    members = [
        {"_id": 0, "name": "127.0.0.1:41017", "health": 0.0, "state": 8, "stateStr": "(not reachable/healthy)",
         "optime": _optime(1795423387, 3), "pingMs": 0, "lastHeartbeatMessage": "", "syncSourceHost": ""},
        {"_id": 1, "name": "127.0.0.1:41018", "health": 1.0, "state": 2, "stateStr": "SECONDARY",
         "optime": _optime(1795423387, 3), "syncSourceHost": "", "self": True, "lastHeartbeatMessage": ""},
        {"_id": 2, "name": "127.0.0.1:41019", "health": 0.0, "state": 8, "stateStr": "(not reachable/healthy)",
         "optime": _optime(0, 0, -1), "pingMs": 0, "lastHeartbeatMessage": "", "syncSourceHost": ""},
    ]
    status = {"set": "rs0", "myState": 2, "term": 2,
              "optimes": {"lastCommittedOpTime": _optime(1795423387, 3)}, "members": members}
    lines = format_status(status).splitlines()
    assert lines[2] == "my state:     SECONDARY (127.0.0.1:41018)"
    assert lines[5].split() == ["name", "state", "health", "optime", "lag", "s", "ping", "ms", "sync", "source"]
    rows = [line.split("  ") for line in lines[6:]]
    cells = [[c.strip() for c in row if c.strip()] for row in rows]
    assert cells == [
        ["127.0.0.1:41017", "(not reachable/healthy)", "0", "1795423387.3", "-", "0"],
        ["127.0.0.1:41018 *", "SECONDARY", "1", "1795423387.3", "-"],
        ["127.0.0.1:41019", "(not reachable/healthy)", "0", "-", "-", "0"],
    ]


def test_a_second_process_on_a_data_directory_exits_at_once_and_a_killed_one_leaves_no_lock(tmp_path: Any) -> None:
    first = Member(dbpath=str(tmp_path / "m"))
    rs = ReplicaSet([first])
    rs.start()
    try:
        rs.initiate()
        rs.direct(first).app.things.insert_one({"_id": 1})
        assert first.process is not None
        lock_file = tmp_path / "m" / LOCK_FILE
        assert lock_file.read_text().strip() == str(first.process.pid)
        second = subprocess.run(
            [sys.executable, "-m", "replset", "node", "--port", str(free_port()), "--httpPort", str(free_port()),
             "--replSet", "rs0", "--dbpath", str(tmp_path / "m")],
            capture_output=True, text=True, cwd=REPO_ROOT, timeout=60)
        assert second.returncode == EXIT_DBPATH_IN_USE
        assert f"pid {first.process.pid}" in second.stderr and "DBPathInUse" in second.stderr
        assert rs.direct(first).app.things.find_one() == {"_id": 1}
        first.kill()  # kill -9: the OS lets the lock go; the file still names the dead pid
        first.start()
        rs.wait_primary()
        assert rs.direct(first).app.things.find_one() == {"_id": 1}
        rs.stop()
        assert lock_file.read_text() == ""  # a clean shutdown empties it, as mongod's
    finally:
        rs.stop()


def test_restart_delay_doubles_up_to_the_cap_and_resets_after_a_stable_run() -> None:
    delay = None
    delays = []
    for _ in range(8):
        delay = restart_delay(delay, uptime_s=2)
        delays.append(delay)
    assert delays == [1, 2, 4, 8, 16, 30, 30, 30]
    assert delays[0] == MIN_RESTART_DELAY_S and delays[-1] == MAX_RESTART_DELAY_S
    assert restart_delay(30, uptime_s=60) == MIN_RESTART_DELAY_S
    assert restart_delay(4, uptime_s=59.9) == 8


# -- `replset up` with a real set ------------------------------------------------------------------------

def _direct(port: int) -> MongoClient[dict[str, Any]]:
    return MongoClient(f"mongodb://127.0.0.1:{port}/?directConnection=true", serverSelectionTimeoutMS=1000)


def _command(port: int, name: str) -> dict[str, Any]:
    with _direct(port) as client:
        return dict(client.admin.command(name))


def test_up_restarts_a_killed_member_and_stops_all_on_sigint(tmp_path: Any) -> None:
    base = free_base_port(3)
    ports = [base, base + 1, base + 2]
    up = subprocess.Popen(
        [sys.executable, "-m", "replset", "up", "--nodes", "3", "--port", str(base), "--dir", str(tmp_path)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=REPO_ROOT,
        start_new_session=True)  # its own process group, which the members share: the cleanup kills it
    out = Output(up.stdout)
    pids: set[int] = set()
    try:
        wait_for(lambda: out.has("connection string") or up.poll() is not None, 60, "`up` to report the set")
        assert up.poll() is None, f"`up` exited early:\n{out}"
        hosts = ",".join(f"127.0.0.1:{p}" for p in ports)
        assert out.has(f"connection string: mongodb://{hosts}/?replicaSet=rs0")
        # "is up" only once every member is PRIMARY or SECONDARY: a w:3 write right after it is acknowledged.
        states = [_command(p, "replSetGetStatus")["myState"] for p in ports]
        assert sorted(states) == [1, 2, 2], f"`up` said the set is up with member states {states}:\n{out}"

        for p in ports:
            wait_for(lambda p=p: _command(p, "replSetGetStatus")["myState"] in (1, 2), 30, f"{p} to join")
        pid_of = {p: int(_command(p, "serverStatus")["pid"]) for p in ports}
        pids.update(pid_of.values())
        victim = next(p for p in ports if _command(p, "hello").get("secondary"))

        # The table and the JSON form of `replset status`, from the real set.
        # The victim may have joined a moment before its first heartbeat reply from the new primary.
        wait_for(lambda: any(m["stateStr"] == "PRIMARY" for m in _command(victim, "replSetGetStatus")["members"]),
                 10, "the victim to see the primary")
        table = subprocess.run([sys.executable, "-m", "replset", "status", "--host", f"127.0.0.1:{victim}"],
                               capture_output=True, text=True, cwd=REPO_ROOT, timeout=30, check=True).stdout
        assert "my state:     SECONDARY" in table
        assert f"127.0.0.1:{victim} *" in table and "PRIMARY" in table
        raw = subprocess.run(
            [sys.executable, "-m", "replset", "status", "--host", f"127.0.0.1:{victim}", "--json"],
            capture_output=True, text=True, cwd=REPO_ROOT, timeout=30, check=True).stdout
        doc = json_util.loads(raw)
        assert doc["set"] == "rs0" and doc["myState"] == 2 and len(doc["members"]) == 3
        assert '"$timestamp"' in raw

        os.kill(pid_of[victim], signal.SIGKILL)
        wait_for(lambda: out.has(f"member on port {victim} exited with code -9; restarting in 1 s"), 10,
                 "`up` to report the killed member")

        def restarted() -> bool:
            new_pid = int(_command(victim, "serverStatus")["pid"])
            pids.add(new_pid)
            return new_pid != pid_of[victim]

        wait_for(restarted, 20, f"member {victim} to be restarted")
        assert _command(victim, "ping")["ok"] == 1
        wait_for(lambda: _command(victim, "replSetGetStatus")["myState"] == 2, 20, f"{victim} to be SECONDARY")
        primary = next(p for p in ports if _command(p, "hello").get("isWritablePrimary"))

        def primary_sees_it() -> bool:
            row = next(m for m in _command(primary, "replSetGetStatus")["members"]
                       if m["name"] == f"127.0.0.1:{victim}")
            return row["stateStr"] == "SECONDARY" and row["health"] == 1
        wait_for(primary_sees_it, 20, f"the primary to see {victim} as a healthy SECONDARY")

        # A second `up` on the same directory: its members find their data directories locked,
        # exit at once, are not restarted, and it gives up; the running set is untouched.
        second = subprocess.run(
            [sys.executable, "-m", "replset", "up", "--nodes", "3", "--port", str(base), "--dir", str(tmp_path)],
            capture_output=True, text=True, cwd=REPO_ROOT, timeout=60)
        assert second.returncode == 1, second.stdout + second.stderr
        assert second.stdout.count("is in use by another process (DBPathInUse); not restarting it") == 3
        assert "is another `replset up` running there?" in second.stderr
        assert all(_command(p, "ping")["ok"] == 1 for p in ports)

        up.send_signal(signal.SIGINT)
        assert up.wait(timeout=30) == 0, str(out)
        assert all(gone(pid) for pid in pids), f"members left running: {[p for p in pids if not gone(p)]}"
        with pytest.raises(ProcessLookupError):
            os.killpg(up.pid, 0)  # nothing is left in the process group `up` led
        assert not any(listening(p) for p in ports)
    finally:
        try:
            os.killpg(up.pid, signal.SIGKILL)  # `up` and its members, if anything is left
        except ProcessLookupError:
            pass
        up.wait(10)
        for pid in pids:  # members never leave the group; this is only a last resort
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        out.join(10)
        if up.stdout is not None:
            up.stdout.close()
