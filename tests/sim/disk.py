"""A member's simulated disk: what survives a crash, and what a crash loses.

Durable state (MongoDB's `local` database): the term and last vote
(`local.replset.election`), the oplog, the data the oplog produced (an entry
and its effect commit in one transaction, design rule 3), the rollback id,
`minValid`, and the rollback file (`<dbpath>/rollback/`). The config is fixed
for a run and lives with the runner.

The product commits through one group-commit writer and flushes its journal
apart from the commits (`oplog.journal`), so the model is MongoDB's applied /
durable split: a transaction *commits* (`commit`) at once - its entries are in
the oplog, served to other members, applied, enough for `w:1` - and becomes
*durable* when a journal flush that began after it ends (`sync`), a random disk
latency later. Until then it is the unsynced tail: a crash (`crash`, the
machine's: power lost) drops it, and the data goes back to what was durable.
A rollback's transaction is the exception: it commits when its flush ends
(it is answered only then in the product too, and nothing else is written
meanwhile), so a crash finds the member before or after it.

Entries are tiny and carry only ints, so a prefix of the oplog is identified
by a hash chain: `chain[i]` covers entries `0..i`. Two members whose oplogs
hold the same optime with the same chain value agree on the whole prefix up to
it; the checkers use that to compare committed prefixes in O(1).

Data lives in a real store: an in-memory `oplog.sqlite_store.SQLiteStore`,
one document `{_id: key, value, write}` per key in `sim.kv`. A batch becomes
durable by applying its entries with the product's `oplog.apply.apply_entry`
(each WRITE entry in the product's idempotent oplog form, a `$set` with upsert:
`entry_document`) in one storage transaction, and a rollback replaces the
refetched documents in one transaction too. `fold` is what the model expects:
the checkers compare each member's store (`data`) with the fold of its oplog.
"""

from __future__ import annotations

import bisect
import enum
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from base.optime import NULL_OPTIME, OpTime
from base.votes import LastVote
from oplog.apply import apply_entry
from oplog.entry import update_entry
from oplog.sqlite_store import SQLiteStore, StoreTxn

MAX_OPLOG_ENTRIES = 200_000
KV_NS = "sim.kv"


class SimInvariantError(Exception):
    """A simulator-checked invariant broke (the message says which)."""


class EntryKind(enum.IntEnum):
    INITIATE = 0      # the "initiating set" no-op
    NEW_PRIMARY = 1   # the "new primary" no-op written after an election
    WRITE = 2         # a client write: data[key] = (value, write_id)


@dataclass(frozen=True, slots=True)
class Entry:
    optime: OpTime
    kind: EntryKind
    write_id: int = -1
    key: int = -1
    value: int = 0

    def describe(self) -> str:
        o = self.optime
        what = self.kind.name if self.kind is not EntryKind.WRITE else f"w{self.write_id} k{self.key}={self.value}"
        return f"({o.term},{o.secs % 100_000}.{o.inc}) {what}"


def chain_hash(previous: int, entry: Entry) -> int:
    o = entry.optime
    return hash((previous, o.term, o.secs, o.inc, int(entry.kind), entry.write_id, entry.key, entry.value))


def entry_document(entry: Entry) -> dict[str, Any] | None:
    """The product's oplog form of a simulated entry (None for the no-ops, which change no data)."""
    if entry.kind is not EntryKind.WRITE:
        return None
    return update_entry(KV_NS, entry.key, {"$set": {"value": entry.value, "write": entry.write_id}}, upsert=True)


def _put(txn: StoreTxn, key: int, doc: tuple[int, int] | None) -> None:
    txn.delete(KV_NS, key)
    if doc is not None:
        txn.insert(KV_NS, {"_id": key, "value": doc[0], "write": doc[1]}, upsert=True)


def apply_entries(data: dict[int, tuple[int, int]], entries: list[Entry]) -> None:
    for e in entries:
        if e.kind is EntryKind.WRITE:
            data[e.key] = (e.value, e.write_id)


def fold(entries: list[Entry]) -> dict[int, tuple[int, int]]:
    data: dict[int, tuple[int, int]] = {}
    apply_entries(data, entries)
    return data


@dataclass(frozen=True, slots=True)
class DiskEvent:
    """What the observer records: entries committed, made durable, saved to the rollback file, or truncated."""

    kind: str                      # "committed" | "synced" | "saved" | "rolled_back" | "lost" (not durable)
    entries: tuple[Entry, ...]
    hashes: tuple[int, ...]


@dataclass(slots=True)
class Disk:
    term: int = 0
    last_vote: LastVote | None = None
    rbid: int = 0
    min_valid: OpTime | None = None
    refetched_keys: frozenset[int] = frozenset()   # the documents the last rollback took from its source
    oplog: list[Entry] = field(default_factory=list)
    chain: list[int] = field(default_factory=list)
    ts_keys: list[int] = field(default_factory=list)
    store: SQLiteStore = field(default_factory=lambda: SQLiteStore(None))
    rollback_saved: list[Entry] = field(default_factory=list)
    durable_len: int = 0                                   # the oplog's durable prefix
    durable_data: dict[int, tuple[int, int]] = field(default_factory=dict)   # the data as of that prefix
    journal: list[DiskEvent] = field(default_factory=list)

    @property
    def last(self) -> OpTime:
        return self.oplog[-1].optime if self.oplog else NULL_OPTIME

    @property
    def last_hash(self) -> int:
        return self.chain[-1] if self.chain else 0

    @property
    def data(self) -> dict[int, tuple[int, int]]:
        """The store's documents, as `key -> (value, write_id)`."""
        reader = self.store.reader
        if reader.collection(KV_NS) is None:
            return {}
        return {doc["_id"]: (doc["value"], doc["write"]) for doc in reader.scan(KV_NS)}

    def get(self, key: int) -> tuple[int, int] | None:
        doc = self.store.reader.get(KV_NS, key)
        return (doc["value"], doc["write"]) if doc is not None else None

    def _transaction(self, work: Callable[[StoreTxn], None]) -> None:
        txn = self.store.begin()
        try:
            work(txn)
        except BaseException:
            self.store.rollback()
            raise
        self.store.commit()

    def put(self, key: int, doc: tuple[int, int] | None) -> None:
        """Sets one document directly, durably (a story's starting state)."""
        self._transaction(lambda txn: _put(txn, key, doc))
        if doc is None:
            self.durable_data.pop(key, None)
        else:
            self.durable_data[key] = doc

    # -- writes -------------------------------------------------------------------------------------

    def persist_term(self, term: int, last_vote: LastVote | None) -> None:
        self.term = max(self.term, term)
        self.last_vote = last_vote

    @property
    def all_durable(self) -> bool:
        return self.durable_len == len(self.oplog)

    def commit(self, entries: list[Entry]) -> None:
        """A transaction committed: its entries are in the oplog and their effect in the data (visible,
        not durable yet)."""
        if len(self.oplog) + len(entries) > MAX_OPLOG_ENTRIES:
            raise SimInvariantError(f"oplog grew past {MAX_OPLOG_ENTRIES} entries")
        for e in entries:
            self._check_order(e)
            self.chain.append(chain_hash(self.last_hash, e))
            self.oplog.append(e)
            self.ts_keys.append(e.optime.ts_key)
        if entries:
            self._transaction(lambda txn: self._apply(txn, entries))
            self.journal.append(DiskEvent("committed", tuple(entries), tuple(self.chain[-len(entries):])))

    def sync(self, upto: int | None = None) -> list[Entry]:
        """A journal flush ended: the oplog's first `upto` entries (all: None) and their data are durable.
        Returns the entries that became durable."""
        upto = len(self.oplog) if upto is None else min(upto, len(self.oplog))
        if upto <= self.durable_len:
            return []
        entries = self.oplog[self.durable_len:upto]
        hashes = self.chain[self.durable_len:upto]
        self.durable_len = upto
        apply_entries(self.durable_data, entries)
        self.journal.append(DiskEvent("synced", tuple(entries), tuple(hashes)))
        return entries

    @staticmethod
    def _apply(txn: StoreTxn, entries: list[Entry]) -> None:
        for e in entries:
            doc = entry_document(e)
            if doc is not None:
                apply_entry(txn, doc, replay=True)

    def _check_order(self, entry: Entry) -> None:
        last = self.last
        if self.oplog and (entry.optime.ts_key <= last.ts_key or entry.optime.term < last.term):
            raise SimInvariantError(f"oplog order broken: {entry.describe()} after {self.oplog[-1].describe()}")

    def crash(self) -> list[Entry]:
        """The machine lost power: what was not durable is gone. Returns the entries lost."""
        lost = self.oplog[self.durable_len:]
        if not lost:
            return []
        hashes = self.chain[self.durable_len:]
        del self.oplog[self.durable_len:], self.chain[self.durable_len:], self.ts_keys[self.durable_len:]
        durable = dict(self.durable_data)

        def restore(txn: StoreTxn) -> None:
            for key in {e.key for e in lost if e.kind is EntryKind.WRITE}:
                _put(txn, key, durable.get(key))

        self._transaction(restore)
        self.journal.append(DiskEvent("lost", tuple(lost), tuple(hashes)))
        return lost

    def save_rollback_file(self, planned: list[Entry]) -> None:
        """The rollback file (fsynced before the rollback transaction): what the plan said is undone."""
        self.rollback_saved.extend(planned)
        self.journal.append(DiskEvent("saved", tuple(planned), ()))

    def roll_back(self, common: OpTime, refetched: dict[int, tuple[int, int] | None], min_valid: OpTime,
                  keep_refetched: frozenset[int] = frozenset()) -> int:
        """One transaction: replace the planned keys by the source's versions, truncate the oplog
        after `common` (whatever is there by now), store `minValid` and bump the rollback id."""
        index = self.index_of(common)
        if index is None:
            raise SimInvariantError(f"rollback to {common}, which is not in the oplog")
        if not self.all_durable:
            raise SimInvariantError("a rollback committed over entries not yet durable")
        undone = self.oplog[index + 1:]
        hashes = self.chain[index + 1:]
        del self.oplog[index + 1:], self.chain[index + 1:], self.ts_keys[index + 1:]
        self.durable_len = len(self.oplog)

        def restore(txn: StoreTxn) -> None:
            for key, doc in refetched.items():
                _put(txn, key, doc)

        self._transaction(restore)
        for key, doc in refetched.items():
            if doc is None:
                self.durable_data.pop(key, None)
            else:
                self.durable_data[key] = doc
        self.min_valid = min_valid
        self.refetched_keys = frozenset(refetched) | keep_refetched
        self.rbid += 1
        self.journal.append(DiskEvent("rolled_back", tuple(undone), tuple(hashes)))
        return len(undone)

    # -- reads --------------------------------------------------------------------------------------

    def index_of(self, optime: OpTime) -> int | None:
        i = bisect.bisect_left(self.ts_keys, optime.ts_key)
        if i < len(self.oplog) and self.oplog[i].optime == optime:
            return i
        return None

    def first_index_at_or_after(self, ts_key: int) -> int:
        return bisect.bisect_left(self.ts_keys, ts_key)

    def optimes_newest_first(self, at_or_before_ts_key: int, limit: int) -> list[OpTime]:
        end = bisect.bisect_right(self.ts_keys, at_or_before_ts_key)
        start = max(0, end - limit)
        return [e.optime for e in reversed(self.oplog[start:end])]

    def entries_after(self, optime: OpTime) -> list[Entry]:
        index = self.first_index_at_or_after(optime.ts_key + 1)
        return self.oplog[index:]

    def value_at(self, key: int, at: OpTime) -> tuple[int, int] | None:
        """`data[key]` as of the entry at `at` (a snapshot read): the newest write to `key` up to it."""
        end = bisect.bisect_right(self.ts_keys, at.ts_key)
        for e in reversed(self.oplog[:end]):
            if e.kind is EntryKind.WRITE and e.key == key:
                return (e.value, e.write_id)
        return None
