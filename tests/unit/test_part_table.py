"""Parts table definitions and partition ids (oplog/parts/table.py)."""

from __future__ import annotations

import datetime

import pytest

from base.errors import MongoError
from oplog.parts.part_info import PARTITION_ID
from oplog.parts.table import PartitionKey, TableDef, parse_table_def, partition_id

SPEC = {"columns": [{"name": "ts", "type": "timestamp[ms]"}, {"name": "user", "type": "string"},
                    {"name": "n", "type": "int64", "default": 0}],
        "partitionBy": "toYYYYMM(ts)", "orderBy": ["user", "ts"]}


def test_a_definition_round_trips_through_its_document() -> None:
    table = parse_table_def("analytics", "events", SPEC)
    assert table.partition == PartitionKey("ts", by_month=True) and table.order_by == ("user", "ts")
    assert table.column("n") is not None and table.column("n").default == 0
    again = TableDef.from_document("analytics", table.to_document())
    assert again == table and again.ns == "analytics.events"


@pytest.mark.parametrize(("spec", "code"), [
    ({}, 9), ({"columns": []}, 9), ({"columns": [{"name": "a"}]}, 9),
    ({"columns": [{"name": "a", "type": "varchar"}]}, 2),
    ({"columns": [{"name": "a", "type": "int64"}, {"name": "a", "type": "int64"}]}, 2),
    ({"columns": [{"name": "1a", "type": "int64"}]}, 2),
    ({"columns": [{"name": "a", "type": "int64"}], "partitionBy": "b"}, 2),
    ({"columns": [{"name": "a", "type": "int64"}], "partitionBy": "toYYYYMM(a)"}, 2),
    ({"columns": [{"name": "a", "type": "int64"}], "orderBy": ["b"]}, 2),
    ({"columns": [{"name": "a", "type": "int64"}], "orderBy": 5}, 9),
])
def test_bad_definitions_are_refused_with_mongodb_codes(spec: dict, code: int) -> None:
    with pytest.raises(MongoError) as exc:
        parse_table_def("db", "t", spec)
    assert exc.value.code == code


def test_partition_ids_as_clickhouse_forms_them() -> None:
    month = PartitionKey("ts", by_month=True)
    assert partition_id(month, datetime.datetime(2024, 5, 17, 3, 4)) == "202405"
    assert partition_id(PartitionKey(), 123) == "all"
    assert partition_id(PartitionKey("n"), -7) == "-7"
    assert partition_id(PartitionKey("d"), datetime.date(2024, 5, 17)) == "20240517"
    assert partition_id(PartitionKey("t"), datetime.datetime(1970, 1, 2)) == "86400"
    hashed = partition_id(PartitionKey("user"), "alice")
    assert len(hashed) == 32 and hashed == partition_id(PartitionKey("user"), "alice")
    for pid in ("202405", "-7", hashed, "all"):
        assert PARTITION_ID.match(pid)
    with pytest.raises(MongoError):
        partition_id(month, "not a date")
