"""Reading from a sync source: the few commands the fetcher, initial sync and rollback share.

A shell over `sync.peer.PeerClient`. Every read carries `$readPreference`
secondaryPreferred (the source may be a secondary), a reply with `ok: 0` becomes
the `MongoError` it names, and an oplog cursor is released on a best-effort basis.
"""

from __future__ import annotations

from typing import Any

from base.errors import MongoError
from sync.peer import PeerClient, PeerError

SECONDARY_OK = {"mode": "secondaryPreferred"}
KILL_CURSOR_TIMEOUT_S = 1.0


async def source_command(client: PeerClient, body: dict[str, Any], *, timeout_s: float,
                         raw: bool = False) -> Any:
    """Runs one read on the source; raises MongoError for an `ok: 0` reply, PeerError for I/O. With
    `raw`, the reply is a `RawBSONDocument` (see `PeerClient.command`)."""
    reply = await client.command(body | {"$readPreference": SECONDARY_OK}, timeout_s=timeout_s, raw=raw)
    if not reply.get("ok"):
        raise MongoError(int(reply.get("code", 1)), str(reply.get("errmsg", "sync source error")))
    return reply


async def oplog_end(client: PeerClient, *, newest: bool, timeout_s: float) -> dict[str, Any] | None:
    """The source's newest (or oldest) oplog entry, None when its oplog is empty."""
    reply = await source_command(client, {
        "find": "oplog.rs", "filter": {}, "sort": {"$natural": -1 if newest else 1}, "limit": 1,
        "singleBatch": True, "$db": "local"}, timeout_s=timeout_s)
    batch = reply["cursor"].get("firstBatch", [])
    return dict(batch[0]) if batch else None


async def kill_oplog_cursor(client: PeerClient, cursor_id: int) -> None:
    """Best effort: the source would otherwise keep the cursor until it idles out."""
    try:
        await client.command({"killCursors": "oplog.rs", "cursors": [cursor_id], "$db": "local"},
                             timeout_s=KILL_CURSOR_TIMEOUT_S)
    except PeerError:
        pass
