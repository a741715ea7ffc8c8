"""`let`: variables a command binds for its filters, pipelines and updates (`$$name`).

The values are expressions evaluated once, before any document is read (they may use `$$NOW`, not
fields). They are then bound by substitution: every `"$$name"` (or `"$$name.path"`) in the
command's expressions becomes the value as a `$literal` (or a `$let` over it), so every stage and
operator sees them without carrying a scope. `$literal` arguments are left as written.
"""

from __future__ import annotations

__layer__ = "core"  # pure: no I/O, clock or randomness (tests/unit/test_layering.py)

import datetime
from collections.abc import Mapping
from typing import Any

from base.errors import MongoError
from oplog.expressions import MISSING, evaluate

_RESERVED = frozenset({"ROOT", "CURRENT", "NOW", "REMOVE", "CLUSTER_TIME", "DESCEND", "PRUNE", "KEEP",
                       "SEARCH_META", "USER_ROLES"})


def let_variables(let: Any, *, now: datetime.datetime) -> dict[str, Any]:
    """The values of a command's `let` document (empty for none)."""
    if let is None:
        return {}
    if not isinstance(let, Mapping):
        raise MongoError(14, "BSON field 'let' is the wrong type, expected type 'object'")
    values: dict[str, Any] = {}
    for name, expr in let.items():
        if not isinstance(name, str) or not name or not (name[0].islower() or not name[0].isascii()) or any(
                not (c.isalnum() or c == "_") for c in name if c.isascii()):
            raise MongoError(16870 if name and name[0].isupper() else 16869,
                             f"'{name}' starts with an invalid character for a user variable name")
        if name in _RESERVED:
            raise MongoError(16867, f"'{name}' is a reserved variable name")
        value = evaluate(expr, {}, now=now)
        values[name] = None if value is MISSING else value
    return values


def bind(expr: Any, variables: Mapping[str, Any]) -> Any:
    """`expr` with each `$$name` of `variables` replaced by its value."""
    if not variables:
        return expr
    if isinstance(expr, str):
        if expr.startswith("$$"):
            name, dot, _ = expr[2:].partition(".")
            if name in variables:
                value = {"$literal": variables[name]}
                return value if not dot else {"$let": {"vars": {name: value}, "in": expr}}
        return expr
    if isinstance(expr, list):
        return [bind(item, variables) for item in expr]
    if isinstance(expr, Mapping):
        if len(expr) == 1 and "$literal" in expr:
            return expr
        return {key: bind(value, variables) for key, value in expr.items()}
    return expr


def bind_filter(query: Any, variables: Mapping[str, Any]) -> Any:
    """A query filter with the variables bound inside its `$expr` clauses only (elsewhere a string
    starting with `$$` is a value to compare with)."""
    if not variables or not isinstance(query, Mapping):
        return query
    out: dict[str, Any] = {}
    for key, value in query.items():
        if key == "$expr":
            out[key] = bind(value, variables)
        elif key in ("$and", "$or", "$nor") and isinstance(value, list):
            out[key] = [bind_filter(clause, variables) for clause in value]
        else:
            out[key] = value
    return out


def bind_pipeline(pipeline: Any, variables: Mapping[str, Any]) -> Any:
    """An aggregation or update pipeline with the variables bound (in `$match` stages, only inside
    `$expr`)."""
    if not variables or not isinstance(pipeline, list):
        return pipeline
    return [{"$match": bind_filter(stage["$match"], variables)}
            if isinstance(stage, Mapping) and list(stage) == ["$match"] else bind(stage, variables)
            for stage in pipeline]


def _bind_statement(statement: Any, filter_key: str, update_key: str | None,
                    variables: Mapping[str, Any]) -> Any:
    if not isinstance(statement, Mapping):
        return statement
    out = dict(statement)
    if filter_key in out:
        out[filter_key] = bind_filter(out[filter_key], variables)
    if update_key is not None and isinstance(out.get(update_key), list):
        out[update_key] = bind_pipeline(out[update_key], variables)
    return out


def bind_command(name: str, cmd: Mapping[str, Any], *, now: datetime.datetime) -> dict[str, Any]:
    """`cmd` with its `let` variables bound into its filters, pipelines and pipeline updates (and
    `let` itself removed)."""
    variables = let_variables(cmd.get("let"), now=now)
    out = {k: v for k, v in cmd.items() if k != "let"}
    if name == "find":
        if "filter" in out:
            out["filter"] = bind_filter(out["filter"], variables)
        if isinstance(out.get("projection"), Mapping):
            out["projection"] = bind(out["projection"], variables)
    elif name == "aggregate" and "pipeline" in out:
        out["pipeline"] = bind_pipeline(out["pipeline"], variables)
    elif name == "update" and isinstance(out.get("updates"), list):
        out["updates"] = [_bind_statement(s, "q", "u", variables) for s in out["updates"]]
    elif name == "delete" and isinstance(out.get("deletes"), list):
        out["deletes"] = [_bind_statement(s, "q", None, variables) for s in out["deletes"]]
    elif name in ("findAndModify", "findandmodify"):
        out = _bind_statement(out, "query", "update", variables)
    return out
