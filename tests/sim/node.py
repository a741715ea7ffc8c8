"""One simulated member: the product's replica core (`replset.replica.Replica`) in a simulated shell.

`SimNode` is to the simulator what `replset.replication` is to the asyncio
member: it feeds the core events (packets, timer ticks, fsync completions)
with the member's drifting local clock, and carries out the actions the core
returns (persist through the group commit, send packets, answer votes, write
the "new primary" no-op, start and stop the fetcher, wake waiting clients).
Every decision about terms, votes, elections, the commit point, heartbeats,
position reports and write concern is the core's; the simulator holds none.

Step interface, all in simulated time:

    deliver(now, packet)   a request or reply arrives
    tick(now)              deadlines that passed (the core's, the fetcher's, the journal's)
    on_fsync_done(now)     the journal flush finished
    next_wakeup()          the next local deadline, for the runner's event queue

Each step appends packets to `outbox` and may set `fsync_started`; the runner
moves them into the network and the disk queue.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from base.config import ReplSetConfig
from base.errors import MongoError
from base.member import MemberState
from base.messages import parse_repl_metadata, repl_metadata
from base.optime import OpTime, next_optime
from replset import actions as act
from replset import events as ev
from replset.election import RandomSource
from replset.replica import NEVER, Replica
from replset.topology import Topology
from tests.sim import rpc
from tests.sim.clients import ClientResult, ClientService
from tests.sim.clock import SimClock
from tests.sim.disk import Disk, Entry, EntryKind, SimInvariantError
from tests.sim.fetcher import Fetcher
from tests.sim.source import OplogSource
from tests.sim.writer import DURABLE, GroupCommit, WriteOp

INF = NEVER
MAX_OUTSTANDING_CALLS = 256
DRAIN_TIMEOUT_MS = 5000  # SyncWorker.stop(drain=True): STOP_TIMEOUT_S

_KINDS = {act.CallKind.HEARTBEAT: rpc.HEARTBEAT, act.CallKind.VOTE: rpc.VOTE,
          act.CallKind.POSITIONS: rpc.UPDATE_POSITION}


@dataclass(slots=True)
class Call:
    """A request the fetcher sent and still waits for (the core tracks its own calls)."""

    kind: str
    peer: int
    sent_ms: int
    deadline_ms: int


class SimNode:
    def __init__(self, member_id: int, config: ReplSetConfig, disk: Disk, clock: SimClock, rng: RandomSource,
                 now_g: int, next_rpc_id: Callable[[], int], *,
                 initiator: bool = False, trace: Callable[[str], None] | None = None) -> None:
        me = config.member_by_id(member_id)
        if me is None:
            raise ValueError(f"member {member_id} is not in the config")
        self.id, self.config, self.disk, self.clock = member_id, config, disk, clock
        self.host = me.host
        self._next_rpc_id = next_rpc_id
        self._trace = trace
        self.now_g = now_g
        self.now = clock.local_ms(now_g)
        self.outbox: list[tuple[int, rpc.Request | rpc.Reply]] = []
        self.fsync_started = False
        self.log_last = disk.last              # the LogWriter: ahead of the applied position inside a batch
        min_valid = disk.min_valid
        if min_valid is not None and disk.last >= min_valid and disk.index_of(min_valid) is not None:
            min_valid = None  # as Node.start(): reached, and that very entry (not one of another branch)
        # Durable state, as Node.start() recovers it.
        self.core = Replica(me=self.host, config=config, state=MemberState.STARTUP,
                            term=max(disk.term, disk.last.term), last_vote=disk.last_vote, applied=disk.last,
                            durable=disk.last, min_valid=min_valid, rng=rng, now=self.now)
        self.refused_rollbacks = 0
        self.writer = GroupCommit(disk)
        self.source = OplogSource(self)
        self.clients = ClientService(self)
        self.fetcher: Fetcher | None = None
        self.calls: dict[int, Call] = {}          # the fetcher's calls
        self.core_calls: dict[int, int] = {}      # rpc id -> the core's call id
        self.drain_deadline: int | None = None
        self.pending: list[act.Action] = []       # what `Replica.step` returned and is not carried out yet
        self.tell(ev.Started(initiator, MemberState.ARBITER if me.arbiter_only else self.core.data_state()))
        self._carry_out()

    # -- what the core knows ------------------------------------------------------------------------

    @property
    def state(self) -> MemberState:
        return self.core.state

    @property
    def term(self) -> int:
        return self.core.term

    @property
    def last_vote(self) -> Any:
        return self.core.last_vote

    @property
    def commit_point(self) -> OpTime:
        return self.core.commit_point

    @property
    def last_applied(self) -> OpTime:
        return self.core.applied

    @property
    def min_valid(self) -> OpTime | None:
        return self.core.min_valid

    @property
    def topology(self) -> Topology:
        assert self.core.topology is not None
        return self.core.topology

    @property
    def is_primary(self) -> bool:
        return self.core.is_primary

    @property
    def await_data_ms(self) -> int:
        return self.core.await_data_ms

    @property
    def heartbeat_timeout_ms(self) -> int:
        return self.core.heartbeat_timeout_ms

    @property
    def sync_source_host(self) -> str:
        return self.fetcher.sync_source or "" if self.fetcher is not None else ""

    def trace(self, what: str) -> None:
        if self._trace is not None:
            self._trace(f"m{self.id} {self.state.name[:3]} t{self.term}: {what}")

    def member_id_of(self, host: str) -> int | None:
        return self.core.member_id_of(host)

    # -- the step interface -------------------------------------------------------------------------

    def _enter(self, now_g: int) -> None:
        self.now_g = now_g
        self.now = max(self.now, self.clock.local_ms(now_g))

    def deliver(self, now_g: int, packet: rpc.Request | rpc.Reply) -> None:
        self._enter(now_g)
        if isinstance(packet, rpc.Request):
            self._on_request(packet)
        else:
            self._on_reply(packet)
        self._settle()

    def tick(self, now_g: int) -> None:
        self._enter(now_g)
        now = self.now
        for rpc_id, call in list(self.calls.items()):
            if call.deadline_ms <= now and self.calls.pop(rpc_id, None) is not None:
                if self.fetcher is not None:
                    self.fetcher.on_failed(rpc_id, call, "timed out")
        self.tell(ev.Tick())
        self.source.expire_parked()
        self._settle()

    def on_fsync_done(self, now_g: int) -> None:
        self._enter(now_g)
        rolling_back = self.writer.rollback is not None
        released, synced = self.writer.flushed()
        if synced and self._trace is not None:
            self.trace(f"fsynced {len(synced)}: {synced[0].describe()} .. {synced[-1].describe()}")
        if rolling_back and self.writer.rollback is None:   # the rollback's transaction committed
            self.log_last = self.disk.last
            self.source.answer_parked()
            self.tell(ev.LocalCommit(self.disk.last))
        durable = self.disk.oplog[self.disk.durable_len - 1].optime if self.disk.durable_len else None
        if durable is not None:
            self.tell(ev.LocalDurable(durable))
        self._carry_out()
        for op in released:
            op.done(op.error)
            self._carry_out()
        self._settle()

    def _commit(self) -> None:
        """The group commit's transactions that may run now: each commits at once (its entries applied,
        served, reported), and its ops not waiting for the journal are answered."""
        while (batch := self.writer.commit_next(self.now)) is not None:
            self.log_last = self.disk.last
            self.source.answer_parked()
            self.tell(ev.LocalCommit(self.disk.last))
            self._carry_out()
            for op in batch:
                if op.kind not in DURABLE or op.error is not None:
                    op.done(op.error)
                    self._carry_out()

    def next_wakeup(self) -> int:
        """The earliest local time at which `tick` has something to do."""
        times = [call.deadline_ms for call in self.calls.values()]
        times += [self.core.next_deadline(), self.source.next_wakeup()]
        journal_due = self.writer.next_deadline()
        if journal_due is not None:
            times.append(journal_due)
        if self.fetcher is not None:
            times.append(self.fetcher.next_wakeup())
        if self.drain_deadline is not None:
            times.append(self.drain_deadline)
        return min(times, default=INF)

    def _settle(self) -> None:
        """The work that follows any step: the core's actions, fetching, applying, writing."""
        self._carry_out()
        for _ in range(100):
            if self.fetcher is not None:
                self.fetcher.pump()
            self._maybe_drained()
            self._carry_out()
            self._commit()
            if not self.core.actions and not self.pending and (not self.writer.queue or self.writer.rollback):
                break
        if self.writer.start_flush(self.now):
            self.fsync_started = True

    # -- carrying out the core's actions --------------------------------------------------------------

    def tell(self, event: ev.Event) -> None:
        """Hands `event` to the core; its actions are carried out in order with the next `_carry_out`."""
        self.pending += self.core.step(self.now, event)

    def _carry_out(self) -> None:
        while actions := self._take_actions():
            for action in actions:
                self._do(action)

    def _take_actions(self) -> list[act.Action]:
        actions, self.pending = self.pending + self.core.take_actions(), []
        return actions

    def ask(self, event: Callable[[object], ev.Event]) -> Any:
        """Steps a request the core answers at once (`Answer`); returns the answer's body."""
        token = object()
        actions = self.core.step(self.now, event(token))
        answer = next(a for a in actions if isinstance(a, act.Answer) and a.reply_to is token)
        self.pending += [a for a in actions if a is not answer]
        return answer.body

    def _answer_at_once(self, req: rpc.Request, event: ev.Event) -> None:
        """A heartbeat or a position report is answered as it is handled, before the actions it caused."""
        actions = self.core.step(self.now, event)
        answer = next(a for a in actions if isinstance(a, act.Answer) and a.reply_to is req)
        self.reply(req, answer.body)
        self.pending += [a for a in actions if a is not answer]

    def _do(self, action: act.Action) -> None:
        core = self.core
        match action:
            case act.Send(to=to, kind=kind, body=body, call=call):
                rpc_id = self._next_rpc_id()
                self.core_calls[rpc_id] = call
                self.outbox.append((to, rpc.Request(rpc_id, self.id, _KINDS[kind], body)))
            case act.Persist(token=token):
                # As the member's group commit does: the transaction writes the term and vote the core
                # holds when it runs, and they are durable once its fsync completes.
                written: list[tuple[int, Any]] = []

                def write(written: list[tuple[int, Any]] = written) -> list[Entry]:
                    written.append((core.term, core.last_vote))
                    return []

                def persisted(error: BaseException | None, token: int = token,
                              written: list[tuple[int, Any]] = written) -> None:
                    self.disk.persist_term(*written[0])
                    self.tell(ev.Persisted(token))

                if not self.writer.submit(WriteOp("term", write, persisted)):
                    raise SimInvariantError(f"m{self.id}: the writer queue is full; the term cannot be persisted")
            case act.Answer(reply_to=request, body=body):
                assert isinstance(request, rpc.Request)
                self.reply(request, body)
            case act.StateChanged(new=new):
                self.trace(f"state -> {new.name}")
                if new is MemberState.PRIMARY:
                    self.trace(f"became primary in term {core.term}")
            case act.StartFetching():
                if self.fetcher is None:
                    self.fetcher = Fetcher(self)
            case act.StopFetching(drain=drain):
                fetcher = self.fetcher
                if fetcher is not None:
                    fetcher.stop_fetching()
                if drain:
                    self.drain_deadline = self.now + DRAIN_TIMEOUT_MS
                else:
                    self.fetcher = None
            case act.ChangeSyncSource(reason=reason):
                if self.fetcher is not None:
                    self.trace(f"changing sync source: {reason}")
                    self.fetcher.request_change()
            case act.WriteNoop(term=term):
                self._write_new_primary_entry(term)
            case act.Wake(waiter=request, error=error):
                self.clients.wake(request, error)
            case act.CheckMinValid(optime=optime):
                self.tell(ev.MinValidChecked(optime, self.disk.index_of(optime) is not None))
            case act.ForgetMinValid(optime=optime):
                if self.disk.min_valid == optime:
                    self.disk.min_valid, self.disk.refetched_keys = None, frozenset()
            case act.Resync(reason=reason):
                raise SimInvariantError(f"m{self.id} needs a resync ({reason}); the simulator has no initial sync")
            case act.TopologyChanged():
                if self.fetcher is not None:
                    self.fetcher.on_topology_change()
            case act.CloseOplogCursors():
                self.source.kill_cursors()
            case act.Flush():
                self.writer.want_flush()
            case act.PositionsMoved() | act.AdoptConfig():
                pass  # the config is fixed for a run
            case act.TermRefused(term=term, source=source):
                self.trace(f"refused term {term} from {source}")
            case _:
                raise SimInvariantError(f"m{self.id}: the core asked for {action!r}, which this shell cannot do")

    def _maybe_drained(self) -> None:
        if self.drain_deadline is None:
            return
        fetcher = self.fetcher
        drained = fetcher is None or fetcher.drained()
        if not drained and self.now < self.drain_deadline:
            return
        self.drain_deadline = None
        self.fetcher = None  # the applier is cancelled; anything still buffered is dropped
        self.tell(ev.SyncDrained(drained))

    def _write_new_primary_entry(self, term: int) -> None:
        core = self.core

        def run() -> list[Entry]:
            if not core.may_write_noop(term):
                raise MongoError(189, f"term changed to {core.term} before becoming primary in {term}")
            return [Entry(self.new_optime(term), EntryKind.NEW_PRIMARY)]

        def done(error: BaseException | None) -> None:
            self.tell(ev.NoopWritten(term, error is None))

        if not self.submit(WriteOp("noop", run, done)):
            self.tell(ev.NoopWritten(term, False))

    def submit(self, op: WriteOp) -> bool:
        return self.writer.submit(op)

    def new_id(self) -> int:
        return self._next_rpc_id()

    def new_optime(self, term: int) -> OpTime:
        """LogWriter: the next optime, from our wall clock, strictly after the last one we wrote."""
        optime = next_optime(self.log_last, self.clock.wall_secs(self.now_g), term)
        self.log_last = optime
        return optime

    # -- RPC plumbing -------------------------------------------------------------------------------

    def call(self, peer: int, kind: str, body: Any, timeout_ms: int) -> int | None:
        """A call of the fetcher's."""
        if len(self.calls) >= MAX_OUTSTANDING_CALLS:
            return None
        rpc_id = self._next_rpc_id()
        self.calls[rpc_id] = Call(kind, peer, self.now, self.now + timeout_ms)
        self.outbox.append((peer, rpc.Request(rpc_id, self.id, kind, body)))
        return rpc_id

    def reply(self, request: rpc.Request, body: Any, error: str | None = None) -> None:
        self.outbox.append((request.src, rpc.Reply(request.rpc_id, self.id, request.kind, body, error)))

    def _on_request(self, req: rpc.Request) -> None:
        try:
            match req.kind:
                case rpc.HEARTBEAT:
                    self._answer_at_once(req, ev.HeartbeatIn(req.body, req))
                case rpc.VOTE:
                    self.tell(ev.VoteRequestIn(req.body, req))
                case rpc.UPDATE_POSITION:
                    self._answer_at_once(req, ev.PositionsIn(req.body, req))
                case rpc.FETCH:
                    self.source.on_fetch_request(req)
                case rpc.SCAN | rpc.REFETCH:
                    self.reply(req, self.source.serve_rollback_read(req))
                case rpc.WRITE:
                    self.clients.on_write(req)
                case rpc.READ:
                    self.clients.on_read(req)
                case _:
                    raise MongoError(59, f"no such command {req.kind}")
        except MongoError as exc:
            if req.kind in (rpc.WRITE, rpc.READ):
                self.reply(req, ClientResult(exc.code, primary_hint=self.clients.primary_hint()))
            else:
                self.reply(req, None, error=str(exc.code))

    def _on_reply(self, reply: rpc.Reply) -> None:
        core_call = self.core_calls.pop(reply.rpc_id, None)
        if core_call is not None:
            if reply.error is not None:
                self.tell(ev.CallFailed(core_call, refused=reply.error == rpc.REFUSED, why=reply.error))
            else:
                self.tell(ev.Replied(core_call, reply.body))
            return
        call = self.calls.pop(reply.rpc_id, None)
        if call is None or self.fetcher is None:
            return  # a duplicate, or the answer to a call we gave up on
        if reply.error is not None:
            self.fetcher.on_failed(reply.rpc_id, call, reply.error)
        else:
            self.fetcher.on_reply(reply.rpc_id, call, reply.body)

    # -- what the fetcher asks of the member ----------------------------------------------------------

    def deny(self, host: str, for_ms: int) -> None:
        self.tell(ev.Deny(host, for_ms))

    def choose_sync_source(self, last_fetched: OpTime) -> str | None:
        return self.core.choose_sync_source(self.now, last_fetched)

    def on_sync_source_metadata(self, metadata: dict[str, Any]) -> None:
        meta = parse_repl_metadata(metadata)
        if meta is not None:
            self.tell(ev.SourceMetadata(meta))

    def metadata_document(self) -> dict[str, Any]:
        return {"$replData": repl_metadata(self.core.metadata(), self.config.version, self.config.term)}

    def set_state(self, new: MemberState) -> None:
        self.tell(ev.EnterState(new))

    def check_invariants(self) -> None:
        """Raised after every step by the runner: what must hold whatever the faults."""
        core = self.core
        if core.commit_point > core.applied:
            raise SimInvariantError(f"m{self.id}: commit point {core.commit_point} is past the last applied "
                                    f"entry {core.applied}")
        if self.is_primary and self.fetcher is not None:
            raise SimInvariantError(f"m{self.id}: a primary is still fetching")
        if self.is_primary and core.term != core.primary_term:
            raise SimInvariantError(f"m{self.id}: PRIMARY of term {core.primary_term} runs in term {core.term}")
