"""Aggregation stages that write or read other collections, and explain, through pymongo on a real
set: `$out` replaces a collection on every member in one entry batch, `$merge` merges by `_id`,
`$lookup` joins, a pipeline-style update is logged as its result, and `explain` names the plan
the member really runs."""

from __future__ import annotations

import pytest
from pymongo.errors import OperationFailure
from pymongo.write_concern import WriteConcern

from tests.support.replica_set import ReplicaSet


def test_out_merge_and_lookup(rs: ReplicaSet) -> None:
    db = rs.client().stages
    db.orders.drop()
    db.orders.insert_many([{"_id": i, "item": "ab"[i % 2], "qty": i} for i in range(6)])
    db.totals.insert_one({"_id": "stale"})
    db.orders.aggregate([{"$group": {"_id": "$item", "qty": {"$sum": "$qty"}}}, {"$out": "totals"}])
    assert sorted((d["_id"], d["qty"]) for d in db.totals.find()) == [("a", 6), ("b", 9)]
    db.orders.aggregate([{"$match": {"item": "a"}}, {"$project": {"_id": "$item", "orders": {"$literal": 1}}},
                         {"$limit": 1}, {"$merge": {"into": "totals", "whenMatched": "merge"}}])
    assert db.totals.find_one({"_id": "a"}) == {"_id": "a", "qty": 6, "orders": 1}
    with pytest.raises(OperationFailure) as failed:
        db.orders.aggregate([{"$project": {"_id": "$item"}}, {"$limit": 1},
                             {"$merge": {"into": "totals", "whenMatched": "fail"}}])
    assert failed.value.code == 11000
    joined = list(db.totals.aggregate([{"$sort": {"_id": 1}}, {"$lookup": {
        "from": "orders", "localField": "_id", "foreignField": "item", "as": "lines"}}]))
    assert [len(d["lines"]) for d in joined] == [3, 3]
    # Every member holds the same result (the entries replicate like any write).
    db.barrier.with_options(write_concern=WriteConcern(w=3)).insert_one({})
    for m in rs.members:
        assert sorted(d["_id"] for d in rs.direct(m).stages.totals.find()) == ["a", "b"]


def test_a_pipeline_update_is_logged_as_its_result(rs: ReplicaSet) -> None:
    client = rs.client()
    coll = client.stages.pipelined
    coll.insert_one({"_id": 1, "a": 2, "drop": True})
    coll.update_one({"_id": 1}, [{"$set": {"b": {"$multiply": ["$a", 10]}}}, {"$unset": "drop"}])
    assert coll.find_one() == {"_id": 1, "a": 2, "b": 20}
    entry = client.local["oplog.rs"].find_one({"ns": "stages.pipelined", "op": "u"}, sort=[("$natural", -1)])
    assert entry is not None and entry["o"] == {"$set": {"b": 20}, "$unset": {"drop": True}}


def test_explain_names_the_plan_the_member_runs(rs: ReplicaSet) -> None:
    coll = rs.client().stages.plans
    coll.insert_many([{"_id": i, "a": i % 3} for i in range(9)])
    by_id = coll.find({"_id": 4}).explain()
    assert by_id["queryPlanner"]["winningPlan"] == {"stage": "IDHACK"}
    assert by_id["executionStats"]["totalDocsExamined"] == 1
    scan = coll.find({"a": 1}).sort("a", 1).explain()
    assert scan["queryPlanner"]["winningPlan"]["inputStage"]["stage"] == "COLLSCAN"
    assert (scan["executionStats"]["nReturned"], scan["executionStats"]["totalDocsExamined"]) == (3, 9)


def test_database_level_aggregates(rs: ReplicaSet) -> None:
    client = rs.client()
    with client.start_session() as session:
        client.stages.anything.find_one({}, session=session)
        listed = list(client.admin.aggregate([{"$listLocalSessions": {}}]))
        assert session.session_id["id"] in [entry["_id"]["id"] for entry in listed]
    docs = list(client.stages.aggregate([{"$documents": [{"x": 1}, {"x": 2}]}, {"$match": {"x": 2}}]))
    assert docs == [{"x": 2}]
    with pytest.raises(OperationFailure) as refused:
        client.stages.aggregate([{"$match": {}}])
    assert refused.value.code == 73


def test_validate_reads_a_collection_back(rs: ReplicaSet) -> None:
    db = rs.client().stages
    db.checked.insert_many([{"_id": i, "a": i, "tags": [1, 2]} for i in range(5)])
    db.checked.create_index("a", unique=True)
    db.checked.create_index("tags")
    result = db.command("validate", "checked")
    assert result["valid"] and result["errors"] == []
    assert (result["nrecords"], result["keysPerIndex"]) == (5, {"_id_": 5, "a_1": 5, "tags_1": 10})
    with pytest.raises(OperationFailure) as missing:
        db.command("validate", "no_such_collection")
    assert missing.value.code == 26
