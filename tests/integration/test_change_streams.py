"""Change streams through pymongo's `watch()` on a real three-member set: the events of inserts,
updates, replaces and deletes in order; `fullDocument: "updateLookup"`; a resume token taken on one
member resumes on another; a write a majority lacks is not shown until it is committed; a dropped
collection ends its stream with `invalidate`; a resume point older than the oplog is 286."""

from __future__ import annotations

from typing import Any

import pytest
from bson.timestamp import Timestamp
from pymongo import ReadPreference
from pymongo.errors import OperationFailure
from pymongo.write_concern import WriteConcern

from tests.support.replica_set import ReplicaSet

WAIT_MS = 200


def _next(stream: Any, deadline_tries: int = 50) -> dict[str, Any] | None:
    for _ in range(deadline_tries):
        change = stream.try_next()
        if change is not None:
            return change
    return None


def test_watch_shows_each_write_once_in_order(rs: ReplicaSet) -> None:
    coll = rs.client().cs.orders
    with coll.watch(max_await_time_ms=WAIT_MS) as stream:
        coll.insert_one({"_id": 1, "n": 1})
        coll.update_one({"_id": 1}, {"$set": {"n": 2}, "$unset": {"gone": ""}})
        coll.replace_one({"_id": 1}, {"n": 3})
        coll.delete_one({"_id": 1})
        coll.database.other.insert_one({"_id": "elsewhere"})
        changes = [_next(stream) for _ in range(4)]
    assert [c["operationType"] for c in changes if c] == ["insert", "update", "replace", "delete"]
    insert, update, replace, delete = changes
    assert insert["fullDocument"] == {"_id": 1, "n": 1} and insert["documentKey"] == {"_id": 1}
    assert update["updateDescription"]["updatedFields"] == {"n": 2}
    assert replace["fullDocument"] == {"_id": 1, "n": 3}
    assert delete["ns"] == {"db": "cs", "coll": "orders"}
    tokens = [c["_id"]["_data"] for c in changes]
    assert tokens == sorted(tokens) and len(set(tokens)) == 4


def test_update_lookup_and_database_and_cluster_streams(rs: ReplicaSet) -> None:
    client = rs.client()
    coll = client.cs.lookup
    coll.insert_one({"_id": 1, "n": 1, "keep": "me"})
    with coll.watch(full_document="updateLookup", max_await_time_ms=WAIT_MS) as stream, \
            client.cs.watch(max_await_time_ms=WAIT_MS) as db_stream, \
            client.watch(max_await_time_ms=WAIT_MS) as everything:
        coll.update_one({"_id": 1}, {"$inc": {"n": 1}})
        client.cs2.t.insert_one({"_id": "x"})
        change = _next(stream)
        assert change is not None and change["fullDocument"] == {"_id": 1, "n": 2, "keep": "me"}
        assert _next(db_stream)["ns"] == {"db": "cs", "coll": "lookup"}
        seen = [_next(everything), _next(everything)]
        assert [c["ns"]["db"] for c in seen if c] == ["cs", "cs2"]


def test_a_token_resumes_on_another_member(rs: ReplicaSet) -> None:
    client = rs.client()
    coll = client.cs.resume
    with coll.watch(max_await_time_ms=WAIT_MS) as stream:
        coll.insert_many([{"_id": i} for i in range(5)])
        first = _next(stream)
        token = stream.resume_token
    assert first is not None and first["documentKey"] == {"_id": 0}
    secondary = rs.client(readPreference="secondary")
    with secondary.cs.resume.watch(resume_after=token, max_await_time_ms=WAIT_MS) as resumed:
        rest = [_next(resumed) for _ in range(4)]
    assert [c["documentKey"]["_id"] for c in rest if c] == [1, 2, 3, 4]


def test_a_write_a_majority_lacks_is_not_shown_until_committed(rs: ReplicaSet) -> None:
    primary = rs.wait_primary()
    secondaries = [m for m in rs.members if m is not primary]
    coll = rs.direct(primary).cs.pending
    coll.insert_one({"_id": "before"})
    with coll.watch(max_await_time_ms=WAIT_MS) as stream:
        for m in secondaries:
            rs.fail_point(m, "stopReplProducer", "alwaysOn")
        try:
            coll.with_options(write_concern=WriteConcern(w=1)).insert_one({"_id": "later"})
            assert _next(stream, deadline_tries=5) is None
        finally:
            for m in secondaries:
                rs.fail_point(m, "stopReplProducer", "off")
        change = _next(stream)
    assert change is not None and change["documentKey"] == {"_id": "later"}


def test_a_dropped_collection_invalidates_its_stream(rs: ReplicaSet) -> None:
    coll = rs.client().cs.dropped
    coll.insert_one({"_id": 1})
    with coll.watch(max_await_time_ms=WAIT_MS) as stream:
        coll.drop()
        kinds = [(_next(stream) or {}).get("operationType") for _ in range(2)]
        assert kinds == ["drop", "invalidate"]
        assert not stream.alive or _next(stream, deadline_tries=2) is None


def test_a_resume_point_older_than_the_oplog_is_history_lost(rs: ReplicaSet) -> None:
    with pytest.raises(OperationFailure) as caught:
        rs.client().cs.any.watch(start_at_operation_time=Timestamp(1, 1)).try_next()
    assert caught.value.code == 286


def test_a_stream_on_a_secondary(rs: ReplicaSet) -> None:
    client = rs.client()
    on_secondary = client.cs.get_collection("sec", read_preference=ReadPreference.SECONDARY)
    with on_secondary.watch(max_await_time_ms=WAIT_MS) as stream:
        client.cs.sec.insert_one({"_id": 7})
        change = _next(stream)
    assert change is not None and change["documentKey"] == {"_id": 7}


async def test_a_motor_stream_survives_a_killed_primary_and_sees_every_majority_insert_once(
        tmp_path: Any) -> None:
    """w:"majority" inserts while the primary is killed (-9) and comes back: the stream resumes on
    its own (the driver resumes from its last token on the new primary) and shows every acknowledged
    insert exactly once, in the order they were acknowledged."""
    import asyncio

    from motor.motor_asyncio import AsyncIOMotorClient

    from tests.support.replica_set import make_replica_set

    rs = make_replica_set(str(tmp_path), 3)
    client: AsyncIOMotorClient[dict[str, Any]] | None = None
    try:
        await asyncio.to_thread(rs.start)
        await asyncio.to_thread(rs.initiate)
        client = AsyncIOMotorClient(rs.uri, w="majority", retryWrites=True, serverSelectionTimeoutMS=30_000)
        coll = client.cs.survive
        await coll.insert_one({"_id": -1})
        seen: list[int] = []
        acknowledged: list[int] = []
        done = asyncio.Event()

        stream = coll.watch(max_await_time_ms=WAIT_MS)
        await stream.try_next()   # opened before the first insert

        async def watch() -> None:
            try:
                while not done.is_set() or not set(acknowledged) <= set(seen):
                    change = await stream.try_next()
                    if change is not None and change["operationType"] == "insert":
                        seen.append(change["documentKey"]["_id"])
            finally:
                await stream.close()

        watcher = asyncio.get_running_loop().create_task(watch())
        for i in range(120):
            if i == 40:
                primary = await asyncio.to_thread(rs.wait_primary)
                await asyncio.to_thread(primary.kill)
            if i == 80:
                for m in rs.members:
                    if m.process is not None and m.process.poll() is not None:
                        await asyncio.to_thread(m.start)
            try:
                await coll.insert_one({"_id": i})
                acknowledged.append(i)
            except Exception:   # an outcome unknown: it may appear, once
                continue
        done.set()
        try:
            await asyncio.wait_for(watcher, 60)
        except TimeoutError:
            raise AssertionError(f"not seen: {sorted(set(acknowledged) - set(seen))}; seen {seen}") from None
        assert len(seen) == len(set(seen)), "an event came twice"
        assert [i for i in seen if i in set(acknowledged)] == acknowledged
        assert seen == sorted(seen)
    finally:
        if client is not None:
            client.close()
        await asyncio.to_thread(rs.stop)


def test_pre_and_post_images_on_every_member(rs: ReplicaSet) -> None:
    client = rs.client()
    db = client.cs
    db.create_collection("imaged", changeStreamPreAndPostImages={"enabled": True})
    coll = db.imaged.with_options(write_concern=WriteConcern(w=3))
    coll.insert_one({"_id": 1, "n": 1, "keep": True})
    secondary = next(m for m in rs.members if m is not rs.wait_primary())
    on_secondary = rs.direct(secondary).cs.imaged
    opts = {"full_document": "required", "full_document_before_change": "required", "max_await_time_ms": WAIT_MS}
    with coll.watch(**opts) as stream, on_secondary.watch(**opts) as secondary_stream:
        coll.update_one({"_id": 1}, {"$inc": {"n": 1}})
        coll.delete_one({"_id": 1})
        for s in (stream, secondary_stream):
            update, delete = _next(s), _next(s)
            assert update is not None and delete is not None
            assert update["fullDocumentBeforeChange"] == {"_id": 1, "n": 1, "keep": True}
            assert update["fullDocument"] == {"_id": 1, "n": 2, "keep": True}
            assert delete["fullDocumentBeforeChange"] == {"_id": 1, "n": 2, "keep": True}
    # Without pre-images, `required` cannot be met: the stream fails rather than answer without one.
    plain = db.plain
    plain.insert_one({"_id": 1})
    with plain.watch(full_document_before_change="required", max_await_time_ms=WAIT_MS) as stream:
        plain.update_one({"_id": 1}, {"$set": {"x": 1}})
        with pytest.raises(OperationFailure) as missing:
            for _ in range(50):
                stream.try_next()
        assert missing.value.code == 47


def test_a_large_event_comes_in_fragments_with_split_large_event(rs: ReplicaSet) -> None:
    with rs.client() as client:
        db = client.split_events
        client.drop_database("split_events")
        coll = db.create_collection("big", changeStreamPreAndPostImages={"enabled": True})
        coll.insert_one({"_id": 1, "value": "q" * 10 * 1024 * 1024})
        split = [{"$changeStreamSplitLargeEvent": {}}]
        with coll.watch(split, full_document_before_change="required") as stream:
            coll.update_one({"_id": 1}, {"$set": {"value": "z" * 10 * 1024 * 1024}})
            first, second = stream.next(), stream.next()
        assert first["splitEvent"] == {"fragment": 1, "of": 2} and second["splitEvent"] == {"fragment": 2, "of": 2}
        assert first["operationType"] == "update" and second["fullDocumentBeforeChange"]["value"][0] == "q"
        with coll.watch(split, full_document_before_change="required", resume_after=first["_id"]) as resumed:
            assert resumed.next()["splitEvent"] == {"fragment": 2, "of": 2}  # resumed inside the event
        with pytest.raises(OperationFailure) as needs_stage:
            with coll.watch(full_document_before_change="required", resume_after=first["_id"]) as plain:
                plain.next()
        assert needs_stage.value.code == 7182504
        with pytest.raises(OperationFailure) as too_large:  # (without the stage: as mongod, too large)
            with coll.watch(full_document_before_change="required", start_at_operation_time=first["clusterTime"]) as plain:
                plain.next()
        assert too_large.value.code == 10334
        client.drop_database("split_events")
