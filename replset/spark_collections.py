"""Collections through Spark, with the MongoDB Spark Connector 10.x's option names: `format("mongodb")`
(or `format("replset")` with `collection`).

    (spark.read.format("mongodb").option("connection.uri", URI).option("database", "shop")
       .option("collection", "orders").option("aggregation.pipeline", '[{"$match": {"paid": true}}]').load())
    (df.write.format("mongodb").option("connection.uri", URI).option("database", "shop")
       .option("collection", "totals").option("operationType", "update").option("idFieldList", "day,shop")
       .mode("append").save())

Theory of operation
-------------------
**Reads.** The collection is split in `_id` ranges of about
`partitionDocuments` (100,000) documents by the member's `splitVector`, one
Spark partition per range. A range whose ends are of different BSON types
covers every type bracket between them (`id_range_filter`: MongoDB compares
within a type bracket only, so a plain `$gte`/`$lt` loses documents, as the
official connector's SPARK-221 did). With `aggregation.pipeline` (a JSON array
of stages, or one stage) each range runs `[{$match: <range>}, ...pipeline]` on
the server: its `$match` stages filter there. Spark's own filters are not pushed
down: Spark 4.3 reuses a load's plan with one query's pushed filters for the
next query (see `replset.spark`). The schema is the user's
(`spark.read.schema`) or inferred from the first `sampleSize` (1,000) documents
the pipeline gives. A value that does not fit its column reads as null
(`mode` PERMISSIVE, the default) or fails the task (`mode` FAILFAST); ObjectIds
read as their hex strings.

**Writes.** Rows are written in batches of `maxBatchSize` (or `batchSize`,
1,000), `ordered` (true), with `writeConcern.w` ("majority"),
`writeConcern.journal` and `writeConcern.wTimeoutMS`, as `operationType` says:
`replace` (the default: the document whose `idFieldList` fields, `_id` by
default, equal the row's is replaced, or inserted when `upsertDocument`, true,
allows), `update` (those fields' document gets the row's other fields by
`$set`), or `insert`. A row without `_id` (with `idFieldList` `_id`) gets one
made from the write id, its Spark partition and a hash of its values (with a
count of equal rows before it): a retried task writes the same documents under
the same `_id`s whatever order its rows come in, and an insert retried finds
its own documents there (a duplicate key on a made `_id` is taken as written).
`mode("overwrite")` drops the collection first.
"""

from __future__ import annotations

import datetime
import decimal
import hashlib
import itertools
import logging
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import bson
import pyarrow as pa
from bson import json_util
from bson.decimal128 import Decimal128
from pymongo import InsertOne, MongoClient, ReplaceOne, UpdateOne, WriteConcern
from pymongo.errors import BulkWriteError
from pyspark import TaskContext
from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceReader,
    InputPartition,
    WriterCommitMessage,
)
from pyspark.sql.types import StructType

from oplog import values

log = logging.getLogger(__name__)

PARTITION_DOCUMENTS = 100_000
SAMPLE_SIZE = 1_000
BATCH_SIZE = 1_000
READ_BATCH_ROWS = 65_536
DUPLICATE_KEY = 11000
OPERATIONS = ("replace", "update", "insert")
MODES = ("PERMISSIVE", "FAILFAST")


def _flag(raw: str | None, default: bool, name: str) -> bool:
    if raw is None:
        return default
    if raw.lower() not in ("true", "false"):
        raise ValueError(f"option {name!r} is true or false, not {raw!r}")
    return raw.lower() == "true"


@dataclass(frozen=True)
class CollectionOptions:
    """The options of a collection read or write (Spark passes option names in lower case)."""

    uri: str
    db: str
    coll: str
    pipeline: tuple[dict[str, Any], ...] = ()
    partition_documents: int = PARTITION_DOCUMENTS
    sample_size: int = SAMPLE_SIZE
    failfast: bool = False
    operation: str = "replace"
    upsert: bool = True
    id_fields: tuple[str, ...] = ("_id",)
    ordered: bool = True
    batch_size: int = BATCH_SIZE
    write_concern: tuple[Any, bool | None, int | None] = ("majority", None, None)

    @classmethod
    def parse(cls, options: dict[str, str]) -> CollectionOptions:
        uri = options.get("connection.uri") or options.get("uri")
        if not uri:
            raise ValueError("a collection needs the 'connection.uri' (or 'uri') option")
        name = options.get("collection", "")
        if options.get("database"):
            db, coll = options["database"], name
        else:
            db, _, coll = name.partition(".")
        if not db or not coll:
            raise ValueError("name the collection with 'database' and 'collection' (or 'collection' as '<db>.<coll>')")
        mode = options.get("mode", "PERMISSIVE").upper()
        operation = options.get("operationtype", "replace").lower()
        if mode not in MODES:
            raise ValueError(f"option 'mode' is one of {', '.join(MODES)}, not {mode!r}")
        if operation not in OPERATIONS:
            raise ValueError(f"option 'operationType' is one of {', '.join(OPERATIONS)}, not {operation!r}")
        raw_w = options.get("writeconcern.w") or options.get("writeconcern") or "majority"
        timeout = options.get("writeconcern.wtimeoutms")
        return cls(uri, db, coll, pipeline=_pipeline(options.get("aggregation.pipeline")),
                   partition_documents=int(options.get("partitiondocuments", PARTITION_DOCUMENTS)),
                   sample_size=int(options.get("samplesize", SAMPLE_SIZE)), failfast=mode == "FAILFAST",
                   operation=operation, upsert=_flag(options.get("upsertdocument"), True, "upsertDocument"),
                   id_fields=tuple(f.strip() for f in options.get("idfieldlist", "_id").split(",") if f.strip()),
                   ordered=_flag(options.get("ordered"), True, "ordered"),
                   batch_size=int(options.get("maxbatchsize") or options.get("batchsize") or BATCH_SIZE),
                   write_concern=(int(raw_w) if raw_w.isdigit() else raw_w,
                                  None if options.get("writeconcern.journal") is None
                                  else _flag(options["writeconcern.journal"], False, "writeConcern.journal"),
                                  int(timeout) if timeout else None))

    def client(self, **kwargs: Any) -> MongoClient[dict[str, Any]]:
        return MongoClient(self.uri, serverSelectionTimeoutMS=30_000, **kwargs)

    def concern(self) -> WriteConcern:
        w, journal, timeout = self.write_concern
        return WriteConcern(w=w, j=journal, wtimeout=timeout)


def _pipeline(raw: str | None) -> tuple[dict[str, Any], ...]:
    """`aggregation.pipeline`: Extended JSON, an array of stages or one stage."""
    if not raw:
        return ()
    try:
        parsed = json_util.loads(raw)
    except (ValueError, TypeError) as exc:
        raise ValueError(f"option 'aggregation.pipeline' is not JSON: {exc}") from None
    stages = parsed if isinstance(parsed, list) else [parsed]
    if not all(isinstance(s, dict) and len(s) == 1 for s in stages):
        raise ValueError("option 'aggregation.pipeline' holds stages: objects of one field each")
    return tuple(stages)


# -- reads -----------------------------------------------------------------------------------------


def _plain(value: Any) -> Any:
    """A BSON value as Arrow can hold it: ObjectId and other BSON-only types as strings."""
    if value is None or isinstance(value, (bool, int, float, str, bytes, datetime.datetime)):
        return value
    if isinstance(value, Decimal128):
        return value.to_decimal()
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return str(value)


class MalformedValue(ValueError):
    """A value that does not fit its column, read with `mode` FAILFAST."""


def _column(values: list[Any], arrow_type: pa.DataType | None = None, *, name: str = "",
            failfast: bool = False) -> pa.Array:
    """The values as one Arrow column (of `arrow_type` when given); a value that does not fit is null
    (or, `failfast`, an error naming it), and a column whose values share no type is strings."""
    try:
        return pa.array(values, type=arrow_type)
    except (pa.ArrowException, TypeError, ValueError, OverflowError):
        pass
    if arrow_type is None:
        return pa.array([None if v is None else str(v) for v in values], type=pa.string())
    out = []
    for value in values:
        try:
            out.append(pa.array([value], type=arrow_type)[0].as_py())
        except (pa.ArrowException, TypeError, ValueError, OverflowError):
            if failfast:
                raise MalformedValue(f"field {name!r}: {value!r} does not fit the column's type {arrow_type} "
                                     "(mode FAILFAST; PERMISSIVE reads it as null)") from None
            out.append(None)
    return pa.array(out, type=arrow_type)


def _sample(opts: CollectionOptions) -> list[dict[str, Any]]:
    with opts.client(tz_aware=True) as client:
        coll = client[opts.db][opts.coll]
        if opts.pipeline:
            return list(coll.aggregate([*opts.pipeline, {"$limit": opts.sample_size}]))
        return list(coll.find().limit(opts.sample_size))


def infer_collection_schema(options: dict[str, str]) -> StructType:
    """The fields of the first `sampleSize` documents (through the pipeline), `_id` first; their types
    as Arrow infers them."""
    from pyspark.sql.pandas.types import from_arrow_schema

    sample = [{k: _plain(v) for k, v in doc.items()} for doc in _sample(CollectionOptions.parse(options))]
    names: list[str] = []
    for doc in sample:
        names.extend(k for k in doc if k not in names)
    if "_id" in names:
        names.remove("_id")
        names.insert(0, "_id")
    fields = [pa.field(name, _column([d.get(name) for d in sample]).type) for name in names]
    fields = [f if not pa.types.is_null(f.type) else pa.field(f.name, pa.string()) for f in fields]
    return from_arrow_schema(pa.schema(fields))


@dataclass
class IdRange(InputPartition):
    """Documents with `lower <= _id < upper` in MongoDB's order of every BSON type; a range at an end of the
    collection has no bound there (`from_start`, `to_end`: a null `_id` is a bound like any other)."""

    lower: Any = None
    upper: Any = None
    from_start: bool = False
    to_end: bool = False


# The BSON type numbers of each rank of MongoDB's comparison order (MinKey, null, numbers, strings, ...).
_RANK_TYPES: dict[int, tuple[int, ...]] = {
    values.RANK_MINKEY: (-1,), values.RANK_NULL: (10, 6), values.RANK_NUMBER: (1, 16, 18, 19),
    values.RANK_STRING: (2, 14, 13, 15), values.RANK_OBJECT: (3, 12), values.RANK_ARRAY: (4,),
    values.RANK_BINARY: (5,), values.RANK_OBJECTID: (7,), values.RANK_BOOL: (8,), values.RANK_DATE: (9,),
    values.RANK_TIMESTAMP: (17,), values.RANK_REGEX: (11,), values.RANK_MAXKEY: (127,)}


def id_range_filter(lower: Any, upper: Any, *, from_start: bool = False, to_end: bool = False) -> dict[str, Any]:
    """The query for `lower <= _id < upper` across BSON types (`from_start` / `to_end`: no bound on that
    side). A comparison only matches values of its bound's type bracket (`{$lt: "a"}` never matches 1),
    so a range whose ends are of two types is three pieces: from `lower` to the end of its bracket,
    every bracket in between by `$type`, and the start of `upper`'s bracket up to `upper` (the official
    connector's SPARK-221 lost documents here)."""
    if from_start and to_end:
        return {}
    low = None if from_start else values.type_rank(lower)
    high = None if to_end else values.type_rank(upper)
    if low is not None and low == high:
        return {"_id": {"$gte": lower, "$lt": upper}}
    pieces: list[dict[str, Any]] = []
    if low is not None:   # (MinKey and MaxKey compare with every type: their brackets go by $type)
        pieces.append({"_id": {"$type": [-1]}} if low == values.RANK_MINKEY else {"_id": {"$gte": lower}})
    first = low + 1 if low is not None else values.RANK_MINKEY
    last = high - 1 if high is not None else values.RANK_MAXKEY
    between = [code for rank in range(first, last + 1) for code in _RANK_TYPES.get(rank, ())]
    if between:
        pieces.append({"_id": {"$type": between}})
    if high is not None and high != values.RANK_MAXKEY:
        pieces.append({"_id": {"$lt": upper}})
    return pieces[0] if len(pieces) == 1 else {"$or": pieces} if pieces else {"_id": {"$type": []}}


class CollectionReader(DataSourceReader):
    def __init__(self, options: dict[str, str], schema: StructType) -> None:
        self.opts = CollectionOptions.parse(options)
        self.schema = schema

    def partitions(self) -> list[InputPartition]:
        opts = self.opts
        with opts.client() as client:
            reply = client[opts.db].command({"splitVector": f"{opts.db}.{opts.coll}", "keyPattern": {"_id": 1},
                                             "maxChunkObjects": opts.partition_documents})
        keys = [key["_id"] for key in reply["splitKeys"]]
        bounds = [None, *keys, None]
        last = len(bounds) - 2
        return [IdRange(lower, upper, from_start=i == 0, to_end=i == last)
                for i, (lower, upper) in enumerate(itertools.pairwise(bounds))]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        from pyspark.sql.pandas.types import to_arrow_type

        assert isinstance(partition, IdRange)
        opts = self.opts
        types = {f.name: to_arrow_type(f.dataType, timezone="UTC") for f in self.schema.fields}
        query = id_range_filter(partition.lower, partition.upper, from_start=partition.from_start,
                                to_end=partition.to_end)
        with opts.client(tz_aware=True) as client:
            coll = client[opts.db][opts.coll]
            if opts.pipeline:   # the range first, then the user's stages, on the server
                cursor: Any = coll.aggregate([{"$match": query}, *opts.pipeline], batchSize=READ_BATCH_ROWS)
            else:
                cursor = coll.find(query, batch_size=READ_BATCH_ROWS)
            batch: list[dict[str, Any]] = []
            for doc in cursor:
                batch.append(doc)
                if len(batch) >= READ_BATCH_ROWS:
                    yield self._record_batch(batch, types)
                    batch = []
            if batch:
                yield self._record_batch(batch, types)

    def _record_batch(self, docs: list[dict[str, Any]], types: dict[str, pa.DataType]) -> pa.RecordBatch:
        return pa.RecordBatch.from_arrays([_column([_plain(d.get(name)) for d in docs], arrow_type, name=name,
                                                   failfast=self.opts.failfast)
                                           for name, arrow_type in types.items()], names=list(types))


# -- writes ----------------------------------------------------------------------------------------


@dataclass
class DocumentsWritten(WriterCommitMessage):
    partition: int
    upserted: int
    modified: int
    inserted: int


def _bson_value(value: Any) -> Any:
    """A value as Spark's Arrow rows give it, in a form BSON can hold."""
    if isinstance(value, decimal.Decimal):
        return Decimal128(value)
    if isinstance(value, datetime.date) and not isinstance(value, datetime.datetime):
        return datetime.datetime(value.year, value.month, value.day)
    if isinstance(value, dict):
        return {k: _bson_value(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_bson_value(v) for v in value]
    return value


class MadeIds:
    """`_id`s for one task's rows that have none: the write id, the Spark partition, a hash of the row's
    values and how many equal rows came before it in the task - the same ids in any row order."""

    def __init__(self, write_id: str, partition: int) -> None:
        self.prefix = f"{write_id}-{partition}-"
        self.seen: dict[str, int] = {}

    def next(self, doc: dict[str, Any]) -> str:
        digest = hashlib.blake2b(bson.encode(doc), digest_size=8).hexdigest()
        count = self.seen.get(digest, 0)
        self.seen[digest] = count + 1
        return f"{self.prefix}{digest}-{count}"


class CollectionWriter(DataSourceArrowWriter):
    """Rows into a collection (see the module doc)."""

    def __init__(self, options: dict[str, str], overwrite: bool) -> None:
        self.opts = CollectionOptions.parse(options)
        self.write_id = options.get("writeid") or uuid.uuid4().hex
        if overwrite:
            with self.opts.client() as client:
                client[self.opts.db].drop_collection(self.opts.coll)

    def _operation(self, doc: dict[str, Any]) -> Any:
        opts = self.opts
        if opts.operation == "insert":
            return InsertOne(doc)
        missing = [f for f in opts.id_fields if f not in doc]
        if missing:
            raise ValueError(f"a row has no {missing[0]!r}, a field of idFieldList {','.join(opts.id_fields)}")
        key = {f: doc[f] for f in opts.id_fields}
        if opts.operation == "replace":
            return ReplaceOne(key, doc, upsert=opts.upsert)
        changes = {k: v for k, v in doc.items() if k not in opts.id_fields and k != "_id"}
        return UpdateOne(key, {"$set": changes}, upsert=opts.upsert)

    def write(self, iterator: Iterator[pa.RecordBatch]) -> DocumentsWritten:
        context = TaskContext.get()
        partition = context.partitionId() if context is not None else 0
        made = MadeIds(self.write_id, partition)
        made_ids: set[str] = set()
        counts = DocumentsWritten(partition, 0, 0, 0)
        with self.opts.client() as client:
            coll = client[self.opts.db].get_collection(self.opts.coll, write_concern=self.opts.concern())
            pending: list[Any] = []
            for batch in iterator:
                for row in batch.to_pylist():
                    doc = {k: _bson_value(v) for k, v in row.items() if not (k == "_id" and v is None)}
                    if "_id" not in doc and self.opts.id_fields == ("_id",):
                        doc = {"_id": made.next(doc), **doc}
                        made_ids.add(doc["_id"])
                    pending.append((doc.get("_id"), self._operation(doc)))
                    if len(pending) >= self.opts.batch_size:
                        self._flush(coll, pending, made_ids, counts)
                        pending = []
            if pending:
                self._flush(coll, pending, made_ids, counts)
        return counts

    def _flush(self, coll: Any, pending: list[tuple[Any, Any]], made_ids: set[str], counts: DocumentsWritten) -> None:
        """One batch (`(_id, operation)` each). An insert sent again (a retried task) meets the documents its
        first attempt wrote under the same made `_id`s: those are written, and left out of what is sent
        again; any other error fails the task."""
        ops = pending
        while ops:
            try:
                details = coll.bulk_write([op for _id, op in ops], ordered=self.opts.ordered).bulk_api_result
                ops = []
            except BulkWriteError as exc:
                details = exc.details
                errors = details.get("writeErrors", ())
                others = [e for e in errors
                          if not (e.get("code") == DUPLICATE_KEY and e.get("op", {}).get("_id") in made_ids)]
                if others or details.get("writeConcernErrors"):
                    raise
                # An ordered batch stopped at its first such error: the rest goes on, without the made ids
                # already there (one look, not a stop per document). An unordered one tried them all.
                rest = ops[max(int(e["index"]) for e in errors) + 1:] if self.opts.ordered else []
                made = [_id for _id, _op in rest if _id in made_ids]
                there = {d["_id"] for d in coll.find({"_id": {"$in": made}}, {"_id": 1})} if made else set()
                ops = [(_id, op) for _id, op in rest if _id not in there]
            counts.upserted += int(details.get("nUpserted", 0))
            counts.modified += int(details.get("nModified", 0))
            counts.inserted += int(details.get("nInserted", 0))

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        written = [m for m in messages if isinstance(m, DocumentsWritten)]
        log.info("replset write %s into %s.%s (%s): %d inserted, %d upserted, %d modified, from %d Spark "
                 "partitions", self.write_id, self.opts.db, self.opts.coll, self.opts.operation,
                 sum(m.inserted for m in written), sum(m.upserted for m in written),
                 sum(m.modified for m in written), len(written))


class MongoDataSource(DataSource):
    """`format("mongodb")`: a collection, with the MongoDB Spark Connector's option names."""

    @classmethod
    def name(cls) -> str:
        return "mongodb"

    def schema(self) -> StructType:
        return infer_collection_schema(dict(self.options))

    def reader(self, schema: StructType) -> DataSourceReader:
        return CollectionReader(dict(self.options), schema)

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceArrowWriter:
        return CollectionWriter(dict(self.options), overwrite)

    def simpleStreamReader(self, schema: StructType) -> Any:
        """`spark.readStream`: the collection's change stream (`replset.spark_streams`)."""
        from replset.spark_streams import ChangeStreamReader

        return ChangeStreamReader(dict(self.options), schema)
