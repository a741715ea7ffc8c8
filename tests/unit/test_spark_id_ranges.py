"""The `_id` ranges a collection read is split into cover every document once, whatever the BSON types of
its `_id`s (the official connector's SPARK-221: ranges whose ends differ in type lost documents)."""

from __future__ import annotations

import datetime
import functools
import itertools

import pytest
from bson import Binary, Int64, MaxKey, MinKey, ObjectId, Timestamp
from hypothesis import given, settings
from hypothesis import strategies as st

from oplog.query import matches
from oplog.values import compare_values

pytest.importorskip("pyspark")
from replset.spark_collections import id_range_filter

IDS = [MinKey(), None, -5, 0, 1.5, Int64(7), 2**40, "", "a", "zz", {"k": 1}, Binary(b"\x01"),
       ObjectId("5f0000000000000000000001"), ObjectId("6f0000000000000000000001"), False, True,
       datetime.datetime(2020, 1, 1), datetime.datetime(2024, 5, 1), Timestamp(1, 1), MaxKey()]
ORDERED = sorted(IDS, key=functools.cmp_to_key(compare_values))


def filters(keys: list[object]) -> list[dict[str, object]]:
    """The queries of the ranges split at `keys`, as `CollectionReader.partitions` makes them."""
    bounds = [None, *keys, None]
    last = len(bounds) - 2
    return [id_range_filter(lo, hi, from_start=i == 0, to_end=i == last)
            for i, (lo, hi) in enumerate(itertools.pairwise(bounds))]


def test_a_range_across_types_holds_every_type_between_its_ends() -> None:
    # The case: {_id: 1}, {_id: "a"}, an ObjectId, split at "a" and at the ObjectId.
    oid = ObjectId()
    for value in (1, "a", oid):
        assert sum(matches({"_id": value}, f) for f in filters(["a", oid])) == 1, value
    assert id_range_filter(1, 5) == {"_id": {"$gte": 1, "$lt": 5}}   # one type: one index range


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from(range(len(ORDERED))), unique=True, max_size=8))
def test_the_ranges_between_any_split_keys_hold_every_id_exactly_once(cuts: list[int]) -> None:
    every = filters([ORDERED[i] for i in sorted(cuts)])
    for value in ORDERED:
        hits = [f for f in every if matches({"_id": value}, f)]
        assert len(hits) == 1, (value, hits)
