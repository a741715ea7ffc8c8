"""An insert's rows as the client sent them - BSON `rows`, JSON lines or an Arrow IPC stream - decoded into a
table, bounded by their decoded size before the memory is taken (`oplog.parts.block_size`).

Theory of operation
-------------------
`decode_block` looks the table up first: rows for a table that does not exist
are refused (26) before a byte of them is decoded. Then, on a worker thread:

* an Arrow stream's messages are read without decoding them (the metadata and
  8 bytes per compressed buffer: `oplog.parts.ipc_metadata`) and the stream is
  measured; only a stream within the member's limit is decompressed;
* BSON rows (decoded by the wire layer already, within its 48 MB message) are
  measured by their number, then turned into Arrow columns `ROWS_STEP` rows at a
  time: pyarrow holds the interpreter while it converts one list of Python
  values, so 600,000 rows at once would hold the event loop for over a second;
  between two steps the loop gets its turn. JSON lines are parsed the same
  steps at a time, so their Python objects never exist all at once;
* the decoded table is measured as `conform` will build it (dictionaries
  expanded, narrow columns widened, left-out columns filled) before anything
  builds it.

Past the limit: BSONObjectTooLarge (10334); what is not a stream or not rows:
BadValue (2).
"""

from __future__ import annotations

import asyncio
import io
import itertools
from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

import pyarrow as pa
from bson import json_util
from bson.errors import BSONError

from base.errors import MongoError
from oplog.parts.block_size import (
    StreamSize,
    add_batch,
    check_decoded_size,
    conformed_bytes,
    stream_bytes,
    table_bytes,
)
from oplog.parts.ipc_metadata import batch_layout, decoded_bytes
from oplog.parts.table import TableDef
from replset.parts.insert import load_table

if TYPE_CHECKING:
    from replset.node import Node

BAD_VALUE = 2
ROWS_STEP = 8192   # rows turned into Arrow columns at a time (a few milliseconds holding the interpreter)


def _unreadable(what: str, exc: Exception) -> MongoError:
    return MongoError(BAD_VALUE, f"{what}: the rows cannot be read as a table: {exc}")


def arrow_stream_size(stream: bytes, what: str) -> StreamSize:
    """The stream's rows and decoded bytes, from its messages' metadata: nothing is decompressed."""
    size = StreamSize()
    try:
        for message in pa.ipc.MessageReader.open_stream(pa.py_buffer(stream)):
            layout = batch_layout(message.metadata)
            body = message.body
            size = add_batch(size, layout, decoded_bytes(layout, body if body is not None else b""))
    except (pa.ArrowException, OSError, TypeError, ValueError) as exc:  # OSError: a malformed IPC stream
        raise _unreadable(what, exc) from None
    return size


def table_from_arrow(stream: bytes, table: TableDef, limit: int, what: str) -> pa.Table:
    """An Arrow IPC stream's rows, once its decoded size is known to be within `limit`."""
    check_decoded_size(what, stream_bytes(table, arrow_stream_size(stream, what)), limit)
    try:
        data = pa.ipc.open_stream(stream).read_all()
    except (pa.ArrowException, OSError, TypeError, ValueError) as exc:
        raise _unreadable(what, exc) from None
    return _within(_not_empty(data, what), table, limit, what)


def table_from_rows(rows: Sequence[Any], table: TableDef, limit: int, what: str) -> pa.Table:
    """Documents' rows, measured by their number first. The columns are the first row's fields (as
    pyarrow's `from_pylist` names them); a field another row has and the first not is left out."""
    check_decoded_size(what, table_bytes(table, len(rows)), limit)
    return table_from_row_steps((rows[i:i + ROWS_STEP] for i in range(0, len(rows), ROWS_STEP)),
                                table, limit, what)


def table_from_row_steps(steps: Iterable[Sequence[Any]], table: TableDef, limit: int, what: str) -> pa.Table:
    """Rows given a step at a time, each turned into Arrow columns before the next is taken; measured as
    they come (rows parsed lazily, from JSON lines, stop at the limit)."""
    names: list[str] | None = None
    pieces, rows = [], 0
    for step in steps:
        rows += len(step)
        check_decoded_size(what, table_bytes(table, rows), limit)
        if names is None and step:
            names = _fields(step[0], what)
        pieces.append(_columns(step, names or [], what))
    if not pieces:
        raise MongoError(BAD_VALUE, f"{what}: no rows")
    try:
        data = pa.concat_tables(pieces, promote_options="permissive").combine_chunks()
    except (pa.ArrowException, TypeError, ValueError) as exc:   # a field of two types in two steps
        raise _unreadable(what, exc) from None
    return _within(_not_empty(data, what), table, limit, what)


def _fields(row: Any, what: str) -> list[str]:
    if not isinstance(row, dict):
        raise MongoError(BAD_VALUE, f"{what}: each row must be a document, not {type(row).__name__}")
    return list(row)


def _columns(step: Sequence[Any], names: list[str], what: str) -> pa.Table:
    if not all(isinstance(row, dict) for row in step):
        raise MongoError(BAD_VALUE, f"{what}: each row must be a document")
    try:
        return pa.table({name: [row.get(name) for row in step] for name in names})
    except (pa.ArrowException, TypeError, ValueError) as exc:
        raise _unreadable(what, exc) from None


def json_line_steps(body: bytes, what: str) -> Iterator[list[Any]]:
    """JSON lines (MongoDB Extended JSON, one row a line), parsed `ROWS_STEP` lines at a time."""
    lines = (line for line in io.BytesIO(body) if line.strip())   # split as they are read
    while step := list(itertools.islice(lines, ROWS_STEP)):
        try:
            parsed = [json_util.loads(line) for line in step]
        except (ValueError, TypeError, OverflowError, BSONError) as exc:   # ({"$oid": "zz"}, {"$date": 1e400})
            raise MongoError(BAD_VALUE, f"{what}: the body is not JSON lines: {exc}") from None
        yield parsed


def _not_empty(data: pa.Table, what: str) -> pa.Table:
    if data.num_rows == 0:
        raise MongoError(BAD_VALUE, f"{what}: no rows")
    return data


def _within(data: pa.Table, table: TableDef, limit: int, what: str) -> pa.Table:
    """`data`, once what `conform` builds of it is known to be within `limit`."""
    try:
        size = conformed_bytes(table, data)
    except (pa.ArrowException, IndexError) as exc:   # a dictionary index past its dictionary
        raise _unreadable(what, exc) from None
    check_decoded_size(what, size, limit)
    return data


async def decode_block(node: Node, db: str, name: str, *, rows: Any = None, arrow: Any = None,
                       json_lines: bytes | None = None, what: str) -> pa.Table:
    """The rows of an insert into `db.name` (exactly one of `rows`, `arrow`, `json_lines`), decoded on a
    worker thread once the table is known to exist, within the member's `--maxDecodedBlockBytes`."""
    given = [r for r in (rows, arrow, json_lines) if r is not None]
    if len(given) != 1:
        raise MongoError(BAD_VALUE, f"{what} takes exactly one of 'rows' (an array of documents) and 'arrow' "
                                    "(Arrow IPC stream bytes)")
    table = load_table(node.store.reader, db, name)
    limit = node.options.max_decoded_block_bytes
    if rows is not None:
        return await asyncio.to_thread(table_from_rows, list(rows), table, limit, what)
    if json_lines is not None:
        return await asyncio.to_thread(lambda: table_from_row_steps(json_line_steps(json_lines, what), table,
                                                                    limit, what))
    stream = arrow if isinstance(arrow, bytes) else bytes(arrow)   # BSON binData is bytes: not copied
    return await asyncio.to_thread(table_from_arrow, stream, table, limit, what)
