"""Everything one seed decides before the run starts: the set, its settings, the network,
the clocks, the disk, the workload and the fault schedule of the safety phase.

Config shapes cover plain sets of three and five voters, priorities (takeovers),
a priority-0 member, a primary-secondary-arbiter set and a non-voting member.
Settings scale the product's defaults (heartbeat 2 s, election timeout 10 s)
down so that a run covers many elections in little simulated time, keeping
their ratios.

Faults (TigerBeetle's "swarm testing": each seed picks its own mix and rates,
so some seeds are calm and some are brutal): crash a member and restart it
later (its unsynced writes are lost), crash or isolate whoever is primary when
the fault fires, symmetric partitions, one-way link cuts, process pauses,
wall-clock steps, disk stalls (an fsync started meanwhile completes only when
the stall ends), and network weather (loss, duplication, delay spikes).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

from base.config import ReplSetConfig, parse_config
from sync.fetching import DIVERGED_DENY_MS
from tests.sim.clock import SimClock
from tests.sim.fetcher import ROLLBACK_COMMAND_TIMEOUT_MS
from tests.sim.network import NetworkParams
from tests.sim.workload import WorkloadParams

SHAPES: tuple[tuple[str, tuple[dict[str, Any], ...]], ...] = (
    ("three voters", ({}, {}, {})),
    ("five voters", ({}, {}, {}, {}, {})),
    ("three voters, one preferred", ({"priority": 2}, {}, {})),
    ("three voters, one priority 0", ({}, {}, {"priority": 0})),
    ("primary-secondary-arbiter", ({}, {}, {"arbiterOnly": True, "priority": 0})),
    ("four members, one non-voter", ({}, {}, {}, {"votes": 0, "priority": 0})),
    ("five voters, graded priorities", ({"priority": 3}, {"priority": 2}, {}, {}, {"priority": 0})),
)
TIMINGS = ((500, 2500), (1000, 5000), (2000, 10_000))  # (heartbeat interval, election timeout) ms


@dataclass(frozen=True, slots=True)
class Fault:
    at_ms: int
    action: str          # see Simulation._apply_fault
    args: tuple[int, ...] = ()


@dataclass(slots=True)
class Scenario:
    seed: int
    shape: str
    config: ReplSetConfig
    clocks: dict[int, SimClock]
    network: NetworkParams
    workload: WorkloadParams
    faults: list[Fault] = field(default_factory=list)
    safety_ms: int = 60_000
    liveness_bound_ms: int = 60_000
    fsync_ms: tuple[int, int] = (1, 10)
    slow_fsync_probability: float = 0.0

    def describe(self) -> str:
        s = self.config.settings
        return (f"seed {self.seed}: {self.shape}, heartbeat {s.heartbeat_interval_ms} ms, election timeout "
                f"{s.election_timeout_ms} ms, {len(self.faults)} faults over {self.safety_ms} ms")


def host_of(member_id: int) -> str:
    return f"m{member_id}.sim:27017"


def make_config(members: tuple[dict[str, Any], ...], heartbeat_ms: int, election_ms: int, *,
                heartbeat_timeout_secs: int, catch_up_timeout_ms: int) -> ReplSetConfig:
    raw = {
        "_id": "rs0", "version": 1, "term": 1,
        "members": [{"_id": i, "host": host_of(i), **extra} for i, extra in enumerate(members)],
        "settings": {"heartbeatIntervalMillis": heartbeat_ms, "electionTimeoutMillis": election_ms,
                     "heartbeatTimeoutSecs": heartbeat_timeout_secs, "catchUpTimeoutMillis": catch_up_timeout_ms},
    }
    return parse_config(raw)


def liveness_bound_ms(election_ms: int) -> int:
    """How long after the faults heal the set may take to converge: a few rounds of election
    timeouts (split votes, catch-up, priority takeover), plus one rollback command that the
    faults left waiting for its 30 s timeout, plus a diverged source's 10 s deny-list entry."""
    return 10 * election_ms + ROLLBACK_COMMAND_TIMEOUT_MS + DIVERGED_DENY_MS


def make_scenario(seed: int) -> Scenario:
    rng = random.Random(seed)
    shape, members = rng.choice(SHAPES)
    heartbeat_ms, election_ms = rng.choice(TIMINGS)
    config = make_config(members, heartbeat_ms, election_ms,
                         heartbeat_timeout_secs=max(1, round(election_ms / 1000 * rng.choice((0.5, 1.0, 1.0)))),
                         catch_up_timeout_ms=rng.choice((-1, -1, 0, election_ms // 2)))
    ids = [m.id for m in config.members]
    drift = rng.choice((0, 1000, 20_000, 80_000))
    clocks = {i: SimClock(offset_ms=rng.randint(0, 10**7), drift_ppm=rng.randint(-drift, drift),
                          wall_skew_ms=rng.randint(-3000, 3000)) for i in ids}
    max_delay = rng.choice((5, 20, 100))
    network = NetworkParams(min_delay_ms=1, max_delay_ms=max_delay, jitter_ms=rng.choice((1, 10, max_delay)),
                            spike_ms=election_ms // 2)
    workload = WorkloadParams(
        clients=rng.randint(1, 3), think_min_ms=5, think_max_ms=election_ms // rng.choice((10, 25, 50)),
        read_fraction=rng.choice((0.1, 0.3)),
        write_concerns=rng.choice(((1, "majority"), (1, 2, "majority"), ("majority",), (1,),
                                   (1, len([m for m in config.members if m.data_bearing]), "majority"))),
        wtimeout_ms=rng.choice((0, election_ms // 2, election_ms * 2)),
        client_timeout_ms=election_ms * 3,
    )
    safety_ms = election_ms * rng.randint(5, 10)
    scenario = Scenario(seed, shape, config, clocks, network, workload, safety_ms=safety_ms,
                        liveness_bound_ms=liveness_bound_ms(election_ms),
                        fsync_ms=(1, rng.choice((2, 10, 30))),
                        slow_fsync_probability=rng.choice((0.0, 0.02, 0.1)))
    scenario.faults = _faults(rng, ids, election_ms, safety_ms)
    return scenario


def _faults(rng: random.Random, ids: list[int], election_ms: int, safety_ms: int) -> list[Fault]:
    """The safety phase's fault schedule: each seed draws its own mix and intensity."""
    kinds = ("crash", "crash_primary", "isolate_primary", "partition", "block", "pause", "clock_step", "weather",
             "disk_stall")
    weights = [rng.choice((0, 1, 3)) for _ in kinds]
    if not any(weights):
        return []
    count = rng.choice((0, 3, 6, 10, 16, 24))
    faults: list[Fault] = []
    for _ in range(count):
        at = rng.randint(0, safety_ms)
        kind = rng.choices(kinds, weights)[0]
        duration = rng.randint(election_ms // 5, election_ms * 4)
        member = rng.choice(ids)
        match kind:
            case "crash":
                faults.append(Fault(at, kind, (member,)))
                if rng.random() < 0.85:
                    faults.append(Fault(at + duration, "restart", (member,)))
            case "crash_primary" | "isolate_primary":
                faults.append(Fault(at, kind, (duration,)))
            case "partition":
                shuffled = rng.sample(ids, len(ids))
                cut = rng.randint(1, len(ids) - 1)
                faults.append(Fault(at, "partition", tuple(shuffled[:cut])))
                faults.append(Fault(at + duration, "heal_partition"))
            case "block":
                other = rng.choice([i for i in ids if i != member])
                faults.append(Fault(at, "block", (member, other)))
                faults.append(Fault(at + duration, "unblock", (member, other)))
            case "pause":
                faults.append(Fault(at, "pause", (member, rng.randint(election_ms // 10, election_ms * 2))))
            case "clock_step":
                faults.append(Fault(at, "clock_step", (member, rng.randint(-5000, 5000))))
            case "disk_stall":
                faults.append(Fault(at, "disk_stall", (member, rng.randint(election_ms // 20, election_ms))))
            case "weather":
                faults.append(Fault(at, "weather", (rng.choice((0, 1, 5, 20)), rng.choice((0, 1, 5)),
                                                    rng.choice((0, 1, 5)))))
    faults.sort(key=lambda f: f.at_ms)
    return faults
