"""`$out` and `$merge` of an aggregate sent to a secondary: as in mongod 5.0+, the pipeline reads on the
secondary the client chose, and its results are written through the primary.

The secondary sends the results to the primary in one member-only command, `_aggregateOutput`, which
writes them in one group commit there (as an aggregate run on the primary writes them) and honours the
aggregate's write concern; its reply (and any `writeConcernError`) is the aggregate's. Results that do
not fit one command document (16 MiB) are refused (10334) rather than written in pieces that a failure
could leave half done: such an aggregate runs on the primary.
"""

from __future__ import annotations

from typing import Any

import bson
from bson.timestamp import Timestamp

from base.errors import MongoError
from base.optime import ts_key
from oplog.output_stages import OutputStage, write_merge, write_out
from oplog.writes import WriteEnv
from replset.wire import system_namespaces
from replset.wire.commands import CommandContext, command
from replset.wire.views import check_not_view
from sync.peer import PeerError

FORWARD_LIMIT = 16 * 1024 * 1024
FORWARD_TIMEOUT_S = 60.0


def write_output(env: WriteEnv, output: OutputStage, docs: list[dict[str, Any]]) -> dict[str, Any]:
    (write_out if output.kind == "$out" else write_merge)(env, output, docs)
    return {"ok": 1.0}


async def forward_output(ctx: CommandContext, output: OutputStage, docs: list[dict[str, Any]]) -> dict[str, Any]:
    node = ctx.node
    host = node.primary_host
    if host is None or host == node.options.me:
        raise MongoError(10107, f"not primary, and no primary is known to write {output.kind}'s results")
    cmd: dict[str, Any] = {"_aggregateOutput": output.coll, "kind": output.kind, "on": list(output.on),
                           "whenMatched": output.when_matched, "whenNotMatched": output.when_not_matched,
                           "documents": docs}
    for name in ("writeConcern", "bypassDocumentValidation", "comment"):
        if name in ctx.cmd:
            cmd[name] = ctx.cmd[name]
    if len(bson.encode(cmd)) > FORWARD_LIMIT:
        raise MongoError(10334, f"the results of {output.kind} are too large to send from a secondary to the "
                                "primary in one command; run the aggregate on the primary")
    try:
        reply = await node.parts.link.ask(host, output.db, cmd, FORWARD_TIMEOUT_S)
    except PeerError as exc:
        raise MongoError(6, f"the primary {host} did not answer the write of {output.kind}'s results; it may or "
                            f"may not have made it ({exc})") from exc
    # A causally consistent session reads its write next, here: answer once this member has applied it,
    # with the primary's operation time.
    written = reply.get("operationTime")
    if isinstance(written, Timestamp):
        deadline = node.clock.monotonic() + FORWARD_TIMEOUT_S
        while node.last_committed_optime.ts_key < ts_key(written) and (left := deadline - node.clock.monotonic()) > 0:
            await node.wait_for_oplog(node.last_committed_optime.ts_key, left)
    return {k: v for k, v in reply.items() if k in ("writeConcernError", "operationTime")}


@command("_aggregateOutput", kind="write")
async def cmd_aggregate_output(ctx: CommandContext) -> dict[str, Any]:
    """A secondary's `$out` / `$merge` results, written here on the primary (member-only)."""
    from replset.wire.crud import run_write

    cmd = ctx.cmd
    kind, docs, on = cmd.get("kind"), cmd.get("documents"), cmd.get("on", ["_id"])
    if (kind not in ("$out", "$merge") or not isinstance(docs, list) or not isinstance(on, list) or not on
            or not all(isinstance(field, str) for field in on)):
        raise MongoError(9, "_aggregateOutput takes a kind ($out or $merge), documents and the fields 'on' names")
    output = OutputStage(str(kind), ctx.db, str(cmd["_aggregateOutput"]), tuple(on),
                         str(cmd.get("whenMatched", "merge")), str(cmd.get("whenNotMatched", "insert")))
    system_namespaces.check_write(output.ns)
    check_not_view(ctx.node.store.reader, output.ns, output.kind)
    return await run_write(ctx, lambda env: write_output(env, output, docs))
