"""Part-log commands: parts tables (ClickHouse ReplicatedMergeTree semantics on the replica set).

A table's definition is a document of `<db>.system.parts` keyed by the table's name
(`oplog.parts.table.TableDef.to_document`), written through the primary as an ordinary
replicated insert and acknowledged at `w: "majority"` unless the command asks for another
write concern (a table every member may be asked to hold parts of should not exist on
one member only). Its state collections are `<db>.system.parts.<table>.*`; clients read
them but cannot write them (`system_namespaces`).

- `{createPartsTable: <name>, columns: [...], partitionBy: ..., orderBy: [...]}`:
  48 `NamespaceExists` if the table exists; 2 / 9 / 73 for a bad definition.
- `{dropPartsTable: <name>}`: 26 `NamespaceNotFound` if it does not exist; removes the
  definition and the table's state collections.
- `{insertBlock: <name>, rows: [{...}, ...] | arrow: <Arrow IPC stream bytes>, dedupToken: <string>,
  insertQuorum: 0 | N | "majority", quorumTimeoutMS: <ms>}` on any member: one block per partition,
  written as parts on this member and committed through the primary (`replset.parts.commit`); the
  reply lists each block's part and whether it was `deduplicated`. With a quorum above 1 the reply
  waits until that many members hold each new part, or says `quorumStatus: "pending"` when
  `quorumTimeoutMS` (ClickHouse's `insert_quorum_timeout`, 600 s) passes first - never an ambiguous
  failure: `insertStatus` answers later.
- `{insertStatus: <name>, blockIds: [...] | dedupToken: <string>}`: each block's state - `reached`,
  `pending` or `failed` for quorum inserts, `committed` for the others, `unknown` when no member
  committed it.
- `{_partsCommit: <name>, blocks: [...], source, http, attempt, quorum}`: a member's commit of blocks
  it wrote, sent to the primary; only over a member connection.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from base.errors import MongoError
from oplog.entry import command_entry, delete_entry, insert_entry
from oplog.parts.table import parse_table_def
from oplog.writes import WriteEnv, ensure_collection
from replset.parts.commit import QUORUM_TIMEOUT_MS, commit_here, insert_rows, parse_quorum, primary_body
from replset.parts.insert import Block, load_table, table_from_arrow, table_from_rows
from replset.parts.names import state_ns, tables_ns
from replset.parts.registry import REACHED
from replset.wire.admission import Role
from replset.wire.commands import CommandContext, command
from replset.wire.crud import run_write
from replset.write_concern import MAJORITY, parse_write_concern

BAD_VALUE = 2
UNAUTHORIZED = 13
NAMESPACE_EXISTS = 48
NAMESPACE_NOT_FOUND = 26


def _majority_by_default(ctx: CommandContext) -> None:
    if ctx.cmd.get("writeConcern") is None:
        ctx.cmd["writeConcern"] = {"w": "majority"}


@command("createPartsTable", kind="write")
async def cmd_create_parts_table(ctx: CommandContext) -> dict[str, Any]:
    name = ctx.cmd["createPartsTable"]
    table = parse_table_def(ctx.db, name, ctx.cmd)
    ns = tables_ns(ctx.db)
    _majority_by_default(ctx)

    def body(env: WriteEnv) -> dict[str, Any]:
        if env.txn.get(ns, name) is not None:
            raise MongoError(NAMESPACE_EXISTS, f"parts table {table.ns} already exists")
        ensure_collection(env, ns)
        env.emit(insert_entry(ns, table.to_document()))
        return {"ok": 1.0}

    return await run_write(ctx, body)


@command("dropPartsTable", kind="write")
async def cmd_drop_parts_table(ctx: CommandContext) -> dict[str, Any]:
    name = ctx.cmd["dropPartsTable"]
    ns = tables_ns(ctx.db)
    state_prefix = f"{ns}.{name}."
    _majority_by_default(ctx)

    def body(env: WriteEnv) -> dict[str, Any]:
        if env.txn.get(ns, name) is None:
            raise MongoError(NAMESPACE_NOT_FOUND, f"parts table {ctx.db}.{name} not found")
        env.emit(delete_entry(ns, name))
        for info in env.txn.collections(ctx.db):
            if info.ns.startswith(state_prefix):
                env.emit(command_entry(ctx.db, {"drop": info.ns.partition(".")[2]}, info.uuid))
        return {"ok": 1.0}

    return await run_write(ctx, body)


def _rows(ctx: CommandContext) -> pa.Table:
    rows, arrow = ctx.cmd.get("rows"), ctx.cmd.get("arrow")
    if (rows is None) == (arrow is None):
        raise MongoError(BAD_VALUE, "insertBlock takes exactly one of 'rows' (an array of documents) and "
                                    "'arrow' (Arrow IPC stream bytes)")
    return table_from_rows(list(rows)) if rows is not None else table_from_arrow(bytes(arrow))


@command("insertBlock")
async def cmd_insert_block(ctx: CommandContext) -> dict[str, Any]:
    name = ctx.cmd["insertBlock"]
    quorum = parse_quorum(ctx.cmd.get("insertQuorum", 0), ctx.node.config)
    data = _rows(ctx)
    _majority_by_default(ctx)
    return await insert_rows(ctx.node, ctx.db, name, data, wc=parse_write_concern(ctx.cmd["writeConcern"]),
                             dedup_token=ctx.cmd.get("dedupToken"), quorum=quorum,
                             quorum_timeout_ms=int(ctx.cmd.get("quorumTimeoutMS", QUORUM_TIMEOUT_MS)))


@command("_partsCommit", kind="write")
async def cmd_parts_commit(ctx: CommandContext) -> dict[str, Any]:
    """Another member's commit of blocks it wrote (`replset.parts.commit.PrimaryLink`)."""
    if ctx.conn.role is not Role.MEMBER:
        raise MongoError(UNAUTHORIZED, "_partsCommit is for members of the set only")
    name = ctx.cmd["_partsCommit"]
    raw_blocks = ctx.cmd.get("blocks")
    if not isinstance(raw_blocks, list) or not raw_blocks:
        raise MongoError(BAD_VALUE, "_partsCommit needs a non-empty blocks array")
    blocks = [Block.from_wire(b) for b in raw_blocks]
    token = ctx.cmd.get("dedupToken")
    body = primary_body(ctx.db, name, blocks, source=str(ctx.cmd.get("source", "")), http=str(ctx.cmd.get("http", "")),
                        attempt=str(ctx.cmd.get("attempt", "")), quorum=int(ctx.cmd.get("quorum", 0)),
                        dedup_token=None if token is None else str(token), directory=None)
    return await commit_here(ctx.node, parse_write_concern(ctx.cmd.get("writeConcern") or {"w": MAJORITY}), body)


@command("insertStatus")
async def cmd_insert_status(ctx: CommandContext) -> dict[str, Any]:
    """Where each block of an insert stands, on any member (what it has replicated so far)."""
    name = ctx.cmd["insertStatus"]
    reader = ctx.node.store.reader
    load_table(reader, ctx.db, name)
    log_ns, quorum_ns = state_ns(ctx.db, name, "log"), state_ns(ctx.db, name, "quorum")
    block_ids, token = ctx.cmd.get("blockIds"), ctx.cmd.get("dedupToken")
    if (block_ids is None) == (token is None):
        raise MongoError(BAD_VALUE, "insertStatus takes exactly one of 'blockIds' and 'dedupToken'")
    if token is not None:
        def by_token() -> list[Any]:   # a scan of the log: on the query pool, never on the loop
            thread_reader = ctx.node.store.thread_reader()
            if thread_reader.collection(log_ns) is None:
                return []
            return [d["_id"] for d in thread_reader.scan(log_ns) if d.get("dedupToken") == token]
        block_ids = await ctx.node.queries.run(by_token)
    if not isinstance(block_ids, list) or not all(isinstance(b, str) for b in block_ids):
        raise MongoError(BAD_VALUE, "insertStatus: blockIds must be an array of strings")
    out = []
    for block_id in block_ids:
        log_doc = reader.get(log_ns, block_id) if reader.collection(log_ns) else None
        quorum_doc = reader.get(quorum_ns, block_id) if reader.collection(quorum_ns) else None
        if quorum_doc is not None:
            status = str(quorum_doc.get("status"))
        else:
            status = "committed" if log_doc is not None else "unknown"
        row: dict[str, Any] = {"blockId": block_id, "status": status}
        if log_doc is not None:
            row["part"] = log_doc["part"]
        out.append(row)
    return {"blocks": out, "allReached": all(r["status"] in (REACHED, "committed") for r in out) and bool(out),
            "ok": 1.0}
