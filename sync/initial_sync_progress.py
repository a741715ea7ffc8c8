"""Initial sync progress: counters kept while a member clones, and the
`replSetGetStatus.initialSyncStatus` document built from them.

Pure. The syncer (`sync.initial_sync`) updates an `InitialSyncProgress` as it
goes; `initial_sync_status(progress, now)` renders it with MongoDB's field names
(logical initial sync, 4.4+):

    {method: "logical", failedInitialSyncAttempts, initialSyncStart, [initialSyncEnd],
     totalInitialSyncElapsedMillis, initialSyncAttempts: [{durationMillis, status,
     syncSource, rollBackId, operationsRetried, totalTimeUnreachableMillis}],
     approxTotalDataSize, approxTotalBytesCopied, [remainingInitialSyncEstimatedMillis],
     appliedOps, [initialSyncOplogStart], [initialSyncOplogEnd],
     databases: {databasesToClone, databasesCloned,
                 <db>: {collections, clonedCollections, [start, end, elapsedMillis],
                        <db.coll>: {documentsToCopy, documentsCopied, indexes, fetchedBatches,
                                    bytesToCopy, approxBytesCopied, receivedBatches,
                                    [start, end, elapsedMillis]}}}}

The remaining-time estimate is MongoDB's: the average rate so far (elapsed time per
byte copied) times the bytes still to copy; it is absent until a byte is copied.
The sizes to copy are the source's figures when the clone started, so "copied"
may end a little above or below "to copy" when writes go on meanwhile.
"""

from __future__ import annotations

__layer__ = "core"  # pure: no I/O, clock or randomness (tests/unit/test_layering.py)

import datetime
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from bson.timestamp import Timestamp


@dataclass(slots=True)
class CollectionProgress:
    ns: str
    documents_to_copy: int = 0
    bytes_to_copy: int = 0
    indexes: int = 0
    documents_copied: int = 0
    bytes_copied: int = 0
    fetched_batches: int = 0
    start: datetime.datetime | None = None
    end: datetime.datetime | None = None


@dataclass(slots=True)
class DatabaseProgress:
    name: str
    collections: list[CollectionProgress] = field(default_factory=list)
    start: datetime.datetime | None = None
    end: datetime.datetime | None = None

    @property
    def cloned_collections(self) -> int:
        return sum(1 for c in self.collections if c.end is not None)


@dataclass(frozen=True, slots=True)
class AttemptInfo:
    """One finished attempt (MongoDB lists failed and successful attempts alike)."""

    duration_ms: int
    status: str
    sync_source: str
    rollback_id: int = -1


@dataclass(slots=True)
class InitialSyncProgress:
    started: datetime.datetime | None = None
    ended: datetime.datetime | None = None
    failed_attempts: int = 0
    attempts: list[AttemptInfo] = field(default_factory=list)
    databases: list[DatabaseProgress] = field(default_factory=list)
    applied_ops: int = 0
    begin_applying: Timestamp | None = None
    stop: Timestamp | None = None

    def new_attempt(self) -> None:
        """Forget the previous attempt's copy: each attempt starts from an empty member."""
        self.databases = []
        self.applied_ops = 0
        self.begin_applying = None
        self.stop = None

    @property
    def bytes_to_copy(self) -> int:
        return sum(c.bytes_to_copy for d in self.databases for c in d.collections)

    @property
    def bytes_copied(self) -> int:
        return sum(c.bytes_copied for d in self.databases for c in d.collections)


def elapsed_ms(start: datetime.datetime, end: datetime.datetime) -> int:
    return max(int((end - start).total_seconds() * 1000), 0)


def remaining_estimate_ms(elapsed: int, bytes_copied: int, bytes_total: int) -> int | None:
    """MongoDB's estimate: time per byte so far times the bytes left; None before the first byte."""
    if bytes_copied <= 0:
        return None
    return max(int(elapsed / bytes_copied * (bytes_total - bytes_copied)), 0)


def _timed(doc: dict[str, Any], start: datetime.datetime | None, end: datetime.datetime | None,
           now: datetime.datetime) -> None:
    if start is None:
        return
    doc["start"] = start
    if end is not None:
        doc["end"] = end
    doc["elapsedMillis"] = elapsed_ms(start, end or now)


def _collection_status(c: CollectionProgress, now: datetime.datetime) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "documentsToCopy": c.documents_to_copy, "documentsCopied": c.documents_copied, "indexes": c.indexes,
        "fetchedBatches": c.fetched_batches, "bytesToCopy": c.bytes_to_copy,
        "approxBytesCopied": c.bytes_copied, "receivedBatches": c.fetched_batches,
    }
    _timed(doc, c.start, c.end, now)
    return doc


def _databases_status(databases: list[DatabaseProgress], now: datetime.datetime) -> dict[str, Any]:
    doc: dict[str, Any] = {"databasesToClone": len(databases),
                           "databasesCloned": sum(1 for d in databases if d.end is not None)}
    for db in databases:
        sub: dict[str, Any] = {"collections": len(db.collections), "clonedCollections": db.cloned_collections}
        _timed(sub, db.start, db.end, now)
        for c in db.collections:
            sub[c.ns] = _collection_status(c, now)
        doc[db.name] = sub
    return doc


def _attempt_status(a: AttemptInfo) -> dict[str, Any]:
    return {"durationMillis": a.duration_ms, "status": a.status, "syncSource": a.sync_source,
            "rollBackId": a.rollback_id, "operationsRetried": 0, "totalTimeUnreachableMillis": 0}


def initial_sync_status(p: InitialSyncProgress, now: datetime.datetime) -> dict[str, Any]:
    """`replSetGetStatus.initialSyncStatus` for the progress `p` at wall time `now`."""
    doc: dict[str, Any] = {"method": "logical", "failedInitialSyncAttempts": p.failed_attempts}
    total_elapsed = 0
    if p.started is not None:
        doc["initialSyncStart"] = p.started
        if p.ended is not None:
            doc["initialSyncEnd"] = p.ended
        total_elapsed = elapsed_ms(p.started, p.ended or now)
        doc["totalInitialSyncElapsedMillis"] = total_elapsed
    doc["initialSyncAttempts"] = [_attempt_status(a) for a in p.attempts]
    total, copied = p.bytes_to_copy, p.bytes_copied
    doc["approxTotalDataSize"] = total
    doc["approxTotalBytesCopied"] = copied
    remaining = remaining_estimate_ms(total_elapsed, copied, total)
    if remaining is not None:
        doc["remainingInitialSyncEstimatedMillis"] = remaining
    doc["appliedOps"] = p.applied_ops
    if p.begin_applying is not None:
        doc["initialSyncOplogStart"] = p.begin_applying
    if p.stop is not None:
        doc["initialSyncOplogEnd"] = p.stop
    doc["databases"] = _databases_status(p.databases, now)
    return doc


@dataclass(frozen=True, slots=True)
class CopyTotals:
    """What the CLI's progress bar needs, summed over every collection of a status document."""

    documents_copied: int
    documents_to_copy: int
    bytes_copied: int
    bytes_to_copy: int
    remaining_ms: int | None


def copy_totals(status: Mapping[str, Any]) -> CopyTotals:
    """Sums an `initialSyncStatus` document (as served, possibly by another member)."""
    docs_copied = docs_total = 0
    databases = status.get("databases")
    for db in (databases or {}).values() if isinstance(databases, Mapping) else ():
        if not isinstance(db, Mapping):
            continue
        for coll in db.values():
            if isinstance(coll, Mapping):
                docs_copied += int(coll.get("documentsCopied", 0))
                docs_total += int(coll.get("documentsToCopy", 0))
    remaining = status.get("remainingInitialSyncEstimatedMillis")
    return CopyTotals(docs_copied, docs_total, int(status.get("approxTotalBytesCopied", 0)),
                      int(status.get("approxTotalDataSize", 0)), None if remaining is None else int(remaining))
