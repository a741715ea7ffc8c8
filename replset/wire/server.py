"""The asyncio wire-protocol server: bytes from sockets into the codec, replies out.

One task per connection reads into the sans-I/O decoder and handles requests in
order (drivers never pipeline on one connection). Every resource a connection
can hold is bounded, so that a misbehaving client costs a bounded amount and
the member keeps answering everyone else:
- Connections: `--maxConns` clients (`Admission`, see admission.py: connections that
  authenticated as a member never count and are never refused; idle client connections
  give their place to new ones at the cap, and at most `--maxIdleConns` sit idle).
- Receive buffer: one message of at most maxMessageSizeBytes; a length prefix
  outside [16, 48 MB] closes the connection before the body is buffered.
- Time mid-message: a connection that sent part of a message (header or body)
  and then nothing for `stalled_message_timeout_s` is closed. A connection idle
  *between* messages is never closed: drivers keep pooled connections idle for
  long.
- Send buffer: past WRITE_HIGH_WATER bytes the connection waits for the client
  to read; if it does not within `write_stall_timeout_s`, it is closed.
- Bad input: an unframeable length closes the connection (the stream cannot be
  resynchronised); a framed message with bad contents gets an error reply and
  the connection stays open (see codec.py).
"""

from __future__ import annotations

import asyncio
import logging
import resource
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from base.clock import Clock
from base.codec import (
    OP_QUERY,
    MalformedRequest,
    MessageDecoder,
    ProtocolError,
    encode_op_msg,
    encode_op_reply,
)
from base.errors import MongoError
from replset.auth.users import INTERNAL_USER, ConnectionAuth
from replset.wire.admission import (
    DEFAULT_MAX_IDLE,
    Admission,
    Role,
    claims_member,
    command_name,
    effective_max_conns,
)

if TYPE_CHECKING:
    from replset.node import Node
    from replset.wire.commands import Dispatcher

log = logging.getLogger(__name__)
TRACED_COMMANDS = frozenset({"insert", "update", "delete"})   # `replset.hops`: request and reply marks
READ_CHUNK = 256 * 1024
TLS_HANDSHAKE_TIMEOUT_S = 10.0  # a TLS client that does not finish its handshake in this long is dropped
WRITE_HIGH_WATER = 4 * 1024 * 1024
STALLED_MESSAGE_TIMEOUT_S = 30.0  # no byte for this long in the middle of a message: close
WRITE_STALL_TIMEOUT_S = 60.0  # a client that reads none of WRITE_HIGH_WATER bytes for this long: close
IDENTIFY_TIMEOUT_S = 2.0  # a connection arriving at the limit has this long to log in as a member


@dataclass(frozen=True, slots=True)
class WireLimits:
    """The wire server's bounds. `max_conns` None means the descriptor-derived default."""

    max_conns: int | None = None
    max_idle: int = DEFAULT_MAX_IDLE
    stalled_message_timeout_s: float = STALLED_MESSAGE_TIMEOUT_S
    write_stall_timeout_s: float = WRITE_STALL_TIMEOUT_S
    identify_timeout_s: float = IDENTIFY_TIMEOUT_S


def fd_soft_limit() -> int:
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    return soft if soft != resource.RLIM_INFINITY else 1 << 20


@dataclass(slots=True)
class Connection:
    id: int
    peer: str
    request_ids: int = 0
    client_metadata: dict[str, object] = field(default_factory=dict)
    role: Role = Role.CLIENT
    identify_deadline: float = 0.0  # monotonic time by which a PENDING connection must log in as a member
    claims_member: bool = False  # it sent a message only members send: spared by test fail points, no more
    auth: ConnectionAuth = field(default_factory=ConnectionAuth)  # the users it proved to be
    # An exhaust getMore being streamed: the command and the request id of the reply sent last (the
    # next reply answers it), until the cursor is done; None otherwise.
    exhaust: tuple[dict[str, object], int] | None = None

    def next_request_id(self) -> int:
        self.request_ids += 1
        return self.request_ids


class _Refused(Exception):
    """The connection is refused under --maxConns (closed without a reply)."""


class WireServer:
    def __init__(self, node: Node, dispatcher: Dispatcher, limits: WireLimits | None = None, *,
                 clock: Clock | None = None) -> None:
        self._node = node
        self._clock = node.clock if clock is None else clock
        self._dispatcher = dispatcher
        self.limits = limits or WireLimits()
        requested = self.limits.max_conns
        self.admission = Admission(effective_max_conns(requested, fd_soft_limit()), max_idle=self.limits.max_idle)
        if requested is not None and requested > self.admission.max_conns:
            log.warning("--maxConns %d is above 80%% of the open-file limit; using %d", requested,
                        self.admission.max_conns)
        self._server: asyncio.base_events.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._writers: dict[int, asyncio.StreamWriter] = {}  # open connections by id (to close idle ones)

    async def start(self, host: str | list[str] | None, port: int) -> None:
        tls = self._node.options.tls.server_context()
        self._server = await asyncio.start_server(self._handle, host, port, limit=READ_CHUNK, backlog=1024,
                                                  ssl=tls, ssl_handshake_timeout=TLS_HANDSHAKE_TIMEOUT_S if tls else None)

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        admitted = self.admission.on_accept(self._clock.monotonic_ms())
        peer = writer.get_extra_info("peername")
        peer_name = f"{peer[0]}:{peer[1]}" if peer else "?"
        if admitted is None:
            self._log_refused(peer_name)
            writer.close()
            return
        if admitted.evict is not None:
            self._close_idle(admitted.evict, "its place went to a new connection at the connection limit")
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        conn = Connection(self._node.next_connection_id(), peer_name, role=admitted.role,
                          identify_deadline=self._clock.monotonic() + self.limits.identify_timeout_s)
        self._writers[conn.id] = writer
        self._node.connections_open += 1
        try:
            await self._serve(conn, reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.CancelledError):
            pass
        except _Refused:
            self._log_refused(conn.peer)
        except ProtocolError as exc:
            log.info("closing connection %d from %s: %s", conn.id, conn.peer, exc)
        finally:
            self._dispatcher.abandon_exhaust(conn)  # (a stream cut off: its cursor goes too)
            self.admission.on_close(conn.id, conn.role)
            self._writers.pop(conn.id, None)
            self._node.connections_open -= 1
            self._tasks.discard(task)
            writer.close()

    def _close_idle(self, conn_id: int, why: str) -> None:
        writer = self._writers.get(conn_id)
        if writer is not None:
            evicted = self.admission.evicted  # a flood closes thousands: one line, then one a thousand
            log.log(logging.INFO if evicted == 1 or evicted % 1000 == 0 else logging.DEBUG,
                    "closing idle connection %d (%d closed so far): %s", conn_id, evicted, why)
            writer.close()  # its task sees the end of the stream and leaves

    def _log_refused(self, peer: str) -> None:
        log.info("connection from %s refused because too many open connections: %d", peer,
                 self.admission.clients)

    async def _read(self, conn: Connection, reader: asyncio.StreamReader, decoder: MessageDecoder) -> bytes:
        """The next bytes; b"" at end of stream or when a deadline (see the module docstring) passed."""
        if conn.role is Role.PENDING:  # one deadline for the whole first message, however it trickles in
            try:
                async with asyncio.timeout(conn.identify_deadline - self._clock.monotonic()):
                    return await reader.read(READ_CHUNK)
            except TimeoutError:
                self.admission.on_identify_timeout(conn.role)
                raise _Refused from None
        if not decoder.partial:  # idle between messages: wait as long as the client likes (within budget)
            self.admission.on_idle(conn.id, conn.role, self._clock.monotonic_ms())
            for conn_id in self.admission.over_idle_budget():
                self._close_idle(conn_id, f"more than {self.admission.max_idle} client connections were idle")
            data = await reader.read(READ_CHUNK)
            self.admission.on_busy(conn.id)
            return data
        timeout_s = self.limits.stalled_message_timeout_s
        try:
            async with asyncio.timeout(timeout_s):
                return await reader.read(READ_CHUNK)
        except TimeoutError:
            log.info("closing connection %d from %s: no bytes for %g s in the middle of a message "
                     "(%d bytes buffered)", conn.id, conn.peer, timeout_s, decoder.buffered)
            return b""

    async def _serve(self, conn: Connection, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        decoder = MessageDecoder()
        transport = writer.transport
        hops = self._node.hops
        while True:
            data = await self._read(conn, reader, decoder)
            if not data:
                return
            decoder.receive_data(data)
            while (request := decoder.next_request()) is not None:
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
                    if conn.role is not Role.MEMBER and INTERNAL_USER in conn.auth.users:
                        conn.role = self.admission.on_member_login(conn.id, conn.role)
                if reply is None:
                    continue
                writer.write(reply)
                if traced:
                    hops.mark("reply", 0)
                # An idle connection must not hold its last request and reply (an insert's rows, a batch).
                request = reply = None
                if transport.get_write_buffer_size() > WRITE_HIGH_WATER and not await self._drain(conn, writer):
                    return
                if conn.exhaust is not None and not await self._stream_exhaust(conn, writer):
                    return

    async def _stream_exhaust(self, conn: Connection, writer: asyncio.StreamWriter) -> bool:
        """An exhaust cursor's getMore replies, each sent as the client reads the one before, until the
        cursor is done. False if the client stopped reading (the connection closes and its cursor is
        killed: the client discards a connection with replies still to come)."""
        while conn.exhaust is not None:
            if writer.transport.is_closing() or not await self._drain(conn, writer):
                return False
            reply = await self._dispatcher.next_exhaust_reply(conn)
            writer.write(reply)
            await asyncio.sleep(0)  # (a long stream lets other connections in between its replies)
        return True

    async def _drain(self, conn: Connection, writer: asyncio.StreamWriter) -> bool:
        """Waits for the client to read its replies; False (close it) if it does not in time."""
        try:
            async with asyncio.timeout(self.limits.write_stall_timeout_s):
                await writer.drain()
        except TimeoutError:
            log.info("closing connection %d from %s: it read none of %d bytes of replies for %g s",
                     conn.id, conn.peer, writer.transport.get_write_buffer_size(),
                     self.limits.write_stall_timeout_s)
            writer.transport.abort()  # close() would wait to flush what the client will not read
            return False
        return True

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
