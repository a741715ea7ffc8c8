"""Connection admission: which connections count against `--maxConns`, which are refused, which
idle ones are closed to make room. Pure: no I/O; the clock is passed in.

Theory of operation. mongod refuses a new connection once `maxConns` are open ("connection
refused because too many open connections") by accepting it and closing it at once. Two
things must hold beside that cap:

1. **A member is who authenticated, never who said so.** With `--keyFile`, a connection that
   logged in as `__system@local` (the keyfile's internal user) is a *member*: it never counts
   and is never refused, so a client storm cannot turn into a failover. Nothing in a message
   (`hello` with `internalClient`, a heartbeat, an oplog read) makes a connection a member:
   anyone may send those. Without auth there is no identity at all, so every connection counts.
2. **Members and pings are always served.** Idle client connections are what a client storm
   leaves behind (pools, abandoned sockets): at the cap, a new connection takes the place of
   the client connection idle the longest, if it has been idle for `preempt_idle_ms`; and
   however many connections the cap allows, at most `max_idle` client connections may sit idle:
   past that, the oldest idle ones are closed (an event loop holding tens of thousands of idle
   connections answers everyone late). Drivers check a pooled connection that sat idle before
   using it (pymongo: idle over 1 s) and open a new one, so closing idle ones is safe for them.

A connection arriving at the cap with no idle client to replace is *pending*: it does not
count, it gets `identify_timeout_s` to authenticate as a member (only the handshake and the
SASL commands are served meanwhile), and it is refused (closed without a reply) otherwise.
Pending connections are bounded (`max_pending`): past that, new connections are refused at
accept, so a flood of silent connections cannot hold descriptors.

The server shell calls `on_accept`, `on_idle`/`on_busy` around the wait for each message,
`on_member_login` once a connection has authenticated as `__system`, `may_serve_pending` for
each message of a pending connection, `over_idle_budget` after a connection went idle, and
`on_close`; it closes the connections those calls name.
"""

from __future__ import annotations

__layer__ = "core"  # pure: no I/O, clock or randomness (tests/unit/test_layering.py)

import enum
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from base.codec import MalformedRequest, OpMsgRequest, OpQueryRequest

MAX_CONNS_CAP = 1_000_000  # mongod's default maxIncomingConnections
FD_SHARE = 0.8  # mongod's share of the descriptor limit open to connections
DEFAULT_MAX_IDLE = 10_000  # idle client connections kept open at most (see the module docstring)
PREEMPT_IDLE_MS = 5_000  # at the cap, a client idle this long gives its place to a new connection
HANDSHAKE_COMMANDS = frozenset({"hello", "isMaster", "ismaster", "saslStart", "saslContinue"})
# Messages only another member sends. They identify nobody (anyone may send them); test fail points
# use them to spare members' traffic, nothing else does.
MEMBER_ONLY_COMMANDS = frozenset({"replSetHeartbeat", "replSetRequestVotes", "replSetUpdatePosition",
                                  "replSetGetRBID"})
HELLO_COMMANDS = frozenset({"hello", "isMaster", "ismaster"})
OPLOG_READS = {"find": "find", "getMore": "collection", "killCursors": "killCursors"}  # command -> field naming
OPLOG = "oplog.rs"


class Role(enum.Enum):
    CLIENT = "client"  # counts against maxConns
    MEMBER = "member"  # authenticated as the internal user: never counts, never refused
    PENDING = "pending"  # arrived at the limit: may authenticate as a member, nothing else


def default_max_conns(fd_soft_limit: int) -> int:
    """mongod's rule: 1,000,000, but no more than 80% of the descriptor limit, so that the member keeps
    descriptors for its database files, its connections to other members and the HTTP port (an accept
    failing with EMFILE is far worse than a refused client)."""
    return max(1, min(MAX_CONNS_CAP, int(fd_soft_limit * FD_SHARE)))


def effective_max_conns(requested: int | None, fd_soft_limit: int) -> int:
    """`--maxConns` as given, capped (like mongod) by the descriptor-derived default."""
    ceiling = default_max_conns(fd_soft_limit)
    return ceiling if requested is None else max(1, min(requested, ceiling))


def _body(request: OpMsgRequest | OpQueryRequest | MalformedRequest) -> dict[str, Any] | None:
    if isinstance(request, OpMsgRequest):
        return request.body
    if isinstance(request, OpQueryRequest):
        query = request.query
        inner = query.get("$query")
        return inner if isinstance(inner, dict) else query
    return None


def command_name(request: OpMsgRequest | OpQueryRequest | MalformedRequest) -> str | None:
    body = _body(request)
    return None if body is None else next(iter(body), None)


def claims_member(request: OpMsgRequest | OpQueryRequest | MalformedRequest) -> bool:
    """True when the message is of a kind only members send. A claim, not an identity: it grants
    nothing (see the module docstring); test fail points use it to leave members' traffic alone."""
    body = _body(request)
    if body is None:
        return False
    name = next(iter(body), None)
    if name in MEMBER_ONLY_COMMANDS:
        return True
    if name in OPLOG_READS:
        return body.get(OPLOG_READS[name]) == OPLOG and body.get("$db") == "local"
    return name in HELLO_COMMANDS and isinstance(body.get("internalClient"), dict)


@dataclass(frozen=True, slots=True)
class Admitted:
    role: Role
    evict: int | None = None  # a connection to close to make room (it was idle the longest)


@dataclass(slots=True)
class Admission:
    """Counts connections by role and decides admissions. Mutable; owned by one wire server."""

    max_conns: int
    max_pending: int = 128
    max_idle: int = DEFAULT_MAX_IDLE
    preempt_idle_ms: int = PREEMPT_IDLE_MS
    clients: int = 0
    members: int = 0
    pending: int = 0
    refused: int = 0
    evicted: int = 0
    _idle: OrderedDict[int, int] = field(default_factory=OrderedDict)  # client id -> idle since (ms), oldest first

    def on_accept(self, now_ms: int) -> Admitted | None:
        """The role of a new connection (and a connection to close for it), or None to refuse it."""
        if self.clients < self.max_conns:
            self.clients += 1
            return Admitted(Role.CLIENT)
        oldest = next(iter(self._idle.items()), None)
        if oldest is not None and now_ms - oldest[1] >= self.preempt_idle_ms:
            self._evict(oldest[0])  # it counts until it is closed, a moment from now
            self.clients += 1
            return Admitted(Role.CLIENT, evict=oldest[0])
        if self.pending < self.max_pending:
            self.pending += 1
            return Admitted(Role.PENDING)
        self.refused += 1
        return None

    def on_idle(self, conn_id: int, role: Role, now_ms: int) -> None:
        """A connection waits for its next message (nothing half-received)."""
        if role is Role.CLIENT:
            self._idle[conn_id] = now_ms
            self._idle.move_to_end(conn_id)

    def on_busy(self, conn_id: int) -> None:
        """Bytes arrived on a connection."""
        self._idle.pop(conn_id, None)

    def over_idle_budget(self) -> list[int]:
        """Idle client connections to close, oldest first, so at most `max_idle` stay idle."""
        out = []
        while len(self._idle) > self.max_idle:
            conn_id, _since = self._idle.popitem(last=False)
            self.evicted += 1
            out.append(conn_id)
        return out

    def may_serve_pending(self, name: str | None) -> bool:
        """Whether a pending connection's message is served (the handshake, logging in); if not, the
        connection is refused."""
        if name in HANDSHAKE_COMMANDS:
            return True
        self.refused += 1
        return False

    def on_member_login(self, conn_id: int, role: Role) -> Role:
        """The connection authenticated as the internal user: it is a member from now on."""
        if role is Role.MEMBER:
            return role
        self._leave(conn_id, role)
        self.members += 1
        return Role.MEMBER

    def on_close(self, conn_id: int, role: Role) -> None:
        self._leave(conn_id, role)

    def on_identify_timeout(self, role: Role) -> None:
        """A pending connection did not authenticate as a member in time: it is refused (then closed)."""
        if role is Role.PENDING:
            self.refused += 1

    def _evict(self, conn_id: int) -> None:
        del self._idle[conn_id]
        self.evicted += 1

    def _leave(self, conn_id: int, role: Role) -> None:
        self._idle.pop(conn_id, None)
        if role is Role.CLIENT:
            self.clients -= 1
        elif role is Role.MEMBER:
            self.members -= 1
        else:
            self.pending -= 1

    @property
    def open(self) -> int:
        return self.clients + self.members + self.pending

    def snapshot(self) -> dict[str, int]:
        return {"current": self.open, "clients": self.clients, "members": self.members,
                "pending": self.pending, "idle": len(self._idle), "refused": self.refused,
                "evicted": self.evicted, "maxConns": self.max_conns}
