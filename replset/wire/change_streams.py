"""Change streams: `aggregate` with `$changeStream` first, on a collection, a database (`aggregate: 1`)
or the whole deployment (`admin`, `allChangesForCluster: true`); pymongo's and motor's `watch()`.

Theory of operation. A stream is a cursor over the oplog that shows only majority-committed entries:
each batch reads the entries after the stream's position up to the commit point, turns them into
change events (`oplog.change_events`, pure), drops the ones its resume point has passed, adds
`fullDocument` (`updateLookup` / `whenAvailable` / `required`: the document as it is now), runs the
pipeline's other stages over them (on the query pool: they evaluate the client's expressions), and
answers with `postBatchResumeToken`. A getMore with nothing to show waits, woken by every step of
the replication core (the commit point moving), up to its `maxTimeMS` (1 s by default), then
answers an empty batch with the new high-water token.

Resuming: `resumeAfter` / `startAfter` take a token from any member (tokens name oplog timestamps,
the same on every member), `startAtOperationTime` a cluster time. A point older than the oldest oplog
entry is ChangeStreamHistoryLost (286); an event token whose entry no longer exists (it was rolled
back) is ChangeStreamFatalError (280). Errors a change of primary explains carry the
`ResumableChangeStreamError` label, so drivers resume on another member.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import bson
from bson.int64 import Int64
from bson.timestamp import Timestamp

from base.clock import Clock
from base.errors import MongoError
from oplog.aggregate import check_output, iter_pipeline, may_grow, validate_pipeline
from oplog.change_events import (
    COLLECTION_UUID,
    INVALIDATE,
    SPLIT_STAGE,
    ResumePoint,
    StreamScope,
    check_event_size,
    events_of,
    parse_token,
    split_event,
    ts_key_of,
    update_entry_of,
)
from oplog.codec_options import DOC_OPTIONS
from oplog.doc_limits import MAX_INTERNAL_BSON_SIZE
from oplog.preimages import PREIMAGES_NS, preimage_id
from oplog.update import apply_oplog_update
from oplog.views import view_definition
from replset.cursors import Cursor
from replset.wire.ownership import register_cursor

if TYPE_CHECKING:
    from replset.wire.commands import CommandContext

HISTORY_LOST = 286
FATAL = 280
INVALID_RESUME_TOKEN = 260
UNKNOWN_FIELD = 40415
DEFAULT_AWAIT_MS = 1000
SCAN_CHUNK = 1000
MAX_SCAN = 10_000   # oplog entries one batch reads at most (the rest wait for the next getMore)
OPTIONS = {"fullDocument", "fullDocumentBeforeChange", "resumeAfter", "startAfter", "startAtOperationTime",
           "allChangesForCluster", "showExpandedEvents"}
FULL_DOCUMENT = ("default", "updateLookup", "whenAvailable", "required")
BEFORE_CHANGE = ("off", "whenAvailable", "required")
NO_MATCHING_DOCUMENT = 47
RESUMABLE_CODES = frozenset({6, 7, 43, 89, 91, 189, 237, 262, 9001, 10107, 11600, 11602, 13435, 13436, 63, 150,
                             13388, 234, 133})


@dataclass(slots=True)
class ChangeStream:
    scope: StreamScope
    resume: ResumePoint               # events at or before this were shown (or skipped)
    scanned_key: int                  # every entry up to this key was read
    full_document: str
    stages: list[Any]
    history_epoch: int
    pending: list[dict[str, Any]] = field(default_factory=list)
    invalidated: bool = False
    before_change: str = "off"  # fullDocumentBeforeChange
    split: bool = False  # $changeStreamSplitLargeEvent: events too large for a document come in fragments


def is_change_stream(pipeline: list[Any]) -> bool:
    return bool(pipeline) and isinstance(pipeline[0], dict) and "$changeStream" in pipeline[0]


def resumable(err: MongoError) -> MongoError:
    """`err` with the label drivers resume on, when a change of member explains it."""
    if err.code in RESUMABLE_CODES:
        err.extra.setdefault("errorLabels", ["ResumableChangeStreamError"])
    elif err.code == FATAL:
        err.extra.setdefault("errorLabels", ["NonResumableChangeStreamError"])
    return err


async def open_stream(ctx: CommandContext, target: Any, pipeline: list[Any],
                      cursor_opts: dict[str, Any]) -> dict[str, Any]:
    spec = pipeline[0]["$changeStream"]
    if not isinstance(spec, dict):
        raise MongoError(14, "the $changeStream stage takes an object")
    unknown = set(spec) - OPTIONS
    if unknown:
        raise MongoError(UNKNOWN_FIELD, f"BSON field '$changeStream.{sorted(unknown)[0]}' is an unknown field.")
    stages = pipeline[1:]
    if any(isinstance(s, dict) and "$changeStream" in s for s in stages):
        raise MongoError(40602, "$changeStream is only valid as the first stage in a pipeline")
    split = _split_stage(stages)
    if split:
        stages = stages[:-1]
    validate_pipeline(stages)
    concern = ctx.cmd.get("readConcern")
    if isinstance(concern, dict) and concern.get("level", "majority") != "majority":
        # (a stream reads majority-committed history: an explicit other level is refused, as mongod's)
        raise MongoError(72, "Change stream must use majority read concern")
    full_document = spec.get("fullDocument", "default")
    if full_document not in FULL_DOCUMENT:
        raise MongoError(2, f"unknown fullDocument mode {full_document!r}")
    before_change = spec.get("fullDocumentBeforeChange", "off")
    if before_change not in BEFORE_CHANGE:
        raise MongoError(2, f"unknown fullDocumentBeforeChange mode {before_change!r}")
    scope, cursor_ns = _scope(ctx, target, bool(spec.get("allChangesForCluster")))
    if spec.get("showExpandedEvents"):
        scope = dataclasses.replace(scope, expanded=True)
    node = ctx.node
    start = _start_point(ctx, spec)
    if start.fragment and not split:
        raise MongoError(7182504, f"To resume from a split event, the $changeStream pipeline must include a "
                                  f"{SPLIT_STAGE} stage")
    stream = ChangeStream(scope, start, start.ts_key if start.whole else start.ts_key - 1, full_document, stages,
                          node.history_epoch, before_change=before_change, split=split)
    cursor = Cursor(id=0, ns=cursor_ns, source=iter(()), tailable=True, await_data=True, change_stream=stream)
    batch = await _take(ctx, stream, _batch_size(cursor_opts))
    register_cursor(ctx, cursor)   # (refused past its owner's share of open cursors)
    return _reply(cursor, stream, batch, first=True)


async def get_more(ctx: CommandContext, cursor: Cursor, batch_size: int, max_time_ms: int) -> dict[str, Any]:
    stream: ChangeStream = cursor.change_stream
    node = ctx.node
    if node.history_epoch != stream.history_epoch:
        node.cursors.kill(cursor.id)
        raise resumable(MongoError(237, "a rollback replaced oplog entries this change stream may have shown: "
                                        "resume from its last token"))
    batch = await _take(ctx, stream, batch_size)
    if not batch and not stream.invalidated:
        deadline = node.clock.monotonic() + (max_time_ms or DEFAULT_AWAIT_MS) / 1000
        while not batch and not stream.invalidated and node.clock.monotonic() < deadline \
                and node.history_epoch == stream.history_epoch:
            if node.majority_commit_point.ts_key > stream.scanned_key:
                batch = await _take(ctx, stream, batch_size)
                continue
            await node.repl.stepped.wait(deadline - node.clock.monotonic())
    if stream.invalidated and not stream.pending:
        node.cursors.kill(cursor.id)
        return _reply(cursor, stream, batch, first=False, closed=True)
    return _reply(cursor, stream, batch, first=False)


def _batch_size(opts: dict[str, Any]) -> int:
    size = opts.get("batchSize", 101)
    return int(size) if isinstance(size, (int, float)) and not isinstance(size, bool) and size > 0 else 101


def _scope(ctx: CommandContext, target: Any, all_changes: bool) -> tuple[StreamScope, str]:
    if isinstance(target, str):
        if ctx.db in ("admin", "config", "local"):
            raise MongoError(73, f"$changeStream may not be opened on the internal {ctx.db} database")
        if view_definition(ctx.node.store.reader, f"{ctx.db}.{target}") is not None:
            raise MongoError(166, f"$changeStream is not supported on views: {ctx.db}.{target}")
        return StreamScope(ctx.db, target), f"{ctx.db}.{target}"
    if target != 1:
        raise MongoError(73, "aggregate takes a collection name or 1")
    if ctx.db == "admin":
        if not all_changes:
            raise MongoError(73, "a $changeStream on admin needs allChangesForCluster: true")
        return StreamScope(), "admin.$cmd.aggregate"
    if all_changes:
        raise MongoError(73, "allChangesForCluster is only allowed on the admin database")
    if ctx.db in ("config", "local"):
        raise MongoError(73, f"$changeStream may not be opened on the internal {ctx.db} database")
    return StreamScope(ctx.db), f"{ctx.db}.$cmd.aggregate"


def _start_point(ctx: CommandContext, spec: dict[str, Any]) -> ResumePoint:
    reader = ctx.node.store.reader
    given = [k for k in ("resumeAfter", "startAfter", "startAtOperationTime") if k in spec]
    if len(given) > 1:
        raise MongoError(40674, "Only one type of resume option is allowed, but multiple were found.")
    oldest = reader.oplog_oldest_key() or 0
    if not given:
        return ResumePoint(ctx.node.last_committed_optime.ts_key, whole=True)
    if given[0] == "startAtOperationTime":
        ts = spec["startAtOperationTime"]
        if not isinstance(ts, Timestamp):
            raise MongoError(14, "startAtOperationTime must be a Timestamp")
        point = ResumePoint(ts_key_of(ts), -1)
        if point.ts_key < oldest:
            raise _history_lost()
        return point
    point = parse_token(spec[given[0]])
    if point.invalidate and given[0] == "resumeAfter":
        raise MongoError(INVALID_RESUME_TOKEN, "cannot resume a change stream after an invalidate event; "
                                               "use startAfter")
    if point.ts_key < oldest:
        raise _history_lost()
    if not point.whole and reader.oplog_entry(point.ts_key) is None:
        raise MongoError(FATAL, "the resume token's event is not in this member's oplog: it was rolled back "
                                "or never replicated here")
    return point


def _history_lost() -> MongoError:
    return MongoError(HISTORY_LOST, "the resume point may no longer be in the oplog")


def _committed_entries(ctx: CommandContext, after_key: int, limit_key: int) -> Iterator[tuple[int, dict[str, Any]]]:
    reader = ctx.node.store.reader
    key = after_key
    while key < limit_key and (rows := reader.oplog_after(key, SCAN_CHUNK)):
        for row_key, blob in rows:
            if row_key > limit_key:
                return
            key = row_key
            yield row_key, bson.decode(blob, DOC_OPTIONS)


async def _take(ctx: CommandContext, stream: ChangeStream, batch_size: int) -> list[dict[str, Any]]:
    """Up to `batch_size` events: those pending, then events of entries up to the commit point, through
    the stream's own stages (on the query pool: they evaluate the client's expressions)."""
    limit_key = ctx.node.majority_commit_point.ts_key
    if not stream.invalidated:
        oldest = ctx.node.store.reader.oplog_oldest_key() or 0
        if stream.scanned_key < oldest - 1 and stream.scanned_key < limit_key:
            raise _history_lost()
        for scanned, (key, entry) in enumerate(_committed_entries(ctx, stream.scanned_key, limit_key)):
            stream.scanned_key = key
            for event in events_of(entry, stream.scope):
                index = parse_token(event["_id"]).index
                resumed_inside = stream.resume.fragment and (key, index) == (stream.resume.ts_key, stream.resume.index)
                if not stream.resume.is_after(key, index) and not resumed_inside:
                    continue
                stream.pending.append(event)
                if event["operationType"] == INVALIDATE:
                    stream.invalidated = True
                    break
            if stream.invalidated or len(stream.pending) >= batch_size or scanned >= MAX_SCAN:
                break   # MAX_SCAN: one batch reads a bounded run of the oplog on the event loop
    taken, stream.pending = stream.pending[:batch_size], stream.pending[batch_size:]
    resumed_from = stream.resume
    if taken:
        stream.resume = parse_token(taken[-1]["_id"])
    events = _shaped(ctx, stream, taken)
    if stream.stages and events:
        clock = ctx.node.clock
        events = await ctx.node.queries.run(lambda: _through_stages(stream, events, clock))
    return _sized(stream, events, resumed_from)


def _sized(stream: ChangeStream, events: list[dict[str, Any]], resumed_from: ResumePoint) -> list[dict[str, Any]]:
    """Events as they go out: each fits a document, or (with `$changeStreamSplitLargeEvent`) comes in
    fragments; a stream resumed from a fragment starts at the next one of that event."""
    if not stream.split:
        for event in events:
            check_event_size(event)
        return events
    out: list[dict[str, Any]] = []
    for event in events:
        for fragment in split_event(event):
            point = parse_token(fragment["_id"])
            if resumed_from.fragment and (point.ts_key, point.index) == (resumed_from.ts_key, resumed_from.index) \
                    and point.fragment <= resumed_from.fragment:
                continue  # (shown before the stream was resumed)
            out.append(fragment)
    return out


def _split_stage(stages: list[Any]) -> bool:
    """Whether the stream splits large events: `$changeStreamSplitLargeEvent: {}`, the last stage."""
    where = [i for i, stage in enumerate(stages) if isinstance(stage, dict) and SPLIT_STAGE in stage]
    if not where:
        return False
    if where != [len(stages) - 1]:
        raise MongoError(7182802, f"{SPLIT_STAGE} must be the last stage in the pipeline")
    if stages[-1][SPLIT_STAGE] != {}:
        raise MongoError(7182800, f"{SPLIT_STAGE} takes an empty object")
    return True


def _shaped(ctx: CommandContext, stream: ChangeStream, events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Adds the documents the stream asked for: `updateLookup` (the document as it is now), post-images
    (`whenAvailable` / `required`: the pre-image with the update applied) and pre-images
    (`fullDocumentBeforeChange`), both from `config.system.preimages` (oplog/preimages.py)."""
    reader = ctx.node.store.reader
    for event in events:
        ui = event.pop(COLLECTION_UUID, None)
        kind = event["operationType"]
        if kind not in ("update", "replace", "delete"):
            continue
        wants_post = kind == "update" and stream.full_document in ("whenAvailable", "required")
        before = None
        if (stream.before_change != "off" or wants_post) and ui is not None:
            stored = reader.get(PREIMAGES_NS, preimage_id(ui, event["clusterTime"], parse_token(event["_id"]).index))
            before = None if stored is None else stored.get("preImage")
        if stream.before_change != "off":
            if before is None and stream.before_change == "required":
                raise _image_missing("pre", event)
            event["fullDocumentBeforeChange"] = before
        if kind == "update" and stream.full_document == "updateLookup":
            ns = f"{event['ns']['db']}.{event['ns']['coll']}"
            event["fullDocument"] = reader.get(ns, event["documentKey"]["_id"])
        elif wants_post:
            described = event["updateDescription"]
            after = None if before is None else apply_oplog_update(before, update_entry_of(described))
            if after is None and stream.full_document == "required":
                raise _image_missing("post", event)
            event["fullDocument"] = after
    return events


def _through_stages(stream: ChangeStream, events: list[dict[str, Any]], clock: Clock) -> list[dict[str, Any]]:
    """`events` through the stream's stages (`$$NOW` from `clock`), which must keep every event's resume
    token and leave events that fit a reply."""
    tokens = {event["_id"]["_data"] for event in events}
    grows = may_grow(stream.stages)
    events = list(iter_pipeline(events, stream.stages, now=clock.wall()))
    for event in events:
        token = event.get("_id")
        if not isinstance(token, dict) or token.get("_data") not in tokens or len(token) != 1:
            raise MongoError(FATAL, "Encountered an event whose _id field, which contains the resume token, "
                                    "was modified by the pipeline. Modifying the _id field of an event makes "
                                    "it impossible to resume the stream from that point. Only transformations "
                                    "that retain the unmodified _id field are allowed.")
        if grows and not stream.split:  # (a split stream cuts large events into fragments after this)
            check_output(event, MAX_INTERNAL_BSON_SIZE)
    return events


def _image_missing(kind: str, event: dict[str, Any]) -> MongoError:
    return MongoError(NO_MATCHING_DOCUMENT, f"Change stream was configured to require a {kind}-image for all "
                                            f"update, delete and replace events, but the {kind}-image was not "
                                            f"found for event: {event['_id']}")


def _reply(cursor: Cursor, stream: ChangeStream, batch: list[dict[str, Any]], *, first: bool,
           closed: bool = False) -> dict[str, Any]:
    # Pending events, an ended stream, or a resume point not read up to yet: the last point shown. Else
    # the high-water mark: every entry up to the last one read.
    behind = stream.pending or stream.invalidated or stream.resume.ts_key > stream.scanned_key
    token = stream.resume.token() if behind else ResumePoint(stream.scanned_key, whole=True).token()
    return {"cursor": {"firstBatch" if first else "nextBatch": batch, "id": Int64(0 if closed else cursor.id),
                       "ns": cursor.ns, "postBatchResumeToken": token}, "ok": 1.0}
