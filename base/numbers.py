"""Numbers that cross a process boundary: strict integer parsing with a range, and the ranges.

Theory of operation
-------------------
Every number another process sends us - a peer's term in a heartbeat, a config
version in `replSetReconfig`, an election timeout in the config's settings - is
checked where it enters, the way mongod's IDL and `bsonExtractIntegerField` do:

- not a number at all (a string, a bool, null)  -> the caller's type code
- a number that is not an exact integer (1.5, NaN, infinity, 1e300 - beyond
  64 bits)                                         -> BadValue (2), "Expected field
  "term" to have a value exactly representable as a 64-bit integer, but found ..."
- an integer outside the field's range            -> BadValue (2), "BSON field 'term'
  value must be <= ..., actual value '...'"

so that nothing further in can meet a value it cannot store, count with or
sleep for. Int32, Int64, doubles with an integral value and exact Decimal128
values are accepted, as mongod accepts them; bools are refused (BSON has no
numeric bool).

Pure: no I/O.
"""

from __future__ import annotations

__layer__ = "core"  # pure: no I/O, clock or randomness (tests/unit/test_layering.py)

import decimal
import math
from typing import Any

from bson.decimal128 import Decimal128

from base.bson_types import bson_type
from base.errors import MongoError

INT32_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1
INT64_MIN = -(2**63)

# The largest election term a member adopts, persists or sends. MongoDB's terms are int64 with no
# bound below that; a term at the int64 limit can never be followed (term + 1 cannot be stored), so
# one message carrying it would end elections for good. 2**62 leaves room for any number of further
# elections (2**62 more than any set will hold) while keeping every term, and term + 1, an int64.
MAX_TERM = 2**62
UNINITIALIZED_TERM = -1

# mongod's ReplSetConfig `version` (repl_set_config.idl: `validator: {gt: 0, lt: 2147483648}`).
MAX_CONFIG_VERSION = INT32_MAX
# A member without a config sends -2 as its config version (kUninitializedConfigVersion).
UNINITIALIZED_CONFIG_VERSION = -2
# Member ids: mongod's MemberId is a non-negative int32; -1 stands for "none" in messages.
MAX_MEMBER_ID = INT32_MAX


def _shown(value: Any) -> str:
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return f"{value:g}" if abs(value) >= 1e16 else repr(value)
    return str(value)


def exact_int(value: Any, field: str, *, type_code: int = 14) -> int:
    """`value` as a Python int when it is a number with an exact 64-bit integer value; else the
    MongoError mongod's `bsonExtractIntegerField` gives (`type_code` for a value of another type)."""
    if isinstance(value, bool) or not isinstance(value, (int, float, Decimal128)):
        raise MongoError(type_code, f"Expected field \"{field}\" to have numeric type, but found "
                                    f"{bson_type(value)}")
    number: int | None
    if isinstance(value, int):
        number = int(value)
    elif isinstance(value, float):
        number = int(value) if math.isfinite(value) and value.is_integer() else None
    else:
        exact = value.to_decimal()
        number = int(exact) if exact.is_finite() and exact == exact.to_integral_value(decimal.ROUND_DOWN) else None
    if number is None or not INT64_MIN <= number <= INT64_MAX:
        raise MongoError(2, f"Expected field \"{field}\" to have a value exactly representable as a 64-bit "
                            f"integer, but found {field}: {_shown(value)}")
    return number


def int_in_range(value: Any, field: str, low: int, high: int, *, type_code: int = 14) -> int:
    """`exact_int`, then the range `low <= value <= high` (BadValue (2) in mongod's IDL words)."""
    number = exact_int(value, field, type_code=type_code)
    if number < low:
        raise MongoError(2, f"BSON field '{field}' value must be >= {low}, actual value '{number}'")
    if number > high:
        raise MongoError(2, f"BSON field '{field}' value must be <= {high}, actual value '{number}'")
    return number


def finite_number(value: Any, field: str, *, type_code: int = 14) -> float:
    """A number that may have a fraction (seconds for a stepdown or a freeze), but is finite."""
    if isinstance(value, bool) or not isinstance(value, (int, float, Decimal128)):
        raise MongoError(type_code, f"Expected field \"{field}\" to have numeric type, but found "
                                    f"{bson_type(value)}")
    try:
        number = float(value.to_decimal()) if isinstance(value, Decimal128) else float(value)
    except OverflowError:  # an int beyond any double (never from BSON, whose ints are 64-bit)
        number = math.inf
    if not math.isfinite(number):
        raise MongoError(2, f"Expected field \"{field}\" to be a finite number, but found {field}: "
                            f"{_shown(number)}")
    return number


def safe_number_long(value: Any) -> int:
    """mongod's BSONElement::safeNumberLong: truncate toward zero, NaN -> 0, clamp to 64 bits."""
    if isinstance(value, Decimal128):
        dec = value.to_decimal()
        if dec.is_nan():
            return 0
        if dec.is_infinite():
            return INT64_MAX if dec > 0 else INT64_MIN
        value = int(dec)
    elif isinstance(value, float):
        if math.isnan(value):
            return 0
        if math.isinf(value):
            return INT64_MAX if value > 0 else INT64_MIN
        value = int(value)
    return max(INT64_MIN, min(INT64_MAX, int(value)))
