"""CRUD commands: insert, update, delete, findAndModify, find, getMore, killCursors,
aggregate, count, distinct. Writes go through group commit and the oplog; reads use
the committed snapshot and server-side cursors.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from typing import Any

import bson
from bson.int64 import Int64

from base.clock import Clock
from base.errors import MongoError
from base.messages import POSITIONS_FIELD
from base.optime import OpTime
from oplog.aggregate import Sampler, check_output, iter_pipeline, may_grow, validate_pipeline
from oplog.clustered import clustered_index_spec, is_clustered
from oplog.codec_options import DOC_OPTIONS
from oplog.collation import Collation, collated_matcher, collated_sort, has_strings, parse_collation
from oplog.doc_limits import MAX_INTERNAL_BSON_SIZE
from oplog.explain import query_planner
from oplog.expressions import evaluate, filter_evaluates_expressions, projection_evaluates_expressions
from oplog.index_hint import IndexScan, index_for_key, index_scan, is_natural_hint, key_of
from oplog.output_stages import output_stage
from oplog.projection import apply_projection, compile_projection, validate_projection
from oplog.query import Matcher
from oplog.sort import sort_payloads
from oplog.sqlite_store import scan_rows
from oplog.timeseries import BucketCatalog, TimeseriesOptions
from oplog.timeseries_writes import insert_measurements
from oplog.values import canonical_key
from oplog.views import refuse_on_view, resolve_view, view_definition
from oplog.writes import (
    WriteEnv,
    delete_documents,
    evaluates_expressions,
    find_and_modify,
    id_equality,
    insert_documents,
    statement_evaluates_expressions,
    update_documents,
)
from replset.auth.access import acts_as_member
from replset.cursors import Cursor, cursor_reply
from replset.query_pool import TimeLimit, time_checked
from replset.wire import change_streams, sessions, system_namespaces
from replset.wire.capped_tail import capped_tail_source, check_capped_position, check_tailable
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
from replset.wire.output_forward import forward_output, write_output
from replset.wire.ownership import check_cursor_owner, list_local_sessions, register_cursor
from replset.wire.read_waits import (
    before_read,
    bind_view,
    read_concern_of,
    settle_batch,
    stamp_operation_time,
)
from replset.wire.views import check_not_view, write_target
from replset.wire.write_batches import (
    CANDIDATE_RETRIES,
    Perform,
    StaleCandidates,
    find_candidates,
    result_reply,
    run_batch,
)
from replset.write_concern import parse_write_concern, write_concern_error_field

MAX_WRITE_BATCH = 100_000
DEFAULT_AWAIT_DATA_MS = 1000


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
async def run_write(ctx: CommandContext, body: Callable[[WriteEnv], dict[str, Any]], *,
                    off_loop: bool = False) -> dict[str, Any]:
    """Runs a write command once per (lsid, txnNumber), then honours the write concern. `off_loop`:
    a write whose cost grows with the data (see `GroupCommitWriter.submit`)."""
    bypass = bool(ctx.cmd.get("bypassDocumentValidation"))
    if ctx.txn is not None:  # a statement of a transaction: its writes wait for the commit
        def in_transaction(env: WriteEnv) -> dict[str, Any]:
            env.bypass_validation = bypass
            return body(env)

        return dict(await ctx.node.transactions.run_statement(ctx.txn, in_transaction, off_loop=off_loop))
    wc = parse_write_concern(ctx.cmd.get("writeConcern"))
    # `local` is not replicated, so neither is a retry record of a write to it (and none is kept).
    rw = None if ctx.db == "local" else sessions.retryable_write(ctx.cmd)

    def fn(env: WriteEnv) -> tuple[dict[str, Any], OpTime | None]:
        env.bypass_validation = bypass
        if rw is not None:
            stored = sessions.recorded(env, rw).stored
            if stored is not None:
                return stored, None
            sessions.begin(env, rw)
        reply = body(env)
        if rw is not None:
            sessions.record(env, rw, reply)
        last = env.last_entry
        return reply, OpTime.from_document(last) if last and "ts" in last else None

    reply, optime = await ctx.node.submit_write(fn, durable=False, flush=wc.waits_for_journal,
                                                off_loop=off_loop)
    reply = dict(reply)
    wce = await ctx.node.wait_for_write_concern(wc, optime or ctx.node.last_committed_optime)
    if wce is not None:
        reply["writeConcernError"] = write_concern_error_field(wce)
    return reply


async def _batch_write(ctx: CommandContext, field: str, perform: Perform) -> dict[str, Any]:
    ns = f"{ctx.db}.{collection_name(ctx)}"
    system_namespaces.check_write(ns)
    timeseries = write_target(ctx.node.store.reader, ns, ctx.name)
    if timeseries is not None:
        if field != "documents":
            raise MongoError(72, f"{ctx.name} on the time-series collection {ns} is not supported by this server "
                                 "(inserts and reads are)")
        ns, options = timeseries
        perform = _measurements(options, ctx.node.buckets)
    statements = _array_arg(ctx, field)
    ordered = bool(ctx.cmd.get("ordered", True))
    if ctx.txn is not None:
        # In a transaction: the whole command is one statement of it, its candidates found in it.
        evaluates = field != "documents" and any(statement_evaluates_expressions(s) for s in statements)
        return await run_write(ctx, lambda env: result_reply(perform(env, ns, statements, ordered, None),
                                                             update=field == "updates"), off_loop=evaluates)
    return await run_batch(ctx, ns, statements, ordered, perform, is_update=field == "updates",
                           scanning=field != "documents")


def _measurements(options: TimeseriesOptions, catalog: BucketCatalog) -> Perform:
    """An insert into a time-series collection: into its buckets (see `oplog.timeseries`)."""
    return lambda env, ns, docs, ordered, _found: insert_measurements(env, ns, docs, ordered, options, catalog)


@command("insert", kind="write")
async def cmd_insert(ctx: CommandContext) -> dict[str, Any]:
    return await _batch_write(ctx, "documents", lambda env, ns, docs, ordered, _found: insert_documents(
        env, ns, docs, ordered))


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
    if write_target(ctx.node.store.reader, ns, "findAndModify") is not None:
        raise MongoError(72, f"findAndModify on the time-series collection {ns} is not supported by this server")
    fields = ctx.cmd.get("fields")
    if fields:
        validate_projection(fields)

    def body(candidates: list[Any] | None) -> Callable[[WriteEnv], dict[str, Any]]:
        # With candidates found off the loop: if the first no longer matches (another writer took
        # it), roll back and look again rather than answer "nothing matched".
        cmd = ctx.cmd if not candidates else {**ctx.cmd, "upsert": False}

        def run(env: WriteEnv) -> dict[str, Any]:
            reply = find_and_modify(env, ns, cmd, candidates)
            if candidates and reply["lastErrorObject"]["n"] == 0:
                raise StaleCandidates()
            if fields and reply.get("value") is not None:
                reply["value"] = apply_projection(reply["value"], fields)
            reply["ok"] = 1.0
            return reply

        return run

    query = ctx.cmd.get("query") or {}
    evaluates = evaluates_expressions(query, ctx.cmd.get("update"))  # (then off the event loop)
    if ctx.txn is not None:
        return await run_write(ctx, body(None), off_loop=evaluates)
    if isinstance(query, dict) and not id_equality(query)[0]:
        limit = TimeLimit.from_max_time_ms(_int_arg(ctx.cmd, "maxTimeMS"))
        for _attempt in range(CANDIDATE_RETRIES):
            ids = await find_candidates(ctx, ns, query, ctx.cmd.get("sort"), True, limit,
                                        parse_collation(ctx.cmd.get("collation")))
            try:
                return await run_write(ctx, body(ids), off_loop=evaluates)
            except StaleCandidates:
                continue
    return await run_write(ctx, body(None), off_loop=evaluates)


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
                      tail_state: dict[str, int] | None = None, off_loop: bool = False,
                      collation: Collation | None = None) -> Iterator[dict[str, Any]]:
    """Documents of a namespace in natural order (the oplog is a virtual collection). `off_loop`: for
    iteration on the query pool's threads (each chunk read through that thread's connection, the
    deadline of the running batch checked as it goes)."""
    if ns != OPLOG_NS:
        viewed = resolve_view(lambda name: view_definition(ctx.node.store.reader, name), ns)
        if viewed is not None:  # a view: its source, through its pipeline
            source_ns, pipeline = viewed
            source = collection_source(ctx, source_ns, {}, off_loop=off_loop, collation=collation)
            return _pipeline_results(ctx, source, pipeline, ctx.node.now(), collation)
    reader: Any = ctx.node.store.any_thread_reader if off_loop else ctx.node.store.reader
    if ctx.txn is not None and ns != OPLOG_NS:
        reader = ctx.txn  # the transaction's snapshot, its own writes over it
    elif ctx.snapshot is not None and ns != OPLOG_NS:
        reader = ctx.snapshot  # a snapshot read's point in time
    elif ctx.majority_view is not None and ns != OPLOG_NS:
        reader = ctx.majority_view  # a majority read's committed snapshot
    if ns == OPLOG_NS:
        docs = oplog_source(reader, oplog_start_key(query), reverse=reverse, before_key=oplog_end_key(query),
                            state=tail_state)
    else:
        exact, id_value = id_equality(query)
        if exact and not (collation is not None and has_strings(id_value)):  # (the _id index is binary)
            doc = reader.get(ns, id_value)
            return iter([] if doc is None else [doc])
        docs = reader.scan(ns)
        info = ctx.node.store.reader.collection(ns)  # (the catalog: a transaction's reader has none)
        if info is not None and is_clustered(info.options):  # (natural order is _id order)
            docs = iter(collated_sort(list(docs), {"_id": 1}, None))
        if reverse:
            docs = _reversed_lazily(docs)
    return time_checked(docs) if off_loop else docs


def _reversed_lazily(docs: Iterator[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    yield from reversed(list(docs))


def runs_on_loop(ns: str, query: dict[str, Any], tailable: bool, projection: dict[str, Any] | None = None) -> bool:
    """Reads whose cost does not grow with the data stay on the event loop: a lookup by `_id`, and the
    positional oplog reads of fetchers and tailing cursors. Everything else runs on the query pool, and
    so does a lookup whose filter or projection evaluates expressions (their cost is the client's)."""
    if ns == OPLOG_NS:
        return tailable or start_key_is_whole_filter(query)
    if tailable:
        return True  # (a capped collection: what a tailing cursor reads is bounded by its size)
    return (id_equality(query)[0] and not filter_evaluates_expressions(query)
            and not projection_evaluates_expressions(projection))


def _decoded(stored: Iterator[bytes]) -> Iterator[tuple[dict[str, Any], bytes]]:
    for blob in stored:
        yield bson.decode(blob, DOC_OPTIONS), blob


def _query_pipeline(source: Iterator[Any], matcher: Matcher, cmd: dict[str, Any],
                    sort: dict[str, Any] | None, skip: int, projection: dict[str, Any] | None, *,
                    sorted_by: dict[str, Any] | None = None, collation: Collation | None = None
                    ) -> Iterator[dict[str, Any]]:
    """Lazy from the first document on: nothing (not even a sort) runs before the first batch asks.
    With `sorted_by`, `source` yields (document, stored BSON) pairs: the sort keeps the BSON of each
    matching document and decodes again only what the cursor returns (see `sort_payloads`)."""
    docs: Iterator[dict[str, Any]]
    if sorted_by is not None:
        matching = ((doc, blob) for doc, blob in source if matcher.matches(doc))
        docs = (bson.decode(blob, DOC_OPTIONS) for blob in sort_payloads(matching, sorted_by))
    else:
        docs = (d for d in source if matcher.matches(d))
    if sort and _natural_direction(sort) is None:
        docs = iter(collated_sort(list(docs), sort, collation))
    for _ in range(skip):
        if next(docs, None) is None:
            break
    if projection:
        compiled = compile_projection(projection, matcher=matcher)
        if projection_evaluates_expressions(projection):  # (a computed value may be any size)
            yield from (check_output(compiled.apply(d), MAX_INTERNAL_BSON_SIZE) for d in docs)
            return
        yield from (compiled.apply(d) for d in docs)
        return
    yield from docs


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
    return_key, show_record_id = bool(cmd.get("returnKey")), bool(cmd.get("showRecordId"))
    if (return_key or show_record_id) and (ns == OPLOG_NS or cmd.get("tailable")):
        raise MongoError(115, "returnKey and showRecordId are for finds on collections here")
    collation = parse_collation(cmd.get("collation"))
    matcher = collated_matcher(query, collation)
    scan = hinted_scan(ctx, ns, cmd)
    if scan is not None:
        matcher = _InScan(matcher, scan)
        sort = sort or scan.order
    elif not sort and is_natural_hint(cmd.get("hint")):
        sort = {"$natural": cmd["hint"]["$natural"]}  # (a `$natural` hint reads in that direction)
    tailable = bool(cmd.get("tailable"))
    viewed = ns != OPLOG_NS and view_definition(ctx.node.store.reader, ns) is not None
    if viewed and (tailable or cmd.get("min") is not None or cmd.get("max") is not None):
        raise refuse_on_view(ns, "a tailable cursor, min or max")
    if tailable and ns != OPLOG_NS:
        check_tailable(ctx.node.store.reader, ns)
    concern = read_concern_of(ctx)
    limit_left = TimeLimit.from_max_time_ms(_int_arg(cmd, "maxTimeMS"))
    epoch = await before_read(ctx, concern, limit_left, ns)
    off_loop = viewed or return_key or show_record_id or not runs_on_loop(ns, query, tailable, projection)
    tail_state: dict[str, int] = {"last": oplog_start_key(query) if ns == OPLOG_NS else 0}
    raw = (ns == OPLOG_NS and start_key_is_whole_filter(query) and not projection and not skip
           and (not sort or _natural_direction(sort) == 1))
    if raw:
        # A sync source serving a fetcher: entries go out as stored, never decoded.
        docs: Iterator[Any] = raw_oplog_source(ctx.node.store.reader, tail_state["last"], tail_state)
    elif return_key or show_record_id:
        docs = _keys_or_record_ids(ctx, ns, query, matcher, cmd, sort, skip, projection, collation, return_key)
    elif (off_loop and not viewed and ns != OPLOG_NS and sort and _natural_direction(sort) is None and ctx.txn is None
          and ctx.snapshot is None and ctx.majority_view is None and collation is None):
        stored = time_checked(ctx.node.store.scan_bson_from_any_thread(ns))
        docs = _query_pipeline(_decoded(stored), matcher, cmd, None, skip, projection, sorted_by=sort)
    elif tailable and ns != OPLOG_NS:  # a capped collection, tailed in natural order
        source = capped_tail_source(ctx.node.store.reader, ns, tail_state)
        docs = _query_pipeline(source, matcher, cmd, None, skip, projection)
    else:
        source = collection_source(ctx, ns, query, reverse=_natural_direction(sort) == -1,
                                   tail_state=tail_state, off_loop=off_loop, collation=collation)
        docs = _query_pipeline(source, matcher, cmd, sort, skip, projection, collation=collation)
    cursor = Cursor(id=0, ns=ns, source=docs, limit=limit, tailable=tailable,
                    await_data=bool(cmd.get("awaitData")), read_concern=concern, history_epoch=epoch,
                    view=ctx.majority_view)
    if off_loop:
        cursor.time_limit = limit_left
    if tailable:
        cursor.refill = _tail_refill(ctx, ns, tail_state, None if raw else matcher, projection)
        cursor.tail_state = tail_state
    reply = await first_batch(ctx, cursor, batch_size if batch_size >= 0 else None, single_batch)
    return _with_repl_data(ctx, ns, reply)


def _keys_or_record_ids(ctx: CommandContext, ns: str, query: dict[str, Any], matcher: Any, cmd: dict[str, Any],
                       sort: dict[str, Any] | None, skip: int, projection: dict[str, Any] | None,
                       collation: Collation | None, return_key: bool) -> Iterator[dict[str, Any]]:
    """A find with `returnKey` (each result is the key of the index the find reads with; see
    `oplog.index_hint.index_for_key`) or `showRecordId` (each result carries `$recordId`, its row id,
    after its projection). Row ids are the store's: not for a transaction's or a snapshot's read (115)."""
    if return_key:
        specs = [index.spec for index in ctx.node.store.reader.indexes(ns)]
        spec = index_for_key(specs, cmd.get("hint"), query, sort)
        source = collection_source(ctx, ns, query, off_loop=True, collation=collation)
        return (key_of(doc, spec) for doc in _query_pipeline(source, matcher, cmd, sort, skip, None,
                                                              collation=collation))
    if ctx.txn is not None or ctx.snapshot is not None or ctx.majority_view is not None:
        raise MongoError(115, "showRecordId is not supported in a transaction or a snapshot or majority read here")
    if view_definition(ctx.node.store.reader, ns) is not None:
        raise refuse_on_view(ns, "showRecordId")
    reader = ctx.node.store.any_thread_reader
    source = time_checked(_with_record_id(bson.decode(blob, DOC_OPTIONS), row)
                          for row, blob in scan_rows(lambda: reader, ns))
    docs = _query_pipeline(source, matcher, cmd, sort, skip, None, collation=collation)
    if not projection:
        return docs
    compiled = compile_projection(projection, matcher=matcher)
    return (_with_record_id(compiled.apply(doc), doc["$recordId"]) for doc in docs)


def _with_record_id(doc: dict[str, Any], row: int) -> dict[str, Any]:
    doc["$recordId"] = Int64(row)
    return doc


def hinted_scan(ctx: CommandContext, ns: str, cmd: dict[str, Any]) -> IndexScan | None:
    """The index scan a find's `hint` (and `min` / `max`) ask for (see `oplog.index_hint`); None to read
    in natural order. A collection that does not exist answers nothing, hint or not, as mongod's."""
    low, high = _document_arg(cmd, "min"), _document_arg(cmd, "max")
    if ns == OPLOG_NS or (cmd.get("hint") is None and low is None and high is None):
        return None
    reader = ctx.node.store.reader  # (the catalog: a transaction's reader has none)
    info = reader.collection(ns)
    if info is not None:
        specs = [index.spec for index in reader.indexes(ns)]
        if is_clustered(info.options):  # (named as listIndexes shows it)
            specs = [clustered_index_spec(info.options) if s["name"] == "_id_" else s for s in specs]
    elif ctx.txn is not None:  # (created by the transaction itself: it has its _id index)
        specs = [{"v": 2, "key": {"_id": 1}, "name": "_id_"}]
    else:
        return None
    return index_scan(specs, cmd.get("hint"), low, high)


class _InScan:
    """A find's matcher that also keeps to what a hinted index holds."""

    def __init__(self, matcher: Any, scan: IndexScan) -> None:
        self._matcher = matcher
        self._scan = scan

    def matches(self, doc: dict[str, Any]) -> bool:
        return self._scan.includes(doc) and self._matcher.matches(doc)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._matcher, name)


def _with_repl_data(ctx: CommandContext, ns: str, reply: dict[str, Any]) -> dict[str, Any]:
    """Oplog reads carry the sender's term and commit point, as a sync source's replies do."""
    if ns == OPLOG_NS:
        reply["$replData"] = ctx.node.repl.metadata_document()
    return reply


def _tail_refill(ctx: CommandContext, ns: str, state: dict[str, int], matcher: Matcher | None,
                 projection: dict[str, Any] | None) -> Callable[[], Iterator[dict[str, Any]]]:
    reader = ctx.node.store.reader

    def refill() -> Iterator[dict[str, Any]]:
        if ns != OPLOG_NS:
            assert matcher is not None
            check_capped_position(reader, ns, state)
            return _query_pipeline(capped_tail_source(reader, ns, state), matcher, {}, None, 0, projection)
        check_tail_position(reader, state.get("last", 0))
        if matcher is None:
            return raw_oplog_source(reader, state.get("last", 0), state)
        source = oplog_source(reader, state.get("last", 0), reverse=False, state=state)
        return _query_pipeline(source, matcher, {}, None, 0, projection)

    return refill


def _take_batch(cursor: Cursor, batch_size: int) -> tuple[list[Any], bool]:
    """The next batch, and whether the cursor stays open after it. As mongod's, a cursor whose batch
    filled up stays open without looking further (its next getMore may find nothing and close it: an
    exhaust stream and the driver's command events count on that); one whose source ran dry closes. A
    cursor that is done closes its source here, on the thread that ran the batch: a sort's memory is
    let go there, not on the event loop."""
    batch = cursor.next_batch(batch_size)
    more = cursor.tailable or not cursor.exhausted
    if not more:
        close = getattr(cursor.source, "close", None)
        if close is not None:
            close()
    return batch, more


async def _run_batch(ctx: CommandContext, cursor: Cursor, batch_size: int) -> tuple[list[Any], bool]:
    """`_take_batch` on the query pool for a cursor that runs off the loop, inline otherwise. A cursor is
    used by one batch at a time (a second getMore meanwhile is refused, as mongod's CursorInUse)."""
    if cursor.time_limit is None:
        return _take_batch(cursor, batch_size)
    if cursor.busy:
        raise MongoError(143, f"cursor id {cursor.id} is already in use")
    cursor.busy = True
    try:
        return await ctx.node.queries.run(lambda: _take_batch(cursor, batch_size), cursor.time_limit)
    finally:
        cursor.busy = False


async def first_batch(ctx: CommandContext, cursor: Cursor, batch_size: int | None,
                      single_batch: bool) -> dict[str, Any]:
    """The command's reply with the first batch (`batch_size` None: the default size). A `batchSize` of 0
    asks for an open cursor and no documents yet, as mongod answers it: the query runs at the first
    getMore (raw-batch cursors rely on it)."""
    if batch_size == 0 and not single_batch:
        batch, more = [], True
    else:
        batch, more = await _run_batch(ctx, cursor, batch_size or 0)
    if cursor.read_concern is not None:
        try:
            await settle_batch(ctx.node, cursor.read_concern, cursor.history_epoch, _wait_limit(ctx, cursor),
                               cursor.view)
        except BaseException:
            await _release(ctx, cursor)
            raise
    if more and not single_batch:
        try:
            register_cursor(ctx, cursor)
        except MongoError:  # (past its owner's share of open cursors: refused, its source let go)
            await _release(ctx, cursor)
            raise
    elif more:
        await _release(ctx, cursor)
    reply = _answered_at(ctx, cursor, cursor_reply(cursor.id, cursor.ns, batch, first=True))
    if ctx.snapshot_time is not None:
        reply["cursor"]["atClusterTime"] = ctx.snapshot_time
    return reply


def _wait_limit(ctx: CommandContext, cursor: Cursor) -> TimeLimit:
    """What a batch's read-concern wait may spend: the cursor's `maxTimeMS` left, or the command's own."""
    if cursor.time_limit is not None:
        return cursor.time_limit
    return TimeLimit.from_max_time_ms(_int_arg(ctx.cmd, "maxTimeMS"))


def _answered_at(ctx: CommandContext, cursor: Cursor, reply: dict[str, Any]) -> dict[str, Any]:
    if cursor.read_concern is None:
        return reply
    return stamp_operation_time(reply, ctx.node, cursor.read_concern)


async def _release(ctx: CommandContext, cursor: Cursor) -> None:
    """Closes the source of a cursor that will not be read on. A big sort's memory is let go in
    pieces, on the query pool for a cursor that ran there, not on the event loop."""
    close = getattr(cursor.source, "close", None)
    if close is None or cursor.busy:
        return
    if cursor.time_limit is None:
        close()
    else:
        await ctx.node.queries.run(close)


@command("getMore")  # the cursor was opened with the read preference it needed
async def cmd_get_more(ctx: CommandContext) -> dict[str, Any]:
    cursor_id = ctx.cmd["getMore"]
    if isinstance(cursor_id, bool) or not isinstance(cursor_id, int):
        raise MongoError(14, "getMore cursor id must be a 64-bit integer")
    ns = f"{ctx.db}.{collection_name(ctx, 'collection')}"
    registry = ctx.node.cursors
    cursor = registry.get(int(cursor_id), ns, ctx.node.clock.monotonic_ms())
    check_cursor_owner(ctx, cursor)
    if (cursor.time_limit is not None and cursor.time_limit.left_s is not None
            and ctx.node.failpoints.check("maxTimeAlwaysTimeOut") is not None):
        registry.kill(cursor.id)  # (a getMore runs under what is left of its cursor's maxTimeMS)
        raise MongoError(50, "operation exceeded time limit (maxTimeAlwaysTimeOut fail point)")
    report = ctx.cmd.get(POSITIONS_FIELD)
    if report is not None and ns == OPLOG_NS and acts_as_member(ctx.node.options.auth, ctx.conn.auth):
        ctx.node.repl.on_update_position(report)  # a fetcher's positions, riding on its getMore
    batch_size = _int_arg(ctx.cmd, "batchSize", 0)
    if not ctx.conn.claims_member and (
            point := ctx.node.failpoints.check("failGetMoreAfterCursorCheckout")) is not None:
        error = MongoError(int(point.data.get("errorCode", 96)), "failGetMoreAfterCursorCheckout fail point")
        raise change_streams.resumable(error) if cursor.change_stream is not None else error
    if cursor.change_stream is not None:
        try:
            return await change_streams.get_more(ctx, cursor, batch_size or 101, _int_arg(ctx.cmd, "maxTimeMS"))
        except MongoError as err:
            raise change_streams.resumable(err) from None
    if cursor.view is not None:
        bind_view(ctx.node, cursor.view)  # this batch reads the committed snapshot of now
        ctx.majority_view = cursor.view  # (let go when the command ends)
    if cursor.time_limit is not None:
        try:
            batch, more = await _run_batch(ctx, cursor, batch_size)
        except MongoError as err:
            if err.code != 143:
                registry.kill(cursor.id)  # a cursor whose batch failed (time limit, dropped collection) is dead
            raise
        if cursor.killed:  # a rollback or resync replaced the data under it meanwhile
            raise MongoError(237, f"cursor id {cursor.id} was killed: {cursor.killed}")
        await _settle_more(ctx, cursor)
        if not more:
            registry.kill(cursor.id)
        return _answered_at(ctx, cursor, _with_repl_data(
            ctx, ns, cursor_reply(cursor.id if more else 0, ns, batch, first=False)))
    try:
        if cursor.tailable and ns != OPLOG_NS and cursor.refill is not None:
            # A capped collection's tail reads afresh from its position at each getMore: rows read ahead
            # earlier may have been trimmed since (and a trimmed position is CappedPositionLost).
            cursor.source = cursor.refill()
        batch = cursor.next_batch(batch_size)
        if not batch and cursor.tailable and cursor.await_data:
            max_time_ms = _int_arg(ctx.cmd, "maxTimeMS", DEFAULT_AWAIT_DATA_MS) or DEFAULT_AWAIT_DATA_MS
            if ns == OPLOG_NS:
                await ctx.node.wait_for_oplog(cursor.tail_state.get("last", 0), max_time_ms / 1000)
                batch = cursor.next_batch(batch_size)
            else:
                batch = await _await_capped(ctx, cursor, batch_size, max_time_ms / 1000)
    except MongoError:
        registry.kill(cursor.id)  # (a tailing cursor whose position was trimmed away is dead)
        raise
    if cursor.killed:
        raise MongoError(237, f"cursor id {cursor.id} was killed: {cursor.killed}")
    done = cursor.exhausted and not cursor.tailable and not cursor.pending  # (no look past a full batch)
    await _settle_more(ctx, cursor)
    if done:
        registry.kill(cursor.id)
    if batch and ns == OPLOG_NS:
        ctx.node.hops.mark("served", cursor.tail_state.get("last", 0))
    return _answered_at(ctx, cursor, _with_repl_data(
        ctx, ns, cursor_reply(0 if done else cursor.id, ns, batch, first=False)))


async def _await_capped(ctx: CommandContext, cursor: Cursor, batch_size: int, wait_s: float) -> list[Any]:
    """An awaitData getMore on a capped collection: waits for writes (any committed entry wakes it) until
    one brings the cursor documents, or the wait is over."""
    deadline = ctx.node.clock.monotonic() + wait_s
    while (left := deadline - ctx.node.clock.monotonic()) > 0 and not cursor.killed:
        await ctx.node.wait_for_oplog(ctx.node.last_committed_optime.ts_key, left)
        batch = cursor.next_batch(batch_size)
        if batch:
            return batch
    return []


async def _settle_more(ctx: CommandContext, cursor: Cursor) -> None:
    """A getMore's batch under the cursor's read concern; a cursor whose wait failed is dead."""
    if cursor.read_concern is None or not cursor.read_concern.majority:
        return
    try:
        await settle_batch(ctx.node, cursor.read_concern, cursor.history_epoch, _wait_limit(ctx, cursor),
                           cursor.view)
    except BaseException:
        if ctx.node.cursors.take(cursor.id) is not None:
            await _release(ctx, cursor)
        raise


@command("killCursors")
async def cmd_kill_cursors(ctx: CommandContext) -> dict[str, Any]:
    """Kills the listed cursors of the namespace named; as in mongod, a cursor of another namespace is
    left alone and reported in `cursorsNotFound`, and one of another user makes the whole command
    Unauthorized (13) before any is killed."""
    ns = f"{ctx.db}.{collection_name(ctx)}"
    ids = ctx.cmd.get("cursors")
    if not isinstance(ids, list):
        raise MongoError(9, "killCursors requires a 'cursors' array")
    for cid in ids:
        found = ctx.node.cursors.peek(int(cid))
        if found is not None and found.ns == ns:
            check_cursor_owner(ctx, found, kill=True)
    killed, not_found = [], []
    for cid in ids:
        found = ctx.node.cursors.peek(int(cid))
        if found is None or found.ns != ns:
            not_found.append(Int64(cid))
            continue
        cursor = ctx.node.cursors.take(int(cid))
        (killed if cursor is not None else not_found).append(Int64(cid))
        if cursor is not None:
            await _release(ctx, cursor)
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
        return _explain_aggregate(ctx, target, pipeline)
    if change_streams.is_change_stream(pipeline):
        try:
            return await change_streams.open_stream(ctx, target, pipeline, cursor_opts or {})
        except MongoError as err:
            raise change_streams.resumable(err) from None
    documents: list[dict[str, Any]] | None = None
    source_stage = next(iter(pipeline[0])) if pipeline and isinstance(pipeline[0], dict) and pipeline[0] else ""
    if target == 1 and source_stage == "$documents":
        spec = pipeline[0]["$documents"]
        clock = ctx.node.clock
        documents = await ctx.node.queries.run(lambda: _documents_stage(spec, clock))  # (an expression: off the loop)
        pipeline = pipeline[1:]
        ns = f"{ctx.db}.$cmd.aggregate"
    elif target == 1 and source_stage == "$listLocalSessions":  # (on any database, as mongod's)
        documents = list_local_sessions(ctx, pipeline[0]["$listLocalSessions"])
        pipeline = pipeline[1:]
        ns = f"{ctx.db}.$cmd.aggregate"
    elif target == 1 or not isinstance(target, str):
        raise MongoError(73, "collection-less aggregate is supported with $changeStream, $documents or "
                             "$listLocalSessions first")
    else:
        ns = f"{ctx.db}.{target}"
    limit = TimeLimit.from_max_time_ms(_int_arg(ctx.cmd, "maxTimeMS"))
    concern = read_concern_of(ctx)
    epoch = await before_read(ctx, concern, limit, ns)
    now = ctx.node.now()
    write_reply: dict[str, Any] = {}
    output = None
    collation = parse_collation(ctx.cmd.get("collation"))
    if pipeline and isinstance(pipeline[0], dict) and "$collStats" in pipeline[0]:
        from replset.wire.admin import coll_stats_document

        check_not_view(ctx.node.store.reader, ns, "$collStats")
        spec = pipeline[0]["$collStats"]
        stats = await ctx.node.queries.run(
            lambda: coll_stats_document(ctx, ns, spec, ctx.node.store.thread_reader()))
        documents = [stats]
        pipeline = pipeline[1:]
    else:
        output = output_stage(pipeline, ctx.db)
        if output is not None:
            if concern.level == "linearizable":
                raise MongoError(72, f"{output.kind} cannot be used with a 'linearizable' read concern level")
            pipeline = pipeline[:-1]
            system_namespaces.check_write(output.ns)
            check_not_view(ctx.node.store.reader, output.ns, output.kind)
    validate_pipeline(pipeline)
    first = pipeline[0] if pipeline else {}
    source = iter(documents) if documents is not None else collection_source(
        ctx, ns, first.get("$match") or {} if isinstance(first, dict) else {}, off_loop=True,
        collation=collation)
    # The pipeline runs on the query pool, batch by batch as the cursor is read (its stages may group or
    # sort every document, and evaluate expressions); every result must fit in a reply's document.
    results = _pipeline_results(ctx, source, pipeline, now, collation)
    if output is not None:
        written = await ctx.node.queries.run(lambda: list(results), limit)
        if ctx.node.is_primary or ctx.txn is not None:
            write_reply = await run_write(ctx, lambda env: write_output(env, output, written))
        else:
            # As mongod 5.0+: the read ran here, on the secondary the client chose; the write goes to
            # the primary.
            write_reply = await forward_output(ctx, output, written)
        results = iter([])
    batch_size = _int_arg(cursor_opts or {}, "batchSize", -1)
    cursor = Cursor(id=0, ns=ns, source=results, read_concern=concern, history_epoch=epoch,
                    view=ctx.majority_view)
    cursor.time_limit = limit
    written_out = output is not None  # (its cursor has nothing to return: it closes at once)
    reply = await first_batch(ctx, cursor, None if batch_size < 0 or written_out else batch_size, False)
    if "writeConcernError" in write_reply:
        reply["writeConcernError"] = write_reply["writeConcernError"]
    if "operationTime" in write_reply:  # (written through the primary: the time of its write)
        reply["operationTime"] = write_reply["operationTime"]
    return reply


def _pipeline_results(ctx: CommandContext, source: Iterator[dict[str, Any]], pipeline: list[Any],
                      now: Any, collation: Collation | None) -> Iterator[dict[str, Any]]:
    """The results of `pipeline` over `source`, computed as they are read (on the query pool: nothing
    runs before the first batch asks, not even a blocking stage), each checked to fit a reply (16 MiB +
    16 KiB of BSON) when a stage may have built it."""
    allow_disk_use = ctx.cmd.get("allowDiskUse") is not False
    collections = _collections_of(ctx)
    grows = may_grow(pipeline)
    results = iter_pipeline(source, pipeline, now=now, collections=collections, sampler=_SAMPLER,
                            collation=collation, allow_disk_use=allow_disk_use)
    for doc in results:
        yield check_output(doc, MAX_INTERNAL_BSON_SIZE) if grows else doc


class _RandomSampler(Sampler):
    def __init__(self) -> None:
        self._random = random.Random()

    def sample(self, population: list[dict[str, Any]], k: int) -> list[dict[str, Any]]:
        return self._random.sample(population, k)


_SAMPLER = _RandomSampler()


def _collections_of(ctx: CommandContext) -> Callable[[str], Iterator[dict[str, Any]]]:
    """How `$lookup` / `$unionWith` read another collection of the database: as the aggregate reads
    its own (a transaction's or a snapshot read's view, else the newest data from the reader of
    whichever query-pool thread runs the stage)."""
    view: Any = ctx.txn if ctx.txn is not None else ctx.snapshot or ctx.majority_view

    def read(coll: str) -> Iterator[dict[str, Any]]:
        ns = f"{ctx.db}.{coll}"
        if view_definition(ctx.node.store.reader, ns) is not None:  # (a view: through its pipeline)
            return collection_source(ctx, ns, {}, off_loop=True)
        return iter(view.scan(ns)) if view is not None else ctx.node.store.scan_from_any_thread(ns)

    return read


def _explain_aggregate(ctx: CommandContext, target: Any, pipeline: list[Any]) -> dict[str, Any]:
    """`aggregate` with `explain: true`: the plan of the collection read, then the stages as given."""
    validate_pipeline(pipeline)
    first = pipeline[0] if pipeline and isinstance(pipeline[0], dict) else {}
    planner = query_planner(f"{ctx.db}.{target}", first.get("$match") or {})
    return {"explainVersion": "1", "stages": [{"$cursor": {"queryPlanner": planner}}, *pipeline], "ok": 1.0}


def _documents_stage(expr: Any, clock: Clock) -> list[dict[str, Any]]:
    """`$documents`: the documents an expression (evaluated with no input document, `$$NOW` from `clock`)
    gives."""
    docs = evaluate(expr, {}, now=clock.wall())
    if not isinstance(docs, list) or not all(isinstance(d, dict) for d in docs):
        raise MongoError(5858203, "error during $documents stage: the value must be an array of objects")
    return docs


@command("count", kind="read")
async def cmd_count(ctx: CommandContext) -> dict[str, Any]:
    ns = f"{ctx.db}.{collection_name(ctx)}"
    query = _document_arg(ctx.cmd, "query") or {}
    skip, limit = _int_arg(ctx.cmd, "skip"), abs(_int_arg(ctx.cmd, "limit"))
    concern = read_concern_of(ctx)
    time_limit = TimeLimit.from_max_time_ms(_int_arg(ctx.cmd, "maxTimeMS"))
    epoch = await before_read(ctx, concern, time_limit, ns)
    if not query and ns != OPLOG_NS and view_definition(ctx.node.store.reader, ns) is None:
        view: Any = ctx.majority_view if ctx.majority_view is not None else ctx.node.store.any_thread_reader
        n = await ctx.node.queries.run(lambda: view.count(ns))
    else:
        collation = parse_collation(ctx.cmd.get("collation"))
        matcher = collated_matcher(query, collation)
        source = collection_source(ctx, ns, query, off_loop=True, collation=collation)
        n = await ctx.node.queries.run(lambda: sum(1 for d in source if matcher.matches(d)), time_limit)
    await settle_batch(ctx.node, concern, epoch, time_limit, ctx.majority_view)
    n = max(0, n - skip)
    if limit:
        n = min(n, limit)
    return stamp_operation_time({"n": n, "ok": 1.0}, ctx.node, concern)


@command("distinct", kind="read")
async def cmd_distinct(ctx: CommandContext) -> dict[str, Any]:
    from oplog.query_common import get_path

    ns = f"{ctx.db}.{collection_name(ctx)}"
    key = ctx.cmd.get("key")
    if not isinstance(key, str):
        raise MongoError(14, "'key' must be a string")
    query = _document_arg(ctx.cmd, "query") or {}
    collation = parse_collation(ctx.cmd.get("collation"))
    matcher = collated_matcher(query, collation)
    concern = read_concern_of(ctx)
    time_limit = TimeLimit.from_max_time_ms(_int_arg(ctx.cmd, "maxTimeMS"))
    epoch = await before_read(ctx, concern, time_limit, ns)
    source = collection_source(ctx, ns, query, off_loop=True, collation=collation)

    def distinct_values() -> list[Any]:
        seen: dict[bytes, Any] = {}
        for doc in source:
            if not matcher.matches(doc):
                continue
            for value in get_path(doc, key):
                for item in value if isinstance(value, list) else [value]:
                    seen.setdefault(canonical_key(item if collation is None else collation.fold(item)), item)
        return [d["v"] for d in collated_sort([{"v": v} for v in seen.values()], {"v": 1}, collation)]

    values = await ctx.node.queries.run(distinct_values, time_limit)
    await settle_batch(ctx.node, concern, epoch, time_limit, ctx.majority_view)
    reply: dict[str, Any] = {"values": values, "ok": 1.0}
    if ctx.snapshot_time is not None:
        reply["atClusterTime"] = ctx.snapshot_time
    return stamp_operation_time(reply, ctx.node, concern)

