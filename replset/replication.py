"""The replication coordinator: heartbeats, elections, position reports, write-concern waiters.

A shell around the pure cores. It owns the asyncio tasks and the peer
connections; every decision comes from `topology` (cluster view), `election`
(votes, tally, timeouts), `sync.sync_source` (which member to pull from) and
`quorum` (commit point, write concern).

    heartbeat task per member --reply--> Topology --> adopt term / step down /
        reset election timer / priority takeover / switch sync source
    election timer --timeout--> dry run --> real election (term + 1, vote fsynced)
        --> drain the applier --> "new primary" no-op --> PRIMARY
    applier commit --> report positions to the sync source (and relay the
        positions of members downstream) --> the primary advances the commit
        point --> write-concern waiters wake

Ordering contracts: a vote and a term are fsynced before the reply that grants
or announces them; applied and durable positions are reported separately (durable
only after the journal flusher's fsync) and the commit point counts durable ones; a
primary that learns of a higher term stops accepting writes before anything
else happens.
"""

from __future__ import annotations

import asyncio
import datetime
import heapq
import logging
import math
import random
import time
from typing import TYPE_CHECKING, Any

import bson

from oplog.errors import MongoError
from oplog.optime import NULL_OPTIME, OpTime
from replset.config import ReplSetConfig, parse_config
from replset.election import (
    ElectionTally,
    LastVote,
    VoteRequest,
    config_is_older,
    decide_vote,
    election_timeout_ms,
    priority_takeover_delay_ms,
    wants_priority_takeover,
)
from replset.member import MemberState
from replset.messages import (
    HeartbeatReply,
    HeartbeatRequest,
    ReplMetadata,
    heartbeat_reply,
    heartbeat_request,
    parse_heartbeat_reply,
    parse_heartbeat_request,
    parse_update_position,
    parse_vote_reply,
    parse_vote_request,
    position_report,
    repl_metadata,
    update_position_command,
    vote_reply,
    vote_request,
)
from replset.peer import PeerClient, PeerError
from replset.pulse import Pulse
from replset.quorum import follower_commit_point, majority_commit_point, write_concern_satisfied
from replset.status import MemberView
from replset.topology import Topology
from replset.write_concern import MAJORITY, WriteConcern, check_satisfiable, timeout_error
from sync.resync import ResyncCoordinator
from sync.sync_source import active_denylist, explain_sync_source, should_change_sync_source
from sync.worker import SyncWorker

if TYPE_CHECKING:
    from replset.node import Node

log = logging.getLogger(__name__)

MAX_WAITERS = 100_000
STOP_TIMEOUT_S = 5.0
# A secondary's report waits this long at most for the journal flush that follows an applied batch, so
# one report usually carries both positions instead of two reports a batch (fsync here: ~0.5 ms).
REPORT_LINGER_S = 0.002


def now_ms() -> int:
    return int(time.monotonic() * 1000)


class Replication:
    def __init__(self, node: Node) -> None:
        self.node = node
        self.topology: Topology | None = None
        self.rng = random.Random()
        self.topology_changed = Pulse()
        self.worker: SyncWorker | None = None
        self.resync = ResyncCoordinator(node)  # initial sync (STARTUP2), too stale, resync
        self.commit_point = NULL_OPTIME
        self.forced_sync_source: str | None = None
        self.frozen_until_ms = 0
        self.election_date: datetime.datetime | None = None
        self.last_election_reason = ""
        self._learned_commit_point = NULL_OPTIME
        self._heartbeats: dict[str, asyncio.Task[None]] = {}
        self._heartbeat_now = Pulse()
        self._timer_reset = Pulse()
        self._election_deadline_ms = math.inf
        self._takeover_deadline_ms: float = math.inf
        self._electing = False
        self._initiator = False
        self._report_needed = asyncio.Event()
        self._positions_moved = Pulse()
        self._durable_moved = Pulse()
        self._denylist: dict[str, int] = {}
        # w:"majority" waiters in a heap on their optime: a commit point move pops exactly the ones it
        # satisfies. Other concerns (w:N, j, tags), keyed by the future so a finished one leaves in O(1).
        self._majority_waiters: list[tuple[OpTime, int, asyncio.Future[MongoError | None]]] = []
        self._waiter_seq = 0
        self._waiters: dict[asyncio.Future[MongoError | None], tuple[WriteConcern, OpTime]] = {}
        self._vote_lock = asyncio.Lock()
        self._tasks: list[asyncio.Task[Any]] = []
        self._config_fetches: set[str] = set()
        self._config_lock = asyncio.Lock()

    # -- settings -------------------------------------------------------------------------------------

    @property
    def config(self) -> ReplSetConfig:
        assert self.node.config is not None
        return self.node.config

    @property
    def self_id(self) -> int:
        assert self.topology is not None
        return self.topology.self_id

    @property
    def election_timeout_base_ms(self) -> int:
        return self.config.settings.election_timeout_ms if self.node.config else 10_000

    @property
    def heartbeat_timeout_s(self) -> float:
        return float(self.config.settings.heartbeat_timeout_secs) if self.node.config else 10.0

    @property
    def await_data_ms(self) -> int:
        return max(100, min(5000, self.election_timeout_base_ms // 2))

    # -- lifecycle ------------------------------------------------------------------------------------

    def start(self, *, initiator: bool = False) -> None:
        """Begins replication under `node.config`, which must name this member."""
        config = self.config
        me = config.member_by_host(self.node.options.me)
        assert me is not None
        self.topology = Topology(config, me.id, now_ms())
        self._initiator = initiator
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(self._election_timer_loop(), name="election-timer"),
                       loop.create_task(self._reporter_loop(), name="position-reporter")]
        self._sync_heartbeat_tasks()
        self._reset_election_timer()
        if len(config.voters) == 1 and me.votes:
            self._election_deadline_ms = now_ms()  # a one-voter set elects itself at once
        self._start_worker()

    async def stop(self) -> None:
        tasks = [*self._tasks, *self._heartbeats.values()]
        for task in tasks:
            task.cancel()
        if tasks:
            # Bounded: a task that swallowed its cancellation must not keep the member alive.
            await asyncio.wait(tasks, timeout=STOP_TIMEOUT_S)
        self._tasks, self._heartbeats = [], {}
        await self._stop_worker(drain=False)
        self._fail_waiters(MongoError(91, "The server is in quiesce mode and will shut down"))

    def _start_worker(self) -> None:
        if self.node.state is MemberState.STARTUP2:
            self.resync.start_initial_sync()
            return
        if self.worker is None and self.node.state in (MemberState.SECONDARY, MemberState.RECOVERING):
            self.worker = SyncWorker(self.node)
            self.worker.start()

    async def _stop_worker(self, *, drain: bool) -> bool:
        await self.resync.stop()
        worker, self.worker = self.worker, None
        if worker is None:
            return True
        return await worker.stop(drain=drain)

    # -- configs --------------------------------------------------------------------------------------

    def _sync_heartbeat_tasks(self) -> None:
        others = {m.host for m in self.config.members if m.host != self.node.options.me}
        for host in list(self._heartbeats):
            if host not in others:
                self._heartbeats.pop(host).cancel()
        loop = asyncio.get_running_loop()
        for host in others - set(self._heartbeats):
            self._heartbeats[host] = loop.create_task(self._heartbeat_loop(host), name=f"heartbeat-{host}")

    async def install_config(self, config: ReplSetConfig) -> None:
        """Adopts a newer config (from a heartbeat or a reconfig): persist, then act on it."""
        async with self._config_lock:  # two heartbeats may bring configs at once; the newest wins
            node = self.node
            current = node.config
            if current is not None and not config_is_older(current.version, current.term,
                                                           config.version, config.term):
                return
            await node.store_config(config)
            node.config = config
            await self._act_on_config(config)

    async def _act_on_config(self, config: ReplSetConfig) -> None:
        node = self.node
        me = config.member_by_host(node.options.me)
        log.info("installed config version %d term %d", config.version, config.term)
        if me is None:
            if node.state is MemberState.PRIMARY:
                self.step_down_now("removed from the config")
            await self._stop_worker(drain=False)
            node.set_state(MemberState.REMOVED)
            self._sync_heartbeat_tasks()
            return
        if node.state in (MemberState.STARTUP, MemberState.REMOVED):
            # An arbiter votes and heartbeats but holds no data: it never fetches or applies.
            node.set_state(MemberState.ARBITER if me.arbiter_only else node.data_state())
        if self.topology is None:
            self.start()
        else:
            self.topology.reconfigure(config, me.id)
            self._sync_heartbeat_tasks()
            self._start_worker()
            if node.is_primary and not me.electable:
                self.step_down_now("no longer electable in the new config")
        node.notify_state_change()
        self._heartbeat_now.fire()

    def schedule_config_fetch(self, host: str) -> None:
        """An uninitiated member was heartbeated by `host`: ask it for its config."""
        if host in self._config_fetches or not host:
            return
        self._config_fetches.add(host)

        async def fetch() -> None:
            client = PeerClient(host, latency_ms=self.node.failpoints.latency_ms,
                                route=self.node.failpoints.peer_route)
            try:
                req = HeartbeatRequest(self.node.options.repl_set, -2, -1, self.node.options.me, -1, self.node.term)
                reply = await client.command(heartbeat_request(req), timeout_s=5.0)
                raw = reply.get("config")
                if reply.get("ok") and isinstance(raw, dict):
                    config = parse_config(raw)
                    if config.name == self.node.options.repl_set:
                        await self.install_config(config)
            except (PeerError, MongoError) as exc:
                log.info("could not fetch the config from %s: %s", host, exc)
            finally:
                client.close()
                self._config_fetches.discard(host)

        self._tasks.append(asyncio.get_running_loop().create_task(fetch()))

    # -- heartbeats -----------------------------------------------------------------------------------

    async def _heartbeat_loop(self, host: str) -> None:
        client = PeerClient(host, latency_ms=self.node.failpoints.latency_ms,
                            route=self.node.failpoints.peer_route)
        try:
            while True:
                try:
                    await self._heartbeat_once(client)
                except Exception:  # a bug here must not silently stop heartbeats to this member
                    log.exception("heartbeat to %s failed", host)
                await self._heartbeat_now.wait(self.config.settings.heartbeat_interval_ms / 1000)
        finally:
            client.close()

    def _member_id(self, host: str) -> int | None:
        member = self.config.member_by_host(host)
        return member.id if member is not None else None

    async def _heartbeat_once(self, client: PeerClient) -> None:
        node, topology = self.node, self.topology
        member_id = self._member_id(client.host)
        if topology is None or member_id is None:
            return
        config = self.config
        req = HeartbeatRequest(config.name, config.version, config.term, node.options.me, self.self_id, node.term)
        started = time.monotonic()
        try:
            raw = await client.command(heartbeat_request(req), timeout_s=self.heartbeat_timeout_s)
            if not raw.get("ok"):
                raise PeerError(str(raw.get("errmsg", "heartbeat failed")))
            reply = parse_heartbeat_reply(raw)
            if reply.set_name != config.name:
                raise PeerError(f"member is in replica set {reply.set_name!r}, not {config.name!r}")
        except (PeerError, MongoError) as exc:
            refused = isinstance(exc, PeerError) and exc.refused
            if topology.on_heartbeat_failure(member_id, now_ms(), refused=refused, message=str(exc)):
                log.info("member %s is now DOWN: %s", client.host, exc)
                self._on_topology_change()
            self._check_primary_liveness()
            return
        rtt_ms = (time.monotonic() - started) * 1000
        await self._on_heartbeat_reply(member_id, reply, rtt_ms)

    async def _on_heartbeat_reply(self, member_id: int, reply: HeartbeatReply, rtt_ms: float) -> None:
        node, topology = self.node, self.topology
        assert topology is not None
        outcome = topology.on_heartbeat_reply(member_id, reply, rtt_ms, now_ms(), node.term)
        if outcome.newer_config and reply.config is not None:
            await self.install_config(parse_config(reply.config))
        if outcome.newer_term is not None:
            await self.update_term(outcome.newer_term, f"a heartbeat from member {member_id}")
        if outcome.primary_seen and not node.is_primary:
            self._reset_election_timer()
        if node.is_primary:  # the reply may bring a position that no report has brought (yet)
            self._advance_commit_point()
            self._check_waiters()
        else:
            self._learn_commit_point(reply.commit_point)
        self._maybe_priority_takeover(member_id, reply)
        self._maybe_elect_after_initiate()
        self._on_topology_change()
        self._check_primary_liveness()

    def on_heartbeat_request(self, cmd: dict[str, Any]) -> dict[str, Any]:
        req = parse_heartbeat_request(cmd)
        node = self.node
        config = node.config
        if config is None or self.topology is None:
            if req.set_name == node.options.repl_set:
                self.schedule_config_fetch(req.sender_host)
            raise MongoError(94, "no replset config has been received")
        if req.set_name != config.name:
            raise MongoError(185, f"Our set name of {config.name} does not match name {req.set_name} "
                                  f"reported by remote node")
        self.topology.on_heartbeat_request(req.sender_id, now_ms(), req.config_version, req.config_term)
        self._maybe_elect_after_initiate()
        if req.term > node.term:
            self._spawn(self.update_term(req.term, f"a heartbeat request from {req.sender_host}"))
        sender = self.topology.members.get(req.sender_id)
        if config_is_older(config.version, config.term, req.config_version, req.config_term) or (
                sender is not None and req.term > sender.term):
            # Our next heartbeat to them brings the newer config, or their new state after an election.
            self._heartbeat_now.fire()
        requester_older = config_is_older(req.config_version, req.config_term, config.version, config.term)
        primary_id = self.topology.primary_id(node.state, node.term)
        return heartbeat_reply(HeartbeatReply(
            set_name=config.name, state=node.state, term=node.term, applied=node.last_committed_optime,
            durable=node.last_durable_optime, config_version=config.version, config_term=config.term,
            sync_source=self.sync_source_host, commit_point=self.commit_point,
            primary_id=-1 if primary_id is None else primary_id,
            election_date=self.election_date if node.is_primary else None,
            config=config.to_document() if requester_older else None,
        ))

    def _on_topology_change(self) -> None:
        self.topology_changed.fire()
        self._maybe_change_sync_source()

    def _check_primary_liveness(self) -> None:
        node, topology = self.node, self.topology
        if not node.is_primary or topology is None or len(self.config.voters) <= 1:
            return
        if not topology.sees_majority(now_ms(), self.election_timeout_base_ms):
            self.step_down_now("can't see a majority of the set's voting members")

    # -- terms and votes ----------------------------------------------------------------------------

    async def update_term(self, term: int, why: str) -> None:
        """Adopts a higher term: a primary stops accepting writes first, then the term is persisted."""
        if term <= self.node.term:
            return
        if self.node.is_primary:
            self.step_down_now(f"saw term {term} in {why}")
        async with self._vote_lock:
            if term > self.node.term:
                await self.node.persist_term(term, self.node.last_vote)
        self._reset_election_timer()

    async def on_vote_request(self, cmd: dict[str, Any]) -> dict[str, Any]:
        req = parse_vote_request(cmd)
        node, topology = self.node, self.topology
        config = node.config
        if config is None or topology is None:
            raise MongoError(94, "no replset config has been received")
        async with self._vote_lock:
            me = config.member_by_id(self.self_id)
            candidate = config.member_by_id(req.candidate_id)
            primary_id = topology.primary_id(node.state, node.term)
            primary = config.member_by_id(primary_id) if primary_id is not None else None
            healthy_primary_ge = (primary is not None and candidate is not None and primary.id != candidate.id
                                  and primary.priority >= candidate.priority)
            response, vote = decide_vote(
                req, set_name=config.name, my_term=node.term, my_last_applied=node.last_committed_optime,
                config_version=config.version, config_term=config.term, last_vote=node.last_vote,
                i_am_arbiter=me is not None and me.arbiter_only,
                healthy_primary_priority_ge_candidate=healthy_primary_ge)
            if response.term > node.term and node.is_primary:
                self.step_down_now(f"a vote request for term {response.term}")
            if response.term > node.term or vote is not None:
                await node.persist_term(response.term, vote if vote is not None else node.last_vote)
        if vote is not None:
            self._reset_election_timer()
            log.info("voted for member %d in term %d", req.candidate_id, req.term)
        return vote_reply(response)

    # -- elections ------------------------------------------------------------------------------------

    def _reset_election_timer(self) -> None:
        self._election_deadline_ms = now_ms() + election_timeout_ms(self.election_timeout_base_ms, self.rng)
        self._timer_reset.fire()

    def call_election_now(self) -> None:
        self._election_deadline_ms = now_ms()
        self._timer_reset.fire()

    async def _election_timer_loop(self) -> None:
        while True:
            now = now_ms()
            deadline = min(self._election_deadline_ms, self._takeover_deadline_ms)
            if now < deadline:
                await self._timer_reset.wait(min((deadline - now) / 1000, 3600.0))
                continue
            takeover = self._takeover_deadline_ms <= now
            self._takeover_deadline_ms = math.inf
            self._reset_election_timer()
            if self._electable(now):
                try:
                    await self.run_election("priorityTakeover" if takeover else "electionTimeout")
                except (MongoError, PeerError) as exc:
                    log.warning("election failed: %s", exc)

    def _electable(self, now: int) -> bool:
        node = self.node
        if node.state is not MemberState.SECONDARY or self._electing or node.config is None:
            return False
        me = node.config.member_by_host(node.options.me)
        return (me is not None and me.electable and me.votes > 0 and now >= self.frozen_until_ms
                and node.last_committed_optime != NULL_OPTIME)

    async def run_election(self, reason: str, *, skip_dry_run: bool = False) -> bool:
        """Dry run, then the real election; True when this member became primary."""
        if not self._electable(now_ms()):
            return False
        self._electing = True
        try:
            node = self.node
            if not skip_dry_run:
                won, higher = await self._request_votes(dry_run=True, term=node.term)
                if higher is not None:
                    await self.update_term(higher, "a dry-run vote response")
                if not won:
                    return False
            term = node.term + 1
            async with self._vote_lock:
                if node.state is not MemberState.SECONDARY or node.term >= term:
                    return False
                await node.persist_term(term, LastVote(term, self.self_id))
            log.info("running for election in term %d (%s)", term, reason)
            won, higher = await self._request_votes(dry_run=False, term=term)
            if higher is not None:
                await self.update_term(higher, "a vote response")
            if not won or node.term != term or node.state is not MemberState.SECONDARY:
                log.info("election in term %d lost", term)
                return False
            self.last_election_reason = reason
            return await self._assume_primary(term)
        finally:
            self._electing = False

    async def _request_votes(self, *, dry_run: bool, term: int) -> tuple[bool, int | None]:
        """Asks every other voter; returns (won, a higher term seen or None)."""
        config, node, topology = self.config, self.node, self.topology
        assert topology is not None
        tally = ElectionTally(config, self.self_id)
        if tally.won:
            return True, None
        req = VoteRequest(config.name, dry_run, term, self.self_id, config.version, config.term,
                          node.last_committed_optime)

        async def ask(member_id: int, host: str) -> tuple[int, dict[str, Any]]:
            client = PeerClient(host, latency_ms=node.failpoints.latency_ms, route=node.failpoints.peer_route)
            try:
                return member_id, await client.command(vote_request(req), timeout_s=self.heartbeat_timeout_s)
            finally:
                client.close()

        loop = asyncio.get_running_loop()
        tasks = [loop.create_task(ask(m.id, m.host)) for m in config.voters if m.id != self.self_id]
        higher: int | None = None
        try:
            for next_done in asyncio.as_completed(tasks, timeout=self.election_timeout_base_ms / 1000):
                try:
                    member_id, raw = await next_done
                except (PeerError, MongoError):
                    continue
                if not raw.get("ok"):
                    continue
                response = parse_vote_reply(raw)
                topology.touch(member_id, now_ms())
                if response.term > term:
                    higher = response.term
                    break
                tally.record(member_id, response.vote_granted)
                if tally.won or tally.lost:
                    break
        except TimeoutError:
            pass
        finally:
            for task in tasks:
                task.cancel()
        return tally.won, higher

    async def _assume_primary(self, term: int) -> bool:
        """Won: catch up, apply everything fetched, then write the "new primary" no-op and accept writes."""
        await self._catch_up(term)
        drained = await self._stop_worker(drain=True)
        node = self.node
        if not drained or node.term != term or node.state is not MemberState.SECONDARY:
            self._start_worker()
            return False
        try:
            await node.become_primary(term)
        except MongoError as exc:
            log.warning("could not become primary in term %d: %s", term, exc)
            self._start_worker()
            return False
        self._takeover_deadline_ms = math.inf
        self.forced_sync_source = None
        self.election_date = node.now()
        log.info("became primary in term %d", term)
        self._advance_commit_point()
        self._heartbeat_now.fire()
        return True

    async def _catch_up(self, term: int) -> None:
        """Fetch what other members have and we lack (w:1 writes of the old primary) before writing.

        The target is the newest optime heartbeats reported. The wait is bounded by
        `catchUpTimeoutMillis`; its default -1 ("no limit" in MongoDB) is bounded here by
        the election timeout, so a member that cannot reach the newest data still takes
        over rather than leaving the set without a primary.
        """
        assert self.topology is not None
        node = self.node
        target = self.topology.newest_applied()
        if target <= node.last_committed_optime or self.worker is None:
            return
        limit_ms = self.config.settings.catch_up_timeout_ms
        if limit_ms < 0:
            limit_ms = self.election_timeout_base_ms
        deadline = time.monotonic() + limit_ms / 1000
        log.info("catching up to %s before becoming primary", target)
        while node.last_committed_optime < target and node.term == term and time.monotonic() < deadline:
            await node.wait_for_oplog(node.last_committed_optime.ts_key, deadline - time.monotonic())

    def step_down_now(self, reason: str) -> None:
        """PRIMARY -> SECONDARY at once: no more writes, waiters fail with PrimarySteppedDown."""
        node = self.node
        if not node.is_primary:
            return
        log.info("stepping down: %s", reason)
        node.set_state(MemberState.SECONDARY)
        self._fail_waiters(MongoError(189, "Primary stepped down while waiting for replication"))
        self._reset_election_timer()
        self._start_worker()

    def _maybe_priority_takeover(self, member_id: int, reply: HeartbeatReply) -> None:
        node = self.node
        if reply.state is not MemberState.PRIMARY or node.state is not MemberState.SECONDARY:
            return
        if self._takeover_deadline_ms == math.inf and wants_priority_takeover(
                self.config, self.self_id, member_id, my_applied=node.last_committed_optime,
                primary_applied=reply.applied):
            timeout = election_timeout_ms(self.election_timeout_base_ms, self.rng)
            delay = priority_takeover_delay_ms(self.config, self.self_id, timeout)
            self._takeover_deadline_ms = now_ms() + delay
            self._timer_reset.fire()

    def _maybe_elect_after_initiate(self) -> None:
        """The initiating member stands as soon as a majority of voters has the new config."""
        if not self._initiator or self.node.state is not MemberState.SECONDARY or self.topology is None:
            return
        if self.topology.majority_has_config():
            self._initiator = False
            self.call_election_now()

    # -- positions, commit point, write concern ---------------------------------------------------------

    def on_local_durable(self) -> None:
        """The journal flusher made our entries durable up to `node.last_durable_optime`."""
        node = self.node
        self._durable_moved.fire()
        if node.is_primary:
            self._advance_commit_point()
        elif self.topology is not None and not self._own_moves_ride_on_fetch():
            self._report_needed.set()
        elif node.config is None:
            self.commit_point = node.last_durable_optime
        self._check_waiters()

    def on_local_commit(self) -> None:
        """Our applied optime moved (a primary write or an applied batch, committed, maybe not fsynced)."""
        node = self.node
        if node.is_primary:
            self._advance_commit_point()
        elif self.topology is not None:
            self._maybe_end_recovering()
            self.resync.on_applied()
            self.commit_point = follower_commit_point(self._learned_commit_point, node.last_committed_optime,
                                                      self.commit_point)
            if not self._own_moves_ride_on_fetch():
                self._report_needed.set()
        self._check_waiters()

    def _maybe_end_recovering(self) -> None:
        """After a rollback: RECOVERING -> SECONDARY once the source's entries up to minValid are applied."""
        node = self.node
        min_valid, last = node.min_valid, node.last_committed_optime
        if node.state is not MemberState.RECOVERING or min_valid is None or last < min_valid:
            return
        node.min_valid = None
        blob = node.store.reader.oplog_entry(min_valid.ts_key)
        if blob is not None and OpTime.from_document(bson.decode(blob)) == min_valid:
            log.info("reached minValid %s: data consistent again", min_valid)
            node.set_state(MemberState.SECONDARY)
            node.notify_state_change()
            return
        # We went past minValid on another branch: the documents the rollback refetched may hold
        # writes of a branch that lost, and no entry of ours will undo them. Start from scratch.
        log.error("passed minValid %s on another branch (now at %s): resyncing", min_valid, last)
        async def resync() -> None:
            try:
                await self.resync.resync(f"passed the rollback's minValid {min_valid} on another branch")
            except MongoError as exc:
                log.error("resync after passing minValid on another branch failed: %s", exc)

        self._spawn(resync())

    def _advance_commit_point(self) -> None:
        if self.topology is None:
            return
        node = self.node
        _applied, durable = self.topology.positions(node.last_committed_optime, node.last_durable_optime)
        self.commit_point = majority_commit_point(self.config, durable, self.node.term, self.commit_point)

    def _learn_commit_point(self, commit_point: OpTime) -> None:
        if commit_point > self._learned_commit_point:
            self._learned_commit_point = commit_point
            self.commit_point = follower_commit_point(commit_point, self.node.last_committed_optime,
                                                      self.commit_point)

    def on_update_position(self, cmd: dict[str, Any]) -> dict[str, Any]:
        positions, term = parse_update_position(cmd)
        if self.node.config is None or self.topology is None:
            raise MongoError(94, "no replset config has been received")
        if term > self.node.term:
            # A newer term exists: stop being primary at once, and count nothing from this report
            # (its members may already hold the new primary's branch).
            if self.node.is_primary:
                self.step_down_now(f"saw term {term} in replSetUpdatePosition")
            self._spawn(self.update_term(term, "replSetUpdatePosition"))
            return {"ok": 1.0}
        now = now_ms()
        moved = False
        for pos in positions:
            if pos.member_id != self.self_id:
                moved = self.topology.on_position(pos, now) or moved
        if moved:
            self._positions_moved.fire()
            if self.node.is_primary:
                self._advance_commit_point()
                self._check_waiters()
            else:
                self._report_needed.set()  # relay upstream at once
        return {"ok": 1.0}

    def on_sync_source_metadata(self, meta: ReplMetadata) -> None:
        if meta.term > self.node.term:
            self._spawn(self.update_term(meta.term, "sync source metadata"))
        self._learn_commit_point(meta.commit_point)

    def metadata_document(self) -> dict[str, Any]:
        node = self.node
        primary_id = self.topology.primary_id(node.state, node.term) if self.topology else None
        meta = ReplMetadata(node.term, self.commit_point, -1 if primary_id is None else primary_id)
        config = node.config
        return repl_metadata(meta, config.version if config else -2, config.term if config else -1)

    def _own_moves_ride_on_fetch(self) -> bool:
        """Whether the fetcher's next getMore will carry our new positions (it is between a batch and
        its next getMore): then no separate replSetUpdatePosition is needed for them."""
        worker = self.worker
        return worker is not None and worker.carrying_reports and not worker.awaiting_source

    def fetch_position_report(self) -> dict[str, Any] | None:
        """Our positions and those reported to us, for the fetcher's next getMore (`POSITIONS_FIELD`)."""
        if self.topology is None:
            return None
        node = self.node
        positions = self.topology.positions_to_report(node.last_committed_optime, node.last_durable_optime)
        return position_report(positions, node.term)

    async def settle_durable(self) -> None:
        """Waits (at most `REPORT_LINGER_S`) for a journal flush under way, so one report carries both
        the applied and the durable position of a batch."""
        node = self.node
        if node.last_durable_optime < node.last_committed_optime and node.writer.flush_pending:
            await self._durable_moved.wait(REPORT_LINGER_S)

    async def _reporter_loop(self) -> None:
        client: PeerClient | None = None
        try:
            while True:
                keepalive_s = self.election_timeout_base_ms / 2000
                try:
                    await asyncio.wait_for(self._report_needed.wait(), keepalive_s)
                except TimeoutError:
                    pass
                self._report_needed.clear()
                source = self.sync_source_host
                if self.node.is_primary or not source or self.topology is None:
                    continue
                await self.settle_durable()
                self._report_needed.clear()
                node = self.node
                if client is None or client.host != source:
                    if client is not None:
                        client.close()
                    client = PeerClient(source, latency_ms=self.node.failpoints.latency_ms,
                                        route=self.node.failpoints.peer_route)
                node = self.node
                positions = self.topology.positions_to_report(node.last_committed_optime, node.last_durable_optime)
                cmd = update_position_command(positions, node.term)
                try:
                    await client.command(cmd, timeout_s=self.heartbeat_timeout_s)
                except PeerError as exc:
                    log.debug("position report to %s failed: %s", source, exc)
        finally:
            if client is not None:
                client.close()

    def write_concern_error(self, wc: WriteConcern) -> MongoError | None:
        return check_satisfiable(wc, self.node.config)

    def _satisfied(self, wc: WriteConcern, target: OpTime,
                   positions: tuple[dict[int, OpTime], dict[int, OpTime]] | None = None) -> bool:
        node = self.node
        if node.config is None or self.topology is None:
            return (node.last_durable_optime if wc.j or wc.w == MAJORITY else node.last_committed_optime) >= target
        if positions is None:
            positions = self.topology.positions(node.last_committed_optime, node.last_durable_optime)
        applied, durable = positions
        return write_concern_satisfied(wc, target, config=node.config, applied=applied, durable=durable,
                                       commit_point=self.commit_point)

    async def wait_for_write_concern(self, wc: WriteConcern, target: OpTime) -> MongoError | None:
        """Waits until the write at `target` satisfies `wc`; returns a writeConcernError or None."""
        error = self.write_concern_error(wc)
        if error is not None or wc.unacknowledged:
            return error
        if wc.w == 1 and not wc.j and self.node.last_committed_optime >= target:
            return None  # w:1: acknowledged once applied, which it is when the write returns
        local_only = isinstance(wc.w, int) and wc.w <= 1
        if not local_only and (not self.node.is_primary or self.node.term != target.term):
            # Positions of members in a newer term are on another branch: they prove nothing here.
            return MongoError(189, "Primary stepped down while waiting for replication")
        if self._satisfied(wc, target):
            return None
        if not self.node.is_primary and not local_only:
            return MongoError(189, "Primary stepped down while waiting for replication")
        if len(self._waiters) + len(self._majority_waiters) >= MAX_WAITERS:
            return MongoError(64, "too many writes waiting for replication")
        self._maybe_flush_for(wc)
        waiter: asyncio.Future[MongoError | None] = asyncio.get_running_loop().create_future()
        if wc.w == MAJORITY:
            self._waiter_seq += 1
            heapq.heappush(self._majority_waiters, (target, self._waiter_seq, waiter))
        else:
            self._waiters[waiter] = (wc, target)
        try:
            timeout_s = wc.wtimeout_ms / 1000 if wc.wtimeout_ms > 0 else None
            return await asyncio.wait_for(asyncio.shield(waiter), timeout_s)
        except TimeoutError:
            return timeout_error(wc)
        finally:
            # A timed-out majority waiter stays in the heap, done, until the commit point passes it.
            self._waiters.pop(waiter, None)

    def _maybe_flush_for(self, wc: WriteConcern) -> None:
        """A write waits on durability: flush our journal at once, as MongoDB does. For w:"majority"
        this runs alongside the secondaries' apply: the majority is then us and the fastest of them,
        not the slowest two of them."""
        if wc.j or wc.w == MAJORITY:
            self.node.request_flush()

    def _check_waiters(self) -> None:
        heap = self._majority_waiters
        while heap and heap[0][0] <= self.commit_point:
            _target, _seq, waiter = heapq.heappop(heap)
            if not waiter.done():
                waiter.set_result(None)
        if not self._waiters:
            return
        node, topology = self.node, self.topology
        positions = (topology.positions(node.last_committed_optime, node.last_durable_optime)
                     if topology is not None else None)
        for waiter, (wc, target) in self._waiters.items():
            if not waiter.done() and self._satisfied(wc, target, positions):
                waiter.set_result(None)

    def _fail_waiters(self, error: MongoError) -> None:
        for waiter in [*self._waiters, *(w for _t, _s, w in self._majority_waiters)]:
            if not waiter.done():
                waiter.set_result(error)
        self._majority_waiters = []

    async def wait_for_positions(self, timeout_s: float) -> None:
        """Returns when a member's position moved or a heartbeat updated the view (a member that just
        finished its initial sync becomes SECONDARY there), or at the timeout."""
        waits = [asyncio.ensure_future(self._positions_moved.wait(timeout_s)),
                 asyncio.ensure_future(self.topology_changed.wait(timeout_s))]
        _done, pending = await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        for task in pending:
            task.cancel()

    # -- sync source ------------------------------------------------------------------------------------

    @property
    def sync_source_host(self) -> str:
        worker = self.worker
        return worker.sync_source or "" if worker is not None else self.resync.sync_source

    def _sync_inputs(self, last_fetched: OpTime) -> Any:
        assert self.topology is not None
        now = now_ms()
        return self.topology.sync_source_inputs(
            last_fetched=last_fetched, my_state=self.node.state, my_term=self.node.term,
            forced_host=self.forced_sync_source, denylist=active_denylist(self._denylist, now), now_ms=now)

    def choose_sync_source(self, last_fetched: OpTime) -> str | None:
        if self.topology is None or self.node.state not in (MemberState.SECONDARY, MemberState.RECOVERING,
                                                            MemberState.STARTUP2):
            return None
        choice = explain_sync_source(self._sync_inputs(last_fetched))
        return choice.host

    def _maybe_change_sync_source(self) -> None:
        worker = self.worker
        if worker is None or not worker.sync_source or self.topology is None:
            return
        decision = should_change_sync_source(self._sync_inputs(worker.last_fetched), worker.sync_source)
        if decision.change:
            log.info("changing sync source: %s", decision.reason)
            worker.request_change()

    def deny(self, host: str, for_ms: int) -> None:
        self._denylist[host] = now_ms() + for_ms
        if self.forced_sync_source == host:
            self.forced_sync_source = None

    def on_sync_source_changed(self) -> None:
        self._report_needed.set()

    def sync_from(self, host: str) -> str:
        """`replSetSyncFrom`: returns the previous sync source."""
        if self.node.is_primary:
            raise MongoError(95, "primaries don't sync")
        member = self.config.member_by_host(host)
        if member is None:
            raise MongoError(74, f"Could not find member \"{host}\" in replica set")
        if member.host == self.node.options.me:
            raise MongoError(2, "I cannot sync from myself")
        previous = self.sync_source_host
        self.forced_sync_source = member.host
        self._denylist.pop(member.host, None)
        if self.worker is not None and previous != member.host:
            self.worker.request_change()
        return previous

    # -- admin ------------------------------------------------------------------------------------------

    async def step_down(self, step_down_secs: float, catch_up_secs: float, force: bool) -> None:
        node = self.node
        if not node.is_primary or self.topology is None:
            raise MongoError(10107, "not primary so can't step down")
        deadline = time.monotonic() + catch_up_secs
        target = self.topology.caught_up_electable(node.last_committed_optime)
        while target is None and time.monotonic() < deadline:
            await self.wait_for_positions(max(deadline - time.monotonic(), 0.0))
            target = self.topology.caught_up_electable(node.last_committed_optime)
        if target is None and not force:
            raise MongoError(262, "No electable secondaries caught up as of now. Please use the "
                                  "{force: true} option if you really want to step down.")
        self.frozen_until_ms = now_ms() + int(step_down_secs * 1000)
        self.step_down_now("replSetStepDown")
        if target is not None:
            self._spawn(self._hand_off(target))

    async def _hand_off(self, host: str) -> None:
        """Election handoff: ask a caught-up secondary to stand at once, without a dry run."""
        client = PeerClient(host, latency_ms=self.node.failpoints.latency_ms,
                            route=self.node.failpoints.peer_route)
        try:
            await client.command({"replSetStepUp": 1, "skipDryRun": True, "$db": "admin"},
                                 timeout_s=self.heartbeat_timeout_s)
        except PeerError as exc:
            log.info("election handoff to %s failed: %s", host, exc)
        finally:
            client.close()

    def freeze(self, secs: float) -> str:
        if self.node.is_primary:
            raise MongoError(95, "cannot freeze node when primary or running for election. state: Primary")
        if secs <= 0:
            self.frozen_until_ms = 0
            return "unfreezing"
        self.frozen_until_ms = now_ms() + int(secs * 1000)
        return ""

    # -- status -----------------------------------------------------------------------------------------

    def member_views(self) -> tuple[MemberView, ...]:
        node, config, topology = self.node, self.config, self.topology
        now, wall = now_ms(), node.now()

        def ago(ms: int | None) -> datetime.datetime | None:
            return None if ms is None else wall - datetime.timedelta(milliseconds=now - ms)

        views = []
        for m in config.members:
            data = topology.members.get(m.id) if topology is not None else None
            if m.host == node.options.me or data is None:
                views.append(MemberView(
                    id=m.id, name=m.host, is_self=m.host == node.options.me, health=True, state=node.state,
                    optime=node.last_committed_optime, durable_optime=node.last_durable_optime,
                    sync_source_host=self.sync_source_host, sync_source_id=self._member_id_or(self.sync_source_host),
                    uptime_s=int(node.uptime_s()), config_version=config.version, config_term=config.term,
                    election_date=self.election_date if node.is_primary else None,
                    info_message=self._info_message() if m.host == node.options.me else ""))
                continue
            ping = data.ping.value_ms
            views.append(MemberView(
                id=m.id, name=m.host, is_self=False, health=data.healthy,
                state=data.state if data.healthy else MemberState.DOWN, optime=data.applied,
                durable_optime=data.durable, sync_source_host=data.sync_source,
                sync_source_id=self._member_id_or(data.sync_source),
                ping_ms=None if ping is None else round(ping), last_heartbeat=ago(data.last_heartbeat_ms),
                last_heartbeat_recv=ago(data.last_heartbeat_recv_ms), last_heartbeat_message=data.message,
                election_date=data.election_date if data.state is MemberState.PRIMARY else None,
                config_version=data.config_version, config_term=data.config_term))
        return tuple(views)

    def _member_id_or(self, host: str) -> int:
        member = self.config.member_by_host(host) if host else None
        return member.id if member is not None else -1

    def status_extra(self) -> dict[str, Any]:
        extra: dict[str, Any] = {}
        if self.node.is_primary and self.election_date is not None:
            extra["electionCandidateMetrics"] = {
                "lastElectionReason": self.last_election_reason, "lastElectionDate": self.election_date,
                "electionTerm": self.node.term, "numVotesNeeded": self.config.majority_vote_count,
                "electionTimeoutMillis": self.election_timeout_base_ms,
            }
        if self._info_message():
            extra["infoMessage"] = self._info_message()
        extra.update(self.resync.status_fields())
        return extra

    def _info_message(self) -> str:
        return self.resync.info_message() or (self.worker.message if self.worker is not None else "")

    # -- initial sync and resync (sync.resync) ----------------------------------------------------------

    def start_steady_state(self) -> None:
        """An initial sync ended (or a resync was abandoned): fetch and apply from our last entry."""
        self._start_worker()
        self.node.notify_state_change()
        self._heartbeat_now.fire()

    async def stop_steady_state(self) -> None:
        """A resync is about to drop the data: stop fetching and applying."""
        await self._stop_worker(drain=False)

    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.append(task)
        task.add_done_callback(lambda t: self._tasks.remove(t) if t in self._tasks else None)
