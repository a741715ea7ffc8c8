"""Group commit: a write marked off_loop runs alone on a worker thread while the event loop goes on;
writes queued behind it commit after it, in order."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import bson

from base.errors import MongoError
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


def test_a_commit_made_while_a_flush_runs_is_flushed_within_the_interval_on_an_idle_writer() -> None:
    async def scenario() -> tuple[int, int]:
        store = SQLiteStore(None)
        sync_wal = store.sync_wal

        def slow_sync() -> None:
            time.sleep(0.05)
            sync_wal()

        store.sync_wal = slow_sync   # type: ignore[method-assign]
        writer = GroupCommitWriter(store, lambda: None)
        writer.start()
        try:
            first = asyncio.get_running_loop().create_task(writer.submit(lambda txn: None, durable=True))
            deadline = time.monotonic() + 5
            while not writer.journal.pending or writer.journal.flushing_seq is None:   # its flush is running
                assert time.monotonic() < deadline
                await asyncio.sleep(0.001)
            await writer.submit(lambda txn: None, durable=False)   # committed while the fsync runs
            await first
            while writer.journal.durable_seq < writer.journal.committed_seq and time.monotonic() < deadline:
                await asyncio.sleep(0.01)   # nothing else happens: only the interval can flush it
            return writer.journal.durable_seq, writer.journal.committed_seq
        finally:
            await writer.stop()

    durable, committed = asyncio.run(scenario())
    assert durable == committed == 2


def test_a_writer_that_journals_each_applied_batch_inline_still_checkpoints() -> None:
    """A secondary journals its applied batches in the step of their commit (`flush=True` with inline fsync),
    so its flusher may never run; the WAL must still be checkpointed (SQLite's own autocheckpoint is off)."""
    async def scenario() -> tuple[int, int]:
        writer = GroupCommitWriter(SQLiteStore(None), lambda: None)
        writer.inline_fsync = True
        writer.start()
        try:
            deadline = time.monotonic() + 5
            while writer.checkpoints == 0 and time.monotonic() < deadline:
                await writer.submit(lambda txn: None, durable=False, flush=True)
                await asyncio.sleep(0.01)
            return writer.checkpoints, writer.journal.durable_seq
        finally:
            await writer.stop()

    checkpoints, durable = asyncio.run(scenario())
    assert durable >= 1 and checkpoints >= 1


def test_a_failed_request_leaves_nothing_alone_or_beside_others() -> None:
    """A lone request runs without a savepoint (its transaction is rolled back when it fails); in a batch,
    a failing request's savepoint is rolled back and the others commit."""
    def writes(key: int, fail: bool) -> Any:
        def fn(txn: StoreTxn) -> int:
            txn.append_oplog([(key, bson.encode({"k": key}))])
            if fail:
                raise MongoError(11000, "duplicate key")
            return key
        return fn

    async def scenario() -> tuple[list[Any], list[int]]:
        store = SQLiteStore(None)
        writer = GroupCommitWriter(store, lambda: None)
        writer.start()
        try:
            outcomes: list[Any] = []
            for batch in ([(1, True)], [(2, False)], [(3, False), (4, True), (5, False)]):
                outcomes += await asyncio.gather(*(writer.submit(writes(k, f), durable=False) for k, f in batch),
                                                 return_exceptions=True)
            return [o if isinstance(o, int) else o.code for o in outcomes], \
                [k for k, _blob in store.reader.oplog_after(0, 10)]
        finally:
            await writer.stop()
            store.close()

    outcomes, kept = asyncio.run(scenario())
    assert outcomes == [11000, 2, 3, 11000, 5]
    assert kept == [2, 3, 5]
