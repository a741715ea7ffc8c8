"""The oplog is idempotent: replaying it (twice, in overlapping ranges, or resumed
from any earlier point) reproduces the primary's data exactly.

Random write sequences go through the real write path (`oplog.writes`, the same
code the `insert`/`update`/`delete` commands run); the resulting oplog is then
applied in replay mode to fresh stores.
"""

from __future__ import annotations

import datetime
from typing import Any

import bson
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from base.optime import NULL_OPTIME
from oplog.apply import apply_entry
from oplog.codec_options import DOC_OPTIONS
from oplog.log_writer import LogWriter
from oplog.sqlite_store import SQLiteStore
from oplog.writes import WriteEnv, delete_documents, insert_documents, update_documents

NS = "db.c"
NOW = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)

ids = st.integers(0, 6)
scalars = st.one_of(st.integers(-5, 5), st.text("ab", max_size=2), st.none(), st.booleans())
docs = st.fixed_dictionaries({"_id": ids}, optional={"a": scalars, "n": st.integers(0, 9),
                                                       "arr": st.lists(st.integers(0, 3), max_size=4),
                                                       "sub": st.fixed_dictionaries({"x": scalars})})
update_ops = st.one_of(
    st.builds(lambda v: {"$set": {"a": v}}, scalars),
    st.builds(lambda v: {"$set": {"sub.x": v}}, scalars),
    st.builds(lambda v: {"$inc": {"n": v}}, st.integers(-3, 3)),
    st.builds(lambda v: {"$push": {"arr": v}}, st.integers(0, 3)),
    st.builds(lambda v: {"$addToSet": {"arr": v}}, st.integers(0, 3)),
    st.builds(lambda v: {"$pull": {"arr": v}}, st.integers(0, 3)),
    st.just({"$pop": {"arr": 1}}),
    st.just({"$unset": {"a": ""}}),
    st.just({"$rename": {"a": "b"}}),
    st.builds(lambda v: {"$max": {"n": v}}, st.integers(0, 9)),
    st.builds(lambda v: {"$mul": {"n": v}}, st.integers(0, 2)),
    st.builds(lambda v: {"a": v, "replaced": True}, scalars),
)
filters = st.one_of(st.builds(lambda i: {"_id": i}, ids), st.builds(lambda v: {"n": {"$gte": v}}, st.integers(0, 9)),
                    st.just({}))
ops = st.one_of(
    st.tuples(st.just("insert"), docs),
    st.tuples(st.just("update"), st.fixed_dictionaries({"q": filters, "u": update_ops, "multi": st.booleans(),
                                                        "upsert": st.booleans()})),
    st.tuples(st.just("delete"), st.fixed_dictionaries({"q": filters, "limit": st.sampled_from([0, 1])})),
)


def _run_workload(workload: list[tuple[str, Any]]) -> tuple[SQLiteStore, list[dict[str, Any]]]:
    store = SQLiteStore(None)
    writer = LogWriter(NULL_OPTIME)
    for kind, arg in workload:
        txn = store.begin()
        env = WriteEnv(txn=txn, log=writer, term=1, now=NOW)
        if kind == "insert":
            insert_documents(env, NS, [arg], ordered=True)
        elif kind == "update":
            spec = dict(arg)
            if spec["multi"] and not any(k.startswith("$") for k in spec["u"]):
                spec["multi"] = False
            update_documents(env, NS, [spec], ordered=True)
        else:
            delete_documents(env, NS, [arg], ordered=True)
        store.commit()
    entries = [bson.decode(blob, DOC_OPTIONS) for _k, blob in store.reader.oplog_after(0, 1_000_000)]
    return store, entries


def _state(store: SQLiteStore) -> list[bytes]:
    """The store's documents as exact bytes (field order counts), by `_id`; closes the store.

    Natural (insertion) order is not part of the contract: a replayed delete and
    re-insert may place a document elsewhere, as on MongoDB's secondaries.
    """
    try:
        return sorted(bson.encode(d) for d in store.reader.scan(NS))
    finally:
        store.close()


def _replay(entries: list[dict[str, Any]], plan: list[tuple[int, int]]) -> SQLiteStore:
    store = SQLiteStore(None)
    for start, end in plan:
        txn = store.begin()
        for entry in entries[start:end]:
            apply_entry(txn, entry, replay=True)
        store.commit()
    return store


SETTINGS = settings(max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(st.lists(ops, min_size=1, max_size=25))
def test_replaying_the_oplog_reproduces_the_data(workload: list[tuple[str, Any]]) -> None:
    primary, entries = _run_workload(workload)
    replica = _replay(entries, [(0, len(entries))])
    assert _state(replica) == _state(primary)


@SETTINGS
@given(st.lists(ops, min_size=1, max_size=25), st.data())
def test_replaying_random_ranges_twice_is_harmless(workload: list[tuple[str, Any]], data: st.DataObject) -> None:
    primary, entries = _run_workload(workload)
    n = len(entries)
    plan: list[tuple[int, int]] = []
    position = 0
    while position < n:
        end = data.draw(st.integers(position + 1, n))
        back = data.draw(st.integers(0, position))  # replay an already-applied suffix again
        plan += [(back, position), (position, end)] if back < position else [(position, end)]
        position = end
    replica = _replay(entries, plan)
    assert _state(replica) == _state(primary)


@SETTINGS
@given(st.lists(ops, min_size=1, max_size=25), st.data())
def test_stopping_mid_batch_and_resuming_earlier(workload: list[tuple[str, Any]], data: st.DataObject) -> None:
    primary, entries = _run_workload(workload)
    n = len(entries)
    stop = data.draw(st.integers(0, n))
    resume = data.draw(st.integers(0, stop))  # the last durable position may be older than what was applied
    replica = _replay(entries, [(0, stop), (resume, n)])
    assert _state(replica) == _state(primary)


def test_the_seed_example_inc_is_logged_as_set() -> None:
    primary, entries = _run_workload([("insert", {"_id": 1, "counter": 1}),
                                      ("update", {"q": {"_id": 1}, "u": {"$inc": {"counter": 1}},
                                                  "multi": False, "upsert": False})])
    update = [e for e in entries if e["op"] == "u"]
    assert len(update) == 1
    assert update[0]["o"] == {"$set": {"counter": 2}} and update[0]["o2"] == {"_id": 1}
    assert _state(primary) == [bson.encode({"_id": 1, "counter": 2})]
