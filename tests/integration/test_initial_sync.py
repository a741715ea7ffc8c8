"""Initial sync, too-stale handling and resync on real member processes.

A member added by replSetReconfig, a member whose dbpath was emptied, and a member
too stale to catch up all clone their data from a sync source (STARTUP2 ->
SECONDARY) and end with exactly the primary's collections, indexes and documents
(compared as raw BSON). An initial sync killed half-way starts over after a
restart; `resync` (command and CLI) copies the old data aside first and is
refused on the primary.
"""

from __future__ import annotations

import glob
import os
import shutil
import sqlite3
import subprocess
import sys
import threading
from typing import Any

import bson
import pytest
from bson.codec_options import CodecOptions
from bson.raw_bson import RawBSONDocument
from pymongo import MongoClient, ReadPreference, WriteConcern
from pymongo.errors import NotPrimaryError, OperationFailure, PyMongoError

from tests.support.members import REPO_ROOT, Member, wait_for
from tests.support.replica_set import ReplicaSet, make_replica_set

STARTUP2, SECONDARY, RECOVERING = 5, 2, 3
RAW = CodecOptions(document_class=RawBSONDocument)


# -- helpers ----------------------------------------------------------------------------------------

def _load(client: MongoClient[dict[str, Any]]) -> None:
    """A few thousand documents in several collections and databases, a unique and a plain
    secondary index, and session records (retryable writes) in config.transactions."""
    app = client.app
    app.users.create_index("email", unique=True)
    app.users.create_index([("age", 1), ("name", -1)], name="age_name")
    app.users.insert_many([{"_id": i, "email": f"u{i}@x", "age": i % 90, "name": f"n{i}"} for i in range(2000)])
    app.items.insert_many([{"sku": f"s{i}", "qty": i, "tags": ["a", "b"][: i % 3]} for i in range(3000)])
    client.other.events.insert_many([{"_id": f"e{i}", "at": i, "payload": {"k": [i, str(i)]}} for i in range(500)])
    with client.start_session() as session:
        for i in range(20):
            app.users.update_one({"_id": i}, {"$inc": {"age": 1}}, session=session)


def _read(client: MongoClient[dict[str, Any]]) -> dict[str, Any]:
    """Every replicated collection's options, indexes and documents (raw BSON, by _id)."""
    snapshot: dict[str, Any] = {}
    for db_name in sorted(client.list_database_names()):
        if db_name == "local":
            continue
        db = client.get_database(db_name, codec_options=RAW)
        for info in sorted(client[db_name].list_collections(), key=lambda i: i["name"]):
            coll = db[info["name"]]
            snapshot[f"{db_name}.{info['name']}"] = {
                "options": info["options"],
                "indexes": sorted((dict(i) for i in client[db_name][info["name"]].list_indexes()),
                                  key=lambda i: i["name"]),
                "documents": sorted((doc.raw for doc in coll.find()), key=lambda raw: bson.encode(
                    {"k": bson.decode(raw)["_id"]})),
            }
    return snapshot


def _assert_same_data(rs: ReplicaSet, member: Member) -> None:
    primary = rs.wait_primary()
    # w: all members: every write so far is applied on `member` once this returns.
    rs.client().app.marker.with_options(write_concern=WriteConcern(w=len(rs.members), wtimeout=20_000)) \
        .insert_one({"n": len(rs.members)})
    with primary.direct_client() as p, member.direct_client(read_preference=ReadPreference.SECONDARY_PREFERRED) as m:
        theirs, ours = _read(p), _read(m)
    assert sorted(ours) == sorted(theirs)
    for ns in theirs:
        assert ours[ns] == theirs[ns], ns
    assert "config.transactions" in ours and ours["config.transactions"]["documents"]


def _uuids(member: Member) -> dict[str, Any]:
    with member.direct_client() as client:
        return {f"{db}.{info['name']}": info["info"]["uuid"] for db in client.list_database_names() if db != "local"
                for info in client[db].list_collections()}


def _my_status(rs: ReplicaSet, member: Member) -> dict[str, Any]:
    status = rs.status(member)
    return next(m for m in status["members"] if m.get("self")) | {"_status": status}


class Writer(threading.Thread):
    """Keeps inserting, updating (unique key included) and deleting until stopped."""

    def __init__(self, uri: str) -> None:
        super().__init__(daemon=True)
        self.uri = uri
        self.stop_event = threading.Event()
        self.done = 0
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            with MongoClient(self.uri, serverSelectionTimeoutMS=10_000) as client:
                app = client.app
                n = 0
                while not self.stop_event.is_set():
                    n += 1
                    app.live.insert_one({"_id": n, "at": n})
                    app.users.update_one({"_id": n % 2000}, {"$set": {"email": f"w{n}@x"}, "$inc": {"age": 1}})
                    app.items.delete_one({"qty": n})
                    self.done += 1
        except BaseException as exc:  # reported by the test
            self.error = exc

    def finish(self) -> int:
        self.stop_event.set()
        self.join(30)
        if self.error is not None:
            raise self.error
        return self.done


def _new_member(tmp_path: Any, name: str, *extra: str) -> Member:
    return Member(dbpath=str(tmp_path / name), extra_args=["--enableTestCommands", *extra])


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "replset", *args], capture_output=True, text=True, timeout=120,
                          cwd=REPO_ROOT)


@pytest.fixture()
def pair(tmp_path: Any) -> Any:
    """A two-member set holding the data of `_load`; extra members the test starts join `members`."""
    rs = make_replica_set(str(tmp_path / "set"), 2)
    try:
        rs.start()
        rs.initiate()
        _load(rs.client())
        yield rs
    finally:
        rs.stop()


# -- tests ------------------------------------------------------------------------------------------

def test_added_member_clones_while_writes_go_on(pair: ReplicaSet, tmp_path: Any) -> None:
    rs = pair
    primary = rs.wait_primary()
    new = _new_member(tmp_path, "new")
    new.start()
    rs.fail_point(new, "initialSyncHangBeforeCopyingDatabases", "alwaysOn")
    rs.add_member(new)
    status = wait_for(lambda: (s := rs.status(new))["myState"] == STARTUP2
                      and "initialSyncOplogStart" in s.get("initialSyncStatus", {}) and s, 30, "STARTUP2")
    assert status["initialSyncStatus"]["failedInitialSyncAttempts"] == 0
    assert _my_status(rs, new)["syncSourceHost"] in {m.host for m in rs.members[:2]}
    # The primary sees the new member in STARTUP2; the CLI asks it for its progress.
    wait_for(lambda: any(m["name"] == new.host and m["stateStr"] == "STARTUP2"
                         for m in rs.status(primary)["members"]), 10, "the primary to see STARTUP2")
    table = _cli("status", "--host", primary.host)
    assert table.returncode == 0, table.stderr
    assert f"initial sync {new.host}" in table.stdout and "[" in table.stdout
    # Writes go on from before the clone starts until after it ends (slowed down by latency).
    writer = Writer(rs.uri)
    writer.start()
    wait_for(lambda: writer.done >= 20, 20, "writes before the clone")
    rs.fail_point(new, "peerLatency", "alwaysOn", {"host": primary.host, "delayMs": 30})
    rs.fail_point(new, "initialSyncHangBeforeCopyingDatabases", "off")
    final = rs.wait_state(new, SECONDARY, 60)
    rs.fail_point(new, "peerLatency", "off")
    writes = writer.finish()
    assert writes > 20
    done = final["initialSyncStatus"]
    assert done["initialSyncAttempts"][-1]["status"] == "OK"
    assert done["approxTotalBytesCopied"] > 0 and "initialSyncEnd" in done
    assert done["appliedOps"] > 0 and done["initialSyncOplogEnd"] > done["initialSyncOplogStart"]
    databases = done["databases"]
    assert databases["databasesCloned"] == databases["databasesToClone"] >= 3  # app, config, other
    assert databases["app"]["app.users"]["documentsCopied"] >= 2000
    _assert_same_data(rs, new)
    # Cloned collections keep their sync source's UUIDs.
    source = next(m for m in rs.members if m.host == done["initialSyncAttempts"][-1]["syncSource"])
    theirs, ours = _uuids(source), _uuids(new)
    for ns in ("app.users", "app.items", "other.events", "config.transactions"):
        assert ours[ns] == theirs[ns], ns
    with new.direct_client(read_preference=ReadPreference.SECONDARY_PREFERRED) as client:
        assert client.app.live.count_documents({}) >= writes  # writes made during the sync are there


def test_killed_during_initial_sync_starts_over_after_restart(pair: ReplicaSet, tmp_path: Any) -> None:
    rs = pair
    new = _new_member(tmp_path, "new")
    new.start()
    rs.fail_point(new, "initialSyncHangDuringCollectionClone", "alwaysOn",
                  {"namespace": "app.items", "numDocsToClone": 100})
    rs.add_member(new)

    def half_cloned() -> bool:
        databases = rs.status(new).get("initialSyncStatus", {}).get("databases", {})
        return databases.get("app", {}).get("app.items", {}).get("documentsCopied", 0) >= 100

    wait_for(half_cloned, 30, "the clone to stop half-way through app.items")
    new.kill()
    # On disk: the initial-sync flag and a partial copy.
    db = sqlite3.connect(f"file:{os.path.join(new.dbpath, 'replset.sqlite3')}?mode=ro", uri=True)
    try:
        assert db.execute("SELECT count(*) FROM meta WHERE key='initialSync'").fetchone()[0] == 1
    finally:
        db.close()
    new.start()
    rs.wait_state(new, SECONDARY, 60)
    assert "an interrupted initial sync starts over" in new.read_log()
    assert not os.path.exists(os.path.join(new.dbpath, "rollback"))  # a partial copy is not data to keep
    _assert_same_data(rs, new)


def test_emptied_dbpath_initial_syncs(pair: ReplicaSet) -> None:
    rs = pair
    primary = rs.wait_primary()
    secondary = next(m for m in rs.members if m is not primary)
    secondary.stop()
    shutil.rmtree(secondary.dbpath)
    secondary.start()
    rs.wait_state(secondary, SECONDARY, 60)
    assert "this member has no data" in secondary.read_log()
    assert not os.path.exists(os.path.join(secondary.dbpath, "rollback"))
    _assert_same_data(rs, secondary)


def test_too_stale_member_says_so_then_resyncs_keeping_its_old_data(tmp_path: Any) -> None:
    rs = make_replica_set(str(tmp_path), 3, extra_args=("--oplogSizeMB", "1"))
    try:
        rs.start()
        primary = rs.initiate()
        client = rs.client()
        _load(client)
        stale = next(m for m in rs.members if m is not primary)
        client.app.marker.with_options(write_concern=WriteConcern(w=3, wtimeout=20_000)).insert_one({"_id": "x"})
        stale_last = rs.status(stale)["optimes"]["appliedOpTime"]
        stale.stop()
        # Far more than the 1 MB oplogs hold: both other members trim past the stopped member's last entry.
        blob = "x" * 1000
        for first in range(0, 4000, 500):
            client.app.bulk.insert_many([{"_id": i, "b": blob} for i in range(first, first + 500)])

        def trimmed_everywhere() -> bool:
            for m in rs.members:
                if m is stale:
                    continue
                with m.direct_client() as c:
                    oldest = c.local["oplog.rs"].find().sort("$natural", 1).limit(1).next()
                if oldest["ts"] <= stale_last["ts"]:
                    return False
            return True

        wait_for(trimmed_everywhere, 30, "both oplogs to trim past the stopped member")
        stale.start()
        recovering = wait_for(lambda: (me := _my_status(rs, stale))["state"] == RECOVERING and me, 30,
                              "RECOVERING")
        assert "too stale to catch up" in recovering["infoMessage"]
        assert "replset resync" in recovering["infoMessage"]
        assert "too stale" in recovering["_status"]["infoMessage"]
        # The primary sees it RECOVERING; reads on it are refused meanwhile.
        wait_for(lambda: any(m["name"] == stale.host and m["stateStr"] == "RECOVERING"
                             for m in rs.status(primary)["members"]), 10, "the primary to see RECOVERING")
        with stale.direct_client(read_preference=ReadPreference.SECONDARY_PREFERRED,
                                 serverSelectionTimeoutMS=500) as c:
            with pytest.raises(PyMongoError, match="not in primary or recovering state"):  # 13436
                c.app.users.find_one()
        with stale.direct_client(serverSelectionTimeoutMS=2000) as c, \
                pytest.raises(NotPrimaryError) as refused:   # nor inserts into parts tables
            c.app.command({"insertBlock": "events", "rows": [{"n": 1}]})
        assert refused.value.details["code"] == 13436, refused.value.details
        # After the bounded delay (three election timeouts) it resyncs by itself.
        rs.wait_state(stale, SECONDARY, 90)
        backups = glob.glob(os.path.join(stale.dbpath, "rollback", "resync-*", "replset.sqlite3"))
        assert len(backups) == 1
        kept = sqlite3.connect(f"file:{backups[0]}?mode=ro", uri=True)
        try:
            last_key = kept.execute("SELECT max(ts) FROM oplog").fetchone()[0]
        finally:
            kept.close()
        assert last_key == (stale_last["ts"].time << 32) | stale_last["ts"].inc  # the old data, as it was
        _assert_same_data(rs, stale)
    finally:
        rs.stop()


def test_resync_command_and_cli(pair: ReplicaSet) -> None:
    rs = pair
    primary = rs.wait_primary()
    secondary = next(m for m in rs.members if m is not primary)
    with pytest.raises(OperationFailure) as refused:
        rs.direct(primary).admin.command("resync")
    assert refused.value.code == 95 and "primaries cannot resync" in str(refused.value)
    cli_refused = _cli("resync", "--host", primary.host)
    assert cli_refused.returncode == 1 and "(code 95)" in cli_refused.stderr

    # The command waits for the initial sync by default; the old data is copied aside first.
    reply = rs.direct(secondary).admin.command("resync")
    assert reply["ok"] == 1.0 and reply["info"] == "initial sync done"
    assert reply["previousDataCopiedTo"].startswith(os.path.join(secondary.dbpath, "rollback", "resync-"))
    assert os.path.getsize(reply["previousDataCopiedTo"]) > 0
    assert rs.status(secondary)["myState"] == SECONDARY
    _assert_same_data(rs, secondary)

    # The CLI shows progress until the member is SECONDARY again.
    result = _cli("resync", "--host", secondary.host)
    assert result.returncode == 0, result.stderr
    assert f"{secondary.host}: resync started" in result.stdout
    assert f"{secondary.host}: SECONDARY again" in result.stdout
    assert len(glob.glob(os.path.join(secondary.dbpath, "rollback", "resync-*"))) == 2
    _assert_same_data(rs, secondary)


def test_resync_is_refused_before_initiate(tmp_path: Any) -> None:
    member = _new_member(tmp_path, "lonely")
    member.start()
    try:
        with member.direct_client() as client:
            with pytest.raises(PyMongoError) as err:
                client.admin.command("resync")
        assert getattr(err.value, "code", None) == 94
    finally:
        member.stop()
