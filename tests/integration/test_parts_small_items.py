"""Parts tables on a real set, four views and types:

* killing a mutation that has finished leaves it done on every member (and its rows as they were);
* a `timestamp[ms, tz=UTC]` column takes pymongo datetimes and gives back the same instants;
* `partsStatus` says how many rows each part holds;
* `partsMutations` says when a mutation's rewrite last failed (`latest_fail_time`).
"""

from __future__ import annotations

import datetime
from typing import Any

import pytest
from pymongo.errors import OperationFailure

from tests.support.members import Member, wait_for
from tests.support.parts import select
from tests.support.replica_set import ReplicaSet

TABLE = {"columns": [{"name": "day", "type": "timestamp[ms]"}, {"name": "user", "type": "string"},
                     {"name": "n", "type": "int64"}],
         "partitionBy": "toYYYYMM(day)", "orderBy": ["user", "day"]}
EPOCH = datetime.datetime(1970, 1, 1)   # pymongo's naive UTC datetimes


def _rows(month: int, n: int, start: int = 0) -> list[dict[str, Any]]:
    return [{"day": datetime.datetime(2024, month, 1 + i % 28), "user": f"u{i % 4}", "n": start + i}
            for i in range(n)]


def _ns(rs: ReplicaSet, member: Member, db: str) -> set[int]:
    return {r["n"] for r in select(rs, member, db, columns=["n"])}


def _converged(rs: ReplicaSet, db: str, expected: set[int]) -> None:
    for member in rs.members:
        wait_for(lambda m=member: _ns(rs, m, db) == expected, 30, f"the rows on {member.host}")


def _mutation(rs: ReplicaSet, member: Member, db: str, mutation_id: str) -> dict[str, Any]:
    rows = rs.direct(member)[db].command({"partsMutations": "events"})["mutations"]
    return next(r for r in rows if r["mutation_id"] == mutation_id)


def test_killing_a_finished_mutation_leaves_it_done_everywhere(rs: ReplicaSet) -> None:
    db = rs.client().kf
    db.command({"createPartsTable": "events", **TABLE})
    db.command({"insertBlock": "events", "rows": _rows(1, 20)})
    _converged(rs, "kf", set(range(20)))
    mutation = db.command({"alterDelete": "events", "filter": {"n": {"$lt": 5}}, "sync": 2})["mutation"]
    for member in rs.members:
        assert _mutation(rs, member, "kf", mutation)["is_done"], member.host
    # Like ClickHouse's KILL MUTATION, the kill names it; there is nothing left for it to stop.
    assert db.command({"killPartsMutation": "events", "mutation": mutation})["killed"] == [mutation]
    for member in rs.members:
        wait_for(lambda m=member: _mutation(rs, m, "kf", mutation)["is_killed"], 20, f"the kill on {member.host}")
        row = _mutation(rs, member, "kf", mutation)
        assert (row["is_done"], row["parts_to_do"]) == (True, 0), (member.host, row)
        assert _ns(rs, member, "kf") == set(range(5, 20))


def test_utc_timestamps_round_trip_and_other_time_zones_are_refused(rs: ReplicaSet) -> None:
    db = rs.client().tz
    with pytest.raises(OperationFailure) as err:
        db.command({"createPartsTable": "events", "columns": [{"name": "ts", "type": "timestamp[ms, tz=Europe/Paris]"}]})
    assert err.value.code == 2 and "unknown type 'timestamp[ms, tz=Europe/Paris]'" in str(err.value)
    db.command({"createPartsTable": "events", "columns": [{"name": "ts", "type": "timestamp[ms, tz=UTC]"},
                                                          {"name": "n", "type": "int64"}],
                "partitionBy": "toYYYYMM(ts)", "orderBy": ["ts"]})
    instants = [datetime.datetime(2024, 5, 31, 23, 59, 59, 999000), datetime.datetime(2024, 6, 1, 0, 0),
                datetime.datetime(2024, 6, 15, 12, 30, 0, 250000)]
    reply = db.command({"insertBlock": "events", "rows": [{"ts": t, "n": i} for i, t in enumerate(instants)]})
    assert reply["ok"] == 1.0 and reply["inserted"] == 2   # a part per month
    for member in rs.members:
        got = wait_for(lambda m=member: select(rs, m, "tz") if len(select(rs, m, "tz")) == 3 else None, 20,
                       f"the rows on {member.host}")
        assert [r["ts"] for r in got] == instants, member.host
        june = select(rs, member, "tz", filter={"ts": {"$gte": datetime.datetime(2024, 6, 1)}}, columns=["n"])
        assert sorted(r["n"] for r in june) == [1, 2]
    parts = db.command({"partsStatus": "events"})["parts"]
    assert sorted(p["partition_id"] for p in parts if p["active"]) == ["202405", "202406"]


def test_parts_status_gives_the_rows_of_each_part(rs: ReplicaSet) -> None:
    db = rs.client().pr
    db.command({"createPartsTable": "events", **TABLE})
    db.command({"insertBlock": "events", "rows": _rows(1, 7) + _rows(2, 3, 100)})
    _converged(rs, "pr", set(range(7)) | set(range(100, 103)))
    db.command({"alterDelete": "events", "filter": {"n": {"$lt": 2}}, "sync": 2})
    for member in rs.members:
        parts = rs.direct(member).pr.command({"partsStatus": "events"})["parts"]
        active = {p["partition_id"]: p["rows"] for p in parts if p["active"]}
        assert active == {"202401": 5, "202402": 3}, (member.host, parts)


def test_a_failing_rewrite_shows_when_it_last_failed(rs: ReplicaSet) -> None:
    db = rs.client().lf
    db.command({"createPartsTable": "events", **TABLE})
    db.command({"insertBlock": "events", "rows": _rows(1, 4, 1)})
    _converged(rs, "lf", {1, 2, 3, 4})
    fine = db.command({"alterDelete": "events", "filter": {"n": 4}, "sync": 2})["mutation"]
    primary = rs.wait_primary()
    assert _mutation(rs, primary, "lf", fine)["latest_fail_time"] == EPOCH   # ClickHouse's "never"
    before = datetime.datetime.now(datetime.UTC).replace(tzinfo=None) - datetime.timedelta(seconds=1)
    overflow = db.command({"alterUpdate": "events", "filter": {}, "set": {"n": {"$add": ["$n", 2 ** 63 - 1]}},
                           "sync": 0})["mutation"]
    try:
        row = wait_for(lambda: (r := _mutation(rs, primary, "lf", overflow))["latest_fail_reason"] and r, 30,
                       "the rewrite to fail on the primary")
        after = datetime.datetime.now(datetime.UTC).replace(tzinfo=None) + datetime.timedelta(seconds=1)
        assert row["latest_failed_part"] and not row["is_done"]
        assert before <= row["latest_fail_time"] <= after, row
    finally:
        db.command({"dropPartsTable": "events"})   # its rewrite would go on failing
