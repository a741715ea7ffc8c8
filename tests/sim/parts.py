"""The part-log simulator: the product's part-log core for every member, in one process, driven by
one seed.

What runs is the product's pure part-log core - `oplog.parts.table_replica.TableReplica` (each
member's state of the table and its decisions: log documents as tasks, which task runs and how, the
fetch source, finishing a task, damaged parts and their refetch, the check schedule, old parts, the
rebuild's look at the parts on disk; on the primary, the merges and rewrites to log, the log entries
that can go and the parts that are lost, as its leader asks them), with the `ReplicationQueue`,
`replica_rules`, `plan_merges` and the mutation rules inside it - and the pure rules of the insert
path (`replset.parts.commit`: which replicas count as live, which failures leave an insert's outcome
unknown and the error its client hears; `replset.parts.registry.quorum_status`), around a simulated
clock, network, disks and clients. This file is the second shell around `TableReplica` (the member's
runner is the first) and carries out the same actions.

The world. The primary's oplog is one list of documents (part-log entries, their removals, registry
documents, lost-part records, mutations, quorum records), each member pulls it with its own lag and
feeds its core, as the product's runner does from the oplog. A part is a string of its rows' tokens
(`[t3]`, `m([t1],[t2])` for a merge, `u9([t4])` for a rewrite by the mutation numbered 9): a
copy's bytes and the checksums stored with it are two strings, and a flipped bit changes only the
first. Faults: crashes (a member's queue is rebuilt from the parts on its disk and the log prefix it
holds), cuts (no fetch, log or commit crosses), lag, a flipped bit in a stored part, a lost disk (a
member restarts empty), a change of primary (a majority elects the member with the longest log; the
log entries past it are rolled back everywhere, and a member that had them rebuilds; block numbers
are the log's, so a number can name other rows than before), and a commit's reply lost on its way
back. Table changes: merges and mutations (the primary's leader logs them), partition drops and
metadata alters.

Clients insert blocks on any member, each with its own dedup token and `insertQuorum` 1..3, and
retry what the product answers as retryable (`RetryableWriteError`) with the same token until it
answers otherwise. An insert is refused when fewer replicas are live than its quorum; a quorum
insert's commit must be confirmed by a majority and its quorum reached within `QUORUM_TIMEOUT_MS`.

A seed's **safety phase** runs clients, table changes and faults; then everything heals and the
**liveness phase** requires, within a bound, every member to hold exactly the active parts the log
produces with exactly the bytes the log says (every copy checked against the rows the log's entries
name), every queue empty and every client answered. Checkers: no member ever merges or rewrites bytes
that do not match their checksums; a refused insert, or one answered with an error that is not
retryable, committed nothing; an insert answered `reached` keeps its rows exactly once (unless a
later drop removed them, or a lost disk took every copy); no block's rows are ever there twice; an
insert refused at once only when its quorum could not be met. A scheduler exception fails the seed.

Known to fail: a merged part whose every copy two faults destroyed (a flipped bit, then the disk of the
other holder lost; seed 966) is marked lost, and the merges that need it then never end: members keep
different parts. The product has no rule for it yet (ClickHouse puts an empty part in place of a lost
one, so the log goes on without its rows); seed 20367 is another (a lost insert a merge needs). And
about one seed in 200 (386, 396, 434, 501, 20085, 20180, 20318, 20470, 20820): an old primary cut off
rolls back when it returns, its rebuild sets aside a part of its disk the new log cannot vouch for
(`unverifiable_after_rollback`, `bytes_found`) or that intersects the new log's merge
(`_resolve_conflicts`), and its reads answer without that part's rows - which the log still holds in
parts not fetched yet - where a damaged part set aside makes them refuse (`read_holes`). A soak of
10,000 seeds from 545,827,200 found these (43 reads after a rollback, 5 not converged) and rarer ones: a
part declared lost when its quorum failed (`part_lost`) whose rows a merge the log keeps still holds
(545829933, 545830197: a read answers without them); an insert answered `reached` whose rows are there
twice (545828147, 545833758, 545835405) or not at all (545831322, 545832012); one answered
`failed-quorum` whose rows are there (545830559).

    python -m tests.sim.parts --seeds 200                 # one line per failing seed, then a summary
    python -m tests.sim.parts --seed 7                    # one seed's story
    python -m tests.sim.parts --compare-sources --seeds 50  # catch-up time: random source vs the seed's rule

`--compare-sources` measures today's ClickHouse rule (a random live holder) against the seed
document's "largest log pointer, smallest queue" (the holder with the least `lag + queue length`),
on the same seeds: the time from the heal until every member holds every part.
"""

from __future__ import annotations

import argparse
import datetime
import itertools
import random
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from base.config import parse_config
from base.errors import MongoError
from oplog.parts.active_set import ActivePartSet
from oplog.parts.mutations import Mutation
from oplog.parts.part_info import PartInfo, drop_range, inserted_part, merged_part, mutated_part
from oplog.parts.queue import ReplicationQueue
from oplog.parts.replica_rules import Copy
from oplog.parts.table import parse_table_def
from oplog.parts.table_replica import (
    BROKEN,
    Check,
    Checksums,
    Gone,
    Held,
    NotHeld,
    Registered,
    RemoveOld,
    Run,
    SetAside,
    TableReplica,
    Unlogged,
    checksum_docs,
    parse_checksums,
    same_data,
)
from replset.parts import commit
from replset.parts.registry import FAILED, PENDING, REACHED, quorum_status
from replset.write_concern import WriteConcern, timeout_error, write_concern_error_field
from sync.peer import PeerError
from tests.sim.pool import in_processes

STEP_MS = 20
LIVENESS_STEP_MS = 100
BLOCK_BYTES = 1_000_000
UPLOAD_BYTES_PER_MS = 20_000          # 20 MB/s per member, shared by its concurrent uploads
MERGE_BYTES_PER_MS = 50_000
MERGE_EVERY_MS = 1_000
CLEANUP_EVERY_MS = 1_000
LEADER_EVERY_MS = 200                 # registrations, lost parts: how often the primary looks
DEDUP_WINDOW = 40                      # the newest blocks whose dedup keys are kept
OLD_PARTS_LIFETIME_MS = 2_000          # short (the product's is 480 s): lagging members need covering parts
CHECK_PERIOD_MS = 30_000               # the check schedule (the product's is an hour)
QUORUM_TIMEOUT_MS = 2_000
QUORUM_LOST_AFTER_MS = 10_000
IN_DOUBT_KEEP_MS = 20_000              # an insert's temporary part in doubt, or its part published lately
REPLY_LOST = 0.1                       # how often a forwarded commit's reply is lost
READS_PER_STEP = 0.05                  # how often a client reads the whole table on some member
LIVENESS_BOUND_MS = 400_000
TABLE = parse_table_def("sim", "events", {"columns": [{"name": "n", "type": "int64"}], "orderBy": ["n"], "settings": {
    "oldPartsLifetimeSecs": OLD_PARTS_LIFETIME_MS // 1000, "mergeSelectingSleepMS": MERGE_EVERY_MS,
    "cleanupDelayPeriodSecs": CLEANUP_EVERY_MS // 1000, "quorumLostAfterMS": QUORUM_LOST_AFTER_MS,
    "replicatedDeduplicationWindow": DEDUP_WINDOW}})
TOKEN = re.compile(r"\[(\w+)\]")
PART_DOCS = ("GET_PART", "MERGE_PARTS", "MUTATE_PART", "DROP_RANGE", "ALTER_METADATA")


def sums(content: str) -> Checksums:
    """The checksums of a part whose rows are `content`."""
    return {"data.parquet": (len(content), content), "columns.txt": (1, "c")}


def tokens(content: str) -> list[str]:
    return TOKEN.findall(content)


_signatures = itertools.count(1)


@dataclass
class Dir:
    """A part's directory on a disk: `stored` is what its checksums.txt says, `actual` its bytes, `sig` its
    files' signature (sizes and times: a rename or a rewrite changes it, a flipped bit does not)."""

    stored: str
    actual: str
    sig: int = field(default_factory=lambda: next(_signatures), compare=False)

    @property
    def intact(self) -> bool:
        return self.stored == self.actual


@dataclass
class Task:
    run: Run
    done_at: int
    source: str | None          # the member it fetches from (None: made here)
    part: PartInfo              # what it produces
    checksums: Any = None       # what it is expected to be (a fetch: the registered copy's)
    content: str = ""           # what a merge or rewrite here makes


def _new_replica() -> TableReplica:
    return TableReplica(TABLE, "", ReplicationQueue(), check_period_ms=CHECK_PERIOD_MS)


@dataclass
class Member:
    name: str
    replica: TableReplica = field(default_factory=_new_replica)
    applied: int = 0                                  # oplog documents pulled (the log pointer)
    running: dict[str, Task] = field(default_factory=dict)
    up: bool = True
    lag_ms: int = 0
    uploads: int = 0
    disk: dict[str, Dir] = field(default_factory=dict)             # part directories (active, old, parked)
    temps: dict[str, tuple[str, int]] = field(default_factory=dict)   # block id -> (rows, until): in doubt
    inserting: dict[str, int] = field(default_factory=dict)        # part -> until: published by an insert here
    unreported: dict[str, Checksums] = field(default_factory=dict)  # held, the registry does not say so yet
    gone: set[str] = field(default_factory=set)                    # set aside as damaged, maybe still registered
    rolled_back: bool = False      # its log had documents a change of primary undid: it rolls back on return
    served: dict[str, str] = field(default_factory=dict)   # insert -> the part its last answered read had it in
    broken_dirs: set[str] = field(default_factory=set)   # parts set aside as damaged (`broken_<name>_<time>`)

    def serves(self, part: PartInfo) -> bool:
        return (part in self.replica.queue.current or part.name in self.replica.outdated) and part.name in self.disk


@dataclass
class Insert:
    """One client's insert of one block: retried with the same token while the answer says to."""

    token: str
    quorum: int
    answer: str = ""        # "" (not yet), ok, reached, pending, failed-quorum, refused, error
    tries: int = 0
    next_try: int = 0
    waiting: dict[str, Any] | None = None   # a committed try waiting for its write concern and quorum
    refused_with_live: int | None = None    # the live replicas the member saw when it refused
    in_doubt: bool = False                  # a try's outcome was unknown: a later refusal settles nothing
    past_window: bool = False               # a retry came after DEDUP_WINDOW newer blocks (ClickHouse's limit)


class PartSim:
    def __init__(self, seed: int, *, members: int = 3, rule: str = "random", damage: bool = True,
                 reads: bool = True) -> None:
        self.rng = random.Random(seed)
        self.seed, self.rule, self.damage, self.reads = seed, rule, damage, reads
        # The first primary (m0) writes the log: it has every document at once, as the product's runner
        # pulls its own commits before the leader plans again.
        self.members = [Member(f"m{i}:1", lag_ms=self.rng.choice((0, 20, 100, 500)) if i else 0)
                        for i in range(members)]
        self.config = parse_config({"_id": "sim", "members": [{"_id": i, "host": m.name}
                                                              for i, m in enumerate(self.members)]})
        self.primary_name = self.members[0].name
        self.log: list[tuple[int, dict[str, Any]]] = []     # (time appended, document): the primary's oplog
        self.sizes: dict[str, int] = {}
        self.cut: set[str] = set()
        self.now = 0
        self.events: list[str] = []
        self.violations: list[str] = []                      # what a checker saw: the seed fails
        self.refetched = 0                                   # damaged parts set aside and queued to fetch again
        self.holes_refused = 0                               # reads refused while such a part was not here again
        self.rolled_back = 0                                 # log documents undone by changes of primary
        self.restarts: list[tuple[int, Member]] = []        # crashed members coming back before the heal
        self.elections: list[int] = []                       # when the members cut off from the primary elect
        self.inserts: list[Insert] = []
        self.destroyed: set[str] = set()                     # tokens a lost disk took every copy of
        self.next_leader_ms = 0
        self.next_alter = 1
        self._expected: tuple[Any, dict[str, str]] = (None, {})
        self._fold()

    # -- the primary's state: a fold of its log ------------------------------------------------------

    def _fold(self) -> None:
        """What the primary's state collections hold, from its log (again after a rollback)."""
        self.next_block = 1
        self.keys: dict[str, tuple[str, int]] = {}        # block id -> (log id, block number): dedup keys
        self.quorums: dict[str, dict[str, Any]] = {}      # block id -> quorum record
        self.removed: set[str] = set()                     # log documents removed
        self.logged_ids: set[str] = set()
        self.holders: dict[str, set[str]] = {}             # part -> members: the registry
        self.lost: set[str] = set()
        self.mutation_count = 0
        self._truth: dict[str, str] = {}
        for _, doc in self.log:
            self._fold_doc(doc)

    def _fold_doc(self, doc: dict[str, Any]) -> None:
        kind = doc["type"]
        if kind == "GET_PART":
            self.next_block = max(self.next_block, PartInfo.parse(doc["part"]).max_block + 1)
            self.keys[doc["blockId"]] = (doc["_id"], PartInfo.parse(doc["part"]).max_block)
            self._truth[doc["part"]] = doc["rows"]
        elif kind == "MERGE_PARTS":
            self._truth[doc["part"]] = "m(" + ",".join(self._truth.get(s, "?") for s in doc["sources"]) + ")"
        elif kind == "MUTATE_PART":
            self._truth[doc["part"]] = f"u{doc['version']}({self._truth.get(doc['sources'][0], '?')})"
        if kind in PART_DOCS:
            self.logged_ids.add(doc["_id"])
        if kind == "DROP_RANGE":
            self.next_block = max(self.next_block, PartInfo.parse(doc["part"]).max_block + 2)
        elif kind == "MUTATION":
            self.next_block = max(self.next_block, doc["blockNumbers"]["all"] + 1)
            self.mutation_count += 1
        elif kind == "REMOVED":
            self.removed.add(doc["_id"])
        elif kind == "KEY_GONE":
            self.keys.pop(doc["block"], None)
        elif kind == "REG":
            self.holders.setdefault(doc["part"], set()).add(doc["member"])
        elif kind == "UNREG":
            self.holders.get(doc["part"], set()).discard(doc["member"])
        elif kind == "LOST":
            self.lost.add(doc["part"])
        elif kind == "QUORUM":
            if doc["status"] == "gone":
                self.quorums.pop(doc["block"], None)
            else:
                self.quorums[doc["block"]] = {"status": doc["status"], "part": doc["part"],
                                              "required": doc["required"]}

    def append(self, doc: dict[str, Any]) -> int:
        self.log.append((self.now, doc))
        self._fold_doc(doc)
        return len(self.log)

    def truth(self, name: str) -> str | None:
        """The rows the log says part `name` holds (None: no log entry produces it)."""
        return self._truth.get(name)

    # -- the world ------------------------------------------------------------------------------

    def reachable(self, a: str, b: str) -> bool:
        return a == b or (a not in self.cut and b not in self.cut and self.member(a).up and self.member(b).up)

    def member(self, name: str) -> Member:
        return next(m for m in self.members if m.name == name)

    @property
    def primary(self) -> Member:
        return self.member(self.primary_name)

    def wall(self) -> datetime.datetime:
        return datetime.datetime.fromtimestamp(self.now / 1000, datetime.UTC)

    # -- clients --------------------------------------------------------------------------------

    def client_step(self) -> None:
        for ins in self.inserts:
            if ins.waiting is not None:
                self.wait_for(ins)
            elif not ins.answer and ins.next_try <= self.now:
                candidates = [m for m in self.members if m.up]
                if candidates:
                    self.try_insert(ins, self.rng.choice(candidates))

    def try_insert(self, ins: Insert, member: Member) -> None:
        """`insertBlock` on `member`, as the product runs it: refused when too few replicas are live, else
        written here and committed through the primary; a failure whose outcome is unknown keeps the
        temporary part and answers the product's retryable error."""
        ins.tries += 1
        live = {m.name for m in self.members if m is not member and self.reachable(member.name, m.name)}
        try:
            commit.check_live_quorum(_Node(self.config, member.name, live), ins.quorum)
        except MongoError as exc:
            self.answer(ins, "refused" if exc.code == commit.UNSATISFIABLE else "error", exc)
            ins.refused_with_live = len(live) + 1
            return
        if len(live) + 1 < ins.quorum:
            self.violations.append(f"{self.now} {member.name} took insert {ins.token} with quorum {ins.quorum}, "
                                   f"seeing {len(live) + 1} live replicas")
        block_id, rows = f"b_{ins.token}", f"[{ins.token}]"
        primary = self.primary
        key = self.keys.get(block_id)
        if key is not None and key[1] < self.next_block - DEDUP_WINDOW and self.reachable(member.name, primary.name):
            ins.past_window = True   # the documented limit of block dedup: this retry inserts the rows again
        try:
            if not self.reachable(member.name, primary.name):
                raise PeerError(f"{primary.name} did not answer _partsCommit")
            part, at, deduplicated = self.commit_on_primary(block_id, rows, member, ins.quorum)
            if member is not primary and self.rng.random() < REPLY_LOST:
                self.events.append(f"{self.now} the reply of {part} to {member.name} is lost")
                raise PeerError(f"the reply of {primary.name} to _partsCommit was lost")
        except (PeerError, MongoError) as exc:
            self.in_doubt(ins, member, block_id, rows, exc, stepped_down=False)
            return
        if not deduplicated and member is not primary:
            self.publish(member, part, rows)
        if ins.quorum == 1:
            self.answer(ins, "ok")
            return
        ins.waiting = {"member": member.name, "block": block_id, "part": part, "at": at, "rows": rows,
                       "primary": primary.name, "deadline": self.now + QUORUM_TIMEOUT_MS}

    def commit_on_primary(self, block_id: str, rows: str, source: Member, quorum: int) -> tuple[str, int, bool]:
        """The primary's commit transaction: a dedup hit answers the earlier part; else a new block number,
        the GET_PART entry naming `source`, its registration, dedup key and quorum record."""
        key = self.keys.get(block_id)
        if key is not None and key[1] >= self.next_block - DEDUP_WINDOW and key[0] not in self.removed:
            doc = next(d for _, d in self.log if d.get("_id") == key[0])
            return doc["part"], len(self.log), True
        part = inserted_part("all", self.next_block)
        self.sizes[part.name] = BLOCK_BYTES
        at = self.append({"_id": f"log_{part.name}", "type": "GET_PART", "part": part.name, "source": source.name,
                          "checksums": checksum_docs(sums(rows)), "blockId": block_id, "rows": rows,
                          "bytes": BLOCK_BYTES, "createTime": self.wall(), "quorum": quorum})
        self.append({"type": "REG", "part": part.name, "member": source.name, "checksums": checksum_docs(sums(rows))})
        if quorum > 1:
            self.append({"type": "QUORUM", "block": block_id, "part": part.name, "status": PENDING,
                         "required": quorum})
        if source is self.primary:
            self.publish(source, part.name, rows)
        self.events.append(f"{self.now} commit {part.name} ({rows}, quorum {quorum}) from {source.name}")
        return part.name, at, False

    def publish(self, member: Member, part: str, rows: str) -> None:
        """The insert's temporary part renamed to its committed name (the runner's GET_PART finds it)."""
        existing = member.disk.get(part)
        if existing is not None and existing.stored != rows:
            if PartInfo.parse(part) in member.replica.queue.current:
                return   # the product's publish finds a part of that name in use and keeps its temporary
            member.disk.pop(part)   # a stale directory of another history: set aside
        member.disk[part] = Dir(rows, rows)
        member.inserting[part] = self.now + IN_DOUBT_KEEP_MS

    def in_doubt(self, ins: Insert, member: Member, block_id: str, rows: str, exc: BaseException, *,
                 stepped_down: bool) -> None:
        if not commit.outcome_unknown(exc):
            self.answer(ins, "error", exc)
            return
        member.temps[block_id] = (rows, self.now + IN_DOUBT_KEEP_MS)
        error = commit.in_doubt_error(exc, stepped_down=stepped_down) if isinstance(exc, (PeerError, MongoError)) \
            else exc
        self.answer(ins, "retry", error)

    def wait_for(self, ins: Insert) -> None:
        """A quorum insert's commit waits for a majority to hold its entry, then for its quorum record."""
        waiting = ins.waiting
        assert waiting is not None
        if "confirmed" not in waiting:
            if waiting["primary"] != self.primary_name and len(self.log) < waiting["at"]:
                ins.waiting = None
                self.in_doubt(ins, self.member(waiting["member"]), waiting["block"], waiting["rows"],
                              MongoError(commit.NO_PRIMARY, "not primary"), stepped_down=True)
                return
            if sum(m.applied >= waiting["at"] for m in self.members) > len(self.members) // 2:
                waiting["confirmed"] = True
            elif self.now >= waiting["deadline"]:
                ins.waiting = None
                wce = write_concern_error_field(timeout_error(WriteConcern(wtimeout_ms=QUORUM_TIMEOUT_MS)))
                try:
                    commit._raise_if_unconfirmed(wce)
                except MongoError as exc:
                    self.in_doubt(ins, self.member(waiting["member"]), waiting["block"], waiting["rows"], exc,
                                  stepped_down=False)
                return
            else:
                return
        record = self.quorums.get(waiting["block"])
        status = quorum_status(record, len(self.holders.get(waiting["part"], set())) if record else 0, ins.quorum)
        if status != PENDING or self.now >= waiting["deadline"]:
            ins.waiting = None
            self.answer(ins, {REACHED: "reached", FAILED: "failed-quorum"}.get(status, "pending"))

    def answer(self, ins: Insert, what: str, error: BaseException | None = None) -> None:
        if what == "refused" and ins.in_doubt:
            what = "retry"   # only this try was refused: an earlier one may have committed; try again later
            error = MongoError(commit.UNSATISFIABLE, "", extra={"errorLabels": [commit.RETRYABLE_WRITE_ERROR]})
        if what == "retry":
            labels = error.extra.get("errorLabels", []) if isinstance(error, MongoError) else []
            if commit.RETRYABLE_WRITE_ERROR not in labels:
                what = "error"   # the client is told the insert failed
            else:
                ins.in_doubt = True
                ins.next_try = self.now + self.rng.randrange(200, 1_000)
                return
        ins.answer = what
        self.events.append(f"{self.now} insert {ins.token} (quorum {ins.quorum}): {what}"
                           + (f" {error}" if error is not None and what == "error" else ""))

    # -- the primary's leader --------------------------------------------------------------------

    def leader_step(self) -> None:
        primary = self.primary
        if not primary.up or self.primary_name in self.cut:
            return
        rt = primary.replica
        if self.now >= self.next_leader_ms:
            self.next_leader_ms = self.now + LEADER_EVERY_MS
            self.register_reports(primary)
            live = {m.name for m in self.members if self.reachable(primary.name, m.name)}
            for part, log_id, block_id, why in rt.lost_parts(primary.name, live, self.now, self.now):
                self.mark_lost(part, log_id, block_id, why)
            self.pull(primary)
        for sources in rt.merges_due(self.now / 1000, self.now):
            new = merged_part(sources)
            if f"merge_{new.name}" in self.logged_ids:
                continue
            size = sum(self.sizes.get(p.name, 0) for p in sources)
            self.sizes[new.name] = size
            self.append({"_id": f"merge_{new.name}", "type": "MERGE_PARTS", "part": new.name,
                         "sources": [p.name for p in sources], "bytes": size, "createTime": self.wall()})
        self.pull(primary)   # the leader plans from its own commits (one transaction at a time)
        for part, mutation in rt.rewrites_due(self.now / 1000, 100):
            version = mutation.versions[part.partition_id]
            new = mutated_part(part, version)
            if f"mutate_{new.name}" in self.logged_ids:
                continue
            self.sizes[new.name] = self.sizes.get(part.name, 0)
            self.append({"_id": f"mutate_{new.name}", "type": "MUTATE_PART", "part": new.name,
                         "sources": [part.name], "mutation": mutation.id, "version": version,
                         "bytes": self.sizes[new.name], "createTime": self.wall()})
        self.pull(primary)
        live = {m.name for m in self.members if self.reachable(primary.name, m.name)}

        def dedup_key(block_id: str) -> dict[str, Any] | None:
            key = self.keys.get(block_id)
            return {"log": key[0]} if key is not None and key[1] >= self.next_block - DEDUP_WINDOW else None

        for log_id, block_id, with_quorum in rt.obsolete_log_entries(self.now / 1000, self.now, live, dedup_key, 1000):
            if log_id not in self.removed:
                self.append({"_id": log_id, "type": "REMOVED"})
                record = self.quorums.get(block_id) if block_id is not None and with_quorum else None
                if record is not None:
                    self.append({"type": "QUORUM", "block": block_id, "part": record["part"], "status": "gone",
                                 "required": 0})

    def register_reports(self, primary: Member) -> None:
        """The "has part" reports that reach the primary, written as registry documents (the product's
        `register_holders`: only parts the log produces; the member's documents of the parts a merged part
        replaced go; a pending quorum is marked reached once enough members hold its part)."""
        rt = primary.replica
        for m in self.members:
            if not self.reachable(m.name, primary.name):
                continue
            for part, checksums in list(m.unreported.items()):
                if part not in rt.logged or m.name in self.holders.get(part, set()):
                    continue
                self.append({"type": "REG", "part": part, "member": m.name, "checksums": checksum_docs(checksums)})
                for old in rt.replaced_registrations(part, m.name):
                    self.append({"type": "UNREG", "part": old, "member": m.name})
                block = rt.quorum_blocks.get(part)
                record = self.quorums.get(block) if block is not None else None
                if record is not None and record["status"] == PENDING and \
                        quorum_status(record, len(self.holders.get(part, set())), record["required"]) == REACHED:
                    self.append({"type": "QUORUM", "block": block, "part": part, "status": REACHED,
                                 "required": record["required"]})
            for part in list(m.gone):
                if m.name in self.holders.get(part, set()):
                    self.append({"type": "UNREG", "part": part, "member": m.name})

    def mark_lost(self, part: str, log_id: str | None, block_id: str | None, why: str) -> None:
        if part in self.lost:
            return
        key = self.keys.get(block_id) if block_id is not None else None
        log_id = log_id if log_id is not None else (key[0] if key is not None else None)
        self.append({"type": "LOST", "part": part, "reason": why})
        if log_id is not None and log_id in self.logged_ids and log_id not in self.removed:
            self.append({"_id": log_id, "type": "REMOVED"})
        if key is not None and key[0] == log_id:
            self.append({"type": "KEY_GONE", "block": block_id})
        record = self.quorums.get(block_id) if block_id is not None else None
        if record is not None and record["status"] == PENDING and record["part"] == part:
            self.append({"type": "QUORUM", "block": block_id, "part": part, "status": FAILED,
                         "required": record["required"]})
        self.events.append(f"{self.now} lost {part}: {why}")

    # -- table changes ----------------------------------------------------------------------------

    def mutate(self) -> None:
        number = self.next_block
        self.append({"_id": f"mutation_{number}", "type": "MUTATION", "kind": "update", "filter": {},
                     "set": {"n": number}, "blockNumbers": {"all": number}, "createMs": self.now})
        self.events.append(f"{self.now} mutation {number}")

    def drop(self) -> None:
        """`dropPartition`: a DROP_RANGE over every block so far; the partition's log documents, dedup
        keys, registrations and quorum records go in the same transaction."""
        fake = drop_range("all", self.next_block)
        assert fake is not None
        for log_id, part in list(self.primary.replica.log_parts.items()):
            if fake.contains(PartInfo.parse(part)) and log_id not in self.removed:
                self.append({"_id": log_id, "type": "REMOVED"})
        for block_id, (_, number) in list(self.keys.items()):
            if number <= fake.max_block:
                self.append({"type": "KEY_GONE", "block": block_id})
        for part, members in list(self.holders.items()):
            if fake.contains(PartInfo.parse(part)):
                for m in list(members):
                    self.append({"type": "UNREG", "part": part, "member": m})
        for block_id, record in list(self.quorums.items()):
            if fake.contains(PartInfo.parse(record["part"])):
                self.append({"type": "QUORUM", "block": block_id, "part": record["part"], "status": "gone",
                             "required": 0})
        self.append({"_id": f"drop_{fake.name}", "type": "DROP_RANGE", "part": fake.name, "createTime": self.wall()})
        self.events.append(f"{self.now} drop {fake.name}")

    def alter(self) -> None:
        self.append({"_id": f"alter_{self.next_alter}", "type": "ALTER_METADATA", "version": self.next_alter})
        self.next_alter += 1

    # -- every member: the shell around its core ------------------------------------------------

    def pull(self, member: Member) -> None:
        """The oplog documents that reached `member` (its lag behind the primary; nothing while cut off)."""
        if not member.up or not self.reachable(member.name, self.primary.name):
            return
        if member.rolled_back:
            self.roll_back(member)
        replica = member.replica
        lag_ms = 0 if member is self.primary else member.lag_ms   # the primary applies its own log at once
        while member.applied < len(self.log) and self.log[member.applied][0] + lag_ms <= self.now:
            doc = self.log[member.applied][1]
            member.applied += 1
            self.apply(member, replica, doc)
        self.carry_out(member)

    def apply(self, member: Member, replica: TableReplica, doc: dict[str, Any]) -> None:
        kind = doc["type"]
        if kind in PART_DOCS:
            replica.log_doc(doc)
        elif kind == "REMOVED":
            replica.log_entry_removed(doc["_id"])
        elif kind == "REG":
            replica.registry_added(doc["part"], doc["member"], doc["member"], parse_checksums(doc["checksums"]),
                                   member.name)
        elif kind == "UNREG":
            replica.registry_removed(doc["part"], doc["member"], member.name)
        elif kind == "LOST":
            replica.part_lost(doc["part"], doc["reason"])
        elif kind == "MUTATION":
            replica.mutation_recorded(Mutation.from_document(doc))
        elif kind == "QUORUM":
            replica.quorum_settled(doc["block"])
            if doc["status"] == PENDING:
                replica.quorum_pending(doc["part"], doc["block"])
            elif doc["status"] == REACHED:
                replica.quorum_was_reached(doc["part"])

    def carry_out(self, member: Member) -> None:
        replica = member.replica
        while actions := replica.take_actions():
            for action in actions:
                if isinstance(action, Run):
                    self.start(member, action)
                elif isinstance(action, SetAside):
                    member.disk.pop(action.part, None)
                    if action.prefix == BROKEN:
                        member.broken_dirs.add(action.part)
                    replica.set_aside_done(action.part, self.now)
                    self.refetched += f"refetch_{action.part}" in replica.docs
                elif isinstance(action, Held):
                    if action.register:
                        d = member.disk.get(action.part)
                        member.unreported[action.part] = action.checksums if action.checksums is not None \
                            else sums(d.stored) if d is not None else {}
                    member.gone.discard(action.part)
                elif isinstance(action, (Registered, Unlogged)):
                    member.unreported.pop(action.part, None)
                    member.gone.discard(action.part)
                elif isinstance(action, NotHeld):
                    self.append({"type": "UNREG", "part": action.part, "member": action.member})
                elif isinstance(action, Gone):
                    member.unreported.pop(action.part, None)
                    member.gone.add(action.part)
                elif isinstance(action, RemoveOld):
                    member.disk.pop(action.part, None)
                elif isinstance(action, Check):
                    self.hash_whole(member, action.part)

    def hash_whole(self, member: Member, part: str) -> bool:
        """The shell's check of one part: its bytes against its checksums.txt and what the log recorded.
        False: damaged (the core hears)."""
        d = member.disk.get(part)
        recorded = member.replica.recorded_checksums(part, member.name)
        if d is not None and d.intact and (not recorded or same_data(sums(d.actual), recorded)):
            member.replica.verified(part, d.sig, self.now, whole=True)
            return True
        member.replica.damaged(part, member.name)
        return False

    def start(self, member: Member, run: Run) -> None:
        replica, entry = member.replica, run.entry
        assert entry.new_part is not None
        doc = replica.docs.get(entry.node_name, {})
        if run.how == "drop":
            replica.task_finished(entry, self.now, produced=entry.new_part, checksums={}, me=member.name)
            return
        if run.how == "get":
            got = self.published_here(member, entry.new_part.name, doc) or self.adopt_own(member, entry.new_part.name, doc)
            if got is not None:
                replica.task_finished(entry, self.now, produced=entry.new_part, checksums=got, me=member.name)
                return
        if run.how == "produce":
            for source in run.verify:
                if not self.hash_whole(member, source):
                    replica.task_finished(entry, self.now, error=f"{source} is damaged", me=member.name)
                    return
            dirs = [member.disk.get(p.name) for p in entry.source_parts]
            bad = [p.name for p, d in zip(entry.source_parts, dirs, strict=True) if d is None or not d.intact]
            if bad:
                self.violations.append(f"{self.now} {member.name} merges {bad}, damaged, into {entry.new_part}")
            contents = [d.actual if d is not None else "?" for d in dirs]
            content = f"u{doc.get('version')}({contents[0]})" if doc.get("type") == "MUTATE_PART" \
                else "m(" + ",".join(contents) + ")"
            size = self.sizes.get(entry.new_part.name, BLOCK_BYTES)
            member.running[entry.node_name] = Task(run, self.now + max(1, size // MERGE_BYTES_PER_MS), None,
                                                   entry.new_part, sums(content), content)
            return
        rank: Callable[[Copy], Any] | None = None
        if self.rule == "seed":   # the seed's rule: the holder with the least lag + queue length
            def rank(copy: Copy) -> Any:
                holder = self.member(copy.member)
                return (len(self.log) - holder.applied) + len(holder.replica.queue)
        live = {m.name for m in self.members if self.reachable(member.name, m.name)}
        source = replica.fetch_source(entry.new_part, doc, me=member.name,
                                      live=live, http_of=lambda m: m, choose=self.rng.choice, rank=rank)
        if source is None:
            replica.task_finished(entry, self.now, error="no live member has the part", me=member.name)
            return
        address, part, checksums = source
        holder = self.member(address)
        holder.uploads += 1
        size = self.sizes.get(part.name, BLOCK_BYTES)
        took = max(1, size * holder.uploads // UPLOAD_BYTES_PER_MS)
        member.running[entry.node_name] = Task(run, self.now + took, holder.name, part, checksums)

    def published_here(self, member: Member, part: str, doc: dict[str, Any]) -> Checksums | None:
        """An insert here published the part already (`PartsManager._published_here`)."""
        d = member.disk.get(part)
        expected = parse_checksums(doc.get("checksums", []))
        if d is None or doc.get("source") != member.name or not same_data(sums(d.stored), expected):
            return None
        return sums(d.stored)

    def adopt_own(self, member: Member, part: str, doc: dict[str, Any]) -> Checksums | None:
        """The log named this member before the commit's reply came, or instead of it: the temporary part
        whose checksums are the recorded ones is published (`adopt_temporary`)."""
        if doc.get("source") != member.name or "blockId" not in doc:
            return None
        temp = member.temps.get(str(doc["blockId"]))
        if temp is None or not same_data(sums(temp[0]), parse_checksums(doc.get("checksums", []))):
            return None
        del member.temps[str(doc["blockId"])]
        self.publish(member, part, temp[0])
        return sums(temp[0])

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
                member.disk[task.part.name] = Dir(task.content, task.content)
                replica.task_finished(entry, self.now, produced=task.part, checksums=task.checksums,
                                      me=member.name)
                continue
            holder = self.member(task.source)
            holder.uploads -= 1
            error, content = self.send(holder, member, task)
            if error:
                replica.fetch_failed(entry.new_part.name, task.part.name, holder.name, missing=error == "missing",
                                     primary=member is self.primary, http_of=lambda m: m)
                replica.task_finished(entry, self.now, error=f"{holder.name}: {error}", me=member.name)
                continue
            replica.fetched(entry.new_part.name)
            member.disk[task.part.name] = Dir(content, content)
            replica.task_finished(entry, self.now, produced=task.part, checksums=task.checksums, me=member.name)
        replica.expire(self.now)
        replica.check_due(self.now)
        for block_id in [b for b, (_, until) in member.temps.items() if until <= self.now]:
            del member.temps[block_id]
        for part in [p for p, until in member.inserting.items() if until <= self.now]:
            del member.inserting[part]
        self.carry_out(member)

    def send(self, holder: Member, member: Member, task: Task) -> tuple[str, str]:
        """A part's bytes from `holder` to `member`: ("", rows) (received and checked), ("missing", "") (the
        holder has no such part, or found its copy damaged before sending it) or why the receiver refused."""
        if not self.reachable(member.name, holder.name) or not holder.serves(task.part):
            return "missing", ""
        if holder.replica.needs_hashing(task.part.name, holder.disk[task.part.name].sig, now_ms=self.now) \
                and not self.hash_whole(holder, task.part.name):
            self.carry_out(holder)
            return "missing", ""
        sent = holder.disk[task.part.name].actual
        if not same_data(sums(sent), task.checksums):
            return "its bytes do not match the registered checksums", ""
        return "", sent

    def read(self, member: Member) -> None:
        """A client reads the whole table on `member`, as `selectParts` does: refused while a damaged part set
        aside is not here again (`read_holes`); each visible part is hashed first if its files changed since
        it was verified, and its pages' CRCs fail a read of flipped bytes (the part is then reported damaged
        and the read refused). Checkers: what is served is what the log says; and rows a member served stay
        in its later answers while the log holds them in a part containing the one they were served from
        (a read never misses a part it had: no answer with rows missing and no error)."""
        replica = member.replica
        served: dict[str, str] = {}
        refused = bool(replica.read_holes())
        self.holes_refused += refused
        for part in [] if refused else replica.visible_parts():
            d = member.disk.get(part.name)
            if d is None:
                self.violations.append(f"{self.now} {member.name} reads {part.name}, which it does not have")
                continue
            if replica.needs_hashing(part.name, d.sig) and not self.hash_whole(member, part.name):
                refused = True
                break
            if not d.intact:
                replica.damaged(part.name, member.name)
                refused = True
                break
            if d.actual != self.truth(part.name):
                self.violations.append(f"{self.now} {member.name} serves {part.name} as {d.actual}; the log says "
                                       f"{self.truth(part.name)}")
            served |= dict.fromkeys(tokens(d.actual), part.name)
        self.carry_out(member)
        if refused:
            return
        vanished = sorted(t for t, part in member.served.items() if t not in served and self.still_holds(t, part))
        if vanished:
            self.violations.append(f"{self.now} {member.name} answers a read without the rows of {vanished}, "
                                   "which it served before and the log still holds")
        member.served = served

    def still_holds(self, token: str, served_from: str) -> bool:
        """Whether the log still holds the rows of insert `token` in a part containing `served_from`, the part
        a read had them in. Rows whose part the log dropped, lost or rolled back may come back in another part
        (a client retrying the insert after a drop), which a member serves only once it has fetched it."""
        old = PartInfo.parse(served_from)
        return any(token in tokens(rows) and PartInfo.parse(name).contains(old)
                   for name, rows in self.expected().items())

    # -- faults -----------------------------------------------------------------------------------

    def crash(self, member: Member) -> None:
        """Down: its running tasks die. Its disk keeps its parts; the queue is rebuilt at the restart."""
        member.up = False
        member.inserting.clear()   # the runner's memory (temporary parts stay on disk: start-up recovers them)
        for task in member.running.values():
            if task.source is not None:
                self.member(task.source).uploads -= 1
        member.running.clear()

    def rebuild(self, member: Member, *, replaced: bool = False) -> None:
        """The product's rebuild (start-up, rollback): a new core from the parts on disk and the state
        collections as the member's log prefix leaves them - registry, lost parts, mutations, quorum
        records, the log documents not removed - then the core's look at the disk (`unlogged_here`,
        `bytes_expected` / `bytes_found`) and a "has part" report for each part it keeps."""
        for task in member.running.values():
            if task.source is not None:
                self.member(task.source).uploads -= 1
        member.running.clear()
        parts = []
        for name in member.disk:
            parts.append(PartInfo.parse(name))
        replica = member.replica = _new_replica()
        replica.queue = ReplicationQueue(parts)
        for name, d in member.disk.items():   # as `trust_sizes` at start-up and kept signatures at a rebuild
            replica.verified(name, d.sig, self.now, whole=False)
        for part in parts:
            if part not in replica.queue.current:
                replica.mark_outdated(part.name, self.now)
        prefix = [doc for _, doc in self.log[:member.applied]]
        removed = {doc["_id"] for doc in prefix if doc["type"] == "REMOVED"}
        holders: dict[tuple[str, str], Checksums] = {}
        quorums: dict[str, dict[str, Any]] = {}
        for doc in prefix:
            if doc["type"] == "REG":
                holders[(doc["part"], doc["member"])] = parse_checksums(doc["checksums"])
            elif doc["type"] == "UNREG":
                holders.pop((doc["part"], doc["member"]), None)
            elif doc["type"] == "LOST":
                replica.lost[doc["part"]] = doc["reason"]
            elif doc["type"] == "MUTATION":
                replica.mutations[doc["_id"]] = Mutation.from_document(doc)
            elif doc["type"] == "QUORUM":
                quorums[doc["block"]] = doc
        for (part, holder), checksums in holders.items():
            replica.add_holder(part, holder, holder, checksums)
        for block_id, doc in quorums.items():
            if doc["status"] == PENDING:
                replica.quorum_pending(doc["part"], block_id)
            elif doc["status"] == REACHED:
                replica.quorum_was_reached(doc["part"])
        for doc in prefix:
            if doc["type"] in PART_DOCS and doc["_id"] not in removed:
                replica.log_doc(doc)
        replica.unlogged_here(self.now, kept_until=lambda name: member.inserting.get(name, 0))
        for name in replica.bytes_expected():
            d = member.disk.get(name)
            replica.bytes_found(name, sums(d.stored) if d is not None else {})
        if replaced:
            replica.unverifiable_after_rollback()
        for part in list(replica.queue.current):
            d = member.disk.get(part.name)
            if part.name in replica.logged and d is not None:
                replica.held(part.name, sums(d.stored), member.name)
        member.unreported.clear()
        member.gone.clear()
        replica.damage_holes.update(member.broken_dirs)   # the product reads them from its directory
        replica.registrations_not_here(member.name)
        self.carry_out(member)

    def restart(self, member: Member) -> None:
        member.up = True
        if member.rolled_back and self.reachable(member.name, self.primary.name):
            self.roll_back(member)
        else:
            self.rebuild(member)

    def roll_back(self, member: Member) -> None:
        """A member whose log a change of primary undid, back in touch with the primary: its rollback
        refetches the documents it changed, as they are on the primary now (MongoDB's rollback via
        refetch), so its rebuild sees the new history's log - in which a block number may name other rows
        than the part of that name on its disk."""
        member.rolled_back = False
        member.applied = len(self.log)
        self.events.append(f"{self.now} {member.name} rolls back")
        self.rebuild(member, replaced=True)

    def lose_disk(self, member: Member) -> None:
        """Its disk is replaced: a crash, every part gone, and a restart with nothing."""
        self.crash(member)
        member.disk.clear()
        member.temps.clear()
        member.inserting.clear()
        member.broken_dirs.clear()
        member.served.clear()   # a new member: it catches up from nothing, as an initial sync does
        self.events.append(f"{self.now} lose the disk of {member.name}")
        # (An insert's temporary part in doubt is not counted: it is published only for its own commit's entry.)
        alive = {t for m in self.members for d in m.disk.values() if d.intact for t in tokens(d.actual)}
        for _, doc in self.log:
            if doc["type"] == "GET_PART":
                for t in tokens(doc["rows"]):
                    if t not in alive:
                        self.destroyed.add(t)
        self.restart(member)

    def flip_a_bit(self) -> None:
        """A bit flips in one stored part of a random member; the member does not know. Only a part another
        member holds intact: the damage of a part's only copy loses it in any system."""
        victim = self.rng.choice([m for m in self.members if m.up])
        parts = sorted(p.name for p in victim.replica.queue.current if p.name in victim.disk
                       and any(o is not victim and p.name in o.disk and o.disk[p.name].intact for o in self.members))
        if parts:
            part = self.rng.choice(parts)
            victim.disk[part].actual += "!"
            self.events.append(f"{self.now} damage {part} on {victim.name}")

    def change_primary(self) -> None:
        """The primary is cut off (since a while: it may have committed writes nobody pulled); the members, a
        majority of which still see each other, elect the one with the longest log. The log past it is
        rolled back: every member that had more rolls back when it next sees the new primary."""
        old = self.primary
        self.cut.add(old.name)
        voters = [m for m in self.members if m.up and m.name not in self.cut]
        if len(voters) <= len(self.members) // 2:
            self.events.append(f"{self.now} cut {old.name} (the primary): no majority elects another")
            return
        new = max(voters, key=lambda m: (m.applied, self.rng.random()))
        undone = len(self.log) - new.applied
        self.rolled_back += undone
        self.log = self.log[:new.applied]
        self.primary_name = new.name
        self._fold()
        self.events.append(f"{self.now} {new.name} is primary ({old.name} cut off, {undone} documents rolled back)")
        for m in self.members:
            if m.applied > len(self.log):
                m.applied = len(self.log)
                if m.up and m.name not in self.cut:
                    self.rebuild(m, replaced=True)
                else:   # it rolls back once it sees the new primary again
                    m.rolled_back = True

    def fault(self) -> None:
        victim = self.rng.choice(self.members)
        kinds = ["crash", "cut", "lag", "failover", "lose-disk"] + (["damage"] if self.damage else [])
        kind = self.rng.choice(kinds)
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
        elif kind == "failover" and self.primary_name not in self.cut:
            # The primary is cut off; it takes writes (on its own, w:1) until the others elect another one.
            self.cut.add(self.primary_name)
            self.events.append(f"{self.now} cut {self.primary_name} (the primary)")
            self.elections.append(self.now + self.rng.randrange(300, 3_000))
        elif kind == "lose-disk" and victim.up and victim is not self.primary:
            self.lose_disk(victim)
        elif kind == "damage":
            self.flip_a_bit()

    def heal(self) -> None:
        self.cut.clear()
        for member in self.members:
            member.lag_ms = min(member.lag_ms, 500) if member is not self.primary else 0
            if not member.up:
                self.restart(member)

    # -- running ----------------------------------------------------------------------------------

    def step(self, step_ms: int = STEP_MS) -> None:
        self.client_step()
        if self.reads and self.rng.random() < READS_PER_STEP:
            # (A member that has not rolled back yet serves its own history, as any "local" read does.)
            readable = [m for m in self.members if m.up and not m.rolled_back]
            if readable:
                self.read(self.rng.choice(readable))
        for member in self.members:
            if member.up:
                self.pull(member)
                self.finish(member)
                member.replica.schedule(self.now)
                self.carry_out(member)
        self.pull(self.primary)
        self.leader_step()
        self.pull(self.primary)
        self.now += step_ms

    def expected(self) -> dict[str, str]:
        """The active parts the log produces, with the rows each holds (recomputed when the log changed)."""
        key = (len(self.log), self.rolled_back)
        if self._expected[0] != key:
            self._expected = (key, self._expected_now())
        return self._expected[1]

    def _expected_now(self) -> dict[str, str]:
        parts = ActivePartSet()
        for _, doc in self.log:
            if doc["type"] in ("GET_PART", "MERGE_PARTS", "MUTATE_PART"):
                parts.add(PartInfo.parse(doc["part"]))
            elif doc["type"] == "DROP_RANGE":
                fake = PartInfo.parse(doc["part"])
                for p in [p for p in parts if fake.contains(p)]:
                    parts.remove(p)
            elif doc["type"] == "LOST":
                part = PartInfo.parse(doc["part"])
                if part in parts:
                    parts.remove(part)
        return {p.name: self.truth(p.name) or "?" for p in parts}

    def converged(self) -> bool:
        if any(not ins.answer for ins in self.inserts):
            return False
        want = self.expected()
        return all(m.up and m.applied == len(self.log) and not len(m.replica.queue)
                   and [p.name for p in m.replica.queue.current] == list(want)
                   and all(m.disk.get(n) == Dir(rows, rows) for n, rows in want.items())
                   for m in self.members)

    def check_answers(self) -> None:
        """What every client was told, against the rows the set ended with."""
        final = [t for rows in self.expected().values() for t in tokens(rows)]
        count = {t: final.count(t) for t in set(final)}
        committed: dict[str, list[int]] = {}        # token -> its GET_PART's block numbers in the log
        drops = []
        for i, (_, doc) in enumerate(self.log):
            if doc["type"] == "GET_PART":
                committed.setdefault(doc["rows"][1:-1], []).append(i)
            elif doc["type"] == "DROP_RANGE":
                drops.append((i, PartInfo.parse(doc["part"])))
        positions = {i: PartInfo.parse(doc["part"]) for i, (_, doc) in enumerate(self.log) if doc["type"] == "GET_PART"}

        def dropped(token: str) -> bool:
            return any(at > i and fake.contains(positions[i]) for i in committed.get(token, []) for at, fake in drops)

        for ins in self.inserts:
            n = count.get(ins.token, 0)
            if n > 1 and not ins.past_window:
                self.violations.append(f"insert {ins.token} ({ins.answer}): its rows are there {n} times")
            if ins.answer in ("refused", "error", "failed-quorum") and n:
                self.violations.append(f"insert {ins.token} was answered {ins.answer}, yet its rows are there")
            if ins.answer == "refused" and ins.refused_with_live is not None and ins.refused_with_live >= ins.quorum:
                self.violations.append(f"insert {ins.token} was refused with {ins.refused_with_live} live replicas "
                                       f"for quorum {ins.quorum}")
            twice_allowed = n > 1 and ins.past_window   # (the dedup window's documented limit, as above)
            if ins.answer == "reached" and n != 1 and not twice_allowed and not dropped(ins.token) \
                    and ins.token not in self.destroyed:
                self.violations.append(f"insert {ins.token} was answered reached, and its rows are there {n} times")

    def run(self, *, inserts: int = 60, safety_ms: int = 20_000) -> Result:
        starts = sorted(self.rng.randrange(safety_ms) for _ in range(inserts))
        for i, at in enumerate(starts):
            self.inserts.append(Insert(f"t{i}", self.rng.choice((1, 1, 2, 2, 3)), next_try=at))
        faults = sorted(self.rng.randrange(safety_ms) for _ in range(self.rng.randrange(0, 9)))
        changes = sorted((self.rng.randrange(safety_ms), self.rng.choice(("mutate", "drop", "alter")))
                         for _ in range(self.rng.randrange(0, 4)))
        while self.now < safety_ms:
            while faults and faults[0] <= self.now:
                faults.pop(0)
                self.fault()
            while changes and changes[0][0] <= self.now:
                _, what = changes.pop(0)
                if self.primary.up and self.primary_name not in self.cut:
                    getattr(self, what)()
            for at in [e for e in self.elections if e <= self.now]:
                self.elections.remove(at)
                if self.primary_name in self.cut:
                    self.change_primary()
            for at, member in [r for r in self.restarts if r[0] <= self.now]:
                self.restarts.remove((at, member))
                if not member.up:
                    self.restart(member)
                    self.events.append(f"{self.now} restart {member.name}")
            self.step()
            if self.violations:
                return self.failed(0)
        self.heal()
        healed = self.now
        while not self.converged():
            if self.now - healed > LIVENESS_BOUND_MS or self.violations:
                return self.failed(self.now - healed)
            self.step(STEP_MS if self.now - healed < 10_000 else LIVENESS_STEP_MS)
        self.check_answers()
        if self.violations:
            return self.failed(self.now - healed)
        return Result(self.seed, True, self.now - healed, "")

    def failed(self, catch_up_ms: int) -> Result:
        reason = self.violations[0] if self.violations else (
            f"not converged {LIVENESS_BOUND_MS} ms after the heal (members' parts or queues differ)")
        return Result(self.seed, False, catch_up_ms, self.describe(), reason)

    def describe(self) -> str:
        want = self.expected()
        lines = [f"seed {self.seed}: expected {want}", *self.violations, *self.events[-80:]]
        for m in self.members:
            lines.append(f"  {m.name} up={m.up} applied={m.applied}/{len(self.log)} "
                         f"parts={[p.name for p in m.replica.queue.current]} "
                         f"not as logged={sorted(n for n, d in m.disk.items() if n in want and d.actual != want[n])}")
            lines += [f"    {r['node_name']}: {r['postpone_reason'] or r['last_exception']}"
                      for r in m.replica.queue.view(self.now)[:5]]
        lines += [f"  unanswered {ins.token} (quorum {ins.quorum}, {ins.tries} tries)"
                  for ins in self.inserts if not ins.answer]
        return "\n".join(lines)


@dataclass
class _Node:
    """What `commit.check_live_quorum` asks of a member: its config, its name and the members it sees."""

    config: Any
    me: str
    live: set[str]

    @property
    def options(self) -> Any:
        return self

    def answering_members(self) -> set[str]:
        return self.live


@dataclass(frozen=True)
class Result:
    seed: int
    ok: bool
    catch_up_ms: int
    report: str
    reason: str = ""   # the first violation (or the exception), for a one-line summary


def run_seed(seed: int, *, rule: str = "random") -> Result:
    # One seed in four has no reader: only the check schedule and the senders find damage there, as on a
    # table nobody reads (why ClickHouse checks parts in the background at all).
    sim = PartSim(seed, members=3 + seed % 3, rule=rule, reads=seed % 4 != 3)
    try:
        return sim.run()
    except Exception as exc:   # a scheduler exception fails the seed, with what led to it
        why = f"{type(exc).__name__}: {exc}"
        return Result(seed, False, 0, f"{why}\n{sim.describe()}", why)


def run_seeds(seeds: list[int], *, jobs: int = 1) -> list[Result]:
    """Runs `seeds` (in `jobs` processes when > 1); results come back in seed order."""
    return in_processes(run_seed, seeds, jobs)


def replay_command(seed: int) -> str:
    return f"python -m tests.sim.parts --seed {seed}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, default=100)
    parser.add_argument("--start", type=int, default=0)
    parser.add_argument("--seed", type=int)
    parser.add_argument("--jobs", type=int, default=1, help="run seeds in this many processes")
    parser.add_argument("--compare-sources", action="store_true")
    args = parser.parse_args(argv)
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
        return 0
    failures = 0
    chunk = max(1, args.jobs) * 16
    for i in range(0, len(seeds), chunk):  # chunks: failures print as they are found
        for result in run_seeds(seeds[i:i + chunk], jobs=args.jobs):
            if not result.ok:
                failures += 1
                print(result.report if args.seed is not None else
                      f"seed {result.seed} FAILED: {result.reason} -- replay: {replay_command(result.seed)}",
                      flush=True)
    print(f"{len(seeds)} seeds, {failures} failures")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
