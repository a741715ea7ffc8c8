"""Damaged bytes on one member never become another member's data or anybody's answer: a member
checks a part against its checksums before it merges, mutates, serves or reads it; a damaged part is
moved aside as `broken_<name>_<time>` (never deleted) and fetched again from a healthy replica."""

from __future__ import annotations

import datetime
import hashlib
import os
from typing import Any

import pytest
from pymongo import ReadPreference
from pymongo.errors import OperationFailure

from oplog.parts.active_set import ActivePartSet
from oplog.parts.part_info import PartInfo
from tests.support.members import Member, wait_for
from tests.support.parts import part_dirs, select
from tests.support.replica_set import ReplicaSet

TABLE = {"columns": [{"name": "ts", "type": "timestamp[ms]"}, {"name": "user", "type": "string"},
                     {"name": "n", "type": "int64"}],
         "partitionBy": "toYYYYMM(ts)", "orderBy": ["user", "ts"], "settings": {"oldPartsLifetimeSecs": 600}}


def _rows(block: int, n: int = 400) -> list[dict[str, Any]]:
    return [{"ts": datetime.datetime(2024, 5, 1 + i % 28, block % 24), "user": f"u{(i * 7 + block) % 11}",
             "n": block * 1000 + i} for i in range(n)]


def _key(row: dict[str, Any]) -> tuple[Any, ...]:
    return row["n"], row["user"], row["ts"]


def _active(member: Member, ns: str) -> list[str]:
    return sorted(p.name for p in ActivePartSet(PartInfo.parse(d) for d in part_dirs(member, ns)
                                                if not d.startswith("broken_")))


def _digest(member: Member, ns: str, part: str) -> str:
    with open(os.path.join(member.dbpath, "parts", ns, part, "data.parquet"), "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def _damage(member: Member, ns: str, part: str) -> None:
    """Flips one byte in the middle of the part's rows (a page of data, not the footer)."""
    path = os.path.join(member.dbpath, "parts", ns, part, "data.parquet")
    with open(path, "r+b") as f:
        f.seek(os.path.getsize(path) // 2)
        byte = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte[0] ^ 0x5A]))


def _broken(member: Member, ns: str) -> list[str]:
    directory = os.path.join(member.dbpath, "parts", ns)
    return sorted(d for d in os.listdir(directory) if d.startswith("broken_"))


def _rows_on(rs: ReplicaSet, member: Member, db: str) -> list[tuple[Any, ...]] | None:
    """The member's rows, or None while it refuses to answer (a damaged part found, being fetched again)."""
    try:
        return sorted(_key(r) for r in select(rs, member, db))
    except OperationFailure:
        return None


def _assert_right_or_refused(rows: list[tuple[Any, ...]] | None, expected: list[tuple[Any, ...]],
                             host: str) -> None:
    if rows is None or rows == expected:
        return
    missing, extra = sorted(set(expected) - set(rows)), sorted(set(rows) - set(expected))
    raise AssertionError(f"{host} answered {len(rows)} rows, {len(expected)} inserted: {len(missing)} missing "
                         f"(first {missing[:3]}), {len(extra)} never inserted (first {extra[:3]}), "
                         f"{len(rows) - len(set(rows))} repeated")


def _log(rs: ReplicaSet, db: str) -> Any:
    return rs.direct(rs.wait_primary())[db].get_collection("system.parts.events.log",
                                                           read_preference=ReadPreference.PRIMARY)


def _converged(rs: ReplicaSet, ns: str, fewer_than: int) -> list[str] | None:
    views = [_active(m, ns) for m in rs.members]
    if not all(v == views[0] for v in views) or len(views[0]) >= fewer_than:
        return None
    if any(len({_digest(m, ns, p) for m in rs.members}) != 1 for p in views[0]):
        return None
    return views[0]


@pytest.mark.parametrize("merge_first", ["primary", "racing"])
def test_a_part_damaged_on_the_primary_never_becomes_the_merged_copy(rs3: ReplicaSet, merge_first: str) -> None:
    """The primary's copies of three parts lose a byte each; then it merges them. It finds them damaged,
    sets them aside, fetches them again, and merges the right rows: every member ends with the same
    bytes and every row as inserted, and no member's answer ever holds a wrong row."""
    client = rs3.client()
    primary = rs3.wait_primary()
    secondaries = [m for m in rs3.members if m is not primary]
    rs3.fail_point(primary, "partsStopMerges", "alwaysOn")
    client.dm.command({"createPartsTable": "events", **TABLE})
    inserted = [row for block in range(6) for row in _rows(block)]
    for block in range(6):
        client.dm.command({"insertBlock": "events", "rows": _rows(block)})
    expected = sorted(_key(r) for r in inserted)
    for member in rs3.members:
        wait_for(lambda m=member: len(part_dirs(m, "dm.events")) == 6, 30, f"every part on {member.host}")
    if merge_first == "primary":   # the secondaries see the merge only once the primary registered its result
        for member in secondaries:
            rs3.fail_point(member, "stopReplProducer", "alwaysOn")
    for part in _active(primary, "dm.events")[:3]:
        _damage(primary, "dm.events", part)
    rs3.fail_point(primary, "partsStopMerges", "off")
    try:
        wait_for(lambda: _log(rs3, "dm").count_documents({"type": "MERGE_PARTS"}) >= 1, 30, "a merge logged")
        for member in rs3.members:   # never a wrong row: the right ones, or a refusal
            _assert_right_or_refused(_rows_on(rs3, member, "dm"), expected, member.host)
    finally:
        for member in secondaries:
            rs3.fail_point(member, "stopReplProducer", "off")
    wait_for(lambda: _converged(rs3, "dm.events", 6), 60, "every member to hold the same merged bytes")
    for member in rs3.members:
        assert wait_for(lambda m=member: _rows_on(rs3, m, "dm"), 30, f"rows on {member.host}") == expected
    assert _broken(primary, "dm.events"), "the damaged parts are kept aside, never deleted"


def test_a_member_never_answers_rows_of_a_damaged_part_and_fetches_it_again(rs3: ReplicaSet) -> None:
    client = rs3.client()
    client.dr.command({"createPartsTable": "events", **TABLE})
    rs3.fail_point(rs3.wait_primary(), "partsStopMerges", "alwaysOn")
    for block in range(2):
        client.dr.command({"insertBlock": "events", "rows": _rows(block)})
    expected = sorted(_key(r) for block in range(2) for r in _rows(block))
    member = next(m for m in rs3.members if m is not rs3.wait_primary())
    wait_for(lambda: len(part_dirs(member, "dr.events")) == 2, 30, "both parts on the secondary")
    assert _rows_on(rs3, member, "dr") == expected
    part = _active(member, "dr.events")[0]
    good = _digest(member, "dr.events", part)
    _damage(member, "dr.events", part)
    assert _rows_on(rs3, member, "dr") in (expected, None)   # refused while damaged, never wrong
    wait_for(lambda: _broken(member, "dr.events"), 30, "the damaged part set aside")
    wait_for(lambda: _rows_on(rs3, member, "dr") == expected, 30, "the part fetched again")
    assert _digest(member, "dr.events", part) == good
