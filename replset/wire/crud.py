"""CRUD commands: insert, update, delete, findAndModify, find, getMore, killCursors,
aggregate, count, distinct. Writes go through group commit and the oplog; reads use
the committed snapshot and server-side cursors.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

from bson.int64 import Int64

from oplog.aggregate import run_pipeline, validate_pipeline
from oplog.errors import MongoError
from oplog.optime import OpTime
from oplog.query import (
    Matcher,
    apply_projection,
    compile_filter,
    compile_projection,
    sort_documents,
    validate_projection,
)
from oplog.values import canonical_key
from oplog.writes import (
    WriteEnv,
    WriteResult,
    delete_documents,
    find_and_modify,
    id_equality,
    insert_documents,
    update_documents,
)
from replset.cursors import Cursor, cursor_reply
from replset.messages import POSITIONS_FIELD
from replset.node import utcnow
from replset.wire import sessions, system_namespaces
from replset.wire.commands import CommandContext, command
from replset.wire.oplog_reader import (
    OPLOG_NS,
    check_tail_position,
    oplog_end_key,
    oplog_source,
    oplog_start_key,
    raw_oplog_source,
    start_key_is_whole_filter,
)
from replset.write_concern import parse_write_concern

MAX_WRITE_BATCH = 100_000
DEFAULT_AWAIT_DATA_MS = 1000


def now_ms() -> int:
    return int(time.monotonic() * 1000)


def collection_name(ctx: CommandContext, field: str | None = None) -> str:
    value = ctx.cmd[field or ctx.name]
    if not isinstance(value, str) or not value:
        raise MongoError(73, f"collection name has invalid type {type(value).__name__}")
    return value


def _array_arg(ctx: CommandContext, field: str) -> list[Any]:
    value = ctx.cmd.get(field)
    if not isinstance(value, list):
        raise MongoError(9, f"BSON field '{ctx.name}.{field}' is missing or is not an array")
    if len(value) > MAX_WRITE_BATCH:
        raise MongoError(16, f"Write batch sizes must be between 1 and {MAX_WRITE_BATCH}. Got "
                             f"{len(value)} operations.")
    return value


# -- writes --------------------------------------------------------------------------
async def run_write(ctx: CommandContext, body: Callable[[WriteEnv], dict[str, Any]]) -> dict[str, Any]:
    """Runs a write command once per (lsid, txnNumber), then honours the write concern."""
    wc = parse_write_concern(ctx.cmd.get("writeConcern"))
    # `local` is not replicated, so neither is a retry record of a write to it (and none is kept).
    rw = None if ctx.db == "local" else sessions.retryable_write(ctx.cmd)

    def fn(env: WriteEnv) -> tuple[dict[str, Any], OpTime | None]:
        if rw is not None:
            stored = sessions.stored_reply(env, rw)
            if stored is not None:
                return stored, None
            sessions.begin(env, rw)
        reply = body(env)
        if rw is not None:
            sessions.record(env, rw, reply)
        last = env.last_entry
        return reply, OpTime.from_document(last) if last and "ts" in last else None

    reply, optime = await ctx.node.submit_write(fn, durable=False)
    reply = dict(reply)
    wce = await ctx.node.wait_for_write_concern(wc, optime or ctx.node.last_committed_optime)
    if wce is not None:
        reply["writeConcernError"] = {k: v for k, v in wce.to_document().items() if k != "ok"}
    return reply


def _result_reply(result: WriteResult, *, update: bool = False) -> dict[str, Any]:
    reply: dict[str, Any] = {"n": result.n}
    if update:
        reply["nModified"] = result.n_modified
        if result.upserted:
            reply["upserted"] = result.upserted
    if result.write_errors:
        reply["writeErrors"] = result.write_errors
    reply["ok"] = 1.0
    return reply


BatchWrite = Callable[[WriteEnv, str, list[Any], bool], WriteResult]


async def _batch_write(ctx: CommandContext, field: str, perform: BatchWrite) -> dict[str, Any]:
    ns = f"{ctx.db}.{collection_name(ctx)}"
    system_namespaces.check_write(ns)
    statements = _array_arg(ctx, field)
    ordered = bool(ctx.cmd.get("ordered", True))
    is_update = field == "updates"
    return await run_write(
        ctx, lambda env: _result_reply(perform(env, ns, statements, ordered), update=is_update)
    )


@command("insert", kind="write")
async def cmd_insert(ctx: CommandContext) -> dict[str, Any]:
    return await _batch_write(ctx, "documents", insert_documents)


@command("update", kind="write")
async def cmd_update(ctx: CommandContext) -> dict[str, Any]:
    return await _batch_write(ctx, "updates", update_documents)


@command("delete", kind="write")
async def cmd_delete(ctx: CommandContext) -> dict[str, Any]:
    return await _batch_write(ctx, "deletes", delete_documents)


@command("findAndModify", "findandmodify", kind="write")
async def cmd_find_and_modify(ctx: CommandContext) -> dict[str, Any]:
    ns = f"{ctx.db}.{collection_name(ctx)}"
    system_namespaces.check_write(ns)
    fields = ctx.cmd.get("fields")
    if fields:
        validate_projection(fields)

    def body(env: WriteEnv) -> dict[str, Any]:
        reply = find_and_modify(env, ns, ctx.cmd)
        if fields and reply.get("value") is not None:
            reply["value"] = apply_projection(reply["value"], fields)
        reply["ok"] = 1.0
        return reply

    return await run_write(ctx, body)


# -- reads ---------------------------------------------------------------------------
def _int_arg(cmd: dict[str, Any], field: str, default: int = 0) -> int:
    value = cmd.get(field, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise MongoError(14, f"BSON field '{field}' is the wrong type '{type(value).__name__}', "
                             "expected types '[long, int, decimal, double]'")
    return int(value)


def _document_arg(cmd: dict[str, Any], field: str) -> dict[str, Any] | None:
    value = cmd.get(field)
    if value is not None and not isinstance(value, dict):
        raise MongoError(14, f"BSON field '{field}' is the wrong type '{type(value).__name__}', "
                             "expected type 'object'")
    return value


def _natural_direction(sort: dict[str, Any] | None) -> int | None:
    if sort and list(sort) == ["$natural"]:
        return -1 if sort["$natural"] < 0 else 1
    return None


def collection_source(ctx: CommandContext, ns: str, query: dict[str, Any], *, reverse: bool = False,
                      tail_state: dict[str, int] | None = None) -> Iterator[dict[str, Any]]:
    """Documents of a namespace in natural order (the oplog is a virtual collection)."""
    reader = ctx.node.store.reader
    if ns == OPLOG_NS:
        return oplog_source(reader, oplog_start_key(query), reverse=reverse, before_key=oplog_end_key(query),
                            state=tail_state)
    exact, id_value = id_equality(query)
    if exact:
        doc = reader.get(ns, id_value)
        return iter([] if doc is None else [doc])
    docs = reader.scan(ns)
    return reversed(list(docs)) if reverse else docs


def _query_pipeline(source: Iterator[dict[str, Any]], matcher: Matcher, cmd: dict[str, Any],
                    sort: dict[str, Any] | None, skip: int, projection: dict[str, Any] | None
                    ) -> Iterator[dict[str, Any]]:
    docs: Iterator[dict[str, Any]] = (d for d in source if matcher.matches(d))
    if sort and _natural_direction(sort) is None:
        docs = iter(sort_documents(list(docs), sort))
    for _ in range(skip):
        if next(docs, None) is None:
            break
    if projection:
        compiled = compile_projection(projection, matcher=matcher)
        return (compiled.apply(d) for d in docs)
    return docs


@command("find", kind="read")
async def cmd_find(ctx: CommandContext) -> dict[str, Any]:
    coll = collection_name(ctx)
    ns = f"{ctx.db}.{coll}"
    cmd = ctx.cmd
    query = _document_arg(cmd, "filter") or {}
    sort = _document_arg(cmd, "sort")
    projection = _document_arg(cmd, "projection")
    if projection:
        validate_projection(projection)
    skip, limit, batch_size = _int_arg(cmd, "skip"), _int_arg(cmd, "limit"), _int_arg(cmd, "batchSize", -1)
    if skip < 0 or batch_size < -1:
        raise MongoError(2, "skip and batchSize must be non-negative")
    single_batch = bool(cmd.get("singleBatch")) or limit < 0
    limit = abs(limit)
    matcher = compile_filter(query)
    tailable = bool(cmd.get("tailable"))
    tail_state: dict[str, int] = {"last": oplog_start_key(query)}
    raw = (ns == OPLOG_NS and start_key_is_whole_filter(query) and not projection and not skip
           and (not sort or _natural_direction(sort) == 1))
    if raw:
        # A sync source serving a fetcher: entries go out as stored, never decoded.
        docs: Iterator[Any] = raw_oplog_source(ctx.node.store.reader, tail_state["last"], tail_state)
    else:
        source = collection_source(ctx, ns, query, reverse=_natural_direction(sort) == -1,
                                   tail_state=tail_state)
        docs = _query_pipeline(source, matcher, cmd, sort, skip, projection)
    cursor = Cursor(id=0, ns=ns, source=docs, limit=limit, tailable=tailable,
                    await_data=bool(cmd.get("awaitData")))
    if tailable:
        if ns != OPLOG_NS:
            raise MongoError(2, "tailable cursor requested on non capped collection")
        cursor.refill = _tail_refill(ctx, tail_state, None if raw else matcher, projection)
        cursor.tail_state = tail_state
    return _with_repl_data(ctx, ns, _first_batch(ctx, cursor, batch_size if batch_size >= 0 else 0,
                                                 single_batch))


def _with_repl_data(ctx: CommandContext, ns: str, reply: dict[str, Any]) -> dict[str, Any]:
    """Oplog reads carry the sender's term and commit point, as a sync source's replies do."""
    if ns == OPLOG_NS:
        reply["$replData"] = ctx.node.repl.metadata_document()
    return reply


def _tail_refill(ctx: CommandContext, state: dict[str, int], matcher: Matcher | None,
                 projection: dict[str, Any] | None) -> Callable[[], Iterator[dict[str, Any]]]:
    reader = ctx.node.store.reader

    def refill() -> Iterator[dict[str, Any]]:
        check_tail_position(reader, state.get("last", 0))
        if matcher is None:
            return raw_oplog_source(reader, state.get("last", 0), state)
        source = oplog_source(reader, state.get("last", 0), reverse=False, state=state)
        return _query_pipeline(source, matcher, {}, None, 0, projection)

    return refill


def _first_batch(ctx: CommandContext, cursor: Cursor, batch_size: int, single_batch: bool) -> dict[str, Any]:
    batch = cursor.next_batch(batch_size)
    keep = not single_batch and (cursor.tailable or not cursor.exhausted)
    if keep and not cursor.tailable and not cursor.pending:
        # Peek so that a cursor that is already drained is not left open.
        nxt = next(cursor.source, None)
        if nxt is None:
            keep = False
        else:
            cursor.pending.append(nxt)
    if keep:
        cursor.id = ctx.node.cursors.new_id()
        ctx.node.cursors.register(cursor, now_ms())
    return cursor_reply(cursor.id, cursor.ns, batch, first=True)


@command("getMore")  # the cursor was opened with the read preference it needed
async def cmd_get_more(ctx: CommandContext) -> dict[str, Any]:
    cursor_id = ctx.cmd["getMore"]
    if isinstance(cursor_id, bool) or not isinstance(cursor_id, int):
        raise MongoError(14, "getMore cursor id must be a 64-bit integer")
    ns = f"{ctx.db}.{collection_name(ctx, 'collection')}"
    registry = ctx.node.cursors
    cursor = registry.get(int(cursor_id), ns, now_ms())
    report = ctx.cmd.get(POSITIONS_FIELD)
    if report is not None and ns == OPLOG_NS:
        ctx.node.repl.on_update_position(report)  # a fetcher's positions, riding on its getMore
    batch_size = _int_arg(ctx.cmd, "batchSize", 0)
    batch = cursor.next_batch(batch_size)
    if not batch and cursor.tailable and cursor.await_data:
        max_time_ms = _int_arg(ctx.cmd, "maxTimeMS", DEFAULT_AWAIT_DATA_MS) or DEFAULT_AWAIT_DATA_MS
        await ctx.node.wait_for_oplog(cursor.tail_state.get("last", 0), max_time_ms / 1000)
        if cursor.killed:
            raise MongoError(237, f"cursor id {cursor.id} was killed: {cursor.killed}")
        batch = cursor.next_batch(batch_size)
    done = cursor.exhausted and not cursor.tailable and not cursor.pending
    if not done and not cursor.tailable:
        nxt = next(cursor.source, None)
        if nxt is None:
            done = True
        else:
            cursor.pending.append(nxt)
    if done:
        registry.kill(cursor.id)
    return _with_repl_data(ctx, ns, cursor_reply(0 if done else cursor.id, ns, batch, first=False))


@command("killCursors")
async def cmd_kill_cursors(ctx: CommandContext) -> dict[str, Any]:
    ids = ctx.cmd.get("cursors")
    if not isinstance(ids, list):
        raise MongoError(9, "killCursors requires a 'cursors' array")
    killed, not_found = [], []
    for cid in ids:
        (killed if ctx.node.cursors.kill(int(cid)) else not_found).append(Int64(cid))
    return {"cursorsKilled": killed, "cursorsNotFound": not_found, "cursorsAlive": [],
            "cursorsUnknown": [], "ok": 1.0}


@command("aggregate", kind="read")
async def cmd_aggregate(ctx: CommandContext) -> dict[str, Any]:
    target = ctx.cmd["aggregate"]
    pipeline = ctx.cmd.get("pipeline")
    if not isinstance(pipeline, list):
        raise MongoError(14, "'pipeline' option must be specified as an array")
    cursor_opts = _document_arg(ctx.cmd, "cursor")
    if cursor_opts is None and not ctx.cmd.get("explain"):
        raise MongoError(9, "The 'cursor' option is required, except for aggregate with the explain "
                            "argument")
    if ctx.cmd.get("explain"):
        raise MongoError(115, "explain is not supported")
    if target == 1 or not isinstance(target, str):
        raise MongoError(73, "collection-less aggregate is not supported")
    ns = f"{ctx.db}.{target}"
    if pipeline and isinstance(pipeline[0], dict) and "$collStats" in pipeline[0]:
        from replset.wire.admin import coll_stats_document

        docs: Any = iter([coll_stats_document(ctx, ns, pipeline[0]["$collStats"])])
        pipeline = pipeline[1:]
        validate_pipeline(pipeline)
        results = run_pipeline(docs, pipeline, now=utcnow())
    else:
        validate_pipeline(pipeline)
        first = pipeline[0] if pipeline else {}
        source = collection_source(ctx, ns, first.get("$match") or {} if isinstance(first, dict) else {})
        results = run_pipeline(source, pipeline, now=utcnow())
    batch_size = _int_arg(cursor_opts or {}, "batchSize", 0)
    cursor = Cursor(id=0, ns=ns, source=iter(results))
    return _first_batch(ctx, cursor, batch_size, False)


@command("count", kind="read")
async def cmd_count(ctx: CommandContext) -> dict[str, Any]:
    ns = f"{ctx.db}.{collection_name(ctx)}"
    query = _document_arg(ctx.cmd, "query") or {}
    skip, limit = _int_arg(ctx.cmd, "skip"), abs(_int_arg(ctx.cmd, "limit"))
    if not query and ns != OPLOG_NS:
        n = ctx.node.store.reader.count(ns)
    else:
        matcher = compile_filter(query)
        n = sum(1 for d in collection_source(ctx, ns, query) if matcher.matches(d))
    n = max(0, n - skip)
    if limit:
        n = min(n, limit)
    return {"n": n, "ok": 1.0}


@command("distinct", kind="read")
async def cmd_distinct(ctx: CommandContext) -> dict[str, Any]:
    from oplog.query import get_path

    ns = f"{ctx.db}.{collection_name(ctx)}"
    key = ctx.cmd.get("key")
    if not isinstance(key, str):
        raise MongoError(14, "'key' must be a string")
    query = _document_arg(ctx.cmd, "query") or {}
    matcher = compile_filter(query)
    seen: dict[bytes, Any] = {}
    for doc in collection_source(ctx, ns, query):
        if not matcher.matches(doc):
            continue
        for value in get_path(doc, key):
            for item in value if isinstance(value, list) else [value]:
                seen.setdefault(canonical_key(item), item)
    values = sort_documents([{"v": v} for v in seen.values()], {"v": 1})
    return {"values": [d["v"] for d in values], "ok": 1.0}

