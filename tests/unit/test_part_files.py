"""Parts on disk (oplog/parts/part_files.py): atomic writes, checksums, schema changes, merges."""

from __future__ import annotations

import datetime
import os
import pathlib

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from base.errors import MongoError
from oplog.parts import part_files as pf
from oplog.parts.table import TableDef, alter_table, parse_table_def, partition_id

TABLE = parse_table_def("analytics", "events", {
    "columns": [{"name": "ts", "type": "timestamp[ms]"}, {"name": "user", "type": "string"},
                {"name": "n", "type": "int64", "default": 0}],
    "partitionBy": "toYYYYMM(ts)", "orderBy": ["user", "ts"]})


def rows(*items: tuple[int, str, int]) -> pa.Table:
    return pa.Table.from_pylist([{"ts": datetime.datetime(2024, month, 1), "user": user, "n": n}
                                 for month, user, n in items])


def test_an_insert_is_split_by_partition_sorted_and_written_atomically(tmp_path: pathlib.Path) -> None:
    data = pf.conform(TABLE, rows((5, "bob", 1), (6, "al", 2), (5, "al", 3)))
    parts = pf.split_by_partition(TABLE, data)
    assert list(parts) == ["202405", "202406"]
    assert parts["202405"].column("user").to_pylist() == ["al", "bob"]
    written = pf.write_part(str(tmp_path), "202405_1_1_0", parts["202405"], TABLE)
    assert written.rows == 2 and sorted(os.listdir(tmp_path)) == ["202405_1_1_0"]
    part_dir = str(tmp_path / "202405_1_1_0")
    assert sorted(os.listdir(part_dir)) == sorted(pf.PART_FILES)
    assert pf.verify_part(part_dir) is None and pf.read_checksums(part_dir) == written.checksums
    with open(os.path.join(part_dir, pf.DATA_FILE), "r+b") as f:
        f.seek(10)
        f.write(b"X")
    assert pf.verify_part(part_dir) == "data.parquet does not match its checksum"
    with pytest.raises(MongoError):
        pf.write_part(str(tmp_path), "202405_1_1_0", parts["202405"], TABLE)      # never over a part


def test_the_same_rows_make_the_same_bytes_and_merges_are_byte_identical(tmp_path: pathlib.Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    for d in (a, b):
        pf.write_part(str(d), "all_1_1_0", pf.conform(TABLE, rows((5, "z", 1), (5, "a", 2))), TABLE)
        pf.write_part(str(d), "all_2_2_0", pf.conform(TABLE, rows((5, "m", 3))), TABLE)
    merged = [pf.merge_to_temp(str(d), ["all_1_1_0", "all_2_2_0"], "tmp_merge_all_1_2_1", TABLE) for d in (a, b)]
    for d in (a, b):
        pf.publish(str(d), "tmp_merge_all_1_2_1", "all_1_2_1")
    assert merged[0].checksums == merged[1].checksums and merged[0].rows == 3
    assert pf.read_part(str(a / "all_1_2_1"), TABLE).column("user").to_pylist() == ["a", "m", "z"]
    assert pf.rows_bytes(pf.conform(TABLE, rows((5, "q", 1)))) == pf.rows_bytes(pf.conform(TABLE, rows((5, "q", 1))))


def test_parts_written_before_a_column_was_added_read_with_its_default(tmp_path: pathlib.Path) -> None:
    pf.write_part(str(tmp_path), "all_1_1_0", pf.conform(TABLE, rows((5, "a", 1))), TABLE)
    doc = TABLE.to_document()
    doc["columns"].append({"name": "country", "type": "string", "default": "nl"})
    wider = TableDef.from_document("analytics", doc)
    assert pf.read_part(str(tmp_path / "all_1_1_0"), wider).column("country").to_pylist() == ["nl"]


def test_a_part_read_in_batches_is_the_part_read_whole_through_schema_changes(tmp_path: pathlib.Path) -> None:
    data = pf.conform(TABLE, rows(*((5, f"u{i % 7}", i) for i in range(1000))))
    pf.write_part(str(tmp_path), "all_1_1_0", pf.sort_rows(TABLE, data), TABLE)
    changed = alter_table(alter_table(TABLE, {"renameColumn": {"from": "n", "to": "count"}}),
                          {"addColumn": {"name": "country", "type": "string", "default": "nl"}})
    part = str(tmp_path / "all_1_1_0")
    batches = list(pf.iter_part(part, changed, 128))
    assert len(batches) == 8 and max(b.num_rows for b in batches) == 128
    assert pa.concat_tables(batches).equals(pf.read_part(part, changed))
    assert batches[0].column_names == ["ts", "user", "count", "country"]


def test_bad_input_is_refused(tmp_path: pathlib.Path) -> None:
    with pytest.raises(MongoError) as exc:
        pf.conform(TABLE, pa.Table.from_pylist([{"user": "a", "nope": 1}]))
    assert "no column(s) nope" in str(exc.value)
    with pytest.raises(MongoError):
        pf.conform(TABLE, pa.Table.from_pylist([{"n": "not a number"}]))
    for name in ("../x", "/etc/passwd", "data.parquet/../../x", "other.bin", ""):
        with pytest.raises(MongoError):
            pf.check_file_name(name)
    for name in ("..", "a/b", ""):
        with pytest.raises(MongoError):
            pf.check_part_dir_name(name)


def test_start_up_removes_what_a_crash_left_half_written(tmp_path: pathlib.Path) -> None:
    pf.write_part(str(tmp_path), "all_1_1_0", pf.conform(TABLE, rows((5, "a", 1))), TABLE)
    for leftover in ("tmp_insert_all_2_2_0", "tmp-fetch_all_3_3_0", "tmp_merge_all_1_2_1"):
        (tmp_path / leftover).mkdir()
    assert pf.remove_temporary(str(tmp_path)) == ["tmp-fetch_all_3_3_0", "tmp_insert_all_2_2_0",
                                                   "tmp_merge_all_1_2_1"]
    assert os.listdir(tmp_path) == ["all_1_1_0"]


def test_the_same_rows_in_any_order_sort_to_the_same_bytes() -> None:
    tied = rows((5, "a", 1), (5, "a", 2), (5, "b", 3), (5, "a", 1))      # ties on the order key (user, ts)
    shuffled = tied.take(pa.array([3, 2, 1, 0]))
    assert pf.rows_bytes(pf.sort_rows(TABLE, pf.conform(TABLE, tied))) == pf.rows_bytes(
        pf.sort_rows(TABLE, pf.conform(TABLE, shuffled)))


@given(st.lists(st.one_of(st.none(), st.integers(-5, 5)), min_size=1, max_size=60),
       st.lists(st.datetimes(min_value=datetime.datetime(1990, 1, 1), max_value=datetime.datetime(2090, 1, 1)),
                min_size=1, max_size=60))
def test_rows_split_into_the_partitions_partition_id_names(keys: list[int | None],
                                                           days: list[datetime.datetime]) -> None:
    """The vectorised split puts each row where `partition_id` of its own value says, for a column key
    (nulls included) and for toYYYYMM."""
    by_value = parse_table_def("d", "t", {"columns": [{"name": "k", "type": "int64"}, {"name": "i", "type": "int64"}],
                                          "partitionBy": "k", "orderBy": ["i"]})
    data = pa.table({"k": pa.array(keys, pa.int64()), "i": pa.array(range(len(keys)), pa.int64())})
    split = pf.split_by_partition(by_value, data)
    for pid, rows in split.items():
        assert {partition_id(by_value.partition, keys[i]) for i in rows.column("i").to_pylist()} == {pid}
    assert sum(t.num_rows for t in split.values()) == len(keys)
    by_month = parse_table_def("d", "t", {"columns": [{"name": "ts", "type": "timestamp[ms]"},
                                                      {"name": "i", "type": "int64"}],
                                          "partitionBy": "toYYYYMM(ts)", "orderBy": ["i"]})
    data = pa.table({"ts": pa.array(days, pa.timestamp("ms")), "i": pa.array(range(len(days)), pa.int64())})
    for pid, rows in pf.split_by_partition(by_month, data).items():
        assert {partition_id(by_month.partition, days[i]) for i in rows.column("i").to_pylist()} == {pid}


def parquet_bytes(data: pa.Table, path: str) -> bytes:
    """The rows written in one go, as `pyarrow.parquet.write_table` writes them: the reference bytes."""
    pq.write_table(data, path, compression=pf.COMPRESSION, row_group_size=pf.ROW_GROUP_ROWS, write_statistics=True,
                   write_page_checksum=True)
    with open(path, "rb") as f:
        return f.read()


def data_bytes(directory: str, part: str) -> bytes:
    with open(os.path.join(directory, part, pf.DATA_FILE), "rb") as f:
        return f.read()


def merged_rows(directory: str, names: list[str]) -> pa.Table:
    """A merge in memory, the reference: the sources' rows concatenated, then sorted."""
    return pf.sort_rows(TABLE, pa.concat_tables([pf.read_part(os.path.join(directory, n), TABLE) for n in names]))


_row = st.tuples(st.integers(1, 3), st.sampled_from(["al", "bo", "cy", ""]), st.one_of(st.none(), st.integers(-3, 3)))


@settings(deadline=None)   # each example writes and merges Parquet files: its time is the disk's
@given(parts=st.lists(st.lists(_row, max_size=12), min_size=1, max_size=5), batch_rows=st.integers(1, 5))
def test_a_streamed_merge_gives_the_rows_and_bytes_of_a_merge_in_memory(
        tmp_path_factory: pytest.TempPathFactory, parts: list[list[tuple[int, str, int | None]]],
        batch_rows: int) -> None:
    directory = str(tmp_path_factory.mktemp("merge"))
    names = []
    for i, items in enumerate(parts, start=1):
        data = pf.sort_rows(TABLE, pf.conform(TABLE, pa.Table.from_pylist(
            [{"ts": datetime.datetime(2024, month, 1), "user": user, "n": n} for month, user, n in items],
            schema=pf.arrow_schema(TABLE))))
        names.append(pf.write_part(directory, f"all_{i}_{i}_0", data, TABLE).name)
    whole = merged_rows(directory, names)
    chunks = list(pf.iter_merged(directory, names, TABLE, batch_rows=batch_rows))
    streamed = pa.concat_tables(chunks) if chunks else pf.arrow_schema(TABLE).empty_table()
    assert streamed.to_pylist() == whole.to_pylist()
    by_stream = pf.write_temp_part_streaming(directory, "tmp_merge_b", iter(chunks), TABLE)
    assert data_bytes(directory, "tmp_merge_b") == parquet_bytes(whole, os.path.join(directory, "whole.parquet"))
    assert by_stream.rows == whole.num_rows


def test_a_streamed_merge_cuts_row_groups_where_a_merge_in_memory_does(tmp_path: pathlib.Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pf, "ROW_GROUP_ROWS", 4)
    directory = str(tmp_path)
    for i in range(1, 4):
        pf.write_part(directory, f"all_{i}_{i}_0", pf.conform(TABLE, rows(*[(5, f"u{(j * i) % 7}", j)
                                                                             for j in range(5)])), TABLE)
    names = ["all_1_1_0", "all_2_2_0", "all_3_3_0"]
    by_stream = pf.merge_to_temp(directory, names, "tmp_merge_b", TABLE)
    whole = merged_rows(directory, names)
    assert data_bytes(directory, "tmp_merge_b") == parquet_bytes(whole, os.path.join(directory, "whole.parquet"))
    assert by_stream.rows == 15 and len(pq.ParquetFile(os.path.join(directory, "whole.parquet")).metadata.to_dict()
                                        ["row_groups"]) == 4


def test_a_damaged_page_fails_the_read_and_the_part_check(tmp_path: pathlib.Path) -> None:
    """Every page carries its CRC: a flipped byte fails the read (never other rows), and `verify_part`
    names the file; against the checksums the log recorded, a rewritten checksums.txt is caught too."""
    directory = str(tmp_path)
    data = pf.conform(TABLE, rows(*[(5, f"u{j % 7}", j) for j in range(2000)]))
    written = pf.write_part(directory, "all_1_1_0", data, TABLE)
    part_dir = os.path.join(directory, "all_1_1_0")
    assert pf.verify_part(part_dir, written.checksums) is None
    before = pf.part_signature(part_dir)
    path = os.path.join(part_dir, pf.DATA_FILE)
    with open(path, "r+b") as f:
        f.seek(os.path.getsize(path) // 2)
        byte = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte[0] ^ 0x5A]))
    assert pf.part_signature(part_dir) != before
    with pytest.raises(OSError):
        pf.read_part(part_dir, TABLE)
    assert pf.verify_part(part_dir) == f"{pf.DATA_FILE} does not match its checksum"
    assert pf.check_sizes(part_dir) is None   # the cheap start-up check sees sizes only
    forged = {**written.checksums, pf.DATA_FILE: pf._sha256(path)}
    pf.write_checksums(part_dir, forged)
    assert pf.verify_part(part_dir) is None
    assert "other bytes" in str(pf.verify_part(part_dir, written.checksums))
    assert pf.set_aside(directory, "all_1_1_0", pf.BROKEN_PREFIX, wall_s=1_700_000_000).split(os.sep)[-1] == (
        "broken_all_1_1_0_1700000000")


def test_the_names_of_parts_set_aside_are_read_back_from_their_directories(tmp_path: pathlib.Path) -> None:
    for name in ("202405_1_1_0", "202405_2_4_1_7", "all_3_3_0"):
        (tmp_path / name).mkdir()
    assert pf.set_aside(str(tmp_path), "202405_1_1_0", pf.BROKEN_PREFIX, wall_s=1764320000)
    assert pf.set_aside(str(tmp_path), "202405_2_4_1_7", pf.BROKEN_PREFIX, wall_s=1764320000)
    (tmp_path / "all_3_3_0_x").mkdir()
    assert pf.set_aside(str(tmp_path), "all_3_3_0", pf.BROKEN_PREFIX, wall_s=1764320000)
    os.rename(tmp_path / "all_3_3_0_x", tmp_path / "all_3_3_0")
    assert pf.set_aside(str(tmp_path), "all_3_3_0", pf.BROKEN_PREFIX, wall_s=1764320000)   # twice in a second
    (tmp_path / "unexpected_all_9_9_0_1764320000").mkdir()
    assert sorted(pf.set_aside_names(str(tmp_path), pf.BROKEN_PREFIX)) == [
        "202405_1_1_0", "202405_2_4_1_7", "all_3_3_0", "all_3_3_0"]
