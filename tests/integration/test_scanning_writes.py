"""Updates, deletes and findAndModify whose filter is not an `_id` find their documents off the event
loop, then apply themselves to those documents in small commits, with the results mongod gives."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from pymongo import ReturnDocument
from pymongo.errors import ExecutionTimeout, OperationFailure

from replset.wire.write_batches import MULTI_SLICE, WRITE_SLICE
from tests.support.members import Member

N = MULTI_SLICE * 3 + WRITE_SLICE + 31


@pytest.fixture()
def coll(member: Member, request: pytest.FixtureRequest) -> Any:
    client = member.direct_client()
    collection = client.test[f"scan_{request.node.name[:40]}"]
    collection.drop()
    collection.insert_many([{"_id": i, "k": i % 3, "s": "a" * 40 + "!" if i == 7 else "x"} for i in range(N)])
    yield collection
    client.close()


def test_update_many_over_several_commits(coll: Any) -> None:
    result = coll.update_many({"k": {"$gte": 0}}, {"$set": {"seen": True}})
    assert (result.matched_count, result.modified_count) == (N, N)
    assert coll.count_documents({"seen": True}) == N
    result = coll.update_many({"k": 1}, {"$inc": {"n": 1}})
    assert result.matched_count == len([i for i in range(N) if i % 3 == 1])


def test_update_one_by_a_field_and_its_upsert(coll: Any) -> None:
    result = coll.update_one({"k": 2}, {"$set": {"one": 1}})
    assert (result.matched_count, result.modified_count) == (1, 1)
    assert coll.count_documents({"one": 1}) == 1
    result = coll.update_one({"k": 99}, {"$set": {"made": True}}, upsert=True)
    assert result.matched_count == 0 and result.upserted_id is not None
    assert coll.find_one({"_id": result.upserted_id}) == {"_id": result.upserted_id, "k": 99, "made": True}
    result = coll.update_many({"k": 98}, {"$set": {"many": True}}, upsert=True)
    assert result.upserted_id is not None and coll.count_documents({"k": 98}) == 1


def test_delete_many_and_delete_one_by_a_field(coll: Any) -> None:
    assert coll.delete_one({"k": 0}).deleted_count == 1
    remaining = len([i for i in range(N) if i % 3 == 0]) - 1
    assert coll.delete_many({"k": 0}).deleted_count == remaining
    assert coll.count_documents({"k": 0}) == 0


def test_write_errors_keep_the_batch_going_unordered(coll: Any) -> None:
    reply = coll.database.command({"delete": coll.name, "ordered": False, "deletes": [
        {"q": {"k": {"$bogus": 1}}, "limit": 0}, {"q": {"k": 1}, "limit": 1}]})
    assert reply["n"] == 1
    assert [(e["index"], e["code"]) for e in reply["writeErrors"]] == [(0, 2)]


def test_a_catastrophic_regex_in_a_write_ends_with_an_error(coll: Any) -> None:
    reply = coll.database.command({"delete": coll.name, "deletes": [
        {"q": {"s": {"$regex": "^(a|aa)+$"}}, "limit": 0}]})
    assert reply["n"] == 0 and reply["writeErrors"][0]["code"] == 2  # the regex's budget
    with pytest.raises((ExecutionTimeout, OperationFailure)) as err:
        coll.database.command({"update": coll.name, "maxTimeMS": 300, "updates": [
            {"q": {"s": {"$regex": "^(a|aa)+$"}}, "u": {"$set": {"z": 1}}, "multi": True}]})
    assert err.value.code == 50
    assert coll.count_documents({"z": 1}) == 0


def test_find_and_modify_as_a_job_queue_under_contention(coll: Any) -> None:
    coll.update_many({}, {"$set": {"state": "ready"}})
    taken: list[list[Any]] = [[] for _ in range(4)]

    def worker(k: int) -> None:
        while True:
            doc = coll.find_one_and_update({"state": "ready"}, {"$set": {"state": "taken", "by": k}},
                                           sort=[("k", 1)], return_document=ReturnDocument.AFTER)
            if doc is None:
                return
            taken[k].append(doc["_id"])

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    ids = [i for part in taken for i in part]
    assert sorted(ids) == list(range(N))  # every job taken exactly once, none left behind
    assert coll.count_documents({"state": "ready"}) == 0
    for k, part in enumerate(taken):
        assert coll.count_documents({"by": k}) == len(part)


def test_a_multi_statement_stops_at_its_first_error_in_an_unordered_batch(coll: Any) -> None:
    coll.create_index("u", unique=True, sparse=True)
    reply = coll.database.command({"update": coll.name, "ordered": False, "updates": [
        {"q": {"k": {"$gte": 0}}, "u": {"$set": {"u": 5}}, "multi": True},
        {"q": {"_id": 1}, "u": {"$set": {"after": True}}}]})
    assert [(e["index"], e["code"]) for e in reply["writeErrors"]] == [(0, 11000)]  # once, not per commit
    assert coll.count_documents({"u": 5}) <= 1
    assert coll.find_one({"_id": 1})["after"] is True  # the batch went on with the next statement
