"""A tailing oplog cursor never silently skips entries the capped oplog trimmed."""

from __future__ import annotations

import bson
import pytest

from base.errors import MongoError
from oplog.sqlite_store import SQLiteStore
from replset.wire.oplog_reader import CHUNK, check_tail_position, raw_oplog_source


def _store(n: int) -> SQLiteStore:
    store = SQLiteStore(None)
    txn = store.begin()
    txn.append_oplog([(key, bson.encode({"k": key})) for key in range(1, n + 1)])
    store.commit()
    return store


def _trim_through(store: SQLiteStore, key: int) -> None:
    txn = store.begin()
    txn.trim_oplog(10**12, keep_after=key)
    store.commit()


def test_resuming_after_a_trimmed_position_is_capped_position_lost() -> None:
    store = _store(10)
    state: dict[str, int] = {}
    assert [d["k"] for d in raw_oplog_source(store.reader, 0, state)] == list(range(1, 11))
    check_tail_position(store.reader, state["last"])  # still there: resuming is fine
    _trim_through(store, 10)
    assert store.reader.oplog_bounds() == (10, 10)
    check_tail_position(store.reader, 10)
    with pytest.raises(MongoError) as err:
        check_tail_position(store.reader, 9)
    assert err.value.code == 136
    store.close()


def test_a_trim_between_chunks_of_one_scan_is_detected() -> None:
    store = _store(CHUNK * 2)
    docs = raw_oplog_source(store.reader, 0, {})
    for _ in range(CHUNK):
        next(docs)
    _trim_through(store, CHUNK + 5)  # entries right after the first chunk are gone
    with pytest.raises(MongoError) as err:
        next(docs)
    assert err.value.code == 136
    store.close()
