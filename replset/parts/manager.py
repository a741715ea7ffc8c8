"""Every member's part-log side: a replication queue per table, fed by the part log, and its runner.

Theory of operation
-------------------
The part log is ordinary replicated documents (`replset.parts.insert`,
`replset.parts.leader`), so it reaches every member with the oplog - applied by
the fetcher on a secondary, written by the primary itself. After each commit
the manager looks at the new oplog entries (a byte search for `.system.parts`
first, so other writes cost next to nothing) and turns each GET_PART and
MERGE_PARTS log document into a task of that table's
`oplog.parts.queue.ReplicationQueue` (idempotently: the task is keyed by the log
document's `_id`). Applying stays synchronous and does no I/O; the work happens
here, after the commit, off the apply path.

The runner asks each queue for the tasks that may run (`next_to_run`, with
ClickHouse's postponement reasons), and carries them out:

* a part this member already has (or one containing it) needs nothing;
* a merge whose sources are all here is done here, off the event loop; its
  result is compared with the copy of any member the registry lists, and
  fetched from that member instead if the bytes differ;
* anything else is fetched (`sync.part_fetch`: every byte checked) from a live
  member the registry lists as holding the part, chosen at random, or holding
  a part that covers it (the part was merged away meanwhile). A fetch that
  receives nothing for `fetchProgressTimeoutMS` is abandoned, and the next try
  goes to another holder while there is one that has not failed it.

A failed task stays queued and backs off; the queue view says why. A part this
member obtained is reported upstream until the registry lists it
(`replset.parts.registry`). Parts a merge replaced stay on disk, readable, for
`oldPartsLifetimeSecs`, then go.

When the history is replaced (a rollback, an initial sync) or the oplog was
trimmed past what the manager had seen, it rebuilds everything from the state
collections and the parts on disk, as at start-up: the queue is derived state.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import shutil
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import aiohttp
import bson

from base.clock import Clock
from base.errors import MongoError
from base.member import MemberState
from base.optime import OpTime
from oplog.codec_options import DOC_OPTIONS
from oplog.parts import part_files
from oplog.parts.active_set import ActivePartSet
from oplog.parts.jobs import STAGED_PREFIX
from oplog.parts.mutations import Mutation, parts_to_do
from oplog.parts.part_info import PartInfo, PartsIntersect
from oplog.parts.queue import EntryType, QueueEntry, ReplicationQueue
from oplog.parts.storage_url import part_key
from oplog.parts.table import TableDef
from oplog.parts.table_replica import (
    BROKEN,
    Check,
    Checksums,
    Gone,
    Held,
    Moved,
    NotHeld,
    Registered,
    RemoveOld,
    Run,
    SetAside,
    TableReplica,
    Unlogged,
    parse_checksums,
    same_data,
)
from replset.parts.alter import rewrite_part
from replset.parts.commit import IN_DOUBT_KEEP_S, PrimaryLink
from replset.parts.insert import logged_block, remembered
from replset.parts.jobs import remove_staged, stage_of
from replset.parts.leader import Leader
from replset.parts.names import PART_LOG, state_ns, table_dir, tables_ns
from replset.parts.registry import PENDING, REACHED, HeldReports, parse_held, quorum_status
from replset.parts.runtime import adopt_temporary, local_parts, part_damage, trust_sizes
from replset.parts.snapshots import PinOwners, pin_of
from replset.pulse import Pulse
from sync.part_fetch import FetchFailed, PartMissing, fetch_part

if TYPE_CHECKING:
    from replset.node import Node

log = logging.getLogger(__name__)

MARKER = f".{PART_LOG}".encode()
PULL_CHUNK = 1000
TOO_MANY_PARTS = 96   # OperationFailed (ClickHouse: TOO_MANY_PARTS)
INTERRUPTED = 11601
RETRY_S = 1.0          # the runner looks again at least this often (backed-off tasks, merge selection)
OPERATION_FAILED = 96
PART_CHECK_TICK_S = 1.0   # the check schedule (`TableReplica.check_due`) is looked at this often
_merge_names = itertools.count(1)


_CHANGES_ROWS = (EntryType.GET_PART, EntryType.DROP_RANGE)   # the tasks a read through a time waits for
STAGE_SWEEP_S = 60.0   # how often staged blocks no record names are looked for


class PartsManager:
    def __init__(self, node: Node, *, clock: Clock | None = None) -> None:
        self.node = node
        self.clock = node.clock if clock is None else clock   # the queue keeps times in its monotonic ms
        # The views show those as wall times: one offset per runner, so the same failure shows the same
        # time every time it is asked (`replset.parts.views`).
        self.wall_minus_monotonic_ms = self.clock.wall_ms() - self.clock.monotonic_ms()
        self.tables: dict[str, TableReplica] = {}
        self._wake = Pulse()
        self._dirty = False
        self._rescan = True
        self._replaced = False
        self._seen_key = 0
        self._started_up = False   # the first load cleans up after a crash; later rebuilds leave tmp_ alone
        self._task: asyncio.Task[None] | None = None
        self._running: set[asyncio.Task[None]] = set()
        self._session: aiohttp.ClientSession | None = None
        self.link = PrimaryLink(node, clock=self.clock)
        self.held = HeldReports(node.options.me, node.options.http_address)
        self.leader = Leader(node, self.tables, clock=self.clock)
        self.registry_moved = Pulse()   # a holder registered or a quorum record changed
        self.pin_owners = PinOwners()   # whose each read snapshot is (`openPartsSnapshot`'s per-user share)
        self._dropped: set[str] = set()  # tables whose drop was applied since the last rebuild
        self._next_outdated_check = 0.0
        self._stages_gone: dict[tuple[str, str], OpTime] = {}   # (ns, stage id) -> the optime its record went at
        self._next_stage_sweep = 0.0
        self._next_inserted_check = 0.0
        self.parts_moved = Pulse()      # a task finished here, or a mutation arrived
        self.pulled = Pulse()           # the runner took in the oplog up to a new position (`_seen_key`)
        self._was_primary = False   # as of the runner's last look (a rebuild resets it: see `_load_all`)
        self._in_doubt: list[tuple[float, str, list[str]]] = []   # (until, directory, tmp parts): unsettled commits
        self._inserted: dict[tuple[str, str], float] = {}   # (ns, part) -> until: published by an insert here
        self._loop: asyncio.AbstractEventLoop | None = None
        self._next_part_check = 0.0
        self._checking: set[str] = set()   # parts the check schedule is hashing now

    # -- lifecycle -------------------------------------------------------------------------------

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._task = self._loop.create_task(self._run(), name="part-log")

    async def stop(self) -> None:
        self.link.close()
        tasks = [t for t in (self._task, self.leader.cancel(), *self._running) if t is not None]
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=5)
        if self._session is not None:
            await self._session.close()

    def on_commit(self, rows: Sequence[tuple[int, bytes]] | None) -> None:
        """A commit appended `rows` to the oplog (None: not known). The runner looks at once when they may
        hold part-log entries or the member became or stopped being primary; a commit of ordinary writes
        only moves the runner's position past them (it was caught up: nothing is pending), without a wake."""
        if (rows is not None and not self._dirty and not self._rescan and self._was_primary == self.node.is_primary
                and not any(MARKER in blob for _key, blob in rows)):
            if rows:
                self._seen_key = rows[-1][0]
                self.pulled.fire()
            return
        self._dirty = True
        self._wake.fire()

    def on_history_replaced(self) -> None:
        self._rescan = True
        self._replaced = True   # the rebuild distrusts the parts it cannot verify (see `_set_aside_mismatched`)
        self._wake.fire()

    # -- the loop --------------------------------------------------------------------------------

    async def _run(self) -> None:
        self._session = self.node.http_session()
        while True:
            try:
                if self._rescan and not self._running:   # rebuilt once running tasks ended
                    self._rescan = self._dirty = False
                    await self._load_all()
                elif self._dirty and not self._rescan:
                    self._dirty = False
                    self._pull()
                if not self._rescan:
                    self._schedule()
                    self._notice_step_up()
                    self.leader.step(self._wake.fire)
                    self._remove_outdated()
                    self._check_schedule()
                await self._expire_in_doubt()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("the part log's runner failed; starting over from the state collections")
                self._rescan = True
                await asyncio.sleep(RETRY_S)   # a fault that repeats must not spin the loop
            ready = (self._rescan and not self._running) or (self._dirty and not self._rescan)
            if not ready:
                await self._wake.wait(RETRY_S)

    def _notice_step_up(self) -> None:
        """On becoming primary: what this member reported it holds, but no registration lists yet (it was
        promoted before its upstream passed the report on), is registered by itself now, and what it
        reported gone is unregistered; and every pending quorum is looked at again."""
        primary = self.node.is_primary
        if primary and not self._was_primary:
            me, http = self.node.options.me, self.node.options.http_address
            for (ns, part), checksums in self.held.own.items():
                self.leader.register(ns, part, me, http, checksums)
            for ns, part in self.held.gone:   # reported gone, and the report never reached a primary
                self.leader.not_held(ns, part, me)
            self.leader.took_over()
        self._was_primary = primary

    def keep_in_doubt(self, directory: str, tmp_names: list[str], keep_s: float) -> None:
        """An insert's commit has an unknown outcome: its temporary parts stay for `keep_s`, for the log
        to name them (a GET_PART whose source is this member publishes one, see `_execute`)."""
        self._in_doubt.append((self.clock.monotonic() + keep_s, directory, tmp_names))

    def inserting(self, ns: str, parts: list[str]) -> None:
        """An insert here is about to publish these parts (its commit went through, or is going through):
        a rebuild that does not find them in the log yet keeps them for `IN_DOUBT_KEEP_S`, unread (see
        `_set_aside_unexpected`). Called from the insert's thread too."""
        until = self.clock.monotonic() + IN_DOUBT_KEEP_S
        for part in parts:
            self._inserted[(ns, part)] = until

    def published(self, ns: str, parts: list[str]) -> None:
        """An insert here published these parts: their files are the ones whose checksums it computed from
        what it wrote, so they count as hashed whole now (the first send or read does not hash them again;
        a flipped bit later is the check schedule's, the page CRCs' and the receivers'). On the insert's
        thread."""
        rt = self.tables.get(ns)
        if rt is None:
            return
        now = self.clock.monotonic_ms()
        for part in parts:
            signature = part_files.part_signature(os.path.join(rt.directory, part))
            if signature:
                rt.verified(part, signature, now, whole=True)

    async def _expire_in_doubt(self) -> None:
        now = self.clock.monotonic()
        if self._inserted and now >= self._next_inserted_check:
            self._next_inserted_check = now + RETRY_S
            for key in [k for k, until in list(self._inserted.items()) if until <= now]:
                del self._inserted[key]
        if not self._in_doubt or self._in_doubt[0][0] > now:
            return
        expired = [item for item in self._in_doubt if item[0] <= now]
        self._in_doubt = [item for item in self._in_doubt if item[0] > now]
        for _, directory, tmp_names in expired:
            await asyncio.to_thread(part_files.remove_named, directory, tmp_names)

    async def _load_all(self) -> None:
        reader = self.node.store.reader
        replaced, self._replaced = self._replaced, False
        self._seen_key = reader.oplog_newest_key() or 0
        before, self.tables = self.tables, {}
        self.leader.rebind(self.tables)
        definitions = await self._read_all(lambda r: [
            (info.ns.partition(".")[0], doc) for info in r.collections()
            if info.ns.partition(".")[2] == PART_LOG for doc in r.scan(info.ns)])
        for db, doc in definitions:
            await self._add_table(TableDef.from_document(db, doc))
        for ns, rt in self.tables.items():
            old = before.get(ns)
            if old is not None:   # a rebuild: what was verified stays verified while its files are unchanged
                rt.checked, rt.checked_at = old.checked, old.checked_at
            else:
                await asyncio.to_thread(trust_sizes, rt)
        self.held.own.clear()
        self.pin_owners.clear()   # (counted again from the snapshots read below)
        self._stages_gone.clear()   # (a removal a rollback undid did not happen; what did is swept by age)
        for rt in self.tables.values():
            db, name = rt.table.db, rt.table.name
            for doc in await self._scan(state_ns(db, name, "replicas")):
                rt.add_holder(str(doc["part"]), str(doc["member"]), str(doc["http"]),
                              parse_checksums(doc.get("checksums", [])))
            for doc in await self._scan(state_ns(db, name, "lost")):
                rt.lost[str(doc["_id"])] = str(doc.get("reason", ""))
            for doc in await self._scan(state_ns(db, name, "staged")):
                rt.jobs.stage_recorded(str(doc["_id"]), stage_of(doc))
            for doc in await self._scan(state_ns(db, name, "snapshots")):
                self._pin(rt, doc)
            keys = sorted(map(remembered, await self._scan(state_ns(db, name, "blocks"))), key=lambda b: b.number)
            rt.remembered.extend(keys)
            for doc in await self._scan(state_ns(db, name, "mutations")):
                rt.mutations[str(doc["_id"])] = Mutation.from_document(doc)
            for doc in await self._scan(state_ns(db, name, "quorum")):
                if doc.get("status") == PENDING:
                    rt.quorum_pending(str(doc["part"]), str(doc["_id"]))
                elif doc.get("status") == REACHED:
                    rt.quorum_was_reached(str(doc["part"]))
            for doc in sorted(await self._scan(state_ns(db, name, "log")), key=lambda d: int(d.get("seq", 0))):
                self._enqueue(rt, doc)
            await self._set_aside_unexpected(rt)
            # (While an initial sync clones the log, what vouches for a part may not be here yet: its end
            # rebuilds again, as a replaced history.)
            await self._set_aside_mismatched(rt, replaced=replaced and self.node.state is not MemberState.STARTUP2)
            me = self.node.options.me
            for part in rt.queue.current:   # held here, but no registration says so (a failover lost it)
                if part.name in rt.logged:
                    rt.held(part.name, await asyncio.to_thread(self._checksums_of, rt, part.name), me)
            rt.registrations_not_here(me, coming=[part for ns, part in self._inserted if ns == rt.table.ns])
            self._carry_out(rt)
        self._started_up = True
        self._was_primary = False   # a rebuild while primary looks at registrations and quorums again
        self.registry_moved.fire()
        # A table whose drop this member applied loses its parts too. A table merely missing from a rebuild
        # (an initial sync's clone under way) keeps them.
        for ns in [ns for ns in self._dropped if ns in before and ns not in self.tables]:
            log.info("parts table %s was dropped: removing its parts", ns)
            await asyncio.to_thread(shutil.rmtree, before[ns].directory, True)
        self._dropped.clear()

    def _remove_old_stages(self, rt: TableReplica) -> None:
        """Staged blocks no record names (a crash before the record, or before the files went), older than
        the table's stage timeout (a record may not have reached a member that is behind yet)."""
        cutoff = self.clock.wall_ms() / 1000 - rt.table.settings.staged_parts_timeout_secs
        names = os.listdir(rt.directory) if os.path.isdir(rt.directory) else []
        in_use = self._stages_in_use(rt) if any(n.startswith(STAGED_PREFIX) for n in names) else set()
        for name in names:
            stage_id = name[len(STAGED_PREFIX):]
            if not name.startswith(STAGED_PREFIX) or stage_id in rt.jobs.staged or stage_id in in_use:
                continue
            try:
                if os.stat(os.path.join(rt.directory, name)).st_mtime < cutoff:
                    remove_staged(rt.directory, [stage_id])
            except OSError:
                continue

    def _sweep_stages(self) -> None:
        """Once a second: the files of stages whose record's removal is majority-committed; once a minute, the
        staged blocks no record names (`_remove_old_stages`)."""
        now, committed = self.clock.monotonic(), self.node.majority_commit_point
        due: dict[str, list[str]] = {}
        for (ns, stage_id), at in list(self._stages_gone.items()):
            if at <= committed:
                del self._stages_gone[(ns, stage_id)]
                due.setdefault(ns, []).append(stage_id)
        for ns, stage_ids in due.items():
            rt = self.tables.get(ns)
            if rt is not None:
                in_use = self._stages_in_use(rt)
                gone = [s for s in stage_ids if s not in rt.jobs.staged and s not in in_use]
                for stage_id in in_use.intersection(stage_ids):   # a task still publishes from it: next time
                    self._stages_gone[(ns, stage_id)] = committed
                self._spawn(asyncio.to_thread(remove_staged, rt.directory, gone))
        if now >= self._next_stage_sweep:
            self._next_stage_sweep = now + STAGE_SWEEP_S
            for rt in self.tables.values():
                self._spawn(asyncio.to_thread(self._remove_old_stages, rt))

    async def _read_all(self, fn: Any) -> Any:
        """`fn(reader)` on the query pool: a scan of a state collection grows with the table."""
        store = self.node.store
        return await self.node.queries.run(lambda: fn(store.thread_reader()))

    async def _scan(self, ns: str) -> list[dict[str, Any]]:
        return list(await self._read_all(lambda r: list(r.scan(ns)) if r.collection(ns) is not None else []))

    @staticmethod
    def _checksums_of(rt: TableReplica, part: str) -> Checksums:
        try:
            return part_files.read_checksums(os.path.join(rt.directory, part))
        except (OSError, ValueError, MongoError):
            return {}

    async def _add_table(self, table: TableDef) -> None:
        directory = table_dir(self.node.options.dbpath, table.ns)
        if not self._started_up:
            await self._recover_inserts(table, directory)
        parts = await asyncio.to_thread(local_parts, directory, at_start_up=not self._started_up)
        rt = TableReplica(table, directory, ReplicationQueue(parts))
        broken = await asyncio.to_thread(part_files.set_aside_names, directory, part_files.BROKEN_PREFIX)
        rt.damage_holes.update(broken)   # `read_holes` closes those filled since
        now = self.clock.monotonic_ms()
        for part in parts:
            if part not in rt.queue.current:   # replaced by a merged part before a restart: old, still readable
                rt.mark_outdated(part.name, now)
        self.tables[table.ns] = rt

    async def _set_aside_unexpected(self, rt: TableReplica) -> None:
        """Every rebuild: a part directory that no part of the log contains is never read
        (`TableReplica.unlogged_here`): set aside as `unexpected_<name>`, never deleted. But a part an
        insert here published lately may be one whose log entry has not reached this member yet: it stays
        on disk, unread, until its GET_PART publishes it (`_published_here`) or `IN_DOUBT_KEEP_S` passed
        (`_remove_outdated`). So does every such part while an initial sync clones the log (its end
        rebuilds again)."""
        now = self.clock.monotonic_ms()
        cloning = self.node.state is MemberState.STARTUP2
        ns = rt.table.ns

        def kept_until(name: str) -> int:
            return now + int(IN_DOUBT_KEEP_S * 1000) if cloning else int(self._inserted.get((ns, name), 0.0) * 1000)

        rt.unlogged_here(now, kept_until=kept_until)
        for name in rt.parked:
            log.info("part %s of %s is not in the log (yet): not read until it is", name, ns)
        for action in rt.actions:
            if isinstance(action, SetAside):
                log.warning("part %s of %s is in no part of the log: setting it aside as unexpected_%s",
                            action.part, ns, action.part)

    async def _set_aside_mismatched(self, rt: TableReplica, *, replaced: bool) -> None:
        """Every rebuild: a part here whose bytes are not the ones the log recorded for its name (or, for
        a merged or mutated part, not those of any registered copy) is set aside (`TableReplica.bytes_found`).
        After a rollback a block number can name other rows than before; the copy of the history that lost
        must not be read."""
        wanted = rt.bytes_expected()
        found = await asyncio.to_thread(lambda: {name: self._checksums_of(rt, name) for name in wanted})
        for name, here in found.items():
            rt.bytes_found(name, here)
            if PartInfo.parse(name) not in rt.queue.current:
                log.warning("part %s of %s here is not the part the log names: setting it aside", name, rt.table.ns)
        if replaced:
            before = set(rt.queue.current)
            rt.unverifiable_after_rollback()
            for part in before - set(rt.queue.current):
                log.info("part %s of %s: nothing in the new history says which rows it holds: setting it aside "
                         "(the part covering it is fetched or made instead)", part, rt.table.ns)
        self._carry_out(rt)

    async def _recover_inserts(self, table: TableDef, directory: str) -> None:
        """At start-up, before temporary parts are removed: an insert whose commit went through while this
        member crashed before publishing its part left `tmp_insert_<block id>_...` behind, and a log
        document naming this member as the source. Such a part is published if its files are the ones
        the log recorded. The others wait `IN_DOUBT_KEEP_S` for the log to arrive (this member may be
        behind), as the parts of a commit whose reply was lost do."""
        if not await asyncio.to_thread(os.path.isdir, directory):
            return   # no part of the table reached this member yet
        names = await asyncio.to_thread(os.listdir, directory)
        me, reader = self.node.options.me, self.node.store.reader
        block_ids = {name[len(part_files.TMP_INSERT):].rsplit("_", 2)[0] for name in names
                     if name.startswith(part_files.TMP_INSERT)}
        for block_id in sorted(block_ids):
            doc = logged_block(reader, table.db, table.name, block_id)
            if doc is None or doc.get("source") != me:
                continue
            expected = parse_checksums(doc.get("checksums", []))
            if await asyncio.to_thread(adopt_temporary, directory, block_id, str(doc["part"]), expected):
                log.info("published %s of %s, committed before a crash", doc["part"], table.ns)
                self.inserting(table.ns, [str(doc["part"])])   # as `_adopt_own`'s: a rollback may undo its entry
        left = [n for n in await asyncio.to_thread(os.listdir, directory) if n.startswith(part_files.TMP_INSERT)]
        if left:
            self.keep_in_doubt(directory, left, IN_DOUBT_KEEP_S)

    def _pull(self) -> None:
        """The part-log entries committed since the last look."""
        reader = self.node.store.reader
        # Trimmed past what we saw: entries we never read may be gone, rebuild. The store keeps the newest
        # key a trim deleted (as the oplog cursors check it): no query per commit for it.
        if self._seen_key and self._seen_key < reader.oplog_trimmed_through:
            self._rescan = True
            return
        while rows := reader.oplog_after(self._seen_key, PULL_CHUNK):
            for key, blob in rows:
                self._seen_key = key
                if MARKER in blob:
                    self._on_entry(bson.decode(blob, DOC_OPTIONS))
        self.pulled.fire()

    def _on_entry(self, entry: dict[str, Any]) -> None:
        ns, op = str(entry.get("ns", "")), entry.get("op")
        db, _, coll = ns.partition(".")
        if coll == PART_LOG and op == "u":   # an alter: the new definition, read as it stands now
            table = str(entry.get("o2", {}).get("_id"))
            rt, doc = self.tables.get(f"{db}.{table}"), self.node.store.reader.get(ns, table)
            if rt is not None and doc is not None:
                rt.table = TableDef.from_document(db, doc)
        elif coll == PART_LOG:
            self._rescan = True   # a table was created or dropped: reload the definitions
            if op == "d":
                self._dropped.add(f"{db}.{entry['o']['_id']}")
        elif coll.startswith(f"{PART_LOG}."):
            table, _, what = coll[len(PART_LOG) + 1:].rpartition(".")
            rt = self.tables.get(f"{db}.{table}")
            if rt is None:
                if what == "log":
                    self._rescan = True
            elif what == "log" and op == "i":
                self._enqueue(rt, entry["o"])
            elif what == "log" and op == "d":
                rt.log_entry_removed(str(entry["o"].get("_id")))
            elif what == "replicas":
                self._on_registry_entry(rt, op, entry)
            elif what == "quorum":
                self._on_quorum_entry(rt, ns, op, entry)
            elif what == "blocks":
                self._on_dedup_key_entry(rt, ns, op, entry)
            elif what == "lost" and op == "i":
                self._on_lost(rt, entry["o"])
            elif what == "staged":
                self._on_stage_entry(rt, op, entry)
            elif what == "snapshots":
                self._on_pin_entry(rt, ns, op, entry)
            elif what == "mutations" and op in ("i", "u"):   # recorded, or killed
                doc = entry["o"] if op == "i" else self.node.store.reader.get(ns, entry.get("o2", {}).get("_id"))
                if doc is None:
                    return
                rt.mutation_recorded(Mutation.from_document(doc))
            if rt is not None:
                self._carry_out(rt)

    def _on_registry_entry(self, rt: TableReplica, op: Any, entry: dict[str, Any]) -> None:
        doc, me = entry["o"], self.node.options.me
        if op == "i":
            part, member = str(doc["part"]), str(doc["member"])
            rt.registry_added(part, member, str(doc["http"]), parse_checksums(doc.get("checksums", [])), me)
            self.leader.registered(rt.table.ns, part, member)
        elif op == "d":
            part, _, member = str(doc["_id"]).rpartition("@")
            rt.registry_removed(part, member, me)
        self.registry_moved.fire()

    def _on_stage_entry(self, rt: TableReplica, op: Any, entry: dict[str, Any]) -> None:
        """A job's stage recorded, or removed (committed, aborted, timed out): a removed stage's files here
        go, unless a GET_PART of its job is about to publish them (`runtime.adopt_temporary`)."""
        if op in ("i", "u"):   # recorded, or sent again
            stage_id = entry["o"]["_id"] if op == "i" else entry.get("o2", {}).get("_id")
            doc = self.node.store.reader.get(f"{rt.table.db}.{PART_LOG}.{rt.table.name}.staged", stage_id)
            if doc is not None:
                rt.jobs.stage_recorded(str(stage_id), stage_of(doc))
        elif op == "d":
            # Its files go once that removal is majority-committed (`_sweep_stages`): until then a job this
            # member published them for may be rolled back, and its commit's retry needs them again.
            stage_id = str(entry["o"].get("_id"))
            rt.jobs.stage_removed(stage_id)
            self._stages_gone[(rt.table.ns, stage_id)] = OpTime.from_document(entry)

    def _on_pin_entry(self, rt: TableReplica, ns: str, op: Any, entry: dict[str, Any]) -> None:
        """A read snapshot pinned, marked expired (its parts go as any old part; its key is refused), or
        forgotten."""
        if op == "d":
            rt.unpin(str(entry["o"].get("_id")))
            self.pin_owners.unpinned(rt.table.ns, str(entry["o"].get("_id")))
            return
        key = entry["o"]["_id"] if op == "i" else entry.get("o2", {}).get("_id")
        doc = self.node.store.reader.get(ns, key)
        if doc is not None:
            self._pin(rt, doc)

    def _pin(self, rt: TableReplica, doc: dict[str, Any]) -> None:
        key, parts, until_ms = pin_of(doc)
        if doc.get("expired"):
            rt.unpin(key, expired_at=until_ms)
            self.pin_owners.unpinned(rt.table.ns, key)
        else:
            rt.pin(key, parts, until_ms)
            self.pin_owners.pinned(rt.table.ns, key, str(doc.get("owner", "")))

    @staticmethod
    def _stages_in_use(rt: TableReplica) -> set[str]:
        """The stages a queued (or inert) GET_PART of this member may still publish from."""
        docs = itertools.chain(rt.docs.values(), *(d.values() for d in rt.jobs.pending.values()))
        return {str(d["blockId"]) for d in docs if d.get("job") is not None and "blockId" in d}

    def _on_lost(self, rt: TableReplica, doc: dict[str, Any]) -> None:
        rt.part_lost(str(doc.get("part", "")), str(doc.get("reason", "")))
        self.registry_moved.fire()

    def _on_dedup_key_entry(self, rt: TableReplica, ns: str, op: Any, entry: dict[str, Any]) -> None:
        """A dedup key written (remembered, newest last) or removed (the stale oldest ones forgotten)."""
        reader = self.node.store.reader
        if op in ("i", "u"):
            doc = reader.get(ns, entry["o"]["_id"] if op == "i" else entry.get("o2", {}).get("_id"))
            if doc is not None:
                rt.remembered.append(remembered(doc))
        elif op == "d":
            rt.drop_stale_keys(lambda block_id: reader.get(ns, block_id))

    def _on_quorum_entry(self, rt: TableReplica, ns: str, op: Any, entry: dict[str, Any]) -> None:
        block_id = entry["o"]["_id"] if op in ("i", "d") else entry.get("o2", {}).get("_id")
        doc = self.node.store.reader.get(ns, block_id)
        rt.quorum_settled(str(block_id))
        if doc is not None and doc.get("status") == PENDING:
            rt.quorum_pending(str(doc["part"]), str(block_id))
        elif doc is not None and doc.get("status") == REACHED:
            rt.quorum_was_reached(str(doc["part"]))
        self.registry_moved.fire()

    def _enqueue(self, rt: TableReplica, doc: dict[str, Any]) -> None:
        try:
            rt.log_doc(doc)
        except (KeyError, TypeError, ValueError, MongoError, PartsIntersect) as exc:
            # Not a log document this member can use: skipped, not a reason to rebuild again and again.
            log.warning("part log document %r of %s is skipped: %s", doc.get("_id"), rt.table.ns, exc)

    # -- carrying out the core's decisions ---------------------------------------------------------

    def _carry_out(self, rt: TableReplica) -> None:
        """The core's actions, in order (`oplog.parts.table_replica`): file work goes to threads, and
        reports back to the core when it is done."""
        ns, me = rt.table.ns, self.node.options.me
        for action in rt.take_actions():
            if isinstance(action, Run):
                self._spawn(self._execute(rt, action))
            elif isinstance(action, SetAside):
                self._spawn(self._move_aside(rt, action))
            elif isinstance(action, Held):
                self._held(rt, action)
            elif isinstance(action, (Registered, Unlogged)):
                self.held.own.pop((ns, action.part), None)
                self.held.gone.pop((ns, action.part), None)
            elif isinstance(action, NotHeld):
                self.leader.not_held(ns, action.part, action.member)
            elif isinstance(action, Gone):
                self.held.own.pop((ns, action.part), None)
                if self.node.is_primary:
                    self.leader.not_held(ns, action.part, me)
                else:   # reported upstream until the primary removed the registration
                    self.held.gone[(ns, action.part)] = None
                    self.node.repl.holdings_changed()
            elif isinstance(action, RemoveOld):
                self._spawn(asyncio.to_thread(shutil.rmtree, os.path.join(rt.directory, action.part), True))
            elif isinstance(action, Check):
                self._spawn(self._check(rt, action.part))
            elif isinstance(action, Moved):
                if self.node.is_primary:
                    self.leader.parts_arrived(rt)
                self.parts_moved.fire()
        self._wake.fire()

    def _spawn(self, work: Any) -> None:
        task = asyncio.get_running_loop().create_task(work)
        self._running.add(task)
        task.add_done_callback(self._running.discard)

    async def _move_aside(self, rt: TableReplica, action: SetAside) -> None:
        try:
            await asyncio.to_thread(part_files.set_aside, rt.directory, action.part, action.prefix,
                                    wall_s=self.clock.wall_ms() // 1000)
        finally:
            if self.tables.get(rt.table.ns) is rt:
                rt.set_aside_done(action.part, self.clock.monotonic_ms())
                self._carry_out(rt)

    # -- damaged parts ---------------------------------------------------------------------------

    def check_for_read(self, ns: str, part: str) -> None:
        """Before a read here uses `part` (on a query's thread): OperationFailed if this member's copy is not
        the bytes recorded for it (the part is then set aside and fetched again from a replica)."""
        rt = self.tables.get(ns)
        if rt is None:
            return
        why = part_damage(rt, part, self.node.options.me, whole=False, now_ms=self.clock.monotonic_ms())
        if why is not None:
            self.report_damage(ns, part, why)
            raise MongoError(OPERATION_FAILED, f"part {part} of {ns} is damaged on this member ({why}): it is "
                                               "set aside and fetched again from a replica; read from another "
                                               "member or retry")

    def damage_for_serving(self, ns: str, part: str) -> str | None:
        """Before this member sends `part` to a replica (on a thread): why it must not (None: it may)."""
        rt = self.tables.get(ns)
        if rt is None:
            return None
        why = part_damage(rt, part, self.node.options.me, whole=False, now_ms=self.clock.monotonic_ms(),
                          send=True)
        if why is not None:
            self.report_damage(ns, part, why)
        return why

    def report_damage(self, ns: str, part: str, why: str) -> None:
        """This member's copy of `part` failed its checksums (from any thread)."""
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._on_damage, ns, part, why)

    def _on_damage(self, ns: str, part: str, why: str) -> None:
        rt = self.tables.get(ns)
        if rt is not None:
            self._damaged(rt, part, why)

    def _damaged(self, rt: TableReplica, part: str, why: str) -> None:
        if part in rt.broken:
            return
        log.error("part %s of %s is damaged (%s): setting it aside as %s%s and fetching it again",
                  part, rt.table.ns, why, BROKEN, part)
        self.node.metrics.parts_broken.inc()
        rt.damaged(part, self.node.options.me)
        self._carry_out(rt)

    def _check_schedule(self) -> None:
        """The part checks on a schedule (`TableReplica.check_due`), looked at once a `PART_CHECK_TICK_S`."""
        now = self.clock.monotonic()
        if now < self._next_part_check or self._checking:
            return
        self._next_part_check = now + PART_CHECK_TICK_S
        for rt in self.tables.values():
            rt.check_due(self.clock.monotonic_ms())
            self._carry_out(rt)

    async def _check(self, rt: TableReplica, part: str) -> None:
        self._checking.add(part)
        try:
            why = await asyncio.to_thread(part_damage, rt, part, self.node.options.me, whole=True,
                                          now_ms=self.clock.monotonic_ms())
        finally:
            self._checking.discard(part)
        if why is not None and self.tables.get(rt.table.ns) is rt:
            self._damaged(rt, part, why)

    # -- running tasks ---------------------------------------------------------------------------

    def _schedule(self) -> None:
        now = self.clock.monotonic_ms()
        for rt in list(self.tables.values()):
            rt.schedule(now)
            self._carry_out(rt)

    async def _execute(self, rt: TableReplica, run: Run) -> None:
        entry = run.entry
        assert entry.new_part is not None
        error, produced, checksums = "", entry.new_part, {}
        signature: part_files.Signature = ()
        try:
            await asyncio.to_thread(os.makedirs, rt.directory, exist_ok=True)
            made = None
            if run.how == "drop":
                made = {}   # nothing to do on disk: the queue drops what it covers; the parts age out
            elif run.how == "get":   # an insert on this member published it already
                made = await asyncio.to_thread(self._published_here, rt, entry.new_part.name,
                                               rt.docs.get(entry.node_name, {}))
                if made is None:   # or wrote it, and the commit's reply is late or was lost
                    made = await asyncio.to_thread(self._adopt_own, rt, entry.new_part.name,
                                                   rt.docs.get(entry.node_name, {}))
            elif run.how == "produce":
                made = await self._produce_here(rt, entry, run.verify)
            if made is not None:
                checksums = made
            else:
                produced, checksums = await self._fetch(rt, entry)
            if run.how != "drop":   # its bytes were just checked: the first read need not hash them again
                signature = await asyncio.to_thread(part_files.part_signature,
                                                    os.path.join(rt.directory, produced.name))
        except (FetchFailed, MongoError, OSError) as exc:
            error = str(exc) or type(exc).__name__
            log.info("%s of %s failed: %s", entry.node_name, rt.table.ns, error)
        except Exception as exc:   # a bug: the task backs off, the runner goes on
            error = f"{type(exc).__name__}: {exc}"
            log.exception("%s of %s failed", entry.node_name, rt.table.ns)
        finally:
            if self.tables.get(rt.table.ns) is rt:
                now = self.clock.monotonic_ms()
                rt.task_finished(entry, now, error=error, produced=None if error else produced,
                                 checksums=checksums, me=self.node.options.me)
                if not error and signature:
                    rt.verified(produced.name, signature, now, whole=True)
                self._carry_out(rt)
            self._wake.fire()

    def _adopt_own(self, rt: TableReplica, part: str, doc: dict[str, Any]) -> Checksums | None:
        if doc.get("source") != self.node.options.me or "blockId" not in doc:
            return None
        found = adopt_temporary(rt.directory, str(doc["blockId"]), part, parse_checksums(doc.get("checksums", [])))
        if found is not None:
            log.debug("published %s of %s, written here by an insert: the log named it before the commit's "
                      "reply came (or instead of it)", part, rt.table.ns)
            # The insert's commit may still be under way: if this entry is rolled back and the commit's retry
            # takes the same name on the new primary, the insert answers with this very directory. A rebuild
            # that finds it unlogged meanwhile parks it instead of setting it aside (the part's only copy).
            self.inserting(rt.table.ns, [part])
        return found

    @staticmethod
    def _claim_name(rt: TableReplica, part: PartInfo, expected: Checksums,
                    report_damage: Callable[[str, str, str], None] | None = None, *,
                    clock: Clock) -> Checksums | None:
        """Before a part is fetched or made here: a directory of its name may be here already - fetched
        just now for another task (a covering part), or a copy a rolled-back history left (outside the
        active set once the part covering it was set aside as a conflict). Its checksums when its bytes
        are `expected`'s: nothing to do. Other bytes, and not a part of the queue's: set aside."""
        path = os.path.join(rt.directory, part.name)
        if not os.path.isdir(path):
            return None
        try:
            here = part_files.read_checksums(path)
        except (OSError, ValueError, MongoError):
            here = {}
        if here and same_data(here, expected):
            why = part_files.verify_part(path, expected)
            if why is None:
                return here
            if part in rt.queue.current:
                if report_damage is not None:
                    report_damage(rt.table.ns, part.name, why)
            else:
                log.error("part %s of %s here is damaged (%s): setting it aside", part, rt.table.ns, why)
                part_files.set_aside(rt.directory, part.name, part_files.BROKEN_PREFIX,
                                     wall_s=clock.wall_ms() // 1000)
            return None
        if part not in rt.queue.current:
            log.warning("part %s of %s here is not the part the log names: setting it aside", part, rt.table.ns)
            part_files.set_aside(rt.directory, part.name, wall_s=clock.wall_ms() // 1000)
        return None

    @staticmethod
    def _published_here(rt: TableReplica, part: str, doc: dict[str, Any]) -> Checksums | None:
        """The checksums of `part` if this member's directory holds it as the log recorded it."""
        path = os.path.join(rt.directory, part)
        if not os.path.isdir(path):
            return None
        try:
            here = part_files.read_checksums(path)
        except (OSError, ValueError, MongoError):
            return None
        expected = parse_checksums(doc.get("checksums", []))
        if not expected or not same_data(here, expected):
            return None
        if rt.checked.get(part) == part_files.part_signature(path):   # the insert's own files (`published`)
            return here
        return here if part_files.verify_part(path, expected) is None else None

    async def _produce_here(self, rt: TableReplica, entry: QueueEntry, verify: tuple[str, ...]) -> Checksums | None:
        """Merges the sources into the entry's part, or rewrites its source for a mutation, once every byte of
        the sources the core named (`verify`) matched its checksums; None when another member's copy of
        the part has other bytes (the caller fetches that copy instead: replicas end up byte-identical)."""
        assert entry.new_part is not None
        name = entry.new_part.name
        tmp = f"{part_files.TMP_MERGE}{name}_{os.getpid()}_{next(_merge_names)}"
        sources = [p.name for p in entry.source_parts]
        me = self.node.options.me
        for source in verify:   # before a row of it is read
            why = await asyncio.to_thread(part_damage, rt, source, me, whole=True,
                                          now_ms=self.clock.monotonic_ms())
            if why is not None:
                if self.tables.get(rt.table.ns) is rt:
                    self._damaged(rt, source, why)
                raise MongoError(OPERATION_FAILED, f"{source}, a source of {name}, is damaged here ({why}): "
                                                   "it is fetched again first")
        if entry.type is EntryType.MUTATE_PART:
            mutation = rt.mutation_of(entry)
            if mutation is None:
                raise MongoError(8, f"the mutation of {entry.node_name} is not known here yet")
            # (A killed mutation's rewrites logged before the kill still run: every member makes the same bytes.)
            files = await asyncio.to_thread(rewrite_part, rt.directory, sources[0], tmp, rt.table, mutation)
        else:
            files = await asyncio.to_thread(part_files.merge_to_temp, rt.directory, sources, tmp, rt.table)
        try:
            if not rt.merge_result_usable(name, files.checksums, me):
                log.warning("merging into %s of %s gave other bytes than the registered copy: fetching that",
                            name, rt.table.ns)
                return None
            here = await asyncio.to_thread(self._claim_name, rt, entry.new_part, files.checksums,
                                           self.report_damage, clock=self.clock)
            if here is not None:
                return here
            if rt.table.settings.zero_copy:   # every member makes the same bytes: one object, put once
                url = self.node.options.parts_storage
                if url is None:
                    log.warning("%s keeps its parts in shared storage (zeroCopy), and this member has none "
                                "(--partsStorage): fetching %s whole from a member instead", rt.table.ns, name)
                    return None
                key = part_key(rt.table.uuid, entry.new_part.partition_id, files.checksums)
                await asyncio.to_thread(part_files.externalize, os.path.join(rt.directory, tmp), url, key)
            await asyncio.to_thread(part_files.publish, rt.directory, tmp, name)
            return files.checksums
        finally:
            await asyncio.to_thread(shutil.rmtree, os.path.join(rt.directory, tmp), True)

    async def _fetch(self, rt: TableReplica, entry: QueueEntry) -> tuple[PartInfo, Checksums]:
        assert entry.new_part is not None and self._session is not None
        node = self.node
        source = rt.fetch_source(entry.new_part, rt.docs.get(entry.node_name, {}), me=node.options.me,
                                 live=node.live_members(), http_of=node.http_of, choose=node.rng.choice)
        if source is None:
            raise FetchFailed(f"no other live replica is known to have {entry.new_part} or a part covering it")
        http, part, checksums = source
        here = await asyncio.to_thread(self._claim_name, rt, part, checksums, self.report_damage,
                                       clock=self.clock)
        if here is not None:
            return part, here
        storage_problem = await self._adopt_shared(rt, part, checksums, http)
        if storage_problem is None:
            rt.fetched(entry.new_part.name)
            return part, checksums
        try:
            # `peerRoutes` (tests) covers part fetches too: a fault proxy in front of a member's HTTP port.
            await fetch_part(self._session, node.failpoints.peer_route(http), rt.table.ns, part.name,
                             checksums, rt.directory,
                             progress_timeout_s=rt.table.settings.fetch_progress_timeout_ms / 1000,
                             scheme=node.http_scheme, auth=node.member_auth(http))
        except FetchFailed as exc:
            if self.tables.get(rt.table.ns) is rt:
                rt.fetch_failed(entry.new_part.name, part.name, http, missing=isinstance(exc, PartMissing),
                                primary=node.is_primary, http_of=node.http_of)
                self._carry_out(rt)
            if storage_problem:   # partsReplicationQueue shows both
                raise FetchFailed(f"{exc}; before that, from the shared storage: {storage_problem}") from exc
            raise
        rt.fetched(entry.new_part.name)
        node.metrics.part_fetch_bytes.inc(sum(size for size, _digest in checksums.values()))
        return part, checksums

    async def _adopt_shared(self, rt: TableReplica, part: PartInfo, checksums: Checksums, http: str) -> str | None:
        """A zero-copy table's fetch: the part's metadata from the shared storage, its objects checked there
        (`part_files.adopt_shared`); None when done. Otherwise the caller fetches it from `http`, whole: ""
        when the table is not zero-copy, else why the storage could not give it (logged, and shown by
        `partsReplicationQueue` if the fetch from the member fails too)."""
        url = self.node.options.parts_storage
        if not rt.table.settings.zero_copy:
            return ""
        if url is None:
            return "this member has no --partsStorage"
        tmp = f"{part_files.TMP_FETCH}{part.name}_{os.getpid()}_{next(_merge_names)}"
        try:
            key = part_key(rt.table.uuid, part.partition_id, checksums)
            await asyncio.to_thread(part_files.adopt_shared, rt.directory, part.name, url, key, checksums, tmp)
        except (MongoError, OSError) as exc:
            why = exc.errmsg if isinstance(exc, MongoError) else str(exc)
            log.warning("%s of %s from the shared storage failed (%s): fetching it whole from %s", part.name,
                        rt.table.ns, why, http)
            return why
        return None

    def insert_delay(self, ns: str, partitions: list[str]) -> float:
        """ClickHouse's insert backpressure: seconds to wait before committing into these partitions (0 when
        merges keep up), or TooManyParts (an error) past `partsToThrowInsert` active parts in one."""
        rt = self.tables.get(ns)
        if rt is None:
            return 0.0
        settings = rt.table.settings
        worst = max((len(rt.queue.virtual.parts_of(pid)) for pid in partitions), default=0)
        if worst >= settings.parts_to_throw_insert:
            raise MongoError(TOO_MANY_PARTS, f"too many parts ({worst}) in a partition of {ns}: merges are slower "
                                             f"than inserts (partsToThrowInsert {settings.parts_to_throw_insert}); "
                                             "insert bigger blocks, less often")
        if worst < settings.parts_to_delay_insert:
            return 0.0
        over = worst - settings.parts_to_delay_insert + 1
        allowed = settings.parts_to_throw_insert - settings.parts_to_delay_insert + 1
        return float(settings.max_delay_to_insert_ms ** (over / allowed)) / 1000

    def _remove_outdated(self) -> None:
        """Old parts and parked ones (`TableReplica.expire`), looked at once a second at most."""
        now = self.clock.monotonic()
        if now < self._next_outdated_check:
            return
        self._next_outdated_check = now + RETRY_S
        self._sweep_stages()
        for rt in self.tables.values():
            rt.expire(self.clock.monotonic_ms(), self.clock.wall_ms())
            self._carry_out(rt)

    # -- "has part": reports upstream --------------------------------------------------------------

    def _held(self, rt: TableReplica, held: Held) -> None:
        """This member holds a part; the registry should say so."""
        ns, me = rt.table.ns, self.node.options.me
        self.held.gone.pop((ns, held.part), None)   # damaged once, whole again: registered as it stands
        if not held.register:
            return
        checksums = held.checksums if held.checksums is not None else self._checksums_of(rt, held.part)
        if me in rt.holders.get(held.part, {}) or held.part not in rt.logged or not checksums:
            return
        self.held.own[(ns, held.part)] = checksums
        if self.node.is_primary:
            self.leader.register(ns, held.part, me, self.node.options.http_address, checksums)
            self._wake.fire()
        else:
            self.node.repl.holdings_changed()

    def held_report(self) -> list[dict[str, Any]]:
        """`partsHeld` for this member's next position report."""
        return self.held.report(self.clock.monotonic_ms())

    def on_held_report(self, raw: Any) -> None:
        """The `partsHeld` of a position report from a member syncing from us."""
        items = parse_held(raw)
        if not items:
            return
        if not self.node.is_primary:
            if self.held.relay(items, self.clock.monotonic_ms()):
                self.node.repl.holdings_changed()
            return
        for member, http, parts, gone in items:
            for ns, part, checksums in parts:
                self.leader.register(ns, part, member, http, parse_checksums(checksums))
            for ns, part in gone:
                rt = self.tables.get(ns)
                if rt is not None and member in rt.holders.get(part, {}):
                    self.leader.not_held(ns, part, member)
        self._wake.fire()

    async def wait_quorum(self, ns: str, blocks: list[tuple[str, str]], required: int,
                          timeout_s: float) -> list[str]:
        """Each block's quorum status (`registry.quorum_status`) once none is pending, or when `timeout_s`
        passes: `reached`, `pending` or `failed`."""
        deadline = self.clock.monotonic() + timeout_s
        while True:
            statuses = self.quorum_statuses(ns, blocks, required)
            remaining = deadline - self.clock.monotonic()
            if PENDING not in statuses or remaining <= 0:
                return statuses
            await self.registry_moved.wait(remaining)

    def quorum_statuses(self, ns: str, blocks: list[tuple[str, str]], required: int) -> list[str]:
        """For each (block id, part): its status against `required`, from its quorum record and the
        holders the registry lists here."""
        db, _, table = ns.partition(".")
        quorum_ns = state_ns(db, table, "quorum")
        reader, rt = self.node.store.reader, self.tables.get(ns)
        return [quorum_status(reader.get(quorum_ns, block_id) if reader.collection(quorum_ns) else None,
                              len(rt.holders.get(part, {})) if rt is not None else 0, required)
                for block_id, part in blocks]

    async def _wait_until(self, done: Any, timeout_s: float, what: str) -> None:
        """Until `done()` (checked whenever a task finishes here, and every `RETRY_S`); MaxTimeMSExpired (50)
        naming `what` past `timeout_s`."""
        deadline = self.clock.monotonic() + timeout_s
        while not done():
            remaining = deadline - self.clock.monotonic()
            if remaining <= 0:
                raise MongoError(50, f"{what} is not done here within {timeout_s:.0f} s")
            await self.parts_moved.wait(min(remaining, RETRY_S))

    async def wait_parts_active(self, ns: str, parts: Sequence[str], timeout_s: float) -> None:
        """Until each of `parts` (or a part containing it: merged meanwhile) is active here, so that an
        insert this member acknowledges is in its next read (ClickHouse makes an inserted part active on
        the inserting replica before the INSERT returns). A part dropped meanwhile counts as done."""
        wanted = [PartInfo.parse(p) for p in parts]

        def done() -> bool:
            rt = self.tables.get(ns)
            if self._rescan:
                return False
            if rt is None:   # dropped meanwhile (its rows went with it), or not loaded here yet
                db, _, table = ns.partition(".")
                return self.node.store.reader.get(tables_ns(db), table) is None
            return all(rt.queue.current.containing(p) is not None or _dropped_by(rt, p) for p in wanted)

        await self._wait_until(done, timeout_s, f"the inserted parts {', '.join(parts)} of {ns}")

    async def wait_through(self, ns: str, through_key: int, timeout_s: float) -> None:
        """Until what the part log held up to oplog position `through_key` is readable here: the runner
        took in every entry to there, and each new part or drop among the tasks it had queued then is
        carried out (a merge or a mutation under way reads from its sources meanwhile, so it is not
        waited for). `afterClusterTime` reads of parts tables wait on this."""
        deadline = self.clock.monotonic() + timeout_s
        while self._rescan or self._seen_key < through_key:
            remaining = deadline - self.clock.monotonic()
            if remaining <= 0:
                raise MongoError(50, f"the part log of {ns} is not taken in here through the asked time "
                                     f"within {timeout_s:.1f} s")
            await self.pulled.wait(min(remaining, RETRY_S))
        rt = self.tables.get(ns)
        if rt is None:
            return
        pending = {e.node_name for e in rt.queue.entries if e.type in _CHANGES_ROWS}

        def done() -> bool:
            current = self.tables.get(ns)
            return current is None or not any(e.node_name in pending for e in current.queue.entries)

        await self._wait_until(done, max(0.0, deadline - self.clock.monotonic()),
                               f"the parts of {ns} through the asked time")

    async def wait_mutation(self, ns: str, mutation_id: str, timeout_s: float = 600.0) -> None:
        """Until this member has rewritten every part the mutation affects (or is about to fetch a
        rewritten one). A mutation whose rewrite keeps failing here is an error, with the reason."""
        def done() -> bool:
            rt = self.tables.get(ns)
            mutation = rt.mutations.get(mutation_id) if rt is not None else None
            if rt is None or mutation is None:
                return False
            if mutation.killed:
                raise MongoError(INTERRUPTED, f"mutation {mutation_id} was killed")
            failing = next((e for e in rt.queue.entries if e.type is EntryType.MUTATE_PART and e.num_tries >= 3
                            and rt.docs.get(e.node_name, {}).get("mutation") == mutation_id), None)
            if failing is not None:
                raise MongoError(96, f"mutation {mutation_id} fails on {failing.new_part}: {failing.last_exception}")
            return not parts_to_do(mutation, rt.queue.current) and not parts_to_do(mutation, rt.queue.virtual)

        await self._wait_until(done, timeout_s, f"mutation {mutation_id} (partsMutations shows where it stands)")

    async def wait_job_visible(self, ns: str, job: str, timeout_s: float) -> None:
        """Until every part of the committed job `job` is readable here (`TableReplica.job_visible`)."""
        def done() -> bool:
            rt = self.tables.get(ns)
            return rt is not None and rt.job_visible(job)

        await self._wait_until(done, timeout_s, f"job {job} of {ns}")

    async def wait_metadata(self, ns: str, version: int, timeout_s: float = 600.0) -> None:
        """Until this member's queue adopted metadata version `version` of the table."""
        def done() -> bool:
            rt = self.tables.get(ns)
            return rt is not None and rt.queue.metadata_version >= version

        await self._wait_until(done, timeout_s, f"metadata version {version} of {ns}")

    async def wait_dropped(self, ns: str, drop_range: str, timeout_s: float = 600.0) -> None:
        """Until this member carried out the drop range (its parts no longer read)."""
        def done() -> bool:
            rt = self.tables.get(ns)
            return rt is not None and drop_range in rt.finished_drops

        await self._wait_until(done, timeout_s, f"the drop {drop_range}")

    # -- views -----------------------------------------------------------------------------------

    def queue_view(self, ns: str) -> list[dict[str, Any]]:
        rt = self.tables.get(ns)
        return rt.queue.view(self.clock.monotonic_ms()) if rt is not None else []

    def active_parts(self, ns: str) -> ActivePartSet | None:
        rt = self.tables.get(ns)
        return rt.queue.current if rt is not None else None


def _dropped_by(rt: TableReplica, part: PartInfo) -> bool:
    """Whether a drop range carried out here covers `part` (its rows are gone: nothing to wait for)."""
    return any(PartInfo.parse(drop).contains(part) for drop in rt.finished_drops)
