"""Time-series buckets: options, the bucket a measurement goes into, and unpacking them back."""

from __future__ import annotations

import datetime

import pytest

from base.errors import MongoError
from oplog.timeseries import (
    MAX_BUCKET_COUNT,
    BucketCatalog,
    added_to_bucket,
    bucket_for,
    expired_buckets_filter,
    grew,
    new_bucket,
    opened,
    parse_timeseries,
    unpack_bucket,
)
from oplog.update import apply_oplog_update

T0 = datetime.datetime(2026, 12, 1, 10, 0, 30)
TS = parse_timeseries({"timeField": "t", "metaField": "m"})


def test_options_as_mongod_checks_them() -> None:
    assert (TS.max_span_s, TS.rounding_s, TS.granularity) == (3600, 60, "seconds")
    hours = parse_timeseries({"timeField": "t", "granularity": "hours"})
    assert hours.to_document() == {"timeField": "t", "granularity": "hours", "bucketMaxSpanSeconds": 2592000}
    assert parse_timeseries(hours.to_document()) == hours  # (read back as stored)
    custom = parse_timeseries({"timeField": "t", "bucketMaxSpanSeconds": 600, "bucketRoundingSeconds": 600})
    assert (custom.max_span_s, custom.granularity) == (600, None)
    for bad in ({}, {"timeField": "a.b"}, {"timeField": "t", "metaField": "t"}, {"timeField": "t", "granularity": "days"},
                {"timeField": "t", "granularity": "hours", "bucketMaxSpanSeconds": 5},
                {"timeField": "t", "bucketMaxSpanSeconds": 600}, {"timeField": "t", "other": 1}):
        with pytest.raises(MongoError):
            parse_timeseries(bad)


def _insert(catalog: BucketCatalog, buckets: dict, doc: dict) -> None:
    """What insert_measurements does, over a dict of buckets."""
    size = 50
    found = bucket_for(catalog, "db.b", doc, TS, size, buckets.get)
    if found is None:
        bucket, start = new_bucket(doc, TS)
        buckets[bucket["_id"]] = bucket
        opened(catalog, "db.b", doc, TS, bucket["_id"], start, size)
    else:
        bucket, position = found
        buckets[bucket["_id"]] = apply_oplog_update(bucket, added_to_bucket(bucket, doc, TS, position))
        grew(catalog, "db.b", doc, TS, size)


def test_measurements_share_a_bucket_by_meta_and_time_and_unpack_as_they_went_in() -> None:
    catalog, buckets = BucketCatalog(), {}
    docs = [{"_id": i, "t": T0 + datetime.timedelta(minutes=i * 10), "m": i % 2, "v": i} for i in range(10)]
    docs.append({"_id": 99, "t": T0, "v": -1})  # no meta: a bucket of its own
    for doc in docs:
        _insert(catalog, buckets, doc)
    # meta 0 and 1 each: minutes 0..50 in one bucket (the hour from 10:00), 60..90 in the next; no meta: one
    assert len(buckets) == 5
    unpacked = [d for b in buckets.values() for d in unpack_bucket(b, "t", "m")]
    assert sorted(unpacked, key=lambda d: d["_id"]) == sorted(docs, key=lambda d: d["_id"])
    first = next(b for b in buckets.values() if b.get("meta") == 0)
    assert first["control"]["min"]["t"] == datetime.datetime(2026, 12, 1, 10, 0)  # rounded down to the minute
    assert first["control"]["max"]["v"] == 4 and first["control"]["min"]["v"] == 0


def test_a_bucket_closes_at_its_count_and_a_lost_bucket_is_not_reused() -> None:
    catalog, buckets = BucketCatalog(), {}
    for i in range(MAX_BUCKET_COUNT + 1):
        _insert(catalog, buckets, {"_id": i, "t": T0, "m": "x"})
    assert sorted(len(b["data"]["t"]) for b in buckets.values()) == [1, MAX_BUCKET_COUNT]
    buckets.clear()  # (dropped, or rolled back, behind the catalog's back)
    _insert(catalog, buckets, {"_id": "new", "t": T0, "m": "x"})
    assert [len(b["data"]["t"]) for b in buckets.values()] == [1]


def test_expired_buckets_are_those_whose_latest_time_is_old() -> None:
    options = {"timeseries": TS.to_document(), "expireAfterSeconds": 60}
    assert expired_buckets_filter(options, T0) == {"control.max.t": {"$lt": T0 - datetime.timedelta(seconds=60)}}
    assert expired_buckets_filter({"timeseries": TS.to_document()}, T0) is None
