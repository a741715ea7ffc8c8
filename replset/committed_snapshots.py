"""Committed snapshots: what `majority` reads answer from, so they do not wait for the newest write.

Theory of operation. SQLite keeps one version of each document, but an open read transaction keeps
the data as it was when it began (`SQLiteStore.snapshot`). While majority reads keep coming (one in
the last `DEMAND_WINDOW_S`), this member takes such a snapshot each time a commit moves its applied
optime, labelled with the newest oplog entry it holds (read inside the snapshot, so the label is
exactly what the data reflects): the *candidates*.

A majority read (each batch of a majority cursor) starts from `target = min(commit point, applied)`
and takes the oldest candidate whose label is at or past it: it holds every write that was majority
committed when the read began (a `w: "majority"` write acknowledged before is seen). The read then
answers once the commit point reaches the label (`replset/wire/read_waits.settle_batch`), which under
load is at once or one replication step away, instead of waiting for the newest write. With no
candidate at or past the target (no demand before), a new snapshot is taken for the read.

A candidate below the target can never be chosen again (the target only moves forward within a
history epoch) and is closed once no read holds it; one that no read chose for `MAX_IDLE_S` is
closed too, so a commit point that stops moving does not pin the WAL for long (a checkpoint cannot
move past an open snapshot; while reads keep choosing the snapshot at a stuck commit point, it is
pinned, as MongoDB's committed snapshot pins history); at most `MAX_CANDIDATES` are kept. A rollback
or resync (a new history epoch) closes every candidate: a label from the old history proves nothing in
the new one.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from base.errors import MongoError
from base.optime import NULL_OPTIME, OpTime
from oplog.sqlite_store import SnapshotReader, SQLiteStore, scan_chunked

DEMAND_WINDOW_S = 10.0
MAX_IDLE_S = 10.0
MAX_CANDIDATES = 32


@dataclass(eq=False)
class Candidate:
    optime: OpTime  # the newest oplog entry the snapshot holds
    epoch: int
    reader: SnapshotReader
    used_s: float  # taken or last chosen by a read
    users: int = 0
    retired: bool = False  # out of the list: closed when its last user lets go


class CommittedSnapshots:
    def __init__(self, store: SQLiteStore, clock: Callable[[], float]) -> None:
        self._store = store
        self._clock = clock
        self._candidates: list[Candidate] = []  # ascending labels, one history epoch
        self._wanted_until = float("-inf")

    def __len__(self) -> int:
        return len(self._candidates)

    def on_commit(self, epoch: int, target: OpTime) -> None:
        """After a commit moved the applied optime: a new candidate while majority reads want them."""
        now = self._clock()
        self._prune(epoch, target, now)
        if now <= self._wanted_until and len(self._candidates) < MAX_CANDIDATES:
            self._take(epoch, now)

    def acquire(self, epoch: int, target: OpTime) -> Candidate:
        """The oldest candidate holding everything up to `target` (taken now if none is kept); pass it
        to `release` once the read is answered."""
        now = self._clock()
        self._wanted_until = now + DEMAND_WINDOW_S
        self._prune(epoch, target, now)
        chosen = next((c for c in self._candidates if c.optime >= target), None)
        if chosen is None:
            chosen = self._take(epoch, now)
        chosen.users += 1
        chosen.used_s = now
        return chosen

    def release(self, candidate: Candidate) -> None:
        candidate.users -= 1
        if candidate.users == 0 and candidate.retired:
            candidate.reader.close()

    def close_all(self) -> None:
        for candidate in self._candidates:
            self._retire(candidate)
        self._candidates.clear()

    def _take(self, epoch: int, now: float) -> Candidate:
        reader = self._store.snapshot()
        newest = reader.newest_entry()
        candidate = Candidate(NULL_OPTIME if newest is None else OpTime.from_document(newest), epoch, reader, now)
        if self._candidates and self._candidates[-1].optime >= candidate.optime:
            self._retire(candidate)  # nothing new since the newest kept one: that one serves
            return self._candidates[-1]
        self._candidates.append(candidate)
        return candidate

    def _prune(self, epoch: int, target: OpTime, now: float) -> None:
        keep: list[Candidate] = []
        for candidate in self._candidates:
            stale = candidate.epoch != epoch or candidate.optime < target or \
                (candidate.users == 0 and now - candidate.used_s > MAX_IDLE_S)
            if stale:
                self._retire(candidate)
            else:
                keep.append(candidate)
        self._candidates = keep

    @staticmethod
    def _retire(candidate: Candidate) -> None:
        candidate.retired = True
        if candidate.users == 0:
            candidate.reader.close()


class MajorityView:
    """What one majority read or cursor reads through: the candidate bound for its current batch
    (`bind` before the batch, `release` once it is answered). A scan continues across batches by
    record id, each chunk from the candidate bound then, as a yielding scan does."""

    def __init__(self, snapshots: CommittedSnapshots) -> None:
        self._snapshots = snapshots
        self._bound: Candidate | None = None

    @property
    def optime(self) -> OpTime | None:
        return None if self._bound is None else self._bound.optime

    def bind(self, epoch: int, target: OpTime) -> None:
        self.release()
        self._bound = self._snapshots.acquire(epoch, target)

    def release(self) -> None:
        bound, self._bound = self._bound, None
        if bound is not None:
            self._snapshots.release(bound)

    def _reader(self) -> SnapshotReader:
        if self._bound is None:
            raise MongoError(239, "a majority read's snapshot was let go before the read ended")
        return self._bound.reader

    def scan(self, ns: str) -> Iterator[dict[str, Any]]:
        return scan_chunked(self._reader, ns)

    def __getattr__(self, name: str) -> Any:  # get, count, collection, indexes, ...: the bound snapshot's
        return getattr(self._reader(), name)
