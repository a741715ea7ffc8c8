"""The member's clocks (`base.clock`): the system clock's readings agree with each other, and a manual
clock moves only when told."""

from __future__ import annotations

import datetime

import pytest

from base.clock import DEFAULT_WALL_MS, SYSTEM_CLOCK, Clock, ManualClock, SystemClock


def test_the_system_clock_is_a_clock_and_reads_sensible_times() -> None:
    clock: Clock = SYSTEM_CLOCK
    assert isinstance(SYSTEM_CLOCK, SystemClock)
    before = clock.monotonic()
    ms = clock.monotonic_ms()
    after = clock.monotonic()
    assert int(before * 1000) <= ms <= int(after * 1000)   # the same clock, in whole milliseconds
    assert clock.monotonic() >= after                       # never backwards
    wall = clock.wall()
    assert wall.tzinfo is not None and wall.utcoffset() == datetime.timedelta(0)
    assert abs(clock.wall_ms() - wall.timestamp() * 1000) < 60_000
    assert clock.wall_ms() > DEFAULT_WALL_MS                # after 2023-11-14: the epoch, in milliseconds


def test_a_manual_clock_moves_only_when_told() -> None:
    clock = ManualClock(5.0)
    assert (clock.monotonic(), clock.monotonic_ms(), clock.wall_ms()) == (5.0, 5000, DEFAULT_WALL_MS)
    assert clock.monotonic() == 5.0                          # read again: the same
    for _ in range(3):
        clock.advance(0.001)                                 # steps add up exactly (integer nanoseconds)
    assert (clock.monotonic_ms(), clock.wall_ms()) == (5003, DEFAULT_WALL_MS + 3)
    assert clock.monotonic() == pytest.approx(5.003)
    with pytest.raises(ValueError):
        clock.advance(-1)


def test_a_manual_clocks_wall_time_is_aware_utc_and_steps_alone() -> None:
    clock = ManualClock(wall_ms=1_700_000_000_123)
    assert clock.wall() == datetime.datetime(2023, 11, 14, 22, 13, 20, 123_000, tzinfo=datetime.UTC)
    assert clock.wall().utcoffset() == datetime.timedelta(0)
    clock.set_wall_ms(1_000)                                 # an NTP step back: the monotonic clock stays
    assert (clock.wall_ms(), clock.monotonic_ms()) == (1_000, 0)
    assert clock.wall() == datetime.datetime(1970, 1, 1, 0, 0, 1, tzinfo=datetime.UTC)
    assert int(clock.wall().timestamp() * 1000) == clock.wall_ms()
