"""Query execution off the event loop: scans, filters, sorts and aggregations run on worker threads.

Theory of operation: the event loop serves heartbeats, elections, replication and every client, so
no work whose cost grows with the data may run on it. A read that is not a point lookup (`_id`
equality) or an oplog read hands each batch to `QueryPool.run`, which runs it on one of a few worker
threads with a reader connection of that thread's own (`SQLiteStore.thread_reader`). The loop waits
for the batch without blocking and goes on serving everything else meanwhile.

Threads share one interpreter, so the loop still needs its turn: pure-Python work (decoding,
matching, computing sort keys) gives it up every `sys.getswitchinterval()` (0.2 ms here); SQLite
steps release it; the C-level steps that would not (one big `list.sort`, a runaway regex) are
bounded where they happen: sorts go in runs of `oplog.sort.SORT_RUN` documents, and regex matching
releases the interpreter and stops at its budget (`oplog.query_regex.REGEX_BUDGET`).

Time limits: `maxTimeMS` is what the operation may spend in total, over its first batch and every
getMore (`TimeLimit`, kept by the cursor). Inside a batch, `check_time_limit` is called from the
scan between documents and from long expression evaluations (`oplog.expr_eval.interrupt_point`),
and the regex budget is the smaller of `REGEX_MATCH_LIMIT_S` and what the limit leaves; going over
answers `MaxTimeMSExpired` (50).
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

from base.clock import SYSTEM_CLOCK, Clock
from base.errors import MongoError
from oplog.expr_eval import INTERRUPT_CHECK
from oplog.query_regex import REGEX_BUDGET, RegexBudget

T = TypeVar("T")

QUERY_THREADS = 4
# One regex match on a worker thread may run this long (the loop is not waiting on it).
REGEX_MATCH_LIMIT_S = 1.0
CHECK_EVERY = 64  # documents between two looks at the clock

# The running batch's deadline, with the clock it is on.
_DEADLINE: contextvars.ContextVar[tuple[Clock, float] | None] = contextvars.ContextVar(
    "query_deadline", default=None)


def time_limit_error() -> MongoError:
    return MongoError(50, "operation exceeded time limit")


@dataclass(slots=True)
class TimeLimit:
    """What is left of an operation's `maxTimeMS` (None: no limit), spent batch by batch."""

    left_s: float | None = None

    @classmethod
    def from_max_time_ms(cls, max_time_ms: int) -> TimeLimit:
        return cls(max_time_ms / 1000 if max_time_ms > 0 else None)


def check_time_limit() -> None:
    """Raises `MaxTimeMSExpired` when the batch running on this thread is past its deadline."""
    deadline = _DEADLINE.get()
    if deadline is not None and deadline[0].monotonic() > deadline[1]:
        raise time_limit_error()


def time_checked(source: Iterator[Any]) -> Iterator[Any]:
    """`source`, looking at the running batch's deadline every `CHECK_EVERY` items (the filter above it
    may discard every document, so the check belongs under it, at the scan)."""
    for i, item in enumerate(source):
        if i % CHECK_EVERY == 0:
            check_time_limit()
        yield item


class QueryPool:
    def __init__(self, threads: int = QUERY_THREADS, clock: Clock = SYSTEM_CLOCK) -> None:
        self._executor = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="query")
        self._clock = clock
        self.batches = 0

    async def run(self, fn: Callable[[], T], limit: TimeLimit | None = None) -> T:
        """`fn()` on a worker thread, within what `limit` leaves (which it then spends)."""
        limit = limit or TimeLimit()
        if limit.left_s is not None and limit.left_s <= 0:
            raise time_limit_error()
        started = self._clock.monotonic()
        try:
            return await asyncio.get_running_loop().run_in_executor(
                self._executor, contextvars.copy_context().run, self._call, fn, limit.left_s, started)
        finally:
            self.batches += 1
            if limit.left_s is not None:
                limit.left_s -= self._clock.monotonic() - started

    def _call(self, fn: Callable[[], T], left_s: float | None, started: float) -> T:
        budget = RegexBudget.limited_to(REGEX_MATCH_LIMIT_S)
        if left_s is not None:
            _DEADLINE.set((self._clock, started + left_s))
            INTERRUPT_CHECK.set(check_time_limit)  # long expression evaluations look at it too
            left_now = max(0.0, started + left_s - self._clock.monotonic())
            if left_now < budget.seconds:
                budget = RegexBudget(left_now, 50, time_limit_error().errmsg)
        REGEX_BUDGET.set(budget)
        return fn()

    def shutdown(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)

