"""OpTime: the position of an entry in the replicated log, `(ts, term)`.

`ts` is a BSON Timestamp (seconds, increment) that strictly increases on one
primary; `t` is the election term. Comparison is by term first, then `ts`, like
MongoDB's `OpTime::operator<`: that is Raft's "more up-to-date log" order, so a
deposed primary's later timestamps in an older term never outrank the new
primary's entries. Within one log both grow together. Pure: the caller passes
the wall-clock seconds in.
"""

from __future__ import annotations

__layer__ = "core"  # pure: no I/O, clock or randomness (tests/unit/test_layering.py)

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from bson.int64 import Int64
from bson.timestamp import Timestamp

from base.bson_types import bson_type
from base.errors import MongoError
from base.numbers import MAX_TERM, UNINITIALIZED_TERM, int_in_range


@dataclass(frozen=True, slots=True)
class OpTime:
    secs: int
    inc: int
    term: int

    def _order(self) -> tuple[int, int, int]:
        return (self.term, self.secs, self.inc)

    def __lt__(self, other: OpTime) -> bool:
        return self._order() < other._order()

    def __le__(self, other: OpTime) -> bool:
        return self._order() <= other._order()

    def __gt__(self, other: OpTime) -> bool:
        return self._order() > other._order()

    def __ge__(self, other: OpTime) -> bool:
        return self._order() >= other._order()

    @property
    def ts(self) -> Timestamp:
        return Timestamp(self.secs, self.inc)

    @property
    def ts_key(self) -> int:
        """The 64-bit integer form of `ts`, the oplog's primary key."""
        return (self.secs << 32) | self.inc

    def to_document(self) -> dict[str, Any]:
        return {"ts": self.ts, "t": Int64(self.term)}

    @classmethod
    def from_document(cls, doc: Mapping[str, Any]) -> OpTime:
        """`{ts, t}` as an oplog entry or a peer's message carries it: `ts` a BSON Timestamp, `t` (absent:
        -1) an integer term up to `MAX_TERM`; anything else is FailedToParse (9) or BadValue (2)."""
        ts, t = doc.get("ts"), doc.get("t", UNINITIALIZED_TERM)
        # Every entry this set writes: a Timestamp and an Int64 term in range, read without the checks.
        if type(ts) is Timestamp and type(t) is Int64 and UNINITIALIZED_TERM <= t <= MAX_TERM:
            return cls(ts.time, ts.inc, int(t))
        if not isinstance(ts, Timestamp):
            raise MongoError(9, f"Expected field \"ts\" to be a Timestamp, but found {bson_type(ts)}")
        term = int_in_range(doc.get("t", UNINITIALIZED_TERM), "t", UNINITIALIZED_TERM, MAX_TERM, type_code=9)
        return cls(ts.time, ts.inc, term)

    @classmethod
    def from_ts_key(cls, key: int, term: int) -> OpTime:
        return cls(key >> 32, key & 0xFFFFFFFF, term)


NULL_OPTIME = OpTime(0, 0, -1)


def ts_key(ts: Timestamp) -> int:
    return (ts.time << 32) | ts.inc


def next_optime(last: OpTime, now_secs: int, term: int) -> OpTime:
    """The optime after `last`: strictly increasing even if the clock goes backwards."""
    if now_secs > last.secs:
        return OpTime(now_secs, 1, term)
    if last.inc >= 0xFFFFFFFF:
        return OpTime(last.secs + 1, 1, term)
    return OpTime(last.secs, last.inc + 1, term)
