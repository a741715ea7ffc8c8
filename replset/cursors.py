"""Server-side cursors: batches for find/aggregate/listX and tailable oplog cursors.

A cursor owns a lazy iterator of documents. `next_batch` takes up to `batch_size`
documents (at most ~16 MiB); a tailable cursor also has a `refill` function that
yields newly committed documents. Idle cursors expire, like mongod's 10-minute cursor
timeout. The registry is bounded per owner (a user with access control on, a connection
without it: `maxOpenCursorsPerUser`) and in all (`MAX_CURSORS`, memory): a cursor past
either bound is refused, and no open cursor is ever dropped to make room for another
(`replset.owner_shares`). Members' cursors (oplog tailing, initial sync) count apart, so
no client's cursors can keep a member from replicating. Pure with respect to time:
callers pass `now_ms`.
"""

from __future__ import annotations

import itertools
import random
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import bson
from bson.int64 import Int64

from base.errors import MongoError
from replset.owner_shares import Shares

MAX_BATCH_BYTES = 16 * 1024 * 1024
DEFAULT_FIRST_BATCH = 101
MAX_CURSORS = 10_000  # clients' cursors, all together
MAX_CURSORS_PER_USER = 1_000  # the default share of each (`maxOpenCursorsPerUser`)
MAX_MEMBER_CURSORS = 1_000  # members' cursors (one or two per fetching member), apart from clients'
MAX_MEMBER_CURSORS_PER_CONNECTION = 64  # so that one connection's leaked oplog cursors cannot take them all
IDLE_TIMEOUT_MS = 10 * 60 * 1000


@dataclass(slots=True)
class Cursor:
    id: int
    ns: str
    source: Iterator[dict[str, Any]]
    limit: int = 0  # 0: no limit
    returned: int = 0
    tailable: bool = False
    await_data: bool = False
    refill: Callable[[], Iterator[dict[str, Any]]] | None = None
    last_used_ms: int = 0
    exhausted: bool = False
    pending: list[dict[str, Any]] = field(default_factory=list)
    tail_state: dict[str, int] = field(default_factory=dict)
    killed: str = ""  # why the member killed it under a getMore in flight (a rollback, a resync)
    # A cursor whose batches run on the query pool: what is left of its maxTimeMS (see
    # `replset.query_pool.TimeLimit`); None for one served on the event loop.
    time_limit: Any = None
    busy: bool = False  # a batch is being taken on a worker thread
    # The read concern every batch honours (`base.read_concern.ReadConcern`; None: local) and the
    # member's history epoch when the read began (see `replset.wire.read_waits`).
    read_concern: Any = None
    history_epoch: int = 0
    change_stream: Any = None  # a change stream's state (`replset.wire.change_streams.ChangeStream`)
    view: Any = None  # a majority cursor's committed snapshot (`replset.committed_snapshots.MajorityView`)
    owners: tuple[tuple[str, str], ...] = ()  # with auth on: the users whose connection opened it
    counted_as: str = ""  # whose share of open cursors it takes: a user's full name, or a connection's
    member: bool = False  # a member's (counted apart from clients')

    def next_batch(self, batch_size: int) -> list[dict[str, Any]]:
        """Up to `batch_size` documents (0 = the default size), respecting limit and 16 MiB."""
        want = batch_size if batch_size > 0 else DEFAULT_FIRST_BATCH
        if self.limit:
            want = min(want, self.limit - self.returned)
        batch: list[dict[str, Any]] = []
        size = 0
        while len(batch) < want:
            doc = self._next_doc()
            if doc is None:
                break
            doc_size = len(bson.encode(doc))
            if batch and size + doc_size > MAX_BATCH_BYTES:
                self.pending.append(doc)
                break
            batch.append(doc)
            size += doc_size
        self.returned += len(batch)
        if self.limit and self.returned >= self.limit:
            self.exhausted = True
        return batch

    def _next_doc(self) -> dict[str, Any] | None:
        if self.pending:
            return self.pending.pop()
        for doc in self.source:
            return doc
        if self.tailable and self.refill is not None:
            self.source = self.refill()
            for doc in self.source:
                return doc
            return None
        self.exhausted = True
        return None


class CursorRegistry:
    def __init__(self, rng: random.Random, max_cursors: int = MAX_CURSORS,
                 per_owner: int = MAX_CURSORS_PER_USER) -> None:
        self._cursors: OrderedDict[int, Cursor] = OrderedDict()  # least recently used first
        self._rng = rng
        self.shares = Shares("open cursors", "maxOpenCursorsPerUser", per_owner=per_owner, total=max_cursors)
        self._members = Shares("open cursors of members", "members' cursors",
                               per_owner=MAX_MEMBER_CURSORS_PER_CONNECTION, total=MAX_MEMBER_CURSORS)
        self._ids = itertools.count(1)

    def __len__(self) -> int:
        return len(self._cursors)

    def _shares_of(self, cursor: Cursor) -> Shares:
        return self._members if cursor.member else self.shares

    def register(self, cursor: Cursor, now_ms: int) -> None:
        """Keeps `cursor` open, or raises (96) when its owner holds its share, or the member its bound."""
        self.expire(now_ms)
        self._shares_of(cursor).take(cursor.counted_as)
        cursor.last_used_ms = now_ms
        self._cursors[cursor.id] = cursor

    def _pop(self, cursor_id: int) -> Cursor | None:
        """The one way a cursor leaves the registry: its place in its owner's share is free again."""
        cursor = self._cursors.pop(cursor_id, None)
        if cursor is not None:
            self._shares_of(cursor).give_back(cursor.counted_as)
        return cursor

    def new_id(self) -> int:
        while True:
            cid = self._rng.getrandbits(62) or next(self._ids)
            if cid not in self._cursors:
                return cid

    def peek(self, cursor_id: int) -> Cursor | None:
        return self._cursors.get(cursor_id)

    def get(self, cursor_id: int, ns: str, now_ms: int) -> Cursor:
        cursor = self._cursors.get(cursor_id)
        if cursor is None or (now_ms - cursor.last_used_ms > IDLE_TIMEOUT_MS):
            self._pop(cursor_id)
            raise MongoError(43, f"cursor id {cursor_id} not found")
        if cursor.ns != ns:
            raise MongoError(13, f"Requested getMore on namespace '{ns}', but cursor belongs to a "
                                 f"different namespace {cursor.ns}")
        cursor.last_used_ms = now_ms
        self._cursors.move_to_end(cursor_id)
        return cursor

    def kill(self, cursor_id: int) -> bool:
        return self._pop(cursor_id) is not None

    def take(self, cursor_id: int) -> Cursor | None:
        """Removes and returns a cursor (the caller lets its source go where it chooses)."""
        return self._pop(cursor_id)

    def kill_all(self, reason: str) -> int:
        """Kills every cursor, including those a getMore is waiting on (they report `reason`).

        Called when the data or the oplog under them changed history (rollback, resync): a tailing
        fetcher must not read on from a position whose entries were truncated and replaced.
        """
        for cursor in self._cursors.values():
            cursor.killed = reason
        count = len(self._cursors)
        self._cursors.clear()
        self.shares.clear()
        self._members.clear()
        return count

    def expire(self, now_ms: int) -> None:
        while self._cursors:
            cid, cursor = next(iter(self._cursors.items()))
            if now_ms - cursor.last_used_ms <= IDLE_TIMEOUT_MS:
                break
            self._pop(cid)


def cursor_reply(cursor_id: int, ns: str, batch: list[dict[str, Any]], *, first: bool) -> dict[str, Any]:
    key = "firstBatch" if first else "nextBatch"
    return {"cursor": {key: batch, "id": Int64(cursor_id), "ns": ns}, "ok": 1.0}
