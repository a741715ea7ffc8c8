"""PingStats: the smoothed heartbeat round-trip time to one member.

Theory of operation
-------------------
Every heartbeat reply gives one round-trip sample. Like MongoDB's `PingStats`,
the first sample is taken as is and later ones are blended in with an
exponentially weighted moving average:

    value = ALPHA * sample + (1 - ALPHA) * value        (ALPHA = 0.2, i.e. (4 * value + sample) / 5)

so one slow reply moves the estimate by a fifth of the difference and a
persistent change is followed within a handful of heartbeats. A failed
heartbeat does not change the estimate; it bumps `failures`, which the next
success resets to 0 (the caller decides when enough failures mean DOWN).

One departure from MongoDB: the estimate never exceeds the slowest of the last
`RECENT_SAMPLES` round trips,

    value = min(ALPHA * sample + (1 - ALPHA) * value, max(recent samples))

A reply held up by a stall - our own process paused, the member paused, a
burst of delay - can take seconds, and an average forgets only a fifth of it
per heartbeat: a 7.7 s round trip still weighs 138 ms after 18 heartbeats
(0.8 ** 18 * 7666). A member 3 ms away looked farther than one 57 ms away for
45 s after it answered again, and a secondary kept the slower source. With the
cap a stall counts for `RECENT_SAMPLES` heartbeats at most. While the round trips are
steady or rising the average stays below the slowest recent one, and the
value is MongoDB's.

The value is immutable: `record` and `record_failure` return a new PingStats,
so a topology snapshot can hold them without copying. Pure: no clocks.
"""

from __future__ import annotations

__layer__ = "core"  # pure: no I/O, clock or randomness (tests/unit/test_layering.py)

import math
from dataclasses import dataclass

ALPHA = 0.2
RECENT_SAMPLES = 5   # the value never exceeds the slowest of this many last round trips (10 s of heartbeats)


@dataclass(frozen=True, slots=True)
class PingStats:
    """Smoothed RTT (`value_ms`, None until the first success), sample count, consecutive failures and the
    last `RECENT_SAMPLES` round trips (oldest first)."""

    value_ms: float | None = None
    samples: int = 0
    failures: int = 0
    recent_ms: tuple[float, ...] = ()

    def record(self, rtt_ms: float) -> PingStats:
        """Blend in one successful round trip; resets `failures`."""
        if not math.isfinite(rtt_ms) or rtt_ms < 0:
            raise ValueError(f"round-trip time must be a finite non-negative number, got {rtt_ms!r}")
        rtt = float(rtt_ms)
        recent = (*self.recent_ms, rtt)[-RECENT_SAMPLES:]
        average = rtt if self.value_ms is None else ALPHA * rtt + (1.0 - ALPHA) * self.value_ms
        return PingStats(value_ms=min(average, max(recent)), samples=self.samples + 1, failures=0,
                         recent_ms=recent)

    def record_failure(self) -> PingStats:
        """Count one failed heartbeat; the smoothed value is kept."""
        return PingStats(value_ms=self.value_ms, samples=self.samples, failures=self.failures + 1,
                         recent_ms=self.recent_ms)
