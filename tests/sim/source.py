"""A member serving other members' oplog reads: tailable cursors, waiting getMores, rollback reads.

As in the product (`replset/wire/crud.py`): `find` on `local.oplog.rs` needs a
PRIMARY or SECONDARY (`check_role`), returns the entries from `{ts: {$gte}}`
and opens a tailable cursor; `getMore` has no role check, hands the positions it carries to the core, and
serves whatever follows the cursor's last key, waiting (awaitData) until the next commit or
`maxTimeMS`. Cursors live in memory (a crash loses them: CursorNotFound, 43).
The rollback runner's reads (our optimes newest first; the documents to
refetch with the source's top) need a readable member too. Bounded: at most
`MAX_CURSORS` cursors (members' cursors, as the product counts them apart from clients'; a cursor
idle for `IDLE_TIMEOUT_MS` expires, and past the bound a new one is refused, never an open one
dropped) and `MAX_PARKED_FETCHES` waiting getMores.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from base.errors import MongoError
from base.member import MemberState
from base.optime import OpTime
from replset import events as ev
from replset.cursors import IDLE_TIMEOUT_MS, MAX_MEMBER_CURSORS
from tests.sim import rpc
from tests.sim.disk import Entry

if TYPE_CHECKING:
    from tests.sim.node import SimNode

MAX_CURSORS = MAX_MEMBER_CURSORS
MAX_PARKED_FETCHES = 64
INF = 1 << 62


@dataclass(frozen=True, slots=True)
class FetchReply:
    entries: tuple[Entry, ...]
    metadata: dict[str, Any]
    cursor: int
    has_required: bool = True     # the source holds the requested minValid entry
    required: OpTime | None = None  # the minValid entry asked about (None: not asked)
    oldest: OpTime | None = None  # the source's oldest entry (a `find` answer only)


class OplogSource:
    def __init__(self, node: SimNode) -> None:
        self.node = node
        self.cursors: collections.OrderedDict[int, int] = collections.OrderedDict()  # id -> last key served
        self.used_at: dict[int, int] = {}  # id -> when it was last used (the cursors least recently used first)
        self.parked: list[tuple[rpc.Request, int]] = []
        self.reports_received = 0   # positions that rode on a getMore

    def next_wakeup(self) -> int:
        return min((deadline for _req, deadline in self.parked), default=INF)

    def check_readable(self) -> None:
        if self.node.state not in (MemberState.PRIMARY, MemberState.SECONDARY):
            raise MongoError(13436, "node is not in primary or recovering state")

    def on_fetch_request(self, req: rpc.Request) -> None:
        node, disk = self.node, self.node.disk
        body: rpc.FetchBody = req.body
        if body.cursor is None:
            self.check_readable()
            index = disk.first_index_at_or_after(body.after.ts_key)
            batch = disk.oplog[index:index + body.limit]
            cursor = self._new_cursor(batch[-1].optime.ts_key if batch else body.after.ts_key - 1)
            has_required = body.required is None or disk.index_of(body.required) is not None
            oldest = disk.oplog[0].optime if disk.oplog else None
            node.reply(req, FetchReply(tuple(batch), node.metadata_document(), cursor, has_required, body.required,
                                       oldest))
            return
        if body.cursor not in self.cursors:
            raise MongoError(43, f"cursor id {body.cursor} not found")
        if body.positions:   # a fetcher's positions, riding on its getMore
            node.ask(lambda token: ev.PositionsIn(body.positions, token))
            self.reports_received += 1
        batch = self._next_batch(body.cursor, body.limit)
        if not batch and body.await_ms > 0 and len(self.parked) < MAX_PARKED_FETCHES:
            self.parked.append((req, node.now + body.await_ms))  # wait_for_oplog: the next commit or maxTimeMS
            return
        node.reply(req, FetchReply(tuple(batch), node.metadata_document(), body.cursor))

    def kill_cursors(self) -> None:
        self.cursors.clear()
        self.used_at.clear()
        for req, _deadline in self.parked:
            self.node.reply(req, None, error="43")
        self.parked = []

    def _new_cursor(self, last_key: int) -> int:
        while self.cursors:   # idle cursors expire (`CursorRegistry.expire`)
            oldest = next(iter(self.cursors))
            if self.node.now - self.used_at[oldest] <= IDLE_TIMEOUT_MS:
                break
            del self.cursors[oldest], self.used_at[oldest]
        if len(self.cursors) >= MAX_CURSORS:   # refused, as the product refuses it: none is dropped
            raise MongoError(96, f"this member holds {len(self.cursors)} open cursors of members")
        cursor = self.node.new_id()
        self.cursors[cursor] = last_key
        self.used_at[cursor] = self.node.now
        return cursor

    def _next_batch(self, cursor: int, limit: int) -> list[Entry]:
        last_key = self.cursors[cursor]
        self.cursors.move_to_end(cursor)
        self.used_at[cursor] = self.node.now
        disk = self.node.disk
        index = disk.first_index_at_or_after(last_key + 1)
        batch = disk.oplog[index:index + limit]
        if batch:
            self.cursors[cursor] = batch[-1].optime.ts_key
        return batch

    def answer_parked(self, *, expired_only: bool = False) -> None:
        """Wakes the waiting getMores (all after a commit; at a tick only those whose time is up)."""
        node = self.node
        keep = []
        for req, deadline in self.parked:
            if expired_only and deadline > node.now:
                keep.append((req, deadline))
                continue
            cursor = req.body.cursor
            if cursor not in self.cursors:
                node.reply(req, None, error="43")
                continue
            batch = self._next_batch(cursor, req.body.limit)
            node.reply(req, FetchReply(tuple(batch), node.metadata_document(), cursor))
        self.parked = keep

    def expire_parked(self) -> None:
        if any(deadline <= self.node.now for _req, deadline in self.parked):
            self.answer_parked(expired_only=True)

    def serve_rollback_read(self, req: rpc.Request) -> Any:
        self.check_readable()
        disk = self.node.disk
        if req.kind == rpc.SCAN:
            before_ts_key, limit = req.body
            return tuple(disk.optimes_newest_first(before_ts_key, limit))
        keys: tuple[int, ...] = req.body
        return ({key: disk.get(key) for key in keys}, disk.last)
