"""The primary's deletion of a zero-copy table's shared objects: never a marked, young, or not yet
majority-committed-unmarked key (oplog.parts.shared_garbage)."""

from __future__ import annotations

from base.optime import OpTime
from oplog.parts.shared_garbage import SharedGarbage, referenced_keys
from oplog.parts.storage_url import part_key

UUID = "0f8fad5b-d9cb-469f-a165-70867728950e"
A = {"data.parquet": (10, "aa"), "columns.txt": (5, "cc")}
B = {"data.parquet": (12, "bb"), "columns.txt": (5, "cc")}
KA, KB = part_key(UUID, "202401", A), part_key(UUID, "202401", B)
GRACE = 1_000


def t(n: int, term: int = 1) -> OpTime:
    return OpTime(n, 0, term)


def test_referenced_keys_come_from_each_copys_partition_and_checksums() -> None:
    assert referenced_keys(UUID, [("202401_1_1_0", A), ("202401_2_2_0", B), ("202401_3_3_0", {}),
                                  ("not a part", A)]) == {KA, KB}


def test_a_key_goes_only_after_two_looks_the_second_once_the_commit_point_reached_the_first() -> None:
    gc = SharedGarbage(GRACE)
    stored = {KA: 0, KB: 0}
    assert gc.look(stored, {KB}, now_ms=5_000, last=t(10), commit_point=t(8), term=1) == []
    assert gc.look(stored, {KB}, now_ms=6_000, last=t(11), commit_point=t(9), term=1) == []   # not yet
    assert gc.look(stored, {KB}, now_ms=7_000, last=t(12), commit_point=t(10), term=1) == [KA]
    assert KB not in gc.candidates


def test_a_mark_seen_at_the_second_look_keeps_the_key() -> None:
    """Seed 003's delete-during-fetch: the source let the part go before the receiver's mark was set. Here
    a key unmarked at the first look and marked by the second (a fetch registered meanwhile) stays."""
    gc = SharedGarbage(GRACE)
    gc.look({KA: 0}, set(), now_ms=5_000, last=t(10), commit_point=t(9), term=1)
    assert gc.look({KA: 0}, {KA}, now_ms=6_000, last=t(12), commit_point=t(12), term=1) == []
    assert gc.candidates == {}   # marked again: a later unmarking starts over with two looks
    assert gc.look({KA: 0}, set(), now_ms=7_000, last=t(13), commit_point=t(13), term=1) == []


def test_young_objects_and_a_new_term_wait() -> None:
    """An insert's objects are stored before its commit marks them: young objects wait. And seed 003's
    rollback of a mark: an unmarking seen by one primary may be rolled back under the next, so a new
    term starts the two looks over."""
    gc = SharedGarbage(GRACE)
    assert gc.look({KA: 4_500}, set(), now_ms=5_000, last=t(10), commit_point=t(10), term=1) == []
    assert gc.candidates == {}   # younger than the grace: not even a candidate
    gc.look({KA: 0}, set(), now_ms=6_000, last=t(10), commit_point=t(10), term=1)
    # A new primary term: the first look was another history's; it starts over.
    assert gc.look({KA: 0}, set(), now_ms=7_000, last=t(11, 2), commit_point=t(11, 2), term=2) == []
    assert gc.look({KA: 0}, set(), now_ms=8_000, last=t(12, 2), commit_point=t(12, 2), term=2) == [KA]
    gc.forget()
    assert gc.candidates == {}
