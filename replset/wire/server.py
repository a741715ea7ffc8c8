"""The asyncio wire-protocol server: bytes from sockets into the codec, replies out.

Each connection is an `asyncio.Protocol` (`_Link`): bytes go into its sans-I/O decoder as
they arrive, and from its first whole message on one task serves its requests in order
(drivers never pipeline on one connection). A connection that never finishes a message
costs no task and no timer: tens of thousands of half-sent headers cost the event loop a
callback each, and the deadlines of all connections are checked by one periodic sweep.

Every resource a connection can hold is bounded, so that a misbehaving client costs a
bounded amount and the member keeps answering everyone else (the decisions are the pure
`Admission`'s, see admission.py; this shell reports events and closes what it names):
- Connections: `--maxConns` clients. Connections that authenticated as a member never
  count and are never refused; at the cap a new connection takes the place of the client
  that waited longest. At most `--maxIdleConns` clients sit idle, at most
  `--maxPartialConns` unauthenticated ones have not finished a message, and at most
  `--maxNewConnsPerSource` from one address have not finished a first one.
- Receive buffers: one message of at most maxMessageSizeBytes per connection (a length
  prefix outside [16, 48 MB] closes the connection before the body is buffered), and
  `--maxPartialBytes` of unfinished messages on all connections together.
- Time mid-message: a connection that sent part of a message (header or body) and then
  nothing for 30 s (`Budgets.stalled_ms`) is closed. A connection idle *between* messages
  is closed only by the idle budget: drivers keep pooled connections idle for long.
- Send buffer: past WRITE_HIGH_WATER bytes the connection waits for the client to read;
  if it does not within `write_stall_timeout_s`, it is closed.
- Bad input: an unframeable length closes the connection (the stream cannot be
  resynchronised); a framed message with bad contents gets an error reply and the
  connection stays open (see codec.py).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import resource
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, cast

from base.clock import Clock
from base.codec import (
    OP_QUERY,
    MalformedRequest,
    MessageDecoder,
    OpMsgRequest,
    ProtocolError,
    Request,
    decode_request,
    decode_request_sliced,
    encode_op_msg,
    encode_op_reply,
)
from base.errors import MongoError
from replset.auth.users import INTERNAL_USER, ConnectionAuth
from replset.wire.admission import (
    Admission,
    Budgets,
    Close,
    Reason,
    Role,
    claims_member,
    command_name,
    effective_max_conns,
)
from replset.wire.command_args import exceeds_depth

if TYPE_CHECKING:
    from replset.node import Node
    from replset.wire.commands import Dispatcher

log = logging.getLogger(__name__)
TRACED_COMMANDS = frozenset({"insert", "update", "delete"})   # `replset.hops`: request and reply marks
READ_CHUNK = 256 * 1024
TLS_HANDSHAKE_TIMEOUT_S = 10.0  # a TLS client that does not finish its handshake in this long is dropped
WRITE_HIGH_WATER = 4 * 1024 * 1024
WRITE_STALL_TIMEOUT_S = 60.0  # a client that reads none of WRITE_HIGH_WATER bytes for this long: close
SWEEP_INTERVAL_S = 0.1  # deadlines and budgets are checked this often (besides after each event)
# The accept queue's length: the kernel caps it at net.core.somaxconn. A full queue drops new
# connections' SYNs, and a dropped SYN costs the client a second before it tries again.
LISTEN_BACKLOG = 65535


OFF_LOOP_BYTES = 1 << 20  # a message this large is decoded, and its nesting checked, on a worker thread


def _decode_large(frame: bytes) -> Request | MalformedRequest:
    """A large message decoded off the event loop, its arrays a slice at a time, and its nesting
    checked there too (a 600,000-row insert took 1.8 s of the loop's thread for both)."""
    request = decode_request_sliced(frame)
    if isinstance(request, OpMsgRequest):
        try:
            within = not exceeds_depth(request.command())
        except ProtocolError:
            within = False
        if within:
            request = dataclasses.replace(request, depth_checked=True)
    return request


@dataclass(frozen=True, slots=True)
class WireLimits:
    """The wire server's bounds. `max_conns` None means the descriptor-derived default; the budgets of
    connections and their deadlines are the admission core's (admission.py)."""

    max_conns: int | None = None
    budgets: Budgets = field(default_factory=Budgets)
    write_stall_timeout_s: float = WRITE_STALL_TIMEOUT_S


def fd_soft_limit() -> int:
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    return soft if soft != resource.RLIM_INFINITY else 1 << 20


def raise_fd_limit() -> int:
    """Raises the open-file soft limit to the hard limit, as mongod advises for a server (each
    connection is a descriptor); the soft limit in force after."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard and soft != resource.RLIM_INFINITY:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        except (ValueError, OSError) as exc:
            log.warning("could not raise the open-file limit from %d to %d: %s", soft, hard, exc)
    return fd_soft_limit()


@dataclass(slots=True)
class Connection:
    id: int
    peer: str
    request_ids: int = 0
    client_metadata: dict[str, object] = field(default_factory=dict)
    role: Role = Role.CLIENT
    logged_in: bool = False  # it authenticated (as any user): out of the budgets of unauthenticated ones
    claims_member: bool = False  # it sent a message only members send: spared by test fail points, no more
    auth: ConnectionAuth = field(default_factory=ConnectionAuth)  # the users it proved to be
    # An exhaust getMore being streamed: the command and the request id of the reply sent last (the
    # next reply answers it), until the cursor is done; None otherwise.
    exhaust: tuple[dict[str, object], int] | None = None

    def next_request_id(self) -> int:
        self.request_ids += 1
        return self.request_ids


def _level(count: int) -> int:
    """A flood closes thousands of connections for one reason: the first ten are logged, then one a
    thousand (the rest at debug level)."""
    return logging.INFO if count <= 10 or count % 1000 == 0 else logging.DEBUG


class _Refused(Exception):
    """The connection is refused under --maxConns (closed without a reply)."""


class _Link(asyncio.Protocol):
    """One connection's transport events. Bytes go into its decoder as they arrive; a task serves its
    messages in order from its first whole message on, so a connection that never finishes one costs
    no task and no timer (a flood of half-sent headers costs a callback per event, nothing more)."""

    def __init__(self, server: WireServer) -> None:
        self.server = server
        self.conn: Connection | None = None  # None: refused at accept
        self.transport: asyncio.Transport | None = None
        self.decoder = MessageDecoder()
        self.task: asyncio.Task[None] | None = None
        self.busy = False  # the task is serving a message (not waiting for bytes)
        self.lost = False
        self._bytes: asyncio.Future[None] | None = None  # the idle task waits on it for a whole message
        self._writable: asyncio.Future[None] | None = None  # set while the transport's buffer is full
        self._reading_paused = False

    # -- asyncio.Protocol ------------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.server.on_made(self, cast(asyncio.Transport, transport))

    def data_received(self, data: bytes) -> None:
        if self.conn is not None:
            self.server.on_data(self, data)

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        self.decoder.clear()
        self._wake()
        if self._writable is not None and not self._writable.done():
            self._writable.set_result(None)
        if self.task is None:
            self.server.finish(self)

    def pause_writing(self) -> None:
        self._writable = asyncio.get_running_loop().create_future()

    def resume_writing(self) -> None:
        if self._writable is not None and not self._writable.done():
            self._writable.set_result(None)
        self._writable = None

    # -- for the serving task --------------------------------------------------------------------------
    def on_whole_message(self) -> None:
        """A whole message is buffered: the serving task (started on the first one) takes it."""
        if self.task is None:
            self.task = asyncio.get_running_loop().create_task(self.server.serve(self))
        elif not self.busy:
            self._wake()
        elif self.decoder.buffered >= READ_CHUNK and self.transport is not None:
            self.transport.pause_reading()  # (pipelined: nothing more until the task catches up)
            self._reading_paused = True

    async def wait_for_message(self) -> None:
        """Until a whole message is buffered or the connection is gone."""
        self.busy = False
        if self._reading_paused and self.transport is not None and not self.lost:
            self._reading_paused = False
            self.transport.resume_reading()
        self._bytes = asyncio.get_running_loop().create_future()
        try:
            await self._bytes
        finally:
            self._bytes = None
            self.busy = True

    async def drain(self, timeout_s: float) -> bool:
        """Waits for the client to read its replies; False if it does not within `timeout_s`."""
        writable = self._writable
        if writable is None or self.lost:
            return not self.lost
        try:
            async with asyncio.timeout(timeout_s):
                await asyncio.shield(writable)
        except TimeoutError:
            return False
        return not self.lost

    def _wake(self) -> None:
        if self._bytes is not None and not self._bytes.done():
            self._bytes.set_result(None)


class WireServer:
    def __init__(self, node: Node, dispatcher: Dispatcher, limits: WireLimits | None = None, *,
                 clock: Clock | None = None) -> None:
        self._node = node
        self._clock = node.clock if clock is None else clock
        self._dispatcher = dispatcher
        self.limits = limits or WireLimits()
        requested = self.limits.max_conns
        self.admission = Admission(effective_max_conns(requested, fd_soft_limit()), self.limits.budgets)
        if requested is not None and requested > self.admission.max_conns:
            log.warning("--maxConns %d is above 80%% of the open-file limit; using %d", requested,
                        self.admission.max_conns)
        self._server: asyncio.base_events.Server | None = None
        self._sweeper: asyncio.Task[None] | None = None
        self._links: dict[int, _Link] = {}  # open connections by id (to close the ones a budget names)

    async def start(self, host: str | list[str] | None, port: int) -> None:
        tls = self._node.options.tls.server_context()
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            lambda: _Link(self), host, port, backlog=LISTEN_BACKLOG, ssl=tls,
            ssl_handshake_timeout=TLS_HANDSHAKE_TIMEOUT_S if tls else None)
        self._sweeper = loop.create_task(self._sweep())

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        if self._sweeper is not None:
            self._sweeper.cancel()
        tasks = [link.task for link in self._links.values() if link.task is not None]
        for link in list(self._links.values()):
            if link.task is not None:
                link.task.cancel()
            if link.transport is not None:
                link.transport.close()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()

    # -- transport events (from _Link) -----------------------------------------------------------------
    def on_made(self, link: _Link, transport: asyncio.Transport) -> None:
        now_ms = self._clock.monotonic_ms()
        peer = transport.get_extra_info("peername")
        conn_id = self._node.next_connection_id()
        admitted = self.admission.on_accept(conn_id, str(peer[0]) if peer else "?", now_ms)
        peer_name = f"{peer[0]}:{peer[1]}" if peer else "?"
        if admitted is None:
            self._log_refused(peer_name)
            transport.close()
            return
        link.conn = Connection(conn_id, peer_name, role=admitted.role)
        link.transport = transport
        transport.set_write_buffer_limits(high=WRITE_HIGH_WATER)
        self._links[conn_id] = link
        self._node.connections_open += 1
        if admitted.evict is not None:
            self._close(Close(admitted.evict, Reason.PREEMPTED))
        self._enforce(now_ms)

    def on_data(self, link: _Link, data: bytes) -> None:
        conn, decoder = link.conn, link.decoder
        assert conn is not None and link.transport is not None
        decoder.receive_data(data)
        try:
            whole = decoder.has_message()
        except ProtocolError as exc:
            log.info("closing connection %d from %s: %s", conn.id, conn.peer, exc)
            decoder.clear()
            link.transport.abort()
            return
        now_ms = self._clock.monotonic_ms()
        self.admission.on_receive(conn.id, decoder.buffered, now_ms)
        if whole:
            link.on_whole_message()
        self._enforce(now_ms)

    def finish(self, link: _Link) -> None:
        """The connection is gone and its task (if any) is done: out of every count."""
        conn = link.conn
        if conn is None or self._links.pop(conn.id, None) is None:
            return
        self._dispatcher.abandon_exhaust(conn)  # (a stream cut off: its cursor goes too)
        self.admission.on_close(conn.id)
        self._node.connections_open -= 1

    # -- budgets ---------------------------------------------------------------------------------------
    def _enforce(self, now_ms: int) -> None:
        for close in self.admission.over_budget(now_ms):
            self._close(close)

    async def _sweep(self) -> None:
        """Deadlines (stalled messages, pending connections) and budgets, every SWEEP_INTERVAL_S: one
        timer for the whole server instead of one per connection."""
        while True:
            await asyncio.sleep(SWEEP_INTERVAL_S)
            now_ms = self._clock.monotonic_ms()
            for close in self.admission.overdue(now_ms) + self.admission.over_budget(now_ms):
                self._close(close)

    def _close(self, close: Close) -> None:
        link = self._links.get(close.conn_id)
        if link is None or link.conn is None or link.transport is None:
            return
        self._log_close(link.conn, link.decoder.buffered, close.reason)
        if close.reason in (Reason.BYTES, Reason.STALLED):
            link.decoder.clear()  # its bytes go now; nothing is owed to it
            link.transport.abort()
        else:
            link.transport.close()  # (its task, if any, sees the end and leaves)

    def _log_close(self, conn: Connection, buffered: int, reason: Reason) -> None:
        if reason is Reason.IDENTIFY:
            self._log_refused(conn.peer)
            return
        level = _level(self.admission.closed[reason])
        if reason is Reason.STALLED:
            log.log(level, "closing connection %d from %s: no bytes for %g s in the middle of a message "
                    "(%d bytes buffered)", conn.id, conn.peer, self.admission.budgets.stalled_ms / 1000, buffered)
            return
        log.log(level, "closing connection %d from %s (%d closed so far for this): %s", conn.id, conn.peer,
                self.admission.closed[reason], reason.value)

    def _log_refused(self, peer: str) -> None:
        log.log(_level(self.admission.refused), "connection from %s refused because too many open connections: "
                "%d", peer, self.admission.clients)


    # -- serving ---------------------------------------------------------------------------------------
    async def serve(self, link: _Link) -> None:
        """The connection's messages, one at a time, until it is gone."""
        conn = link.conn
        assert conn is not None and link.transport is not None
        link.busy = True
        try:
            await self._serve(link, conn, link.transport)
        except (ConnectionError, asyncio.CancelledError):
            pass
        except _Refused:
            self._log_refused(conn.peer)
        except ProtocolError as exc:
            log.info("closing connection %d from %s: %s", conn.id, conn.peer, exc)
        finally:
            link.task = None
            if link.lost:
                self.finish(link)
            else:
                link.transport.close()  # (connection_lost finishes it)

    async def _serve(self, link: _Link, conn: Connection, transport: asyncio.Transport) -> None:
        decoder = link.decoder
        hops = self._node.hops
        while not link.lost:
            frame = decoder.next_frame()
            request = None
            if frame is not None:
                request = decode_request(frame) if len(frame) < OFF_LOOP_BYTES else await asyncio.to_thread(
                    _decode_large, frame)
                if link.lost:
                    return  # (closed while it was decoded: by the client or a budget; nobody hears a reply)
            if request is None:
                now_ms = self._clock.monotonic_ms()
                self.admission.on_wait(conn.id, decoder.buffered, now_ms)
                self._enforce(now_ms)
                await link.wait_for_message()
                continue
            self.admission.on_message(conn.id, decoder.buffered, self._clock.monotonic_ms())
            if conn.role is Role.PENDING and not self.admission.may_serve_pending(command_name(request)):
                raise _Refused
            conn.claims_member = conn.claims_member or claims_member(request)
            traced = hops.enabled and command_name(request) in TRACED_COMMANDS
            if traced:
                hops.mark("request", 0)
            if isinstance(request, MalformedRequest):
                reply = self._malformed_reply(conn, request)
            else:
                reply = await self._dispatcher.handle(conn, request)
                self._maybe_logged_in(conn)
            if reply is None:
                continue
            if transport.is_closing():
                return  # (closed while the command ran: by the client, a budget, or the member stopping)
            transport.write(reply)
            if traced:
                hops.mark("reply", 0)
            # An idle connection must not hold its last request and reply (an insert's rows, a batch).
            request = reply = None
            if not await self._drain(conn, link):
                return
            if conn.exhaust is not None and not await self._stream_exhaust(conn, link):
                return

    def _maybe_logged_in(self, conn: Connection) -> None:
        """A connection that authenticated leaves the budgets of unauthenticated ones; one that
        authenticated as the internal user is a member from now on."""
        if not conn.auth.users:
            return
        member = INTERNAL_USER in conn.auth.users
        if conn.logged_in and (conn.role is Role.MEMBER or not member):
            return
        conn.logged_in = True
        conn.role = self.admission.on_login(conn.id, member)

    async def _stream_exhaust(self, conn: Connection, link: _Link) -> bool:
        """An exhaust cursor's getMore replies, each sent as the client reads the one before, until the
        cursor is done. False if the client stopped reading (the connection closes and its cursor is
        killed: the client discards a connection with replies still to come)."""
        assert link.transport is not None
        while conn.exhaust is not None:
            if not await self._drain(conn, link):
                return False
            reply = await self._dispatcher.next_exhaust_reply(conn)
            if link.transport.is_closing():
                return False
            link.transport.write(reply)
            await asyncio.sleep(0)  # (a long stream lets other connections in between its replies)
        return True

    async def _drain(self, conn: Connection, link: _Link) -> bool:
        """Waits for the client to read its replies (past WRITE_HIGH_WATER); False (close it) if it
        does not in time."""
        if await link.drain(self.limits.write_stall_timeout_s):
            return True
        if not link.lost and link.transport is not None:
            log.info("closing connection %d from %s: it read none of %d bytes of replies for %g s",
                     conn.id, conn.peer, link.transport.get_write_buffer_size(),
                     self.limits.write_stall_timeout_s)
            link.transport.abort()  # close() would wait to flush what the client will not read
        return False

    @staticmethod
    def _malformed_reply(conn: Connection, request: MalformedRequest) -> bytes | None:
        """An error reply in the format the opcode calls for; none for a moreToCome message."""
        log.debug("connection %d: malformed message (opcode %d): %s", conn.id, request.opcode, request.reason)
        if request.more_to_come:
            return None
        doc = MongoError(request.code, request.reason).to_document()
        if request.opcode == OP_QUERY:
            return encode_op_reply(doc, conn.next_request_id(), request.request_id)
        return encode_op_msg(doc, conn.next_request_id(), request.request_id)
