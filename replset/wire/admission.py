"""Connection admission under `--maxConns`: which incoming connections count, which are refused.

Theory of operation. mongod refuses a new connection once `maxConns` are open
("connection refused because too many open connections") by accepting it and
closing it at once. Here connections between members must never be refused or
counted: a member that cannot heartbeat, vote or fetch the oplog because
application pools filled the port would turn a client storm into a failover.

A member cannot be recognised when its TCP connection is accepted (same
address range as clients, no handshake yet); it can be recognised by its first
message. Members send one of:
- a `hello`/`isMaster` carrying `internalClient` (what mongod members send as
  the first message of every connection), or
- a command only members send: `replSetHeartbeat`, `replSetRequestVotes`,
  `replSetUpdatePosition`, `replSetGetRBID`, or
- a read of the oplog (`find`/`getMore`/`killCursors` on `local.oplog.rs`): the
  first message of a member's oplog fetcher and rollback connections, which
  open with no handshake. (A user tool tailing the oplog is exempt too; that
  is the price of never refusing a fetcher.)
So every connection starts as a *client* while there is room (it counts), and
becomes a *member* (stops counting) when a message shows it is one. At the
limit a new connection is *pending*: it does not count, it gets
`identify_timeout_s` to send one message, and it is refused (closed without a
reply) unless that message identifies a member. Pending connections are
themselves bounded (`max_pending`): past that bound, new connections are
refused at accept, so a flood of silent connections cannot hold descriptors.
A driver's connection at the limit is therefore closed right after its first
`hello` (drivers send it at once), which the driver sees as a network error
during the handshake, exactly as against mongod.

This is load shedding, not security: anyone may claim to be a member (there is
no authentication in this project); the point is that honest application
connection pools cannot starve replication.

Pure: no I/O, no clock. The server shell asks `on_accept()`, reports
`on_message()` for each request and `on_close()`, and acts on the returned values.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

from base.codec import MalformedRequest, OpMsgRequest, OpQueryRequest

MAX_CONNS_CAP = 1_000_000  # mongod's default maxIncomingConnections
FD_SHARE = 0.8  # mongod's share of the descriptor limit open to connections
MEMBER_ONLY_COMMANDS = frozenset({"replSetHeartbeat", "replSetRequestVotes", "replSetUpdatePosition",
                                  "replSetGetRBID"})
HELLO_COMMANDS = frozenset({"hello", "isMaster", "ismaster"})
OPLOG_READS = {"find": "find", "getMore": "collection", "killCursors": "killCursors"}  # command -> field naming
OPLOG = "oplog.rs"


class Role(enum.Enum):
    CLIENT = "client"  # counts against maxConns
    MEMBER = "member"  # another member of the set: never counts, never refused
    PENDING = "pending"  # arrived at the limit: one message to show it is a member


class Verdict(enum.Enum):
    SERVE = "serve"
    REFUSE = "refuse"


def default_max_conns(fd_soft_limit: int) -> int:
    """mongod's rule: 1,000,000, but no more than 80% of the descriptor limit, so that the member keeps
    descriptors for its database files, its connections to other members and the HTTP port (an accept
    failing with EMFILE is far worse than a refused client)."""
    return max(1, min(MAX_CONNS_CAP, int(fd_soft_limit * FD_SHARE)))


def effective_max_conns(requested: int | None, fd_soft_limit: int) -> int:
    """`--maxConns` as given, capped (like mongod) by the descriptor-derived default."""
    ceiling = default_max_conns(fd_soft_limit)
    return ceiling if requested is None else max(1, min(requested, ceiling))


def is_member_request(request: OpMsgRequest | OpQueryRequest | MalformedRequest) -> bool:
    """True when the message is one only another member of the set sends (see the module docstring)."""
    if isinstance(request, OpMsgRequest):
        body: dict[str, Any] = request.body
    elif isinstance(request, OpQueryRequest):
        body = request.query
    else:
        return False
    name = next(iter(body), None)
    if name in MEMBER_ONLY_COMMANDS:
        return True
    if name in OPLOG_READS:
        return body.get(OPLOG_READS[name]) == OPLOG and body.get("$db") == "local"
    return name in HELLO_COMMANDS and isinstance(body.get("internalClient"), dict)


@dataclass(slots=True)
class Admission:
    """Counts connections by role and decides admissions. Mutable; owned by one wire server."""

    max_conns: int
    max_pending: int = 128
    clients: int = 0
    members: int = 0
    pending: int = 0
    refused: int = 0

    def on_accept(self) -> Role | None:
        """The role of a new connection, or None when it must be refused at once."""
        if self.clients < self.max_conns:
            self.clients += 1
            return Role.CLIENT
        if self.pending < self.max_pending:
            self.pending += 1
            return Role.PENDING
        self.refused += 1
        return None

    def on_message(self, role: Role, member: bool) -> tuple[Role, Verdict]:
        """A connection in `role` sent a message (`member`: it identifies a member). Returns the new role
        and whether to serve the message or refuse the connection."""
        if role is Role.MEMBER or (not member and role is Role.CLIENT):
            return role, Verdict.SERVE
        if member:
            self._leave(role)
            self.members += 1
            return Role.MEMBER, Verdict.SERVE
        self.refused += 1  # a pending connection that is not a member
        return role, Verdict.REFUSE

    def on_close(self, role: Role) -> None:
        self._leave(role)

    def on_identify_timeout(self, role: Role) -> None:
        """A pending connection sent no whole message in time: it is refused (then closed)."""
        if role is Role.PENDING:
            self.refused += 1

    def _leave(self, role: Role) -> None:
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
                "pending": self.pending, "refused": self.refused, "maxConns": self.max_conns}
