"""Parsing filters: a filter document validated and compiled into a match tree
(`_parse_filter`).

All validation (unknown operators, malformed arguments, bad regex options) happens
here, once per filter. Compilation has two layers, mirroring the MongoDB server's
matcher:

* An operator document such as ``{$gt: 1, $ne: 5}`` is parsed into a tiny
  intermediate form (`_IR`): *single-value predicates* (``x -> bool`` on one BSON
  value, which may be the `MISSING` sentinel), negations and conjunctions.
* That form is then bound either to a **path** (a `_leaf` node walks the document
  along the dotted path and asks "does any reachable value satisfy the predicate?")
  or, inside a value-form ``$elemMatch``, to a **single element** (no traversal).

``$expr`` is validated here as an aggregation expression (`oplog.expressions`) and
evaluated per document by the match tree (`oplog.query_match`).

Pure: no I/O, no clocks, no randomness.
"""

from __future__ import annotations

__layer__ = "core"  # pure: no I/O, clock or randomness (tests/unit/test_layering.py)

import datetime
import math
from collections.abc import Callable, Mapping
from decimal import Decimal
from typing import Any

from bson.binary import Binary
from bson.regex import Regex

from base.errors import MongoError
from oplog.doc_limits import MAX_STORED_DEPTH, check_field_path_length
from oplog.expr_values import is_truthy
from oplog.expressions import validate_expression
from oplog.json_schema import compile_schema
from oplog.query_common import _ARRAY, _DOC, _NO_TRAVERSE, _TRAVERSE, Pred, _bad, _is_nan, _truncate_to_long
from oplog.query_match import (
    _CMP_TESTS,
    MatchFn,
    _and,
    _bits_pred,
    _cmp_pred,
    _const,
    _elem_leaf,
    _ElemMatch,
    _eq_pred,
    _exists_pred,
    _expr,
    _in_pred,
    _leaf,
    _mod_pred,
    _nor,
    _not,
    _or,
    _size_pred,
    _type_pred,
)
from oplog.query_regex import _REGEX_TYPES, _regex_pred, _regex_source, _regex_value_pred
from oplog.values import TYPE_ALIASES, is_number

# ---------------------------------------------------------------------------
# Operator documents -> intermediate form
# ---------------------------------------------------------------------------


# _IR items: ("leaf", pred, mode) | ("elem", _ElemMatch) | ("not", [ir]) | ("and", [ir]) | ("const", bool)
_IR = tuple[Any, ...]

_TOP_LEVEL_OPS = frozenset(
    {"$and", "$or", "$nor", "$expr", "$comment", "$where", "$text", "$jsonSchema", "$alwaysTrue",
     "$alwaysFalse", "$sampleRate"}
)
_UNSUPPORTED_FIELD_OPS = frozenset(
    {"$near", "$nearSphere", "$geoWithin", "$geoIntersects", "$within", "$geometry", "$maxDistance",
     "$minDistance", "$center", "$centerSphere", "$box", "$polygon", "$uniqueDocs"}
)
_DBREF_KEYS = frozenset({"$ref", "$id", "$db"})


def _is_operator_doc(value: Any) -> bool:
    """An object whose first key is an operator (not a DBRef's ``$ref``/``$id``/``$db``)."""
    if not isinstance(value, _DOC) or not value:
        return False
    first = next(iter(value))
    return isinstance(first, str) and first.startswith("$") and first not in _DBREF_KEYS


def _value_ir(value: Any) -> _IR:
    """Implicit equality ``{path: value}``; a regex value means a regex match."""
    if isinstance(value, _REGEX_TYPES):
        return ("leaf", _regex_value_pred(value), _TRAVERSE)
    return ("leaf", _eq_pred(value), _TRAVERSE)


def _parse_ops(ops: Mapping[str, Any]) -> list[_IR]:
    """Parse ``{$op: arg, ...}`` (all keys must be operators) into intermediate form."""
    out: list[_IR] = []
    regex_done = False
    for op, arg in ops.items():
        if op in ("$regex", "$options"):
            if not regex_done:
                out.append(_parse_regex_ops(ops))
                regex_done = True
            continue
        out.append(_parse_op(op, arg))
    return out


def _parse_op(op: str, arg: Any) -> _IR:
    if op == "$eq":
        return ("leaf", _eq_pred(arg), _TRAVERSE)
    if op == "$ne":
        return ("not", [("leaf", _eq_pred(arg), _TRAVERSE)])
    if op in _CMP_TESTS:
        if isinstance(arg, _REGEX_TYPES):
            raise _bad(f"Can't have RegEx as arg to {op} predicate.")
        return ("leaf", _cmp_pred(op, arg), _TRAVERSE)
    if op in ("$in", "$nin"):
        leaf = ("leaf", _parse_in(op, arg), _TRAVERSE)
        return leaf if op == "$in" else ("not", [leaf])
    if op == "$exists":
        exists = ("leaf", _exists_pred, _TRAVERSE)
        return exists if is_truthy(arg) else ("not", [exists])
    if op == "$not":
        return ("not", _parse_not(arg))
    parser = _OP_PARSERS.get(op)
    if parser is not None:
        return parser(op, arg)
    if op in _UNSUPPORTED_FIELD_OPS:
        raise _bad(f"{op} is not supported")
    raise _bad(f"unknown operator: {op}")


def _parse_in(op: str, arg: Any) -> Pred:
    if not isinstance(arg, _ARRAY):
        raise _bad(f"{op} needs an array")
    values: list[Any] = []
    regexes: list[Pred] = []
    for item in arg:
        if isinstance(item, _REGEX_TYPES):
            regexes.append(_regex_value_pred(item))
        elif _is_operator_doc(item):
            raise _bad(f"cannot nest $ under {op}")
        else:
            values.append(item)
    return _in_pred(values, regexes)


def _parse_not(arg: Any) -> list[_IR]:
    if isinstance(arg, _REGEX_TYPES):
        return [("leaf", _regex_value_pred(arg), _TRAVERSE)]
    if not isinstance(arg, _DOC):
        raise _bad("$not needs a regex or a document")
    if not arg:
        raise _bad("$not cannot be empty")
    return _parse_ops(arg)


def _parse_regex_ops(ops: Mapping[str, Any]) -> _IR:
    if "$regex" not in ops:
        raise _bad("$options needs a $regex")
    regex = ops["$regex"]
    options = ops.get("$options")
    if options is not None and not isinstance(options, str):
        raise _bad("$options has to be a string")
    if isinstance(regex, _REGEX_TYPES):
        pattern, flags = _regex_source(regex)
        if isinstance(regex, Regex) and isinstance(regex.flags, str):
            flags = regex.flags
        if flags and options:
            raise MongoError(51075, "options set in both $regex and $options")
        return ("leaf", _regex_pred(pattern, options or flags), _TRAVERSE)
    if not isinstance(regex, str):
        raise _bad("$regex has to be a string")
    return ("leaf", _regex_pred(regex, options or ""), _TRAVERSE)


def _parse_size(op: str, arg: Any) -> _IR:
    if not is_number(arg) or arg.__class__ is bool:
        raise _bad("$size needs a number")
    if _is_nan(arg) or (arg.__class__ is float and not math.isfinite(arg)):
        raise _bad("$size must be a whole number")
    n = _truncate_to_long(arg)
    if n is None or Decimal(str(arg)) != n:
        raise _bad("$size must be a whole number")
    if n < 0:
        raise _bad("$size may not be negative")
    return ("leaf", _size_pred(n), _NO_TRAVERSE)


def _type_code(spec: Any) -> list[int]:
    if isinstance(spec, str):
        if spec == "number":
            return [1, 16, 18, 19]
        if spec not in TYPE_ALIASES:
            raise _bad(f"Unknown type name alias: {spec}")
        return [TYPE_ALIASES[spec]]
    if is_number(spec) and spec.__class__ is not bool:
        code = _truncate_to_long(spec)
        if code is None or code != spec or code not in set(TYPE_ALIASES.values()):
            raise _bad(f"Invalid numerical type code: {spec}")
        return [code]
    raise MongoError(14, "type must be represented as a number or a string")


def _parse_type(op: str, arg: Any) -> _IR:
    specs = list(arg) if isinstance(arg, _ARRAY) else [arg]
    codes = frozenset(c for spec in specs for c in _type_code(spec))
    return ("leaf", _type_pred(codes), _TRAVERSE)


def _parse_mod(op: str, arg: Any) -> _IR:
    if not isinstance(arg, _ARRAY):
        raise _bad("malformed mod, needs to be an array")
    if len(arg) < 2:
        raise _bad("malformed mod, not enough elements")
    if len(arg) > 2:
        raise _bad("malformed mod, too many elements")
    parsed = []
    for what, value in zip(("divisor", "remainder"), arg, strict=True):
        if not is_number(value) or value.__class__ is bool:
            raise _bad(f"malformed mod, {what} not a number")
        number = _truncate_to_long(value)
        if number is None:
            raise _bad(f"malformed mod, {what} value is invalid")
        parsed.append(number)
    divisor, remainder = parsed
    if divisor == 0:
        raise _bad("divisor cannot be 0")
    return ("leaf", _mod_pred(divisor, remainder), _TRAVERSE)


def _parse_all(op: str, arg: Any) -> _IR:
    if not isinstance(arg, _ARRAY):
        raise _bad("$all needs an array")
    if not arg:
        return ("const", False)
    first = arg[0]
    if isinstance(first, _DOC) and first and next(iter(first)) == "$elemMatch":
        items = []
        for item in arg:
            if not (isinstance(item, _DOC) and len(item) == 1 and "$elemMatch" in item):
                raise _bad("$all/$elemMatch has to be consistent")
            items.append(_parse_elem_match("$elemMatch", item["$elemMatch"]))
        return ("and", items)
    out: list[_IR] = []
    for item in arg:
        if _is_operator_doc(item):
            raise _bad("no $ expressions in $all")
        out.append(_value_ir(item))
    return ("and", out)


def _parse_elem_match(op: str, arg: Any) -> _IR:
    if not isinstance(arg, _DOC):
        raise _bad("$elemMatch needs an Object")
    if _is_operator_doc(arg) and next(iter(arg)) not in _TOP_LEVEL_OPS:
        return ("elem", _ElemMatch(None, _ir_to_pred(("and", _parse_ops(arg)))))
    return ("elem", _ElemMatch(_parse_filter(arg, None), None))


def _bit_positions(op: str, arg: Any) -> list[int]:
    if isinstance(arg, bool):
        raise _bad(f"{op} takes an Array, a number, or a BinData but received: {arg!r}")
    if is_number(arg):
        mask = _truncate_to_long(arg)
        if mask is None or mask < 0 or (arg.__class__ is float and arg != int(arg)):
            raise MongoError(9, f"{op} bitmask must be a non-negative integer, got: {arg!r}")
        return [b for b in range(64) if mask >> b & 1]
    if isinstance(arg, (bytes, Binary)):
        data = bytes(arg)
        return [i * 8 + b for i, byte in enumerate(data) for b in range(8) if byte >> b & 1]
    if isinstance(arg, _ARRAY):
        out = []
        for p in arg:
            pos = _truncate_to_long(p) if is_number(p) and p.__class__ is not bool else None
            if pos is None or pos < 0 or (p.__class__ is float and p != int(p)):
                raise _bad(f"bit positions must be non-negative integers, got: {p!r}")
            out.append(pos)
        return out
    raise _bad(f"{op} takes an Array, a number, or a BinData but received: {arg!r}")


def _parse_bits(op: str, arg: Any) -> _IR:
    return ("leaf", _bits_pred(op, _bit_positions(op, arg)), _TRAVERSE)


_OP_PARSERS: dict[str, Callable[[str, Any], _IR]] = {
    "$size": _parse_size,
    "$type": _parse_type,
    "$mod": _parse_mod,
    "$all": _parse_all,
    "$elemMatch": _parse_elem_match,
    "$bitsAllSet": _parse_bits,
    "$bitsAllClear": _parse_bits,
    "$bitsAnySet": _parse_bits,
    "$bitsAnyClear": _parse_bits,
}


def _ir_to_pred(ir: _IR) -> Pred:
    """Bind intermediate form to one value (value-form $elemMatch: no array traversal)."""
    kind = ir[0]
    if kind == "leaf":
        return ir[1]  # type: ignore[no-any-return]
    if kind == "elem":
        elem: _ElemMatch = ir[1]
        return lambda x: elem.find(x) >= 0
    if kind == "const":
        value = ir[1]
        return lambda x: value
    preds = [_ir_to_pred(sub) for sub in ir[1]]
    if kind == "not":
        return lambda x: not all(p(x) for p in preds)
    if len(preds) == 1:
        return preds[0]
    return lambda x: all(p(x) for p in preds)


def _ir_to_node(path: str, ir: _IR) -> MatchFn:
    """Bind intermediate form to a document path."""
    kind = ir[0]
    if kind == "leaf":
        return _leaf(path, ir[1], ir[2])
    if kind == "elem":
        return _elem_leaf(path, ir[1])
    if kind == "const":
        return _const(ir[1])
    children = [_ir_to_node(path, sub) for sub in ir[1]]
    if kind == "not":
        return _not(_and(children))
    return _and(children)


# ---------------------------------------------------------------------------
# Filter documents
# ---------------------------------------------------------------------------


def _parse_filter(filt: Mapping[str, Any], now: datetime.datetime | None) -> MatchFn:
    """Compile a filter document; `now` is $$NOW for ``$expr``, None where ``$expr`` is not
    allowed (inside ``$elemMatch``, as on the server)."""
    if not isinstance(filt, _DOC):
        raise _bad("query filter must be an object")
    nodes: list[MatchFn] = []
    for key, value in filt.items():
        if not isinstance(key, str):
            raise _bad(f"field names must be strings: {key!r}")
        if key.startswith("$"):
            node = _parse_top_level(key, value, now)
            if node is not None:
                nodes.append(node)
        else:
            # As mongod's match parser: at most 180 parts (BSONDepth::getMaxDepthForUserStorage).
            check_field_path_length(key.count(".") + 1, code=5729100, limit=MAX_STORED_DEPTH)
            nodes.append(_parse_field(key, value))
    if not nodes:
        return _const(True)
    return _and(nodes)


def _parse_field(path: str, value: Any) -> MatchFn:
    if _is_operator_doc(value):
        irs = _parse_ops(value)
        return _and([_ir_to_node(path, ir) for ir in irs])
    return _ir_to_node(path, _value_ir(value))


def _parse_top_level(op: str, value: Any, now: datetime.datetime | None) -> MatchFn | None:
    if op in ("$and", "$or", "$nor"):
        if not isinstance(value, _ARRAY):
            raise _bad(f"{op} must be an array")
        if not value:
            raise _bad("$and/$or/$nor must be a nonempty array")
        children = []
        for sub in value:
            if not isinstance(sub, _DOC):
                raise _bad("$or/$and/$nor entries need to be full objects")
            children.append(_parse_filter(sub, now))
        if op == "$and":
            return _and(children)
        return _or(children) if op == "$or" else _nor(children)
    if op == "$comment":
        return None
    if op == "$expr":
        if now is None:
            raise _bad("$expr can only be applied to the top-level document")
        validate_expression(value)
        return _expr(value, now)
    if op in ("$alwaysTrue", "$alwaysFalse"):
        if value != 1:
            raise _bad(f"{op} must be an integer value of 1")
        return _const(op == "$alwaysTrue")
    if op == "$text":
        raise MongoError(27, "text index required for $text query")
    if op == "$jsonSchema":
        check = compile_schema(value)
        return lambda doc, _record: check(doc)
    if op in ("$where", "$sampleRate"):
        raise _bad(f"{op} is not supported")
    raise _bad(
        f"unknown top level operator: {op}. If you have a field name that starts with a '$' symbol, "
        "consider using $getField or $setField."
    )
