"""Clustered collections (MongoDB 5.3+): documents kept in `_id` order, so a collection scan (natural
order) returns them by `_id`, and the collection's own index is the clustered `_id` index. With
`expireAfterSeconds`, a document expires once its `_id` (a date) is that old. Pure."""

from __future__ import annotations

__layer__ = "core"  # pure: no I/O, clock or randomness (tests/unit/test_layering.py)

import datetime
from collections.abc import Mapping
from typing import Any

from base.errors import MongoError
from oplog.ttl import expire_after_seconds

INVALID_CLUSTERED = 5979700


def check_clustered_options(options: Mapping[str, Any]) -> dict[str, Any]:
    """`create`'s `clusteredIndex` (and `expireAfterSeconds`, which needs it), as mongod checks them;
    returns the options to store, the index spec as listCollections shows it."""
    out = dict(options)
    spec = options.get("clusteredIndex")
    if spec is None:
        if "expireAfterSeconds" in options:
            raise MongoError(72, "'expireAfterSeconds' requires clustering to be enabled")
        return out
    if not isinstance(spec, Mapping) or dict(spec.get("key") or {}) != {"_id": 1} or spec.get("unique") is not True:
        raise MongoError(INVALID_CLUSTERED, "The clusteredIndex option must be {key: {_id: 1}, unique: true}")
    unknown = sorted(set(spec) - {"key", "unique", "name", "v"})
    if unknown:
        raise MongoError(40415, f"BSON field 'clusteredIndex.{unknown[0]}' is an unknown field.")
    name = spec.get("name", "_id_")
    if not isinstance(name, str) or not name:
        raise MongoError(2, "clusteredIndex.name must be a non-empty string")
    if spec.get("v", 2) != 2:
        raise MongoError(2, "clusteredIndex.v must be 2")
    if options.get("capped"):
        raise MongoError(72, "a capped collection cannot be clustered")
    out["clusteredIndex"] = {"v": 2, "key": {"_id": 1}, "name": name, "unique": True}
    if "expireAfterSeconds" in options:
        out["expireAfterSeconds"] = expire_after_seconds(options["expireAfterSeconds"])
    return out


def is_clustered(options: Mapping[str, Any]) -> bool:
    return "clusteredIndex" in options


def clustered_index_spec(options: Mapping[str, Any]) -> dict[str, Any]:
    """The clustered index as listIndexes shows it."""
    spec = options["clusteredIndex"]
    return {"v": spec.get("v", 2), "key": {"_id": 1}, "name": spec.get("name", "_id_"), "unique": True,
            "clustered": True}


def expired_clustered_filter(options: Mapping[str, Any], now: datetime.datetime) -> dict[str, Any] | None:
    """The documents a clustered collection's `expireAfterSeconds` has expired at `now`; None without one."""
    expire = options.get("expireAfterSeconds")
    if not is_clustered(options) or expire is None or isinstance(expire, bool):
        return None
    return {"_id": {"$lt": now.replace(tzinfo=None) - datetime.timedelta(seconds=float(expire))}}


def natural_order(info: Any) -> dict[str, Any] | None:
    """The sort that natural order is for a collection (`CollectionInfo` or None): `_id` for a clustered
    collection, None (insertion order) for any other."""
    return {"_id": 1} if info is not None and is_clustered(info.options) else None
