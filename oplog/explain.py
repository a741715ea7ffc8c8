"""`explain`: the plan this member really runs for a read or a write's filter.

A filter that pins `_id` to one value is answered by one lookup in the `_id` index (`IDHACK`);
any other filter is a collection scan (`COLLSCAN`) in natural order, with a blocking `SORT` over
its results when a sort is asked for. Secondary indexes serve uniqueness (and TTL), not query
plans: the plan says so rather than name an index it does not use.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from base.errors import MongoError
from oplog.writes import id_equality

VERBOSITIES = ("queryPlanner", "executionStats", "allPlansExecution")


def winning_plan(query: Mapping[str, Any], sort: Mapping[str, Any] | None = None) -> dict[str, Any]:
    if id_equality(query)[0]:
        return {"stage": "IDHACK"}
    plan: dict[str, Any] = {"stage": "COLLSCAN", "filter": dict(query), "direction": "forward"}
    if sort and list(sort) != ["$natural"]:
        plan = {"stage": "SORT", "sortPattern": dict(sort), "memLimit": 104857600, "type": "simple",
                "inputStage": plan}
    return plan


def query_planner(ns: str, query: Mapping[str, Any], sort: Mapping[str, Any] | None = None) -> dict[str, Any]:
    return {"namespace": ns, "parsedQuery": dict(query), "indexFilterSet": False,
            "winningPlan": winning_plan(query, sort), "rejectedPlans": []}


def explained_target(inner: Any) -> tuple[str, Any, dict[str, Any], dict[str, Any] | None]:
    """(command name, collection, filter, sort) of the command `explain` is asked about."""
    if not isinstance(inner, Mapping) or not inner:
        raise MongoError(9, "explain command requires a nested object")
    name = next(iter(inner))
    coll = inner[name]
    if name == "find":
        return name, coll, dict(inner.get("filter") or {}), inner.get("sort")
    if name in ("count", "distinct"):
        return name, coll, dict(inner.get("query") or {}), None
    if name in ("findAndModify", "findandmodify"):
        return name, coll, dict(inner.get("query") or {}), inner.get("sort")
    if name in ("update", "delete"):
        statements = inner.get("updates" if name == "update" else "deletes")
        first = statements[0] if isinstance(statements, list) and statements else {}
        return name, coll, dict(first.get("q") or {}) if isinstance(first, Mapping) else {}, None
    if name == "aggregate":
        pipeline = inner.get("pipeline") or []
        first = pipeline[0] if pipeline and isinstance(pipeline[0], Mapping) else {}
        return name, coll, dict(first.get("$match") or {}), None
    raise MongoError(59, f"Explain failed due to unknown command: {name}")
