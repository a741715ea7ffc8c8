"""Views (read-only, non-materialised, defined in system.views through create / collMod / drop),
time-series collections (measurements in buckets, read through a view), `$out` / `$merge` sent to a
secondary and `$rand`, on a real three-member set driven by pymongo."""

from __future__ import annotations

import datetime
from typing import Any

import pytest
from pymongo import ReadPreference
from pymongo.errors import OperationFailure

from tests.support.members import wait_for
from tests.support.replica_set import ReplicaSet


@pytest.fixture()
def db(fresh_db: Any) -> Any:
    fresh_db.src.insert_many([{"_id": i, "x": i, "g": i % 3} for i in range(10)])
    return fresh_db


def test_a_view_reads_its_source_through_its_pipeline(db: Any) -> None:
    db.create_collection("big", viewOn="src", pipeline=[{"$match": {"x": {"$gte": 5}}}])
    db.create_collection("shape", viewOn="big", pipeline=[{"$project": {"g": 1}}])  # a view on a view
    assert db.big.estimated_document_count() == 5
    assert db.big.count_documents({"g": 0}) == 2
    assert [d["_id"] for d in db.big.find({"g": 1}, sort=[("x", -1)])] == [7]
    assert db.big.find_one({"_id": 2}) is None  # (an _id lookup reads through the view too)
    assert db.shape.find_one({"_id": 5}) == {"_id": 5, "g": 2}
    assert db.shape.distinct("g") == [0, 1, 2]
    assert list(db.big.aggregate([{"$group": {"_id": None, "n": {"$sum": "$x"}}}])) == [{"_id": None, "n": 35}]
    joined = db.src.aggregate([{"$lookup": {"from": "big", "localField": "_id", "foreignField": "_id", "as": "v"}},
                               {"$match": {"v": {"$ne": []}}}, {"$count": "n"}])
    assert list(joined) == [{"n": 5}]
    db.src.insert_one({"_id": 10, "x": 10, "g": 1})  # not materialised: the view sees it at once
    assert db.big.count_documents({}) == 6
    listed = {c["name"]: c for c in db.list_collections()}
    assert listed["big"]["type"] == "view" and listed["big"]["info"]["readOnly"] is True
    assert listed["big"]["options"] == {"viewOn": "src", "pipeline": [{"$match": {"x": {"$gte": 5}}}]}
    assert listed["src"]["type"] == "collection"


def test_a_view_is_the_same_on_every_member_and_changes_and_goes_through_the_log(rs: ReplicaSet, db: Any) -> None:
    db.create_collection("low", viewOn="src", pipeline=[{"$match": {"x": {"$lt": 3}}}])
    db.command("collMod", "low", viewOn="src", pipeline=[{"$match": {"x": {"$lt": 2}}}])
    db.src.insert_one({"_id": 11, "x": 0, "g": 0})  # (w:3: every member has the view's change too)
    for member in rs.members:
        with rs.direct(member) as direct:
            reader = direct.get_database(db.name, read_preference=ReadPreference.SECONDARY_PREFERRED)
            assert sorted(d["_id"] for d in reader.low.find()) == [0, 1, 11]
    db.low.drop()
    assert "low" not in db.list_collection_names()
    with rs.direct(rs.wait_primary()) as direct:
        creates = list(direct.local["oplog.rs"].find({"ns": f"{db.name}.$cmd", "o.create": "low"}))
    assert creates and creates[0]["o"]["viewOn"] == "src"


def test_writes_and_unsupported_reads_on_a_view_are_refused(db: Any) -> None:
    db.create_collection("v", viewOn="src", pipeline=[])
    refusals = [
        lambda: db.v.insert_one({"x": 1}),
        lambda: db.v.update_one({}, {"$set": {"y": 1}}),
        lambda: db.v.delete_many({}),
        lambda: db.v.find_one_and_delete({}),
        lambda: db.v.create_index("x"),
        lambda: db.v.watch(),
        lambda: list(db.src.aggregate([{"$out": "v"}])),
    ]
    for refused in refusals:
        with pytest.raises(OperationFailure) as err:
            refused()
        assert err.value.code == 166
    with pytest.raises(OperationFailure) as direct_write:
        db.system.views.insert_one({"_id": f"{db.name}.w", "viewOn": "src", "pipeline": []})
    assert direct_write.value.code == 73
    for clash in ({"create": "src", "viewOn": "x", "pipeline": []}, {"create": "v"}):
        with pytest.raises(OperationFailure) as exists:
            db.command(clash)
        assert exists.value.code == 48
    with pytest.raises(OperationFailure) as bad_stage:
        db.command("create", "w", viewOn="src", pipeline=[{"$out": "elsewhere"}])
    assert bad_stage.value.code == 166
    assert db.src.count_documents({}) == 10  # nothing was written anywhere


def test_out_and_merge_sent_to_a_secondary_write_through_the_primary(rs: ReplicaSet, db: Any) -> None:
    primary = rs.wait_primary()
    secondary = next(m for m in rs.members if m is not primary)
    with rs.direct(secondary) as direct:
        on_secondary = direct.get_database(db.name, read_preference=ReadPreference.SECONDARY_PREFERRED)
        assert on_secondary.command("hello")["isWritablePrimary"] is False
        on_secondary.command("aggregate", "src", pipeline=[{"$match": {"x": {"$gte": 7}}}, {"$out": "copied"}],
                             cursor={}, writeConcern={"w": 3})
        reply = on_secondary.command("aggregate", "src", pipeline=[{"$match": {"x": 0}}, {"$merge": {"into": "copied"}}],
                                     cursor={}, writeConcern={"w": 1})
        # Answered once this member applied the write (a causal read here after it sees it), at its time.
        assert sorted(d["_id"] for d in on_secondary.copied.find()) == [0, 7, 8, 9]
        assert reply["operationTime"] >= on_secondary.command("find", "copied")["operationTime"]
    assert sorted(d["_id"] for d in db.copied.find()) == [0, 7, 8, 9]
    with pytest.raises(OperationFailure) as malformed:  # (the member-only command checks what it is sent)
        db.command({"_aggregateOutput": "copied", "kind": "$merge", "on": "_id", "documents": []})
    assert malformed.value.code == 9


def test_rand_in_an_update_logs_the_value_drawn(rs: ReplicaSet, db: Any) -> None:
    db.src.update_many({}, [{"$set": {"r": {"$rand": {}}}}])
    drawn = {d["_id"]: d["r"] for d in db.src.find()}
    assert all(0 <= r < 1 for r in drawn.values()) and len(set(drawn.values())) == 10
    for member in rs.members:  # the oplog carries the results: every member holds the same numbers
        with rs.direct(member) as direct:
            reader = direct.get_database(db.name, read_preference=ReadPreference.SECONDARY_PREFERRED)
            assert {d["_id"]: d["r"] for d in reader.src.find()} == drawn


def test_a_time_series_collection_keeps_measurements_in_buckets(rs: ReplicaSet, fresh_db: Any) -> None:
    db = fresh_db
    db.create_collection("weather", timeseries={"timeField": "time", "metaField": "sensor", "granularity": "minutes"})
    t0 = datetime.datetime(2026, 12, 1, 10, 0)
    # Measurements need no unique _id: two share one here.
    db.weather.insert_many([{"_id": 1, "time": t0, "sensor": {"id": "a"}, "temp": 20},
                            {"_id": 1, "time": t0 + datetime.timedelta(minutes=5), "sensor": {"id": "a"}, "temp": 22}])
    db.weather.insert_many([{"time": t0 + datetime.timedelta(minutes=i), "sensor": {"id": "b"}, "temp": i}
                            for i in range(10)])
    assert db.weather.count_documents({}) == 12
    assert [d["temp"] for d in db.weather.find({"sensor.id": "a"}, sort=[("time", -1)])] == [22, 20]
    totals = db.weather.aggregate([{"$group": {"_id": "$sensor.id", "sum": {"$sum": "$temp"}}}, {"$sort": {"_id": 1}}])
    assert list(totals) == [{"_id": "a", "sum": 42}, {"_id": "b", "sum": 45}]
    assert db.system.buckets.weather.count_documents({}) == 2  # one bucket per sensor
    listed = {c["name"]: c for c in db.list_collections()}
    assert listed["weather"]["type"] == "timeseries"
    assert listed["weather"]["options"]["timeseries"]["timeField"] == "time"
    for member in rs.members:
        with rs.direct(member) as direct:
            reader = direct.get_database(db.name, read_preference=ReadPreference.SECONDARY_PREFERRED)
            assert reader.weather.count_documents({}) == 12
    with pytest.raises(OperationFailure) as no_time:
        db.weather.insert_one({"sensor": {"id": "a"}, "temp": 1})
    assert no_time.value.code == 2
    with pytest.raises(OperationFailure) as update:
        db.weather.update_many({}, {"$set": {"temp": 0}})
    assert update.value.code == 72
    with pytest.raises(OperationFailure) as dotted:  # (a bucket's columns are paths)
        db.weather.insert_one({"time": t0, "sensor": {"id": "a"}, "a.b": 1})
    assert dotted.value.code == 2
    with pytest.raises(OperationFailure) as coll_mod:
        db.command("collMod", "weather", viewOn="x", pipeline=[])
    assert coll_mod.value.code == 72
    assert db.weather.count_documents({}) == 12
    db.weather.drop()
    assert not [n for n in db.list_collection_names() if "weather" in n]


def test_a_time_series_collection_expires_old_buckets(set_client: Any, fresh_db: Any) -> None:
    db = fresh_db
    db.create_collection("events", timeseries={"timeField": "at"}, expireAfterSeconds=3600)
    now = datetime.datetime.now(datetime.UTC).replace(tzinfo=None)
    db.events.insert_many([{"at": now - datetime.timedelta(days=2), "n": 1}, {"at": now, "n": 2}])
    _wait_for_expiry(set_client, lambda: [d["n"] for d in db.events.find()] == [2], "the old measurement's bucket")


def test_a_clustered_collection_reads_in_id_order_and_expires_by_id(set_client: Any, fresh_db: Any) -> None:
    db = fresh_db
    db.create_collection("byid", clusteredIndex={"key": {"_id": 1}, "unique": True, "name": "by id"})
    db.byid.insert_many([{"_id": i} for i in (5, 3, 9, 1)])
    assert [d["_id"] for d in db.byid.find()] == [1, 3, 5, 9]  # natural order is _id order
    assert [d["_id"] for d in db.byid.find().sort("$natural", -1)] == [9, 5, 3, 1]
    [listed] = db.list_collections(filter={"name": "byid"})
    assert listed["options"]["clusteredIndex"] == {"v": 2, "key": {"_id": 1}, "name": "by id", "unique": True}
    assert [i["name"] for i in db.byid.list_indexes()] == ["by id"]
    assert [d["_id"] for d in db.byid.find().hint("by id")] == [1, 3, 5, 9]
    assert db.byid.find_one_and_delete({})["_id"] == 1  # (the first in natural order: by _id)
    with pytest.raises(OperationFailure):
        db.command("create", "notclustered", expireAfterSeconds=5)  # (expiry by _id needs clustering)
    now = datetime.datetime.now(datetime.UTC).replace(tzinfo=None)
    db.create_collection("logs", clusteredIndex={"key": {"_id": 1}, "unique": True}, expireAfterSeconds=3600)
    db.logs.insert_many([{"_id": now - datetime.timedelta(days=1), "n": 1}, {"_id": now, "n": 2}])
    _wait_for_expiry(set_client, lambda: [d["n"] for d in db.logs.find()] == [2], "the day-old document")


def _wait_for_expiry(client: Any, expired: Any, what: str) -> None:
    """Waits, with the TTL monitor running every second meanwhile, until `expired()`."""
    previous = client.admin.command("setParameter", 1, ttlMonitorSleepSecs=1)["was"]
    try:
        wait_for(expired, 30, f"{what} to expire")
    finally:
        client.admin.command("setParameter", 1, ttlMonitorSleepSecs=previous)
