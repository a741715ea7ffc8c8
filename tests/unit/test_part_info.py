"""Part names, covering and the active part set (oplog/parts/part_info.py, oplog/parts/active_set.py),
with ClickHouse's own examples and hypothesis properties."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from base.errors import MongoError
from oplog.parts.active_set import ActivePartSet
from oplog.parts.part_info import (
    LEGACY_MAX_LEVEL,
    MAX_BLOCK_NUMBER,
    MAX_LEVEL,
    PartInfo,
    PartsIntersect,
    drop_range,
    inserted_part,
    merged_part,
    mutated_part,
)

P = PartInfo.parse


def test_names_as_clickhouse_writes_them() -> None:
    assert inserted_part("202405", 7).name == "202405_7_7_0"
    assert P("all_1_42_5").name == "all_1_42_5"
    assert mutated_part(P("all_1_42_5"), 63).name == "all_1_42_5_63"
    assert drop_range("202107", 10) == P("202107_0_9_999999999_999999999")
    assert drop_range("202107", 0) is None
    legacy = P(f"202107_0_9_{LEGACY_MAX_LEVEL}")
    assert legacy.level == MAX_LEVEL and legacy.name == f"202107_0_9_{LEGACY_MAX_LEVEL}"


@pytest.mark.parametrize("bad", ["", "all", "all_1_2", "all_2_1_0", "al_l_1_1_0", "all_1_x_0", "all_1_2_0_3_4",
                                 "bad.id_1_1_0", "all_-1_1_0"])
def test_what_is_not_a_part_name(bad: str) -> None:
    with pytest.raises(MongoError) as exc:
        P(bad)
    assert exc.value.code == 2


def test_covering_as_clickhouse_defines_it() -> None:
    assert not P("all_0_5_2").contains(P("all_0_4_2"))      # equal level needs equal ranges
    assert P("all_0_5_3").contains(P("all_0_4_2"))
    assert P("all_0_4_2_9").contains(P("all_0_4_2"))
    assert not P("all_0_4_2").contains(P("all_0_4_2_9"))    # a lower mutation never contains a higher
    assert not P("a_0_4_2").contains(P("b_0_4_2"))
    assert P("all_0_9_999999999_999999999").contains(P("all_3_3_0_15"))   # a drop range covers mutated parts
    assert P("all_0_5_1").intersects(P("all_3_8_1"))
    assert P("all_0_2_1").is_disjoint(P("all_3_8_1"))
    assert P("all_3_3_0").data_version == 3 and P("all_3_3_0_15").data_version == 15


def test_merged_and_mutated_parts() -> None:
    merged = merged_part([P("all_1_1_0"), P("all_2_5_1_7"), P("all_6_6_0")])
    assert merged.name == "all_1_6_2_7"
    with pytest.raises(ValueError):
        merged_part([P("a_1_1_0"), P("b_2_2_0")])
    with pytest.raises(ValueError):
        mutated_part(P("all_3_3_0_15"), 15)


partition_ids = st.sampled_from(["all", "202405", "202406", "-1"])
levels = st.integers(0, 5)
parts = st.builds(lambda pid, lo, span, level, mutation: PartInfo(pid, lo, lo + span, level, mutation),
                  partition_ids, st.integers(0, 30), st.integers(0, 10), levels,
                  st.one_of(st.just(0), st.integers(1, 50)))


@given(parts)
def test_a_name_parses_back_to_its_part(part: PartInfo) -> None:
    assert P(part.name) == part and P(part.name).name == part.name


@given(parts, parts, parts)
def test_containing_is_a_partial_order(a: PartInfo, b: PartInfo, c: PartInfo) -> None:
    assert a.contains(a)
    if a.contains(b) and b.contains(a):
        assert a == b
    if a.contains(b) and b.contains(c):
        assert a.contains(c)
    assert a.is_disjoint(b) == b.is_disjoint(a) and a.intersects(b) == b.intersects(a)


@given(st.lists(parts, min_size=1, max_size=5))
def test_a_merge_contains_its_sources(sources: list[PartInfo]) -> None:
    pid = sources[0].partition_id
    chain, at = [], 0
    for p in sources:   # made adjacent, in block order, in one partition
        chain.append(PartInfo(pid, at, at + p.max_block - p.min_block, p.level, p.mutation))
        at = chain[-1].max_block + 1
    merged = merged_part(chain)
    assert all(merged.contains(p) for p in chain)


@given(st.lists(parts, max_size=40))
def test_the_active_set_keeps_disjoint_parts_covering_everything_it_accepted(added: list[PartInfo]) -> None:
    active, accepted = ActivePartSet(), []
    for part in added:
        before = list(active)
        try:
            replaced = active.add(part)
        except PartsIntersect:
            assert list(active) == before                    # a refused part changes nothing
            assert any(p.intersects(part) for p in before)
            continue
        accepted.append(part)
        assert all(part.contains(p) for p in replaced)
    members = list(active)
    assert len(members) == len(active)
    for i, a in enumerate(members):
        assert all(a.is_disjoint(b) for b in members[i + 1:])
    for part in accepted:
        holder = active.containing(part)
        assert holder is not None and holder.contains(part)


def test_the_active_set_queries() -> None:
    active = ActivePartSet([P("all_1_1_0"), P("all_2_2_0"), P("all_3_3_0"), P("x_1_1_0")])
    assert active.add(P("all_1_2_1")) == [P("all_1_1_0"), P("all_2_2_0")]
    assert active.add(P("all_1_1_0")) == []                   # covered: ignored
    with pytest.raises(PartsIntersect):
        active.add(P("all_2_3_1"))
    assert active.containing(P("all_2_2_0")) == P("all_1_2_1")
    assert active.covered_by(P("all_0_9_999999999_999999999")) == [P("all_1_2_1"), P("all_3_3_0")]
    assert active.remove_covered(drop_range("all", 10) or P("all_0_0_0")) == [P("all_1_2_1"), P("all_3_3_0")]
    assert list(active) == [P("x_1_1_0")] and P("x_1_1_0") in active and active.partitions() == ["x"]
    assert MAX_BLOCK_NUMBER == MAX_LEVEL == 999_999_999
