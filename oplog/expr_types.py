"""Type and conversion expression operators: ``$type``, ``$isNumber``, and ``$toString``,
``$toInt``, ``$toLong``, ``$toDouble`` and ``$toBool`` (the short forms of ``$convert``:
a value that does not convert fails with 241 ConversionFailure, as ``$convert``
without ``onError`` does).

Pure: no I/O and no clock.
"""

from __future__ import annotations

__layer__ = "core"  # pure: no I/O, clock or randomness (tests/unit/test_layering.py)

import datetime
import math
from typing import Any

from bson.int64 import Int64
from bson.objectid import ObjectId

from base.errors import MongoError
from oplog.expr_dates import _date_ms
from oplog.expr_eval import Context, _eager
from oplog.expr_strings import _coerce_to_string
from oplog.expr_values import (
    INT32_MAX,
    INT32_MIN,
    INT64_MAX,
    INT64_MIN,
    _to_float,
    _to_int,
    is_nullish,
    is_truthy,
    type_name,
)
from oplog.values import is_number


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
