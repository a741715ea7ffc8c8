"""The part-log simulator: the product's part-log core for every member, in one process, driven by
one seed.

What runs is the product's pure part-log core - `oplog.parts.table_replica.TableReplica` (each
member's state of the table and its decisions: log documents as tasks, which task runs and how, the
fetch source, finishing a task, damaged parts and their refetch, the check schedule, old parts; on
the primary, the merges to log and the log entries that can go, as its leader asks them), with the
`ReplicationQueue`, `replica_rules` and `plan_merges` inside it - around a simulated clock, network
and disks. This file is the second shell around
`TableReplica` (the member's runner is the first): it carries out the same actions: the part log is a list of documents the primary appends to and
each member pulls with its own lag; fetches take the time the part's bytes need over the source's
upload bandwidth, shared by its concurrent uploads; members crash (their queue is rebuilt from the
log prefix they hold and the parts on their disk, as at a restart) and are cut off (fetches from and
to them fail, the log stops reaching them). The primary removes old log entries as the product's
does (`log_entry_obsolete`): the removal is itself a log entry, so a member pulls an entry and later its
removal (its queued task runs on), and a restarted member rebuilds from what its prefix leaves.

Disks are damaged too: a bit flips in a stored part of a member (which does not know it). The shell
checks bytes only where the core says to - a merge's sources (`Run.verify`), a part the check
schedule names (`Check`), a part about to be sent (`needs_hashing`) - and a receiver checks what it
fetched against the registered copy's checksums, as the product's fetch does.

A seed's **safety phase** inserts blocks on random members under faults; then everything heals and
the **liveness phase** requires, within a bound, every member's active parts to be exactly the part
set the log produces, every copy of them intact, and every queue empty. Checkers, all the time: no
member ever merges bytes that do not match their checksums, and no member keeps a part made from
such bytes. A scheduler exception (parts intersecting, a task in an impossible state) fails the seed
too.

    python -m tests.sim.parts --seeds 200                 # one line per failing seed, then a summary
    python -m tests.sim.parts --compare-sources --seeds 50  # catch-up time: random source vs the seed's rule

`--compare-sources` measures today's ClickHouse rule (a random live holder) against the seed
document's "largest log pointer, smallest queue" (the holder with the least `lag + queue length`),
on the same seeds: the time from the heal until every member holds every part.

Not modelled yet: inserts on a member whose commit is cut off, quorum inserts, mutations, drops and
alters, a change of primary, lost disks (so the lost-part rules are not exercised here), and the
primary's decisions (`replset.parts.leader`) beyond merge selection and log clean-up.
"""

from __future__ import annotations

import argparse
import datetime
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from oplog.parts.active_set import ActivePartSet
from oplog.parts.part_info import PartInfo, inserted_part, merged_part
from oplog.parts.queue import ReplicationQueue
from oplog.parts.replica_rules import Copy
from oplog.parts.table import parse_table_def
from oplog.parts.table_replica import (
    Check,
    Gone,
    Held,
    NotHeld,
    RemoveOld,
    Run,
    SetAside,
    TableReplica,
    checksum_docs,
    same_data,
)

STEP_MS = 20
BLOCK_BYTES = 1_000_000
UPLOAD_BYTES_PER_MS = 20_000          # 20 MB/s per member, shared by its concurrent uploads
MERGE_BYTES_PER_MS = 50_000
MERGE_EVERY_MS = 1_000
CLEANUP_EVERY_MS = 1_000
DEDUP_WINDOW = 5                       # the newest blocks whose log entries their dedup keys keep
OLD_PARTS_LIFETIME_MS = 2_000          # short (the product's is 480 s): lagging members need covering parts
CHECK_PERIOD_MS = 30_000               # the check schedule (the product's is an hour)
LIVENESS_BOUND_MS = 300_000
SUMS = {"data.parquet": (1, "x"), "columns.txt": (1, "c")}   # every intact copy of a part has these bytes
MADE_FROM_DAMAGE = {"data.parquet": (1, "made from damaged bytes"), "columns.txt": (1, "c")}
TABLE = parse_table_def("sim", "events", {"columns": [{"name": "n", "type": "int64"}], "orderBy": ["n"], "settings": {
    "oldPartsLifetimeSecs": OLD_PARTS_LIFETIME_MS // 1000, "mergeSelectingSleepMS": MERGE_EVERY_MS,
    "cleanupDelayPeriodSecs": CLEANUP_EVERY_MS // 1000}})


@dataclass
class Task:
    run: Run
    done_at: int
    source: str | None          # the member it fetches from (None: made here)
    part: PartInfo              # what it produces
    checksums: Any = None       # what it is expected to be (a fetch: the registered copy's)


def _new_replica() -> TableReplica:
    return TableReplica(TABLE, "", ReplicationQueue(), check_period_ms=CHECK_PERIOD_MS)


@dataclass
class Member:
    name: str
    replica: TableReplica = field(default_factory=_new_replica)
    applied: int = 0                                  # log documents pulled (the log pointer)
    running: dict[str, Task] = field(default_factory=dict)
    up: bool = True
    lag_ms: int = 0
    uploads: int = 0
    damaged: set[str] = field(default_factory=set)    # parts on its disk whose bytes a flipped bit changed
    made_bad: set[str] = field(default_factory=set)   # parts it made from damaged bytes (the core never lets it)

    def serves(self, part: PartInfo) -> bool:
        return part in self.replica.queue.current or part.name in self.replica.outdated

    def intact(self, name: str) -> bool:
        return name not in self.damaged and name not in self.made_bad


class PartSim:
    def __init__(self, seed: int, *, members: int = 3, rule: str = "random", damage: bool = True) -> None:
        self.rng = random.Random(seed)
        self.seed, self.rule, self.damage = seed, rule, damage
        # The primary (m0) writes the log: it has every document at once, as the product's runner pulls
        # its own commits before the leader plans again.
        self.members = [Member(f"m{i}", lag_ms=self.rng.choice((0, 20, 100, 500)) if i else 0)
                        for i in range(members)]
        self.log: list[tuple[int, dict[str, Any]]] = []     # (time appended, document)
        self.removed: set[str] = set()                       # log documents the primary removed
        self.sizes: dict[str, tuple[int, int]] = {}
        self.cut: set[str] = set()
        self.blocks = 0
        self.now = 0
        self.events: list[str] = []
        self.violations: list[str] = []                      # what a checker saw: the seed fails
        self._expected: tuple[int, list[PartInfo]] = (-1, [])
        self.refetched = 0                                   # damaged parts set aside and queued to fetch again
        self.restarts: list[tuple[int, Member]] = []      # crashed members coming back before the heal

    # -- the world ------------------------------------------------------------------------------

    def reachable(self, a: str, b: str) -> bool:
        return a == b or (a not in self.cut and b not in self.cut and self.member(a).up and self.member(b).up)

    def member(self, name: str) -> Member:
        return next(m for m in self.members if m.name == name)

    @property
    def primary(self) -> Member:
        return self.members[0]

    def register(self, part: PartInfo, member: Member, checksums: Any) -> None:
        """The registry (replicated to every member at once here) lists `member` for `part`; as the
        product's registration does, its copies of the parts `part` replaced are unregistered (a member
        that still needs one fetches the covering part)."""
        for m in self.members:
            m.replica.registry_added(part.name, member.name, member.name, checksums, m.name)
            for name in [n for n in m.replica.holders if n != part.name and part.contains(PartInfo.parse(n))]:
                m.replica.registry_removed(name, member.name, m.name)
            m.replica.take_actions()   # (Registered / Held again: nothing more to do here)

    def unregister(self, part: str, member: str) -> None:
        for m in self.members:
            m.replica.registry_removed(part, member, m.name)
        holder = self.member(member)
        if holder.up and PartInfo.parse(part) in holder.replica.queue.current:
            holder.replica.held(part, SUMS if holder.intact(part) else MADE_FROM_DAMAGE, holder.name)
        for m in self.members:
            if m.up:
                self.carry_out(m)

    # -- writes through the primary -------------------------------------------------------------

    def insert(self, member: Member) -> None:
        """A block inserted on `member`: its part is there at once, the log names it as the source."""
        if not member.up or not self.reachable(member.name, self.primary.name):
            return
        self.blocks += 1
        part = inserted_part("all", self.blocks)
        member.replica.queue.current.add(part)
        member.replica.queue.virtual.add(part)
        self.sizes[part.name] = (BLOCK_BYTES, self.now)
        self.log.append((self.now, {"_id": f"b{self.blocks}.{self.blocks}", "type": "GET_PART", "part": part.name,
                                    "source": member.name, "checksums": checksum_docs(SUMS),
                                    "blockId": str(self.blocks), "bytes": BLOCK_BYTES, "createTime": self.wall()}))
        self.register(part, member, SUMS)

    def wall(self) -> datetime.datetime:
        return datetime.datetime.fromtimestamp(self.now / 1000, datetime.UTC)

    def select_merges(self) -> None:
        """The primary's merge selection: the core's (`TableReplica.merges_due`), as its leader asks it."""
        primary = self.primary
        if not primary.up:
            return
        for sources in primary.replica.merges_due(self.now / 1000, self.now):
            new = merged_part(sources)
            if any(d.get("part") == new.name for _, d in self.log if d["type"] != "REMOVED"):
                continue
            size = sum(self.sizes.get(p.name, (0, 0))[0] for p in sources)
            self.sizes[new.name] = (size, self.now)
            self.log.append((self.now, {"_id": f"merge_{new.name}", "type": "MERGE_PARTS", "part": new.name,
                                        "sources": [p.name for p in sources], "bytes": size,
                                        "createTime": self.wall()}))

    def clear_old_log(self) -> None:
        """The primary's clean-up: the core's rule (`TableReplica.obsolete_log_entries`), with the live
        members the primary can reach and the dedup keys of the newest `DEDUP_WINDOW` blocks."""
        primary = self.primary
        if not primary.up:
            return
        live = {m.name for m in self.members if self.reachable(primary.name, m.name)}

        def dedup_key(block_id: str) -> dict[str, Any] | None:
            n = int(block_id)
            return {"log": f"b{n}.{n}"} if n > self.blocks - DEDUP_WINDOW else None

        for log_id, _block_id, _with_quorum in primary.replica.obsolete_log_entries(
                self.now / 1000, self.now, live, dedup_key, 1000):
            if log_id not in self.removed:
                self.removed.add(log_id)
                self.log.append((self.now, {"_id": log_id, "type": "REMOVED"}))

    # -- every member: the shell around its core ------------------------------------------------

    def pull(self, member: Member) -> None:
        """The log documents that reached `member` (its lag behind the primary; nothing while cut off)."""
        if not member.up or not self.reachable(member.name, self.primary.name):
            return
        while member.applied < len(self.log) and self.log[member.applied][0] + member.lag_ms <= self.now:
            doc = self.log[member.applied][1]
            member.applied += 1
            if doc["type"] == "REMOVED":
                member.replica.log_entry_removed(doc["_id"])
            else:
                member.replica.log_doc(doc)
        self.carry_out(member)

    def carry_out(self, member: Member) -> None:
        replica = member.replica
        while actions := replica.take_actions():
            for action in actions:
                if isinstance(action, Run):
                    self.start(member, action)
                elif isinstance(action, SetAside):
                    member.damaged.discard(action.part)
                    member.made_bad.discard(action.part)
                    replica.set_aside_done(action.part, self.now)
                    self.refetched += f"refetch_{action.part}" in replica.docs
                elif isinstance(action, Held) and action.register:
                    self.register(PartInfo.parse(action.part), member,
                                  action.checksums if action.checksums is not None else SUMS)
                elif isinstance(action, NotHeld):
                    self.unregister(action.part, action.member)
                elif isinstance(action, Gone):
                    self.unregister(action.part, member.name)
                elif isinstance(action, RemoveOld):
                    member.damaged.discard(action.part)
                    member.made_bad.discard(action.part)
                elif isinstance(action, Check):
                    self.hash_whole(member, action.part)

    def hash_whole(self, member: Member, part: str) -> bool:
        """The shell's check of one part: every byte against its checksums. False: damaged (the core hears)."""
        if member.intact(part):
            member.replica.verified(part, (), self.now, whole=True)
            return True
        member.replica.damaged(part, member.name)
        return False

    def start(self, member: Member, run: Run) -> None:
        replica, entry = member.replica, run.entry
        assert entry.new_part is not None
        if run.how == "drop":
            replica.task_finished(entry, self.now, produced=entry.new_part, checksums={}, me=member.name)
            return
        if run.how == "produce":
            for source in run.verify:
                if not self.hash_whole(member, source):
                    replica.task_finished(entry, self.now, error=f"{source} is damaged", me=member.name)
                    return
            bad = [p.name for p in entry.source_parts if not member.intact(p.name)]
            if bad:
                self.violations.append(f"{self.now} {member.name} merges {bad}, damaged, into {entry.new_part}")
            size = self.sizes.get(entry.new_part.name, (BLOCK_BYTES, 0))[0]
            member.running[entry.node_name] = Task(run, self.now + max(1, size // MERGE_BYTES_PER_MS), None,
                                                   entry.new_part, MADE_FROM_DAMAGE if bad else SUMS)
            return
        rank: Callable[[Copy], Any] | None = None
        if self.rule == "seed":   # the seed's rule: the holder with the least lag + queue length
            def rank(copy: Copy) -> Any:
                holder = self.member(copy.member)
                return (len(self.log) - holder.applied) + len(holder.replica.queue)
        live = {m.name for m in self.members if self.reachable(member.name, m.name)}
        source = replica.fetch_source(entry.new_part, replica.docs.get(entry.node_name, {}), me=member.name,
                                      live=live, http_of=lambda m: m, choose=self.rng.choice, rank=rank)
        if source is None:
            replica.task_finished(entry, self.now, error="no live member has the part", me=member.name)
            return
        address, part, checksums = source
        holder = self.member(address)
        holder.uploads += 1
        size = self.sizes.get(part.name, (BLOCK_BYTES, 0))[0]
        took = max(1, size * holder.uploads // UPLOAD_BYTES_PER_MS)
        member.running[entry.node_name] = Task(run, self.now + took, holder.name, part, checksums)

    def finish(self, member: Member) -> None:
        replica = member.replica
        for name, task in list(member.running.items()):
            if task.done_at > self.now:
                continue
            del member.running[name]
            entry = task.run.entry
            assert entry.new_part is not None
            if task.source is None:   # made here: kept, or the registered copy fetched if its bytes differ
                if not replica.merge_result_usable(task.part.name, task.checksums, member.name):
                    replica.task_finished(entry, self.now, error="other bytes than the registered copy",
                                          me=member.name)
                    continue
                if task.checksums is MADE_FROM_DAMAGE:
                    member.made_bad.add(task.part.name)
                replica.task_finished(entry, self.now, produced=task.part, checksums=task.checksums,
                                      me=member.name)
                continue
            holder = self.member(task.source)
            holder.uploads -= 1
            error = self.send(holder, member, task)
            if error:
                replica.fetch_failed(entry.new_part.name, task.part.name, holder.name, missing=error == "missing",
                                     primary=member is self.primary, http_of=lambda m: m)
                replica.task_finished(entry, self.now, error=f"{holder.name}: {error}", me=member.name)
                continue
            replica.fetched(entry.new_part.name)
            if task.checksums == MADE_FROM_DAMAGE:
                member.made_bad.add(task.part.name)   # it fetched, and checked, a copy made from damage
            member.damaged.discard(task.part.name)
            replica.task_finished(entry, self.now, produced=task.part, checksums=task.checksums, me=member.name)
        replica.expire(self.now)
        replica.check_due(self.now)
        self.carry_out(member)

    def send(self, holder: Member, member: Member, task: Task) -> str:
        """A part's bytes from `holder` to `member`: "" (received and checked), "missing" (the holder has no
        such part, or found its copy damaged before sending it) or why the receiver refused it."""
        if not self.reachable(member.name, holder.name) or not holder.serves(task.part):
            return "missing"
        if holder.replica.needs_hashing(task.part.name, (), now_ms=self.now) \
                and not self.hash_whole(holder, task.part.name):
            self.carry_out(holder)
            return "missing"
        sent = MADE_FROM_DAMAGE if task.part.name in holder.made_bad else \
            {"data.parquet": (1, "flipped")} if task.part.name in holder.damaged else SUMS
        return "" if same_data(sent, task.checksums) else "its bytes do not match the registered checksums"

    # -- faults -----------------------------------------------------------------------------------

    def crash(self, member: Member) -> None:
        """Down: its running tasks die. Its disk keeps its parts; the queue is rebuilt at the restart."""
        member.up = False
        for task in member.running.values():
            if task.source is not None:
                self.member(task.source).uploads -= 1
        member.running.clear()

    def restart(self, member: Member) -> None:
        """The product's rebuild: a new core from the parts on disk (damaged ones too: nothing knows yet),
        the registry, and the log prefix the member holds."""
        old = member.replica
        parts = list(old.queue.current)
        member.replica, member.up = _new_replica(), True
        member.replica.queue = ReplicationQueue(parts)
        for name, copies in old.holders.items():
            for holder, copy in copies.items():
                member.replica.add_holder(name, holder, copy.http, copy.checksums)
        prefix = [doc for _, doc in self.log[:member.applied]]
        gone = {doc["_id"] for doc in prefix if doc["type"] == "REMOVED"}
        for doc in prefix:
            if doc["_id"] not in gone and doc["type"] != "REMOVED":
                member.replica.log_doc(doc)
        self.carry_out(member)

    def flip_a_bit(self) -> None:
        """A bit flips in one stored part of a random member; the member does not know. Only a part another
        member holds intact: the damage of a part's only copy loses it in any system (the lost-part rules
        are not modelled here)."""
        victim = self.rng.choice([m for m in self.members if m.up])
        parts = sorted(p.name for p in victim.replica.queue.current
                       if any(o is not victim and p in o.replica.queue.current and o.intact(p.name)
                              for o in self.members))
        if parts:
            part = self.rng.choice(parts)
            victim.damaged.add(part)
            self.events.append(f"{self.now} damage {part} on {victim.name}")

    def fault(self) -> None:
        victim = self.rng.choice(self.members)
        kind = self.rng.choice(("crash", "cut", "lag", "damage") if self.damage else ("crash", "cut", "lag"))
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
        elif kind == "damage":
            self.flip_a_bit()

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
                member.replica.schedule(self.now)
                self.carry_out(member)
        self.select_merges()
        self.pull(self.primary)
        self.clear_old_log()
        self.now += STEP_MS

    def expected(self) -> list[PartInfo]:
        """The active parts the log produces (recomputed only when the log grew)."""
        if self._expected[0] != len(self.log):
            parts = ActivePartSet()
            for _, doc in self.log:
                if doc["type"] != "REMOVED":
                    parts.add(PartInfo.parse(doc["part"]))
            self._expected = (len(self.log), list(parts))
        return self._expected[1]

    def converged(self) -> bool:
        want = self.expected()
        return all(m.up and m.applied == len(self.log) and not len(m.replica.queue)
                   and list(m.replica.queue.current) == want and all(m.intact(p.name) for p in want)
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
            if self.violations:
                return Result(self.seed, False, 0, self.describe())
        self.heal()
        healed = self.now
        while not self.converged():
            if self.now - healed > LIVENESS_BOUND_MS or self.violations:
                return Result(self.seed, False, self.now - healed, self.describe())
            self.step()
        return Result(self.seed, True, self.now - healed, "")

    def describe(self) -> str:
        want = [p.name for p in self.expected()]
        lines = [f"seed {self.seed}: expected {want}", *self.violations, *self.events]
        for m in self.members:
            lines.append(f"  {m.name} up={m.up} applied={m.applied}/{len(self.log)} "
                         f"parts={[p.name for p in m.replica.queue.current]} damaged={sorted(m.damaged)} "
                         f"made from damage={sorted(m.made_bad)}")
            lines += [f"    {r['node_name']}: {r['postpone_reason'] or r['last_exception']}"
                      for r in m.replica.queue.view(self.now)[:5]]
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
