"""Group commit: many concurrent writes share one SQLite transaction and one fsync.

Theory of operation: callers `submit(fn)`; a single writer task takes every queued
request at once, runs each `fn(txn)` in its own savepoint inside one open
transaction (a failing request rolls back alone), then commits — the fsync runs in
a worker thread so the event loop keeps serving reads and heartbeats — and only
then resolves the callers' futures. Nothing is acknowledged before it is durable.
The queue is bounded: when it is full, `submit` waits (backpressure).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from oplog.errors import MongoError
from oplog.sqlite_store import SQLiteStore, StoreTxn

T = TypeVar("T")
log = logging.getLogger(__name__)

MAX_QUEUED = 10_000
MAX_BATCH = 2_000


class GroupCommitWriter:
    def __init__(self, store: SQLiteStore, on_commit: Callable[[], None],
                 on_abort: Callable[[], None] | None = None) -> None:
        self._on_abort = on_abort or (lambda: None)
        self._store = store
        self._on_commit = on_commit
        self._queue: asyncio.Queue[tuple[Callable[[StoreTxn], Any], asyncio.Future[Any]]] = asyncio.Queue(
            MAX_QUEUED
        )
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="fsync")
        self._task: asyncio.Task[None] | None = None
        self.batches = 0
        self.requests = 0

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="group-commit")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None
        while not self._queue.empty():
            _fn, fut = self._queue.get_nowait()
            if not fut.done():
                fut.set_exception(MongoError(91, "The server is in quiesce mode and will shut down"))
        self._executor.shutdown(wait=True)

    async def submit(self, fn: Callable[[StoreTxn], T]) -> T:
        fut: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        await self._queue.put((fn, fut))
        return await fut

    async def _run(self) -> None:
        while True:
            batch = [await self._queue.get()]
            while len(batch) < MAX_BATCH and not self._queue.empty():
                batch.append(self._queue.get_nowait())
            await self._commit_batch(batch)

    async def _commit_batch(self, batch: list[tuple[Callable[[StoreTxn], Any], asyncio.Future[Any]]]) -> None:
        outcomes: list[tuple[bool, Any]] = []
        txn = self._store.begin()
        try:
            for fn, _fut in batch:
                outcomes.append(self._run_one(txn, fn))
            await asyncio.get_running_loop().run_in_executor(self._executor, self._store.commit)
        except BaseException as exc:
            self._store.rollback()
            self._on_abort()  # in-memory positions the batch advanced must go back with it
            error = MongoError(1, f"storage commit failed: {exc}")
            for _fn, fut in batch:
                if not fut.done():
                    fut.set_exception(error)
            if isinstance(exc, asyncio.CancelledError):
                raise
            log.exception("group commit failed")
            self._on_commit()
            return
        self.batches += 1
        self.requests += len(batch)
        self._on_commit()
        for (_fn, fut), (ok, value) in zip(batch, outcomes):
            if fut.done():
                continue
            if ok:
                fut.set_result(value)
            else:
                fut.set_exception(value)

    @staticmethod
    def _run_one(txn: StoreTxn, fn: Callable[[StoreTxn], Any]) -> tuple[bool, Any]:
        sp = txn.savepoint()
        try:
            value = fn(txn)
        except MongoError as err:
            txn.rollback_to(sp)
            return False, err
        except Exception as exc:
            txn.rollback_to(sp)
            log.exception("write failed")
            return False, MongoError(1, f"internal error: {exc!r}")
        txn.release(sp)
        return True, value
