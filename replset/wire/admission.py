"""Connection admission: which connections count against `--maxConns`, which are refused, which
are closed to make room or to keep a budget. Pure: no I/O; the clock is passed in.

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
count, it gets `identify_ms` to authenticate as a member (only the handshake and the SASL
commands are served meanwhile), and it is refused (closed without a reply) otherwise.
Pending connections are bounded (`max_pending`): past that, new connections are refused at
accept, so a flood of silent connections cannot hold descriptors.

**Connections that are not yet useful are budgeted too.** A connection that has not finished a
first message, or is in the middle of one, costs the member a descriptor and buffered bytes and
gives nothing back until its message is whole. A hostile client opens thousands that send half
a header and then nothing; without a budget they fill `maxConns`, and pings, members and real
clients are refused. So, for connections that have not authenticated (members and logged-in
clients are out of these budgets):

- **partial** (`max_partial`): unproven (no whole message yet) or mid-message connections; past
  it the one waiting longest is closed.
- **per source address** (`max_new_per_source`): connections from one address that have not
  finished a first message; past it the oldest from that address is closed. A flood from one
  address then costs everyone else nothing, and its own newest connection (a client retrying)
  still gets in.
- Both close a connection only once it has been waiting `grace_ms`: a burst of connections is
  accepted before what they sent with it is read, and a client whose hello is already in the
  socket must not lose its place to that order. At a flood's rate R the sets overshoot their
  budgets by at most R x `grace_ms` (plus the sweep's period, below).
- **bytes** (`max_partial_bytes`, on every connection but members'): past the total, the
  connection whose unfinished message began first is closed, unauthenticated ones first
  (see `_over_bytes`). The cap is never below one largest message (48 MB), so that a lone
  client's message always fits; by default it is two.

At the cap, a new connection takes the place of the client connection that has waited longest,
idle or unfinished, once it has waited `preempt_idle_ms`.

**Deadlines.** A message that stops arriving half way is closed after `stalled_ms` without a
byte; a pending connection after `identify_ms`. Both are found by `overdue(now_ms)`, which the
server calls on one periodic sweep: no timer per connection.

The server shell reports events (`on_accept`, `on_receive` as bytes arrive, `on_message` as a
whole message is taken, `on_wait` when a connection has nothing to do, `on_login`, `on_close`),
calls `may_serve_pending` for each message of a pending connection, and closes the connections
that `over_budget(now_ms)` (after events) and `overdue(now_ms)` (on its sweep) name.
"""

from __future__ import annotations

__layer__ = "core"  # pure: no I/O, clock or randomness (tests/unit/test_layering.py)

import enum
from collections import Counter, OrderedDict
from dataclasses import dataclass, field
from typing import Any

from base.codec import MAX_MESSAGE_SIZE, MalformedRequest, OpMsgRequest, OpQueryRequest

MAX_CONNS_CAP = 1_000_000  # mongod's default maxIncomingConnections
FD_SHARE = 0.8  # mongod's share of the descriptor limit open to connections
DEFAULT_MAX_IDLE = 10_000  # idle client connections kept open at most (see the module docstring)
PREEMPT_IDLE_MS = 5_000  # at the cap, a client idle this long gives its place to a new connection
DEFAULT_MAX_PARTIAL = 1_000  # unauthenticated clients unproven or mid-message, at most
DEFAULT_MAX_NEW_PER_SOURCE = 256  # connections from one address that have not finished a first message
DEFAULT_MAX_PARTIAL_BYTES = 2 * MAX_MESSAGE_SIZE  # bytes of unfinished messages, on all connections
GRACE_MS = 100  # a new or mid-message connection is closed by a count budget only after this long
STALLED_MS = 30_000  # no byte for this long in the middle of a message: closed
IDENTIFY_MS = 2_000  # a connection arriving at the limit has this long to log in as a member
_NEVER = 2**62  # a time no clock reaches
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
    evict: int | None = None  # a connection to close to make room (it waited the longest)


class Reason(enum.Enum):
    """Why a connection is named to close (the server logs it)."""

    PREEMPTED = "its place went to a new connection at the connection limit"
    IDLE = "more than maxIdleConns client connections were idle"
    PARTIAL = "more than maxPartialConns connections had not finished a message"
    SOURCE = "more than maxNewConnsPerSource connections from its address had not finished a first message"
    BYTES = "unfinished messages held more than maxPartialBytes bytes"
    STALLED = "no bytes in the middle of a message for the stalled-message timeout"
    IDENTIFY = "arrived at the connection limit and did not log in as a member in time"


@dataclass(frozen=True, slots=True)
class Close:
    conn_id: int
    reason: Reason


@dataclass(frozen=True, slots=True)
class Budgets:
    """What connections may hold (see the module docstring); the server's `WireLimits` fill it in."""

    max_idle: int = DEFAULT_MAX_IDLE
    max_partial: int = DEFAULT_MAX_PARTIAL
    max_new_per_source: int = DEFAULT_MAX_NEW_PER_SOURCE
    max_partial_bytes: int = DEFAULT_MAX_PARTIAL_BYTES
    preempt_idle_ms: int = PREEMPT_IDLE_MS
    grace_ms: int = GRACE_MS
    stalled_ms: int = STALLED_MS
    identify_ms: int = IDENTIFY_MS

    def __post_init__(self) -> None:
        if min(self.max_idle, self.max_partial, self.max_new_per_source) < 1:
            raise ValueError("a budget of connections is at least 1")
        if self.max_partial_bytes < MAX_MESSAGE_SIZE:
            raise ValueError(f"maxPartialBytes is at least one largest message ({MAX_MESSAGE_SIZE} bytes)")


@dataclass(slots=True)
class _Conn:
    """One open connection as the budgets see it."""

    role: Role
    source: str  # the peer's address, without the port
    proven: bool = False  # a whole message arrived on it
    trusted: bool = False  # it logged in (as any user)
    closing: bool = False  # named to close: out of every budget already, counted until it is closed
    held: int = 0  # bytes of messages it sent that are buffered, not yet taken to be served
    last_byte_ms: int = 0


def _oldest(index: OrderedDict[int, int]) -> tuple[int, int] | None:
    return next(iter(index.items()), None)


@dataclass(slots=True)
class Admission:
    """Counts connections by role, keeps the budgets and decides admissions. Mutable; owned by one
    wire server. Every `OrderedDict` index maps a connection id to the time (ms) it entered, oldest
    first, so that each budget closes the oldest without a scan."""

    max_conns: int
    budgets: Budgets = field(default_factory=Budgets)
    max_pending: int = 128
    clients: int = 0
    members: int = 0
    pending: int = 0
    refused: int = 0
    evicted: int = 0  # closed to make room at the cap, or past the idle budget
    closed: Counter[Reason] = field(default_factory=Counter)
    held_total: int = 0  # bytes buffered for unfinished messages, on every connection
    _conns: dict[int, _Conn] = field(default_factory=dict)
    _idle: OrderedDict[int, int] = field(default_factory=OrderedDict)  # proven clients with nothing to do
    _partial: OrderedDict[int, int] = field(default_factory=OrderedDict)  # unproven or mid-message
    _holders: OrderedDict[int, int] = field(default_factory=OrderedDict)  # holding bytes of a message
    _pending_since: OrderedDict[int, int] = field(default_factory=OrderedDict)
    _new_by_source: dict[str, OrderedDict[int, int]] = field(default_factory=dict)  # unproven, by address
    _crowded: set[str] = field(default_factory=set)  # addresses over max_new_per_source
    # The count budgets (partial, per source) close nothing before this time: the oldest of a set
    # over its budget is still in its grace. Lowered when a set goes over; keeps a flood's events cheap.
    _recheck_ms: int = _NEVER

    # -- events --------------------------------------------------------------------------------------
    def on_accept(self, conn_id: int, source: str, now_ms: int) -> Admitted | None:
        """The role of a new connection (and a connection to close for it), or None to refuse it."""
        evict = None
        if self.clients >= self.max_conns:
            evict = self._preempt(now_ms)
            if evict is None:
                return self._admit_pending(conn_id, source, now_ms)
        self.clients += 1
        self._conns[conn_id] = _Conn(Role.CLIENT, source, last_byte_ms=now_ms)
        self._enter_partial(conn_id, now_ms)
        new = self._new_by_source.setdefault(source, OrderedDict())
        new[conn_id] = now_ms
        if len(new) > self.budgets.max_new_per_source:
            self._crowded.add(source)
            self._recheck_ms = min(self._recheck_ms, next(iter(new.values())) + self.budgets.grace_ms)
        return Admitted(Role.CLIENT, evict)

    def on_receive(self, conn_id: int, held: int, now_ms: int) -> None:
        """Bytes arrived; `held` is what the connection's decoder now buffers."""
        conn = self._conns.get(conn_id)
        if conn is None or conn.closing:
            return
        conn.last_byte_ms = now_ms
        self._idle.pop(conn_id, None)
        self._hold(conn_id, conn, held, now_ms)
        if held and self._budgeted(conn) and conn_id not in self._partial:
            self._enter_partial(conn_id, now_ms)

    def on_message(self, conn_id: int, held: int, now_ms: int) -> None:
        """A whole message was taken from the decoder, which buffers `held` bytes after it."""
        conn = self._conns.get(conn_id)
        if conn is None or conn.closing:
            return
        if not conn.proven:
            conn.proven = True
            self._forget_new(conn_id, conn.source)
        self._hold(conn_id, conn, held, now_ms)
        if not held:
            self._partial.pop(conn_id, None)  # it is busy now, not waiting for the rest of a message

    def on_wait(self, conn_id: int, held: int, now_ms: int) -> None:
        """The connection has nothing to do until more bytes come; its decoder buffers `held`."""
        conn = self._conns.get(conn_id)
        if conn is None or conn.closing:
            return
        self._hold(conn_id, conn, held, now_ms)
        if held or not conn.proven:
            return
        self._partial.pop(conn_id, None)
        if conn.role is Role.CLIENT:
            self._idle[conn_id] = now_ms
            self._idle.move_to_end(conn_id)

    def on_login(self, conn_id: int, member: bool) -> Role:
        """The connection authenticated (as the internal user when `member`): it leaves the budgets
        of unauthenticated connections; a member never counts and is never closed by a budget."""
        conn = self._conns[conn_id]
        conn.trusted = True
        self._partial.pop(conn_id, None)
        if member and conn.role is not Role.MEMBER:
            self._count(conn.role, -1)
            self._idle.pop(conn_id, None)
            self._pending_since.pop(conn_id, None)
            conn.role = Role.MEMBER
            self.members += 1
        return conn.role

    def on_close(self, conn_id: int) -> None:
        conn = self._conns.pop(conn_id, None)
        if conn is None:
            return
        self._retire(conn_id, conn)
        self._count(conn.role, -1)

    def may_serve_pending(self, name: str | None) -> bool:
        """Whether a pending connection's message is served (the handshake, logging in); if not, the
        connection is refused."""
        if name in HANDSHAKE_COMMANDS:
            return True
        self.refused += 1
        return False

    # -- decisions ----------------------------------------------------------------------------------
    def over_budget(self, now_ms: int) -> list[Close]:
        """Connections to close, oldest first, so that every budget holds again. Cheap when none is
        over: the server asks after each event that can fill one."""
        out = self._over_idle() if len(self._idle) > self.budgets.max_idle else []
        if now_ms >= self._recheck_ms:
            self._recheck_ms = _NEVER
            out += self._over_partial(now_ms)
            out += self._over_sources(now_ms)
        if self.held_total > self.budgets.max_partial_bytes:
            out += self._over_bytes()
        return out

    def overdue(self, now_ms: int) -> list[Close]:
        """Connections past a deadline: a message stalled half way, a pending connection that did not
        log in as a member in time. The server asks on a periodic sweep."""
        out: list[Close] = []
        stalled_ms = self.budgets.stalled_ms
        for conn_id, since in list(self._holders.items()):
            if now_ms - since < stalled_ms:
                break  # (holders are in the order their unfinished bytes began)
            if now_ms - self._conns[conn_id].last_byte_ms >= stalled_ms:
                out.append(self._close(conn_id, Reason.STALLED))
        for conn_id, since in list(self._pending_since.items()):
            if now_ms - since < self.budgets.identify_ms:
                break
            self.refused += 1
            out.append(self._close(conn_id, Reason.IDENTIFY))
        return out

    # -- budgets ------------------------------------------------------------------------------------
    def _over_idle(self) -> list[Close]:
        out = []
        while len(self._idle) > self.budgets.max_idle:
            out.append(self._close(next(iter(self._idle)), Reason.IDLE))
        return out

    def _over_partial(self, now_ms: int) -> list[Close]:
        out = []
        while len(self._partial) > self.budgets.max_partial:
            conn_id, since = next(iter(self._partial.items()))
            if now_ms - since < self.budgets.grace_ms:
                self._recheck_ms = min(self._recheck_ms, since + self.budgets.grace_ms)
                break
            out.append(self._close(conn_id, Reason.PARTIAL))
        return out

    def _over_sources(self, now_ms: int) -> list[Close]:
        out = []
        for source in list(self._crowded):
            new = self._new_by_source.get(source)
            while new and len(new) > self.budgets.max_new_per_source:
                conn_id, since = next(iter(new.items()))
                if now_ms - since < self.budgets.grace_ms:
                    self._recheck_ms = min(self._recheck_ms, since + self.budgets.grace_ms)
                    break
                out.append(self._close(conn_id, Reason.SOURCE))
            if not new or len(new) <= self.budgets.max_new_per_source:
                self._crowded.discard(source)
        return out

    def _over_bytes(self) -> list[Close]:
        """Past the cap on buffered bytes, the connections whose unfinished message began first are
        closed, unauthenticated ones before authenticated ones, members never: a message that takes
        long to arrive holds its bytes longest, while a client sending at the speed of its link is
        done (and its message young) before the slow ones are."""
        out: list[Close] = []
        if self.held_total <= self.budgets.max_partial_bytes:
            return out
        for trusted in (False, True):
            for conn_id in list(self._holders):
                if self.held_total <= self.budgets.max_partial_bytes:
                    return out
                conn = self._conns[conn_id]
                if conn.trusted is trusted and conn.role is not Role.MEMBER:
                    out.append(self._close(conn_id, Reason.BYTES))
        return out

    # -- bookkeeping ---------------------------------------------------------------------------------
    def _admit_pending(self, conn_id: int, source: str, now_ms: int) -> Admitted | None:
        if self.pending >= self.max_pending:
            self.refused += 1
            return None
        self.pending += 1
        self._conns[conn_id] = _Conn(Role.PENDING, source, last_byte_ms=now_ms)
        self._pending_since[conn_id] = now_ms
        return Admitted(Role.PENDING)

    def _preempt(self, now_ms: int) -> int | None:
        """At the cap: the client connection that has waited longest, idle or with an unfinished
        message, if it has waited `preempt_idle_ms`."""
        waited = [entry for entry in (_oldest(self._idle), _oldest(self._partial)) if entry is not None]
        if not waited:
            return None
        conn_id, since = min(waited, key=lambda entry: entry[1])
        if now_ms - since < self.budgets.preempt_idle_ms:
            return None
        return self._close(conn_id, Reason.PREEMPTED).conn_id

    def _close(self, conn_id: int, reason: Reason) -> Close:
        """Takes the connection out of every budget (it counts until the server has closed it)."""
        conn = self._conns[conn_id]
        conn.closing = True
        self._retire(conn_id, conn)
        self.closed[reason] += 1
        if reason in (Reason.IDLE, Reason.PREEMPTED):
            self.evicted += 1
        return Close(conn_id, reason)

    def _retire(self, conn_id: int, conn: _Conn) -> None:
        self._hold(conn_id, conn, 0, 0)
        self._idle.pop(conn_id, None)
        self._partial.pop(conn_id, None)
        self._pending_since.pop(conn_id, None)
        self._forget_new(conn_id, conn.source)

    def _enter_partial(self, conn_id: int, now_ms: int) -> None:
        self._partial[conn_id] = now_ms
        if len(self._partial) > self.budgets.max_partial:
            oldest = next(iter(self._partial.values()))
            self._recheck_ms = min(self._recheck_ms, oldest + self.budgets.grace_ms)

    def _hold(self, conn_id: int, conn: _Conn, held: int, now_ms: int) -> None:
        self.held_total += held - conn.held
        conn.held = held
        if held:
            self._holders.setdefault(conn_id, now_ms)
        else:
            self._holders.pop(conn_id, None)

    def _forget_new(self, conn_id: int, source: str) -> None:
        new = self._new_by_source.get(source)
        if new is not None and new.pop(conn_id, None) is not None and not new:
            del self._new_by_source[source]

    def _budgeted(self, conn: _Conn) -> bool:
        """Whether the budgets of unauthenticated clients apply to the connection."""
        return conn.role is Role.CLIENT and not conn.trusted

    def _count(self, role: Role, delta: int) -> None:
        if role is Role.CLIENT:
            self.clients += delta
        elif role is Role.MEMBER:
            self.members += delta
        else:
            self.pending += delta

    @property
    def open(self) -> int:
        return self.clients + self.members + self.pending

    def snapshot(self) -> dict[str, int]:
        return {"current": self.open, "clients": self.clients, "members": self.members,
                "pending": self.pending, "idle": len(self._idle), "partial": len(self._partial),
                "partialBytes": self.held_total, "refused": self.refused, "evicted": self.evicted,
                "closedUnfinished": self.closed[Reason.PARTIAL] + self.closed[Reason.SOURCE],
                "closedForBytes": self.closed[Reason.BYTES], "stalled": self.closed[Reason.STALLED],
                "maxConns": self.max_conns}
