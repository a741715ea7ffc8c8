"""The secondary's replication pipeline: oplog fetcher -> bounded buffer -> batched applier.

A shell. While the member is SECONDARY:

* The **fetcher** carries out `sync.fetch_loop.FetchLoop`'s actions (the same
  core the simulator runs): ask the runtime for a sync source (the pure choice
  in `sync.sync_source`), run `find` on the source's `local.oplog.rs` with
  `{ts: {$gte: <last fetched ts>}}`, `tailable` and `awaitData`, read the
  source's oldest entry or its minValid entry when the core asks, then loop on
  `getMore`, which the source answers as soon as it commits new entries (push,
  not polling) or after `maxTimeMS` with an empty batch. Each getMore waits
  until the last batch is applied and carries our positions. Each batch goes
  into the bounded buffer; a full buffer stops the fetcher (backpressure). The
  runtime may cancel a session's read to switch sources (`request_change`).
* The **applier** takes everything buffered (up to `MAX_APPLY_BATCH` entries),
  applies it in one group-commit transaction with the idempotent `apply_entry`
  in replay mode and appends the same entries to our oplog; the applied position
  is reported upstream at once (one report for the whole batch), and the journal
  flush that follows reports the durable one.

A member with no oplog never gets here: it initial-syncs first (STARTUP2,
`sync.initial_sync`). A source whose oldest entry is newer than our last one
is reported too stale (`ReportTooStale`); the runtime (`sync.resync`) decides
when that means RECOVERING and a resync.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

import bson
from bson.raw_bson import RawBSONDocument
from tenacity import AsyncRetrying, RetryCallState, retry_if_exception, wait_fixed

from base.clock import Clock
from base.errors import MongoError
from base.member import MemberState
from base.messages import POSITIONS_FIELD, parse_repl_metadata
from base.optime import NULL_OPTIME, OpTime
from oplog.apply import apply_entry
from oplog.codec_options import DOC_OPTIONS
from oplog.entry import cost_grows_with_data
from oplog.sqlite_store import StoreTxn
from sync import fetch_loop as fl
from sync.fetching import Problem
from sync.peer import PeerClient, PeerError
from sync.rollback_flow import Outcome, RollbackRun
from sync.rollback_runner import RollbackRunner
from sync.source_reads import kill_oplog_cursor, oplog_end, source_command
from sync.too_stale import StaleVerdict

if TYPE_CHECKING:
    from sync.host import SyncHost

log = logging.getLogger(__name__)

BUFFER_BATCHES = 64
MAX_APPLY_BATCH = 5000
APPLY_SLICE = 500
APPLY_RETRY_S = 0.5
FETCH_BATCH = 5000
STOP_TIMEOUT_S = 5.0
ROLLBACK_FINISH_S = 120.0


# A fetched entry: decoded (to apply it) and the bytes the source sent (stored as they are), or None
# when the entry came decoded only (the first batch of a cursor).
FetchedEntry = tuple[dict[str, Any], bytes | None]


def fetched_entries(batch: Iterable[RawBSONDocument]) -> list[FetchedEntry]:
    """A getMore's `nextBatch`, each entry decoded and with its bytes. pymongo hands a large sub-document's
    bytes as a memoryview of the whole reply; those are copied into `bytes` here: the store, the committed
    tail and the part log's runner treat an entry's bytes as `bytes` (`MARKER in blob` is False on a
    memoryview), and a view would keep the reply's frame alive as long as the tail keeps the entry."""
    entries: list[FetchedEntry] = []
    for doc in batch:
        raw = doc.raw
        if type(raw) is not bytes:
            raw = bytes(raw)
        entries.append((bson.decode(raw, DOC_OPTIONS), raw))
    return entries


class SyncWorker:
    def __init__(self, node: SyncHost, *, clock: Clock | None = None) -> None:
        self.node = node
        self.clock = node.clock if clock is None else clock
        self.core = fl.FetchLoop(node.log.last)
        self.sync_source: str | None = None
        self._buffer: asyncio.Queue[list[FetchedEntry]] = asyncio.Queue(BUFFER_BATCHES)
        self._buffered = 0                          # batches put in the buffer and not yet applied
        self._client: PeerClient | None = None     # the session's connection to its source
        self._cursor_id = 0
        self._reply: list[FetchedEntry] = []       # the last answer, whose entries `Take` hands on
        self._read_task: asyncio.Task[Callable[[], list[fl.Action]]] | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._cleanup: set[asyncio.Task[None]] = set()
        self._rollback_task: asyncio.Task[list[fl.Action]] | None = None

    @property
    def last_fetched(self) -> OpTime:
        return self.core.last_fetched

    @property
    def message(self) -> str:
        return self.core.message

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(self._fetch_loop(), name="oplog-fetcher"),
                       loop.create_task(self._apply_loop(), name="oplog-applier")]

    async def stop(self, *, drain: bool) -> bool:
        """Stops fetching; with `drain`, first applies everything already buffered.

        Returns False when the buffer could not be drained in time (the caller must
        not take writes then: fetched entries would be lost to this member).
        """
        fetcher, applier = self._tasks or (None, None)
        if fetcher is not None:
            fetcher.cancel()
        drained = True
        rollback = self._rollback_task
        if drain and rollback is not None and not rollback.done():
            # Taking over (an election) waits for a rollback to end; shutting down does not need to:
            # a rollback is one transaction, so a restart finds the member before or after it.
            await asyncio.wait([rollback], timeout=ROLLBACK_FINISH_S)
        if drain:
            try:
                await asyncio.wait_for(self._buffer.join(), STOP_TIMEOUT_S)
            except TimeoutError:
                drained = False
        if applier is not None:
            applier.cancel()
        if self._tasks:
            await asyncio.wait(self._tasks, timeout=STOP_TIMEOUT_S)
        self._tasks = []
        self.sync_source = None
        return drained

    def request_change(self) -> None:
        """Drop the current source (the runtime decided another one is better)."""
        if self._read_task is not None:
            self._read_task.cancel()

    # -- fetcher: carries out `sync.fetch_loop`'s actions -----------------------------------------------

    async def _fetch_loop(self) -> None:
        actions = self.core.start()
        try:
            while True:
                current = asyncio.current_task()
                if current is not None and current.cancelling():
                    # A cancellation swallowed by a racing wait_for still means "stop".
                    raise asyncio.CancelledError
                actions = await self._carry_out(actions)
        finally:
            for action in self.core.stop():
                if isinstance(action, fl.Riding | fl.CloseCursor):
                    await self._do(action)
            self._close_client()

    async def _carry_out(self, actions: list[fl.Action]) -> list[fl.Action]:
        """Carries out `actions` in order; returns what the answer to the last (a read, a wait) leads to."""
        following: list[fl.Action] = []
        for action in actions:
            following = await self._do(action)
        return following

    async def _do(self, action: fl.Action) -> list[fl.Action]:
        core, repl = self.core, self.node.repl
        match action:
            case fl.ChooseSource(last_fetched=last):
                return core.chosen(repl.choose_sync_source(last), self.clock.monotonic_ms())
            case fl.Moved(source=source, new_source=new_source):
                if new_source:
                    log.info("choosing sync source %s", source)
                self.sync_source = source
                repl.on_fetched()
            case fl.Riding(riding=riding):
                repl.reports_ride_on_fetch(riding)
            case fl.AwaitTopology(until_ms=until):
                await repl.topology_changed.wait(self._seconds_until(until))
                return core.wake()
            case fl.Pause(until_ms=until):
                await asyncio.sleep(self._seconds_until(until))
                return core.wake()
            case fl.AwaitApplied() if self._buffered == 0:   # applied already (`_take`): no wait, no task
                return core.applied(flush_pending=repl.flush_pending(), now_ms=self.clock.monotonic_ms())
            case fl.AwaitDurable() if not repl.flush_pending():
                return core.settled()
            case fl.Find() | fl.ReadOldest() | fl.ReadMinValid() | fl.AwaitApplied() | fl.AwaitDurable() \
                    | fl.GetMore():
                return await self._read(action)
            case fl.Take(start=start):
                await self._take(self._reply[start:])
            case fl.CloseCursor(source=source):
                if self._cursor_id:
                    self._release_cursor(source, self._cursor_id)
                self._cursor_id = 0
                self._close_client()
            case fl.Deny(source=source, for_ms=for_ms):
                repl.deny(source, for_ms)
            case fl.ReportTooStale(source=source, our_last=our_last, source_oldest=oldest):
                repl.resync.on_too_stale(StaleVerdict(source, our_last, oldest, self.clock.monotonic_ms()))
            case fl.RollBack(source=source):
                return await self._roll_back_uncancelled(source)
        return []

    def _seconds_until(self, until_ms: int) -> float:
        return max(0, until_ms - self.clock.monotonic_ms()) / 1000

    async def _read(self, action: fl.Action) -> list[fl.Action]:
        """One step of a session: the runtime may cancel it to switch sources (`request_change`), and it
        may end badly (`FetchLoop.failed`). The read runs in a task of its own; what its answer means is
        handed to the core only once that task has ended, so a cancellation never drops an answer the core
        already took in."""
        task = asyncio.get_running_loop().create_task(self._session_step(action))
        self._read_task = task
        try:
            answer = await task
            return answer()
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if current is not None and current.cancelling():
                task.cancel()
                raise
            return self.core.change()
        except PeerError as exc:
            log.info("sync source %s failed: %s", self.core.source, exc)
            return self._failed(Problem.UNREACHABLE)
        except MongoError as exc:
            log.warning("sync source %s: %s", self.core.source, exc)
            return self._failed(Problem.ERROR)
        except Exception:  # a malformed reply must not end replication for good
            log.exception("fetching from %s failed", self.core.source)
            return self._failed(Problem.ERROR)
        finally:
            self._read_task = None

    def _failed(self, problem: Problem) -> list[fl.Action]:
        actions = self.core.failed(problem, **self._judging())
        return actions if problem is Problem.UNREACHABLE else self._logged(actions)

    def _judging(self) -> dict[str, Any]:
        repl = self.node.repl
        return {"source_applied": repl.source_applied(self.core.source or ""), "my_term": self.node.term,
                "primary_seen": repl.primary_seen(), "now_ms": self.clock.monotonic_ms()}

    async def _session_step(self, action: fl.Action) -> Callable[[], list[fl.Action]]:
        """Carries out one read of a session; returns what hands its answer to the core (`_read` calls it)."""
        core, node = self.core, self.node
        match action:
            case fl.Find(source=source, after=after):
                await self._wait_while_stopped()
                self._close_client()
                self._client = node.peer(source)
                query: dict[str, Any] = {} if after == NULL_OPTIME else {"ts": {"$gte": after.ts}}
                reply = await self._command({
                    "find": "oplog.rs", "filter": query, "tailable": True, "awaitData": True,
                    "batchSize": FETCH_BATCH, "$db": "local"})
                cursor = reply["cursor"]
                self._cursor_id = cursor.get("id", 0)  # released however the session ends
                self._reply = [(doc, None) for doc in cursor.get("firstBatch", [])]
                first = OpTime.from_document(self._reply[0][0]) if self._reply else None
                last = OpTime.from_document(self._reply[-1][0]) if self._reply else None
                min_valid = node.min_valid if node.state is MemberState.RECOVERING else None
                return lambda: self._logged(core.found(first, last, min_valid=min_valid, **self._judging(),
                                                       cursor_open=bool(self._cursor_id)))
            case fl.ReadOldest():
                assert self._client is not None
                oldest = await oplog_end(self._client, newest=False, timeout_s=node.repl.heartbeat_timeout_s)
                source_oldest = OpTime.from_document(oldest) if oldest is not None else None
                return lambda: self._logged(core.oldest(source_oldest, **self._judging()))
            case fl.ReadMinValid(min_valid=min_valid):
                # The first entry at or after it (a keyed seek: `{ts: X}` alone would scan on when X is missing).
                reply = await self._command({
                    "find": "oplog.rs", "filter": {"ts": {"$gte": min_valid.ts}}, "limit": 1,
                    "singleBatch": True, "$db": "local"})
                held = [OpTime.from_document(doc) for doc in reply["cursor"].get("firstBatch", [])][:1] == [min_valid]
                return lambda: self._logged(core.min_valid_read(min_valid, held, **self._judging()))
            case fl.AwaitApplied():
                await self._buffer.join()
                return lambda: core.applied(flush_pending=node.repl.flush_pending(), now_ms=self.clock.monotonic_ms())
            case fl.AwaitDurable(until_ms=until):
                await node.repl.durable_moved(self._seconds_until(until))
                return core.settled
            case fl.GetMore():
                await self._wait_while_stopped()
                body: dict[str, Any] = {
                    "getMore": self._cursor_id, "collection": "oplog.rs", "batchSize": FETCH_BATCH,
                    "maxTimeMS": node.repl.await_data_ms, "$db": "local"}
                report = node.repl.fetch_position_report()
                if report is not None:
                    body[POSITIONS_FIELD] = report
                    node.hops.mark("report", node.last_durable_optime.ts_key)
                reply = await self._command(body, raw=True)
                cursor = reply["cursor"]
                await self._wait_while_stopped()  # a batch that arrived after the fail point waits too
                # Each entry is decoded once, to apply it, and stored with the bytes the source sent.
                self._reply = fetched_entries(cursor.get("nextBatch", []))
                self._cursor_id = cursor.get("id", 0)
                last = OpTime.from_document(self._reply[-1][0]) if self._reply else None
                if last is not None:
                    node.hops.mark("received", last.ts_key)
                return lambda: core.batch(last, cursor_open=bool(self._cursor_id))
        raise AssertionError(f"not a read: {action!r}")

    def _logged(self, actions: list[fl.Action]) -> list[fl.Action]:
        """A first batch or its follow-up ended the session badly: say why (`FetchLoop.failed` did)."""
        if any(isinstance(a, fl.Deny | fl.RollBack | fl.ReportTooStale) for a in actions):
            log.warning("sync source %s: %s", self.core.source, self.core.message or "rolling back to it")
        return actions

    def _close_client(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None

    def _release_cursor(self, source: str, cursor_id: int) -> None:
        """Best effort: the source would otherwise keep our tailable cursor until it idles out."""
        async def kill() -> None:
            client = self.node.peer(source)
            try:
                await kill_oplog_cursor(client, cursor_id)
            finally:
                client.close()

        task = asyncio.get_running_loop().create_task(kill())
        self._cleanup.add(task)
        task.add_done_callback(self._cleanup.discard)

    async def _command(self, body: dict[str, Any], *, raw: bool = False) -> Any:
        assert self._client is not None
        timeout_s = self.node.repl.await_data_ms / 1000 + self.node.repl.heartbeat_timeout_s
        reply = await source_command(self._client, body, timeout_s=timeout_s, raw=raw)
        meta = parse_repl_metadata(reply)
        if meta is not None:
            self.node.repl.on_sync_source_metadata(meta)
        return reply

    async def _roll_back_uncancelled(self, source: str) -> list[fl.Action]:
        """A rollback runs to its end even if the fetcher is cancelled meanwhile (a drain before an
        election, a source change): stopping half-way would leave the member in ROLLBACK with its
        transaction possibly committed behind its back."""
        task = asyncio.get_running_loop().create_task(self._roll_back(source), name="rollback")
        self._rollback_task = task
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            await asyncio.wait([task], timeout=ROLLBACK_FINISH_S)
            raise

    async def _roll_back(self, source: str) -> list[fl.Action]:
        """ROLLBACK: undo our entries after the common point, then RECOVERING until minValid. The steps
        and how each ends are `sync.rollback_flow`'s; this carries them out. Returns what the fetch loop
        does next."""
        node, repl = self.node, self.node.repl
        run = RollbackRun(source, self.clock.monotonic_ms())
        try:
            left_ms = run.drain_deadline_ms - self.clock.monotonic_ms()
            await asyncio.wait_for(self._buffer.join(), left_ms / 1000)
        except TimeoutError:
            run.drain_overdue(run.drain_deadline_ms)
            assert run.ending is not None
            ending = run.ending
        else:
            # Committed entries only: a write still committing (a step-down raced it) is caught by the run's
            # commit check, as our oplog then no longer ends where the plan was made.
            run.drained(node.last_committed_optime, recovering=node.min_valid is not None)
            repl.rollback_started()
            self.core.rollback_started(run.message)
            ending = await RollbackRunner(node, run).run()
        message = ""
        match ending.outcome:
            case Outcome.ROLLED_BACK:
                assert ending.common_point is not None
            case Outcome.REFUSED:
                log.critical("refusing to roll back: %s", ending.why)
                message = f"cannot roll back against {source}: {ending.why}"
            case _:
                log.warning("rollback against %s failed, nothing changed: %s", source, ending.why)
                message = f"rollback against {source} failed: {ending.why}"
        common = ending.common_point if ending.outcome is Outcome.ROLLED_BACK else None
        actions = self.core.rolled_back(common, message)
        for action in actions:
            if isinstance(action, fl.Moved):   # the fetcher is at the common point before the core hears
                await self._do(action)
        # RECOVERING until minValid is applied (at once if already there), or back where we were
        repl.rollback_ended(run)
        return [action for action in actions if not isinstance(action, fl.Moved)]

    async def _take(self, entries: list[FetchedEntry]) -> None:
        """Hands a fetched batch to the applier. When nothing is buffered and the writer is idle, the batch
        is applied here and now, in this step (`GroupCommitWriter.commit_now`; with an inline fsync it is
        journaled too), so the getMore that reports it goes out without a trip through the buffer, the
        applier task and the writer task. A batch that fails there, or that must run off the loop or in
        slices, goes through the buffer (which retries it)."""
        if not entries:
            return
        self.node.metrics.fetch_batch.observe(len(entries))
        if self._buffered == 0 and len(entries) <= APPLY_SLICE \
                and not any(cost_grows_with_data(entry) for entry, _raw in entries):
            done = self.node.writer.commit_now(self._apply_function(entries), flush=True)
            if done is not None and done.exception() is None:
                self.node.metrics.apply_batch.observe(len(entries))
                return
        await self._buffer.put(entries)
        self._buffered += 1   # after the put: a fetcher cancelled while the buffer is full counts nothing

    async def _wait_while_stopped(self) -> None:
        points = self.node.failpoints
        while points.is_on("stopReplProducer"):
            self.node.repl.on_fetched()
            await asyncio.sleep(0.02)  # test-only fail point: nothing to wait on but the operator

    # -- applier ----------------------------------------------------------------------------------

    async def _apply_loop(self) -> None:
        while True:
            batch, taken = list(await self._buffer.get()), 1
            while len(batch) < MAX_APPLY_BATCH and not self._buffer.empty():
                batch.extend(self._buffer.get_nowait())
                taken += 1
            self.node.metrics.apply_batch.observe(len(batch))
            try:
                # In slices: one transaction holds the event loop while it applies, and heartbeats
                # must not wait for 5,000 entries.
                for start in range(0, len(batch), APPLY_SLICE):
                    await self._apply(batch[start:start + APPLY_SLICE])
            finally:
                for _ in range(taken):
                    self._buffered -= 1
                    self._buffer.task_done()

    def _apply_function(self, entries: list[FetchedEntry]) -> Callable[[StoreTxn], None]:
        """What applies `entries` in a write transaction: each one not applied yet, and our oplog after them."""
        node = self.node

        def write(txn: StoreTxn) -> None:
            rows: list[tuple[int, bytes]] = []
            last = node.log.last
            for entry, raw in entries:
                optime = OpTime.from_document(entry)
                if optime.ts_key <= last.ts_key:
                    continue  # already applied (a refetched overlap)
                apply_entry(txn, entry, replay=True)
                rows.append((optime.ts_key, raw if raw is not None else bson.encode(entry)))
                last = optime
            txn.append_oplog(rows)
            node.log.last = last

        return write

    async def _apply(self, entries: list[FetchedEntry]) -> None:
        node = self.node
        write = self._apply_function(entries)

        def log_retry(state: RetryCallState) -> None:
            exc = state.outcome.exception() if state.outcome is not None else None
            log.error("applying a batch of %d entries failed: %s; retrying", len(entries), exc)

        # A failed batch (a storage error) is retried as it stands until it applies, unless we shut down.
        async for attempt in AsyncRetrying(
                retry=retry_if_exception(lambda exc: isinstance(exc, MongoError) and not node.shutting_down),
                wait=wait_fixed(APPLY_RETRY_S), before_sleep=log_retry, reraise=True):
            with attempt:
                # As MongoDB's applier: the batch is applied (reported at once, for w:N), and the journal
                # flush that makes it durable (for w:"majority" and j) starts now, not in 100 ms (`flush`).
                await node.writer.submit(write, durable=False, flush=True,
                                         off_loop=any(cost_grows_with_data(entry) for entry, _raw in entries))

