"""The asyncio wire-protocol server: bytes from sockets into the codec, replies out.

One task per connection reads into the sans-I/O decoder and handles requests in
order (drivers never pipeline on one connection). A protocol error closes only
that connection. The receive buffer is bounded by the codec's maximum message size.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from replset.wire.codec import MessageDecoder, ProtocolError

if TYPE_CHECKING:
    from replset.node import Node
    from replset.wire.commands import Dispatcher

log = logging.getLogger(__name__)
READ_CHUNK = 256 * 1024
WRITE_HIGH_WATER = 4 * 1024 * 1024


@dataclass(slots=True)
class Connection:
    id: int
    peer: str
    request_ids: int = 0
    client_metadata: dict[str, object] = field(default_factory=dict)

    def next_request_id(self) -> int:
        self.request_ids += 1
        return self.request_ids


class WireServer:
    def __init__(self, node: Node, dispatcher: Dispatcher) -> None:
        self._node = node
        self._dispatcher = dispatcher
        self._server: asyncio.base_events.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self, host: str, port: int) -> None:
        self._server = await asyncio.start_server(self._handle, host, port, limit=READ_CHUNK, backlog=1024)

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
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        peer = writer.get_extra_info("peername")
        conn = Connection(self._node.next_connection_id(), f"{peer[0]}:{peer[1]}" if peer else "?")
        self._node.connections_open += 1
        try:
            await self._serve(conn, reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.CancelledError):
            pass
        except ProtocolError as exc:
            log.info("closing connection %d from %s: %s", conn.id, conn.peer, exc)
        finally:
            self._node.connections_open -= 1
            self._tasks.discard(task)
            writer.close()

    async def _serve(self, conn: Connection, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        decoder = MessageDecoder()
        transport = writer.transport
        while True:
            data = await reader.read(READ_CHUNK)
            if not data:
                return
            decoder.receive_data(data)
            while (request := decoder.next_message()) is not None:
                reply = await self._dispatcher.handle(conn, request)
                if reply is None:
                    continue
                writer.write(reply)
                if transport.get_write_buffer_size() > WRITE_HIGH_WATER:
                    await writer.drain()
