"""SQLite storage (WAL): documents, indexes, the oplog and member metadata in one file.

Theory of operation: one *writer* connection runs every write inside an explicit
transaction that the caller commits (group commit: many client writes share one
transaction and one fsync); one *reader* connection serves queries from the last
committed snapshot, so reads never see a half-applied write. Each collection is a
table `c<N>` (rowid = natural order, `idkey` = canonical `_id` bytes, `doc` = BSON);
each unique index is a table `u<N>` mapping canonical key bytes to the rowid. The
oplog is a table keyed by the 64-bit timestamp.

Durability is MongoDB's: `synchronous=NORMAL` makes a commit write the WAL without an
fsync (it survives a crash of the process, not of the machine); `sync_wal` is the
explicit durable barrier (an fsync of the WAL) that the journal flusher
(`replset.group_commit`) runs for `j: true` and `w: "majority"` writes and every
100 ms. Checkpoints never run inside a commit (`wal_autocheckpoint=0`): `checkpoint`
runs them on a connection and thread of their own.

Every statement here is on some path a client or a peer can drive; none may scan the
oplog or a collection when it is reached from a write, an oplog read or an apply
(`tests/integration/test_query_plans.py` checks the plans of the statements a real set
runs). SQLite answers a lone `min()` or `max()` of the key from the b-tree, but not both
in one statement, hence two statements in `oplog_bounds`.

This is a shell module: it does I/O. Everything that decides *what* to write
lives in the pure modules and calls the `StoreTxn` methods here.
"""

from __future__ import annotations

import itertools
import json
import os
import sqlite3
import threading
import uuid
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import bson
from bson.binary import Binary

from base.errors import MongoError
from oplog.codec_options import DOC_OPTIONS
from oplog.committed_tail import CommittedTail, Row
from oplog.durable_files import fsync_path
from oplog.index_keys import index_keys, key_document
from oplog.values import canonical_key

_SCHEMA = """
CREATE TABLE IF NOT EXISTS collections(
    id INTEGER PRIMARY KEY AUTOINCREMENT, ns TEXT UNIQUE NOT NULL, uuid BLOB, options BLOB);
CREATE TABLE IF NOT EXISTS indexes(
    id INTEGER PRIMARY KEY AUTOINCREMENT, ns TEXT NOT NULL, name TEXT NOT NULL, spec BLOB NOT NULL,
    UNIQUE(ns, name));
CREATE TABLE IF NOT EXISTS oplog(ts INTEGER PRIMARY KEY, entry BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS meta(key TEXT PRIMARY KEY, value BLOB NOT NULL);
"""


@dataclass(frozen=True, slots=True)
class CollectionInfo:
    ns: str
    table: str
    uuid: Binary
    options: dict[str, Any]

    @property
    def db(self) -> str:
        return self.ns.split(".", 1)[0]

    @property
    def name(self) -> str:
        return self.ns.split(".", 1)[1]


@dataclass(frozen=True, slots=True)
class IndexInfo:
    ns: str
    name: str
    spec: dict[str, Any]
    table: str

    @property
    def unique(self) -> bool:
        return bool(self.spec.get("unique"))


def _decode(blob: bytes) -> dict[str, Any]:
    return bson.decode(blob, DOC_OPTIONS)


class DeferredIndexes:
    """Secondary index builds put off while a `StoreTxn` is `deferring_index_builds`: by namespace,
    the specs by name, in creation order. Initial sync keeps one per attempt: its oplog replay
    passes through states that only hold together at the stop point, so no unique key may be
    checked before then (`StoreTxn.build_deferred_indexes` builds them there). In memory only:
    an interrupted initial sync starts over, dropping whatever it had copied."""

    def __init__(self) -> None:
        self._specs: dict[str, dict[str, dict[str, Any]]] = {}

    def __len__(self) -> int:
        return sum(len(specs) for specs in self._specs.values())

    def namespaces(self) -> list[str]:
        return list(self._specs)

    def specs(self, ns: str) -> list[dict[str, Any]]:
        return list(self._specs.get(ns, {}).values())

    def add(self, ns: str, spec: Mapping[str, Any]) -> bool:
        """Records an index build; False if one of that name is already recorded for `ns`."""
        specs = self._specs.setdefault(ns, {})
        if spec["name"] in specs:
            return False
        specs[spec["name"]] = dict(spec)
        return True

    def discard(self, ns: str, name: str) -> bool:
        """Cancels a recorded build (dropIndexes); False if none of that name is recorded."""
        specs = self._specs.get(ns)
        if specs is None or specs.pop(name, None) is None:
            return False
        if not specs:
            del self._specs[ns]
        return True

    def set_option(self, ns: str, name: str, option: str, value: Any) -> bool:
        """Changes an option of a recorded build (collMod); False if none of that name is recorded."""
        spec = self._specs.get(ns, {}).get(name)
        if spec is None:
            return False
        spec[option] = value
        return True

    def forget(self, ns: str) -> None:
        """Cancels every build recorded for `ns` (its collection was dropped)."""
        self._specs.pop(ns, None)

    def rename(self, source: str, target: str) -> None:
        specs = self._specs.pop(source, None)
        if specs is not None:
            self._specs[target] = specs


@dataclass(frozen=True, slots=True)
class _SavepointSQL:
    name: str
    open: str
    release: str
    rollback: str


_SAVEPOINT_SQL: dict[str, _SavepointSQL] = {}


def _savepoint_name(depth: int) -> _SavepointSQL:
    """The statements of the savepoint opened at `depth` (0: the outermost)."""
    name = f"sp{depth + 1}"
    sql = _SAVEPOINT_SQL.get(name)
    if sql is None:
        sql = _SAVEPOINT_SQL[name] = _SavepointSQL(name, f"SAVEPOINT {name}", f"RELEASE {name}",
                                                   f"ROLLBACK TO {name}")
    return sql


class _Reader:
    """Read helpers shared by the reader connection and the writer transaction."""

    _conn: sqlite3.Connection

    def collection(self, ns: str) -> CollectionInfo | None:
        row = self._conn.execute("SELECT id, uuid, options FROM collections WHERE ns=?", (ns,)).fetchone()
        if row is None:
            return None
        return CollectionInfo(ns, f"c{row[0]}", Binary(row[1], 4), _decode(row[2]))

    def collections(self, db: str | None = None) -> list[CollectionInfo]:
        if db is None:
            rows = self._conn.execute("SELECT id, ns, uuid, options FROM collections ORDER BY ns").fetchall()
        else:
            rows = self._conn.execute(
                "SELECT id, ns, uuid, options FROM collections WHERE ns >= ? AND ns < ? ORDER BY ns",
                (db + ".", db + "/"),
            ).fetchall()
        return [CollectionInfo(ns, f"c{i}", Binary(u, 4), _decode(o)) for i, ns, u, o in rows]

    def indexes(self, ns: str) -> list[IndexInfo]:
        rows = self._conn.execute("SELECT id, name, spec FROM indexes WHERE ns=? ORDER BY id", (ns,)).fetchall()
        return [IndexInfo(ns, name, _decode(spec), f"u{i}") for i, name, spec in rows]

    def get(self, ns: str, id_value: Any) -> dict[str, Any] | None:
        info = self.collection(ns)
        if info is None:
            return None
        row = self._conn.execute(
            f"SELECT doc FROM {info.table} WHERE idkey=?", (canonical_key(id_value),)
        ).fetchone()
        return None if row is None else _decode(row[0])

    def scan(self, ns: str) -> Iterator[dict[str, Any]]:
        info = self.collection(ns)
        if info is None:
            return iter(())
        rows = self._conn.execute(f"SELECT doc FROM {info.table} ORDER BY rid").fetchall()
        return (_decode(r[0]) for r in rows)

    SCAN_CHUNK = 1000

    def scan_chunk(self, ns: str, table: str, after_rid: int) -> list[tuple[int, bytes]]:
        """The next `SCAN_CHUNK` (rid, document) rows of a collection's table after `after_rid`."""
        try:
            return self._conn.execute(f"SELECT rid, doc FROM {table} WHERE rid > ? ORDER BY rid LIMIT ?",
                                      (after_rid, self.SCAN_CHUNK)).fetchall()
        except sqlite3.OperationalError:
            raise MongoError(175, f"collection {ns} was dropped during the query") from None

    def count(self, ns: str) -> int:
        info = self.collection(ns)
        if info is None:
            return 0
        return int(self._conn.execute(f"SELECT count(*) FROM {info.table}").fetchone()[0])

    def totals(self, ns: str) -> tuple[int, int]:
        """(documents, bytes of BSON) a collection holds."""
        info = self.collection(ns)
        if info is None:
            return 0, 0
        row = self._conn.execute(f"SELECT count(*), coalesce(sum(length(doc)), 0) FROM {info.table}").fetchone()
        return int(row[0]), int(row[1])

    def oldest_rows(self, ns: str, limit: int) -> list[tuple[int, bytes]]:
        """The first `limit` (rid, document) rows of a collection in natural (insertion) order."""
        info = self.collection(ns)
        if info is None:
            return []
        return self._conn.execute(f"SELECT rid, doc FROM {info.table} ORDER BY rid LIMIT ?", (limit,)).fetchall()

    def holds_row(self, ns: str, rid: int) -> bool:
        """Whether the row `rid` of a collection is still there (a tailing cursor's position)."""
        info = self.collection(ns)
        return info is not None and self._conn.execute(
            f"SELECT 1 FROM {info.table} WHERE rid=?", (rid,)).fetchone() is not None

    def stored_rows(self, ns: str) -> Iterator[tuple[bytes, bytes]]:
        """(stored `_id` key, document) of every row of a collection, for `validate`."""
        info = self.collection(ns)
        if info is None:
            return iter(())
        return iter(self._conn.execute(f"SELECT idkey, doc FROM {info.table} ORDER BY rid").fetchall())

    def unique_key_count(self, index: IndexInfo) -> int:
        """How many keys a unique index's table holds."""
        return int(self._conn.execute(f"SELECT count(*) FROM {index.table}").fetchone()[0])

    def data_size(self, ns: str) -> int:
        info = self.collection(ns)
        if info is None:
            return 0
        row = self._conn.execute(f"SELECT coalesce(sum(length(doc)), 0) FROM {info.table}").fetchone()
        return int(row[0])

    def meta(self, key: str) -> dict[str, Any] | None:
        row = self._conn.execute("SELECT value FROM meta WHERE key=?", (key,)).fetchone()
        return None if row is None else _decode(row[0])

    def oplog_after(self, after_key: int, limit: int) -> list[tuple[int, bytes]]:
        return self._conn.execute(
            "SELECT ts, entry FROM oplog WHERE ts > ? ORDER BY ts LIMIT ?", (after_key, limit)
        ).fetchall()

    def oplog_before(self, before_key: int, limit: int) -> list[tuple[int, bytes]]:
        return self._conn.execute(
            "SELECT ts, entry FROM oplog WHERE ts < ? ORDER BY ts DESC LIMIT ?", (before_key, limit)
        ).fetchall()

    def oplog_oldest_key(self) -> int | None:
        row = self._conn.execute("SELECT min(ts) FROM oplog").fetchone()
        return None if row[0] is None else int(row[0])

    def oplog_newest_key(self) -> int | None:
        row = self._conn.execute("SELECT max(ts) FROM oplog").fetchone()
        return None if row[0] is None else int(row[0])

    def oplog_bounds(self) -> tuple[int, int] | None:
        """The oldest and newest keys: two statements, each answered from the b-tree in O(log n)."""
        oldest = self.oplog_oldest_key()
        newest = self.oplog_newest_key()
        return None if oldest is None or newest is None else (oldest, newest)

    def count_oplog(self) -> tuple[int, int]:
        """(entries, bytes) of the whole oplog: a full scan, for start-up only (the runtime keeps
        both up to date in memory from then on)."""
        row = self._conn.execute("SELECT count(*), coalesce(sum(length(entry)), 0) FROM oplog").fetchone()
        return int(row[0]), int(row[1])

    def oplog_entry(self, key: int) -> bytes | None:
        row = self._conn.execute("SELECT entry FROM oplog WHERE ts=?", (key,)).fetchone()
        return None if row is None else bytes(row[0])


@dataclass(slots=True)
class CatalogCache:
    """Collection and index metadata as the writer last read it. Only the writer changes the catalog,
    so the cache outlives transactions: any DDL, and any rollback, clears it."""

    collections: dict[str, CollectionInfo | None] = field(default_factory=dict)
    indexes: dict[str, list[IndexInfo]] = field(default_factory=dict)

    def clear(self) -> None:
        self.collections.clear()
        self.indexes.clear()


class StoreTxn(_Reader):
    """Write operations inside the writer's open transaction.

    Catalog lookups (collection and index metadata) come from the store's `CatalogCache`:
    every write asks for the same few namespaces. Any DDL, and any rollback to a savepoint,
    clears it.
    """

    def __init__(self, conn: sqlite3.Connection, oplog_totals: tuple[int, int] = (0, 0),
                 trimmed_through: int = 0, catalog: CatalogCache | None = None,
                 tail: CommittedTail | None = None) -> None:
        self._conn = conn
        # The open savepoints, outermost first: (name, oplog totals and appended rows when it was taken).
        self._savepoints: list[tuple[str, tuple[int, int], int]] = []
        # The oplog rows this transaction appended (handed to the committed tail when it commits).
        self._tail = tail if tail is not None else CommittedTail(None)
        self.appended: list[Row] = []
        # Namespaces whose documents this transaction wrote (a savepoint rolled back may leave some
        # here: "may have changed"). The store keeps the last commit's (`SQLiteStore.last_changed`).
        self.changed: set[str] = set()
        # (entries, bytes) of the oplog as this transaction leaves it: kept incrementally, so no
        # statement ever has to count or sum the oplog.
        self.oplog_totals = oplog_totals
        self.oplog_trimmed_through = trimmed_through  # the newest key a trim deleted
        catalog = catalog if catalog is not None else CatalogCache()
        self._collections = catalog.collections
        self._indexes = catalog.indexes
        self._deferred: DeferredIndexes | None = None  # set only inside `deferring_index_builds`

    def _catalog_changed(self) -> None:
        self._collections.clear()
        self._indexes.clear()

    def collection(self, ns: str) -> CollectionInfo | None:
        if ns not in self._collections:
            self._collections[ns] = super().collection(ns)
        return self._collections[ns]

    def indexes(self, ns: str) -> list[IndexInfo]:
        cached = self._indexes.get(ns)
        if cached is None:
            cached = self._indexes[ns] = super().indexes(ns)
        return cached

    # -- savepoints: one client statement or command is all-or-nothing ---------
    def savepoint(self) -> str:
        """Opens a savepoint, named by its depth: the few statements that makes stay in the connection's
        statement cache (a new name for each would be parsed again every time)."""
        name = _savepoint_name(len(self._savepoints))
        self._conn.execute(name.open)
        self._savepoints.append((name.name, self.oplog_totals, len(self.appended)))
        return name.name

    def _close(self, name: str) -> tuple[str, tuple[int, int], int]:
        """Forgets `name` and the savepoints opened inside it (SQLite ends those with it)."""
        for depth in range(len(self._savepoints) - 1, -1, -1):
            if self._savepoints[depth][0] == name:
                taken = self._savepoints[depth]
                del self._savepoints[depth:]
                return taken
        raise RuntimeError(f"no open savepoint {name}")

    def release(self, name: str) -> None:
        self._conn.execute(_SAVEPOINT_SQL[name].release)
        self._close(name)

    def rollback_to(self, name: str) -> None:
        sql = _SAVEPOINT_SQL[name]
        self._conn.execute(sql.rollback)
        self._conn.execute(sql.release)
        _name, self.oplog_totals, appended = self._close(name)
        del self.appended[appended:]
        self._catalog_changed()

    def _oplog_changed(self, entries: int, size: int) -> None:
        count, total = self.oplog_totals
        self.oplog_totals = (max(count + entries, 0), max(total + size, 0))

    # -- collections and indexes ----------------------------------------------
    def create_collection(self, ns: str, options: Mapping[str, Any] | None = None,
                          coll_uuid: Binary | None = None) -> CollectionInfo:
        existing = self.collection(ns)
        if existing is not None:
            return existing
        self._catalog_changed()
        ui = coll_uuid if coll_uuid is not None else Binary(uuid.uuid4().bytes, 4)
        cur = self._conn.execute(
            "INSERT INTO collections(ns, uuid, options) VALUES (?, ?, ?)",
            (ns, bytes(ui), bson.encode(dict(options or {}))),
        )
        table = f"c{cur.lastrowid}"
        # A capped collection's row ids are never reused (a tailing cursor's position names one).
        rid = "rid INTEGER PRIMARY KEY AUTOINCREMENT" if (options or {}).get("capped") else "rid INTEGER PRIMARY KEY"
        self._conn.execute(f"CREATE TABLE {table}({rid}, idkey BLOB UNIQUE NOT NULL, doc BLOB NOT NULL)")
        self._conn.execute(
            "INSERT OR IGNORE INTO indexes(ns, name, spec) VALUES (?, '_id_', ?)",
            (ns, bson.encode({"v": 2, "key": {"_id": 1}, "name": "_id_"})),
        )
        return CollectionInfo(ns, table, ui, dict(options or {}))

    def set_collection_options(self, ns: str, changes: Mapping[str, Any]) -> bool:
        """Sets (or, for a None value, removes) options of a collection (collMod); False if none."""
        info = self.collection(ns)
        if info is None:
            return False
        options = dict(info.options)
        for key, value in changes.items():
            if value is None:
                options.pop(key, None)
            else:
                options[key] = value
        self._catalog_changed()
        self._conn.execute("UPDATE collections SET options=? WHERE ns=?", (bson.encode(options), ns))
        return True

    def drop_collection(self, ns: str) -> int | None:
        """Drops a collection; returns the number of indexes it had, or None if absent."""
        self.changed.add(ns)
        if self._deferred is not None:
            self._deferred.forget(ns)
        self._catalog_changed()
        info = self.collection(ns)
        if info is None:
            return None
        indexes = self.indexes(ns)
        for index in indexes:
            self._conn.execute(f"DROP TABLE IF EXISTS {index.table}")
        self._conn.execute(f"DROP TABLE {info.table}")
        self._conn.execute("DELETE FROM indexes WHERE ns=?", (ns,))
        self._conn.execute("DELETE FROM collections WHERE ns=?", (ns,))
        self._catalog_changed()  # the lookups above cached the dropped collection
        return len(indexes)

    def rename_collection(self, source: str, target: str) -> None:
        self.changed.update((source, target))
        self._catalog_changed()
        self._conn.execute("UPDATE collections SET ns=? WHERE ns=?", (target, source))
        self._conn.execute("UPDATE indexes SET ns=? WHERE ns=?", (target, source))
        if self._deferred is not None:
            self._deferred.rename(source, target)

    def create_index(self, ns: str, spec: Mapping[str, Any]) -> bool:
        """Adds an index (building unique keys from existing documents); False if it exists.
        While `deferring_index_builds`, a new index is only recorded there (no key is checked)."""
        self._catalog_changed()
        name = spec["name"]
        if self._conn.execute("SELECT 1 FROM indexes WHERE ns=? AND name=?", (ns, name)).fetchone():
            return False
        if self._deferred is not None:
            return self._deferred.add(ns, spec)
        cur = self._conn.execute(
            "INSERT INTO indexes(ns, name, spec) VALUES (?, ?, ?)", (ns, name, bson.encode(dict(spec)))
        )
        index = IndexInfo(ns, name, dict(spec), f"u{cur.lastrowid}")
        if index.unique:
            self._conn.execute(f"CREATE TABLE {index.table}(key BLOB PRIMARY KEY, rid INTEGER NOT NULL)")
            info = self.collection(ns)
            assert info is not None
            for rid, blob in self._conn.execute(f"SELECT rid, doc FROM {info.table}").fetchall():
                self._add_keys(index, _decode(blob), rid)
        return True

    def set_index_option(self, ns: str, name: str, option: str, value: Any) -> bool:
        """Sets one option of an index's spec (collMod's `expireAfterSeconds`); False if no such index."""
        self._catalog_changed()
        if self._deferred is not None and self._deferred.set_option(ns, name, option, value):
            return True
        row = self._conn.execute("SELECT id, spec FROM indexes WHERE ns=? AND name=?", (ns, name)).fetchone()
        if row is None:
            return False
        spec = _decode(row[1])
        spec[option] = value
        self._conn.execute("UPDATE indexes SET spec=? WHERE id=?", (bson.encode(spec), row[0]))
        return True

    def drop_index(self, ns: str, name: str) -> bool:
        if self._deferred is not None and self._deferred.discard(ns, name):
            return True
        self._catalog_changed()
        index = next((i for i in self.indexes(ns) if i.name == name), None)
        if index is None:
            return False
        self._conn.execute(f"DROP TABLE IF EXISTS {index.table}")
        self._conn.execute("DELETE FROM indexes WHERE ns=? AND name=?", (ns, name))
        self._catalog_changed()  # the lookup above cached the dropped index
        return True

    @contextmanager
    def deferring_index_builds(self, deferred: DeferredIndexes) -> Iterator[None]:
        """Within this block `create_index` of a new (secondary) index only records its spec in
        `deferred`, `drop_index` and `drop_collection` cancel recorded builds, and
        `rename_collection` moves them along. Scoped, never left on: a group-commit transaction
        is shared with other writers."""
        previous, self._deferred = self._deferred, deferred
        try:
            yield
        finally:
            self._deferred = previous

    def build_deferred_indexes(self, deferred: DeferredIndexes, ns: str | None = None) -> int:
        """Builds the indexes recorded in `deferred` (those of `ns`, or all), unique keys from the
        documents now there (DuplicateKey, MongoError 11000, when they do not hold), and removes
        them from it; indexes of collections since gone are dropped. Returns how many were built."""
        if self._deferred is not None:
            raise RuntimeError("build_deferred_indexes inside deferring_index_builds")
        built = 0
        for name in [ns] if ns is not None else deferred.namespaces():
            specs = deferred.specs(name)
            if self.collection(name) is not None:
                built += sum(1 for spec in specs if self.create_index(name, spec))
            deferred.forget(name)
        return built

    # -- documents --------------------------------------------------------------
    def _unique_indexes(self, ns: str) -> list[IndexInfo]:
        return [i for i in self.indexes(ns) if i.unique and i.name != "_id_"]

    def _add_keys(self, index: IndexInfo, doc: dict[str, Any], rid: int) -> None:
        if not _in_partial_index(index, doc):
            return
        for key in index_keys(doc, index.spec["key"], sparse=bool(index.spec.get("sparse"))):
            try:
                self._conn.execute(f"INSERT INTO {index.table}(key, rid) VALUES (?, ?)", (key, rid))
            except sqlite3.IntegrityError:
                raise duplicate_key(index.ns, index.name, key_document(doc, index.spec["key"])) from None

    def _remove_keys(self, index: IndexInfo, doc: dict[str, Any], rid: int) -> None:
        keys = index_keys(doc, index.spec["key"], sparse=bool(index.spec.get("sparse")))
        self._conn.executemany(f"DELETE FROM {index.table} WHERE key=? AND rid=?", [(k, rid) for k in keys])

    def insert(self, ns: str, doc: dict[str, Any], *, upsert: bool = False) -> None:
        """Inserts a document; with `upsert` an existing `_id` is replaced (oplog replay)."""
        self.changed.add(ns)
        info = self.collection(ns) or self.create_collection(ns)
        idkey = canonical_key(doc["_id"])
        if upsert and self._conn.execute(f"SELECT 1 FROM {info.table} WHERE idkey=?", (idkey,)).fetchone():
            self.replace(ns, doc)
            return
        try:
            cur = self._conn.execute(
                f"INSERT INTO {info.table}(idkey, doc) VALUES (?, ?)", (idkey, bson.encode(doc))
            )
        except sqlite3.IntegrityError:
            raise duplicate_key(ns, "_id_", {"_id": doc["_id"]}) from None
        rid = cur.lastrowid
        assert rid is not None
        for index in self._unique_indexes(ns):
            self._add_keys(index, doc, rid)

    def replace(self, ns: str, doc: dict[str, Any]) -> bool:
        """Replaces the document with the same `_id`; False if there is none."""
        self.changed.add(ns)
        info = self.collection(ns)
        if info is None:
            return False
        idkey = canonical_key(doc["_id"])
        row = self._conn.execute(f"SELECT rid, doc FROM {info.table} WHERE idkey=?", (idkey,)).fetchone()
        if row is None:
            return False
        rid, old_blob = row
        unique = self._unique_indexes(ns)
        if unique:
            old = _decode(old_blob)
            for index in unique:
                self._remove_keys(index, old, rid)
                self._add_keys(index, doc, rid)
        self._conn.execute(f"UPDATE {info.table} SET doc=? WHERE rid=?", (bson.encode(doc), rid))
        return True

    def delete(self, ns: str, id_value: Any) -> bool:
        self.changed.add(ns)
        info = self.collection(ns)
        if info is None:
            return False
        idkey = canonical_key(id_value)
        row = self._conn.execute(f"SELECT rid, doc FROM {info.table} WHERE idkey=?", (idkey,)).fetchone()
        if row is None:
            return False
        rid, blob = row
        unique = self._unique_indexes(ns)
        if unique:
            old = _decode(blob)
            for index in unique:
                self._remove_keys(index, old, rid)
        self._conn.execute(f"DELETE FROM {info.table} WHERE rid=?", (rid,))
        return True

    # -- oplog and metadata ------------------------------------------------------
    def append_oplog(self, rows: list[tuple[int, bytes]]) -> None:
        """Appends entries (an entry with a key already there replaces it, and is counted twice
        until the next start: only initial sync's overlapping replay does that)."""
        self._conn.executemany("INSERT OR REPLACE INTO oplog(ts, entry) VALUES (?, ?)", rows)
        self._oplog_changed(len(rows), sum(len(blob) for _key, blob in rows))
        if not rows or not self._tail.usable:
            return
        last = self.appended[-1][0] if self.appended else self._tail.last_key
        if last is None or rows[0][0] <= last or any(a[0] >= b[0] for a, b in itertools.pairwise(rows)):
            self._tail.cut()  # a replayed entry replaced one: not an append at the end
            return
        self.appended.extend(rows)

    def truncate_oplog_after(self, key: int) -> int:
        self._tail.cut()
        count, size = self._conn.execute(
            "SELECT count(*), coalesce(sum(length(entry)), 0) FROM oplog WHERE ts > ?", (key,)).fetchone()
        self._oplog_changed(-int(count), -int(size))
        return self._conn.execute("DELETE FROM oplog WHERE ts > ?", (key,)).rowcount

    def trim_oplog(self, excess_bytes: int, keep_after: int) -> tuple[int, int]:
        """Deletes the oldest entries totalling at least `excess_bytes` (never past
        `keep_after`); returns (entries, bytes) removed."""
        removed, count, last_key = 0, 0, None
        cur = self._conn.execute("SELECT ts, length(entry) FROM oplog WHERE ts < ? ORDER BY ts", (keep_after,))
        for key, size in cur:
            removed += size
            count += 1
            last_key = key
            if removed >= excess_bytes:
                break
        cur.close()
        if last_key is not None:
            self._conn.execute("DELETE FROM oplog WHERE ts <= ?", (last_key,))
            self.oplog_trimmed_through = max(self.oplog_trimmed_through, last_key)
        self._oplog_changed(-count, -removed)
        return count, removed

    def set_meta(self, key: str, value: Mapping[str, Any]) -> None:
        self._conn.execute(
            "INSERT OR REPLACE INTO meta(key, value) VALUES (?, ?)", (key, bson.encode(dict(value)))
        )

    def delete_meta(self, key: str) -> None:
        self._conn.execute("DELETE FROM meta WHERE key=?", (key,))

    # -- initial sync -------------------------------------------------------------
    def drop_replicated_data(self) -> int:
        """Drops every collection outside `local` and empties the oplog; keeps `meta` and `local`
        (the config, the term and the vote survive). Returns the number of collections dropped."""
        dropped = 0
        for info in self.collections():
            if info.db != "local":
                self.drop_collection(info.ns)
                dropped += 1
        self._tail.cut()
        self._conn.execute("DELETE FROM oplog")
        self.oplog_totals = (0, 0)
        self.oplog_trimmed_through = 0  # a new history: the fetcher's own first-entry check guards it
        return dropped

    def bulk_insert(self, ns: str, rows: list[tuple[bytes, bytes]]) -> None:
        """Appends `(canonical _id key, BSON)` rows to a collection in one statement (initial
        sync's clone). Unique secondary indexes are not maintained: create them afterwards."""
        info = self.collection(ns) or self.create_collection(ns)
        try:
            self._conn.executemany(f"INSERT INTO {info.table}(idkey, doc) VALUES (?, ?)", rows)
        except sqlite3.IntegrityError:
            raise MongoError(11000, f"E11000 duplicate key error collection: {ns} index: _id_") from None


def _in_partial_index(index: IndexInfo, doc: dict[str, Any]) -> bool:
    partial = index.spec.get("partialFilterExpression")
    if not partial:
        return True
    from oplog.query import matches

    return matches(doc, partial)


def duplicate_key(ns: str, index_name: str, key_value: dict[str, Any]) -> MongoError:
    shown = ", ".join(f"{k}: {_show(v)}" for k, v in key_value.items())
    return MongoError(
        11000,
        f"E11000 duplicate key error collection: {ns} index: {index_name} dup key: {{ {shown} }}",
        extra={"keyPattern": {k: 1 for k in key_value}, "keyValue": key_value},
    )


def _show(value: Any) -> str:
    return f'"{value}"' if isinstance(value, str) else repr(value)


class SQLiteStore:
    """Owns the database file: a writer transaction at a time, plus a reader."""

    FILE_NAME = "replset.sqlite3"

    _memory_ids = 0

    def __init__(self, dbpath: str | None, *, trace_path: str | None = None) -> None:
        """Opens `<dbpath>/replset.sqlite3`; `dbpath=None` gives a private in-memory store. With
        `trace_path`, every statement run (values bound) is appended there, one JSON string a line."""
        self._trace = open(trace_path, "a", buffering=1, encoding="utf-8") if trace_path else None
        if dbpath is None:
            SQLiteStore._memory_ids += 1
            self.path = f"file:replset-mem-{id(self)}-{SQLiteStore._memory_ids}?mode=memory&cache=shared"
        else:
            os.makedirs(dbpath, exist_ok=True)
            self.path = os.path.join(dbpath, self.FILE_NAME)
        self._writer = self._connect()
        self._writer.execute("PRAGMA wal_autocheckpoint=0")  # checkpoints run in `checkpoint`, not in commits
        self._writer.executescript(_SCHEMA)
        self.reader = _ReadConnection(self._connect())
        # Readers of worker threads (query execution off the event loop), one connection each.
        self._thread_local = threading.local()
        self._thread_readers: list[_ReadConnection] = []
        self._thread_readers_lock = threading.Lock()
        self._checkpoint_conn: sqlite3.Connection | None = None
        self._idle_snapshot_conns: list[sqlite3.Connection] | None = []  # None once the store is closed
        self.last_changed: set[str] = set()  # namespaces the last commit wrote (StoreTxn.changed)
        # The oplog rows the last commit appended, oldest first; None when not known (it cut the oplog
        # back, replaced an entry, or rolled back): then read the oplog.
        self.last_commit_rows: list[Row] | None = None
        self._wal_fd: int | None = None
        self._txn: StoreTxn | None = None
        self._catalog = CatalogCache()
        # (entries, bytes) of the oplog as committed: one scan at start, then kept by each transaction.
        self.oplog_totals = self.reader.count_oplog()
        oldest = self.reader.oplog_oldest_key()
        self.reader.oplog_trimmed_through = 0 if oldest is None else oldest - 1

    @property
    def in_memory(self) -> bool:
        return self.path.startswith("file:")

    def _connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False, uri=self.in_memory)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")
        conn.execute("PRAGMA cache_size=-65536")
        conn.execute("PRAGMA busy_timeout=10000")
        if self._trace is not None:
            trace = self._trace
            conn.set_trace_callback(lambda statement: trace.write(json.dumps(statement) + "\n"))
        return conn

    def thread_reader(self) -> _ReadConnection:
        """The calling thread's own reader (opened on first use): worker threads read concurrently with
        the event loop's `reader` and with each other, each through a connection of its own."""
        reader = getattr(self._thread_local, "reader", None)
        if reader is None:
            reader = _ReadConnection(self._connect())
            self._thread_local.reader = reader
            with self._thread_readers_lock:
                self._thread_readers.append(reader)
        return reader

    @property
    def any_thread_reader(self) -> AnyThreadReader:
        """A reader for work that may move between worker threads (a cursor's batches)."""
        return AnyThreadReader(self)

    def scan_from_any_thread(self, ns: str) -> Iterator[dict[str, Any]]:
        """`_ReadConnection.scan` for a cursor whose batches may each run on another worker thread:
        every chunk is read through the reader of the thread that asks for it."""
        return (_decode(blob) for blob in self.scan_bson_from_any_thread(ns))

    def scan_bson_from_any_thread(self, ns: str) -> Iterator[bytes]:
        """`scan_from_any_thread`, each document as stored (BSON bytes)."""
        return _scan_bson(self.thread_reader, ns)

    def sync_wal(self) -> None:
        """The durable barrier: fsyncs the WAL, so every transaction committed before the call survives
        a power cut. Blocking (run it in a worker thread). The WAL file keeps its inode while the store
        is open (checkpoints restart it in place), so one descriptor serves for the store's life."""
        if self.in_memory:
            return
        if self._wal_fd is None:
            try:
                self._wal_fd = os.open(self.path + "-wal", os.O_RDONLY)
            except FileNotFoundError:
                return  # nothing was ever written through the WAL
        os.fsync(self._wal_fd)

    def checkpoint(self) -> tuple[int, int]:
        """Copies committed WAL frames into the database file without blocking the writer (a passive
        checkpoint, with its own connection; it fsyncs the WAL first and the database file after).
        Blocking (run it in a worker thread). Returns (frames in the WAL, frames checkpointed)."""
        if self.in_memory:
            return 0, 0
        if self._checkpoint_conn is None:
            self._checkpoint_conn = self._connect()
        _busy, frames, done = self._checkpoint_conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
        return int(frames), int(done)

    def finish_checkpoint(self) -> tuple[int, int]:
        """After `checkpoint`: copies the few frames committed while it ran, on the writer's connection,
        between transactions (call it from the writer's thread with no transaction open). Under a
        steady stream of writes a checkpoint in another thread never catches up with the writer, and
        SQLite only restarts the WAL from its beginning once every frame is checkpointed: without
        this step the WAL grows without bound (and appending costs more than overwriting in place,
        for the fsync above all). Returns (frames in the WAL, frames checkpointed)."""
        if self.in_memory or self._txn is not None:
            return 0, 0
        _busy, frames, done = self._writer.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
        return int(frames), int(done)

    def snapshot(self) -> SnapshotReader:
        """A reader that sees the data as committed now, for as long as it stays open: a read
        transaction on a connection of its own (a multi-document transaction's snapshot, a snapshot
        read's point in time, a majority read's committed snapshot). Close it soon: a checkpoint
        cannot move the WAL's start past an open snapshot. Closed snapshots leave their connection
        for the next (`IDLE_SNAPSHOT_CONNECTIONS`), so taking one costs two statements, not a
        connection."""
        with self._thread_readers_lock:
            conn = self._idle_snapshot_conns.pop() if self._idle_snapshot_conns else None
        if conn is None:
            conn = self._connect()
            conn.execute("PRAGMA query_only=1")
        conn.execute("BEGIN")
        conn.execute("SELECT count(*) FROM meta").fetchone()  # the snapshot is taken at the first read
        return SnapshotReader(conn, self._snapshot_closed)

    IDLE_SNAPSHOT_CONNECTIONS = 8

    def _snapshot_closed(self, conn: sqlite3.Connection) -> None:
        with self._thread_readers_lock:
            if self._idle_snapshot_conns is not None and \
                    len(self._idle_snapshot_conns) < self.IDLE_SNAPSHOT_CONNECTIONS:
                self._idle_snapshot_conns.append(conn)
                return
        conn.close()

    def begin(self) -> StoreTxn:
        if self._txn is not None:
            raise RuntimeError("a write transaction is already open")
        self._writer.execute("BEGIN IMMEDIATE")
        self._txn = StoreTxn(self._writer, self.oplog_totals, self.reader.oplog_trimmed_through, self._catalog,
                             self.reader.tail)
        return self._txn

    def commit(self) -> None:
        """Commits the open transaction (written to the WAL, not fsynced: see `sync_wal`). Nothing that can
        fail runs after the COMMIT: a failure there would report a committed transaction as rolled back."""
        tail, txn = self.reader.tail, self._txn
        # The tail starts again after a cut from the newest key this transaction leaves (read inside it, on
        # the writer's connection, which the committing thread owns: a commit may run off the loop).
        newest = self._newest_oplog_key() if txn is not None and not tail.usable else None
        self._writer.execute("COMMIT")
        if txn is not None:
            self.last_changed = txn.changed
            self.oplog_totals = txn.oplog_totals
            self.reader.oplog_trimmed_through = txn.oplog_trimmed_through
            # Exact only while the tail followed every append of the transaction (it stops at a cut).
            self.last_commit_rows = txn.appended if tail.usable else None
            tail.committed(txn.appended, newest)
        self._txn = None

    def _newest_oplog_key(self) -> int | None:
        row = self._writer.execute("SELECT max(ts) FROM oplog").fetchone()
        return None if row[0] is None else int(row[0])

    def rollback(self) -> None:
        self.last_commit_rows = None
        if self._writer.in_transaction:
            self._writer.execute("ROLLBACK")
        self._catalog.clear()  # the transaction may have changed the catalog
        self._txn = None

    def backup_to(self, directory: str) -> str | None:
        """Copies a consistent snapshot of the database file into `directory` (SQLite's online
        backup, through a connection of its own, so it may run in a worker thread while the
        member goes on). Returns the copy's path, or None for an in-memory store."""
        if self.in_memory:
            return None
        os.makedirs(directory, exist_ok=True)
        target = os.path.join(directory, self.FILE_NAME)
        source = sqlite3.connect(self.path)
        copy = sqlite3.connect(target)
        try:
            source.backup(copy)
        finally:
            copy.close()
            source.close()
        fsync_path(target)
        return target

    def close(self) -> None:
        self.rollback()
        self.reader.close()
        with self._thread_readers_lock:
            for reader in self._thread_readers:
                reader.close()
            self._thread_readers.clear()
            for conn in self._idle_snapshot_conns or ():
                conn.close()
            self._idle_snapshot_conns = None
        if self._checkpoint_conn is not None:
            self._checkpoint_conn.close()
        self._writer.close()  # the last connection: SQLite checkpoints (with fsyncs) and removes the WAL
        if self._wal_fd is not None:
            os.close(self._wal_fd)
            self._wal_fd = None
        if self._trace is not None:
            self._trace.close()


class _ReadConnection(_Reader):

    def __init__(self, conn: sqlite3.Connection) -> None:
        conn.execute("PRAGMA query_only=1")
        self._conn = conn
        # The newest oplog key trimmed away (as committed): a tailing cursor whose last key is at or
        # below it lost its position. Kept in memory, so checking costs no statement per getMore.
        self.oplog_trimmed_through = 0
        # The store's own reader: the newest committed entries, as the commits left them (the readers of
        # worker threads keep none and read SQLite).
        self.tail = CommittedTail(None)

    def oplog_after(self, after_key: int, limit: int) -> list[tuple[int, bytes]]:
        """As `_Reader.oplog_after`; from the committed tail when it holds the rows."""
        if after_key >= self.oplog_trimmed_through:
            rows = self.tail.after(after_key, limit)
            if rows is not None:
                return rows
        return super().oplog_after(after_key, limit)

    def scan(self, ns: str) -> Iterator[dict[str, Any]]:
        """Documents in natural order, read in chunks so a cursor over a big collection holds one
        chunk in memory, not the collection (each chunk sees the latest commit, like a yielding scan)."""
        return scan_chunked(lambda: self, ns)

    def close(self) -> None:
        self._conn.close()


class SnapshotReader(_Reader):
    """See `SQLiteStore.snapshot`. Safe to share between threads: one statement runs at a time, and
    each statement's rows are read whole before the next may run (`_LockedConnection`)."""

    def __init__(self, conn: sqlite3.Connection, on_close: Callable[[sqlite3.Connection], None]) -> None:
        self._locked = _LockedConnection(conn)
        self._conn = self._locked  # type: ignore[assignment]
        self._on_close = on_close

    def scan(self, ns: str) -> Iterator[dict[str, Any]]:
        """Documents in natural order, read whole at the first one asked for (so on the thread that
        iterates, and independent of the snapshot from then on)."""
        def documents() -> Iterator[dict[str, Any]]:
            yield from _Reader.scan(self, ns)

        return documents()

    def newest_entry(self) -> dict[str, Any] | None:
        """The newest oplog entry this snapshot holds (what its data reflects), if any."""
        row = self._conn.execute("SELECT entry FROM oplog ORDER BY ts DESC LIMIT 1").fetchone()
        return None if row is None else _decode(row[0])

    def close(self) -> None:
        conn = self._locked.detach()
        if conn is None:
            return
        try:
            conn.execute("ROLLBACK")
        except sqlite3.Error:
            conn.close()
            return
        self._on_close(conn)


class _LockedConnection:
    """A connection shared by threads: `execute` runs under a lock and returns the rows read whole."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self._conn: sqlite3.Connection | None = conn
        self._lock = threading.Lock()

    def execute(self, sql: str, params: Any = ()) -> _Rows:
        with self._lock:
            if self._conn is None:
                raise MongoError(239, "the snapshot this read used was let go (read it again)")
            return _Rows(self._conn.execute(sql, params).fetchall())

    def detach(self) -> sqlite3.Connection | None:
        """The connection, taken away (None if it was already): statements on it fail from now on."""
        with self._lock:
            conn, self._conn = self._conn, None
            return conn


class _Rows(list[Any]):
    def fetchone(self) -> Any:
        return self[0] if self else None

    def fetchall(self) -> list[Any]:
        return list(self)


def scan_chunked(reader: Callable[[], _ReadConnection | SnapshotReader], ns: str) -> Iterator[dict[str, Any]]:
    """A collection's documents in natural order, `SCAN_CHUNK` rows per statement, each chunk read
    through `reader()` (which may be another connection or snapshot each time)."""
    return (_decode(blob) for blob in _scan_bson(reader, ns))


def _scan_bson(reader: Callable[[], _ReadConnection | SnapshotReader], ns: str) -> Iterator[bytes]:
    """A collection's stored documents in natural order, `SCAN_CHUNK` rows per statement, each chunk
    read through `reader()` (the same connection, or the reader of whichever thread asks)."""
    return (blob for _rid, blob in scan_rows(reader, ns))


def scan_rows(reader: Callable[[], Any], ns: str, after_rid: int = 0) -> Iterator[tuple[int, bytes]]:
    """(row id, stored document) of a collection in natural order after row `after_rid`, a chunk at a
    time, each chunk read through `reader()`."""
    info = reader().collection(ns)
    if info is None:
        return
    rid = after_rid
    while rows := reader().scan_chunk(ns, info.table, rid):
        yield from rows
        rid = rows[-1][0]


class AnyThreadReader:
    """Reads through the calling thread's own reader, looked up at each call: a cursor whose batches
    run on different worker threads reads each chunk through the connection of the thread it is on.
    The oplog's trim watermark is the event loop reader's (commits keep it there)."""

    def __init__(self, store: SQLiteStore) -> None:
        self._store = store

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store.thread_reader(), name)

    @property
    def oplog_trimmed_through(self) -> int:
        return self._store.reader.oplog_trimmed_through

    def scan(self, ns: str) -> Iterator[dict[str, Any]]:
        return self._store.scan_from_any_thread(ns)
