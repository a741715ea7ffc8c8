"""One deterministic run: all members, the network, the disks and the clients, driven by a seed.

Theory of operation
-------------------
A single event queue orders everything by global simulated time (ties by
insertion order): packet deliveries, member wake-ups (timers), fsync
completions, client operations and faults. Each member is a `SimNode` step
function; after every step the runner

1. moves the member's outgoing packets into the network (or straight to a
   client), and schedules its fsync if it started one;
2. records what happened (`History`): a new primary, entries made durable or
   rolled back, the commit point moving, replies to clients;
3. checks the member's invariants, and schedules its next wake-up.

Two phases (TigerBeetle's VOPR): the **safety phase** runs the seed's fault
schedule under client load; at its end everything heals (partitions lifted,
crashed members restarted, paused ones resumed, loss and duplication off) and
clients stop starting operations. The **liveness phase** then checks every
`CONVERGENCE_CHECK_MS` whether the set converged (one primary, identical
oplogs and data, commit points at the end), and fails if it has not within
the scenario's bound. A converged set then runs idle for the **ping phase**:
one secondary's link to the primary grows slower (`drift_ms` one way) for
`PING_SETTLE_HEARTBEATS` heartbeat intervals, and heals for as many again; after
each, the runner records who syncs from whom with the true round trips
(`SyncView`) for `sync_sources_follow_ping`. Throughout the run a watch every
`WATCH_MS` records each stretch a primary could reach no majority of voters
(`CutOff`) for `cut_off_primaries_step_down`.

Bounded: at most `MAX_EVENTS` events per run. Any exception from a member's
step (an illegal state transition, a broken invariant, a bug in a core) ends
the run as a failure with the seed to replay it.
"""

from __future__ import annotations

import heapq
import itertools
import random
import traceback
from dataclasses import dataclass, field
from typing import Any

from base.member import MemberState
from base.optime import NULL_OPTIME, OpTime
from tests.sim import mutations, rpc
from tests.sim.checkers import check
from tests.sim.clients import ClientResult
from tests.sim.disk import Disk, Entry, EntryKind, fold
from tests.sim.history import (
    Ack,
    Committed,
    CutOff,
    FinalState,
    History,
    MajorityRead,
    RolledBack,
    Stored,
    SyncView,
)
from tests.sim.network import Network
from tests.sim.node import INF, SimNode
from tests.sim.pool import in_processes
from tests.sim.scenario import Fault, Scenario, make_scenario
from tests.sim.workload import Client

MAX_EVENTS = 2_000_000
CONVERGENCE_CHECK_MS = 100
CLIENT_DELAY_MS = (1, 5)
FIRST_CLIENT_ID = 100
INITIATE_SECS = 1_700_000_000
WATCH_MS = 50
PING_SETTLE_HEARTBEATS = 18     # the smoothed ping keeps 0.8 ** 18 < 2 % of an old round trip
PING_SECOND_LOOK_HEARTBEATS = 3  # who syncs from whom is noted this long before each look
CLOCK_SLACK = 1.1               # members' clocks run up to 8 % slow

# Event kinds, in the queue as (time, seq, kind, member_or_client, incarnation, payload).
DELIVER, WAKE, FSYNC, CLIENT, FAULT, HEAL, CHECK, RESUME, WATCH, PING = range(10)


@dataclass(slots=True)
class RunResult:
    seed: int
    failures: list[str]
    stats: dict[str, int] = field(default_factory=dict)
    trace: list[str] = field(default_factory=list)
    description: str = ""
    final_logs: dict[int, list[str]] = field(default_factory=dict)


class Simulation:
    def __init__(self, scenario: Scenario, *, verbose: bool = False) -> None:
        self.scenario = scenario
        self.verbose = verbose
        self.trace: list[str] = []
        seed = scenario.seed
        self.rng_disk = random.Random(seed * 7 + 1)
        self.rng_faults = random.Random(seed * 7 + 2)
        self.rng_nodes = random.Random(seed * 7 + 3)
        config = scenario.config
        self.ids = [m.id for m in config.members]
        self.arbiters = {m.id for m in config.members if m.arbiter_only}
        self.network = Network(random.Random(seed * 7 + 4), self.ids, scenario.network)
        self.clients = {FIRST_CLIENT_ID + i: Client(FIRST_CLIENT_ID + i, random.Random(seed * 7 + 10 + i), self.ids,
                                                    scenario.workload)
                        for i in range(scenario.workload.clients)}
        self.rpc_ids = itertools.count(1)
        self.queue: list[tuple[int, int, int, int, int, Any]] = []
        self.seq = itertools.count()
        self.now = 0
        self.events = 0
        self.disks = {m: self._initial_disk(m) for m in self.ids}
        self.nodes: dict[int, SimNode | None] = {}
        self.incarnation = dict.fromkeys(self.ids, 0)
        self.paused_until = dict.fromkeys(self.ids, 0)
        self.disk_stalled_until = dict.fromkeys(self.ids, 0)
        self.held: dict[int, list[tuple[int, int, int, int, int, Any]]] = {m: [] for m in self.ids}
        self.scheduled_wake = dict.fromkeys(self.ids, INF)
        self.last_state: dict[int, MemberState] = {}
        self.marked: dict[int, tuple[OpTime, int]] = {}
        voting_data = frozenset(m.id for m in config.members if m.votes > 0 and m.data_bearing)
        settings = config.settings
        self.heartbeat_ms = settings.heartbeat_interval_ms
        stepdown_bound = (settings.election_timeout_ms + settings.heartbeat_timeout_secs * 1000
                          + 2 * settings.heartbeat_interval_ms) * CLOCK_SLACK + 2 * WATCH_MS
        self.history = History(write_majority=config.write_majority_count, voting_data_members=voting_data,
                               liveness_bound_ms=scenario.liveness_bound_ms, stepdown_bound_ms=int(stepdown_bound))
        self.voters = frozenset(m.id for m in config.members if m.votes > 0)
        self.majority_votes = config.majority_vote_count
        self.cut_since: dict[int, tuple[int, int]] = {}   # primary -> (term, since) while it reaches no majority
        self.drift = (0, 0, 0)                              # the ping phase: (slowed member, primary, added ms)
        self.noted_sources: dict[int, int | None] = {}
        self.stats = {"events": 0, "elections": 0, "rollbacks": 0, "crashes": 0, "acks": 0, "writes_failed": 0}
        self.finished = False
        self.lost_entries = 0            # committed, not yet durable, when their member crashed
        self.reports_on_get_more = 0     # of members since crashed

    # -- setup ----------------------------------------------------------------------------------------

    def _initial_disk(self, member: int) -> Disk:
        """After replSetInitiate: the config is stored and the oplog holds the "initiating set" entry."""
        disk = Disk()
        if member not in self.arbiters:
            disk.commit([Entry(OpTime(INITIATE_SECS, 1, -1), EntryKind.INITIATE)])
            disk.sync()
            disk.journal.clear()
        return disk

    def _start_node(self, member: int) -> None:
        self.incarnation[member] += 1
        first = self.incarnation[member] == 1
        trace = self._trace if self.verbose else None
        node = SimNode(member, self.scenario.config, self.disks[member], self.scenario.clocks[member],
                       random.Random(self.rng_nodes.getrandbits(64)), self.now, self.rpc_ids.__next__,
                       initiator=first and member == self.ids[0], trace=trace)
        self.nodes[member] = node
        self.last_state[member] = node.state
        self.marked[member] = (NULL_OPTIME, -1)
        self.scheduled_wake[member] = INF
        self._after_step(member)

    def _trace(self, what: str) -> None:
        self.trace.append(f"{self.now:>8} {what}")

    # -- the event queue ------------------------------------------------------------------------------

    def _push(self, at: int, kind: int, who: int = -1, incarnation: int = 0, payload: Any = None) -> None:
        heapq.heappush(self.queue, (at, next(self.seq), kind, who, incarnation, payload))

    def run(self) -> RunResult:
        for m in self.ids:
            self._start_node(m)
        for client in self.clients.values():
            self._push(client.next_op_at, CLIENT, client.id)
        for fault in self.scenario.faults:
            self._push(fault.at_ms, FAULT, payload=fault)
        self._push(self.scenario.safety_ms, HEAL)
        self._push(WATCH_MS, WATCH)
        try:
            self._loop()
        except Exception as exc:  # a crash in a member step is a finding, reported with its seed
            where = traceback.extract_tb(exc.__traceback__)[-1]
            self.history.problems.append(f"{type(exc).__name__} at {self.now} ms: {exc} "
                                         f"({where.filename.rsplit('/', 1)[-1]}:{where.lineno})")
            if self.verbose:
                self.trace.append(traceback.format_exc())
        for member in list(self.cut_since):
            self._end_cut(member, stepped_down=False)
        self._record_final()
        self.stats["events"] = self.events
        self.stats["sim_ms"] = self.now
        self.stats["entries lost in crashes"] = self.lost_entries
        self.stats["positions on getMore"] = self.reports_on_get_more + sum(
            n.source.reports_received for n in self.nodes.values() if n is not None)
        failures = check(self.history)
        logs = {m: [e.describe() for e in d.oplog] for m, d in self.disks.items()} if self.verbose else {}
        return RunResult(self.scenario.seed, failures, dict(self.stats), self.trace, self.scenario.describe(), logs)

    def _loop(self) -> None:
        while self.queue and not self.finished:
            self.events += 1
            if self.events > MAX_EVENTS:
                self.history.problems.append(f"the run needed more than {MAX_EVENTS} events")
                return
            event = heapq.heappop(self.queue)
            at, _seq, kind, who, incarnation, payload = event
            self.now = at
            if kind in (DELIVER, WAKE, FSYNC) and who in self.paused_until and self.paused_until[who] > at:
                self.held[who].append(event)  # a paused process handles nothing until it resumes
                continue
            if kind == DELIVER:
                self._deliver(who, payload)
            elif kind == WAKE:
                self._wake(who, incarnation, at)
            elif kind == FSYNC:
                self._fsync_done(who, incarnation)
            elif kind == CLIENT:
                self._client_step(who)
            elif kind == FAULT:
                self._apply_fault(payload)
            elif kind == HEAL:
                self._heal()
            elif kind == RESUME:
                self._resume(who)
            elif kind == WATCH:
                self._watch()
            elif kind == PING:
                self._ping_phase(payload)
            else:
                self._check_convergence()

    # -- members ------------------------------------------------------------------------------------

    def _wake(self, member: int, incarnation: int, at: int) -> None:
        node = self.nodes.get(member)
        if node is None or incarnation != self.incarnation[member] or self.scheduled_wake[member] != at:
            return
        self.scheduled_wake[member] = INF
        node.tick(self.now)
        self._after_step(member)

    def _fsync_done(self, member: int, incarnation: int) -> None:
        node = self.nodes.get(member)
        if node is None or incarnation != self.incarnation[member]:
            return
        node.on_fsync_done(self.now)
        self._after_step(member)

    def _after_step(self, member: int) -> None:
        node = self.nodes[member]
        assert node is not None
        for dst, packet in node.outbox:
            self._observe_outgoing(member, dst, packet)
            self._send(member, dst, packet)
        node.outbox.clear()
        if node.fsync_started:
            node.fsync_started = False
            lo, hi = self.scenario.fsync_ms
            latency = self.rng_disk.randint(lo, hi)
            if self.rng_disk.random() < self.scenario.slow_fsync_probability:
                latency += self.rng_disk.randint(50, 500)
            latency = max(latency, self.disk_stalled_until[member] - self.now)
            self._push(self.now + latency, FSYNC, member, self.incarnation[member])
        self._observe_disk(member, node.disk)
        self._observe_state(member, node)
        node.check_invariants()
        wake = node.next_wakeup()
        if wake < INF:
            at = max(node.clock.global_ms_at(wake), self.now + 1)
            if at < self.scheduled_wake[member] or self.scheduled_wake[member] < self.now:
                self.scheduled_wake[member] = at
                self._push(at, WAKE, member, self.incarnation[member])

    # -- the network ----------------------------------------------------------------------------------

    def _send(self, src: int, dst: int, packet: rpc.Request | rpc.Reply) -> None:
        if src >= FIRST_CLIENT_ID or dst >= FIRST_CLIENT_ID:
            self._push(self.now + self.rng_faults.randint(*CLIENT_DELAY_MS), DELIVER, dst, 0, (src, packet))
            return
        for delay in self.network.delays_for(src, dst, self.now, ordered=packet.kind == rpc.FETCH):
            self._push(self.now + delay, DELIVER, dst, 0, (src, packet))

    def _deliver(self, dst: int, payload: tuple[int, rpc.Request | rpc.Reply]) -> None:
        src, packet = payload
        member_link = src < FIRST_CLIENT_ID and dst < FIRST_CLIENT_ID
        if member_link and not self.network.landed(src, dst):
            return
        if dst >= FIRST_CLIENT_ID:
            client = self.clients[dst]
            if isinstance(packet, rpc.Reply):
                client.on_reply(self.now, packet)
                self._schedule_client(client.id)
            return
        node = self.nodes.get(dst)
        if node is None:
            if isinstance(packet, rpc.Request):  # nothing listens: the connection is refused
                self._send(dst, src, rpc.Reply(packet.rpc_id, dst, packet.kind, None, rpc.REFUSED))
            return
        node.deliver(self.now, packet)
        self._after_step(dst)

    # -- clients --------------------------------------------------------------------------------------

    def _client_step(self, client_id: int) -> None:
        client = self.clients[client_id]
        out = client.tick(self.now, next(self.rpc_ids))
        if out is not None:
            dst, request = out
            self._send(client_id, dst, request)
        self._schedule_client(client_id)

    def _schedule_client(self, client_id: int) -> None:
        wake = self.clients[client_id].next_wakeup()
        if wake < INF:
            self._push(max(wake, self.now), CLIENT, client_id)

    # -- observing --------------------------------------------------------------------------------------

    def _observe_outgoing(self, member: int, dst: int, packet: rpc.Request | rpc.Reply) -> None:
        if dst < FIRST_CLIENT_ID or not isinstance(packet, rpc.Reply):
            return
        op = self.clients[dst].ops.get(packet.rpc_id)
        result = packet.body
        if op is None or not isinstance(result, ClientResult):
            return
        node = self.nodes[member]
        assert node is not None
        if op.kind == "write" and result.code == 0 and result.optime is not None:
            index = node.disk.index_of(result.optime)
            if index is None:
                self.history.problems.append(f"m{member} acknowledged write {op.write_id} at {result.optime}, "
                                             f"which is not in its oplog")
                return
            self.stats["acks"] += 1
            self.history.acks.append(Ack(self.now, member, op.write_id, op.w, result.optime, node.disk.chain[index]))
        elif op.kind == "write" and result.code != 0 and not result.written:
            self.stats["writes_failed"] += 1
            self.history.failed_writes.add(op.write_id)
        elif op.kind == "read" and op.majority and result.code == 0:
            write_id = result.value[1] if result.value is not None else None
            self.history.majority_reads.append(MajorityRead(self.now, member, op.key, write_id))

    def _observe_disk(self, member: int, disk: Disk) -> None:
        for event in disk.journal:
            if event.kind == "committed":
                self.history.applied.extend(Stored(self.now, member, h) for h in event.hashes)
            elif event.kind == "lost":
                self.history.lost_in_crash.update(e.write_id for e in event.entries if e.write_id >= 0)
            elif event.kind == "synced":
                self.history.stored.extend(Stored(self.now, member, h) for h in event.hashes)
            elif event.kind == "saved":
                self.history.saved_writes.update(e.write_id for e in event.entries if e.write_id >= 0)
            else:
                self.stats["rollbacks"] += 1
                self.history.rolled_back.extend(RolledBack(self.now, member, e.optime, h, e.write_id)
                                                for e, h in zip(event.entries, event.hashes))
        disk.journal.clear()

    def _observe_state(self, member: int, node: SimNode) -> None:
        if node.state is MemberState.PRIMARY and self.last_state.get(member) is not MemberState.PRIMARY:
            self.stats["elections"] += 1
            self.history.primaries.append((self.now, member, node.term))
        self.last_state[member] = node.state
        if node.refused_rollbacks:
            self.history.problems.append(f"m{member} refused a rollback at {self.now} ms: its commit point "
                                         f"{node.commit_point} is past the common point with its sync source")
            node.refused_rollbacks = 0
        marked, index = self.marked[member]
        commit = node.commit_point
        if commit <= marked:
            return
        disk = node.disk
        new_index = disk.index_of(commit)
        if new_index is None:
            self.history.problems.append(f"m{member}'s commit point {commit} is not in its oplog at {self.now} ms")
            self.marked[member] = (commit, index)
            return
        for i in range(index + 1, new_index + 1):
            self.history.committed.append(Committed(self.now, member, disk.oplog[i].optime, disk.chain[i]))
        self.marked[member] = (commit, new_index)

    # -- faults ---------------------------------------------------------------------------------------

    def _primary(self) -> int | None:
        primaries = [m for m, node in self.nodes.items() if node is not None and node.is_primary]
        return max(primaries, key=lambda m: self.nodes[m].term) if primaries else None  # type: ignore[union-attr]

    def _apply_fault(self, fault: Fault) -> None:
        if self.verbose:
            self._trace(f"FAULT {fault.action} {fault.args}")
        match fault.action:
            case "crash":
                self._crash(fault.args[0])
            case "crash_primary":
                primary = self._primary()
                if primary is not None:
                    self._crash(primary)
                    self._push(self.now + fault.args[0], FAULT, payload=Fault(self.now, "restart", (primary,)))
            case "restart":
                if self.nodes.get(fault.args[0]) is None:
                    self._start_node(fault.args[0])
            case "isolate_primary":
                primary = self._primary()
                if primary is not None:
                    self.network.isolate(primary)
                    self._push(self.now + fault.args[0], FAULT, payload=Fault(self.now, "heal_partition"))
            case "partition":
                group = list(fault.args)
                self.network.partition([group, [m for m in self.ids if m not in group]])
            case "heal_partition":
                self.network.heal()
            case "block":
                self.network.block(fault.args[0], fault.args[1])
            case "unblock":
                self.network.blocked.discard((fault.args[0], fault.args[1]))
            case "pause":
                member, duration = fault.args
                self.paused_until[member] = max(self.paused_until[member], self.now + duration)
                self._push(self.paused_until[member], RESUME, member)
            case "disk_stall":
                member, duration = fault.args
                self.disk_stalled_until[member] = max(self.disk_stalled_until[member], self.now + duration)
            case "clock_step":
                member, step = fault.args
                self.scenario.clocks[member].wall_skew_ms += step
            case "weather":
                loss, dup, spikes = fault.args
                self.network.set_faults(loss=loss / 100, duplication=dup / 100, spike_probability=spikes / 100)

    def _resume(self, member: int, *, force: bool = False) -> None:
        """The pause ended: everything that arrived meanwhile is handled now, in arrival order."""
        if force:
            self.paused_until[member] = 0
        if self.paused_until[member] > self.now:
            return
        for _at, _seq, kind, who, incarnation, payload in self.held[member]:
            if kind != WAKE:
                self._push(self.now, kind, who, incarnation, payload)
        self.held[member] = []
        if self.nodes.get(member) is not None:  # timers that expired during the pause fire now
            self.scheduled_wake[member] = self.now
            self._push(self.now, WAKE, member, self.incarnation[member])

    def _crash(self, member: int) -> None:
        if self.nodes.get(member) is None:
            return
        if self.verbose:
            self._trace(f"m{member} CRASH (unsynced writes lost)")
        self.stats["crashes"] += 1
        node = self.nodes[member]
        assert node is not None
        self.reports_on_get_more += node.source.reports_received
        self.nodes[member] = None
        self.lost_entries += len(self.disks[member].crash())
        self._observe_disk(member, self.disks[member])
        self.incarnation[member] += 1
        self._resume(member, force=True)

    # -- liveness -------------------------------------------------------------------------------------

    def _heal(self) -> None:
        if self.verbose:
            self._trace("HEAL: liveness phase")
        self.queue = [e for e in self.queue if e[2] != FAULT]
        heapq.heapify(self.queue)
        self.network.heal()
        self.network.set_faults(loss=0.0, duplication=0.0, spike_probability=0.0)
        for m in self.ids:
            self._resume(m, force=True)
            self.disk_stalled_until[m] = 0
            if self.nodes.get(m) is None:
                self._start_node(m)
        for client in self.clients.values():
            client.stopped = True
        self.history.heal_ms = self.now
        self._push(self.now + CONVERGENCE_CHECK_MS, CHECK)

    def _check_convergence(self) -> None:
        if self._converged():
            self.history.converged_ms = self.now
            self._ping_phase(0)
        elif self.now - (self.history.heal_ms or 0) >= self.scenario.liveness_bound_ms:
            self.finished = True
        else:
            self._push(self.now + CONVERGENCE_CHECK_MS, CHECK)

    def _converged(self) -> bool:
        nodes = {m: n for m, n in self.nodes.items() if n is not None}
        if len(nodes) != len(self.ids):
            return False
        primaries = [n for n in nodes.values() if n.is_primary]
        if len(primaries) != 1:
            return False
        primary = primaries[0]
        top = (len(primary.disk.oplog), primary.disk.last_hash)
        for m, node in nodes.items():
            if m in self.arbiters:
                if node.state is not MemberState.ARBITER:
                    return False
                continue
            disk = node.disk
            if node.state not in (MemberState.PRIMARY, MemberState.SECONDARY) or not disk.all_durable:
                return False
            if (len(disk.oplog), disk.last_hash) != top or node.commit_point != disk.last:
                return False
            if node.topology.primary_id(node.state, node.term) != primary.id:
                return False
        datas = [n.disk.data for m, n in nodes.items() if m not in self.arbiters]
        return all(d == datas[0] for d in datas) and datas[0] == fold(primary.disk.oplog)

    # -- watching a primary that reaches no majority -------------------------------------------------

    def _reaches_majority(self, member: int) -> bool:
        blocked = self.network.blocked
        reached = sum(1 for other in self.voters
                      if other == member or (self.nodes.get(other) is not None and self.paused_until[other] <= self.now
                                             and (member, other) not in blocked and (other, member) not in blocked))
        return reached >= self.majority_votes

    def _end_cut(self, member: int, *, stepped_down: bool) -> None:
        term, since = self.cut_since.pop(member)
        self.history.cut_offs.append(CutOff(member, term, since, self.now, stepped_down))

    def _watch(self) -> None:
        for member, node in self.nodes.items():
            primary = node is not None and node.is_primary
            if member in self.cut_since:
                if not primary or node.term != self.cut_since[member][0]:  # type: ignore[union-attr]
                    self._end_cut(member, stepped_down=True)
                elif self._reaches_majority(member):
                    self._end_cut(member, stepped_down=False)
                elif self.paused_until[member] > self.now:
                    del self.cut_since[member]      # a paused process cannot step down; count again once it runs
            elif primary and self.paused_until[member] <= self.now and not self._reaches_majority(member):
                self.cut_since[member] = (node.term, self.now)  # type: ignore[union-attr]
        if not self.finished:
            self._push(self.now + WATCH_MS, WATCH)

    # -- the ping phase ---------------------------------------------------------------------------------

    def _ping_phase(self, step: int) -> None:
        """0: slow down one secondary's link to the primary; 1 and 3: note who syncs from whom; 2: look
        (a member that changed its source since the note is still deciding), and heal the link; 4: look,
        and end the run."""
        primary = self._primary()
        sources = self._sources()
        if primary is None or not sources:
            self.finished = True
            return
        settle = int(PING_SETTLE_HEARTBEATS * self.heartbeat_ms * CLOCK_SLACK)
        second_look = int(PING_SECOND_LOOK_HEARTBEATS * self.heartbeat_ms * CLOCK_SLACK)
        if step == 0:
            direct = [m for m, s in sources.items() if s == primary]
            slowed = max(direct[1:] or sources)
            p = self.scenario.network
            self.drift = (slowed, primary, 2 * p.max_delay_ms + 2 * p.jitter_ms + 40)
            self.network.extra[(slowed, primary)] = self.drift[2]
            if self.verbose:
                self._trace(f"PING: m{slowed} -> m{primary} {self.drift[2]} ms slower")
            self._push(self.now + settle - second_look, PING, payload=1)
        elif step in (1, 3):
            self.noted_sources = sources
            self._push(self.now + second_look, PING, payload=step + 1)
        else:
            slowed, _, drift_ms = self.drift
            p = self.scenario.network
            after = (f"m{slowed}'s link to the primary m{primary} {drift_ms} ms slower for "
                     f"{PING_SETTLE_HEARTBEATS} heartbeat intervals" + (", then healed as long" if step == 4 else ""))
            rtt = {(a, b): self.network.true_rtt(a, b) or 0 for a in sources for b in self.ids if a != b}
            self.history.sync_views.append(SyncView(self.now, after, primary, sources, self.voters, rtt,
                                                    margin_ms=p.jitter_ms + 0.05 * drift_ms + 2,
                                                    earlier=self.noted_sources))
            self.network.extra.clear()
            if step == 4:
                self.finished = True
                return
            self._push(self.now + settle - second_look, PING, payload=3)

    def _sources(self) -> dict[int, int | None]:
        out: dict[int, int | None] = {}
        for member, node in self.nodes.items():
            if node is not None and member not in self.arbiters and node.state is MemberState.SECONDARY:
                host = node.sync_source_host
                out[member] = node.member_id_of(host) if host else None
        return out

    def _record_final(self) -> None:
        for m in self.ids:
            if m in self.arbiters:
                continue
            node, disk = self.nodes.get(m), self.disks[m]
            self.history.final[m] = FinalState(
                state=node.state.name if node is not None else "DOWN", hashes=list(disk.chain),
                write_ids=[e.write_id for e in disk.oplog], last_optime=disk.last,
                commit_point=node.commit_point if node is not None else NULL_OPTIME,
                data=dict(disk.data), folded=fold(disk.oplog))


def run_seed(seed: int, *, bugs: frozenset[str] = frozenset(), verbose: bool = False) -> RunResult:
    """Runs one seed, with the named known bugs (`tests.sim.mutations`) put back into the product."""
    with mutations.applied(bugs):
        return Simulation(make_scenario(seed), verbose=verbose).run()


def _run_one(args: tuple[int, frozenset[str]]) -> RunResult:
    seed, bugs = args
    result = run_seed(seed, bugs=bugs)
    result.trace = []
    return result


def run_seeds(seeds: list[int], *, bugs: frozenset[str] = frozenset(), jobs: int = 1) -> list[RunResult]:
    """Runs `seeds` (in `jobs` processes when > 1); results come back in seed order."""
    return in_processes(_run_one, [(seed, bugs) for seed in seeds], jobs)
