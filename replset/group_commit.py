"""Group commit and the journal flusher: many writes share one SQLite transaction; durability is a
separate, explicit barrier, as in MongoDB.

Theory of operation: callers `submit(fn)`; a single writer task takes the queued requests
(`oplog.journal.batch_cut`), runs each `fn(txn)` in its own savepoint inside one open
transaction (a failing request rolls back alone), then commits. SQLite runs in WAL
mode with `synchronous=NORMAL`, so a commit writes the WAL (it survives a crash of
this process: the bytes are in the operating system's page cache) but does not fsync
it. That is MongoDB's `{w: 1}`: acknowledged once applied, not yet journaled.

The **flusher** makes commits durable: it fsyncs the WAL in a worker thread and then
reports the position that was committed when the fsync began (`on_durable`). When it
runs, and whom a flush answers, is `oplog.journal.Journal`'s decision: at once when
someone waits for durability (`request_flush`: a `j: true` or `w: "majority"` write, a
secondary's applied batch, a request submitted with `durable=True` such as a vote) and
otherwise at most `JOURNAL_COMMIT_INTERVAL_MS` after a commit (MongoDB's
`journalCommitInterval`, 100 ms). A request submitted with `durable=True` is answered only
after the flush that covers its commit. Flushes coalesce: commits made while one fsync
runs are covered by the next. The simulator runs the same decisions.

Checkpoints (copying the WAL into the database file) run in a thread and connection
of their own (`SQLiteStore.checkpoint`), never inside a commit, so a commit costs a
few page writes and no fsync, and the event loop is never stalled by one.

A request whose cost grows with the data (`submit(..., off_loop=True)`: a unique index build, a
dropped collection's pages, an applied batch holding such an entry) runs alone in a transaction on a
worker thread instead; the event loop goes on serving heartbeats and reads meanwhile, and the requests
queued behind it commit after it, in order. Everything but storage (futures, positions, wake-ups)
is still done on the loop (`_finish`).

The queue is bounded: when it is full, `submit` waits (backpressure).
"""

from __future__ import annotations

import asyncio
import enum
import functools
import logging
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, NoReturn, TypeVar

from base.clock import SYSTEM_CLOCK, Clock
from base.errors import MongoError
from oplog.journal import JOURNAL_COMMIT_INTERVAL_MS, MAX_BATCH, FsyncPace, Journal, batch_cut
from oplog.sqlite_store import SQLiteStore, StoreTxn

T = TypeVar("T")
log = logging.getLogger(__name__)

MAX_QUEUED = 10_000
CHECKPOINT_INTERVAL_S = 0.5
BATCH_SLICE_S = 0.02
FINISH_CHECKPOINT_MAX_FRAMES = 2_000



class Answer(enum.IntEnum):
    """When a request's future is answered."""
    AT_COMMIT = 0
    AT_COMMIT_FLUSHING = 1   # at commit, and the journal flush starts before anything the commit wakes
    WHEN_DURABLE = 2         # once the flush that covers its commit ended


# (fn, its future, when it is answered, off_loop)
Request = tuple[Callable[[StoreTxn], Any], asyncio.Future[Any], Answer, bool]



def _fsync_failed(exc: BaseException) -> NoReturn:
    """After a failed fsync the kernel may have dropped the dirty pages: retrying could report data durable
    that is not. Stop; a restart recovers from what is on disk. (Any other failure of a flush ends here too:
    a flush that never ends would leave every write waiting for durability hung.)"""
    log.critical("fsync of the journal failed, shutting down: %s", exc)
    os._exit(70)

class GroupCommitWriter:
    def __init__(self, store: SQLiteStore, on_commit: Callable[[], None],
                 on_abort: Callable[[], None] | None = None, *,
                 position: Callable[[], Any] = lambda: None,
                 on_durable: Callable[[Any], None] = lambda _position: None,
                 observe_batch: Callable[[int], None] = lambda _size: None,
                 observe_fsync: Callable[[float], None] = lambda _seconds: None,
                 clock: Clock = SYSTEM_CLOCK) -> None:
        self._clock = clock
        self._observe_batch = observe_batch  # each committed batch's size (metrics)
        self._observe_fsync = observe_fsync  # each journal fsync's time (metrics)
        self._on_abort = on_abort or (lambda: None)
        self._store = store
        self._on_commit = on_commit
        self._position = position
        self._on_durable = on_durable
        self._queue: asyncio.Queue[Request] = asyncio.Queue(MAX_QUEUED)
        self._fsync = ThreadPoolExecutor(max_workers=1, thread_name_prefix="fsync")
        self._checkpointer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="checkpoint")
        self._off_loop = ThreadPoolExecutor(max_workers=1, thread_name_prefix="long-write")
        self._off_loop_running = False
        self._writing = False   # the writer task holds requests it took (a batch, its slices, an off-loop one)
        self._tasks: list[asyncio.Task[None]] = []
        self._flush_wanted = asyncio.Event()
        self._flush_timer: asyncio.TimerHandle | None = None
        self._checkpoint_running = False
        self.fsync_pace = FsyncPace()
        self._threaded_flush: asyncio.Future[float] | None = None   # the fsync running in the thread, if any
        self._stopped = False
        # Set by the runtime: a secondary fsyncs on the event loop (see `_inline_fsync_now`), a primary never.
        self.inline_fsync = False
        self._last_checkpoint = 0.0
        # Commits are numbered; a durable request waits until the flushed number reaches its commit's.
        self.journal: Journal[tuple[asyncio.Future[Any], Any]] = Journal()
        self.batches = 0
        self.requests = 0
        self.flushes = 0
        self.checkpoints = 0

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(self._run(), name="group-commit"),
                       loop.create_task(self._flush_loop(), name="journal-flusher")]

    async def stop(self) -> None:
        # The flusher first makes everything committed durable (a clean shutdown loses nothing).
        writer, *rest = self._tasks or [None]
        if writer is not None:
            writer.cancel()
            try:
                await writer
            except asyncio.CancelledError:
                pass
        if self.journal.committed_seq > self.journal.durable_seq:
            try:
                await asyncio.wait_for(self._wait_durable(self.journal.committed_seq), 10.0)
            except (TimeoutError, MongoError):
                log.warning("could not flush the journal before shutting down")
        for task in rest:
            if task is not None:
                task.cancel()
        if rest:
            await asyncio.wait([t for t in rest if t is not None])
        self._tasks = []
        if self._flush_timer is not None:
            self._flush_timer.cancel()
        self._stopped = True   # a threaded flush that ends from now on answers nobody and starts nothing
        if self._threaded_flush is not None and not self._threaded_flush.done():
            await asyncio.wait([self._threaded_flush], timeout=10.0)
        while not self._queue.empty():
            _fn, fut, _answer, _off_loop = self._queue.get_nowait()
            if not fut.done():
                fut.set_exception(MongoError(91, "The server is in quiesce mode and will shut down"))
        self._fail_durable_waiters(MongoError(91, "The server is in quiesce mode and will shut down"))
        self._fsync.shutdown(wait=True)
        self._checkpointer.shutdown(wait=True)
        self._off_loop.shutdown(wait=True)

    async def submit(self, fn: Callable[[StoreTxn], T], *, durable: bool = True, flush: bool = False,
                     off_loop: bool = False) -> T:
        """Runs `fn(txn)` in the next group commit. With `durable` (the default: votes, configs,
        rollbacks, initial sync steps), returns only once the commit is fsynced; without it, once
        committed (client writes and applied batches, whose durability the write concern decides).
        `off_loop`: a write whose cost grows with the data (building a unique index, dropping a
        collection's table) runs alone, in a transaction of its own, on a worker thread; the event loop
        serves everything else meanwhile, and the writes queued behind it wait, as behind any commit.
        `flush` (without `durable`): the caller will wait for the commit to be durable (a `j` or
        w:"majority" write), so the journal flush starts as soon as it commits, ahead of the getMores and
        reports the commit wakes: the fsync runs while the secondaries fetch."""
        fut: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        answer = Answer.WHEN_DURABLE if durable else Answer.AT_COMMIT_FLUSHING if flush else Answer.AT_COMMIT
        await self._queue.put((fn, fut, answer, off_loop))
        return await fut

    def commit_now(self, fn: Callable[[StoreTxn], T], *, flush: bool = False) -> asyncio.Future[T] | None:
        """`submit(fn, durable=False, flush=flush)` without a trip through the queue and the writer task: when
        nothing is queued or being written, `fn` runs and commits now, in the caller's step, and the
        returned future is done (its result, or the error that rolled `fn` back). None: the writer is busy,
        call `submit`. For a lone writer (a secondary's applier) only: callers that arrive together are
        batched by `submit`, and each of them committing alone here would give that up."""
        if self._writing or not self._tasks or not self._queue.empty():
            return None
        fut: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        self._finish(*self._run_batch([(fn, fut, Answer.AT_COMMIT_FLUSHING if flush else Answer.AT_COMMIT, False)]))
        return fut

    # -- durability -----------------------------------------------------------------------------

    @property
    def flush_pending(self) -> bool:
        """A flush was asked for and has not ended yet (not merely scheduled by the interval)."""
        return self.journal.pending

    def request_flush(self) -> None:
        """Someone waits for durability: flush now (coalesced with a flush already under way)."""
        self.journal.want_flush()
        self._flush_wanted.set()

    def _schedule_flush(self) -> None:
        """After a commit or a flush: flush at once if someone waits, else when the journal says one is due
        (a commit made while a flush ran is due within the interval of its own commit)."""
        if self.journal.flush_wanted:
            self._flush_wanted.set()
            return
        due_ms = self.journal.next_deadline()
        if self._flush_timer is None and due_ms is not None:
            delay_ms = min(max(0, due_ms - self._clock.monotonic_ms()), JOURNAL_COMMIT_INTERVAL_MS)
            self._flush_timer = asyncio.get_running_loop().call_later(delay_ms / 1000, self._flush_due)

    def _flush_due(self) -> None:
        self._flush_timer = None
        self.request_flush()

    async def _wait_durable(self, seq: int) -> None:
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        if self.journal.wait_durable((fut, None), seq):
            return
        self._flush_wanted.set()
        await fut

    async def _flush_loop(self) -> None:
        while True:
            await self._flush_wanted.wait()
            self._flush_wanted.clear()
            self._start_flush()

    def _start_flush(self) -> None:
        """Starts the flush that is wanted or due, unless one runs: on the loop when `_inline_fsync_now`,
        else in the fsync thread, whose end (`_flush_ended`) answers the waiters."""
        if self._flush_timer is not None:
            self._flush_timer.cancel()
            self._flush_timer = None
        position = self._position()
        if self.journal.start_flush(self._clock.monotonic_ms()) is None:
            self._maybe_checkpoint()
            return
        started = self._clock.monotonic()
        if self._inline_fsync_now():
            try:
                self._sync_wal_inline()
            except OSError as exc:
                _fsync_failed(exc)
            self._flush_ended(position, started)
            return
        fut = asyncio.get_running_loop().run_in_executor(self._fsync, self._timed_sync_wal)
        self._threaded_flush = fut
        fut.add_done_callback(functools.partial(self._threaded_flush_ended, position, started))

    def _threaded_flush_ended(self, position: Any, started: float, fut: asyncio.Future[float]) -> None:
        if self._stopped or fut.cancelled():
            return
        exc = fut.exception()
        if exc is not None:
            _fsync_failed(exc)
        self.fsync_pace.observed(fut.result())
        self._flush_ended(position, started)

    def _flush_ended(self, position: Any, started: float) -> None:
        self._journaled(position, self._clock.monotonic() - started)
        self._schedule_flush()
        self._maybe_checkpoint()

    def _journaled(self, position: Any, took_s: float) -> None:
        """A flush that began at `position` ended: whoever waited for it is answered."""
        self._observe_fsync(took_s)
        self.flushes += 1
        released = self.journal.flushed()
        self._on_durable(position)
        for fut, value in released:
            if not fut.done():
                fut.set_result(value)

    def _timed_sync_wal(self) -> float:
        started = self._clock.monotonic()
        self._store.sync_wal()
        return self._clock.monotonic() - started

    def _sync_wal_inline(self) -> None:
        self.fsync_pace.observed(self._timed_sync_wal())

    def _fail_durable_waiters(self, error: MongoError) -> None:
        for fut, _value in self.journal.abandon():
            if not fut.done():
                fut.set_exception(error)

    def _maybe_checkpoint(self) -> None:
        now = self._clock.monotonic()
        if self._checkpoint_running or now - self._last_checkpoint < CHECKPOINT_INTERVAL_S:
            return
        self._checkpoint_running, self._last_checkpoint = True, now

        def done(fut: asyncio.Future[Any]) -> None:
            self._checkpoint_running = False
            if fut.cancelled():
                return
            if fut.exception() is not None:
                log.warning("checkpoint failed: %s", fut.exception())
                return
            self.checkpoints += 1
            frames, copied = fut.result()
            if frames - copied <= FINISH_CHECKPOINT_MAX_FRAMES and not self._off_loop_running:
                # On the event loop, between group commits: the writer cannot append meanwhile, so
                # this pass completes and the next transaction restarts the WAL from its beginning.
                try:
                    self._store.finish_checkpoint()
                except Exception as exc:  # a busy database: the next round tries again
                    log.warning("checkpoint could not finish: %s", exc)

        asyncio.get_running_loop().run_in_executor(self._checkpointer, self._store.checkpoint).add_done_callback(done)

    # -- the writer -----------------------------------------------------------------------------

    async def _run(self) -> None:
        pending: list[Request] = []
        while True:
            if not pending:
                self._writing = False
                pending = [await self._queue.get()]
                self._writing = True
            while len(pending) < MAX_BATCH and not self._queue.empty():
                pending.append(self._queue.get_nowait())
            taken, alone = batch_cut([request[3] for request in pending])
            if alone:
                done = await self._commit_off_loop(pending[0])
            else:
                done = self._finish(*self._run_batch(pending[:taken]))
            pending = pending[done:]
            if pending:
                await asyncio.sleep(0)  # the batch ran out of its time slice: let the loop serve others

    async def _commit_off_loop(self, request: Request) -> int:
        self._off_loop_running = True
        try:
            taken = await asyncio.get_running_loop().run_in_executor(self._off_loop, self._run_batch, [request])
        finally:
            self._off_loop_running = False
        return self._finish(*taken)

    def _run_batch(self, pending: list[Request]) -> tuple[list[Request], list[tuple[bool, Any]], Exception | None]:
        """Runs and commits a prefix of `pending` in one transaction: every request, or as many as fit
        in `BATCH_SLICE_S` (at least one), so one commit never holds the event loop much longer than
        that, whatever the queue holds. Touches storage only (it may run on a worker thread). Returns the
        requests it took, their outcomes, and the error that rolled the transaction back, if any."""
        outcomes: list[tuple[bool, Any]] = []
        txn = self._store.begin()
        batch = pending
        try:
            if len(pending) == 1:
                # A lone request needs no savepoint: the transaction is its own, and a failure rolls it all back.
                outcome = self._run_one(txn, pending[0][0], savepoint=False)
                outcomes.append(outcome)
                if not outcome[0]:
                    self._store.rollback()
                    return batch, outcomes, None
            else:
                started = self._clock.monotonic()
                for i, (fn, _fut, _answer, _off_loop) in enumerate(pending):
                    outcomes.append(self._run_one(txn, fn))
                    if self._clock.monotonic() - started > BATCH_SLICE_S:
                        batch = pending[:i + 1]
                        break
            self._store.commit()
        except Exception as exc:
            self._store.rollback()
            log.exception("group commit failed")
            return batch, outcomes, exc
        return batch, outcomes, None

    def _finish(self, batch: list[Request], outcomes: list[tuple[bool, Any]], error: Exception | None) -> int:
        """On the event loop, after `_run_batch`: answers the requests, reports the commit. Returns how
        many requests the batch took."""
        if error is not None:
            self._on_abort()  # in-memory positions the batch advanced must go back with it
            failure = MongoError(1, f"storage commit failed: {error}")
            for _fn, fut, _answer, _off_loop in batch:
                if not fut.done():
                    fut.set_exception(failure)
            self._on_commit()
            return len(batch)
        self.batches += 1
        self.requests += len(batch)
        self._observe_batch(len(batch))
        # The writers' continuations are queued before whatever `on_commit` wakes (tailing getMores,
        # position reports): a w:1 reply does not wait behind the replication traffic it causes.
        waiting = []
        flush = False
        for (_fn, fut, answer, _off_loop), (ok, value) in zip(batch, outcomes):
            if fut.done():
                continue
            if not ok:
                fut.set_exception(value)
            elif answer is Answer.WHEN_DURABLE:
                waiting.append((fut, value))
            else:
                fut.set_result(value)
                flush = flush or answer is Answer.AT_COMMIT_FLUSHING
        self.journal.committed(self._clock.monotonic_ms(), waiting)
        if flush and self._inline_fsync_now() and self.journal.flushing_seq is None:
            # A secondary's applied batch: journaled in the same step, before anything the commit wakes,
            # so its fetcher finds it durable and reports both positions on its next getMore at once.
            self._on_commit()
            self.journal.want_flush()
            self._start_flush()   # on the loop (`_inline_fsync_now`), so the flusher need not run at all
        else:
            if flush:
                self.request_flush()
            self._on_commit()
        self._schedule_flush()
        return len(batch)

    def _inline_fsync_now(self) -> bool:
        return self.inline_fsync and self.fsync_pace.inline_ok

    @staticmethod
    def _run_one(txn: StoreTxn, fn: Callable[[StoreTxn], Any], *, savepoint: bool = True) -> tuple[bool, Any]:
        """Runs one request; a failure undoes what it wrote (its savepoint is rolled back; without one, the
        caller rolls the transaction back)."""
        sp = txn.savepoint() if savepoint else None
        try:
            value = fn(txn)
        except MongoError as err:
            if sp is not None:
                txn.rollback_to(sp)
            return False, err
        except Exception as exc:
            if sp is not None:
                txn.rollback_to(sp)
            log.exception("write failed")
            return False, MongoError(1, f"internal error: {exc!r}")
        if sp is not None:
            txn.release(sp)
        return True, value
