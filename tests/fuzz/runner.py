"""Sends fuzz cases at a running member and checks every outcome.

Connections are reused across cases (a driver's pool does the same); one is
replaced only when a case expects the member to close it. Each chunk of cases is
spread over the connections in order, then the member's health is checked: it
is alive, and a `ping` on a fresh connection answers within PING_BOUND_S.
Every outcome is counted; a surprise (a reply that is late, malformed or answers
the wrong request, a connection closed after a framed message, a framing error
left open) is recorded with the case that caused it.
"""

from __future__ import annotations

import asyncio
import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import bson

from base.codec import OP_MSG, OP_QUERY, OP_REPLY, encode_op_msg_request
from tests.fuzz.cases import Case, CaseFactory, Expect
from tests.fuzz.http_cases import HttpCase, next_http_case

REPLY_BOUND_S = 10.0  # some commands do real work (index builds, 8 MB inserts): generous, but bounded
CLOSE_BOUND_S = 5.0
PING_BOUND_S = 2.0
HTTP_BOUND_S = 5.0
MAX_NOTES = 20


@dataclass
class Stats:
    sent: int = 0
    replies: int = 0
    ok_replies: int = 0  # ok: 1 (the rest are error replies): how far past validation the cases got
    silent: int = 0
    closed_by_server: int = 0  # expected: the bytes could not be framed
    unexpected_closes: int = 0  # a framed message, and the member closed the connection
    hangs: int = 0
    bad_replies: int = 0
    crashes: int = 0
    health_failures: int = 0
    http_sent: int = 0
    http_hangs: int = 0
    http_failures: int = 0
    handler_errors: dict[str, str] = field(default_factory=dict)  # "command: error" -> reproducer
    notes: list[str] = field(default_factory=list)
    kinds: dict[str, int] = field(default_factory=dict)

    def note(self, what: str, case: Case | None = None) -> None:
        if len(self.notes) < MAX_NOTES:
            detail = f" case={case.kind} request={case.request_id} command={_short(case.command)} " \
                     f"bytes={case.data[:120]!r}" if case is not None else ""
            self.notes.append(what + detail)

    @property
    def failures(self) -> int:
        return (self.unexpected_closes + self.hangs + self.bad_replies + self.crashes + self.health_failures
                + self.http_hangs + self.http_failures)


def _short(doc: Any, limit: int = 400) -> str:
    text = repr(doc)
    return text if len(text) <= limit else text[:limit] + "..."


class _Conn:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    def close(self) -> None:
        self.writer.transport.abort()


async def _read_frame(reader: asyncio.StreamReader) -> bytes:
    header = await reader.readexactly(16)
    (length,) = struct.unpack_from("<i", header)
    if not 16 <= length <= 48_000_000:
        raise ValueError(f"reply length {length}")
    return header + await reader.readexactly(length - 16)


def check_reply(case: Case, reply: bytes) -> tuple[str | None, dict[str, Any] | None]:
    """(problem, body): a correct reply is OP_MSG (OP_REPLY for OP_QUERY), answers this request, has flag
    bits 0, one kind-0 section, and a document with `ok`."""
    _length, _rid, response_to, opcode = struct.unpack_from("<iiii", reply)
    request_opcode = struct.unpack_from("<i", case.data, 12)[0]
    if response_to != case.request_id:
        return f"reply answers request {response_to}, not {case.request_id}", None
    if opcode == OP_MSG:
        if struct.unpack_from("<I", reply, 16)[0] != 0 or reply[20] != 0:
            return "OP_MSG reply flag bits or section kind are not 0", None
        doc_bytes = reply[21:]
    elif opcode == OP_REPLY and request_opcode == OP_QUERY:
        doc_bytes = reply[36:]
    else:
        return f"reply opcode {opcode} for request opcode {request_opcode}", None
    try:
        body = bson.decode(doc_bytes)
    except Exception as exc:
        return f"reply body is not one BSON document: {exc}", None
    if "ok" not in body:
        return "reply has no ok field", body
    return None, body


class Runner:
    def __init__(self, port: int, http_port: int, factory: CaseFactory, *, connections: int,
                 alive: Callable[[], bool]) -> None:
        self.port, self.http_port = port, http_port
        self.factory = factory
        self.stats = Stats()
        self._conns: list[_Conn | None] = [None] * connections
        self._alive = alive

    async def _connect(self, port: int) -> _Conn:
        reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), CLOSE_BOUND_S)
        return _Conn(reader, writer)

    async def run_chunk(self, cases: list[Case], http_cases: list[HttpCase]) -> None:
        n = len(self._conns)
        lanes = [self._lane(i, cases[i::n]) for i in range(n)]
        await asyncio.gather(*lanes, self._http_lane(http_cases))
        await self.check_health()

    async def _lane(self, index: int, cases: list[Case]) -> None:
        for case in cases:
            if not self._alive():
                return
            conn = self._conns[index]
            if conn is None:
                conn = self._conns[index] = await self._connect(self.port)
            self.stats.sent += 1
            self.stats.kinds[case.kind] = self.stats.kinds.get(case.kind, 0) + 1
            keep = await self._send_one(conn, case)
            if not keep:
                conn.close()
                self._conns[index] = None

    async def _send_one(self, conn: _Conn, case: Case) -> bool:
        """Sends one case and checks the outcome; False when the connection is no longer usable."""
        stats = self.stats
        try:
            conn.writer.write(case.data)
            if case.kind == "truncated":
                conn.writer.write_eof()
            async with asyncio.timeout(REPLY_BOUND_S):
                await conn.writer.drain()
        except (ConnectionError, TimeoutError):
            if case.expect is Expect.CLOSE:
                stats.closed_by_server += 1
                return False
            stats.unexpected_closes += 1
            stats.note("connection closed while sending a framed message", case)
            return False
        match case.expect:
            case Expect.SILENT:
                stats.silent += 1
                return True
            case Expect.CLOSE:
                return await self._expect_close(conn, case)
            case Expect.REPLY:
                return await self._expect_reply(conn, case)

    async def _expect_close(self, conn: _Conn, case: Case) -> bool:
        try:
            async with asyncio.timeout(CLOSE_BOUND_S):
                data = await conn.reader.read(65536)
                while data:  # replies to earlier silent cases may not exist; anything here is a surprise
                    self.stats.bad_replies += 1
                    self.stats.note("data after an unframeable message", case)
                    data = await conn.reader.read(65536)
        except ConnectionError:
            pass
        except TimeoutError:
            self.stats.hangs += 1
            self.stats.note("an unframeable message did not close the connection", case)
            return False
        self.stats.closed_by_server += 1
        return False

    async def _expect_reply(self, conn: _Conn, case: Case) -> bool:
        stats = self.stats
        try:
            async with asyncio.timeout(REPLY_BOUND_S):
                reply = await _read_frame(conn.reader)
        except TimeoutError:
            stats.hangs += 1
            stats.note(f"no reply within {REPLY_BOUND_S} s", case)
            return False
        except (ConnectionError, asyncio.IncompleteReadError):
            stats.unexpected_closes += 1
            stats.note("the member closed the connection after a framed message", case)
            return False
        except ValueError as exc:
            stats.bad_replies += 1
            stats.note(str(exc), case)
            return False
        stats.replies += 1
        problem, body = check_reply(case, reply)
        if problem is not None:
            stats.bad_replies += 1
            stats.note(problem, case)
            return False
        assert body is not None
        if body.get("ok") == 1:
            stats.ok_replies += 1
        errmsg = str(body.get("errmsg", ""))
        if body.get("code") == 1 and "internal error" in errmsg:
            key = errmsg.split(":", 1)[0] + ": " + errmsg.split(":", 1)[-1].strip().split("(", 1)[0]
            stats.handler_errors.setdefault(key, f"{_short(case.command, 600)} -> {errmsg[:300]}")
        return True

    async def _http_lane(self, cases: list[HttpCase]) -> None:
        for case in cases:
            if not self._alive():
                return
            self.stats.http_sent += 1
            await self._http_one(case)

    async def _http_one(self, case: HttpCase) -> None:
        response = b""
        try:
            conn = await self._connect(self.http_port)
        except (OSError, TimeoutError):
            self.stats.http_failures += 1
            self.stats.note(f"cannot connect to the HTTP port for {case.data[:80]!r}")
            return
        try:
            conn.writer.write(case.data)
            if not case.must_succeed:  # a well-formed request says Connection: close instead
                conn.writer.write_eof()
            async with asyncio.timeout(HTTP_BOUND_S):
                while chunk := await conn.reader.read(65536):
                    response += chunk
        except ConnectionError:
            pass
        except TimeoutError:
            self.stats.http_hangs += 1
            self.stats.note(f"HTTP request got neither a response nor a close: {case.data[:80]!r}")
        finally:
            conn.close()
        if case.must_succeed and not response.startswith(b"HTTP/1.1 200"):
            self.stats.http_failures += 1
            self.stats.note(f"HTTP status page did not answer 200: {case.data[:80]!r} -> {response[:120]!r}")

    async def check_health(self) -> None:
        if not self._alive():
            self.stats.crashes += 1
            return
        try:
            conn = await self._connect(self.port)
            try:
                conn.writer.write(encode_op_msg_request({"ping": 1, "$db": "admin"}, 7))
                async with asyncio.timeout(PING_BOUND_S):
                    reply = await _read_frame(conn.reader)
            finally:
                conn.close()
            if bson.decode(reply[21:]).get("ok") != 1.0:
                raise ValueError("ping did not answer ok: 1")
        except (OSError, TimeoutError, ValueError, asyncio.IncompleteReadError) as exc:
            self.stats.health_failures += 1
            self.stats.note(f"health check: ping on a fresh connection failed: {exc!r}")

    def close(self) -> None:
        for conn in self._conns:
            if conn is not None:
                conn.close()
        self._conns = [None] * len(self._conns)


async def run(runner: Runner, count: int, chunk: int, http_every: int, http_rng: Any,
              progress: Callable[[int], None] | None = None) -> Stats:
    done = 0
    while done < count and runner.stats.crashes == 0:
        size = min(chunk, count - done)
        cases = [runner.factory.big(done // 25_000) if (done + i) % 25_000 == 12_345 else
                 runner.factory.next_case() for i in range(size)]
        http_cases = [next_http_case(http_rng) for _ in range(size // http_every)]
        await runner.run_chunk(cases, http_cases)
        done += size
        if progress is not None:
            progress(done)
    runner.close()
    return runner.stats
