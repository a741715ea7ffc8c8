"""Evaluating filters: the single-value predicates and the match tree a compiled filter is
made of.

A predicate (`Pred`) tests one BSON value, which may be the `MISSING` sentinel.
Comparisons are type-bracketed with `oplog.values` ordering (``{$gt: 5}`` never
matches strings), except ``MinKey``/``MaxKey`` bounds and ``null`` which also cover
missing fields. A match node (`MatchFn`) tests a whole document: `_leaf` asks whether
any value reachable along a path satisfies a predicate, `_elem_leaf` runs an
``$elemMatch`` array test, and `_and`, `_or`, `_nor`, `_not` combine nodes. Negations
wrap the *whole* path test, so ``{a: {$ne: 1}}`` rejects ``{a: [1, 2]}`` just as
MongoDB does. A node records the index of the array element that made its path
match, for the positional ``$``. `oplog.query_parse` builds these trees.

Pure: no I/O, no clocks, no randomness.
"""

from __future__ import annotations

__layer__ = "core"  # pure: no I/O, clock or randomness (tests/unit/test_layering.py)

import datetime
import math
from collections.abc import Callable, Mapping
from typing import Any

from bson.binary import Binary
from bson.decimal128 import Decimal128
from bson.int64 import Int64
from bson.max_key import MaxKey
from bson.min_key import MinKey
from bson.objectid import ObjectId

from oplog.expr_values import MISSING, is_truthy
from oplog.expressions import evaluate
from oplog.query_common import (
    _ARRAY,
    _DOC,
    _NO_TRAVERSE,
    Pred,
    _is_nan,
    _iter_doc,
    _split,
    _truncate_to_long,
)
from oplog.values import RANK_NULL, RANK_NUMBER, bson_type_code, compare_values, is_number, type_rank

_PLAIN_NUM = frozenset({int, float, Int64})


# ---------------------------------------------------------------------------
# Single-value predicates
# ---------------------------------------------------------------------------


def _eq_pred(v: Any) -> Pred:
    """Equality with `v` as the server's $eq: type-bracketed, numbers by value, null ~ missing."""
    if v is None:
        return lambda x: x is None or x is MISSING
    cls = v.__class__
    if cls in _PLAIN_NUM and v == v:

        def num_eq(x: Any) -> bool:
            c = x.__class__
            if c in _PLAIN_NUM:
                return x == v  # type: ignore[no-any-return]
            return c is Decimal128 and compare_values(x, v) == 0

        return num_eq
    if cls is str:
        return lambda x: x.__class__ is str and x == v
    if cls is bool:
        return lambda x: x is v
    if cls is ObjectId:
        return lambda x: x.__class__ is ObjectId and x == v
    rank = type_rank(v)
    return lambda x: x is not MISSING and type_rank(x) == rank and compare_values(x, v) == 0


_CMP_TESTS: dict[str, Callable[[int], bool]] = {
    "$lt": lambda c: c < 0,
    "$lte": lambda c: c <= 0,
    "$gt": lambda c: c > 0,
    "$gte": lambda c: c >= 0,
}


def _cmp_pred(op: str, v: Any) -> Pred:
    """$lt/$lte/$gt/$gte against `v` (type-bracketed; NaN only equals NaN)."""
    test = _CMP_TESTS[op]
    inclusive = op in ("$lte", "$gte")
    if v.__class__ in _PLAIN_NUM and v == v:
        fast = _fast_num_cmp(op, v)
        if fast is not None:
            return fast
    if v.__class__ is str:
        return _fast_str_cmp(op, v)
    rank = type_rank(v)
    # Against MinKey/MaxKey every other value (even a missing one) is in range.
    bound = (op in ("$lt", "$lte")) if isinstance(v, MaxKey) else None
    if isinstance(v, MinKey):
        bound = op in ("$gt", "$gte")
    v_nan = _is_nan(v)

    def pred(x: Any) -> bool:
        if x is MISSING:
            return inclusive if rank == RANK_NULL else bool(bound)
        if type_rank(x) != rank:
            return bool(bound)
        if rank == RANK_NUMBER and (v_nan or _is_nan(x)):
            return inclusive and v_nan and _is_nan(x)
        return test(compare_values(x, v))

    return pred


def _fast_num_cmp(op: str, v: Any) -> Pred | None:
    def slow(x: Any) -> bool:
        return x.__class__ is Decimal128 and not _is_nan(x) and _CMP_TESTS[op](compare_values(x, v))

    num = _PLAIN_NUM
    if op == "$lt":
        return lambda x: x < v if x.__class__ in num else slow(x)
    if op == "$lte":
        return lambda x: x <= v if x.__class__ in num else slow(x)
    if op == "$gt":
        return lambda x: x > v if x.__class__ in num else slow(x)
    if op == "$gte":
        return lambda x: x >= v if x.__class__ in num else slow(x)
    return None


def _fast_str_cmp(op: str, v: str) -> Pred:
    test = _CMP_TESTS[op]
    return lambda x: x.__class__ is str and test((x > v) - (x < v))


def _fast_key(x: Any) -> tuple[int, Any] | None:
    """A hashable key for values whose Python equality matches MongoDB's, else None."""
    c = x.__class__
    if c is str:
        return (4, x)
    if c is int or c is Int64 or (c is float and x == x):
        return (3, x)
    if c is bool:
        return (9, x)
    if c is ObjectId:
        return (8, x)
    if x is None:
        return (2, None)
    return None


def _in_pred(values: list[Any], regexes: list[Pred]) -> Pred:
    """$in: equal to any value or matching any regex; null in the list also matches missing."""
    has_null = any(v is None for v in values)
    fast = {k for k in map(_fast_key, values) if k is not None}
    slow = [_eq_pred(v) for v in values if _fast_key(v) is None]
    every = [_eq_pred(v) for v in values]

    def pred(x: Any) -> bool:
        if x is MISSING:
            return has_null
        key = _fast_key(x)
        if key is not None:
            if key in fast or any(p(x) for p in slow):
                return True
        elif any(p(x) for p in every):
            return True
        return any(r(x) for r in regexes)

    return pred


def _type_pred(codes: frozenset[int]) -> Pred:
    def pred(x: Any) -> bool:
        if x is MISSING:
            return False
        try:
            return bson_type_code(x) in codes
        except TypeError:
            return False

    return pred


def _size_pred(n: int) -> Pred:
    return lambda x: isinstance(x, _ARRAY) and len(x) == n


def _exists_pred(x: Any) -> bool:
    return x is not MISSING


def _c_mod(dividend: int, divisor: int) -> int:
    r = abs(dividend) % abs(divisor)
    return -r if dividend < 0 else r


def _mod_pred(divisor: int, remainder: int) -> Pred:
    def pred(x: Any) -> bool:
        if x.__class__ is bool or not is_number(x):
            return False
        d = _truncate_to_long(x)
        return d is not None and _c_mod(d, divisor) == remainder

    return pred


# ---------------------------------------------------------------------------
# Bit test operators
# ---------------------------------------------------------------------------


def _bit_set(x: Any, pos: int) -> bool | None:
    if isinstance(x, (bytes, Binary)):
        data = bytes(x)
        return pos // 8 < len(data) and bool(data[pos // 8] >> (pos % 8) & 1)
    if x.__class__ is bool or not is_number(x):
        return None
    if x.__class__ is float and (not math.isfinite(x) or x != int(x)):
        return None
    if isinstance(x, Decimal128) and (not x.to_decimal().is_finite() or x.to_decimal() % 1 != 0):
        return None
    value = _truncate_to_long(x)
    if value is None:
        return None
    return value < 0 if pos >= 64 else bool(value >> pos & 1)


def _bits_pred(op: str, positions: list[int]) -> Pred:
    want_set = op in ("$bitsAllSet", "$bitsAnySet")
    want_all = op in ("$bitsAllSet", "$bitsAllClear")

    def pred(x: Any) -> bool:
        if x is MISSING:
            return False
        results = []
        for pos in positions:
            bit = _bit_set(x, pos)
            if bit is None:
                return False
            results.append(bit == want_set)
        return all(results) if want_all else any(results)

    return pred


# ---------------------------------------------------------------------------
# Match tree nodes
# ---------------------------------------------------------------------------


# A compiled predicate over a whole document. `rec` (``[index]`` or None) records the
# array index that made a path match, for the positional operator (MongoDB's elemMatchKey).
MatchFn = Callable[[Any, "list[Any] | None"], bool]


def _leaf(path: str, pred: Pred, mode: int) -> MatchFn:
    """Does any value reachable along `path` satisfy `pred`?"""
    parts = _split(path)
    if len(parts) > 1:

        def match_path(doc: Any, rec: list[Any] | None) -> bool:
            # Fast walk through plain embedded documents; anything else takes the full walk.
            value = doc
            for part in parts:
                if value.__class__ is not dict:
                    break
                value = value.get(part, MISSING)
            else:
                if value.__class__ is not list and value.__class__ is not tuple:
                    return pred(value)
            if value is MISSING or (value.__class__ is not dict and not isinstance(value, (*_ARRAY, Mapping))):
                return pred(MISSING)
            for value, offset in _iter_doc(doc, parts, 0, mode):
                if pred(value):
                    if rec is not None and offset is not None:
                        rec[0] = offset
                    return True
            return False

        return match_path
    name = path
    if mode == _NO_TRAVERSE:
        return lambda doc, rec: pred(doc.get(name, MISSING))

    def match_field(doc: Any, rec: list[Any] | None) -> bool:
        value = doc.get(name, MISSING)
        if value.__class__ is list or value.__class__ is tuple:
            for k, elem in enumerate(value):
                if pred(elem):
                    if rec is not None:
                        rec[0] = k
                    return True
        return pred(value)

    return match_field


class _ElemMatch:
    """The array test of ``$elemMatch``: index of the first matching element, or -1."""

    __slots__ = ("elem_pred", "sub")

    def __init__(self, sub: MatchFn | None, elem_pred: Pred | None) -> None:
        self.sub = sub  # document form: a compiled sub-filter
        self.elem_pred = elem_pred  # value form: a single-value predicate

    def find(self, arr: Any) -> int:
        if not isinstance(arr, _ARRAY):
            return -1
        pred = self.elem_pred
        if pred is not None:
            for k, elem in enumerate(arr):
                if pred(elem):
                    return k
            return -1
        sub = self.sub
        assert sub is not None
        for k, elem in enumerate(arr):
            if isinstance(elem, _DOC):
                if sub(elem, None):
                    return k
            elif isinstance(elem, _ARRAY) and sub({str(i): e for i, e in enumerate(elem)}, None):
                return k  # an array element is matched as the object {"0": ..., "1": ...}
        return -1


def _elem_leaf(path: str, elem: _ElemMatch) -> MatchFn:
    parts = _split(path)
    find = elem.find

    def match(doc: Any, rec: list[Any] | None) -> bool:
        for value, offset in _iter_doc(doc, parts, 0, _NO_TRAVERSE):
            k = find(value)
            if k >= 0:
                if rec is not None:
                    rec[0] = k if offset is None else offset
                return True
        return False

    return match


def _and(children: list[MatchFn]) -> MatchFn:
    if len(children) == 1:
        return children[0]
    if len(children) == 2:
        first, second = children
        return lambda doc, rec: first(doc, rec) and second(doc, rec)

    def match(doc: Any, rec: list[Any] | None) -> bool:
        for child in children:
            if not child(doc, rec):
                return False
        return True

    return match


def _or(children: list[MatchFn]) -> MatchFn:
    # $or, $nor and $not never report an array index (the server passes no details down).
    return lambda doc, rec: any(child(doc, None) for child in children)


def _nor(children: list[MatchFn]) -> MatchFn:
    return lambda doc, rec: not any(child(doc, None) for child in children)


def _not(child: MatchFn) -> MatchFn:
    return lambda doc, rec: not child(doc, None)


def _const(value: bool) -> MatchFn:
    return lambda doc, rec: value


def _expr(expr: Any, now: datetime.datetime) -> MatchFn:
    return lambda doc, rec: is_truthy(evaluate(expr, doc, now=now))
