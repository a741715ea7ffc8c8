"""A real member process driven by pymongo's synchronous client."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from bson.int64 import Int64
from pymongo import ASCENDING, MongoClient, ReturnDocument
from pymongo.errors import (
    BulkWriteError,
    DuplicateKeyError,
    OperationFailure,
    WriteConcernError,
)
from pymongo.write_concern import WriteConcern

from tests.support.members import Member


@pytest.fixture(scope="module")
def client(member: Member) -> Iterator[MongoClient[dict[str, Any]]]:
    with MongoClient(member.uri, serverSelectionTimeoutMS=10000) as c:
        yield c


@pytest.fixture()
def coll(client: MongoClient[dict[str, Any]], request: pytest.FixtureRequest) -> Any:
    c = client.testdb[request.node.name.replace("[", "_").replace("]", "_")]
    c.drop()
    return c


def test_discovers_the_primary(client: MongoClient[dict[str, Any]], member: Member) -> None:
    hello = client.admin.command("hello")
    assert hello["setName"] == "rs0"
    assert hello["isWritablePrimary"] is True
    assert hello["hosts"] == [member.host]
    assert hello["me"] == member.host
    assert client.primary == ("127.0.0.1", member.port)


def test_insert_find_update_delete(coll: Any) -> None:
    coll.insert_one({"_id": 1, "qty": 5})
    coll.insert_many([{"_id": i, "qty": i} for i in range(2, 10)])
    assert coll.find_one({"_id": 1}) == {"_id": 1, "qty": 5}
    result = coll.update_one({"_id": 1}, {"$inc": {"qty": 1}})
    assert (result.matched_count, result.modified_count) == (1, 1)
    assert coll.find_one({"_id": 1})["qty"] == 6
    assert coll.count_documents({"qty": {"$gt": 3}}) == 7
    assert coll.estimated_document_count() == 9
    many = coll.update_many({"qty": {"$lt": 5}}, {"$set": {"small": True}})
    assert many.modified_count == 3
    assert coll.delete_many({"small": True}).deleted_count == 3
    assert coll.delete_one({"_id": 9}).deleted_count == 1
    assert sorted(d["_id"] for d in coll.find()) == [1, 5, 6, 7, 8]


def test_upsert_and_replace(coll: Any) -> None:
    result = coll.update_one({"name": "a"}, {"$set": {"n": 1}}, upsert=True)
    assert result.upserted_id is not None
    doc = coll.find_one({"name": "a"})
    assert doc["n"] == 1 and doc["_id"] == result.upserted_id
    coll.replace_one({"name": "a"}, {"name": "a", "n": 2})
    assert coll.find_one({"name": "a"}, {"_id": 0}) == {"name": "a", "n": 2}


def test_cursor_over_several_batches(coll: Any) -> None:
    coll.insert_many([{"_id": i, "v": i % 7} for i in range(1000)])
    docs = list(coll.find({}, batch_size=50).sort("_id", ASCENDING))
    assert [d["_id"] for d in docs] == list(range(1000))
    assert len(list(coll.find({"v": 3}).skip(10).limit(20))) == 20
    assert [d["_id"] for d in coll.find().sort("_id", -1).limit(3)] == [999, 998, 997]


def test_aggregate_distinct_projection(coll: Any) -> None:
    coll.insert_many([{"_id": i, "g": i % 3, "x": i} for i in range(30)])
    groups = list(coll.aggregate([{"$group": {"_id": "$g", "total": {"$sum": "$x"}}}, {"$sort": {"_id": 1}}]))
    assert groups == [{"_id": 0, "total": 135}, {"_id": 1, "total": 145}, {"_id": 2, "total": 155}]
    assert coll.distinct("g") == [0, 1, 2]
    assert coll.find_one({"_id": 4}, {"x": 1, "_id": 0}) == {"x": 4}


def test_unique_index_violation(coll: Any) -> None:
    coll.create_index([("email", ASCENDING)], unique=True)
    coll.insert_one({"email": "a@example.com"})
    with pytest.raises(DuplicateKeyError) as excinfo:
        coll.insert_one({"email": "a@example.com"})
    assert excinfo.value.code == 11000
    assert excinfo.value.details["keyValue"] == {"email": "a@example.com"}
    with pytest.raises(DuplicateKeyError):
        coll.insert_one({"_id": coll.find_one()["_id"]})
    names = [i["name"] for i in coll.list_indexes()]
    assert names == ["_id_", "email_1"]


def test_ordered_batch_stops_at_first_error(coll: Any) -> None:
    with pytest.raises(BulkWriteError) as excinfo:
        coll.insert_many([{"_id": 1}, {"_id": 1}, {"_id": 2}])
    assert excinfo.value.details["nInserted"] == 1
    assert coll.count_documents({}) == 1
    with pytest.raises(BulkWriteError) as excinfo:
        coll.insert_many([{"_id": 1}, {"_id": 3}], ordered=False)
    assert excinfo.value.details["nInserted"] == 1
    assert coll.count_documents({}) == 2


def test_find_one_and_update(coll: Any) -> None:
    coll.insert_one({"_id": "c", "seq": 0})
    doc = coll.find_one_and_update({"_id": "c"}, {"$inc": {"seq": 1}}, return_document=ReturnDocument.AFTER)
    assert doc == {"_id": "c", "seq": 1}
    assert coll.find_one_and_delete({"_id": "c"}) == {"_id": "c", "seq": 1}


def test_write_concerns_on_one_member(coll: Any) -> None:
    coll.with_options(write_concern=WriteConcern(w=1, j=True)).insert_one({"_id": 1})
    coll.with_options(write_concern=WriteConcern(w="majority", wtimeout=1000)).insert_one({"_id": 2})
    with pytest.raises(WriteConcernError) as excinfo:
        coll.with_options(write_concern=WriteConcern(w=2, wtimeout=100)).insert_one({"_id": 3})
    assert excinfo.value.code == 100
    assert coll.count_documents({}) == 3


def test_errors_have_mongodb_codes(client: MongoClient[dict[str, Any]], coll: Any) -> None:
    with pytest.raises(OperationFailure) as excinfo:
        client.testdb.command("noSuchCommand")
    assert excinfo.value.code == 59
    with pytest.raises(OperationFailure) as excinfo:
        list(coll.find({"a": {"$frob": 1}}))
    assert excinfo.value.code == 2
    coll.insert_one({"_id": 1, "s": "x"})
    with pytest.raises(OperationFailure) as excinfo:
        coll.update_one({"_id": 1}, {"$inc": {"s": 1}})
    assert excinfo.value.code == 14


def test_inc_is_logged_as_set(client: MongoClient[dict[str, Any]], coll: Any) -> None:
    coll.insert_one({"_id": 1, "counter": 1})
    coll.update_one({"_id": 1}, {"$inc": {"counter": 1}})
    oplog = client.local["oplog.rs"]
    entry = oplog.find_one({"ns": coll.full_name, "op": "u"}, sort=[("$natural", -1)])
    assert entry["o"] == {"$set": {"counter": 2}}
    assert entry["o2"] == {"_id": 1}
    assert isinstance(entry["t"], Int64)


def test_catalog_commands(client: MongoClient[dict[str, Any]], coll: Any) -> None:
    coll.insert_one({"_id": 1})
    assert coll.name in client.testdb.list_collection_names()
    assert "testdb" in client.list_database_names()
    assert "oplog.rs" in client.local.list_collection_names()
    status = client.admin.command("replSetGetStatus")
    assert status["set"] == "rs0" and status["myState"] == 1
    assert client.admin.command("buildInfo")["version"]
    server_status = client.admin.command("serverStatus")
    assert {"host", "version", "process", "pid", "uptime"} <= set(server_status)
