"""Date expression operators: the date parts (``$year``, ``$month``... ``$isoDayOfWeek``)
and ``$dateToString``, in UTC or a fixed-offset time zone (``"+hh:mm"``; named zones
other than UTC are not supported).

Also here, for the other families: a date as milliseconds since the Unix epoch
(`_date_ms`) and a date in the ISO-8601 form ``$toString`` gives it (`format_date`).

Pure: no I/O and no clock.
"""

from __future__ import annotations

__layer__ = "core"  # pure: no I/O, clock or randomness (tests/unit/test_layering.py)

import datetime
from collections.abc import Callable
from typing import Any

from bson.objectid import ObjectId
from bson.timestamp import Timestamp

from base.errors import MongoError
from oplog.expr_eval import Context, _Args, _eval, _lazy, _object_args
from oplog.expr_values import is_nullish, type_name

__all__ = [
    "format_date",
]


_EPOCH = datetime.datetime(1970, 1, 1)


def _date_ms(value: datetime.datetime) -> int:
    if value.tzinfo is not None:
        value = value.astimezone(datetime.UTC).replace(tzinfo=None)
    return (value - _EPOCH) // datetime.timedelta(milliseconds=1)


def format_date(value: datetime.datetime) -> str:
    return _format_date(_utc_naive(value), "%Y-%m-%dT%H:%M:%S.%LZ", 0)


def _utc_naive(value: datetime.datetime) -> datetime.datetime:
    if value.tzinfo is not None:
        return value.astimezone(datetime.UTC).replace(tzinfo=None)
    return value


def _as_datetime(name: str, value: Any) -> datetime.datetime:
    if isinstance(value, datetime.datetime):
        return _utc_naive(value)
    if isinstance(value, Timestamp):
        return _EPOCH + datetime.timedelta(seconds=value.time)
    if isinstance(value, ObjectId):
        return _utc_naive(value.generation_time)
    raise MongoError(16006, f"can't convert from BSON type {type_name(value)} to Date")


def _tz_offset_minutes(tz: Any) -> int:
    if tz is None or tz in ("UTC", "GMT", "Z", "Etc/UTC", "Etc/GMT"):
        return 0
    if not isinstance(tz, str):
        raise MongoError(40517, f"timezone must evaluate to a string, found {type_name(tz)}")
    digits = tz[1:].replace(":", "")
    if tz[:1] in "+-" and tz[:1] and digits.isdigit() and len(digits) in (2, 4):
        minutes = int(digits[:2]) * 60 + int(digits[2:] or 0)
        return -minutes if tz[0] == "-" else minutes
    raise MongoError(40485, f'unrecognized time zone identifier: "{tz}"')


def _date_input(name: str, raw: Any, ctx: Context) -> tuple[datetime.datetime, int] | None:
    """A date operator's (local time, UTC offset in minutes), or None for a nullish date."""
    tz: Any = None
    if isinstance(raw, dict) and "date" in raw and not next(iter(raw)).startswith("$"):
        for key in raw:
            if key not in ("date", "timezone"):
                raise MongoError(40535, f'unrecognized option to {name}: "{key}"')
        date = _eval(raw["date"], ctx)
        if "timezone" in raw:
            tz = _eval(raw["timezone"], ctx)
            if is_nullish(tz):
                return None
    else:
        args = raw if isinstance(raw, list) else [raw]
        if len(args) != 1:
            raise MongoError(40536, f"{name} accepts exactly one argument if given an array, but was given {len(args)}")
        date = _eval(args[0], ctx)
    if is_nullish(date):
        return None
    offset = _tz_offset_minutes(tz)
    return _as_datetime(name, date) + datetime.timedelta(minutes=offset), offset


_DATE_PARTS: dict[str, Callable[[datetime.datetime], int]] = {
    "$year": lambda d: d.year,
    "$month": lambda d: d.month,
    "$dayOfMonth": lambda d: d.day,
    "$hour": lambda d: d.hour,
    "$minute": lambda d: d.minute,
    "$second": lambda d: d.second,
    "$millisecond": lambda d: d.microsecond // 1000,
    "$dayOfYear": lambda d: d.timetuple().tm_yday,
    "$dayOfWeek": lambda d: d.isoweekday() % 7 + 1,
    "$week": lambda d: int(d.strftime("%U")),
    "$isoWeek": lambda d: d.isocalendar()[1],
    "$isoWeekYear": lambda d: d.isocalendar()[0],
    "$isoDayOfWeek": lambda d: d.isoweekday(),
}


@_lazy(*_DATE_PARTS)
def _op_date_part(name: str, raw: Any, ctx: Context) -> Any:
    found = _date_input(name, raw, ctx)
    return None if found is None else _DATE_PARTS[name](found[0])


def _offset_text(minutes: int, colon: bool = False) -> str:
    sign = "-" if minutes < 0 else "+"
    hours, mins = divmod(abs(minutes), 60)
    return f"{sign}{hours:02d}{':' if colon else ''}{mins:02d}"


_FORMATTERS: dict[str, Callable[[datetime.datetime, int], str]] = {
    "Y": lambda d, o: f"{d.year:04d}",
    "m": lambda d, o: f"{d.month:02d}",
    "d": lambda d, o: f"{d.day:02d}",
    "H": lambda d, o: f"{d.hour:02d}",
    "M": lambda d, o: f"{d.minute:02d}",
    "S": lambda d, o: f"{d.second:02d}",
    "L": lambda d, o: f"{d.microsecond // 1000:03d}",
    "j": lambda d, o: f"{d.timetuple().tm_yday:03d}",
    "w": lambda d, o: str(d.isoweekday() % 7 + 1),
    "u": lambda d, o: str(d.isoweekday()),
    "U": lambda d, o: d.strftime("%U"),
    "G": lambda d, o: f"{d.isocalendar()[0]:04d}",
    "V": lambda d, o: f"{d.isocalendar()[1]:02d}",
    "z": lambda d, o: _offset_text(o),
    "Z": lambda d, o: str(o),
    "%": lambda d, o: "%",
}


def _format_date(local: datetime.datetime, fmt: str, offset: int) -> str:
    out, i = [], 0
    while i < len(fmt):
        ch = fmt[i]
        if ch != "%":
            out.append(ch)
            i += 1
            continue
        if i + 1 >= len(fmt):
            raise MongoError(18535, "Unmatched '%' at end of format string")
        spec = fmt[i + 1]
        if spec not in _FORMATTERS:
            raise MongoError(18536, f"Invalid format character '%{spec}' in format string")
        out.append(_FORMATTERS[spec](local, offset))
        i += 2
    return "".join(out)


@_lazy("$dateToString", args=_Args(("date", "format", "timezone", "onNull"), ("date",), (18534, 18628)))
def _op_date_to_string(name: str, raw: Any, ctx: Context) -> Any:
    spec = _object_args(name, raw)
    found = _date_input(name, {k: spec[k] for k in ("date", "timezone") if k in spec}, ctx)
    if found is None:
        return _eval(spec["onNull"], ctx) if "onNull" in spec else None
    default = "%Y-%m-%dT%H:%M:%S.%LZ" if "timezone" not in spec else "%Y-%m-%dT%H:%M:%S.%L"
    fmt = _eval(spec["format"], ctx) if "format" in spec else default
    if is_nullish(fmt):
        return None
    if not isinstance(fmt, str):
        raise MongoError(18533, f"$dateToString requires that 'format' be a string, found: {type_name(fmt)}")
    return _format_date(found[0], fmt, found[1])
