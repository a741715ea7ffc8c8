"""Mutations and partition drops on a real set: alterDelete / alterUpdate (sent to any member) rewrite
every member's parts the same way; dropPartition removes a partition everywhere and lets its blocks be
inserted again; the mutations view says where each stands."""

from __future__ import annotations

import datetime
import os
import threading
from typing import Any

import pytest
from pymongo.errors import OperationFailure

from tests.support.members import Member, wait_for
from tests.support.parts import select
from tests.support.replica_set import ReplicaSet

TABLE = {"columns": [{"name": "day", "type": "timestamp[ms]"}, {"name": "user", "type": "string"},
                     {"name": "n", "type": "int64"}, {"name": "note", "type": "string"}],
         "partitionBy": "toYYYYMM(day)", "orderBy": ["user", "day"]}


def _rows(month: int, n: int, start: int = 0) -> list[dict[str, Any]]:
    return [{"day": datetime.datetime(2024, month, 1 + i % 28), "user": f"u{i % 4}", "n": start + i,
             "note": "x"} for i in range(n)]


def _ns(rs: ReplicaSet, member: Member, db: str) -> set[int]:
    return {r["n"] for r in select(rs, member, db, columns=["n"])}


def _converged(rs: ReplicaSet, db: str, expected: set[int]) -> None:
    for member in rs.members:
        wait_for(lambda m=member: _ns(rs, m, db) == expected, 30, f"the rows on {member.host}")


def _secondary(rs: ReplicaSet) -> Member:
    primary = rs.wait_primary()
    return next(m for m in rs.members if m is not primary)


def test_alter_delete_and_update_rewrite_every_members_parts(rs: ReplicaSet) -> None:
    db = rs.client().mu
    db.command({"createPartsTable": "events", **TABLE})
    db.command({"insertBlock": "events", "rows": _rows(1, 40) + _rows(2, 40, 100)})
    _converged(rs, "mu", set(range(40)) | set(range(100, 140)))
    secondary = _secondary(rs)
    # Sent to a secondary: passed to the primary; sync 1 waits until this member applied it.
    reply = rs.direct(secondary).mu.command({"alterDelete": "events", "filter": {"n": {"$gte": 20, "$lt": 120}}})
    assert reply["ok"] == 1.0 and reply["mutation"].startswith("mutation_")
    assert _ns(rs, secondary, "mu") == set(range(20)) | set(range(120, 140))
    _converged(rs, "mu", set(range(20)) | set(range(120, 140)))
    # A block inserted after the mutation is not touched by it.
    db.command({"insertBlock": "events", "rows": _rows(1, 10, 50)})
    db.command({"alterUpdate": "events", "filter": {"user": "u1"}, "set": {"n": {"$add": ["$n", 1000]},
                                                                           "note": "updated"}})
    expected = {n + 1000 if n % 4 == 1 else n for n in set(range(20)) | set(range(120, 140))}
    expected |= {n + 1000 if (n - 50) % 4 == 1 else n for n in range(50, 60)}
    _converged(rs, "mu", expected)
    notes = {r["note"] for r in select(rs, rs.members[2], "mu", filter={"user": "u1"}, columns=["note"])}
    assert notes == {"updated"}
    for member in rs.members:
        view = rs.direct(member).mu.command({"partsMutations": "events"})["mutations"]
        wait_for(lambda m=member: all(v["is_done"] for v in rs.direct(m).mu.command(
            {"partsMutations": "events"})["mutations"]), 30, f"mutations done on {member.host}")
        assert [v["command"]["kind"] for v in view] == ["delete", "update"]
    parts = [p["name"] for p in rs.direct(rs.members[0]).mu.command({"partsStatus": "events"})["parts"]
             if p["active"]]
    assert any(len(name.split("_")) == 5 for name in parts)   # rewritten parts carry the mutation version


def test_sync_2_returns_once_every_member_applied_the_mutation(rs: ReplicaSet) -> None:
    db = rs.client().s2
    db.command({"createPartsTable": "events", **TABLE})
    db.command({"insertBlock": "events", "rows": _rows(3, 30)})
    _converged(rs, "s2", set(range(30)))
    reply = rs.direct(_secondary(rs)).s2.command({"alterDelete": "events", "filter": {"n": {"$lt": 10}}, "sync": 2})
    for member in rs.members:   # no waiting here: every member had it done before the reply
        assert _ns(rs, member, "s2") == set(range(10, 30)), member.host
        (row,) = rs.direct(member).s2.command({"partsMutations": "events"})["mutations"]
        assert row["mutation_id"] == reply["mutation"] and row["is_done"] and not row["is_killed"]


def test_a_killed_mutation_is_planned_no_further_and_a_waiter_hears_so(rs3: ReplicaSet) -> None:
    """S2 fetches nothing, so a sync 2 mutation waits for it; killing the mutation ends the wait with
    Interrupted; what was rewritten before the kill is rewritten on every member once S2 catches up."""
    db = rs3.client().km
    db.command({"createPartsTable": "events", **TABLE})
    db.command({"insertBlock": "events", "rows": _rows(4, 12)})
    _converged(rs3, "km", set(range(12)))
    primary = rs3.wait_primary()
    s2, s1 = [m for m in rs3.members if m is not primary]

    def s1_on_the_primary() -> bool:   # S1 chained to S2 would stall the kill's w:"majority" with S2
        if rs3.sync_source(s1) == primary.host:
            return True
        rs3.direct(s1).admin.command("replSetSyncFrom", primary.host)
        return False

    wait_for(s1_on_the_primary, 30, "S1 to sync from the primary", interval_s=0.5)
    rs3.fail_point(s2, "stopReplProducer", "alwaysOn")
    outcome: list[Any] = []

    def wait_all() -> None:
        try:
            outcome.append(rs3.direct(primary).km.command({"alterDelete": "events", "filter": {"n": 0}, "sync": 2,
                                                           "writeConcern": {"w": 1}}))
        except OperationFailure as exc:
            outcome.append(exc)

    waiter = threading.Thread(target=wait_all, daemon=True)
    waiter.start()
    try:
        mutations = rs3.direct(primary).km["system.parts.events.mutations"]
        mutation = wait_for(lambda: mutations.find_one(), 20, "the mutation recorded")["_id"]
        wait_for(lambda: 0 not in _ns(rs3, primary, "km"), 20, "the primary to apply it")
        kill = {"killPartsMutation": "events", "mutation": mutation}
        assert rs3.direct(s1).km.command(kill)["killed"] == [mutation]   # sent on to the primary
        assert rs3.direct(primary).km.command(kill)["killed"] == []
        waiter.join(30)
        assert outcome and isinstance(outcome[0], OperationFailure) and outcome[0].code == 11601, outcome
    finally:
        rs3.fail_point(s2, "stopReplProducer", "off")
    view = rs3.direct(primary).km.command({"partsMutations": "events"})["mutations"]
    # Killed after the primary had rewritten its one part: done there all the same (nothing was left).
    assert [(v["mutation_id"], v["is_killed"], v["is_done"]) for v in view] == [(mutation, True, True)]
    _converged(rs3, "km", set(range(1, 12)))   # what the mutation rewrote before the kill, it did everywhere


@pytest.mark.parametrize(("cmd", "code"), [
    ({"alterDelete": "events", "filter": {"nope": 1}}, 2),
    ({"alterUpdate": "events", "filter": {}, "set": {"user": "x"}}, 2),       # part of the sort key
    ({"alterUpdate": "events", "filter": {}, "set": {"n": "text"}}, 2),
    ({"alterDelete": "nope", "filter": {}}, 26),
    ({"alterDelete": "events"}, 40414),
])
def test_bad_mutations_are_refused_before_anything_is_written(rs: ReplicaSet, cmd: dict[str, Any], code: int) -> None:
    db = rs.client().badmu
    if db["system.parts"].find_one({"_id": "events"}) is None:
        db.command({"createPartsTable": "events", **TABLE})
    with pytest.raises(OperationFailure) as err:
        rs.direct(_secondary(rs)).badmu.command(cmd)
    assert err.value.code == code
    assert rs.direct(rs.wait_primary()).badmu["system.parts.events.mutations"].count_documents({}) == 0


def test_drop_partition_removes_it_everywhere_and_its_blocks_can_come_back(rs: ReplicaSet) -> None:
    db = rs.client().dp
    db.command({"createPartsTable": "events", **TABLE, "settings": {"oldPartsLifetimeSecs": 1}})
    march, april = _rows(3, 30), _rows(4, 30, 500)
    db.command({"insertBlock": "events", "rows": march})
    db.command({"insertBlock": "events", "rows": april})
    _converged(rs, "dp", {r["n"] for r in march + april})
    again = db.command({"insertBlock": "events", "rows": march})
    assert again["deduplicated"] == 1
    reply = rs.direct(_secondary(rs)).dp.command({"dropPartition": "events", "partition": "202403"})
    assert reply["dropRange"].startswith("202403_0_")
    _converged(rs, "dp", {r["n"] for r in april})
    for member in rs.members:   # the dropped parts leave the disk after oldPartsLifetimeSecs
        directory = os.path.join(member.dbpath, "parts", "dp.events")
        wait_for(lambda d=directory: not [p for p in os.listdir(d) if p.startswith("202403_")], 20,
                 f"the dropped parts gone on {member.host}")
    # The dedup key went with the part: the same block is inserted again, not deduplicated.
    back = db.command({"insertBlock": "events", "rows": march})
    assert back["inserted"] == 1 and back["deduplicated"] == 0
    _converged(rs, "dp", {r["n"] for r in march + april})
    by_value = db.command({"dropPartition": "events", "partition": {"value": datetime.datetime(2024, 4, 3)},
                           "sync": 2})
    assert by_value["dropRange"].startswith("202404_0_")
    for member in rs.members:   # sync 2: dropped on every member before the reply
        assert _ns(rs, member, "dp") == {r["n"] for r in march}, member.host


def test_schema_changes_read_old_and_new_parts_on_every_member(rs: ReplicaSet) -> None:
    db = rs.client().sc
    db.command({"createPartsTable": "events", **TABLE})
    db.command({"insertBlock": "events", "rows": _rows(1, 10)})
    secondary = _secondary(rs)
    reply = rs.direct(secondary).sc.command({"alterPartsTable": "events", "alterSync": 2,
                                             "addColumn": {"name": "score", "type": "float64", "default": 1.5}})
    assert reply["metadataVersion"] == 1
    for member in rs.members:   # alterSync 2: every member has the new definition already
        status = rs.direct(member).sc.command({"partsStatus": "events"})
        assert status["metadataVersion"] == 1
        wait_for(lambda m=member: rs.direct(m).sc.command({"partsStatus": "events"})["localMetadataVersion"] == 1,
                 10, f"the new metadata adopted on {member.host}")
    db.command({"insertBlock": "events", "rows": [{**r, "score": 9.0} for r in _rows(2, 5, 100)]})
    db.command({"alterPartsTable": "events", "renameColumn": {"from": "note", "to": "comment"}})
    db.command({"alterPartsTable": "events", "dropColumn": "n"})
    db.command({"insertBlock": "events", "rows": [{"day": datetime.datetime(2024, 3, 1), "user": "z",
                                                   "comment": "new", "score": 2.0}]})
    for member in rs.members:
        def read(m: Member = member) -> list[dict[str, Any]]:
            return select(rs, m, "sc", columns=["user", "comment", "score"])
        rows = wait_for(lambda r=read: (lambda got: got if len(got) == 16 else None)(r()), 20,
                        f"every part readable on {member.host}")
        assert all(set(r) == {"user", "comment", "score"} for r in rows)
        assert sorted(r["score"] for r in rows) == [1.5] * 10 + [2.0] + [9.0] * 5
        assert sorted(r["comment"] for r in rows) == ["new"] + ["x"] * 15
    with pytest.raises(OperationFailure) as err:   # the old schema: a column that is gone
        db.command({"insertBlock": "events", "rows": [{"day": datetime.datetime(2024, 3, 1), "user": "z", "n": 1}]})
    assert err.value.code == 2 and "no column" in str(err.value)
    with pytest.raises(OperationFailure) as err:
        db.command({"alterPartsTable": "events", "dropColumn": "user"})   # the sort key
    assert err.value.code == 2
