"""Parts on disk: one directory per part, written under a temporary name and renamed when complete.

    <dbpath>/parts/<db>.<table>/<part_name>/
        data.parquet     the rows, sorted by the table's order key (every page with its CRC-32)
        columns.txt      the columns and their Arrow types, one per line
        checksums.txt    every other file's size and SHA-256

A part is written into `tmp_insert_<name>` (an insert), `tmp_merge_<name>` (a
merge or mutation) or `tmp-fetch_<name>` (a fetch), each file fsynced, then
renamed to `<name>` and the parent directory fsynced: a crash leaves either no
part or a whole one, plus temporary directories that start-up removes. The
same rows always make the same bytes (sorted, row groups of `ROW_GROUP_ROWS`,
fixed compression), so replicas that merge the same parts get byte-identical
parts and compare them by checksum. A merge streams (`iter_merged`, a k-way
merge): it holds a batch of each source and a row group, not the sources, and
writes the bytes a merge in memory would.

Bytes are checked end to end: every Parquet page carries a CRC-32, verified on every read
(ClickHouse's per-block checksums), so a damaged page fails the read instead of answering other
rows; `verify_part` checks whole files against `checksums.txt` and against the checksums the part
log recorded (a merge checks its sources so before it reads them); `part_signature` tells a file
rewritten since it was last verified. A damaged part is moved aside as `broken_<name>_<time>`,
never deleted.

A zero-copy part (docs/zero-copy.md) keeps its `data.parquet` once in shared storage: its directory
holds `columns.txt`, `checksums.txt` and `storage.txt` (where the data is). `data_source`,
`verify_part`, `check_sizes` and `part_signature` read either kind.

A shell: file I/O and pyarrow. The decisions (names, covering, what to merge)
are the pure modules beside it.
"""

from __future__ import annotations

import hashlib
import io
import os
import shutil
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from base.errors import MongoError
from oplog.durable_files import fsync_path
from oplog.parts import shared_storage
from oplog.parts.block_size import check_partitions
from oplog.parts.part_info import PartInfo
from oplog.parts.storage_url import redact_url
from oplog.parts.table import TableDef, arrow_type, partition_id

DATA_FILE = "data.parquet"
COLUMNS_FILE = "columns.txt"
CHECKSUMS_FILE = "checksums.txt"
PART_FILES = (DATA_FILE, COLUMNS_FILE, CHECKSUMS_FILE)
# A zero-copy part's directory holds this in place of its data file: the storage URL and the part's key
# there (`externalize`; docs/zero-copy.md). Every read of its rows goes through `data_source`.
STORAGE_FILE = "storage.txt"
TMP_INSERT, TMP_MERGE, TMP_FETCH = "tmp_insert_", "tmp_merge_", "tmp-fetch_"
TEMPORARY_PREFIXES = (TMP_INSERT, TMP_MERGE, TMP_FETCH, "tmp_")
COMPRESSION = "zstd"
ROW_GROUP_ROWS = 1_000_000
PARTITION_VALUES_STEP = 1024   # distinct partition-key values turned into partition ids at a time
INSECURE_PATH = 2  # BadValue: a file name that would leave the part directory


@dataclass(frozen=True, slots=True)
class PartFiles:
    """A part as written: its name, rows, bytes on disk and per-file checksums."""

    name: str
    rows: int
    bytes: int
    checksums: dict[str, tuple[int, str]]


def check_file_name(name: str) -> str:
    """`name` if it is one of a part's own files; refuses anything that could leave the part directory."""
    if name not in PART_FILES or os.path.basename(name) != name:
        raise MongoError(INSECURE_PATH, f"{name!r} is not a part file (one of {', '.join(PART_FILES)})")
    return name


def check_part_dir_name(name: str) -> str:
    if not name or name in (".", "..") or "/" in name or "\\" in name or "\x00" in name:
        raise MongoError(INSECURE_PATH, f"{name!r} is not a part name")
    return name


def arrow_schema(table: TableDef) -> pa.Schema:
    return pa.schema([pa.field(c.name, arrow_type(c.type)) for c in table.columns])


def conform(table: TableDef, data: pa.Table) -> pa.Table:
    """`data` in the table's schema: columns in order, cast to their types, absent ones filled with their
    defaults. A column the table does not have is refused (MongoError 2), as is a value that does not cast."""
    unknown = [name for name in data.column_names if table.column(name) is None]
    if unknown:
        raise MongoError(2, f"{table.ns} has no column(s) {', '.join(unknown)}; its columns are "
                            f"{', '.join(c.name for c in table.columns)}")
    arrays = []
    for column in table.columns:
        type_ = arrow_type(column.type)
        if column.name in data.column_names:
            try:
                arrays.append(data.column(column.name).cast(type_))
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
                raise MongoError(2, f"column {column.name!r}: {exc}") from None
        else:
            arrays.append(pa.repeat(pa.scalar(column.default, type=type_), data.num_rows))   # no list of rows
    return pa.Table.from_arrays(arrays, schema=arrow_schema(table))


def sort_rows(table: TableDef, data: pa.Table) -> pa.Table:
    """Sorted by the order key, then by the other columns: the same rows in any order sort the same,
    so they make the same bytes (and the same block id)."""
    if data.num_rows < 2:
        return data
    keys = [*table.order_by, *(name for name in data.column_names if name not in table.order_by)]
    indices = pc.sort_indices(data, sort_keys=[(name, "ascending", "at_end") for name in keys])
    return data.take(indices)


def split_by_partition(table: TableDef, data: pa.Table, *, insert: bool = False) -> dict[str, pa.Table]:
    """The rows of each partition, sorted by the order key; partitions in id order. An `insert` block's
    rows may fall into `maxPartitionsPerInsertBlock` partitions at most (TooManyParts past it, found
    before a partition's rows are copied)."""
    key = table.partition
    if key.column is None:
        return {"all": sort_rows(table, data)}
    column = data.column(key.column)
    if key.by_month:   # computed by Arrow over the whole column; one Python step per distinct month
        column = pc.add(pc.multiply(pc.year(column), 10_000), pc.multiply(pc.month(column), 100))
    encoded = pc.dictionary_encode(column).combine_chunks()
    nulls = pc.is_null(encoded.indices)
    has_nulls = bool(pc.any(nulls).as_py())
    if has_nulls and key.by_month:
        raise MongoError(2, f"toYYYYMM({key.column}): a row has no value (null is not a date)")
    groups = _partition_groups(table, encoded.dictionary, insert=insert)
    if insert and has_nulls:
        check_partitions(table, len(groups | {partition_id(key, None): []}))
    out = {}
    for pid, indices in sorted(groups.items()):
        mask = pc.is_in(encoded.indices, pa.array(indices, encoded.indices.type))
        out[pid] = sort_rows(table, data.filter(mask))
    if has_nulls:
        pid = partition_id(key, None)
        rows = data.filter(nulls)
        out[pid] = sort_rows(table, pa.concat_tables([out[pid].select(rows.column_names), rows])) if pid in out \
            else sort_rows(table, rows)
    return dict(sorted(out.items()))


def _partition_groups(table: TableDef, values: pa.Array, *, insert: bool) -> dict[str, list[int]]:
    """The partition of each distinct partition-key value, as the indices of the values in each; an
    insert's counted as they are found (a key of a million values stops at the limit)."""
    key = table.partition
    groups: dict[str, list[int]] = {}
    for start in range(0, len(values), PARTITION_VALUES_STEP):
        for index, value in enumerate(values.slice(start, PARTITION_VALUES_STEP).to_pylist(), start):
            pid = f"{value // 10_000:04d}{value // 100 % 100:02d}" if key.by_month else partition_id(key, value)
            groups.setdefault(pid, []).append(index)
        if insert:
            check_partitions(table, len(groups))
    return groups


def rows_bytes(data: pa.Table) -> bytes:
    """The rows in a canonical serialised form (Arrow IPC stream): what a block id hashes."""
    sink = io.BytesIO()
    with pa.ipc.new_stream(sink, data.schema) as writer:
        writer.write_table(data)
    return sink.getvalue()


def _sha256(path: str) -> tuple[int, str]:
    digest, size = hashlib.sha256(), 0
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
            size += len(chunk)
    return size, digest.hexdigest()


def _write_file(path: str, write: Any) -> None:
    with open(path, "wb") as f:
        write(f)
        f.flush()
        os.fsync(f.fileno())


def columns_text(table: TableDef) -> str:
    return "columns format version: 1\n" + f"{len(table.columns)} columns:\n" + "".join(
        f"`{c.name}` {c.type}\n" for c in table.columns) + f"metadata version: {table.metadata_version}\n"


def part_metadata_version(part_dir: str) -> int:
    """The table's metadata version when the part was written (0 when its columns.txt does not say)."""
    try:
        with open(os.path.join(part_dir, COLUMNS_FILE), encoding="utf-8") as f:
            lines = f.read().splitlines()
    except OSError:
        return 0
    last = lines[-1] if lines else ""
    return int(last.rpartition(": ")[2]) if last.startswith("metadata version: ") else 0


def checksums_text(checksums: Mapping[str, tuple[int, str]]) -> str:
    return "checksums format version: 1\n" + "".join(
        f"{name}\t{size}\t{digest}\n" for name, (size, digest) in sorted(checksums.items()))


def parse_checksums(text: str) -> dict[str, tuple[int, str]]:
    lines = text.splitlines()
    if not lines or lines[0] != "checksums format version: 1":
        raise MongoError(2, "not a checksums.txt of format version 1")
    result = {}
    for line in lines[1:]:
        name, size, digest = line.split("\t")
        result[check_file_name(name)] = (int(size), digest)
    return result


def write_checksums(part_dir: str, checksums: Mapping[str, tuple[int, str]]) -> None:
    _write_file(os.path.join(part_dir, CHECKSUMS_FILE), lambda f: f.write(checksums_text(checksums).encode()))


def write_temp_part(table_dir: str, tmp_name: str, data: pa.Table, table: TableDef) -> PartFiles:
    """Writes `data` (conformed and sorted) as a whole part in the directory `tmp_name` (a temporary
    name: `publish` gives it its part name), every file and the directory fsynced."""
    return write_temp_part_streaming(table_dir, tmp_name, [data], table)


UNEXPECTED_PREFIX = "unexpected_"   # a part no log entry names
BROKEN_PREFIX = "broken_"           # a part whose bytes failed their checksums


def publish(table_dir: str, tmp_name: str, name: str, *, sync: bool = True) -> None:
    """Renames a temporary part to its part name (`sync`: and fsyncs the table directory)."""
    final = os.path.join(table_dir, check_part_dir_name(name))
    if os.path.exists(final):
        raise MongoError(2, f"part {name} already exists in {table_dir}")
    os.rename(os.path.join(table_dir, check_part_dir_name(tmp_name)), final)
    if sync:
        fsync_path(table_dir)


def write_part(table_dir: str, name: str, data: pa.Table, table: TableDef, *, prefix: str = TMP_INSERT) -> PartFiles:
    """Writes `data` (conformed and sorted) as part `name` under `table_dir`, atomically."""
    check_part_dir_name(name)
    tmp_name = prefix + name
    files = write_temp_part(table_dir, tmp_name, data, table)
    try:
        publish(table_dir, tmp_name, name)
    except MongoError:
        shutil.rmtree(os.path.join(table_dir, tmp_name), ignore_errors=True)
        raise
    return PartFiles(name, files.rows, files.bytes, files.checksums)


def read_checksums(part_dir: str) -> dict[str, tuple[int, str]]:
    with open(os.path.join(part_dir, CHECKSUMS_FILE), encoding="utf-8") as f:
        return parse_checksums(f.read())


# -- zero-copy parts ------------------------------------------------------------------------------

def shared_location(part_dir: str) -> tuple[str, str] | None:
    """A zero-copy part's (storage URL, key); None when its data file is here."""
    try:
        with open(os.path.join(part_dir, STORAGE_FILE), encoding="utf-8") as f:
            lines = f.read().splitlines()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise MongoError(2, f"unreadable {STORAGE_FILE}: {exc}") from None
    if len(lines) < 2 or not lines[0] or not lines[1]:
        raise MongoError(2, f"{STORAGE_FILE} does not name a storage and a key")
    return lines[0], lines[1]


def _write_location(part_dir: str, url: str, key: str) -> None:
    """`STORAGE_FILE`: what `shared_location` reads back."""
    _write_file(os.path.join(part_dir, STORAGE_FILE), lambda f: f.write(f"{url}\n{key}\n".encode()))


def data_source(part_dir: str) -> pa.NativeFile:
    """The part's data file, opened: here, or (a zero-copy part) its object in shared storage."""
    shared = shared_location(part_dir)
    if shared is None:
        return pa.OSFile(os.path.join(part_dir, DATA_FILE))
    url, key = shared
    return shared_storage.for_url(url).open_file(key, DATA_FILE)


def externalize(part_dir: str, url: str, key: str, *, keep_data: bool = False) -> None:
    """Makes the (temporary) part in `part_dir` a zero-copy part: its files are published under `key` in
    the storage at `url` (verified there), then the directory names them there (`STORAGE_FILE`) and its
    data file goes - unless `keep_data` (an insert's, until its commit is published: `settle_shared`). Run
    again after a crash, it finds the part published and finishes."""
    shared_storage.for_url(url).put_part(key, part_dir)
    _write_location(part_dir, url, key)
    if not keep_data:
        settle_shared(part_dir)
    fsync_path(part_dir)


def settle_shared(part_dir: str) -> None:
    """A zero-copy part that still holds its own data file (an insert's, kept until its commit was
    published): its objects are put again if they are gone (an insert whose commit took longer than the
    storage's grace for unmarked objects), then the data file here goes. Raises, keeping the file, when
    the storage fails: then it is the part's only copy."""
    shared = shared_location(part_dir)
    data = os.path.join(part_dir, DATA_FILE)
    if shared is None or not os.path.exists(data):
        return
    shared_storage.for_url(shared[0]).put_part(shared[1], part_dir)
    os.unlink(data)
    fsync_path(part_dir)


def adopt_shared(table_dir: str, name: str, url: str, key: str, recorded: Mapping[str, tuple[int, str]],
                 tmp_name: str) -> None:
    """A zero-copy part's fetch: the part published under `key` in the storage at `url`, checked against
    the checksums the part log `recorded` (every byte of its objects is read), becomes part `name` here
    with its metadata only (written as `tmp_name`, then published). BadValue when the objects are not that
    part, OSError when the storage did not answer."""
    storage = shared_storage.for_url(url)
    stored = storage.published(key)
    if stored is None:
        raise MongoError(2, f"{key} is not published in {redact_url(url)}")
    if any(stored.checksums.get(file) != sums for file, sums in recorded.items() if file != CHECKSUMS_FILE):
        raise MongoError(2, f"{key} in {redact_url(url)} holds other bytes than the part log recorded for {name}")
    tmp = os.path.join(table_dir, check_part_dir_name(tmp_name))
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        storage.download(key, tmp, skip=(DATA_FILE,))
        why = storage.verify_file(key, DATA_FILE, stored.checksums[DATA_FILE])
        if why is not None:
            raise MongoError(2, why)
        _write_location(tmp, url, key)
        fsync_path(tmp)
        publish(table_dir, tmp_name, name)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def verify_part(part_dir: str, recorded: Mapping[str, tuple[int, str]] | None = None) -> str | None:
    """Why the part directory is not a whole, intact part (None: it is): every file against its
    `checksums.txt` and, given `recorded` (what the part log recorded for the part), against that too.
    Raises `shared_storage.StorageUnavailable` when a zero-copy part's storage did not answer (nothing is
    known of its bytes then: not damage)."""
    try:
        expected = read_checksums(part_dir)
    except (OSError, ValueError, MongoError) as exc:
        return f"no readable {CHECKSUMS_FILE}: {exc}"
    for file, sums in (recorded or {}).items():
        if file != CHECKSUMS_FILE and expected.get(file) != sums:
            return f"{CHECKSUMS_FILE} records other bytes for {file} than the part log"
    try:
        shared = shared_location(part_dir)
    except MongoError as exc:
        return exc.errmsg
    for file, (size, digest) in expected.items():
        # A zero-copy part's data file is checked in the storage - unless it is still here (an insert's or a
        # staged block's, kept until its commit is published): the copy here is what a publish relies on.
        if shared is not None and file == DATA_FILE and not os.path.exists(os.path.join(part_dir, file)):
            why = shared_storage.for_url(shared[0]).verify_file(shared[1], file, (size, digest))
            if why is not None:
                return why
            continue
        path = os.path.join(part_dir, file)
        if not os.path.exists(path):
            return f"{file} is missing"
        if _sha256(path) != (size, digest):
            return f"{file} does not match its checksum"
    return None


def check_sizes(part_dir: str) -> str | None:
    """A cheap check (ClickHouse's at start-up): every file of `checksums.txt` is there with its size."""
    try:
        expected = read_checksums(part_dir)
    except (OSError, ValueError, MongoError) as exc:
        return f"no readable {CHECKSUMS_FILE}: {exc}"
    try:
        shared = shared_location(part_dir)
    except MongoError as exc:
        return exc.errmsg
    for file, (size, _digest) in expected.items():
        try:
            if shared is not None and file == DATA_FILE and not os.path.exists(os.path.join(part_dir, file)):
                here = shared_storage.for_url(shared[0]).file_size(shared[1], file)
            else:
                here = os.path.getsize(os.path.join(part_dir, file))
        except OSError:
            return f"{file} is missing"
        if here != size:
            return f"{file} is not of its recorded size"
    return None


Signature = tuple[tuple[str, int, int, int], ...]


def part_signature(part_dir: str) -> Signature:
    """What tells the part's files apart from a rewritten copy without reading them: each file's inode,
    size and modification time (() when the part is gone)."""
    out = []
    files = PART_FILES if not os.path.exists(os.path.join(part_dir, STORAGE_FILE)) else (
        STORAGE_FILE, COLUMNS_FILE, CHECKSUMS_FILE)   # a zero-copy part: its objects are never rewritten
    for file in files:
        try:
            st = os.stat(os.path.join(part_dir, file))
        except OSError:
            return ()
        out.append((file, st.st_ino, st.st_size, st.st_mtime_ns))
    return tuple(out)


def read_part(part_dir: str, table: TableDef, columns: Iterable[str] | None = None) -> pa.Table:
    """A part's rows in the table's current schema (columns added since it was written get defaults)."""
    with data_source(part_dir) as source:
        data = pq.read_table(source, page_checksum_verification=True)
    if table.changes:
        data = _through_changes(data, table, part_metadata_version(part_dir))
    present = [name for name in data.column_names if table.column(name) is not None]
    data = conform(table, data.select(present))
    if columns is not None:
        data = data.select(list(columns))
    return data


def iter_part(part_dir: str, table: TableDef, batch_rows: int) -> Iterator[pa.Table]:
    """A part's rows in the table's current schema, `batch_rows` at a time: what a read holds in
    memory is a batch (a Parquet row group is decoded as it is reached), not the part."""
    written_at = part_metadata_version(part_dir) if table.changes else 0
    with data_source(part_dir) as source:
        data_file = pq.ParquetFile(source, page_checksum_verification=True)
        for batch in data_file.iter_batches(batch_size=batch_rows):
            data = pa.Table.from_batches([batch])
            if table.changes:
                data = _through_changes(data, table, written_at)
            present = [name for name in data.column_names if table.column(name) is not None]
            yield conform(table, data.select(present))


def _through_changes(data: pa.Table, table: TableDef, written_at: int) -> pa.Table:
    """A part's columns as the renames and drops made since it was written left them."""
    names = list(data.column_names)
    for kind, column, new, version in sorted(table.changes, key=lambda c: c[3]):
        if version <= written_at or column not in names:
            continue
        if kind == "drop":
            data = data.drop_columns([column])
        else:
            data = data.rename_columns([new if n == column else n for n in data.column_names])
        names = list(data.column_names)
    return data


MERGE_BATCH_ROWS = 65_536   # rows read from each source part at a time by a merge


def _sort_keys(table: TableDef, names: list[str]) -> list[tuple[str, str, str]]:
    return [(name, "ascending", "at_end") for name in
            [*table.order_by, *(name for name in names if name not in table.order_by)]]


def iter_merged(table_dir: str, sources: Iterable[str], table: TableDef,
                batch_rows: int = MERGE_BATCH_ROWS) -> Iterator[pa.Table]:
    """The rows of the parts `sources` in the order `sort_rows` gives their concatenation (ties in
    source order), a chunk at a time: a k-way merge holding a batch of each source, not the sources.

    Each round sorts what the sources' batches hold and emits the rows up to the last row of the
    source whose last row is the smallest (the lowest-numbered among equals) - no row still unread
    can come before them. What a round does not emit stays, in each source's order, for the next."""
    readers = [iter_part(os.path.join(table_dir, check_part_dir_name(s)), table, batch_rows) for s in sources]
    schema = arrow_schema(table)
    held = [schema.empty_table() for _ in readers]
    more = [True for _ in readers]

    def refill(i: int) -> None:
        while more[i] and held[i].num_rows == 0:
            batch = next(readers[i], None)
            if batch is None:
                more[i] = False
            else:
                held[i] = batch

    for i in range(len(readers)):
        refill(i)
    while any(t.num_rows for t in held):
        keys = _sort_keys(table, held[0].column_names)
        filled = [i for i, t in enumerate(held) if t.num_rows]
        offsets, total = {}, 0
        for i in filled:
            offsets[i], total = total, total + held[i].num_rows
        rows = pa.concat_tables([held[i] for i in filled])
        order = pc.sort_indices(rows, sort_keys=keys)
        waiting = [i for i in filled if more[i]]   # sources with rows still unread
        if not waiting:
            yield rows.take(order)
            return
        lasts = pa.concat_tables([held[i].slice(held[i].num_rows - 1) for i in waiting])
        bound = waiting[pc.sort_indices(lasts, sort_keys=keys)[0].as_py()]
        cut = pc.index(order, offsets[bound] + held[bound].num_rows - 1).as_py() + 1
        yield rows.take(order.slice(0, cut))
        # The rest, back in concatenation order: each source's rows stay together and in order.
        rest = order.slice(cut)
        rest = rest.take(pc.sort_indices(rest))
        start = 0
        for i in filled:
            end = offsets[i] + held[i].num_rows
            count = pc.sum(pc.and_(pc.greater_equal(rest, offsets[i]), pc.less(rest, end))).as_py() or 0
            held[i] = rows.take(rest.slice(start, count))
            start += count
            refill(i)


def write_temp_part_streaming(table_dir: str, tmp_name: str, chunks: Iterable[pa.Table], table: TableDef) -> PartFiles:
    """Writes rows that arrive in sorted chunks as a whole part in the directory `tmp_name` (a temporary
    name: `publish` gives it its part name), a row group of `ROW_GROUP_ROWS` at a time (so the bytes
    do not depend on how the rows were chunked), every file and the directory fsynced."""
    if not tmp_name.startswith(TEMPORARY_PREFIXES):
        raise ValueError(f"{tmp_name!r} is not a temporary name")
    check_part_dir_name(tmp_name)
    os.makedirs(table_dir, exist_ok=True)
    tmp = os.path.join(table_dir, tmp_name)
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    rows = 0

    def write(f: Any) -> None:
        nonlocal rows
        writer: pq.ParquetWriter | None = None
        pending: list[pa.Table] = []
        pending_rows = 0

        def flush(group: pa.Table) -> None:
            nonlocal writer
            if writer is None:
                writer = pq.ParquetWriter(f, group.schema, compression=COMPRESSION, write_statistics=True,
                                          write_page_checksum=True)
            writer.write_table(group.combine_chunks(), row_group_size=ROW_GROUP_ROWS)

        for chunk in chunks:
            pending.append(chunk)
            pending_rows += chunk.num_rows
            rows += chunk.num_rows
            while pending_rows >= ROW_GROUP_ROWS:
                joined = pa.concat_tables(pending)
                flush(joined.slice(0, ROW_GROUP_ROWS))
                pending, pending_rows = [joined.slice(ROW_GROUP_ROWS)], pending_rows - ROW_GROUP_ROWS
        if pending_rows or writer is None:
            flush(pa.concat_tables(pending) if pending else arrow_schema(table).empty_table())
        assert writer is not None
        writer.close()

    _write_file(os.path.join(tmp, DATA_FILE), write)
    _write_file(os.path.join(tmp, COLUMNS_FILE), lambda f: f.write(columns_text(table).encode()))
    checksums = {file: _sha256(os.path.join(tmp, file)) for file in (DATA_FILE, COLUMNS_FILE)}
    write_checksums(tmp, checksums)
    fsync_path(tmp)
    return PartFiles(tmp_name, rows, sum(size for size, _ in checksums.values()), checksums)


def merge_to_temp(table_dir: str, sources: Iterable[str], tmp_name: str, table: TableDef) -> PartFiles:
    """Writes the merge of `sources` as the temporary part `tmp_name`, for the caller to check, then
    publish; streamed (`iter_merged`): what it holds is a batch per source and a row group."""
    return write_temp_part_streaming(table_dir, tmp_name, iter_merged(table_dir, sources, table), table)


def set_aside(table_dir: str, name: str, prefix: str = UNEXPECTED_PREFIX, *, wall_s: int) -> str | None:
    """Moves the part directory `name` out of the way as `<prefix><name>_<wall_s>` (the caller's wall
    clock, Unix seconds; ClickHouse's `unexpected_` and `broken_` parts): never read, never deleted.
    Returns the new path (None: it was not there)."""
    base = os.path.join(table_dir, f"{prefix}{check_part_dir_name(name)}_{wall_s}")
    path = base
    while os.path.exists(path):   # set aside twice within a second
        path = f"{base}_{os.urandom(3).hex()}"
    try:
        os.rename(os.path.join(table_dir, name), path)
    except FileNotFoundError:
        return None
    return path


def set_aside_names(table_dir: str, prefix: str) -> list[str]:
    """The part names of the directories `set_aside` moved out of the way with `prefix` (`<prefix><name>_<wall_s>`,
    maybe with `_<6 hex>` after it); a name that is no part's is left out."""
    names = []
    for entry in sorted(os.listdir(table_dir)) if os.path.isdir(table_dir) else []:
        if not entry.startswith(prefix):
            continue
        tokens = entry[len(prefix):].split("_")
        if len(tokens) > 2 and len(tokens[-1]) == 6 and tokens[-2].isdigit() and len(tokens[-2]) >= 10:
            tokens = tokens[:-1]
        if len(tokens) > 1 and tokens[-1].isdigit():
            try:
                names.append(PartInfo.parse("_".join(tokens[:-1])).name)
            except MongoError:
                continue
    return names


def remove_named(table_dir: str, tmp_names: list[str]) -> None:
    """Removes these temporary directories (gone already: nothing to do)."""
    for name in tmp_names:
        if name.startswith(TEMPORARY_PREFIXES):
            shutil.rmtree(os.path.join(table_dir, check_part_dir_name(name)), ignore_errors=True)


def remove_temporary(table_dir: str, *, keep: tuple[str, ...] = ()) -> list[str]:
    """Start-up: removes the temporary directories a crash left behind (but those starting with a
    prefix in `keep`); returns their names."""
    if not os.path.isdir(table_dir):
        return []
    removed = [entry for entry in sorted(os.listdir(table_dir))
               if entry.startswith(TEMPORARY_PREFIXES) and not entry.startswith(keep)]
    for entry in removed:
        shutil.rmtree(os.path.join(table_dir, entry), ignore_errors=True)
    return removed
