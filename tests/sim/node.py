"""One simulated member: the product's decision cores driven by a step function.

`SimNode` is the replication runtime (`replset/replication.py`) with its
asyncio tasks turned into explicit state and deadlines, composed of the pure
cores: `Topology` (cluster view), `election` (votes, tally, timeouts),
`quorum` (commit point, write concern), `sync_source` (which member to pull
from) and `messages` (every heartbeat, vote and position report is built and
parsed by the product's own code). The fetcher, applier and rollback
(`sync/worker.py`) are in `tests.sim.fetcher`, the election run in
`tests.sim.candidate`.

Step interface, all in simulated time:

    deliver(now, packet)   a request or reply arrives
    tick(now)              deadlines that passed (timeouts, heartbeats, election timer)
    on_fsync_done(now)     the group commit's fsync finished
    next_wakeup()          the next local deadline, for the runner's event queue

Each step appends packets to `outbox` and may set `fsync_started`; the runner
moves them into the network and the disk queue. Work the runtime *spawns*
(`update_term` from a heartbeat request, a position report or fetcher metadata)
runs after the handler that spawned it, as in the event loop.

Ordering contracts kept from the runtime: a vote and a term are on disk before
the reply that grants or announces them; positions are reported and writes
acknowledged only after the fsync; a primary that learns of a higher term
stops taking writes before it persists the term.
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from oplog.errors import MongoError
from oplog.optime import NULL_OPTIME, OpTime, next_optime
from replset.config import ReplSetConfig
from replset.election import (
    LastVote,
    RandomSource,
    VoteRequest,
    decide_vote,
    election_timeout_ms,
    priority_takeover_delay_ms,
    wants_priority_takeover,
)
from replset.member import MemberState, check_transition
from replset.messages import (
    HeartbeatReply,
    HeartbeatRequest,
    ReplMetadata,
    heartbeat_reply,
    heartbeat_request,
    parse_heartbeat_reply,
    parse_heartbeat_request,
    parse_repl_metadata,
    parse_update_position,
    parse_vote_request,
    repl_metadata,
    update_position_command,
    vote_reply,
)
from replset.quorum import follower_commit_point, majority_commit_point
from replset.topology import Topology
from sync.sync_source import SyncSourceInputs, active_denylist, explain_sync_source, should_change_sync_source
from tests.sim import rpc
from tests.sim.candidate import ElectionRun
from tests.sim.clients import ClientResult, ClientService
from tests.sim.clock import SimClock
from tests.sim.disk import Disk, SimInvariantError
from tests.sim.fetcher import Fetcher
from tests.sim.model import ShellModel
from tests.sim.source import OplogSource
from tests.sim.writer import GroupCommit, WriteOp

INF = 1 << 62
MAX_OUTSTANDING_CALLS = 256


@dataclass(slots=True)
class Call:
    """A request this member sent and still waits for."""

    kind: str
    peer: int
    sent_ms: int
    deadline_ms: int


class SimNode:
    def __init__(self, member_id: int, config: ReplSetConfig, disk: Disk, clock: SimClock, rng: RandomSource,
                 now_g: int, next_rpc_id: Callable[[], int], model: ShellModel, *,
                 initiator: bool = False, trace: Callable[[str], None] | None = None) -> None:
        me = config.member_by_id(member_id)
        if me is None:
            raise ValueError(f"member {member_id} is not in the config")
        self.id, self.config, self.disk, self.clock, self.rng = member_id, config, disk, clock, rng
        self.host = me.host
        self.model = model
        self._next_rpc_id = next_rpc_id
        self._trace = trace
        self.now_g = now_g
        self.now = clock.local_ms(now_g)
        self.outbox: list[tuple[int, rpc.Request | rpc.Reply]] = []
        self.fsync_started = False
        # Durable state, as Node.start() recovers it.
        self.term = max(disk.term, disk.last.term)
        self.last_vote = disk.last_vote
        self.last_applied = disk.last          # last_committed_optime: applied = durable
        self.log_last = disk.last              # the LogWriter: ahead of last_applied inside a batch
        self.min_valid = disk.min_valid if disk.min_valid is not None and disk.last < disk.min_valid else None
        self.state = MemberState.STARTUP
        self.arbiter = me.arbiter_only
        self.set_state(MemberState.ARBITER if self.arbiter else self.data_state())
        # Volatile replication state (Replication.__init__ / start()).
        self.topology = Topology(config, member_id, self.now)
        self.commit_point = NULL_OPTIME
        self.learned_commit_point = NULL_OPTIME
        self.election_deadline = INF
        self.takeover_deadline = INF
        self.election: ElectionRun | None = None
        self.primary_term = -1
        self.initiator = initiator
        self.frozen_until = 0
        self.denylist: dict[str, int] = {}
        self.calls: dict[int, Call] = {}
        others = [m.id for m in config.members if m.id != member_id]
        self.hb_next = dict.fromkeys(others, self.now)
        self.hb_call: dict[int, int | None] = dict.fromkeys(others)
        self.report_needed = False
        self.report_call: int | None = None
        self.report_keepalive = self.now + self.election_timeout_base // 2
        self.refused_rollbacks = 0
        self.writer = GroupCommit(disk)
        self.source = OplogSource(self)
        self.clients = ClientService(self)
        self.fetcher: Fetcher | None = None
        self.deferred: list[Callable[[], None]] = []
        self.vote_lock_held = False
        self.vote_lock_waiting: collections.deque[Callable[[], bool]] = collections.deque()
        self.reset_election_timer()
        self.start_worker()

    # -- settings -----------------------------------------------------------------------------------

    @property
    def election_timeout_base(self) -> int:
        return self.config.settings.election_timeout_ms

    @property
    def heartbeat_timeout_ms(self) -> int:
        return self.config.settings.heartbeat_timeout_secs * 1000

    @property
    def await_data_ms(self) -> int:
        return max(100, min(5000, self.election_timeout_base // 2))

    @property
    def is_primary(self) -> bool:
        return self.state is MemberState.PRIMARY

    def trace(self, what: str) -> None:
        if self._trace is not None:
            self._trace(f"m{self.id} {self.state.name[:3]} t{self.term}: {what}")

    def member_id_of(self, host: str) -> int | None:
        member = self.config.member_by_host(host)
        return member.id if member is not None else None

    def data_state(self) -> MemberState:
        return MemberState.RECOVERING if self.min_valid is not None else MemberState.SECONDARY

    def set_state(self, new: MemberState) -> None:
        check_transition(self.state, new)
        if new is not self.state:
            self.trace(f"state -> {new.name}")
            self.state = new

    # -- the step interface -------------------------------------------------------------------------

    def _enter(self, now_g: int) -> None:
        self.now_g = now_g
        self.now = self.clock.local_ms(now_g)

    def _leave(self) -> None:
        while self.deferred:
            task = self.deferred.pop(0)
            task()
        self._pump()

    def deliver(self, now_g: int, packet: rpc.Request | rpc.Reply) -> None:
        self._enter(now_g)
        if isinstance(packet, rpc.Request):
            self._on_request(packet)
        else:
            self._on_reply(packet)
        self._leave()

    def tick(self, now_g: int) -> None:
        self._enter(now_g)
        now = self.now
        for rpc_id, call in list(self.calls.items()):
            if call.deadline_ms <= now and self.calls.pop(rpc_id, None) is not None:
                self._on_call_failed(rpc_id, call, refused=False, why="timed out")
        self.clients.expire_waiters()
        self.source.expire_parked()
        self._maybe_run_election_timer()
        if self.election is not None:
            self.election.tick(self)
        self._leave()

    def on_fsync_done(self, now_g: int) -> None:
        self._enter(now_g)
        batch, synced = self.writer.finish()
        if synced and self._trace is not None:
            self.trace(f"fsynced {len(synced)}: {synced[0].describe()} .. {synced[-1].describe()}")
        self._on_commit()
        for op in batch:
            op.done(op.error)
        self._leave()

    def next_wakeup(self) -> int:
        """The earliest local time at which `tick` has something to do."""
        times = [call.deadline_ms for call in self.calls.values()]
        times += [due for peer, due in self.hb_next.items() if self.hb_call[peer] is None]
        if self.election is None:
            times += [self.election_deadline, self.takeover_deadline]
        else:
            times.append(self.election.deadline_ms)
        times += [self.clients.next_wakeup(), self.source.next_wakeup()]
        if self.report_call is None:
            times.append(self.report_keepalive)
        if self.fetcher is not None:
            times.append(self.fetcher.next_wakeup())
        return min(times, default=INF)

    def _pump(self) -> None:
        """The work that follows any step: heartbeats and reports due, fetching, applying, writing."""
        self._send_due_heartbeats()
        self._maybe_report()
        if self.fetcher is not None:
            self.fetcher.pump()
        if self.election is not None:
            self.election.poll(self)
        if self.writer.maybe_start_batch():
            self.fsync_started = True

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
                    self.reply(req, self._on_heartbeat_request(req.body))
                case rpc.VOTE:
                    self._on_vote_request(req)
                case rpc.UPDATE_POSITION:
                    self.reply(req, self._on_update_position(req.body))
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
        call = self.calls.pop(reply.rpc_id, None)
        if call is None:
            return  # a duplicate, or the answer to a call we gave up on
        if reply.error is not None:
            self._on_call_failed(reply.rpc_id, call, refused=reply.error == rpc.REFUSED, why=reply.error)
            return
        match call.kind:
            case rpc.HEARTBEAT:
                self._on_heartbeat_reply(reply.rpc_id, call, reply.body)
            case rpc.VOTE:
                if self.election is not None:
                    self.election.on_vote_reply(self, reply.rpc_id, call.peer, reply.body)
            case rpc.UPDATE_POSITION:
                if self.report_call == reply.rpc_id:
                    self.report_call = None
            case rpc.FETCH | rpc.SCAN | rpc.REFETCH:
                if self.fetcher is not None:
                    self.fetcher.on_reply(reply.rpc_id, call, reply.body)

    def _on_call_failed(self, rpc_id: int, call: Call, *, refused: bool, why: str) -> None:
        match call.kind:
            case rpc.HEARTBEAT:
                self._on_heartbeat_failure(rpc_id, call.peer, refused=refused, why=why)
            case rpc.VOTE:
                if self.election is not None:
                    self.election.on_vote_failed(self, rpc_id)
            case rpc.UPDATE_POSITION:
                if self.report_call == rpc_id:
                    self.report_call = None
            case rpc.FETCH | rpc.SCAN | rpc.REFETCH:
                if self.fetcher is not None:
                    self.fetcher.on_failed(rpc_id, call, why)

    # -- heartbeats ---------------------------------------------------------------------------------

    def _send_due_heartbeats(self) -> None:
        config = self.config
        for peer, due in self.hb_next.items():
            if self.hb_call[peer] is not None or due > self.now:
                continue  # a call in flight, or (-1) its reply still being handled
            req = HeartbeatRequest(config.name, config.version, config.term, self.host, self.id, self.term)
            rpc_id = self.call(peer, rpc.HEARTBEAT, heartbeat_request(req), self.heartbeat_timeout_ms)
            if rpc_id is None:
                self.hb_next[peer] = self.now + config.settings.heartbeat_interval_ms
            self.hb_call[peer] = rpc_id

    def heartbeat_now(self) -> None:
        """The `_heartbeat_now` pulse: wakes the heartbeat loops that are waiting (not the busy ones)."""
        for peer in self.hb_next:
            if self.hb_call[peer] is None:
                self.hb_next[peer] = self.now

    def _heartbeat_done(self, peer: int) -> None:
        self.hb_call[peer] = None
        self.hb_next[peer] = self.now + self.config.settings.heartbeat_interval_ms

    def _on_heartbeat_reply(self, rpc_id: int, call: Call, body: Any) -> None:
        peer = call.peer
        try:
            if not body.get("ok"):
                raise MongoError(int(body.get("code", 1)), "heartbeat failed")
            reply = parse_heartbeat_reply(body)
            if reply.set_name != self.config.name:
                raise MongoError(185, "member is in another replica set")
        except MongoError as exc:
            self._heartbeat_done(peer)
            self._heartbeat_failed(peer, refused=False, why=str(exc))
            return
        outcome = self.topology.on_heartbeat_reply(peer, reply, float(self.now - call.sent_ms), self.now,
                                                   self.term)

        def rest() -> None:  # after `await self.update_term(...)`; the heartbeat loop waits for it
            self._heartbeat_done(peer)
            if outcome.primary_seen and not self.is_primary:
                self.reset_election_timer()
            if not self.is_primary:
                self.learn_commit_point(reply.commit_point)
            elif not self.model.has("heartbeat-positions-ignored"):
                self.advance_commit_point()  # the reply may have moved the member's optimes
                self.clients.check_waiters()
            self._maybe_priority_takeover(peer, reply)
            self._maybe_elect_after_initiate()
            self.on_topology_change()
            self._check_primary_liveness()

        if outcome.newer_term is not None:
            self.hb_call[peer] = -1  # busy until the term is on disk
            self.update_term(outcome.newer_term, f"a heartbeat from m{peer}", then=rest)
        else:
            rest()

    def _on_heartbeat_failure(self, rpc_id: int, peer: int, *, refused: bool, why: str) -> None:
        if self.hb_call.get(peer) == rpc_id:
            self._heartbeat_done(peer)
        self._heartbeat_failed(peer, refused=refused, why=why)

    def _heartbeat_failed(self, peer: int, *, refused: bool, why: str) -> None:
        if self.topology.on_heartbeat_failure(peer, self.now, refused=refused, message=why):
            self.trace(f"m{peer} is DOWN ({why})")
            self.on_topology_change()
        self._check_primary_liveness()

    def _on_heartbeat_request(self, body: Any) -> dict[str, Any]:
        req = parse_heartbeat_request(body)
        config = self.config
        if req.set_name != config.name:
            raise MongoError(185, "set name does not match")
        self.topology.on_heartbeat_request(req.sender_id, self.now, req.config_version, req.config_term)
        self._maybe_elect_after_initiate()
        if req.term > self.term:
            self.spawn(lambda: self.update_term(req.term, f"a heartbeat request from m{req.sender_id}"))
        sender = self.topology.members.get(req.sender_id)
        if sender is not None and req.term > sender.term:
            self.heartbeat_now()
        primary_id = self.topology.primary_id(self.state, self.term)
        return heartbeat_reply(HeartbeatReply(
            set_name=config.name, state=self.state, term=self.term, applied=self.last_applied,
            durable=self.last_applied, config_version=config.version, config_term=config.term,
            sync_source=self.sync_source_host, commit_point=self.commit_point,
            primary_id=-1 if primary_id is None else primary_id))

    def on_topology_change(self) -> None:
        if self.fetcher is not None:
            self.fetcher.on_topology_change()
        self._maybe_change_sync_source()

    def _check_primary_liveness(self) -> None:
        if not self.is_primary or len(self.config.voters) <= 1:
            return
        if not self.topology.sees_majority(self.now, self.election_timeout_base):
            self.step_down_now("can't see a majority of the set's voting members")

    # -- terms, votes, elections ---------------------------------------------------------------------

    def spawn(self, task: Callable[[], None]) -> None:
        self.deferred.append(task)

    # The runtime's `_vote_lock`: a vote, a term update and an election's own vote are decided and
    # fsynced one at a time; the in-memory term moves only once the fsync completed.

    def with_vote_lock(self, section: Callable[[], bool]) -> None:
        """Runs `section` holding the lock; it returns True when it started a persist (which releases it)."""
        if self.vote_lock_held:
            self.vote_lock_waiting.append(section)
            return
        self.vote_lock_held = True
        if not section():
            self._release_vote_lock()

    def _release_vote_lock(self) -> None:
        self.vote_lock_held = False
        if self.vote_lock_waiting:
            self.with_vote_lock(self.vote_lock_waiting.popleft())

    def persist_term(self, term: int, last_vote: LastVote | None, then: Callable[[], None]) -> bool:
        """Node.persist_term: through the group-commit writer, so it waits for the batch ahead of it."""
        def done(error: BaseException | None) -> None:
            self.disk.persist_term(term, last_vote)
            if term > self.term and self.is_primary and not self.model.has("term-adopted-while-becoming-primary"):
                self.step_down_now(f"adopted term {term}")  # became primary while this term was being persisted
            self.term = max(self.term, term)
            self.last_vote = last_vote
            try:
                then()
            finally:
                self._release_vote_lock()

        if not self.writer.submit(WriteOp("term", lambda: [], done)):
            raise SimInvariantError(f"m{self.id}: the writer queue is full; the term cannot be persisted")
        return True

    def update_term(self, term: int, why: str, then: Callable[[], None] | None = None) -> None:
        def after() -> None:
            self.reset_election_timer()
            if then is not None:
                then()

        if term <= self.term:
            if then is not None:
                then()
            return
        if self.is_primary:
            self.step_down_now(f"saw term {term} in {why}")

        def section() -> bool:
            if term > self.term:
                return self.persist_term(term, self.last_vote, after)
            after()
            return False

        self.with_vote_lock(section)

    def _on_vote_request(self, req: rpc.Request) -> None:
        vote_req = parse_vote_request(req.body)
        self.with_vote_lock(lambda: self._decide_vote(req, vote_req))

    def _decide_vote(self, req: rpc.Request, vote_req: VoteRequest) -> bool:
        config = self.config
        me = config.member_by_id(self.id)
        candidate = config.member_by_id(vote_req.candidate_id)
        primary_id = self.topology.primary_id(self.state, self.term)
        primary = config.member_by_id(primary_id) if primary_id is not None else None
        healthy_primary_ge = (primary is not None and candidate is not None and primary.id != candidate.id
                              and primary.priority >= candidate.priority)
        response, vote = decide_vote(
            vote_req, set_name=config.name, my_term=self.term, my_last_applied=self.last_applied,
            config_version=config.version, config_term=config.term, last_vote=self.last_vote,
            i_am_arbiter=me is not None and me.arbiter_only, healthy_primary_priority_ge_candidate=healthy_primary_ge)
        if response.term > self.term and self.is_primary:
            self.step_down_now(f"a vote request for term {response.term}")

        def answer() -> None:
            if vote is not None:
                self.reset_election_timer()
                self.trace(f"voted for m{vote_req.candidate_id} in term {vote_req.term}")
            self.reply(req, vote_reply(response))

        if response.term > self.term or vote is not None:
            return self.persist_term(response.term, vote if vote is not None else self.last_vote, answer)
        answer()
        return False

    def reset_election_timer(self) -> None:
        self.election_deadline = self.now + election_timeout_ms(self.election_timeout_base, self.rng)

    def _maybe_run_election_timer(self) -> None:
        if self.election is not None:
            return  # the timer loop is inside run_election
        if min(self.election_deadline, self.takeover_deadline) > self.now:
            return
        takeover = self.takeover_deadline <= self.now
        self.takeover_deadline = INF
        self.reset_election_timer()
        if self.electable():
            self.election = ElectionRun.start(self, "priorityTakeover" if takeover else "electionTimeout")

    def electable(self) -> bool:
        me = self.config.member_by_id(self.id)
        return (self.state is MemberState.SECONDARY and self.election is None and me is not None
                and me.electable and me.votes > 0 and self.now >= self.frozen_until
                and self.last_applied != NULL_OPTIME)

    def _maybe_priority_takeover(self, peer: int, reply: HeartbeatReply) -> None:
        if reply.state is not MemberState.PRIMARY or self.state is not MemberState.SECONDARY:
            return
        if self.takeover_deadline == INF and wants_priority_takeover(
                self.config, self.id, peer, my_applied=self.last_applied, primary_applied=reply.applied):
            timeout = election_timeout_ms(self.election_timeout_base, self.rng)
            self.takeover_deadline = self.now + priority_takeover_delay_ms(self.config, self.id, timeout)

    def _maybe_elect_after_initiate(self) -> None:
        if not self.initiator or self.state is not MemberState.SECONDARY:
            return
        if self.topology.majority_has_config():
            self.initiator = False
            self.election_deadline = self.now  # call_election_now

    def step_down_now(self, why: str) -> None:
        if not self.is_primary:
            return
        self.trace(f"stepping down: {why}")
        self.set_state(MemberState.SECONDARY)
        self.clients.fail_waiters(189)
        self.reset_election_timer()
        self.start_worker()

    def became_primary(self, term: int) -> None:
        self.primary_term = term
        self.set_state(MemberState.PRIMARY)
        self.takeover_deadline = INF
        self.trace(f"became primary in term {term}")
        self.advance_commit_point()
        self.heartbeat_now()

    # -- commit point and positions -----------------------------------------------------------------

    def _on_commit(self) -> None:
        """Node._on_commit: the fsync made the batch durable and visible."""
        self.last_applied = self.log_last = self.disk.last
        self.source.answer_parked()
        self.on_local_commit()

    def on_local_commit(self) -> None:
        if self.is_primary:
            self.advance_commit_point()
        else:
            self._maybe_end_recovering()
            self.commit_point = follower_commit_point(self.learned_commit_point, self.last_applied,
                                                      self.commit_point)
            self.report_needed = True
        self.clients.check_waiters()
        if self.election is not None:
            self.election.on_local_commit(self)

    def _maybe_end_recovering(self) -> None:
        if (self.state is MemberState.RECOVERING and self.min_valid is not None
                and self.last_applied >= self.min_valid):
            self.min_valid = None
            self.set_state(MemberState.SECONDARY)

    def advance_commit_point(self) -> None:
        _applied, durable = self.topology.positions(self.last_applied, self.last_applied)
        self.commit_point = majority_commit_point(self.config, durable, self.term, self.commit_point)

    def learn_commit_point(self, commit_point: OpTime) -> None:
        if commit_point > self.learned_commit_point:
            self.learned_commit_point = commit_point
            self.commit_point = follower_commit_point(commit_point, self.last_applied, self.commit_point)

    def _on_update_position(self, body: Any) -> dict[str, Any]:
        positions, term = parse_update_position(body)
        if term > self.term:
            if self.model.has("positions-counted-before-term"):
                self.spawn(lambda: self.update_term(term, "replSetUpdatePosition"))
            else:
                self.update_term(term, "replSetUpdatePosition")  # a stale primary counts nothing from it
        moved = False
        for pos in positions:
            if pos.member_id != self.id:
                moved = self.topology.on_position(pos, self.now) or moved
        if moved:
            if self.is_primary:
                self.advance_commit_point()
                self.clients.check_waiters()
            else:
                self.report_needed = True
        return {"ok": 1.0}

    def on_sync_source_metadata(self, metadata: dict[str, Any]) -> None:
        meta = parse_repl_metadata(metadata)
        if meta is None:
            return
        if meta.term > self.term:
            self.spawn(lambda: self.update_term(meta.term, "sync source metadata"))
        self.learn_commit_point(meta.commit_point)

    def metadata_document(self) -> dict[str, Any]:
        primary_id = self.topology.primary_id(self.state, self.term)
        meta = ReplMetadata(self.term, self.commit_point, -1 if primary_id is None else primary_id)
        return {"$replData": repl_metadata(meta, self.config.version, self.config.term)}

    def _maybe_report(self) -> None:
        if self.report_call is not None or not (self.report_needed or self.now >= self.report_keepalive):
            return
        self.report_needed = False
        self.report_keepalive = self.now + self.election_timeout_base // 2
        source = self.member_id_of(self.sync_source_host) if self.sync_source_host else None
        if self.is_primary or source is None:
            return
        positions = self.topology.positions_to_report(self.last_applied, self.last_applied)
        self.report_call = self.call(source, rpc.UPDATE_POSITION, update_position_command(positions, self.term),
                                     self.heartbeat_timeout_ms)

    # -- the sync worker ----------------------------------------------------------------------------

    @property
    def sync_source_host(self) -> str:
        return self.fetcher.sync_source or "" if self.fetcher is not None else ""

    def start_worker(self) -> None:
        if self.fetcher is None and self.state in (MemberState.SECONDARY, MemberState.RECOVERING):
            self.fetcher = Fetcher(self)

    def deny(self, host: str, for_ms: int) -> None:
        self.denylist[host] = self.now + for_ms

    def sync_inputs(self, last_fetched: OpTime) -> SyncSourceInputs:
        return self.topology.sync_source_inputs(
            last_fetched=last_fetched, my_state=self.state, my_term=self.term, forced_host=None,
            denylist=active_denylist(self.denylist, self.now), now_ms=self.now)

    def choose_sync_source(self, last_fetched: OpTime) -> str | None:
        if self.state not in (MemberState.SECONDARY, MemberState.RECOVERING):
            return None
        return explain_sync_source(self.sync_inputs(last_fetched)).host

    def _maybe_change_sync_source(self) -> None:
        fetcher = self.fetcher
        if fetcher is None or not fetcher.sync_source:
            return
        decision = should_change_sync_source(self.sync_inputs(fetcher.last_fetched), fetcher.sync_source)
        if decision.change:
            self.trace(f"changing sync source: {decision.reason}")
            fetcher.request_change()

    def check_invariants(self) -> None:
        """Raised after every step by the runner: what must hold whatever the faults."""
        if self.commit_point > self.last_applied:
            raise SimInvariantError(f"m{self.id}: commit point {self.commit_point} is past the last applied "
                                    f"entry {self.last_applied}")
        if self.is_primary and self.fetcher is not None:
            raise SimInvariantError(f"m{self.id}: a primary is still fetching")
        if self.is_primary and self.term != self.primary_term:
            raise SimInvariantError(f"m{self.id}: PRIMARY of term {self.primary_term} runs in term {self.term}")
