"""An insert block's decoded size before it is decoded (oplog/parts/ipc_metadata.py, oplog/parts/block_size.py),
the partition limit, and the bounded decoding built on them (replset/parts/payload.py).

The metadata reading is checked against pyarrow itself: for any stream, the sizes read from the
metadata are the sizes of the buffers pyarrow decodes."""

from __future__ import annotations

import datetime
import io
import time

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from base.errors import MongoError
from oplog.parts import part_files as pf
from oplog.parts.block_size import (
    BATCH_OVERHEAD_BYTES,
    BSON_OBJECT_TOO_LARGE,
    BUFFER_OVERHEAD_BYTES,
    TOO_MANY_PARTS,
    StreamSize,
    add_batch,
    check_decoded_size,
    check_partitions,
    conformed_bytes,
    stream_bytes,
    table_bytes,
)
from oplog.parts.ipc_metadata import DICTIONARY_BATCH, RECORD_BATCH, SCHEMA, batch_layout, decoded_bytes
from oplog.parts.table import parse_table_def
from replset.parts.payload import (
    arrow_stream_size,
    json_line_steps,
    table_from_arrow,
    table_from_row_steps,
    table_from_rows,
)

TABLE = parse_table_def("db", "events", {
    "columns": [{"name": "n", "type": "int64"}, {"name": "user", "type": "string", "default": "nobody"},
                {"name": "day", "type": "int32", "default": 0}],
    "partitionBy": "day", "orderBy": ["n"]})
MIB = 1 << 20


def stream(data: pa.Table | list[pa.RecordBatch], compression: str | None = None) -> bytes:
    batches = data.to_batches() if isinstance(data, pa.Table) else data
    sink = io.BytesIO()
    with pa.ipc.new_stream(sink, batches[0].schema, options=pa.ipc.IpcWriteOptions(compression=compression)) as w:
        for batch in batches:
            w.write_batch(batch)
    return sink.getvalue()


def zeros(batches: int, rows: int, compression: str = "zstd") -> bytes:
    """`batches` batches of `rows` int64 zeros: `batches * rows * 8` bytes decoded, a few KB sent."""
    batch = pa.record_batch({"n": pa.array([0] * rows, pa.int64())})
    return stream([batch] * batches, compression)


def measured(data: bytes) -> list[tuple[int, int, int]]:
    """(kind, rows, decoded bytes) of each message, from the metadata alone."""
    out = []
    for message in pa.ipc.MessageReader.open_stream(pa.py_buffer(data)):
        layout = batch_layout(message.metadata)
        out.append((layout.kind, layout.rows, decoded_bytes(layout, message.body or b"")))
    return out


# -- the metadata against pyarrow ----------------------------------------------------------------------


def test_each_message_is_read_without_decoding_it() -> None:
    table = pa.table({"n": pa.array(range(1000), pa.int64()),
                      "user": pa.array(["al", "bob"] * 500).dictionary_encode()})
    for compression in (None, "zstd", "lz4"):
        data = stream(table.to_batches(max_chunksize=300), compression)
        sizes = measured(data)
        assert [kind for kind, _, _ in sizes] == [SCHEMA, DICTIONARY_BATCH] + [RECORD_BATCH] * 4
        assert [rows for kind, rows, _ in sizes if kind == RECORD_BATCH] == [300, 300, 300, 100]
        decoded = pa.ipc.open_stream(data).read_all()   # the dictionary's buffers are shared: counted once
        assert sum(size for _, _, size in sizes) == decoded.get_total_buffer_size(), compression


_VALUES = st.one_of(
    st.lists(st.one_of(st.none(), st.integers(-2**63, 2**63 - 1)), min_size=1, max_size=50).map(
        lambda v: pa.array(v, pa.int64())),
    st.lists(st.one_of(st.none(), st.text(max_size=20)), min_size=1, max_size=50).map(pa.array),
    st.lists(st.sampled_from(["a", "bb", "", "dddd"]), min_size=1, max_size=50).map(
        lambda v: pa.array(v).dictionary_encode()),
    st.lists(st.booleans(), min_size=1, max_size=50).map(pa.array),
)


@settings(max_examples=150, deadline=None)
@given(column=_VALUES, compression=st.sampled_from([None, "zstd", "lz4"]), chunk=st.integers(1, 60))
def test_the_decoded_size_is_what_pyarrow_decodes(column: pa.Array, compression: str | None, chunk: int) -> None:
    table = pa.table({"c": column})
    data = stream(table.to_batches(max_chunksize=chunk), compression)
    from_metadata = sum(size for kind, _, size in measured(data) if kind == RECORD_BATCH)
    decoded = pa.ipc.open_stream(data).read_all()
    indices_only = [c.indices if isinstance(c, pa.DictionaryArray) else c for c in decoded.column(0).chunks]
    assert from_metadata == sum(c.get_total_buffer_size() for c in indices_only)
    assert sum(rows for kind, rows, _ in measured(data) if kind == RECORD_BATCH) == len(column)


def test_800_mb_of_compressed_zeros_is_known_as_800_mb_from_a_few_kb() -> None:
    data = zeros(100, 1_000_000)
    assert len(data) < 100_000
    started = time.perf_counter()
    size = arrow_stream_size(data, "insertBlock")
    assert time.perf_counter() - started < 1.0   # nothing was decompressed
    assert size.rows == 100_000_000 and size.batches == 100
    assert size.decoded_bytes == 800_000_000 + 100 * (BATCH_OVERHEAD_BYTES + 2 * BUFFER_OVERHEAD_BYTES)
    with pytest.raises(MongoError) as refused:
        table_from_arrow(data, TABLE, 256 * MIB, "insertBlock")
    assert refused.value.code == BSON_OBJECT_TOO_LARGE and "268,435,456" in refused.value.errmsg


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200))
def test_malformed_metadata_is_bad_value_never_a_crash(raw: bytes) -> None:
    try:
        layout = batch_layout(raw)
        decoded_bytes(layout, raw)
    except MongoError as exc:
        assert exc.code == 2


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_a_damaged_real_message_is_bad_value_or_a_layout(data: st.DataObject) -> None:
    message = list(pa.ipc.MessageReader.open_stream(pa.py_buffer(zeros(1, 1000))))[1]
    metadata, body = bytearray(message.metadata.to_pybytes()), message.body.to_pybytes()
    at = data.draw(st.integers(0, len(metadata) - 1))
    metadata[at] = data.draw(st.integers(0, 255))
    try:
        layout = batch_layout(bytes(metadata))
        assert decoded_bytes(layout, body) >= 0
    except MongoError as exc:
        assert exc.code == 2


def test_a_buffer_outside_the_body_or_a_negative_length_is_bad_value() -> None:
    message = list(pa.ipc.MessageReader.open_stream(pa.py_buffer(zeros(1, 1000))))[1]
    layout = batch_layout(message.metadata)
    with pytest.raises(MongoError, match="outside the batch's body"):
        decoded_bytes(layout, message.body.to_pybytes()[:10])
    body = bytearray(message.body.to_pybytes())
    offset = max(o for o, n in layout.buffers if n)
    body[offset:offset + 8] = (-5).to_bytes(8, "little", signed=True)
    with pytest.raises(MongoError, match="decodes to -5 bytes"):
        decoded_bytes(layout, bytes(body))


# -- the accounting ------------------------------------------------------------------------------------


def test_a_row_takes_the_tables_fixed_width_and_offsets() -> None:
    # int64 (64) + string offset (32) + int32 (32) + a validity bit each
    assert table_bytes(TABLE, 8) == 8 * (64 + 32 + 32 + 3) // 8
    assert table_bytes(TABLE, 0) == 0


def test_a_stream_is_measured_as_its_decoded_batches_or_its_rows_in_the_table_whichever_is_larger() -> None:
    few_rows = StreamSize(rows=10, decoded_bytes=10_000, batches=1)
    many_narrow_rows = StreamSize(rows=1_000_000, decoded_bytes=1_000_000, batches=1)   # int8 into int64 ...
    assert stream_bytes(TABLE, few_rows) == 10_000
    assert stream_bytes(TABLE, many_narrow_rows) == table_bytes(TABLE, 1_000_000) > 16_000_000


def test_schema_messages_count_nothing_and_batches_count_their_overhead() -> None:
    schema = next(iter(pa.ipc.MessageReader.open_stream(pa.py_buffer(zeros(1, 10)))))
    assert add_batch(StreamSize(), batch_layout(schema.metadata), 0) == StreamSize()
    sizes = measured(zeros(3, 10))
    for kind, rows, decoded in sizes[1:]:
        assert (kind, rows, decoded) == (RECORD_BATCH, 10, 80)


def _dictionary_stream(rows: int, value: str) -> bytes:
    indices = pa.array([0] * rows, pa.int8())
    users = pa.DictionaryArray.from_arrays(indices, pa.array([value]))
    return stream(pa.table({"n": pa.array([1] * rows, pa.int64()), "user": users}), "zstd")


def test_a_dictionary_is_counted_as_conform_expands_it() -> None:
    data = pa.ipc.open_stream(_dictionary_stream(10_000, "x" * 1000)).read_all()
    estimate = conformed_bytes(TABLE, data)
    built = pf.conform(TABLE, data)
    assert built.column("user").nbytes >= 10_000 * 1000
    assert built.nbytes <= estimate <= built.nbytes * 1.5


def test_conformed_bytes_bounds_what_conform_builds() -> None:
    cases = [pa.table({"n": pa.array([i % 100 for i in range(5000)], pa.int8())}),     # widened, left-out filled
             pa.table({"n": pa.array(range(5000)), "user": pa.array(["ab", None] * 2500)}),
             pa.table({"n": pa.array(range(5000)), "user": pa.array(range(5000))})]   # numbers as text
    for data in cases:
        assert pf.conform(TABLE, data).nbytes <= conformed_bytes(TABLE, data)


def test_a_dictionary_that_expands_past_the_limit_is_refused_before_conform() -> None:
    data = _dictionary_stream(300_000, "x" * 1000)    # ~300 MB once expanded, a few KB sent and decoded
    assert len(data) < 100_000
    with pytest.raises(MongoError) as refused:
        table_from_arrow(data, TABLE, 256 * MIB, "insertBlock")
    assert refused.value.code == BSON_OBJECT_TOO_LARGE
    assert table_from_arrow(data, TABLE, 512 * MIB, "insertBlock").num_rows == 300_000


def test_the_limit_is_past_the_number_and_zero_means_none() -> None:
    check_decoded_size("insertBlock", 100, 100)
    check_decoded_size("insertBlock", 10**15, 0)
    with pytest.raises(MongoError) as refused:
        check_decoded_size("insertBlock", 101, 100)
    assert refused.value.code == BSON_OBJECT_TOO_LARGE and refused.value.code_name == "BSONObjectTooLarge"


# -- partitions ----------------------------------------------------------------------------------------


def _days(n: int) -> pa.Table:
    return pa.table({"n": pa.array(range(n)), "day": pa.array(range(n), pa.int32())})


def test_a_block_may_fall_into_100_partitions_not_101() -> None:
    check_partitions(TABLE, 100)
    with pytest.raises(MongoError) as refused:
        check_partitions(TABLE, 101)
    assert refused.value.code == TOO_MANY_PARTS and "maxPartitionsPerInsertBlock" in refused.value.errmsg
    assert len(pf.split_by_partition(TABLE, pf.conform(TABLE, _days(100)), insert=True)) == 100
    with pytest.raises(MongoError) as refused:
        pf.split_by_partition(TABLE, pf.conform(TABLE, _days(101)), insert=True)
    assert refused.value.code == TOO_MANY_PARTS
    assert len(pf.split_by_partition(TABLE, pf.conform(TABLE, _days(101)))) == 101   # merges, reads: no limit


def test_the_null_partition_counts_and_zero_is_no_limit() -> None:
    rows = pa.table({"n": pa.array(range(101)), "day": pa.array([*range(100), None], pa.int32())})
    with pytest.raises(MongoError):
        pf.split_by_partition(TABLE, pf.conform(TABLE, rows), insert=True)
    unlimited = parse_table_def("db", "events", {**TABLE.to_document(), "columns": [
        {"name": c.name, "type": c.type, "default": c.default} for c in TABLE.columns],
        "partitionBy": "day", "settings": {"maxPartitionsPerInsertBlock": 0}})
    assert len(pf.split_by_partition(unlimited, pf.conform(unlimited, _days(5000)), insert=True)) == 5000


def test_a_key_of_a_million_values_stops_at_the_limit_without_listing_them_all() -> None:
    started = time.perf_counter()
    with pytest.raises(MongoError):
        pf.split_by_partition(TABLE, pf.conform(TABLE, _days(1_000_000)), insert=True)
    assert time.perf_counter() - started < 2.0


# -- rows ----------------------------------------------------------------------------------------------


def test_rows_in_steps_make_the_table_from_pylist_makes() -> None:
    docs = [{"n": i, "user": None if i % 3 else f"u{i}", "day": i % 7} for i in range(20_000)]
    docs[0]["user"] = None   # the first step's column is all null, the next ones' strings
    stepped = table_from_rows(docs, TABLE, 0, "insertBlock")
    whole = pa.Table.from_pylist(docs)
    assert stepped.equals(whole) and stepped.column(0).num_chunks == 1


def test_rows_are_measured_by_their_number_before_they_are_converted() -> None:
    with pytest.raises(MongoError) as refused:
        table_from_rows([{}] * 1_000_000, TABLE, 1 * MIB, "insertBlock")
    assert refused.value.code == BSON_OBJECT_TOO_LARGE
    with pytest.raises(MongoError, match="no rows"):
        table_from_rows([{}] * 10, TABLE, 0, "insertBlock")
    with pytest.raises(MongoError, match="must be a document"):
        table_from_rows([{"n": 1}, 5], TABLE, 0, "insertBlock")
    with pytest.raises(MongoError, match="cannot be read as a table"):
        table_from_rows([{"n": 1}] * 9000 + [{"n": "x"}], TABLE, 0, "insertBlock")


def test_json_lines_are_parsed_a_step_at_a_time() -> None:
    body = b"\n".join(b'{"n": %d, "day": {"$numberInt": "1"}}' % i for i in range(20_000)) + b"\n\n"
    steps = json_line_steps(body, "insert")
    first = next(steps)
    assert len(first) == 8192 and first[0] == {"n": 0, "day": 1}
    assert table_from_row_steps(json_line_steps(body, "insert"), TABLE, 0, "insert").num_rows == 20_000
    with pytest.raises(MongoError, match="not JSON lines"):
        list(json_line_steps(b'{"n": 1}\nnope\n', "insert"))


def test_dates_and_missing_fields_survive_the_steps() -> None:
    day = datetime.datetime(2024, 5, 1)
    docs = [{"n": 1, "ts": day}] + [{"n": i} for i in range(9000)]
    assert table_from_rows(docs, TABLE, 0, "insertBlock").column("ts").null_count == 9000


def test_the_spark_writer_cuts_a_block_over_the_partition_limit() -> None:
    from replset.spark import partition_pieces

    pieces = list(partition_pieces(TABLE, _days(250)))
    assert [len({d for d in p.column("day").to_pylist()}) for p in pieces] == [100, 100, 50]
    assert sorted(n for p in pieces for n in p.column("n").to_pylist()) == list(range(250))
    assert list(partition_pieces(TABLE, _days(100))) == [_days(100)]   # within the limit: as it came
