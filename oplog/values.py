"""BSON value ordering and equality, as MongoDB compares values.

Theory of operation: every BSON value has a *canonical type rank* (MongoDB's
comparison order: MinKey < null < numbers < strings < objects < arrays < binary
< ObjectId < bool < date < timestamp < regex < MaxKey). Two values compare by
rank first, then by value within the rank; numbers of every width compare as
numbers (1 == 1.0 == Int64(1)). `canonical_key` turns a value into bytes that are
equal exactly when the values are equal, for unique indexes and `_id` lookups.

Pure: no I/O.
"""

from __future__ import annotations

__layer__ = "core"  # pure: no I/O, clock or randomness (tests/unit/test_layering.py)

import datetime
import math
import re
import uuid
from decimal import Decimal
from typing import Any

import bson
from bson.binary import Binary
from bson.code import Code
from bson.dbref import DBRef
from bson.decimal128 import Decimal128
from bson.int64 import Int64
from bson.max_key import MaxKey
from bson.min_key import MinKey
from bson.objectid import ObjectId
from bson.regex import Regex
from bson.timestamp import Timestamp

RANK_MINKEY = 1
RANK_NULL = 2
RANK_NUMBER = 3
RANK_STRING = 4
RANK_OBJECT = 5
RANK_ARRAY = 6
RANK_BINARY = 7
RANK_OBJECTID = 8
RANK_BOOL = 9
RANK_DATE = 10
RANK_TIMESTAMP = 11
RANK_REGEX = 12
RANK_MAXKEY = 13

# BSON type aliases as used by $type.
TYPE_ALIASES: dict[str, int] = {
    "double": 1, "string": 2, "object": 3, "array": 4, "binData": 5, "undefined": 6,
    "objectId": 7, "bool": 8, "date": 9, "null": 10, "regex": 11, "dbPointer": 12,
    "javascript": 13, "symbol": 14, "javascriptWithScope": 15, "int": 16, "timestamp": 17,
    "long": 18, "decimal": 19, "minKey": -1, "maxKey": 127,
}


def bson_type_code(value: Any) -> int:
    """The BSON element type number of a Python value as pymongo encodes it."""
    if value is None:
        return 10
    if isinstance(value, bool):
        return 8
    if isinstance(value, Int64):
        return 18
    if isinstance(value, int):
        return 16 if -(2**31) <= value < 2**31 else 18
    if isinstance(value, float):
        return 1
    if isinstance(value, Decimal128):
        return 19
    if isinstance(value, str):
        return 2
    if isinstance(value, dict):
        return 3
    if isinstance(value, (list, tuple)):
        return 4
    if isinstance(value, (bytes, Binary, uuid.UUID)):
        return 5
    if isinstance(value, ObjectId):
        return 7
    if isinstance(value, datetime.datetime):
        return 9
    if isinstance(value, (Regex, re.Pattern)):
        return 11
    if isinstance(value, Code):
        return 13 if value.scope is None else 15
    if isinstance(value, Timestamp):
        return 17
    if isinstance(value, MinKey):
        return -1
    if isinstance(value, MaxKey):
        return 127
    if isinstance(value, DBRef):
        return 3
    raise TypeError(f"not a BSON value: {type(value).__name__}")


def type_rank(value: Any) -> int:
    """MongoDB's canonical comparison rank of a value's type."""
    if value is None:
        return RANK_NULL
    if isinstance(value, bool):
        return RANK_BOOL
    if isinstance(value, (int, float, Decimal128)):
        return RANK_NUMBER
    if isinstance(value, str):
        return RANK_STRING
    if isinstance(value, (dict, DBRef)):
        return RANK_OBJECT
    if isinstance(value, (list, tuple)):
        return RANK_ARRAY
    if isinstance(value, (bytes, Binary, uuid.UUID)):
        return RANK_BINARY
    if isinstance(value, ObjectId):
        return RANK_OBJECTID
    if isinstance(value, datetime.datetime):
        return RANK_DATE
    if isinstance(value, Timestamp):
        return RANK_TIMESTAMP
    if isinstance(value, (Regex, re.Pattern)):
        return RANK_REGEX
    if isinstance(value, MinKey):
        return RANK_MINKEY
    if isinstance(value, MaxKey):
        return RANK_MAXKEY
    if isinstance(value, Code):
        return RANK_STRING
    return RANK_OBJECT


def is_number(value: Any) -> bool:
    return isinstance(value, (int, float, Decimal128)) and not isinstance(value, bool)


def _number_as_decimal(value: Any) -> Decimal:
    if isinstance(value, Decimal128):
        return value.to_decimal()
    if isinstance(value, float):
        return Decimal(value) if math.isfinite(value) else Decimal(str(value))
    return Decimal(int(value))


def _compare_numbers(a: Any, b: Any) -> int:
    if isinstance(a, Decimal128) or isinstance(b, Decimal128):
        da, db = _number_as_decimal(a), _number_as_decimal(b)
        a_nan, b_nan = da.is_nan(), db.is_nan()
    else:
        da, db = a, b
        a_nan = isinstance(a, float) and math.isnan(a)
        b_nan = isinstance(b, float) and math.isnan(b)
    # MongoDB orders NaN below every other number and equal to itself.
    if a_nan or b_nan:
        return 0 if a_nan and b_nan else (-1 if a_nan else 1)
    return (da > db) - (da < db)


def _binary_parts(value: Any) -> tuple[int, int, bytes]:
    if isinstance(value, uuid.UUID):
        return (16, 4, value.bytes)
    data = bytes(value)
    subtype = value.subtype if isinstance(value, Binary) else 0
    return (len(data), subtype, data)


def _regex_parts(value: Any) -> tuple[str, str]:
    if isinstance(value, Regex):
        return (str(value.pattern), str(value.flags) if isinstance(value.flags, str) else "")
    return (value.pattern, "")


def compare_values(a: Any, b: Any) -> int:
    """-1, 0 or 1: how MongoDB orders two BSON values (sort and comparison operators)."""
    ra, rb = type_rank(a), type_rank(b)
    if ra != rb:
        return -1 if ra < rb else 1
    if ra in (RANK_NULL, RANK_MINKEY, RANK_MAXKEY):
        return 0
    if ra == RANK_NUMBER:
        return _compare_numbers(a, b)
    if ra == RANK_OBJECT:
        return _compare_documents(_as_dict(a), _as_dict(b))
    if ra == RANK_ARRAY:
        return _compare_arrays(list(a), list(b))
    if ra == RANK_BINARY:
        pa, pb = _binary_parts(a), _binary_parts(b)
        return (pa > pb) - (pa < pb)
    if ra == RANK_OBJECTID:
        ba, bb = a.binary, b.binary
        return (ba > bb) - (ba < bb)
    if ra == RANK_TIMESTAMP:
        ta, tb = (a.time, a.inc), (b.time, b.inc)
        return (ta > tb) - (ta < tb)
    if ra == RANK_REGEX:
        xa, xb = _regex_parts(a), _regex_parts(b)
        return (xa > xb) - (xa < xb)
    if ra == RANK_STRING:
        sa, sb = str(a), str(b)
        return (sa > sb) - (sa < sb)
    if ra == RANK_DATE:
        ta_, tb_ = _date_ms(a), _date_ms(b)
        return (ta_ > tb_) - (ta_ < tb_)
    return (a > b) - (a < b)


def _date_ms(value: datetime.datetime) -> int:
    if value.tzinfo is not None:
        value = value.astimezone(datetime.UTC).replace(tzinfo=None)
    delta = value - datetime.datetime(1970, 1, 1)
    return delta // datetime.timedelta(milliseconds=1)


def _as_dict(value: Any) -> dict[str, Any]:
    if isinstance(value, DBRef):
        return dict(value.as_doc())
    return value  # type: ignore[no-any-return]


def _compare_documents(a: dict[str, Any], b: dict[str, Any]) -> int:
    items_a, items_b = list(a.items()), list(b.items())
    for (ka, va), (kb, vb) in zip(items_a, items_b):
        ra, rb = type_rank(va), type_rank(vb)
        if ra != rb:
            return -1 if ra < rb else 1
        if ka != kb:
            return -1 if ka < kb else 1
        c = compare_values(va, vb)
        if c:
            return c
    return (len(items_a) > len(items_b)) - (len(items_a) < len(items_b))


def _compare_arrays(a: list[Any], b: list[Any]) -> int:
    for va, vb in zip(a, b):
        c = compare_values(va, vb)
        if c:
            return c
    return (len(a) > len(b)) - (len(a) < len(b))


def values_equal(a: Any, b: Any) -> bool:
    """MongoDB equality: numbers by value, documents by ordered fields, arrays elementwise."""
    return compare_values(a, b) == 0


class SortKey:
    """Wraps a value so Python's sort orders it like MongoDB (use with `sorted(key=...)`)."""

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value

    def __lt__(self, other: SortKey) -> bool:
        return compare_values(self.value, other.value) < 0

    def __eq__(self, other: object) -> bool:
        return isinstance(other, SortKey) and compare_values(self.value, other.value) == 0

    def __hash__(self) -> int:
        return hash(canonical_key(self.value))


def _canonical(value: Any) -> Any:
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, (int, float, Decimal128)):
        return _canonical_number(value)
    if isinstance(value, dict):
        return {k: _canonical(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_canonical(v) for v in value]
    if isinstance(value, uuid.UUID):
        return Binary(value.bytes, 4)
    if isinstance(value, re.Pattern):
        return Regex.from_native(value)
    return value


def _canonical_number(value: Any) -> Any:
    if isinstance(value, Decimal128):
        d = value.to_decimal()
        if d.is_nan():
            return math.nan
        if d == d.to_integral_value() and abs(d) < 2**63:
            return int(d)
        return float(d) if Decimal(float(d)) == d else value
    if isinstance(value, float):
        if math.isnan(value):
            return math.nan
        if value.is_integer() and abs(value) < 2**63:
            return int(value)
        return value
    return int(value)


def canonical_key(value: Any) -> bytes:
    """Bytes equal exactly when the values are equal under MongoDB equality."""
    canon = _canonical(value)
    # The type rank leads so that, e.g., the string "1" and the number 1 differ.
    return bson.encode({"r": type_rank(value), "v": canon})
