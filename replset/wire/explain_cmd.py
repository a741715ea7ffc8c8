"""The `explain` command (see oplog/explain.py): the plan, and for reads with `executionStats`
(pymongo's default is `allPlansExecution`) the read run once to count what it examined. Writes are
explained without running."""

from __future__ import annotations

import time
from typing import Any

from base.errors import MongoError
from oplog.explain import VERBOSITIES, explained_target, query_planner
from oplog.query import compile_filter
from oplog.writes import id_equality
from replset import __version__
from replset.wire.commands import CommandContext, command

_READS = frozenset({"find", "count", "distinct", "aggregate"})


@command("explain", kind="read")
async def cmd_explain(ctx: CommandContext) -> dict[str, Any]:
    inner = ctx.cmd.get("explain")
    name, coll, query, sort = explained_target(inner)
    if not isinstance(coll, str):
        raise MongoError(73, f"explain of {name} needs a collection name")
    verbosity = ctx.cmd.get("verbosity", "allPlansExecution")
    if verbosity not in VERBOSITIES:
        raise MongoError(2, f"verbosity string must be one of {{{', '.join(VERBOSITIES)}}}")
    ns = f"{ctx.db}.{coll}"
    compile_filter(query)  # a bad filter is refused as the command itself would refuse it
    planner = query_planner(ns, query, sort)
    reply: dict[str, Any] = {"explainVersion": "1", "queryPlanner": planner, "command": dict(inner),
                             "serverInfo": {"host": ctx.node.options.me, "version": __version__}}
    if verbosity != "queryPlanner" and name in _READS:
        reply["executionStats"] = await _execution_stats(ctx, ns, query)
    reply["ok"] = 1.0
    return reply


async def _execution_stats(ctx: CommandContext, ns: str, query: dict[str, Any]) -> dict[str, Any]:
    matcher = compile_filter(query)
    exact, id_value = id_equality(query)
    store = ctx.node.store

    def run() -> tuple[int, int]:
        reader = store.thread_reader()
        if exact:
            doc = reader.get(ns, id_value)
            return (1 if doc is not None and matcher.matches(doc) else 0), (1 if doc is not None else 0)
        examined = returned = 0
        for doc in reader.scan(ns):
            examined += 1
            returned += matcher.matches(doc)
        return returned, examined

    started = time.perf_counter()
    returned, examined = await ctx.node.queries.run(run)
    return {"executionSuccess": True, "nReturned": returned,
            "executionTimeMillis": int((time.perf_counter() - started) * 1000),
            "totalKeysExamined": 1 if exact else 0, "totalDocsExamined": examined}
