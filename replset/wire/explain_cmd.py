"""`explain` (see oplog/explain.py): the plan, and for reads with `executionStats` (pymongo's
default is `allPlansExecution`) the read run once to count what it examined; writes are explained
without running. `validate`: a collection's documents and unique indexes read back and checked."""

from __future__ import annotations

from typing import Any

import bson

from base.errors import MongoError
from oplog.codec_options import DOC_OPTIONS
from oplog.explain import VERBOSITIES, explained_target, query_planner
from oplog.index_keys import index_keys
from oplog.query import compile_filter
from oplog.values import canonical_key
from oplog.writes import id_equality
from replset import __version__
from replset.wire.commands import CommandContext, command
from replset.wire.crud import hinted_scan

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
    if name == "find" and isinstance(inner, dict):
        hinted_scan(ctx, ns, inner)  # (and so is a hint that names no index)
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

    started = ctx.node.clock.monotonic()
    returned, examined = await ctx.node.queries.run(run)
    return {"executionSuccess": True, "nReturned": returned,
            "executionTimeMillis": int((ctx.node.clock.monotonic() - started) * 1000),
            "totalKeysExamined": 1 if exact else 0, "totalDocsExamined": examined}


@command("validate", kind="read")
async def cmd_validate(ctx: CommandContext) -> dict[str, Any]:
    """Reads every document of a collection back: each must decode, carry an `_id` and be stored
    under that `_id`'s key; each unique index must hold exactly the keys its documents give. Other
    indexes keep no keys here (they serve uniqueness and TTL only): their expected key counts are
    reported."""
    coll = ctx.cmd.get("validate")
    if not isinstance(coll, str) or not coll:
        raise MongoError(73, "validate needs a collection name")
    ns = f"{ctx.db}.{coll}"
    if ctx.cmd.get("background") and ctx.cmd.get("full"):
        raise MongoError(72, "Running the validate command with both { background: true } and { full: true } "
                             "is not supported.")
    store = ctx.node.store

    def check() -> dict[str, Any]:
        reader = store.thread_reader()
        if reader.collection(ns) is None:
            raise MongoError(26, f"Collection '{ns}' does not exist to validate.")
        indexes = reader.indexes(ns)
        keys = dict.fromkeys((i.name for i in indexes), 0)
        errors: list[str] = []
        records = 0
        for idkey, blob in reader.stored_rows(ns):
            records += 1
            try:
                doc = bson.decode(blob, DOC_OPTIONS)
            except Exception as exc:
                errors.append(f"record {records}: does not decode: {exc}")
                continue
            if "_id" not in doc or canonical_key(doc["_id"]) != idkey:
                errors.append(f"record {records}: stored under a key that is not its _id's")
            for index in indexes:
                keys[index.name] += len(index_keys(doc, index.spec["key"], sparse=bool(index.spec.get("sparse"))))
        for index in indexes:
            if index.unique and index.name != "_id_" and reader.unique_key_count(index) != keys[index.name]:
                errors.append(f"index {index.name}: {reader.unique_key_count(index)} keys stored, "
                              f"{keys[index.name]} expected")
        return {"ns": ns, "nInvalidDocuments": 0, "nNonCompliantDocuments": 0, "nrecords": records,
                "nIndexes": len(indexes), "keysPerIndex": keys,
                "indexDetails": {name: {"valid": not any(e.startswith(f"index {name}:") for e in errors)}
                                 for name in keys},
                "valid": not errors, "repaired": False, "warnings": [], "errors": errors,
                "extraIndexEntries": [], "missingIndexEntries": [], "corruptRecords": [], "ok": 1.0}

    return await ctx.node.queries.run(check)
