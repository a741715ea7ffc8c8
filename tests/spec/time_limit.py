"""A pytest plugin for the driver suites' child run: a test that runs longer than
`SPEC_TEST_TIMEOUT_S` (default 20) fails with SpecTestTimeout instead of hanging the run. Some tests
iterate a change stream until an event arrives, and wait for ever for an event this server does
not produce."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from typing import Any

import pytest

LIMIT_S = int(os.environ.get("SPEC_TEST_TIMEOUT_S", "20"))


class SpecTestTimeout(BaseException):
    """Not an OSError (as TimeoutError is): the driver would take that for a network error and retry."""


def _expired(signum: int, frame: Any) -> None:
    raise SpecTestTimeout(f"the test ran for more than {LIMIT_S} s")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    previous = signal.signal(signal.SIGALRM, _expired)
    signal.alarm(LIMIT_S)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
