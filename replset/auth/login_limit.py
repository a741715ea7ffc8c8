"""How many failed HTTP Basic logins an address gets: `MAX_FAILURES` in any `WINDOW_S`.

Theory of operation
-------------------
Every HTTP Basic password check costs 15,000 PBKDF2 rounds, and each one tells the sender whether a guess
was right. So the failures of each source address are counted: while an address has `MAX_FAILURES`
failures within the last `WINDOW_S`, its next attempts are answered 429 with the seconds until the oldest
of those failures leaves the window (`Retry-After`), before any password is looked at (not even a
remembered success answers for it: that would tell a guesser when a guess was right). A check under way
counts as a failure until it ends (`begin` / `end`), so that many attempts sent at once are no way around
the limit. An address thus gets at most `MAX_FAILURES` guesses per window, and the member spends at most
that many checks on it.

A success does not clear an address's failures: one account's password must not buy more guesses at
another's. The table is bounded (`capacity` addresses): when it is full the address whose last failure
is the oldest is forgotten.

Pure: the clock reading (`now`, monotonic seconds) comes in from the caller.
"""

from __future__ import annotations

__layer__ = "core"  # pure: no I/O, clock or randomness (tests/unit/test_layering.py)

from collections import deque

MAX_FAILURES = 5
WINDOW_S = 60.0
CAPACITY = 10_000
PENDING_RETRY_S = 1.0   # the wait an address is told while its own checks under way fill its allowance


class FailedLogins:
    def __init__(self, max_failures: int = MAX_FAILURES, window_s: float = WINDOW_S,
                 capacity: int = CAPACITY) -> None:
        if max_failures < 1 or window_s <= 0 or capacity < 1:
            raise ValueError("a login limit needs max_failures >= 1, window_s > 0 and capacity >= 1")
        self._max = max_failures
        self._window_s = window_s
        self._capacity = capacity
        self._failures: dict[str, deque[float]] = {}   # oldest last failure first
        self._pending: dict[str, int] = {}             # checks under way, by address

    def __len__(self) -> int:
        return len(self._failures)

    def retry_after(self, source: str, now: float) -> float | None:
        """None when `source` may try a password now, else the seconds until it may."""
        live = [t for t in self._failures.get(source, ()) if t + self._window_s > now]
        excess = len(live) + self._pending.get(source, 0) - self._max + 1   # failures that must leave first
        if excess <= 0:
            return None
        return PENDING_RETRY_S if excess > len(live) else live[excess - 1] + self._window_s - now

    def begin(self, source: str) -> None:
        """A check of a password from `source` starts (its `end` must follow)."""
        self._pending[source] = self._pending.get(source, 0) + 1

    def end(self, source: str, *, failed: bool, now: float) -> None:
        """The check `begin` announced is over: right, or wrong (`failed`)."""
        left = self._pending.pop(source, 1) - 1
        if left > 0:
            self._pending[source] = left
        if failed:
            self.failed(source, now)

    def failed(self, source: str, now: float) -> None:
        """A password from `source` was wrong (or named no user)."""
        times = self._failures.pop(source, None)
        if times is None:
            times = deque(maxlen=self._max)
            self._evict(now)
        times.append(now)
        self._failures[source] = times   # to the end: the table stays ordered by last failure

    def _evict(self, now: float) -> None:
        """Room for one more address: those whose failures all left the window go, then the oldest."""
        while self._failures:
            source, times = next(iter(self._failures.items()))
            if len(self._failures) < self._capacity and times[-1] + self._window_s > now:
                return
            del self._failures[source]
