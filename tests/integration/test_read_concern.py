"""Read concerns on a real three-member set, through pymongo: a `majority` or `linearizable` read never
returns a write a majority does not hold (the secondaries stop fetching, a w:1 write lands on the
primary alone); it returns the write once they fetch again; `linearizable` is refused on a
secondary; every reply carries `$clusterTime` and `operationTime`; a causally consistent session
reads its own write on a secondary that had not applied it yet (the read waits for it)."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from bson.timestamp import Timestamp
from pymongo import ReadPreference
from pymongo.errors import ExecutionTimeout, NotPrimaryError, OperationFailure
from pymongo.read_concern import ReadConcern
from pymongo.write_concern import WriteConcern

from tests.support.members import Member
from tests.support.replica_set import ReplicaSet


def _secondaries(rs: ReplicaSet, primary: Member) -> list[Member]:
    return [m for m in rs.members if m is not primary]


@contextlib.contextmanager
def fetching_stopped(rs: ReplicaSet, primary: Member) -> Iterator[list[Member]]:
    """The primary's secondaries with their fetchers stopped (heartbeats go on, so the primary stays
    primary); fetching again afterwards."""
    secondaries = _secondaries(rs, primary)
    for m in secondaries:
        rs.fail_point(m, "stopReplProducer", "alwaysOn")
    try:
        yield secondaries
    finally:
        for m in secondaries:
            rs.fail_point(m, "stopReplProducer", "off")


def test_majority_and_linearizable_reads_never_return_a_write_a_majority_lacks(rs: ReplicaSet) -> None:
    primary = rs.wait_primary()
    db = rs.direct(primary).rc
    db.dirty.insert_one({"_id": "before"})
    with fetching_stopped(rs, primary) as secondaries:
        _reads_wait_for_a_majority(rs, db, secondaries)


def _reads_wait_for_a_majority(rs: ReplicaSet, db: Any, secondaries: list[Member]) -> None:
    db.dirty.with_options(write_concern=WriteConcern(w=1)).insert_one({"_id": "alone", "n": 1})
    assert db.dirty.find_one({"_id": "alone"}) == {"_id": "alone", "n": 1}   # local: there it is

    majority = db.dirty.with_options(read_concern=ReadConcern("majority"))
    linearizable = db.dirty.with_options(read_concern=ReadConcern("linearizable"))
    for read in (lambda: majority.find_one({"_id": "alone"}, max_time_ms=300),
                 lambda: list(majority.find({}, max_time_ms=300)),
                 lambda: majority.count_documents({}, maxTimeMS=300),
                 lambda: majority.distinct("n", maxTimeMS=300),
                 lambda: db.command({"count": "dirty", "readConcern": {"level": "majority"}, "maxTimeMS": 300}),
                 lambda: linearizable.find_one({"_id": "before"}, max_time_ms=300)):
        with pytest.raises(ExecutionTimeout):
            read()

    for m in secondaries:
        rs.fail_point(m, "stopReplProducer", "off")
    assert majority.find_one({"_id": "alone"}, max_time_ms=20_000) == {"_id": "alone", "n": 1}
    assert linearizable.find_one({"_id": "alone"}, max_time_ms=20_000) == {"_id": "alone", "n": 1}
    assert majority.count_documents({}, maxTimeMS=20_000) == 2


def test_a_majority_read_answers_from_the_committed_snapshot_without_waiting_for_newer_writes(
        rs: ReplicaSet) -> None:
    """Majority reads kept coming, so the member keeps committed snapshots: with a write that only the
    primary holds, a majority read answers at once with the data as majority committed (without that
    write), instead of waiting for the write to be committed."""
    primary = rs.wait_primary()
    db = rs.direct(primary).rc
    db.committed.with_options(write_concern=WriteConcern(w="majority")).insert_one({"_id": "everywhere"})
    majority = db.committed.with_options(read_concern=ReadConcern("majority"))
    assert majority.find_one({"_id": "everywhere"}, max_time_ms=20_000) == {"_id": "everywhere"}
    with fetching_stopped(rs, primary):
        db.committed.with_options(write_concern=WriteConcern(w=1)).insert_one({"_id": "alone"})
        assert [d["_id"] for d in majority.find({}, max_time_ms=5_000)] == ["everywhere"]
        assert majority.find_one({"_id": "alone"}, max_time_ms=5_000) is None
        assert majority.count_documents({}, maxTimeMS=5_000) == 1
        assert majority.distinct("_id", maxTimeMS=5_000) == ["everywhere"]
        assert db.committed.count_documents({}) == 2  # local: both
    db.committed.with_options(write_concern=WriteConcern(w="majority", wtimeout=20_000)).insert_one({"_id": "after"})
    assert sorted(majority.distinct("_id", maxTimeMS=20_000)) == ["after", "alone", "everywhere"]


def test_linearizable_on_a_secondary_is_refused_as_not_primary(rs: ReplicaSet) -> None:
    primary = rs.wait_primary()
    secondary = _secondaries(rs, primary)[0]
    db = rs.direct(secondary).rc
    with pytest.raises((NotPrimaryError, OperationFailure)) as caught:
        db.command({"find": "any", "readConcern": {"level": "linearizable"}},
                   read_preference=ReadPreference.SECONDARY_PREFERRED)
    assert caught.value.details is not None and caught.value.details["code"] == 10107


@pytest.mark.parametrize(("concern", "code"), [
    ({"level": "strong"}, 9),
    ({"level": "linearizable", "afterClusterTime": Timestamp(1, 1)}, 72),
    ({"level": "majority", "atClusterTime": Timestamp(1, 1)}, 72),
    ({"level": "snapshot", "atClusterTime": Timestamp(1, 1)}, 239),  # no snapshot kept at that time
    ({"afterClusterTime": "yesterday"}, 9),
    ({"level": "majority", "afterClusterTime": Timestamp(2**31, 1)}, 72),   # past the cluster time
])
def test_read_concerns_it_cannot_serve_get_mongods_codes(rs: ReplicaSet, concern: dict[str, Any],
                                                         code: int) -> None:
    with pytest.raises(OperationFailure) as caught:
        rs.client().rc.command({"find": "any", "readConcern": concern})
    assert caught.value.code == code


def test_snapshot_reads_see_one_point_in_time_across_commands(rs: ReplicaSet) -> None:
    client = rs.client()
    coll = client.rc.snap
    coll.insert_many([{"_id": i, "v": 0} for i in range(5)])
    with client.start_session(snapshot=True) as session:
        first = coll.find_one({"_id": 0}, session=session)
        coll.update_many({}, {"$set": {"v": 1}})      # after the session's point in time
        coll.insert_one({"_id": "late", "v": 1})
        later = list(coll.find({}, session=session).sort("_id", 1))
        values = coll.distinct("v", session=session)
    assert first == {"_id": 0, "v": 0}
    assert later == [{"_id": i, "v": 0} for i in range(5)] and values == [0]
    assert coll.count_documents({"v": 1}) == 6
    with pytest.raises(OperationFailure) as refused:  # not a read at a point in time
        client.rc.command({"count": "snap", "readConcern": {"level": "snapshot"}})
    assert refused.value.code == 72


def test_replies_carry_cluster_time_and_operation_time(rs: ReplicaSet) -> None:
    client = rs.client()
    with client.start_session() as session:
        client.rc.times.insert_one({"_id": 1}, session=session)
        assert isinstance(session.operation_time, Timestamp)
        assert session.cluster_time is not None
        assert isinstance(session.cluster_time["clusterTime"], Timestamp)
        written = session.operation_time
        reply = client.rc.command({"find": "times", "readConcern": {"level": "majority"}}, session=session)
        assert reply["operationTime"] >= written
    # A cluster time gossiped by a client comes back, newer than any optime.
    ahead = Timestamp(int(time.time()) + 3600, 1)
    primary = rs.direct(rs.wait_primary())
    with primary.start_session() as session:
        session.advance_cluster_time({"clusterTime": ahead, "signature": {"hash": b"\0" * 20, "keyId": 0}})
        primary.admin.command("ping", session=session)
    assert primary.admin.command("ping")["$clusterTime"]["clusterTime"] == ahead


def test_a_causal_session_reads_its_write_on_a_secondary_that_had_not_applied_it(rs: ReplicaSet) -> None:
    primary = rs.wait_primary()
    behind = _secondaries(rs, primary)[0]
    writer = rs.client()
    reader = rs.direct(behind)
    writer.rc.causal.insert_one({"_id": "warm-up"})
    rs.fail_point(behind, "stopReplProducer", "alwaysOn")
    resume = threading.Timer(1.0, lambda: rs.fail_point(behind, "stopReplProducer", "off"))
    try:
        with writer.start_session(causal_consistency=True) as wrote:
            writer.rc.causal.insert_one({"_id": "mine"}, session=wrote)
            with reader.start_session(causal_consistency=True) as reads:
                reads.advance_cluster_time(wrote.cluster_time)
                reads.advance_operation_time(wrote.operation_time)
                on_secondary = reader.rc.causal.with_options(read_preference=ReadPreference.SECONDARY_PREFERRED)
                assert on_secondary.find_one({"_id": "mine"}) is None  # no session: not applied there yet
                resume.start()
                assert on_secondary.find_one({"_id": "mine"}, session=reads) == {"_id": "mine"}
    finally:
        resume.cancel()
        rs.fail_point(behind, "stopReplProducer", "off")
