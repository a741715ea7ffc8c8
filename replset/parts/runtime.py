"""What a member knows of one parts table between two rebuilds: its queue, the part log's parts, the
registry, and its own parts on disk (active, and old ones kept readable for a while after a merge).

All of it is derived state: `replset.parts.manager` rebuilds it from the state collections and the
directory at start-up, after a rollback or an initial sync, and keeps it current from the oplog.
"""

from __future__ import annotations

import datetime
import os
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from base.errors import MongoError
from oplog.parts import part_files
from oplog.parts.blocks import RememberedBlock
from oplog.parts.mutations import Mutation
from oplog.parts.part_info import PartInfo
from oplog.parts.queue import ReplicationQueue
from oplog.parts.table import TableDef
from replset.parts.registry import Checksums, parse_checksums


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
class TableRuntime:
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
    outdated: dict[str, float] = field(default_factory=dict)        # merged-away parts here -> since (monotonic s)
    parked: dict[str, float] = field(default_factory=dict)          # inserted here, not in the log yet -> until
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
    checked: dict[str, part_files.Signature] = field(default_factory=dict)   # part -> its files when verified
    checked_at: dict[str, float] = field(default_factory=dict)      # part -> when wholly verified (monotonic s)
    broken: set[str] = field(default_factory=set)                   # parts being set aside as damaged now

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

    def registered_covering(self, part: PartInfo) -> list[tuple[PartInfo, dict[str, Holder]]]:
        """The registered parts that contain `part` (itself aside), with their holders: a look at the
        parts of its partition only."""
        return [(info, self.holders[name]) for info, name in self.registered_by_partition.get(part.partition_id, {})
                .items() if info != part and info.contains(part)]

    def mark_outdated(self, part: str, now: float) -> None:
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

    def recorded_checksums(self, part: str, me: str) -> Checksums:
        """What the part log recorded for `part`'s bytes: its insert's checksums, else this member's own
        registered copy's ({} when neither is known: only `checksums.txt` speaks for the part)."""
        logged = self.logged.get(part)
        if logged is not None and logged.checksums:
            return logged.checksums
        mine = self.holders.get(part, {}).get(me)
        return mine.checksums if mine is not None else {}

    def damage(self, part: str, me: str, *, whole: bool, now: float) -> str | None:
        """Why this member's copy of `part` must not be used (None: it may). `whole`: every byte is hashed
        (before a merge or a mutation reads it, and on the check schedule); otherwise a copy whose files
        have not changed since they were last verified is taken as verified, and a copy never verified
        since start-up is hashed once. File I/O: call it off the event loop."""
        path = os.path.join(self.directory, part)
        signature = part_files.part_signature(path)
        if not signature:
            return "its files are gone"
        if not whole and self.checked.get(part) == signature:
            return None
        why = part_files.verify_part(path, self.recorded_checksums(part, me))
        if why is None:
            self.checked[part] = signature
            self.checked_at[part] = now
        else:
            self.checked.pop(part, None)
        return why

    def trust_sizes(self, part: str, now: float) -> None:
        """At start-up: a part whose files have their recorded sizes is taken as verified until its files
        change or the check schedule reaches it (ClickHouse checks sizes at start-up, bytes later)."""
        path = os.path.join(self.directory, part)
        if part_files.check_sizes(path) is None:
            self.checked[part] = part_files.part_signature(path)
            self.checked_at.setdefault(part, now)

    def part_sizes(self) -> dict[str, tuple[int, int]]:
        return {name: (p.bytes, p.create_ms) for name, p in self.logged.items()}


def local_parts(directory: str, *, at_start_up: bool) -> list[PartInfo]:
    """The published parts in a table's directory. At start-up, the temporary parts a crash left are
    removed first (but an insert's: the log may name it yet, see `adopt_temporary`); a later rebuild
    must not: an insert or a fetch may be writing one right now."""
    if at_start_up:
        part_files.remove_temporary(directory, keep=(part_files.TMP_INSERT,))
    parts = []
    for name in sorted(os.listdir(directory)) if os.path.isdir(directory) else []:
        try:
            parts.append(PartInfo.parse(name))
        except MongoError:
            continue   # not a part (moved aside, or foreign): left alone
    return parts


def publish_if_intact(directory: str, tmp_name: str, part: str, expected: Checksums) -> bool:
    """Publishes the temporary part `tmp_name` as `part` if its files are whole and are the ones `expected`."""
    tmp_dir = os.path.join(directory, tmp_name)
    if os.path.exists(os.path.join(directory, part)) or part_files.verify_part(tmp_dir) is not None:
        return False
    try:
        written = part_files.read_checksums(tmp_dir)
    except (OSError, ValueError, MongoError):
        return False
    if any(written.get(file) != sums for file, sums in expected.items()):
        return False
    part_files.publish(directory, tmp_name, part)
    return True


def adopt_temporary(directory: str, block_id: str, part: str, expected: Checksums) -> Checksums | None:
    """The log names this member as the source of `part` (block `block_id`), and the part is not here
    yet: an insert's commit whose reply was lost, or a crash before the publish. A temporary part
    `tmp_insert_<block id>_...` with the files the log recorded is published as `part`; returns its
    checksums, or None when there is none."""
    prefix = f"{part_files.TMP_INSERT}{block_id}_"
    try:
        names = [n for n in os.listdir(directory) if n.startswith(prefix)]
    except OSError:
        return None
    for name in names:
        try:
            if publish_if_intact(directory, name, part, expected):
                return part_files.read_checksums(os.path.join(directory, part))
        except (OSError, MongoError):   # published meanwhile by the insert itself, or removed
            continue
    return None


def same_data(a: Checksums, b: Checksums) -> bool:
    """Two copies of a part hold the same bytes (`checksums.txt` itself aside)."""
    files = (part_files.DATA_FILE, part_files.COLUMNS_FILE)
    return all(a.get(f) == b.get(f) for f in files)
