"""Comparison, boolean and conditional expression operators: ``$eq``, ``$ne``, ``$gt``,
``$gte``, ``$lt``, ``$lte``, ``$cmp``, ``$and``, ``$or``, ``$not``, ``$cond``, ``$ifNull``
and ``$switch``, with ``$literal`` and ``$let``.

Comparisons follow the server's order of BSON values, missing just below null
(`oplog.expr_values.compare`). ``$and``, ``$or``, ``$cond``, ``$switch`` and ``$let``
are lazy: they evaluate only the arguments they need. The argument shapes of
``$cond``, ``$switch`` and ``$let`` (`_cond_args`, `_switch_branches`, `_let_vars`) are
checked by `oplog.expressions.validate_expression` too.

Pure: no I/O and no clock.
"""

from __future__ import annotations

__layer__ = "core"  # pure: no I/O, clock or randomness (tests/unit/test_layering.py)

from collections.abc import Callable
from typing import Any

from base.errors import MongoError
from oplog.expr_eval import Context, _Args, _eager, _eval, _lazy, _object_args
from oplog.expr_values import MISSING, compare, is_nullish, is_truthy, type_name

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


def _field_name(name: str, raw: Any, ctx: Context) -> str:
    field = _eval(raw, ctx)
    if not isinstance(field, str):
        raise MongoError(4161102 if name == "$getField" else 4161106,
                         f"{name} requires 'field' to evaluate to type String, but got {type_name(field)}")
    return field


@_lazy("$getField")
def _op_get_field(name: str, raw: Any, ctx: Context) -> Any:
    """A field by its exact name (dots and `$` are part of it), of `input` ($$CURRENT by default)."""
    if not isinstance(raw, dict) or "field" not in raw:
        field, source = _field_name(name, raw, ctx), ctx.current
    else:
        field = _field_name(name, raw["field"], ctx)
        source = _eval(raw["input"], ctx) if "input" in raw else ctx.current
    if not isinstance(source, dict):
        return MISSING
    return source.get(field, MISSING)


@_lazy("$setField", args=_Args(("field", "input", "value"), ("field", "input", "value"), (4161100, 4161101)))
def _op_set_field(name: str, raw: Any, ctx: Context) -> Any:
    """`input` with one field (named exactly, dots and `$` included) set to `value`, or removed when
    `value` is $$REMOVE."""
    spec = _object_args(name, raw)
    field = _field_name(name, spec["field"], ctx)
    source = _eval(spec["input"], ctx)
    if source is None or source is MISSING:
        return None
    if not isinstance(source, dict):
        raise MongoError(4161105, f"{name} requires 'input' to evaluate to type Object")
    value = _eval(spec["value"], ctx)
    out = dict(source)
    if value is MISSING:
        out.pop(field, None)
    else:
        out[field] = value
    return out


@_lazy("$unsetField", args=_Args(("field", "input"), ("field", "input"), (4161100, 4161101)))
def _op_unset_field(name: str, raw: Any, ctx: Context) -> Any:
    spec = _object_args(name, raw)
    return _op_set_field("$setField", {"field": spec["field"], "input": spec["input"], "value": "$$REMOVE"},
                         ctx)
