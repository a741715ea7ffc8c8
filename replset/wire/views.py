"""The member's side of views (see `oplog.views`): the DDL that defines them, and the checks that keep
writes and unsupported reads off them."""

from __future__ import annotations

from typing import Any

from base.errors import MongoError
from oplog.entry import command_entry
from oplog.views import check_view_options, refuse_on_view, view_definition, views_ns
from oplog.writes import WriteEnv, new_collection_uuid


def check_not_view(reader: Any, ns: str, what: str) -> None:
    """A command that needs a collection, sent to a view: CommandNotSupportedOnView (166)."""
    if view_definition(reader, ns) is not None:
        raise refuse_on_view(ns, what)


def view_entries(reader: Any, db: str) -> list[dict[str, Any]]:
    """`listCollections` entries of the database's views."""
    if reader.collection(views_ns(db)) is None:
        return []
    return [{"name": view["_id"].split(".", 1)[1], "type": "view",
             "options": {"viewOn": view["viewOn"], "pipeline": view["pipeline"]}, "info": {"readOnly": True}}
            for view in reader.scan(views_ns(db))]


def create_view(env: WriteEnv, db: str, coll: str, options: dict[str, Any]) -> dict[str, Any]:
    """`create` with `viewOn`: logged as mongod logs it (a `create` entry naming the source and the
    pipeline); `system.views` is created first if the database has none."""
    view_on, pipeline = options.get("viewOn"), options.get("pipeline", [])
    check_view_options(view_on, pipeline, options)
    ns = f"{db}.{coll}"
    if env.txn.collection(ns) is not None or view_definition(env.txn, ns) is not None:
        raise MongoError(48, f"Collection {ns} already exists.")
    if env.txn.collection(views_ns(db)) is None:
        env.emit(command_entry(db, {"create": "system.views"}, new_collection_uuid()))
    env.emit(command_entry(db, {"create": coll, "viewOn": view_on, "pipeline": pipeline}))
    return {"ok": 1.0}


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
