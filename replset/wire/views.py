"""The member's side of views (see `oplog.views`): the DDL that defines them, and the checks that keep
writes and unsupported reads off them."""

from __future__ import annotations

from typing import Any

from base.errors import MongoError
from oplog.entry import command_entry
from oplog.timeseries import TimeseriesOptions, buckets_name, parse_timeseries
from oplog.ttl import expire_after_seconds
from oplog.views import check_view_options, refuse_on_view, view_definition, views_ns
from oplog.writes import WriteEnv, new_collection_uuid


def write_target(reader: Any, ns: str, what: str) -> tuple[str, TimeseriesOptions] | None:
    """Where a write to `ns` goes: None for a collection (or nothing yet), (buckets, options) for a
    time-series collection; a view refuses it (166). One look at the catalog for all three."""
    definition = view_definition(reader, ns)
    if definition is None:
        return None
    found = _timeseries_of(reader, ns, definition)
    if found is None:
        raise refuse_on_view(ns, what)
    return found


def check_not_view(reader: Any, ns: str, what: str) -> None:
    """A command that needs a collection, sent to a view: CommandNotSupportedOnView (166)."""
    if view_definition(reader, ns) is not None:
        raise refuse_on_view(ns, what)


def view_entries(reader: Any, db: str) -> list[dict[str, Any]]:
    """`listCollections` entries of the database's views."""
    if reader.collection(views_ns(db)) is None:
        return []
    return [timeseries_entry(reader, db, view) or {
        "name": view["_id"].split(".", 1)[1], "type": "view",
        "options": {"viewOn": view["viewOn"], "pipeline": view["pipeline"]}, "info": {"readOnly": True}}
        for view in reader.scan(views_ns(db))]


def create_view(env: WriteEnv, db: str, coll: str, options: dict[str, Any]) -> dict[str, Any]:
    """`create` with `viewOn`: logged as mongod logs it (a `create` entry naming the source and the
    pipeline); `system.views` is created first if the database has none."""
    view_on, pipeline = options.get("viewOn"), options.get("pipeline", [])
    check_view_options(view_on, pipeline, options)
    _claim_view_name(env, db, coll)
    env.emit(command_entry(db, {"create": coll, "viewOn": view_on, "pipeline": pipeline}))
    return {"ok": 1.0}


def _claim_view_name(env: WriteEnv, db: str, coll: str) -> None:
    """A new view's name is free (48 otherwise); the database's system.views exists (its own entry first)."""
    ns = f"{db}.{coll}"
    if env.txn.collection(ns) is not None or view_definition(env.txn, ns) is not None:
        raise MongoError(48, f"Collection {ns} already exists.")
    if env.txn.collection(views_ns(db)) is None:
        env.emit(command_entry(db, {"create": "system.views"}, new_collection_uuid()))


def modify_view(env: WriteEnv, db: str, coll: str, options: dict[str, Any]) -> dict[str, Any]:
    """`collMod` of a view: a new source and pipeline, both given (as mongod asks)."""
    if set(options) != {"viewOn", "pipeline"}:
        raise MongoError(2, "collMod of a view takes both 'viewOn' and 'pipeline', and nothing else")
    check_view_options(options["viewOn"], options["pipeline"], options)
    env.emit(command_entry(db, {"collMod": coll, "viewOn": options["viewOn"], "pipeline": options["pipeline"]}))
    return {"ok": 1.0}


def drop_view(env: WriteEnv, db: str, coll: str) -> dict[str, Any]:
    env.emit(command_entry(db, {"drop": coll}))
    return {"ns": f"{db}.{coll}", "ok": 1.0}


# -- time-series collections (see oplog.timeseries) -----------------------------------------------
def timeseries_of(reader: Any, ns: str) -> tuple[str, TimeseriesOptions] | None:
    """(its buckets' namespace, its options) for a time-series collection; None for any other name."""
    definition = view_definition(reader, ns)
    return None if definition is None else _timeseries_of(reader, ns, definition)


def _timeseries_of(reader: Any, ns: str, definition: dict[str, Any]) -> tuple[str, TimeseriesOptions] | None:
    if definition.get("viewOn") != buckets_name(ns.split(".", 1)[1]):
        return None
    buckets_ns = f"{ns.split('.', 1)[0]}.{definition['viewOn']}"
    info = reader.collection(buckets_ns)
    if info is None or "timeseries" not in info.options:
        return None
    options = parse_timeseries(info.options["timeseries"])
    if definition.get("pipeline") != [options.unpack_stage()]:
        return None
    return buckets_ns, options


def create_timeseries(env: WriteEnv, db: str, coll: str, options: dict[str, Any]) -> dict[str, Any]:
    """`create` with `timeseries`: its buckets collection, then the view that unpacks them."""
    ts = parse_timeseries(options["timeseries"])
    others = sorted(set(options) - {"timeseries", "expireAfterSeconds"})
    if others:
        raise MongoError(115, f"option(s) {', '.join(others)} of a time-series collection are not supported by "
                              "this server")
    bucket_options: dict[str, Any] = {"timeseries": ts.to_document()}
    if "expireAfterSeconds" in options:
        bucket_options["expireAfterSeconds"] = expire_after_seconds(options["expireAfterSeconds"])
    _claim_view_name(env, db, coll)
    env.emit(command_entry(db, {"create": buckets_name(coll), **bucket_options}, new_collection_uuid()))
    env.emit(command_entry(db, {"create": coll, "viewOn": buckets_name(coll), "pipeline": [ts.unpack_stage()]}))
    return {"ok": 1.0}


def drop_timeseries(env: WriteEnv, db: str, coll: str) -> dict[str, Any]:
    """Drops a time-series collection: its view, then its buckets."""
    env.emit(command_entry(db, {"drop": coll}))
    info = env.txn.collection(f"{db}.{buckets_name(coll)}")
    if info is not None:
        env.emit(command_entry(db, {"drop": buckets_name(coll)}, info.uuid))
    return {"ns": f"{db}.{coll}", "ok": 1.0}


def timeseries_entry(reader: Any, db: str, view: dict[str, Any]) -> dict[str, Any] | None:
    """A time-series collection's `listCollections` entry (for its view's definition), as mongod lists it."""
    found = timeseries_of(reader, view["_id"])
    if found is None:
        return None
    options: dict[str, Any] = {"timeseries": found[1].to_document()}
    info = reader.collection(found[0])
    if info is not None and "expireAfterSeconds" in info.options:
        options["expireAfterSeconds"] = info.options["expireAfterSeconds"]
    return {"name": view["_id"].split(".", 1)[1], "type": "timeseries", "options": options,
            "info": {"readOnly": False}}
