"""Reading `local.oplog.rs`: natural-order scans in chunks, starting where a
`{ts: {$gt|$gte: T}}` filter allows, and remembering the last key for tailing."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import bson
from bson.raw_bson import RawBSONDocument
from bson.timestamp import Timestamp

from base.errors import MongoError
from base.optime import ts_key
from oplog.codec_options import DOC_OPTIONS

CHUNK = 1000
OPLOG_NS = "local.oplog.rs"


def oplog_start_key(query: dict[str, Any]) -> int:
    """The oplog key to scan *after*, derived from the query's `ts` lower bound."""
    cond = query.get("ts")
    if isinstance(cond, dict):
        if isinstance(cond.get("$gt"), Timestamp):
            return ts_key(cond["$gt"])
        if isinstance(cond.get("$gte"), Timestamp):
            return max(ts_key(cond["$gte"]) - 1, 0)
    elif isinstance(cond, Timestamp):
        return max(ts_key(cond) - 1, 0)
    return 0


def oplog_end_key(query: dict[str, Any]) -> int:
    """The oplog key to scan *before* in a reverse scan, from the query's `ts` upper bound."""
    cond = query.get("ts")
    top = (1 << 63) - 1
    if isinstance(cond, dict):
        if isinstance(cond.get("$lt"), Timestamp):
            return ts_key(cond["$lt"])
        if isinstance(cond.get("$lte"), Timestamp):
            return min(ts_key(cond["$lte"]) + 1, top)
    return top


def start_key_is_whole_filter(query: dict[str, Any]) -> bool:
    """Whether `oplog_start_key` alone implements `query` ({} or one `ts` $gt/$gte bound), so
    entries can be served as stored, without decoding them to match."""
    if not query:
        return True
    cond = query.get("ts")
    return (len(query) == 1 and isinstance(cond, dict) and len(cond) == 1
            and isinstance(cond.get("$gt", cond.get("$gte")), Timestamp))


def check_tail_position(reader: Any, last_key: int) -> None:
    """A tailing cursor resumes after the entry it returned last; if the capped oplog trimmed
    that entry, later ones may be gone too, and reading on would silently skip them."""
    if last_key and last_key <= reader.oplog_trimmed_through:
        raise MongoError(136, "CappedPositionLost: the oplog was trimmed past this cursor's position")


def raw_oplog_source(reader: Any, after_key: int, state: dict[str, int]) -> Iterator[Any]:
    """Entries after `after_key` as stored (RawBSONDocument): the sync source's hot path."""
    key = after_key
    while rows := reader.oplog_after(key, CHUNK):
        for row_key, blob in rows:
            state["last"] = row_key
            yield RawBSONDocument(blob)
        key = rows[-1][0]
        check_tail_position(reader, key)  # a trim may have run while the cursor was idle


def oplog_source(reader: Any, after_key: int, *, reverse: bool, before_key: int = (1 << 63) - 1,
                 state: dict[str, int] | None = None) -> Iterator[dict[str, Any]]:
    """Decoded entries after `after_key` in order, or (`reverse`) before `before_key`, newest first."""
    if reverse:
        key = before_key
        while rows := reader.oplog_before(key, CHUNK):
            for _key, blob in rows:
                yield bson.decode(blob, DOC_OPTIONS)
            key = rows[-1][0]
        return
    key = after_key
    while rows := reader.oplog_after(key, CHUNK):
        for row_key, blob in rows:
            if state is not None:
                state["last"] = row_key
            yield bson.decode(blob, DOC_OPTIONS)
        key = rows[-1][0]
        check_tail_position(reader, key)
