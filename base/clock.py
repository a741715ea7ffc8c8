"""Clock: time as one input of the member.

Theory of operation
-------------------
A member reads two clocks. The monotonic clock never goes backwards and
measures durations and deadlines: heartbeat and election timeouts, wtimeouts,
how long a read or a fsync took, when a cursor idles out. The wall clock says
what time it is for people and for documents: optime timestamps, `$$NOW`, the
dates `replSetGetStatus` and `hello` show, the age of a part-log entry. The two
are unrelated (an NTP step moves the wall clock only), so a reading of one is
never compared with a reading of the other.

Nothing in `base`, `oplog`, `sync` or `replset` reads the operating system's
clocks except `SystemClock` here (tests/unit/test_layering.py checks): the
member (`replset.node.Node`) holds one `Clock`, its `clock`, and every shell
gets its time from it, or from a clock its constructor takes (`SYSTEM_CLOCK` by
default for the classes that stand alone). A test may hand in a `ManualClock`
and move time by hand; the pure cores take no clock at all, their callers pass
the reading in (`now_ms`).

Units: `monotonic()` is seconds (a float, like `time.monotonic()`),
`monotonic_ms()` the same reading truncated to whole milliseconds (the unit of
the replica core and the part-log runner), `wall_ms()` milliseconds since the
Unix epoch, and `wall()` an aware UTC datetime.
"""

from __future__ import annotations

import datetime
import time
from typing import Protocol


class Clock(Protocol):
    """Where a member's time comes from."""

    def monotonic(self) -> float:
        """Seconds on a clock that never goes backwards (its zero means nothing)."""
        ...

    def monotonic_ms(self) -> int:
        """`monotonic()` in whole milliseconds."""
        ...

    def wall_ms(self) -> int:
        """Milliseconds since the Unix epoch."""
        ...

    def wall(self) -> datetime.datetime:
        """The wall-clock time, aware, in UTC."""
        ...


class SystemClock:
    """The operating system's clocks: the only place the member reads them."""

    __slots__ = ()

    def monotonic(self) -> float:
        return time.monotonic()

    def monotonic_ms(self) -> int:
        return int(time.monotonic() * 1000)

    def wall_ms(self) -> int:
        return int(time.time() * 1000)

    def wall(self) -> datetime.datetime:
        return datetime.datetime.now(datetime.UTC)


SYSTEM_CLOCK = SystemClock()

_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)
DEFAULT_WALL_MS = 1_700_000_000_000  # 2023-11-14T22:13:20Z: where a ManualClock's wall clock starts


class ManualClock:
    """A clock that moves only when told (tests): `advance` moves both clocks, `set_wall_ms` steps the
    wall clock alone (an NTP correction). Kept in integer nanoseconds, so steps add up exactly."""

    __slots__ = ("_monotonic_ns", "_wall_ns")

    def __init__(self, monotonic: float = 0.0, wall_ms: int = DEFAULT_WALL_MS) -> None:
        self._monotonic_ns = round(monotonic * 1_000_000_000)
        self._wall_ns = wall_ms * 1_000_000

    def advance(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError(f"a monotonic clock does not go back ({seconds} s)")
        step = round(seconds * 1_000_000_000)
        self._monotonic_ns += step
        self._wall_ns += step

    def set_wall_ms(self, wall_ms: int) -> None:
        self._wall_ns = wall_ms * 1_000_000

    def monotonic(self) -> float:
        return self._monotonic_ns / 1_000_000_000

    def monotonic_ms(self) -> int:
        return self._monotonic_ns // 1_000_000

    def wall_ms(self) -> int:
        return self._wall_ns // 1_000_000

    def wall(self) -> datetime.datetime:
        return _EPOCH + datetime.timedelta(microseconds=self._wall_ns // 1000)
