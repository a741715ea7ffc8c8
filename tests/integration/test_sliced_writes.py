"""Big write batches run as several group commits (so the event loop is never held for seconds), with
mongod's batch semantics: ordered stops at the first error, unordered goes on, indexes are the
batch's, and a retryable batch interrupted part way resumes without running a statement twice."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from pymongo.errors import BulkWriteError, OperationFailure

from replset.wire.write_batches import WRITE_SLICE
from tests.support.members import Member

N = WRITE_SLICE * 3 + 17  # four slices, the last one short


def _docs(start: int = 0) -> list[dict[str, Any]]:
    return [{"_id": i, "v": i} for i in range(start, start + N)]


def test_an_ordered_batch_stops_at_its_first_error_across_slices(member: Member) -> None:
    with member.direct_client() as client:
        coll = client.test.sliced_ordered
        coll.drop()
        bad = WRITE_SLICE + 7  # in the second slice
        coll.insert_one({"_id": bad})
        with pytest.raises(BulkWriteError) as err:
            coll.insert_many(_docs(), ordered=True)
        details = err.value.details
        assert details["nInserted"] == bad
        assert [e["index"] for e in details["writeErrors"]] == [bad]
        assert coll.count_documents({}) == bad + 1


def test_an_unordered_batch_goes_on_after_errors_in_any_slice(member: Member) -> None:
    with member.direct_client() as client:
        coll = client.test.sliced_unordered
        coll.drop()
        bad = [3, WRITE_SLICE * 2 + 1, N - 1]
        coll.insert_many([{"_id": i} for i in bad])
        with pytest.raises(BulkWriteError) as err:
            coll.insert_many(_docs(), ordered=False)
        details = err.value.details
        assert details["nInserted"] == N - len(bad)
        assert sorted(e["index"] for e in details["writeErrors"]) == bad
        assert coll.count_documents({}) == N


def test_a_big_update_batch_reports_every_statement(member: Member) -> None:
    with member.direct_client() as client:
        coll = client.test.sliced_updates
        coll.drop()
        coll.insert_many(_docs())
        reply = client.test.command({"update": "sliced_updates", "updates": [
            {"q": {"_id": i}, "u": {"$inc": {"v": 1}}, "upsert": True} for i in range(1, N + 5)]})
        assert reply["n"] == N + 4 and reply["nModified"] == N - 1
        assert [u["index"] for u in reply["upserted"]] == [N - 1, N, N + 1, N + 2, N + 3]
        assert coll.find_one({"_id": N - 1})["v"] == N


def test_a_retryable_batch_interrupted_part_way_resumes_without_running_twice(
        start_member: Callable[..., Member]) -> None:
    member = start_member("--enableTestCommands")
    with member.direct_client(retryWrites=True) as client:
        coll = client.test.sliced_retry
        coll.drop()
        # The second slice fails once with a retryable error: pymongo retries the whole command with the
        # same session and txnNumber, and the member resumes after the slice that committed.
        client.admin.command({"configureFailPoint": "failBatchWriteSlice", "mode": {"times": 1},
                              "data": {"errorCode": 262}})
        result = coll.insert_many(_docs(), ordered=True)
        assert len(result.inserted_ids) == N
        assert coll.count_documents({}) == N
        entries = client.local["oplog.rs"].count_documents({"ns": "test.sliced_retry", "op": "i"})
        assert entries == N  # each document was inserted (and logged) once
        # The same fail point with an error that is not retryable stops the batch after its first slice.
        client.admin.command({"configureFailPoint": "failBatchWriteSlice", "mode": {"times": 1},
                              "data": {"errorCode": 2}})
        other = client.test.sliced_stopped
        other.drop()
        with pytest.raises(OperationFailure) as err:
            other.insert_many(_docs(), ordered=True)
        assert err.value.code == 2
        assert other.count_documents({}) == WRITE_SLICE
