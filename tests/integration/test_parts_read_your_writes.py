"""Acknowledged is readable: an insert a member acknowledged is in that member's next read, and a read
on any member after the insert's operationTime (`readConcern: {afterClusterTime}`) sees it too -
waiting for the part to be fetched if it must, never answering fewer rows."""

from __future__ import annotations

import datetime
from typing import Any

import pytest
from pymongo import MongoClient
from pymongo.errors import OperationFailure

from tests.support.members import wait_for
from tests.support.parts import select
from tests.support.replica_set import ReplicaSet

TABLE = {"columns": [{"name": "day", "type": "timestamp[ms]"}, {"name": "n", "type": "int64"}],
         "partitionBy": "toYYYYMM(day)", "orderBy": ["n"]}
INSERTS = 200


def _row(n: int) -> dict[str, Any]:
    return {"day": datetime.datetime(2024, 1 + n % 12, 1), "n": n}


def _read_after(client: MongoClient[dict[str, Any]], db: str, reply: dict[str, Any], **args: Any) -> set[int]:
    """`selectParts` through `client` (one member's) after the reply's time, in a session that has seen
    that reply (as a driver's causally consistent session has): its cluster time gossiped, its
    operationTime the read's afterClusterTime."""
    with client.start_session() as session:
        session.advance_cluster_time(reply["$clusterTime"])
        rows = client[db].cursor_command("selectParts", "events", session=session,
                                         readConcern={"afterClusterTime": reply["operationTime"]}, **args)
        return {r["n"] for r in rows}


def test_every_acknowledged_insert_is_read_where_it_was_acknowledged_and_after_its_time(rs3: ReplicaSet) -> None:
    rs = rs3
    rs.client().ryw.command({"createPartsTable": "events", **TABLE})
    for member in rs.members:
        definitions = rs.direct(member).ryw.get_collection("system.parts")
        wait_for(lambda d=definitions: d.find_one({"_id": "events"}) is not None, 30,
                 f"the table's definition on {member.host}")
    clients = [rs.direct(m) for m in rs.members]
    mine: list[set[int]] = [set() for _ in clients]
    missed_here, missed_after = [], []
    for n in range(INSERTS):
        here, elsewhere = n % len(clients), (n + 1) % len(clients)
        reply = clients[here].ryw.command({"insertBlock": "events", "rows": [_row(n)], "writeConcern": {"w": 1}})
        mine[here].add(n)
        read_here = {r["n"] for r in clients[here].ryw.cursor_command("selectParts", "events")}
        if not mine[here] <= read_here:
            missed_here.append((n, rs.members[here].host, sorted(mine[here] - read_here)))
        read_after = _read_after(clients[elsewhere], "ryw", reply)
        if not set(range(n + 1)) <= read_after:
            missed_after.append((n, rs.members[elsewhere].host, sorted(set(range(n + 1)) - read_after)))
    assert missed_here == [], f"{len(missed_here)} of {INSERTS} reads where the insert was acknowledged missed rows"
    assert missed_after == [], f"{len(missed_after)} of {INSERTS} afterClusterTime reads elsewhere missed rows"


def test_a_read_after_a_time_a_member_cannot_reach_fails_rather_than_answer_fewer_rows(rs3: ReplicaSet) -> None:
    """A secondary whose replication is stopped cannot have the parts through a later time: the read
    waits its maxTimeMS and fails (50), it does not answer what it has."""
    rs = rs3
    rs.client().late.command({"createPartsTable": "events", **TABLE})
    primary = rs.wait_primary()
    behind = next(m for m in rs.members if m is not primary)
    rs.client().late.command({"insertBlock": "events", "rows": [_row(0)], "writeConcern": {"w": 3}})
    rs.fail_point(behind, "stopReplProducer", "alwaysOn")
    try:
        reply = rs.direct(primary).late.command({"insertBlock": "events", "rows": [_row(1)], "writeConcern": {"w": 1}})
        with pytest.raises(OperationFailure) as refused:
            _read_after(rs.direct(behind), "late", reply, maxTimeMS=1500)
        assert refused.value.code == 50
        assert sorted(r["n"] for r in select(rs, behind, "late")) == [0]   # (a plain read answers what it has)
    finally:
        rs.fail_point(behind, "stopReplProducer", "off")
    assert _read_after(rs.direct(behind), "late", reply) == {0, 1}
