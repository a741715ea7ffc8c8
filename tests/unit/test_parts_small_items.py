"""What the parts tables' views say, and their column types, on one member with no processes:

* a mutation killed after it finished stays done (`partsMutations`);
* `is_done` waits for parts this member is still to fetch, as a `sync: 1` wait does;
* a failed rewrite's time is `latest_fail_time` (1970-01-01 when none failed);
* `partsStatus` rows carry `rows`, read once per part copy;
* every column type `createPartsTable` accepts is an Arrow type, time-zone timestamps included.
"""

from __future__ import annotations

import asyncio
import datetime
import os
import pathlib
import shutil
import time
from types import SimpleNamespace
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from base.clock import SYSTEM_CLOCK
from base.errors import MongoError
from oplog.parts import mutations
from oplog.parts import part_files as pf
from oplog.parts.filters import filter_expression
from oplog.parts.mutations import Mutation
from oplog.parts.part_info import PartInfo, mutated_part
from oplog.parts.queue import EntryType, QueueEntry, ReplicationQueue
from oplog.parts.table import ARROW_TYPES, TableDef, parse_table_def
from oplog.parts.table_replica import TableReplica
from replset.parts import views

P = PartInfo.parse
EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)
TABLE = parse_table_def("db", "events", {"columns": [{"name": "user", "type": "string"},
                                                     {"name": "n", "type": "int64"}], "orderBy": ["user"]})
DELETE = Mutation("mutation_0000000001", "delete", {"n": 1}, versions={"all": 5})


OFFSET_MS = SYSTEM_CLOCK.wall_ms() - SYSTEM_CLOCK.monotonic_ms()   # taken once, as `PartsManager` keeps it


def node_with(rt: TableReplica) -> Any:
    async def run(fn: Any) -> Any:   # the query pool, inline
        return fn()

    return SimpleNamespace(parts=SimpleNamespace(tables={rt.table.ns: rt}, wall_minus_monotonic_ms=OFFSET_MS),
                           queries=SimpleNamespace(run=run))


def status(node: Any) -> list[dict[str, Any]]:
    return list(asyncio.run(views.parts_status(node, TABLE)))


def runtime(tmp_path: pathlib.Path, parts: list[str], *mutations: Mutation, table: TableDef = TABLE) -> TableReplica:
    rt = TableReplica(table, str(tmp_path), ReplicationQueue([P(p) for p in parts]))
    rt.mutations = {m.id: m for m in mutations}
    return rt


def the_row(rt: TableReplica) -> dict[str, Any]:
    (row,) = views.mutations_view(node_with(rt), rt.table)
    return row


# -- a killed mutation and is_done -----------------------------------------------------------------


def test_a_mutation_killed_after_it_finished_stays_done(tmp_path: pathlib.Path) -> None:
    killed = Mutation(DELETE.id, DELETE.kind, DELETE.filter, versions=DELETE.versions, killed=True)
    row = the_row(runtime(tmp_path, ["all_1_1_0_5", "all_6_6_0"], killed))   # all_6_6_0: inserted after it
    assert (row["is_killed"], row["is_done"], row["parts_to_do"]) == (True, True, 0)


def test_a_mutation_killed_before_it_finished_is_not_done_and_plans_nothing(tmp_path: pathlib.Path) -> None:
    killed = Mutation(DELETE.id, DELETE.kind, DELETE.filter, versions=DELETE.versions, killed=True)
    row = the_row(runtime(tmp_path, ["all_1_1_0_5", "all_2_2_0"], killed))
    assert (row["is_killed"], row["is_done"], row["parts_to_do"]) == (True, False, 0)


def test_a_mutation_is_not_done_while_a_part_it_affects_is_still_to_be_fetched(tmp_path: pathlib.Path) -> None:
    rt = runtime(tmp_path, ["all_1_1_0_5"], DELETE)
    fetch = QueueEntry("log-0000000002", EntryType.GET_PART, P("all_2_2_0"))
    rt.queue.add(fetch)
    assert not the_row(rt)["is_done"]
    assert not mutations.mutation_done(DELETE, rt.queue.current, rt.queue.virtual)
    rt.queue.started(fetch, 1)
    rt.queue.finished(fetch, 2)
    assert the_row(rt)["parts_to_do_names"] == ["all_2_2_0"] and not the_row(rt)["is_done"]
    rewrite = QueueEntry("log-0000000003", EntryType.MUTATE_PART, mutated_part(P("all_2_2_0"), 5), (P("all_2_2_0"),))
    rt.queue.add(rewrite)
    rt.queue.started(rewrite, 3)
    rt.queue.finished(rewrite, 4)
    assert the_row(rt)["is_done"] and mutations.mutation_done(DELETE, rt.queue.current, rt.queue.virtual)


# -- latest_fail_time ------------------------------------------------------------------------------


def test_a_failed_rewrite_gives_the_latest_fail_part_time_and_reason(tmp_path: pathlib.Path) -> None:
    rt = runtime(tmp_path, ["all_1_1_0", "all_2_2_0"], DELETE)
    assert (the_row(rt)["latest_failed_part"], the_row(rt)["latest_fail_time"],
            the_row(rt)["latest_fail_reason"]) == ("", EPOCH, "")
    entries = []
    for n, part in enumerate(["all_1_1_0", "all_2_2_0"], start=2):
        entry = QueueEntry(f"log-{n:010d}", EntryType.MUTATE_PART, mutated_part(P(part), 5), (P(part),))
        rt.docs[entry.node_name] = {"mutation": DELETE.id}
        rt.queue.add(entry)
        entries.append(entry)
    before = datetime.datetime.now(datetime.UTC) - datetime.timedelta(milliseconds=5)
    now_ms = int(time.monotonic() * 1000)   # the runner's clock: monotonic milliseconds
    second, first = entries[1], entries[0]
    rt.queue.started(second, now_ms - 1000)
    rt.queue.finished(second, now_ms - 1000, error="Overflow: a sum does not fit int64")
    rt.queue.started(first, now_ms)
    rt.queue.finished(first, now_ms, error="disk full")
    after = datetime.datetime.now(datetime.UTC) + datetime.timedelta(milliseconds=5)
    row = the_row(rt)
    assert (row["latest_failed_part"], row["latest_fail_reason"]) == ("all_1_1_0_5", "disk full")
    assert isinstance(row["latest_fail_time"], datetime.datetime)
    assert before <= row["latest_fail_time"] <= after
    assert the_row(rt)["latest_fail_time"] == row["latest_fail_time"]   # the same instant, asked again


# -- rows in partsStatus ---------------------------------------------------------------------------


def test_parts_status_gives_each_parts_rows_read_once(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
                                                       ) -> None:
    for name, n in (("all_1_1_0", 3), ("all_2_2_0", 5)):
        pf.write_part(str(tmp_path), name, pf.conform(TABLE, pa.table({"user": ["u"] * n, "n": list(range(n))})),
                      TABLE)
    rt = runtime(tmp_path, ["all_1_1_0", "all_2_2_0"])
    rt.outdated["all_2_2_0"] = 0.0
    rt.queue.part_removed(P("all_2_2_0"))   # merged away here: an old part still on disk
    rt.lost["all_3_3_0"] = "no member has it"
    node = node_with(rt)
    rows = {r["name"]: r.get("rows") for r in status(node)}
    assert rows == {"all_1_1_0": 3, "all_2_2_0": 5, "all_3_3_0": None}
    reads: list[str] = []
    real = pq.read_metadata
    monkeypatch.setattr(pq, "read_metadata", lambda path, *a, **k: reads.append(path) or real(path, *a, **k))
    status(node)
    assert reads == []   # parts do not change: their row counts are remembered
    shutil.rmtree(tmp_path / "all_1_1_0")   # another copy under the same name (a rollback's)
    pf.write_part(str(tmp_path), "all_1_1_0", pf.conform(TABLE, pa.table({"user": ["u"], "n": [1]})), TABLE)
    assert {r["name"]: r["rows"] for r in status(node)}["all_1_1_0"] == 1
    assert [os.path.basename(os.path.dirname(p)) for p in reads] == ["all_1_1_0"]


# -- column types ----------------------------------------------------------------------------------


def test_every_column_type_a_table_accepts_is_an_arrow_type() -> None:
    for name in sorted(ARROW_TYPES):
        table = parse_table_def("db", "t", {"columns": [{"name": "c", "type": name}]})
        type_ = pf.arrow_schema(table).field("c").type
        assert str(type_) == name if name.startswith("timestamp") else type_ == pa.type_for_alias(name)


def test_utc_timestamps_keep_their_instants_through_a_part_and_a_filter(tmp_path: pathlib.Path) -> None:
    table = parse_table_def("db", "t", {"columns": [{"name": "ts", "type": "timestamp[ms, tz=UTC]"},
                                                    {"name": "n", "type": "int64"}],
                                        "partitionBy": "toYYYYMM(ts)", "orderBy": ["ts"]})
    naive = datetime.datetime(2024, 5, 31, 23, 30, 0, 123000)   # a BSON datetime as pymongo gives it: UTC
    aware = datetime.datetime(2024, 6, 1, 1, 0, tzinfo=datetime.timezone(datetime.timedelta(hours=2)))
    data = pf.conform(table, pa.Table.from_pylist([{"ts": naive, "n": 1}, {"ts": aware, "n": 2}]))
    parts = pf.split_by_partition(table, data)
    assert list(parts) == ["202405"]   # 01:00+02:00 is 23:00 UTC on May 31st
    pf.write_part(str(tmp_path), "202405_1_1_0", parts["202405"], table)
    back = pf.read_part(str(tmp_path / "202405_1_1_0"), table)
    assert back.schema.field("ts").type == pa.timestamp("ms", tz="UTC")
    assert back.column("ts").to_pylist() == [aware, naive.replace(tzinfo=datetime.UTC)]
    late = back.filter(filter_expression({"ts": {"$gte": datetime.datetime(2024, 5, 31, 23, 15)}}, table))
    assert late.column("n").to_pylist() == [1]


@pytest.mark.parametrize("type_name", ["timestamp[ms, tz=Europe/Paris]", "timestamp[s, tz=UTC]", "decimal128(10, 2)",
                                       "Timestamp[ms]"])
def test_a_column_type_arrow_has_but_tables_do_not_take_is_refused(type_name: str) -> None:
    with pytest.raises(MongoError) as err:
        parse_table_def("db", "t", {"columns": [{"name": "c", "type": type_name}]})
    assert err.value.code == 2 and f"unknown type {type_name!r}" in str(err.value)
