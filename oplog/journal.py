"""Group commit's decisions: which queued writes share a transaction, and which commits a journal flush
makes durable for whom (MongoDB's applied/durable split).

Theory of operation
-------------------
Writes queue up; the writer takes a prefix of the queue into one transaction (`batch_cut`): everything
queued, up to `MAX_BATCH`, but a write whose cost grows with the data runs alone (off the event loop in
the member), and the ones behind it wait for the next transaction. Each transaction that commits gets the
next commit number. A commit is *applied* at once (visible, reported upstream as applied, enough for
`w:1`); it is *durable* once a journal flush that began after it ends.

`Journal` holds the numbers. A write that must be durable before it is answered (a vote, a config, a
rollback) waits for the flush that covers its commit, and asks for one at once. So does anybody who calls
`want_flush` (a `j:true` or `w:"majority"` write, a secondary's applied batch: the core's `Flush`). Any
other commit is flushed within `JOURNAL_COMMIT_INTERVAL_MS` (MongoDB's `journalCommitInterval`). One
flush runs at a time and covers every commit made before it began; commits made meanwhile wait for the
next one, which starts as soon as this one ends if anybody waits for them.

Pure: commit numbers and caller-chosen waiter tokens in, decisions out. The member's writer
(`replset.group_commit`) and the simulator's carry them out with real or simulated storage and time.
"""

from __future__ import annotations

__layer__ = "core"  # pure: no I/O, clock or randomness (tests/unit/test_layering.py)

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

T = TypeVar("T")

MAX_BATCH = 2_000
JOURNAL_COMMIT_INTERVAL_MS = 100
INLINE_FSYNC_LIMIT_S = 0.002   # a flush may hold the event loop while fsyncs take less than this
FSYNC_SMOOTHING = 0.2


def batch_cut(alone: Sequence[bool]) -> tuple[int, bool]:
    """How many of the queued writes (whether each must run alone, in queue order) the next transaction
    takes, and whether it is one that runs alone."""
    if not alone:
        return 0, False
    if alone[0]:
        return 1, True
    taken = 1
    while taken < len(alone) and taken < MAX_BATCH and not alone[taken]:
        taken += 1
    return taken, False


@dataclass(slots=True)
class Journal(Generic[T]):
    """Commit numbers, the flush that runs, and who waits for which commit to be durable."""

    committed_seq: int = 0
    durable_seq: int = 0
    flush_wanted: bool = False               # someone waits: flush as soon as no flush runs
    flushing_seq: int | None = None          # the last commit the running flush covers
    flush_due_ms: int | None = None          # a commit nobody waits for is flushed by then
    waiters: list[tuple[int, T]] = field(default_factory=list)

    def committed(self, now_ms: int, durable: Sequence[T] = ()) -> int:
        """A transaction committed: its number. `durable`: the tokens of its writes that are answered only
        once it is durable (a flush is wanted at once); otherwise one is due within the interval."""
        self.committed_seq += 1
        for token in durable:
            self.waiters.append((self.committed_seq, token))
        if durable:
            self.flush_wanted = True
        elif self.flush_due_ms is None:
            self.flush_due_ms = now_ms + JOURNAL_COMMIT_INTERVAL_MS
        return self.committed_seq

    def want_flush(self) -> None:
        """Somebody waits for durability (`j`, `w:"majority"`, a secondary's applied batch)."""
        self.flush_wanted = True

    def wait_durable(self, token: T, seq: int | None = None) -> bool:
        """`token` waits until commit `seq` (the last one: None) is durable. True: it already is."""
        seq = self.committed_seq if seq is None else seq
        if seq <= self.durable_seq:
            return True
        self.waiters.append((seq, token))
        self.flush_wanted = True
        return False

    @property
    def pending(self) -> bool:
        """Whether a flush was asked for and has not ended yet (not merely due by the interval)."""
        return self.flushing_seq is not None or self.flush_wanted

    def next_deadline(self) -> int | None:
        """When `start_flush` must be asked again without anything else happening (None: never)."""
        if self.flushing_seq is not None or self.flush_wanted:
            return None
        return self.flush_due_ms

    def start_flush(self, now_ms: int) -> int | None:
        """The commit number a flush starting now covers (the caller syncs, then calls `flushed`), or
        None: one runs already, none is wanted or due yet, or everything committed is durable."""
        if self.flushing_seq is not None:
            return None
        if not self.flush_wanted and (self.flush_due_ms is None or now_ms < self.flush_due_ms):
            return None
        self.flush_wanted, self.flush_due_ms = False, None
        if self.committed_seq <= self.durable_seq:
            return None
        self.flushing_seq = self.committed_seq
        return self.flushing_seq

    def flushed(self) -> list[T]:
        """The running flush ended: the tokens whose commits are durable now, in the order they waited.
        Those still waiting want the next flush at once."""
        if self.flushing_seq is not None:
            self.durable_seq = max(self.durable_seq, self.flushing_seq)
            self.flushing_seq = None
        released = [token for seq, token in self.waiters if seq <= self.durable_seq]
        self.waiters = [(seq, token) for seq, token in self.waiters if seq > self.durable_seq]
        if self.waiters:
            self.flush_wanted = True
        return released

    def abandon(self) -> list[T]:
        """Shutting down, or the storage lost what it had not flushed: every waiter, released unanswered."""
        waiting, self.waiters = [token for _seq, token in self.waiters], []
        self.flushing_seq = None
        self.flush_wanted, self.flush_due_ms = False, None
        return waiting


@dataclass(slots=True)
class FsyncPace:
    """Whether a journal flush may run on the event loop: while recent fsyncs are short (a smoothed time
    of each fsync, wherever it ran). One slow fsync (a checkpoint's, a busy neighbour's) moves the smoothed
    time a fifth of the way: a spike of 10 ms sends the next few flushes to the thread, not the next
    seconds' worth; a disk that stays slow keeps them there until it is fast again."""

    limit_s: float = INLINE_FSYNC_LIMIT_S
    smoothed_s: float | None = None

    def observed(self, seconds: float) -> None:
        if self.smoothed_s is None:
            self.smoothed_s = seconds
        else:
            self.smoothed_s += FSYNC_SMOOTHING * (seconds - self.smoothed_s)

    @property
    def inline_ok(self) -> bool:
        return self.smoothed_s is None or self.smoothed_s <= self.limit_s
