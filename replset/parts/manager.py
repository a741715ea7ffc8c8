"""Every member's part-log side: a replication queue per table, fed by the part log, and its runner.

Theory of operation
-------------------
The part log is ordinary replicated documents (`replset.parts.insert`), so it
reaches every member with the oplog - applied by the fetcher on a secondary,
written by the primary itself. After each commit the manager looks at the new
oplog entries (a byte search for `.system.parts` first, so other writes cost
next to nothing) and turns each GET_PART log document into a task of that
table's `oplog.parts.queue.ReplicationQueue` (idempotently: the task is keyed
by the log document's `_id`). Applying stays synchronous and does no I/O; the
work happens here, after the commit, off the apply path.

The runner asks each queue for the tasks that may run (`next_to_run`, with
ClickHouse's postponement reasons), and carries them out: a part this member
already has needs nothing; otherwise it is fetched from the member that
inserted it (`sync.part_fetch`: every byte checked against the log's
checksums). A failed fetch stays queued and backs off; the queue view says why.

When the history is replaced (a rollback, an initial sync) or the oplog was
trimmed past what the manager had seen, it rebuilds everything from the state
collections and the parts on disk, as at start-up: the queue is derived state.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import aiohttp
import bson

from base.errors import MongoError
from oplog.codec_options import DOC_OPTIONS
from oplog.parts import part_files
from oplog.parts.part_info import PartInfo
from oplog.parts.queue import EntryType, QueueEntry, ReplicationQueue
from oplog.parts.table import TableDef
from replset.parts.names import PART_LOG, state_ns, table_dir
from replset.pulse import Pulse
from sync.part_fetch import FetchFailed, fetch_part

if TYPE_CHECKING:
    from replset.node import Node

log = logging.getLogger(__name__)

MARKER = f".{PART_LOG}".encode()
PULL_CHUNK = 1000
RETRY_S = 1.0          # the runner looks again at least this often (backed-off tasks)


def _now_ms() -> int:
    return int(time.monotonic() * 1000)


@dataclass(slots=True)
class TableRuntime:
    table: TableDef
    directory: str
    queue: ReplicationQueue
    docs: dict[str, dict[str, Any]] = field(default_factory=dict)   # queued log documents by _id


def local_parts(directory: str, *, at_start_up: bool) -> list[PartInfo]:
    """The published parts in a table's directory. At start-up, the temporary parts a crash left are
    removed first; a later rebuild must not: an insert or a fetch may be writing one right now."""
    if at_start_up:
        part_files.remove_temporary(directory)
    parts = []
    for name in sorted(os.listdir(directory)) if os.path.isdir(directory) else []:
        try:
            parts.append(PartInfo.parse(name))
        except MongoError:
            continue   # not a part (moved aside, or foreign): left alone
    return parts


class PartsManager:
    def __init__(self, node: Node) -> None:
        self.node = node
        self.tables: dict[str, TableRuntime] = {}
        self._wake = Pulse()
        self._dirty = False
        self._rescan = True
        self._seen_key = 0
        self._started_up = False   # the first load cleans up after a crash; later rebuilds leave tmp_ alone
        self._task: asyncio.Task[None] | None = None
        self._running: set[asyncio.Task[None]] = set()
        self._session: aiohttp.ClientSession | None = None

    # -- lifecycle -------------------------------------------------------------------------------

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="part-log")

    async def stop(self) -> None:
        tasks = [t for t in (self._task, *self._running) if t is not None]
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=5)
        if self._session is not None:
            await self._session.close()

    def on_commit(self) -> None:
        self._dirty = True
        self._wake.fire()

    def on_history_replaced(self) -> None:
        self._rescan = True
        self._wake.fire()

    # -- the loop --------------------------------------------------------------------------------

    async def _run(self) -> None:
        self._session = aiohttp.ClientSession()
        while True:
            try:
                if self._rescan and not self._running:   # rebuilt once running fetches ended
                    self._rescan = self._dirty = False
                    await self._load_all()
                elif self._dirty and not self._rescan:
                    self._dirty = False
                    self._pull()
                if not self._rescan:
                    self._schedule()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("the part log's runner failed; starting over from the state collections")
                self._rescan = True
            ready = (self._rescan and not self._running) or (self._dirty and not self._rescan)
            if not ready:
                await self._wake.wait(RETRY_S)

    async def _load_all(self) -> None:
        reader = self.node.store.reader
        self._seen_key = reader.oplog_newest_key() or 0
        before, self.tables = self.tables, {}
        for info in reader.collections():
            if info.ns.partition(".")[2] != PART_LOG:
                continue
            for doc in reader.scan(info.ns):
                await self._add_table(TableDef.from_document(info.ns.partition(".")[0], doc))
        for rt in self.tables.values():
            db, name = rt.table.db, rt.table.name
            log_ns = state_ns(db, name, "log")
            if reader.collection(log_ns) is not None:
                for doc in sorted(reader.scan(log_ns), key=lambda d: int(d.get("seq", 0))):
                    self._enqueue(rt, doc)
        self._started_up = True
        for ns in before.keys() - self.tables.keys():   # dropped: its parts go too
            log.info("parts table %s was dropped: removing its parts", ns)
            await asyncio.to_thread(shutil.rmtree, before[ns].directory, True)

    async def _add_table(self, table: TableDef) -> None:
        directory = table_dir(self.node.options.dbpath, table.ns)
        parts = await asyncio.to_thread(local_parts, directory, at_start_up=not self._started_up)
        self.tables[table.ns] = TableRuntime(table, directory, ReplicationQueue(parts))

    def _pull(self) -> None:
        """The part-log entries committed since the last look."""
        reader = self.node.store.reader
        oldest = reader.oplog_oldest_key()
        if oldest is not None and self._seen_key and oldest > self._seen_key + 1:
            self._rescan = True   # trimmed past what we saw: rebuild
            return
        while rows := reader.oplog_after(self._seen_key, PULL_CHUNK):
            for key, blob in rows:
                self._seen_key = key
                if MARKER in blob:
                    self._on_entry(bson.decode(blob, DOC_OPTIONS))

    def _on_entry(self, entry: dict[str, Any]) -> None:
        ns, op = str(entry.get("ns", "")), entry.get("op")
        db, _, coll = ns.partition(".")
        if coll == PART_LOG:
            self._rescan = True   # a table was created or dropped: reload the definitions
        elif coll.startswith(f"{PART_LOG}.") and coll.endswith(".log") and op == "i":
            table = coll[len(PART_LOG) + 1:-len(".log")]
            rt = self.tables.get(f"{db}.{table}")
            if rt is None:
                self._rescan = True
            else:
                self._enqueue(rt, entry["o"])

    def _enqueue(self, rt: TableRuntime, doc: dict[str, Any]) -> None:
        if doc.get("type") != "GET_PART":
            return
        entry = QueueEntry(str(doc["_id"]), EntryType.GET_PART, PartInfo.parse(str(doc["part"])),
                           source_replica=str(doc.get("source", "")), quorum=int(doc.get("quorum", 0)))
        if rt.queue.add(entry):
            rt.docs[entry.node_name] = doc

    # -- running tasks ---------------------------------------------------------------------------

    def _schedule(self) -> None:
        now = _now_ms()
        for rt in list(self.tables.values()):
            while (entry := rt.queue.next_to_run(now)) is not None:
                rt.queue.started(entry, now)
                if rt.queue.already_done(entry):
                    rt.queue.finished(entry, now)
                    rt.docs.pop(entry.node_name, None)
                    continue
                task = asyncio.get_running_loop().create_task(self._fetch(rt, entry))
                self._running.add(task)
                task.add_done_callback(self._running.discard)

    async def _fetch(self, rt: TableRuntime, entry: QueueEntry) -> None:
        doc = rt.docs.get(entry.node_name, {})
        error = ""
        try:
            source = str(doc.get("http", ""))
            if not source or doc.get("source") == self.node.options.me:
                raise FetchFailed(f"no other replica is known to have {entry.new_part}")
            checksums = {c["file"]: (int(c["size"]), str(c["sha256"])) for c in doc.get("checksums", [])}
            assert self._session is not None and entry.new_part is not None
            await asyncio.to_thread(os.makedirs, rt.directory, exist_ok=True)
            await fetch_part(self._session, source, rt.table.ns, entry.new_part.name, checksums, rt.directory)
        except (FetchFailed, MongoError, OSError) as exc:
            error = str(exc)
            log.info("fetching %s of %s failed: %s", entry.new_part, rt.table.ns, error)
        finally:
            if entry in rt.queue.entries:
                rt.queue.finished(entry, _now_ms(), error=error)
                if not error:
                    rt.docs.pop(entry.node_name, None)
            self._wake.fire()

    # -- views -----------------------------------------------------------------------------------

    def queue_view(self, ns: str) -> list[dict[str, Any]]:
        rt = self.tables.get(ns)
        return rt.queue.view() if rt is not None else []
