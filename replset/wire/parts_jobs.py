"""Job commands: many blocks committed as one, exactly once (`replset.parts.jobs`).

- `{stagePartsBlock: <table>, arrow: <Arrow IPC stream>, writeId, stageKey}` on any member: the
  rows written here as staged blocks (one per partition), recorded through the primary; the reply
  lists each stage id with its partition and rows. `committed: true` (nothing staged) when the write
  was committed already.
- `{commitPartsJob: <table>, writeId, stages: [...], rows, digest, replace, insertQuorum,
  quorumTimeoutMS, writeConcern}`: the listed stages published as one part-log transaction through the
  primary (`w: "majority"` unless asked otherwise); `replace: true` drops every row the table had in
  the same transaction (an overwrite: readers see the old rows or the new ones). The reply comes once
  the job is readable on the member asked (`visibleHere`, false if `quorumTimeoutMS` passed first); `alreadyCommitted: true` when the write was committed
  before with the same rows; 11000 `DuplicateKey` when it was committed with other rows; 4
  `NoSuchKey` when a stage is not recorded (aborted or timed out: nothing committed); 117 when the
  table's schema changed while the job ran. With a quorum above 1 the reply says `quorumStatus` for
  the job's parts together, as `insertBlock` does for its blocks.
- `{abortPartsJob: <table>, writeId}`: the write's stages removed (a committed write is left as it is:
  `committed: true`).
- `{partsJobStatus: <table>, writeId}`: committed (parts, rows, digest, time), or the stages recorded.
- `{_partsStage: <table>, blocks, source, writeId}`: a member's stage record, sent to the primary;
  only over a member connection.
"""

from __future__ import annotations

from typing import Any

from base.errors import MongoError
from oplog.parts.jobs import job_id_of
from replset.parts.commit import QUORUM_TIMEOUT_MS, check_live_quorum, commit_here, new_attempt, parse_quorum
from replset.parts.insert import Block, load_table
from replset.parts.jobs import (
    STAGE_WRITE_CONCERN,
    abort_job_body,
    commit_job_body,
    job_status,
    stage_body,
    stage_rows,
)
from replset.parts.payload import decode_block
from replset.parts.registry import PENDING, REACHED
from replset.wire.commands import CommandContext, command
from replset.wire.parts_commands import _on_primary, member_source

BAD_VALUE = 2
MAX_TIME_EXPIRED = 50


def _write_id(ctx: CommandContext) -> str:
    write_id = ctx.cmd.get("writeId")
    if not isinstance(write_id, str) or not write_id:
        raise MongoError(BAD_VALUE, f"{ctx.name} needs a non-empty string writeId")
    return write_id


@command("stagePartsBlock")
async def cmd_stage_parts_block(ctx: CommandContext) -> dict[str, Any]:
    name = ctx.cmd["stagePartsBlock"]
    data = await decode_block(ctx.node, ctx.db, name, arrow=ctx.cmd["arrow"], what="stagePartsBlock")
    return await stage_rows(ctx.node, ctx.db, name, data, write_id=_write_id(ctx), stage_key=str(ctx.cmd["stageKey"]))


@command("_partsStage", kind="write")
async def cmd_parts_stage(ctx: CommandContext) -> dict[str, Any]:
    """Another member's stage record. Where the staged files are fetched from is what that member says
    in its heartbeats, never what the message says."""
    name = ctx.cmd["_partsStage"]
    source, http = member_source(ctx)
    blocks = [Block.from_wire(b) for b in ctx.cmd["blocks"]]
    return await commit_here(ctx.node, STAGE_WRITE_CONCERN,
                             stage_body(ctx.db, name, blocks, write_id=_write_id(ctx), source=source, http=http))


@command("commitPartsJob")
async def cmd_commit_parts_job(ctx: CommandContext) -> dict[str, Any]:
    name = ctx.cmd["commitPartsJob"]
    write_id = _write_id(ctx)
    stages = ctx.cmd["stages"]
    load_table(ctx.node.store.reader, ctx.db, name)
    quorum = parse_quorum(ctx.cmd.get("insertQuorum", 0), ctx.node.config)
    check_live_quorum(ctx.node, quorum)
    ctx.cmd.setdefault("writeConcern", {"w": "majority"})
    ctx.cmd["insertQuorum"] = quorum   # "majority" resolved here: the primary counts the same
    body = commit_job_body(ctx.db, name, write_id=write_id, stage_ids=[str(s) for s in stages],
                           rows=int(ctx.cmd.get("rows", 0)), digest=str(ctx.cmd.get("digest", "")),
                           quorum=quorum, attempt=str(ctx.cmd.setdefault("attempt", new_attempt())),
                           replace=bool(ctx.cmd.get("replace", False)))
    reply = await _on_primary(ctx, body, off_loop=True)
    left_s = int(ctx.cmd.get("quorumTimeoutMS", QUORUM_TIMEOUT_MS)) / 1000
    if "writeConcernError" not in reply:   # read-your-writes here, as an insert's part is before its reply
        try:
            await ctx.node.parts.wait_job_visible(f"{ctx.db}.{name}", job_id_of(write_id), left_s)
            reply["visibleHere"] = True
        except MongoError as exc:
            if exc.code != MAX_TIME_EXPIRED:
                raise
            reply["visibleHere"] = False
    if quorum > 1 and not reply.get("alreadyCommitted") and "writeConcernError" not in reply:
        blocks = [(str(b["blockId"]), str(b["part"])) for b in reply.get("blocks", ())]
        statuses = await ctx.node.parts.wait_quorum(f"{ctx.db}.{name}", blocks, quorum, left_s) if blocks else []
        reply["quorumStatus"] = (REACHED if all(s == REACHED for s in statuses)
                                 else PENDING if PENDING in statuses else next(s for s in statuses if s != REACHED))
    return reply


@command("abortPartsJob")
async def cmd_abort_parts_job(ctx: CommandContext) -> dict[str, Any]:
    name = ctx.cmd["abortPartsJob"]
    ctx.cmd.setdefault("writeConcern", {"w": "majority"})
    return await _on_primary(ctx, abort_job_body(ctx.db, name, _write_id(ctx)), off_loop=True)


@command("partsJobStatus")
async def cmd_parts_job_status(ctx: CommandContext) -> dict[str, Any]:
    name = ctx.cmd["partsJobStatus"]
    write_id = _write_id(ctx)
    # a scan of the stage records: on the query pool
    return dict(await ctx.node.queries.run(lambda: job_status(ctx.node.store.thread_reader(), ctx.db, name, write_id)))
