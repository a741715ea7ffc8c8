"""Arithmetic expression operators: ``$add``, ``$subtract``, ``$multiply``, ``$divide``,
``$mod``, ``$abs``, ``$ceil``, ``$floor``, ``$trunc``, ``$round``, ``$sqrt``, ``$exp``,
``$ln``, ``$log10``, ``$pow``, and the expression forms of ``$sum``, ``$avg``,
``$min`` and ``$max``.

Results are typed the way MongoDB types them (`oplog.expr_values`). ``$add`` also adds
milliseconds to a date, and ``$subtract`` takes them from a date or subtracts two dates.
Integer arithmetic is mongod's 64-bit arithmetic: a ``$pow`` or ``$multiply`` result that would
not fit a long is a double (never a bigger Python integer), and double functions overflow to
infinity as C's do.

Pure: no I/O and no clock.
"""

from __future__ import annotations

__layer__ = "core"  # pure: no I/O, clock or randomness (tests/unit/test_layering.py)

import datetime
import decimal
import math
from decimal import Decimal
from typing import Any

from bson.decimal128 import Decimal128
from bson.int64 import Int64

from base.errors import MongoError
from oplog.expr_dates import _date_ms
from oplog.expr_eval import Context, _eager, _lazy, draw_random
from oplog.expr_values import (
    _DEC_CTX,
    _KIND_DECIMAL,
    _KIND_DOUBLE,
    _KIND_INT,
    INT64_MAX,
    INT64_MIN,
    NumericSum,
    _decimal128,
    _integer_result,
    _is_integral,
    _num_kind,
    _number_is_zero,
    _to_decimal,
    _to_float,
    _to_int,
    compare,
    is_nullish,
    sum_numbers,
    type_name,
)
from oplog.values import is_number


def _date_plus_ms(date: datetime.datetime, ms: Any) -> datetime.datetime:
    if isinstance(ms, float):
        if not math.isfinite(ms):
            raise MongoError(15, "date overflow")
        ms = round(ms)
    try:
        return date + datetime.timedelta(milliseconds=_to_int(ms))
    except OverflowError:
        raise MongoError(15, "date overflow")


@_eager("$add")
def _op_add(name: str, vals: list[Any], ctx: Context) -> Any:
    date = None
    total = NumericSum()
    for value in vals:
        if is_nullish(value):
            return None
        if isinstance(value, datetime.datetime):
            if date is not None:
                raise MongoError(16612, "only one date allowed in an $add expression")
            date = value
        elif is_number(value):
            total.add(value)
        else:
            raise MongoError(14, f"$add only supports numeric or date types, not {type_name(value)}")
    return total.result() if date is None else _date_plus_ms(date, total.result())


def _subtract_numbers(a: Any, b: Any) -> Any:
    kind = max(_num_kind(a), _num_kind(b))
    if kind == _KIND_DECIMAL:
        with decimal.localcontext(_DEC_CTX):
            return _decimal128(_to_decimal(a) - _to_decimal(b))
    if kind == _KIND_DOUBLE:
        return _to_float(a) - _to_float(b)
    return _integer_result(int(a) - int(b), kind)


@_eager("$subtract", nmin=2, nmax=2)
def _op_subtract(name: str, vals: list[Any], ctx: Context) -> Any:
    a, b = vals
    if is_number(a) and is_number(b):
        return _subtract_numbers(a, b)
    if is_nullish(a) or is_nullish(b):
        return None
    if isinstance(a, datetime.datetime):
        if isinstance(b, datetime.datetime):
            return Int64(_date_ms(a) - _date_ms(b))
        if is_number(b):
            return _date_plus_ms(a, -_to_float(b) if isinstance(b, float) else -_to_int(b))
        raise MongoError(14, f"can't $subtract {type_name(b)} from date")
    raise MongoError(14, f"can't $subtract {type_name(b)} from {type_name(a)}")


@_eager("$multiply")
def _op_multiply(name: str, vals: list[Any], ctx: Context) -> Any:
    """As mongod: an integer product that overflows int64 goes on as a double (never a big int)."""
    kind = _KIND_INT
    for value in vals:
        if is_nullish(value):
            return None
        if not is_number(value):
            raise MongoError(14, f"$multiply only supports numeric types, not {type_name(value)}")
        kind = max(kind, _num_kind(value))
    if kind == _KIND_DECIMAL:
        with decimal.localcontext(_DEC_CTX):
            return _decimal128(math.prod((_to_decimal(v) for v in vals), start=Decimal(1)))
    product, double_product = 1, 1.0
    for value in vals:
        double_product *= _to_float(value)
        if kind != _KIND_DOUBLE:
            product *= int(value)
            if not INT64_MIN <= product <= INT64_MAX:
                kind = _KIND_DOUBLE
    if kind == _KIND_DOUBLE:
        return double_product
    return _integer_result(product, kind)


@_eager("$divide", nmin=2, nmax=2)
def _op_divide(name: str, vals: list[Any], ctx: Context) -> Any:
    a, b = vals
    if is_number(a) and is_number(b):
        if _number_is_zero(b):
            raise MongoError(2, "can't $divide by zero")
        if isinstance(a, Decimal128) or isinstance(b, Decimal128):
            with decimal.localcontext(_DEC_CTX):
                return _decimal128(_to_decimal(a) / _to_decimal(b))
        return _to_float(a) / _to_float(b)
    if is_nullish(a) or is_nullish(b):
        return None
    raise MongoError(14, f"$divide only supports numeric types, not {type_name(a)} and {type_name(b)}")


@_eager("$mod", nmin=2, nmax=2)
def _op_mod(name: str, vals: list[Any], ctx: Context) -> Any:
    a, b = vals
    if is_number(a) and is_number(b):
        kind = max(_num_kind(a), _num_kind(b))
        if _number_is_zero(b):
            raise MongoError(5733415 if kind == _KIND_DECIMAL else 16610, "can't $mod by zero")
        if kind == _KIND_DECIMAL:
            with decimal.localcontext(_DEC_CTX):
                return _decimal128(_to_decimal(a) % _to_decimal(b))
        if kind == _KIND_DOUBLE:
            return math.fmod(_to_float(a), _to_float(b))
        remainder = abs(int(a)) % abs(int(b))
        return _integer_result(-remainder if a < 0 else remainder, kind)
    if is_nullish(a) or is_nullish(b):
        return None
    raise MongoError(16611, f"$mod only supports numeric types, not {type_name(a)} and {type_name(b)}")


def _unary_number(name: str, value: Any) -> Any:
    """The argument of a one-number operator, or None when it is nullish."""
    if is_nullish(value):
        return None
    if not is_number(value):
        raise MongoError(28765, f"{name} only supports numeric types, not {type_name(value)}")
    return value


@_eager("$abs", nmin=1, nmax=1)
def _op_abs(name: str, vals: list[Any], ctx: Context) -> Any:
    value = _unary_number(name, vals[0])
    if value is None:
        return None
    if isinstance(value, Decimal128):
        return _decimal128(abs(value.to_decimal()))
    if isinstance(value, float):
        return abs(value)
    if value == INT64_MIN:
        raise MongoError(28680, "can't take $abs of long long min")
    return _integer_result(abs(int(value)), _num_kind(value))


_ROUNDING = {
    "$ceil": decimal.ROUND_CEILING,
    "$floor": decimal.ROUND_FLOOR,
    "$trunc": decimal.ROUND_DOWN,
    "$round": decimal.ROUND_HALF_EVEN,
}


@_eager("$ceil", "$floor", nmin=1, nmax=1)
@_eager("$trunc", "$round", nmin=1, nmax=2)
def _op_round(name: str, vals: list[Any], ctx: Context) -> Any:
    value = _unary_number(name, vals[0])
    place = vals[1] if len(vals) > 1 else 0
    if value is None or is_nullish(place):
        return None
    if not _is_integral(place, -20, 100):
        raise MongoError(51083, f"cannot apply {name} with precision value {place} value must be in [-20, 100]")
    place = _to_int(place)
    if isinstance(value, float) and not math.isfinite(value):
        return value
    if isinstance(value, int) and place >= 0:
        return value
    with decimal.localcontext(_DEC_CTX) as dctx:
        rounded = _to_decimal(value).quantize(Decimal(1).scaleb(-place), rounding=_ROUNDING[name])
        if dctx.flags[decimal.InvalidOperation]:  # more digits than decimal128 holds: unchanged
            return value
    if isinstance(value, Decimal128):
        return _decimal128(rounded)
    if isinstance(value, float):
        return float(rounded)
    return _integer_result(int(rounded), _num_kind(value))


@_eager("$sqrt", "$exp", "$ln", "$log10", nmin=1, nmax=1)
def _op_float_fn(name: str, vals: list[Any], ctx: Context) -> Any:
    value = _unary_number(name, vals[0])
    if value is None:
        return None
    x = _to_float(value)
    if name == "$sqrt":
        if x < 0:
            raise MongoError(28714, "$sqrt's argument must be greater than or equal to 0")
        return math.sqrt(x)
    if name == "$exp":
        return _c_exp(x)
    if x <= 0:
        raise MongoError(28766 if name == "$ln" else 28761, f"{name}'s argument must be a positive number, but is {x}")
    return math.log(x) if name == "$ln" else math.log10(x)


def _c_exp(x: float) -> float:
    """C's ``exp``: infinity past the largest double, where Python's `math.exp` raises."""
    try:
        return math.exp(x)
    except OverflowError:
        return math.inf


def c_pow(base: float, exp: float) -> float:
    """C's ``pow`` (what mongod calls): infinity on overflow, NaN for a negative base and a
    fractional exponent, where Python's `math.pow` raises."""
    try:
        return math.pow(base, exp)
    except OverflowError:
        odd = exp.is_integer() and abs(exp) < 2**53 and int(exp) % 2 == 1
        return -math.inf if base < 0 and odd else math.inf
    except ValueError:
        return math.nan if base != 0 else math.inf


def _integer_pow(base: int, exp: int, kind: int) -> Any:
    """mongod's integer ``$pow``: exact while the result fits a long (so the exponent is at most 63,
    or the base is -1, 0 or 1), else the double ``pow`` gives; an int when both are ints and the
    result fits one. Never builds a bigger integer than 64 * 64 bits."""
    if base in (0, 1, -1):
        if exp < 0:  # (a base of 0 with a negative exponent was refused before)
            exp = -exp
        return _integer_result(0 if base == 0 and exp else (-1 if base == -1 and exp % 2 else 1), kind)
    if 0 <= exp <= 63:
        result = base ** exp
        if INT64_MIN <= result <= INT64_MAX:
            return _integer_result(result, kind)
    return c_pow(float(base), float(exp))


@_eager("$pow", nmin=2, nmax=2)
def _op_pow(name: str, vals: list[Any], ctx: Context) -> Any:
    base, exp = vals
    if is_nullish(base) or is_nullish(exp):
        return None
    for what, value in (("base", base), ("exponent", exp)):
        if not is_number(value):
            raise MongoError(28762 if what == "base" else 28763, f"$pow's {what} must be numeric, not {type_name(value)}")
    kind = max(_num_kind(base), _num_kind(exp))
    if kind == _KIND_DECIMAL:
        base_dec, exp_dec = _to_decimal(base), _to_decimal(exp)
        if base_dec.is_zero() and exp_dec.is_signed() and not exp_dec.is_zero():
            raise MongoError(28764, "$pow cannot take a base of 0 and a negative exponent")
        with decimal.localcontext(_DEC_CTX):
            return _decimal128(base_dec ** exp_dec)
    if _to_float(base) == 0 and _to_float(exp) < 0:
        raise MongoError(28764, "$pow cannot take a base of 0 and a negative exponent")
    if kind == _KIND_DOUBLE:
        return c_pow(_to_float(base), _to_float(exp))
    return _integer_pow(int(base), int(exp), kind)


def _numeric_operands(vals: list[Any]) -> list[Any]:
    """$sum/$avg/$min/$max expression form: one array argument is traversed."""
    if len(vals) == 1 and isinstance(vals[0], list):
        return vals[0]
    return vals


@_eager("$sum")
def _op_sum(name: str, vals: list[Any], ctx: Context) -> Any:
    return sum_numbers(v for v in _numeric_operands(vals) if is_number(v))


@_eager("$avg")
def _op_avg(name: str, vals: list[Any], ctx: Context) -> Any:
    total = NumericSum()
    for value in _numeric_operands(vals):
        if is_number(value):
            total.add(value)
    return total.average()


@_eager("$min", "$max")
def _op_min_max(name: str, vals: list[Any], ctx: Context) -> Any:
    best: Any = None
    sign = -1 if name == "$min" else 1
    for value in _numeric_operands(vals):
        if is_nullish(value):
            continue
        if best is None or compare(value, best) * sign > 0:
            best = value
    return best


@_lazy("$rand")
def _op_rand(name: str, raw: Any, ctx: Context) -> float:
    """A double in [0, 1), drawn from the runtime's source (`oplog.expr_eval.install_random_source`). A
    write that uses it logs the value drawn, so every member applies the same one."""
    if raw != {}:
        raise MongoError(3040501, "$rand does not currently accept arguments")
    return draw_random()
