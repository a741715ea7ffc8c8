"""A collection's change stream as a Spark structured stream (`spark.readStream.format("mongodb")`), with
resume tokens as the stream's offsets.

    (spark.readStream.format("mongodb").schema("_id long, n long, operationType string")
       .option("connection.uri", URI).option("database", "shop").option("collection", "orders")
       .option("change.stream.lookup.full.document", "updateLookup").load())

Theory of operation
-------------------
A `SimpleDataSourceStreamReader`: Spark's driver asks for the events after an
offset, and checkpoints the offset each micro-batch ended at. An offset is a
change stream resume token (`{"resumeToken": <Extended JSON>}`): a new query
starts at the stream's position when it starts (`initialOffset`); a query
restarted from its checkpoint resumes after the last token it committed, so no
event is read twice or skipped. A micro-batch reads at most `maxEventsPerBatch`
(10,000) events and ends at its last event's token; a batch read again after a
failure (`readBetweenOffsets`) reads the same events, up to that token.

Each event is one row in the stream's schema (yours, or the collection's as
inferred): a field is taken from the event's `fullDocument` (inserts, replaces,
and updates when `change.stream.lookup.full.document` is `updateLookup`), `_id`
from its `documentKey` when there is no full document; the event's own fields
`operationType`, `clusterTime` (a timestamp) and `resumeToken` (Extended JSON)
fill columns of those names. With `change.stream.publish.full.document.only`
true, only events that carry a full document become rows, of its fields alone.
`aggregation.pipeline` filters the stream on the server. A value that does not
fit its column is null.
"""

from __future__ import annotations

import datetime
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
from bson import json_util
from bson.timestamp import Timestamp
from pyspark.sql.datasource import SimpleDataSourceStreamReader
from pyspark.sql.types import StructType

from replset.spark_collections import CollectionOptions, _column, _plain

MAX_EVENTS_PER_BATCH = 10_000
AWAIT_MS = 200
EVENT_FIELDS = ("operationType", "clusterTime", "resumeToken")


class ChangeStreamReader(SimpleDataSourceStreamReader):
    def __init__(self, options: dict[str, str], schema: StructType) -> None:
        self.opts = CollectionOptions.parse(options)
        self.schema = schema
        self.full_only = options.get("change.stream.publish.full.document.only", "false").lower() == "true"
        self.lookup = options.get("change.stream.lookup.full.document", "default")
        self.max_events = int(options.get("maxeventsperbatch", MAX_EVENTS_PER_BATCH))

    def _watch(self, client: Any, token: Any) -> Any:
        return client[self.opts.db][self.opts.coll].watch(
            list(self.opts.pipeline), resume_after=token, full_document=self.lookup, max_await_time_ms=AWAIT_MS,
            batch_size=min(self.max_events, 1_000))

    def initialOffset(self) -> dict[str, Any]:
        with self.opts.client() as client, self._watch(client, None) as stream:
            stream.try_next()   # the stream's position now (its postBatchResumeToken)
            return _offset(stream.resume_token)

    def read(self, start: dict[str, Any]) -> tuple[Iterator[tuple[Any, ...]], dict[str, Any]]:
        events = []
        with self.opts.client(tz_aware=True) as client, self._watch(client, _token(start)) as stream:
            while len(events) < self.max_events:
                event = stream.try_next()
                if event is None:
                    break
                events.append(event)
        # The last event's own token (never the batch's position past it: a replay stops exactly there).
        end = _offset(events[-1]["_id"]) if events else start   # no event: no new micro-batch
        return iter(self._rows(events)), end

    def readBetweenOffsets(self, start: dict[str, Any], end: dict[str, Any]) -> Iterator[tuple[Any, ...]]:
        events = []
        stop = _token(end)
        with self.opts.client(tz_aware=True) as client, self._watch(client, _token(start)) as stream:
            while (event := stream.try_next()) is not None:
                events.append(event)
                if event["_id"] == stop:
                    break
        return iter(self._rows(events))

    def commit(self, end: dict[str, Any]) -> None:
        """Nothing to release: the checkpoint keeps the token."""

    def _rows(self, events: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
        from pyspark.sql.pandas.types import to_arrow_type

        docs = []
        for event in events:
            full = event.get("fullDocument")
            if full is None and self.full_only:
                continue
            doc = dict(full) if full is not None else dict(event.get("documentKey", {}))
            if not self.full_only:
                doc.update({"operationType": event.get("operationType"),
                            "clusterTime": _cluster_time(event.get("clusterTime")),
                            "resumeToken": json_util.dumps(event.get("_id"))})
            docs.append(doc)
        if not docs:
            return []
        columns = [_column([_plain(d.get(f.name)) for d in docs], to_arrow_type(f.dataType, timezone="UTC"),
                           name=f.name) for f in self.schema.fields]
        table = pa.Table.from_arrays(columns, names=[f.name for f in self.schema.fields])
        return [tuple(row.values()) for row in table.to_pylist()]


def _offset(token: Any) -> dict[str, Any]:
    return {"resumeToken": json_util.dumps(token)}


def _token(offset: dict[str, Any]) -> Any:
    return json_util.loads(offset["resumeToken"]) if offset.get("resumeToken") else None


def _cluster_time(value: Any) -> datetime.datetime | None:
    if isinstance(value, Timestamp):
        return value.as_datetime()
    return value if isinstance(value, datetime.datetime) else None
