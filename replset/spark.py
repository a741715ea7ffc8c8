"""The "replset" data source for PySpark: parts tables loaded exactly once, one commit per job, and read
a part per task; rows written into collections by `_id`.

    import replset.spark
    replset.spark.register(spark)
    (df.write.format("replset").option("uri", URI).option("table", "analytics.events")
       .option("insertQuorum", 2).mode("append").save())
    events = spark.read.format("replset").option("uri", URI).option("table", "analytics.events").load()

Theory of operation
-------------------
Spark 4's Python Data Source API (`pyspark.sql.datasource`). Everything here
runs in Spark's Python workers; the member is reached as any client reaches it
(pymongo, and the HTTP port for part files).

**Writes** (`DataSourceArrowWriter`): Spark's writer protocol, as Delta and
Iceberg use it; one job is one part-log commit (`replset.parts.jobs`). The
writer is made once per `save()` and pickled to every task attempt, so the
write id it draws (or the `writeId` option) is the job's. A task attempt cuts
its rows into blocks of `blockRows` (100,000), each cut again where its rows
fall into more than the table's `maxPartitionsPerInsertBlock` partitions (100),
and stages each with
`stagePartsBlock` (stage key `<Spark partition>:<task attempt id>:<block
index>`): written on the member, recorded through the primary, read by nobody.
Its commit message lists its stages, its rows and an order-free digest of them
(`rows_digest`). The driver's `commit` sends the stages of the attempts Spark
let commit to `commitPartsJob`: every part of the job becomes visible at once,
or none; a killed, failed or speculative attempt's stages are removed. The
committed write id is recorded in the table's replicated state: the same job run
again (same `writeId`, same rows in any order and any split) writes nothing,
and other rows under a committed write id fail the job. Whatever the dedup
window. `insertQuorum` applies to the job's commit (a quorum not reached fails
the job after its commit; `partsJobStatus` answers later).

* `abort` removes the job's stages (and the primary does after
  `stagedPartsTimeoutSecs` when no driver is left to).
* `mode("overwrite")`: the commit also drops every row the table had, in the
  same transaction (`replace`): a failed overwrite leaves the table as it
  was, and readers see the old rows or the new ones. Only `append` and
  `overwrite` are Spark's modes for Python sources.

ClickHouse has no atomic insert of many blocks: each of its blocks commits on
its own, and a retry is exactly-once only inside its dedup window.

**Collections** (`collection` instead of `table`, or `format("mongodb")` with
the MongoDB Spark Connector's option names): `replset.spark_collections`.

**Reads** (`DataSourceReader`, `PartsReader`). Planning fixes how many tasks
read (the table's size then, in `partitionBytes` slots of 128 MB). Which parts
they read is fixed when each action runs: its first task opens a snapshot on the
primary (`openPartsSnapshot`, keyed by the planning and Spark's SQL execution
id: its visible parts, with their copies and checksums, pinned on every member
for `snapshotTtlSecs`), and each task reads its slot of that one list, fetching
each part over the HTTP port from the first copy that serves it whole (every
byte checked) and reading it in the snapshot's schema as Arrow batches. Spark
replays one planning for every action on a loaded DataFrame; the snapshot per
action is what makes each action read the table as it is then. `filter` (a
MongoDB filter over the columns, Extended JSON, as `selectParts` takes it)
belongs to the load: its terms on the partition key prune parts (equality,
`$in`, and ranges on a `toYYYYMM` key), and the rows are filtered by it.
Spark's own filters are never used to prune parts: Spark 4.3 keeps the plan one
query's pushed filters pruned and hands it to the next query on the same
DataFrame that pushes none (a count after a filtered count answered the
filtered count), so `pushFilters` is not implemented and pushdown is left as
the session has it; Spark filters the rows. `columns` (a comma-separated list)
prunes columns.
"""

from __future__ import annotations

import asyncio
import base64
import concurrent.futures
import datetime
import io
import logging
import os
import shutil
import ssl
import tempfile
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp
import pyarrow as pa
from bson import json_util
from pymongo import MongoClient, ReadPreference, uri_parser
from pymongo.errors import ConnectionFailure, OperationFailure, PyMongoError, ServerSelectionTimeoutError
from pyspark import TaskContext
from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceReader,
    EqualTo,
    Filter,
    GreaterThan,
    GreaterThanOrEqual,
    In,
    InputPartition,
    LessThan,
    LessThanOrEqual,
    WriterCommitMessage,
)
from pyspark.sql.types import (
    BinaryType,
    BooleanType,
    ByteType,
    DataType,
    DateType,
    DecimalType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    ShortType,
    StringType,
    StructField,
    StructType,
    TimestampNTZType,
    TimestampType,
)
from tenacity import Retrying, retry_if_exception, stop_after_delay, wait_exponential_jitter

from base.errors import MongoError
from oplog.parts import part_files
from oplog.parts.filters import filter_expression
from oplog.parts.storage_url import REDACTED, part_key
from oplog.parts.table import TableDef, arrow_type, partition_id
from replset.spark_collections import (
    CollectionReader,
    CollectionWriter,
    MongoDataSource,
    infer_collection_schema,
)
from sync.part_fetch import FetchFailed, fetch_part

log = logging.getLogger(__name__)

BLOCK_ROWS = 100_000
COMMIT_RETRY_S = 120.0   # a job's commit is sent again for this long across a change of primary
PARTITION_BYTES = 128 << 20
FETCH_THREADS = 4       # parts of one task fetched at once
SNAPSHOT_TTL_S = 3600   # a query's parts are kept on every member this long (`openPartsSnapshot`)
READ_BATCH_ROWS = 65_536

# A column's Arrow type -> (Spark type, the Arrow type Spark reads it as).
_SPARK_TYPES: dict[str, tuple[DataType, pa.DataType]] = {
    "bool": (BooleanType(), pa.bool_()), "int8": (ByteType(), pa.int8()), "int16": (ShortType(), pa.int16()),
    "int32": (IntegerType(), pa.int32()), "int64": (LongType(), pa.int64()), "uint8": (ShortType(), pa.int16()),
    "uint16": (IntegerType(), pa.int32()), "uint32": (LongType(), pa.int64()),
    "uint64": (DecimalType(20, 0), pa.decimal128(20, 0)), "float32": (FloatType(), pa.float32()),
    "float64": (DoubleType(), pa.float64()), "string": (StringType(), pa.string()),
    "large_string": (StringType(), pa.string()), "binary": (BinaryType(), pa.binary()),
    "date32": (DateType(), pa.date32()),
    **{f"timestamp[{unit}]": (TimestampNTZType(), pa.timestamp("us")) for unit in ("s", "ms", "us", "ns")},
    **{f"timestamp[{unit}, tz=UTC]": (TimestampType(), pa.timestamp("us", tz="UTC")) for unit in ("ms", "us")},
}


def register(spark: Any) -> None:
    """Registers the "replset" data source, and "mongodb" for collections with the MongoDB Spark
    Connector's option names (`replset.spark_collections`), with `spark` (the session's settings are left
    as they are)."""
    spark.dataSource.register(ReplsetDataSource)
    spark.dataSource.register(MongoDataSource)


def _client(options: dict[str, str], **kwargs: Any) -> MongoClient[dict[str, Any]]:
    uri = options.get("uri")
    if not uri:
        raise ValueError("the replset data source needs the 'uri' option")
    return MongoClient(uri, serverSelectionTimeoutMS=30_000, **kwargs)


def _table_name(options: dict[str, str]) -> tuple[str, str]:
    full = options.get("table", "")
    db, _, name = full.partition(".")
    if not db or not name:
        raise ValueError("the 'table' option names a parts table as '<db>.<table>'")
    return db, name


def load_definition(client: MongoClient[dict[str, Any]], db: str, name: str) -> dict[str, Any]:
    doc = client[db].get_collection("system.parts", read_preference=ReadPreference.PRIMARY_PREFERRED).find_one(
        {"_id": name})
    if doc is None:
        raise ValueError(f"parts table {db}.{name} not found")
    return dict(doc)


def spark_schema(table: TableDef, columns: Sequence[str] | None = None) -> StructType:
    chosen = [c for c in table.columns if columns is None or c.name in columns]
    return StructType([StructField(c.name, _SPARK_TYPES[c.type][0], nullable=True) for c in chosen])


def _columns_option(options: dict[str, str]) -> list[str] | None:
    raw = options.get("columns")
    return [c.strip() for c in raw.split(",") if c.strip()] if raw else None


class ReplsetDataSource(DataSource):
    """`format("replset")`: a parts table (`table`: "<db>.<table>")."""

    @classmethod
    def name(cls) -> str:
        return "replset"

    def _definition(self) -> tuple[TableDef, dict[str, Any]]:
        db, name = _table_name(self.options)
        with _client(self.options) as client:
            doc = load_definition(client, db, name)
        return TableDef.from_document(db, doc), doc

    def schema(self) -> StructType:
        if "collection" in self.options:
            return infer_collection_schema(dict(self.options))
        table, _ = self._definition()
        return spark_schema(table, _columns_option(self.options))

    def reader(self, schema: StructType) -> DataSourceReader:
        if "collection" in self.options:
            return CollectionReader(dict(self.options), schema)
        _, doc = self._definition()
        return PartsReader(dict(self.options), doc, [f.name for f in schema.fields])

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceArrowWriter:
        if "collection" in self.options:
            return CollectionWriter(dict(self.options), overwrite)
        return PartsWriter(dict(self.options), overwrite)


# -- writes ----------------------------------------------------------------------------------------


@dataclass
class BlocksStaged(WriterCommitMessage):
    """What one task attempt staged: the stage ids, and its rows' count and order-free digest."""

    partition: int
    attempt: int
    stages: list[str]
    rows: int
    digest: int


def rows_digest(block: pa.Table) -> int:
    """The sum (mod 2**64) of a hash of each row: the same for the same rows in any order and any cut
    into blocks, so a job run again is recognised whatever its tasks saw first."""
    import pandas as pd  # pyspark[sql] brings it (its Arrow paths need it)

    hashes = pd.util.hash_pandas_object(block.to_pandas(), index=False).to_numpy(dtype="uint64")
    return int(hashes.sum(dtype="uint64"))


def _job_digest(staged: list[BlocksStaged]) -> str:
    return f"{sum(m.digest for m in staged) % (1 << 64):016x}"


class PartsWriter(DataSourceArrowWriter):
    def __init__(self, options: dict[str, str], overwrite: bool) -> None:
        self.options = options
        self.write_id = options.get("writeid") or uuid.uuid4().hex
        self.block_rows = int(options.get("blockrows", BLOCK_ROWS))
        if self.block_rows <= 0:
            raise ValueError("'blockRows' must be a positive number of rows")
        raw_quorum = options.get("insertquorum")
        self.quorum: int | str | None = None
        if raw_quorum is not None:
            self.quorum = raw_quorum if raw_quorum == "majority" else int(raw_quorum)
        self.db, self.table = _table_name(options)
        with _client(options) as client:
            status = client[self.db].command({"partsJobStatus": self.table, "writeId": self.write_id})
            self.definition = load_definition(client, self.db, self.table)   # (a document: pickled to tasks)
        # A write id committed before: the tasks only count and digest their rows, the commit compares.
        self.committed: dict[str, Any] | None = dict(status) if status.get("committed") else None
        self.overwrite = overwrite   # the table's rows replaced by the job's in its commit

    def write(self, iterator: Iterator[pa.RecordBatch]) -> BlocksStaged:
        context = TaskContext.get()
        partition = context.partitionId() if context is not None else 0
        attempt = context.taskAttemptId() if context is not None else uuid.uuid4().int >> 64
        stages: list[str] = []
        rows = digest = 0
        table = TableDef.from_document(self.db, self.definition)
        index = 0
        with _client(self.options) as client:
            db = client[self.db]
            for block in _blocks(iterator, self.block_rows):
                rows += block.num_rows
                digest = (digest + rows_digest(block)) % (1 << 64)
                if self.committed is not None:
                    continue
                for piece in partition_pieces(table, block):
                    reply = db.command({"stagePartsBlock": self.table, "arrow": _ipc(piece),
                                        "writeId": self.write_id, "stageKey": f"{partition}:{attempt}:{index}"})
                    stages.extend(str(s["stage"]) for s in reply["stages"])
                    index += 1
        return BlocksStaged(partition, attempt, stages, rows, digest)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        """The stages of the attempts Spark let commit, published as one part-log transaction."""
        staged = [m for m in messages if isinstance(m, BlocksStaged)]
        rows, digest = sum(m.rows for m in staged), _job_digest(staged)
        if self.committed is not None:
            if (int(self.committed["rows"]), str(self.committed["digest"])) != (rows, digest):
                raise RuntimeError(f"write {self.write_id!r} was committed into {self.db}.{self.table} with other "
                                   f"rows ({self.committed['rows']} rows; this job has {rows}): nothing was "
                                   "written; use a new writeId")
            log.warning("replset write %s into %s.%s was committed before (%d rows at %s): nothing written",
                        self.write_id, self.db, self.table, rows, self.committed.get("commitTime"))
            return
        command: dict[str, Any] = {"commitPartsJob": self.table, "writeId": self.write_id,
                                   "stages": [s for m in staged for s in m.stages], "rows": rows, "digest": digest,
                                   "attempt": uuid.uuid4().hex, "replace": self.overwrite,
                                   "writeConcern": {"w": "majority"}}
        if self.quorum is not None:
            command["insertQuorum"] = self.quorum
        with _client(self.options) as client:
            reply = _commit_with_retries(client[self.db], command)
        if "writeConcernError" in reply:
            raise RuntimeError(f"replset write {self.write_id}: committed, but {reply['writeConcernError']}")
        if self.quorum is not None and reply.get("quorumStatus", "reached") != "reached":
            raise RuntimeError(f"replset write {self.write_id}: committed, but insertQuorum {self.quorum} is "
                               f"{reply['quorumStatus']} (partsJobStatus / insertStatus answer later)")
        log.info("replset write %s into %s.%s: %d rows in %d parts from %d Spark partitions%s", self.write_id,
                 self.db, self.table, rows, len(reply.get("parts", ())), len(staged),
                 " (committed before: nothing new)" if reply.get("alreadyCommitted") else "")

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        """The job failed: its stages are removed (the primary removes them after `stagedPartsTimeoutSecs`
        anyway). Nothing of it was published."""
        if self.committed is not None:
            return
        try:
            with _client(self.options) as client:
                client[self.db].command({"abortPartsJob": self.table, "writeId": self.write_id})
        except PyMongoError as exc:
            log.warning("replset write %s into %s.%s failed and its abort failed too (%s): the primary removes "
                        "its staged blocks after stagedPartsTimeoutSecs", self.write_id, self.db, self.table, exc)


def partition_pieces(table: TableDef, block: pa.Table) -> Iterator[pa.Table]:
    """`block`, cut so that no piece's rows fall into more than the table's `maxPartitionsPerInsertBlock`
    partitions (a member refuses a block over more: TooManyParts), partitions in id order."""
    limit = table.settings.max_partitions_per_insert_block
    if not limit or table.partition.column is None:
        yield block
        return
    try:
        parts = part_files.split_by_partition(table, part_files.conform(table, block))
    except MongoError:
        yield block   # rows the table refuses: the member says why
        return
    if len(parts) <= limit:
        yield block
        return
    ids = sorted(parts)
    for start in range(0, len(ids), limit):
        yield pa.concat_tables([parts[pid] for pid in ids[start:start + limit]])


def _ipc(block: pa.Table) -> bytes:
    sink = io.BytesIO()
    with pa.ipc.new_stream(sink, block.schema) as stream:
        stream.write_table(block)
    return sink.getvalue()


def _commit_with_retries(db: Any, command: dict[str, Any]) -> dict[str, Any]:
    """The commit, sent again (same attempt id: the primary recognises its own earlier try) while the
    failure is one a change of primary or a lost reply explains."""
    retrying = Retrying(retry=retry_if_exception(_retryable_commit_error), stop=stop_after_delay(COMMIT_RETRY_S),
                        wait=wait_exponential_jitter(multiplier=0.1, max=2.0), reraise=True)
    return dict(retrying(db.command, command))


def _retryable_commit_error(exc: BaseException) -> bool:
    if isinstance(exc, (ConnectionFailure, ServerSelectionTimeoutError)):
        return True
    return isinstance(exc, OperationFailure) and exc.has_error_label("RetryableWriteError")


def _blocks(batches: Iterator[pa.RecordBatch], rows: int) -> Iterator[pa.Table]:
    """The task's rows cut into tables of `rows` rows (the last one shorter), in the order they came."""
    pending: list[pa.RecordBatch] = []
    count = 0
    for batch in batches:
        while batch.num_rows:
            take = min(rows - count, batch.num_rows)
            pending.append(batch.slice(0, take))
            batch, count = batch.slice(take), count + take
            if count == rows:
                yield pa.Table.from_batches(pending)
                pending, count = [], 0
    if count:
        yield pa.Table.from_batches(pending)


# -- reads -----------------------------------------------------------------------------------------


@dataclass
class PartsSlot(InputPartition):
    """One task's share of a query's snapshot: slot `index` of `count` (`_pack`), of planning `plan`."""

    plan: str
    index: int
    count: int


def _pack(parts: list[dict[str, Any]], count: int) -> list[list[dict[str, Any]]]:
    """The snapshot's parts in `count` slots of about equal bytes: biggest first, each into the lightest
    slot (ties: the lowest). Every task computes the same slots from the same snapshot."""
    slots: list[list[dict[str, Any]]] = [[] for _ in range(count)]
    sizes = [0] * count
    for part in sorted(parts, key=lambda p: (-int(p.get("bytes") or 0), str(p["name"]))):
        lightest = min(range(count), key=lambda i: (sizes[i], i))
        slots[lightest].append(part)
        sizes[lightest] += int(part.get("bytes") or 0)
    return slots


class PartsReader(DataSourceReader):
    """Planning decides how many tasks read (the table's size then, in `partitionBytes` slots); which
    parts they read is decided when the query runs: its first task opens a snapshot (`openPartsSnapshot`,
    keyed by this planning and Spark's SQL execution id), and every task of that query reads its slot of
    that same list. Spark replays one planning for every action on a DataFrame, so each action still
    gets its own snapshot: the table as it is when the action runs, pinned until it ends."""

    def __init__(self, options: dict[str, str], definition: dict[str, Any], columns: list[str]) -> None:
        self.options = options
        self.definition = definition
        self.columns = columns
        self.db, self.table = _table_name(options)
        self.query = _filter_option(options)   # the load's own filter: prunes parts, filters rows

    def _table(self) -> TableDef:
        return TableDef.from_document(self.db, self.definition)

    def partitions(self) -> list[InputPartition]:
        table = self._table()
        if self.query:
            filter_expression(self.query, table)   # a bad filter fails the planning, not every task
        with _client(self.options, readPreference=self.options.get("readpreference", "primary")) as client:
            status = client[self.db].command({"partsStatus": self.table})["parts"]
        prune = _pruning_filters(table, self.query)
        total = sum(int(p.get("bytes_on_disk") or 0) for p in status
                    if p.get("active") and _may_hold(table, p["partition_id"], prune))
        parts = sum(1 for p in status if p.get("active") and _may_hold(table, p["partition_id"], prune))
        limit = int(self.options.get("partitionbytes", PARTITION_BYTES))
        count = max(1, min(parts, -(-total // limit)))
        plan = uuid.uuid4().hex
        return [PartsSlot(plan, index, count) for index in range(count)]

    def _snapshot(self, slot: PartsSlot) -> dict[str, Any]:
        context = TaskContext.get()
        execution = context.getLocalProperty("spark.sql.execution.id") if context is not None else None
        query = execution if execution is not None else f"stage{context.stageId() if context else 0}"
        ttl = int(self.options.get("snapshotttlsecs", SNAPSHOT_TTL_S))
        with _client(self.options) as client:
            reply = client[self.db].command({"openPartsSnapshot": self.table, "key": f"{slot.plan}:{query}",
                                             "ttlSecs": ttl})
        # A zero-copy table's objects are read from the storage the member named (or the `partsStorage`
        # option: the same storage as this host reaches it), no member in the path. The member names it
        # redacted (oplog/parts/storage_url.py): a URL with a password or key in it comes from the option
        # only; without the option such a table's parts are fetched from the members.
        named = reply.get("partsStorage")
        storage = self.options.get("partsstorage") or (named if named and REDACTED not in named else None)
        return {**reply["snapshot"], "partsStorage": storage}

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, PartsSlot)
        snapshot = self._snapshot(partition)
        table = TableDef.from_document(self.db, snapshot["definition"])
        types = {c.name: _SPARK_TYPES[c.type][1] for c in table.columns}
        gone = [c for c in self.columns if c not in types]
        if gone:
            raise RuntimeError(f"column {gone[0]!r} of {self.db}.{self.table} was dropped after this DataFrame was "
                               "loaded: load() it again")
        wanted = {c: types[c] for c in self.columns}
        schema = pa.schema([pa.field(n, t) for n, t in wanted.items()])
        prune = _pruning_filters(table, self.query)
        expression = filter_expression(self.query, table) if self.query else None
        parts = [p for p in snapshot["parts"] if _may_hold(table, str(p["partition"]), prune)]
        ns = f"{self.db}.{self.table}"
        mine = _pack(parts, partition.count)[partition.index]
        # The slot's parts are fetched FETCH_THREADS at a time while the first ones are read, in order.
        with tempfile.TemporaryDirectory(prefix="replset-spark-") as directory:
            pool = concurrent.futures.ThreadPoolExecutor(FETCH_THREADS)
            try:
                shared = snapshot.get("partsStorage") if table.settings.zero_copy else None
                fetches = [pool.submit(self._fetch, ns, part, directory, table, shared) for part in mine]
                for part, fetch in zip(mine, fetches, strict=True):
                    fetch.result()
                    path = os.path.join(directory, part["name"])
                    for data in part_files.iter_part(path, table, READ_BATCH_ROWS):
                        if expression is not None:
                            data = data.filter(expression)
                        yield from data.select(list(wanted)).cast(schema).to_batches()
                    shutil.rmtree(path, ignore_errors=True)
            finally:
                pool.shutdown(wait=True, cancel_futures=True)

    def _fetch(self, ns: str, part: dict[str, Any], directory: str, table: TableDef, shared: str | None) -> None:
        """The part from the first of its copies that serves it whole (every byte checked against that
        copy's checksums, with the URI's login and TLS settings). A zero-copy table's part is read from the
        shared storage first (its metadata here, its objects checked there), from a member if that fails."""
        errors = []
        copies = list(part["holders"])   # the primary's own copy first
        if self.options.get("readpreference", "primary") != "primary":
            copies = copies[1:] + copies[:1]   # the other members' first, the primary's last
        for copy in copies:
            sums = {str(c["file"]): (int(c["size"]), str(c["sha256"])) for c in copy["checksums"]}
            if shared is not None:
                try:
                    key = part_key(table.uuid, str(part["partition"]), sums)
                    part_files.adopt_shared(directory, part["name"], shared, key, sums,
                                            f"{part_files.TMP_FETCH}{part['name']}")
                    return
                except (MongoError, OSError) as exc:
                    errors.append(f"the shared storage: {exc}")
                    shared = None   # its other copies name the same objects: from the members now
            try:
                asyncio.run(fetch_with_uri(self.options["uri"], str(copy["http"]), ns, part["name"], sums, directory))
                return
            except (FetchFailed, aiohttp.ClientError, OSError) as exc:
                errors.append(f"{copy['member']}: {exc}")
        raise RuntimeError(f"part {part['name']} of {ns} could not be read from any copy ({'; '.join(errors)}); "
                           "a scan longer than snapshotTtlSecs may find its parts gone")


async def fetch_with_uri(uri: str, http: str, ns: str, part: str, sums: dict[str, tuple[int, str]],
                         directory: str) -> None:
    """Fetches a part from a member's HTTP port as the connection string says to reach the set: its
    user and password as HTTP Basic (a set with access control), HTTPS checked against its
    `tlsCAFile` when it asks for TLS."""
    parsed = uri_parser.parse_uri(uri)
    options = parsed["options"]
    tls = bool(options.get("tls") or options.get("ssl"))
    login = f"{parsed['username']}:{parsed['password'] or ''}".encode()
    headers = {"Authorization": "Basic " + base64.b64encode(login).decode()} if parsed.get("username") else None
    connector = aiohttp.TCPConnector(ssl=ssl.create_default_context(cafile=options.get("tlsCAFile"))) if tls else None
    async with aiohttp.ClientSession(headers=headers, connector=connector) as session:
        await fetch_part(session, http, ns, part, sums, directory, scheme="https" if tls else "http")


def _filter_option(options: dict[str, str]) -> dict[str, Any] | None:
    """The `filter` option: a MongoDB filter over the table's columns, as Extended JSON."""
    raw = options.get("filter")
    if not raw:
        return None
    query = json_util.loads(raw, json_options=json_util.JSONOptions(tz_aware=True))
    if not isinstance(query, dict):
        raise ValueError("the 'filter' option is a MongoDB filter document (Extended JSON)")
    return query


_RANGES = {"$gt": GreaterThan, "$gte": GreaterThanOrEqual, "$lt": LessThan, "$lte": LessThanOrEqual}


def _pruning_filters(table: TableDef, query: dict[str, Any] | None) -> list[Filter]:
    """The terms of `query` on the partition key that every matching row satisfies (at its top level or in
    a top-level `$and`), as the filters `_may_hold` prunes by. Pruning need not be exact: the rows are
    filtered by the whole query."""
    column = table.partition.column
    if not query or column is None:
        return []
    out: list[Filter] = []
    for key, value in query.items():
        if key == "$and" and isinstance(value, list):
            out += [f for clause in value if isinstance(clause, dict) for f in _pruning_filters(table, clause)]
        elif key == column:
            terms = value.items() if isinstance(value, dict) and any(k.startswith("$") for k in value) \
                else [("$eq", value)]
            for op, arg in terms:
                if op == "$eq" and (v := _as_column(table, column, [arg])) is not None:
                    out.append(EqualTo((column,), v[0]))
                elif op == "$in" and isinstance(arg, list) and (v := _as_column(table, column, arg)) is not None:
                    out.append(In((column,), tuple(v)))
                elif op in _RANGES and (v := _as_column(table, column, [arg])) is not None:
                    out.append(_RANGES[op]((column,), v[0]))
    return out


def _as_column(table: TableDef, column: str, values: list[Any]) -> list[Any] | None:
    """`values` as the partition column holds them (a filter's 1.0 for an int64 key is the row's 1, and its
    partition is 1's), or None when one does not convert exactly: that term then prunes nothing."""
    col = table.column(column)
    if col is None:
        return None
    try:
        return pa.array(values).cast(arrow_type(col.type), safe=True).to_pylist()   # safe: 1.5 is no int64
    except (pa.ArrowException, TypeError, ValueError, OverflowError):
        return None


def _may_hold(table: TableDef, pid: str, filters: list[Filter]) -> bool:
    """Whether partition `pid` may hold rows that pass every pushed filter on the partition key."""
    key = table.partition
    for f in filters:
        if isinstance(f, EqualTo):
            values = [f.value]
        elif isinstance(f, In):
            values = list(f.value)
        elif key.by_month and pid.isdigit():
            if not _month_range_may_hold(pid, f):
                return False
            continue
        else:
            continue
        if key.by_month:
            months = {_month(v) for v in values if isinstance(v, (datetime.date, datetime.datetime))}
            if len(months) == len(values) and not any(abs(_month_index(pid) - m) <= 1 for m in months):
                return False   # a month either side: time zones never move a row further
        elif pid not in {partition_id(key, v) for v in values}:
            return False
    return True


def _month(value: datetime.date) -> int:
    return value.year * 12 + value.month - 1


def _month_index(pid: str) -> int:
    return int(pid[:4]) * 12 + int(pid[4:6]) - 1


def _month_range_may_hold(pid: str, f: Filter) -> bool:
    value = getattr(f, "value", None)
    if not isinstance(value, (datetime.date, datetime.datetime)):
        return True
    month, bound = _month_index(pid), _month(value)
    if isinstance(f, (GreaterThan, GreaterThanOrEqual)):
        return month >= bound - 1
    if isinstance(f, (LessThan, LessThanOrEqual)):
        return month <= bound + 1
    return True


