"""Views: read-only, non-materialised collections defined by a source namespace and a pipeline.

A view's definition is a document of its database's `system.views` collection (`_id` the view's
namespace, `viewOn` the collection or view it reads, `pipeline`), as mongod keeps it. It is written
only by the `create`, `collMod` and `drop` command entries that name the view (`apply_view_command`),
so it replicates, syncs and recovers as any document does. A read of a view reads its source through
the view's pipeline (a view on a view through both, up to `MAX_VIEW_DEPTH`); writes to a view are
refused (166). Pure: the catalog comes in through the transaction or reader passed.
"""

from __future__ import annotations

__layer__ = "core"  # pure: no I/O, clock or randomness (tests/unit/test_layering.py)

from collections.abc import Callable, Mapping
from typing import Any

from base.errors import MongoError

VIEWS_COLLECTION = "system.views"
MAX_VIEW_DEPTH = 20
COMMAND_NOT_SUPPORTED_ON_VIEW = 166
VIEW_DEPTH_LIMIT_EXCEEDED = 149
_OUTPUT_STAGES = ("$out", "$merge")


def views_ns(db: str) -> str:
    return f"{db}.{VIEWS_COLLECTION}"


def view_definition(reader: Any, ns: str) -> dict[str, Any] | None:
    """The view named `ns` ({_id, viewOn, pipeline}), or None if `ns` is not a view."""
    db = ns.split(".", 1)[0]
    if reader.collection(views_ns(db)) is None:
        return None
    return reader.get(views_ns(db), ns)


def check_view_options(view_on: Any, pipeline: Any, options: Mapping[str, Any]) -> None:
    """`create` (or `collMod`) of a view as mongod checks it."""
    if not isinstance(view_on, str) or not view_on:
        raise MongoError(2, "'viewOn' must be a non-empty string")
    if view_on.startswith("system.buckets."):
        raise MongoError(2, "a view may not read a time-series collection's buckets (create the time-series "
                            "collection with 'timeseries')")
    if not isinstance(pipeline, list) or not all(isinstance(stage, dict) for stage in pipeline):
        raise MongoError(14, "'pipeline' must be an array of objects")
    for stage in pipeline:
        if any(name in _OUTPUT_STAGES for name in stage):
            raise MongoError(COMMAND_NOT_SUPPORTED_ON_VIEW, "$out and $merge cannot be used in a view definition")
    others = sorted(set(options) - {"viewOn", "pipeline"})
    if others:
        raise MongoError(115, f"option(s) {', '.join(others)} of a view are not supported by this server "
                              "(a view takes viewOn and pipeline)")


def resolve_view(lookup: Callable[[str], dict[str, Any] | None], ns: str) -> tuple[str, list[Any]] | None:
    """(the collection a view finally reads, the pipeline over it) for a view; None for a namespace that
    is not a view. A chain of views longer than `MAX_VIEW_DEPTH` (or a cycle) is refused (149)."""
    definition = lookup(ns)
    if definition is None:
        return None
    db = ns.split(".", 1)[0]
    pipeline: list[Any] = []
    for _ in range(MAX_VIEW_DEPTH):
        pipeline = list(definition["pipeline"]) + pipeline
        source = f"{db}.{definition['viewOn']}"
        definition = lookup(source)
        if definition is None:
            return source, pipeline
    raise MongoError(VIEW_DEPTH_LIMIT_EXCEEDED, f"View depth too deep or view cycle detected; maximum depth is "
                                                f"{MAX_VIEW_DEPTH}")


def refuse_on_view(ns: str, what: str) -> MongoError:
    return MongoError(COMMAND_NOT_SUPPORTED_ON_VIEW, f"Namespace {ns} is a view, not a collection ({what})")


def apply_view_command(txn: Any, db: str, o: Mapping[str, Any]) -> bool:
    """Applies a command entry that concerns a view (its `system.views` document); False if the entry
    is not about a view (a collection's own DDL)."""
    name = next(iter(o))
    ns = f"{db}.{o[name]}"
    if name == "create" and "viewOn" in o:
        if txn.collection(views_ns(db)) is None:
            txn.create_collection(views_ns(db))
        txn.insert(views_ns(db), {"_id": ns, "viewOn": o["viewOn"], "pipeline": list(o.get("pipeline") or [])},
                   upsert=True)
        return True
    if name == "collMod" and "viewOn" in o:
        if txn.collection(views_ns(db)) is not None:
            txn.replace(views_ns(db), {"_id": ns, "viewOn": o["viewOn"], "pipeline": list(o.get("pipeline") or [])})
        return True
    if name == "drop" and view_definition(txn, ns) is not None:
        txn.delete(views_ns(db), ns)
        return True
    return False
