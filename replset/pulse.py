"""Pulse: wake every current waiter at once; later waiters wait for the next firing.

The runtime's one wake-up primitive (new oplog entries, state changes, topology
changes, timer resets), so waiters are woken by events instead of polling.
"""

from __future__ import annotations

import asyncio


class Pulse:
    def __init__(self) -> None:
        self._event = asyncio.Event()

    def fire(self) -> None:
        self._event.set()
        self._event = asyncio.Event()

    async def wait(self, timeout_s: float) -> None:
        """Returns at the next `fire()` or after `timeout_s`, whichever comes first."""
        try:
            await asyncio.wait_for(self._event.wait(), timeout_s)
        except TimeoutError:
            pass
