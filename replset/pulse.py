"""Pulse: wake every current waiter at once; later waiters wait for the next firing.

The runtime's one wake-up primitive (new oplog entries, state changes, topology
changes, timer resets), so waiters are woken by events instead of polling.

It is fired many times per write (every step of the replica core, every commit), mostly with nobody
waiting: a firing without waiters costs one test. A waiter is one future, woken by the firing itself in
the loop's next step (`asyncio.wait_for` would run the wait in a task of its own and take two more
steps: a getMore tailing the oplog wakes on every commit), or by its own timer.
"""

from __future__ import annotations

import asyncio


def _expire(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


class Pulse:
    def __init__(self) -> None:
        self._waiters: dict[asyncio.Future[None], None] = {}   # in the order they came

    def fire(self) -> None:
        if not self._waiters:
            return
        waiters, self._waiters = self._waiters, {}
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    async def wait(self, timeout_s: float) -> None:
        """Returns at the next `fire()` or after `timeout_s`, whichever comes first."""
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[None] = loop.create_future()
        self._waiters[waiter] = None
        timer = loop.call_later(max(timeout_s, 0.0), _expire, waiter)
        try:
            await waiter
        finally:
            timer.cancel()
            self._waiters.pop(waiter, None)   # timed out or cancelled: not kept until the next firing
