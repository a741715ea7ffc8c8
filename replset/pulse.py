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
        """Returns at the next `fire()` or after `timeout_s`, whichever comes first. The waiting task is
        woken by the firing itself, in the loop's next step (`asyncio.wait_for` would run the wait in a
        task of its own and take two more steps: a getMore tailing the oplog wakes on every commit)."""
        try:
            async with asyncio.timeout(timeout_s):
                await self._event.wait()
        except TimeoutError:
            pass
