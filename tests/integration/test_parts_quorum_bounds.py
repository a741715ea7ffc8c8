"""A quorum insert is never ambiguous and never silently slow, on real members.

- More replicas asked than this member sees alive: refused at once (UnsatisfiableWriteConcern, 100,
  "too few live replicas"), nothing written or committed - ClickHouse's TOO_FEW_LIVE_REPLICAS.
- A live replica that cannot fetch: `quorumStatus: "pending"` within `quorumTimeoutMS`.
- A commit no majority confirms in time, or a primary that does not answer: a retryable error
  (HostUnreachable 6 or PrimarySteppedDown 189, labelled RetryableWriteError) within `quorumTimeoutMS`;
  the retry with the same dedupToken inserts the rows exactly once.
"""

from __future__ import annotations

import datetime
import os
import time
from typing import Any

import pytest
from pymongo.errors import OperationFailure

from tests.support.members import Member, wait_for
from tests.support.parts import select
from tests.support.replica_set import ReplicaSet

TABLE = {"columns": [{"name": "day", "type": "timestamp[ms]"}, {"name": "user", "type": "string"},
                     {"name": "n", "type": "int64"}],
         "partitionBy": "toYYYYMM(day)", "orderBy": ["user", "day"],
         "settings": {"fetchProgressTimeoutMS": 1500}}
TIMEOUT_MS = 2000
SLACK_S = 1.5   # a loaded two-core machine: the reply may come this much after quorumTimeoutMS
RETRYABLE_ANSWERS = (6, 189)   # HostUnreachable, PrimarySteppedDown
DEAD = "127.0.0.1:1"
CLIENT_WAIT_MS = 90_000


def _rows(n: int, month: int = 3, start: int = 0) -> list[dict[str, Any]]:
    return [{"day": datetime.datetime(2024, month, 1 + i % 28), "user": f"u{i % 4}", "n": start + i}
            for i in range(n)]


def _http(member: Member) -> str:
    return f"127.0.0.1:{member.http_port}"


def _timed(rs: ReplicaSet, member: Member, db: str, cmd: dict[str, Any]) -> tuple[Any, float]:
    """The command's reply (or its OperationFailure) and how long it took; a reply that does not come
    within `CLIENT_WAIT_MS` fails the test."""
    client = member.direct_client(socketTimeoutMS=CLIENT_WAIT_MS)
    rs.clients.append(client)
    started = time.monotonic()
    try:
        reply: Any = client[db].command(cmd)
    except OperationFailure as exc:
        reply = exc
    return reply, time.monotonic() - started


def _assert_retryable(failure: Any) -> None:
    assert isinstance(failure, OperationFailure), failure
    assert failure.code in RETRYABLE_ANSWERS, failure.details
    assert failure.has_error_label("RetryableWriteError"), failure.details
    assert "same dedupToken" in str(failure), failure.details


def _unhealthy(rs: ReplicaSet, member: Member, hosts: set[str]) -> bool:
    seen = {m["name"]: m for m in rs.status(member)["members"]}
    return all(seen[h]["health"] == 0 for h in hosts)


def _wait_all_live(rs: ReplicaSet, member: Member) -> None:
    """Until `member`'s heartbeats show every member as primary or secondary: what a quorum insert on
    it counts (a set just started may still look, to it, as it was a heartbeat ago)."""
    def all_live() -> bool:
        return all(m["stateStr"] in ("PRIMARY", "SECONDARY") for m in rs.status(member)["members"])

    wait_for(all_live, 30, f"{member.host} to see every member up")


def _rows_everywhere(rs: ReplicaSet, db: str, expected: list[int]) -> None:
    for member in rs.members:
        wait_for(lambda m=member: sorted(r["n"] for r in select(rs, m, db, columns=["n"])) == expected, 30,
                 f"exactly these rows on {member.host}")


def test_a_quorum_above_the_live_members_is_refused_at_once_and_nothing_is_committed(rs3: ReplicaSet) -> None:
    db = "few"
    rs3.client()[db].command({"createPartsTable": "events", **TABLE})
    primary = rs3.wait_primary()
    secondaries = [m for m in rs3.members if m is not primary]
    _wait_all_live(rs3, primary)
    for member in secondaries:
        rs3.pause(member)
    try:
        wait_for(lambda: _unhealthy(rs3, primary, {m.host for m in secondaries}), 30,
                 "the primary to see both secondaries down")
        # A long quorumTimeoutMS: an answer well within it came at once, not after a try or a wait (on a
        # loaded machine "at once" may take a second).
        insert = {"insertBlock": "events", "rows": _rows(5), "insertQuorum": 3, "quorumTimeoutMS": 60_000,
                  "dedupToken": "x"}
        failure, took = _timed(rs3, primary, db, insert)
        assert isinstance(failure, OperationFailure), failure
        assert failure.code == 100 and "too few live replicas" in str(failure), failure.details
        assert took < 15.0, took
        status = rs3.direct(primary)[db].command({"insertStatus": "events", "dedupToken": "x"})
        assert status["blocks"] == []
        directory = os.path.join(primary.dbpath, "parts", f"{db}.events")
        assert not os.path.isdir(directory) or not os.listdir(directory)   # not even a temporary part
    finally:
        for member in secondaries:
            rs3.resume(member)
    # Back together: an insert every member confirms, and still no trace of the refused one anywhere.
    _wait_all_live(rs3, primary)
    after = rs3.direct(primary)[db].command({"insertBlock": "events", "rows": _rows(3, 4, 100), "insertQuorum": 3,
                                      "quorumTimeoutMS": 30_000})
    assert after["quorumStatus"] == "reached"
    _rows_everywhere(rs3, db, [100, 101, 102])
    for member in rs3.members:
        assert rs3.direct(member)[db].command({"insertStatus": "events", "dedupToken": "x"})["blocks"] == []


@pytest.mark.parametrize("inserter", ["primary", "secondary"])
def test_a_quorum_a_live_replica_cannot_fetch_for_is_pending_within_the_timeout(rs3: ReplicaSet,
                                                                                 inserter: str) -> None:
    db = "nf"
    rs3.client()[db].command({"createPartsTable": "events", **TABLE})
    primary = rs3.wait_primary()
    s1, s2 = [m for m in rs3.members if m is not primary]
    sent_to = primary if inserter == "primary" else s1
    _wait_all_live(rs3, sent_to)
    rs3.fail_point(s2, "peerRoutes", "alwaysOn", {"routes": {_http(primary): DEAD, _http(s1): DEAD}})
    try:
        rows = _rows(6)
        reply, took = _timed(rs3, sent_to, db, {
            "insertBlock": "events", "rows": rows, "insertQuorum": 3, "quorumTimeoutMS": TIMEOUT_MS,
            "dedupToken": "nf-1"})
        assert not isinstance(reply, OperationFailure), reply.details
        assert reply["quorumStatus"] == "pending" and reply["inserted"] == 1, reply
        assert took < TIMEOUT_MS / 1000 + SLACK_S, took
        block = reply["blocks"][0]["blockId"]
        status = rs3.direct(primary)[db].command({"insertStatus": "events", "blockIds": [block]})
        assert status["blocks"][0]["status"] == "pending"
    finally:
        rs3.fail_point(s2, "peerRoutes", "off")

    def reached() -> bool:
        return bool(rs3.direct(primary)[db].command({"insertStatus": "events", "blockIds": [block]})["allReached"])

    wait_for(reached, 30, "the quorum once S2 fetches again")
    _rows_everywhere(rs3, db, [r["n"] for r in rows])


@pytest.mark.parametrize("inserter", ["primary", "secondary"])
def test_a_commit_no_majority_confirms_in_time_is_a_retryable_error_within_the_timeout(rs3: ReplicaSet,
                                                                                       inserter: str) -> None:
    """Every member is alive (heartbeats answer) but neither secondary replicates: the commit is made on
    the primary and not confirmed by a majority within quorumTimeoutMS."""
    db = "nm"
    rs3.client()[db].command({"createPartsTable": "events", **TABLE})
    primary = rs3.wait_primary()
    s1, s2 = [m for m in rs3.members if m is not primary]
    rows = _rows(7, 5)
    insert = {"insertBlock": "events", "rows": rows, "insertQuorum": 2, "quorumTimeoutMS": TIMEOUT_MS,
              "dedupToken": "nm-1"}
    sent_to = primary if inserter == "primary" else s1
    _wait_all_live(rs3, sent_to)
    for member in (s1, s2):
        rs3.fail_point(member, "stopReplProducer", "alwaysOn")
    try:
        failure, took = _timed(rs3, sent_to, db, insert)
        _assert_retryable(failure)
        assert took < TIMEOUT_MS / 1000 + SLACK_S, took
    finally:
        for member in (s1, s2):
            rs3.fail_point(member, "stopReplProducer", "off")

    def reached() -> bool:   # the commit happened: once replication runs, its quorum is reached
        return bool(rs3.direct(primary)[db].command({"insertStatus": "events", "dedupToken": "nm-1"})["allReached"])

    wait_for(reached, 30, "the unconfirmed commit to reach its quorum")
    again = rs3.direct(primary)[db].command({**insert, "quorumTimeoutMS": 30_000})
    assert (again["inserted"], again["deduplicated"], again["quorumStatus"]) == (0, 1, "reached"), again
    _rows_everywhere(rs3, db, [r["n"] for r in rows])


def test_a_paused_primary_gives_an_answer_within_the_timeout(rs3: ReplicaSet) -> None:
    """S1 sends its commit to a primary that stopped answering (and may run it when it wakes): the
    client hears, within quorumTimeoutMS, either the insert's outcome or a labelled retryable error;
    retrying with the same dedupToken inserts the rows exactly once."""
    db = "pp"
    rs3.client()[db].command({"createPartsTable": "events", **TABLE})
    primary = rs3.wait_primary()
    s1 = next(m for m in rs3.members if m is not primary)
    rows = _rows(9, 6)
    insert = {"insertBlock": "events", "rows": rows, "insertQuorum": 2, "quorumTimeoutMS": TIMEOUT_MS,
              "dedupToken": "pp-1"}
    _wait_all_live(rs3, s1)
    rs3.pause(primary)
    try:
        reply, took = _timed(rs3, s1, db, insert)
        assert took < TIMEOUT_MS / 1000 + SLACK_S, took
        if isinstance(reply, OperationFailure):
            _assert_retryable(reply)
        else:
            assert reply["quorumStatus"] in ("reached", "pending"), reply
    finally:
        rs3.resume(primary)

    unlabelled: list[Any] = []

    def retried() -> dict[str, Any] | None:
        answer, _took = _timed(rs3, s1, db, {**insert, "quorumTimeoutMS": 10_000})
        if isinstance(answer, OperationFailure):
            if answer.code not in RETRYABLE_ANSWERS or not answer.has_error_label("RetryableWriteError"):
                unlabelled.append(answer.details)
            return None
        return answer if answer["quorumStatus"] == "reached" else None

    wait_for(retried, 60, "a retry with the same dedupToken to be answered")
    assert not unlabelled, unlabelled
    _rows_everywhere(rs3, db, [r["n"] for r in rows])
