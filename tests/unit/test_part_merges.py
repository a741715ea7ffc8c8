"""Merge predicate and selection (oplog/parts/merges.py)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from oplog.parts.active_set import ActivePartSet
from oplog.parts.merges import (
    BASE_OLD,
    BASE_YOUNG,
    OLD_AGE_MS,
    MergeCandidate,
    can_merge,
    merge_base,
    select_merge,
)
from oplog.parts.part_info import PartInfo, merged_part

P = PartInfo.parse
MB = 1024 * 1024


def test_the_merge_predicate() -> None:
    virtual = ActivePartSet([P("all_1_1_0"), P("all_2_2_0"), P("all_4_4_0"), P("x_1_1_0")])
    assert can_merge(P("all_1_1_0"), P("all_2_2_0"), virtual=virtual) is None
    assert can_merge(P("all_2_2_0"), P("all_4_4_0"), virtual=virtual) is None        # a gap nobody holds
    assert "being committed" in (can_merge(P("all_2_2_0"), P("all_4_4_0"), virtual=virtual, committing={3}) or "")
    assert "different partitions" in (can_merge(P("all_1_1_0"), P("x_1_1_0"), virtual=virtual) or "")
    assert "not before" in (can_merge(P("all_2_2_0"), P("all_1_1_0"), virtual=virtual) or "")
    assert "quorum" in (can_merge(P("all_1_1_0"), P("all_2_2_0"), virtual=virtual, pinned={P("all_2_2_0")}) or "")
    assert "mutation versions" in (can_merge(P("all_1_1_0"), P("all_2_2_0"), virtual=virtual, mutations={2}) or "")
    virtual.add(P("all_3_3_0"))
    assert "lies between" in (can_merge(P("all_2_2_0"), P("all_4_4_0"), virtual=virtual) or "")
    virtual.add(merged_part([P("all_1_1_0"), P("all_2_2_0")]))
    assert "already assigned" in (can_merge(P("all_1_2_1"), P("all_3_3_0"), virtual=ActivePartSet(
        [P("all_1_3_1"), P("all_4_4_0")])) or "")


def test_base_falls_with_age() -> None:
    assert merge_base(0) == BASE_YOUNG and merge_base(OLD_AGE_MS) == BASE_OLD
    assert BASE_OLD < merge_base(OLD_AGE_MS // 2) < BASE_YOUNG


def test_young_parts_merge_once_there_are_enough_of_similar_size() -> None:
    five = [MergeCandidate(P(f"all_{i}_{i}_0"), 10 * MB, 0) for i in range(1, 6)]
    assert select_merge(five[:4], [True] * 3) == []                 # four fresh parts: not yet worth it
    assert [p.name for p in select_merge(five, [True] * 4)] == [f"all_{i}_{i}_0" for i in range(1, 6)]
    big = [MergeCandidate(P("all_0_0_0"), 10_000 * MB, 0), *five]
    assert P("all_0_0_0") not in select_merge(big, [True] * 5)      # the big part is not rewritten for them
    assert select_merge(five, [True, True, False, True]) == []     # broken into runs too short to merge
    old = [MergeCandidate(c.part, c.bytes, OLD_AGE_MS) for c in five[:2]]
    assert len(select_merge(old, [True])) == 2                     # old small parts merge anyway


sizes = st.lists(st.tuples(st.integers(1, 2000), st.integers(0, 2 * OLD_AGE_MS), st.booleans()), max_size=30)


@given(sizes, st.integers(2, 10), st.integers(1, 20_000))
def test_a_selected_range_obeys_every_limit(parts: list[tuple[int, int, bool]], max_parts: int,
                                            max_mb: int) -> None:
    candidates = [MergeCandidate(PartInfo("all", i, i), mb * MB, age) for i, (mb, age, _) in enumerate(parts)]
    mergeable = [ok for _, _, ok in parts[:-1]]
    chosen = select_merge(candidates, mergeable, max_parts=max_parts, max_bytes=max_mb * MB)
    if not chosen:
        return
    start = next(i for i, c in enumerate(candidates) if c.part == chosen[0])
    window = candidates[start:start + len(chosen)]
    assert [c.part for c in window] == chosen and 2 <= len(chosen) <= max_parts
    assert all(mergeable[start:start + len(chosen) - 1])
    assert sum(c.bytes for c in window) <= max_mb * MB
