"""The packets members and clients exchange: a request, and the reply to it.

Members speak the product's documents where the product has a builder and a
parser (`base.messages`: heartbeats, votes, `replSetUpdatePosition`,
`$replData` metadata), so every simulated message goes through the real
parsing. The oplog reads (`find`/`getMore` on `local.oplog.rs`, the rollback
scans) carry the simulator's entries directly: their BSON form is the
document store's business, not replication's.

A reply names the request it answers (`rpc_id`, unique over the whole run, so
a reply to a member's previous incarnation is recognised as stale). `error`
is None for a normal answer, `"refused"` when nobody listened at the
destination (a crashed member), or a MongoDB error code as a string.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# Request kinds.
HEARTBEAT = "replSetHeartbeat"
VOTE = "replSetRequestVotes"
UPDATE_POSITION = "replSetUpdatePosition"
FETCH = "find/getMore oplog"
SCAN = "rollback: oplog newest first"
REFETCH = "rollback: refetch + source top"
WRITE = "client write"
READ = "client read"

REFUSED = "refused"


@dataclass(frozen=True, slots=True)
class Request:
    rpc_id: int
    src: int
    kind: str
    body: Any


@dataclass(frozen=True, slots=True)
class Reply:
    rpc_id: int
    src: int
    kind: str
    body: Any
    error: str | None = None


@dataclass(frozen=True, slots=True)
class FetchBody:
    """`find {ts: {$gte: after.ts}}` (opens a tailable cursor) or `getMore` on that cursor."""

    after: Any          # OpTime: our last fetched entry, which the first returned entry must equal
    limit: int
    await_ms: int
    cursor: int | None  # None: `find` opens a cursor; else `getMore` on it
    required: Any = None  # OpTime: while RECOVERING, the minValid entry the source must hold
    positions: Any = None  # a getMore's: our positions and those reported to us (the product's $replPositions)


@dataclass(frozen=True, slots=True)
class WriteBody:
    write_id: int
    key: int
    value: int
    w: int | str
    wtimeout_ms: int


@dataclass(frozen=True, slots=True)
class ReadBody:
    key: int
    majority: bool
