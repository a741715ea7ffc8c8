"""Path walking, the update tree and value helpers for `oplog.update`.

Theory of operation: an update path is a list of string parts ("a.0.b" ->
["a", "0", "b"]). Walking it from the document root finds the longest prefix that
exists (`resolve`); an object is entered by field name, an array by a part made only
of digits. What is left over is the *path to create*: `create_path` builds it the
way MongoDB's ``pathsupport::createPathAt`` does (an array is padded with nulls up
to a numeric index; everything created below that is an object; a scalar, or an
array reached with a non-numeric part, is "not viable" -> 28 PathNotViable).

The update tree (`ObjectNode`, `ArrayNode`, `Leaf`) mirrors MongoDB's
``UpdateObjectNode`` / ``UpdateArrayNode``: `insert_leaf` adds one modifier path and
reports conflicting paths (40), `merge_nodes` combines two subtrees that apply to the
same array element. `arithmetic` is MongoDB's ``SafeNum`` ($inc, $mul): int32 widens
to int64 on overflow, int64 overflow is an error, doubles and decimals win.

Also here: MongoDB's ordering of sibling update paths (`compare_field_names`,
numeric-aware), binary identity of BSON values (`identical`, what MongoDB calls
"binaryEqualValues": same type and same bytes), deep copies, and the shell-like
rendering of values used in MongoDB's error messages (`format_value`).

Pure: no I/O.
"""

from __future__ import annotations

__layer__ = "core"  # pure: no I/O, clock or randomness (tests/unit/test_layering.py)

import calendar
import datetime
import decimal
import functools
import re
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import bson
from bson.binary import Binary
from bson.code import Code
from bson.decimal128 import Decimal128
from bson.int64 import Int64
from bson.max_key import MaxKey
from bson.min_key import MinKey
from bson.objectid import ObjectId
from bson.regex import Regex
from bson.timestamp import Timestamp

from base.errors import MongoError
from oplog.doc_limits import check_field_path_length
from oplog.values import TYPE_ALIASES, bson_type_code, compare_values, is_number

MAX_PADDING = 1_500_000  # pathsupport::kMaxPaddingAllowed
CODE_CANNOT_BACKFILL_ARRAY = 34
_TYPE_NAMES = {code: name for name, code in TYPE_ALIASES.items()}


# -- path parts ---------------------------------------------------------------------
def array_index(part: str) -> int | None:
    """The array index a path part names (digits only), else None."""
    if part and part.isascii() and part.isdigit():
        return int(part)
    return None


def dotted(parts: list[str] | tuple[str, ...]) -> str:
    return ".".join(parts)


def compare_field_names(a: str, b: str) -> int:
    """MongoDB's ``cmpPathsAndArrayIndexes``: numbers (no leading zero) by value, else bytes."""
    a_num = bool(a) and "0" <= a[0] <= "9" and not (a[0] == "0" and len(a) > 1)
    b_num = bool(b) and "0" <= b[0] <= "9" and not (b[0] == "0" and len(b) > 1)
    if a_num and b_num and len(a) != len(b):
        return -1 if len(a) < len(b) else 1
    return (a > b) - (a < b)


field_name_key = functools.cmp_to_key(compare_field_names)


# -- values -------------------------------------------------------------------------
def deep_copy(value: Any) -> Any:
    """Copy documents and arrays (as dict / list); other BSON values are shared."""
    if isinstance(value, Mapping) and not isinstance(value, (Code, Regex)):
        return {k: deep_copy(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [deep_copy(v) for v in value]
    return value


def encode_value(value: Any) -> bytes:
    return bson.encode({"": value})


def identical(a: Any, b: Any) -> bool:
    """Binary equality of two BSON values: same type and same encoded bytes."""
    if a is b:
        return True
    return encode_value(a) == encode_value(b)


def type_name(value: Any) -> str:
    """MongoDB's ``typeName`` of a value ("int", "long", "double", "string", ...)."""
    try:
        return _TYPE_NAMES.get(bson_type_code(value), "unknown")
    except TypeError:
        return type(value).__name__


def _format_double(value: float) -> str:
    if value != value:
        return "nan"
    if value in (float("inf"), float("-inf")):
        return "inf" if value > 0 else "-inf"
    return repr(value)


def format_value(value: Any) -> str:
    """Render a value like MongoDB's ``BSONElement::toString`` (used in error messages)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(int(value))
    if isinstance(value, float):
        return _format_double(value)
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, Mapping) and not isinstance(value, (Code, Regex)):
        if not value:
            return "{}"
        return "{ " + ", ".join(f"{k}: {format_value(v)}" for k, v in value.items()) + " }"
    if isinstance(value, (list, tuple)):
        return "[]" if not value else "[ " + ", ".join(format_value(v) for v in value) + " ]"
    return _format_special(value)


def _format_special(value: Any) -> str:
    if isinstance(value, Decimal128):
        return f'NumberDecimal("{value}")'
    if isinstance(value, ObjectId):
        return f"ObjectId('{value}')"
    if isinstance(value, datetime.datetime):
        return f"new Date({_date_ms(value)})"
    if isinstance(value, Timestamp):
        return f"Timestamp({value.time}, {value.inc})"
    if isinstance(value, (Binary, bytes, uuid.UUID)):
        data = value.bytes if isinstance(value, uuid.UUID) else bytes(value)
        subtype = 4 if isinstance(value, uuid.UUID) else getattr(value, "subtype", 0)
        return f"BinData({subtype}, {data.hex().upper()})"
    if isinstance(value, (Regex, re.Pattern)):
        flags = value.flags if isinstance(value, Regex) and isinstance(value.flags, str) else ""
        return f"/{value.pattern}/{flags}"
    if isinstance(value, MinKey):
        return "MinKey"
    if isinstance(value, MaxKey):
        return "MaxKey"
    return repr(value)


def _date_ms(value: datetime.datetime) -> int:
    if value.tzinfo is not None:
        value = value.astimezone(datetime.UTC).replace(tzinfo=None)
    return (value - datetime.datetime(1970, 1, 1)) // datetime.timedelta(milliseconds=1)


def format_element(name: str, value: Any) -> str:
    return f"{name}: {format_value(value)}"


def id_string(doc: Mapping[str, Any]) -> str:
    """``_id: <value>`` as MongoDB prints a document's id in messages, or ``no id``."""
    return format_element("_id", doc["_id"]) if "_id" in doc else "no id"


# -- walking ------------------------------------------------------------------------
class Located(NamedTuple):
    """Result of walking a path: `found` leading parts exist; `value` is the last found."""

    found: int
    value: Any
    parent: Any  # container holding `value` (None for the root)
    key: Any  # str field name or int index of `value` in `parent`


def child_of(container: Any, part: str) -> tuple[bool, Any]:
    """Step into an object by name or an array by numeric part."""
    if isinstance(container, dict):
        if part in container:
            return True, container[part]
    elif isinstance(container, list):
        index = array_index(part)
        if index is not None and index < len(container):
            return True, container[index]
    return False, None


def resolve(root: dict[str, Any], parts: list[str] | tuple[str, ...]) -> Located:
    """Walk `parts` from `root` as far as they exist."""
    parent: Any = None
    key: Any = None
    current: Any = root
    for i, part in enumerate(parts):
        ok, child = child_of(current, part)
        if not ok:
            return Located(i, current, parent, key)
        parent, key = current, (part if isinstance(current, dict) else int(part))
        current = child
    return Located(len(parts), current, parent, key)


def get_path(root: Any, parts: list[str] | tuple[str, ...]) -> tuple[bool, Any]:
    current = root
    for part in parts:
        ok, current = child_of(current, part)
        if not ok:
            return False, None
    return True, current


def dotted_get(value: Any, path: str) -> tuple[bool, Any]:
    """``BSONObj::getFieldDotted``: arrays are entered only by their exact index names."""
    current = value
    for part in path.split("."):
        if isinstance(current, dict) and part in current:
            current = current[part]
        elif isinstance(current, list) and part == str(array_index(part)) and int(part) < len(current):
            current = current[int(part)]
        else:
            return False, None
    return True, current


def not_viable(message: str) -> MongoError:
    return MongoError(28, message)


def create_path(element: Any, element_name: str, to_create: list[str] | tuple[str, ...],
                value: Any) -> None:
    """``createPathAt``: build `to_create` below `element` (an existing value) ending in `value`.

    `element_name` is the field name of `element`, for the error message.
    """
    first = to_create[0]
    if isinstance(element, dict):
        element[first] = _nest(to_create[1:], value)
        return
    if not isinstance(element, list) or array_index(first) is None:
        raise not_viable(f"Cannot create field '{first}' in element {{{format_element(element_name, element)}}}")
    index = array_index(first)
    assert index is not None
    if index - len(element) > MAX_PADDING:
        raise MongoError(CODE_CANNOT_BACKFILL_ARRAY, f"can't backfill more than {MAX_PADDING} elements")
    element.extend([None] * (index - len(element)))
    element.append(_nest(to_create[1:], value))


def _nest(parts: list[str] | tuple[str, ...], value: Any) -> Any:
    for part in reversed(parts):
        value = {part: value}
    return value


def check_viable(element: Any, taken: list[str] | tuple[str, ...], to_create: list[str] | tuple[str, ...]) -> None:
    """``UpdateLeafNode::checkViability`` for modifiers that never create paths ($pop, $pull)."""
    if isinstance(element, dict):
        return
    if isinstance(element, list) and array_index(to_create[0]) is not None:
        return
    name = taken[-1] if taken else ""
    raise not_viable(
        f"Cannot use the part ({to_create[0]}) of ({dotted(taken)}.{dotted(to_create)}) "
        f"to traverse the element ({{{format_element(name, element)}}})"
    )


# -- the update tree ----------------------------------------------------------------
@dataclass(slots=True)
class Leaf:
    """One modifier on one path: `op` ("$set", ...), its parsed argument, the path as written."""

    op: str
    field: str
    arg: Any
    source: tuple[str, ...] = ()  # $rename: the source path (the leaf sits at the destination)


class Placeholder:
    """Marks $rename's source path so that other modifiers on it conflict."""

    __slots__ = ()


@dataclass(slots=True)
class ObjectNode:
    """Children by field name (or array index), plus the positional ``$`` child."""

    children: dict[str, Any] = field(default_factory=dict)
    positional: Any = None

    def get(self, name: str) -> Any:
        return self.positional if name == "$" else self.children.get(name)

    def put(self, name: str, node: Any) -> None:
        if name == "$":
            self.positional = node
        else:
            self.children[name] = node


@dataclass(slots=True)
class ArrayNode:
    """Children by array-filter identifier (``""`` for ``$[]``)."""

    children: dict[str, Any] = field(default_factory=dict)

    def get(self, name: str) -> Any:
        return self.children.get(name)

    def put(self, name: str, node: Any) -> None:
        self.children[name] = node


def is_identifier(part: str) -> bool:
    """``$[]`` or ``$[<identifier>]``."""
    return len(part) >= 3 and part.startswith("$[") and part.endswith("]")


def check_path(path: str) -> list[str]:
    """``fieldchecker::isUpdatable`` plus the positional ``$`` rules; returns the parts."""
    if path == "":
        raise MongoError(56, "An empty update path is not valid.")
    parts = path.split(".")
    check_field_path_length(len(parts))  # (a longer path could only build a document too deep to store)
    if "" in parts:
        raise MongoError(56, f"The update path '{path}' contains an empty field name, which is not allowed.")
    positions = [i for i, part in enumerate(parts) if part == "$"]
    if len(positions) > 1:
        raise MongoError(2, f"Too many positional (i.e. '$') elements found in path '{path}'")
    if positions and positions[0] == 0:
        raise MongoError(2, f"Cannot have positional (i.e. '$') element in the first position in path '{path}'")
    return parts


def _child_name(parts: list[str], i: int, filters: Mapping[str, Any] | None, found_ids: set[str]) -> str:
    part = parts[i]
    if not is_identifier(part):
        return part
    if i == 0:
        raise MongoError(2, "Cannot have array filter identifier (i.e. '$[<id>]') element in the first "
                            f"position in path '{dotted(parts)}'")
    identifier = part[2:-1]
    if identifier:
        if filters is not None and identifier not in filters:
            raise MongoError(2, f"No array filter found for identifier '{identifier}' in path '{dotted(parts)}'")
        found_ids.add(identifier)
    return identifier


def insert_leaf(root: ObjectNode, leaf: Any, parts: list[str], filters: Mapping[str, Any] | None,
                found_ids: set[str]) -> None:
    """``UpdateObjectNode::parseAndMerge``: add `leaf` at `parts`, creating internal nodes."""
    current: Any = root
    for i in range(len(parts) - 1):
        name = _child_name(parts, i, filters, found_ids)
        child = current.get(name)
        node_type = ArrayNode if is_identifier(parts[i + 1]) else ObjectNode
        if child is None:
            child = node_type()
            current.put(name, child)
        elif type(child) is not node_type:
            raise _conflict(dotted(parts), dotted(parts[: i + 1]))
        current = child
    name = _child_name(parts, len(parts) - 1, filters, found_ids)
    if current.get(name) is not None:
        raise _conflict(dotted(parts), dotted(parts))
    current.put(name, leaf)


def _conflict(path: str, at: str) -> MongoError:
    return MongoError(40, f"Updating the path '{path}' would create a conflict at '{at}'")


def merge_nodes(left: Any, right: Any, path: list[str]) -> Any:
    """``UpdateNode::createUpdateNodeByMerging``: two subtrees applied to the same element."""
    if isinstance(left, ObjectNode) and isinstance(right, ObjectNode):
        merged = ObjectNode(_merge_children(left.children, right.children, path, False))
        if left.positional is None or right.positional is None:
            merged.positional = left.positional or right.positional
        else:
            merged.positional = merge_nodes(left.positional, right.positional, [*path, "$"])
        return merged
    if isinstance(left, ArrayNode) and isinstance(right, ArrayNode):
        return ArrayNode(_merge_children(left.children, right.children, path, True))
    raise MongoError(40, f"Update created a conflict at '{dotted(path)}'")


def _merge_children(left: dict[str, Any], right: dict[str, Any], path: list[str],
                    identifiers: bool) -> dict[str, Any]:
    merged = dict(left)
    for name, node in right.items():
        if name in merged:
            step = f"$[{name}]" if identifiers else name
            merged[name] = merge_nodes(merged[name], node, [*path, step])
        else:
            merged[name] = node
    return merged


# -- numbers ------------------------------------------------------------------------
INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
_DEC_CTX = decimal.Context(prec=34, rounding=decimal.ROUND_HALF_EVEN, Emin=-6143, Emax=6144, clamp=1,
                           traps=[])
_DOUBLE_TO_DECIMAL = decimal.Context(prec=15, rounding=decimal.ROUND_HALF_EVEN, traps=[])
_DEBUG_NAMES = {"int": "NumberInt", "long": "NumberLong", "double": "NumberDouble", "decimal": "NumberDecimal"}


def number_kind(value: Any) -> str | None:
    """"int" (int32), "long" (int64), "double", "decimal", or None for a non-number."""
    if isinstance(value, bool):
        return None
    if isinstance(value, Int64):
        return "long"
    if isinstance(value, int):
        return "int" if INT32_MIN <= value <= INT32_MAX else "long"
    if isinstance(value, float):
        return "double"
    if isinstance(value, Decimal128):
        return "decimal"
    return None


def is_integral(value: Any) -> bool:
    return number_kind(value) in ("int", "long")


def debug_number(value: Any) -> str:
    """``SafeNum::debugString``: ``(NumberLong)9223372036854775807``."""
    kind = number_kind(value)
    text = str(value) if kind == "decimal" else format_value(value)
    return f"({_DEBUG_NAMES.get(kind or '', 'EOO')}){text}"


def as_float(value: Any) -> float:
    return float(value.to_decimal()) if isinstance(value, Decimal128) else float(value)


def _as_decimal(value: Any) -> decimal.Decimal:
    if isinstance(value, Decimal128):
        return value.to_decimal()
    if isinstance(value, float):  # Decimal128(double): exactly 15 significant digits
        rounded = _DOUBLE_TO_DECIMAL.create_decimal(value)
        if not rounded.is_finite() or rounded.is_zero():
            return rounded
        return rounded.quantize(decimal.Decimal(1).scaleb(rounded.adjusted() - 14), context=_DEC_CTX)
    return decimal.Decimal(int(value))


def arithmetic(op: str, a: Any, b: Any) -> Any:
    """``SafeNum`` add ("add") or multiply ("mul") with MongoDB's type promotion.

    int32 op int32 widens to int64 on overflow; an int64 overflow returns None (an error).
    """
    kinds = (number_kind(a), number_kind(b))
    if "decimal" in kinds:
        x, y = _as_decimal(a), _as_decimal(b)
        return Decimal128(_DEC_CTX.add(x, y) if op == "add" else _DEC_CTX.multiply(x, y))
    if "double" in kinds:
        return as_float(a) + as_float(b) if op == "add" else as_float(a) * as_float(b)
    result = int(a) + int(b) if op == "add" else int(a) * int(b)
    if kinds == ("int", "int") and INT32_MIN <= result <= INT32_MAX:
        return result
    return Int64(result) if INT64_MIN <= result <= INT64_MAX else None


def bit_op(name: str, a: Any, b: Any) -> Any:
    """$bit's and / or / xor on int32 / int64 values."""
    x, y = int(a), int(b)
    result = x & y if name == "and" else x | y if name == "or" else x ^ y
    if number_kind(a) == "int" and number_kind(b) == "int":
        return result
    return Int64(result)


def current_date_value(kind: str, now: datetime.datetime) -> Any:
    """$currentDate: a date (millisecond precision) or a Timestamp(now seconds, 1)."""
    if kind == "timestamp":
        return Timestamp(calendar.timegm(now.utctimetuple()), 1)
    return now.replace(microsecond=now.microsecond // 1000 * 1000)


# -- parsing helpers ----------------------------------------------------------------
def parse_long(name: str, value: Any) -> int:
    """``MatchExpressionParser::parseIntegerElementToLong`` (errors are 9 FailedToParse)."""
    elem = format_element(name, value)
    kind = number_kind(value)
    if kind is None:
        raise MongoError(9, f"Expected a number in: {elem}")
    if kind in ("double", "decimal"):
        number = value.to_decimal() if kind == "decimal" else value
        if number != number:
            raise MongoError(9, f"Expected an integer, but found NaN in: {elem}")
        if number in (float("inf"), float("-inf")) or not -(2**63) <= number < 2**63:
            raise MongoError(9, f"Cannot represent as a 64-bit integer: {elem}")
        if number != int(number):
            raise MongoError(9, f"Expected an integer: {elem}")
    return int(value.to_decimal()) if kind == "decimal" else int(value)


def compile_filter(query: Mapping[str, Any]) -> Any:
    from oplog.query import compile_filter  # imported lazily: oplog.query depends on nothing here

    return compile_filter(dict(query))


_IDENTIFIER = re.compile(r"[a-z][a-zA-Z0-9]*")


def compile_array_filters(array_filters: list[Mapping[str, Any]]) -> dict[str, Any]:
    """arrayFilters -> {identifier: matcher}, with MongoDB's checks on the identifiers."""
    compiled: dict[str, Any] = {}
    for array_filter in array_filters:
        if not isinstance(array_filter, Mapping):
            raise MongoError(14, "arrayFilters entries must be objects")
        try:
            matcher = compile_filter(array_filter)
        except MongoError as exc:
            raise MongoError(exc.code, f"Error parsing array filter :: caused by :: {exc.errmsg}")
        identifier = _filter_identifier(array_filter)
        if identifier in compiled:
            raise MongoError(9, f"Found multiple array filters with the same top-level field name {identifier}")
        compiled[identifier] = matcher
    return compiled


def _filter_identifier(array_filter: Mapping[str, Any]) -> str:
    names: list[str] = []
    _filter_names(array_filter, names)
    if not names:
        raise MongoError(9, "Cannot use an expression without a top-level field name in arrayFilters")
    for other in names[1:]:
        if other != names[0]:
            raise MongoError(9, "Error parsing array filter :: caused by :: Expected a single top-level field "
                                f"name, found '{names[0]}' and '{other}'")
    if not _IDENTIFIER.fullmatch(names[0]):
        raise MongoError(2, "Error parsing array filter :: caused by :: The top-level field name must be an "
                            f"alphanumeric string beginning with a lowercase letter, found '{names[0]}'")
    return names[0]


def _filter_names(query: Mapping[str, Any], names: list[str]) -> None:
    for key, value in query.items():
        if key in ("$and", "$or", "$nor") and isinstance(value, list):
            for clause in value:
                if isinstance(clause, Mapping):
                    _filter_names(clause, names)
        elif not key.startswith("$"):
            names.append(key.split(".", 1)[0])


def validate_replacement_fields(replacement: Mapping[str, Any]) -> None:
    for key in replacement:
        if str(key).startswith("$"):
            raise MongoError(52, f"The dollar ($) prefixed field '{key}' in '{key}' is not allowed in the context "
                                 "of an update's replacement document. Consider using an aggregation pipeline "
                                 "with $replaceWith.")


_UPDATE_STAGES = frozenset({"$addFields", "$set", "$project", "$unset", "$replaceRoot", "$replaceWith"})


def validate_pipeline(stages: list[Any]) -> None:
    """Shape checks of a pipeline-style update (its stages are not evaluated here)."""
    for stage in stages:
        if not isinstance(stage, Mapping):
            raise MongoError(14, "Each element of the 'pipeline' array must be an object")
        if len(stage) != 1:
            raise MongoError(40323, "A pipeline stage specification object must contain exactly one field.")
        name = next(iter(stage))
        if name not in _UPDATE_STAGES:
            if str(name).startswith("$"):
                raise MongoError(72, f"{name} is not allowed to be used within an update")
            raise MongoError(40324, f"Unrecognized pipeline stage name: '{name}'")


# -- $push ------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class PushSpec:
    values: list[Any]
    slice: int | None = None
    sort: tuple[Any, ...] | None = None  # ("whole", direction) or ("fields", ((path, direction), ...))
    position: int | None = None


def parse_push(name: str, value: Any) -> PushSpec:
    if not (isinstance(value, Mapping) and "$each" in value):
        return PushSpec([value])
    for clause in value:
        if clause not in ("$each", "$slice", "$sort", "$position"):
            raise MongoError(2, f"Unrecognized clause in $push: {clause}")
    each = value["$each"]
    if not isinstance(each, list):
        raise MongoError(2, f"The argument to $each in $push must be an array but it was of type: {type_name(each)}")
    return PushSpec(list(each), _parse_push_int(value, "$slice", "must be an integer value but was given type: "),
                     _parse_sort(value["$sort"]) if "$sort" in value else None,
                     _parse_push_int(value, "$position", "must be an integer value, not of type: "))


def _parse_push_int(spec: Mapping[str, Any], clause: str, problem: str) -> int | None:
    if clause not in spec:
        return None
    try:
        return parse_long(clause, spec[clause])
    except MongoError:
        raise MongoError(2, f"The value for {clause} {problem}{type_name(spec[clause])}")


def _parse_sort(spec: Any) -> tuple[Any, ...]:
    if isinstance(spec, Mapping):
        if not spec:
            raise MongoError(2, "The $sort pattern is empty when it should be a set of fields.")
        fields = []
        for path, direction in spec.items():
            if not is_number(direction) or as_float(direction) not in (1.0, -1.0):
                raise MongoError(2, "The $sort element value must be either 1 or -1")
            if path == "":
                raise MongoError(2, "The $sort field cannot be empty")
            if "" in path.split("."):
                raise MongoError(2, f"The $sort field is a dotted field but has an empty part: {path}")
            fields.append((path, 1 if as_float(direction) > 0 else -1))
        return ("fields", tuple(fields))
    if is_number(spec):
        if as_float(spec) in (1.0, -1.0):
            return ("whole", 1 if as_float(spec) > 0 else -1)
        raise MongoError(2, "The $sort element value must be either 1 or -1")
    raise MongoError(2, "The $sort is invalid: use 1/-1 to sort the whole element, or {field:1/-1} to sort "
                        "embedded fields")


def push_values(array: list[Any], spec: PushSpec) -> list[Any]:
    """``PushNode::performPush``: insert at $position, then $sort, then $slice."""
    values = [deep_copy(value) for value in spec.values]
    if values:
        size, position = len(array), spec.position
        if size == 0 or position is None or position > size:
            index = size
        elif position > 0:
            index = position
        elif position < 0 and -position < size:
            index = size + position
        else:
            index = 0
        array[index:index] = values
    if spec.sort is not None:
        array = sorted(array, key=functools.cmp_to_key(_push_comparator(spec.sort)))
    if spec.slice is not None:
        array = array[: spec.slice] if spec.slice >= 0 else array[max(0, len(array) + spec.slice):]
    return array


def _push_comparator(sort: tuple[Any, ...]) -> Callable[[Any, Any], int]:
    if sort[0] == "whole":
        direction = sort[1]
        return lambda a, b: direction * compare_values(a, b)
    fields = sort[1]

    def key(value: Any) -> list[Any]:
        document = value if isinstance(value, dict) else {"": value}
        return [dotted_get(document, path)[1] for path, _ in fields]

    def compare(a: Any, b: Any) -> int:
        for (_, direction), x, y in zip(fields, key(a), key(b), strict=True):
            c = compare_values(x, y)
            if c:
                return direction * c
        return 0
    return compare
