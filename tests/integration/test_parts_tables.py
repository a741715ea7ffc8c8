"""Parts tables on a real set: createPartsTable / dropPartsTable replicate at w:"majority", bad
definitions and misuse get MongoDB codes, and the part log's state is not the client's to write."""

from __future__ import annotations

from typing import Any

import pytest
from pymongo import ReadPreference
from pymongo.errors import OperationFailure

from tests.support.members import wait_for
from tests.support.replica_set import ReplicaSet

EVENTS = {"columns": [{"name": "ts", "type": "timestamp[ms]"}, {"name": "user", "type": "string"},
                      {"name": "n", "type": "int64", "default": 0}],
          "partitionBy": "toYYYYMM(ts)", "orderBy": ["user", "ts"]}


def _code(fn: Any) -> int:
    with pytest.raises(OperationFailure) as err:
        fn()
    return int(err.value.code or 0)


def test_a_parts_table_is_created_on_every_member_and_dropped(rs: ReplicaSet) -> None:
    db = rs.client().analytics
    reply = db.command({"createPartsTable": "events", **EVENTS})
    assert reply["ok"] == 1.0 and "writeConcernError" not in reply
    for member in rs.members:   # acknowledged at w:"majority"; every member gets it
        tables = rs.direct(member).analytics.get_collection(
            "system.parts", read_preference=ReadPreference.SECONDARY_PREFERRED)
        doc = wait_for(lambda t=tables: t.find_one({"_id": "events"}), 10, f"the definition on {member.host}")
        assert doc["partitionBy"] == "toYYYYMM(ts)" and doc["orderBy"] == ["user", "ts"]
        assert [c["name"] for c in doc["columns"]] == ["ts", "user", "n"] and doc["metadataVersion"] == 0
    assert _code(lambda: db.command({"createPartsTable": "events", **EVENTS})) == 48
    assert db.command({"dropPartsTable": "events"})["ok"] == 1.0
    assert db["system.parts"].find_one({"_id": "events"}) is None
    assert _code(lambda: db.command({"dropPartsTable": "events"})) == 26


@pytest.mark.parametrize(("spec", "code"), [
    ({"columns": [{"name": "a", "type": "varchar"}]}, 2),
    ({"columns": [{"name": "a", "type": "int64"}], "partitionBy": "toYYYYMM(a)"}, 2),
    ({"columns": []}, 9),
    ({"columns": "a"}, 14),
    ({"columns": [{"name": "a", "type": "int64"}], "nope": 1}, 40415),
])
def test_bad_definitions_get_mongodb_codes(rs: ReplicaSet, spec: dict[str, Any], code: int) -> None:
    assert _code(lambda: rs.client().analytics.command({"createPartsTable": "bad", **spec})) == code


def test_the_part_log_state_is_not_the_clients_to_write(rs: ReplicaSet) -> None:
    db = rs.client().analytics
    assert _code(lambda: db["system.parts"].insert_one({"_id": "forged", "columns": []})) == 73
    assert _code(lambda: db["system.parts.events.log"].insert_one({"_id": "log-1"})) == 73
