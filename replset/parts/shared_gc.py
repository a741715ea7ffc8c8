"""The primary deletes the shared objects of zero-copy tables that nothing marks any more (docs/zero-copy.md).

Every `cleanupDelayPeriodSecs` per zero-copy table, the leader (`replset.parts.leader`) lists the table's
keys in the storage and hands them to the table's `SharedGarbage` (`oplog.parts.shared_garbage`: the
rules) with the keys still marked: the registry's copies, the active and pinned parts the log recorded
checksums for, the blocks jobs staged, and every part directory on this member (published, outdated, set
aside or temporary, all kept by what they name). Each key is looked at once more just before it goes: one
written again since the listing (the same bytes stored anew) is young, and stays. What
it returns is deleted. No other member ever deletes shared objects.
"""

from __future__ import annotations

import asyncio
import logging
import os
from typing import TYPE_CHECKING

from base.clock import Clock
from base.errors import MongoError
from oplog.parts import part_files, shared_storage
from oplog.parts.shared_garbage import SharedGarbage, referenced_keys
from oplog.parts.storage_url import part_key
from oplog.parts.table_replica import TableReplica, parse_checksums
from replset.parts.names import state_ns

if TYPE_CHECKING:
    from replset.node import Node

log = logging.getLogger(__name__)


def local_keys(directory: str) -> set[str]:
    """The keys every zero-copy part directory here names (temporary and set-aside ones included)."""
    keys = set()
    try:
        names = os.listdir(directory)
    except OSError:
        return keys
    for name in names:
        try:
            location = part_files.shared_location(os.path.join(directory, name))
        except (MongoError, OSError):
            continue
        if location is not None:
            keys.add(location[1])
    return keys


class SharedCollector:
    def __init__(self, node: Node, clock: Clock) -> None:
        self.node = node
        self.clock = clock
        self._tables: dict[str, SharedGarbage] = {}   # by table uuid
        self._next: dict[str, float] = {}              # table uuid -> monotonic s of its next look

    def forget(self) -> None:
        """Not primary any more: every table's candidates start over."""
        self._tables.clear()
        self._next.clear()

    def due(self, tables: dict[str, TableReplica]) -> TableReplica | None:
        if self.node.options.parts_storage is None:
            return None
        now = self.clock.monotonic()
        for rt in tables.values():
            uuid = rt.table.uuid
            if rt.table.settings.zero_copy and uuid and now >= self._next.get(uuid, 0.0):
                self._next[uuid] = now + rt.table.settings.cleanup_delay_period_secs
                return rt
        return None

    async def collect(self, rt: TableReplica) -> None:
        url, table = self.node.options.parts_storage, rt.table
        assert url is not None
        storage = shared_storage.for_url(url)
        try:
            stored = await asyncio.to_thread(storage.stored_keys, table.uuid)
        except MongoError as exc:
            log.info("shared objects of %s not looked at: %s", table.ns, exc.errmsg)
            return
        here = await asyncio.to_thread(local_keys, rt.directory)
        # The log keeps an inserted part's document (its dedup key) long after a merge replaced the part:
        # what the log recorded marks only the parts still active or pinned here.
        live = {part.name for part in rt.queue.current} | rt.pinned_parts(self.clock.wall_ms())
        copies = [(part, holder.checksums) for part, by_member in rt.holders.items() for holder in by_member.values()]
        copies += [(part, logged.checksums) for part, logged in rt.logged.items() if part in live]
        marked = referenced_keys(table.uuid, copies) | here | self._staged_keys(rt)
        node = self.node
        if not node.is_primary:
            return
        garbage = self._tables.setdefault(table.uuid, SharedGarbage(table.settings.zero_copy_grace_secs * 1000))
        garbage.grace_ms = table.settings.zero_copy_grace_secs * 1000
        due = garbage.look(stored, marked, now_ms=self.clock.wall_ms(), last=node.last_committed_optime,
                           commit_point=node.majority_commit_point, term=node.term)
        node.metrics.shared_looks.inc()
        for key in due:
            # Written again since the listing (a part of the same bytes stored anew): young, so not now.
            try:
                deleted = await asyncio.to_thread(self._delete_if_old, storage, key, garbage.grace_ms)
            except MongoError as exc:
                log.info("deleting %s of %s failed (looked at again later): %s", key, table.ns, exc.errmsg)
                continue
            if deleted:
                node.metrics.shared_deleted.inc()
                log.info("deleted %s of %s from the shared storage: no member holds it", key, table.ns)

    def _delete_if_old(self, storage: shared_storage.SharedStorage, key: str, grace_ms: int) -> bool:
        written = storage.written_ms(key)
        if written is not None and self.clock.wall_ms() - written < grace_ms:
            return False
        storage.delete(key)
        return True

    def _staged_keys(self, rt: TableReplica) -> set[str]:
        """The keys of the blocks jobs staged and have not committed or aborted (their records name the
        partition and the checksums; a job may take longer than the grace)."""
        staged_ns = state_ns(rt.table.db, rt.table.name, "staged")
        reader = self.node.store.reader
        if reader.collection(staged_ns) is None:
            return set()
        keys = set()
        for doc in reader.scan(staged_ns):
            try:
                keys.add(part_key(rt.table.uuid, str(doc.get("partition", "")), parse_checksums(doc.get("checksums", []))))
            except MongoError:
                continue
        return keys
