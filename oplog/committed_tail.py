"""The newest committed oplog entries, in memory: what the readers that follow the oplog's end read.

A tailing getMore (a secondary's fetcher, a change stream) is answered at every commit; each used to read
back, with a SQLite statement, the rows the commit had just written. The store's commits hand their rows
here instead (`SQLiteStore.commit`), and the store's reader answers `oplog_after` from here when it can
(the part log's runner reads its entries this way too). An entry's bytes are `bytes`, never a view of a
message (see `sync.worker.fetched_entries`).

Usable for a read after key K when K >= `floor`: every committed entry newer than `floor` is in the rows,
oldest first. Anything that changes the oplog other than by appending newer entries (a rollback's
truncation, initial sync's drop, a replayed entry that is not newer than the last) makes it unusable at
once, inside that transaction, before it commits; the next commit starts it again from the newest key
SQLite holds. Bounded: past `max_rows` or `max_bytes` the older half is let go (reads before the new
floor go to SQLite).

Thread safety: commits may run on a worker thread while the event loop reads. A reader takes the state
once and the length of its row list once, and only ever reads that prefix; a commit only appends to the
list (one `list.extend`, atomic under the GIL) or replaces the whole state. Pure: no I/O.
"""

from __future__ import annotations

__layer__ = "core"  # pure: no I/O, clock or randomness (tests/unit/test_layering.py)

import bisect
from collections.abc import Sequence
from operator import itemgetter

Row = tuple[int, bytes]

MAX_ROWS = 4096
MAX_BYTES = 8 * 1024 * 1024
_key = itemgetter(0)


class CommittedTail:
    def __init__(self, floor: int | None, *, max_rows: int = MAX_ROWS, max_bytes: int = MAX_BYTES) -> None:
        self._max_rows = max_rows
        self._max_bytes = max_bytes
        self._state: tuple[int, list[Row]] | None = None if floor is None else (floor, [])
        self._bytes = 0

    @property
    def usable(self) -> bool:
        return self._state is not None

    @property
    def last_key(self) -> int | None:
        """The newest key held (or the floor when none is), None when unusable."""
        state = self._state
        if state is None:
            return None
        floor, rows = state
        return rows[-1][0] if rows else floor

    def after(self, key: int, limit: int) -> list[Row] | None:
        """Up to `limit` committed entries newer than `key`, oldest first; None: ask SQLite."""
        state = self._state
        if state is None:
            return None
        floor, rows = state
        if key < floor:
            return None
        end = len(rows)
        start = bisect.bisect_right(rows, key, 0, end, key=_key)
        return rows[start:min(end, start + limit)]

    def cut(self) -> None:
        """The oplog is changed other than by appending newer entries: unusable until the next commit."""
        self._state = None

    def committed(self, rows: Sequence[Row], newest_after_cut: int | None) -> None:
        """A transaction committed that appended `rows` (newer than everything before, in order). After a
        cut, starts again with nothing held and `newest_after_cut` (the newest key the transaction left,
        None: the oplog is empty) as the floor."""
        state = self._state
        if state is None:
            self._state, self._bytes = (0 if newest_after_cut is None else newest_after_cut, []), 0
            return
        if not rows:
            return
        held = state[1]
        held.extend(rows)
        self._bytes += sum(len(blob) for _key_, blob in rows)
        if len(held) > self._max_rows or self._bytes > self._max_bytes:
            dropped = max(1, len(held) // 2)
            kept = held[dropped:]
            self._state = (held[dropped - 1][0], kept)
            self._bytes = sum(len(blob) for _key_, blob in kept)
