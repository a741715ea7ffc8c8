"""Merges on a real set: the primary logs them, every member merges (or fetches the result), and all
members end with the same active parts and byte-identical Parquet; replaced parts stay readable for
oldPartsLifetimeSecs, then go; a member that was away fetches the merged part."""

from __future__ import annotations

import datetime
import hashlib
import os
from typing import Any

import pyarrow.parquet as pq
from pymongo import ReadPreference
from pymongo.errors import OperationFailure

from oplog.parts.active_set import ActivePartSet
from oplog.parts.part_info import PartInfo
from tests.support.members import Member, wait_for
from tests.support.parts import part_dirs
from tests.support.replica_set import ReplicaSet

TABLE = {"columns": [{"name": "ts", "type": "timestamp[ms]"}, {"name": "user", "type": "string"},
                     {"name": "n", "type": "int64"}],
         "partitionBy": "toYYYYMM(ts)", "orderBy": ["user", "ts"]}


def _rows(block: int, n: int = 50) -> list[dict[str, Any]]:
    return [{"ts": datetime.datetime(2024, 5, 1 + i % 28, block % 24), "user": f"u{(i * 7 + block) % 11}",
             "n": block * 1000 + i} for i in range(n)]


def _active(member: Member, ns: str) -> list[str]:
    """The parts a reader of this member would use: the ones no other part here covers."""
    return sorted(p.name for p in ActivePartSet(PartInfo.parse(d) for d in part_dirs(member, ns)))


def _digest(member: Member, ns: str, part: str) -> str:
    with open(os.path.join(member.dbpath, "parts", ns, part, "data.parquet"), "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def _log(rs: ReplicaSet, db: str, table: str) -> Any:
    return rs.direct(rs.wait_primary())[db].get_collection(f"system.parts.{table}.log",
                                                           read_preference=ReadPreference.PRIMARY)


def test_merges_converge_to_identical_parts_and_bytes_on_every_member(rs3: ReplicaSet) -> None:
    client = rs3.client()
    client.mg.command({"createPartsTable": "events", **TABLE, "settings": {"oldPartsLifetimeSecs": 2}})
    members = rs3.members

    def knows_table(member: Member) -> bool:   # the create is majority-acknowledged: a third may lag
        try:
            rs3.direct(member).mg.command({"partsStatus": "events"})
        except OperationFailure:
            return False
        return True

    for member in members:
        wait_for(lambda m=member: knows_table(m), 30, f"{member.host} to know the table")
    for block in range(8):   # inserted on every member in turn: sources come from all three
        rs3.direct(members[block % 3]).mg.command({"insertBlock": "events", "rows": _rows(block)})
    merges = _log(rs3, "mg", "events")
    wait_for(lambda: merges.count_documents({"type": "MERGE_PARTS"}) >= 1, 30, "the primary to log a merge")

    def converged() -> list[str] | None:
        views = [_active(m, "mg.events") for m in members]
        return views[0] if all(v == views[0] for v in views) and len(views[0]) < 8 else None

    active = wait_for(converged, 30, "every member to hold the same merged parts")
    merged = [p for p in active if PartInfo.parse(p).level > 0]
    assert merged, active
    for part in merged:
        digests = {_digest(m, "mg.events", part) for m in members}
        assert len(digests) == 1, f"{part} differs between members"
    # Every row is still there once, in the merged part(s) of each member.
    for member in members:
        rows = sum(pq.read_metadata(os.path.join(member.dbpath, "parts", "mg.events", p, "data.parquet")).num_rows
                   for p in _active(member, "mg.events"))
        assert rows == 8 * 50
    # The replaced parts go after oldPartsLifetimeSecs, on every member (the primary may have merged
    # further meanwhile: what is on disk is what is active then).
    for member in members:
        wait_for(lambda m=member: part_dirs(m, "mg.events") == _active(m, "mg.events"), 20,
                 f"old parts removed on {member.host}")
    doc = merges.find_one({"type": "MERGE_PARTS"})
    assert doc["part"] == PartInfo.parse(doc["part"]).name and len(doc["sources"]) >= 2


def test_a_member_away_during_a_merge_fetches_the_merged_part(rs3: ReplicaSet) -> None:
    client = rs3.client()
    client.aw.command({"createPartsTable": "events", **TABLE, "settings": {"oldPartsLifetimeSecs": 1}})
    primary = rs3.wait_primary()
    away = next(m for m in rs3.members if m is not primary)
    for block in range(2):
        client.aw.command({"insertBlock": "events", "rows": _rows(block)})
    wait_for(lambda: len(part_dirs(away, "aw.events")) == 2, 20, "the first parts on the member about to stop")
    away.stop()
    try:
        for block in range(2, 8):
            client.aw.command({"insertBlock": "events", "rows": _rows(block)})
        merges = _log(rs3, "aw", "events")
        wait_for(lambda: merges.count_documents({"type": "MERGE_PARTS"}) >= 1, 30, "a merge")
        others = [m for m in rs3.members if m is not away]

        def merged_and_cleaned() -> list[str] | None:
            views = [part_dirs(m, "aw.events") for m in others]
            one = views[0]
            return one if all(v == one for v in views) and len(one) < 8 and one == _active(others[0], "aw.events") \
                else None

        final = wait_for(merged_and_cleaned, 30, "the others to merge and drop the replaced parts")
    finally:
        away.start()
    # The sources of the merge are gone everywhere else: the member fetches the covering part.
    wait_for(lambda: _active(away, "aw.events") == final, 30, "the returning member to catch up")
    for part in final:
        assert _digest(away, "aw.events", part) == _digest(primary, "aw.events", part)


def test_a_member_initial_synced_from_a_set_with_parts_fetches_them(rs3: ReplicaSet, tmp_path: Any) -> None:
    client = rs3.client()
    client.isy.command({"createPartsTable": "events", **TABLE, "settings": {"oldPartsLifetimeSecs": 1}})
    for block in range(7):
        client.isy.command({"insertBlock": "events", "rows": _rows(block)})
    merges = _log(rs3, "isy", "events")
    wait_for(lambda: merges.count_documents({"type": "MERGE_PARTS"}) >= 1, 30, "a merge")
    primary = rs3.wait_primary()
    wait_for(lambda: part_dirs(primary, "isy.events") == _active(primary, "isy.events"), 30,
             "the merged-away parts gone on the primary")
    new = Member(dbpath=str(tmp_path / "new"), extra_args=["--enableTestCommands"])
    new.start()
    rs3.add_member(new)
    rs3.wait_state(new, 2, 60)
    # The log lists parts no member has any more (merged away): the new member fetches what covers them.
    wait_for(lambda: _active(new, "isy.events") == _active(primary, "isy.events"), 30, "the new member's parts")
    for part in _active(new, "isy.events"):
        assert _digest(new, "isy.events", part) == _digest(primary, "isy.events", part)
    assert len(list(rs3.direct(new).isy.cursor_command("selectParts", "events"))) == 7 * 50


def test_the_log_keeps_only_what_a_queue_still_needs(rs3: ReplicaSet) -> None:
    """ClickHouse's clearOldLogs: once every member holds a merged part and the dedup window moved on, the
    log entries of the parts it replaced go - and a restarted member rebuilds the same parts from what is
    left, setting nothing aside. A block still in the window is deduplicated though its part was merged."""
    client = rs3.client()
    client.lg.command({"createPartsTable": "events", **TABLE, "settings": {
        "oldPartsLifetimeSecs": 1, "cleanupDelayPeriodSecs": 1, "replicatedDeduplicationWindow": 2}})
    for block in range(10):
        client.lg.command({"insertBlock": "events", "rows": _rows(block)})
    primary = rs3.wait_primary()
    db = rs3.direct(primary).lg
    log_coll, keys = _log(rs3, "lg", "events"), db.get_collection("system.parts.events.blocks")

    def only_needed_entries() -> list[str] | None:
        active = set(_active(primary, "lg.events"))
        keyed = {k["log"] for k in keys.find()}
        docs = list(log_coll.find({}, {"part": 1}))
        extra = [d["_id"] for d in docs if d["part"] not in active and d["_id"] not in keyed]
        merged = any(PartInfo.parse(p).level > 0 for p in active)
        return sorted(active) if merged and not extra and len(keyed) <= 2 else None

    active = wait_for(only_needed_entries, 60, "the log to keep only the entries of active parts and dedup keys")
    assert len(list(log_coll.find())) < 10, "no log entry was removed"
    # The newest block is still a dedup key: inserting it again is a duplicate, though its part was merged.
    again = client.lg.command({"insertBlock": "events", "rows": _rows(9)})
    assert [b["deduplicated"] for b in again["blocks"]] == [True]
    # A secondary restarted now builds its queue from the shortened log: the same parts, nothing set aside.
    secondary = next(m for m in rs3.members if m is not primary)
    secondary.stop()
    secondary.start()
    rs3.wait_state(secondary, 2, 60)
    wait_for(lambda: _active(secondary, "lg.events") == sorted(active), 30, "the restarted member's parts")
    assert not [d for d in os.listdir(os.path.join(secondary.dbpath, "parts", "lg.events"))
                if d.startswith("unexpected_")]
    assert len(list(rs3.direct(secondary).lg.cursor_command("selectParts", "events"))) == 10 * 50
