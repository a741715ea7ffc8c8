"""Aggregation expressions: MongoDB's expression language evaluated against one document.

Theory of operation
-------------------
An expression is plain BSON data interpreted recursively by `_eval`:

* a string starting with ``$`` is a field path on ``$$CURRENT`` (``"$a.b"``); a path
  that crosses an array yields the array of the values found in its documents;
* a string starting with ``$$`` names a variable (``$$ROOT``, ``$$CURRENT``, ``$$NOW``,
  ``$$REMOVE``, or one bound by ``$let``/``$map``/``$filter``/``$reduce``), optionally
  followed by ``.path``;
* a one-key document whose key starts with ``$`` is an operator call, looked up in the
  `_OPERATORS` dispatch table (unknown names raise 168 InvalidPipelineOperator);
* any other document is an *expression object*: every value is evaluated and fields
  that come out "missing" are left out;
* an array evaluates element-wise (missing elements become null);
* anything else is a literal.

"Missing" (a path that does not exist) is not null: it is the `MISSING` sentinel, and
most operators treat both alike ("nullish"). Operators are either *eager* (their
arguments are evaluated first; arity comes from the table and is checked both when a
pipeline is parsed, by `validate_expression`, and when it runs) or *lazy* (they get the
raw argument and evaluate only what they need: ``$cond``, ``$and``, ``$let``, ``$map``…;
their named-argument documents are described by `_Args`). `validate_expression` is
the parse-time pass: operator names, arities, argument documents, field paths and
variable scope (``$$x`` must be built in or bound by an enclosing ``$let``/``$map``…),
so callers (pipelines, ``$expr``, find projections) validate once and then `evaluate`
per document.

Numbers follow MongoDB's widening: int32 -> int64 -> double -> decimal128, and integer
results that overflow int64 become doubles. A Python int outside the int32 range, or a
`bson.Int64`, counts as an int64; int64 results are returned as `Int64`.

Pure: no I/O and no clock (``$$NOW`` is the ``now`` the caller passes in).
"""

from __future__ import annotations

__layer__ = "core"  # pure: no I/O, clock or randomness (tests/unit/test_layering.py)

import datetime
import decimal
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any, NamedTuple

from bson.decimal128 import Decimal128, create_decimal128_context
from bson.int64 import Int64
from bson.min_key import MinKey
from bson.objectid import ObjectId
from bson.timestamp import Timestamp

from oplog.errors import MongoError
from oplog.values import TYPE_ALIASES, bson_type_code, compare_values, is_number

__all__ = [
    "MISSING",
    "Context",
    "NumericSum",
    "compare",
    "evaluate",
    "evaluate_in",
    "format_date",
    "is_nullish",
    "is_operator",
    "is_truthy",
    "merge_object_into",
    "sum_numbers",
    "type_name",
    "validate_expression",
    "walk_path",
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
_EPOCH = datetime.datetime(1970, 1, 1)
_TYPE_NAMES = {code: name for name, code in TYPE_ALIASES.items()}


@dataclass(frozen=True)
class Context:
    """What an expression can see: the document, ``$$NOW`` and bound variables."""

    root: Any
    now: datetime.datetime
    current: Any = None
    variables: dict[str, Any] = field(default_factory=dict)

    def bind(self, **values: Any) -> Context:
        return Context(self.root, self.now, self.current, {**self.variables, **values})


def evaluate(expr: Any, doc: Any, *, now: datetime.datetime) -> Any:
    """Evaluate `expr` with `doc` as ``$$ROOT``/``$$CURRENT``; may return `MISSING`."""
    return _eval(expr, Context(doc, now, doc))


def evaluate_in(expr: Any, ctx: Context) -> Any:
    """Evaluate `expr` in an existing context (used by the pipeline stages)."""
    return _eval(expr, ctx)


# ---------------------------------------------------------------------------
# Value helpers


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


# ---------------------------------------------------------------------------
# Core evaluation


def _eval(expr: Any, ctx: Context) -> Any:
    if isinstance(expr, str):
        return _eval_path(expr, ctx) if expr.startswith("$") else expr
    if isinstance(expr, dict):
        if expr and next(iter(expr)).startswith("$"):
            return _eval_operator(expr, ctx)
        return _eval_object(expr, ctx)
    if isinstance(expr, list):
        return [_null_if_missing(_eval(item, ctx)) for item in expr]
    return expr


def _eval_object(expr: dict[str, Any], ctx: Context) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, sub in expr.items():
        value = _eval(sub, ctx)
        if value is not MISSING:
            out[key] = value
    return out


def _eval_path(expr: str, ctx: Context) -> Any:
    if expr.startswith("$$"):
        name, _, rest = expr[2:].partition(".")
        base = _variable(name, ctx)
        return walk_path(base, rest.split(".")) if rest else base
    if expr == "$":
        raise MongoError(16872, "'$' by itself is not a valid FieldPath")
    return walk_path(ctx.current, expr[1:].split("."))


def _variable(name: str, ctx: Context) -> Any:
    if name in ctx.variables:
        return ctx.variables[name]
    if name == "ROOT":
        return ctx.root
    if name == "CURRENT":
        return ctx.current
    if name == "REMOVE":
        return MISSING
    if name == "NOW":
        return ctx.now
    raise MongoError(17276, f"Use of undefined variable: {name}")


def walk_path(value: Any, parts: list[str]) -> Any:
    """Aggregation field-path lookup: arrays on the way yield arrays of the values found."""
    for i, part in enumerate(parts):
        if isinstance(value, dict):
            value = value.get(part, MISSING)
        elif isinstance(value, list):
            return _walk_array(value, parts[i:])
        else:
            return MISSING
        if value is MISSING:
            return MISSING
    return value


def _walk_array(array: list[Any], parts: list[str]) -> list[Any]:
    out = []
    for item in array:
        if isinstance(item, dict):
            found = walk_path(item, parts)
            if found is not MISSING:
                out.append(found)
    return out


class _Args(NamedTuple):
    """A lazy operator's named-argument document: allowed and required keys, error codes."""

    allowed: tuple[str, ...]
    required: tuple[str, ...]
    codes: tuple[int, int]  # (not an object / unknown key, missing key)


class _Op(NamedTuple):
    fn: Callable[[str, Any, Context], Any]
    nmin: int
    nmax: int | None
    lazy: bool
    args: _Args | None = None


_OPERATORS: dict[str, _Op] = {}


def _eager(*names: str, nmin: int = 0, nmax: int | None = None) -> Callable[[Any], Any]:
    """Register an operator whose arguments are evaluated before it runs."""

    def register(fn: Callable[[str, list[Any], Context], Any]) -> Any:
        for name in names:
            _OPERATORS[name] = _Op(fn, nmin, nmax, False)
        return fn

    return register


def _lazy(*names: str, args: _Args | None = None) -> Callable[[Any], Any]:
    """Register an operator that receives its raw, unevaluated argument (a named-argument
    document described by `args`, if given: `_object_args` checks it)."""

    def register(fn: Callable[[str, Any, Context], Any]) -> Any:
        for name in names:
            _OPERATORS[name] = _Op(fn, 0, None, True, args)
        return fn

    return register


def is_operator(name: str) -> bool:
    """Whether `name` (such as ``"$add"``) is an expression operator this module implements."""
    return name in _OPERATORS


def _lookup_operator(expr: dict[str, Any]) -> tuple[str, _Op]:
    if len(expr) != 1:
        raise MongoError(
            15983, f"An object representing an expression must have exactly one field: {expr!r}"
        )
    name = next(iter(expr))
    op = _OPERATORS.get(name)
    if op is None:
        raise MongoError(168, f"Unrecognized expression '{name}'")
    return name, op


def _check_arity(name: str, op: _Op, count: int) -> None:
    if op.nmax is not None and op.nmin == op.nmax and count != op.nmin:
        raise MongoError(
            16020, f"Expression {name} takes exactly {op.nmin} arguments. {count} were passed in."
        )
    if count < op.nmin or (op.nmax is not None and count > op.nmax):
        most = f", and at most {op.nmax}" if op.nmax is not None else ""
        raise MongoError(
            28667,
            f"Expression {name} takes at least {op.nmin} arguments{most}, but {count} were passed in.",
        )


def _eval_operator(expr: dict[str, Any], ctx: Context) -> Any:
    name, op = _lookup_operator(expr)
    raw = expr[name]
    if op.lazy:
        return op.fn(name, raw, ctx)
    args = raw if isinstance(raw, list) else [raw]
    _check_arity(name, op, len(args))
    return op.fn(name, [_eval(arg, ctx) for arg in args], ctx)


_BUILTIN_VARIABLES = frozenset({"ROOT", "CURRENT", "NOW", "REMOVE"})


def validate_expression(expr: Any, variables: Iterable[str] = ()) -> None:
    """Parse-time checks: operator names, arities, named-argument documents, field-path
    syntax and variable references (`variables` are names bound around `expr`)."""
    _validate(expr, _BUILTIN_VARIABLES.union(variables))


def _validate(expr: Any, scope: frozenset[str]) -> None:
    if isinstance(expr, str):
        if expr.startswith("$"):
            _check_field_path(expr)
            name = expr[2:].partition(".")[0]
            if expr.startswith("$$") and name not in scope:
                raise MongoError(17276, f"Use of undefined variable: {name}")
    elif isinstance(expr, list):
        for item in expr:
            _validate(item, scope)
    elif isinstance(expr, dict):
        if expr and next(iter(expr)).startswith("$"):
            name, op = _lookup_operator(expr)
            raw = expr[name]
            if op.lazy:
                _validate_lazy(name, op, raw, scope)
            else:
                _check_arity(name, op, len(raw) if isinstance(raw, list) else 1)
                _validate(raw, scope)
            return
        for key, sub in expr.items():
            _check_field_name(key)
            _validate(sub, scope)


def _validate_lazy(name: str, op: _Op, raw: Any, scope: frozenset[str]) -> None:
    if name == "$literal":
        return
    if op.args is None or (name == "$cond" and isinstance(raw, list)):
        if name == "$cond":
            _cond_args(name, raw)
        _validate(raw, scope)
        return
    spec = _object_args(name, raw)
    inner = scope
    if name == "$let":
        bound = _let_vars(spec)
        _validate(list(bound.values()), scope)
        inner = scope.union(bound)
    elif name in ("$map", "$filter"):
        inner = scope | {_as_variable(name, spec)}
    elif name == "$reduce":
        inner = scope | {"this", "value"}
    elif name == "$switch":
        _switch_branches(spec)
    for key, sub in spec.items():
        if not (name == "$let" and key == "vars"):
            _validate(sub, inner if key in ("in", "cond") else scope)


def _check_field_name(key: str) -> None:
    if key.startswith("$"):
        raise MongoError(16410, f"FieldPath field names may not start with '$': {key}")
    if "." in key:
        raise MongoError(16412, f"FieldPath field names may not contain '.': {key}")


def _check_field_path(expr: str) -> None:
    body = expr[2:] if expr.startswith("$$") else expr[1:]
    if not body:
        raise MongoError(16872, "'$' by itself is not a valid FieldPath")
    if any(part == "" for part in body.split(".")):
        raise MongoError(15998, f"FieldPath field names may not be empty strings: {expr}")


# ---------------------------------------------------------------------------
# Arithmetic


def _date_ms(value: datetime.datetime) -> int:
    if value.tzinfo is not None:
        value = value.astimezone(datetime.UTC).replace(tzinfo=None)
    return (value - _EPOCH) // datetime.timedelta(milliseconds=1)


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
    if kind == _KIND_DOUBLE:
        return math.prod(_to_float(v) for v in vals)
    return _integer_result(math.prod(int(v) for v in vals), kind)


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
        return math.exp(x)
    if x <= 0:
        raise MongoError(28766 if name == "$ln" else 28761, f"{name}'s argument must be a positive number, but is {x}")
    return math.log(x) if name == "$ln" else math.log10(x)


@_eager("$pow", nmin=2, nmax=2)
def _op_pow(name: str, vals: list[Any], ctx: Context) -> Any:
    base, exp = vals
    if is_nullish(base) or is_nullish(exp):
        return None
    for what, value in (("base", base), ("exponent", exp)):
        if not is_number(value):
            raise MongoError(28762 if what == "base" else 28763, f"$pow's {what} must be numeric, not {type_name(value)}")
    if _number_is_zero(base) and _to_float(exp) < 0:
        raise MongoError(28764, "$pow cannot take a base of 0 and a negative exponent")
    kind = max(_num_kind(base), _num_kind(exp))
    if kind == _KIND_DECIMAL:
        with decimal.localcontext(_DEC_CTX):
            return _decimal128(_to_decimal(base) ** _to_decimal(exp))
    if kind == _KIND_DOUBLE or (exp < 0 and base not in (1, -1)):  # int base and exponent here
        return math.pow(_to_float(base), _to_float(exp))
    return _integer_result(int(base) ** abs(int(exp)), kind)


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


# ---------------------------------------------------------------------------
# Comparison, boolean and conditional


_COMPARISONS: dict[str, Callable[[int], bool]] = {
    "$eq": lambda c: c == 0,
    "$ne": lambda c: c != 0,
    "$gt": lambda c: c > 0,
    "$gte": lambda c: c >= 0,
    "$lt": lambda c: c < 0,
    "$lte": lambda c: c <= 0,
}


@_eager(*_COMPARISONS, nmin=2, nmax=2)
def _op_compare(name: str, vals: list[Any], ctx: Context) -> Any:
    return _COMPARISONS[name](compare(vals[0], vals[1]))


@_eager("$cmp", nmin=2, nmax=2)
def _op_cmp(name: str, vals: list[Any], ctx: Context) -> Any:
    return compare(vals[0], vals[1])


@_lazy("$and", "$or")
def _op_and_or(name: str, raw: Any, ctx: Context) -> Any:
    want = name == "$or"
    for arg in raw if isinstance(raw, list) else [raw]:
        if is_truthy(_eval(arg, ctx)) == want:
            return want
    return not want


@_eager("$not", nmin=1, nmax=1)
def _op_not(name: str, vals: list[Any], ctx: Context) -> Any:
    return not is_truthy(vals[0])


def _object_args(name: str, raw: Any) -> dict[str, Any]:
    """Check an operator's named-argument document against its registered `_Args`."""
    args = _OPERATORS[name].args
    assert args is not None
    allowed, required, codes = args
    if not isinstance(raw, dict):
        raise MongoError(codes[0], f"{name} requires an object as an argument, found: {type_name(raw)}")
    for key in raw:
        if key not in allowed:
            raise MongoError(codes[0], f"Unrecognized parameter to {name}: {key}")
    for key in required:
        if key not in raw:
            raise MongoError(codes[1], f"Missing '{key}' parameter to {name}")
    return raw


def _cond_args(name: str, raw: Any) -> tuple[Any, Any, Any]:
    if isinstance(raw, list):
        if len(raw) != 3:
            raise MongoError(16020, f"Expression $cond takes exactly 3 arguments. {len(raw)} were passed in.")
        cond, then, other = raw
        return cond, then, other
    spec = _object_args(name, raw)
    return spec["if"], spec["then"], spec["else"]


@_lazy("$cond", args=_Args(("if", "then", "else"), ("if", "then", "else"), (17083, 17080)))
def _op_cond(name: str, raw: Any, ctx: Context) -> Any:
    cond, then, other = _cond_args(name, raw)
    return _eval(then if is_truthy(_eval(cond, ctx)) else other, ctx)


@_eager("$ifNull", nmin=2)
def _op_if_null(name: str, vals: list[Any], ctx: Context) -> Any:
    for value in vals[:-1]:
        if not is_nullish(value):
            return value
    return vals[-1]


def _switch_branches(spec: dict[str, Any]) -> list[dict[str, Any]]:
    branches = spec["branches"]
    if not isinstance(branches, list):
        raise MongoError(40061, f"$switch expected an array for 'branches', found: {type_name(branches)}")
    for branch in branches:
        if not isinstance(branch, dict) or "case" not in branch or "then" not in branch:
            raise MongoError(40064, "$switch requires each branch have a 'case' and 'then' expression")
    return branches


@_lazy("$switch", args=_Args(("branches", "default"), ("branches",), (40061, 40068)))
def _op_switch(name: str, raw: Any, ctx: Context) -> Any:
    spec = _object_args(name, raw)
    for branch in _switch_branches(spec):
        if is_truthy(_eval(branch["case"], ctx)):
            return _eval(branch["then"], ctx)
    if "default" not in spec:
        raise MongoError(
            40066, "$switch could not find a matching branch for an input, and no default was specified."
        )
    return _eval(spec["default"], ctx)


@_lazy("$literal")
def _op_literal(name: str, raw: Any, ctx: Context) -> Any:
    return raw


def _let_vars(spec: dict[str, Any]) -> dict[str, Any]:
    bound = spec["vars"]
    if not isinstance(bound, dict):
        raise MongoError(10065, f"invalid parameter: expected an object (vars), found: {type_name(bound)}")
    return bound


@_lazy("$let", args=_Args(("vars", "in"), ("vars", "in"), (16875, 16876)))
def _op_let(name: str, raw: Any, ctx: Context) -> Any:
    spec = _object_args(name, raw)
    values = {var: _eval(expr, ctx) for var, expr in _let_vars(spec).items()}
    return _eval(spec["in"], ctx.bind(**values))


# ---------------------------------------------------------------------------
# Strings


def _format_double(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "Infinity" if value > 0 else "-Infinity"
    text = repr(value)
    return text[:-2] if text.endswith(".0") else text


def format_date(value: datetime.datetime) -> str:
    return _format_date(_utc_naive(value), "%Y-%m-%dT%H:%M:%S.%LZ", 0)


def _coerce_to_string(name: str, value: Any) -> str:
    if is_nullish(value):
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        raise MongoError(16007, "can't convert from BSON type bool to String")
    if isinstance(value, float):
        return _format_double(value)
    if isinstance(value, (int, Decimal128)):
        return str(value)
    if isinstance(value, datetime.datetime):
        return format_date(value)
    raise MongoError(16007, f"can't convert from BSON type {type_name(value)} to String")


_ASCII_UPPER = str.maketrans("abcdefghijklmnopqrstuvwxyz", "ABCDEFGHIJKLMNOPQRSTUVWXYZ")
_ASCII_LOWER = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")


@_eager("$toUpper", "$toLower", nmin=1, nmax=1)
def _op_case(name: str, vals: list[Any], ctx: Context) -> Any:
    text = _coerce_to_string(name, vals[0])
    return text.translate(_ASCII_UPPER if name == "$toUpper" else _ASCII_LOWER)


@_eager("$concat")
def _op_concat(name: str, vals: list[Any], ctx: Context) -> Any:
    for value in vals:
        if is_nullish(value):
            return None
        if not isinstance(value, str):
            raise MongoError(16702, f"$concat only supports strings, not {type_name(value)}")
    return "".join(vals)


def _is_continuation(byte: int) -> bool:
    return 0x80 <= byte < 0xC0


@_eager("$substr", "$substrBytes", nmin=3, nmax=3)
def _op_substr_bytes(name: str, vals: list[Any], ctx: Context) -> Any:
    text, start, length = vals
    data = _coerce_to_string(name, text).encode()
    if not is_number(start):
        raise MongoError(16034, f"{name}: starting index must be a numeric type (is BSON type {type_name(start)})")
    if not is_number(length):
        raise MongoError(16035, f"{name}: length must be a numeric type (is BSON type {type_name(length)})")
    lo, count = _to_int(start), _to_int(length)
    if lo < 0 or lo >= len(data):
        return ""
    hi = len(data) if count < 0 else min(lo + count, len(data))
    if _is_continuation(data[lo]):
        raise MongoError(28656, f"{name}:  Invalid range, starting index is a UTF-8 continuation byte.")
    if hi < len(data) and _is_continuation(data[hi]):
        raise MongoError(28657, f"{name}:  Invalid range, ending index is in the middle of a UTF-8 character.")
    return data[lo:hi].decode()


@_eager("$substrCP", nmin=3, nmax=3)
def _op_substr_cp(name: str, vals: list[Any], ctx: Context) -> Any:
    text, start, length = vals
    text = _coerce_to_string(name, text)
    for what, value, codes in (("starting index", start, (34450, 34451)), ("length", length, (34452, 34453))):
        if not is_number(value):
            raise MongoError(codes[0], f"$substrCP: {what} must be a numeric type (is BSON type {type_name(value)})")
        if not _is_integral(value, INT32_MIN, INT32_MAX):
            raise MongoError(codes[1], f"$substrCP: {what} cannot be represented as a 32-bit integral value: {value}")
    lo, count = _to_int(start), _to_int(length)
    if lo < 0:
        raise MongoError(34454, "$substrCP: the starting index must be nonnegative integer.")
    if count < 0:
        raise MongoError(34455, "$substrCP: length must be a nonnegative integer.")
    return text[lo : lo + count]


@_eager("$strLenCP", "$strLenBytes", nmin=1, nmax=1)
def _op_strlen(name: str, vals: list[Any], ctx: Context) -> Any:
    value = vals[0]
    if not isinstance(value, str):
        code = 34471 if name == "$strLenCP" else 34473
        raise MongoError(code, f"{name} requires a string argument, found: {type_name(value)}")
    return len(value) if name == "$strLenCP" else len(value.encode())


@_eager("$split", nmin=2, nmax=2)
def _op_split(name: str, vals: list[Any], ctx: Context) -> Any:
    text, sep = vals
    if is_nullish(text) or is_nullish(sep):
        return None
    if not isinstance(text, str):
        raise MongoError(40085, f"$split requires an expression that evaluates to a string as a first argument, found: {type_name(text)}")
    if not isinstance(sep, str):
        raise MongoError(40086, f"$split requires an expression that evaluates to a string as a second argument, found: {type_name(sep)}")
    if not sep:
        raise MongoError(40087, "$split requires a non-empty separator")
    return text.split(sep)


@_eager("$strcasecmp", nmin=2, nmax=2)
def _op_strcasecmp(name: str, vals: list[Any], ctx: Context) -> Any:
    a, b = (_coerce_to_string(name, v).translate(_ASCII_UPPER) for v in vals)
    return (a > b) - (a < b)


_WHITESPACE = "\0 \t\n\v\f\r\u00a0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a\u2028\u2029\u202f\u205f\u3000"


@_lazy("$trim", "$ltrim", "$rtrim", args=_Args(("input", "chars"), ("input",), (50694, 50695)))
def _op_trim(name: str, raw: Any, ctx: Context) -> Any:
    spec = _object_args(name, raw)
    text = _eval(spec["input"], ctx)
    chars = _eval(spec["chars"], ctx) if "chars" in spec else _WHITESPACE
    if is_nullish(text) or is_nullish(chars):
        return None
    if not isinstance(text, str):
        raise MongoError(50699, f"{name} requires its input to be a string, got {text!r} (of type {type_name(text)}) instead.")
    if not isinstance(chars, str):
        raise MongoError(50700, f"{name} requires 'chars' to be a string, got {chars!r} (of type {type_name(chars)}) instead.")
    if name == "$ltrim":
        return text.lstrip(chars)
    return text.rstrip(chars) if name == "$rtrim" else text.strip(chars)


# ---------------------------------------------------------------------------
# Arrays and objects


@_eager("$size", nmin=1, nmax=1)
def _op_size(name: str, vals: list[Any], ctx: Context) -> Any:
    if not isinstance(vals[0], list):
        raise MongoError(17124, f"The argument to $size must be an array. Type of argument is: {type_name(vals[0])}")
    return len(vals[0])


@_eager("$arrayElemAt", nmin=2, nmax=2)
def _op_array_elem_at(name: str, vals: list[Any], ctx: Context) -> Any:
    array, index = vals
    if is_nullish(array) or is_nullish(index):
        return None
    if not isinstance(array, list):
        raise MongoError(28689, f"$arrayElemAt's first argument must be an array, but is {type_name(array)}")
    if not is_number(index):
        raise MongoError(28690, f"$arrayElemAt's second argument must be a numeric value, but is {type_name(index)}")
    if not _is_integral(index, INT32_MIN, INT32_MAX):
        raise MongoError(28691, f"$arrayElemAt's second argument must be representable as a 32-bit integer: {index}")
    i = _to_int(index)
    i = i + len(array) if i < 0 else i
    return array[i] if 0 <= i < len(array) else MISSING


@_eager("$first", "$last", nmin=1, nmax=1)
def _op_first_last(name: str, vals: list[Any], ctx: Context) -> Any:
    array = vals[0]
    if is_nullish(array):
        return None
    if not isinstance(array, list):
        raise MongoError(28689, f"{name}'s argument must be an array, but is {type_name(array)}")
    if not array:
        return MISSING
    return array[0] if name == "$first" else array[-1]


@_eager("$in", nmin=2, nmax=2)
def _op_in(name: str, vals: list[Any], ctx: Context) -> Any:
    needle, haystack = vals
    if not isinstance(haystack, list):
        raise MongoError(40081, f"$in requires an array as a second argument, found: {type_name(haystack)}")
    return any(compare(needle, item) == 0 for item in haystack)


@_eager("$concatArrays")
def _op_concat_arrays(name: str, vals: list[Any], ctx: Context) -> Any:
    out: list[Any] = []
    for value in vals:
        if is_nullish(value):
            return None
        if not isinstance(value, list):
            raise MongoError(28664, f"$concatArrays only supports arrays, not {type_name(value)}")
        out.extend(value)
    return out


@_eager("$isArray", nmin=1, nmax=1)
def _op_is_array(name: str, vals: list[Any], ctx: Context) -> Any:
    return isinstance(vals[0], list)


@_eager("$reverseArray", nmin=1, nmax=1)
def _op_reverse_array(name: str, vals: list[Any], ctx: Context) -> Any:
    if is_nullish(vals[0]):
        return None
    if not isinstance(vals[0], list):
        raise MongoError(34435, f"The argument to $reverseArray must be an array, but was of type: {type_name(vals[0])}")
    return vals[0][::-1]


def _int_arg(name: str, what: str, value: Any, code: int) -> int:
    if not _is_integral(value, INT32_MIN, INT32_MAX):
        raise MongoError(code, f"{name} requires {what} that can be represented as a 32-bit integer, found: {value!r}")
    return _to_int(value)


@_eager("$slice", nmin=2, nmax=3)
def _op_slice(name: str, vals: list[Any], ctx: Context) -> Any:
    if any(is_nullish(v) for v in vals):
        return None
    array = vals[0]
    if not isinstance(array, list):
        raise MongoError(28724, f"First argument to $slice must be an array, but is of type: {type_name(array)}")
    if len(vals) == 2:
        n = _int_arg(name, "a second argument", vals[1], 28725)
        return array[:n] if n >= 0 else array[max(0, len(array) + n) :]
    pos = _int_arg(name, "a second argument", vals[1], 28727)
    n = _int_arg(name, "a third argument", vals[2], 28728)
    if n <= 0:
        raise MongoError(28729, f"Third argument to $slice must be positive: {n}")
    start = pos if pos >= 0 else max(0, len(array) + pos)
    return array[start : start + n]


@_eager("$range", nmin=2, nmax=3)
def _op_range(name: str, vals: list[Any], ctx: Context) -> Any:
    start = _int_arg(name, "a starting value", vals[0], 34444)
    end = _int_arg(name, "an ending value", vals[1], 34446)
    step = _int_arg(name, "a step value", vals[2], 34448) if len(vals) > 2 else 1
    if step == 0:
        raise MongoError(34449, "$range requires a non-zero step value")
    return list(range(start, end, step))


@_eager("$indexOfArray", nmin=2, nmax=4)
def _op_index_of_array(name: str, vals: list[Any], ctx: Context) -> Any:
    array, needle = vals[0], vals[1]
    if is_nullish(array):
        return None
    if not isinstance(array, list):
        raise MongoError(40090, f"$indexOfArray requires an array as a first argument, found: {type_name(array)}")
    lo = _int_arg(name, "a starting index", vals[2], 40096) if len(vals) > 2 else 0
    hi = _int_arg(name, "an ending index", vals[3], 40096) if len(vals) > 3 else len(array)
    for i in range(max(lo, 0), min(hi, len(array))):
        if compare(array[i], needle) == 0:
            return i
    return -1


def _array_input(name: str, value: Any, code: int) -> list[Any] | None:
    if is_nullish(value):
        return None
    if not isinstance(value, list):
        raise MongoError(code, f"input to {name} must be an array not {type_name(value)}")
    return value


def _as_variable(name: str, spec: dict[str, Any]) -> str:
    var = spec.get("as", "this")
    if not isinstance(var, str) or not var:
        raise MongoError(16866, f"{name}: 'as' must be a non-empty variable name, found: {var!r}")
    return var


@_lazy("$map", args=_Args(("input", "as", "in"), ("input", "in"), (16879, 16880)))
def _op_map(name: str, raw: Any, ctx: Context) -> Any:
    spec = _object_args(name, raw)
    array = _array_input(name, _eval(spec["input"], ctx), 16883)
    if array is None:
        return None
    var = _as_variable(name, spec)
    return [_null_if_missing(_eval(spec["in"], ctx.bind(**{var: item}))) for item in array]


@_lazy("$filter", args=_Args(("input", "as", "cond", "limit"), ("input", "cond"), (28647, 28648)))
def _op_filter(name: str, raw: Any, ctx: Context) -> Any:
    spec = _object_args(name, raw)
    array = _array_input(name, _eval(spec["input"], ctx), 28651)
    if array is None:
        return None
    limit = _eval(spec["limit"], ctx) if "limit" in spec else None
    if limit is not None and (not _is_integral(limit, 1, INT32_MAX)):
        raise MongoError(2, f"$filter: limit must be a positive integer, found: {limit!r}")
    var = _as_variable(name, spec)
    out = [item for item in array if is_truthy(_eval(spec["cond"], ctx.bind(**{var: item})))]
    return out if limit is None else out[: _to_int(limit)]


@_lazy("$reduce", args=_Args(("input", "initialValue", "in"), ("input", "initialValue", "in"), (40076, 40077)))
def _op_reduce(name: str, raw: Any, ctx: Context) -> Any:
    spec = _object_args(name, raw)
    array = _eval(spec["input"], ctx)
    if is_nullish(array):
        return None
    if not isinstance(array, list):
        raise MongoError(40080, f"$reduce requires that 'input' be an array, found: {type_name(array)}")
    acc = _eval(spec["initialValue"], ctx)
    for item in array:
        acc = _eval(spec["in"], ctx.bind(this=item, value=acc))
    return acc


@_eager("$mergeObjects")
def _op_merge_objects(name: str, vals: list[Any], ctx: Context) -> Any:
    out: dict[str, Any] = {}
    for value in vals:
        merge_object_into(out, value)
    return out


def merge_object_into(out: dict[str, Any], value: Any) -> None:
    """One $mergeObjects step (also the accumulator's): nullish inputs are skipped."""
    if is_nullish(value):
        return
    if not isinstance(value, dict):
        raise MongoError(40400, f"$mergeObjects requires object inputs, but input {value!r} is of type {type_name(value)}")
    out.update(value)


@_eager("$objectToArray", nmin=1, nmax=1)
def _op_object_to_array(name: str, vals: list[Any], ctx: Context) -> Any:
    value = vals[0]
    if is_nullish(value):
        return None
    if not isinstance(value, dict):
        raise MongoError(40390, f"$objectToArray requires a document input, found: {type_name(value)}")
    return [{"k": k, "v": v} for k, v in value.items()]


@_eager("$arrayToObject", nmin=1, nmax=1)
def _op_array_to_object(name: str, vals: list[Any], ctx: Context) -> Any:
    array = vals[0]
    if is_nullish(array):
        return None
    if not isinstance(array, list):
        raise MongoError(40386, f"$arrayToObject requires an array input, found: {type_name(array)}")
    out: dict[str, Any] = {}
    for item in array:
        key, value = _key_value_pair(item)
        out[key] = value
    return out


def _key_value_pair(item: Any) -> tuple[str, Any]:
    if isinstance(item, list):
        if len(item) != 2:
            raise MongoError(40397, f"$arrayToObject requires an array of size 2 arrays,found array of size: {len(item)}")
        key, value = item
    elif isinstance(item, dict):
        if set(item) != {"k", "v"}:
            raise MongoError(40392, f"$arrayToObject requires an object keys of 'k' and 'v'. Found incorrect number of keys:{len(item)}")
        key, value = item["k"], item["v"]
    else:
        raise MongoError(40398, f"Unrecognised input type format for $arrayToObject: {type_name(item)}")
    if not isinstance(key, str):
        raise MongoError(40395, f"$arrayToObject requires an array of key-value pairs, where the key must be of type string. Found key type: {type_name(key)}")
    return key, value


# ---------------------------------------------------------------------------
# Types and conversions


@_eager("$type", nmin=1, nmax=1)
def _op_type(name: str, vals: list[Any], ctx: Context) -> Any:
    return type_name(vals[0])


@_eager("$isNumber", nmin=1, nmax=1)
def _op_is_number(name: str, vals: list[Any], ctx: Context) -> Any:
    return is_number(vals[0])


def _conversion_error(value: Any, target: str) -> MongoError:
    return MongoError(
        241, f"Unsupported conversion from {type_name(value)} to {target} in $convert with no onError value"
    )


def _convert_to_string(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (str, ObjectId)):
        return str(value)
    if is_number(value) or isinstance(value, datetime.datetime):
        return _coerce_to_string("$toString", value)
    raise _conversion_error(value, "string")


def _parse_number(text: str, target: str) -> Any:
    try:
        return int(text, 10) if target in ("int", "long") else float(text)
    except ValueError:
        raise MongoError(241, f"Failed to parse number '{text}' in $convert with no onError value")


def _convert_to_integer(value: Any, target: str) -> int:
    lo, hi = (INT32_MIN, INT32_MAX) if target == "int" else (INT64_MIN, INT64_MAX)
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, str):
        result = _parse_number(value, target)
    elif is_number(value):
        if isinstance(value, float) and not math.isfinite(value):
            raise MongoError(241, "Attempt to convert NaN value to integer type in $convert with no onError value")
        result = _to_int(value)
    elif isinstance(value, datetime.datetime) and target == "long":
        result = _date_ms(value)
    else:
        raise _conversion_error(value, target)
    if not lo <= result <= hi:
        raise MongoError(241, f"Conversion would overflow target type in $convert with no onError value: {value}")
    return result


def _convert_to_double(value: Any) -> float:
    if isinstance(value, bool) or is_number(value):
        return _to_float(value)
    if isinstance(value, str):
        return float(_parse_number(value, "double"))
    if isinstance(value, datetime.datetime):
        return float(_date_ms(value))
    raise _conversion_error(value, "double")


@_eager("$toString", "$toInt", "$toLong", "$toDouble", "$toBool", nmin=1, nmax=1)
def _op_convert(name: str, vals: list[Any], ctx: Context) -> Any:
    value = vals[0]
    if is_nullish(value):
        return None
    if name == "$toString":
        return _convert_to_string(value)
    if name == "$toInt":
        return _convert_to_integer(value, "int")
    if name == "$toLong":
        return Int64(_convert_to_integer(value, "long"))
    if name == "$toDouble":
        return _convert_to_double(value)
    return is_truthy(value)


# ---------------------------------------------------------------------------
# Dates (UTC and fixed-offset time zones only)


def _utc_naive(value: datetime.datetime) -> datetime.datetime:
    if value.tzinfo is not None:
        return value.astimezone(datetime.UTC).replace(tzinfo=None)
    return value


def _as_datetime(name: str, value: Any) -> datetime.datetime:
    if isinstance(value, datetime.datetime):
        return _utc_naive(value)
    if isinstance(value, Timestamp):
        return _EPOCH + datetime.timedelta(seconds=value.time)
    if isinstance(value, ObjectId):
        return _utc_naive(value.generation_time)
    raise MongoError(16006, f"can't convert from BSON type {type_name(value)} to Date")


def _tz_offset_minutes(tz: Any) -> int:
    if tz is None or tz in ("UTC", "GMT", "Z", "Etc/UTC", "Etc/GMT"):
        return 0
    if not isinstance(tz, str):
        raise MongoError(40517, f"timezone must evaluate to a string, found {type_name(tz)}")
    digits = tz[1:].replace(":", "")
    if tz[:1] in "+-" and tz[:1] and digits.isdigit() and len(digits) in (2, 4):
        minutes = int(digits[:2]) * 60 + int(digits[2:] or 0)
        return -minutes if tz[0] == "-" else minutes
    raise MongoError(40485, f'unrecognized time zone identifier: "{tz}"')


def _date_input(name: str, raw: Any, ctx: Context) -> tuple[datetime.datetime, int] | None:
    """A date operator's (local time, UTC offset in minutes), or None for a nullish date."""
    tz: Any = None
    if isinstance(raw, dict) and "date" in raw and not next(iter(raw)).startswith("$"):
        for key in raw:
            if key not in ("date", "timezone"):
                raise MongoError(40535, f'unrecognized option to {name}: "{key}"')
        date = _eval(raw["date"], ctx)
        if "timezone" in raw:
            tz = _eval(raw["timezone"], ctx)
            if is_nullish(tz):
                return None
    else:
        args = raw if isinstance(raw, list) else [raw]
        if len(args) != 1:
            raise MongoError(40536, f"{name} accepts exactly one argument if given an array, but was given {len(args)}")
        date = _eval(args[0], ctx)
    if is_nullish(date):
        return None
    offset = _tz_offset_minutes(tz)
    return _as_datetime(name, date) + datetime.timedelta(minutes=offset), offset


_DATE_PARTS: dict[str, Callable[[datetime.datetime], int]] = {
    "$year": lambda d: d.year,
    "$month": lambda d: d.month,
    "$dayOfMonth": lambda d: d.day,
    "$hour": lambda d: d.hour,
    "$minute": lambda d: d.minute,
    "$second": lambda d: d.second,
    "$millisecond": lambda d: d.microsecond // 1000,
    "$dayOfYear": lambda d: d.timetuple().tm_yday,
    "$dayOfWeek": lambda d: d.isoweekday() % 7 + 1,
    "$week": lambda d: int(d.strftime("%U")),
    "$isoWeek": lambda d: d.isocalendar()[1],
    "$isoWeekYear": lambda d: d.isocalendar()[0],
    "$isoDayOfWeek": lambda d: d.isoweekday(),
}


@_lazy(*_DATE_PARTS)
def _op_date_part(name: str, raw: Any, ctx: Context) -> Any:
    found = _date_input(name, raw, ctx)
    return None if found is None else _DATE_PARTS[name](found[0])


def _offset_text(minutes: int, colon: bool = False) -> str:
    sign = "-" if minutes < 0 else "+"
    hours, mins = divmod(abs(minutes), 60)
    return f"{sign}{hours:02d}{':' if colon else ''}{mins:02d}"


_FORMATTERS: dict[str, Callable[[datetime.datetime, int], str]] = {
    "Y": lambda d, o: f"{d.year:04d}",
    "m": lambda d, o: f"{d.month:02d}",
    "d": lambda d, o: f"{d.day:02d}",
    "H": lambda d, o: f"{d.hour:02d}",
    "M": lambda d, o: f"{d.minute:02d}",
    "S": lambda d, o: f"{d.second:02d}",
    "L": lambda d, o: f"{d.microsecond // 1000:03d}",
    "j": lambda d, o: f"{d.timetuple().tm_yday:03d}",
    "w": lambda d, o: str(d.isoweekday() % 7 + 1),
    "u": lambda d, o: str(d.isoweekday()),
    "U": lambda d, o: d.strftime("%U"),
    "G": lambda d, o: f"{d.isocalendar()[0]:04d}",
    "V": lambda d, o: f"{d.isocalendar()[1]:02d}",
    "z": lambda d, o: _offset_text(o),
    "Z": lambda d, o: str(o),
    "%": lambda d, o: "%",
}


def _format_date(local: datetime.datetime, fmt: str, offset: int) -> str:
    out, i = [], 0
    while i < len(fmt):
        ch = fmt[i]
        if ch != "%":
            out.append(ch)
            i += 1
            continue
        if i + 1 >= len(fmt):
            raise MongoError(18535, "Unmatched '%' at end of format string")
        spec = fmt[i + 1]
        if spec not in _FORMATTERS:
            raise MongoError(18536, f"Invalid format character '%{spec}' in format string")
        out.append(_FORMATTERS[spec](local, offset))
        i += 2
    return "".join(out)


@_lazy("$dateToString", args=_Args(("date", "format", "timezone", "onNull"), ("date",), (18534, 18628)))
def _op_date_to_string(name: str, raw: Any, ctx: Context) -> Any:
    spec = _object_args(name, raw)
    found = _date_input(name, {k: spec[k] for k in ("date", "timezone") if k in spec}, ctx)
    if found is None:
        return _eval(spec["onNull"], ctx) if "onNull" in spec else None
    default = "%Y-%m-%dT%H:%M:%S.%LZ" if "timezone" not in spec else "%Y-%m-%dT%H:%M:%S.%L"
    fmt = _eval(spec["format"], ctx) if "format" in spec else default
    if is_nullish(fmt):
        return None
    if not isinstance(fmt, str):
        raise MongoError(18533, f"$dateToString requires that 'format' be a string, found: {type_name(fmt)}")
    return _format_date(found[0], fmt, found[1])
