"""A member's connection to another member: one OP_MSG command at a time, over asyncio streams.

A shell. Members talk to each other with the wire protocol the drivers use, so
heartbeats, votes, oplog fetching and position reports are ordinary commands.
Each user of a peer (heartbeats, the fetcher, the position reporter) owns its
own `PeerClient`, so a long awaitData `getMore` never delays a heartbeat. A
failed or timed-out command closes the connection (the reply stream can no
longer be trusted) and raises `PeerError`; the next command reconnects.

`latency_ms(host)` is the test-only extra delay before each request to `host`
(the `peerLatency` fail point), which is how tests build sync chains by ping.
`route(host)` is the test-only address actually dialled for `host` (the
`peerRoutes` fail point: a fault-injecting proxy in front of the peer). It is
looked up before every request, so a changed route takes effect on the next
command, even on a connection that is already open; `host` stays the member's
name everywhere else.
"""

from __future__ import annotations

import asyncio
import itertools
import ssl
import struct
from collections.abc import Callable, Mapping
from typing import Any

from bson.binary import Binary

from base.codec import HEADER, MAX_MESSAGE_SIZE, decode_raw_reply, decode_reply, encode_op_msg_request
from base.hello import MAX_WIRE_VERSION, MIN_WIRE_VERSION
from base.scram import INTERNAL_USER_NAME, SHA256, client_exchange

CONNECT_TIMEOUT_S = 2.0
INTERNAL_HELLO = {"hello": 1, "internalClient": {"minWireVersion": MIN_WIRE_VERSION,
                                                 "maxWireVersion": MAX_WIRE_VERSION}, "$db": "admin"}
_request_ids = itertools.count(1)


class PeerError(Exception):
    """The peer could not be reached, did not answer in time, or broke the protocol."""

    def __init__(self, message: str, *, refused: bool = False) -> None:
        super().__init__(message)
        self.refused = refused


class PeerAuthFailed(ValueError):
    """The peer refused this member's keyfile credentials (or proved none of its own)."""


class PeerClient:
    def __init__(self, host: str, *, latency_ms: Callable[[str], float] | None = None,
                 route: Callable[[str], str] | None = None, internal_key: str | None = None,
                 tls: ssl.SSLContext | None = None) -> None:
        self.host = host
        self._tls = tls  # with TLS on: the context the peer's certificate is checked with
        self._internal_key = internal_key  # with a keyfile: authenticate as __system@local on connect
        self._latency_ms = latency_ms
        self._route = route
        self._dialled = host  # the address the open connection goes to
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._lock = asyncio.Lock()

    async def command(self, body: Mapping[str, Any], *, timeout_s: float, raw: bool = False) -> Any:
        """Runs one command; returns the reply document (which may have ok: 0), a `RawBSONDocument`
        with `raw` (its sub-documents keep their bytes)."""
        async with self._lock:
            try:
                async with asyncio.timeout(timeout_s):  # no extra task per command, unlike wait_for
                    return await self._round_trip(body, raw)
            except (OSError, TimeoutError, asyncio.IncompleteReadError, struct.error, ValueError) as exc:
                self.close()
                refused = isinstance(exc, ConnectionRefusedError)
                detail = str(exc) or ("no reply within the timeout" if isinstance(exc, TimeoutError) else "")
                raise PeerError(f"{self.host}: {type(exc).__name__}: {detail}", refused=refused) from exc

    async def _round_trip(self, body: Mapping[str, Any], raw: bool = False) -> Any:
        delay = self._latency_ms(self.host) if self._latency_ms is not None else 0.0
        if delay > 0:
            await asyncio.sleep(delay / 1000)
        address = self._route(self.host) if self._route is not None else self.host
        if self._writer is not None and address != self._dialled:
            self.close()  # the route changed: the old connection bypasses (or uses) the old path
        if self._writer is None:
            host, port = address.rsplit(":", 1)
            self._reader, self._writer = await asyncio.wait_for(
                asyncio.open_connection(host, int(port), ssl=self._tls,
                                        server_hostname=self.host.rsplit(":", 1)[0] if self._tls else None),
                CONNECT_TIMEOUT_S)
            self._dialled = address
            # The first message says this is a member (as mongod's internal connections do): a member
            # at its --maxConns limit still takes it, and it never counts as a client connection.
            await self._exchange(INTERNAL_HELLO, raw=True)
            if self._internal_key is not None:
                await self._authenticate(self._internal_key)
        return await self._exchange(body, raw)

    async def _authenticate(self, key: str) -> None:
        """SCRAM-SHA-256 as `__system@local`, the keyfile's key as the password; the peer's signature
        is checked too (a peer without the key cannot pass for a member)."""
        client = client_exchange(SHA256, INTERNAL_USER_NAME, key)
        reply = await self._exchange({"saslStart": 1, "mechanism": SHA256, "$db": "local",
                                      "payload": Binary(client.get_client_first().encode()),
                                      "options": {"skipEmptyExchange": True}}, raw=False)
        if not reply.get("ok"):
            raise PeerAuthFailed(f"keyfile authentication refused: {reply.get('errmsg')}")
        try:
            client.set_server_first(bytes(reply["payload"]).decode())
            final = client.get_client_final()
        except Exception as exc:
            raise PeerAuthFailed(f"keyfile authentication: {exc}") from None
        reply = await self._exchange({"saslContinue": 1, "conversationId": reply["conversationId"], "$db": "local",
                                      "payload": Binary(final.encode())}, raw=False)
        if not reply.get("ok"):
            raise PeerAuthFailed(f"keyfile authentication refused: {reply.get('errmsg')}")
        try:
            client.set_server_final(bytes(reply["payload"]).decode())
        except Exception as exc:
            raise PeerAuthFailed(f"keyfile authentication: the peer does not hold this key ({exc})") from None

    async def _exchange(self, body: Mapping[str, Any], raw: bool) -> Any:
        reader, writer = self._reader, self._writer
        assert reader is not None and writer is not None
        request_id = next(_request_ids) & 0x7FFFFFFF
        writer.write(encode_op_msg_request(body, request_id))
        await writer.drain()
        header = await reader.readexactly(HEADER.size)
        length = HEADER.unpack(header)[0]
        if not HEADER.size <= length <= MAX_MESSAGE_SIZE:
            raise ValueError(f"bad reply length {length}")
        frame = header + await reader.readexactly(length - HEADER.size)
        response_to, reply = decode_raw_reply(frame) if raw else decode_reply(frame)
        if response_to != request_id:
            raise ValueError(f"reply to request {response_to}, expected {request_id}")
        return reply

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
        self._reader = self._writer = None
