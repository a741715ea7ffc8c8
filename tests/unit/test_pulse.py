"""`replset.pulse.Pulse`: a firing wakes every current waiter; a timeout or a cancellation lets one go."""

from __future__ import annotations

import asyncio
import time

from replset.pulse import Pulse


def test_a_firing_wakes_every_waiter_and_later_waiters_wait_for_the_next() -> None:
    async def scenario() -> tuple[int, bool, int]:
        pulse = Pulse()
        woken = 0

        async def waiter() -> None:
            nonlocal woken
            await pulse.wait(10)
            woken += 1

        tasks = [asyncio.create_task(waiter()) for _ in range(3)]
        await asyncio.sleep(0)
        pulse.fire()
        await asyncio.wait(tasks, timeout=5)
        late = asyncio.create_task(pulse.wait(10))
        await asyncio.sleep(0.01)
        waiting = len(pulse._waiters)
        late.cancel()
        await asyncio.gather(late, return_exceptions=True)
        return woken, late.done() and not late.cancelled(), waiting

    woken, late_done, still_waiting = asyncio.run(scenario())
    assert woken == 3 and not late_done and still_waiting == 1


def test_timeouts_and_cancellations_do_not_pile_up() -> None:
    async def scenario() -> tuple[float, int]:
        pulse = Pulse()
        started = time.monotonic()
        for _ in range(100):
            await pulse.wait(0.001)          # a pulse waited on in a loop and never fired
        took = time.monotonic() - started
        task = asyncio.create_task(pulse.wait(10))
        await asyncio.sleep(0)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        return took, len(pulse._waiters)

    took, left = asyncio.run(scenario())
    assert took < 5 and left == 0
