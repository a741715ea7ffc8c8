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
in about ClickHouse's order (`shouldExecuteLogEntry`; the checks that cost a
lookup come before those that scan the running tasks), recorded on the task with a
count and a time so the queue view tells why - when:

1. it failed recently: back off `min(2^tries, cap)` ms after the last failure
   (caps: fetches 60 s, mutations 300 s, others 60 s);
2. a fetch, and `fetch_pool_size` fetches are running; a merge or mutation, and
   `merge_pool_size` of those are running;
3. a merge or mutation one of whose source parts is not here yet but is being
   produced or fetched by another task ("is not ready yet"). A source nobody
   will produce does not hold it up: the runner fetches the result instead;
4. a running task produces a part that contains or overlaps its result ("is
   being processed"); a drop range never waits for what it covers;
5. its result is going to be dropped by a drop range queued or running;
6. an ALTER_METADATA while an older alter version is queued; a MUTATE_PART of an
   alter before its metadata version is applied here;
7. a drop range while a running task produces a part it covers (the part would
   outlive the drop), or while another drop range overlapping it runs.

The tasks of a pool that is full are not walked by `next_to_run` (each pool
keeps its tasks in queue order; the walk merges the open pools' by sequence),
and a merge's "is being produced" check is one lookup in an index of the queued
results by partition: with thousands of fetches queued and the fetch pool full,
a decision costs what the other pools hold, not the length of the queue.

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
import heapq
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


@dataclass(slots=True, eq=False)
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
    seq: int = 0                                   # queue order (set when queued)
    blocked_on: PartInfo | None = None             # a source another queued task produces (not walked meanwhile)

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
        self._drops: dict[str, QueueEntry] = {}   # drop ranges, at the front of the queue, in log order
        self._pools: dict[str, dict[str, QueueEntry]] = {"fetch": {}, "merge": {}, "common": {}}   # the rest
        self._producing: dict[str, dict[PartInfo, int]] = {}   # partition -> queued results -> how many tasks
        self._blocked: dict[str, dict[PartInfo, list[QueueEntry]]] = {}   # partition -> source -> tasks waiting
        self._seq = itertools.count(1)
        self.metadata_version = metadata_version
        self.pool_size = {"fetch": fetch_pool_size, "merge": merge_pool_size}
        self.running = {"fetch": 0, "merge": 0, "common": 0}

    def __len__(self) -> int:
        return len(self._drops) + sum(len(queued) for queued in self._pools.values())

    @property
    def entries(self) -> list[QueueEntry]:
        """The queue in order: drop ranges first, then every other task in log order."""
        return list(self._in_order(self._pools))

    def _in_order(self, pools: Iterable[str]) -> Iterator[QueueEntry]:
        """The drop ranges, then the tasks of `pools` in queue order."""
        yield from self._drops.values()
        yield from heapq.merge(*(self._pools[p].values() for p in pools), key=lambda e: e.seq)

    def _queue_of(self, entry: QueueEntry) -> dict[str, QueueEntry]:
        return self._drops if entry.type is EntryType.DROP_RANGE else self._pools[entry.pool()]

    def fetches(self) -> list[QueueEntry]:
        """The queued GET_PART tasks, in queue order."""
        return list(self._pools["fetch"].values())

    def has(self, entry: QueueEntry) -> bool:
        """`entry` itself is queued (or running)."""
        return self._queue_of(entry).get(entry.node_name) is entry

    # -- queueing --------------------------------------------------------------------------------

    def postponed(self) -> int:
        """How many waiting entries have a reason to wait."""
        return sum(1 for e in self.entries if e.postpone_reason)

    def add(self, entry: QueueEntry) -> bool:
        """Queues a task once (False: its log document was queued before)."""
        name = entry.node_name
        if name in self._drops or any(name in queued for queued in self._pools.values()):
            return False
        if entry.type is EntryType.DROP_RANGE:
            assert entry.new_part is not None
            self.virtual.remove_covered(entry.new_part)
            self.virtual.add(entry.new_part)
        elif entry.type in PRODUCING and entry.new_part is not None:
            self.virtual.add(entry.new_part)
            bucket = self._producing.setdefault(entry.new_part.partition_id, {})
            bucket[entry.new_part] = bucket.get(entry.new_part, 0) + 1
        entry.seq = next(self._seq)
        self._queue_of(entry)[name] = entry
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
        full = self._pool_full(entry.pool())   # first of the rest: it costs nothing, the others a scan
        if full is not None:
            return full
        unready = self._unready_source(entry)   # before the running tasks' scan: a lookup per source
        if unready is not None:
            return f"source part {unready} is not ready yet"
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

    def _unready_source(self, entry: QueueEntry) -> PartInfo | None:
        """A source part of `entry` not here yet that another queued task produces."""
        for source in entry.source_parts:
            if self.current.containing(source) is None and self._being_produced(source, entry):
                return source
        return None

    def _block(self, entry: QueueEntry, source: PartInfo) -> None:
        """`entry` waits for `source`: it is not looked at again until a part containing `source` arrives
        here or the last queued task producing such a part leaves the queue (`_unblock_within`)."""
        entry.blocked_on = source
        self._blocked.setdefault(source.partition_id, {}).setdefault(source, []).append(entry)

    def _unblock(self, entry: QueueEntry) -> None:
        source, entry.blocked_on = entry.blocked_on, None
        if source is None:
            return
        bucket = self._blocked.get(source.partition_id, {})
        waiting = bucket.get(source, [])
        if entry in waiting:
            waiting.remove(entry)
        if not waiting:
            bucket.pop(source, None)
            if not bucket:
                self._blocked.pop(source.partition_id, None)

    def _unblock_within(self, part: PartInfo) -> None:
        """Every task waiting for a source that `part` contains is looked at again."""
        bucket = self._blocked.get(part.partition_id)
        if not bucket:
            return
        for source in [s for s in bucket if part.contains(s)]:   # the blocked sources: a few per partition
            for entry in list(bucket.get(source, [])):
                self._unblock(entry)

    def _pool_full(self, pool: str) -> str | None:
        if pool in self.pool_size and self.running[pool] >= self.pool_size[pool]:
            what = "fetches" if pool == "fetch" else "merges and mutations"
            return f"{self.running[pool]} {what} are already executing, at most {self.pool_size[pool]}"
        return None

    def _drop_ranges(self) -> Iterable[QueueEntry]:
        """The queued drop ranges (a task's check costs their number, not the length of the queue)."""
        return self._drops.values()

    def _being_produced(self, part: PartInfo, asking: QueueEntry) -> bool:
        """Whether another queued or running task produces `part` (or a part containing it). The queued
        results are indexed by partition; an exact match (the usual case: a merge's source is a fetch's
        or an earlier merge's result) costs one lookup."""
        bucket = self._producing.get(part.partition_id)
        if not bucket:
            return False
        mine = asking.new_part if asking.type in PRODUCING else None

        def others(result: PartInfo) -> int:
            return bucket.get(result, 0) - (1 if result == mine else 0)

        if others(part) > 0:
            return True
        # A task whose result contains this one's too comes after it (a mutation of this merge's result, a
        # wider merge): waiting for it would wait for ever. This task then fetches its result instead.
        return any(result.contains(part) and others(result) > 0 and not (mine is not None and result.contains(mine))
                   for result in bucket)

    def next_to_run(self, now: int) -> QueueEntry | None:
        """The first task in queue order that may run (recording why the ones before it wait). The tasks
        of a full pool are not walked: nothing of theirs can start (the queue view says why they wait)."""
        open_pools = [p for p, queued in self._pools.items() if queued and self._pool_full(p) is None]
        for entry in self._in_order(open_pools):
            if entry.currently_executing or entry.blocked_on is not None:
                continue
            reason = None if self.already_done(entry) else self.postpone_reason(entry, now)
            if reason is None:
                return entry
            entry.num_postponed += 1
            entry.postpone_reason = reason
            entry.last_postpone_time_ms = now
            if entry.source_parts and (unready := self._unready_source(entry)) is not None:
                self._block(entry, unready)
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
            cancelled = [e for p in ("fetch", "merge") for e in self._pools[p].values()
                         if e.type in PRODUCING and not e.currently_executing
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
                self._unblock_within(part)
        return cancelled

    def drop(self, entry: QueueEntry) -> None:
        """Removes a queued task that will never run (its part is lost for good, or its quorum failed)."""
        if entry.currently_executing:
            raise ValueError(f"{entry.node_name} is running")
        self._remove(entry)

    def _remove(self, entry: QueueEntry) -> None:
        queued = self._queue_of(entry)
        if queued.get(entry.node_name) is not entry:
            raise ValueError(f"{entry.node_name} is not queued")
        del queued[entry.node_name]
        self._unblock(entry)
        if entry.type in PRODUCING and entry.new_part is not None:
            bucket = self._producing[entry.new_part.partition_id]
            bucket[entry.new_part] -= 1
            if not bucket[entry.new_part]:
                del bucket[entry.new_part]
                if not bucket:
                    del self._producing[entry.new_part.partition_id]
                self._unblock_within(entry.new_part)   # nobody produces it now: its waiters run and fetch

    def part_removed(self, part: PartInfo) -> None:
        """A part left this replica (an old part after a merge, a detached one)."""
        self.current.remove(part)

    def view(self, now: int) -> list[dict[str, Any]]:
        """The queue view. A waiting task shows why it waits now (`next_to_run` does not walk the tasks
        of a full pool, so what it recorded may be older)."""
        rows = []
        for position, entry in enumerate(self._in_order(self._pools)):
            row = entry.view(position)
            if not entry.currently_executing and not self.already_done(entry):
                row["postpone_reason"] = self.postpone_reason(entry, now) or ""
            rows.append(row)
        return rows
