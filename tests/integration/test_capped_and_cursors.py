"""Capped collections, tailable and exhaust cursors, `batchSize: 0`, and a find's hint, min and max, on a
real three-member set driven by pymongo."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from pymongo import ASCENDING, DESCENDING, CursorType, MongoClient, monitoring
from pymongo.errors import OperationFailure, WriteError
from pymongo.write_concern import WriteConcern

from tests.support.members import wait_for
from tests.support.replica_set import ReplicaSet


class _Commands(monitoring.CommandListener):
    def __init__(self) -> None:
        self.names: list[str] = []

    def started(self, event: monitoring.CommandStartedEvent) -> None:
        self.names.append(event.command_name)

    def succeeded(self, event: monitoring.CommandSucceededEvent) -> None:
        pass

    def failed(self, event: monitoring.CommandFailedEvent) -> None:
        pass


@pytest.fixture()
def db(fresh_db: Any) -> Any:
    return fresh_db


@pytest.fixture()
def client(set_client: MongoClient[dict[str, Any]]) -> MongoClient[dict[str, Any]]:
    return set_client


def _members_docs(rs: ReplicaSet, db_name: str, coll: str) -> list[list[Any]]:
    out = []
    for member in rs.members:
        with rs.direct(member) as direct:
            out.append([d["x"] for d in direct[db_name][coll].find()])
    return out


# -- capped collections ----------------------------------------------------------------
def test_a_capped_collection_keeps_its_newest_documents_on_every_member(rs: ReplicaSet, db: Any) -> None:
    db.create_collection("log", capped=True, size=100_000, max=3)
    db.log.insert_many([{"x": i} for i in range(5)])
    db.log.insert_one({"x": 5})
    assert [d["x"] for d in db.log.find()] == [3, 4, 5]
    # The trimmed documents are deletes in the oplog: every member removed exactly the same ones.
    assert _members_docs(rs, db.name, "log") == [[3, 4, 5]] * 3
    with rs.direct(rs.wait_primary()) as direct:
        deletes = list(direct.local["oplog.rs"].find({"ns": f"{db.name}.log", "op": "d"}))
    assert len(deletes) == 3


def test_a_capped_collection_holds_at_most_its_size(rs: ReplicaSet, db: Any) -> None:
    db.create_collection("sized", capped=True, size=4096)
    db.sized.insert_many([{"x": i, "pad": "p" * 100} for i in range(100)])
    stats = db.command("aggregate", "sized", pipeline=[{"$collStats": {"storageStats": {}}}],
                       cursor={})["cursor"]["firstBatch"][0]["storageStats"]
    assert stats["capped"] is True and stats["maxSize"] == 4096
    assert 0 < stats["size"] <= 4096
    kept = [d["x"] for d in db.sized.find()]
    assert kept == list(range(100 - len(kept), 100))  # the newest, in insertion order
    assert _members_docs(rs, db.name, "sized") == [kept] * 3
    assert db.sized.options() == {"capped": True, "size": 4096}
    names = db.list_collection_names(filter={"options.capped": True})
    assert names == ["sized"]


def test_capped_refusals(db: Any, client: MongoClient[dict[str, Any]]) -> None:
    with pytest.raises(OperationFailure) as no_size:
        db.create_collection("nosize", capped=True)
    assert no_size.value.code == 72
    db.create_collection("small", capped=True, size=1000)  # (4096 bytes: mongod's least)
    db.small.insert_one({"pad": "p" * 2000})
    with pytest.raises(WriteError) as too_big:
        db.small.insert_one({"pad": "p" * 5000})
    assert too_big.value.code == 10003
    assert db.small.count_documents({}) == 1
    with client.start_session() as session, pytest.raises(OperationFailure) as in_txn:
        with session.start_transaction():
            db.small.insert_one({"x": 1}, session=session)
    assert in_txn.value.code == 263
    with pytest.raises(OperationFailure) as out_to_capped:
        db.other.insert_one({"x": 1})
        list(db.other.aggregate([{"$out": "small"}]))
    assert out_to_capped.value.code == 17152
    with pytest.raises(OperationFailure) as not_capped:
        db.other.find(cursor_type=CursorType.TAILABLE).to_list()
    assert not_capped.value.code == 2


# -- tailable cursors ------------------------------------------------------------------
def test_a_tailable_cursor_follows_inserts_and_dies_when_trimmed_past(db: Any) -> None:
    db.create_collection("tail", capped=True, size=100_000, max=3)
    cursor = db.tail.find(cursor_type=CursorType.TAILABLE)
    db.tail.insert_one({"x": 1})
    assert [d["x"] for d in cursor] == [1]
    db.tail.insert_one({"x": 2})
    assert [d["x"] for d in cursor] == [2]
    assert cursor.alive
    db.tail.insert_many([{"x": i} for i in range(3, 7)])  # pushes out 2, the cursor's position
    assert cursor.to_list() == []
    assert not cursor.alive
    # The same, as commands: the getMore fails with CappedPositionLost instead of skipping documents.
    reply = db.command("find", "tail", tailable=True, batchSize=1)
    cursor_id = reply["cursor"]["id"]
    assert [d["x"] for d in reply["cursor"]["firstBatch"]] == [4]
    db.tail.insert_many([{"x": i} for i in range(7, 10)])
    with pytest.raises(OperationFailure) as lost:
        db.command("getMore", cursor_id, collection="tail")
    assert lost.value.code == 136
    with pytest.raises(OperationFailure) as gone:
        db.command("getMore", cursor_id, collection="tail")
    assert gone.value.code == 43  # (killed with its error)


def test_an_await_data_cursor_returns_an_insert_made_while_it_waits(db: Any) -> None:
    db.create_collection("await", capped=True, size=100_000)
    db["await"].insert_one({"x": 0})
    cursor = db["await"].find(cursor_type=CursorType.TAILABLE_AWAIT).max_await_time_ms(30_000)
    assert next(cursor)["x"] == 0
    waiting = threading.Event()
    inserter = threading.Thread(target=lambda: (waiting.wait(30), db["await"].insert_one({"x": 1})))
    inserter.start()
    try:
        waiting.set()
        assert next(cursor)["x"] == 1  # the getMore in flight returned it (a 30 s wait otherwise ends empty)
    finally:
        inserter.join(30)
        cursor.close()
    empty = db.command("find", "await", tailable=True, awaitData=True)
    more = db.command("getMore", empty["cursor"]["id"], collection="await", maxTimeMS=50)
    assert more["cursor"]["nextBatch"] == [] and more["cursor"]["id"] != 0
    db.command("killCursors", "await", cursors=[empty["cursor"]["id"]])


# -- batch sizes, exhaust and raw batches ------------------------------------------------
def test_batch_size_zero_opens_a_cursor_with_an_empty_first_batch(db: Any) -> None:
    db.items.insert_many([{"_id": i, "x": i} for i in range(10)])
    for reply in (db.command("find", "items", batchSize=0),
                  db.command("aggregate", "items", pipeline=[{"$sort": {"_id": 1}}], cursor={"batchSize": 0})):
        assert reply["cursor"]["firstBatch"] == [] and reply["cursor"]["id"] != 0
        rest = db.command("getMore", reply["cursor"]["id"], collection="items")
        assert [d["_id"] for d in rest["cursor"]["nextBatch"]] == list(range(10))
    batches = db.items.aggregate_raw_batches([{"$sort": {"_id": 1}}]).to_list()
    assert len(batches) == 1
    batches = db.items.find_raw_batches().to_list()
    assert len(batches) == 1


def test_a_full_batch_leaves_the_cursor_open_as_mongod_does(rs: ReplicaSet, db: Any) -> None:
    db.three.insert_many([{"_id": i} for i in range(3)])
    listener = _Commands()
    with rs.client(event_listeners=[listener]) as c:
        assert len(c[db.name].three.find(batch_size=1).to_list()) == 3
        assert listener.names == ["find", "getMore", "getMore", "getMore"]
        listener.names.clear()
        assert len(c[db.name].three.find(batch_size=2).to_list()) == 3
        assert listener.names == ["find", "getMore"]  # (the second batch was not full: it closed)


def test_an_exhaust_cursor_streams_its_batches(rs: ReplicaSet, db: Any) -> None:
    db.many.insert_many([{"i": i} for i in range(150)])
    listener = _Commands()
    with rs.client(event_listeners=[listener], maxPoolSize=1) as c:
        coll = c[db.name].many
        result = coll.find(cursor_type=CursorType.EXHAUST, batch_size=40).to_list()
        assert sorted(d["i"] for d in result) == list(range(150))
        # One getMore sent; the member streamed the later replies on its own (the driver reports each).
        assert listener.names == ["find", "getMore", "getMore", "getMore"]
        pool = c._topology.select_server_by_address(c.primary, "test").pool  # type: ignore[union-attr,arg-type]
        assert len(pool.conns) == 1  # the connection went back to the pool once the stream ended
        # A stream the client abandons: its connection is discarded, and the member kills the cursor.
        before = _open_cursors(c)
        cursor = coll.find(cursor_type=CursorType.EXHAUST, batch_size=2)
        for _ in range(3):
            next(cursor)
        assert len(pool.conns) == 0  # (held by the stream: replies are still to come on it)
        cursor.close()
        assert len(pool.conns) == 0
        wait_for(lambda: _open_cursors(c) == before, 30, "the abandoned exhaust cursor to be killed")


def _open_cursors(client: MongoClient[dict[str, Any]]) -> int:
    return int(client.admin.command("serverStatus")["metrics"]["cursor"]["open"]["total"])


# -- hint, min and max ---------------------------------------------------------------------
def test_a_hint_reads_as_the_index_would(db: Any) -> None:
    db.h.insert_many([{"i": i, "j": i, "k": i} for i in range(10)])
    db.h.create_index([("i", DESCENDING)], name="by_i_desc")
    assert next(db.h.find())["i"] == 0
    assert next(db.h.find().hint("by_i_desc"))["i"] == 9
    assert next(db.h.find().hint([("$natural", -1)]))["i"] == 9
    for hint in ("nope", [("nope", ASCENDING)]):
        with pytest.raises(OperationFailure) as unknown:
            db.h.find().hint(hint).to_list()
        assert unknown.value.code == 2
        with pytest.raises(OperationFailure):
            db.h.find().hint(hint).explain()
    db.h.create_index([("s", ASCENDING)], sparse=True)
    db.h.insert_one({"s": 1})
    assert [d["s"] for d in db.h.find().hint([("s", ASCENDING)])] == [1]  # a sparse index holds one
    db.h.create_index([("j", ASCENDING), ("k", ASCENDING)])
    pattern = [("j", ASCENDING), ("k", ASCENDING)]
    assert [d["j"] for d in db.h.find({"j": {"$exists": True}}).max([("j", 3), ("k", 3)]).hint(pattern)] == [0, 1, 2]
    assert len(db.h.find().min([("j", 3), ("k", 3)]).hint(pattern).to_list()) == 7
    with pytest.raises(OperationFailure):
        db.h.find().max([("k", 3), ("j", 3)]).hint(pattern).to_list()
    with pytest.raises(OperationFailure) as no_hint:  # (sent as a command: the driver checks it itself)
        db.command("find", "h", max={"j": 3})
    assert no_hint.value.code == 51173


# -- small things the drivers' own tests touch ----------------------------------------
def test_fsync_validate_empty_collation_and_index_options(db: Any, client: MongoClient[dict[str, Any]]) -> None:
    wc = db.with_options(write_concern=WriteConcern(w="majority"))
    wc.v.insert_one({"x": 1})
    assert client.admin.command("fsync")["ok"] == 1.0
    assert wc.validate_collection("v", background=True)["valid"]
    with pytest.raises(OperationFailure):
        wc.validate_collection("v", full=True, background=True)
    assert db.v.delete_many({"x": 2}, {}).deleted_count == 0  # collation {} is no collation
    db.v.insert_many([{"u": 1}, {"u": 1}])
    with pytest.raises(OperationFailure) as dup:
        db.v.create_index("u", unique=True, dropDups=False)  # (dropDups is taken and ignored)
    assert dup.value.code == 11000
    assert db.v.count_documents({}) == 3
    for bad in (5, {"x": {"$asdasd": 3}}, {"$and": 5}):
        with pytest.raises(OperationFailure):
            db.v.create_index("x", partialFilterExpression=bad)


def test_return_key_and_show_record_id(db: Any) -> None:
    db.rk.insert_many([{"_id": i, "x": i * 11} for i in range(1, 6)])
    keys = db.command("find", "rk", sort={"_id": 1}, returnKey=True, showRecordId=True)["cursor"]["firstBatch"]
    assert keys == [{"_id": i} for i in range(1, 6)]  # (the _id index serves the sort)
    assert db.command("find", "rk", returnKey=True)["cursor"]["firstBatch"] == [{}] * 5  # a collection scan
    db.rk.create_index("x")
    by_x = db.command("find", "rk", sort={"x": -1}, limit=2, returnKey=True)["cursor"]["firstBatch"]
    assert by_x == [{"x": 55}, {"x": 44}]
    with_ids = db.command("find", "rk", filter={"x": {"$gt": 20}}, projection={"x": 1, "_id": 0},
                          showRecordId=True)["cursor"]["firstBatch"]
    assert [d["x"] for d in with_ids] == [22, 33, 44, 55]
    assert all(isinstance(d["$recordId"], int) for d in with_ids)
    assert len({d["$recordId"] for d in with_ids}) == 4  # one row id each, after the projection
