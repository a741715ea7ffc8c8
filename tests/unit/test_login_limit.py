"""Failed HTTP Basic logins per address (replset/auth/login_limit.py): `MAX_FAILURES` in any window, then
429 until the oldest of them leaves it; a success clears nothing; the table stays bounded."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from replset.auth.login_limit import FailedLogins


def test_an_address_is_stopped_after_its_failures_until_the_oldest_leaves_the_window() -> None:
    limit = FailedLogins(max_failures=3, window_s=60.0)
    for t in (0.0, 10.0, 20.0):
        assert limit.retry_after("10.0.0.1", t) is None
        limit.failed("10.0.0.1", t)
    assert limit.retry_after("10.0.0.1", 20.0) == pytest.approx(40.0)
    assert limit.retry_after("10.0.0.2", 20.0) is None   # another address is not stopped
    assert limit.retry_after("10.0.0.1", 59.9) == pytest.approx(0.1)
    assert limit.retry_after("10.0.0.1", 60.0) is None   # the failure at 0 s left the window: one more try
    limit.failed("10.0.0.1", 60.0)
    assert limit.retry_after("10.0.0.1", 60.0) == pytest.approx(10.0)   # until the one at 10 s leaves


def test_the_table_is_bounded_and_forgets_the_oldest_first() -> None:
    limit = FailedLogins(max_failures=1, window_s=60.0, capacity=3)
    for i, source in enumerate(["a", "b", "c"]):
        limit.failed(source, float(i))
    limit.failed("a", 3.0)   # a is now the newest
    limit.failed("d", 4.0)
    assert len(limit) == 3 and limit.retry_after("b", 4.0) is None and limit.retry_after("a", 4.0) is not None
    limit.failed("e", 100.0)   # everything else has left the window
    assert len(limit) == 1


def test_bad_limits_are_refused() -> None:
    with pytest.raises(ValueError):
        FailedLogins(max_failures=0)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from("abc"), st.integers(0, 30)), max_size=80),
       st.integers(1, 5), st.integers(1, 100))
def test_against_a_naive_twin(attempts: list[tuple[str, int]], max_failures: int, window_s: int) -> None:
    """Every attempt allowed fails: an address may try iff fewer than `max_failures` of its allowed tries
    are within the window; and it never gets more than that many in any window."""
    limit, now = FailedLogins(max_failures, float(window_s)), 0.0
    tried: dict[str, list[float]] = {s: [] for s in "abc"}
    for source, step in attempts:
        now += step
        recent = [t for t in tried[source] if t > now - window_s]
        assert (limit.retry_after(source, now) is None) == (len(recent) < max_failures)
        if len(recent) < max_failures:
            limit.failed(source, now)
            tried[source].append(now)


def test_checks_under_way_count_until_they_end() -> None:
    """Attempts sent at once: each check under way holds a place, so no more than the allowance start."""
    limit = FailedLogins(max_failures=3, window_s=60.0)
    for _ in range(3):
        assert limit.retry_after("a", 0.0) is None
        limit.begin("a")
    assert limit.retry_after("a", 0.0) is not None   # three checks are running: the fourth waits
    limit.end("a", failed=False, now=1.0)   # one was right: its place is free again
    assert limit.retry_after("a", 1.0) is None
    limit.end("a", failed=True, now=2.0)
    limit.end("a", failed=True, now=3.0)
    limit.failed("a", 4.0)
    assert limit.retry_after("a", 4.0) == pytest.approx(58.0)
