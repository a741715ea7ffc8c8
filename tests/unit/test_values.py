"""BSON ordering and canonical keys (MongoDB's comparison order)."""

from __future__ import annotations

import datetime
import itertools
import math

from bson.decimal128 import Decimal128
from bson.int64 import Int64
from bson.max_key import MaxKey
from bson.min_key import MinKey
from bson.objectid import ObjectId
from bson.timestamp import Timestamp
from hypothesis import given
from hypothesis import strategies as st

from oplog.values import SortKey, canonical_key, compare_values, values_equal

ORDERED = [
    MinKey(), None, -5, 0.5, Int64(3), "a", "b", {"a": 1}, [1], b"\x00", ObjectId("0" * 24), False, True,
    datetime.datetime(2020, 1, 1), Timestamp(1, 1), MaxKey(),
]


def test_type_order_follows_mongodb() -> None:
    for i, a in enumerate(ORDERED):
        for j, b in enumerate(ORDERED):
            expected = (i > j) - (i < j)
            assert compare_values(a, b) == expected, (a, b)


def test_numbers_compare_by_value_across_types() -> None:
    assert values_equal(1, 1.0) and values_equal(Int64(1), Decimal128("1"))
    assert compare_values(2, 1.5) == 1
    assert compare_values(math.nan, -math.inf) == -1
    assert values_equal(math.nan, math.nan)


def test_documents_compare_field_by_field_in_order() -> None:
    assert compare_values({"a": 1, "b": 2}, {"a": 1, "b": 3}) == -1
    assert compare_values({"a": 1}, {"a": 1, "b": 0}) == -1
    assert not values_equal({"a": 1, "b": 2}, {"b": 2, "a": 1})


def test_canonical_keys_match_equality() -> None:
    assert canonical_key(1) == canonical_key(1.0) == canonical_key(Int64(1))
    assert canonical_key("1") != canonical_key(1)
    assert canonical_key({"a": 1}) == canonical_key({"a": 1.0})
    assert canonical_key([1, 2]) != canonical_key([2, 1])


scalars = st.one_of(st.none(), st.booleans(), st.integers(-(2**62), 2**62), st.floats(allow_nan=False),
                    st.text(max_size=5))
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=3)
                      | st.dictionaries(st.text("abc.$_", max_size=3), inner, max_size=3), max_leaves=8)


@given(values, values)
def test_compare_is_antisymmetric_and_keys_agree(a: object, b: object) -> None:
    assert compare_values(a, b) == -compare_values(b, a)
    assert (canonical_key(a) == canonical_key(b)) == values_equal(a, b)


@given(st.lists(values, max_size=8))
def test_sort_key_gives_a_consistent_order(items: list[object]) -> None:
    ordered = sorted(items, key=SortKey)
    for x, y in itertools.pairwise(ordered):
        assert compare_values(x, y) <= 0
