"""Serving part files to the replicas that fetch them (ClickHouse's interserver `DataPartsExchange`).

`GET /parts/<db>.<table>/<part>/<file>` on the member's HTTP port answers one file of
a published part: `<file>` is one of the part's own files (`data.parquet`,
`columns.txt`, `checksums.txt`), `<part>` must parse as a part name and `<db>.<table>`
must be a parts table of this member. Anything else - a path that would leave the
part directory, a temporary part, an unknown table - is 400 or 404, never a file.
The fetcher (`sync.part_fetch`) checks every byte against the checksums the part
log recorded when the part was committed, so a member serving a damaged copy is
found out, not believed; and a member checks its copy before it sends a byte of it (hashed again
when its files changed since they were last verified): a damaged copy is answered 404, set aside
and fetched again.
"""

from __future__ import annotations

import asyncio
import os
from typing import TYPE_CHECKING

from aiohttp import web

from base.errors import MongoError
from oplog.parts import part_files, shared_storage
from oplog.parts.part_info import PartInfo
from replset.parts.names import table_dir, tables_ns

if TYPE_CHECKING:
    from replset.node import Node

ROUTE = "/parts/{ns}/{part}/{file}"
SHARED_CHUNK = 1 << 20


def part_file_path(node: Node, ns: str, part: str, file: str) -> str:
    """The file a request names, or a MongoError saying why it names none (BadValue / NamespaceNotFound)."""
    db, _, table = ns.partition(".")
    if not db or not table or "/" in ns or "\\" in ns or ".." in ns:
        raise MongoError(2, f"{ns!r} is not a table namespace")
    if node.store.reader.get(tables_ns(db), table) is None:
        raise MongoError(26, f"parts table {ns} not found")
    PartInfo.parse(part)
    part_files.check_file_name(file)
    return os.path.join(table_dir(node.options.dbpath, ns), part, file)


def add_routes(app: web.Application, node: Node) -> None:
    async def serve(request: web.Request) -> web.StreamResponse:
        try:
            path = part_file_path(node, request.match_info["ns"], request.match_info["part"],
                                  request.match_info["file"])
        except MongoError as exc:
            raise web.HTTPNotFound(text=exc.errmsg) if exc.code == 26 else web.HTTPBadRequest(text=exc.errmsg)
        shared = None
        if not os.path.isfile(path):
            if os.path.basename(path) == part_files.DATA_FILE:   # a zero-copy part's: in the shared storage
                shared = await asyncio.to_thread(_shared_location, os.path.dirname(path))
            if shared is None:
                raise web.HTTPNotFound(text=f"this member has no {request.match_info['part']}")
        ns, part = request.match_info["ns"], request.match_info["part"]
        why = await asyncio.to_thread(node.parts.damage_for_serving, ns, part)
        if why is not None:   # set aside and fetched again here; the fetcher goes to another replica
            raise web.HTTPNotFound(text=f"this member's copy of {part} is damaged ({why})")
        if shared is not None:
            return await _stream_shared(request, *shared)
        return web.FileResponse(path, headers={"Content-Type": "application/octet-stream"})

    app.router.add_get(ROUTE, serve)


def _shared_location(part_dir: str) -> tuple[str, str] | None:
    try:
        return part_files.shared_location(part_dir)
    except MongoError:
        return None


async def _stream_shared(request: web.Request, url: str, key: str) -> web.StreamResponse:
    """A zero-copy part's data file, read from the shared storage as it is sent (a member that cannot reach
    the storage fetches it whole from one that can: `PartsManager._adopt_shared`)."""
    storage = shared_storage.for_url(url)
    try:
        size = await asyncio.to_thread(storage.file_size, key, part_files.DATA_FILE)
        source = await asyncio.to_thread(storage.open_file, key, part_files.DATA_FILE)
    except (OSError, MongoError) as exc:
        raise web.HTTPServiceUnavailable(text=f"the shared storage did not answer: {exc}") from None
    try:
        response = web.StreamResponse(headers={"Content-Type": "application/octet-stream",
                                               "Content-Length": str(size)})
        await response.prepare(request)
        while chunk := await asyncio.to_thread(source.read, SHARED_CHUNK):
            await response.write(chunk)
        await response.write_eof()
        return response
    finally:
        source.close()
