"""Load tools for the benchmarks: a raw OP_MSG insert generator and a do-nothing OP_MSG server.

`run_load` drives N concurrent writers, each one connection with one `insert` outstanding
(as N single-threaded clients would), from worker processes of its own so the generator's
CPU is not the members' and is measured apart. Every request is the same pre-encoded
OP_MSG (one small document without `_id`: the server assigns an ObjectId), so a request
costs the generator a socket write and a reply check. A reply counts only with `ok: 1`,
`n: 1` and neither `writeErrors` nor `writeConcernError`.

`NullServer` answers the driver handshake (`hello`/`isMaster`) as a standalone and every
other command with `{n: 1, ok: 1}`, doing nothing: the ceiling a client reaches on this
machine, measured in the same run as the member.
"""

from __future__ import annotations

import asyncio
import datetime
import multiprocessing
import os
import socket
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import bson
from bson.objectid import ObjectId

from base.codec import HEADER, OP_MSG, OP_QUERY, decode_message, encode_op_msg, encode_op_reply

_HEADER_SIZE = HEADER.size
_LATENCY_SAMPLE_EVERY = 1  # every request's latency is kept (a few hundred thousand floats at most)


def insert_message(coll: str, db: str, w: int | str, pad: int = 64) -> bytes:
    """One OP_MSG `insert` of `{n: 1, pad: "x" * pad}` with write concern `w`."""
    body = {"insert": coll, "documents": [{"n": 1, "pad": "x" * pad}], "ordered": True,
            "writeConcern": {"w": w}, "$db": db}
    return encode_op_msg(body, 1, 0)


def reply_ok(body: bytes) -> bool:
    """A write reply that acknowledged its one document, with no write or write-concern error."""
    if b"writeErrors" in body or b"writeConcernError" in body:
        return False
    reply = bson.decode(body[_HEADER_SIZE + 5:])
    return bool(reply.get("ok")) and reply.get("n") == 1


@dataclass
class LoadResult:
    ok: int = 0
    errors: int = 0
    seconds: float = 0.0
    cpu_s: float = 0.0
    latencies_s: list[float] = field(default_factory=list)
    first_error: str = ""

    def merge(self, other: LoadResult) -> None:
        self.ok += other.ok
        self.errors += other.errors
        self.seconds = max(self.seconds, other.seconds)
        self.cpu_s += other.cpu_s
        self.latencies_s += other.latencies_s
        self.first_error = self.first_error or other.first_error


class _Writer(asyncio.Protocol):
    """One connection, one request outstanding; the next goes out as soon as the reply is in."""

    def __init__(self, message: bytes, deadline: float, result: LoadResult, done: asyncio.Future[None]) -> None:
        self._message = message
        self._deadline = deadline
        self._result = result
        self._done = done
        self._buffer = bytearray()
        self._sent_at = 0.0
        self._transport: asyncio.Transport | None = None

    def connection_made(self, transport: Any) -> None:
        self._transport = transport
        self._send()

    def _send(self) -> None:
        assert self._transport is not None
        self._sent_at = time.perf_counter()
        self._transport.write(self._message)

    def data_received(self, data: bytes) -> None:
        self._buffer += data
        if len(self._buffer) < 4:
            return
        (length,) = struct.unpack_from("<i", self._buffer, 0)
        if len(self._buffer) < length:
            return
        body, self._buffer = bytes(self._buffer[:length]), self._buffer[length:]
        now = time.perf_counter()
        if reply_ok(body):
            self._result.ok += 1
            self._result.latencies_s.append(now - self._sent_at)
        else:
            self._result.errors += 1
            if not self._result.first_error:
                self._result.first_error = repr(bson.decode(body[_HEADER_SIZE + 5:]))[:300]
        if now < self._deadline:
            self._send()
        elif not self._done.done():
            self._done.set_result(None)

    def connection_lost(self, exc: Exception | None) -> None:
        if not self._done.done():
            self._done.set_result(None)


async def _drive(port: int, message: bytes, writers: int, seconds: float) -> LoadResult:
    loop = asyncio.get_running_loop()
    result = LoadResult()
    started = time.perf_counter()
    deadline = started + seconds
    done: list[asyncio.Future[None]] = []
    transports = []
    for _ in range(writers):
        fut: asyncio.Future[None] = loop.create_future()
        transport, _proto = await loop.create_connection(
            lambda fut=fut: _Writer(message, deadline, result, fut), "127.0.0.1", port)
        transports.append(transport)
        done.append(fut)
    await asyncio.wait_for(asyncio.gather(*done), seconds + 60)
    result.seconds = time.perf_counter() - started
    for transport in transports:
        transport.close()
    return result


def _worker(port: int, message: bytes, writers: int, seconds: float, out: Any) -> None:
    import uvloop

    cpu = time.process_time()
    result = uvloop.run(_drive(port, message, writers, seconds))
    result.cpu_s = time.process_time() - cpu
    out.put(result)


def run_load(port: int, message: bytes, writers: int, seconds: float, processes: int = 2) -> LoadResult:
    """`writers` concurrent writers spread over `processes` worker processes, for `seconds`."""
    processes = max(1, min(processes, writers))
    ctx = multiprocessing.get_context("fork")
    out = ctx.Queue()
    shares = [writers // processes + (1 if i < writers % processes else 0) for i in range(processes)]
    procs = [ctx.Process(target=_worker, args=(port, message, n, seconds, out)) for n in shares]
    for p in procs:
        p.start()
    total = LoadResult()
    try:
        for _ in procs:
            total.merge(out.get(timeout=seconds + 120))
    finally:
        for p in procs:
            p.join(10)
            if p.is_alive():
                p.kill()
    return total


# -- the do-nothing server --------------------------------------------------------------------------

def _hello(connection_id: int) -> dict[str, Any]:
    return {"helloOk": True, "ismaster": True, "isWritablePrimary": True, "topologyVersion": {
        "processId": ObjectId(), "counter": 0}, "maxBsonObjectSize": 16 * 1024 * 1024,
        "maxMessageSizeBytes": 48_000_000, "maxWriteBatchSize": 100_000,
        "localTime": datetime.datetime.now(datetime.UTC), "logicalSessionTimeoutMinutes": 30,
        "connectionId": connection_id, "minWireVersion": 0, "maxWireVersion": 21, "readOnly": False,
        "ok": 1.0}


class _NullProtocol(asyncio.Protocol):
    connections = 0

    def __init__(self) -> None:
        _NullProtocol.connections += 1
        self._id = _NullProtocol.connections
        self._buffer = bytearray()
        self._transport: asyncio.Transport | None = None

    def connection_made(self, transport: Any) -> None:
        self._transport = transport

    def data_received(self, data: bytes) -> None:
        self._buffer += data
        while len(self._buffer) >= 16:
            (length,) = struct.unpack_from("<i", self._buffer, 0)
            if len(self._buffer) < length:
                return
            frame, self._buffer = bytes(self._buffer[:length]), self._buffer[length:]
            self._answer(frame)

    def _answer(self, frame: bytes) -> None:
        assert self._transport is not None
        request = decode_message(frame)
        opcode = HEADER.unpack_from(frame, 0)[3]
        body = request.query if opcode == OP_QUERY else request.body  # type: ignore[union-attr]
        name = next(iter(body), "").lower()
        reply = _hello(self._id) if name in ("hello", "ismaster") else {"n": 1, "ok": 1.0}
        if opcode == OP_MSG:
            self._transport.write(encode_op_msg(reply, 0, request.request_id))
        else:
            self._transport.write(encode_op_reply(reply, 0, request.request_id))


def _serve_null(sock: socket.socket) -> None:
    import uvloop

    async def main() -> None:
        server = await asyncio.get_running_loop().create_server(_NullProtocol, sock=sock)
        async with server:
            await server.serve_forever()

    uvloop.run(main())


class NullServer:
    """The do-nothing OP_MSG server, in a process of its own, on a free loopback port."""

    def __init__(self) -> None:
        self._sock = socket.socket()
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(128)
        self.port = int(self._sock.getsockname()[1])
        self._proc = multiprocessing.get_context("fork").Process(target=_serve_null, args=(self._sock,))

    def __enter__(self) -> NullServer:
        self._proc.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._proc.kill()
        self._proc.join(10)
        self._sock.close()

    @property
    def pid(self) -> int:
        return int(self._proc.pid or 0)


def proc_cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process so far (0 once it is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def timed_calls(call: Callable[[], Any], seconds: float) -> tuple[int, list[float]]:
    """Calls `call` in a loop for `seconds`; returns (calls, latencies)."""
    latencies: list[float] = []
    deadline = time.perf_counter() + seconds
    while (start := time.perf_counter()) < deadline:
        call()
        latencies.append(time.perf_counter() - start)
    return len(latencies), latencies
