"""A nemesis for real-process fault tests: a seeded schedule of crashes, pauses and partitions.

Theory of operation
-------------------
`Nemesis.run` injects one fault at a time until its time budget is spent: it
picks a fault from its seeded `random.Random` (kind, target members, how long to
hold it), injects it, holds it, undoes it, and rests a moment before the next.
Every fault touches a minority of the members (or one member, the primary
included), so a majority can always elect a primary once the fault is undone:

* `kill`    — `kill -9` of one member (or a minority), restarted after the hold;
* `pause`   — SIGSTOP, then SIGCONT after the hold;
* `partition` — a random minority cannot reach the others nor be reached;
* `isolate-primary` — the current primary alone on its side;
* `one-way` — asymmetric: a member cannot reach the others, or the others cannot
  reach it (requests flow from the initiator, so one direction is cut);
* `ring`    — 5 members or more: each member reaches its ring neighbours only, so
  every member sees a majority but no two see the same one;
* `slow`    — 100-300 ms on every link of one member;
* `reset`   — every open connection of one member's links is aborted at once.

The seed decides the kinds, the sizes, the members chosen by position and the
hold times; which member is primary when a fault starts comes from the run, so
the schedule repeats but the history need not. `timeline` records what happened
and when (seconds since the start), for the report printed on a failure.

Partitions go through a `FaultProxy`: every member's peer traffic is routed
through it with the `peerRoutes` fail point, which `install_routes` sets on a
member (again after each restart: fail points live in the process).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import threading
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

from tests.support.members import Member, wait_for
from tests.support.proxy import FaultProxy
from tests.support.replica_set import ReplicaSet

KINDS = ("kill", "pause", "partition", "isolate-primary", "one-way", "ring", "slow", "reset")
WEIGHTS = {"kill": 3, "pause": 2, "partition": 3, "isolate-primary": 3, "one-way": 2, "ring": 1, "slow": 1,
           "reset": 1}
HOLD_S = {"kill": (0.5, 3.0), "pause": (1.0, 4.0), "partition": (2.0, 6.0), "isolate-primary": (3.0, 7.0),
          "one-way": (2.0, 5.0), "ring": (2.0, 5.0), "slow": (2.0, 4.0), "reset": (0.0, 0.0)}
REST_S = (0.5, 2.0)
RESTART_TIMEOUT_S = 30.0
ROUTES_TIMEOUT_S = 10.0


@dataclass(frozen=True, slots=True)
class Fault:
    kind: str
    members: tuple[Member, ...]
    hold_s: float
    detail: str = ""

    def describe(self) -> str:
        hosts = ",".join(m.host for m in self.members)
        return f"{self.kind} {hosts}{' ' + self.detail if self.detail else ''} for {self.hold_s:.1f} s"


class Nemesis:
    """Injects seeded faults into a running replica set whose peer traffic goes through `proxy`."""

    def __init__(self, rs: ReplicaSet, proxy: FaultProxy, seed: int, *, kinds: tuple[str, ...] = KINDS,
                 log: Callable[[str], None] | None = None) -> None:
        self.rs, self.proxy, self.seed = rs, proxy, seed
        self.rng = random.Random(seed)
        self.kinds = tuple(k for k in kinds if k != "ring" or len(rs.members) >= 5)
        self.counts: Counter[str] = Counter()
        self.timeline: list[tuple[float, str]] = []
        self._log = log
        self._started = time.monotonic()
        self._paused: set[int] = set()  # indexes into rs.members
        self._killed: set[int] = set()

    # -- routes -------------------------------------------------------------------------------------

    def connect(self) -> None:
        """Creates a proxy link for every ordered pair and routes every member through it."""
        self.proxy.connect_all(m.host for m in self.rs.members)
        for m in self.rs.members:
            self.install_routes(m)

    def install_routes(self, member: Member) -> None:
        routes = self.proxy.routes_for(member.host)

        def install() -> bool:
            with member.direct_client(serverSelectionTimeoutMS=2000) as client:
                client.admin.command({"configureFailPoint": "peerRoutes", "mode": "alwaysOn",
                                      "data": {"routes": routes}})
            return True

        wait_for(install, ROUTES_TIMEOUT_S, f"{member.host} to take its peer routes")

    # -- the schedule -------------------------------------------------------------------------------

    def run(self, duration_s: float, stop: threading.Event | None = None) -> None:
        """Injects faults one after another for about `duration_s` (a fault in progress is finished)."""
        stop = stop or threading.Event()
        deadline = time.monotonic() + duration_s
        self.note(f"nemesis starts, seed {self.seed}, {duration_s:.0f} s")
        while time.monotonic() < deadline and not stop.is_set():
            fault = self.plan()
            self.inject(fault)
            try:
                stop.wait(min(fault.hold_s, max(0.0, deadline - time.monotonic()) + 1.0))
            finally:
                self.undo(fault)
            stop.wait(self.rng.uniform(*REST_S))
        self.note("nemesis ends")

    def plan(self) -> Fault:
        rng, members = self.rng, self.rs.members
        kind = rng.choices(self.kinds, weights=[WEIGHTS[k] for k in self.kinds])[0]
        hold_s = round(rng.uniform(*HOLD_S[kind]), 1)
        minority = max(1, (len(members) - 1) // 2)
        picked = tuple(rng.sample(members, rng.randint(1, minority)))
        one = (picked[0],)
        want_primary = rng.random() < 0.5
        match kind:
            case "kill" | "pause":
                return Fault(kind, self._maybe_primary(picked, want_primary), hold_s)
            case "partition":
                return Fault(kind, picked, hold_s)
            case "isolate-primary":
                return Fault(kind, self._maybe_primary(one, True), hold_s)
            case "one-way":
                direction = rng.choice(["cannot reach others", "unreachable by others"])
                return Fault(kind, self._maybe_primary(one, want_primary), hold_s, direction)
            case "ring":
                order = list(members)
                rng.shuffle(order)
                return Fault(kind, tuple(order), hold_s)
            case "slow":
                return Fault(kind, one, hold_s, f"{rng.randint(100, 300)} ms")
            case _:
                return Fault(kind, self._maybe_primary(one, want_primary), hold_s)

    def _maybe_primary(self, picked: tuple[Member, ...], want_primary: bool) -> tuple[Member, ...]:
        if not want_primary:
            return picked
        primary = self.rs.primary()
        if primary is None or primary in picked:
            return picked
        return (primary, *picked[1:])

    # -- faults ---------------------------------------------------------------------------------------

    def inject(self, fault: Fault) -> None:
        self.counts[fault.kind] += 1
        self.note(f"inject {fault.describe()}")
        proxy, hosts = self.proxy, [m.host for m in fault.members]
        others = [m.host for m in self.rs.members if m.host not in hosts]
        match fault.kind:
            case "kill":
                for m in fault.members:
                    m.kill()
                    self._killed.add(self.rs.members.index(m))
            case "pause":
                for m in fault.members:
                    self.rs.pause(m)
                    self._paused.add(self.rs.members.index(m))
            case "partition" | "isolate-primary":
                proxy.partition([hosts, others])
            case "one-way" if fault.detail == "cannot reach others":
                proxy.cut(hosts, others)
            case "one-way":
                proxy.cut(others, hosts)
            case "ring":
                n = len(hosts)
                near = {(hosts[i], hosts[(i + d) % n]) for i in range(n) for d in (-1, 1)}
                proxy.set_links([(a, b) for a in hosts for b in hosts if a != b and (a, b) not in near],
                                blackholed=True)
            case "slow":
                proxy.slow(hosts[0], float(fault.detail.split()[0]))
            case "reset":
                aborted = proxy.reset(proxy.links_of(hosts[0]))
                self.note(f"reset {aborted} connections")

    def undo(self, fault: Fault) -> None:
        match fault.kind:
            case "kill":
                for m in fault.members:
                    self._restart(m)
            case "pause":
                for m in fault.members:
                    self.rs.resume(m)
                    self._paused.discard(self.rs.members.index(m))
            case "reset":
                return
            case _:
                self.proxy.heal()
        self.note(f"undo {fault.kind}")

    def _restart(self, member: Member) -> None:
        member.start()
        self.install_routes(member)
        self._killed.discard(self.rs.members.index(member))

    def heal_all(self) -> None:
        """Undoes whatever is still in effect: resumes, restarts, heals the network."""
        for i in sorted(self._paused):
            self.rs.resume(self.rs.members[i])
        self._paused.clear()
        for i in sorted(self._killed):
            self._restart(self.rs.members[i])
        self.proxy.heal()
        self.note("healed everything")

    # -- the record -------------------------------------------------------------------------------------

    def note(self, text: str) -> None:
        line = (time.monotonic() - self._started, text)
        self.timeline.append(line)
        if self._log is not None:
            self._log(f"[{line[0]:7.2f}] {text}")

    def describe(self) -> str:
        lines = [f"nemesis seed {self.seed}; faults: {dict(self.counts)}"]
        lines += [f"  [{t:7.2f}] {text}" for t, text in self.timeline]
        return "\n".join(lines)

    def summary(self) -> dict[str, Any]:
        return {"seed": self.seed, "faults": sum(self.counts.values()), "by_kind": dict(self.counts)}


# -- one run of a workload under the nemesis ---------------------------------------------------------------


@dataclass
class NemesisRun:
    """A set under a nemesis, with the workload's tasks and clients, all stopped by `nemesis_run`."""

    rs: ReplicaSet
    proxy: FaultProxy
    nemesis: Nemesis
    tasks: list[asyncio.Task[None]] = field(default_factory=list)
    clients: list[Any] = field(default_factory=list)
    stop_nemesis: threading.Event = field(default_factory=threading.Event)
    stop_workload: asyncio.Event = field(default_factory=asyncio.Event)

    def spawn(self, work: Coroutine[Any, Any, None]) -> None:
        self.tasks.append(asyncio.get_running_loop().create_task(work))

    async def faults(self, duration_s: float) -> None:
        """The nemesis for `duration_s`, then everything healed."""
        await asyncio.to_thread(self.nemesis.run, duration_s, self.stop_nemesis)
        await asyncio.to_thread(self.nemesis.heal_all)


@contextlib.asynccontextmanager
async def nemesis_run(rs: ReplicaSet, seed: int, settings: dict[str, Any],
                      after_initiate: Callable[[ReplicaSet], None] | None = None) -> AsyncIterator[NemesisRun]:
    """Starts `rs` with every member's peer traffic through a fault proxy (routes set before initiate)
    and initiates it; afterwards stops the workload's tasks and clients, heals, stops the proxy and the
    set. The nemesis's timeline is printed when the body fails."""
    proxy = FaultProxy()
    run = NemesisRun(rs, proxy, Nemesis(rs, proxy, seed, log=print))
    try:
        proxy.start()
        await asyncio.to_thread(rs.start)
        await asyncio.to_thread(run.nemesis.connect)
        await asyncio.to_thread(rs.initiate, settings)
        if after_initiate is not None:
            await asyncio.to_thread(after_initiate, rs)
        yield run
    except BaseException:
        print(run.nemesis.describe())
        raise
    finally:
        run.stop_nemesis.set()
        run.stop_workload.set()
        for task in run.tasks:
            task.cancel()
        await asyncio.gather(*run.tasks, return_exceptions=True)
        for client in run.clients:
            client.close()
        try:
            await asyncio.to_thread(run.nemesis.heal_all)
        finally:
            proxy.stop()
            await asyncio.to_thread(rs.stop)
