"""MongoDB's names of BSON types, as its error messages give them ("... but found: long"). Pure."""

from __future__ import annotations

__layer__ = "core"  # pure: no I/O, clock or randomness (tests/unit/test_layering.py)

import datetime
import re
from collections.abc import Mapping
from typing import Any

from bson.binary import Binary
from bson.code import Code
from bson.dbref import DBRef
from bson.decimal128 import Decimal128
from bson.int64 import Int64
from bson.max_key import MaxKey
from bson.min_key import MinKey
from bson.objectid import ObjectId
from bson.regex import Regex
from bson.timestamp import Timestamp

INT32_MAX = 2**31 - 1


def bson_type(value: Any) -> str:
    """MongoDB's name of the BSON type this decoded value came from (as in its messages)."""
    name = _TYPE_NAMES.get(type(value))
    if name is not None:
        return name
    match value:
        case None:
            return "null"
        case bool():
            return "bool"
        case Int64():
            return "long"
        case int():
            return "int" if -(2**31) <= value <= INT32_MAX else "long"
        case float():
            return "double"
        case Code():  # (a str subclass: before str)
            return "javascript" if value.scope is None else "javascriptWithScope"
        case str():
            return "string"
        case Mapping() | DBRef():
            return "object"
        case list() | tuple():
            return "array"
        case Decimal128():
            return "decimal"
        case Binary() | bytes():
            return "binData"
        case ObjectId():
            return "objectId"
        case datetime.datetime():
            return "date"
        case Timestamp():
            return "timestamp"
        case Regex() | re.Pattern():
            return "regex"
        case MinKey():
            return "minKey"
        case MaxKey():
            return "maxKey"
    return type(value).__name__


_TYPE_NAMES: dict[type, str] = {
    dict: "object", list: "array", str: "string", float: "double", bool: "bool", type(None): "null",
    Int64: "long", Decimal128: "decimal", Binary: "binData", ObjectId: "objectId",
}
