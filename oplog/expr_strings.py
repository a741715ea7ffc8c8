"""String expression operators: ``$toUpper``, ``$toLower``, ``$concat``, ``$substr``,
``$substrBytes``, ``$substrCP``, ``$strLenCP``, ``$strLenBytes``, ``$split``,
``$strcasecmp``, ``$trim``, ``$ltrim`` and ``$rtrim``.

Case mapping is ASCII only, as on the server, and byte offsets count UTF-8 bytes. A string
built (``$concat``) holds less than 16 MiB (16493, as mongod's string values), and ``$split``
gives at most 100 MiB of pieces (146).
`_coerce_to_string` is the server's coercion of numbers, dates and nullish values to
strings.

Pure: no I/O and no clock.
"""

from __future__ import annotations

__layer__ = "core"  # pure: no I/O, clock or randomness (tests/unit/test_layering.py)

import datetime
import math
from typing import Any

from bson.decimal128 import Decimal128

from base.errors import MongoError
from oplog.doc_limits import C_STEP, MEMORY_LIMIT, VALUE_SIZE, check_string_size, exceeded_memory
from oplog.expr_dates import format_date
from oplog.expr_eval import Context, _Args, _eager, _eval, _lazy, _object_args
from oplog.expr_values import INT32_MAX, INT32_MIN, _is_integral, _to_int, is_nullish, type_name
from oplog.values import is_number


def _format_double(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "Infinity" if value > 0 else "-Infinity"
    text = repr(value)
    return text[:-2] if text.endswith(".0") else text


def _coerce_to_string(name: str, value: Any) -> str:
    if is_nullish(value):
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        raise MongoError(16007, "can't convert from BSON type bool to String")
    if isinstance(value, float):
        return _format_double(value)
    if isinstance(value, (int, Decimal128)):
        return str(value)
    if isinstance(value, datetime.datetime):
        return format_date(value)
    raise MongoError(16007, f"can't convert from BSON type {type_name(value)} to String")


_ASCII_UPPER = str.maketrans("abcdefghijklmnopqrstuvwxyz", "ABCDEFGHIJKLMNOPQRSTUVWXYZ")
_ASCII_LOWER = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")


@_eager("$toUpper", "$toLower", nmin=1, nmax=1)
def _op_case(name: str, vals: list[Any], ctx: Context) -> Any:
    text = _coerce_to_string(name, vals[0])
    return text.translate(_ASCII_UPPER if name == "$toUpper" else _ASCII_LOWER)


@_eager("$concat")
def _op_concat(name: str, vals: list[Any], ctx: Context) -> Any:
    for value in vals:
        if is_nullish(value):
            return None
        if not isinstance(value, str):
            raise MongoError(16702, f"$concat only supports strings, not {type_name(value)}")
    # (Counted before joining: the parts may be one long string many times over.)
    check_string_size(sum(len(value) for value in vals))
    check_string_size(sum(_utf8_size(value) for value in vals))
    return "".join(vals)


def _utf8_size(text: str) -> int:
    return len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))


def _is_continuation(byte: int) -> bool:
    return 0x80 <= byte < 0xC0


@_eager("$substr", "$substrBytes", nmin=3, nmax=3)
def _op_substr_bytes(name: str, vals: list[Any], ctx: Context) -> Any:
    text, start, length = vals
    data = _coerce_to_string(name, text).encode()
    if not is_number(start):
        raise MongoError(16034, f"{name}: starting index must be a numeric type (is BSON type {type_name(start)})")
    if not is_number(length):
        raise MongoError(16035, f"{name}: length must be a numeric type (is BSON type {type_name(length)})")
    lo, count = _to_int(start), _to_int(length)
    if lo < 0 or lo >= len(data):
        return ""
    hi = len(data) if count < 0 else min(lo + count, len(data))
    if _is_continuation(data[lo]):
        raise MongoError(28656, f"{name}:  Invalid range, starting index is a UTF-8 continuation byte.")
    if hi < len(data) and _is_continuation(data[hi]):
        raise MongoError(28657, f"{name}:  Invalid range, ending index is in the middle of a UTF-8 character.")
    return data[lo:hi].decode()


@_eager("$substrCP", nmin=3, nmax=3)
def _op_substr_cp(name: str, vals: list[Any], ctx: Context) -> Any:
    text, start, length = vals
    text = _coerce_to_string(name, text)
    for what, value, codes in (("starting index", start, (34450, 34451)), ("length", length, (34452, 34453))):
        if not is_number(value):
            raise MongoError(codes[0], f"$substrCP: {what} must be a numeric type (is BSON type {type_name(value)})")
        if not _is_integral(value, INT32_MIN, INT32_MAX):
            raise MongoError(codes[1], f"$substrCP: {what} cannot be represented as a 32-bit integral value: {value}")
    lo, count = _to_int(start), _to_int(length)
    if lo < 0:
        raise MongoError(34454, "$substrCP: the starting index must be nonnegative integer.")
    if count < 0:
        raise MongoError(34455, "$substrCP: length must be a nonnegative integer.")
    return text[lo : lo + count]


@_eager("$strLenCP", "$strLenBytes", nmin=1, nmax=1)
def _op_strlen(name: str, vals: list[Any], ctx: Context) -> Any:
    value = vals[0]
    if not isinstance(value, str):
        code = 34471 if name == "$strLenCP" else 34473
        raise MongoError(code, f"{name} requires a string argument, found: {type_name(value)}")
    return len(value) if name == "$strLenCP" else len(value.encode())


@_eager("$split", nmin=2, nmax=2)
def _op_split(name: str, vals: list[Any], ctx: Context) -> Any:
    text, sep = vals
    if is_nullish(text) or is_nullish(sep):
        return None
    if not isinstance(text, str):
        raise MongoError(40085, f"$split requires an expression that evaluates to a string as a first argument, found: {type_name(text)}")
    if not isinstance(sep, str):
        raise MongoError(40086, f"$split requires an expression that evaluates to a string as a second argument, found: {type_name(sep)}")
    if not sep:
        raise MongoError(40087, "$split requires a non-empty separator")
    pieces = text.count(sep) + 1
    needed = VALUE_SIZE + pieces * VALUE_SIZE + _utf8_size(text)
    if needed >= MEMORY_LIMIT:
        raise exceeded_memory("$split", needed)
    if pieces <= C_STEP:
        return text.split(sep)
    out: list[str] = []
    rest = text
    while True:  # `C_STEP` pieces per step: each step's C work stays short (see oplog.doc_limits)
        *done, rest = rest.split(sep, C_STEP)
        out.extend(done)
        if not done:
            out.append(rest)
            return out


@_eager("$strcasecmp", nmin=2, nmax=2)
def _op_strcasecmp(name: str, vals: list[Any], ctx: Context) -> Any:
    a, b = (_coerce_to_string(name, v).translate(_ASCII_UPPER) for v in vals)
    return (a > b) - (a < b)


_WHITESPACE = "\0 \t\n\v\f\r\u00a0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a\u2028\u2029\u202f\u205f\u3000"


@_lazy("$trim", "$ltrim", "$rtrim", args=_Args(("input", "chars"), ("input",), (50694, 50695)))
def _op_trim(name: str, raw: Any, ctx: Context) -> Any:
    spec = _object_args(name, raw)
    text = _eval(spec["input"], ctx)
    chars = _eval(spec["chars"], ctx) if "chars" in spec else _WHITESPACE
    if is_nullish(text) or is_nullish(chars):
        return None
    if not isinstance(text, str):
        raise MongoError(50699, f"{name} requires its input to be a string, got {text!r} (of type {type_name(text)}) instead.")
    if not isinstance(chars, str):
        raise MongoError(50700, f"{name} requires 'chars' to be a string, got {chars!r} (of type {type_name(chars)}) instead.")
    if name == "$ltrim":
        return text.lstrip(chars)
    return text.rstrip(chars) if name == "$rtrim" else text.strip(chars)
