"""HTTP endpoints on port+1000 (aiohttp): `/replSetGetStatus`, `/hello`, `/health`, the part files
replicas fetch (`/parts/<db>.<table>/<part>/<file>`, `replset.parts.exchange`) and inserts into parts
tables (`POST /tables/<db>.<table>/insert`, `replset.parts.http_tables`).

Documents are rendered as MongoDB Extended JSON (relaxed), so optimes, dates and
ObjectIds stay readable to operators and tools. `/health` also shows the wire
server's connection counts (clients, members, refused under --maxConns), which
tests wait on instead of sleeping.
"""

from __future__ import annotations

import json
import logging
import math
import pathlib
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, cast

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from bson import json_util
from prometheus_client.aiohttp import make_aiohttp_handler

from base.errors import MongoError
from base.scram import SHA256
from replset.auth.http_auth import HttpAuth, lookup, mirrored_command, user_grants
from replset.auth.password_checks import PasswordChecks
from replset.auth.privileges import authorize
from replset.parts.exchange import add_routes as add_part_routes
from replset.parts.http_tables import add_routes as add_table_routes
from replset.status import replset_status

if TYPE_CHECKING:
    from replset.node import Node

NODE_KEY: web.AppKey[Node] = web.AppKey("node")
ConnectionStats = Callable[[], dict[str, int]]
CONNECTIONS_KEY: web.AppKey[ConnectionStats] = web.AppKey("connections", ConnectionStats)
_JSON_OPTIONS = json_util.RELAXED_JSON_OPTIONS


def _json_response(doc: dict[str, Any], status: int = 200) -> web.Response:
    body = json_util.dumps(doc, json_options=_JSON_OPTIONS)
    return web.Response(text=body, status=status, content_type="application/json")


def _status_document(node: Node) -> dict[str, Any]:
    """`replSetGetStatus`, or its error (94) before the member has a configuration."""
    if node.config is None:
        return MongoError(94, "no replset config has been received").to_document()
    return replset_status(node.status_view()) | {"ok": 1.0}


async def _status(request: web.Request) -> web.Response:
    doc = _status_document(request.app[NODE_KEY])
    return _json_response(doc, 200 if doc["ok"] else 503)


async def _hello(request: web.Request) -> web.Response:
    from base.hello import build_hello

    node = request.app[NODE_KEY]
    return _json_response(build_hello(node.hello_view(0), legacy=False, hello_ok=False,
                                      with_topology_version=False))


async def _hops(request: web.Request) -> web.Response:
    """The write path's hop marks so far (`replset.hops`), then forgotten; 404 unless tracing is on."""
    hops = request.app[NODE_KEY].hops
    if not hops.enabled:
        return _json_response({"ok": 0, "errmsg": "hop tracing is off (REPLSET_TRACE_HOPS=1 turns it on)"}, 404)
    return web.Response(text=json.dumps({"marks": hops.take()}), content_type="application/json")


async def _health(request: web.Request) -> web.Response:
    node = request.app[NODE_KEY]
    body: dict[str, Any] = {"ok": not node.shutting_down, "state": node.state.name}
    connections = request.app.get(CONNECTIONS_KEY)
    if connections is not None:
        body["connections"] = connections()
    return web.Response(text=json.dumps(body), status=200 if body["ok"] else 503,
                        content_type="application/json")


def _auth_middleware(node: Node) -> Any:
    """With auth on: a user (HTTP Basic) or a member's token on every route but `/health`
    (replset/auth/http_auth.py); 401 without, 403 without the privilege."""
    checker = HttpAuth(node.internal_key, node.options.http_address)
    checks = PasswordChecks()

    @web.middleware
    async def middleware(request: web.Request, handler: Any) -> web.StreamResponse:
        mirrored = mirrored_command(request.method, request.path)
        if mirrored is None:
            return await handler(request)
        header = request.headers.get("Authorization", "")
        refusal = checker.member_refusal(header, request.method, request.path, node.clock.wall_ms())
        if refusal is None:
            return await handler(request)
        if refusal.signed:   # a member's token, but expired (clocks apart?) or replayed: the fetcher shows why
            return _unauthorized(f"member token refused: {refusal.reason}")
        doc = await _basic_login(node, checker, checks, request.remote or "", header)
        if isinstance(doc, web.Response):
            return doc
        try:
            authorize(*mirrored, authenticated=True, held=user_grants(doc), me=[(doc["user"], doc["db"])])
        except MongoError as refused:
            return _json_response(refused.to_document(), 403)
        return await handler(request)

    return middleware


async def _basic_login(node: Node, checker: HttpAuth, checks: PasswordChecks, source: str,
                       header: str) -> Mapping[str, Any] | web.Response:
    """The user HTTP Basic names, if the password is right; else the answer: 401, 429 to an address with
    too many failures (replset/auth/login_limit.py), 503 while too many checks are under way."""
    basic = checker.basic(header)
    if basic is None:
        return _unauthorized("authentication required")
    limit = checker.failed_logins
    wait_s = limit.retry_after(source, node.clock.monotonic())
    if wait_s is not None:
        return _retry_later(429, f"too many failed logins from {source}", wait_s)
    uid, doc = lookup(node.store.reader, basic[0])
    stored = None if doc is None else (doc.get("credentials") or {}).get(SHA256)
    if doc is not None and stored is not None and checker.remembered(uid, basic[1], node.clock.monotonic()):
        return doc
    if checks.busy():
        return _retry_later(503, "too many password checks under way", 1.0)
    right = False
    limit.begin(source)
    try:
        right = doc is not None and stored is not None and await checks.matches(stored, doc["user"], basic[1])
    finally:
        limit.end(source, failed=not right, now=node.clock.monotonic())
    if not right or doc is None:
        return _unauthorized("Authentication failed.")
    checker.remember(uid, basic[1], node.clock.monotonic())
    return doc


def _retry_later(status: int, message: str, wait_s: float) -> web.Response:
    response = _json_response(MongoError(18, message).to_document(), status)
    response.headers["Retry-After"] = str(max(1, math.ceil(wait_s)))
    return response


def _unauthorized(message: str) -> web.Response:
    response = _json_response(MongoError(18 if "failed" in message else 13, message).to_document(), 401)
    response.headers["WWW-Authenticate"] = 'Basic realm="replset"'
    return response


PAGE_DIR = pathlib.Path(__file__).parent / "page"


async def _page(request: web.Request) -> web.StreamResponse:
    return web.FileResponse(PAGE_DIR / "index.html")


async def _page_data(request: web.Request) -> web.Response:
    """What the live page draws: `replSetGetStatus`, the oplog's size and window, the elections this
    member saw."""
    node = request.app[NODE_KEY]
    status = _status_document(node)
    entries, size = node.store.oplog_totals
    window = node.oplog_window_s()
    tables = [{"table": ns, "activeParts": len(rt.queue.current), "queue": len(rt.queue.entries),
               "postponed": rt.queue.postponed()}
              for ns, rt in sorted(node.parts.tables.items())]
    return _json_response({"me": node.options.me, "status": status,
                           "oplog": {"entries": entries, "bytes": size, "windowSeconds": window},
                           "elections": list(node.elections), "partsTables": tables})


def build_app(node: Node, connections: ConnectionStats | None = None) -> web.Application:
    app = web.Application(middlewares=[_auth_middleware(node)] if node.options.auth else [])
    app[NODE_KEY] = node
    if connections is not None:
        app[CONNECTIONS_KEY] = connections
    app.router.add_get("/replSetGetStatus", _status)
    app.router.add_get("/hello", _hello)
    app.router.add_get("/health", _health)
    app.router.add_get("/hops", _hops)
    app.router.add_get("/", _page)
    app.router.add_get("/page/data", _page_data)
    app.router.add_static("/page/", PAGE_DIR)
    node.metrics.watch(node, connections)
    app.router.add_get("/metrics", make_aiohttp_handler(node.metrics.registry))
    add_part_routes(app, node)
    add_table_routes(app, node)
    return app


class _RequestErrorLog:
    """aiohttp's request handler logs every malformed request (a bad request line, a header over 8 KB, a
    port scanner's bytes) at ERROR with a traceback, then answers 400 and closes. That is the client's
    error, not ours: one INFO line without a traceback, so that the log's tracebacks stay real faults.
    Anything else (a handler raising) keeps aiohttp's ERROR and traceback."""

    def __init__(self, logger: logging.Logger) -> None:
        self._logger = logger

    def exception(self, msg: str, *args: Any, exc_info: Any = True, **kwargs: Any) -> None:
        if isinstance(exc_info, HttpProcessingError) and 400 <= exc_info.code < 500:
            self._logger.info(msg + ": %d %s", *args, exc_info.code, exc_info.message.split("\n", 1)[0])
        else:
            self._logger.exception(msg, *args, exc_info=exc_info, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._logger, name)


class HttpServer:
    def __init__(self, node: Node, connections: ConnectionStats | None = None) -> None:
        logger = cast(logging.Logger, _RequestErrorLog(logging.getLogger("aiohttp.server")))
        self._runner = web.AppRunner(build_app(node, connections), access_log=None, logger=logger)
        self._tls = node.options.tls.server_context()

    async def start(self, hosts: str | list[str] | None, port: int) -> None:
        """Listens on `hosts` (one, a list, or None for every interface)."""
        await self._runner.setup()
        for host in hosts if isinstance(hosts, list) else [hosts]:
            await web.TCPSite(self._runner, host, port, ssl_context=self._tls).start()

    async def stop(self) -> None:
        await self._runner.cleanup()
