"""HTTP Basic password checks off the event loop, a few at a time (a shell: asyncio and threads).

A check is 15,000 PBKDF2 rounds (`http_auth.password_matches`), tens of milliseconds of a core. They run
on the default thread pool, which the member's file work (fsyncs, part files) shares: at most `RUNNING`
run at once, so that a flood of logins from many addresses (each within its own limit,
`replset.auth.login_limit`) can neither take every thread nor every core, and at most `QUEUED` more wait;
beyond that `busy()` says so and the caller answers 503 without checking.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

from replset.auth.http_auth import password_matches

RUNNING = 2
QUEUED = 14


class PasswordChecks:
    def __init__(self, running: int = RUNNING, queued: int = QUEUED) -> None:
        self._running = asyncio.Semaphore(running)
        self._limit = running + queued
        self._in_flight = 0

    def busy(self) -> bool:
        """As many checks as allowed are running or waiting."""
        return self._in_flight >= self._limit

    async def matches(self, stored: Mapping[str, Any], user: str, password: str) -> bool:
        """`http_auth.password_matches`, on a thread once one of the `running` slots is free."""
        self._in_flight += 1
        try:
            async with self._running:
                return await asyncio.to_thread(password_matches, stored, user, password)
        finally:
            self._in_flight -= 1
