"""MongoDB-style filters and update values over a parts table's columns, as Arrow compute expressions.

`selectParts` and the mutations (`alterDelete`, `alterUpdate`) take a filter written
as a MongoDB query over columns:

    {user: "u1", n: {$gte: 10, $lt: 20}, $or: [{kind: {$in: ["a", "b"]}}, {kind: null}]}

`filter_expression` turns it into one `pyarrow.compute.Expression`, evaluated by Arrow
over whole batches (and pushed down to Parquet row-group statistics by
`pyarrow.dataset`). Operators: equality, `$eq $ne $gt $gte $lt $lte $in $nin`, `$exists`
(a null is an absent value), `$not` over an operator document, `$and $or $nor`. A
comparison with null follows MongoDB: `{c: null}` matches nulls, `{c: {$ne: null}}`
the others. Anything else - an unknown column, an operator this does not know,
`$where`, a regex - is BadValue (2) with the reason, never silently ignored.

`update_expressions` does the same for `alterUpdate`'s `$set`: each column gets a
literal, another column (`"$col"`), or `$add / $subtract / $multiply / $divide /
$concat` of those.

Pure: documents in, expressions out.
"""

from __future__ import annotations

__layer__ = "core"  # pure: no I/O, clock or randomness (tests/unit/test_layering.py)

from collections.abc import Mapping
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from base.errors import MongoError
from oplog.parts.table import TableDef, arrow_type

BAD_VALUE = 2
_COMPARE = {"$eq": "equal", "$ne": "not_equal", "$gt": "greater", "$gte": "greater_equal",
            "$lt": "less", "$lte": "less_equal"}
_ARITHMETIC = {"$add": "add_checked", "$subtract": "subtract_checked", "$multiply": "multiply_checked",
               "$divide": "divide"}


def _bad(message: str) -> MongoError:
    return MongoError(BAD_VALUE, message)


def _type_of(table: TableDef, name: str) -> pa.DataType:
    column = table.column(name)
    if column is None:
        raise _bad(f"{table.ns} has no column {name!r}; its columns are {', '.join(c.name for c in table.columns)}")
    return arrow_type(column.type)


def _literal(value: Any, type_: pa.DataType, where: str) -> pc.Expression:
    try:
        return pc.scalar(pa.scalar(value, type=type_))
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError, OverflowError) as exc:
        raise _bad(f"{where}: {value!r} is not a {type_} value ({exc})") from None


def _true(expr: pc.Expression) -> pc.Expression:
    """True where `expr` is true; false where it is false or null (an absent value matches nothing)."""
    return pc.coalesce(expr, pc.scalar(False))


def filter_expression(query: Mapping[str, Any] | None, table: TableDef) -> pc.Expression | None:
    """The filter as an Arrow expression; None for an empty filter (every row)."""
    if not query:
        return None
    if not isinstance(query, Mapping):
        raise _bad("a filter must be an object")
    return _and([_clause(key, value, table) for key, value in query.items()])


def _and(parts: list[pc.Expression]) -> pc.Expression:
    out = parts[0]
    for part in parts[1:]:
        out = out & part
    return out


def _or(parts: list[pc.Expression]) -> pc.Expression:
    out = parts[0]
    for part in parts[1:]:
        out = out | part
    return out


def _clause(key: str, value: Any, table: TableDef) -> pc.Expression:
    if key in ("$and", "$or", "$nor"):
        if not isinstance(value, list) or not value or not all(isinstance(v, Mapping) and v for v in value):
            raise _bad(f"{key} takes a non-empty array of non-empty filters")
        parts = [filter_expression(v, table) for v in value]
        exprs = [p for p in parts if p is not None]
        if key == "$and":
            return _and(exprs)
        return _or(exprs) if key == "$or" else ~_or(exprs)
    if key.startswith("$"):
        raise _bad(f"unknown top-level operator {key} in a parts table filter")
    type_ = _type_of(table, key)
    if isinstance(value, Mapping) and value and all(str(k).startswith("$") for k in value):
        return _and([_operator(key, op, arg, type_, table) for op, arg in value.items()])
    return _operator(key, "$eq", value, type_, table)


def _operator(column: str, op: str, arg: Any, type_: pa.DataType, table: TableDef) -> pc.Expression:
    field = pc.field(column)
    where = f"{column} {op}"
    if op in _COMPARE:
        if arg is None:
            if op == "$eq":
                return field.is_null()
            if op == "$ne":
                return field.is_valid()
            raise _bad(f"{where}: cannot order against null")
        expr = getattr(pc, _COMPARE[op])(field, _literal(arg, type_, where))
        # MongoDB: $ne matches missing (null) values too.
        return (expr | field.is_null()) if op == "$ne" else _true(expr)
    if op in ("$in", "$nin"):
        if not isinstance(arg, list):
            raise _bad(f"{where} needs an array")
        values = [v for v in arg if v is not None]
        try:
            member = field.isin(pa.array(values, type=type_)) if values else pc.scalar(False)
        except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError, OverflowError) as exc:
            raise _bad(f"{where}: the values are not all {type_} ({exc})") from None
        if None in arg:
            member = member | field.is_null()
        return _true(member) if op == "$in" else ~_true(member)
    if op == "$exists":
        return field.is_valid() if bool(arg) else field.is_null()
    if op == "$not":
        if not isinstance(arg, Mapping) or not arg:
            raise _bad(f"{where} needs an operator document")
        return ~_and([_operator(column, o, a, type_, table) for o, a in arg.items()])
    raise _bad(f"operator {op} is not supported in a parts table filter (on {column})")


def update_expressions(updates: Mapping[str, Any], table: TableDef) -> dict[str, pc.Expression]:
    """`alterUpdate`'s `{column: value | "$other" | {$add: [...]}, ...}` as one expression per column,
    each cast to its column's type."""
    if not isinstance(updates, Mapping) or not updates:
        raise _bad("alterUpdate needs a non-empty 'set' object: {column: value or expression}")
    out = {}
    for column, value in updates.items():
        type_ = _type_of(table, column)
        if column in table.order_by or column == table.partition.column:
            raise _bad(f"column {column!r} is part of the sort or partition key: it cannot be updated")
        out[column] = _value(value, type_, table, column).cast(type_)
    return out


def _value(value: Any, type_: pa.DataType, table: TableDef, where: str) -> pc.Expression:
    if isinstance(value, str) and value.startswith("$"):
        _type_of(table, value[1:])
        return pc.field(value[1:])
    if isinstance(value, Mapping) and len(value) == 1 and next(iter(value)).startswith("$"):
        op, args = next(iter(value.items()))
        if not isinstance(args, list) or len(args) < 2:
            raise _bad(f"{where}: {op} takes an array of at least two operands")
        operands = [_operand(a, table, where) for a in args]
        if op in _ARITHMETIC:
            out = operands[0]
            for operand in operands[1:]:
                out = getattr(pc, _ARITHMETIC[op])(out, operand)
            return out
        if op == "$concat":
            return pc.binary_join_element_wise(*operands, pc.scalar(""))
        raise _bad(f"{where}: expression operator {op} is not supported (use $add, $subtract, $multiply, "
                   "$divide, $concat)")
    return _literal(value, type_, where)


def _operand(value: Any, table: TableDef, where: str) -> pc.Expression:
    if isinstance(value, str) and value.startswith("$"):
        _type_of(table, value[1:])
        return pc.field(value[1:])
    if isinstance(value, Mapping):
        return _value(value, pa.null(), table, where)
    try:
        return pc.scalar(value)
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError) as exc:
        raise _bad(f"{where}: {value!r} cannot be an operand ({exc})") from None
