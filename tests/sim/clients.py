"""A member answering clients (`replset/wire/crud.py`): writes with a write concern, and reads.

A write on the primary goes through the group commit; once it is committed
(applied, not yet journaled: as the product's `submit_write(durable=False)`), the
member hands it to the replica core (`Replica.await_write_concern`), which
answers at once or keeps a waiter and wakes it (`Wake`) when positions, the
commit point, a step-down (189) or `wtimeout` (64) decide. `written=True` in an
answer says the entry is in the oplog even though the concern was not
confirmed (indeterminate for the client). A "majority" read returns the value
as of the member's commit point.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from base.errors import MongoError
from base.member import MemberState
from base.optime import OpTime
from replset import events as ev
from replset.write_concern import WriteConcern
from tests.sim import rpc
from tests.sim.disk import Entry, EntryKind
from tests.sim.writer import WriteOp

if TYPE_CHECKING:
    from tests.sim.node import SimNode

INF = 1 << 62


@dataclass(frozen=True, slots=True)
class ClientResult:
    """What a member answers a client: `code` 0 means ok; `written` says the write is in the oplog."""

    code: int
    written: bool = False
    optime: OpTime | None = None
    primary_hint: int = -1
    value: tuple[int, int] | None = None


class ClientService:
    def __init__(self, node: SimNode) -> None:
        self.node = node
        self.waiting: dict[rpc.Request, OpTime] = {}   # the write-concern waiters the core holds

    def primary_hint(self) -> int:
        primary_id = self.node.core.primary_id()
        return -1 if primary_id is None else primary_id

    # -- writes -------------------------------------------------------------------------------------

    def on_write(self, req: rpc.Request) -> None:
        node = self.node
        core = node.core
        body: rpc.WriteBody = req.body
        if not core.is_primary:
            raise MongoError(10107, "not primary")
        wc = WriteConcern(w=body.w, wtimeout_ms=body.wtimeout_ms, provenance="clientSupplied")

        def run() -> list[Entry]:
            if not core.is_primary:
                raise MongoError(10107, "not primary")
            return [Entry(node.new_optime(core.term), EntryKind.WRITE, body.write_id, body.key, body.value)]

        def done(error: BaseException | None) -> None:
            if isinstance(error, MongoError):
                node.reply(req, ClientResult(error.code, primary_hint=self.primary_hint()))
                return
            target = op.entries[0].optime
            self.waiting[req] = target
            node.tell(ev.AwaitWriteConcern(req, wc, target))

        op = WriteOp("client", run, done)
        if not node.submit(op):
            raise MongoError(64, "too many writes queued")

    def wake(self, req: object, error: MongoError | None) -> None:
        """The core's `Wake`: the write concern is satisfied (`error` None) or failed."""
        assert isinstance(req, rpc.Request)
        target = self.waiting.pop(req)
        code = 0 if error is None else error.code
        self.node.reply(req, ClientResult(code, written=True, optime=target))

    # -- reads --------------------------------------------------------------------------------------

    def on_read(self, req: rpc.Request) -> None:
        node = self.node
        body: rpc.ReadBody = req.body
        if not node.is_primary and node.state is not MemberState.SECONDARY:
            raise MongoError(13436, "node is not in primary or recovering state")
        if body.majority:
            value = node.disk.value_at(body.key, node.commit_point)
        else:
            value = node.disk.get(body.key)
        node.reply(req, ClientResult(0, value=value))
