"""TTL indexes expire documents on every member through ordinary deletes (collMod changes their
`expireAfterSeconds` everywhere); case-insensitive collations work in filters, sorts and distinct;
what this member does not
implement is refused at once with MongoDB's codes instead of being accepted and ignored."""

from __future__ import annotations

import datetime

import pytest
from pymongo.errors import OperationFailure
from pymongo.write_concern import WriteConcern

from tests.support.members import wait_for
from tests.support.replica_set import ReplicaSet


def test_a_ttl_index_removes_expired_documents_on_every_member(rs: ReplicaSet) -> None:
    client = rs.client()
    primary = rs.direct(rs.wait_primary())
    coll = client.ttl.sessions.with_options(write_concern=WriteConcern(w=3))
    now = datetime.datetime.now(datetime.UTC).replace(tzinfo=None)
    past, future = now - datetime.timedelta(seconds=30), now + datetime.timedelta(hours=1)
    coll.insert_many([{"_id": "old", "d": past}, {"_id": "new", "d": future}, {"_id": "no date", "d": "x"},
                      {"_id": "none"}, {"_id": "array", "d": [future, past]}])
    coll.create_index("d", expireAfterSeconds=3600)  # nothing is an hour old: collMod shortens it below
    was = primary.admin.command("setParameter", 1, ttlMonitorSleepSecs=1)["was"]
    try:
        changed = client.ttl.command("collMod", "sessions", index={"keyPattern": {"d": 1}, "expireAfterSeconds": 1})
        assert (changed["expireAfterSeconds_old"], changed["expireAfterSeconds_new"]) == (3600, 1)
        def remaining(member_client: object) -> set[str]:
            return {d["_id"] for d in member_client.ttl.sessions.find()}  # type: ignore[attr-defined]

        kept = {"new", "no date", "none"}
        for m in rs.members:
            direct = rs.direct(m)
            wait_for(lambda direct=direct: remaining(direct) == kept, 30, f"expired documents gone on {m.host}")
            assert direct.ttl.sessions.index_information()["d_1"]["expireAfterSeconds"] == 1
    finally:
        primary.admin.command("setParameter", 1, ttlMonitorSleepSecs=was)
    deletes = {e["o"]["_id"] for e in client.local["oplog.rs"].find({"op": "d", "ns": "ttl.sessions"})}
    assert deletes == {"old", "array"}


def test_a_case_insensitive_collation_in_find_sort_update_and_distinct(rs: ReplicaSet) -> None:
    coll = rs.client().collation.words
    coll.insert_many([{"_id": 1, "w": "apple"}, {"_id": 2, "w": "Banana"}, {"_id": 3, "w": "APPLE"},
                      {"_id": 4, "w": "cherry"}, {"_id": 5, "w": "Éclair"}])
    ci = {"locale": "en", "strength": 2}
    assert sorted(d["_id"] for d in coll.find({"w": "Apple"}, collation=ci)) == [1, 3]
    assert [d["w"] for d in coll.find({}, collation=ci).sort("w", 1)][:3] == ["apple", "APPLE", "Banana"]
    assert [d["_id"] for d in coll.find({"w": "eclair"}, collation={"locale": "fr", "strength": 1})] == [5]
    assert coll.update_many({"w": "apple"}, {"$set": {"fruit": True}}, collation=ci).modified_count == 2
    assert sorted(coll.distinct("w", {"fruit": True}, collation=ci)) in (["APPLE"], ["apple"])
    assert coll.count_documents({"w": "BANANA"}, collation=ci) == 1
    assert coll.count_documents({"w": "BANANA"}) == 0  # no collation: bytes


def test_a_validator_refuses_invalid_writes_on_the_primary_and_replicates(rs: ReplicaSet) -> None:
    from pymongo.errors import WriteError

    db = rs.client().validated
    schema = {"$jsonSchema": {"bsonType": "object", "required": ["name"],
                              "properties": {"age": {"bsonType": "int", "minimum": 0}}}}
    db.create_collection("people", validator=schema)
    people = db.people.with_options(write_concern=WriteConcern(w=3))
    people.insert_one({"_id": 1, "name": "ann", "age": 3})
    with pytest.raises(WriteError) as refused:
        people.insert_one({"_id": 2, "age": 3})
    assert refused.value.code == 121 and refused.value.details["errInfo"]["failingDocumentId"] == 2
    with pytest.raises(WriteError):
        people.update_one({"_id": 1}, {"$set": {"age": -1}})
    people.insert_one({"_id": 3}, bypass_document_validation=True)
    db.command("collMod", "people", validationLevel="moderate", writeConcern={"w": 3})
    people.update_one({"_id": 3}, {"$set": {"age": 9}})  # invalid before: moderate lets it be updated
    for m in rs.members:
        options = next(rs.direct(m).validated.list_collections(filter={"name": "people"}))["options"]
        assert options["validator"] == schema and options["validationLevel"] == "moderate"
        assert sorted(d["_id"] for d in rs.direct(m).validated.people.find()) == [1, 3]


@pytest.mark.parametrize(("command", "code"), [
    ({"createIndexes": "r", "indexes": [{"key": {"body": "text"}, "name": "body_text"}]}, 67),
    ({"createIndexes": "r", "indexes": [{"key": {"at": 1}, "name": "at_1", "hidden": True}]}, 67),
    ({"createIndexes": "r", "indexes": [{"key": {"a": 1, "b": 1}, "name": "ab", "expireAfterSeconds": 5}]}, 67),
    ({"create": "v", "viewOn": "r", "pipeline": [], "collation": {"locale": "en"}}, 2),  # a view's own collation
    ({"create": "capped", "timeseries": {"timeField": "t"}, "validator": {"a": 1}}, 115),
    ({"create": "v", "viewOn": "system.buckets.r", "pipeline": []}, 2),  # (a time-series collection's buckets)
    ({"collMod": "r", "viewOn": "x", "pipeline": []}, 115),  # (a collection does not become a view)
    ({"find": "r", "filter": {"$where": "true"}}, 2),
    ({"create": "bad_validator", "validator": {"$jsonSchema": {"format": "email"}}}, 2),
    ({"find": "r", "filter": {"a": "x"}, "collation": {"locale": "en", "strength": 4}}, 2),
    ({"update": "r", "updates": [{"q": {}, "u": {"$set": {"a": 1}},
                                  "collation": {"locale": "fr", "numericOrdering": True}}]}, 2),
    ({"createIndexes": "r", "indexes": [{"key": {"a": 1}, "name": "a_ci", "collation": {"locale": "en"}}]}, 2),
    ({"aggregate": "r", "pipeline": [{"$match": {}}, {"$out": "o"}, {"$match": {}}], "cursor": {}}, 40601),
    # An update statement's sort is 8.0's; this server answers as the 7.0 it reports.
    ({"update": "r", "updates": [{"q": {}, "u": {"$set": {"a": 1}}, "sort": {"_id": -1}}]}, 40415),
])
def test_what_is_not_implemented_is_refused(rs: ReplicaSet, command: dict[str, object], code: int) -> None:
    db = rs.client().refusals
    db.r.insert_one({})
    with pytest.raises(OperationFailure) as refused:
        db.command(command)
    assert refused.value.code == code
    assert "v" not in db.list_collection_names() and "capped" not in db.list_collection_names()


def test_the_max_time_always_times_out_fail_point(rs: ReplicaSet) -> None:
    """MongoDB's `maxTimeAlwaysTimeOut`: a command that sets maxTimeMS fails with MaxTimeMSExpired at once,
    one without it runs; off again, nothing times out."""
    from pymongo.errors import ExecutionTimeout

    coll = rs.client().refusals.timed
    coll.insert_one({"_id": 1})
    rs.fail_point(rs.wait_primary(), "maxTimeAlwaysTimeOut", "alwaysOn")
    try:
        with pytest.raises(ExecutionTimeout) as timed_out:
            list(coll.find().max_time_ms(60_000))
        assert timed_out.value.code == 50
        assert list(coll.find()) == [{"_id": 1}]
    finally:
        rs.fail_point(rs.wait_primary(), "maxTimeAlwaysTimeOut", "off")
    assert list(coll.find().max_time_ms(60_000)) == [{"_id": 1}]
