"""Where a replicated write spends its time: a timestamp at each hop of the write path, per oplog entry.

Off unless the member starts with `REPLSET_TRACE_HOPS=1` in its environment (then each mark is one
tuple appended to a bounded deque). `python -m bench.trace` reads the marks of every member
(`GET /hops` on the member's HTTP port, which also clears them) and lines them up per write. The
clock is the monotonic clock, which every process of one machine shares, so the marks of the
primary, its secondaries and the client compare directly.

The marks (each with the timestamp key of the newest entry it concerns):

    request     a write command (insert, update, delete) arrived (key 0)
    reply       its reply was handed to the socket (key 0)
    commit      a transaction committed here (a write on the primary, an applied batch on a secondary)
    durable     a journal flush ended: everything up to the key is journaled here
    served      a getMore on the oplog answered a fetcher, up to the key
    received    the fetcher got a batch, up to the key
    report      positions went upstream (on a getMore or a replSetUpdatePosition), durable up to the key
    commit_pt   positions came in and the majority commit point is now at the key
    acked       a write waiting for its write concern at the key was released
"""

from __future__ import annotations

import collections
import os

from base.clock import Clock

ENV = "REPLSET_TRACE_HOPS"
MAX_MARKS = 200_000

Mark = tuple[str, int, float]  # hop name, timestamp key, monotonic seconds


class Hops:
    def __init__(self, clock: Clock, *, enabled: bool | None = None) -> None:
        self.enabled = os.environ.get(ENV) == "1" if enabled is None else enabled
        self._clock = clock
        self._marks: collections.deque[Mark] = collections.deque(maxlen=MAX_MARKS)

    def mark(self, hop: str, ts_key: int) -> None:
        if self.enabled:
            self._marks.append((hop, ts_key, self._clock.monotonic()))

    def take(self) -> list[Mark]:
        """The marks so far, oldest first; they are forgotten here."""
        marks = list(self._marks)
        self._marks.clear()
        return marks
