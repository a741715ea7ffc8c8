"""Reading parts tables: `selectParts` (rows, as a cursor), `partsStatus` and `partsReplicationQueue`.

Each answers from the member it is sent to (any member: the data is local everywhere), like a
ClickHouse query on one replica:

- `{selectParts: <table>, filter: {...}, columns: [...], limit: N, batchSize: N, maxTimeMS: N,
  sequentialConsistency: true}`: the matching rows of this member's active parts, as a cursor
  (`getMore` continues it). The filter is a MongoDB query over columns (`oplog.parts.filters`).
  With `sequentialConsistency`, a member that lacks a part a quorum insert reached answers 134.
- `{partsStatus: <table>}`: this member's parts, ClickHouse's `system.parts` columns.
- `{openPartsSnapshot: <table>, key: <string>, ttlSecs: N}`: the parts a query reads, the same for every
  task that sends the same key (the primary's visible parts when the first one came, each with its
  copies), pinned for `ttlSecs` (3600, at most a day): no member removes a pinned part
  (`replset.parts.snapshots`). The pin is the user's, within its share (`maxPartsSnapshotsPerUser`);
  forwarded to the primary, the command names that user (`owner`, which only a member may name).
- `{partsReplicationQueue: <table>}`: this member's queue, `system.replication_queue` columns,
  with why each waiting task waits (`postpone_reason`) and why a failed one failed
  (`last_exception`).
"""

from __future__ import annotations

import itertools
from typing import Any

from base.errors import MongoError
from oplog.parts.filters import filter_expression
from oplog.parts.storage_url import redact_url
from replset.cursors import Cursor
from replset.parts.commit import commit_here
from replset.parts.insert import load_table
from replset.parts.snapshots import PIN_WRITE_CONCERN, parse_ttl, pin_body, visible_parts
from replset.parts.views import (
    check_sequential_consistency,
    local_metadata_version,
    parts_status,
    read_rows,
    replication_queue,
)
from replset.query_pool import TimeLimit
from replset.wire.commands import CommandContext, command
from replset.wire.crud import first_batch
from replset.wire.ownership import snapshot_owner
from replset.wire.parts_read_waits import wait_for_read_concern

BAD_VALUE = 2
DEFAULT_BATCH = 101


def _columns(ctx: CommandContext, table: Any) -> list[str] | None:
    columns = ctx.cmd.get("columns")
    if columns is None:
        return None
    if not isinstance(columns, list) or not columns or not all(isinstance(c, str) for c in columns):
        raise MongoError(BAD_VALUE, "'columns' must be a non-empty array of column names")
    unknown = [c for c in columns if table.column(c) is None]
    if unknown:
        raise MongoError(BAD_VALUE, f"{table.ns} has no column(s) {', '.join(unknown)}")
    return columns


@command("selectParts")
async def cmd_select_parts(ctx: CommandContext) -> dict[str, Any]:
    table = load_table(ctx.node.store.reader, ctx.db, ctx.cmd["selectParts"])
    expression = filter_expression(ctx.cmd.get("filter"), table)
    columns = _columns(ctx, table)
    limit_left = TimeLimit.from_max_time_ms(int(ctx.cmd.get("maxTimeMS", 0) or 0))
    await wait_for_read_concern(ctx, table.ns, limit_left)
    if ctx.cmd.get("sequentialConsistency"):
        check_sequential_consistency(ctx.node, table)
    limit = int(ctx.cmd.get("limit", 0) or 0)
    rows = read_rows(ctx.node, table, expression, columns)
    if limit > 0:
        rows = itertools.islice(rows, limit)
    cursor = Cursor(id=0, ns=table.ns, source=rows)
    cursor.time_limit = limit_left
    batch_size = int(ctx.cmd.get("batchSize", DEFAULT_BATCH))
    return await first_batch(ctx, cursor, batch_size, False)


@command("partsStatus")
async def cmd_parts_status(ctx: CommandContext) -> dict[str, Any]:
    table = load_table(ctx.node.store.reader, ctx.db, ctx.cmd["partsStatus"])
    await wait_for_read_concern(ctx, table.ns, TimeLimit.from_max_time_ms(int(ctx.cmd.get("maxTimeMS", 0) or 0)))
    return {"parts": await parts_status(ctx.node, table), "metadataVersion": table.metadata_version,
            "localMetadataVersion": local_metadata_version(ctx.node, table), "ok": 1.0}


@command("partsReplicationQueue")
async def cmd_parts_replication_queue(ctx: CommandContext) -> dict[str, Any]:
    table = load_table(ctx.node.store.reader, ctx.db, ctx.cmd["partsReplicationQueue"])
    return {"queue": replication_queue(ctx.node, table), "ok": 1.0}


@command("openPartsSnapshot")
async def cmd_open_parts_snapshot(ctx: CommandContext) -> dict[str, Any]:
    name, key = ctx.cmd["openPartsSnapshot"], ctx.cmd.get("key")
    if not isinstance(key, str) or not key:
        raise MongoError(BAD_VALUE, "openPartsSnapshot needs a non-empty string key")
    ttl_s = parse_ttl(ctx.cmd.get("ttlSecs"))
    owner = snapshot_owner(ctx)
    table = load_table(ctx.node.store.reader, ctx.db, name)
    await wait_for_read_concern(ctx, table.ns, TimeLimit.from_max_time_ms(int(ctx.cmd.get("maxTimeMS", 0) or 0)))
    node = ctx.node

    async def here() -> dict[str, Any]:   # on the primary
        parts = await visible_parts(node, ctx.db, name)
        pins = node.parts.pin_owners
        reply = await commit_here(node, PIN_WRITE_CONCERN, pin_body(ctx.db, name, key, parts, ttl_s, owner=owner,
                                                                    shares=pins.shares))
        # (counted at once, not when the parts runner reads the entry: the owner's next one sees it)
        pins.pinned(f"{ctx.db}.{name}", key, str(reply["snapshot"].get("owner", owner)))
        return reply

    forwarded = {"openPartsSnapshot": name, "key": key, "ttlSecs": ttl_s, "owner": owner}
    reply = await node.parts.link.on_primary(ctx.db, forwarded, here)
    if "writeConcernError" in reply:   # not confirmed: another task could get another list
        raise MongoError(64, f"the snapshot {key} was not confirmed: {reply['writeConcernError']}")
    if node.options.parts_storage is not None:
        # Where a zero-copy table's objects are, for readers to take them from there, named as it is shown:
        # a URL with a password or key in it says `***` in its place, and a reader (Spark's executors) then
        # takes the URL from its own `partsStorage` option, or fetches the parts from the members.
        reply = {**reply, "partsStorage": redact_url(node.options.parts_storage)}
    return reply
