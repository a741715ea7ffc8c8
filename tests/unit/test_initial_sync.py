"""Initial sync's pure pieces: the initialSyncStatus document and its estimate, the CLI's
progress line, the too-stale decision, the retry backoff; and the store operations
initial sync relies on (drop everything but `local` and `meta`, bulk insert, backup, index
builds deferred to the stop point)."""

from __future__ import annotations

import datetime
import os
import sqlite3
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import bson
import pytest
from bson.timestamp import Timestamp

from base.errors import MongoError
from base.optime import OpTime
from oplog.sqlite_store import DeferredIndexes, SQLiteStore, StoreTxn
from oplog.values import canonical_key
from replset.cli import format_initial_sync, format_status, progress_bar, rich_bar
from sync.initial_sync import InitialSyncer, InitialSyncFailed, apply_for_initial_sync, retry_delay_s
from sync.initial_sync_progress import (
    AttemptInfo,
    CollectionProgress,
    DatabaseProgress,
    InitialSyncProgress,
    copy_totals,
    initial_sync_status,
    remaining_estimate_ms,
)
from sync.too_stale import StaleVerdict, TooStaleTracker, resync_delay_ms

T0 = datetime.datetime(2025, 1, 1, 12, 0, 0)


def _at(ms: int) -> datetime.datetime:
    return T0 + datetime.timedelta(milliseconds=ms)


def _progress() -> InitialSyncProgress:
    """Half-way through cloning: app.a done, app.b a quarter copied, other.c not started."""
    a = CollectionProgress("app.a", documents_to_copy=100, bytes_to_copy=1000, indexes=2, documents_copied=100,
                           bytes_copied=1000, fetched_batches=1, start=_at(0), end=_at(1000))
    b = CollectionProgress("app.b", documents_to_copy=400, bytes_to_copy=4000, indexes=1, documents_copied=100,
                           bytes_copied=1000, fetched_batches=1, start=_at(1000))
    c = CollectionProgress("other.c", documents_to_copy=50, bytes_to_copy=500)
    return InitialSyncProgress(
        started=_at(0), failed_attempts=1,
        attempts=[AttemptInfo(300, "PeerError: 127.0.0.1:1: refused", "127.0.0.1:1")],
        databases=[DatabaseProgress("app", [a, b], start=_at(0)), DatabaseProgress("other", [c])],
        begin_applying=Timestamp(100, 1))


def test_remaining_estimate_is_time_per_byte_times_bytes_left() -> None:
    assert remaining_estimate_ms(2000, 0, 5500) is None
    assert remaining_estimate_ms(2000, 2000, 5500) == 3500
    assert remaining_estimate_ms(2000, 6000, 5500) == 0  # copied more than announced (writes went on)


def test_initial_sync_status_uses_mongodb_field_names() -> None:
    doc = initial_sync_status(_progress(), _at(2000))
    assert list(doc)[:6] == ["method", "failedInitialSyncAttempts", "initialSyncStart",
                             "totalInitialSyncElapsedMillis", "initialSyncAttempts", "approxTotalDataSize"]
    assert doc["method"] == "logical" and doc["failedInitialSyncAttempts"] == 1
    assert doc["totalInitialSyncElapsedMillis"] == 2000
    assert doc["initialSyncAttempts"] == [{"durationMillis": 300, "status": "PeerError: 127.0.0.1:1: refused",
                                           "syncSource": "127.0.0.1:1", "rollBackId": -1, "operationsRetried": 0,
                                           "totalTimeUnreachableMillis": 0}]
    assert (doc["approxTotalDataSize"], doc["approxTotalBytesCopied"]) == (5500, 2000)
    assert doc["remainingInitialSyncEstimatedMillis"] == 3500
    assert doc["appliedOps"] == 0 and doc["initialSyncOplogStart"] == Timestamp(100, 1)
    assert "initialSyncOplogEnd" not in doc and "initialSyncEnd" not in doc
    databases = doc["databases"]
    assert (databases["databasesToClone"], databases["databasesCloned"]) == (2, 0)
    app = databases["app"]
    assert (app["collections"], app["clonedCollections"], app["elapsedMillis"]) == (2, 1, 2000)
    assert app["app.a"] == {"documentsToCopy": 100, "documentsCopied": 100, "indexes": 2, "fetchedBatches": 1,
                            "bytesToCopy": 1000, "approxBytesCopied": 1000, "receivedBatches": 1,
                            "start": _at(0), "end": _at(1000), "elapsedMillis": 1000}
    assert "start" not in databases["other"]["other.c"]
    bson.encode(doc)  # servable as BSON


def test_finished_status_has_end_and_no_estimate_left() -> None:
    progress = _progress()
    for db in progress.databases:
        db.end = _at(3000)
        for c in db.collections:
            c.documents_copied, c.bytes_copied, c.end = c.documents_to_copy, c.bytes_to_copy, _at(3000)
    progress.stop, progress.applied_ops, progress.ended = Timestamp(101, 7), 42, _at(3500)
    doc = initial_sync_status(progress, _at(9999))
    assert doc["initialSyncEnd"] == _at(3500) and doc["totalInitialSyncElapsedMillis"] == 3500
    assert doc["remainingInitialSyncEstimatedMillis"] == 0
    assert doc["initialSyncOplogEnd"] == Timestamp(101, 7) and doc["appliedOps"] == 42
    assert doc["databases"]["databasesCloned"] == 2


def test_new_attempt_forgets_the_previous_copy_but_not_the_attempts() -> None:
    progress = _progress()
    progress.new_attempt()
    assert progress.databases == [] and progress.begin_applying is None and progress.bytes_copied == 0
    assert progress.failed_attempts == 1 and len(progress.attempts) == 1


def test_copy_totals_sum_every_collection() -> None:
    totals = copy_totals(initial_sync_status(_progress(), _at(2000)))
    assert (totals.documents_copied, totals.documents_to_copy) == (200, 550)
    assert (totals.bytes_copied, totals.bytes_to_copy, totals.remaining_ms) == (2000, 5500, 3500)
    assert copy_totals({}).documents_to_copy == 0


def test_progress_line_for_the_cli() -> None:
    assert progress_bar(0.5, 10) == "[#####.....]"
    assert progress_bar(1.7, 4) == "[####]" and progress_bar(-1, 4) == "[....]"
    line = format_initial_sync("127.0.0.1:27019", initial_sync_status(_progress(), _at(2000)))
    assert line == ("initial sync 127.0.0.1:27019  [#######.............]   36%  200/550 documents  "
                    "0.0/0.0 MB  cloning  ~4 s left  (1 failed attempt)")
    starting = format_initial_sync("h:1", {"databases": {"databasesToClone": 0}})
    assert "starting" in starting and "[....................]" in starting
    # On a colour terminal, rich's bar: 36% of 20 cells drawn in the bar's colour, the rest in the back one.
    coloured = format_initial_sync("127.0.0.1:27019", initial_sync_status(_progress(), _at(2000)), rich_bar)
    assert "\x1b[" in coloured and "━" in coloured and coloured.endswith("(1 failed attempt)")
    assert "━" * 7 in rich_bar(0.36) and rich_bar(0.0) != rich_bar(1.0)


def test_status_table_adds_progress_and_info_messages() -> None:
    members = [
        {"_id": 0, "name": "h:1", "health": 1.0, "state": 1, "stateStr": "PRIMARY", "self": True,
         "optime": {"ts": Timestamp(100, 1), "t": 1}, "infoMessage": ""},
        {"_id": 1, "name": "h:2", "health": 1.0, "state": 5, "stateStr": "STARTUP2",
         "optime": {"ts": Timestamp(0, 0), "t": -1}, "infoMessage": "", "lastHeartbeatMessage": ""},
        {"_id": 2, "name": "h:3", "health": 1.0, "state": 3, "stateStr": "RECOVERING",
         "optime": {"ts": Timestamp(90, 1), "t": 1}, "infoMessage": "too stale to catch up: ..."},
    ]
    status = {"set": "rs0", "myState": 1, "term": 1, "members": members}
    lines = format_status(status, {"h:2": initial_sync_status(_progress(), _at(2000))}).splitlines()
    assert lines[-3] == ""
    assert lines[-2].startswith("initial sync h:2  [")
    assert lines[-1] == "h:3: too stale to catch up: ..."
    assert "initial sync" not in format_status(status)  # nothing asked from the syncing member


def test_retry_backoff_doubles_up_to_thirty_seconds() -> None:
    assert [retry_delay_s(n) for n in (1, 2, 3, 6, 20)] == [1.0, 2.0, 4.0, 30.0, 30.0]


# -- too stale --------------------------------------------------------------------------------------

OURS = OpTime(100, 5, 1)


def _verdict(host: str, at_ms: int) -> StaleVerdict:
    return StaleVerdict(host, OURS, OpTime(200, 1, 2), at_ms)


def test_too_stale_only_once_every_reachable_source_says_so() -> None:
    tracker = TooStaleTracker()
    tracker.record(_verdict("h:1", 1000))
    assert not tracker.maybe_schedule(["h:1", "H:2"], 1000, 6000)
    assert not tracker.stale and tracker.message(1000) == ""
    tracker.record(_verdict("h:2", 1100))
    assert tracker.maybe_schedule(["h:1", "H:2"], 1100, 6000)
    assert tracker.stale and tracker.resync_due_ms == 7100
    assert not tracker.maybe_schedule(["h:1", "h:2"], 1200, 6000)  # scheduled once
    assert not tracker.resync_due(7099) and tracker.resync_due(7100)
    message = tracker.message(4100)
    assert message.startswith("too stale to catch up: our last entry Timestamp(100, 5) term 1 is gone")
    assert "h:1 starts at Timestamp(200, 1) term 2" in message and "in 3 s" in message
    assert "replset resync" in message and "rollback/resync-" in message
    tracker.clear()
    assert not tracker.stale and tracker.message(4100) == ""


def test_old_verdicts_expire_and_no_reachable_source_is_not_stale() -> None:
    tracker = TooStaleTracker()
    assert not tracker.stale_everywhere([], 0)
    tracker.record(_verdict("h:1", 0))
    assert tracker.stale_everywhere([], 1)  # a verdict and no other source
    assert tracker.stale_everywhere(["h:1"], 59_999)
    assert not tracker.stale_everywhere(["h:1"], 60_000)


def test_resync_waits_three_election_timeouts() -> None:
    assert resync_delay_ms(2000) == 6000
    assert resync_delay_ms(10_000) == 30_000


# -- storage ----------------------------------------------------------------------------------------

def test_drop_replicated_data_keeps_local_and_meta(tmp_path: Any) -> None:
    store = SQLiteStore(str(tmp_path))
    try:
        txn = store.begin()
        txn.insert("local.system.replset", {"_id": "rs0", "version": 1})
        txn.insert("app.a", {"_id": 1})
        txn.create_index("app.a", {"v": 2, "key": {"x": 1}, "name": "x_1", "unique": True})
        txn.insert("config.transactions", {"_id": {"id": 1}})
        txn.append_oplog([(1, bson.encode({"op": "n"}))])
        txn.set_meta("election", {"term": 3})
        assert txn.drop_replicated_data() == 2
        store.commit()
        reader = store.reader
        assert [c.ns for c in reader.collections()] == ["local.system.replset"]
        assert reader.oplog_bounds() is None
        assert reader.meta("election") == {"term": 3}
        txn = store.begin()
        txn.delete_meta("election")
        store.commit()
        assert reader.meta("election") is None
    finally:
        store.close()


def test_bulk_insert_then_unique_index(tmp_path: Any) -> None:
    store = SQLiteStore(str(tmp_path))
    try:
        txn = store.begin()
        docs = [{"_id": i, "k": i} for i in range(5)]
        txn.bulk_insert("app.b", [(canonical_key(d["_id"]), bson.encode(d)) for d in docs])
        txn.create_index("app.b", {"v": 2, "key": {"k": 1}, "name": "k_1", "unique": True})
        with pytest.raises(MongoError) as dup:
            txn.bulk_insert("app.b", [(canonical_key(0), bson.encode({"_id": 0}))])
        assert dup.value.code == 11000
        savepoint = txn.savepoint()
        with pytest.raises(MongoError):
            txn.insert("app.b", {"_id": 9, "k": 3})  # the index built after the load holds
        txn.rollback_to(savepoint)
        store.commit()
        assert list(store.reader.scan("app.b")) == docs
    finally:
        store.close()


def test_backup_copies_a_consistent_snapshot(tmp_path: Any) -> None:
    store = SQLiteStore(str(tmp_path / "db"))
    try:
        txn = store.begin()
        txn.insert("app.c", {"_id": 1, "v": "kept"})
        store.commit()
        path = store.backup_to(str(tmp_path / "db" / "rollback" / "resync-x"))
        assert path is not None and os.path.exists(path)
        copy = sqlite3.connect(path)
        try:
            assert copy.execute("SELECT count(*) FROM collections WHERE ns='app.c'").fetchone() == (1,)
        finally:
            copy.close()
    finally:
        store.close()
    assert SQLiteStore(None).backup_to(str(tmp_path / "mem")) is None


# -- index builds deferred to the stop point --------------------------------------------------------

UNIQUE_K = {"v": 2, "key": {"k": 1}, "name": "k_1", "unique": True}
PLAIN_N = {"v": 2, "key": {"n": 1}, "name": "n_1"}


def _command(db: str, o: dict[str, Any]) -> dict[str, Any]:
    return {"op": "c", "ns": f"{db}.$cmd", "o": o}


def _index_names(store: SQLiteStore, ns: str) -> list[str]:
    return [i.name for i in store.reader.indexes(ns)]


def test_replay_defers_unique_keys_to_the_stop_point() -> None:
    store = SQLiteStore(None)
    try:
        deferred = DeferredIndexes()
        txn = store.begin()
        for entry in [_command("app", {"createIndexes": "a"} | UNIQUE_K),
                      _command("app", {"createIndexes": "a"} | PLAIN_N),
                      {"op": "i", "ns": "app.a", "o": {"_id": 1, "k": 7}},
                      {"op": "i", "ns": "app.a", "o": {"_id": 2, "k": 7}},  # only consistent later
                      _command("app", {"createIndexes": "a"} | UNIQUE_K)]:  # replayed twice: one build
            apply_for_initial_sync(txn, entry, deferred)
        assert [i.name for i in txn.indexes("app.a")] == ["_id_"] and len(deferred) == 2
        apply_for_initial_sync(txn, {"op": "u", "ns": "app.a", "o2": {"_id": 2},
                                     "o": {"$set": {"k": 8}}}, deferred)
        assert txn.build_deferred_indexes(deferred) == 2 and len(deferred) == 0
        store.commit()
        assert _index_names(store, "app.a") == ["_id_", "k_1", "n_1"]  # the source's order
        txn = store.begin()
        with pytest.raises(MongoError) as dup:
            txn.insert("app.a", {"_id": 3, "k": 7})  # built: the key holds from now on
        assert dup.value.code == 11000
        store.rollback()
    finally:
        store.close()


def test_replayed_drops_cancel_deferred_builds_and_renames_carry_them() -> None:
    store = SQLiteStore(None)
    try:
        deferred = DeferredIndexes()
        txn = store.begin()
        for ns in ("app.a", "app.b", "app.c", "other.d"):
            txn.create_collection(ns)
            deferred.add(ns, UNIQUE_K)  # as the cloner records listIndexes
        deferred.add("app.a", PLAIN_N)
        for entry in [_command("app", {"dropIndexes": "a", "index": "k_1"}),
                      _command("app", {"drop": "b"}),
                      _command("app", {"renameCollection": "app.c", "to": "app.e"}),
                      _command("other", {"dropDatabase": 1}),
                      {"op": "i", "ns": "app.a", "o": {"_id": 1, "k": 1}},
                      {"op": "i", "ns": "app.a", "o": {"_id": 2, "k": 1}}]:
            apply_for_initial_sync(txn, entry, deferred)
        assert {ns: [s["name"] for s in deferred.specs(ns)] for ns in deferred.namespaces()} == {
            "app.a": ["n_1"], "app.e": ["k_1"]}
        assert txn.build_deferred_indexes(deferred) == 2
        store.commit()
        assert _index_names(store, "app.a") == ["_id_", "n_1"]  # the dropped unique index never blocked
        assert _index_names(store, "app.e") == ["_id_", "k_1"]
        assert store.reader.collection("app.b") is None and store.reader.collection("other.d") is None
    finally:
        store.close()


def test_deferred_unique_index_that_does_not_hold_raises_duplicate_key() -> None:
    store = SQLiteStore(None)
    try:
        deferred = DeferredIndexes()
        txn = store.begin()
        txn.create_collection("app.a")
        deferred.add("app.a", UNIQUE_K)
        apply_for_initial_sync(txn, {"op": "i", "ns": "app.a", "o": {"_id": 1, "k": 1}}, deferred)
        apply_for_initial_sync(txn, {"op": "i", "ns": "app.a", "o": {"_id": 2, "k": 1}}, deferred)
        savepoint = txn.savepoint()
        with pytest.raises(MongoError) as dup:
            txn.build_deferred_indexes(deferred)
        assert dup.value.code == 11000
        txn.rollback_to(savepoint)
        assert deferred.specs("app.a") == [UNIQUE_K]  # not forgotten: nothing was built
        with txn.deferring_index_builds(deferred), pytest.raises(RuntimeError):
            txn.build_deferred_indexes(deferred)  # never from inside the deferring mode
        store.rollback()
    finally:
        store.close()


class _Writer:
    """One transaction per request, like the group commit's (rolled back when it raises)."""

    def __init__(self, store: SQLiteStore) -> None:
        self.store = store

    async def submit(self, fn: Callable[[StoreTxn], Any], *, durable: bool = True, off_loop: bool = False) -> Any:
        txn = self.store.begin()
        try:
            value = fn(txn)
        except BaseException:
            self.store.rollback()
            raise
        self.store.commit()
        return value


async def test_a_unique_index_that_does_not_hold_at_the_stop_point_fails_the_attempt() -> None:
    store = SQLiteStore(None)
    try:
        txn = store.begin()
        txn.insert("app.a", {"_id": 1, "k": 1})
        txn.insert("app.a", {"_id": 2, "k": 1})
        txn.insert("app.b", {"_id": 1, "k": 1})
        store.commit()
        syncer = InitialSyncer(SimpleNamespace(writer=_Writer(store)), lambda: None)  # type: ignore[arg-type]
        syncer._deferred.add("app.b", UNIQUE_K)
        syncer._deferred.add("app.a", UNIQUE_K)
        with pytest.raises(InitialSyncFailed, match=r"app\.a does not hold at the stop point"):
            await syncer._build_indexes(OpTime(100, 1, 1))
        assert _index_names(store, "app.b") == ["_id_", "k_1"] and _index_names(store, "app.a") == ["_id_"]
    finally:
        store.close()
