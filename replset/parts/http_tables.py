"""A parts table on a member's HTTP port: `POST /tables/<db>.<table>/insert` (ClickHouse's HTTP interface
for inserts), and the views `GET /tables/<db>.<table>/parts` and `/replication_queue` (the
`partsStatus` and `partsReplicationQueue` commands' rows, as JSON).

The body is either an Arrow IPC stream (`Content-Type: application/vnd.apache.arrow.stream`) or
JSON lines, one row per line, in MongoDB Extended JSON so dates and 64-bit integers keep their types
(anything else). It may be far larger than aiohttp's 1 MiB default: it is read as a stream, up to
`MAX_BODY_BYTES` (413 past that), and decoded off the event loop once the table is known to exist,
within the member's `--maxDecodedBlockBytes` (413, BSONObjectTooLarge 10334, past it:
`replset.parts.payload`). Query parameters are the `insertBlock` command's: `insertQuorum`,
`quorumTimeoutMS`, `dedupToken`, and `w` / `wtimeoutMS` for the commit's write concern
(`w: "majority"` unless given).

Bodies being read share one budget of `INSERT_BUFFER_BYTES` (a member must not buffer as many
gigabyte bodies as clients send at once): a request that says its length waits up to
`BUFFER_WAIT_S` for room before it is read; a chunked one takes room as its chunks arrive. No room:
503 with ExceededMemoryLimit (146), to be sent again later.

The reply is the `insertBlock` reply as relaxed Extended JSON; an error is MongoDB's error document
with status 400 (bad input), 404 (no such table), 413 (decodes past the limit) or 503 (no primary to
commit through, shutting down, or no room to buffer the body), so a client can tell what to retry.
"""

from __future__ import annotations

import asyncio
import inspect
from typing import TYPE_CHECKING, Any

from aiohttp import web
from bson import json_util

from base.errors import RETRYABLE_CODES, MongoError
from oplog.parts.block_size import BSON_OBJECT_TOO_LARGE
from replset.parts.commit import QUORUM_TIMEOUT_MS, check_takes_inserts, insert_rows, parse_quorum
from replset.parts.insert import load_table
from replset.parts.payload import decode_block
from replset.parts.views import parts_status, replication_queue
from replset.write_concern import MAJORITY, parse_write_concern

if TYPE_CHECKING:
    from replset.node import Node

ROUTE = "/tables/{ns}/insert"
ARROW_STREAM = "application/vnd.apache.arrow.stream"
MAX_BODY_BYTES = 1 << 30
INSERT_BUFFER_BYTES = 2 << 30   # every insert body being read or decoded on this member, together
BUFFER_WAIT_S = 30.0
EXCEEDED_MEMORY_LIMIT = 146
_JSON_OPTIONS = json_util.RELAXED_JSON_OPTIONS


def _reply(doc: dict[str, Any], status: int = 200) -> web.Response:
    return web.Response(text=json_util.dumps(doc, json_options=_JSON_OPTIONS), status=status,
                        content_type="application/json")


def _error(exc: MongoError) -> web.Response:
    retry_later = exc.code in RETRYABLE_CODES or exc.code == EXCEEDED_MEMORY_LIMIT
    status = 404 if exc.code == 26 else 503 if retry_later else 413 if exc.code == BSON_OBJECT_TOO_LARGE else 400
    return _reply(exc.to_document(), status)


class BodyBudget:
    """The bytes of insert bodies this member holds at once."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.used = 0
        self._freed = asyncio.Condition()

    def take_now(self, n: int) -> None:
        if self.used + n > self.capacity:
            raise MongoError(EXCEEDED_MEMORY_LIMIT, f"this member holds {self.used} bytes of insert bodies "
                                                    f"already (at most {self.capacity}): send it again later")
        self.used += n

    async def take(self, n: int, wait_s: float) -> None:
        async with self._freed:
            try:
                await asyncio.wait_for(self._freed.wait_for(lambda: self.used + n <= self.capacity), wait_s)
            except TimeoutError:
                pass
        self.take_now(n)

    async def give_back(self, n: int) -> None:
        self.used -= n
        async with self._freed:
            self._freed.notify_all()


def _int_param(query: Any, name: str, default: int) -> int:
    raw = query.get(name)
    if raw is None:
        return default
    try:
        return int(raw)
    except ValueError:
        raise MongoError(2, f"{name} must be an integer, not {raw!r}") from None


def _insert_options(node: Node, query: Any) -> dict[str, Any]:
    raw_quorum = query.get("insertQuorum", "0")
    quorum = parse_quorum(raw_quorum if raw_quorum == MAJORITY else _int_param(query, "insertQuorum", 0),
                          node.config)
    w: Any = query.get("w", MAJORITY)
    if w != MAJORITY:
        w = _int_param(query, "w", 1)
    return {"wc": parse_write_concern({"w": w, "wtimeout": _int_param(query, "wtimeoutMS", 0)}),
            "dedup_token": query.get("dedupToken"), "quorum": quorum,
            "quorum_timeout_ms": _int_param(query, "quorumTimeoutMS", QUORUM_TIMEOUT_MS)}


async def _read_body(request: web.Request, budget: BodyBudget) -> tuple[bytes, int]:
    """The body, and how much of `budget` it took (the caller gives it back)."""
    declared = request.content_length
    if declared is not None and declared > MAX_BODY_BYTES:
        raise web.HTTPRequestEntityTooLarge(max_size=MAX_BODY_BYTES, actual_size=declared)
    taken = 0
    if declared:
        await budget.take(declared, BUFFER_WAIT_S)
        taken = declared
    chunks, size = [], 0
    try:
        async for chunk in request.content.iter_chunked(1 << 20):
            size += len(chunk)
            if size > MAX_BODY_BYTES:
                raise web.HTTPRequestEntityTooLarge(max_size=MAX_BODY_BYTES, actual_size=size)
            if size > taken:
                budget.take_now(size - taken)
                taken = size
            chunks.append(chunk)
    except BaseException:
        await budget.give_back(taken)
        raise
    return b"".join(chunks), taken


def add_routes(app: web.Application, node: Node, *, buffer_bytes: int = INSERT_BUFFER_BYTES) -> None:
    budget = BodyBudget(buffer_bytes)

    async def insert(request: web.Request) -> web.Response:
        db, _, table = request.match_info["ns"].partition(".")
        try:
            if not db or not table:
                raise MongoError(2, f"{request.match_info['ns']!r} is not <db>.<table>")
            options = _insert_options(node, request.query)
            check_takes_inserts(node)
            load_table(node.store.reader, db, table)   # 404 before the body is read
            body, taken = await _read_body(request, budget)
            try:
                arrow = request.content_type == ARROW_STREAM
                data = await decode_block(node, db, table, arrow=body if arrow else None,
                                          json_lines=None if arrow else body, what=f"insert into {db}.{table}")
            finally:
                del body
                await budget.give_back(taken)
            return _reply(await insert_rows(node, db, table, data, **options))
        except MongoError as exc:
            return _error(exc)

    def view(rows_of: Any, key: str) -> Any:
        async def handler(request: web.Request) -> web.Response:
            db, _, name = request.match_info["ns"].partition(".")
            try:
                table = load_table(node.store.reader, db, name)
            except MongoError as exc:
                return _error(exc)
            rows = rows_of(node, table)
            return _reply({key: await rows if inspect.isawaitable(rows) else rows, "ok": 1.0})
        return handler

    app.router.add_post(ROUTE, insert)
    app.router.add_get("/tables/{ns}/parts", view(parts_status, "parts"))
    app.router.add_get("/tables/{ns}/replication_queue", view(replication_queue, "queue"))
