"""Savepoints of a write transaction: named by depth, nested, released and rolled back in any order a
statement inside a command inside a group commit uses them."""

from __future__ import annotations

from oplog.sqlite_store import SQLiteStore


def _ids(store: SQLiteStore, ns: str) -> list[int]:
    return sorted(d["_id"] for d in store._txn.scan(ns))  # type: ignore[union-attr]


def test_nested_savepoints_undo_exactly_what_was_written_inside_them() -> None:
    store = SQLiteStore(None)
    try:
        txn = store.begin()
        outer = txn.savepoint()
        txn.insert("db.c", {"_id": 1})
        inner = txn.savepoint()
        assert inner != outer   # a depth each
        txn.insert("db.c", {"_id": 2})
        txn.append_oplog([(10, b"x")])
        txn.rollback_to(inner)
        assert _ids(store, "db.c") == [1] and txn.appended == []
        again = txn.savepoint()   # the same depth again: the same name, a new savepoint
        assert again == inner
        txn.insert("db.c", {"_id": 3})
        txn.release(again)
        txn.rollback_to(outer)
        assert _ids(store, "db.c") == []

        first = txn.savepoint()
        txn.insert("db.c", {"_id": 4})
        txn.savepoint()   # left open: releasing the outer one ends it too
        txn.insert("db.c", {"_id": 5})
        txn.release(first)
        after = txn.savepoint()
        assert after == first   # nothing was left open inside
        txn.insert("db.c", {"_id": 6})
        txn.rollback_to(after)
        store.commit()
        assert sorted(d["_id"] for d in store.reader.scan("db.c")) == [4, 5]
    finally:
        store.close()
