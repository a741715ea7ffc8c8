"""Group commit: a write marked off_loop runs alone on a worker thread while the event loop goes on;
writes queued behind it commit after it, in order."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

from oplog.sqlite_store import SQLiteStore, StoreTxn
from replset.group_commit import GroupCommitWriter


def test_an_off_loop_write_leaves_the_event_loop_free() -> None:
    async def scenario() -> tuple[list[str], list[str], float]:
        store = SQLiteStore(None)
        writer = GroupCommitWriter(store, lambda: None)
        writer.start()
        order: list[str] = []
        threads: list[str] = []

        def long_write(txn: StoreTxn) -> str:
            threads.append(threading.current_thread().name)
            txn.create_collection("t.c")
            time.sleep(0.3)  # a unique index build over a big collection, say
            order.append("long")
            return "long"

        def short_write(name: str) -> Any:
            def write(txn: StoreTxn) -> str:
                threads.append(threading.current_thread().name)
                order.append(name)
                return name
            return write

        longest_tick = 0.0

        async def ticker() -> None:
            nonlocal longest_tick
            while True:
                started = time.perf_counter()
                await asyncio.sleep(0.005)
                longest_tick = max(longest_tick, time.perf_counter() - started)

        tick = asyncio.create_task(ticker())
        long = asyncio.create_task(writer.submit(long_write, durable=False, off_loop=True))
        await asyncio.sleep(0.05)  # the long write is under way
        after = [asyncio.create_task(writer.submit(short_write(f"w{i}"), durable=False)) for i in range(3)]
        results = await asyncio.gather(long, *after)
        tick.cancel()
        await writer.stop()
        store.close()
        assert results == ["long", "w0", "w1", "w2"]
        return order, threads, longest_tick

    order, threads, longest_tick = asyncio.run(scenario())
    assert order == ["long", "w0", "w1", "w2"]
    assert threads[0].startswith("long-write") and all(t == threading.main_thread().name for t in threads[1:])
    assert longest_tick < 0.1  # the loop kept running while the 300 ms write went on
