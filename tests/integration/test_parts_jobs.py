"""Jobs on a real set: blocks staged on any member are invisible until one commit publishes them all;
a committed write id is a no-op when run again with the same rows and refused with other rows; an
abort, a losing attempt and the primary's timeout leave nothing behind; a replacing commit swaps the
rows. Read snapshots: one list of parts per key, whose parts outlive their merge while pinned."""

from __future__ import annotations

import datetime
import io
import os
from typing import Any

import pyarrow as pa
import pytest
from pymongo import ReadPreference
from pymongo.errors import OperationFailure

from tests.support.members import Member, wait_for
from tests.support.parts import part_dirs, select
from tests.support.replica_set import ReplicaSet

EVENTS = {"columns": [{"name": "ts", "type": "timestamp[ms]"}, {"name": "user", "type": "string"},
                      {"name": "n", "type": "int64", "default": 0}],
          "partitionBy": "toYYYYMM(ts)", "orderBy": ["user", "ts"]}


def _arrow(first: int, count: int, months: int = 3) -> bytes:
    rows = [{"ts": datetime.datetime(2024, 1 + i % months, 1 + i % 28), "user": f"u{i % 7}", "n": i}
            for i in range(first, first + count)]
    sink = io.BytesIO()
    data = pa.Table.from_pylist(rows)
    with pa.ipc.new_stream(sink, data.schema) as stream:
        stream.write_table(data)
    return sink.getvalue()


def _staged(member: Member, ns: str) -> list[str]:
    directory = os.path.join(member.dbpath, "parts", ns)
    return sorted(d for d in os.listdir(directory) if d.startswith("tmp_staged_")) if os.path.isdir(directory) else []


def _records(rs: ReplicaSet, db: str, what: str) -> list[dict[str, Any]]:
    coll = rs.client()[db].get_collection(f"system.parts.events.{what}", read_preference=ReadPreference.PRIMARY)
    return list(coll.find())


def _stage(rs: ReplicaSet, member: Member, db: str, write_id: str, key: str, first: int, count: int) -> list[str]:
    reply = rs.direct(member)[db].command({"stagePartsBlock": "events", "arrow": _arrow(first, count),
                                           "writeId": write_id, "stageKey": key})
    assert not reply["committed"] and reply["rows"] == count
    return [s["stage"] for s in reply["stages"]]


def _ns_values(rs: ReplicaSet, member: Member, db: str) -> list[int]:
    return sorted(r["n"] for r in select(rs, member, db))


def test_staged_blocks_are_invisible_until_one_commit_publishes_them_on_every_member(rs: ReplicaSet) -> None:
    db = "jobs1"
    rs.client()[db].command({"createPartsTable": "events", **EVENTS})
    primary = rs.wait_primary()
    secondary = next(m for m in rs.members if m is not primary)
    ours = _stage(rs, primary, db, "w1", "0:1:0", 0, 300) + _stage(rs, secondary, db, "w1", "1:2:0", 300, 300)
    assert len(ours) == 6   # three months in each block
    loser = _stage(rs, secondary, db, "w1", "1:3:0", 300, 300)   # another attempt of task 1: it loses
    assert len(_staged(primary, f"{db}.events")) == 3 and len(_staged(secondary, f"{db}.events")) == 6
    for member in rs.members:   # nothing is a part yet, nothing is read
        assert part_dirs(member, f"{db}.events") == [] and select(rs, member, db) == []
    reply = rs.client()[db].command({"commitPartsJob": "events", "writeId": "w1", "stages": ours, "rows": 600,
                                     "digest": "d1"})
    assert not reply["alreadyCommitted"] and reply["rows"] == 600 and len(reply["parts"]) == 6
    for member in rs.members:
        wait_for(lambda m=member: _ns_values(rs, m, db) == list(range(600)), 30, f"the job's rows on {member.host}")
        wait_for(lambda m=member: _staged(m, f"{db}.events") == [], 30, f"no staged block left on {member.host}")
    assert _records(rs, db, "staged") == []
    assert not set(loser) & {b["blockId"] for b in reply["blocks"]}
    switch = [d for d in _records(rs, db, "log") if d["type"] == "COMMIT_JOB"]
    assert [(d["writeId"], d["rows"], sorted(d["parts"])) for d in switch] == [("w1", 600, sorted(reply["parts"]))]
    status = rs.client()[db].command({"partsJobStatus": "events", "writeId": "w1"})
    assert status["committed"] and status["rows"] == 600


def test_a_committed_write_id_is_a_no_op_with_the_same_rows_and_refused_with_other_rows(rs: ReplicaSet) -> None:
    db = "jobs2"
    rs.client()[db].command({"createPartsTable": "events", **EVENTS})
    primary = rs.wait_primary()
    stages = _stage(rs, primary, db, "w2", "0:1:0", 0, 100)
    first = rs.client()[db].command({"commitPartsJob": "events", "writeId": "w2", "stages": stages, "rows": 100,
                                     "digest": "abc"})
    assert not first["alreadyCommitted"]
    # Staging a committed write writes nothing; committing it again (a lost reply, the job re-run) is a no-op.
    again = rs.direct(primary)[db].command({"stagePartsBlock": "events", "arrow": _arrow(0, 100), "writeId": "w2",
                                            "stageKey": "0:9:0"})
    assert again["committed"] and again["stages"] == []
    same = rs.client()[db].command({"commitPartsJob": "events", "writeId": "w2", "stages": [], "rows": 100,
                                    "digest": "abc"})
    assert same["alreadyCommitted"] and sorted(same["parts"]) == sorted(first["parts"])
    with pytest.raises(OperationFailure) as refused:
        rs.client()[db].command({"commitPartsJob": "events", "writeId": "w2", "stages": [], "rows": 101,
                                 "digest": "other"})
    assert refused.value.code == 11000 and "other rows" in str(refused.value)
    wait_for(lambda: _ns_values(rs, primary, db) == list(range(100)), 30, "the rows once")


def test_an_abort_removes_the_stages_and_a_commit_after_it_commits_nothing(rs: ReplicaSet) -> None:
    db = "jobs3"
    rs.client()[db].command({"createPartsTable": "events", **EVENTS})
    secondary = next(m for m in rs.members if m is not rs.wait_primary())
    stages = _stage(rs, secondary, db, "w3", "0:1:0", 0, 90)
    assert len(_records(rs, db, "staged")) == 3
    reply = rs.client()[db].command({"abortPartsJob": "events", "writeId": "w3"})
    assert reply["removed"] == 3 and not reply["committed"]
    wait_for(lambda: _staged(secondary, f"{db}.events") == [], 30, "the staged blocks removed where they were")
    with pytest.raises(OperationFailure) as refused:
        rs.client()[db].command({"commitPartsJob": "events", "writeId": "w3", "stages": stages, "rows": 90})
    assert refused.value.code == 4
    for bad in ({"replace": "false"}, {"rows": "90"}, {"stages": "all"}, {"writeId": 3}):
        with pytest.raises(OperationFailure) as malformed:
            rs.client()[db].command({"commitPartsJob": "events", "writeId": "w3", "stages": [], "rows": 0, **bad})
        assert malformed.value.code in (2, 14), bad
    assert all(select(rs, m, db) == [] for m in rs.members)
    assert not rs.client()[db].command({"partsJobStatus": "events", "writeId": "w3"})["committed"]


def test_the_primary_removes_stages_no_commit_came_for(rs: ReplicaSet) -> None:
    db = "jobs4"
    rs.client()[db].command({"createPartsTable": "events", **EVENTS, "settings": {"stagedPartsTimeoutSecs": 1}})
    secondary = next(m for m in rs.members if m is not rs.wait_primary())
    _stage(rs, secondary, db, "w4", "0:1:0", 0, 50)
    wait_for(lambda: _records(rs, db, "staged") == [], 30, "the stale stages removed by the primary")
    wait_for(lambda: _staged(secondary, f"{db}.events") == [], 30, "their files removed where they were")


def test_a_replacing_commit_swaps_the_tables_rows_on_every_member(rs: ReplicaSet) -> None:
    db = "jobs5"
    rs.client()[db].command({"createPartsTable": "events", **EVENTS})
    primary = rs.wait_primary()
    old = _stage(rs, primary, db, "w5a", "0:1:0", 0, 120)
    rs.client()[db].command({"commitPartsJob": "events", "writeId": "w5a", "stages": old, "rows": 120})
    new = _stage(rs, primary, db, "w5b", "0:1:0", 1_000, 60)
    reply = rs.client()[db].command({"commitPartsJob": "events", "writeId": "w5b", "stages": new, "rows": 60,
                                     "replace": True})
    assert reply["visibleHere"] and sorted(reply["dropped"]) == ["202401", "202402", "202403"]
    assert _ns_values(rs, primary, db) == list(range(1_000, 1_060))   # read-your-writes where it was committed
    for member in rs.members:
        wait_for(lambda m=member: _ns_values(rs, m, db) == list(range(1_000, 1_060)), 30, f"new rows on {member.host}")


def _active(rs: ReplicaSet, member: Member, db: str) -> list[str]:
    return sorted(p["name"] for p in rs.direct(member)[db].command({"partsStatus": "events"})["parts"] if p["active"])


def test_a_snapshot_is_one_list_per_key_and_keeps_its_parts_past_their_merge_until_it_expires(rs: ReplicaSet) -> None:
    db = "snap1"
    rs.client()[db].command({"createPartsTable": "events", **EVENTS,
                             "settings": {"oldPartsLifetimeSecs": 1, "mergeSelectingSleepMS": 100}})
    primary = rs.wait_primary()
    secondary = next(m for m in rs.members if m is not primary)

    def insert(month: int, first: int, count: int) -> None:
        for n in range(first, first + count):
            rs.client()[db].command({"insertBlock": "events",
                                     "rows": [{"ts": datetime.datetime(2024, month, 2), "user": "u", "n": n}]})

    insert(1, 0, 1)
    wait_for(lambda: _active(rs, primary, db) == ["202401_1_1_0"], 30, "the part active on the primary")
    first = rs.direct(secondary)[db].command({"openPartsSnapshot": "events", "key": "q1", "ttlSecs": 300})["snapshot"]
    assert [p["name"] for p in first["parts"]] == ["202401_1_1_0"] and first["parts"][0]["holders"]
    insert(1, 1, 5)
    again = rs.direct(primary)[db].command({"openPartsSnapshot": "events", "key": "q1"})["snapshot"]
    assert again["parts"] == first["parts"]   # the same key: the same list, whatever came since
    # The parts merge; past oldPartsLifetimeSecs the unpinned old parts go, the pinned one stays everywhere.
    for member in rs.members:
        wait_for(lambda m=member: "202401_1_1_0" not in _active(rs, m, db), 60, f"a merge on {member.host}")
        wait_for(lambda m=member: part_dirs(m, f"{db}.events") == sorted({*_active(rs, m, db), "202401_1_1_0"}), 30,
                 f"only the pinned old part left on {member.host}")
    # A pin that expires (q2, 2 s) stops pinning: the primary marks it so, and its part goes everywhere.
    insert(2, 10, 1)
    wait_for(lambda: "202402_1_1_0" in _active(rs, primary, db), 30, "the February part active on the primary")
    rs.direct(primary)[db].command({"openPartsSnapshot": "events", "key": "q2", "ttlSecs": 2})
    snapshots = rs.client()[db].get_collection("system.parts.events.snapshots")
    wait_for(lambda: snapshots.count_documents({"_id": "q2", "expired": True}) == 1, 40, "the pin marked expired")
    insert(2, 11, 5)
    for member in rs.members:
        wait_for(lambda m=member: "202402_1_1_0" not in part_dirs(m, f"{db}.events"), 60,
                 f"the expired pin's part merged away and gone on {member.host}")
        assert "202401_1_1_0" in part_dirs(member, f"{db}.events"), member.host   # q1 still pins its part
    # A late task of the expired query is refused, never handed another list.
    with pytest.raises(OperationFailure) as late:
        rs.direct(secondary)[db].command({"openPartsSnapshot": "events", "key": "q2"})
    assert late.value.code == 239 and "snapshotTtlSecs" in str(late.value)
