"""The shell around the secondary's pipeline (`sync/worker.py`): fetcher -> bounded buffer -> applier.

It moves messages and entries; every decision is the product's:

* **Fetcher.** Asks the replica core for a sync source (none: wait for a topology
  change or 1 s). Opens a tailable cursor with `find {ts: {$gte: last_fetched.ts}}`
  and judges the first batch with `sync.fetching` (`check_first_batch`,
  `diagnose_missing`, and while RECOVERING `check_min_valid`); every way a fetch
  ends badly gets `sync.fetching.react`'s answer. Then `getMore` on the same
  cursor, which the source answers as soon as it commits or after
  `await_data_ms`. As in the product, a `getMore` is *not* checked: the source
  serves the entries after the cursor's last key. As in the product, the next
  `getMore` waits until the last batch is applied (and, for `REPORT_LINGER_MS`,
  for a journal flush under way) and carries our positions (the core's
  `PositionsWanted`); between a batch and its `getMore` the core knows the
  reports ride on the fetch (`FetchCarriesReports`) and sends no
  replSetUpdatePosition of its own.
* **Applier.** Takes everything buffered (bounded), skips entries at or below
  our last optime and writes the rest through the group-commit writer.
* **Rollback**: one `sync.rollback_flow.RollbackRun`, as `sync/rollback_runner.py`
  carries it out: wait until the buffer is applied, scan both oplogs newest first
  for the common point, refetch the touched keys (and, while RECOVERING, what the
  last rollback refetched) and the source's top (`minValid`), then one
  transaction; its ending goes to the core (`Replica.rollback_ended`).

The member owns one `Fetcher` while it is SECONDARY or RECOVERING (the
runtime's `SyncWorker`); `stop_fetching` is the drain before becoming primary.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from base.member import MemberState
from base.optime import OpTime
from replset import events as ev
from sync import fetching
from sync.fetching import Problem, Verdict, check_first_batch, diagnose_missing, react
from sync.rollback_flow import SCAN_WINDOW, Outcome, RollbackRun, ScanStep, Stage
from tests.sim import rpc
from tests.sim.disk import Entry, EntryKind, SimInvariantError
from tests.sim.writer import WriteOp

if TYPE_CHECKING:
    from tests.sim.node import Call, SimNode

BUFFER_BATCHES = 64
MAX_APPLY_BATCH = 5000
FETCH_BATCH = 200
PROBLEM_SLEEP_MS = 100
NO_SOURCE_RETRY_MS = 1000
ROLLBACK_COMMAND_TIMEOUT_MS = 30_000
REPORT_LINGER_MS = 2   # replset.replication.REPORT_LINGER_S
MAX_ROLLBACK_SCAN = 100_000


@dataclass(slots=True)
class RollbackJob:
    """The shell around one `RollbackRun`: the call in flight and what the plan refetches."""

    run: RollbackRun
    source_id: int
    call: int | None = None
    undone: list[Entry] = field(default_factory=list)
    keys: tuple[int, ...] = ()


class Fetcher:
    def __init__(self, node: SimNode) -> None:
        self.node = node
        self.last_fetched = node.log_last     # SyncWorker: node.log.last
        self.sync_source: str | None = None
        self.running = True
        self.call: int | None = None
        self.cursor: int | None = None        # the source's cursor id once `find` answered
        self.cursor_source: str | None = None
        self.wake_at = 0
        self.waiting_for_topology = False
        self.buffer: collections.deque[list[Entry]] = collections.deque()
        self.applying = False
        self.rollback: RollbackJob | None = None
        self.message = ""
        self.carrying_reports = False      # tailing: each getMore carries our positions
        self.awaiting_source = False       # a getMore is out
        self.linger_until: int | None = None

    # -- the step interface -------------------------------------------------------------------------

    def next_wakeup(self) -> int:
        if self.rollback is not None and self.rollback.run.stage is Stage.DRAIN:
            return self.rollback.run.drain_deadline_ms
        if self.running and self.call is None and self.rollback is None:
            return self.wake_at
        return 1 << 62

    def drained(self) -> bool:
        return not self.buffer and not self.applying

    def pump(self) -> None:
        self._pump_applier()
        if not self.running:
            return
        if self.rollback is not None:
            self._pump_rollback()
        elif self.call is None and self.node.now >= self.wake_at and len(self.buffer) < BUFFER_BATCHES:
            self._fetch_next()

    def on_topology_change(self) -> None:
        if self.waiting_for_topology:
            self.wake_at = self.node.now

    def request_change(self) -> None:
        """The runtime decided another source is better: drop the fetch in progress (not a rollback)."""
        if self.call is not None:
            self.node.calls.pop(self.call, None)
            self.call = None
            self._close_cursor()

    def stop_fetching(self) -> None:
        """SyncWorker.stop: cancel the fetch loop (and a rollback in progress); the applier drains on."""
        self.running = False
        if self.call is not None:
            self.node.calls.pop(self.call, None)
            self.call = None
        if self.rollback is not None:
            if self.rollback.call is not None:
                self.node.calls.pop(self.rollback.call, None)
            self.node.trace(f"rollback cancelled in stage {self.rollback.run.stage.name}")
            self.rollback = None
        self._close_cursor()

    # -- fetching -----------------------------------------------------------------------------------

    def _close_cursor(self) -> None:
        self.cursor = None
        self.cursor_source = None
        self._riding(carrying=False, awaiting=False)

    def _riding(self, *, carrying: bool | None = None, awaiting: bool | None = None) -> None:
        before = self.carrying_reports and not self.awaiting_source
        if carrying is not None:
            self.carrying_reports = carrying
        if awaiting is not None:
            self.awaiting_source = awaiting
        riding = self.carrying_reports and not self.awaiting_source
        if riding != before:
            self.node.tell(ev.FetchCarriesReports(riding))

    def _report_ready(self) -> bool:
        """SyncWorker._positions_after_apply: the last batch applied, and a journal flush under way waited
        for (at most `REPORT_LINGER_MS`), so one report carries the batch's applied and durable positions."""
        node = self.node
        if not self.drained():
            return False
        if node.disk.all_durable or not node.writer.journal.pending:
            self.linger_until = None
            return True
        if self.linger_until is None:
            self.linger_until = node.now + REPORT_LINGER_MS
        if node.now >= self.linger_until:
            self.linger_until = None
            return True
        self.wake_at = self.linger_until
        return False

    def _fetch_next(self) -> None:
        node = self.node
        if self.cursor_source is None:
            source = node.choose_sync_source(self.last_fetched)
            if source is None:
                self.sync_source = None
                node.tell(ev.FetcherMoved(None, self.last_fetched))
                self.waiting_for_topology = True
                self.wake_at = node.now + NO_SOURCE_RETRY_MS
                return
            self.waiting_for_topology = False
            if source != self.sync_source:
                node.trace(f"choosing sync source {source}")
            self.sync_source = self.cursor_source = source
            node.tell(ev.FetcherMoved(source, self.last_fetched))
        source_id = node.member_id_of(self.cursor_source)
        assert source_id is not None
        first = self.cursor is None
        if not first and not self._report_ready():
            return
        required = node.min_valid if node.state is MemberState.RECOVERING else None
        positions = None if first else node.ask(ev.PositionsWanted) or None
        body = rpc.FetchBody(self.last_fetched, FETCH_BATCH, 0 if first else node.await_data_ms, self.cursor,
                             required, positions)
        self.call = node.call(source_id, rpc.FETCH, body, node.await_data_ms + node.heartbeat_timeout_ms)
        if self.call is None:
            self.wake_at = node.now + PROBLEM_SLEEP_MS
        elif not first:
            self._riding(awaiting=True)

    def on_reply(self, rpc_id: int, call: Call, body: Any) -> None:
        if rpc_id == self.call:
            self.call = None
            self._riding(awaiting=False)
            self._on_fetch_reply(body)
        elif self.rollback is not None and rpc_id == self.rollback.call:
            self.rollback.call = None
            self._on_rollback_reply(body)

    def on_failed(self, rpc_id: int, call: Call, why: str) -> None:
        node = self.node
        if rpc_id == self.call:
            self.call = None
            node.trace(f"sync source {self.cursor_source} failed: {why}")
            self._react(Problem.UNREACHABLE if why in ("timed out", rpc.REFUSED) else Problem.ERROR)
        elif self.rollback is not None and rpc_id == self.rollback.call:
            self.rollback.call = None
            self._rollback_ended(self.rollback, f"the source failed: {why}")

    def _on_fetch_reply(self, reply: Any) -> None:
        node = self.node
        node.on_sync_source_metadata(reply.metadata)
        entries: list[Entry] = list(reply.entries)
        if self.cursor is None:
            self.cursor = reply.cursor
            verdict = check_first_batch(entries[0].optime if entries else None, self.last_fetched)
            if verdict is Verdict.MISSING:
                verdict = diagnose_missing(self.last_fetched, reply.oldest)
            if verdict is Verdict.CONTINUES and reply.required is not None:
                verdict = fetching.check_min_valid(reply.required, reply.has_required,
                                          node.core.member_applied(self.cursor_source or ""))
            if verdict is not Verdict.CONTINUES:
                node.trace(f"sync source {self.cursor_source}: {verdict.value} (our last fetched "
                           f"{self.last_fetched}, its first {entries[0].optime if entries else None})")
                self._react(Problem[verdict.name])
                return
            entries = entries[1:]
            self._riding(carrying=True)
        self.message = ""
        if entries:
            node.trace(f"fetched {len(entries)} from {self.cursor_source}: {entries[0].describe()} .. "
                       f"{entries[-1].describe()}")
            self.last_fetched = entries[-1].optime
            self.buffer.append(entries)
            node.tell(ev.FetcherMoved(self.sync_source, self.last_fetched))

    def _react(self, problem: Problem) -> None:
        """Carries out `sync.fetching.react` for the current source."""
        node = self.node
        source = self.cursor_source or ""
        source_id = node.member_id_of(source)
        assert source_id is not None
        self._close_cursor()
        reaction = react(problem, source_applied=node.core.member_applied(source), my_term=node.term)
        if reaction.message:
            self.message = reaction.message
            node.trace(f"sync source {source}: {reaction.message}")
        if reaction.too_stale:
            raise SimInvariantError(f"m{node.id} is too stale for {source}, but no oplog is capped here")
        if reaction.deny_ms:
            node.deny(source, reaction.deny_ms)
        if reaction.pause_ms:
            self.wake_at = node.now + reaction.pause_ms
        if reaction.roll_back:
            node.trace(f"sync source {source} does not have our last fetched {self.last_fetched}: rollback")
            self.rollback = RollbackJob(RollbackRun(source, node.now), source_id)

    # -- applying -----------------------------------------------------------------------------------

    def _pump_applier(self) -> None:
        if self.applying or not self.buffer:
            return
        batch: list[Entry] = []
        while self.buffer and len(batch) < MAX_APPLY_BATCH:
            batch.extend(self.buffer.popleft())
        node = self.node

        def run() -> list[Entry]:
            rows = []
            for entry in batch:
                if entry.optime.ts_key <= node.log_last.ts_key:
                    continue  # already applied (a refetched overlap)
                rows.append(entry)
                node.log_last = entry.optime
            return rows

        def done(error: BaseException | None) -> None:
            self.applying = False
            node.writer.want_flush()   # as the product's applier: the batch's journal flush starts now

        self.applying = node.submit(WriteOp("apply", run, done))

    # -- rollback -----------------------------------------------------------------------------------

    def _pump_rollback(self) -> None:
        job, node = self.rollback, self.node
        assert job is not None
        run = job.run
        if run.stage is not Stage.DRAIN:
            return
        if not self.drained():
            if run.drain_overdue(node.now):
                self._rollback_ended(job)
            return
        run.drained(node.last_applied, recovering=node.min_valid is not None)
        node.tell(ev.RollbackStarted())
        self.message = run.message
        assert run.our_last is not None
        self._scan(job, run.our_last.ts_key)

    def _scan(self, job: RollbackJob, at_or_before_ts_key: int) -> None:
        job.call = self.node.call(job.source_id, rpc.SCAN, (at_or_before_ts_key, SCAN_WINDOW),
                                  ROLLBACK_COMMAND_TIMEOUT_MS)
        if job.call is None:
            self._rollback_ended(job, "too many calls in flight")

    def _on_rollback_reply(self, body: Any) -> None:
        job = self.rollback
        assert job is not None
        if job.run.stage is Stage.SCAN:
            self._on_scan_reply(job, body)
        elif job.run.stage is Stage.REFETCH:
            self._on_refetch_reply(job, body)

    def _on_scan_reply(self, job: RollbackJob, batch: tuple[OpTime, ...]) -> None:
        node, run = self.node, job.run
        assert run.our_last is not None
        # Our side in one read (the disk is in memory); the source's a window at a time.
        ours = node.disk.optimes_newest_first(run.our_last.ts_key, MAX_ROLLBACK_SCAN) if not run.ours else []
        step = run.scanned(ours, batch, ours_done=True, theirs_done=len(batch) < SCAN_WINDOW,
                           commit_point=node.commit_point)
        if step is ScanStep.MORE:
            self._scan(job, batch[-1].ts_key - 1)
            return
        if step is ScanStep.ENDED:
            self._rollback_ended(job)
            return
        common = run.common_point
        assert common is not None
        job.undone = node.disk.entries_after(common)   # the plan: our committed entries after the common point
        keys = {e.key for e in job.undone if e.kind is EntryKind.WRITE}
        if run.refetch_last_rollback:
            keys |= node.disk.refetched_keys  # still inconsistent from the previous rollback
        job.keys = tuple(sorted(keys))
        job.call = node.call(job.source_id, rpc.REFETCH, job.keys, ROLLBACK_COMMAND_TIMEOUT_MS)
        if job.call is None:
            self._rollback_ended(job, "too many calls in flight")

    def _on_refetch_reply(self, job: RollbackJob, body: tuple[dict[int, tuple[int, int] | None], OpTime]) -> None:
        node, run = self.node, job.run
        docs, min_valid = body
        run.refetched(min_valid)
        common = run.common_point
        assert common is not None
        node.disk.save_rollback_file(job.undone)

        def run_commit() -> list[Entry]:
            if run.commit_verdict(node.disk.last, node.commit_point) is not None:
                return []
            keep = node.disk.refetched_keys if run.refetch_last_rollback else frozenset()
            node.writer.rollback_commit = lambda: node.disk.roll_back(common, docs, min_valid, keep)
            node.log_last = common
            return []

        def done(error: BaseException | None) -> None:
            if self.rollback is not job:
                return  # cancelled while the transaction ran: the runtime never gets past the await
            if run.ending is None:
                run.committed()
                self.last_fetched = common
                node.trace(f"rolled back to {common}; recovering until {min_valid}")
            self._rollback_ended(job)

        if not node.submit(WriteOp("rollback", run_commit, done)):
            self._rollback_ended(job, "writer queue full")

    def _rollback_ended(self, job: RollbackJob, failure: str = "") -> None:
        """Hands the run's ending (or `failure`: nothing changed) to the replica core."""
        node, run = self.node, job.run
        ending = run.failed(failure) if failure or run.ending is None else run.ending
        match ending.outcome:
            case Outcome.ROLLED_BACK:
                self.message = ""
            case Outcome.REFUSED:
                node.trace(f"refusing to roll back: {ending.why}")
                self.message = f"cannot roll back against {run.source}: {ending.why}"
                node.refused_rollbacks += 1
            case _:
                node.trace(f"rollback against {run.source} {ending.outcome.value}, nothing changed: {ending.why}")
        self.rollback = None
        node.tell(ev.RollbackEnded(run))
