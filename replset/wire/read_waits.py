"""Read concerns carried out: the waits before a read and after each of its batches.

Theory of operation. A `majority` read of a collection answers from a committed snapshot
(replset/committed_snapshots.py): the oldest SQLite snapshot this member kept that holds the commit
point of the moment the read began, labelled with the newest entry it holds.

1. `before_read` notes the member's history epoch (it moves when a rollback or a resync replaces
   entries) and waits for `afterClusterTime` / `afterOpTime`: applied past it, or for `majority`
   the commit point (as far as this member applied) past it. A primary asked for a time it has not
   reached writes a no-op, as mongod does, so the wait ends. A majority read is then bound to its
   committed snapshot (`ctx.majority_view`; each getMore binds again, as a yielding read).
2. The batch is read.
3. `settle_batch` waits until the commit point reaches what the batch could reflect: the snapshot's
   label, or for a read of the newest data (`linearizable`, the oplog) the newest optime this member
   has taken (`log.last`). If the epoch moved meanwhile, the data read may be rolled back: the read
   fails with InterruptedDueToReplStateChange (11602), which drivers retry. `linearizable` then
   writes a no-op and waits for it to be majority committed, so a deposed or cut-off primary fails
   the read instead of answering stale data.

Every wait is woken by the replication core's steps (no polling) and bounded by the operation's
`maxTimeMS` (MaxTimeMSExpired, 50); without one it waits as long as the client does, as mongod's
`afterClusterTime` waits do.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from bson.timestamp import Timestamp

from base.errors import MongoError
from base.optime import OpTime
from base.read_concern import (
    INVALID_OPTIONS,
    LINEARIZABLE,
    MAJORITY,
    SNAPSHOT,
    ReadConcern,
    parse_read_concern,
    refusal,
)
from oplog.entry import noop_entry
from oplog.writes import WriteEnv
from replset.committed_snapshots import MajorityView
from replset.query_pool import TimeLimit, time_limit_error
from replset.wire.oplog_reader import OPLOG_NS
from replset.write_concern import MAJORITY as W_MAJORITY
from replset.write_concern import WriteConcern

if TYPE_CHECKING:
    from oplog.sqlite_store import SnapshotReader
    from replset.node import Node
    from replset.wire.commands import CommandContext

NOT_PRIMARY = 10107
INTERRUPTED_REPL_STATE_CHANGE = 11602
WRITE_CONCERN_TIMEOUT = 64
WAKE_AT_LEAST_EVERY_S = 1.0  # a wait without a deadline still looks again this often


def read_concern_of(ctx: CommandContext) -> ReadConcern:
    concern = parse_read_concern(ctx.cmd.get("readConcern"))
    if ctx.txn is not None:
        # A transaction reads its own snapshot, opened when it began; no wait applies per read.
        error = refusal(concern, in_transaction=True, command=ctx.name)
        if error is not None:
            raise error
        return parse_read_concern(None)
    return concern


async def before_read(ctx: CommandContext, concern: ReadConcern, limit: TimeLimit, ns: str | None = None) -> int:
    """Refusals and `afterClusterTime` / `afterOpTime` waits; returns the history epoch the read
    starts in (pass it to `settle_batch`). A `majority` read of the collection `ns` is given its
    committed snapshot (`ctx.majority_view`, replset/committed_snapshots.py)."""
    node = ctx.node
    error = refusal(concern, in_transaction="txnNumber" in ctx.cmd and "autocommit" in ctx.cmd,
                    command=ctx.name)
    if error is not None:
        raise error
    if concern.level == SNAPSHOT and ctx.txn is None:
        ctx.snapshot, ctx.snapshot_time = await _snapshot_for(node, concern, limit)
    if concern.level == LINEARIZABLE and not node.is_primary:
        raise MongoError(NOT_PRIMARY, "cannot satisfy linearizable read concern on non-primary node")
    epoch = node.history_epoch
    after = concern.after_cluster_time
    if after is not None and after > node.cluster_time:
        raise MongoError(INVALID_OPTIONS, f"readConcern afterClusterTime value {after} must not be greater "
                                          f"than the current clusterTime {node.cluster_time}")
    if concern.waits:
        def point() -> OpTime:
            return node.majority_read_target if concern.majority else node.last_committed_optime

        def reached() -> bool:
            if concern.after_optime is not None:
                return point() >= concern.after_optime
            assert concern.after_cluster_time is not None
            return point().ts >= concern.after_cluster_time

        if not reached() and node.is_primary and concern.after_cluster_time is not None and \
                node.last_committed_optime.ts < concern.after_cluster_time:
            await _write_noop(node, "advance to afterClusterTime")
        await wait_until(node, reached, limit)
    if concern.level == MAJORITY and ctx.txn is None and ns is not None and ns != OPLOG_NS:
        ctx.majority_view = MajorityView(node.committed_snapshots)
        bind_view(node, ctx.majority_view)
    return epoch


def bind_view(node: Node, view: MajorityView) -> None:
    """Binds a majority read's view, for its next batch, to a committed snapshot holding everything
    majority committed now."""
    view.bind(node.history_epoch, node.majority_read_target)


async def _snapshot_for(node: Node, concern: ReadConcern, limit: TimeLimit) -> tuple[SnapshotReader, Timestamp]:
    """The snapshot a read at `snapshot` answers from, and its time (replset/snapshot_reads.py): the one
    kept at `atClusterTime`, or a new one of the newest data, once majority committed."""
    reads = node.snapshot_reads
    if concern.at_cluster_time is not None:
        kept = reads.kept(concern.at_cluster_time)
        if kept is not None:
            return kept, concern.at_cluster_time
    reader, optime = reads.take()
    try:
        await wait_until(node, lambda: node.majority_commit_point >= optime, limit)
    except BaseException:
        reader.close()
        raise
    return reads.keep(reader, optime.ts), optime.ts


async def settle_batch(node: Node, concern: ReadConcern, epoch: int, limit: TimeLimit,
                       view: MajorityView | None = None) -> None:
    """After a batch was read: waits until what it read is majority committed (`majority`,
    `linearizable`) and, for `linearizable`, that this member is still the primary of a majority.
    A batch read through a committed snapshot (`view`) waits for that snapshot's label only; one
    read from the newest data waits for the newest optime this member has taken."""
    if not concern.majority:
        return
    bound = None if view is None else view.optime
    target = node.log.last if bound is None else bound

    def reached() -> bool:
        nonlocal target
        if node.history_epoch != epoch:
            return True
        if bound is None:
            target = min(target, node.log.last)  # a batch rolled back gave its optimes back
        return node.majority_commit_point >= target

    await wait_until(node, reached, limit)
    if node.history_epoch != epoch:
        raise MongoError(INTERRUPTED_REPL_STATE_CHANGE, "a rollback or resync replaced data while a "
                                                        "majority read waited for it to be committed")
    if concern.level == LINEARIZABLE:
        await _confirm_primary(node, limit)


async def _confirm_primary(node: Node, limit: TimeLimit) -> None:
    if not node.is_primary:
        raise MongoError(NOT_PRIMARY, "cannot satisfy linearizable read concern on non-primary node")
    clock = node.clock
    started = clock.monotonic()
    optime = await _write_noop(node, "linearizable read")
    wtimeout_ms = 0 if limit.left_s is None else max(1, int((limit.left_s - (clock.monotonic() - started)) * 1000))
    error = await node.wait_for_write_concern(WriteConcern(w=W_MAJORITY, wtimeout_ms=wtimeout_ms), optime)
    if limit.left_s is not None:
        limit.left_s -= clock.monotonic() - started
    if error is not None:
        if error.code == WRITE_CONCERN_TIMEOUT:
            raise time_limit_error()
        raise MongoError(error.code, f"linearizable read: {error.errmsg}")


async def _write_noop(node: Node, msg: str) -> OpTime:
    def write(env: WriteEnv) -> OpTime:
        env.emit(noop_entry(msg))
        assert env.last_entry is not None
        return OpTime.from_document(env.last_entry)

    return await node.submit_write(write, durable=False)


async def wait_until(node: Node, reached: Callable[[], bool], limit: TimeLimit) -> None:
    """Waits, woken by each step of the replication core, until `reached()`; spends `limit`."""
    if reached():
        return
    clock = node.clock
    started = clock.monotonic()
    deadline = None if limit.left_s is None else started + limit.left_s
    try:
        while not reached():
            now = clock.monotonic()
            if deadline is not None and now >= deadline:
                raise time_limit_error()
            wait_s = WAKE_AT_LEAST_EVERY_S if deadline is None else min(WAKE_AT_LEAST_EVERY_S, deadline - now)
            await node.repl.stepped.wait(wait_s)
    finally:
        if limit.left_s is not None:
            limit.left_s -= clock.monotonic() - started


def operation_time(node: Node, concern: ReadConcern) -> Timestamp:
    """The time a read answered at: the commit point for majority reads, the applied optime else."""
    return (node.majority_commit_point if concern.majority else node.last_committed_optime).ts


def stamp_operation_time(reply: dict[str, Any], node: Node, concern: ReadConcern) -> dict[str, Any]:
    reply["operationTime"] = operation_time(node, concern)
    return reply
