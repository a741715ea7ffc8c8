"""Parts tables across members: inserts on any member, the registry of who holds which part, quorum
inserts (reached, pending then reached, through a chain), and insertStatus."""

from __future__ import annotations

import datetime
import urllib.error
import urllib.request
from typing import Any

import pyarrow as pa
import pytest
from bson import json_util
from pymongo import ReadPreference

from tests.support.members import Member, free_port, wait_for
from tests.support.parts import part_dirs
from tests.support.replica_set import ReplicaSet

EVENTS = {"columns": [{"name": "ts", "type": "timestamp[ms]"}, {"name": "user", "type": "string"},
                      {"name": "n", "type": "int64", "default": 0}],
          "partitionBy": "toYYYYMM(ts)", "orderBy": ["user", "ts"]}


def _rows(n: int, month: int = 5, salt: int = 0) -> list[dict[str, Any]]:
    return [{"ts": datetime.datetime(2024, month, 1 + i % 28), "user": f"u{i % 7}", "n": i + salt}
            for i in range(n)]


def _state(rs: ReplicaSet, member: Member, db: str, coll: str) -> Any:
    return rs.direct(member)[db].get_collection(coll, read_preference=ReadPreference.SECONDARY_PREFERRED)


def _holders(rs: ReplicaSet, member: Member, db: str, part: str) -> set[str]:
    return {d["member"] for d in _state(rs, member, db, "system.parts.events.replicas").find({"part": part})}


def _secondaries(rs: ReplicaSet) -> list[Member]:
    primary = rs.wait_primary()
    return [m for m in rs.members if m is not primary]


def test_an_insert_on_a_secondary_reaches_every_member_and_every_holder_is_registered(rs: ReplicaSet) -> None:
    rs.client().sec.command({"createPartsTable": "events", **EVENTS})
    secondary = _secondaries(rs)[0]
    reply = rs.direct(secondary).sec.command({"insertBlock": "events", "rows": _rows(30)})
    assert reply["inserted"] == 1 and reply["deduplicated"] == 0
    part = reply["blocks"][0]["part"]
    assert part == "202405_1_1_0"
    assert part_dirs(secondary, "sec.events") == [part]   # published where it was written, before the reply
    log = _state(rs, rs.wait_primary(), "sec", "system.parts.events.log").find_one({"part": part})
    assert log["source"] == secondary.host   # the others fetch it from the member that wrote it
    for member in rs.members:
        wait_for(lambda m=member: part_dirs(m, "sec.events") == [part], 20, f"{part} on {member.host}")
    # Every member that fetched the part reported it upstream; the primary registered it.
    everyone = {m.host for m in rs.members}
    for member in rs.members:
        wait_for(lambda m=member: _holders(rs, m, "sec", part) == everyone, 20, f"the registry on {member.host}")


def test_the_same_block_on_two_members_is_one_part_everywhere(rs: ReplicaSet) -> None:
    rs.client().dup.command({"createPartsTable": "events", **EVENTS})
    primary, secondary = rs.wait_primary(), _secondaries(rs)[1]
    rows = _rows(25, 7)
    first = rs.direct(secondary).dup.command({"insertBlock": "events", "rows": rows})
    second = rs.direct(primary).dup.command({"insertBlock": "events", "rows": list(reversed(rows))})
    assert first["inserted"] == 1 and second["deduplicated"] == 1
    assert second["blocks"][0]["part"] == first["blocks"][0]["part"]
    for member in rs.members:
        wait_for(lambda m=member: part_dirs(m, "dup.events") == ["202407_1_1_0"], 20, f"one part on {member.host}")
    status = rs.direct(secondary).dup.command({"insertStatus": "events",
                                               "blockIds": [first["blocks"][0]["blockId"], "nope"]})
    assert [b["status"] for b in status["blocks"]] == ["committed", "unknown"] and not status["allReached"]


def test_the_dedup_window_keeps_the_newest_blocks_only(rs: ReplicaSet) -> None:
    """A window of 2 blocks: the newest two are duplicates when sent again, an older one is a new part
    (ClickHouse's replicated_deduplication_window); the primary removes keys that fell out, and a
    retry of the newest from a secondary is still deduplicated after a restart of that secondary."""
    rs.client().win.command({"createPartsTable": "events", **EVENTS,
                             "settings": {"replicatedDeduplicationWindow": 2}})
    primary, secondary = rs.wait_primary(), _secondaries(rs)[0]
    db = rs.direct(primary).win
    for token in ("a", "b", "c"):
        assert db.command({"insertBlock": "events", "rows": _rows(3), "dedupToken": token})["inserted"] == 1
    again = {t: db.command({"insertBlock": "events", "rows": _rows(3), "dedupToken": t}) for t in ("c", "b")}
    assert again["c"]["deduplicated"] == 1 and again["b"]["deduplicated"] == 1
    old = db.command({"insertBlock": "events", "rows": _rows(3), "dedupToken": "a"})
    assert old["inserted"] == 1, old   # out of the window: a new part, not a duplicate
    assert len({b["blocks"][0]["part"] for b in (old, again["b"], again["c"])}) == 3
    keys = _state(rs, primary, "win", "system.parts.events.blocks")
    wait_for(lambda: keys.count_documents({}) == 2, 20, "the keys out of the window to be removed")
    newest = old["blocks"][0]["blockId"]
    assert {k["_id"] for k in keys.find()} == {newest, again["c"]["blocks"][0]["blockId"]}
    secondary.stop()
    secondary.start()
    retried = rs.direct(secondary).win.command({"insertBlock": "events", "rows": _rows(3), "dedupToken": "a"})
    assert retried["deduplicated"] == 1 and retried["blocks"][0]["part"] == old["blocks"][0]["part"]
    assert sum(1 for _ in rs.direct(primary).win.cursor_command("selectParts", "events", columns=["n"])) == 4 * 3


def test_a_quorum_insert_on_a_secondary_is_reached(rs: ReplicaSet) -> None:
    rs.client().quo.command({"createPartsTable": "events", **EVENTS})
    secondary = _secondaries(rs)[0]
    reply = rs.direct(secondary).quo.command({"insertBlock": "events", "rows": _rows(10), "insertQuorum": 3,
                                              "dedupToken": "batch-1", "quorumTimeoutMS": 20_000})
    assert reply["quorumStatus"] == "reached" and reply["blocks"][0]["quorumStatus"] == "reached"
    part = reply["blocks"][0]["part"]
    assert _holders(rs, secondary, "quo", part) == {m.host for m in rs.members}
    status = rs.direct(rs.wait_primary()).quo.command({"insertStatus": "events", "dedupToken": "batch-1"})
    assert status["blocks"] == [{"blockId": reply["blocks"][0]["blockId"], "status": "reached", "part": part}]
    # The same token again: a duplicate, and its quorum is already there.
    again = rs.direct(secondary).quo.command({"insertBlock": "events", "rows": _rows(10), "insertQuorum": 3,
                                              "dedupToken": "batch-1", "quorumTimeoutMS": 20_000})
    assert again["deduplicated"] == 1 and again["quorumStatus"] == "reached"


def _cut_fetches(rs: ReplicaSet, member: Member) -> None:
    """`member` stays alive (its heartbeats answer: it counts as a live replica) but fetches no part: its
    fetches from every other member go to a closed port."""
    dead = f"127.0.0.1:{free_port()}"
    rs.fail_point(member, "peerRoutes", "alwaysOn",
                  {"routes": {f"127.0.0.1:{m.http_port}": dead for m in rs.members if m is not member}})


def test_a_quorum_with_a_replica_that_cannot_fetch_is_pending_then_reached(rs3: ReplicaSet) -> None:
    rs3.client().pq.command({"createPartsTable": "events", **EVENTS})
    primary = rs3.wait_primary()
    s1, s2 = [m for m in rs3.members if m is not primary]
    _cut_fetches(rs3, s2)
    try:
        reply = rs3.direct(s1).pq.command({"insertBlock": "events", "rows": _rows(12), "insertQuorum": 3,
                                           "quorumTimeoutMS": 1500})
        assert reply["quorumStatus"] == "pending" and reply["inserted"] == 1   # committed; not yet on 3
        block = reply["blocks"][0]["blockId"]
        status = rs3.direct(primary).pq.command({"insertStatus": "events", "blockIds": [block]})
        assert status["blocks"][0]["status"] == "pending"
    finally:
        rs3.fail_point(s2, "peerRoutes", "off")

    def reached() -> bool:
        answer = rs3.direct(s1).pq.command({"insertStatus": "events", "blockIds": [block]})
        return bool(answer["allReached"])

    wait_for(reached, 30, "the quorum to be reached once the replica fetches again")
    assert part_dirs(s2, "pq.events") == [reply["blocks"][0]["part"]]


def test_a_retry_asking_a_higher_quorum_waits_for_it(rs3: ReplicaSet) -> None:
    """The first insert asked for 2 replicas and got them; its retry (same token) asks for 3 while one
    replica fetches nothing: it is deduplicated, and its quorum is pending - not the first insert's reached."""
    rs3.client().hq.command({"createPartsTable": "events", **EVENTS})
    primary = rs3.wait_primary()
    s1, s2 = [m for m in rs3.members if m is not primary]
    insert = {"insertBlock": "events", "rows": _rows(8), "dedupToken": "hq-1"}
    _cut_fetches(rs3, s2)
    try:
        first = rs3.direct(s1).hq.command({**insert, "insertQuorum": 2, "quorumTimeoutMS": 20_000})
        assert first["quorumStatus"] == "reached"
        again = rs3.direct(s1).hq.command({**insert, "insertQuorum": 3, "quorumTimeoutMS": 1500})
        assert again["deduplicated"] == 1 and again["quorumStatus"] == "pending", again
        status = rs3.direct(primary).hq.command({"insertStatus": "events", "dedupToken": "hq-1", "insertQuorum": 3})
        assert [b["status"] for b in status["blocks"]] == ["pending"]
        as_recorded = rs3.direct(primary).hq.command({"insertStatus": "events", "dedupToken": "hq-1"})
        assert [b["status"] for b in as_recorded["blocks"]] == ["reached"]   # the record: 2 asked, 2 reached
    finally:
        rs3.fail_point(s2, "peerRoutes", "off")

    def reached() -> bool:
        answer = rs3.direct(primary).hq.command({"insertStatus": "events", "dedupToken": "hq-1", "insertQuorum": 3})
        return bool(answer["allReached"])

    wait_for(reached, 30, "three holders once the replica fetches again")


@pytest.mark.parametrize("inserter", ["primary", "tail"])
def test_quorum_3_through_a_chain(rs3: ReplicaSet, inserter: str) -> None:
    primary = rs3.wait_primary()
    s1, s2 = [m for m in rs3.members if m is not primary]
    rs3.client().ch.command({"createPartsTable": "events", **EVENTS})

    def chain_formed() -> bool:
        formed = True
        for member, source in ((s1, primary), (s2, s1)):
            if rs3.sync_source(member) != source.host:
                rs3.direct(member).admin.command("replSetSyncFrom", source.host)
                formed = False
        return formed

    wait_for(chain_formed, 30, "the chain P <- S1 <- S2", interval_s=0.5)
    where = primary if inserter == "primary" else s2
    reply = rs3.direct(where).ch.command({"insertBlock": "events", "rows": _rows(8, 3), "insertQuorum": 3,
                                          "quorumTimeoutMS": 20_000})
    assert reply["quorumStatus"] == "reached"
    assert rs3.sync_source(s2) == s1.host   # S2's acknowledgement went through S1
    for member in rs3.members:
        assert part_dirs(member, "ch.events") == [reply["blocks"][0]["part"]]


def _post(member: Member, path: str, body: bytes, content_type: str) -> tuple[int, dict[str, Any]]:
    request = urllib.request.Request(f"http://127.0.0.1:{member.http_port}{path}", data=body, method="POST",
                                     headers={"Content-Type": content_type})
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, json_util.loads(response.read())
    except urllib.error.HTTPError as err:
        return err.code, json_util.loads(err.read())


def test_inserts_over_http_as_json_lines_and_as_a_large_arrow_stream(rs: ReplicaSet) -> None:
    rs.client().web.command({"createPartsTable": "events", **EVENTS})
    secondary = _secondaries(rs)[0]
    lines = "\n".join(json_util.dumps(r) for r in _rows(5, 9)).encode()
    status, reply = _post(secondary, "/tables/web.events/insert?dedupToken=t1", lines, "application/x-ndjson")
    assert status == 200 and reply["inserted"] == 1 and reply["blocks"][0]["part"] == "202409_1_1_0"
    status, reply = _post(secondary, "/tables/web.events/insert?dedupToken=t1", lines, "application/x-ndjson")
    assert status == 200 and reply["deduplicated"] == 1
    # An Arrow stream far above aiohttp's 1 MiB default body size, with a quorum of every member.
    n = 200_000
    table = pa.table({"ts": pa.array([datetime.datetime(2024, 10, 1 + i % 28) for i in range(n)],
                                     pa.timestamp("ms")),
                      "user": pa.array([f"user-{i}" for i in range(n)]), "n": pa.array(range(n), pa.int64())})
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    body = sink.getvalue().to_pybytes()
    assert len(body) > 4 << 20
    status, reply = _post(secondary, "/tables/web.events/insert?insertQuorum=3&quorumTimeoutMS=30000", body,
                          "application/vnd.apache.arrow.stream")
    assert status == 200 and reply["quorumStatus"] == "reached" and reply["blocks"][0]["rows"] == n
    total = rs.direct(rs.wait_primary()).web["system.parts.events.log"].aggregate(
        [{"$group": {"_id": None, "rows": {"$sum": "$rows"}}}]).next()["rows"]
    assert total == n + 5
    # Bad input gets MongoDB's error document and a status a client can act on.
    assert _post(secondary, "/tables/web.nope/insert", lines, "application/x-ndjson")[0] == 404
    status, reply = _post(secondary, "/tables/web.events/insert", b"{not json", "application/x-ndjson")
    assert status == 400 and reply["code"] == 2
    status, reply = _post(secondary, "/tables/web.events/insert", b"\x00" * 64, "application/vnd.apache.arrow.stream")
    assert status == 400 and reply["code"] == 2
    assert _post(secondary, "/tables/web.events/insert?insertQuorum=7", lines, "application/x-ndjson")[0] == 400
