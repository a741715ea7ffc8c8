"""Fetching a part from a replica that has it (ClickHouse's `fetchPart`), every byte checked.

The part's files are streamed from the source's HTTP port (`replset.parts.exchange`)
into `tmp-fetch_<part>_<n>` under the table's directory; each file's size and SHA-256
must equal what the part log recorded when the part was committed, or the fetch
fails and leaves nothing behind. Then the directory is fsynced and renamed to the
part's name. `checksums.txt` is not fetched: it is written from the part log's
checksums, which the fetched files matched. A source that sends nothing for `progress_timeout_s` is abandoned
(`FetchFailed`): the queue runner postpones the task and tries another replica. With a keyfile each request
carries its own token (`auth`: made for its method and path just before it is sent, good once;
replset/auth/member_token.py).
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import os
import shutil
from collections.abc import Callable, Mapping
from typing import Any, BinaryIO

import aiohttp
import yarl

from base.errors import MongoError
from oplog.durable_files import fsync_path
from oplog.parts import part_files

CHUNK = 4 << 20
PROGRESS_TIMEOUT_S = 30.0
_fetch_names = itertools.count(1)
RequestAuth = Callable[[str, str], Mapping[str, str]]   # (method, path) -> the headers that prove the sender


class FetchFailed(Exception):
    """The part could not be fetched from this source; nothing was left on disk."""


class PartMissing(FetchFailed):
    """The source answered that it does not have the part (HTTP 404): its registration is stale."""


def _hash_and_write(f: BinaryIO, sha: Any, chunk: bytes) -> None:
    sha.update(chunk)
    f.write(chunk)


async def _download(session: aiohttp.ClientSession, url: str, path: str, expected: tuple[int, str],
                    progress_timeout_s: float, auth: RequestAuth | None) -> None:
    size, digest = expected
    sha, received = hashlib.sha256(), 0
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=progress_timeout_s, sock_read=progress_timeout_s)
    headers = None if auth is None else auth("GET", yarl.URL(url).path)   # the path as the member reads it
    try:
        async with session.get(url, timeout=timeout, headers=headers) as response:
            if response.status == 404:
                raise PartMissing(f"{url}: HTTP 404 {(await response.text())[:200]}")
            if response.status != 200:
                raise FetchFailed(f"{url}: HTTP {response.status} {(await response.text())[:200]}")
            with open(path, "wb") as f:
                # Each chunk is hashed and written off the loop while the next one arrives (one at a time,
                # in order): the network, the hash and the disk overlap.
                writing: asyncio.Future[None] | None = None
                try:
                    async for chunk in response.content.iter_chunked(CHUNK):
                        received += len(chunk)
                        if received > size:
                            raise FetchFailed(f"{url}: more than the {size} bytes the part log recorded")
                        if writing is not None:
                            await writing
                        writing = asyncio.ensure_future(asyncio.to_thread(_hash_and_write, f, sha, chunk))
                    if writing is not None:
                        await writing
                finally:
                    if writing is not None and not writing.done():
                        await asyncio.wait([writing])   # the file stays open until its last write ends
                await asyncio.to_thread(lambda: (f.flush(), os.fsync(f.fileno())))
    except (aiohttp.ClientError, TimeoutError) as exc:
        raise FetchFailed(f"{url}: {exc or type(exc).__name__}") from None
    if (received, sha.hexdigest()) != (size, digest):
        raise FetchFailed(f"{url}: {received} bytes with SHA-256 {sha.hexdigest()[:12]}..., the part log "
                          f"recorded {size} bytes with {digest[:12]}...")


async def fetch_part(session: aiohttp.ClientSession, source_http: str, ns: str, part: str,
                     checksums: Mapping[str, tuple[int, str]], directory: str, *,
                     progress_timeout_s: float = PROGRESS_TIMEOUT_S, scheme: str = "http",
                     auth: RequestAuth | None = None) -> str:
    """Fetches `part` of table `ns` from the member whose HTTP address is `source_http` ("host:port")
    into `directory`; `checksums` (file -> (size, sha256)) are the part log's; `scheme` "https" with
    TLS on (the session then carries the context that checks the member's certificate); `auth` the
    headers of each request (a member's token), if any. Returns the part's path."""
    part_files.check_part_dir_name(part)
    files = sorted(part_files.check_file_name(name) for name in checksums if name != part_files.CHECKSUMS_FILE)
    if part_files.DATA_FILE not in files:
        raise MongoError(2, f"the part log records no {part_files.DATA_FILE} for {part}")
    tmp_name = f"{part_files.TMP_FETCH}{part}_{os.getpid()}_{next(_fetch_names)}"
    tmp = os.path.join(directory, tmp_name)
    await asyncio.to_thread(os.makedirs, tmp)
    try:
        for name in files:
            await _download(session, f"{scheme}://{source_http}/parts/{ns}/{part}/{name}", os.path.join(tmp, name),
                            checksums[name], progress_timeout_s, auth)
        await asyncio.to_thread(part_files.write_checksums, tmp, {name: checksums[name] for name in files})
        await asyncio.to_thread(fsync_path, tmp)
        await asyncio.to_thread(part_files.publish, directory, tmp_name, part)
    except BaseException:
        await asyncio.to_thread(shutil.rmtree, tmp, True)
        raise
    return os.path.join(directory, part)
