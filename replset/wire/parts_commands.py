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
- `{insertBlock: <name>, rows: [{...}, ...] | arrow: <Arrow IPC stream bytes>, dedupToken: <string>}`:
  one block per partition, written as parts on this member and committed through the oplog
  (`replset.parts.insert`); the reply lists each block's part and whether it was `deduplicated`.
  On the primary only so far; `insertQuorum` above 1 is refused (2) until quorum inserts exist,
  rather than accepted and ignored.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from base.errors import MongoError
from oplog.entry import command_entry, delete_entry, insert_entry
from oplog.parts.table import parse_table_def
from oplog.writes import WriteEnv, ensure_collection
from replset.parts.insert import insert_rows
from replset.parts.names import tables_ns
from replset.wire.commands import CommandContext, command
from replset.wire.crud import run_write

BAD_VALUE = 2
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
    try:
        data = pa.Table.from_pylist(list(rows)) if rows is not None else pa.ipc.open_stream(bytes(arrow)).read_all()
    except (pa.ArrowException, OSError, TypeError, ValueError) as exc:  # OSError: a malformed IPC stream
        raise MongoError(BAD_VALUE, f"insertBlock: the rows cannot be read as a table: {exc}") from None
    if data.num_rows == 0:
        raise MongoError(BAD_VALUE, "insertBlock: no rows")
    return data


@command("insertBlock", kind="write")
async def cmd_insert_block(ctx: CommandContext) -> dict[str, Any]:
    name = ctx.cmd["insertBlock"]
    quorum = ctx.cmd.get("insertQuorum")
    if quorum not in (None, 0, 1):
        raise MongoError(BAD_VALUE, "insertQuorum above 1 is not supported yet: the insert was not made")
    data = _rows(ctx)
    token = ctx.cmd.get("dedupToken")
    _majority_by_default(ctx)
    return await insert_rows(ctx.node, ctx.db, name, data, dedup_token=token,
                             run_write=lambda body: run_write(ctx, body))
