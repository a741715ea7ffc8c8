"""Bounded work on a live member: requests that ask for unbounded work get mongod's answer fast, and
the member keeps serving meanwhile.

Each case is sent with pymongo while another connection pings the member back to back; the case
must come back within a few seconds with the expected error code (or the right result), no ping may
wait a second, and the member must answer a ping at once afterwards.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from bson.int64 import Int64
from pymongo import MongoClient
from pymongo.errors import OperationFailure, WriteError

from tests.support.members import Member

CASE_SECONDS = 5.0  # what one case may take, with the limits in force
PING_SECONDS = 1.0  # the longest a ping may wait, during a case or after it


@pytest.fixture(scope="module")
def client(member: Member) -> Iterator[MongoClient[dict[str, Any]]]:
    with MongoClient(member.uri, serverSelectionTimeoutMS=10000) as c:
        yield c


@pytest.fixture(scope="module")
def pinger(member: Member) -> Iterator[MongoClient[dict[str, Any]]]:
    with member.direct_client() as c:
        yield c


@pytest.fixture()
def db(client: MongoClient[dict[str, Any]], request: pytest.FixtureRequest) -> Any:
    database = client[f"bounded_{request.node.name[:40]}".replace("[", "_").replace("]", "_")]
    client.drop_database(database.name)
    return database


def _ping_seconds(pinger: MongoClient[dict[str, Any]]) -> float:
    started = time.monotonic()
    pinger.admin.command("ping")
    return time.monotonic() - started


def bounded(pinger: MongoClient[dict[str, Any]], case: Callable[[], Any]) -> tuple[Any, Exception | None]:
    """Runs `case` while pinging the member; returns its result or its error, after checking that it
    took at most CASE_SECONDS and that no ping (during it, or just after) took PING_SECONDS."""
    done = threading.Event()
    slowest = [0.0]

    def ping_loop() -> None:
        while not done.is_set():
            slowest[0] = max(slowest[0], _ping_seconds(pinger))

    thread = threading.Thread(target=ping_loop, daemon=True)
    thread.start()
    started = time.monotonic()
    result: Any = None
    error: Exception | None = None
    try:
        result = case()
    except (OperationFailure, WriteError) as exc:
        error = exc
    finally:
        took = time.monotonic() - started
        done.set()
        thread.join(CASE_SECONDS)
    assert took < CASE_SECONDS, f"the case took {took:.1f} s"
    assert slowest[0] < PING_SECONDS, f"a ping waited {slowest[0]:.2f} s during the case"
    assert _ping_seconds(pinger) < PING_SECONDS
    return result, error


def code_of(error: Exception | None) -> int | None:
    if isinstance(error, OperationFailure):  # (WriteError included)
        return error.code
    return None


def doubled(seed: str, times: int) -> dict[str, Any]:
    """`seed` doubled `times` times by a $reduce: a long string built on the member."""
    return {"$reduce": {"input": {"$range": [0, times]}, "initialValue": seed,
                        "in": {"$concat": ["$$value", "$$value"]}}}


MB9 = doubled("x" * 9, 20)  # 9 MiB, built by the member


# -- numbers --------------------------------------------------------------------------
def test_pow_that_overflows_is_a_double_at_once(db: Any, pinger: Any) -> None:
    db.c.insert_one({"_id": 1})
    result, error = bounded(pinger, lambda: list(db.c.aggregate([
        {"$project": {"p": {"$pow": [3, 2**31 - 1]}, "q": {"$pow": [2, 62]}, "m": {"$multiply": [2**62, 4]}}}])))
    assert error is None
    assert result == [{"_id": 1, "p": float("inf"), "q": Int64(2**62), "m": 2.0**64}]
    found, error = bounded(pinger, lambda: list(db.c.find({"$expr": {"$gt": [{"$pow": [3, 2**31 - 1]}, 0]}})))
    assert error is None and found == [{"_id": 1}]
    found, error = bounded(pinger, lambda: list(db.c.find(
        {"_id": 1, "$expr": {"$gt": [{"$pow": [7, 2**31 - 1]}, 0]}}, {"p": {"$pow": [5, 2**31 - 1]}})))
    assert error is None and found == [{"_id": 1, "p": float("inf")}]


# -- $range and the other builders ----------------------------------------------------
@pytest.mark.parametrize("end", [2**31 - 1, 12_000_000])
def test_a_huge_range_is_refused(db: Any, pinger: Any, end: int) -> None:
    db.c.insert_one({"_id": 1})
    _, error = bounded(pinger, lambda: list(db.c.aggregate([{"$project": {"r": {"$range": [0, end]}}}])))
    assert code_of(error) == 146
    assert "$range would use too much memory" in str(error)
    _, error = bounded(pinger, lambda: list(db.c.find({"$expr": {"$in": [5, {"$range": [0, end]}]}})))
    assert code_of(error) == 146


@pytest.mark.parametrize(("name", "expr", "code"), [
    ("concat", doubled("x", 30), 16493),
    ("concatArrays", {"$reduce": {"input": {"$range": [0, 30]}, "initialValue": [1],
                                  "in": {"$concatArrays": ["$$value", "$$value"]}}}, 146),
    ("map", {"$map": {"input": {"$range": [0, 100_000]}, "in": MB9}}, 146),
    ("split", {"$split": [doubled(",", 23), ","]}, 146),
    ("nesting", {"$reduce": {"input": {"$range": [0, 100_000]}, "initialValue": {}, "in": {"a": "$$value"}}}, 15),
])
def test_builders_stop_at_mongods_limits(db: Any, pinger: Any, name: str, expr: Any, code: int) -> None:
    db.c.insert_one({"_id": 1})
    _, error = bounded(pinger, lambda: list(db.c.aggregate([{"$project": {"v": expr}}])))
    assert code_of(error) == code, f"{name}: {error}"


def test_push_and_group_stop_at_100_mib(db: Any, pinger: Any) -> None:
    db.c.insert_many([{"_id": i} for i in range(13)])
    big = doubled("x" * 8, 20)  # 8 MiB per document
    _, error = bounded(pinger, lambda: list(db.c.aggregate([{"$group": {"_id": None, "all": {"$push": big}}}])))
    assert code_of(error) == 146
    distinct = {"$concat": [big, {"$toString": "$_id"}]}
    _, error = bounded(pinger, lambda: list(db.c.aggregate([
        {"$group": {"_id": None, "all": {"$addToSet": distinct}}}])))
    assert code_of(error) == 146
    _, error = bounded(pinger, lambda: list(db.c.aggregate(
        [{"$group": {"_id": "$_id", "all": {"$push": big}}}], allowDiskUse=False)))
    assert code_of(error) == 292


def test_a_result_over_16_mib_is_refused(db: Any, pinger: Any) -> None:
    db.c.insert_one({"_id": 1})
    _, error = bounded(pinger, lambda: list(db.c.aggregate([{"$project": {"a": MB9, "b": MB9}}])))
    assert code_of(error) == 10334
    _, error = bounded(pinger, lambda: list(db.c.aggregate([
        {"$set": {"s": MB9}}, {"$project": {f"f{i}": "$s" for i in range(1000)}}])))
    assert code_of(error) == 10334
    _, error = bounded(pinger, lambda: list(db.c.find({}, {"a": MB9, "b": MB9})))
    assert code_of(error) == 10334
    rows, error = bounded(pinger, lambda: list(db.c.aggregate([{"$project": {"n": {"$strLenBytes": MB9}}}])))
    assert error is None and rows == [{"_id": 1, "n": 9 * 1024 * 1024}]


# -- writes ---------------------------------------------------------------------------
def test_no_write_stores_more_than_16_mib(db: Any, pinger: Any, client: Any) -> None:
    db.c.insert_one({"_id": 1})
    db.c.update_one({"_id": 1}, [{"$set": {"a": MB9}}])
    _, error = bounded(pinger, lambda: db.c.update_one({"_id": 1}, [{"$set": {"b": "$a"}}]))
    assert code_of(error) == 17419
    _, error = bounded(pinger, lambda: db.c.update_one({"_id": 1}, {"$set": {"b": "y" * (9 * 1024 * 1024)}}))
    assert code_of(error) == 17419
    _, error = bounded(pinger, lambda: db.c.find_one_and_update({"_id": 1}, [{"$set": {"b": "$a"}}]))
    assert code_of(error) == 17419
    _, error = bounded(pinger, lambda: db.c.update_one({"_id": 2}, [{"$set": {"a": MB9, "b": MB9}}], upsert=True))
    assert code_of(error) == 17420
    _, error = bounded(pinger, lambda: db.c.update_many({}, [{"$set": {f"f{i}": "$a" for i in range(1000)}}]))
    assert code_of(error) == 17419
    reply, error = bounded(pinger, lambda: db.command("insert", "c", documents=[{"_id": 3, "a": "z" * 16_777_216}]))
    assert error is None and reply["writeErrors"][0]["code"] == 10334
    with client.start_session() as session:
        session.start_transaction()
        _, error = bounded(pinger, lambda: db.c.update_one({"_id": 1}, [{"$set": {"b": "$a"}}], session=session))
        assert code_of(error) == 17419
        session.abort_transaction()
    assert len(db.c.find_one({"_id": 1})["a"]) == 9 * 1024 * 1024
    assert db.c.find_one({"_id": 1}).keys() == {"_id", "a"}
    assert db.c.count_documents({}) == 1


def test_deep_paths_and_documents_are_refused_cleanly(db: Any, pinger: Any) -> None:
    db.c.insert_one({"_id": 1})
    deep_path = ".".join(["a"] * 100_000)
    _, error = bounded(pinger, lambda: db.c.update_one({"_id": 1}, {"$set": {deep_path: 1}}))
    assert code_of(error) == 15
    _, error = bounded(pinger, lambda: db.c.update_one({"_id": 1}, {"$set": {".".join(["a"] * 181): 1}}))
    assert code_of(error) == 15
    assert "maximum nesting depth of 180" in str(error)
    _, error = bounded(pinger, lambda: list(db.c.aggregate([{"$project": {"x": "$" + deep_path}}])))
    assert code_of(error) == 15
    nested: dict[str, Any] = {"v": 1}
    for _ in range(180):
        nested = {"a": nested}
    _, error = bounded(pinger, lambda: db.c.insert_one({"_id": 2, **nested}))
    assert code_of(error) == 15
    assert db.c.find_one({"_id": 1}) == {"_id": 1}


# -- killCursors ----------------------------------------------------------------------
def test_kill_cursors_kills_only_cursors_of_its_namespace(db: Any) -> None:
    db.a.insert_many([{"_id": i} for i in range(5)])
    reply = db.command("find", "a", batchSize=1)
    cursor_id = reply["cursor"]["id"]
    assert cursor_id
    killed = db.command("killCursors", "b", cursors=[cursor_id])
    assert killed["cursorsKilled"] == [] and killed["cursorsNotFound"] == [cursor_id]
    more = db.command("getMore", cursor_id, collection="a", batchSize=10)
    assert [d["_id"] for d in more["cursor"]["nextBatch"]] == [1, 2, 3, 4]
    again = db.command("find", "a", batchSize=1)
    killed = db.command("killCursors", "a", cursors=[again["cursor"]["id"]])
    assert killed["cursorsKilled"] == [again["cursor"]["id"]]
