"""Path walking and value helpers for `oplog.update` (MongoDB's update semantics).

Theory of operation: an update path is a list of string parts ("a.0.b" ->
["a", "0", "b"]). Walking it from the document root finds the longest prefix that
exists (`resolve`); an object is entered by field name, an array by a part made only
of digits. What is left over is the *path to create*: `create_path` builds it the
way MongoDB's ``pathsupport::createPathAt`` does (an array is padded with nulls up
to a numeric index; everything created below that is an object; a scalar, or an
array reached with a non-numeric part, is "not viable" -> 28 PathNotViable).

Also here: MongoDB's ordering of sibling update paths (`compare_field_names`,
numeric-aware), binary identity of BSON values (`identical`, what MongoDB calls
"binaryEqualValues": same type and same bytes), deep copies, and the shell-like
rendering of values used in MongoDB's error messages (`format_value`).

Pure: no I/O.
"""

from __future__ import annotations

import datetime
import functools
import re
import uuid
from collections.abc import Mapping
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

from oplog.errors import MongoError
from oplog.values import TYPE_ALIASES, bson_type_code

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
    a_num = bool(a) and a[0].isdigit() and not (a[0] == "0" and len(a) > 1)
    b_num = bool(b) and b[0].isdigit() and not (b[0] == "0" and len(b) > 1)
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
        value = value.astimezone(datetime.timezone.utc).replace(tzinfo=None)
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
