"""The primary's part-log duties (ClickHouse's leader replica): registering who holds which part, and
choosing merges.

Theory of operation
-------------------
Both write through the primary's own log, one transaction at a time, from the
manager's loop:

* **Registration.** "Has part" reports (`replset.parts.registry`) from every
  member, this one included, collect in `pending`; one transaction writes a
  batch of registry documents, marks quorums reached, and drops the member's
  documents of the parts a merged part replaced. A report is checked against
  the part log first: only parts the log produces are registered.
* **Mutations.** For each part here that a recorded mutation has yet to rewrite
  (and no queued task takes), a MUTATE_PART entry (`_id` `mutate_<new part>`),
  the oldest mutation first; merges wait for parts to reach the same mutation.
* **Merge selection.** After parts arrive here, and every
  `mergeSelectingSleepMS` otherwise, the selector (`oplog.parts.merges.plan_merges`)
  looks at the parts this member has that no queued task already takes, and
  logs a MERGE_PARTS entry for each range it picks (`_id` `merge_<new part>`,
  so a range is never logged twice). Every member, this one included, then
  carries the merge out from its queue. Parts still waiting for their quorum
  are not merged (the quorum counts holders of that very part).

* **The dedup window.** Dedup keys (`<table>.blocks`) that fell out of the
  table's window (`replicatedDeduplicationWindow` blocks,
  `replicatedDeduplicationWindowSeconds`) are removed, oldest first, a batch per
  transaction; the insert's own lookup checks the window as well.

* **Lost parts.** A registration a fetch found false (the member answered it
  has no such part) is removed; a part no member is registered as holding, that
  this member failed to fetch again and again, is recorded `lost` - and so is
  the part of a pending quorum insert no live member has held for a while: the
  quorum failed. Either way the log document that produced the part (an
  inserted part's dedup key) goes, so a retry of that insert is not swallowed.

* **Shared objects.** Every `cleanupDelayPeriodSecs`, the objects of a zero-copy
  table that nothing marks are deleted from the shared storage
  (`replset.parts.shared_gc`; only the primary deletes).
* **Old log entries.** Every `cleanupDelayPeriodSecs`, the log documents that
  no queue needs any more (`oplog.parts.replica_rules.log_entry_obsolete`: a
  part merged or rewritten into one every live member holds, out of the dedup
  window) are removed, a batch per transaction, with the reached quorum record
  of an inserted part - so the log, and every member's memory of it, follow the
  parts that exist, not every part ever inserted.

A member that is not primary does none of this: what it was about to register is
dropped (the reporters report it again to whoever is primary).
"""

from __future__ import annotations

import asyncio
import datetime
import itertools
import logging
from typing import TYPE_CHECKING, Any

from base.clock import Clock
from base.errors import MongoError
from oplog.entry import delete_entry, insert_entry, update_entry
from oplog.parts.blocks import RememberedBlock, forgotten_prefix
from oplog.parts.mutations import Mutation
from oplog.parts.part_info import PartInfo, merged_part, mutated_part
from oplog.parts.table_replica import TableReplica
from oplog.writes import WriteEnv, ensure_collection
from replset.parts.insert import load_table, newest_block, next_counter
from replset.parts.jobs import abort_job_body
from replset.parts.names import state_ns
from replset.parts.registry import (
    PENDING,
    Checksums,
    LostPart,
    Registration,
    forget_holders,
    mark_lost,
    register_holders,
    settle_quorum,
)
from replset.parts.shared_gc import SharedCollector

if TYPE_CHECKING:
    from replset.node import Node

STOP_MERGES = "partsStopMerges"   # fail point: no merges planned while on
log = logging.getLogger(__name__)

REGISTER_BATCH = 1000
MUTATE_BATCH = 100
LOST_CHECK_S = 1.0          # how often the primary looks for lost parts
DEDUP_CHECK_S = 1.0          # how often the primary looks for dedup keys out of the window, per table
FORGET_BATCH = 1000          # dedup keys removed per transaction
MIN_SELECT_INTERVAL_S = 1.0   # merge selection after new parts: at most this often per table
LOG_CLEANUP_BATCH = 1000     # log documents removed per transaction
EXPIRED_PIN_KEEP_MS = 7 * 86_400_000   # an expired read snapshot's key is refused this long, then forgotten


def merge_log_doc(rt: TableReplica, sources: list[PartInfo], seq: int, now: datetime.datetime) -> dict[str, Any]:
    new = merged_part(sources)
    return {"_id": f"merge_{new.name}", "seq": seq, "type": "MERGE_PARTS", "part": new.name,
            "partition": new.partition_id, "sources": [p.name for p in sources], "createTime": now,
            "bytes": sum(rt.logged[p.name].bytes if p.name in rt.logged else 0 for p in sources)}


class Leader:
    def __init__(self, node: Node, tables: dict[str, TableReplica], *, clock: Clock | None = None) -> None:
        self.node = node
        self.clock = node.clock if clock is None else clock
        self.tables = tables   # the manager's (replaced on a rebuild: see `rebind`)
        self.pending: dict[tuple[str, str, str], tuple[str, Checksums]] = {}   # (ns, part, member) -> copy
        self.stale: set[tuple[str, str, str]] = set()   # (ns, part, member): registered, but it has no such part
        self._task: asyncio.Task[None] | None = None
        self._next_lost_check = 0.0
        self._settle_quorums = False   # look at every pending quorum once (a new primary, a rebuild)
        self.collector = SharedCollector(node, self.clock)   # zero-copy tables' objects nothing marks

    def rebind(self, tables: dict[str, TableReplica]) -> None:
        self.tables = tables

    def cancel(self) -> asyncio.Task[None] | None:
        if self._task is not None:
            self._task.cancel()
        return self._task

    def register(self, ns: str, part: str, member: str, http: str, checksums: Checksums) -> None:
        rt = self.tables.get(ns)
        if rt is not None and part in rt.logged and member not in rt.holders.get(part, {}):
            self.pending[(ns, part, member)] = (http, checksums)

    def registered(self, ns: str, part: str, member: str) -> None:
        self.pending.pop((ns, part, member), None)

    def not_held(self, ns: str, part: str, member: str) -> None:
        """A fetch here found that `member` does not have `part` (it answered 404)."""
        self.stale.add((ns, part, member))

    def took_over(self) -> None:
        """This member became primary, or rebuilt its tables while primary. A failover may have kept the
        registrations of a quorum part but not the transaction's last entries (the quorum marked
        reached): every pending quorum is looked at again once."""
        self._settle_quorums = True

    def parts_arrived(self, rt: TableReplica) -> None:
        """Parts changed here (or a mutation arrived): look for merges and rewrites soon, not at once."""
        rt.next_merge_select = min(rt.next_merge_select, self.clock.monotonic() + MIN_SELECT_INTERVAL_S)
        rt.next_mutation_check = min(rt.next_mutation_check, self.clock.monotonic() + MIN_SELECT_INTERVAL_S)

    def step(self, on_done: Any) -> None:
        """Starts the next transaction, if one is due and none is running; `on_done()` when it ends."""
        if not self.node.is_primary:
            self.pending.clear()
            self.collector.forget()
            return
        if self._task is not None:
            return
        todo = self._registrations()
        if todo:
            self._start(self._register(todo), on_done)
            return
        if self._settle_quorums:
            self._settle_quorums = False
            pending = [(rt.table.db, rt.table.name, part, block) for rt in self.tables.values()
                       for part, block in rt.quorum_blocks.items()]
            if pending:
                self._start(self._settle(pending), on_done)
                return
        # Before the work below, which a busy table may have every step: a table's look is due once a
        # cleanupDelayPeriodSecs at most, and must not wait behind it.
        shared = self.collector.due(self.tables)
        if shared is not None:
            self._start(self.collector.collect(shared), on_done)
            return
        if self.stale:
            stale = [(rt.table.db, rt.table.name, part, member) for ns, part, member in self.stale
                     if (rt := self.tables.get(ns)) is not None]
            self.stale.clear()
            self._start(self.node.submit_write(lambda env: forget_holders(env, stale), durable=False), on_done)
            return
        lost = self._lost()
        if lost:
            self._start(self._mark_lost(lost), on_done)
            return
        forget = self._dedup_keys_to_forget()
        if forget:
            self._start(self._forget_dedup_keys(*forget), on_done)
            return
        stale = self._stale_writes()
        if stale:
            self._start(self._abort_stale(*stale), on_done)
            return
        pins = self._expired_pins()
        if pins:
            self._start(self._expire_pins(*pins), on_done)
            return
        forgotten = self._old_pins()
        if forgotten:
            self._start(self._forget_pins(*forgotten), on_done)
            return
        plans = self._merges()
        if plans:
            self._start(self._log_merges(*plans), on_done)
            return
        rewrites = self._mutations()
        if rewrites:
            self._start(self._log_mutations(*rewrites), on_done)
            return
        old = self._old_log_entries()
        if old:
            self._start(self._clear_old_log(*old), on_done)

    def _start(self, work: Any, on_done: Any) -> None:
        async def run() -> None:
            try:
                await work
            except MongoError as exc:
                log.info("the part log's leader work failed: %s", exc)
            finally:
                self._task = None
                on_done()

        self._task = asyncio.get_running_loop().create_task(run(), name="part-log-leader")

    # -- registration ------------------------------------------------------------------------------

    def _registrations(self) -> list[Registration]:
        todo = []
        for (ns, part, member), (http, checksums) in list(self.pending.items())[:REGISTER_BATCH]:
            rt = self.tables.get(ns)
            if rt is None or part not in rt.logged or member in rt.holders.get(part, {}):
                self.pending.pop((ns, part, member), None)
                continue
            todo.append(Registration(rt.table.db, rt.table.name, part, member, http, checksums,
                                     rt.quorum_blocks.get(part), tuple(rt.replaced_registrations(part, member))))
        return todo

    def _members(self) -> list[str]:
        config = self.node.config
        return [m.host for m in config.members] if config is not None else [self.node.options.me]

    async def _register(self, todo: list[Registration]) -> None:
        members = self._members()
        await self.node.submit_write(lambda env: register_holders(env, todo, members), durable=False)
        for reg in todo:
            self.pending.pop((f"{reg.db}.{reg.table}", reg.part, reg.member), None)

    async def _settle(self, pending: list[tuple[str, str, str, str]]) -> None:
        members = self._members()

        def body(env: WriteEnv) -> int:
            return sum(settle_quorum(env, db, table, part, block, members) for db, table, part, block in pending)

        settled = await self.node.submit_write(body, durable=False)
        if settled:
            log.info("%d pending quorum insert(s) had their holders already: marked reached", settled)

    # -- lost parts --------------------------------------------------------------------------------

    def _lost(self) -> list[LostPart]:
        """Parts no member has, as far as the primary can tell (`TableReplica.lost_parts`), looked for once
        every `LOST_CHECK_S`."""
        now = self.clock.monotonic()
        if now < self._next_lost_check:
            return []
        self._next_lost_check = now + LOST_CHECK_S
        me, live = self.node.options.me, self.node.live_members() | {self.node.options.me}
        now_ms, wall_ms = int(now * 1000), self.clock.wall_ms()
        return [LostPart(rt.table.db, rt.table.name, part, log_id, block_id, why)
                for rt in self.tables.values() for part, log_id, block_id, why in rt.lost_parts(me, live, now_ms, wall_ms)]

    async def _mark_lost(self, lost: list[LostPart]) -> None:
        for item in lost:
            log.warning("part %s of %s.%s is lost: %s", item.part, item.db, item.table, item.reason)
        await self.node.submit_write(lambda env: mark_lost(env, lost), durable=False)

    # -- the dedup window ----------------------------------------------------------------------------

    def _dedup_keys_to_forget(self) -> tuple[TableReplica, list[RememberedBlock]] | None:
        """The oldest dedup keys of a table that fell out of its window (ClickHouse's `clearOldBlocks`),
        looked for at most once a second per table. The insert's lookup checks the window too: this
        only keeps the keys from piling up."""
        now = self.clock.monotonic()
        reader = self.node.store.reader
        for rt in self.tables.values():
            if not rt.remembered or now < rt.next_dedup_check:
                continue
            rt.next_dedup_check = now + DEDUP_CHECK_S
            blocks_ns = state_ns(rt.table.db, rt.table.name, "blocks")
            rt.drop_stale_keys(lambda block_id, ns=blocks_ns: reader.get(ns, block_id))
            newest = newest_block(reader, state_ns(rt.table.db, rt.table.name, "counters"))
            settings = rt.table.settings
            n = forgotten_prefix(rt.remembered, newest, window_count=settings.replicated_deduplication_window,
                                 window_secs=settings.replicated_deduplication_window_seconds, limit=FORGET_BATCH)
            if n:
                if n == FORGET_BATCH:
                    rt.next_dedup_check = now   # more may follow this batch
                return rt, list(itertools.islice(rt.remembered, n))
        return None

    async def _forget_dedup_keys(self, rt: TableReplica, keys: list[RememberedBlock]) -> None:
        blocks_ns = state_ns(rt.table.db, rt.table.name, "blocks")

        def body(env: WriteEnv) -> None:
            if env.txn.collection(blocks_ns) is None:
                return
            for key in keys:
                doc = env.txn.get(blocks_ns, key.block_id)
                if doc is not None and int(doc.get("number", -1)) == key.number:   # not written again since
                    env.emit(delete_entry(blocks_ns, key.block_id))

        await self.node.submit_write(body, durable=False)

    # -- merge selection ---------------------------------------------------------------------------

    def _stale_writes(self) -> tuple[TableReplica, list[str]] | None:
        """A table's jobs whose staged blocks waited `stagedPartsTimeoutSecs` for a commit or an abort."""
        wall_ms = self.clock.wall_ms()
        for rt in self.tables.values():
            writes = rt.jobs.stale_writes(wall_ms, rt.table.settings.staged_parts_timeout_secs * 1000)
            if writes:
                return rt, writes
        return None

    async def _abort_stale(self, rt: TableReplica, writes: list[str]) -> None:
        db, name = rt.table.db, rt.table.name
        for write_id in writes:
            reply = await self.node.submit_write(abort_job_body(db, name, write_id), durable=False)
            log.warning("job %s of %s: %d staged blocks waited %d s for a commit or an abort: removed", write_id,
                        rt.table.ns, reply["removed"], rt.table.settings.staged_parts_timeout_secs)

    def _expired_pins(self) -> tuple[TableReplica, list[str]] | None:
        wall_ms = self.clock.wall_ms()
        for rt in self.tables.values():
            keys = rt.expired_pins(wall_ms, LOG_CLEANUP_BATCH) if rt.pins else []
            if keys:
                return rt, keys
        return None

    async def _expire_pins(self, rt: TableReplica, keys: list[str]) -> None:
        """Expired pins stop pinning; their keys stay, refused (`openPartsSnapshot`: a query's late task must
        not get another list), until `EXPIRED_PIN_KEEP_MS` passed."""
        ns = state_ns(rt.table.db, rt.table.name, "snapshots")

        def body(env: WriteEnv) -> None:
            for key in keys:
                if env.txn.collection(ns) is not None and env.txn.get(ns, key) is not None:
                    env.emit(update_entry(ns, key, {"$set": {"expired": True, "parts": []}}))

        await self.node.submit_write(body, durable=False)

    def _old_pins(self) -> tuple[TableReplica, list[str]] | None:
        wall_ms = self.clock.wall_ms()
        for rt in self.tables.values():
            keys = rt.old_expired_keys(wall_ms, EXPIRED_PIN_KEEP_MS, LOG_CLEANUP_BATCH) if rt.expired_keys else []
            if keys:
                return rt, keys
        return None

    async def _forget_pins(self, rt: TableReplica, keys: list[str]) -> None:
        ns = state_ns(rt.table.db, rt.table.name, "snapshots")

        def body(env: WriteEnv) -> None:
            for key in keys:
                if env.txn.collection(ns) is not None and env.txn.get(ns, key) is not None:
                    env.emit(delete_entry(ns, key))

        await self.node.submit_write(body, durable=False)

    def _merges(self) -> tuple[TableReplica, list[list[PartInfo]]] | None:
        if self.node.failpoints.peek(STOP_MERGES) is not None:
            return None
        now, wall_ms = self.clock.monotonic(), self.clock.wall_ms()
        for rt in self.tables.values():
            plans = rt.merges_due(now, wall_ms)
            if plans:
                return rt, plans
        return None

    def _mutations(self) -> tuple[TableReplica, list[tuple[PartInfo, Mutation]]] | None:
        now = self.clock.monotonic()
        for rt in self.tables.values():
            todo = rt.rewrites_due(now, MUTATE_BATCH)
            if todo:
                return rt, todo
        return None

    async def _log_mutations(self, rt: TableReplica, todo: list[tuple[PartInfo, Mutation]]) -> None:
        db, name = rt.table.db, rt.table.name
        log_ns, counters_ns = state_ns(db, name, "log"), state_ns(db, name, "counters")

        def body(env: WriteEnv) -> int:
            load_table(env.txn, db, name)
            ensure_collection(env, log_ns)
            logged = 0
            for part, mutation in todo:
                new = mutated_part(part, mutation.versions[part.partition_id])
                doc_id = f"mutate_{new.name}"
                if env.txn.get(log_ns, doc_id) is not None:
                    continue
                env.emit(insert_entry(log_ns, {
                    "_id": doc_id, "seq": next_counter(env, counters_ns, "seq"), "type": "MUTATE_PART",
                    "part": new.name, "partition": new.partition_id, "sources": [part.name],
                    "mutation": mutation.id, "createTime": env.now,
                    "bytes": rt.logged[part.name].bytes if part.name in rt.logged else 0}))
                logged += 1
            return logged

        await self.node.submit_write(body, durable=False)

    async def _log_merges(self, rt: TableReplica, plans: list[list[PartInfo]]) -> None:
        db, name = rt.table.db, rt.table.name
        log_ns, counters_ns = state_ns(db, name, "log"), state_ns(db, name, "counters")

        def body(env: WriteEnv) -> list[dict[str, Any]]:
            load_table(env.txn, db, name)   # NamespaceNotFound if it was dropped meanwhile
            ensure_collection(env, log_ns)
            docs = []
            for sources in plans:
                doc = merge_log_doc(rt, sources, 0, env.now)
                if env.txn.get(log_ns, doc["_id"]) is not None:
                    continue
                doc["seq"] = next_counter(env, counters_ns, "seq")
                env.emit(insert_entry(log_ns, doc))
                docs.append(doc)
            return docs

        docs = await self.node.submit_write(body, durable=False)
        for doc in docs:
            log.info("merging %s of %s into %s", ", ".join(doc["sources"]), rt.table.ns, doc["part"])

    # -- old log entries -----------------------------------------------------------------------------

    def _old_log_entries(self) -> tuple[TableReplica, list[tuple[str, str | None, bool]]] | None:
        """A table's log documents that can go (`TableReplica.obsolete_log_entries`)."""
        now, wall_ms = self.clock.monotonic(), self.clock.wall_ms()
        members = self.node.live_members() | {self.node.options.me}
        reader = self.node.store.reader
        for rt in self.tables.values():
            blocks_ns = state_ns(rt.table.db, rt.table.name, "blocks")
            doomed = rt.obsolete_log_entries(now, wall_ms, members, lambda block_id, ns=blocks_ns: reader.get(ns, block_id),
                                             LOG_CLEANUP_BATCH)
            if doomed:
                return rt, doomed
        return None

    async def _clear_old_log(self, rt: TableReplica, doomed: list[tuple[str, str | None, bool]]) -> None:
        db, name = rt.table.db, rt.table.name
        log_ns, blocks_ns, quorum_ns = (state_ns(db, name, what) for what in ("log", "blocks", "quorum"))

        def body(env: WriteEnv) -> int:
            if env.txn.collection(log_ns) is None:
                return 0
            has_blocks, has_quorum = env.txn.collection(blocks_ns) is not None, env.txn.collection(quorum_ns) is not None
            removed = 0
            for log_id, block_id, with_quorum in doomed:
                if env.txn.get(log_ns, log_id) is None:
                    continue
                if block_id is not None and has_blocks:
                    key = env.txn.get(blocks_ns, block_id)
                    if key is not None and key.get("log") == log_id:   # written again since the look
                        continue
                env.emit(delete_entry(log_ns, log_id))
                removed += 1
                record = (env.txn.get(quorum_ns, block_id) if block_id is not None and has_quorum and with_quorum
                          else None)
                if record is not None and record.get("log") == log_id and record.get("status") != PENDING:
                    env.emit(delete_entry(quorum_ns, block_id))
            return removed

        removed = await self.node.submit_write(body, durable=False)
        log.debug("removed %d old part-log entries of %s", removed, rt.table.ns)
