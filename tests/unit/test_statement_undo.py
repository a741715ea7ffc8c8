"""A statement rolled back to its savepoint takes back everything it did: its rows and index keys, and what
it logged (the log's position, which the next optime, the reply and the write concern go by)."""

from __future__ import annotations

import datetime

from base.optime import NULL_OPTIME
from oplog.log_writer import LogWriter
from oplog.sqlite_store import SQLiteStore
from oplog.writes import WriteEnv, insert_documents, update_documents
from sync.rollback_runner import _insert

NOW = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)


def test_a_failed_statement_of_a_multi_update_leaves_the_log_position_at_the_last_kept_entry() -> None:
    store, log = SQLiteStore(None), LogWriter(NULL_OPTIME)
    try:
        txn = store.begin()
        insert_documents(WriteEnv(txn=txn, log=log, term=1, now=NOW), "d.c",
                         [{"_id": 1, "a": 1}, {"_id": 2, "a": "x"}], True)
        store.commit()
        before = log.last
        txn = store.begin()
        env = WriteEnv(txn=txn, log=log, term=1, now=NOW)
        result = update_documents(env, "d.c", [{"q": {}, "u": {"$inc": {"a": 1}}, "multi": True}], True)
        store.commit()
        assert [e["code"] for e in result.write_errors] == [14]   # $inc of a string: the whole statement fails
        assert log.last == before and store.reader.oplog_newest_key() == before.ts_key
        assert env.last_entry is None
        assert sorted((d["_id"], d["a"]) for d in store.reader.scan("d.c")) == [(1, 1), (2, "x")]
    finally:
        store.close()


def test_a_rollback_insert_that_clashes_on_a_unique_index_leaves_nothing_half_written() -> None:
    store = SQLiteStore(None)
    try:
        txn = store.begin()
        txn.create_collection("d.c")
        txn.create_index("d.c", {"v": 2, "key": {"a": 1}, "name": "a_1", "unique": True})
        txn.insert("d.c", {"_id": 1, "a": 1})
        _insert(txn, "d.c", {"_id": 2, "a": 1})   # a refetched document whose key another one holds
        store.commit()
        reader = store.reader
        assert [d["_id"] for d in reader.scan("d.c")] == [1]
        assert [reader.unique_key_count(i) for i in reader.indexes("d.c") if i.unique] == [1]
    finally:
        store.close()
