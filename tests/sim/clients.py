"""A member answering clients: writes with a write concern, and reads (`replset/wire/crud.py`
plus the write-concern waiters of `replset/replication.py`).

A write on the primary goes through the group commit; once it is durable, the
write concern is checked with the product's `write_concern_satisfied` over the
topology's positions: satisfied -> ack; not primary any more ->
PrimarySteppedDown (189); otherwise a waiter, woken by position reports,
heartbeats and local commits, failed on step-down (189) or at `wtimeout`
(64). `written=True` in an answer says the entry is in the oplog even though
the concern was not confirmed (indeterminate for the client). A "majority"
read returns the value as of the member's commit point. Bounded:
`MAX_WAITERS` waiters.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from oplog.errors import MongoError
from oplog.optime import OpTime
from replset.member import MemberState
from replset.quorum import write_concern_satisfied
from replset.write_concern import WriteConcern, check_satisfiable
from tests.sim import rpc
from tests.sim.disk import Entry, EntryKind
from tests.sim.writer import WriteOp

if TYPE_CHECKING:
    from tests.sim.node import SimNode

MAX_WAITERS = 10_000
INF = 1 << 62


@dataclass(frozen=True, slots=True)
class ClientResult:
    """What a member answers a client: `code` 0 means ok; `written` says the write is in the oplog."""

    code: int
    written: bool = False
    optime: OpTime | None = None
    primary_hint: int = -1
    value: tuple[int, int] | None = None


@dataclass(slots=True)
class Waiter:
    request: rpc.Request
    wc: WriteConcern
    target: OpTime
    deadline_ms: int


class ClientService:
    def __init__(self, node: SimNode) -> None:
        self.node = node
        self.waiters: list[Waiter] = []

    def next_wakeup(self) -> int:
        return min((w.deadline_ms for w in self.waiters), default=INF)

    def primary_hint(self) -> int:
        node = self.node
        primary_id = node.topology.primary_id(node.state, node.term)
        return -1 if primary_id is None else primary_id

    # -- writes -------------------------------------------------------------------------------------

    def on_write(self, req: rpc.Request) -> None:
        node = self.node
        body: rpc.WriteBody = req.body
        if not node.is_primary:
            raise MongoError(10107, "not primary")
        wc = WriteConcern(w=body.w, wtimeout_ms=body.wtimeout_ms, provenance="clientSupplied")

        def run() -> list[Entry]:
            if not node.is_primary:
                raise MongoError(10107, "not primary")
            return [Entry(node.new_optime(node.term), EntryKind.WRITE, body.write_id, body.key, body.value)]

        def done(error: BaseException | None) -> None:
            if isinstance(error, MongoError):
                node.reply(req, ClientResult(error.code, primary_hint=self.primary_hint()))
                return
            self._wait_for_write_concern(req, wc, op.entries[0].optime)

        op = WriteOp("client", run, done)
        if not node.submit(op):
            raise MongoError(64, "too many writes queued")

    def _satisfied(self, wc: WriteConcern, target: OpTime) -> bool:
        node = self.node
        applied, durable = node.topology.positions(node.last_applied, node.last_applied)
        if not node.model.has("wn-counts-other-branches"):
            # Only members in the write's term follow the primary that wrote it; a higher-term
            # optime from another branch sorts above the write without containing it.
            applied = {m: o for m, o in applied.items() if o.term == target.term}
            durable = {m: o for m, o in durable.items() if o.term == target.term}
        return write_concern_satisfied(wc, target, config=node.config, applied=applied, durable=durable,
                                       commit_point=node.commit_point)

    def _wait_for_write_concern(self, request: rpc.Request, wc: WriteConcern, target: OpTime) -> None:
        node = self.node
        error = check_satisfiable(wc, node.config)
        if error is not None:
            node.reply(request, ClientResult(error.code, written=True, optime=target))
        elif self._satisfied(wc, target):
            node.reply(request, ClientResult(0, written=True, optime=target))
        elif not node.is_primary:
            node.reply(request, ClientResult(189, written=True, optime=target))
        elif len(self.waiters) >= MAX_WAITERS:
            node.reply(request, ClientResult(64, written=True, optime=target))
        else:
            deadline = node.now + wc.wtimeout_ms if wc.wtimeout_ms > 0 else INF
            self.waiters.append(Waiter(request, wc, target, deadline))

    def check_waiters(self) -> None:
        if not self.waiters:
            return
        keep = []
        for w in self.waiters:
            if self._satisfied(w.wc, w.target):
                self.node.reply(w.request, ClientResult(0, written=True, optime=w.target))
            else:
                keep.append(w)
        self.waiters = keep

    def fail_waiters(self, code: int) -> None:
        for w in self.waiters:
            self.node.reply(w.request, ClientResult(code, written=True, optime=w.target))
        self.waiters = []

    def expire_waiters(self) -> None:
        now = self.node.now
        if any(w.deadline_ms <= now for w in self.waiters):
            for w in self.waiters:
                if w.deadline_ms <= now:
                    self.node.reply(w.request, ClientResult(64, written=True, optime=w.target))
            self.waiters = [w for w in self.waiters if w.deadline_ms > now]

    # -- reads --------------------------------------------------------------------------------------

    def on_read(self, req: rpc.Request) -> None:
        node = self.node
        body: rpc.ReadBody = req.body
        if not node.is_primary and node.state is not MemberState.SECONDARY:
            raise MongoError(13436, "node is not in primary or recovering state")
        if body.majority:
            value = node.disk.value_at(body.key, node.commit_point)
        else:
            value = node.disk.data.get(body.key)
        node.reply(req, ClientResult(0, value=value))
