"""Inserts into a time-series collection: each measurement logged as its bucket's change (see
`oplog.timeseries`)."""

from __future__ import annotations

from typing import Any

from base.errors import MongoError
from oplog.entry import insert_entry, update_entry
from oplog.timeseries import (
    BucketCatalog,
    TimeseriesOptions,
    added_to_bucket,
    bucket_for,
    check_measurement,
    grew,
    measurement_size,
    new_bucket,
    opened,
)
from oplog.writes import WriteEnv, WriteResult, prepare_insert_document, run_statements


def insert_measurements(env: WriteEnv, buckets_ns: str, docs: list[Any], ordered: bool, ts: TimeseriesOptions,
                        catalog: BucketCatalog) -> WriteResult:
    """An insert command's measurements, each logged as its bucket's change (see the module docstring)."""
    if env.in_transaction:
        raise MongoError(263, "Cannot insert into a time-series collection in a multi-document transaction")
    result = WriteResult()
    info = env.txn.collection(buckets_ns)
    if info is None:
        raise MongoError(26, f"the buckets of {buckets_ns} are gone")

    def run_one(i: int) -> None:
        measurement = check_measurement(docs[i], ts)
        prepare_insert_document(measurement)  # (its size and depth, as any document's)
        size = measurement_size(measurement)
        found = bucket_for(catalog, buckets_ns, measurement, ts, size, lambda b: env.txn.get(buckets_ns, b))
        if found is None:
            bucket, start = new_bucket(measurement, ts)
            env.emit(insert_entry(buckets_ns, bucket, info.uuid))
            opened(catalog, buckets_ns, measurement, ts, bucket["_id"], start, size)
        else:
            current, position = found
            env.emit(update_entry(buckets_ns, current["_id"], added_to_bucket(current, measurement, ts, position),
                                  info.uuid))
            grew(catalog, buckets_ns, measurement, ts, size)
        result.n += 1

    return run_statements(env, len(docs), ordered, result, run_one)
