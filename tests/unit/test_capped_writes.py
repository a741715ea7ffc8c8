"""Capped collections' trimming through real writes on an in-memory store: what an insert pushes out
is logged, and updates between inserts of the same write do not leave the trim counting stale sizes."""

from __future__ import annotations

import datetime

from base.optime import NULL_OPTIME
from oplog.capped import capped_limits
from oplog.entry import command_entry
from oplog.log_writer import LogWriter
from oplog.sqlite_store import SQLiteStore
from oplog.writes import WriteEnv, insert_documents, update_documents

NOW = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)


def _capped(store: SQLiteStore, log: LogWriter, **options: int) -> None:
    txn = store.begin()
    WriteEnv(txn=txn, log=log, term=1, now=NOW).emit(command_entry("d", {"create": "c", "capped": True, **options}))
    store.commit()


def test_sizes_round_as_mongods() -> None:
    assert capped_limits({"capped": True, "size": 1000}).size == 4096  # type: ignore[union-attr]
    assert capped_limits({"capped": True, "size": 5000}).size == 5120  # type: ignore[union-attr]
    assert capped_limits({"capped": True, "size": 8192}).size == 8192  # type: ignore[union-attr]


def test_an_insert_pushes_out_the_oldest_and_logs_each_as_a_delete() -> None:
    store, log = SQLiteStore(None), LogWriter(NULL_OPTIME)
    try:
        _capped(store, log, size=4096, max=3)
        txn = store.begin()
        insert_documents(WriteEnv(txn=txn, log=log, term=1, now=NOW), "d.c", [{"_id": i} for i in range(5)], True)
        store.commit()
        assert [d["_id"] for d in store.reader.scan("d.c")] == [2, 3, 4]
        deletes = [e for _k, e in ((k, __import__("bson").decode(b)) for k, b in store.reader.oplog_after(0, 100))
                   if e["op"] == "d"]
        assert [e["o"]["_id"] for e in deletes] == [0, 1]
    finally:
        store.close()


def test_updates_between_upserts_of_one_write_are_counted_before_the_next_trim() -> None:
    store, log = SQLiteStore(None), LogWriter(NULL_OPTIME)
    try:
        _capped(store, log, size=4096)
        txn = store.begin()
        insert_documents(WriteEnv(txn=txn, log=log, term=1, now=NOW), "d.c",
                         [{"_id": i, "pad": "p" * 300} for i in range(12)], True)  # ~3.9 KB of 4 KB
        store.commit()
        txn = store.begin()
        env = WriteEnv(txn=txn, log=log, term=1, now=NOW)
        update_documents(env, "d.c", [
            {"q": {"_id": 100}, "u": {"$set": {"x": 1}}, "upsert": True},  # counts the totals: ~3.9 KB
            {"q": {"_id": {"$lt": 100}}, "u": {"$set": {"pad": "z"}}, "multi": True},  # shrinks them all
            # ~0.7 KB in all now: this one fits, and nothing may go (stale totals would say 4.2 KB)
            {"q": {"_id": 101}, "u": {"$set": {"pad": "p" * 300}}, "upsert": True},
        ], True)
        store.commit()
        kept = [d["_id"] for d in store.reader.scan("d.c")]
        assert kept == [*range(12), 100, 101]
    finally:
        store.close()


def test_a_capped_collection_never_reuses_a_row_id() -> None:
    """A tailing cursor's position is a row id: one freed by deleting the newest row is not handed out
    again (the next insert would sit at the position and be skipped)."""
    store, log = SQLiteStore(None), LogWriter(NULL_OPTIME)
    try:
        _capped(store, log, size=4096)
        txn = store.begin()
        insert_documents(WriteEnv(txn=txn, log=log, term=1, now=NOW), "d.c", [{"_id": 1}, {"_id": 2}], True)
        txn.delete("d.c", 2)
        insert_documents(WriteEnv(txn=txn, log=log, term=1, now=NOW), "d.c", [{"_id": 3}], True)
        store.commit()
        table = store.reader.collection("d.c").table  # type: ignore[union-attr]
        rows = store.reader.scan_chunk("d.c", table, 0)
        assert [rid for rid, _ in rows] == [1, 3]
    finally:
        store.close()
