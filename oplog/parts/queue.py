"""The replication queue's scheduler: which task runs next, and why the others wait.

Theory of operation
-------------------
Every member turns each part-log entry it applies into a task in its own,
unreplicated queue (ClickHouse's `replicas/<r>/queue`): fetch a part
(GET_PART), merge parts (MERGE_PARTS), rewrite a part for a mutation
(MUTATE_PART), drop a range (DROP_RANGE), change the table's metadata
(ALTER_METADATA). A runner asks `next_to_run(now)` for a task, carries it out
off the event loop, and reports `finished(...)`. This module decides; it does
no I/O and reads no clock.

It keeps ClickHouse's three part sets:

* `current`: the parts this replica has;
* `virtual`: what `current` will be once every queued task ran (a task's
  result goes in when it is queued; a drop range removes what it covers);
* `future`: the parts that running tasks are producing right now.

A task whose result this replica already has (the part or one containing it)
needs no work (`already_done`). Otherwise it waits - `postpone_reason`, checked
in ClickHouse's order (`shouldExecuteLogEntry`), recorded on the task with a
count and a time so the queue view tells why - when:

1. it failed recently: back off `min(2^tries, cap)` ms after the last failure
   (caps: fetches 60 s, mutations 300 s, others 60 s);
2. a running task produces a part that contains or overlaps its result ("is
   being processed"); a drop range never waits for what it covers;
3. its result is going to be dropped by a drop range queued or running;
4. a fetch, and `fetch_pool_size` fetches are running; a merge or mutation, and
   `merge_pool_size` of those are running;
5. a merge or mutation one of whose source parts is not here yet but is being
   produced or fetched by another task ("is not ready yet"). A source nobody
   will produce does not hold it up: the runner fetches the result instead;
6. an ALTER_METADATA while an older alter version is queued; a MUTATE_PART of an
   alter before its metadata version is applied here;
7. a drop range while a running task produces a part it covers (the part would
   outlive the drop), or while another drop range overlapping it runs.

Drop ranges go to the front of the queue (no fetch is wasted on data about to
be dropped), everything else to the back; a finished drop range cancels the
queued tasks whose results it covers. The rules keep the GET-versus-covering-
MERGE livelock of ClickHouse #23313 out: a merge waits for a source only while
another task is producing it, and a fetch waits only for a task that is
running.
"""

from __future__ import annotations

__layer__ = "core"  # pure: no I/O, clock or randomness (tests/unit/test_layering.py)

import enum
import itertools
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from oplog.parts.active_set import ActivePartSet
from oplog.parts.part_info import PartInfo

FETCH_POOL_SIZE = 16         # ClickHouse's background_fetches_pool_size
MERGE_POOL_SIZE = 16         # merges and mutations at once
BACKOFF_CAP_MS = {"GET_PART": 60_000, "MUTATE_PART": 300_000}
DEFAULT_BACKOFF_CAP_MS = 60_000


class EntryType(enum.Enum):
    GET_PART = "GET_PART"
    MERGE_PARTS = "MERGE_PARTS"
    MUTATE_PART = "MUTATE_PART"
    DROP_RANGE = "DROP_RANGE"
    ALTER_METADATA = "ALTER_METADATA"


PRODUCING = (EntryType.GET_PART, EntryType.MERGE_PARTS, EntryType.MUTATE_PART)


@dataclass(slots=True)
class QueueEntry:
    """One task, keyed by the log document it came from (`node_name`, which also orders the log)."""

    node_name: str
    type: EntryType
    new_part: PartInfo | None = None               # the result; for DROP_RANGE the fake part dropped
    source_parts: tuple[PartInfo, ...] = ()        # MERGE_PARTS / MUTATE_PART
    create_time_ms: int = 0
    source_replica: str = ""
    quorum: int = 0
    alter_version: int = 0                         # ALTER_METADATA, or the alter a MUTATE_PART belongs to
    currently_executing: bool = False
    num_tries: int = 0
    last_exception: str = ""
    last_exception_time_ms: int = 0
    last_attempt_time_ms: int = 0
    num_postponed: int = 0
    postpone_reason: str = ""
    last_postpone_time_ms: int = 0

    def pool(self) -> str:
        if self.type is EntryType.GET_PART:
            return "fetch"
        if self.type in (EntryType.MERGE_PARTS, EntryType.MUTATE_PART):
            return "merge"
        return "common"

    def view(self, position: int) -> dict[str, Any]:
        """A row of the queue view, with ClickHouse's `system.replication_queue` column names."""
        return {
            "position": position, "node_name": self.node_name, "type": self.type.value,
            "create_time": self.create_time_ms, "required_quorum": self.quorum,
            "source_replica": self.source_replica,
            "new_part_name": self.new_part.name if self.new_part is not None else "",
            "parts_to_merge": [p.name for p in self.source_parts], "is_detach": False,
            "is_currently_executing": self.currently_executing, "num_tries": self.num_tries,
            "last_exception": self.last_exception, "last_exception_time": self.last_exception_time_ms,
            "last_attempt_time": self.last_attempt_time_ms, "num_postponed": self.num_postponed,
            "postpone_reason": self.postpone_reason, "last_postpone_time": self.last_postpone_time_ms,
            "merge_type": "REGULAR" if self.type is EntryType.MERGE_PARTS else "",
        }


class ReplicationQueue:
    def __init__(self, current_parts: Iterable[PartInfo] = (), *, metadata_version: int = 0,
                 fetch_pool_size: int = FETCH_POOL_SIZE, merge_pool_size: int = MERGE_POOL_SIZE) -> None:
        parts = list(current_parts)
        self.current = ActivePartSet(parts)
        self.virtual = ActivePartSet(parts)
        self.future: dict[PartInfo, QueueEntry] = {}
        self.entries: list[QueueEntry] = []
        self._names: set[str] = set()
        self.metadata_version = metadata_version
        self.pool_size = {"fetch": fetch_pool_size, "merge": merge_pool_size}
        self.running = {"fetch": 0, "merge": 0, "common": 0}

    def __len__(self) -> int:
        return len(self.entries)

    # -- queueing --------------------------------------------------------------------------------

    def add(self, entry: QueueEntry) -> bool:
        """Queues a task once (False: its log document was queued before)."""
        if entry.node_name in self._names:
            return False
        if entry.type is EntryType.DROP_RANGE:
            assert entry.new_part is not None
            self.virtual.remove_covered(entry.new_part)
            self.virtual.add(entry.new_part)
            at = next((i for i, e in enumerate(self.entries) if e.type is not EntryType.DROP_RANGE), len(self.entries))
            self.entries.insert(at, entry)
        else:
            if entry.type in PRODUCING and entry.new_part is not None:
                self.virtual.add(entry.new_part)
            self.entries.append(entry)
        self._names.add(entry.node_name)
        return True

    # -- choosing --------------------------------------------------------------------------------

    def already_done(self, entry: QueueEntry) -> bool:
        """A producing task whose part (or one containing it) this replica already has."""
        return (entry.type in PRODUCING and entry.new_part is not None
                and self.current.containing(entry.new_part) is not None)

    def postpone_reason(self, entry: QueueEntry, now: int) -> str | None:
        """Why `entry` must wait now (None: it may run)."""
        if entry.num_tries and entry.last_exception_time_ms:
            cap = BACKOFF_CAP_MS.get(entry.type.value, DEFAULT_BACKOFF_CAP_MS)
            wait = min(2 ** min(entry.num_tries, 30), cap)
            if now < entry.last_exception_time_ms + wait:
                return f"backing off for {wait} ms after {entry.num_tries} failed tries"
        part = entry.new_part
        if part is not None and entry.type is not EntryType.DROP_RANGE:
            for producing, other in self.future.items():
                if other is entry:
                    continue
                if producing.contains(part):
                    return f"another log entry for the same part ({producing}) is being processed"
                if not producing.is_disjoint(part):
                    return f"part {part} is not disjoint with part {producing}, which is being processed"
            drop = next((e for e in self._drop_ranges() if e.new_part is not None and e.new_part.contains(part)),
                        None)
            if drop is not None:
                return f"it produces part {part}, which is going to be dropped by {drop.new_part}"
        pool = entry.pool()
        if pool in self.pool_size and self.running[pool] >= self.pool_size[pool]:
            what = "fetches" if pool == "fetch" else "merges and mutations"
            return f"{self.running[pool]} {what} are already executing, at most {self.pool_size[pool]}"
        for source in entry.source_parts:
            if self.current.containing(source) is None and self._being_produced(source, entry):
                return f"source part {source} is not ready yet"
        if entry.type is EntryType.ALTER_METADATA:
            older = next((e for e in self.entries if e.type is EntryType.ALTER_METADATA and e is not entry
                          and e.alter_version < entry.alter_version), None)
            if older is not None:
                return f"alter version {entry.alter_version} waits for alter version {older.alter_version}"
        if entry.type is EntryType.MUTATE_PART and entry.alter_version > self.metadata_version:
            return f"waits for the metadata of alter version {entry.alter_version}"
        if entry.type is EntryType.DROP_RANGE and part is not None:
            covered = next((p for p in self.future if part.contains(p)), None)
            if covered is not None:
                return f"drop range {part} waits for part {covered}, which is being processed"
            running = next((e for e in self._drop_ranges() if e.currently_executing
                            and e.new_part is not None and not e.new_part.is_disjoint(part)), None)
            if running is not None:
                return f"drop range {part} waits for drop range {running.new_part}"
        return None

    def _drop_ranges(self) -> Iterator[QueueEntry]:
        """The queued drop ranges: the front of the queue (`add` keeps them there), so a task's check
        costs the number of drop ranges, not the length of the queue."""
        return itertools.takewhile(lambda e: e.type is EntryType.DROP_RANGE, self.entries)

    def _being_produced(self, part: PartInfo, asking: QueueEntry) -> bool:
        """Whether another queued or running task produces `part` (or a part containing it)."""
        return any(e is not asking and e.type in PRODUCING and e.new_part is not None and e.new_part.contains(part)
                   for e in self.entries)

    def next_to_run(self, now: int) -> QueueEntry | None:
        """The first task in queue order that may run (recording why the ones before it wait)."""
        for entry in self.entries:
            if entry.currently_executing:
                continue
            reason = None if self.already_done(entry) else self.postpone_reason(entry, now)
            if reason is None:
                return entry
            entry.num_postponed += 1
            entry.postpone_reason = reason
            entry.last_postpone_time_ms = now
        return None

    # -- running ---------------------------------------------------------------------------------

    def started(self, entry: QueueEntry, now: int) -> None:
        entry.currently_executing = True
        entry.last_attempt_time_ms = now
        entry.postpone_reason = ""
        self.running[entry.pool()] += 1
        if entry.type in PRODUCING and entry.new_part is not None:
            self.future[entry.new_part] = entry

    def finished(self, entry: QueueEntry, now: int, *, error: str = "",
                 produced: PartInfo | None = None) -> list[QueueEntry]:
        """The task ended. With `error` it stays queued (and backs off); otherwise it leaves the queue,
        its part joins `current` (`produced`: the part actually obtained, e.g. a covering one fetched),
        and a drop range removes what it covers. Returns the queued tasks a drop range cancelled."""
        if entry.currently_executing:
            entry.currently_executing = False
            self.running[entry.pool()] -= 1
        if entry.new_part is not None and self.future.get(entry.new_part) is entry:
            del self.future[entry.new_part]
        if error:
            entry.num_tries += 1
            entry.last_exception = error
            entry.last_exception_time_ms = now
            return []
        self._remove(entry)
        cancelled: list[QueueEntry] = []
        if entry.type is EntryType.DROP_RANGE and entry.new_part is not None:
            self.current.remove_covered(entry.new_part)
            cancelled = [e for e in self.entries if e.type in PRODUCING and not e.currently_executing
                         and e.new_part is not None and entry.new_part.contains(e.new_part)]
            for e in cancelled:
                self._remove(e)
        elif entry.type is EntryType.ALTER_METADATA:
            self.metadata_version = max(self.metadata_version, entry.alter_version)
        elif entry.type in PRODUCING:
            part = produced or entry.new_part
            if part is not None:
                self.current.add(part)
                self.virtual.add(part)
        return cancelled

    def drop(self, entry: QueueEntry) -> None:
        """Removes a queued task that will never run (its part is lost for good, or its quorum failed)."""
        if entry.currently_executing:
            raise ValueError(f"{entry.node_name} is running")
        self._remove(entry)

    def _remove(self, entry: QueueEntry) -> None:
        self.entries.remove(entry)
        self._names.discard(entry.node_name)

    def part_removed(self, part: PartInfo) -> None:
        """A part left this replica (an old part after a merge, a detached one)."""
        self.current.remove(part)

    def view(self) -> list[dict[str, Any]]:
        return [entry.view(position) for position, entry in enumerate(self.entries)]
