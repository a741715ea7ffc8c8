"""TTL indexes: which documents have expired.

A TTL index is a single-field index with `expireAfterSeconds`. A document expires once the date in
that field (the earliest, for an array of dates) is more than `expireAfterSeconds` in the past; a
document whose field holds no date never expires. `expired_filter` is that rule as a query filter
(`$lt` on a date matches a date or an array holding an earlier one, and nothing else), so the
monitor finds expired documents with the ordinary matcher and deletes them through ordinary delete
entries, re-checked in the write transaction.
"""

from __future__ import annotations

__layer__ = "core"  # pure: no I/O, clock or randomness (tests/unit/test_layering.py)

import datetime
from collections.abc import Mapping
from typing import Any

from base.errors import MongoError

MAX_EXPIRE_AFTER_SECONDS = 2**31 - 1


def expire_after_seconds(value: Any) -> int:
    """A collection's `expireAfterSeconds` (a clustered or time-series one's), checked as mongod does."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= MAX_EXPIRE_AFTER_SECONDS:
        raise MongoError(2, f"'expireAfterSeconds' must be within [0, {MAX_EXPIRE_AFTER_SECONDS}], got {value!r}")
    return int(value)


def check_ttl_spec(spec: Mapping[str, Any]) -> None:
    """An index spec's `expireAfterSeconds`, checked as mongod does when the index is created."""
    if "expireAfterSeconds" not in spec:
        return
    value = spec["expireAfterSeconds"]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= MAX_EXPIRE_AFTER_SECONDS:
        raise MongoError(2, f"TTL index 'expireAfterSeconds' option must be within an acceptable range "
                            f"[0, {MAX_EXPIRE_AFTER_SECONDS}], got {value!r}")
    if len(spec["key"]) != 1:
        raise MongoError(67, "TTL indexes are single-field indexes, compound indexes do not support TTL")
    if next(iter(spec["key"])) == "_id":
        raise MongoError(67, "The field 'expireAfterSeconds' is not valid for an _id index specification")


def expired_filter(spec: Mapping[str, Any], now: datetime.datetime) -> dict[str, Any] | None:
    """The filter matching the documents `spec` (an index spec) has expired at `now`; None if `spec`
    is not a TTL index."""
    seconds = spec.get("expireAfterSeconds")
    if seconds is None or isinstance(seconds, bool) or len(spec.get("key", {})) != 1:
        return None
    field = next(iter(spec["key"]))
    cutoff = now - datetime.timedelta(seconds=float(seconds))
    return {field: {"$lt": cutoff.replace(tzinfo=None) if cutoff.tzinfo else cutoff}}
