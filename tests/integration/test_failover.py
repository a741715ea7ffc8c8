"""Failover with real processes and motor: kill -9 the primary in the middle of a
w:"majority" write loop; a new primary takes over, the loop goes on without any
error handling of its own, and every acknowledged write is on every survivor."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import pytest
from motor.motor_asyncio import AsyncIOMotorClient
from pymongo import ReadPreference, WriteConcern

from tests.support.members import wait_for
from tests.support.replica_set import ReplicaSet, make_replica_set

SETTINGS = {"heartbeatIntervalMillis": 250, "electionTimeoutMillis": 1000}


@pytest.fixture()
def rs(tmp_path: Any) -> Iterator[ReplicaSet]:
    s = make_replica_set(str(tmp_path), 3)
    try:
        s.start()
        s.initiate(SETTINGS)
        yield s
    finally:
        s.stop()


@pytest.mark.alone   # (how soon a new primary takes writes is judged)
async def test_kill_primary_during_majority_writes(rs: ReplicaSet) -> None:
    old_primary = rs.wait_primary()
    client: AsyncIOMotorClient[dict[str, Any]] = AsyncIOMotorClient(rs.uri, serverSelectionTimeoutMS=20000)
    coll = client.app.loop.with_options(write_concern=WriteConcern(w="majority"))
    acked: list[int] = []
    ack_times: list[float] = []

    async def writer(stop: asyncio.Event) -> None:
        i = 0
        while not stop.is_set():
            await coll.insert_one({"_id": i})  # no try/except: the driver handles the failover
            acked.append(i)
            ack_times.append(time.monotonic())
            i += 1

    stop = asyncio.Event()
    task = asyncio.get_running_loop().create_task(writer(stop))
    try:
        await _until(lambda: len(acked) >= 50, 20)
        killed_at = time.monotonic()
        old_primary.kill()
        acked_before_kill = len(acked)
        new_primary = await asyncio.to_thread(rs.wait_primary, 20)
        elected_after = time.monotonic() - killed_at
        await _until(lambda: len(acked) >= acked_before_kill + 50, 30)
    finally:
        stop.set()
        await task
        client.close()
    first_ack_after = next(t for t in ack_times if t > killed_at) - killed_at
    print(f"failover: new primary after {elected_after:.2f} s, first ack after {first_ack_after:.2f} s, "
          f"{len(acked)} writes acknowledged")
    assert new_primary is not old_primary
    assert elected_after < 1.0 * 1.15 + 1.0 + 1.0, f"new primary after {elected_after:.2f} s"
    assert first_ack_after < 10, f"first write acknowledged {first_ack_after:.2f} s after the kill"
    survivors = [m for m in rs.members if m is not old_primary]
    for m in survivors:
        direct = rs.direct(m).app.loop.with_options(read_preference=ReadPreference.SECONDARY_PREFERRED)
        wait_for(lambda direct=direct: direct.count_documents({}) >= len(acked), 10, f"{m.host} to catch up")
        ids = sorted(d["_id"] for d in direct.find({}, {"_id": 1}))
        assert ids == list(range(len(ids))), "duplicates or gaps"
        assert set(acked) <= set(ids)


async def _until(predicate: Any, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError("condition not met in time")
        await asyncio.sleep(0.01)
