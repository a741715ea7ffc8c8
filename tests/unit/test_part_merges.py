"""Merge predicate and selection (oplog/parts/merges.py)."""

from __future__ import annotations

import itertools

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
    plan_merges,
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


@given(st.lists(st.tuples(st.sampled_from(["a", "b"]), st.integers(0, 3), st.integers(0, 4 * MB),
                          st.integers(0, 2 * OLD_AGE_MS)), min_size=0, max_size=30),
       st.sets(st.integers(0, 29), max_size=5), st.sets(st.integers(0, 29), max_size=4))
def test_planned_merges_take_only_free_adjacent_unpinned_parts(
        specs: list[tuple[str, int, int, int]], queued: set[int], pins: set[int]) -> None:
    """Whatever is here and queued, each planned range is one partition's run of parts this replica has,
    none pinned or already taken by a queued task, with nothing between them anywhere."""
    now = 10 * OLD_AGE_MS
    current, virtual, sizes, made = ActivePartSet(), ActivePartSet(), {}, []
    block = {"a": 0, "b": 0}
    for i, (partition, gap, size, age) in enumerate(specs):
        block[partition] += 1 + gap
        part = PartInfo(partition, block[partition], block[partition], 0)
        made.append(part)
        virtual.add(part)
        if i not in queued:          # queued: a fetch of it is in the queue, it is not here yet
            current.add(part)
        sizes[part.name] = (size, now - age)
    pinned = [made[i] for i in pins if i < len(made)]
    plans = plan_merges(current, virtual, sizes, now, pinned=pinned)
    assert len({plan[0].partition_id for plan in plans}) == len(plans)   # one per partition at most
    for plan in plans:
        assert len(plan) >= 2 and all(p in current and p not in pinned for p in plan)
        for left, right in itertools.pairwise(plan):
            assert can_merge(left, right, virtual=virtual, pinned=pinned) is None
            assert not [p for p in virtual if p.partition_id == left.partition_id
                        and left.max_block < p.min_block and p.max_block < right.min_block]


def test_old_small_parts_are_planned_for_a_merge() -> None:
    parts = [P(f"all_{i}_{i}_0") for i in range(1, 4)]
    current = ActivePartSet(parts)
    sizes = {p.name: (1000, 0) for p in parts}
    assert plan_merges(current, ActivePartSet(parts), sizes, 2 * OLD_AGE_MS) == [parts]
    assert plan_merges(current, ActivePartSet(parts), sizes, 1000) == []     # young: three are not enough
    assert plan_merges(current, ActivePartSet(parts), sizes, 2 * OLD_AGE_MS, pinned=[parts[1]]) == []
