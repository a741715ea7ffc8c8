"""Per-member clocks: a monotonic clock that drifts and a wall clock that is off.

The simulator keeps one global time in milliseconds. Each member reads two
clocks derived from it, the way a process reads `time.monotonic()` and
`time.time()`:

* **monotonic** `local_ms(g) = offset + g + g * drift_ppm / 10^6`: never goes
  backwards, but runs fast or slow by `drift_ppm` parts per million, so the
  members' timeouts (heartbeat, election, wtimeout) expire at slightly
  different global times.
* **wall** `wall_secs(g)`: the monotonic reading plus a skew that a fault may
  step (an NTP correction), so optime timestamps of different members disagree
  and may even go backwards on one member (`next_optime` must cope).

Timers are set on the monotonic clock; `global_ms_at` converts a local
deadline back to the global time at which the runner must wake the member.
"""

from __future__ import annotations

from dataclasses import dataclass

EPOCH_SECS = 1_700_000_000
PPM = 1_000_000
MAX_DRIFT_PPM = 100_000  # 10 %: far beyond real quartz, to shake timeouts loose


@dataclass(slots=True)
class SimClock:
    offset_ms: int
    drift_ppm: int
    wall_skew_ms: int

    def __post_init__(self) -> None:
        if not -MAX_DRIFT_PPM <= self.drift_ppm <= MAX_DRIFT_PPM:
            raise ValueError(f"drift {self.drift_ppm} ppm is out of range")

    def local_ms(self, global_ms: int) -> int:
        return self.offset_ms + global_ms + global_ms * self.drift_ppm // PPM

    def global_ms_at(self, local_ms: int) -> int:
        """The first global time at which this clock reads `local_ms` or more (never negative)."""
        guess = (local_ms - self.offset_ms) * PPM // (PPM + self.drift_ppm)
        guess = max(guess, 0)
        for _ in range(4):  # integer rounding: at most a step or two either way
            if self.local_ms(guess) < local_ms:
                guess += 1
            elif guess > 0 and self.local_ms(guess - 1) >= local_ms:
                guess -= 1
            else:
                break
        return guess

    def wall_secs(self, global_ms: int) -> int:
        return EPOCH_SECS + (self.local_ms(global_ms) - self.offset_ms + self.wall_skew_ms) // 1000
