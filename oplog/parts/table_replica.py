"""One member's replica of one parts table, as decisions without I/O: the part-log core.

Theory of operation
-------------------
`TableReplica` is to the part log what `replset.replica.Replica` is to the oplog: it owns what a
member knows and decides about one parts table - its replication queue (`oplog.parts.queue`), the
parts the log produces, the registry of holders, lost parts, quorums, mutations, the parts that
are old (merged away, still readable) or parked, the fetch sources that failed, which parts were
verified and when - and is driven from outside. Every event is a method call with the shell's
clock (`now_ms`, monotonic milliseconds); what the shell must do comes out as actions, taken with
`take_actions()` and carried out in order:

    shell --log_doc / registry_added / part_lost / task_finished / damaged / ...(now_ms)--> core
    core --Run / SetAside / Held / NotHeld / Gone / RemoveOld / Check / Unlogged / Moved--> shell
    shell --set_aside_done / verified / fetch_failed / task_finished--> core

On the primary, the same object answers what its part-log leader (`replset.parts.leader`) writes:
the merges to log (`merges_due`), the rewrites of recorded mutations (`rewrites_due`), the log
entries that can go (`obsolete_log_entries`) and the parts no member has (`lost_fetches`), each
from this member's view and the times passed in; the leader turns the answers into transactions.

No asyncio, clock, randomness (the fetch source's random choice is passed in), files or sockets.
The member's runner (`replset.parts.manager`) and the part-log simulator (`tests/sim/parts.py`) are
the two shells around this one class.

Ordering contracts
------------------
* A damaged part leaves `current` at once (no read, merge or fetch of this member uses it from the
  decision on); its fetch is queued only once the shell has moved it aside (`set_aside_done`), so
  the fetch never meets the damaged directory.
* A merge or a mutation is run with `Run.verify`: the shell hashes each of those sources whole
  before it reads a row of them, and reports a damaged one (`damaged`) instead of producing: a
  result made from damaged bytes is never compared, published or registered.
* A merge result is kept when no other member registered the part, or when its bytes are the
  registered copy's (`merge_result_usable`); otherwise the registered copy is fetched. Registered
  copies come only from verified sources (the rule above), so the comparison never adopts damage.
* The log wins over the disk: a part here that intersects a part of the log (a history a rollback
  undid) is set aside as `unexpected_`, never read.
"""

from __future__ import annotations

__layer__ = "core"  # pure: no I/O, clock or randomness (tests/unit/test_layering.py)

import datetime
from collections import deque
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import Any

from base.errors import MongoError
from oplog.parts.active_set import ActivePartSet
from oplog.parts.blocks import RememberedBlock
from oplog.parts.jobs import COMMIT_JOB, JobBook
from oplog.parts.merges import plan_merges
from oplog.parts.mutations import Mutation, next_mutation, versions_by_partition
from oplog.parts.part_info import PartInfo, PartsIntersect
from oplog.parts.queue import EntryType, QueueEntry, ReplicationQueue
from oplog.parts.replica_rules import (
    Copy,
    choose_source,
    log_entry_obsolete,
    quorum_orphaned,
    seems_lost,
    task_of,
)
from oplog.parts.table import TableDef

Checksums = dict[str, tuple[int, str]]   # file -> (size, sha256)
DATA_FILE, COLUMNS_FILE = "data.parquet", "columns.txt"
UNEXPECTED, BROKEN = "unexpected_", "broken_"   # what a part set aside is renamed with
STALE_AFTER_404S = 3   # a registered holder answering "no such part" this often is unregistered
PART_CHECK_PERIOD_MS = 3_600_000   # each part here is hashed whole again this often
SEND_CHECK_AGE_MS = 600_000        # a part not hashed whole this long is hashed before it is sent


def checksum_docs(checksums: Checksums) -> list[dict[str, Any]]:
    return [{"file": file, "size": size, "sha256": digest} for file, (size, digest) in sorted(checksums.items())]


def parse_checksums(raw: Any) -> Checksums:
    """A checksums list as documents carry it; {} when malformed."""
    try:
        return {str(c["file"]): (int(c["size"]), str(c["sha256"])) for c in raw}
    except (KeyError, TypeError, ValueError):
        return {}


def same_data(a: Checksums, b: Checksums) -> bool:
    """Two copies of a part hold the same bytes (`checksums.txt` itself aside)."""
    return all(a.get(f) == b.get(f) for f in (DATA_FILE, COLUMNS_FILE))


# -- actions: what the shell carries out, in order ----------------------------------------------------


@dataclass(frozen=True, slots=True)
class Run:
    """Carry out a queued task (`how`: "drop" - nothing on disk; "get" - a published or own temporary
    copy, else a fetch; "produce" - merge or rewrite here, after hashing `verify` whole; "fetch") and
    report `task_finished`."""

    entry: QueueEntry
    how: str
    verify: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class SetAside:
    """Rename the part's directory `<prefix><name>_<time>` (never deleted); then `set_aside_done`."""

    part: str
    prefix: str


@dataclass(frozen=True, slots=True)
class Held:
    """This member holds `part` (`checksums`; None: read them from its `checksums.txt`); `register`:
    the registry does not list it yet - report it (the primary registers it at once)."""

    part: str
    checksums: Checksums | None
    register: bool


@dataclass(frozen=True, slots=True)
class Registered:
    """The registry lists this member for `part`: stop reporting it."""

    part: str


@dataclass(frozen=True, slots=True)
class Unlogged:
    """The log no longer produces `part` (dropped, lost): never report it."""

    part: str


@dataclass(frozen=True, slots=True)
class NotHeld:
    """The registry says `member` holds `part`, and it does not (the primary removes the entry)."""

    part: str
    member: str


@dataclass(frozen=True, slots=True)
class Gone:
    """This member's registered copy of `part` was damaged and set aside: its entry must go."""

    part: str


@dataclass(frozen=True, slots=True)
class RemoveOld:
    """An old part's lifetime is over: delete its directory."""

    part: str


@dataclass(frozen=True, slots=True)
class Check:
    """Hash the part whole now (the check schedule); report `verified` or `damaged`."""

    part: str


@dataclass(frozen=True, slots=True)
class Moved:
    """Parts changed here: wake the waiters; a primary looks for merges soon."""


Action = Run | SetAside | Held | Registered | Unlogged | NotHeld | Gone | RemoveOld | Check | Moved
MOVED = Moved()


@dataclass(frozen=True, slots=True)
class LoggedPart:
    """A part the part log produces: its size and commit time (for merge selection), the parts a merge
    made it from, the checksums the log recorded (inserted parts), and the log document that says so
    (with an inserted part's block id and dedup token)."""

    bytes: int
    create_ms: int
    sources: tuple[str, ...] = ()
    checksums: Checksums = field(default_factory=dict)
    log_id: str = ""
    block_id: str | None = None
    dedup_token: str | None = None

    @classmethod
    def of(cls, doc: dict[str, Any]) -> LoggedPart:
        created = doc.get("createTime")
        create_ms = int(created.timestamp() * 1000) if isinstance(created, datetime.datetime) else 0
        block_id, token = doc.get("blockId"), doc.get("dedupToken")
        return cls(int(doc.get("bytes", 0)), create_ms, tuple(str(s) for s in doc.get("sources", ())),
                   parse_checksums(doc.get("checksums", [])), str(doc.get("_id", "")),
                   block_id if isinstance(block_id, str) else None, token if isinstance(token, str) else None)


@dataclass(frozen=True, slots=True)
class Holder:
    http: str
    checksums: Checksums




@dataclass(slots=True)
class TableReplica:
    table: TableDef
    directory: str
    queue: ReplicationQueue
    docs: dict[str, dict[str, Any]] = field(default_factory=dict)   # queued log documents by _id
    logged: dict[str, LoggedPart] = field(default_factory=dict)     # parts the log produces, by name
    log_parts: dict[str, str] = field(default_factory=dict)         # log document _id -> its part, in log order
    holders: dict[str, dict[str, Holder]] = field(default_factory=dict)   # part -> member -> copy (the registry)
    quorum_blocks: dict[str, str] = field(default_factory=dict)     # part -> block id of its pending quorum
    quorum_reached: dict[str, str] = field(default_factory=dict)    # partition -> its newest part with a quorum
    quorum_parts: dict[str, str] = field(default_factory=dict)      # block id -> part: `quorum_blocks` inverted
    outdated: dict[str, int] = field(default_factory=dict)          # merged-away parts here -> since (ms)
    parked: dict[str, int] = field(default_factory=dict)            # inserted here, not in the log yet -> until (ms)
    mutations: dict[str, Mutation] = field(default_factory=dict)    # by id
    finished_drops: set[str] = field(default_factory=set)           # drop ranges carried out here
    drop_ranges: list[PartInfo] = field(default_factory=list)       # the log's DROP_RANGE parts
    failed_sources: dict[str, set[str]] = field(default_factory=dict)   # part -> HTTP addresses that failed it
    lost: dict[str, str] = field(default_factory=dict)              # parts no member has -> why (final)
    missing_answers: dict[tuple[str, str], int] = field(default_factory=dict)   # (part, http) -> 404s seen
    block_ids_by_token: dict[str, list[str]] = field(default_factory=dict)   # dedup token -> its blocks
    remembered: deque[RememberedBlock] = field(default_factory=deque)   # dedup keys, oldest first (may be stale)
    next_dedup_check: float = 0.0                                   # monotonic s (the primary's key clean-up)
    next_merge_select: float = 0.0                                  # monotonic s (the primary's selector)
    next_mutation_check: float = 0.0                                # monotonic s (the primary's rewrites)
    next_log_cleanup: float = 0.0                                   # monotonic s (the primary's log clean-up)
    registered_by_partition: dict[str, dict[PartInfo, str]] = field(default_factory=dict)   # `holders`' parts
    checked: dict[str, Any] = field(default_factory=dict)           # part -> its files' signature when verified
    checked_at: dict[str, int] = field(default_factory=dict)        # part -> when wholly verified (ms)
    broken: set[str] = field(default_factory=set)                   # damaged parts being set aside now
    refetch: dict[str, Checksums] = field(default_factory=dict)     # ... to fetch again once aside: their bytes
    damage_holes: set[str] = field(default_factory=set)             # damaged parts whose rows are not here again
    check_period_ms: int = PART_CHECK_PERIOD_MS
    check_queue: deque[str] = field(default_factory=deque)          # parts due for the check schedule, oldest first
    next_check_walk_ms: int = 0                                     # when the schedule looks for due parts again
    orphaned: dict[str, int] = field(default_factory=dict)          # pending quorum part -> since no live member has it
    jobs: JobBook = field(default_factory=JobBook)                  # jobs' inert parts, switches, stages
    pins: dict[str, tuple[frozenset[str], int]] = field(default_factory=dict)   # read snapshot -> (parts, until ms)
    expired_keys: dict[str, int] = field(default_factory=dict)      # expired read snapshot -> until (ms): refused
    actions: list[Action] = field(default_factory=list)

    def take_actions(self) -> list[Action]:
        out, self.actions = self.actions, []
        return out


    # -- the log ---------------------------------------------------------------------------------

    def log_doc(self, doc: dict[str, Any]) -> None:
        """A part-log document applied here: its task is queued once (keyed by its `_id`). A document
        this member cannot use is skipped (KeyError / ValueError / MongoError raised for the shell to
        log), never a reason to rebuild again and again. A job's part waits for its job's switch
        (`oplog.parts.jobs`)."""
        if doc.get("type") == COMMIT_JOB:
            failed: list[Exception] = []
            for released in self.jobs.commit(doc):   # each on its own: one bad document stops no other
                try:
                    self.log_doc(released)
                except (KeyError, TypeError, ValueError, MongoError, PartsIntersect) as exc:
                    failed.append(exc)
            if failed:
                raise failed[0]
            return
        if self.jobs.hold(doc):
            return
        entry = task_of(doc)
        if entry is None:
            return
        if entry.type is EntryType.DROP_RANGE:
            assert entry.new_part is not None
            self.drop_ranges.append(entry.new_part)
            for name in [n for n in self.logged if entry.new_part.contains(PartInfo.parse(n))]:
                del self.logged[name]   # dropped: never registered or merged again
                self.actions.append(Unlogged(name))
        if entry.type in (EntryType.DROP_RANGE, EntryType.ALTER_METADATA):
            if self.queue.add(entry):
                self.docs[entry.node_name] = doc
            return
        if entry.node_name in self.docs or not self._resolve_conflicts(entry):
            return
        self.log_produces(str(doc["part"]), LoggedPart.of(doc))
        if self.queue.add(entry):
            self.docs[entry.node_name] = doc

    def _resolve_conflicts(self, entry: QueueEntry) -> bool:
        """The log wins over what is on this disk: a part here that intersects the entry's part (a merge of
        a history a rollback undid) is set aside as `unexpected_`. False when the entry conflicts with
        another log entry's part (never on one history): it is skipped."""
        new = entry.new_part
        if new is None:
            return True
        clashes = [p for p in self.queue.virtual.overlapping(new) if not p.contains(new) and not new.contains(p)]
        for part in clashes:
            if part in self.queue.current and part.name not in self.logged:
                self.set_aside(part, UNEXPECTED)
            else:
                raise PartsIntersect(f"log entry {entry.node_name} makes {new}, which intersects {part}")
        return True

    def set_aside(self, part: PartInfo, prefix: str) -> None:
        """`part` here is never read again; the shell renames its directory."""
        self.queue.part_removed(part)
        self.queue.virtual.remove(part)
        self.outdated.pop(part.name, None)
        self.actions.append(SetAside(part.name, prefix))

    def registry_added(self, part: str, member: str, http: str, checksums: Checksums, me: str) -> None:
        self.add_holder(part, member, http, checksums)
        if member == me:
            self.actions.append(Registered(part))

    def registry_removed(self, part: str, member: str, me: str) -> None:
        self.remove_holder(part, member)
        if member != me:
            return
        self.actions.append(Registered(part))   # (no longer waiting for it: it is gone)
        try:
            here = PartInfo.parse(part) in self.queue.current
        except MongoError:
            here = False
        if here:   # unregistered by mistake (a fetch saw it before it was published): say so again
            self.actions.append(Held(part, None, True))

    def part_lost(self, name: str, reason: str) -> None:
        """A part the primary found no member has: its tasks here go, and a copy here (a member the primary
        could not reach while it decided) is set aside, since the log no longer names it."""
        self.lost[name] = reason
        self.logged.pop(name, None)
        self.jobs.look_again()
        self.actions.append(Unlogged(name))
        try:
            part = PartInfo.parse(name)
        except MongoError:
            return
        for entry in [e for e in self.queue.entries if e.new_part == part and not e.currently_executing]:
            self.queue.drop(entry)
            self.docs.pop(entry.node_name, None)
        self.queue.virtual.remove(part)
        if part in self.queue.current:
            self.set_aside(part, UNEXPECTED)

    # -- a rebuild (start-up, rollback, initial sync) ----------------------------------------------

    def unlogged_here(self, now_ms: int, *, kept_until: Callable[[str], int]) -> None:
        """After a rebuild from the log: a part here that no part of the log contains (an insert whose
        commit never happened, a part of a history a rollback undid) is never read. A dropped one ages
        out like a merged-away part; one `kept_until(name)` still keeps (an insert here published it
        lately, its log entry may not be here yet; an initial sync is cloning the log) is parked unread
        until then; any other is set aside as `unexpected_` (never deleted)."""
        self.jobs.look_again()
        produced = ActivePartSet()
        for name in self.logged:
            try:
                produced.add(PartInfo.parse(name))
            except (MongoError, PartsIntersect):
                continue
        here = [*self.queue.current, *(PartInfo.parse(n) for n in self.outdated)]
        for part in here:
            if produced.containing(part) is not None or self._held_drop_covers(part):
                continue   # (an overwrite's drop not carried out here yet: the part is read until it is)
            if any(drop.contains(part) for drop in self.drop_ranges):
                self.queue.part_removed(part)
                self.queue.virtual.remove(part)
                self.mark_outdated(part.name, now_ms)   # goes after oldPartsLifetimeSecs
            elif (until := kept_until(part.name)) > now_ms:
                self.queue.part_removed(part)
                self.queue.virtual.remove(part)
                self.outdated.pop(part.name, None)
                self.parked[part.name] = until
            else:
                self.set_aside(part, UNEXPECTED)

    def registrations_not_here(self, me: str, *, coming: Collection[str] = ()) -> None:
        """After a rebuild: the registry names this member for parts it does not have (its disk was replaced,
        a part was removed while it was down) - each is reported `Gone` until the primary removes the
        registration, so that no fetch is sent here for it (ClickHouse's start-up check of the parts
        Keeper lists for a replica against its disk). `coming`: parts an insert here is publishing (its
        commit registered this member before the directory took the part's name)."""
        here = {p.name for p in self.queue.current} | set(self.outdated) | set(self.parked) | set(coming)
        for name, by_member in self.holders.items():
            if me in by_member and name not in here and name not in self.broken:
                self.actions.append(Gone(name))

    def bytes_expected(self) -> dict[str, list[Checksums]]:
        """After a rebuild: for each part here, the bytes its name may stand for - those the log recorded
        (an inserted part), else those of any registered copy (a merged or mutated part). After a
        rollback a block number can name other rows than before; `bytes_found` decides."""
        return {part.name: sums for part in self.queue.current if (sums := self.bytes_expected_of(part.name))}

    def bytes_found(self, name: str, here: Checksums) -> None:
        """The shell read `name`'s checksums here: a copy of the history that lost is set aside, never read."""
        expected = self.bytes_expected_of(name)
        part = PartInfo.parse(name)
        if part in self.queue.current and expected and not any(same_data(here, sums) for sums in expected):
            self.set_aside(part, UNEXPECTED)

    def unverifiable_after_rollback(self) -> None:
        """After a rebuild that follows a replaced history (a rollback, an initial sync): a part here for which
        the new log records no bytes and no member is registered (its entry cleaned up, covered by a
        merged part the log produces) cannot be told from a part of the same name the undone history
        made - block numbers are the log's, and a rollback gives them out again. It is set aside unread;
        the part covering it is fetched or made instead."""
        for part in list(self.queue.current):
            if not self.bytes_expected_of(part.name):
                self.set_aside(part, UNEXPECTED)

    def bytes_expected_of(self, name: str) -> list[Checksums]:
        logged = self.logged.get(name)
        if logged is not None and logged.checksums:
            return [logged.checksums]
        return [h.checksums for h in self.holders.get(name, {}).values() if h.checksums]

    def mutation_recorded(self, mutation: Mutation) -> None:
        """A mutation recorded or killed: the primary plans its rewrites at once."""
        self.mutations[mutation.id] = mutation
        self.next_mutation_check = 0.0
        self.actions.append(MOVED)

    # -- running tasks ---------------------------------------------------------------------------

    def schedule(self, now_ms: int) -> None:
        """Every task that may run now: started, and a `Run` for the shell (an alter's metadata and a task
        whose part is here already need nothing but the bookkeeping)."""
        if self.jobs.drops:
            self._release_job_drops()
        while (entry := self.queue.next_to_run(now_ms)) is not None:
            self.queue.started(entry, now_ms)
            if entry.type is EntryType.ALTER_METADATA:
                # Parts read through schema changes (`part_files.read_part`): adopting the version is all.
                self.queue.finished(entry, now_ms)
                self.docs.pop(entry.node_name, None)
                self.actions.append(MOVED)
            elif self.queue.already_done(entry):
                self.queue.finished(entry, now_ms)
                self.docs.pop(entry.node_name, None)
                if self.jobs.missing:
                    self.jobs.look_again()
                if entry.type is EntryType.DROP_RANGE and entry.new_part is not None:
                    self.jobs.dropping.discard(entry.new_part.name)
            elif entry.type is EntryType.DROP_RANGE:
                self.actions.append(Run(entry, "drop"))
            elif entry.new_part is not None and entry.new_part.name in self.broken:   # wait: it is being moved
                self.queue.finished(entry, now_ms, error=f"{entry.new_part.name} here is being set aside as damaged")
            elif entry.type is EntryType.GET_PART:
                self.actions.append(Run(entry, "get"))
            elif all(p in self.queue.current for p in entry.source_parts):
                self.actions.append(Run(entry, "produce", tuple(p.name for p in entry.source_parts)))
            else:   # a source nobody here will produce: the result is fetched instead
                self.actions.append(Run(entry, "fetch"))

    def mutation_of(self, entry: QueueEntry) -> Mutation | None:
        return self.mutations.get(str(self.docs.get(entry.node_name, {}).get("mutation")))

    def merge_result_usable(self, name: str, checksums: Checksums, me: str) -> bool:
        """A merge or rewrite made here from verified sources: kept unless another member registered the part
        with other bytes (then that copy is fetched: replicas end up byte-identical)."""
        other = next((h for m, h in self.holders.get(name, {}).items() if m != me and h.checksums), None)
        return other is None or same_data(other.checksums, checksums)

    def fetch_source(self, part: PartInfo, doc: dict[str, Any], *, me: str, live: set[str],
                     http_of: Callable[[str], str | None], choose: Callable[[list[Any]], Any],
                     rank: Callable[[Copy], Any] | None = None) -> tuple[str, PartInfo, Checksums] | None:
        """Where to fetch `part` from, and what to fetch: a live member the registry lists as holding it,
        chosen at random (as today's ClickHouse does: the fetches of many replicas spread over every
        holder); else a live member holding the largest part that covers it and that our own log
        produces; else the member that inserted it, while the registry names no live holder yet."""
        failed = self.failed_sources.get(part.name, set())
        checksums = parse_checksums(doc.get("checksums", []))
        inserted_by = str(doc.get("source", ""))
        inserter_http = http_of(inserted_by) if inserted_by else None
        inserter = Copy(inserted_by, inserter_http, checksums) if inserter_http is not None else None
        covering = [(info, _copies(by_member, http_of)) for info, by_member in self.registered_covering(part)
                    if self.queue.virtual.containing(info) is not None]
        source = choose_source(part, _copies(self.holders.get(part.name, {}), http_of), covering, me=me,
                               live=live, failed=failed, inserter=inserter, choose=choose, rank=rank)
        if source is None:
            return None
        if source.forget_failures:
            failed.clear()
        return source.copy.address, source.part, source.copy.checksums

    def fetch_failed(self, wanted: str, fetched: str, address: str, *, missing: bool, primary: bool,
                     http_of: Callable[[str], str | None]) -> None:
        """A fetch of `fetched` (`wanted` or a part covering it) from `address` failed: the next try for
        `wanted` goes elsewhere. On the primary, a holder that answers "no such part" (`missing`)
        `STALE_AFTER_404S` times is unregistered (one 404 proves nothing: a member that inserted a part
        publishes it just after the commit)."""
        self.failed_sources.setdefault(wanted, set()).add(address)
        if not (missing and primary):
            return
        key = (fetched, address)
        self.missing_answers[key] = self.missing_answers.get(key, 0) + 1
        if self.missing_answers[key] >= STALE_AFTER_404S:
            del self.missing_answers[key]
            for member in list(self.holders.get(fetched, {})):
                if http_of(member) == address:
                    self.actions.append(NotHeld(fetched, member))

    def fetched(self, part: str) -> None:
        self.failed_sources.pop(part, None)

    def task_finished(self, entry: QueueEntry, now_ms: int, *, error: str = "", produced: PartInfo | None = None,
                      checksums: Checksums | None = None, me: str) -> None:
        """The task ended: with `error` it stays queued and backs off; else its part (`produced`: the part
        actually obtained, e.g. a covering one fetched) is here, the parts it covers are old now, and the
        registry should list this member."""
        produced = produced or entry.new_part
        if not self.queue.has(entry) or produced is None:
            return
        if produced.name in self.lost:   # declared lost while it ran: it goes
            self.queue.finished(entry, now_ms, error="lost")
            self.queue.drop(entry)
            self.docs.pop(entry.node_name, None)
            return
        replaced = [] if error else [p for p in self.queue.current.covered_by(produced) if p != produced]
        cancelled = self.queue.finished(entry, now_ms, error=error, produced=None if error else produced)
        for gone in cancelled:
            self.docs.pop(gone.node_name, None)
        if error:
            return
        self.docs.pop(entry.node_name, None)
        for part in replaced:
            self.mark_outdated(part.name, now_ms)
        if entry.type is EntryType.DROP_RANGE:
            self.finished_drops.add(produced.name)
            self.jobs.dropping.discard(produced.name)
        else:
            self.checked_at[produced.name] = now_ms   # its bytes were just checked (fetched, made or published)
            self.held(produced.name, checksums or {}, me)
        if self.jobs.missing:
            self.jobs.arrived(produced)
        if self.jobs.drops:   # the last part of an overwrite's job: its drops, in this same step
            self._release_job_drops()
        self.actions.append(MOVED)

    def held(self, part: str, checksums: Checksums, me: str) -> None:
        """This member now holds `part`: the registry should say so."""
        register = me not in self.holders.get(part, {}) and part in self.logged and bool(checksums)
        self.actions.append(Held(part, checksums, register))

    # -- damaged parts ---------------------------------------------------------------------------

    def damaged(self, name: str, me: str) -> None:
        """This member's copy of `name` failed its checksums (a read, a merge's or a sender's check, the
        schedule): ClickHouse's broken part. It leaves `current` now; the shell moves it aside as
        `broken_<name>_<time>` (never deleted); its registration goes; and, while the log still wants it
        here, it is fetched again from a healthy replica once it is aside (`set_aside_done`)."""
        if name in self.broken:
            return
        try:
            part = PartInfo.parse(name)
        except MongoError:
            return
        self.broken.add(name)
        if part in self.queue.current:
            self.queue.part_removed(part)
            self.damage_holes.add(name)
            if name not in self.lost:
                self.refetch[name] = self.recorded_checksums(name, me)
        self.outdated.pop(name, None)
        self.checked.pop(name, None)
        self.checked_at.pop(name, None)
        self.actions.append(SetAside(name, BROKEN))
        self.actions.append(Gone(name))

    def set_aside_done(self, name: str, now_ms: int) -> None:
        """The shell moved `name` aside. A damaged part the log still wants here is fetched again: a task of
        this member's queue only (ClickHouse's `removePartAndEnqueueFetch`), never of the log."""
        self.broken.discard(name)
        if name not in self.refetch:
            return
        recorded = self.refetch.pop(name)
        part = PartInfo.parse(name)
        if name in self.lost or self.queue.current.containing(part) is not None \
                or any(e.new_part == part for e in self.queue.fetches()):   # the log's own fetch will do
            return
        node_name = f"refetch_{name}"
        entry = QueueEntry(node_name, EntryType.GET_PART, part, create_time_ms=now_ms)
        if self.queue.add(entry):
            self.docs[node_name] = {"_id": node_name, "type": "GET_PART", "part": name,
                                    "checksums": checksum_docs(recorded)}
        self.actions.append(MOVED)

    def read_holes(self) -> list[str]:
        """The parts a read here would miss: this member held them, found them damaged and set them aside
        (now, or before a restart: the `broken_` directories), and neither they nor a part containing them
        are here again while the log still produces them (no drop, loss or rollback took them). The rest
        of the table is no answer then - rows would be missing without an error - so reads refuse until
        the hole is filled (ClickHouse answers without a detached broken part's rows)."""
        for name in list(self.damage_holes):
            part = PartInfo.parse(name)
            if self.queue.current.containing(part) is not None \
                    or not any(PartInfo.parse(n).contains(part) for n in self.logged):
                self.damage_holes.discard(name)
        return sorted(self.damage_holes)

    def verified(self, name: str, signature: Any, now_ms: int, *, whole: bool) -> None:
        """The shell checked `name` (hashed whole, or found its files unchanged since): it may be used."""
        self.checked[name] = signature
        if whole:
            self.checked_at[name] = now_ms

    def needs_hashing(self, name: str, signature: Any, *, now_ms: int | None = None) -> bool:
        """Before a read (or, with `now_ms`, a send): hash the part again unless its files are unchanged since
        it was hashed (and, before a send, it was hashed whole within `SEND_CHECK_AGE_MS`: a sender finds
        bytes that rotted in place, which change no file's size or time)."""
        if self.checked.get(name) != signature:
            return True
        return now_ms is not None and now_ms - self.checked_at.get(name, 0) > SEND_CHECK_AGE_MS

    def check_due(self, now_ms: int) -> None:
        """ClickHouse's part checks, on a schedule: every `check_period_ms` each part here is hashed whole
        again, the one verified longest ago first (one `Check` per call). The parts due are found by one
        walk every tenth of a period (a minute at most), not on every call: what a call costs does not
        grow with the parts of the table."""
        if not self.check_queue:
            if now_ms < self.next_check_walk_ms:
                return
            self.next_check_walk_ms = now_ms + min(self.check_period_ms // 10, 60_000)
            due = sorted((at, p.name) for p in self.queue.current
                         if (at := self.checked_at.get(p.name, 0)) <= now_ms - self.check_period_ms)
            self.check_queue = deque(name for _at, name in due)
        while self.check_queue:
            name = self.check_queue.popleft()
            if name in self.broken or PartInfo.parse(name) not in self.queue.current:
                continue   # gone meanwhile
            self.checked_at[name] = now_ms   # not again before its next period, whatever the shell finds
            self.actions.append(Check(name))
            return

    # -- the primary's selections (its leader writes them) ---------------------------------------

    def merges_due(self, now_s: float, wall_ms: int) -> list[list[PartInfo]]:
        """The merges to log now (at most one per partition), looked for every `mergeSelectingSleepMS`."""
        if now_s < self.next_merge_select:
            return []
        self.next_merge_select = now_s + self.table.settings.merge_selecting_sleep_ms / 1000
        pinned = [PartInfo.parse(p) for p in self.quorum_blocks] + self._job_pins()
        return plan_merges(self.queue.current, self.queue.virtual, self.part_sizes(), wall_ms,
                           pinned=pinned, mutations=versions_by_partition(self.mutations.values()))

    def rewrites_due(self, now_s: float, batch: int) -> list[tuple[PartInfo, Mutation]]:
        """The parts here that a recorded mutation has yet to rewrite and no queued task takes, each with
        the oldest mutation it needs (at most `batch`; looked for again at once when the batch is full)."""
        if not self.mutations or now_s < self.next_mutation_check:
            return []
        self.next_mutation_check = now_s + self.table.settings.merge_selecting_sleep_ms / 1000
        todo = []
        for part in self.queue.current:
            if self.queue.virtual.containing(part) != part:
                continue
            mutation = next_mutation(part, self.mutations.values())
            if mutation is not None:
                todo.append((part, mutation))
            if len(todo) >= batch:
                self.next_mutation_check = now_s   # more may follow this batch
                break
        return todo

    def obsolete_log_entries(self, now_s: float, wall_ms: int, members: set[str],
                             dedup_key: Callable[[str], dict[str, Any] | None],
                             batch: int) -> list[tuple[str, str | None, bool]]:
        """The log documents that can go (`log_entry_obsolete`), as (log id, block id, whether its quorum
        record goes too: not the newest reached quorum of its partition, which sequentially consistent
        reads check), oldest first; looked for every `cleanupDelayPeriodSecs`. `members`: the live
        data-bearing members, this one included; `dedup_key(block id)`: the dedup key document as it
        stands. The walk stops at the first document younger than `oldPartsLifetimeSecs`: it costs the
        old entries, which the clean-up keeps few."""
        if now_s < self.next_log_cleanup:
            return []
        settings = self.table.settings
        self.next_log_cleanup = now_s + settings.cleanup_delay_period_secs
        lifetime_ms = settings.old_parts_lifetime_secs * 1000
        doomed: list[tuple[str, str | None, bool]] = []
        newest_quorums = set(self.quorum_reached.values())
        for log_id, name in self.log_parts.items():
            logged = self.logged.get(name)
            if logged is None or logged.log_id != log_id:
                continue
            if wall_ms - logged.create_ms < lifetime_ms:
                break
            part = PartInfo.parse(name)
            covering = self.queue.current.containing(part)
            holders = (self.holders.get(covering.name, {}) if covering is not None and covering != part
                       and covering.name in self.logged and covering.name not in self.lost else None)
            key = dedup_key(logged.block_id) if holders is not None and logged.block_id is not None else None
            if log_entry_obsolete(created_ms=logged.create_ms, now_ms=wall_ms, lifetime_ms=lifetime_ms,
                                  covering_holders=holders, members=members,
                                  quorum_pending=name in self.quorum_blocks,
                                  names_a_dedup_key=key is not None and key.get("log") == log_id):
                doomed.append((log_id, logged.block_id, name not in newest_quorums))
                if len(doomed) >= batch:
                    self.next_log_cleanup = now_s   # more may follow this batch
                    break
        return doomed

    def lost_fetches(self, me: str, wall_ms: int) -> list[tuple[str, str, str | None, str]]:
        """The parts this member keeps failing to fetch that no other member is registered for (nor for a
        part covering them): lost (`seems_lost`), as (part, log id, block id, why)."""
        lost = []
        for entry in self.queue.fetches():
            part = entry.new_part
            if part is None or entry.num_tries < 1:
                continue   # the cheap test first: most fetches never failed
            logged = self.logged.get(part.name)
            if not seems_lost(entry, here=self.queue.current.containing(part) is not None,
                              held_elsewhere=any(m != me for m in self.holders.get(part.name, {}))
                              or bool(self.registered_covering(part)),
                              already_lost=part.name in self.lost,
                              created_ms=logged.create_ms if logged is not None else None, now_ms=wall_ms):
                continue
            block_id = self.docs.get(entry.node_name, {}).get("blockId")
            log_id = logged.log_id if logged is not None and logged.log_id else entry.node_name
            lost.append((part.name, log_id, str(block_id) if block_id is not None else None,
                         f"no member has {part.name} (fetching it failed {entry.num_tries} times)"))
        return lost

    def lost_parts(self, me: str, live: set[str], now_ms: int, wall_ms: int) -> list[tuple[str, str | None, str | None, str]]:
        """On the primary: the parts no member has, as (part, log id, block id, why) - the fetches that keep
        failing with no other holder (`lost_fetches`), and the parts of pending quorum inserts no live
        member (`live`, this one included) has held for `quorumLostAfterMS` (`quorum_orphaned`: the
        quorum failed; a holder that comes back sets the part aside, as the log no longer names it)."""
        lost: list[tuple[str, str | None, str | None, str]] = list(self.lost_fetches(me, wall_ms))
        after_ms = self.table.settings.quorum_lost_after_ms
        for name in [n for n in self.orphaned if n not in self.quorum_blocks]:
            del self.orphaned[name]
        for name, block_id in list(self.quorum_blocks.items()):
            if name in self.lost:
                continue
            gone, since = quorum_orphaned(self.orphaned.get(name), now_ms=now_ms, after_ms=after_ms,
                                          held_live=any(m in live for m in self.holders.get(name, {})))
            if since is None:
                self.orphaned.pop(name, None)
            else:
                self.orphaned[name] = since
            if gone:
                lost.append((name, None, block_id, f"no live member held {name} for {after_ms / 1000:g} s: "
                                                   "its quorum failed"))
        return lost

    # -- old parts -------------------------------------------------------------------------------

    def expire(self, now_ms: int, wall_ms: int = 0) -> None:
        """Parts a merge replaced go once they are `oldPartsLifetimeSecs` old (readers had that long); a part
        parked (published by an insert here, its log entry not seen yet) is set aside when its wait is over
        and the log never named it (its commit was rolled back)."""
        for name in [n for n, until in self.parked.items() if until <= now_ms]:
            del self.parked[name]
            part = PartInfo.parse(name)
            if part not in self.queue.current and name not in self.logged:
                self.set_aside(part, UNEXPECTED)
        lifetime_ms = self.table.settings.old_parts_lifetime_secs * 1000
        # Insertion order is age order (`mark_outdated`): the walk stops at the first part still young,
        # so it costs the parts that go, not every old part.
        expired = []
        for name, since in self.outdated.items():
            if now_ms - since < lifetime_ms:
                break
            expired.append(name)
        pinned = self.pinned_parts(wall_ms) if expired and self.pins else frozenset()
        for name in expired:
            del self.outdated[name]
            if name in pinned:   # a query is reading it: looked at again a lifetime later
                self.outdated[name] = now_ms
            elif PartInfo.parse(name) not in self.queue.current:
                self.actions.append(RemoveOld(name))

    def pin(self, key: str, parts: Collection[str], until_ms: int) -> None:
        """A read snapshot (`replset.parts.snapshots`): its parts stay on disk until `until_ms` (wall clock,
        as `expire`'s `wall_ms`)."""
        self.pins[key] = (frozenset(parts), until_ms)

    def unpin(self, key: str, *, expired_at: int | None = None) -> None:
        """A pin gone: expired (`expired_at`: its key is kept, refused, until `old_expired_keys`), or deleted."""
        self.pins.pop(key, None)
        if expired_at is None:
            self.expired_keys.pop(key, None)
        else:
            self.expired_keys[key] = expired_at

    def old_expired_keys(self, wall_ms: int, keep_ms: int, batch: int) -> list[str]:
        return [key for key, until in self.expired_keys.items() if wall_ms - until >= keep_ms][:batch]

    def pinned_parts(self, now_ms: int) -> frozenset[str]:
        return frozenset(p for parts, until in self.pins.values() if until > now_ms for p in parts)

    def expired_pins(self, wall_ms: int, batch: int) -> list[str]:
        return [key for key, (_parts, until) in self.pins.items() if until <= wall_ms][:batch]

    # -- state -----------------------------------------------------------------------------------

    def log_produces(self, part: str, logged: LoggedPart) -> None:
        self.logged[part] = logged
        self.log_parts[logged.log_id] = part
        if logged.dedup_token is not None and logged.block_id is not None:
            known = self.block_ids_by_token.setdefault(logged.dedup_token, [])
            if logged.block_id not in known:
                known.append(logged.block_id)

    def log_entry_removed(self, log_id: str) -> None:
        """The log document `log_id` is gone (cleaned up, dropped, lost): its part is no longer one the log
        produces. A task queued for it here runs on (`docs` keeps its own copy)."""
        self.jobs.removed(log_id)
        self.jobs.look_again()
        part = self.log_parts.pop(log_id, None)
        logged = self.logged.get(part) if part is not None else None
        if part is None or logged is None or logged.log_id != log_id:
            return
        del self.logged[part]
        if logged.dedup_token is not None:
            known = self.block_ids_by_token.get(logged.dedup_token, [])
            if logged.block_id in known:
                known.remove(logged.block_id)
            if not known:
                self.block_ids_by_token.pop(logged.dedup_token, None)

    def add_holder(self, part: str, member: str, http: str, checksums: Checksums) -> None:
        if part not in self.holders:
            try:
                info = PartInfo.parse(part)
            except MongoError:
                info = None
            if info is not None:
                self.registered_by_partition.setdefault(info.partition_id, {})[info] = part
        self.holders.setdefault(part, {})[member] = Holder(http, checksums)

    def remove_holder(self, part: str, member: str) -> None:
        held = self.holders.get(part)
        if held is not None:
            held.pop(member, None)
            if not held:
                del self.holders[part]
                try:
                    info = PartInfo.parse(part)
                except MongoError:
                    return
                parts = self.registered_by_partition.get(info.partition_id, {})
                parts.pop(info, None)
                if not parts:
                    self.registered_by_partition.pop(info.partition_id, None)

    def replaced_registrations(self, part: str, member: str) -> list[str]:
        """The parts `member` is registered for that `part` contains (itself aside): a member that holds
        `part` drops them once they are old, whether it merged them or fetched `part` whole."""
        info = PartInfo.parse(part)
        return [name for other, name in self.registered_by_partition.get(info.partition_id, {}).items()
                if other != info and info.contains(other) and member in self.holders.get(name, {})]

    def registered_covering(self, part: PartInfo) -> list[tuple[PartInfo, dict[str, Holder]]]:
        """The registered parts that contain `part` (itself aside), with their holders: a look at the
        parts of its partition only."""
        return [(info, self.holders[name]) for info, name in self.registered_by_partition.get(part.partition_id, {})
                .items() if info != part and info.contains(part)]

    def mark_outdated(self, part: str, now: int) -> None:
        """`part` was replaced here at `now`; `outdated` stays in age order (a part marked again moves last)."""
        self.outdated.pop(part, None)
        self.outdated[part] = now

    def drop_stale_keys(self, current: Callable[[str], dict[str, Any] | None]) -> None:
        """Forgets the oldest remembered dedup keys that are gone or were written again since (`current`:
        the key document as it stands)."""
        while self.remembered:
            head = self.remembered[0]
            doc = current(head.block_id)
            if doc is not None and int(doc.get("number", -1)) == head.number:
                return
            self.remembered.popleft()

    def quorum_pending(self, part: str, block_id: str) -> None:
        self.quorum_blocks[part] = block_id
        self.quorum_parts[block_id] = part

    def quorum_settled(self, block_id: str) -> None:
        """The block's quorum record is no longer pending (reached, failed or gone)."""
        part = self.quorum_parts.pop(block_id, None)
        if part is not None and self.quorum_blocks.get(part) == block_id:
            del self.quorum_blocks[part]

    def quorum_was_reached(self, part: str) -> None:
        info = PartInfo.parse(part)
        newest = self.quorum_reached.get(info.partition_id)
        if newest is None or PartInfo.parse(newest).max_block < info.max_block:
            self.quorum_reached[info.partition_id] = part

    def visible_parts(self) -> list[PartInfo]:
        """The active parts a read sees: all but those holding rows of a job not wholly here yet, and those an
        overwrite's drop is about to remove."""
        if self.jobs.drops:   # a job complete here drops what it replaces in the same step
            self._release_job_drops()
        hidden = self.jobs.hidden(self.queue.current.containing, self._settled) if self.jobs.incomplete else set()
        dropping = [PartInfo.parse(d) for d in self.jobs.dropping]
        return [p for p in self.queue.current
                if p.name not in hidden and not any(d.contains(p) for d in dropping)]

    def _release_job_drops(self) -> None:
        for doc in self.jobs.drops_ready(self.queue.current.containing, self._settled):
            self.log_doc(doc)

    def _job_pins(self) -> list[PartInfo]:
        """Parts no merge may take yet: those of a job not wholly here, and every part of a partition an
        overwrite's drop is waiting to clear (a merge across the drop's block number would keep old rows)."""
        pins = [p for parts in self.jobs.incomplete.values() for p in parts]
        waiting = {str(d.get("partition")) for docs in self.jobs.drops.values() for d in docs}
        if waiting:
            pins += [p for p in self.queue.current if p.partition_id in waiting]
        return pins

    def job_visible(self, job: str) -> bool:
        """Whether the job's switch is here and every part of it is read here."""
        if job not in self.jobs.committed:
            return False
        if self.jobs.drops:
            self._release_job_drops()
        return self.jobs.complete(job, self.queue.current.containing, self._settled) and job not in self.jobs.drops

    def _settled(self, part: PartInfo) -> bool:
        """A job's part no read waits for: lost, or no longer one the log produces (dropped, or its entry
        cleaned up after a merge took it in) - unless an overwrite's drop not carried out here yet is what
        took its entry: until then this member shows the table as before the overwrite."""
        return part.name in self.lost or (part.name not in self.logged and not self._held_drop_covers(part))

    def _held_drop_covers(self, part: PartInfo) -> bool:
        return any(PartInfo.parse(str(d["part"])).contains(part) for docs in self.jobs.drops.values() for d in docs)

    def part_sizes(self) -> dict[str, tuple[int, int]]:
        return {name: (p.bytes, p.create_ms) for name, p in self.logged.items()}

    def recorded_checksums(self, part: str, me: str) -> Checksums:
        """What the part log recorded for `part`'s bytes: its insert's checksums, else this member's own
        registered copy's ({} when neither is known: only `checksums.txt` speaks for the part)."""
        logged = self.logged.get(part)
        if logged is not None and logged.checksums:
            return logged.checksums
        mine = self.holders.get(part, {}).get(me)
        return mine.checksums if mine is not None else {}


def _copies(by_member: dict[str, Holder], http_of: Callable[[str], str | None]) -> dict[str, Copy]:
    """The registered copies of members of the config, each at the HTTP address the member itself gave
    (never the one a document names: see replset/member_http.py)."""
    out = {}
    for member, holder in by_member.items():
        address = http_of(member)
        if address is not None:
            out[member] = Copy(member, address, holder.checksums)
    return out

