"""The replica core: one member's replication state machine, without I/O.

Theory of operation
-------------------
`Replica` owns what a member decides about replication: its term and last
vote, its member state, the commit point, the cluster view (`Topology`), the
deadlines (election timer, priority takeover, heartbeats, position reports,
catch-up, write-concern timeouts), the election in progress (`Candidacy`), the
write-concern waiters and the sync-source choice. Like etcd's raft (`Step` ->
`Ready`) and MongoDB's TopologyCoordinator, it is driven from outside: every
event is a method call that takes the shell's clock value `now` (milliseconds,
monotonic), and returns nothing but appends `replset.actions` to
`self.actions`, which the shell takes with `take_actions()` and carries out in
order:

    shell --event(now, ...)--> Replica --actions--> shell: persist, send, answer,
        start/stop fetching, write the "new primary" no-op, wake waiters, ...
    shell --persisted / reply / call_failed / noop_written / sync_drained--> Replica

No asyncio, no clock, no randomness of its own (a seeded `RandomSource` is
passed in), no sockets, no storage. The asyncio member (`replset.replication`)
and the deterministic simulator (`tests/sim`) are two shells around this one
class; a seed that finds a bug finds it here.

Ordering contracts
------------------
* A term and a vote move in memory when they are decided (as in MongoDB's
  TopologyCoordinator), and are persisted (`Persist`, fsynced) before anything
  that relies on them being durable: the `Answer` that grants the vote, the
  candidate's vote requests. Everything else - heartbeat replies, position
  reports - carries the new term at once, so an old primary counts nothing we
  acknowledge after we voted for its successor.
* A term beyond `MAX_TERM` is never adopted, not even in memory: it is checked
  before anything moves (a primary does not step down for it), because it could
  not be persisted and no election could follow it. The parsers refuse such a
  term where it enters; this is the core's own guard (`TermRefused`, once).
* A primary that learns of a higher term steps down at once, and counts no
  positions from the report that told it.
* A member becoming primary writes its "new primary" no-op only while its term
  is still the election's: a vote for a newer term granted meanwhile ends the
  candidacy (two primaries must never stamp the same term).
* `w: N` only counts members whose position is in the write's term: a member
  on a newer primary's branch reports an optime that sorts above the write
  without holding it.
"""

from __future__ import annotations

__layer__ = "core"  # pure: no I/O, clock or randomness (tests/unit/test_layering.py)

import dataclasses
import datetime
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from base.config import ReplSetConfig
from base.errors import MongoError
from base.member import MemberState, check_transition
from base.messages import (
    HeartbeatReply,
    HeartbeatRequest,
    ReplMetadata,
    heartbeat_reply,
    heartbeat_request,
    parse_heartbeat_reply,
    parse_heartbeat_request,
    parse_update_position,
    parse_vote_request,
    position_report,
    update_position_command,
    vote_reply,
)
from base.numbers import MAX_TERM
from base.optime import NULL_OPTIME, OpTime
from base.votes import LastVote, VoteResponse
from replset.actions import (
    Action,
    AdoptConfig,
    Answer,
    CallKind,
    ChangeSyncSource,
    CheckMinValid,
    CloseOplogCursors,
    Flush,
    ForgetMinValid,
    Persist,
    PositionsMoved,
    Resync,
    Send,
    StartFetching,
    StateChanged,
    StopFetching,
    TermRefused,
    TopologyChanged,
    Wake,
    WriteNoop,
)
from replset.candidacy import Candidacy
from replset.election import (
    RandomSource,
    config_is_older,
    decide_vote,
    election_timeout_ms,
    priority_takeover_delay_ms,
    wants_priority_takeover,
)
from replset.events import (
    AwaitWriteConcern,
    CallFailed,
    ConfigInstalled,
    Deny,
    EnterState,
    Event,
    FetchCarriesReports,
    FetcherMoved,
    FreezeAsked,
    GiveUpWaiting,
    HeartbeatIn,
    HoldingsChanged,
    InitialSyncEnded,
    LocalCommit,
    LocalDurable,
    MinValidChecked,
    MinValidSet,
    NoopWritten,
    Persisted,
    PositionsIn,
    PositionsWanted,
    Recovered,
    Replied,
    ResyncBegan,
    RollbackEnded,
    RollbackStarted,
    ShutDown,
    SourceMetadata,
    Started,
    StepDownAsked,
    StepUpAsked,
    SyncDrained,
    SyncFromAsked,
    Tick,
    VoteRequestIn,
)
from replset.quorum import follower_commit_point, majority_commit_point, write_concern_satisfied
from replset.topology import Topology
from replset.waiters import WaiterTable
from replset.write_concern import MAJORITY, WriteConcern, check_satisfiable, timeout_error
from sync.fetching import DIVERGED_DENY_MS, ERROR_DENY_MS
from sync.rollback_flow import Outcome, RollbackRun
from sync.sync_source import SyncSourceInputs, active_denylist, explain_sync_source, should_change_sync_source

NEVER = 1 << 62
MAX_WAITERS = 100_000
# A secondary's report waits this long at most for the journal flush that follows an applied batch, so
# one report usually carries both positions instead of two reports a batch.
REPORT_LINGER_MS = 2

STEPPED_DOWN = "Primary stepped down while waiting for replication"
STALL_LIMIT_MIN_MS = 1000   # a source that gives nothing new for max(this, 2 heartbeats) while others are ahead


class NoConfig(MongoError):
    """94: this member has no replica set config yet (the shell may fetch it from the sender)."""

    def __init__(self) -> None:
        super().__init__(94, "no replset config has been received")


@dataclass(slots=True)
class _Call:
    kind: CallKind
    peer: int
    sent_ms: int
    deadline_ms: int


class Replica:
    def __init__(self, *, me: str, config: ReplSetConfig | None, state: MemberState, term: int,
                 last_vote: LastVote | None, applied: OpTime, durable: OpTime, min_valid: OpTime | None,
                 rng: RandomSource, now: int) -> None:
        self.me = me
        self.config = config
        self.state = state
        self.term = term
        self.last_vote = last_vote
        self.applied = applied  # last entry committed to our oplog (visible, maybe not fsynced)
        self.durable = durable  # last entry fsynced
        self.min_valid = min_valid  # after a rollback: RECOVERING until applied up to here
        self.rng = rng
        self.now = now
        self.actions: list[Action] = []
        self.topology: Topology | None = None
        self.commit_point = NULL_OPTIME
        self.learned_commit_point = NULL_OPTIME
        self.election_deadline = NEVER
        self.takeover_deadline = NEVER
        self.frozen_until = 0
        self.candidacy: Candidacy | None = None
        self.primary_term = -1
        self.election_date: datetime.datetime | None = None
        self.last_election_reason = ""
        self.last_step_down_reason = ""
        self.initiator = False
        self.fetching = False  # the sync pipeline runs (we asked for it and did not stop it)
        self.sync_source = ""  # the fetcher's current source, as the shell reports it
        self.last_fetched = applied
        self.fetched_at_ms = now  # when that source last gave us a new entry (or was chosen)
        self.forced_sync_source: str | None = None
        self.denylist: dict[str, int] = {}
        self.reports_ride_on_fetch = False  # the fetcher's next getMore carries our positions
        self.waiters = WaiterTable()
        self._calls: dict[int, _Call] = {}
        self._next_call = 0
        self._hb_due: dict[int, int] = {}
        self._hb_call: dict[int, int | None] = {}
        self._report_needed = False
        self._report_call: int | None = None
        self._report_keepalive = NEVER
        self._report_linger_until: int | None = None
        self._pending_persists: dict[int, Callable[[], None]] = {}
        self._deferred: list[Callable[[], None]] = []
        self._checking_min_valid = False
        self.terms_refused = 0  # terms beyond MAX_TERM offered and not adopted (the first one is logged)

    # -- settings -------------------------------------------------------------------------------------

    @property
    def configured(self) -> bool:
        return self.config is not None and self.topology is not None

    @property
    def self_id(self) -> int:
        assert self.topology is not None
        return self.topology.self_id

    @property
    def election_timeout_base(self) -> int:
        return self.config.settings.election_timeout_ms if self.config is not None else 10_000

    @property
    def heartbeat_timeout_ms(self) -> int:
        return self.config.settings.heartbeat_timeout_secs * 1000 if self.config is not None else 10_000

    @property
    def heartbeat_interval_ms(self) -> int:
        return self.config.settings.heartbeat_interval_ms if self.config is not None else 2_000

    @property
    def await_data_ms(self) -> int:
        return max(100, min(5000, self.election_timeout_base // 2))

    @property
    def is_primary(self) -> bool:
        return self.state is MemberState.PRIMARY

    def member_id_of(self, host: str) -> int | None:
        member = self.config.member_by_host(host) if self.config is not None and host else None
        return member.id if member is not None else None

    def primary_id(self) -> int | None:
        return self.topology.primary_id(self.state, self.term) if self.topology is not None else None

    def data_state(self) -> MemberState:
        return MemberState.RECOVERING if self.min_valid is not None else MemberState.SECONDARY

    # -- the shell's side: one entry point, and what it reads ----------------------------------------

    def step(self, now: int, event: Event) -> list[Action]:
        """Handle `event` (`replset.events`) at `now` and return every action to carry out, in order
        (etcd's `Step` and `Ready` in one call). Requests someone waits on are answered with `Answer`."""
        match event:
            case Tick():
                self.tick(now)
            case Replied(call=call, doc=doc):
                self.reply(now, call, doc)
            case CallFailed(call=call, refused=refused, why=why):
                self.call_failed(now, call, refused=refused, why=why)
            case HeartbeatIn(doc=doc, reply_to=reply_to):
                answer = self.heartbeat_request(now, doc)
                self._emit(Answer(reply_to, answer))
            case VoteRequestIn(doc=doc, reply_to=reply_to):
                self.vote_request(now, doc, reply_to)
            case PositionsIn(doc=doc, reply_to=reply_to):
                answer = self.update_position(now, doc)
                self._emit(Answer(reply_to, answer))
            case Persisted(token=token):
                self.persisted(now, token)
            case NoopWritten(term=term, ok=ok, wall=wall):
                self.noop_written(now, term, ok=ok, wall=wall)
            case SyncDrained(drained=drained):
                self.sync_drained(now, drained)
            case LocalCommit(applied=applied):
                self.local_commit(now, applied)
            case LocalDurable(durable=durable):
                self.local_durable(now, durable)
            case MinValidChecked(optime=optime, held=held):
                self.min_valid_checked(now, optime, held)
            case SourceMetadata(meta=meta):
                self.sync_source_metadata(now, meta)
            case FetcherMoved(source=source, last_fetched=last_fetched):
                self.fetcher_moved(now, source=source, last_fetched=last_fetched)
            case Started(initiator=initiator, state=state, config=config, applied=applied, durable=durable):
                if config is not None:
                    self.config = config
                if applied is not None and durable is not None:
                    self.applied, self.durable = applied, durable
                if state is not None:
                    self.enter_state(now, state)
                self.start(now, initiator=initiator)
            case Recovered(term=term, last_vote=last_vote, min_valid=min_valid, applied=applied, durable=durable):
                self.term, self.last_vote, self.min_valid = term, last_vote, min_valid
                self.applied, self.durable = applied, durable
            case MinValidSet(optime=optime):
                self.min_valid = optime
            case FetchCarriesReports(riding=riding):
                self.reports_ride_on_fetch = riding
            case EnterState(state=state):
                self.enter_state(now, state)
            case HoldingsChanged():
                self.holdings_changed(now)
            case AwaitWriteConcern(waiter=waiter, wc=wc, target=target):
                self.await_write_concern(now, waiter, wc, target)
            case GiveUpWaiting(waiter=waiter):
                self.give_up_waiting(waiter)
            case RollbackStarted():
                self.rollback_started(now)
            case RollbackEnded(run=run):
                self.rollback_ended(now, run)
            case Deny(host=host, for_ms=for_ms):
                self.deny(now, host, for_ms)
            case InitialSyncEnded():
                self.start_fetching(now)
            case ResyncBegan():
                self._enter(now)
                self.stop_fetching(drain=False)
            case PositionsWanted(reply_to=reply_to):
                self._enter(now)
                self._emit(Answer(reply_to, self.positions_report() or {}))
            case StepDownAsked(freeze_ms=freeze_ms, reason=reason):
                self.step_down(now, freeze_ms=freeze_ms, reason=reason)
            case StepUpAsked(skip_dry_run=skip_dry_run, reply_to=reply_to):
                self._emit(Answer(reply_to, {"started": self.step_up(now, skip_dry_run=skip_dry_run)}))
            case FreezeAsked(secs=secs, reply_to=reply_to):
                self._emit(Answer(reply_to, {"info": self.freeze(now, secs)}))
            case SyncFromAsked(host=host, reply_to=reply_to):
                self._emit(Answer(reply_to, {"prevSyncTarget": self.sync_from(now, host)}))
            case ConfigInstalled(config=config, data_state=data_state):
                self.install_config(now, config, data_state=data_state)
            case ShutDown():
                self.shutdown(now)
        return self.take_actions()

    def take_actions(self) -> list[Action]:
        actions, self.actions = self.actions, []
        return actions

    def next_deadline(self) -> int:
        """The earliest `now` at which `tick` has something to do (`NEVER` if nothing)."""
        times = [call.deadline_ms for call in self._calls.values()]
        times += [due for peer, due in self._hb_due.items() if self._hb_call.get(peer) is None]
        if self.candidacy is None:
            times += [self.election_deadline, self.takeover_deadline]
        else:
            times.append(self.candidacy.deadline_ms)
        if self.configured and self._report_call is None:
            times.append(self._report_keepalive)
            if self._report_linger_until is not None:
                times.append(self._report_linger_until)
        deadline = self.waiters.next_deadline()
        if deadline != math.inf:
            times.append(int(deadline))
        return min(times, default=NEVER)

    def _enter(self, now: int) -> None:
        self.now = max(self.now, now)

    def _leave(self) -> None:
        while self._deferred:
            self._deferred.pop(0)()
        if not self.configured:
            return
        self._send_due_heartbeats()
        self._maybe_report()

    def _emit(self, action: Action) -> None:
        self.actions.append(action)

    def set_state(self, new: MemberState) -> None:
        check_transition(self.state, new)
        if new is not self.state:
            old, self.state = self.state, new
            self._emit(StateChanged(old, new))

    # -- lifecycle ------------------------------------------------------------------------------------

    def start(self, now: int, *, initiator: bool = False) -> None:
        """Begins replication under `config`, which must name this member."""
        self._enter(now)
        assert self.config is not None
        me = self.config.member_by_host(self.me)
        assert me is not None
        self.topology = Topology(self.config, me.id, now)
        self.initiator = initiator
        self._sync_heartbeat_peers()
        self._report_keepalive = now + self.election_timeout_base // 2
        self.reset_election_timer()
        if len(self.config.voters) == 1 and me.votes:
            self.election_deadline = now  # a one-voter set elects itself at once
        self._start_fetching()
        self._leave()

    def shutdown(self, now: int) -> None:
        self._enter(now)
        self._fail_waiters(MongoError(91, "The server is in quiesce mode and will shut down"))
        self.candidacy = None
        self._calls.clear()

    def _start_fetching(self) -> None:
        if self.candidacy is not None and self.candidacy.phase in ("drain", "new primary no-op"):
            return  # about to become primary: the fetcher was stopped for good (the candidacy restarts it if lost)
        if not self.fetching and self.state in (MemberState.SECONDARY, MemberState.RECOVERING):
            self.fetching = True
            self.last_fetched = self.applied
            self._emit(StartFetching())

    def start_fetching(self, now: int) -> None:
        """The shell's initial sync ended (or a resync was abandoned): fetch from our last entry."""
        self._enter(now)
        self._start_fetching()
        self.heartbeat_now()  # tell the others at once that we are a data-bearing member again
        self._leave()

    def stop_fetching(self, *, drain: bool) -> None:
        if self.fetching:
            self.fetching = False
            self.sync_source = ""
            self._emit(StopFetching(drain))

    # -- configs --------------------------------------------------------------------------------------

    def install_config(self, now: int, config: ReplSetConfig, *, data_state: MemberState | None = None) -> None:
        """A newer config is stored: act on it. `data_state` is the state a member that was not in the
        set takes (SECONDARY, or STARTUP2 when it needs an initial sync)."""
        self._enter(now)
        current = self.config
        if current is not None and self.topology is not None and not config_is_older(
                current.version, current.term, config.version, config.term):
            self._leave()
            return
        self.config = config
        me = config.member_by_host(self.me)
        if me is None:
            self.step_down_now("removed from the config")
            self.stop_fetching(drain=False)
            self.candidacy = None
            self.set_state(MemberState.REMOVED)
            self._sync_heartbeat_peers()
            self._leave()
            return
        if self.state in (MemberState.STARTUP, MemberState.REMOVED):
            # An arbiter votes and heartbeats but holds no data: it never fetches or applies.
            self.set_state(MemberState.ARBITER if me.arbiter_only else (data_state or self.data_state()))
        if self.topology is None:
            self._leave()
            self.start(now)
            return
        self.topology.reconfigure(config, me.id)
        self._sync_heartbeat_peers()
        self._start_fetching()
        if self.is_primary and not me.electable:
            self.step_down_now("no longer electable in the new config")
        self._emit(TopologyChanged())
        self.heartbeat_now()
        self._leave()

    def _sync_heartbeat_peers(self) -> None:
        assert self.config is not None
        others = {m.id for m in self.config.members if m.host != self.me}
        for peer in list(self._hb_due):
            if peer not in others:
                del self._hb_due[peer]
                self._hb_call.pop(peer, None)
        for peer in others - set(self._hb_due):
            self._hb_due[peer] = self.now
            self._hb_call[peer] = None

    # -- calls ------------------------------------------------------------------------------------------

    def _call(self, peer: int, kind: CallKind, body: dict[str, Any], timeout_ms: int) -> int:
        self._next_call += 1
        call = self._next_call
        self._calls[call] = _Call(kind, peer, self.now, self.now + timeout_ms)
        self._emit(Send(peer, kind, body, call, timeout_ms))
        return call

    def reply(self, now: int, call: int, doc: dict[str, Any]) -> None:
        """The answer to a `Send`."""
        self._enter(now)
        record = self._calls.pop(call, None)
        if record is not None:
            if not doc.get("ok"):
                self._call_failed(call, record, refused=False, why=str(doc.get("errmsg", "failed")))
            elif record.kind is CallKind.HEARTBEAT:
                self._on_heartbeat_reply(call, record, doc)
            elif record.kind is CallKind.VOTE:
                if self.candidacy is not None:
                    self.candidacy.on_vote_reply(call, record.peer, doc)
            elif self._report_call == call:
                self._report_call = None
        self._leave()

    def call_failed(self, now: int, call: int, *, refused: bool = False, why: str = "failed") -> None:
        """A `Send` got no answer (timeout, connection refused, an error)."""
        self._enter(now)
        record = self._calls.pop(call, None)
        if record is not None:
            self._call_failed(call, record, refused=refused, why=why)
        self._leave()

    def _call_failed(self, call: int, record: _Call, *, refused: bool, why: str) -> None:
        if record.kind is CallKind.HEARTBEAT:
            if self._hb_call.get(record.peer) == call:
                self._heartbeat_done(record.peer)
            self._heartbeat_failed(record.peer, refused=refused, why=why)
        elif record.kind is CallKind.VOTE:
            if self.candidacy is not None:
                self.candidacy.on_vote_failed(call)
        elif self._report_call == call:
            self._report_call = None

    def tick(self, now: int) -> None:
        """Deadlines that passed: call timeouts, heartbeats, the election timer, wtimeouts."""
        self._enter(now)
        for call, record in list(self._calls.items()):
            if record.deadline_ms <= now and self._calls.pop(call, None) is not None:
                self._call_failed(call, record, refused=False, why="timed out")
        for waiting in self.waiters.expired(now):
            self._emit(Wake(waiting.waiter, timeout_error(waiting.wc)))
        if self.configured:
            self._maybe_run_election_timer()
            if self.candidacy is not None:
                self.candidacy.tick()
        self._leave()

    # -- heartbeats -----------------------------------------------------------------------------------

    def _send_due_heartbeats(self) -> None:
        config = self.config
        assert config is not None
        for peer, due in self._hb_due.items():
            if self._hb_call.get(peer) is not None or due > self.now:
                continue
            req = HeartbeatRequest(config.name, config.version, config.term, self.me, self.self_id, self.term)
            self._hb_call[peer] = self._call(peer, CallKind.HEARTBEAT, heartbeat_request(req),
                                             self.heartbeat_timeout_ms)

    def heartbeat_now(self) -> None:
        """Heartbeat every member at once (not those with a heartbeat in flight)."""
        for peer in self._hb_due:
            if self._hb_call.get(peer) is None:
                self._hb_due[peer] = self.now

    def _heartbeat_done(self, peer: int) -> None:
        if peer in self._hb_due:
            self._hb_call[peer] = None
            self._hb_due[peer] = self.now + self.heartbeat_interval_ms

    def heartbeat_request(self, now: int, doc: dict[str, Any]) -> dict[str, Any]:
        """`replSetHeartbeat` from another member: returns our reply document."""
        self._enter(now)
        try:
            return self._on_heartbeat_request(doc)
        finally:
            self._leave()

    def _on_heartbeat_request(self, doc: dict[str, Any]) -> dict[str, Any]:
        req = parse_heartbeat_request(doc)
        config, topology = self.config, self.topology
        if config is None or topology is None:
            raise NoConfig
        if req.set_name != config.name:
            raise MongoError(185, f"Our set name of {config.name} does not match name {req.set_name} "
                                  f"reported by remote node")
        topology.on_heartbeat_request(req.sender_id, self.now, req.config_version, req.config_term)
        self._maybe_elect_after_initiate()
        if req.term > self.term:
            self._deferred.append(lambda: self.update_term(req.term, f"a heartbeat request from {req.sender_host}"))
        sender = topology.members.get(req.sender_id)
        if config_is_older(config.version, config.term, req.config_version, req.config_term) or (
                sender is not None and req.term > sender.term):
            # Our next heartbeat to them brings the newer config, or their new state after an election.
            self.heartbeat_now()
        requester_older = config_is_older(req.config_version, req.config_term, config.version, config.term)
        primary_id = self.primary_id()
        return heartbeat_reply(HeartbeatReply(
            set_name=config.name, state=self.state, term=self.term, applied=self.applied,
            durable=self.durable, config_version=config.version, config_term=config.term,
            sync_source=self.sync_source, commit_point=self.commit_point,
            primary_id=-1 if primary_id is None else primary_id,
            election_date=self.election_date if self.is_primary else None,
            config=config.to_document() if requester_older else None,
        ))

    def _on_heartbeat_reply(self, call: int, record: _Call, doc: dict[str, Any]) -> None:
        peer, topology, config = record.peer, self.topology, self.config
        assert topology is not None and config is not None
        try:
            reply = parse_heartbeat_reply(doc)
            if reply.set_name != config.name:
                raise MongoError(185, f"member is in replica set {reply.set_name!r}, not {config.name!r}")
        except (MongoError, KeyError, TypeError, ValueError) as exc:
            if self._hb_call.get(peer) == call:
                self._heartbeat_done(peer)
            self._heartbeat_failed(peer, refused=False, why=str(exc))
            return
        outcome = topology.on_heartbeat_reply(peer, reply, float(self.now - record.sent_ms), self.now, self.term)
        if outcome.newer_config and reply.config is not None:
            self._emit(AdoptConfig(reply.config))

        if self._hb_call.get(peer) == call:
            self._heartbeat_done(peer)
        if outcome.newer_term is not None:
            self.update_term(outcome.newer_term, f"a heartbeat from member {peer}")
        if outcome.primary_seen and not self.is_primary:
            self.reset_election_timer()
        if self.is_primary:
            self._heartbeat_moved_positions()
        else:
            self.learn_commit_point(reply.commit_point)
        self._maybe_priority_takeover(peer, reply)
        self._maybe_elect_after_initiate()
        self._on_topology_change()
        self._check_primary_liveness()

    def _heartbeat_moved_positions(self) -> None:
        """A primary learns members' optimes from heartbeat replies too: the reply may bring a position
        that no report has brought (yet), and nothing else would move the commit point on an idle set."""
        self._advance_commit_point()

    def _heartbeat_failed(self, peer: int, *, refused: bool, why: str) -> None:
        assert self.topology is not None
        if self.topology.on_heartbeat_failure(peer, self.now, refused=refused, message=why):
            self._on_topology_change()
        self._check_primary_liveness()

    def _on_topology_change(self) -> None:
        self._emit(TopologyChanged())
        self._maybe_change_sync_source()

    def _check_primary_liveness(self) -> None:
        if not self.is_primary or self.config is None or len(self.config.voters) <= 1:
            return
        assert self.topology is not None
        if not self.topology.sees_majority(self.now, self.election_timeout_base):
            self.step_down_now("can't see a majority of the set's voting members")

    # -- terms and votes --------------------------------------------------------------------------------

    def _refuses_term(self, term: int, why: str) -> bool:
        """True when `term` is beyond `MAX_TERM`: it is not adopted (nothing changes), and the first such
        term is reported (`TermRefused`) - however often one is offered, one log line."""
        if term <= MAX_TERM:
            return False
        self.terms_refused += 1
        if self.terms_refused == 1:
            self._emit(TermRefused(term, why))
        return True

    def persist_term(self, term: int, last_vote: LastVote | None, then: Callable[[], None] | None = None,
                     *, why: str = "a term to persist") -> bool:
        """Adopts `term` and `last_vote` in memory now (as MongoDB's TopologyCoordinator does: every
        report and heartbeat from here on carries the new term, so an old primary counts nothing we
        acknowledge after deciding) and asks the shell to persist them; `then` - the reply that grants
        the vote, the vote requests that announce our candidacy - runs once they are durable.

        False, with nothing changed and `then` never run, when the term (or the vote's) is beyond
        `MAX_TERM`: it could not be persisted, so it is not adopted in memory either."""
        if self._refuses_term(max(term, last_vote.term if last_vote is not None else term), why):
            return False
        if term > self.term and self.is_primary:
            self.step_down_now(f"adopted term {term}")
        if term > self.term:
            self.term = term
            self.reset_election_timer()
        self.last_vote = last_vote
        self._next_call += 1
        token = self._next_call
        self._pending_persists[token] = then or (lambda: None)
        self._emit(Persist(self.term, self.last_vote, token))
        return True

    def persisted(self, now: int, token: int) -> None:
        """The shell made a `Persist` durable."""
        self._enter(now)
        then = self._pending_persists.pop(token, None)
        if then is not None:
            then()
        self._leave()

    def update_term(self, term: int, why: str) -> None:
        """Adopts a higher term: a primary stops accepting writes, then the term is persisted. A term
        beyond `MAX_TERM` changes nothing (not even a primary's state)."""
        if term <= self.term or self._refuses_term(term, why):
            return
        if self.is_primary:
            self.step_down_now(f"saw term {term} in {why}")
        self.persist_term(term, self.last_vote, why=why)

    def vote_request(self, now: int, doc: dict[str, Any], reply_to: object) -> None:
        """`replSetRequestVotes`: the `Answer` comes once the vote (or the newer term) is persisted."""
        self._enter(now)
        req = parse_vote_request(doc)
        config = self.config
        if config is None or not self.configured:
            raise NoConfig
        me = config.member_by_host(self.me)
        candidate = config.member_by_id(req.candidate_id)
        primary_id = self.primary_id()
        primary = config.member_by_id(primary_id) if primary_id is not None else None
        healthy_primary_ge = (primary is not None and candidate is not None and primary.id != candidate.id
                              and primary.priority >= candidate.priority)
        response, vote = decide_vote(
            req, set_name=config.name, my_term=self.term, my_last_applied=self.applied,
            config_version=config.version, config_term=config.term, last_vote=self.last_vote,
            i_am_arbiter=me is not None and me.arbiter_only,
            healthy_primary_priority_ge_candidate=healthy_primary_ge)
        answer = Answer(reply_to, vote_reply(response))
        if response.term > self.term or vote is not None:
            if not self.persist_term(response.term, vote if vote is not None else self.last_vote,
                                     then=lambda: self._emit(answer), why="replSetRequestVotes"):
                refusal = VoteResponse(self.term, False, f"candidate's term ({req.term}) is beyond the largest "
                                                         f"term a member may hold ({MAX_TERM})")
                self._emit(Answer(reply_to, vote_reply(refusal)))
            elif vote is not None:
                self.reset_election_timer()
        else:
            self._emit(answer)
        self._leave()

    # -- elections --------------------------------------------------------------------------------------

    def reset_election_timer(self) -> None:
        self.election_deadline = self.now + election_timeout_ms(self.election_timeout_base, self.rng)

    def call_election_now(self) -> None:
        self.election_deadline = self.now

    def _maybe_run_election_timer(self) -> None:
        if self.candidacy is not None:
            return
        if min(self.election_deadline, self.takeover_deadline) > self.now:
            return
        takeover = self.takeover_deadline <= self.now
        self.takeover_deadline = NEVER
        self.reset_election_timer()
        if self.electable():
            # `start` installs the run itself; one that ends at once (it may not stand) stays ended.
            Candidacy.start(self, "priorityTakeover" if takeover else "electionTimeout")

    def step_up(self, now: int, *, skip_dry_run: bool) -> bool:
        """`replSetStepUp`: stand now. False when this member may not (the shell answers an error)."""
        self._enter(now)
        started = self.electable()
        if started:
            Candidacy.start(self, "stepUpRequest" + ("SkipDryRun" if skip_dry_run else ""),
                            skip_dry_run=skip_dry_run)
        self._leave()
        return started

    def electable(self) -> bool:
        config = self.config
        if self.state is not MemberState.SECONDARY or self.candidacy is not None or config is None:
            return False
        me = config.member_by_host(self.me)
        return (me is not None and me.electable and me.votes > 0 and self.now >= self.frozen_until
                and self.applied != NULL_OPTIME)

    def _maybe_priority_takeover(self, peer: int, reply: HeartbeatReply) -> None:
        """Schedule a takeover of a primary of lower priority than ours; a primary we would not take over
        cancels one scheduled against an earlier primary. Otherwise a member of priority 2 that saw a primary
        of priority 1 stood when its deadline came though one of priority 3 had taken over meanwhile: it
        won, and the priority 3 member took over again - two needless failovers."""
        if reply.state is not MemberState.PRIMARY or self.state is not MemberState.SECONDARY:
            return
        assert self.config is not None
        if not wants_priority_takeover(self.config, self.self_id, peer, my_applied=self.applied,
                                       primary_applied=reply.applied):
            self.takeover_deadline = NEVER
        elif self.takeover_deadline == NEVER:
            timeout = election_timeout_ms(self.election_timeout_base, self.rng)
            self.takeover_deadline = self.now + priority_takeover_delay_ms(self.config, self.self_id, timeout)

    def _maybe_elect_after_initiate(self) -> None:
        """The initiating member stands as soon as a majority of voters has the new config."""
        if not self.initiator or self.state is not MemberState.SECONDARY or self.topology is None:
            return
        if self.topology.majority_has_config():
            self.initiator = False
            self.call_election_now()

    # -- what a candidacy may ask of the core (its only way in) -----------------------------------------

    def candidacy_began(self, run: Candidacy) -> None:
        self.candidacy = run

    def candidacy_over(self, run: Candidacy) -> None:
        if self.candidacy is run:
            self.candidacy = None

    def candidacy_won(self, run: Candidacy, term: int, wall: datetime.datetime | None) -> None:
        self.candidacy_over(run)
        self.last_election_reason = run.reason
        self.became_primary(term, wall)

    def ask_for_vote(self, peer: int, body: dict[str, Any]) -> int:
        """Sends a vote request; returns its call number."""
        return self._call(peer, CallKind.VOTE, body, self.heartbeat_timeout_ms)

    def forget_call(self, call: int) -> None:
        """An outstanding call whose answer no longer matters (an abandoned voting round)."""
        self._calls.pop(call, None)

    def resume_fetching(self) -> None:
        """A candidacy that ended without winning: the sync pipeline runs again."""
        self._start_fetching()

    def ask_for_noop(self, term: int) -> None:
        self._emit(WriteNoop(term))

    def may_write_noop(self, term: int) -> bool:
        """Asked inside the "new primary" no-op's transaction: is this member still about to lead `term`?"""
        return self.term == term and self.state is MemberState.SECONDARY

    def noop_written(self, now: int, term: int, *, ok: bool, wall: datetime.datetime | None = None) -> None:
        """The "new primary" no-op of `term` committed (`ok`) or was refused."""
        self._enter(now)
        if self.candidacy is not None:
            self.candidacy.on_noop_written(term, ok, wall)
        self._leave()

    def sync_drained(self, now: int, drained: bool) -> None:
        """The answer to `StopFetching(drain=True)`: everything fetched is applied (or not, in time)."""
        self._enter(now)
        if self.candidacy is not None:
            self.candidacy.on_drained(drained)
        self._leave()

    def became_primary(self, term: int, wall: datetime.datetime | None) -> None:
        self.primary_term = term
        self.set_state(MemberState.PRIMARY)
        self.takeover_deadline = NEVER
        self.forced_sync_source = None
        self.election_date = wall
        self._advance_commit_point()
        self.heartbeat_now()

    def step_down_now(self, reason: str) -> None:
        """PRIMARY -> SECONDARY at once: no more writes, waiters fail with PrimarySteppedDown."""
        if not self.is_primary:
            return
        self.last_step_down_reason = reason
        self.set_state(MemberState.SECONDARY)
        self._fail_waiters(MongoError(189, STEPPED_DOWN))
        self.reset_election_timer()
        self._start_fetching()

    def step_down(self, now: int, *, freeze_ms: int, reason: str) -> None:
        """`replSetStepDown` decided to go (the shell waited for a caught-up secondary)."""
        self._enter(now)
        if not self.is_primary:
            self._leave()
            raise MongoError(10107, "not primary so can't step down")
        self.frozen_until = now + freeze_ms
        self.step_down_now(reason)
        self._leave()

    def freeze(self, now: int, secs: float) -> str:
        """`replSetFreeze`: no election for `secs` (0 unfreezes)."""
        self._enter(now)
        if self.is_primary:
            raise MongoError(95, "cannot freeze node when primary or running for election. state: Primary")
        if not math.isfinite(secs):
            raise MongoError(2, f"replSetFreeze needs a finite number of seconds, not {secs}")
        if secs <= 0:
            self.frozen_until = 0
            return "unfreezing"
        self.frozen_until = now + int(secs * 1000)
        return ""

    # -- positions and the commit point -----------------------------------------------------------------

    def local_commit(self, now: int, applied: OpTime) -> None:
        """Our oplog's last committed entry is now `applied` (a write, an applied batch, a rollback)."""
        self._enter(now)
        self.applied = applied
        self.durable = min(self.durable, applied)  # the log may have been cut back (rollback)
        if self.is_primary and self.configured:
            self._advance_commit_point()  # wakes the waiters it satisfies
        else:
            if not self.configured:
                self.commit_point = self.durable
            else:
                self._maybe_end_recovering()
                self.commit_point = follower_commit_point(self.learned_commit_point, applied, self.commit_point)
                self._own_position_moved()
            self._check_waiters()
        if self.candidacy is not None:
            self.candidacy.on_local_commit()
        self._leave()

    def local_durable(self, now: int, durable: OpTime) -> None:
        """The journal flush made our entries durable up to `durable`."""
        self._enter(now)
        self.durable = min(max(self.durable, durable), self.applied)
        if self.is_primary and self.configured:
            self._advance_commit_point()  # wakes the waiters it satisfies
        else:
            if not self.configured:
                self.commit_point = self.durable
            else:
                self._own_position_moved()
            self._check_waiters()
        self._leave()

    def holdings_changed(self, now: int) -> None:
        """The shell has something new to say upstream beside positions (parts this member holds, or
        ones a downstream member reported): report soon, as after a position move."""
        self._enter(now)
        self._own_position_moved()
        self._leave()

    def _own_position_moved(self) -> None:
        if not self.reports_ride_on_fetch:
            self._report_needed = True

    def _advance_commit_point(self) -> None:
        if self.topology is None or self.config is None:
            return
        _applied, durable = self.topology.positions(self.applied, self.durable)
        self.commit_point = majority_commit_point(self.config, durable, self.term, self.commit_point)
        self._check_waiters()

    def learn_commit_point(self, commit_point: OpTime) -> None:
        if commit_point > self.learned_commit_point:
            self.learned_commit_point = commit_point
            self.commit_point = follower_commit_point(commit_point, self.applied, self.commit_point)

    def _maybe_end_recovering(self) -> None:
        """After a rollback: RECOVERING -> SECONDARY once the source's entries up to minValid are
        applied, and they are the very entry (not an entry past it on another branch)."""
        min_valid = self.min_valid
        if (self.state is not MemberState.RECOVERING or min_valid is None or self.applied < min_valid
                or self._checking_min_valid):
            return
        self._checking_min_valid = True
        self._emit(CheckMinValid(min_valid))

    def min_valid_checked(self, now: int, optime: OpTime, held: bool) -> None:
        """The answer to `CheckMinValid`: whether our oplog holds that entry."""
        self._enter(now)
        self._checking_min_valid = False
        if self.min_valid == optime and self.state is MemberState.RECOVERING:
            self.min_valid = None
            if held:
                self.set_state(MemberState.SECONDARY)
                self._emit(ForgetMinValid(optime))
            else:
                # We went past minValid on another branch: the documents the rollback refetched may
                # hold writes of a branch that lost, and no entry of ours will undo them.
                self._emit(Resync(f"passed the rollback's minValid {optime} on another branch"))
        self._leave()

    def update_position(self, now: int, doc: dict[str, Any]) -> dict[str, Any]:
        """`replSetUpdatePosition` (or the positions a getMore carries) from a member syncing from us."""
        self._enter(now)
        try:
            positions, term = parse_update_position(doc)
            if not self.configured:
                raise NoConfig
            if term > self.term:
                # A newer term exists: stop being primary at once (`update_term`), and count nothing from
                # this report (its members may already hold the new primary's branch).
                self.update_term(term, "replSetUpdatePosition")
                return {"ok": 1.0}
            self._count_positions(positions)
            return {"ok": 1.0}
        finally:
            self._leave()

    def _count_positions(self, positions: Any) -> None:
        assert self.topology is not None
        moved = False
        for pos in positions:
            if pos.member_id != self.self_id:
                moved = self.topology.on_position(pos, self.now) or moved
        if moved:
            self._emit(PositionsMoved())
            if self.is_primary:
                self._advance_commit_point()
            else:
                self._report_needed = True  # relay upstream at once

    def sync_source_metadata(self, now: int, meta: ReplMetadata) -> None:
        """`$replData` of a sync source's reply."""
        self._enter(now)
        if meta.term > self.term:
            self._deferred.append(lambda: self.update_term(meta.term, "sync source metadata"))
        self.learn_commit_point(meta.commit_point)
        self._leave()

    def metadata(self) -> ReplMetadata:
        primary_id = self.primary_id()
        return ReplMetadata(self.term, self.commit_point, -1 if primary_id is None else primary_id)

    def positions_report(self) -> dict[str, Any] | None:
        """Our positions and those reported to us, for the fetcher's next getMore; clears the need
        for a report of our own."""
        if self.topology is None:
            return None
        self._report_needed = False
        self._report_linger_until = None
        return position_report(self.topology.positions_to_report(self.applied, self.durable), self.term)

    def _maybe_report(self) -> None:
        if self._report_call is not None:
            return
        keepalive = self.now >= self._report_keepalive
        if not (self._report_needed or keepalive):
            return
        if not keepalive and self.durable < self.applied:
            # Linger: one report usually carries both positions of a batch.
            if self._report_linger_until is None:
                self._report_linger_until = self.now + REPORT_LINGER_MS
            if self.now < self._report_linger_until:
                return
        self._report_needed = False
        self._report_linger_until = None
        self._report_keepalive = self.now + self.election_timeout_base // 2
        source = self.member_id_of(self.sync_source)
        if self.is_primary or source is None:
            return
        assert self.topology is not None
        positions = self.topology.positions_to_report(self.applied, self.durable)
        self._report_call = self._call(source, CallKind.POSITIONS, update_position_command(positions, self.term),
                                       self.heartbeat_timeout_ms)

    # -- write concern ----------------------------------------------------------------------------------

    def await_write_concern(self, now: int, waiter: object, wc: WriteConcern, target: OpTime) -> None:
        """A write at `target` waits for `wc`: a `Wake(waiter, ...)` comes now or later."""
        self._enter(now)
        error = self.write_concern_problem(wc, target)
        if error is not None:
            self._emit(Wake(waiter, error if isinstance(error, MongoError) else None))
        elif len(self.waiters) >= MAX_WAITERS:
            self._emit(Wake(waiter, MongoError(64, "too many writes waiting for replication")))
        else:
            if wc.waits_for_journal:
                # A write waits on durability: flush our journal at once, as MongoDB does. For
                # w:"majority" this runs alongside the secondaries' apply.
                self._emit(Flush())
            deadline = now + wc.wtimeout_ms if wc.wtimeout_ms > 0 else math.inf
            self.waiters.add(waiter, wc, target, deadline)
        self._leave()

    def write_concern_problem(self, wc: WriteConcern, target: OpTime) -> MongoError | bool | None:
        """Decided without waiting: an error, True (satisfied now) or None (wait)."""
        error = check_satisfiable(wc, self.config)
        if error is not None:
            return error
        if wc.unacknowledged:
            return True
        if wc.w == 1 and not wc.j and self.applied >= target:
            return True  # w:1: acknowledged once applied, which it is when the write returns
        local_only = isinstance(wc.w, int) and wc.w <= 1
        if not local_only and self.configured and (not self.is_primary or self.term != target.term):
            # Positions of members in a newer term are on another branch: they prove nothing here.
            return MongoError(189, STEPPED_DOWN)
        if self.satisfied(wc, target):
            return True
        return None

    def give_up_waiting(self, waiter: object) -> None:
        """The shell stopped waiting for `waiter` (its connection closed)."""
        self.waiters.remove(waiter)

    def satisfied(self, wc: WriteConcern, target: OpTime,
                  positions: tuple[dict[int, OpTime], dict[int, OpTime]] | None = None) -> bool:
        if self.config is None or self.topology is None:
            return (self.durable if wc.waits_for_journal else self.applied) >= target
        if wc.w == MAJORITY:
            return self.commit_point >= target   # what `write_concern_satisfied` answers, without the positions
        applied, durable = positions or self.topology.positions(self.applied, self.durable)
        # Only members in the write's term follow the primary that wrote it; a higher-term optime
        # from another branch sorts above the write without containing it.
        applied = {m: o for m, o in applied.items() if o.term == target.term}
        durable = {m: o for m, o in durable.items() if o.term == target.term}
        return write_concern_satisfied(wc, target, config=self.config, applied=applied, durable=durable,
                                       commit_point=self.commit_point)

    def _check_waiters(self) -> None:
        if not len(self.waiters):
            return
        for waiting in self.waiters.reached_commit_point(self.commit_point):
            self._emit(Wake(waiting.waiter, None))
        if not self.waiters.others:
            return
        positions = self.topology.positions(self.applied, self.durable) if self.topology is not None else None
        for waiting in self.waiters.satisfied(lambda wc, target: self.satisfied(wc, target, positions)):
            self._emit(Wake(waiting.waiter, None))

    def _fail_waiters(self, error: MongoError) -> None:
        for waiting in self.waiters.take_all():
            self._emit(Wake(waiting.waiter, error))

    # -- the sync source --------------------------------------------------------------------------------

    def sync_inputs(self, last_fetched: OpTime) -> SyncSourceInputs:
        assert self.topology is not None
        inputs = self.topology.sync_source_inputs(
            last_fetched=last_fetched, my_state=self.state, my_term=self.term,
            forced_host=self.forced_sync_source, denylist=active_denylist(self.denylist, self.now),
            now_ms=self.now)
        if not self.sync_source:
            return inputs
        return dataclasses.replace(inputs, fetched_nothing_for_ms=max(0, self.now - self.fetched_at_ms),
                                   stall_limit_ms=max(STALL_LIMIT_MIN_MS, 2 * self.heartbeat_interval_ms))

    def choose_sync_source(self, now: int, last_fetched: OpTime) -> str | None:
        self._enter(now)
        if self.topology is None or self.state not in (MemberState.SECONDARY, MemberState.RECOVERING,
                                                       MemberState.STARTUP2):
            return None
        return explain_sync_source(self.sync_inputs(last_fetched)).host

    def fetcher_moved(self, now: int, *, source: str | None, last_fetched: OpTime) -> None:
        """The fetcher's source or its last fetched entry changed."""
        self._enter(now)
        changed = (source or "") != self.sync_source
        if changed or last_fetched != self.last_fetched:
            self.fetched_at_ms = now   # when the current source last gave us something (or was chosen)
        self.sync_source = source or ""
        self.last_fetched = last_fetched
        if changed:
            self._report_needed = True
        self._leave()

    def _maybe_change_sync_source(self) -> None:
        if not self.fetching or not self.sync_source or self.topology is None:
            return
        decision = should_change_sync_source(self.sync_inputs(self.last_fetched), self.sync_source)
        if decision.change:
            if decision.deny_ms:
                self.denylist[self.sync_source] = self.now + decision.deny_ms
            self._emit(ChangeSyncSource(decision.reason))

    def member_applied(self, host: str) -> OpTime | None:
        """The newest entry `host` reported in its heartbeats (None: not a member we heard from)."""
        member_id = self.member_id_of(host)
        topology = self.topology
        data = topology.members.get(member_id) if topology is not None and member_id is not None else None
        return data.applied if data is not None and data.last_heartbeat_ms is not None else None

    def deny(self, now: int, host: str, for_ms: int) -> None:
        self._enter(now)
        self.denylist[host] = now + for_ms
        if self.forced_sync_source == host:
            self.forced_sync_source = None

    def sync_from(self, now: int, host: str) -> str:
        """`replSetSyncFrom`: returns the previous sync source."""
        self._enter(now)
        if self.is_primary:
            raise MongoError(95, "primaries don't sync")
        assert self.config is not None
        member = self.config.member_by_host(host)
        if member is None:
            raise MongoError(74, f"Could not find member \"{host}\" in replica set")
        if member.host == self.me:
            raise MongoError(2, "I cannot sync from myself")
        previous = self.sync_source
        self.forced_sync_source = member.host
        self.denylist.pop(member.host, None)
        if self.fetching and previous != member.host:
            self._emit(ChangeSyncSource(f"replSetSyncFrom {member.host}"))
        self._leave()
        return previous

    # -- rollback and resync (the fetcher's outcomes) ---------------------------------------------------

    def enter_state(self, now: int, state: MemberState) -> None:
        """A transition the sync pipeline drives (ROLLBACK, RECOVERING after a rollback, STARTUP2 for a
        resync, the data state after an initial sync): the core records it and acts on it."""
        self._enter(now)
        if state is MemberState.ROLLBACK:
            self._leave()
            self.rollback_started(now)
            return
        self.set_state(state)
        if state in (MemberState.SECONDARY, MemberState.RECOVERING):
            self._start_fetching()
        self._leave()

    def rollback_started(self, now: int) -> None:
        """The fetcher drained its buffer and starts undoing our entries after the common point."""
        self._enter(now)
        if self.candidacy is not None:
            self.candidacy.abandon("our history diverged: rolling back")
        self.set_state(MemberState.ROLLBACK)
        self._emit(CloseOplogCursors("the member is rolling back"))
        self._leave()

    def rolled_back(self, now: int, *, common_point: OpTime, min_valid: OpTime) -> None:
        """A rollback committed: our oplog ends at `common_point`; RECOVERING until `min_valid`."""
        self._enter(now)
        self.min_valid = min_valid
        self.set_state(MemberState.RECOVERING)
        # Again at the end: a find that passed its role check just before ROLLBACK began may have
        # registered its cursor since.
        self._emit(CloseOplogCursors("the member rolled back"))
        self._leave()
        self.local_commit(now, common_point)

    def rollback_ended(self, now: int, run: RollbackRun) -> None:
        """A rollback run (`sync.rollback_flow`) ended: carry its ending into the member's state."""
        ending = run.ending
        assert ending is not None
        match ending.outcome:
            case Outcome.ROLLED_BACK:
                assert ending.common_point is not None and ending.min_valid is not None
                self.rolled_back(now, common_point=ending.common_point, min_valid=ending.min_valid)
            case Outcome.REFUSED:
                self.rollback_refused(now, run.source)
            case Outcome.FAILED:
                self.rollback_failed(now, run.source)
            case Outcome.NOT_STARTED:
                self.deny(now, run.source, ERROR_DENY_MS)

    def rollback_refused(self, now: int, source: str) -> None:
        """Rolling back to `source` would undo majority-committed entries: RECOVERING, and not that source."""
        self._enter(now)
        self.deny(now, source, DIVERGED_DENY_MS)
        self.set_state(MemberState.RECOVERING)
        self._start_fetching()
        self._leave()

    def rollback_failed(self, now: int, source: str) -> None:
        """The rollback ended before its transaction (the source failed, our oplog moved): nothing
        changed; back to where we were, and another try after a pause."""
        self._enter(now)
        self.deny(now, source, ERROR_DENY_MS)
        self.set_state(self.data_state())
        self._start_fetching()
        self._leave()
