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
"""

from __future__ import annotations

from typing import Any

from base.errors import MongoError
from oplog.entry import command_entry, delete_entry, insert_entry
from oplog.parts.table import parse_table_def
from oplog.writes import WriteEnv, ensure_collection
from replset.wire.commands import CommandContext, command
from replset.wire.crud import run_write
from replset.wire.system_namespaces import PART_LOG_COLLECTION

NAMESPACE_EXISTS = 48
NAMESPACE_NOT_FOUND = 26


def _majority_by_default(ctx: CommandContext) -> None:
    if ctx.cmd.get("writeConcern") is None:
        ctx.cmd["writeConcern"] = {"w": "majority"}


def tables_ns(db: str) -> str:
    return f"{db}.{PART_LOG_COLLECTION}"


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
