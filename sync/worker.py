"""The secondary's replication pipeline: oplog fetcher -> bounded buffer -> batched applier.

A shell. While the member is SECONDARY:

* The **fetcher** asks the runtime for a sync source (the pure choice in
  `sync.sync_source`), runs `find` on the source's `local.oplog.rs` with
  `{ts: {$gte: <last fetched ts>}}`, `tailable` and `awaitData`, and checks that
  the first entry is our own last fetched entry: a different entry means the
  histories diverged (rollback), a missing one that we are too stale. Then it
  loops on `getMore`, which the source answers as soon as it commits new
  entries (push, not polling) or after `maxTimeMS` with an empty batch. Each
  batch goes into the bounded buffer; a full buffer stops the fetcher
  (backpressure). The runtime may cancel a fetch to switch sources.
* The **applier** takes everything buffered (up to `MAX_APPLY_BATCH` entries),
  applies it in one group-commit transaction with the idempotent `apply_entry`
  in replay mode and appends the same entries to our oplog; the applied position
  is reported upstream at once (one report for the whole batch), and the journal
  flush that follows reports the durable one.

A member with no oplog never gets here: it initial-syncs first (STARTUP2,
`sync.initial_sync`). A source whose oldest entry is newer than our last one
raises `TooStale`; the runtime (`sync.resync`) decides when that means RECOVERING
and a resync.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

import bson
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
from sync import fetching
from sync.fetching import Problem, Verdict, check_first_batch, diagnose_missing, react
from sync.peer import PeerClient, PeerError
from sync.rollback_flow import Outcome, RollbackRun
from sync.rollback_runner import RollbackRunner
from sync.source_reads import kill_oplog_cursor, oplog_end, source_command
from sync.too_stale import StaleVerdict, describe_optime

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


class SyncSourceProblem(Exception):
    """The source cannot serve us: diverged history, too stale, or a bad reply."""


class Diverged(SyncSourceProblem):
    """Our last fetched entry is not in the source's oplog: roll back to the common point."""


class BeforeMinValid(SyncSourceProblem):
    """RECOVERING after a rollback, and the source has not reached the rollback's minValid yet."""


class TooStale(SyncSourceProblem):
    """The source trimmed entries we never applied: its oldest entry is newer than our last one."""

    def __init__(self, our_last: OpTime, source_oldest: OpTime) -> None:
        super().__init__(f"too stale to catch up: our last entry {describe_optime(our_last)} is older than "
                         f"the source's oldest entry {describe_optime(source_oldest)}")
        self.our_last = our_last
        self.source_oldest = source_oldest


class SyncWorker:
    def __init__(self, node: SyncHost, *, clock: Clock | None = None) -> None:
        self.node = node
        self.clock = node.clock if clock is None else clock
        self.last_fetched = node.log.last
        self.sync_source: str | None = None
        self.message = ""
        self._buffer: asyncio.Queue[list[FetchedEntry]] = asyncio.Queue(BUFFER_BATCHES)
        self._fetch_task: asyncio.Task[None] | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._cleanup: set[asyncio.Task[None]] = set()
        self._rollback_task: asyncio.Task[None] | None = None
        # While tailing, each getMore carries our positions (`POSITIONS_FIELD`): it is sent once the
        # previous batch is applied (and, within a short wait, durable), so the source learns of it
        # without a replSetUpdatePosition of its own. `awaiting_source` is True while a getMore is
        # out: positions that move meanwhile go by the position reporter.
        self._carrying_reports = False
        self._awaiting_source = False

    @property
    def carrying_reports(self) -> bool:
        return self._carrying_reports

    @carrying_reports.setter
    def carrying_reports(self, value: bool) -> None:
        self._carrying_reports = value
        self.node.repl.reports_ride_on_fetch(self._carrying_reports and not self._awaiting_source)

    @property
    def awaiting_source(self) -> bool:
        return self._awaiting_source

    @awaiting_source.setter
    def awaiting_source(self, value: bool) -> None:
        self._awaiting_source = value
        self.node.repl.reports_ride_on_fetch(self._carrying_reports and not self._awaiting_source)

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
        if self._fetch_task is not None:
            self._fetch_task.cancel()

    # -- fetcher ----------------------------------------------------------------------------------

    async def _fetch_loop(self) -> None:
        repl = self.node.repl
        while True:
            current = asyncio.current_task()
            if current is not None and current.cancelling():
                # A cancellation swallowed by a racing wait_for still means "stop".
                raise asyncio.CancelledError
            source = repl.choose_sync_source(self.last_fetched)
            if source is None:
                if self.sync_source is not None:
                    self.sync_source = None
                    repl.on_fetched()
                await repl.topology_changed.wait(1.0)
                continue
            if source != self.sync_source:
                log.info("choosing sync source %s", source)
            self.sync_source = source
            repl.on_fetched()
            self._fetch_task = asyncio.get_running_loop().create_task(self._fetch(source))
            try:
                await self._fetch_task
            except asyncio.CancelledError:
                current = asyncio.current_task()
                if current is not None and current.cancelling():
                    self._fetch_task.cancel()
                    raise
            except PeerError as exc:
                log.info("sync source %s failed: %s", source, exc)
                await self._react(source, Problem.UNREACHABLE, exc)
            except Diverged as exc:
                await self._react(source, Problem.DIVERGED, exc)
            except TooStale as exc:
                await self._react(source, Problem.TOO_STALE, exc)
            except BeforeMinValid as exc:
                await self._react(source, Problem.BEFORE_MIN_VALID, exc)
            except SyncSourceProblem as exc:
                await self._react(source, Problem.NO_DATA, exc)
            except MongoError as exc:
                await self._react(source, Problem.ERROR, exc)
            except Exception as exc:  # a malformed reply must not end replication for good
                log.exception("fetching from %s failed", source)
                await self._react(source, Problem.ERROR, exc)
            finally:
                self._fetch_task = None

    async def _react(self, source: str, problem: Problem, exc: BaseException) -> None:
        """Carries out `sync.fetching.react`: what to do when fetching from `source` ended badly."""
        repl = self.node.repl
        reaction = react(problem, source_applied=repl.source_applied(source), my_term=self.node.term)
        if reaction.message:
            self.message = f"sync source {source}: {reaction.message}"
        if problem is not Problem.UNREACHABLE:
            log.warning("sync source %s: %s%s", source, exc,
                        f" ({reaction.message})" if reaction.message and reaction.message != str(exc) else "")
        if reaction.deny_ms:
            repl.deny(source, reaction.deny_ms)
        if reaction.too_stale and isinstance(exc, TooStale):
            self.message = str(exc)
            repl.resync.on_too_stale(StaleVerdict(source, exc.our_last, exc.source_oldest,
                                                  self.clock.monotonic_ms()))
        if reaction.roll_back:
            await self._roll_back_uncancelled(source)
        if reaction.pause_ms:
            await asyncio.sleep(reaction.pause_ms / 1000)

    async def _fetch(self, source: str) -> None:
        node = self.node
        client = node.peer(source)
        cursor_id = 0
        try:
            await self._wait_while_stopped()
            last = self.last_fetched
            query: dict[str, Any] = {} if last == NULL_OPTIME else {"ts": {"$gte": last.ts}}
            reply = await self._command(client, {
                "find": "oplog.rs", "filter": query, "tailable": True, "awaitData": True,
                "batchSize": FETCH_BATCH, "$db": "local"})
            cursor = reply["cursor"]
            cursor_id = cursor.get("id", 0)  # released below however this ends
            docs = self._check_first_batch(list(cursor.get("firstBatch", [])), last)
            if docs is None:
                await self._diagnose_missing(client, last)
            await self._check_min_valid(client, source)
            await self._enqueue([(doc, None) for doc in docs or []])
            self.message = ""
            self.carrying_reports = True
            while cursor_id:
                await self._wait_while_stopped()
                body: dict[str, Any] = {
                    "getMore": cursor_id, "collection": "oplog.rs", "batchSize": FETCH_BATCH,
                    "maxTimeMS": self.node.repl.await_data_ms, "$db": "local"}
                report = await self._positions_after_apply()
                if report is not None:
                    body[POSITIONS_FIELD] = report
                self.awaiting_source = True
                try:
                    reply = await self._command(client, body, raw=True)
                finally:
                    self.awaiting_source = False
                cursor = reply["cursor"]
                await self._wait_while_stopped()  # a batch that arrived after the fail point waits too
                # Each entry is decoded once, to apply it, and stored with the bytes the source sent.
                await self._enqueue([(bson.decode(doc.raw, DOC_OPTIONS), doc.raw)
                                     for doc in cursor.get("nextBatch", [])])
                cursor_id = cursor.get("id", 0)
        finally:
            self.carrying_reports = False
            self.awaiting_source = False
            client.close()
            if cursor_id:
                self._release_cursor(source, cursor_id)

    async def _positions_after_apply(self) -> dict[str, Any] | None:
        """Waits until every fetched batch is applied (and briefly for its journal flush), then returns
        the position report the next getMore carries. Fetching the next batch waits for the last one
        to be applied: one message a batch instead of two, which is what the source's CPU pays for."""
        await self._buffer.join()
        await self.node.repl.settle_durable()
        return self.node.repl.fetch_position_report()

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

    async def _command(self, client: PeerClient, body: dict[str, Any], *, raw: bool = False) -> Any:
        timeout_s = self.node.repl.await_data_ms / 1000 + self.node.repl.heartbeat_timeout_s
        reply = await source_command(client, body, timeout_s=timeout_s, raw=raw)
        meta = parse_repl_metadata(reply)
        if meta is not None:
            self.node.repl.on_sync_source_metadata(meta)
        return reply

    def _check_first_batch(self, docs: list[dict[str, Any]], last: OpTime) -> list[dict[str, Any]] | None:
        """The entries after our last one, or None when the source does not start with it."""
        first = OpTime.from_document(docs[0]) if docs else None
        verdict = check_first_batch(first, last)
        if verdict is Verdict.NO_DATA:
            raise SyncSourceProblem(verdict.value)
        if verdict is Verdict.MISSING:
            return None  # too stale or diverged: the source's oldest entry tells
        if verdict is Verdict.DIVERGED:
            raise Diverged(f"our last fetched optime {last} is not in the source's oplog (it has {first} "
                           "there): the histories diverged and a rollback is needed")
        return docs[1:]

    async def _diagnose_missing(self, client: PeerClient, last: OpTime) -> None:
        oldest = await oplog_end(client, newest=False, timeout_s=self.node.repl.heartbeat_timeout_s)
        source_oldest = OpTime.from_document(oldest) if oldest is not None else None
        if diagnose_missing(last, source_oldest) is Verdict.TOO_STALE:
            assert source_oldest is not None
            raise TooStale(last, source_oldest)
        raise Diverged(f"our last fetched optime {last} is ahead of the source's newest entry "
                       "or missing from it: the histories diverged")

    async def _check_min_valid(self, client: PeerClient, source: str) -> None:
        """While RECOVERING after a rollback: the source must hold the rollback's minValid entry."""
        node = self.node
        min_valid = node.min_valid
        if min_valid is None or node.state is not MemberState.RECOVERING:
            return
        # The first entry at or after it (a keyed seek: `{ts: X}` alone would scan on when X is missing).
        reply = await self._command(client, {
            "find": "oplog.rs", "filter": {"ts": {"$gte": min_valid.ts}}, "limit": 1, "singleBatch": True,
            "$db": "local"})
        found = [OpTime.from_document(doc) for doc in reply["cursor"].get("firstBatch", [])]
        verdict = fetching.check_min_valid(min_valid, found[:1] == [min_valid], node.repl.source_applied(source))
        if verdict is Verdict.MIN_VALID_ELSEWHERE:
            raise Diverged(f"{verdict.value} (our minValid {min_valid})")
        if verdict is Verdict.BEFORE_MIN_VALID:
            raise BeforeMinValid(f"{verdict.value} (our minValid {min_valid})")

    async def _roll_back_uncancelled(self, source: str) -> None:
        """A rollback runs to its end even if the fetcher is cancelled meanwhile (a drain before an
        election, a source change): stopping half-way would leave the member in ROLLBACK with its
        transaction possibly committed behind its back."""
        task = asyncio.get_running_loop().create_task(self._roll_back(source), name="rollback")
        self._rollback_task = task
        try:
            await asyncio.shield(task)
        except asyncio.CancelledError:
            await asyncio.wait([task], timeout=ROLLBACK_FINISH_S)
            raise

    async def _roll_back(self, source: str) -> None:
        """ROLLBACK: undo our entries after the common point, then RECOVERING until minValid. The steps
        and how each ends are `sync.rollback_flow`'s; this carries them out."""
        node, repl = self.node, self.node.repl
        run = RollbackRun(source, self.clock.monotonic_ms())
        try:
            left_ms = run.drain_deadline_ms - self.clock.monotonic_ms()
            await asyncio.wait_for(self._buffer.join(), left_ms / 1000)
        except TimeoutError:
            run.drain_overdue(run.drain_deadline_ms)
            repl.rollback_ended(run)
            return
        # Committed entries only: a write still committing (a step-down raced it) is caught by the run's
        # commit check, as our oplog then no longer ends where the plan was made.
        run.drained(node.last_committed_optime, recovering=node.min_valid is not None)
        repl.rollback_started()
        self.message = run.message
        ending = await RollbackRunner(node, run).run()
        match ending.outcome:
            case Outcome.ROLLED_BACK:
                assert ending.common_point is not None
                self.last_fetched = ending.common_point
                repl.on_fetched()
                self.message = ""
            case Outcome.REFUSED:
                log.critical("refusing to roll back: %s", ending.why)
                self.message = f"cannot roll back against {source}: {ending.why}"
            case _:
                log.warning("rollback against %s failed, nothing changed: %s", source, ending.why)
                self.message = f"rollback against {source} failed: {ending.why}"
        # RECOVERING until minValid is applied (at once if already there), or back where we were
        repl.rollback_ended(run)

    async def _enqueue(self, entries: list[FetchedEntry]) -> None:
        if not entries:
            return
        self.node.metrics.fetch_batch.observe(len(entries))
        self.last_fetched = OpTime.from_document(entries[-1][0])
        self.node.repl.on_fetched()
        await self._buffer.put(entries)

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
                    self._buffer.task_done()

    async def _apply(self, entries: list[FetchedEntry]) -> None:
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

        def log_retry(state: RetryCallState) -> None:
            exc = state.outcome.exception() if state.outcome is not None else None
            log.error("applying a batch of %d entries failed: %s; retrying", len(entries), exc)

        # A failed batch (a storage error) is retried as it stands until it applies, unless we shut down.
        async for attempt in AsyncRetrying(
                retry=retry_if_exception(lambda exc: isinstance(exc, MongoError) and not node.shutting_down),
                wait=wait_fixed(APPLY_RETRY_S), before_sleep=log_retry, reraise=True):
            with attempt:
                await node.writer.submit(write, durable=False,
                                         off_loop=any(cost_grows_with_data(entry) for entry, _raw in entries))
        # As MongoDB's applier: the batch is applied (reported at once, for w:N), and the journal flush
        # that makes it durable (for w:"majority" and j) starts now, not in 100 ms.
        node.request_flush()

