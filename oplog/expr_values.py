"""Values in aggregation expressions: the `MISSING` sentinel, type names, truthiness,
comparison, and MongoDB's typing of numeric results.

"Missing" (a path that does not exist) is not null: it is the `MISSING` sentinel, and
most operators treat both alike ("nullish", `is_nullish`). `compare` orders missing
just below null.

Numbers follow MongoDB's widening: int32 -> int64 -> double -> decimal128, and integer
results that overflow int64 become doubles. A Python int outside the int32 range, or a
`bson.Int64`, counts as an int64; int64 results are returned as `Int64`. `NumericSum`
is the running sum of ``$sum``, ``$avg`` and ``$add``.

Pure: no I/O and no clock.
"""

from __future__ import annotations

__layer__ = "core"  # pure: no I/O, clock or randomness (tests/unit/test_layering.py)

import decimal
import math
from collections.abc import Iterable
from decimal import Decimal
from typing import Any

from bson.decimal128 import Decimal128, create_decimal128_context
from bson.int64 import Int64
from bson.min_key import MinKey

from oplog.values import TYPE_ALIASES, bson_type_code, compare_values, is_number

__all__ = [
    "INT32_MAX",
    "INT32_MIN",
    "INT64_MAX",
    "INT64_MIN",
    "MISSING",
    "NumericSum",
    "compare",
    "is_nullish",
    "is_truthy",
    "sum_numbers",
    "type_name",
]


class _Missing:
    """The value of a field path that does not exist (distinct from null)."""

    _instance: _Missing | None = None

    def __new__(cls) -> _Missing:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __bool__(self) -> bool:
        return False

    def __repr__(self) -> str:
        return "MISSING"


MISSING: Any = _Missing()


INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
_KIND_INT, _KIND_LONG, _KIND_DOUBLE, _KIND_DECIMAL = range(4)
# Decimal128 arithmetic: 34 digits, rounding silently (bson's own context traps Inexact).
_DEC_CTX = create_decimal128_context()
_DEC_CTX.traps = dict.fromkeys(_DEC_CTX.traps, False)
_TYPE_NAMES = {code: name for name, code in TYPE_ALIASES.items()}


def type_name(value: Any) -> str:
    """MongoDB's name for a value's BSON type, as ``$type`` reports it."""
    if value is MISSING:
        return "missing"
    try:
        return _TYPE_NAMES[bson_type_code(value)]
    except (TypeError, KeyError):
        return type(value).__name__


def is_nullish(value: Any) -> bool:
    return value is None or value is MISSING


def is_truthy(value: Any) -> bool:
    """Aggregation truthiness: false, null, missing and numeric zero are false."""
    if is_nullish(value) or value is False:
        return False
    if is_number(value):
        return not _number_is_zero(value)
    return True


def _number_is_zero(value: Any) -> bool:
    if isinstance(value, Decimal128):
        return value.to_decimal().is_zero()
    return value == 0


def _null_if_missing(value: Any) -> Any:
    return None if value is MISSING else value


def compare(a: Any, b: Any) -> int:
    """Like `compare_values`, with missing just below null (but above MinKey), as the server's EOO."""
    if a is MISSING or b is MISSING:
        if a is b:
            return 0
        missing_first = not isinstance(b if a is MISSING else a, MinKey)
        return -1 if (a is MISSING) == missing_first else 1
    return compare_values(a, b)


def _num_kind(value: Any) -> int:
    if isinstance(value, Decimal128):
        return _KIND_DECIMAL
    if isinstance(value, float):
        return _KIND_DOUBLE
    if isinstance(value, Int64) or not INT32_MIN <= value <= INT32_MAX:
        return _KIND_LONG
    return _KIND_INT


def _integer_result(value: int, kind: int) -> Any:
    """An exact integer result typed like MongoDB: int32, then int64, then double."""
    if not INT64_MIN <= value <= INT64_MAX:
        return float(value)
    if kind == _KIND_INT and INT32_MIN <= value <= INT32_MAX:
        return int(value)
    return Int64(value)


def _to_decimal(value: Any) -> Decimal:
    if isinstance(value, Decimal128):
        return value.to_decimal()
    if isinstance(value, float):
        return Decimal(repr(value)) if math.isfinite(value) else Decimal(str(value))
    return Decimal(int(value))


def _decimal128(value: Decimal) -> Decimal128:
    with decimal.localcontext(_DEC_CTX) as ctx:
        return Decimal128(ctx.create_decimal(value))


def _to_float(value: Any) -> float:
    if isinstance(value, Decimal128):
        return float(value.to_decimal())
    return float(value)


def _to_int(value: Any) -> int:
    """Truncate a finite number to an int (callers check finiteness when it matters)."""
    if isinstance(value, Decimal128):
        return int(value.to_decimal())
    return int(value)


def _is_integral(value: Any, lo: int = INT64_MIN, hi: int = INT64_MAX) -> bool:
    if not is_number(value):
        return False
    if isinstance(value, float) and not (math.isfinite(value) and value.is_integer()):
        return False
    if isinstance(value, Decimal128):
        d = value.to_decimal()
        if not d.is_finite() or d != d.to_integral_value():
            return False
    return lo <= _to_int(value) <= hi


class NumericSum:
    """A running sum with MongoDB's result typing (used by $sum, $avg and $add)."""

    def __init__(self) -> None:
        self.kind = _KIND_INT
        self.count = 0
        self._ints = 0
        self._floats = 0.0
        self._compensation = 0.0
        self._decimals = Decimal(0)

    def add(self, value: Any) -> None:
        kind = _num_kind(value)
        self.kind = max(self.kind, kind)
        self.count += 1
        if kind == _KIND_DECIMAL:
            with decimal.localcontext(_DEC_CTX):
                self._decimals += value.to_decimal()
        elif kind == _KIND_DOUBLE:
            self._add_float(value)
        else:
            self._ints += int(value)

    def _add_float(self, x: float) -> None:
        # Neumaier summation: close to MongoDB's double-double accumulator.
        s = self._floats
        t = s + x
        if math.isfinite(t):
            if abs(s) >= abs(x):
                self._compensation += (s - t) + x
            else:
                self._compensation += (x - t) + s
        self._floats = t

    def _float_total(self) -> float:
        total = self._floats if not math.isfinite(self._floats) else self._floats + self._compensation
        return float(self._ints) + total if self._ints else total

    def _decimal_total(self) -> Decimal:
        with decimal.localcontext(_DEC_CTX):
            floats = _to_decimal(self._floats + self._compensation)
            return self._decimals + Decimal(self._ints) + floats

    def result(self) -> Any:
        if self.kind == _KIND_DECIMAL:
            return _decimal128(self._decimal_total())
        if self.kind == _KIND_DOUBLE:
            return self._float_total()
        return _integer_result(self._ints, self.kind)

    def average(self) -> Any:
        if not self.count:
            return None
        if self.kind == _KIND_DECIMAL:
            with decimal.localcontext(_DEC_CTX):
                return _decimal128(self._decimal_total() / self.count)
        if self.kind == _KIND_DOUBLE:
            return self._float_total() / self.count
        return self._ints / self.count


def sum_numbers(values: Iterable[Any]) -> Any:
    total = NumericSum()
    for value in values:
        total.add(value)
    return total.result()
