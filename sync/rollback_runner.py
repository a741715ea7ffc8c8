"""Rolling back a diverged member: the I/O around the decisions in `sync.rollback`.

A shell, run by the fetcher (`sync.worker`) in state ROLLBACK once everything it
had buffered is applied; it carries out the steps of a `sync.rollback_flow.RollbackRun`,
which decides how each ends:

1. Walk our oplog and the source's backwards (the source serves
   `{ts: {$lte: <our last>}}` newest first), a window at a time, until the run
   finds the common point, or refuses it (it would undo majority-committed entries).
2. Plan from our entries after the common point (`plan_rollback`), refetch those
   documents by `_id` and recloned collections whole from the source, then read
   the source's newest optime: that is `minValid`, the point we must reach again
   before our data is a consistent snapshot.
3. Write our current versions of every affected document to
   `<dbpath>/rollback/<ns>/<timestamp>.bson` (concatenated BSON, fsynced) so
   nothing is silently dropped.
4. In ONE storage transaction: replace or delete the affected documents, reclone
   the affected collections, truncate our oplog after the common point, store
   `minValid` and the incremented rollback id. A crash before the commit leaves
   the member as it was (it diverges again and redoes the rollback); a crash
   after it leaves a member that resumes from the common point in RECOVERING.
"""

from __future__ import annotations

import asyncio
import logging
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import bson
from bson.codec_options import CodecOptions

from base.errors import MongoError
from base.optime import OpTime
from oplog.codec_options import DOC_OPTIONS
from oplog.durable_files import fsync_path
from oplog.sqlite_store import StoreTxn
from sync.peer import PeerError
from sync.rollback import MAX_ROLLBACK_ENTRIES, RollbackPlan, plan_rollback, recalled
from sync.rollback_flow import SCAN_WINDOW, Ending, Outcome, RollbackRun, ScanStep
from sync.source_reads import kill_oplog_cursor, oplog_end, source_command

if TYPE_CHECKING:
    from sync.host import SyncHost

log = logging.getLogger(__name__)

REFETCH_CHUNK = 500
COMMAND_TIMEOUT_S = 30.0
MIN_VALID_META = "minValid"
RBID_META = "rbid"
REFETCHED_META = "rollbackRefetched"  # what the last rollback refetched: again, if a new one comes first


class RollbackFailed(Exception):
    """No common point within reach, or the source failed mid-way; nothing was changed."""


@dataclass(slots=True)
class SourceCollection:
    ns: str
    options: dict[str, Any]
    uuid: Any
    indexes: list[dict[str, Any]]
    documents: list[dict[str, Any]]


def rollback_dir(dbpath: str) -> str:
    return os.path.join(dbpath, "rollback")


class RollbackRunner:
    """Carries out one `RollbackRun` (drained: its scan starts at our last entry) against its source."""

    def __init__(self, node: SyncHost, run: RollbackRun) -> None:
        self.node = node
        self.run_state = run
        self.source = run.source
        self.client = node.peer(run.source)

    async def run(self) -> Ending:
        """How the run ended; nothing changed unless it is ROLLED_BACK."""
        try:
            return await self._run()
        except (RollbackFailed, PeerError, MongoError) as exc:
            return self.run_state.failed(str(exc))
        finally:
            self.client.close()

    async def _command(self, body: dict[str, Any]) -> dict[str, Any]:
        return await source_command(self.client, body, timeout_s=COMMAND_TIMEOUT_S)

    async def _run(self) -> Ending:
        node, run = self.node, self.run_state
        assert run.our_last is not None
        our_last = run.our_last
        if await self._find_common_point(our_last) is not ScanStep.FOUND:
            assert run.ending is not None
            return run.ending
        common = run.common_point
        assert common is not None
        undone = [bson.decode(blob, DOC_OPTIONS)
                  for _key, blob in node.store.reader.oplog_after(common.ts_key, MAX_ROLLBACK_ENTRIES)]
        plan = plan_rollback(undone)
        if run.refetch_last_rollback:
            plan.merge(recalled(node.store.reader.meta(REFETCHED_META)))
        log.warning("rolling back %d entries after the common point %s (%d documents, %d collections, "
                    "%d databases to refetch from %s)", plan.entries, common, plan.document_count,
                    len(plan.collections), len(plan.databases), self.source)
        documents = await self._refetch_documents(plan)
        collections = await self._reclone(plan)
        run.refetched(await self._source_top())
        saved, files = await asyncio.to_thread(self._save_rollback_files, plan)
        ending = await self._commit(plan, documents, collections)
        if ending.outcome is Outcome.ROLLED_BACK:
            log.warning("rollback done: %d entries undone back to %s, %d documents saved to %s; rbid %d, "
                        "recovering until %s", plan.entries, common, saved, files or "no file", node.rbid,
                        run.min_valid)
        return ending

    # -- 1. the common point ----------------------------------------------------------------------

    async def _find_common_point(self, our_last: OpTime) -> ScanStep:
        reader, run = self.node.store.reader, self.run_state
        our_key = our_last.ts_key + 1
        our_count = 0
        reply = await self._command({
            "find": "oplog.rs", "filter": {"ts": {"$lte": our_last.ts}}, "sort": {"$natural": -1},
            "projection": {"ts": 1, "t": 1}, "batchSize": SCAN_WINDOW, "$db": "local"})
        batch, cursor_id = reply["cursor"].get("firstBatch", []), reply["cursor"].get("id", 0)
        try:
            while True:
                rows = reader.oplog_before(our_key, SCAN_WINDOW) if our_count < MAX_ROLLBACK_ENTRIES else []
                ours = []
                for key, blob in rows:
                    ours.append(OpTime.from_document(bson.decode(blob, DOC_OPTIONS)))
                    our_key = key
                our_count += len(ours)
                step = run.scanned(ours, [OpTime.from_document(doc) for doc in batch],
                                   ours_done=len(rows) < SCAN_WINDOW or our_count >= MAX_ROLLBACK_ENTRIES,
                                   theirs_done=not cursor_id, commit_point=self.node.repl.commit_point)
                if step is not ScanStep.MORE:
                    return step
                batch = []
                if cursor_id:
                    reply = await self._command({"getMore": cursor_id, "collection": "oplog.rs",
                                                 "batchSize": SCAN_WINDOW, "$db": "local"})
                    batch, cursor_id = reply["cursor"].get("nextBatch", []), reply["cursor"].get("id", 0)
        finally:
            if cursor_id:
                await kill_oplog_cursor(self.client, cursor_id)

    # -- 2. refetching ------------------------------------------------------------------------------

    async def _find_all(self, ns: str, filter_: dict[str, Any]) -> list[dict[str, Any]]:
        db, coll = ns.split(".", 1)
        reply = await self._command({"find": coll, "filter": filter_, "batchSize": 10_000, "$db": db})
        docs = list(reply["cursor"].get("firstBatch", []))
        cursor_id = reply["cursor"].get("id", 0)
        while cursor_id:
            reply = await self._command({"getMore": cursor_id, "collection": coll, "batchSize": 10_000,
                                         "$db": db})
            docs.extend(reply["cursor"].get("nextBatch", []))
            cursor_id = reply["cursor"].get("id", 0)
        return docs

    async def _refetch_documents(self, plan: RollbackPlan) -> dict[str, list[dict[str, Any]]]:
        fetched: dict[str, list[dict[str, Any]]] = {}
        for ns in plan.documents:
            ids = plan.ids(ns)
            docs: list[dict[str, Any]] = []
            for start in range(0, len(ids), REFETCH_CHUNK):
                docs.extend(await self._find_all(ns, {"_id": {"$in": ids[start:start + REFETCH_CHUNK]}}))
            fetched[ns] = docs
        return fetched

    async def _reclone(self, plan: RollbackPlan) -> dict[str, SourceCollection | None]:
        """The source's version of every collection to reclone (None: the source has none)."""
        wanted = set(plan.collections)
        listed: dict[str, dict[str, Any]] = {}
        for db in {ns.split(".", 1)[0] for ns in wanted} | plan.databases:
            reply = await self._command({"listCollections": 1, "$db": db})
            for info in reply["cursor"].get("firstBatch", []):
                listed[f"{db}.{info['name']}"] = info
            wanted.update(ns for ns in listed if ns.split(".", 1)[0] in plan.databases)
            wanted.update(info.ns for info in self.node.store.reader.collections(db)
                          if db in plan.databases)
        result: dict[str, SourceCollection | None] = {}
        for ns in sorted(wanted):
            info = listed.get(ns)
            if info is None:
                result[ns] = None
                continue
            db, coll = ns.split(".", 1)
            reply = await self._command({"listIndexes": coll, "$db": db})
            indexes = [dict(spec) for spec in reply["cursor"].get("firstBatch", []) if spec.get("name") != "_id_"]
            result[ns] = SourceCollection(ns, dict(info.get("options", {})), (info.get("info") or {}).get("uuid"),
                                          indexes, await self._find_all(ns, {}))
        return result

    async def _source_top(self) -> OpTime:
        newest = await oplog_end(self.client, newest=True, timeout_s=COMMAND_TIMEOUT_S)
        if newest is None:
            raise RollbackFailed(f"{self.source} has an empty oplog")
        return OpTime.from_document(newest)

    # -- 3. rollback files --------------------------------------------------------------------------

    def _save_rollback_files(self, plan: RollbackPlan) -> tuple[int, list[str]]:
        """Our versions of every document the rollback replaces or deletes, per namespace."""
        reader = self.node.store.reader
        by_ns: dict[str, list[dict[str, Any]]] = {}
        for ns in plan.documents:
            docs = [doc for doc in (reader.get(ns, id_value) for id_value in plan.ids(ns)) if doc is not None]
            if docs:
                by_ns[ns] = docs
        recloned = set(plan.collections)
        for db in plan.databases:
            recloned.update(info.ns for info in reader.collections(db))
        for ns in recloned:
            docs = list(reader.scan(ns)) if reader.collection(ns) is not None else []
            if docs:
                by_ns.setdefault(ns, []).extend(docs)
        dbpath = self.node.options.dbpath
        if dbpath is None:
            if by_ns:
                log.warning("in-memory member: %d rolled-back documents are only logged",
                            sum(map(len, by_ns.values())))
            return sum(map(len, by_ns.values())), []
        stamp = self.node.now().strftime("%Y-%m-%dT%H-%M-%S.%fZ")
        files = []
        for ns, docs in by_ns.items():
            directory = os.path.join(rollback_dir(dbpath), ns)
            os.makedirs(directory, exist_ok=True)
            path = os.path.join(directory, f"{stamp}.bson")
            options = CodecOptions(tz_aware=True)
            with open(path, "wb") as f:
                for doc in docs:
                    f.write(bson.encode(doc, codec_options=options))
                f.flush()
                os.fsync(f.fileno())
            fsync_path(directory)
            files.append(path)
            log.warning("saved %d rolled-back documents of %s to %s", len(docs), ns, path)
        return sum(map(len, by_ns.values())), files

    # -- 4. one transaction -------------------------------------------------------------------------

    async def _commit(self, plan: RollbackPlan, documents: dict[str, list[dict[str, Any]]],
                      collections: dict[str, SourceCollection | None]) -> Ending:
        node, run = self.node, self.run_state
        common, min_valid = run.common_point, run.min_valid
        assert common is not None and min_valid is not None
        refetched = plan.remembered()   # encoded here, not inside the transaction that holds the writer

        def write(txn: StoreTxn) -> Ending | None:
            # Checked again inside the transaction: a batch may have committed since the plan was made
            # (a write in flight when the primary stepped down), and the commit point may have moved.
            ending = run.commit_verdict(node.log.last, node.repl.commit_point)
            if ending is not None:
                return ending
            for ns in plan.documents:
                if txn.collection(ns) is None:
                    continue
                for id_value in plan.ids(ns):
                    txn.delete(ns, id_value)
            for ns, docs in documents.items():
                for doc in docs:
                    _insert(txn, ns, doc)
            for ns, source in collections.items():
                txn.drop_collection(ns)
                if source is None:
                    continue
                txn.create_collection(ns, source.options, source.uuid)
                for spec in source.indexes:
                    txn.create_index(ns, spec)
                for doc in source.documents:
                    _insert(txn, ns, doc)
            txn.truncate_oplog_after(common.ts_key)
            txn.set_meta(MIN_VALID_META, min_valid.to_document())
            txn.set_meta(REFETCHED_META, refetched)
            txn.set_meta(RBID_META, {"rbid": node.rbid + 1})
            node.log.last = common
            node.on_history_replaced()
            return None

        ending = await node.writer.submit(write)
        if ending is not None:
            return ending
        node.rbid += 1
        node.min_valid = min_valid
        return run.committed()


def _insert(txn: StoreTxn, ns: str, doc: dict[str, Any]) -> None:
    # In a savepoint: an insert that fails on a unique index has written the row (and an upsert may have
    # taken an earlier index's keys) by then; all of it goes, not half.
    sp = txn.savepoint()
    try:
        txn.insert(ns, doc, upsert=True)
    except MongoError as exc:
        txn.rollback_to(sp)
        # A unique-index clash with a document the source's later entries change: applying them fixes it.
        log.warning("rollback: refetched document of %s not restored yet: %s", ns, exc)
    else:
        txn.release(sp)


def load_rbid(node: SyncHost) -> int:
    meta = node.store.reader.meta(RBID_META)
    return int(meta["rbid"]) if meta else 0


def load_min_valid(node: SyncHost) -> OpTime | None:
    meta = node.store.reader.meta(MIN_VALID_META)
    return OpTime.from_document(meta) if meta else None
