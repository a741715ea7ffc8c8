"""Evaluating aggregation expressions: the context an expression sees, field paths and
variables, and the operator dispatch table.

`_eval` interprets an expression recursively: field paths (``"$a.b"``), variables
(``"$$ROOT"``, or one bound by ``$let``, ``$map``...), operator calls, expression
objects, arrays and literals. The operator families (`oplog.expr_arithmetic` and the
other ``expr_`` modules) register their operators in `_OPERATORS`, either with
`_eager` (arguments evaluated first, arity checked from the table) or with `_lazy`
(the raw argument, evaluated as needed; a named-argument document is described by
`_Args` and checked by `_object_args`). The table is complete once
`oplog.expressions` is imported, which is where callers find `evaluate`.

Pure: no I/O and no clock (``$$NOW`` is the ``now`` the caller passes in).
"""

from __future__ import annotations

__layer__ = "core"  # pure: no I/O, clock or randomness (tests/unit/test_layering.py)

import contextvars
import datetime
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from base.errors import MongoError
from oplog.expr_values import MISSING, _null_if_missing, type_name

__all__ = [
    "INTERRUPT_CHECK",
    "Context",
    "draw_random",
    "install_random_source",
    "interrupt_point",
    "walk_path",
]

# A long evaluation (a $map, $filter or $reduce over many elements, a long $range) calls
# `interrupt_point` every so often; the runtime sets the check it makes there (off the event loop:
# whether the operation is past its maxTimeMS), which raises to stop the evaluation.
INTERRUPT_CHECK: contextvars.ContextVar[Callable[[], None] | None] = contextvars.ContextVar(
    "expression_interrupt_check", default=None)
INTERRUPT_EVERY = 256  # elements between two interrupt points of a loop


# `$rand`'s source of numbers in [0, 1): the runtime installs one (`install_random_source`) at start;
# the core draws only from what it is given.
_RANDOM_SOURCE: list[Callable[[], float]] = []


def install_random_source(source: Callable[[], float]) -> None:
    _RANDOM_SOURCE[:] = [source]


def draw_random() -> float:
    if not _RANDOM_SOURCE:
        raise MongoError(2, "$rand has no random source on this process")
    return _RANDOM_SOURCE[0]()


def interrupt_point() -> None:
    check = INTERRUPT_CHECK.get()
    if check is not None:
        check()


@dataclass(frozen=True)
class Context:
    """What an expression can see: the document, ``$$NOW`` and bound variables."""

    root: Any
    now: datetime.datetime
    current: Any = None
    variables: dict[str, Any] = field(default_factory=dict)

    def bind(self, **values: Any) -> Context:
        return Context(self.root, self.now, self.current, {**self.variables, **values})


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
