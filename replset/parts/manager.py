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
from replset.parts.commit import PrimaryLink
from replset.parts.names import PART_LOG, state_ns, table_dir
from replset.parts.registry import (
    PENDING,
    REACHED,
    HeldReports,
    Registration,
    parse_held,
    register_holders,
)
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
    logged: set[str] = field(default_factory=set)                   # parts the log has produced
    holders: dict[str, dict[str, str]] = field(default_factory=dict)   # part -> {member: http} (the registry)
    quorum_blocks: dict[str, str] = field(default_factory=dict)     # part -> block id of its pending quorum

    def add_holder(self, part: str, member: str, http: str) -> None:
        self.holders.setdefault(part, {})[member] = http

    def remove_holder(self, part: str, member: str) -> None:
        held = self.holders.get(part)
        if held is not None:
            held.pop(member, None)
            if not held:
                del self.holders[part]


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


def _publish_if_intact(directory: str, tmp_name: str, part: str, expected: dict[str, tuple[int, str]]) -> bool:
    tmp_dir = os.path.join(directory, tmp_name)
    if os.path.exists(os.path.join(directory, part)) or part_files.verify_part(tmp_dir) is not None:
        return False
    try:
        written = part_files.read_checksums(tmp_dir)
    except (OSError, ValueError, MongoError):
        return False
    if any(written.get(file) != sums for file, sums in expected.items()):
        return False
    part_files.publish(directory, tmp_name, part)
    return True


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
        self.link = PrimaryLink(node)
        self.held = HeldReports(node.options.me, node.options.http_address)
        self.registry_moved = Pulse()   # a holder registered or a quorum record changed
        self._to_register: dict[tuple[str, str, str], str] = {}   # (table ns, part, member) -> http
        self._registering: asyncio.Task[None] | None = None

    # -- lifecycle -------------------------------------------------------------------------------

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="part-log")

    async def stop(self) -> None:
        self.link.close()
        tasks = [t for t in (self._task, self._registering, *self._running) if t is not None]
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
                    self._maybe_register()
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
        self.held.own.clear()
        for rt in self.tables.values():
            db, name = rt.table.db, rt.table.name
            for doc in self._scan(state_ns(db, name, "replicas")):
                rt.add_holder(str(doc["part"]), str(doc["member"]), str(doc["http"]))
            for doc in self._scan(state_ns(db, name, "quorum")):
                if doc.get("status") == PENDING:
                    rt.quorum_blocks[str(doc["part"])] = str(doc["_id"])
            for doc in sorted(self._scan(state_ns(db, name, "log")), key=lambda d: int(d.get("seq", 0))):
                self._enqueue(rt, doc)
            for part in rt.queue.current:   # held here, but no registration says so (a failover lost it)
                if part.name in rt.logged and self.node.options.me not in rt.holders.get(part.name, {}):
                    self._held(rt, part.name)
        self._started_up = True
        self.registry_moved.fire()
        for ns in before.keys() - self.tables.keys():   # dropped: its parts go too
            log.info("parts table %s was dropped: removing its parts", ns)
            await asyncio.to_thread(shutil.rmtree, before[ns].directory, True)

    def _scan(self, ns: str) -> list[dict[str, Any]]:
        reader = self.node.store.reader
        return list(reader.scan(ns)) if reader.collection(ns) is not None else []

    async def _add_table(self, table: TableDef) -> None:
        directory = table_dir(self.node.options.dbpath, table.ns)
        if not self._started_up:
            await self._recover_inserts(table, directory)
        parts = await asyncio.to_thread(local_parts, directory, at_start_up=not self._started_up)
        self.tables[table.ns] = TableRuntime(table, directory, ReplicationQueue(parts))

    async def _recover_inserts(self, table: TableDef, directory: str) -> None:
        """At start-up, before temporary parts are removed: an insert whose commit went through while this
        member crashed before publishing its part left `tmp_insert_<block id>_...` behind, and a log
        document naming this member as the source. Such a part is published if its files are the ones
        the log recorded; anything else is left to the clean-up."""
        names = await asyncio.to_thread(os.listdir, directory) if os.path.isdir(directory) else []
        log_ns, me = state_ns(table.db, table.name, "log"), self.node.options.me
        for name in names:
            if not name.startswith(part_files.TMP_INSERT):
                continue
            block_id = name[len(part_files.TMP_INSERT):].rsplit("_", 2)[0]
            doc = self.node.store.reader.get(log_ns, block_id) if self.node.store.reader.collection(log_ns) else None
            if doc is None or doc.get("source") != me:
                continue
            expected = {c["file"]: (int(c["size"]), str(c["sha256"])) for c in doc.get("checksums", [])}
            if await asyncio.to_thread(_publish_if_intact, directory, name, str(doc["part"]), expected):
                log.info("published %s of %s, committed before a crash", doc["part"], table.ns)

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
        elif coll.startswith(f"{PART_LOG}."):
            table, _, what = coll[len(PART_LOG) + 1:].rpartition(".")
            rt = self.tables.get(f"{db}.{table}")
            if rt is None:
                if what == "log":
                    self._rescan = True
            elif what == "log" and op == "i":
                self._enqueue(rt, entry["o"])
            elif what == "replicas":
                self._on_registry_entry(rt, op, entry)
            elif what == "quorum":
                self._on_quorum_entry(rt, ns, op, entry)

    def _on_registry_entry(self, rt: TableRuntime, op: Any, entry: dict[str, Any]) -> None:
        doc = entry["o"]
        if op == "i":
            part, member = str(doc["part"]), str(doc["member"])
            rt.add_holder(part, member, str(doc["http"]))
            if member == self.node.options.me:
                self.held.own.pop((rt.table.ns, part), None)
            self._to_register.pop((rt.table.ns, part, member), None)
        elif op == "d":
            part, _, member = str(doc["_id"]).rpartition("@")
            rt.remove_holder(part, member)
        self.registry_moved.fire()

    def _on_quorum_entry(self, rt: TableRuntime, ns: str, op: Any, entry: dict[str, Any]) -> None:
        block_id = entry["o"]["_id"] if op in ("i", "d") else entry.get("o2", {}).get("_id")
        doc = self.node.store.reader.get(ns, block_id)
        for part, bid in list(rt.quorum_blocks.items()):
            if bid == block_id:
                del rt.quorum_blocks[part]
        if doc is not None and doc.get("status") == PENDING:
            rt.quorum_blocks[str(doc["part"])] = str(block_id)
        self.registry_moved.fire()

    def _enqueue(self, rt: TableRuntime, doc: dict[str, Any]) -> None:
        if doc.get("type") != "GET_PART":
            return
        rt.logged.add(str(doc["part"]))
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
        assert entry.new_part is not None
        try:
            source = self._fetch_source(rt, entry.new_part.name, doc)
            if source is None:
                raise FetchFailed(f"no other live replica is known to have {entry.new_part}")
            checksums = {c["file"]: (int(c["size"]), str(c["sha256"])) for c in doc.get("checksums", [])}
            assert self._session is not None and entry.new_part is not None
            await asyncio.to_thread(os.makedirs, rt.directory, exist_ok=True)
            await fetch_part(self._session, source, rt.table.ns, entry.new_part.name, checksums, rt.directory)
            self._held(rt, entry.new_part.name)
        except (FetchFailed, MongoError, OSError) as exc:
            error = str(exc)
            log.info("fetching %s of %s failed: %s", entry.new_part, rt.table.ns, error)
        finally:
            if entry in rt.queue.entries:
                rt.queue.finished(entry, _now_ms(), error=error)
                if not error:
                    rt.docs.pop(entry.node_name, None)
            self._wake.fire()

    def _fetch_source(self, rt: TableRuntime, part: str, doc: dict[str, Any]) -> str | None:
        """Where to fetch `part` from: a live member the registry lists as holding it, chosen at random
        (as today's ClickHouse does: it spreads the fetches of many replicas over every holder); the
        member that inserted it when the registry names no live one yet."""
        me, live = self.node.options.me, self.node.live_members()
        holders = [http for member, http in rt.holders.get(part, {}).items() if member != me and member in live]
        if holders:
            return self.node.rng.choice(holders)
        source = str(doc.get("source", ""))
        return str(doc.get("http")) if source and source != me and doc.get("http") else None

    # -- "has part": reports upstream, registration on the primary ---------------------------------

    def _held(self, rt: TableRuntime, part: str) -> None:
        """This member now holds `part`: the registry should say so."""
        if self.node.options.me in rt.holders.get(part, {}):
            return
        self.held.own[(rt.table.ns, part)] = None
        if self.node.is_primary:
            self._to_register[(rt.table.ns, part, self.node.options.me)] = self.node.options.http_address
            self._wake.fire()
        else:
            self.node.repl.holdings_changed()

    def held_report(self) -> list[dict[str, Any]]:
        """`partsHeld` for this member's next position report."""
        return self.held.report(_now_ms())

    def on_held_report(self, raw: Any) -> None:
        """The `partsHeld` of a position report from a member syncing from us."""
        items = parse_held(raw)
        if not items:
            return
        if not self.node.is_primary:
            if self.held.relay(items, _now_ms()):
                self.node.repl.holdings_changed()
            return
        for member, http, parts in items:
            for ns, part in parts:
                rt = self.tables.get(ns)
                if rt is not None and part in rt.logged and member not in rt.holders.get(part, {}):
                    self._to_register[(ns, part, member)] = http
        if self._to_register:
            self._wake.fire()

    def _maybe_register(self) -> None:
        if not self._to_register or self._registering is not None or not self.node.is_primary:
            if not self.node.is_primary:
                self._to_register.clear()   # reported to a primary that stepped down: reported again
            return
        todo = []
        for (ns, part, member), http in list(self._to_register.items())[:1000]:
            rt = self.tables.get(ns)
            if rt is None or part not in rt.logged:
                self._to_register.pop((ns, part, member), None)
                continue
            todo.append(Registration(rt.table.db, rt.table.name, part, member, http, rt.quorum_blocks.get(part)))
        if todo:
            self._registering = asyncio.get_running_loop().create_task(self._register(todo))

    async def _register(self, todo: list[Registration]) -> None:
        config = self.node.config
        members = [m.host for m in config.members] if config is not None else [self.node.options.me]
        try:
            await self.node.submit_write(lambda env: register_holders(env, todo, members), durable=False)
            for reg in todo:
                self._to_register.pop((f"{reg.db}.{reg.table}", reg.part, reg.member), None)
        except MongoError as exc:
            log.info("registering %d part holders failed: %s", len(todo), exc)
        finally:
            self._registering = None
            self._wake.fire()

    async def wait_quorum(self, ns: str, blocks: list[tuple[str, str]], required: int,
                          timeout_s: float) -> list[str]:
        """Each block's quorum status once none is pending, or when `timeout_s` passes: `reached`,
        `pending` or `failed`. A block without a quorum record (a duplicate of an insert made without
        one) has reached it when the registry lists `required` holders of its part."""
        deadline = time.monotonic() + timeout_s
        db, _, table = ns.partition(".")
        quorum_ns = state_ns(db, table, "quorum")
        while True:
            statuses = []
            for block_id, part in blocks:
                record = self.node.store.reader.get(quorum_ns, block_id)
                if record is not None:
                    statuses.append(str(record.get("status", PENDING)))
                else:
                    rt = self.tables.get(ns)
                    held = len(rt.holders.get(part, {})) if rt is not None else 0
                    statuses.append(REACHED if held >= required else PENDING)
            remaining = deadline - time.monotonic()
            if PENDING not in statuses or remaining <= 0:
                return statuses
            await self.registry_moved.wait(remaining)

    # -- views -----------------------------------------------------------------------------------

    def queue_view(self, ns: str) -> list[dict[str, Any]]:
        rt = self.tables.get(ns)
        return rt.queue.view() if rt is not None else []
