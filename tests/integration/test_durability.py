"""Acknowledged writes survive kill -9; retried writes run once."""

from __future__ import annotations

import uuid
from collections.abc import Callable

import pytest
from bson.binary import Binary
from bson.int64 import Int64
from pymongo import MongoClient
from pymongo.write_concern import WriteConcern

from tests.support.members import Member


@pytest.fixture()
def fresh_member(start_member: Callable[..., Member]) -> Member:
    return start_member()


def test_kill_9_after_j_true_ack_keeps_the_data(fresh_member: Member) -> None:
    with MongoClient(fresh_member.uri, serverSelectionTimeoutMS=10000) as client:
        coll = client.db.get_collection("c", write_concern=WriteConcern(w=1, j=True))
        coll.insert_many([{"_id": i, "v": "x" * 100} for i in range(500)])
        coll.update_one({"_id": 7}, {"$set": {"v": "changed"}})
        coll.delete_one({"_id": 8})
        coll.create_index("v")
    fresh_member.kill()
    fresh_member.start()
    fresh_member.wait_primary()
    with MongoClient(fresh_member.uri, serverSelectionTimeoutMS=10000) as client:
        coll = client.db.c
        assert coll.count_documents({}) == 499
        assert coll.find_one({"_id": 7})["v"] == "changed"
        assert coll.find_one({"_id": 8}) is None
        assert [i["name"] for i in coll.list_indexes()] == ["_id_", "v_1"]
        coll.insert_one({"_id": 1000})  # still a writable primary after restart
        hello = client.admin.command("hello")
        assert hello["electionId"].binary[4:] > bytes(8)  # a new term after the restart


def test_retried_write_returns_the_original_result(fresh_member: Member) -> None:
    lsid = {"id": Binary(uuid.uuid4().bytes, 4)}
    with fresh_member.direct_client() as client:
        db = client.db
        db.counters.insert_one({"_id": 1, "n": 0})
        cmd = {"update": "counters", "updates": [{"q": {"_id": 1}, "u": {"$inc": {"n": 1}}}],
               "lsid": lsid, "txnNumber": Int64(5)}
        first = db.command(dict(cmd))
        again = db.command(dict(cmd))
        assert first["nModified"] == again["nModified"] == 1
        assert db.counters.find_one({"_id": 1})["n"] == 1  # ran once
        older = dict(cmd, txnNumber=Int64(4))
        with pytest.raises(Exception) as excinfo:
            db.command(older)
        assert getattr(excinfo.value, "code", None) == 225
        # The driver sends its own session id with the command; the record is keyed by it.
        entry = client.local["oplog.rs"].find_one({"ns": "db.counters", "op": "u"})
        assert entry["txnNumber"] == 5 and entry["o"] == {"$set": {"n": 1}}
        record = client.config.transactions.find_one({"_id": entry["lsid"]})
        assert record["txnNum"] == 5 and record["reply"]["nModified"] == 1


def test_writes_on_an_uninitiated_member_fail_with_not_writable_primary(
        start_member: Callable[..., Member]) -> None:
    m = start_member(initiate=False)
    with m.direct_client() as client:
        hello = client.admin.command("hello")
        assert hello["isWritablePrimary"] is False and hello["isreplicaset"] is True
        with pytest.raises(Exception) as excinfo:
            client.db.command({"insert": "c", "documents": [{"_id": 1}], "lsid": {"id": Binary(
                uuid.uuid4().bytes, 4)}, "txnNumber": Int64(1)})
        details = excinfo.value.details  # type: ignore[attr-defined]
        assert details["code"] == 10107 and details["codeName"] == "NotWritablePrimary"
        assert "RetryableWriteError" in details["errorLabels"]
    with m.direct_client() as client:
        with pytest.raises(Exception) as excinfo:
            client.admin.command("replSetGetStatus")
        assert getattr(excinfo.value, "code", None) == 94
