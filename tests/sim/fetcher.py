"""The shell around the secondary's pipeline (`sync/worker.py`): fetcher -> bounded buffer -> applier.

It moves messages, entries and time; every decision is the product's:

* **Fetcher.** `sync.fetch_loop.FetchLoop`, the same core `SyncWorker` runs,
  says what comes next: ask the replica core for a source, `find` (a FETCH call
  without a cursor), read the source's oldest entry or check it holds our
  minValid (both come back in the `find` answer here), hand a batch to the
  applier, wait until it is applied and briefly for its journal flush, `getMore`
  with our positions, deny a source, pause, roll back. This class carries each
  action out and feeds the answers back.
* **Applier.** Takes everything buffered (bounded), skips entries at or below
  our last optime and writes the rest through the group-commit writer.
* **Rollback**: one `sync.rollback_flow.RollbackRun`, as `sync/rollback_runner.py`
  carries it out: wait until the buffer is applied, scan both oplogs newest first
  for the common point, refetch the touched keys (and, while RECOVERING, what the
  last rollback refetched) and the source's top (`minValid`), then one
  transaction; its ending goes to the core (`Replica.rollback_ended`) and to the
  fetch loop.

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
from sync import fetch_loop as fl
from sync.fetching import Problem
from sync.rollback_flow import SCAN_WINDOW, Outcome, RollbackRun, ScanStep, Stage
from tests.sim import rpc
from tests.sim.disk import Entry, EntryKind, SimInvariantError
from tests.sim.writer import WriteOp

if TYPE_CHECKING:
    from tests.sim.node import Call, SimNode
    from tests.sim.source import FetchReply

MAX_APPLY_BATCH = 5000
FETCH_BATCH = 200
ROLLBACK_COMMAND_TIMEOUT_MS = 30_000
MAX_ROLLBACK_SCAN = 100_000
NEVER = 1 << 62


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
        self.core = fl.FetchLoop(node.log_last)   # SyncWorker: node.log.last
        self.running = True
        self.call: int | None = None              # the FETCH call out (find or getMore)
        self.cursor: int | None = None            # the source's cursor id once `find` answered
        self.reply: FetchReply | None = None      # the last answer, whose entries `Take` hands on
        self.waiting: fl.Action | None = None     # the wait under way (a pause, apply, journal)
        self.buffer: collections.deque[list[Entry]] = collections.deque()
        self.applying = False
        self.rollback: RollbackJob | None = None
        self._carry_out(self.core.start())

    @property
    def sync_source(self) -> str | None:
        return self.core.source if self.running else None

    @property
    def message(self) -> str:
        return self.core.message

    # -- the step interface -------------------------------------------------------------------------

    def next_wakeup(self) -> int:
        if self.rollback is not None and self.rollback.run.stage is Stage.DRAIN:
            return self.rollback.run.drain_deadline_ms
        match self.waiting:
            case fl.AwaitTopology(until_ms=until) | fl.Pause(until_ms=until) | fl.AwaitDurable(until_ms=until):
                return until
        return NEVER

    def drained(self) -> bool:
        return not self.buffer and not self.applying

    def pump(self) -> None:
        self._pump_applier()
        if not self.running:
            return
        if self.rollback is not None:
            self._pump_rollback()
            return
        node, core = self.node, self.core
        match self.waiting:
            case fl.AwaitTopology(until_ms=until) | fl.Pause(until_ms=until) if node.now >= until:
                self.waiting = None
                self._carry_out(core.wake())
            case fl.AwaitApplied() if self.drained():
                self.waiting = None
                self._carry_out(core.applied(flush_pending=self._flush_pending(), now_ms=node.now))
            case fl.AwaitDurable(until_ms=until) if node.now >= until or not self._flush_pending():
                self.waiting = None
                self._carry_out(core.settled())

    def on_topology_change(self) -> None:
        if isinstance(self.waiting, fl.AwaitTopology):
            self.waiting = None
            self._carry_out(self.core.wake())

    def request_change(self) -> None:
        """The runtime decided another source is better: drop the fetch in progress (not a rollback)."""
        self._carry_out(self.core.change())

    def stop_fetching(self) -> None:
        """SyncWorker.stop: cancel the fetch loop (and a rollback in progress); the applier drains on."""
        self._carry_out(self.core.stop())
        self.running = False
        self.waiting = None
        self._drop_call()
        if self.rollback is not None:
            if self.rollback.call is not None:
                self.node.calls.pop(self.rollback.call, None)
            self.node.trace(f"rollback cancelled in stage {self.rollback.run.stage.name}")
            self.rollback = None

    def fetch_from(self, source: str) -> None:
        """A new session with `source`, as if the replica core had chosen it (for stories)."""
        self._carry_out(self.core.change())
        self._drop_call()
        self.waiting = None
        self.core = fl.FetchLoop(self.core.last_fetched)
        self.core.start()
        self._carry_out(self.core.chosen(source, self.node.now))

    # -- carrying out the fetch loop's actions ------------------------------------------------------

    def _carry_out(self, actions: list[fl.Action]) -> None:
        queue = collections.deque(actions)
        while queue:
            queue.extendleft(reversed(self._do(queue.popleft())))

    def _do(self, action: fl.Action) -> list[fl.Action]:
        """Carries out one action; returns the ones its answer leads to when it comes at once."""
        node, core = self.node, self.core
        match action:
            case fl.ChooseSource(last_fetched=last):
                return core.chosen(node.choose_sync_source(last), node.now)
            case fl.Moved(source=source, last_fetched=last, new_source=new_source):
                if new_source:
                    node.trace(f"choosing sync source {source}")
                node.tell(ev.FetcherMoved(source, last))
            case fl.Riding(riding=riding):
                node.tell(ev.FetchCarriesReports(riding))
            case fl.Find(source=source, after=after):
                self.cursor = None
                required = node.min_valid if node.state is MemberState.RECOVERING else None
                return self._fetch(source, rpc.FetchBody(after, FETCH_BATCH, 0, None, required))
            case fl.GetMore(source=source):
                positions = node.ask(ev.PositionsWanted) or None
                return self._fetch(source, rpc.FetchBody(core.last_fetched, FETCH_BATCH, node.await_data_ms,
                                                         self.cursor, None, positions))
            case fl.ReadOldest():   # the `find` answer carries the source's oldest entry
                assert self.reply is not None
                return core.oldest(self.reply.oldest, **self._judging())
            case fl.ReadMinValid(min_valid=min_valid):   # and whether it holds the minValid asked about
                reply = self.reply
                assert reply is not None
                held = reply.required == min_valid and reply.has_required
                return core.min_valid_read(min_valid, held, **self._judging())
            case fl.Take(start=start):
                assert self.reply is not None
                entries = list(self.reply.entries[start:])
                if entries:
                    node.trace(f"fetched {len(entries)} from {core.source}: {entries[0].describe()} .. "
                               f"{entries[-1].describe()}")
                    self.buffer.append(entries)
            case fl.AwaitApplied() | fl.AwaitDurable() | fl.AwaitTopology() | fl.Pause():
                self.waiting = action   # `pump` and `on_topology_change` end it
            case fl.CloseCursor():
                self._drop_call()
                self.cursor = None
                self.waiting = None   # a wait of the session that ended
            case fl.Deny(source=source, for_ms=for_ms):
                node.trace(f"denying {source} for {for_ms} ms: {core.message or 'it failed'}")
                node.deny(source, for_ms)
            case fl.ReportTooStale(source=source):
                raise SimInvariantError(f"m{node.id} is too stale for {source}, but no oplog is capped here")
            case fl.RollBack(source=source):
                node.trace(f"sync source {source} does not have our last fetched {core.last_fetched}: rollback")
                source_id = node.member_id_of(source)
                assert source_id is not None
                self.rollback = RollbackJob(RollbackRun(source, node.now), source_id)
        return []

    def _judging(self) -> dict[str, Any]:
        node = self.node
        return {"source_applied": node.core.member_applied(self.core.source or ""), "my_term": node.term,
                "primary_seen": node.core.primary_id() is not None, "now_ms": node.now}

    def _flush_pending(self) -> bool:
        """A journal flush would make the applied batch durable soon (`Replication.flush_pending`)."""
        node = self.node
        return not node.disk.all_durable and bool(node.writer.journal.pending)

    def _fetch(self, source: str, body: rpc.FetchBody) -> list[fl.Action]:
        node = self.node
        source_id = node.member_id_of(source)
        assert source_id is not None
        self.call = node.call(source_id, rpc.FETCH, body, node.await_data_ms + node.heartbeat_timeout_ms)
        if self.call is None:
            return self.core.failed(Problem.ERROR, **self._judging())
        return []

    def _drop_call(self) -> None:
        if self.call is not None:
            self.node.calls.pop(self.call, None)
            self.call = None

    def on_reply(self, rpc_id: int, call: Call, body: Any) -> None:
        if rpc_id == self.call:
            self.call = None
            self._on_fetch_reply(body)
        elif self.rollback is not None and rpc_id == self.rollback.call:
            self.rollback.call = None
            self._on_rollback_reply(body)

    def on_failed(self, rpc_id: int, call: Call, why: str) -> None:
        node = self.node
        if rpc_id == self.call:
            self.call = None
            node.trace(f"sync source {self.core.source} failed: {why}")
            problem = Problem.UNREACHABLE if why in ("timed out", rpc.REFUSED) else Problem.ERROR
            self._carry_out(self.core.failed(problem, **self._judging()))
        elif self.rollback is not None and rpc_id == self.rollback.call:
            self.rollback.call = None
            self._rollback_ended(self.rollback, f"the source failed: {why}")

    def _on_fetch_reply(self, reply: FetchReply) -> None:
        node, core = self.node, self.core
        node.on_sync_source_metadata(reply.metadata)
        self.reply = reply
        entries = reply.entries
        if core.phase is fl.Phase.FIND:
            self.cursor = reply.cursor
            min_valid = node.min_valid if node.state is MemberState.RECOVERING else None
            self._carry_out(core.found(entries[0].optime if entries else None,
                                       entries[-1].optime if entries else None, min_valid=min_valid,
                                       **self._judging()))
        else:
            self._carry_out(core.batch(entries[-1].optime if entries else None, cursor_open=True))

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
        self.core.rollback_started(run.message)
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
                node.trace(f"rolled back to {common}; recovering until {min_valid}")
            self._rollback_ended(job)

        if not node.submit(WriteOp("rollback", run_commit, done)):
            self._rollback_ended(job, "writer queue full")

    def _rollback_ended(self, job: RollbackJob, failure: str = "") -> None:
        """Hands the run's ending (or `failure`: nothing changed) to the fetch loop and the replica core, in
        `SyncWorker._roll_back`'s order: the fetcher moves to the common point, then the core hears of it."""
        node, run = self.node, job.run
        ending = run.failed(failure) if failure or run.ending is None else run.ending
        message = ""
        match ending.outcome:
            case Outcome.ROLLED_BACK:
                pass
            case Outcome.REFUSED:
                node.trace(f"refusing to roll back: {ending.why}")
                message = f"cannot roll back against {run.source}: {ending.why}"
                node.refused_rollbacks += 1
            case _:
                node.trace(f"rollback against {run.source} {ending.outcome.value}, nothing changed: {ending.why}")
                message = f"rollback against {run.source} failed: {ending.why}"
        self.rollback = None
        common = ending.common_point if ending.outcome is Outcome.ROLLED_BACK else None
        actions = self.core.rolled_back(common, message)
        self._carry_out([a for a in actions if isinstance(a, fl.Moved)])
        node.tell(ev.RollbackEnded(run))
        self._carry_out([a for a in actions if not isinstance(a, fl.Moved)])
