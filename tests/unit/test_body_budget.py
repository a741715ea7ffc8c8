"""The budget of insert bodies a member buffers at once (`replset.parts.http_tables.BodyBudget`)."""

from __future__ import annotations

import asyncio

import pytest

from base.errors import MongoError
from replset.parts.http_tables import EXCEEDED_MEMORY_LIMIT, BodyBudget


async def test_a_body_waits_for_room_and_gets_it_when_another_is_done() -> None:
    budget = BodyBudget(100)
    await budget.take(70, 1.0)
    waiting = asyncio.create_task(budget.take(50, 5.0))
    await asyncio.sleep(0)   # let the waiter start waiting
    assert not waiting.done() and budget.used == 70
    await budget.give_back(70)
    await asyncio.wait_for(waiting, 5.0)
    assert budget.used == 50


async def test_no_room_in_time_is_exceeded_memory_limit() -> None:
    budget = BodyBudget(100)
    await budget.take(100, 1.0)
    with pytest.raises(MongoError) as full:
        await budget.take(1, 0.05)
    assert full.value.code == EXCEEDED_MEMORY_LIMIT and budget.used == 100
    with pytest.raises(MongoError):
        budget.take_now(1)   # a chunked body does not wait
