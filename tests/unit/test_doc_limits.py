"""oplog.doc_limits: measuring a document without encoding it.

The measured BSON size is checked against the real encoder (a naive twin) on generated documents;
then the cases encoding could not afford: a value shared many times over (whose BSON form would be
gigabytes) is measured only up to the limit asked about, and nesting is counted as mongod counts it.
"""

from __future__ import annotations

import datetime
import time
from typing import Any

import bson
from bson.binary import Binary
from bson.decimal128 import Decimal128
from bson.int64 import Int64
from bson.objectid import ObjectId
from bson.regex import Regex
from bson.timestamp import Timestamp
from hypothesis import given, settings
from hypothesis import strategies as st

from oplog.doc_limits import (
    MAX_INTERNAL_BSON_SIZE,
    MAX_USER_BSON_SIZE,
    MEMORY_LIMIT,
    bson_size,
    measure,
    memory_size,
)

_SCALARS = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**63), 2**63 - 1), st.floats(allow_nan=False),
    st.text(st.characters(blacklist_categories=("Cs",)), max_size=20), st.binary(max_size=20).map(lambda b: Binary(b, 0)),
    st.integers(-(2**40), 2**40).map(Int64),
    st.datetimes(min_value=datetime.datetime(1970, 1, 1), max_value=datetime.datetime(2100, 1, 1)).map(
        lambda d: d.replace(microsecond=d.microsecond // 1000 * 1000)),
    st.just(Decimal128("1.25")), st.just(Timestamp(5, 1)), st.just(Regex("^a", "i")), st.just(ObjectId()),
)
_KEYS = st.text(st.characters(blacklist_characters="\x00", blacklist_categories=("Cs",)), max_size=8)
_VALUES = st.recursive(_SCALARS, lambda inner: st.one_of(
    st.lists(inner, max_size=6), st.dictionaries(_KEYS, inner, max_size=6)), max_leaves=40)


@settings(max_examples=100, deadline=None)
@given(st.dictionaries(_KEYS, _VALUES, max_size=8))
def test_the_measured_size_is_the_encoded_size(doc: dict[str, Any]) -> None:
    assert bson_size(doc) == len(bson.encode(doc))


def test_a_shared_value_counts_every_time_it_appears() -> None:
    shared = list(range(1000))
    doc = {"a": shared, "b": {"c": shared, "d": [shared, shared]}}
    assert bson_size(doc) == len(bson.encode(doc))


def test_a_value_shared_past_any_limit_is_measured_only_up_to_the_limit() -> None:
    big = ["x" * 1000] * 10_000  # about 10 MB of BSON
    doc = {f"f{i}": {"v": big} for i in range(10_000)}  # 100 GB of BSON, were it encoded
    started = time.monotonic()
    found = measure(doc, limit=MAX_USER_BSON_SIZE)
    assert found.stopped and found.size > MAX_USER_BSON_SIZE
    assert time.monotonic() - started < 1.0


def _nested(levels: int, leaf: Any = 1) -> dict[str, Any]:
    """Fields down to level `levels`: {a: {a: ... {a: leaf}}}."""
    doc: dict[str, Any] = {"a": leaf}
    for _ in range(levels - 1):
        doc = {"a": doc}
    return doc


def test_nesting_counts_the_levels_of_fields() -> None:
    assert measure({}).depth == 0
    assert measure({"a": 1}).depth == 1
    assert measure({"a": []}).depth == 1
    assert measure({"a": [[1]]}).depth == 3
    assert measure(_nested(180)).depth == 180
    assert measure(_nested(180, {})).depth == 180  # (an empty object holds no field)


def test_a_value_deeper_than_allowed_is_stopped_at_the_limit() -> None:
    deep = _nested(100_000)  # far deeper than Python could recurse
    found = measure(deep, max_depth=200)
    assert found.stopped and found.depth == 201


def test_memory_counts_a_value_and_its_payload() -> None:
    assert memory_size(1) == 24
    assert memory_size("abc") == 16 + 5 + 3
    assert memory_size([1, 2]) > 2 * 16
    assert memory_size(["x" * 1_000_000] * 200, limit=MEMORY_LIMIT) > MEMORY_LIMIT


def test_the_internal_limit_leaves_room_for_a_reply() -> None:
    assert MAX_INTERNAL_BSON_SIZE == 16 * 1024 * 1024 + 16 * 1024
