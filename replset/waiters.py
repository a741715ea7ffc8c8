"""The write-concern waiter table of a primary: who waits for which optime, until when.

`w: "majority"` waiters sit in a heap on their optime, so a commit point move
pops exactly the ones it satisfies (O(log n) each, nothing for the others).
Other concerns (`w: N`, `j`, tag modes) depend on every member's position, so
they are checked one by one when positions move; there are few of them in
practice. Deadlines (`wtimeout`) sit in a second heap, cleaned lazily: a waiter
that finished leaves its deadline behind, skipped when it comes up.

Waiters are opaque keys chosen by the caller (a future, a request). Pure: the
caller passes the time and decides what a finished waiter gets.
"""

from __future__ import annotations

__layer__ = "core"  # pure: no I/O, clock or randomness (tests/unit/test_layering.py)

import heapq
import itertools
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from base.optime import OpTime
from replset.write_concern import MAJORITY, WriteConcern


@dataclass(frozen=True, slots=True)
class Waiting:
    waiter: object
    wc: WriteConcern
    target: OpTime
    deadline_ms: float


class WaiterTable:
    def __init__(self) -> None:
        self._seq = itertools.count()
        self._majority: list[tuple[OpTime, int, object]] = []
        self._others: dict[object, Waiting] = {}
        self._all: dict[object, Waiting] = {}
        self._deadlines: list[tuple[float, int, object]] = []

    def __len__(self) -> int:
        return len(self._all)

    @property
    def others(self) -> int:
        """How many waiters wait for something other than the commit point (w:N, j, a tag mode)."""
        return len(self._others)

    def __iter__(self) -> Iterator[Waiting]:
        return iter(list(self._all.values()))

    def add(self, waiter: object, wc: WriteConcern, target: OpTime, deadline_ms: float) -> None:
        waiting = Waiting(waiter, wc, target, deadline_ms)
        seq = next(self._seq)
        self._all[waiter] = waiting
        if wc.w == MAJORITY:
            heapq.heappush(self._majority, (target, seq, waiter))
        else:
            self._others[waiter] = waiting
        if deadline_ms != float("inf"):
            heapq.heappush(self._deadlines, (deadline_ms, seq, waiter))

    def _finish(self, waiter: object) -> Waiting | None:
        waiting = self._all.pop(waiter, None)
        self._others.pop(waiter, None)
        return waiting

    def _pop_up_to(self, heap: list[Any], bound: Any) -> list[Waiting]:
        """Pops the heap's entries whose key is at or below `bound`; the waiters still waiting, finished."""
        done = []
        while heap and heap[0][0] <= bound:
            waiting = self._finish(heapq.heappop(heap)[2])
            if waiting is not None:
                done.append(waiting)
        return done

    def reached_commit_point(self, commit_point: OpTime) -> list[Waiting]:
        """The majority waiters whose optime the commit point reached, removed from the table."""
        return self._pop_up_to(self._majority, commit_point)

    def satisfied(self, test: Callable[[WriteConcern, OpTime], bool]) -> list[Waiting]:
        """The other waiters that `test` calls satisfied, removed from the table."""
        done = [w for w in self._others.values() if test(w.wc, w.target)]
        for waiting in done:
            self._finish(waiting.waiter)
        return done

    def expired(self, now_ms: float) -> list[Waiting]:
        """The waiters whose deadline passed, removed from the table."""
        done = self._pop_up_to(self._deadlines, now_ms)
        self._compact()
        return done

    def remove(self, waiter: object) -> Waiting | None:
        """The caller gave up on `waiter` (its client went away)."""
        waiting = self._finish(waiter)
        self._compact()
        return waiting

    def take_all(self) -> list[Waiting]:
        done = list(self._all.values())
        self._all.clear()
        self._others.clear()
        self._majority.clear()
        self._deadlines.clear()
        return done

    def next_deadline(self) -> float:
        heap = self._deadlines
        while heap and heap[0][2] not in self._all:
            heapq.heappop(heap)
        return heap[0][0] if heap else float("inf")

    def _compact(self) -> None:
        # Finished majority waiters stay in their heap until the commit point passes them; when most
        # of the heap is finished ones, rebuild it so a stalled commit point cannot grow it forever.
        if len(self._majority) > 64 and len(self._majority) > 2 * (len(self._all) - len(self._others)):
            self._majority = [e for e in self._majority if e[2] in self._all]
            heapq.heapify(self._majority)
