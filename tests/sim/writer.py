"""The group-commit writer of one simulated member (`replset/group_commit.py`).

Callers `submit` a `WriteOp`. When no batch is in flight, everything queued
becomes one batch: each op's `run` executes "inside the transaction" (it may
fail alone, like a savepoint), the batch's entries are written unsynced, and
the runner schedules the fsync. When the fsync completes (`finish`) the
entries are durable, the member's commit hook runs, and then each op's `done`
(the futures resolve after the commit). A rollback transaction runs alone in
its batch: it truncates instead of appending. Bounded: `MAX_QUEUED_WRITES`
queued ops, `MAX_BATCH_OPS` per batch.
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from dataclasses import dataclass, field

from base.errors import MongoError
from tests.sim.disk import Disk, Entry

MAX_QUEUED_WRITES = 10_000
MAX_BATCH_OPS = 2_000


@dataclass(slots=True)
class WriteOp:
    """One request to the writer; `run` executes in the transaction, `done` after the fsync."""

    kind: str                      # "client" | "apply" | "noop" | "term" | "rollback"
    run: Callable[[], list[Entry]]
    done: Callable[[BaseException | None], None]
    entries: list[Entry] = field(default_factory=list)
    error: BaseException | None = None


class GroupCommit:
    def __init__(self, disk: Disk) -> None:
        self.disk = disk
        self.queue: collections.deque[WriteOp] = collections.deque()
        self.in_flight: list[WriteOp] | None = None
        self.rollback_commit: Callable[[], object] | None = None   # set by a rollback op's `run`

    def submit(self, op: WriteOp) -> bool:
        if len(self.queue) >= MAX_QUEUED_WRITES:
            return False
        self.queue.append(op)
        return True

    def maybe_start_batch(self) -> bool:
        """Starts the next batch if none is in flight; True when an fsync must be scheduled."""
        if self.in_flight is not None or not self.queue:
            return False
        batch: list[WriteOp] = []
        if self.queue[0].kind == "rollback":
            batch.append(self.queue.popleft())
        else:
            while self.queue and self.queue[0].kind != "rollback" and len(batch) < MAX_BATCH_OPS:
                batch.append(self.queue.popleft())
        entries: list[Entry] = []
        for op in batch:
            try:
                op.entries = op.run()
            except MongoError as exc:
                op.error = exc
                continue
            entries.extend(op.entries)
        self.in_flight = batch
        if self.rollback_commit is None:
            self.disk.write_unsynced(entries)
        return True

    def finish(self) -> tuple[list[WriteOp], list[Entry]]:
        """The fsync completed: make the batch durable; returns its ops and the entries it appended."""
        batch, self.in_flight = self.in_flight or [], None
        if self.rollback_commit is not None:
            commit, self.rollback_commit = self.rollback_commit, None
            commit()
            return batch, []
        return batch, self.disk.sync()
