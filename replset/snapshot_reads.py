"""`readConcern: {level: "snapshot"}` outside transactions: reads at one point in time, across
batches and across commands.

SQLite keeps one version of each document, so a point in time is served by keeping a read
transaction open there (`SQLiteStore.snapshot`). A snapshot read without `atClusterTime` opens one
at this member's newest applied optime, waits until the commit point has reached that optime (so it
answers majority-committed data, as mongod's snapshot reads do) and answers `atClusterTime` with it;
drivers send that time with the session's later reads, which are served from the same snapshot while
it is kept: `HISTORY_WINDOW_S` (mongod's `minSnapshotHistoryWindowInSeconds` is 300; a shorter one
here, because an open snapshot holds the WAL back from being checkpointed) and at most
`MAX_SNAPSHOTS` at once, the oldest let go first. A time no kept snapshot was taken at is
SnapshotTooOld (239) unless it is this member's newest applied optime (a new snapshot serves it).
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from typing import TYPE_CHECKING

from bson.timestamp import Timestamp

from base.errors import MongoError
from base.read_concern import SNAPSHOT_TOO_OLD, ReadConcern
from oplog.sqlite_store import SnapshotReader
from replset.query_pool import TimeLimit

if TYPE_CHECKING:
    from replset.node import Node

log = logging.getLogger(__name__)

HISTORY_WINDOW_S = 60.0
MAX_SNAPSHOTS = 64


class SnapshotReads:
    def __init__(self, node: Node) -> None:
        self._node = node
        self._kept: OrderedDict[tuple[int, int], tuple[SnapshotReader, asyncio.TimerHandle]] = OrderedDict()

    async def open(self, concern: ReadConcern, limit: TimeLimit) -> tuple[SnapshotReader, Timestamp]:
        """The snapshot a read at `concern` answers from, and its time."""
        from replset.wire.read_waits import wait_until

        node = self._node
        wanted = concern.at_cluster_time
        if wanted is not None:
            kept = self._kept.get((wanted.time, wanted.inc))
            if kept is not None:
                return kept[0], wanted
            if wanted != node.last_committed_optime.ts:
                raise MongoError(SNAPSHOT_TOO_OLD, f"Read timestamp {wanted} is older than the oldest available "
                                                   "timestamp: this member keeps a snapshot only for "
                                                   f"{HISTORY_WINDOW_S:g} s after a read opened it")
        optime = node.last_committed_optime
        reader = node.store.snapshot()  # (nothing commits between these two lines: both on the loop)
        try:
            await wait_until(node, lambda: node.majority_commit_point >= optime, limit)
        except BaseException:
            reader.close()
            raise
        return self._keep(reader, optime.ts), optime.ts

    def _keep(self, reader: SnapshotReader, ts: Timestamp) -> SnapshotReader:
        key = (ts.time, ts.inc)
        if key in self._kept:  # another read opened this time meanwhile: one is enough
            reader.close()
            return self._kept[key][0]
        while len(self._kept) >= MAX_SNAPSHOTS:
            self._forget(next(iter(self._kept)))
        timer = asyncio.get_running_loop().call_later(HISTORY_WINDOW_S, self._forget, key)
        self._kept[key] = (reader, timer)
        return reader

    def _forget(self, key: tuple[int, int]) -> None:
        kept = self._kept.pop(key, None)
        if kept is not None:
            kept[1].cancel()
            kept[0].close()

    def close_all(self) -> None:
        for key in list(self._kept):
            self._forget(key)
