"""One rollback, step by step: the state machine both the member and the simulator run.

Theory of operation
-------------------
A fetcher that found our history diverged from its source's (`sync.fetching.react`
said roll back) starts a `RollbackRun` and carries out what it asks, one stage
at a time:

1. **drain**: entries already fetched are applied first (the rollback plans from
   our oplog as it stands); if that takes longer than `DRAIN_TIMEOUT_MS`, the run
   ends without starting and the source is denied for a second.
2. **scan**: both oplogs are read newest first, a window at a time, from our last
   entry down; after each window `scanned` looks for the common point
   (`sync.rollback.find_common_point`). None yet: read more, unless both sides ran
   out (no common point within reach: the member must be resynced). Found: it must
   not be older than the commit point we learned (`majority_committed_past`), or
   the run is **refused** (rolling back would undo majority-committed writes).
3. **refetch**: the shell refetches what the entries after the common point touched
   (and, while a previous rollback's minValid is not reached, what that one
   refetched: `refetch_last_rollback`) and reads the source's newest entry
   (`minValid`); `refetched` records it.
4. **commit**: inside the rollback's one storage transaction the shell asks
   `commit_verdict`: our oplog must still end where the plan was made and the
   commit point must not have passed the common point meanwhile.

Every way the run ends is an `Ending`; the shell hands it to the replica core
(`rolled_back`, `rollback_refused`, `rollback_failed`, or a denied source when the
drain timed out). The shells only move bytes: the member over a peer connection
and SQLite (`sync.rollback_runner`), the simulator over its network and disk.

Pure: optimes in, decisions out; the clock is passed in.
"""

from __future__ import annotations

__layer__ = "core"  # pure: no I/O, clock or randomness (tests/unit/test_layering.py)

import enum
from collections.abc import Sequence
from dataclasses import dataclass, field

from base.optime import OpTime
from sync.rollback import commit_problem, find_common_point, majority_committed_past

DRAIN_TIMEOUT_MS = 5000
SCAN_WINDOW = 1000


class Stage(enum.Enum):
    DRAIN = "applying what was fetched before rolling back"
    SCAN = "finding the common point"
    REFETCH = "refetching what the undone entries touched"
    COMMIT = "committing the rollback"
    ENDED = "ended"


class Outcome(enum.Enum):
    ROLLED_BACK = "rolled back"
    REFUSED = "refused"          # would undo majority-committed entries: RECOVERING, source denied 10 s
    FAILED = "failed"            # nothing changed: back where we were, source denied 1 s
    NOT_STARTED = "not started"  # the drain timed out: nothing changed, source denied 1 s


@dataclass(frozen=True, slots=True)
class Ending:
    outcome: Outcome
    why: str = ""
    common_point: OpTime | None = None
    min_valid: OpTime | None = None


class ScanStep(enum.Enum):
    MORE = "read the next window of both oplogs"
    FOUND = "the common point is found: refetch"
    ENDED = "the run ended (see `ending`)"


@dataclass(slots=True)
class RollbackRun:
    """One rollback against `source`, started at `started_ms` (the drain's deadline counts from it)."""

    source: str
    started_ms: int
    stage: Stage = Stage.DRAIN
    our_last: OpTime | None = None
    common_point: OpTime | None = None
    min_valid: OpTime | None = None
    ending: Ending | None = None
    refetch_last_rollback: bool = False
    ours: list[OpTime] = field(default_factory=list)
    theirs: list[OpTime] = field(default_factory=list)

    # -- 1. drain --------------------------------------------------------------------------------

    @property
    def drain_deadline_ms(self) -> int:
        return self.started_ms + DRAIN_TIMEOUT_MS

    def drain_overdue(self, now: int) -> bool:
        """Checked while entries are still being applied: True ends the run (`NOT_STARTED`)."""
        if self.stage is Stage.DRAIN and now >= self.drain_deadline_ms:
            self._end(Outcome.NOT_STARTED, "the fetched entries were not applied in time")
            return True
        return False

    def drained(self, our_last: OpTime, *, recovering: bool) -> None:
        """Everything fetched is applied and our oplog ends at `our_last`: start scanning from it.

        `recovering`: a previous rollback's minValid is not reached yet, so the documents it refetched
        may hold writes of a branch that lost since: this run refetches them again.
        """
        assert self.stage is Stage.DRAIN, self.stage
        self.stage = Stage.SCAN
        self.our_last = our_last
        self.refetch_last_rollback = recovering

    @property
    def message(self) -> str:
        """What the member's status says while the run goes on."""
        if self.stage is Stage.DRAIN:
            return ""
        return f"rolling back to the common point with {self.source}"

    # -- 2. scan ---------------------------------------------------------------------------------

    def scanned(self, ours: Sequence[OpTime], theirs: Sequence[OpTime], *, ours_done: bool,
                theirs_done: bool, commit_point: OpTime) -> ScanStep:
        """The next window of both oplogs (newest first), each side's end of the scan, and the
        commit point we learned."""
        assert self.stage is Stage.SCAN, self.stage
        self.ours.extend(ours)
        self.theirs.extend(theirs)
        common = find_common_point(self.ours, self.theirs)
        if common is None:
            if ours_done and theirs_done:
                self._end(Outcome.FAILED, f"no common point with {self.source} within {len(self.ours)} of our "
                                          f"entries and {len(self.theirs)} of its entries: this member must be "
                                          "resynced")
                return ScanStep.ENDED
            return ScanStep.MORE
        if majority_committed_past(common, commit_point):
            self._end(Outcome.REFUSED, f"the common point {common} is older than our majority commit point "
                                       f"{commit_point}: rolling back would undo majority-committed writes")
            return ScanStep.ENDED
        self.common_point = common
        self.stage = Stage.REFETCH
        self.ours, self.theirs = [], []
        return ScanStep.FOUND

    # -- 3. refetch ------------------------------------------------------------------------------

    def refetched(self, min_valid: OpTime) -> None:
        """The affected data is refetched; the source's newest entry was `min_valid`."""
        assert self.stage is Stage.REFETCH, self.stage
        self.min_valid = min_valid
        self.stage = Stage.COMMIT

    # -- 4. commit -------------------------------------------------------------------------------

    def commit_verdict(self, our_last_now: OpTime, commit_point: OpTime) -> Ending | None:
        """Asked inside the rollback's transaction: None to commit, else how the run ends instead."""
        assert self.stage is Stage.COMMIT and self.our_last is not None and self.common_point is not None
        problem = commit_problem(self.our_last, our_last_now, self.common_point, commit_point)
        if problem == "refused":
            return self._end(Outcome.REFUSED, f"the commit point {commit_point} passed the common point "
                                              f"{self.common_point} while the rollback was planned")
        if problem:
            return self._end(Outcome.FAILED, problem)
        return None

    def committed(self) -> Ending:
        assert self.stage is Stage.COMMIT
        return self._end(Outcome.ROLLED_BACK, "", self.common_point, self.min_valid)

    def failed(self, why: str) -> Ending:
        """The source failed, or a read or write around the run did: nothing changed."""
        if self.ending is not None:
            return self.ending
        return self._end(Outcome.FAILED, why)

    def _end(self, outcome: Outcome, why: str, common_point: OpTime | None = None,
             min_valid: OpTime | None = None) -> Ending:
        self.stage = Stage.ENDED
        self.ending = Ending(outcome, why, common_point, min_valid)
        return self.ending
