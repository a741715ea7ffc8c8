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
  dispatch table (`oplog.expr_eval`; unknown names raise 168 InvalidPipelineOperator);
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

The language is split by concern: `oplog.expr_values` (the `MISSING` sentinel,
truthiness, comparison and MongoDB's typing of numeric results), `oplog.expr_eval`
(the evaluator, variables and the dispatch table), and one module per operator
family: `oplog.expr_arithmetic`, `oplog.expr_logic` (comparison, boolean and
conditional), `oplog.expr_strings`, `oplog.expr_arrays` (arrays and objects),
`oplog.expr_types` (types and conversions) and `oplog.expr_dates`. Importing this
module registers every family; the entry points (`evaluate`, `evaluate_in`,
`validate_expression`, `is_operator`) live here, and the names callers use from the
other modules are re-exported.

Pure: no I/O and no clock (``$$NOW`` is the ``now`` the caller passes in).
"""

from __future__ import annotations

__layer__ = "core"  # pure: no I/O, clock or randomness (tests/unit/test_layering.py)

import datetime
from collections.abc import Iterable
from typing import Any

from base.errors import MongoError

# Importing the operator families registers their operators in the dispatch table.
from oplog import expr_arithmetic, expr_arrays, expr_dates, expr_logic, expr_strings, expr_types  # noqa: F401
from oplog.doc_limits import check_field_path_length
from oplog.expr_arrays import _as_variable, merge_object_into
from oplog.expr_dates import format_date
from oplog.expr_eval import (
    _OPERATORS,
    Context,
    _check_arity,
    _eval,
    _lookup_operator,
    _object_args,
    _Op,
    walk_path,
)
from oplog.expr_logic import _cond_args, _let_vars, _switch_branches
from oplog.expr_values import (
    MISSING,
    NumericSum,
    compare,
    is_nullish,
    is_truthy,
    sum_numbers,
    type_name,
)

__all__ = [
    "MISSING",
    "Context",
    "NumericSum",
    "compare",
    "evaluate",
    "evaluate_in",
    "filter_evaluates_expressions",
    "format_date",
    "is_nullish",
    "is_operator",
    "is_truthy",
    "merge_object_into",
    "projection_evaluates_expressions",
    "sum_numbers",
    "type_name",
    "validate_expression",
    "walk_path",
]


def evaluate(expr: Any, doc: Any, *, now: datetime.datetime) -> Any:
    """Evaluate `expr` with `doc` as ``$$ROOT``/``$$CURRENT``; may return `MISSING`."""
    return _eval(expr, Context(doc, now, doc))


def evaluate_in(expr: Any, ctx: Context) -> Any:
    """Evaluate `expr` in an existing context (used by the pipeline stages)."""
    return _eval(expr, ctx)


_LOGICAL = ("$and", "$or", "$nor")


def filter_evaluates_expressions(query: Any) -> bool:
    """Whether matching a query filter evaluates aggregation expressions: it holds `$expr` (at its top
    level or under `$and` / `$or` / `$nor`, where the filter grammar allows it)."""
    stack = [query]
    while stack:
        item = stack.pop()
        if not isinstance(item, dict):
            continue
        if "$expr" in item:
            return True
        for key in _LOGICAL:
            clauses = item.get(key)
            if isinstance(clauses, list):
                stack.extend(clauses)
    return False


def projection_evaluates_expressions(projection: Any) -> bool:
    """Whether a find projection does more than include or exclude fields (it computes values)."""
    if not isinstance(projection, dict):
        return False
    return any(isinstance(value, (dict, str, list)) for value in projection.values())


def is_operator(name: str) -> bool:
    """Whether `name` (such as ``"$add"``) is an expression operator this module implements."""
    return name in _OPERATORS


# ---------------------------------------------------------------------------
# Validation


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
    check_field_path_length(body.count(".") + 1)
    if any(part == "" for part in body.split(".")):
        raise MongoError(15998, f"FieldPath field names may not be empty strings: {expr}")
