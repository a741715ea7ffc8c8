"""Split points of a collection by _id (oplog/split_points.py): ranges of `per_chunk` documents in
MongoDB's order of values."""

from __future__ import annotations

import functools

from hypothesis import given
from hypothesis import strategies as st

from oplog.split_points import split_points
from oplog.values import compare_values

_ids = st.lists(st.one_of(st.integers(-50, 50), st.text(max_size=3), st.floats(allow_nan=False, width=32)),
                unique_by=lambda v: (type(v) is str, v), max_size=40)


@given(ids=_ids, per_chunk=st.integers(1, 7))
def test_each_range_holds_per_chunk_documents_in_value_order(ids: list[object], per_chunk: int) -> None:
    keys = split_points(ids, per_chunk)
    assert len(keys) == max(0, (len(ids) - 1) // per_chunk)
    ordered = sorted(ids, key=functools.cmp_to_key(compare_values))
    for i, key in enumerate(keys):
        assert ordered[(i + 1) * per_chunk] is key


def test_numbers_sort_before_strings_as_in_mongodb() -> None:
    assert split_points(["b", 2, "a", 1], 2) == ["a"]
