"""Read concerns on parts tables: a read after a time sees every part the part log held by then.

`selectParts`, `partsStatus` and `openPartsSnapshot` take `readConcern: {level: "local" | "majority",
afterClusterTime: <ts>}` as document reads do (replset/wire/read_waits.py): the member first applies
(for `majority`: sees majority committed) the oplog past that time, writing a no-op if it is the
primary and has not reached it; then its part log takes in every entry to there and carries out the
new parts and drops it had queued (`PartsManager.wait_through`: a part to fetch is fetched first).
A causal session's operationTime after an insert, sent as afterClusterTime to any member, so reads
its rows there: never fewer.

The wait is bounded by `maxTimeMS` (MaxTimeMSExpired, 50). Without one it lasts `PARTS_WAIT_S`, then
the read fails with ReadConcernMajorityNotAvailableYet (134), which drivers retry, naming why: a member
that cannot get a part (no live holder) answers that rather than fewer rows.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from base.errors import MongoError
from base.optime import ts_key
from replset.query_pool import TimeLimit
from replset.wire.read_waits import before_read, read_concern_of

if TYPE_CHECKING:
    from replset.wire.commands import CommandContext

PARTS_WAIT_S = 60.0
MAX_TIME_EXPIRED = 50
NOT_YET_AVAILABLE = 134


async def wait_for_read_concern(ctx: CommandContext, ns: str, limit: TimeLimit) -> None:
    """Waits until a parts read of `ns` may answer under the command's read concern (see the module doc)."""
    concern = read_concern_of(ctx)
    bounded = limit if limit.left_s is not None else TimeLimit(PARTS_WAIT_S)   # (both waits share it)
    try:
        await before_read(ctx, concern, bounded)
        after = concern.after_cluster_time
        if after is None:
            return
        started = ctx.node.clock.monotonic()
        try:
            await ctx.node.parts.wait_through(ns, ts_key(after), bounded.left_s or 0.0)
        finally:
            bounded.left_s = max(0.0, (bounded.left_s or 0.0) - (ctx.node.clock.monotonic() - started))
    except MongoError as exc:
        if exc.code != MAX_TIME_EXPIRED or bounded is limit:
            raise
        raise MongoError(NOT_YET_AVAILABLE, f"{exc.errmsg}: this member does not have every part through "
                                            f"afterClusterTime within {PARTS_WAIT_S:.0f} s (partsReplicationQueue "
                                            "shows why)") from exc
