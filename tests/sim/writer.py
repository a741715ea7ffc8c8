"""The group-commit writer of one simulated member (`replset/group_commit.py`) over the simulated disk.

The decisions are the product's (`oplog.journal`): which queued ops share a transaction (`batch_cut`: a
rollback runs alone), which commit a flush covers, whom a flush answers, when one is due. This moves
entries and time only. Callers `submit` a `WriteOp`; `commit_next` runs the next transaction at once
(each op's `run` executes "inside the transaction" and may fail alone, like a savepoint) and commits its
entries (applied, not durable); `start_flush` begins a journal flush when the journal says so (the
runner completes it a disk latency later, `flushed`). An op of a `DURABLE` kind is answered after the
flush that covers its commit, as the product's `submit(durable=True)` is; the others at once. A rollback's
transaction commits when its flush ends (see `tests.sim.disk`), and nothing else is written meanwhile.
Bounded: `MAX_QUEUED_WRITES` queued ops.
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from dataclasses import dataclass, field

from base.errors import MongoError
from oplog.journal import Journal, batch_cut
from tests.sim.disk import Disk, Entry

MAX_QUEUED_WRITES = 10_000
DURABLE = frozenset({"noop", "term", "rollback"})   # the product submits these with durable=True


@dataclass(slots=True, eq=False)
class WriteOp:
    """One request to the writer; `run` executes in the transaction, `done` once it is answered."""

    kind: str                      # "client" | "apply" | "noop" | "term" | "rollback"
    run: Callable[[], list[Entry]]
    done: Callable[[BaseException | None], None]
    entries: list[Entry] = field(default_factory=list)
    error: BaseException | None = None


class GroupCommit:
    def __init__(self, disk: Disk) -> None:
        self.disk = disk
        self.queue: collections.deque[WriteOp] = collections.deque()
        self.journal: Journal[WriteOp] = Journal()
        self.flush_upto = 0                                         # the oplog length the running flush covers
        self.rollback: WriteOp | None = None                        # a rollback's transaction, until its flush
        self.rollback_commit: Callable[[], object] | None = None    # set by a rollback op's `run`

    def submit(self, op: WriteOp) -> bool:
        if len(self.queue) >= MAX_QUEUED_WRITES:
            return False
        self.queue.append(op)
        return True

    def commit_next(self, now_ms: int) -> list[WriteOp] | None:
        """Runs and commits the next transaction, if one may start; its ops (None: none ran). The caller
        answers at once those not of a `DURABLE` kind, and those that failed."""
        if not self.queue or self.rollback is not None:
            return None
        taken, alone = batch_cut([op.kind == "rollback" for op in self.queue])
        batch = [self.queue.popleft() for _ in range(taken)]
        entries: list[Entry] = []
        for op in batch:
            try:
                op.entries = op.run()
            except MongoError as exc:
                op.error = exc
                continue
            entries.extend(op.entries)
        if alone:
            self.rollback = batch[0] if batch[0].error is None else None
        else:
            self.disk.commit(entries)
        self.journal.committed(now_ms, [op for op in batch if op.kind in DURABLE and op.error is None])
        return batch

    def want_flush(self) -> None:
        self.journal.want_flush()

    def start_flush(self, now_ms: int) -> bool:
        """Whether a journal flush starts now (the runner ends it with `flushed` a disk latency later)."""
        if self.journal.start_flush(now_ms) is None:
            return False
        self.flush_upto = len(self.disk.oplog)
        return True

    def flushed(self) -> tuple[list[WriteOp], list[Entry]]:
        """The flush ended: the ops it answers, and the entries it made durable."""
        synced = self.disk.sync(self.flush_upto)
        released = self.journal.flushed()
        if self.rollback is not None and self.rollback in released:
            self.rollback = None
            if self.rollback_commit is not None:
                commit, self.rollback_commit = self.rollback_commit, None
                commit()
        return released, synced

    def next_deadline(self) -> int | None:
        return self.journal.next_deadline()
