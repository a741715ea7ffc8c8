"""Reading parts tables on any member: selectParts (filters, columns, cursors, sequential consistency),
partsStatus and partsReplicationQueue, as commands and over HTTP."""

from __future__ import annotations

import datetime
import json
import urllib.request
from typing import Any

import pytest
from pymongo import ReadPreference
from pymongo.errors import OperationFailure

from tests.support.members import free_port, wait_for
from tests.support.parts import select
from tests.support.replica_set import ReplicaSet

TABLE = {"columns": [{"name": "day", "type": "timestamp[ms]"}, {"name": "user", "type": "string"},
                     {"name": "n", "type": "int64"}, {"name": "kind", "type": "string"}],
         "partitionBy": "toYYYYMM(day)", "orderBy": ["user", "day"]}


def _rows(month: int, n: int) -> list[dict[str, Any]]:
    return [{"day": datetime.datetime(2024, month, 1 + i % 28), "user": f"u{i % 5}", "n": i,
             "kind": None if i % 10 == 0 else ("a" if i % 2 else "b")} for i in range(n)]


def _everywhere(rs: ReplicaSet, db: str, rows: int) -> None:
    for member in rs.members:
        wait_for(lambda m=member: len(select(rs, m, db)) == rows, 20, f"{rows} rows on {member.host}")


def test_select_filters_and_projects_the_same_on_every_member(rs: ReplicaSet) -> None:
    rs.client().rd.command({"createPartsTable": "events", **TABLE})
    rs.client().rd.command({"insertBlock": "events", "rows": _rows(3, 300) + _rows(4, 200)})
    _everywhere(rs, "rd", 500)
    expected = sorted(r["n"] for r in _rows(3, 300) + _rows(4, 200)
                      if r["user"] in ("u1", "u2") and 10 <= r["n"] < 200 and r["kind"] != "b")
    for member in rs.members:
        got = select(rs, member, "rd", filter={"user": {"$in": ["u1", "u2"]}, "n": {"$gte": 10, "$lt": 200},
                                                "kind": {"$ne": "b"}}, columns=["n"], batchSize=7)
        assert sorted(r["n"] for r in got) == expected and all(list(r) == ["n"] for r in got)
    nulls = select(rs, rs.members[0], "rd", filter={"kind": None}, columns=["kind"])
    assert len(nulls) == 50 and all(r["kind"] is None for r in nulls)
    april = select(rs, rs.members[1], "rd", filter={"day": {"$gte": datetime.datetime(2024, 4, 1)}}, limit=30)
    assert len(april) == 30 and all(r["day"].month == 4 for r in april)


@pytest.mark.parametrize(("args", "code"), [
    ({"filter": {"nope": 1}}, 2), ({"filter": {"n": {"$regex": "x"}}}, 2), ({"filter": {"n": "x"}}, 2),
    ({"columns": ["nope"]}, 2), ({"filter": {"$where": "1"}}, 2),
])
def test_bad_selects_get_bad_value(rs: ReplicaSet, args: dict[str, Any], code: int) -> None:
    if rs.client().bad["system.parts"].find_one({"_id": "events"}) is None:
        rs.client().bad.command({"createPartsTable": "events", **TABLE})
    with pytest.raises(OperationFailure) as err:
        select(rs, rs.wait_primary(), "bad", **args)
    assert err.value.code == code


def test_views_show_parts_and_the_queue_as_commands_and_over_http(rs: ReplicaSet) -> None:
    rs.client().vw.command({"createPartsTable": "events", **TABLE})
    reply = rs.client().vw.command({"insertBlock": "events", "rows": _rows(5, 20)})
    part = reply["blocks"][0]["part"]
    _everywhere(rs, "vw", 20)
    for member in rs.members:
        parts = rs.direct(member).vw.command({"partsStatus": "events"})["parts"]
        assert [(p["name"], p["active"], p["partition_id"]) for p in parts] == [(part, True, "202405")]
        with urllib.request.urlopen(f"http://127.0.0.1:{member.http_port}/tables/vw.events/parts", timeout=10) as r:
            assert [p["name"] for p in json.loads(r.read())["parts"]] == [part]
        queue = rs.direct(member).vw.command({"partsReplicationQueue": "events"})["queue"]
        assert queue == []   # everything fetched: nothing waits
        with urllib.request.urlopen(f"http://127.0.0.1:{member.http_port}/tables/vw.events/replication_queue",
                                    timeout=10) as r:
            assert json.loads(r.read())["queue"] == []


def test_sequential_consistency_refuses_a_member_without_the_last_quorum_part(rs3: ReplicaSet) -> None:
    rs3.client().sq.command({"createPartsTable": "events", **TABLE})
    primary = rs3.wait_primary()
    s1, s2 = [m for m in rs3.members if m is not primary]
    # S2 cannot fetch parts: its fetches from either holder go to a closed port.
    dead = f"127.0.0.1:{free_port()}"
    routes = {f"127.0.0.1:{m.http_port}": dead for m in (primary, s1)}
    rs3.fail_point(s2, "peerRoutes", "alwaysOn", {"routes": routes})
    reply = rs3.client().sq.command({"insertBlock": "events", "rows": _rows(6, 40), "insertQuorum": 2,
                                     "quorumTimeoutMS": 20_000})
    assert reply["quorumStatus"] == "reached"
    log = rs3.direct(s2).sq.get_collection("system.parts.events.quorum",
                                          read_preference=ReadPreference.SECONDARY_PREFERRED)
    wait_for(lambda: log.find_one({"status": "reached"}), 20, "the quorum record on S2")
    with pytest.raises(OperationFailure) as err:
        select(rs3, s2, "sq", sequentialConsistency=True)
    assert err.value.code == 134
    assert len(select(rs3, s1, "sq", sequentialConsistency=True)) == 40
    queue = rs3.direct(s2).sq.command({"partsReplicationQueue": "events"})["queue"]
    assert queue and queue[0]["type"] == "GET_PART" and queue[0]["last_exception"]   # why it is not there
    rs3.fail_point(s2, "peerRoutes", "off")
    wait_for(lambda: len(select(rs3, s2, "sq", sequentialConsistency=True)) == 40, 30, "S2 to fetch the part")
