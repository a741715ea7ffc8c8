"""Initial sync: how a member with no data (or a resyncing one) becomes a SECONDARY.

A shell, run in state STARTUP2 by `sync.resync.ResyncCoordinator` instead of the
steady-state `SyncWorker`. MongoDB's logical initial sync, simplified:

1. **Start over.** Pick a sync source with the runtime's choice (healthy
   PRIMARY/SECONDARY, closest by ping, deny list honoured). A member that still
   holds data of its own (not a flagged partial copy) first copies its database
   file to `<dbpath>/rollback/resync-<UTC time>/`. In one fsynced
   transaction: set the durable flag `meta.initialSync`, drop every collection
   outside `local` and empty our oplog. `meta` survives (the term and the vote),
   and so does `local` (the config). A restart while the flag is set starts over
   from this step: whatever an interrupted attempt copied is not data.
2. **beginApplying** = the source's newest oplog entry; its rollback id is read.
3. **Clone**: `listDatabases` -> `listCollections` (options and UUID kept) ->
   `$collStats` (sizes for progress) -> `listIndexes` -> `find` + `getMore` in
   batches of `FIND_BATCH` documents, read with `secondaryPreferred` like the
   fetcher. Each batch goes in as one bulk insert (one transaction); the next
   batch is fetched while the previous one commits. Secondary indexes are not
   built yet: their specs are recorded (`DeferredIndexes`, in memory, one per
   attempt; a failed write fails the attempt, so it never outlives data it no
   longer matches) and built in step 5. Non-unique ones wait too: they cost
   nothing, and building all in recorded order keeps the source's index order.
   Every database but `local` is copied, `config`
   (`config.transactions`: the session records of retryable writes) included.
4. **Apply**: `stopTimestamp` = the source's newest entry now. Its entries from
   beginApplying to stop are fetched; the first must be the beginApplying entry
   (else the source's capped oplog rolled over during the clone, or the source
   rolled back: the attempt fails), and the source must still hold it once the
   last entry is read (trimming removes the oldest entries first, so then none
   was lost between two batches). beginApplying is written to our oplog as the
   seed; the later entries are applied with the idempotent replay
   (`apply_entry(replay=True)`) and appended, in batches. Because every collection
   was read after beginApplying, replaying an entry its copy already holds is
   harmless, but the replay walks through states that never existed on the source
   (old entries over newer copies, each collection copied at its own moment): they
   only hold together at stopTimestamp. So no secondary unique key is checked
   during the replay: `apply_for_initial_sync` runs in the store's
   `deferring_index_builds` mode, where a `createIndexes` entry only records its
   spec and `dropIndexes` / `drop` / `dropDatabase` cancel recorded ones (a rename
   carries them along). The `_id` is the only unique key in force, and the replay
   treats an insert of an existing `_id` as a replacement, so no DuplicateKey is
   expected. There is deliberately no "skip the entry on DuplicateKey" tolerance:
   skipping an entry loses its document when the entries that would have
   restored it are themselves skipped as updates of a missing document. Any
   error, DuplicateKey included, fails the attempt.
5. **Finish**: the source's rollback id must be unchanged; the deferred indexes
   are built (one transaction per collection), unique keys from the data as of
   stop. A DuplicateKey there means the copy is not consistent: the attempt fails
   (and the next one starts over). Then one transaction clears the flag and sets
   lastApplied (our newest entry = stop), and the coordinator moves
   STARTUP2 -> SECONDARY and starts steady-state replication from there. A crash
   before the flag is cleared starts over, so no half-indexed copy is ever used.

A failed attempt (source died, rolled back, or trimmed its oplog) is recorded in
`initialSyncAttempts`, `failedInitialSyncAttempts` counts it, the source is
deny-listed briefly, and the next attempt starts over with the best source after
a backoff (1 s, doubling, at most 30 s). It never gives up: a member that cannot
sync serves nothing, and stopping would only leave it to an operator.

Durability: every clone transaction goes through group commit (fsynced); with
batches of thousands of documents the fsync is a small share of the time, so it
is not relaxed. Progress lives in `progress` (`sync.initial_sync_progress`).
"""

from __future__ import annotations

import asyncio
import datetime
import logging
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import bson

from base.errors import MongoError
from base.optime import NULL_OPTIME, OpTime
from oplog.apply import apply_entry
from oplog.sqlite_store import DeferredIndexes, StoreTxn
from oplog.values import canonical_key
from sync.initial_sync_progress import (
    AttemptInfo,
    CollectionProgress,
    DatabaseProgress,
    InitialSyncProgress,
    elapsed_ms,
)
from sync.peer import PeerClient, PeerError
from sync.source_reads import kill_oplog_cursor, oplog_end, source_command

if TYPE_CHECKING:
    from sync.host import SyncHost

log = logging.getLogger(__name__)

INITIAL_SYNC_META = "initialSync"
MIN_VALID_META = "minValid"  # a rollback's consistency point: meaningless once the data is replaced
FIND_BATCH = 10_000
OPLOG_BATCH = 5_000
COMMAND_TIMEOUT_S = 60.0
SOURCE_DENY_MS = 5_000
MIN_BACKOFF_S = 1.0
MAX_BACKOFF_S = 30.0
STOP_TIMEOUT_S = 5.0
FAIL_POINT_POLL_S = 0.05
DUPLICATE_KEY = 11000
NAMESPACE_NOT_FOUND = 26
CLONE_FAIL_POINT = "initialSyncHangDuringCollectionClone"


class InitialSyncFailed(Exception):
    """This attempt cannot complete (the next one starts over)."""


def retry_delay_s(failed_attempts: int) -> float:
    """Backoff before attempt n+1 after n failures: 1 s, 2 s, 4 s, ... at most 30 s."""
    return min(MIN_BACKOFF_S * float(2 ** max(failed_attempts - 1, 0)), MAX_BACKOFF_S)


class InitialSyncer:
    def __init__(self, node: SyncHost, on_done: Callable[[], None], *, data_saved: bool = False) -> None:
        self.node = node
        self._data_saved = data_saved  # the caller already copied the member's data aside
        self.progress = InitialSyncProgress()
        self.sync_source: str | None = None
        self._on_done = on_done
        self._task: asyncio.Task[None] | None = None
        self._source_rbid = -1  # the sync source's rollback id when the attempt began
        self._deferred = DeferredIndexes()  # this attempt's index builds, made at the stop point

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="initial-sync")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None and not task.done():
            task.cancel()
            await asyncio.wait([task], timeout=STOP_TIMEOUT_S)

    # -- attempts ---------------------------------------------------------------------------------

    async def _run(self) -> None:
        progress, node = self.progress, self.node
        clock = node.clock
        progress.started = node.now()
        while True:
            source = await self._choose_source()
            started = clock.monotonic()
            try:
                await self._attempt(source)
            except (PeerError, MongoError, InitialSyncFailed) as exc:
                status = f"{type(exc).__name__}: {exc}"
            except Exception as exc:  # a bug or a malformed reply must not end initial sync for good
                log.exception("initial sync attempt from %s failed", source)
                status = f"{type(exc).__name__}: {exc}"
            else:
                progress.attempts.append(AttemptInfo(int((clock.monotonic() - started) * 1000), "OK", source,
                                                     self._source_rbid))
                progress.ended = node.now()
                log.info("initial sync from %s done in %d ms: %d bytes cloned, %d entries applied", source,
                         elapsed_ms(progress.started, progress.ended), progress.bytes_copied,
                         progress.applied_ops)
                self.sync_source = None
                self._on_done()
                return
            self.sync_source = None
            progress.failed_attempts += 1
            progress.attempts.append(AttemptInfo(int((clock.monotonic() - started) * 1000), status, source,
                                                 self._source_rbid))
            delay = retry_delay_s(progress.failed_attempts)
            log.warning("initial sync attempt %d from %s failed (%s); starting over in %.0f s",
                        progress.failed_attempts, source, status, delay)
            node.repl.deny(source, SOURCE_DENY_MS)
            await asyncio.sleep(delay)  # backoff before the next attempt; nothing to wait on

    async def _choose_source(self) -> str:
        repl = self.node.repl
        while True:
            source = repl.choose_sync_source(NULL_OPTIME)
            if source is not None:
                return source
            await repl.topology_changed.wait(1.0)

    async def _attempt(self, source: str) -> None:
        node = self.node
        self.progress.new_attempt()
        self.sync_source = source
        self._source_rbid = -1
        self._deferred = DeferredIndexes()
        node.repl.on_fetched()
        log.info("initial sync: starting an attempt from %s", source)
        client = node.peer(source)
        try:
            await self._reset_local_data(source)
            rbid = self._source_rbid = await self._rbid(client)
            begin = await self._newest_entry(client)
            self.progress.begin_applying = begin["ts"]
            await self._hang_while("initialSyncHangBeforeCopyingDatabases")
            await self._clone(client)
            stop = await self._newest_entry(client)
            self.progress.stop = stop["ts"]
            last = await self._apply_oplog(client, begin, OpTime.from_document(stop))
            if await self._rbid(client) != rbid:
                raise InitialSyncFailed(f"the sync source {source} rolled back during the initial sync")
            await self._build_indexes(last)
            await self._finish(last)
        finally:
            client.close()

    async def _command(self, client: PeerClient, body: dict[str, Any]) -> dict[str, Any]:
        return await source_command(client, body, timeout_s=COMMAND_TIMEOUT_S)

    async def _hang_while(self, fail_point: str) -> None:
        if self.node.failpoints.is_on(fail_point):
            log.info("initial sync: fail point %s is on; waiting", fail_point)
        while self.node.failpoints.is_on(fail_point):
            await asyncio.sleep(FAIL_POINT_POLL_S)  # test-only: nothing to wait on but the operator

    # -- step 1: start over -----------------------------------------------------------------------

    async def _reset_local_data(self, source: str) -> None:
        node = self.node
        if not self._data_saved:
            await save_data_aside(node)  # data of its own (not a partial copy) is never dropped unsaved
            self._data_saved = True

        def write(txn: StoreTxn) -> int:
            txn.set_meta(INITIAL_SYNC_META, {"syncSource": source, "started": node.now()})
            txn.delete_meta(MIN_VALID_META)
            dropped = txn.drop_replicated_data()
            node.on_data_dropped()
            return dropped

        dropped = await node.writer.submit(write)
        if dropped:
            log.info("initial sync: dropped %d collections and the oplog", dropped)

    async def _rbid(self, client: PeerClient) -> int:
        reply = await self._command(client, {"replSetGetRBID": 1, "$db": "admin"})
        return int(reply.get("rbid", 0))

    async def _newest_entry(self, client: PeerClient) -> dict[str, Any]:
        entry = await oplog_end(client, newest=True, timeout_s=COMMAND_TIMEOUT_S)
        if entry is None:
            raise InitialSyncFailed("the sync source's oplog is empty")
        return entry

    # -- step 3: clone ----------------------------------------------------------------------------

    async def _clone(self, client: PeerClient) -> None:
        reply = await self._command(client, {"listDatabases": 1, "nameOnly": True, "$db": "admin"})
        names = sorted(str(d["name"]) for d in reply.get("databases", []) if d.get("name") != "local")
        listed: list[tuple[DatabaseProgress, list[dict[str, Any]]]] = []
        for name in names:
            entries = await self._list_collections(client, name)
            db = DatabaseProgress(name, [CollectionProgress(f"{name}.{e['name']}") for e in entries])
            for entry, coll in zip(entries, db.collections):
                await self._size_up(client, name, str(entry["name"]), coll)
            listed.append((db, entries))
        self.progress.databases = [db for db, _ in listed]
        for db, entries in listed:
            db.start = self.node.now()
            for entry, coll in zip(entries, db.collections):
                await self._clone_collection(client, db.name, entry, coll)
            db.end = self.node.now()

    async def _list_collections(self, client: PeerClient, db: str) -> list[dict[str, Any]]:
        reply = await self._command(client, {"listCollections": 1, "cursor": {"batchSize": 100_000}, "$db": db})
        entries = list(reply["cursor"].get("firstBatch", []))
        return sorted((e for e in entries if e.get("type", "collection") == "collection"),
                      key=lambda e: str(e["name"]))

    async def _size_up(self, client: PeerClient, db: str, name: str, coll: CollectionProgress) -> None:
        try:
            reply = await self._command(client, {"aggregate": name, "pipeline": [{"$collStats": {"storageStats": {}}}],
                                                 "cursor": {}, "$db": db})
        except MongoError:
            return  # sizes only feed the progress figures
        batch = reply["cursor"].get("firstBatch", [])
        stats = batch[0].get("storageStats", {}) if batch else {}
        coll.documents_to_copy = int(stats.get("count", 0))
        coll.bytes_to_copy = int(stats.get("size", 0))

    async def _clone_collection(self, client: PeerClient, db: str, entry: dict[str, Any],
                                coll: CollectionProgress) -> None:
        node, ns, name = self.node, coll.ns, str(entry["name"])
        coll.start = node.now()
        try:
            reply = await self._command(client, {"listIndexes": name, "cursor": {"batchSize": 10_000}, "$db": db})
        except MongoError as exc:
            if exc.code != NAMESPACE_NOT_FOUND:
                raise
            coll.end = node.now()  # dropped since it was listed: the oplog replays the drop
            return
        indexes = [dict(spec) for spec in reply["cursor"].get("firstBatch", [])]
        coll.indexes = len(indexes)
        options = dict(entry.get("options") or {})
        uuid = (entry.get("info") or {}).get("uuid")
        await node.writer.submit(lambda txn: txn.create_collection(ns, options, uuid))
        await self._copy_documents(client, db, name, coll)
        for spec in indexes:
            if spec.get("name") != "_id_":
                self._deferred.add(ns, spec)  # built at the stop point (step 5), after the replay
        coll.end = node.now()

    def _clone_fail_point(self, ns: str) -> int | None:
        """numDocsToClone of the test-only `initialSyncHangDuringCollectionClone` when it is on for `ns`."""
        points = self.node.failpoints
        point = points.check(CLONE_FAIL_POINT) if points.is_on(CLONE_FAIL_POINT) else None
        if point is None or point.data.get("namespace") != ns:
            return None
        return max(int(point.data.get("numDocsToClone", 1)), 1)

    async def _copy_documents(self, client: PeerClient, db: str, name: str, coll: CollectionProgress) -> None:
        """find + getMore; each batch is inserted while the next one is on its way."""
        ns = coll.ns
        hang_after = self._clone_fail_point(ns)
        batch_size = hang_after or FIND_BATCH  # a hanging clone stops mid-collection
        reply = await self._command(client, {"find": name, "filter": {}, "batchSize": batch_size, "$db": db})
        cursor = reply["cursor"]
        docs, cursor_id = list(cursor.get("firstBatch", [])), int(cursor.get("id", 0))
        pending: asyncio.Future[None] | None = None
        try:
            while True:
                rows = [(canonical_key(doc["_id"]), bson.encode(doc)) for doc in docs]
                if pending is not None:
                    await pending
                    await self._maybe_hang_in_clone(coll)
                pending = asyncio.ensure_future(self._insert(ns, rows, coll))
                if not cursor_id:
                    break
                reply = await self._command(client, {"getMore": cursor_id, "collection": name,
                                                     "batchSize": batch_size, "$db": db})
                cursor = reply["cursor"]
                docs, cursor_id = list(cursor.get("nextBatch", [])), int(cursor.get("id", 0))
            await pending
        except BaseException:
            if pending is not None and not pending.done():
                pending.cancel()  # the attempt fails: whatever it inserted is dropped by the next one
            raise
        await self._maybe_hang_in_clone(coll)

    async def _insert(self, ns: str, rows: list[tuple[bytes, bytes]], coll: CollectionProgress) -> None:
        if rows:
            await self.node.writer.submit(lambda txn: txn.bulk_insert(ns, rows))
        coll.documents_copied += len(rows)
        coll.bytes_copied += sum(len(blob) for _key, blob in rows)
        coll.fetched_batches += 1

    async def _maybe_hang_in_clone(self, coll: CollectionProgress) -> None:
        """Test-only `initialSyncHangDuringCollectionClone` ({namespace, numDocsToClone}): waits,
        while the fail point is on, once that many documents of the namespace are committed."""
        hang_after = self._clone_fail_point(coll.ns)
        if hang_after is not None and coll.documents_copied >= hang_after:
            await self._hang_while(CLONE_FAIL_POINT)

    # -- step 4: apply the oplog from beginApplying to stop -----------------------------------------

    async def _apply_oplog(self, client: PeerClient, begin: dict[str, Any], stop: OpTime) -> OpTime:
        begin_optime = OpTime.from_document(begin)
        reply = await self._command(client, {"find": "oplog.rs", "filter": {"ts": {"$gte": begin["ts"]}},
                                             "batchSize": OPLOG_BATCH, "$db": "local"})
        cursor = reply["cursor"]
        batch, cursor_id = list(cursor.get("firstBatch", [])), int(cursor.get("id", 0))
        if not batch or OpTime.from_document(batch[0]) != begin_optime:
            raise InitialSyncFailed(
                f"the sync source no longer holds the beginApplying entry {begin_optime}: its oplog rolled "
                "over during the clone (a larger --oplogSizeMB there helps) or it rolled back")
        await self._apply_batch(batch[:1], seed=True)
        batch, last = batch[1:], begin_optime
        try:
            while last.ts_key < stop.ts_key:
                wanted = [e for e in batch if OpTime.from_document(e).ts_key <= stop.ts_key]
                if wanted:
                    await self._apply_batch(wanted, seed=False)
                    last = OpTime.from_document(wanted[-1])
                if len(wanted) < len(batch) or (not cursor_id and last.ts_key < stop.ts_key):
                    break  # past the stop point, or the source has nothing more
                if last.ts_key < stop.ts_key:
                    reply = await self._command(client, {"getMore": cursor_id, "collection": "oplog.rs",
                                                         "batchSize": OPLOG_BATCH, "$db": "local"})
                    cursor = reply["cursor"]
                    batch, cursor_id = list(cursor.get("nextBatch", [])), int(cursor.get("id", 0))
        finally:
            if cursor_id:
                await kill_oplog_cursor(client, cursor_id)
        if last != stop:
            raise InitialSyncFailed(f"the sync source's oplog does not hold the stop point {stop} "
                                    f"(it went on from {last}): it rolled back")
        await self._check_still_holds(client, begin_optime)
        return last

    async def _check_still_holds(self, client: PeerClient, begin: OpTime) -> None:
        """Trimming removes the oldest entries first: while the source still holds beginApplying,
        no entry we read after it can have been trimmed away between two batches."""
        oldest = await oplog_end(client, newest=False, timeout_s=COMMAND_TIMEOUT_S)
        if oldest is None or OpTime.from_document(oldest).ts_key > begin.ts_key:
            raise InitialSyncFailed("the sync source trimmed its oplog past the beginApplying entry while it "
                                    "was being read (a larger --oplogSizeMB there helps)")

    async def _apply_batch(self, entries: list[dict[str, Any]], *, seed: bool) -> None:
        """Applies (unless `seed`) and appends `entries` to our oplog in one transaction."""
        node, progress, deferred = self.node, self.progress, self._deferred

        def write(txn: StoreTxn) -> None:
            rows: list[tuple[int, bytes]] = []
            for entry in entries:
                if not seed:
                    apply_for_initial_sync(txn, entry, deferred)
                blob = bson.encode(entry)
                rows.append((OpTime.from_document(entry).ts_key, blob))
            txn.append_oplog(rows)

        await node.writer.submit(write)
        if not seed:
            progress.applied_ops += len(entries)

    # -- step 5: finish -----------------------------------------------------------------------------

    async def _build_indexes(self, stop: OpTime) -> None:
        """Builds the deferred indexes, one collection per transaction (each on the group commit's
        worker thread, so heartbeats go on); a unique one that does not hold fails the attempt."""
        node, deferred = self.node, self._deferred
        built = 0
        for ns in deferred.namespaces():
            try:
                # Reads every document of the collection for its keys: on a worker thread.
                built += await node.writer.submit(lambda txn, ns=ns: txn.build_deferred_indexes(deferred, ns),
                                                  off_loop=True)
            except MongoError as exc:
                if exc.code != DUPLICATE_KEY:
                    raise
                raise InitialSyncFailed(f"an index of {ns} does not hold at the stop point {stop}, so the copy "
                                        f"is not consistent: {exc}") from exc
        if built:
            log.info("initial sync: built %d secondary indexes at the stop point", built)

    async def _finish(self, last: OpTime) -> None:
        node = self.node

        def write(txn: StoreTxn) -> None:
            txn.delete_meta(INITIAL_SYNC_META)
            node.log.last = last

        await node.writer.submit(write)


def has_data_of_its_own(node: SyncHost) -> bool:
    """An oplog or replicated collections that are not an interrupted initial sync's partial copy."""
    reader = node.store.reader
    if reader.meta(INITIAL_SYNC_META) is not None:
        return False
    return reader.oplog_newest_key() is not None or any(c.db != "local" for c in reader.collections())


def backup_dir(dbpath: str, now: datetime.datetime) -> str:
    return os.path.join(dbpath, "rollback", "resync-" + now.strftime("%Y-%m-%dT%H-%M-%S.%fZ"))


async def save_data_aside(node: SyncHost) -> str | None:
    """Copies the database file to `<dbpath>/rollback/resync-<UTC time>/` when the member holds
    data of its own; returns the copy's path (None: nothing to keep). Raises OSError."""
    if not has_data_of_its_own(node):
        return None
    path = await asyncio.to_thread(node.store.backup_to, backup_dir(node.options.dbpath, node.now()))
    if path is not None:
        log.warning("the member's previous data is kept in %s", path)
    return path


def apply_for_initial_sync(txn: StoreTxn, entry: dict[str, Any], deferred: DeferredIndexes) -> None:
    """Applies one entry of initial sync's replay: idempotently (`replay=True`), with index builds
    recorded in `deferred` instead of made (see step 4 above). Raises whatever the entry raises,
    DuplicateKey included: nothing is skipped."""
    with txn.deferring_index_builds(deferred):
        apply_entry(txn, entry, replay=True)
