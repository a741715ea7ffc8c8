"""Initial sync converges: a clone taken at any point after beginApplying, plus the
oplog replayed from beginApplying with initial sync's tolerance (DuplicateKey
skipped), ends with exactly the primary's documents — unique indexes included.

Random writes go through the real write path against a collection with a unique
index on a field drawn from a tiny range, so replaying an old entry over a newer
copy often clashes with another document's newer key.
"""

from __future__ import annotations

import datetime
from typing import Any

import bson
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from oplog.apply import apply_entry
from oplog.codec_options import DOC_OPTIONS
from oplog.log_writer import LogWriter
from oplog.optime import NULL_OPTIME
from oplog.sqlite_store import SQLiteStore
from oplog.values import canonical_key
from oplog.writes import WriteEnv, delete_documents, insert_documents, update_documents
from sync.initial_sync import apply_for_initial_sync

NS = "db.c"
NOW = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)
UNIQUE = {"v": 2, "key": {"k": 1}, "name": "k_1", "unique": True}

ids = st.integers(0, 5)
keys = st.integers(0, 3)
ops = st.one_of(
    st.tuples(st.just("insert"), st.fixed_dictionaries({"_id": ids, "k": keys, "n": st.integers(0, 3)})),
    st.tuples(st.just("update"), st.fixed_dictionaries({
        "q": st.one_of(st.builds(lambda i: {"_id": i}, ids), st.just({})),
        "u": st.one_of(st.builds(lambda k: {"$set": {"k": k}}, keys), st.just({"$inc": {"n": 1}}),
                       st.builds(lambda k: {"k": k, "replaced": True}, keys)),
        "upsert": st.booleans()})),
    st.tuples(st.just("delete"), st.fixed_dictionaries({"q": st.builds(lambda i: {"_id": i}, ids),
                                                        "limit": st.just(1)})),
)


def _primary(workload: list[tuple[str, Any]]) -> tuple[SQLiteStore, list[dict[str, Any]]]:
    store = SQLiteStore(None)
    txn = store.begin()
    txn.create_collection(NS)
    txn.create_index(NS, UNIQUE)
    store.commit()
    writer = LogWriter(NULL_OPTIME)
    for kind, arg in workload:
        txn = store.begin()
        env = WriteEnv(txn=txn, log=writer, term=1, now=NOW)
        if kind == "insert":
            insert_documents(env, NS, [arg], ordered=True)
        elif kind == "update":
            update_documents(env, NS, [dict(arg, multi=False)], ordered=True)
        else:
            delete_documents(env, NS, [arg], ordered=True)
        store.commit()
    entries = [bson.decode(blob, DOC_OPTIONS) for _k, blob in store.reader.oplog_after(0, 1_000_000)]
    return store, entries


def _documents(store: SQLiteStore) -> list[bytes]:
    try:
        return sorted(bson.encode(d) for d in store.reader.scan(NS))
    finally:
        store.close()


def _clone_at(entries: list[dict[str, Any]], position: int) -> SQLiteStore:
    """A copy of the primary's collection as it was after `position` entries, loaded like the cloner."""
    then = SQLiteStore(None)
    txn = then.begin()
    for entry in entries[:position]:
        apply_entry(txn, entry, replay=True)
    then.commit()
    docs = list(then.reader.scan(NS))
    then.close()
    clone = SQLiteStore(None)
    txn = clone.begin()
    txn.create_collection(NS)
    txn.bulk_insert(NS, [(canonical_key(d["_id"]), bson.encode(d)) for d in docs])
    txn.create_index(NS, UNIQUE)
    clone.commit()
    return clone


@settings(max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(ops, min_size=1, max_size=30), st.data())
def test_clone_plus_tolerant_replay_reproduces_the_primary(workload: list[tuple[str, Any]],
                                                           data: st.DataObject) -> None:
    primary, entries = _primary(workload)
    begin = data.draw(st.integers(0, len(entries)))        # entries applied when beginApplying was read
    cloned_at = data.draw(st.integers(begin, len(entries)))  # the collection is read later
    replica = _clone_at(entries, cloned_at)
    txn = replica.begin()
    for entry in entries[begin:]:
        apply_for_initial_sync(txn, entry)
    replica.commit()
    assert _documents(replica) == _documents(primary)
