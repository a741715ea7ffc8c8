"""`splitVector`: split points of a collection by `_id`, for clients that read it in parallel ranges.

`{splitVector: "<db>.<coll>", keyPattern: {_id: 1}, maxChunkSizeBytes: N | maxChunkSize: MB |
maxChunkObjects: N}` answers `{splitKeys: [{_id: v}, ...]}`: each range `[k(i), k(i+1))` holds about
`maxChunkObjects` documents, or about `maxChunkSizeBytes` of them at the collection's average document
size (MongoDB's sharding helper, for `_id` only here). It reads every `_id` on the query pool, never on
the event loop."""

from __future__ import annotations

from typing import Any

from base.errors import MongoError
from oplog.split_points import split_points
from replset.query_pool import TimeLimit
from replset.wire.commands import CommandContext, command

BAD_VALUE = 2
INVALID_NAMESPACE = 73


@command("splitVector", kind="read")
async def cmd_split_vector(ctx: CommandContext) -> dict[str, Any]:
    ns = ctx.cmd["splitVector"]
    if not isinstance(ns, str) or "." not in ns:
        raise MongoError(INVALID_NAMESPACE, "splitVector takes a full namespace '<db>.<collection>'")
    if ctx.cmd.get("keyPattern") != {"_id": 1}:
        raise MongoError(BAD_VALUE, "splitVector supports keyPattern {_id: 1} only")
    objects = _positive(ctx.cmd, "maxChunkObjects")
    size_bytes = _positive(ctx.cmd, "maxChunkSizeBytes") or _positive(ctx.cmd, "maxChunkSize") * 1024 * 1024
    if not objects and not size_bytes:
        raise MongoError(BAD_VALUE, "splitVector needs maxChunkObjects, maxChunkSizeBytes or maxChunkSize")
    store = ctx.node.store

    def keys() -> list[Any]:
        reader = store.thread_reader()
        count = reader.count(ns) if reader.collection(ns) is not None else 0
        if count == 0:
            return []
        per_chunk = objects
        if size_bytes:
            average = max(1, reader.data_size(ns) // count)
            by_size = max(1, size_bytes // average)
            per_chunk = min(per_chunk, by_size) if per_chunk else by_size
        return split_points((doc["_id"] for doc in reader.scan(ns)), per_chunk)

    found = await ctx.node.queries.run(keys, TimeLimit.from_max_time_ms(int(ctx.cmd.get("maxTimeMS", 0) or 0)))
    return {"splitKeys": [{"_id": key} for key in found], "ok": 1.0}


def _positive(cmd: dict[str, Any], field: str) -> int:
    value = cmd.get(field, 0)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        raise MongoError(BAD_VALUE, f"splitVector: {field} must be a non-negative number")
    return int(value)
