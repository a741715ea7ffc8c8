"""`commitTransaction` and `abortTransaction` (see replset/transactions.py)."""

from __future__ import annotations

from typing import Any

from base.errors import MongoError
from base.optime import OpTime
from replset.wire.commands import CommandContext, command
from replset.write_concern import parse_write_concern, write_concern_error_field


def _admin_only(ctx: CommandContext) -> None:
    if ctx.db != "admin":
        raise MongoError(13, f"{ctx.name} may only be run against the admin database.")


@command("commitTransaction")
async def cmd_commit_transaction(ctx: CommandContext) -> dict[str, Any]:
    _admin_only(ctx)
    if "autocommit" not in ctx.cmd:
        raise MongoError(50768, "commitTransaction must be run within a transaction")
    parse_write_concern(ctx.cmd.get("writeConcern"))  # a bad one is refused before the commit
    optime = None
    if ctx.txn is not None:  # None: committed before, and that transaction's state is the stored record
        optime = await ctx.node.transactions.commit(ctx.txn)
    return await _answer(ctx, optime)


@command("abortTransaction")
async def cmd_abort_transaction(ctx: CommandContext) -> dict[str, Any]:
    _admin_only(ctx)
    if "autocommit" not in ctx.cmd or ctx.txn is None:
        raise MongoError(50768, "abortTransaction must be run within a transaction")
    ctx.node.transactions.abort(ctx.txn)
    return await _answer(ctx, None)


async def _answer(ctx: CommandContext, optime: OpTime | None) -> dict[str, Any]:
    """`{ok: 1}` once the command's write concern is met at `optime` (else this member's last write)."""
    node = ctx.node
    wc = parse_write_concern(ctx.cmd.get("writeConcern"))
    reply: dict[str, Any] = {"ok": 1.0}
    wce = await node.wait_for_write_concern(wc, optime or node.last_committed_optime)
    if wce is not None:
        reply["writeConcernError"] = write_concern_error_field(wce)
    return reply
