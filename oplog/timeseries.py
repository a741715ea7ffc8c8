"""Time-series collections, stored as mongod 5.0+ stores them: measurements grouped into buckets.

`create` with `timeseries: {timeField, metaField?, granularity?}` makes two namespaces: the buckets
collection `system.buckets.<name>` (its options hold the time-series options and any
`expireAfterSeconds`) and a view `<name>` over it whose pipeline, `$_internalUnpackBucket`, turns each
bucket back into its measurements. Reads go through the view (so find, count, distinct and aggregate
work on measurements); inserts into `<name>` go into buckets.

A bucket holds measurements of one meta value whose times lie within `bucketMaxSpanSeconds` of the
bucket's start (its earliest time rounded down to `bucketRoundingSeconds`), at most `MAX_BUCKET_COUNT`
of them and about `MAX_BUCKET_BYTES`:

    {_id: ObjectId (its time part the bucket's start),
     control: {version: 1, min: {field: lowest}, max: {field: highest}},
     meta: <the meta value> (absent when the measurements have none),
     data: {field: {"0": value of measurement 0, "1": ..., ...}}}

Measurements keep their own `_id` (one is made for a measurement without), which need not be unique.
A measurement is logged as the bucket's change: a new bucket is an insert entry, a measurement added
to a bucket is an update entry that sets its values (and any new control bound), so every member holds
the same buckets. Which bucket is open for a meta value is the primary's memory (`BucketCatalog`, as
mongod's bucket catalog is): a new primary opens new buckets. Pure: no I/O or clock.
"""

from __future__ import annotations

__layer__ = "core"  # pure: no I/O, clock or randomness (tests/unit/test_layering.py)

import datetime
import struct
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import bson
from bson.objectid import ObjectId

from base.errors import MongoError
from oplog.values import canonical_key, compare_values

BUCKETS_PREFIX = "system.buckets."
UNPACK_STAGE = "$_internalUnpackBucket"
MAX_BUCKET_COUNT = 1000
MAX_BUCKET_BYTES = 125 * 1024
# granularity -> (bucketMaxSpanSeconds, bucketRoundingSeconds), as mongod's defaults
GRANULARITIES = {"seconds": (3600, 60), "minutes": (86400, 3600), "hours": (2592000, 86400)}
_OPTIONS = frozenset({"timeField", "metaField", "granularity", "bucketMaxSpanSeconds", "bucketRoundingSeconds"})


def buckets_name(coll: str) -> str:
    return BUCKETS_PREFIX + coll


@dataclass(frozen=True, slots=True)
class TimeseriesOptions:
    time_field: str
    meta_field: str | None
    granularity: str | None
    max_span_s: int
    rounding_s: int

    def to_document(self) -> dict[str, Any]:
        out: dict[str, Any] = {"timeField": self.time_field}
        if self.meta_field is not None:
            out["metaField"] = self.meta_field
        if self.granularity is not None:
            out["granularity"] = self.granularity
        out["bucketMaxSpanSeconds"] = self.max_span_s
        if self.granularity is None:
            out["bucketRoundingSeconds"] = self.rounding_s
        return out

    def unpack_stage(self) -> dict[str, Any]:
        spec: dict[str, Any] = {"timeField": self.time_field, "bucketMaxSpanSeconds": self.max_span_s}
        if self.meta_field is not None:
            spec["metaField"] = self.meta_field
        return {UNPACK_STAGE: spec}


def parse_timeseries(raw: Any) -> TimeseriesOptions:
    """`create`'s `timeseries` option, checked as mongod checks it (or a stored one read back)."""
    if not isinstance(raw, Mapping):
        raise MongoError(14, "'timeseries' must be an object")
    unknown = sorted(set(raw) - _OPTIONS)
    if unknown:
        raise MongoError(40415, f"BSON field 'timeseries.{unknown[0]}' is an unknown field.")
    time_field, meta_field = raw.get("timeField"), raw.get("metaField")
    if not isinstance(time_field, str) or not time_field or "." in time_field or time_field.startswith("$"):
        raise MongoError(2, "'timeseries.timeField' must be a non-empty top-level field name")
    if meta_field is not None and (not isinstance(meta_field, str) or not meta_field or "." in meta_field
                                   or meta_field.startswith("$") or meta_field in (time_field, "_id")):
        raise MongoError(2, "'timeseries.metaField' must be a top-level field name other than the timeField "
                            "and _id")
    span, rounding = raw.get("bucketMaxSpanSeconds"), raw.get("bucketRoundingSeconds")
    granularity = raw.get("granularity")
    if granularity is not None and granularity not in GRANULARITIES:
        raise MongoError(2, f"Enumeration value '{granularity}' for field 'timeseries.granularity' is not a "
                            "valid value.")
    if granularity is not None and (span is not None or rounding is not None):
        # (mongod lists a granularity's own span beside it, and takes that back)
        if (span, rounding) not in ((GRANULARITIES[granularity][0], None), GRANULARITIES[granularity]):
            raise MongoError(72, "Time-series 'bucketMaxSpanSeconds' and 'bucketRoundingSeconds' cannot be set "
                                 "together with 'granularity'")
        span, rounding = GRANULARITIES[granularity]
    elif span is None and rounding is None:
        granularity = granularity or "seconds"
        span, rounding = GRANULARITIES[granularity]
    elif span is None or rounding is None or span != rounding:
        raise MongoError(72, "Time-series 'bucketMaxSpanSeconds' and 'bucketRoundingSeconds' must be set "
                             "together, to the same value")
    for value in (span, rounding):
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 31536000:
            raise MongoError(2, "Time-series bucket seconds must be an integer between 1 and 31536000")
    return TimeseriesOptions(time_field, meta_field, granularity, int(span), int(rounding))


# -- reading ----------------------------------------------------------------------------------
def unpack_bucket(bucket: Mapping[str, Any], time_field: str, meta_field: str | None) -> Iterator[dict[str, Any]]:
    """The measurements of a bucket, in the order they went in."""
    data = bucket.get("data") or {}
    times = data.get(time_field) or {}
    for position in times:
        doc: dict[str, Any] = {}
        for name, column in data.items():
            if position in column:
                doc[name] = column[position]
        if meta_field is not None and "meta" in bucket:
            doc[meta_field] = bucket["meta"]
        yield doc


def unpack_spec(spec: Any) -> tuple[str, str | None]:
    """(timeField, metaField) of a `$_internalUnpackBucket` stage."""
    if not isinstance(spec, Mapping) or not isinstance(spec.get("timeField"), str):
        raise MongoError(5346500, f"{UNPACK_STAGE} needs a timeField")
    meta = spec.get("metaField")
    return spec["timeField"], meta if isinstance(meta, str) else None


# -- writing ----------------------------------------------------------------------------------
@dataclass(slots=True)
class _OpenBucket:
    bucket_id: ObjectId
    start: datetime.datetime
    count: int
    size: int


@dataclass(slots=True)
class BucketCatalog:
    """The primary's open bucket per (collection, meta value). Memory only: a bucket it names may be
    gone (dropped, rolled back), which `bucket_for` finds out by reading it."""

    open: dict[tuple[str, bytes], _OpenBucket] = field(default_factory=dict)

    def forget(self, ns: str) -> None:
        for key in [k for k in self.open if k[0] == ns]:
            del self.open[key]


def check_measurement(doc: Any, ts: TimeseriesOptions) -> dict[str, Any]:
    if not isinstance(doc, dict):
        raise MongoError(14, "documents to insert must be objects")
    bad = next((name for name in doc if "." in name or name.startswith("$")), None)
    if bad is not None:  # (a bucket's columns are paths: a dotted name would land elsewhere)
        raise MongoError(2, f"a time-series measurement's field names may not contain '.' or start with '$': {bad!r}")
    when = doc.get(ts.time_field)
    if not isinstance(when, datetime.datetime):
        raise MongoError(2, f"'{ts.time_field}' must be present and contain a valid BSON UTC datetime value")
    return doc if "_id" in doc else {"_id": ObjectId(), **doc}


def _bucket_start(when: datetime.datetime, rounding_s: int) -> datetime.datetime:
    naive = when.replace(tzinfo=None)
    seconds = int((naive - datetime.datetime(1970, 1, 1)).total_seconds() // rounding_s * rounding_s)
    return datetime.datetime(1970, 1, 1) + datetime.timedelta(seconds=seconds)


def _bucket_id(start: datetime.datetime) -> ObjectId:
    seconds = int((start - datetime.datetime(1970, 1, 1)).total_seconds())
    return ObjectId(struct.pack(">I", seconds & 0xFFFFFFFF) + ObjectId().binary[4:])


def _fields(measurement: Mapping[str, Any], ts: TimeseriesOptions) -> dict[str, Any]:
    return {k: v for k, v in measurement.items() if k != ts.meta_field}


def new_bucket(measurement: Mapping[str, Any], ts: TimeseriesOptions) -> tuple[dict[str, Any], datetime.datetime]:
    """A bucket holding only `measurement`, and its start."""
    fields = _fields(measurement, ts)
    start = _bucket_start(fields[ts.time_field], ts.rounding_s)
    control_min = {**fields, ts.time_field: start}
    bucket: dict[str, Any] = {"_id": _bucket_id(start),
                              "control": {"version": 1, "min": control_min, "max": dict(fields)}}
    if ts.meta_field is not None and ts.meta_field in measurement:
        bucket["meta"] = measurement[ts.meta_field]
    bucket["data"] = {name: {"0": value} for name, value in fields.items()}
    return bucket, start


def added_to_bucket(bucket: Mapping[str, Any], measurement: Mapping[str, Any], ts: TimeseriesOptions,
                    position: int) -> dict[str, Any]:
    """The `$set` that adds `measurement` to `bucket` as measurement number `position`: its values, and
    the control bounds it moves."""
    fields = _fields(measurement, ts)
    control = bucket.get("control") or {}
    lows, highs = control.get("min") or {}, control.get("max") or {}
    changes: dict[str, Any] = {}
    for name, value in fields.items():
        changes[f"data.{name}.{position}"] = value
        if name not in lows or compare_values(value, lows[name]) < 0:
            if name != ts.time_field:
                changes[f"control.min.{name}"] = value
        if name not in highs or compare_values(value, highs[name]) > 0:
            changes[f"control.max.{name}"] = value
    return {"$set": changes}


def _catalog_key(ns: str, measurement: Mapping[str, Any], ts: TimeseriesOptions) -> tuple[str, bytes]:
    """A bucket's measurements share one meta value (or all lack one)."""
    has_meta = ts.meta_field is not None and ts.meta_field in measurement
    return ns, canonical_key([has_meta, measurement[ts.meta_field] if has_meta else None])


def bucket_for(catalog: BucketCatalog, ns: str, measurement: Mapping[str, Any], ts: TimeseriesOptions,
               size: int, stored: Any) -> tuple[dict[str, Any], int] | None:
    """The open bucket `measurement` goes into and its position there, or None for a new bucket.
    `stored(bucket_id)` reads a bucket (None if it is gone)."""
    key = _catalog_key(ns, measurement, ts)
    found = catalog.open.get(key)
    when = measurement[ts.time_field].replace(tzinfo=None)
    if found is None or found.count >= MAX_BUCKET_COUNT or found.size + size > MAX_BUCKET_BYTES:
        return None
    if not found.start <= when < found.start + datetime.timedelta(seconds=ts.max_span_s):
        return None
    bucket = stored(found.bucket_id)
    if bucket is None or len((bucket.get("data") or {}).get(ts.time_field) or {}) != found.count:
        del catalog.open[key]  # (gone, or changed by something else: start a new one)
        return None
    return bucket, found.count


def opened(catalog: BucketCatalog, ns: str, measurement: Mapping[str, Any], ts: TimeseriesOptions,
           bucket_id: ObjectId, start: datetime.datetime, size: int) -> None:
    catalog.open[_catalog_key(ns, measurement, ts)] = _OpenBucket(bucket_id, start, 1, size)


def grew(catalog: BucketCatalog, ns: str, measurement: Mapping[str, Any], ts: TimeseriesOptions, size: int) -> None:
    found = catalog.open[_catalog_key(ns, measurement, ts)]
    found.count += 1
    found.size += size


def measurement_size(measurement: Mapping[str, Any]) -> int:
    return len(bson.encode(dict(measurement)))



def expired_buckets_filter(options: Mapping[str, Any], now: datetime.datetime) -> dict[str, Any] | None:
    """The buckets a time-series collection's `expireAfterSeconds` has expired at `now` (every
    measurement older than that: the bucket's latest time is), as a filter; None without one."""
    expire = options.get("expireAfterSeconds")
    if "timeseries" not in options or expire is None or isinstance(expire, bool):
        return None
    time_field = parse_timeseries(options["timeseries"]).time_field
    cutoff = now.replace(tzinfo=None) - datetime.timedelta(seconds=float(expire))
    return {f"control.max.{time_field}": {"$lt": cutoff}}
