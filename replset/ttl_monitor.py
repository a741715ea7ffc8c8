"""The TTL monitor: on the primary, every `ttlMonitorSleepSecs` (60, as mongod; `setParameter`
changes it), deletes the documents TTL indexes have expired (`oplog/ttl.py`), through ordinary
delete entries, so secondaries, rollback and change streams see ordinary deletes. Finding them is a
scan on the query pool; each delete is checked again in its write transaction (a document updated
meanwhile to a later date stays). On every member, the same pass lets go of change-stream
pre-images whose entries have left the oplog (oplog/preimages.py)."""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

from bson.timestamp import Timestamp

from base.errors import MongoError
from oplog import preimages
from oplog.clustered import expired_clustered_filter
from oplog.preimages import PREIMAGES_NS
from oplog.query import compile_filter
from oplog.timeseries import expired_buckets_filter
from oplog.ttl import expired_filter
from oplog.writes import WriteEnv, delete_documents

if TYPE_CHECKING:
    from replset.node import Node

log = logging.getLogger(__name__)

SLEEP_S = 60.0
DELETE_SLICE = 64  # deletes per group commit


class TTLMonitor:
    def __init__(self, node: Node, *, sleep_s: float = SLEEP_S) -> None:
        self._node = node
        self.sleep_s = sleep_s
        self.enabled = True
        self.passes = 0
        self.deleted = 0
        self._task: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    def settings_changed(self) -> None:
        """A new sleep time applies from now, not after the current sleep."""
        self._wake.set()

    async def _run(self) -> None:
        while True:
            try:
                async with asyncio.timeout(self.sleep_s):
                    await self._wake.wait()
            except TimeoutError:
                pass
            if self._wake.is_set():
                self._wake.clear()
                continue
            node = self._node
            if node.shutting_down:
                continue
            try:
                await self.prune_preimages()
            except MongoError as err:
                log.info("pre-image clean-up stopped: %s", err.errmsg)
            if not (self.enabled and node.is_primary):
                continue
            try:
                self.deleted += await self.pass_once()
                self.passes += 1
            except MongoError as err:  # the member stepped down mid-pass, or was stopping
                log.info("TTL pass stopped: %s", err.errmsg)
            except Exception:
                log.exception("TTL pass failed")

    async def pass_once(self) -> int:
        """One pass over every TTL index; returns how many documents it deleted."""
        node = self._node
        reader = node.store.reader
        deleted = 0
        for info in reader.collections():
            if info.ns.startswith("local."):
                continue
            for index in reader.indexes(info.ns):
                expired = expired_filter(index.spec, node.now())
                if expired is not None:
                    deleted += await self._delete_expired(info.ns, expired)
            # A time-series collection's buckets, a clustered collection's documents by _id:
            for expired in (expired_buckets_filter(info.options, node.now()),
                            expired_clustered_filter(info.options, node.now())):
                if expired is not None:
                    deleted += await self._delete_expired(info.ns, expired)
        return deleted

    async def prune_preimages(self) -> int:
        """On every member: lets go of the change-stream pre-images whose entries left the oplog
        (they are this member's own, never logged, so each member prunes its own)."""
        node = self._node
        oldest_key = node.store.reader.oplog_oldest_key()
        if oldest_key is None or node.store.reader.collection(PREIMAGES_NS) is None:
            return 0
        oldest = Timestamp(oldest_key >> 32, oldest_key & 0xFFFFFFFF)

        def find() -> list[Any]:
            return [doc["_id"] for doc in node.store.thread_reader().scan(PREIMAGES_NS)
                    if preimages.expired_before(doc, oldest)]

        ids = await node.queries.run(find)
        for start in range(0, len(ids), DELETE_SLICE):
            chunk = ids[start:start + DELETE_SLICE]

            def delete(env: WriteEnv, chunk: list[Any] = chunk) -> None:
                for id_value in chunk:
                    env.txn.delete(PREIMAGES_NS, id_value)

            await node.submit_write(delete, require_primary=False, durable=False)
        return len(ids)

    async def _delete_expired(self, ns: str, expired: dict[str, Any]) -> int:
        node = self._node
        matcher = compile_filter(expired)

        def find() -> list[Any]:
            return [doc["_id"] for doc in node.store.thread_reader().scan(ns) if matcher.matches(doc)]

        ids = await node.queries.run(find)
        deleted = 0
        for start in range(0, len(ids), DELETE_SLICE):
            statements = [{"q": {"_id": id_value, **expired}, "limit": 1}
                          for id_value in ids[start:start + DELETE_SLICE]]

            def delete(env: WriteEnv, statements: list[dict[str, Any]] = statements) -> int:
                return delete_documents(env, ns, statements, ordered=False).n

            deleted += await node.submit_write(delete, durable=False)
        return deleted
