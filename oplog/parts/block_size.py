"""An insert block's decoded size, known before it is decoded, and the limits on a block.

Theory of operation
-------------------
A block's rows arrive small and may grow many times over: an Arrow IPC stream
compresses its buffers (zstd turns 800 MB of zeros into 25 KB), and conforming
the rows to the table's schema (`part_files.conform`) expands a
dictionary-encoded column (one copy of its value per row), widens a narrow
column (int8 into an int64 column) and fills a column the rows leave out with
its default, row by row. So a block is measured against the member's limit
(`--maxDecodedBlockBytes`, `DEFAULT_MAX_DECODED_BYTES`) twice, each time before
the memory is taken:

1. before anything is decompressed (`stream_bytes`): an Arrow stream's batches
   decoded (`ipc_metadata`: each buffer's length, or its uncompressed length),
   with `BATCH_OVERHEAD_BYTES` / `BUFFER_OVERHEAD_BYTES` for the objects a
   decoded batch is made of (48 MB of one-row batches are 200,000 of them), or
   the table's fixed-width columns for as many rows (`table_bytes`), whichever
   is larger. BSON `rows` are counted the second way, by their number.
2. decoded, before `conform` (`conformed_bytes`): the table as conform builds
   it. Fixed-width columns as above; a string or binary column at its decoded
   size, a dictionary-encoded one at the sum over the rows of its values'
   lengths (counted per dictionary value, never expanded), another type turned
   into text at `TEXT_BYTES_PER_VALUE` a row, a left-out one at its default's
   length a row.

Past the limit the block is refused: BSONObjectTooLarge (10334), as mongod
refuses a document past 16 MB. Why 256 MiB by default: mongod's limits are 16 MB
a document and 48 MB a message, and a block is many documents; writing it as
parts holds it two to four times at once (conformed, sorted, split per
partition, the Parquet writer's pages), so one 256 MiB block stays near 1 GiB,
and blocks of ClickHouse's `max_insert_block_size` (1,048,576 rows) of narrow
rows fit.

A block's rows may also fall into at most `maxPartitionsPerInsertBlock`
partitions (a table setting, ClickHouse's `max_partitions_per_insert_block`,
100; 0: no limit): each partition is a part written, committed and merged
apart, so a block spread over thousands would make thousands of tiny parts at
once. Past it: TooManyParts as this set answers ClickHouse's TOO_MANY_PARTS
(252) elsewhere, OperationFailed (96) - MongoDB's 252 is another error
(ReentrancyNotAllowed), which drivers must not be told.

Pure: sizes and tables in, numbers or a MongoError out.
"""

from __future__ import annotations

__layer__ = "core"  # pure: no I/O, clock or randomness (tests/unit/test_layering.py)

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from base.errors import MongoError
from oplog.parts.ipc_metadata import DICTIONARY_BATCH, RECORD_BATCH, BatchLayout
from oplog.parts.table import TableDef, arrow_type

BSON_OBJECT_TOO_LARGE = 10334
TOO_MANY_PARTS = 96    # OperationFailed (ClickHouse: TOO_MANY_PARTS), as `replset.parts.manager` answers it
DEFAULT_MAX_DECODED_BYTES = 256 << 20
BATCH_OVERHEAD_BYTES = 512    # a decoded record batch's objects (measured: ~1.2 KB for two columns)
BUFFER_OVERHEAD_BYTES = 256   # ... and each of its buffers'
TEXT_BYTES_PER_VALUE = 64     # a number, date or timestamp written as text (at most ~35 characters)
VALIDITY_BITS = 1


@dataclass(frozen=True, slots=True)
class StreamSize:
    """An Arrow stream's rows and the bytes its batches take decoded."""

    rows: int = 0
    decoded_bytes: int = 0
    batches: int = 0


def add_batch(size: StreamSize, layout: BatchLayout, decoded: int) -> StreamSize:
    """`size` with one more message counted (`decoded`: `ipc_metadata.decoded_bytes` of its body)."""
    if layout.kind not in (RECORD_BATCH, DICTIONARY_BATCH):
        return size
    rows = size.rows + (layout.rows if layout.kind == RECORD_BATCH else 0)
    overhead = BATCH_OVERHEAD_BYTES + BUFFER_OVERHEAD_BYTES * len(layout.buffers)
    return StreamSize(rows, size.decoded_bytes + decoded + overhead, size.batches + 1)


def _row_bits(type_: pa.DataType) -> int:
    """The bits a row of a column of this type takes, but a string's or binary's characters."""
    if pa.types.is_large_string(type_) or pa.types.is_large_binary(type_):
        return 64 + VALIDITY_BITS      # an offset
    if pa.types.is_string(type_) or pa.types.is_binary(type_):
        return 32 + VALIDITY_BITS
    return int(type_.bit_width) + VALIDITY_BITS


def _is_text(type_: pa.DataType) -> bool:
    return bool(pa.types.is_string(type_) or pa.types.is_large_string(type_) or pa.types.is_binary(type_)
                or pa.types.is_large_binary(type_))


def table_bytes(table: TableDef, rows: int) -> int:
    """The bytes `rows` rows take in the table's schema, but its strings' and binaries' characters."""
    bits = sum(_row_bits(arrow_type(column.type)) for column in table.columns)
    return (rows * bits + 7) // 8


def stream_bytes(table: TableDef, size: StreamSize) -> int:
    """What a stream is measured as before it is decoded (step 1 of the module doc)."""
    return max(size.decoded_bytes, table_bytes(table, size.rows))


def _dictionary_text_bytes(chunk: pa.DictionaryArray) -> int:
    """The characters of a dictionary-encoded text column once expanded: each value's length times the
    rows that name it (memory as the dictionary's, not the rows')."""
    if not _is_text(chunk.dictionary.type):
        return len(chunk) * TEXT_BYTES_PER_VALUE
    counts = pc.value_counts(chunk.indices)
    lengths = pc.binary_length(chunk.dictionary.take(counts.field("values"))).cast(pa.int64())
    total = pc.sum(pc.multiply(lengths, counts.field("counts"))).as_py()
    return int(total or 0)


def _text_bytes(chunks: Iterable[pa.Array]) -> int:
    total = 0
    for chunk in chunks:
        if isinstance(chunk, pa.DictionaryArray):
            total += _dictionary_text_bytes(chunk)
        elif _is_text(chunk.type):
            total += chunk.nbytes
        else:
            total += len(chunk) * TEXT_BYTES_PER_VALUE
    return total


def _default_bytes(default: Any) -> int:
    if isinstance(default, str):
        return len(default.encode())
    return len(default) if isinstance(default, (bytes, bytearray)) else 0


def conformed_bytes(table: TableDef, data: pa.Table) -> int:
    """What `part_files.conform(table, data)` will build (step 2 of the module doc)."""
    total = table_bytes(table, data.num_rows)
    for column in table.columns:
        if not _is_text(arrow_type(column.type)):
            continue
        if column.name in data.column_names:
            total += _text_bytes(data.column(column.name).chunks)
        else:
            total += data.num_rows * _default_bytes(column.default)
    return total


def check_decoded_size(what: str, decoded: int, limit: int) -> None:
    """BSONObjectTooLarge when `decoded` bytes are past `limit` (0: no limit)."""
    if limit and decoded > limit:
        raise MongoError(BSON_OBJECT_TOO_LARGE, f"{what}: the block decodes to {decoded:,} bytes, more than this "
                                                f"member's limit of {limit:,} (--maxDecodedBlockBytes): send "
                                                "its rows in smaller blocks")


def check_partitions(table: TableDef, partitions: int) -> None:
    """TooManyParts when a block's rows fall into more partitions than the table lets one block write."""
    limit = table.settings.max_partitions_per_insert_block
    if limit and partitions > limit:
        raise MongoError(TOO_MANY_PARTS, f"too many partitions for a single insert block into {table.ns} (more "
                                         f"than {limit}): the limit is the table setting "
                                         "maxPartitionsPerInsertBlock (ClickHouse's max_partitions_per_insert_block"
                                         "); every partition is a part written and merged apart: send rows of "
                                         "fewer partitions per block")
