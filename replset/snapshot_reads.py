"""`readConcern: {level: "snapshot"}` outside transactions: reads at one point in time, across
batches and across commands.

SQLite keeps one version of each document, so a point in time is served by keeping a read
transaction open there (`SQLiteStore.snapshot`). A snapshot read without `atClusterTime` opens one
at this member's newest applied optime, waits (replset/wire/read_waits.py) until the commit point
has reached that optime (so it
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
from base.optime import OpTime
from base.read_concern import SNAPSHOT_TOO_OLD
from oplog.sqlite_store import SnapshotReader

if TYPE_CHECKING:
    from replset.node import Node

log = logging.getLogger(__name__)

HISTORY_WINDOW_S = 60.0
MAX_SNAPSHOTS = 64


class SnapshotReads:
    def __init__(self, node: Node) -> None:
        self._node = node
        self._kept: OrderedDict[tuple[int, int], tuple[SnapshotReader, asyncio.TimerHandle]] = OrderedDict()

    def kept(self, ts: Timestamp) -> SnapshotReader | None:
        """The snapshot kept at `ts`, if any; SnapshotTooOld if none can serve it (a time that is not
        this member's newest applied optime can only be served by a kept snapshot)."""
        kept = self._kept.get((ts.time, ts.inc))
        if kept is not None:
            return kept[0]
        if ts != self._node.last_committed_optime.ts:
            raise MongoError(SNAPSHOT_TOO_OLD, f"Read timestamp {ts} is older than the oldest available "
                                               "timestamp: this member keeps a snapshot only for "
                                               f"{HISTORY_WINDOW_S:g} s after a read opened it")
        return None

    def take(self) -> tuple[SnapshotReader, OpTime]:
        """A new snapshot of the newest data, and the applied optime it holds (not yet kept: `keep` it
        once the commit point has reached that optime, or close it)."""
        optime = self._node.last_committed_optime
        return self._node.store.snapshot(), optime  # (nothing commits in between: both on the loop)

    def keep(self, reader: SnapshotReader, ts: Timestamp) -> SnapshotReader:
        """Keeps `reader` as the snapshot at `ts` (or the one kept there already)."""
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
