"""The part-log simulator: the product's replication-queue scheduler, task parsing, merge selection
and fetch-source choice for every member, in one process, driven by one seed.

What runs is the product's pure part-log core - `oplog.parts.queue.ReplicationQueue` (which task runs
next and why the others wait), `oplog.parts.replica_rules` (log documents as tasks, the fetch source,
which old log entries the primary removes),
`oplog.parts.merges.plan_merges` (the primary's merge selection) and `ActivePartSet` - around a
simulated clock, network and disks: the part log is a list of documents the primary appends to and
each member pulls with its own lag; fetches take the time the part's bytes need over the source's
upload bandwidth, shared by its concurrent uploads; members crash (their queue is rebuilt from the
log prefix they hold and the parts on their disk, as at a restart) and are cut off (fetches from and
to them fail, the log stops reaching them). The primary removes old log entries as the product's
does (`log_entry_obsolete`): the removal is itself a log entry, so a member pulls an entry and later its
removal (its queued task runs on), and a restarted member rebuilds from what its prefix leaves.

A seed's **safety phase** inserts blocks on random members under faults; then everything heals and
the **liveness phase** requires, within a bound, every member's active parts to be exactly the part
set the log produces, and every queue empty. A scheduler exception (parts intersecting, a task in an
impossible state) fails the seed too.

    python -m tests.sim.parts --seeds 200                 # one line per failing seed, then a summary
    python -m tests.sim.parts --compare-sources --seeds 50  # catch-up time: random source vs the seed's rule

`--compare-sources` measures today's ClickHouse rule (a random live holder) against the seed
document's "largest log pointer, smallest queue" (the holder with the least `lag + queue length`),
on the same seeds: the time from the heal until every member holds every part.

Not modelled yet: inserts on a member whose commit is cut off, quorum inserts, mutations, drops and
alters, a change of primary, lost disks (so the lost-part rules are not exercised here).
"""

from __future__ import annotations

import argparse
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from oplog.parts.active_set import ActivePartSet
from oplog.parts.merges import plan_merges
from oplog.parts.part_info import PartInfo, inserted_part, merged_part
from oplog.parts.queue import EntryType, QueueEntry, ReplicationQueue
from oplog.parts.replica_rules import Copy, choose_source, log_entry_obsolete, task_of

STEP_MS = 20
BLOCK_BYTES = 1_000_000
UPLOAD_BYTES_PER_MS = 20_000          # 20 MB/s per member, shared by its concurrent uploads
MERGE_BYTES_PER_MS = 50_000
MERGE_EVERY_MS = 1_000
CLEANUP_EVERY_MS = 1_000
DEDUP_WINDOW = 5                       # the newest blocks whose log entries their dedup keys keep
OLD_PARTS_LIFETIME_MS = 2_000          # short (the product's is 480 s): lagging members need covering parts
LIVENESS_BOUND_MS = 300_000
SUMS = {"data.parquet": (1, "x")}      # every copy of a part has the same bytes here


@dataclass
class Task:
    entry: QueueEntry
    done_at: int
    source: str | None          # the member it fetches from (None: made here)
    part: PartInfo              # what it produces


@dataclass
class Member:
    name: str
    queue: ReplicationQueue = field(default_factory=ReplicationQueue)
    applied: int = 0                                  # log documents pulled (the log pointer)
    docs: dict[str, dict[str, Any]] = field(default_factory=dict)
    running: dict[str, Task] = field(default_factory=dict)
    failed: dict[str, set[str]] = field(default_factory=dict)   # part -> sources that failed it
    up: bool = True
    lag_ms: int = 0
    uploads: int = 0
    outdated: dict[str, int] = field(default_factory=dict)    # parts a merge replaced -> since (still served)

    def serves(self, part: PartInfo) -> bool:
        return part in self.queue.current or part.name in self.outdated


class PartSim:
    def __init__(self, seed: int, *, members: int = 3, rule: str = "random") -> None:
        self.rng = random.Random(seed)
        self.seed, self.rule = seed, rule
        # The primary (m0) writes the log: it has every document at once, as the product's runner pulls
        # its own commits before the leader plans again.
        self.members = [Member(f"m{i}", lag_ms=self.rng.choice((0, 20, 100, 500)) if i else 0)
                        for i in range(members)]
        self.log: list[tuple[int, dict[str, Any]]] = []     # (time appended, document)
        self.removed: set[str] = set()                       # log documents the primary removed
        self.registry: dict[str, dict[str, Copy]] = {}
        self.sizes: dict[str, tuple[int, int]] = {}
        self.cut: set[str] = set()
        self.blocks = 0
        self.now = 0
        self.events: list[str] = []
        self.restarts: list[tuple[int, Member]] = []      # crashed members coming back before the heal

    # -- the world ------------------------------------------------------------------------------

    def reachable(self, a: str, b: str) -> bool:
        return a == b or (a not in self.cut and b not in self.cut and self.member(a).up and self.member(b).up)

    def member(self, name: str) -> Member:
        return next(m for m in self.members if m.name == name)

    @property
    def primary(self) -> Member:
        return self.members[0]

    def register(self, part: PartInfo, member: Member) -> None:
        """`member` holds `part`; as the product's registration does, its copies of the parts `part`
        replaced are unregistered (a member that still needs one fetches the covering part)."""
        self.registry.setdefault(part.name, {})[member.name] = Copy(member.name, member.name, SUMS)
        for name in [n for n in self.registry if n != part.name and part.contains(PartInfo.parse(n))]:
            self.registry[name].pop(member.name, None)
            if not self.registry[name]:
                del self.registry[name]

    # -- writes through the primary -------------------------------------------------------------

    def insert(self, member: Member) -> None:
        """A block inserted on `member`: its part is there at once, the log names it as the source."""
        if not member.up or not self.reachable(member.name, self.primary.name):
            return
        self.blocks += 1
        part = inserted_part("all", self.blocks)
        member.queue.current.add(part)
        member.queue.virtual.add(part)
        self.register(part, member)
        self.sizes[part.name] = (BLOCK_BYTES, self.now)
        self.log.append((self.now, {"_id": f"b{self.blocks}.{self.blocks}", "type": "GET_PART", "part": part.name,
                                    "source": member.name, "http": member.name, "checksums": SUMS}))

    def select_merges(self) -> None:
        primary = self.primary
        if not primary.up:
            return
        plans = plan_merges(primary.queue.current, primary.queue.virtual, self.sizes, self.now)
        for sources in plans:
            new = merged_part(sources)
            if any(d.get("part") == new.name for _, d in self.log if d["type"] != "REMOVED"):
                continue
            self.sizes[new.name] = (sum(self.sizes.get(p.name, (0, 0))[0] for p in sources), self.now)
            self.log.append((self.now, {"_id": f"merge_{new.name}", "type": "MERGE_PARTS", "part": new.name,
                                        "sources": [p.name for p in sources]}))

    def clear_old_log(self) -> None:
        """The primary's clean-up: the product's rule, with the live members it can reach."""
        primary = self.primary
        if not primary.up:
            return
        live = {m.name for m in self.members if self.reachable(primary.name, m.name)}
        keyed = {f"b{n}.{n}" for n in range(self.blocks - DEDUP_WINDOW + 1, self.blocks + 1)}
        for at, doc in list(self.log):
            if doc["type"] == "REMOVED" or doc["_id"] in self.removed:
                continue
            part = PartInfo.parse(doc["part"])
            covering = primary.queue.current.containing(part)
            holders = set(self.registry.get(covering.name, {})) if covering is not None and covering != part \
                else None
            if log_entry_obsolete(created_ms=at, now_ms=self.now, lifetime_ms=OLD_PARTS_LIFETIME_MS,
                                  covering_holders=holders, members=live, quorum_pending=False,
                                  names_a_dedup_key=doc["_id"] in keyed):
                self.removed.add(doc["_id"])
                self.log.append((self.now, {"_id": doc["_id"], "type": "REMOVED"}))

    # -- every member ---------------------------------------------------------------------------

    def pull(self, member: Member) -> None:
        """The log documents that reached `member` (its lag behind the primary; nothing while cut off)."""
        if not member.up or not self.reachable(member.name, self.primary.name):
            return
        while member.applied < len(self.log) and self.log[member.applied][0] + member.lag_ms <= self.now:
            doc = self.log[member.applied][1]
            member.applied += 1
            entry = task_of(doc)
            if entry is not None and member.queue.add(entry):
                member.docs[entry.node_name] = doc

    def source_for(self, member: Member, part: PartInfo, doc: dict[str, Any]) -> Any:
        registered = ((PartInfo.parse(name), copies) for name, copies in self.registry.items())
        covering = [(info, copies) for info, copies in registered if info != part and info.contains(part)
                    and member.queue.virtual.containing(info) is not None]
        live = {m.name for m in self.members if self.reachable(member.name, m.name)}
        inserter = Copy(doc["source"], doc["source"], SUMS) if doc.get("source") else None
        rank: Callable[[Copy], Any] | None = None
        if self.rule == "seed":   # the seed's rule: the holder with the least lag + queue length
            def rank(copy: Copy) -> Any:
                holder = self.member(copy.member)
                return (len(self.log) - holder.applied) + len(holder.queue)
        failed = member.failed.setdefault(part.name, set())
        source = choose_source(part, self.registry.get(part.name, {}), covering, me=member.name, live=live,
                               failed=failed, inserter=inserter, choose=self.rng.choice, rank=rank)
        if source is not None and source.forget_failures:
            failed.clear()
        return source

    def schedule(self, member: Member) -> None:
        queue = member.queue
        while (entry := queue.next_to_run(self.now)) is not None:
            queue.started(entry, self.now)
            if queue.already_done(entry) or entry.type in (EntryType.DROP_RANGE, EntryType.ALTER_METADATA):
                queue.finished(entry, self.now)
                member.docs.pop(entry.node_name, None)
                continue
            assert entry.new_part is not None
            if entry.type is EntryType.MERGE_PARTS and all(p in queue.current for p in entry.source_parts):
                size = self.sizes.get(entry.new_part.name, (BLOCK_BYTES, 0))[0]
                member.running[entry.node_name] = Task(entry, self.now + max(1, size // MERGE_BYTES_PER_MS),
                                                       None, entry.new_part)
                continue
            source = self.source_for(member, entry.new_part, member.docs.get(entry.node_name, {}))
            if source is None:
                queue.finished(entry, self.now, error="no live member has the part")
                continue
            holder = self.member(source.copy.member)
            holder.uploads += 1
            size = self.sizes.get(source.part.name, (BLOCK_BYTES, 0))[0]
            took = max(1, size * holder.uploads // UPLOAD_BYTES_PER_MS)
            member.running[entry.node_name] = Task(entry, self.now + took, holder.name, source.part)

    def finish(self, member: Member) -> None:
        for name, task in list(member.running.items()):
            if task.done_at > self.now:
                continue
            del member.running[name]
            if task.source is not None:
                self.member(task.source).uploads -= 1
            ok = task.source is None or (self.reachable(member.name, task.source)
                                         and self.member(task.source).serves(task.part))
            if not ok:
                assert task.source is not None
                member.failed.setdefault(task.entry.new_part.name if task.entry.new_part else "", set()).add(
                    task.source)
                member.queue.finished(task.entry, self.now, error=f"{task.source} went away or has no {task.part}")
                continue
            replaced = [p for p in member.queue.current.covered_by(task.part) if p != task.part]
            member.queue.finished(task.entry, self.now, produced=task.part)
            member.docs.pop(name, None)
            self.register(task.part, member)
            for part in replaced:
                member.outdated[part.name] = self.now
        for name, since in list(member.outdated.items()):
            if self.now - since >= OLD_PARTS_LIFETIME_MS:
                del member.outdated[name]

    # -- faults -----------------------------------------------------------------------------------

    def crash(self, member: Member) -> None:
        """Down: its running tasks die. Its disk keeps its parts; the queue is rebuilt at the restart."""
        member.up = False
        for task in member.running.values():
            if task.source is not None:
                self.member(task.source).uploads -= 1
        member.running.clear()

    def restart(self, member: Member) -> None:
        parts = list(member.queue.current)
        member.queue, member.docs, member.failed, member.up = ReplicationQueue(parts), {}, {}, True
        prefix = [doc for _, doc in self.log[:member.applied]]
        gone = {doc["_id"] for doc in prefix if doc["type"] == "REMOVED"}
        for doc in prefix:
            if doc["_id"] in gone:
                continue
            entry = task_of(doc)
            if entry is not None and member.queue.add(entry):
                member.docs[entry.node_name] = doc

    def fault(self) -> None:
        victim = self.rng.choice(self.members)
        kind = self.rng.choice(("crash", "cut", "lag"))
        if kind == "crash" and victim.up and victim is not self.primary:
            self.crash(victim)
            self.events.append(f"{self.now} crash {victim.name}")
            if self.rng.random() < 0.5:   # back before the heal: a rebuild from the log it holds, mid-run
                self.restarts.append((self.now + self.rng.randrange(200, 5_000), victim))
        elif kind == "cut" and victim.name not in self.cut:
            self.cut.add(victim.name)
            self.events.append(f"{self.now} cut {victim.name}")
        elif kind == "lag" and victim is not self.primary:
            victim.lag_ms = self.rng.choice((0, 100, 2_000))

    def heal(self) -> None:
        self.cut.clear()
        for member in self.members:
            if not member.up:
                self.restart(member)

    # -- running ----------------------------------------------------------------------------------

    def step(self) -> None:
        for member in self.members:
            if member.up:
                self.pull(member)
                self.finish(member)
                self.schedule(member)
        if self.now % MERGE_EVERY_MS == 0:
            self.select_merges()
            self.pull(self.primary)
        if self.now % CLEANUP_EVERY_MS == 0:
            self.clear_old_log()
        self.now += STEP_MS

    def expected(self) -> list[PartInfo]:
        parts = ActivePartSet()
        for _, doc in self.log:
            if doc["type"] != "REMOVED":
                parts.add(PartInfo.parse(doc["part"]))
        return list(parts)

    def converged(self) -> bool:
        want = self.expected()
        return all(m.up and m.applied == len(self.log) and not len(m.queue) and list(m.queue.current) == want
                   for m in self.members)

    def run(self, *, inserts: int = 60, safety_ms: int = 20_000) -> Result:
        gaps = sorted(self.rng.randrange(safety_ms) for _ in range(inserts))
        faults = sorted(self.rng.randrange(safety_ms) for _ in range(self.rng.randrange(0, 9)))
        while self.now < safety_ms:
            while gaps and gaps[0] <= self.now:
                gaps.pop(0)
                self.insert(self.rng.choice(self.members))
            while faults and faults[0] <= self.now:
                faults.pop(0)
                self.fault()
            for at, member in [r for r in self.restarts if r[0] <= self.now]:
                self.restarts.remove((at, member))
                if not member.up:
                    self.restart(member)
                    self.events.append(f"{self.now} restart {member.name}")
            self.step()
        self.heal()
        healed = self.now
        while not self.converged():
            if self.now - healed > LIVENESS_BOUND_MS:
                return Result(self.seed, False, self.now - healed, self.describe())
            self.step()
        return Result(self.seed, True, self.now - healed, "")

    def describe(self) -> str:
        want = [p.name for p in self.expected()]
        lines = [f"seed {self.seed}: expected {want}", *self.events]
        for m in self.members:
            lines.append(f"  {m.name} up={m.up} applied={m.applied}/{len(self.log)} "
                         f"parts={[p.name for p in m.queue.current]}")
            lines += [f"    {r['node_name']}: {r['postpone_reason'] or r['last_exception']}"
                      for r in m.queue.view(self.now)[:5]]
        return "\n".join(lines)


@dataclass(frozen=True)
class Result:
    seed: int
    ok: bool
    catch_up_ms: int
    report: str


def run_seed(seed: int, *, rule: str = "random") -> Result:
    sim = PartSim(seed, members=3 + seed % 3, rule=rule)
    try:
        return sim.run()
    except Exception as exc:   # a scheduler exception fails the seed, with what led to it
        return Result(seed, False, 0, f"{type(exc).__name__}: {exc}\n{sim.describe()}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, default=100)
    parser.add_argument("--start", type=int, default=0)
    parser.add_argument("--seed", type=int)
    parser.add_argument("--compare-sources", action="store_true")
    args = parser.parse_args()
    seeds = [args.seed] if args.seed is not None else list(range(args.start, args.start + args.seeds))
    if args.compare_sources:
        totals = {}
        for rule in ("random", "seed"):
            results = [run_seed(s, rule=rule) for s in seeds]
            failed = [r.seed for r in results if not r.ok]
            totals[rule] = sum(r.catch_up_ms for r in results)
            print(f"{rule:>6}: catch-up after the heal, {len(seeds)} seeds: total {totals[rule] / 1000:.1f} s "
                  f"simulated, mean {totals[rule] / len(seeds) / 1000:.2f} s, failures {failed}")
        print(f"ratio seed/random: {totals['seed'] / max(1, totals['random']):.2f}")
        return
    failures = 0
    for seed in seeds:
        result = run_seed(seed)
        if not result.ok:
            failures += 1
            print(result.report if args.seed is not None else f"seed {seed}: FAILED")
    print(f"{len(seeds)} seeds, {failures} failures")


if __name__ == "__main__":
    main()
