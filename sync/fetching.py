"""The fetcher's decisions: does a source continue our oplog, and what to do when fetching fails.

Theory of operation
-------------------
A secondary opens a tailable cursor on its source with `{ts: {$gte: <our last
fetched ts>}}`. The first entry it gets back decides (`check_first_batch`):

* it is our last fetched entry: the source **continues** our oplog;
* nothing comes back, or an entry newer than ours: our entry is **missing** there,
  and the source's oldest entry tells why (`diagnose_missing`): newer than ours
  means the source trimmed what we still need (**too stale**: another source, or a
  resync), otherwise the histories **diverged**;
* an entry at our timestamp with another term: **diverged**;
* we have no entry at all: an initial sync is needed, not fetching.

While RECOVERING after a rollback, the source must also hold the rollback's
`minValid` entry (`check_min_valid`, MongoDB's requiredOpTime): one that went
past it on another branch makes us refetch what the last rollback refetched.

Every way a fetch can end badly gets one reaction (`react`): deny the source for
a while (1 s after an error, 10 s when it cannot serve us), roll back (only to
a source on the current branch: `sync.rollback.stale_branch_problem`), report
being too stale (`sync.too_stale`), or pause before choosing again. Both the
asyncio fetcher (`sync.worker`) and the simulator's follow these answers.

Pure: optimes in, verdicts out.
"""

from __future__ import annotations

__layer__ = "core"  # pure: no I/O, clock or randomness (tests/unit/test_layering.py)

import enum
from dataclasses import dataclass

from base.optime import NULL_OPTIME, OpTime
from sync.rollback import stale_branch_problem

ERROR_DENY_MS = 1000
DIVERGED_DENY_MS = 10_000
PROBLEM_PAUSE_MS = 100


class Verdict(enum.Enum):
    CONTINUES = "the source continues our oplog"
    MISSING = "our last fetched entry is missing from the source"
    DIVERGED = "our last fetched entry is not in the source's oplog: the histories diverged"
    TOO_STALE = "the source trimmed entries we never fetched"
    NO_DATA = "we have no data: an initial sync is needed"
    MIN_VALID_ELSEWHERE = ("the source went past our minValid on another branch: what our last rollback "
                           "refetched must be refetched from it")
    BEFORE_MIN_VALID = "the source has not reached our minValid yet"


class Problem(enum.Enum):
    UNREACHABLE = "the source did not answer"
    ERROR = "the source answered with an error, or a reply we cannot use"
    DIVERGED = Verdict.DIVERGED.value
    TOO_STALE = Verdict.TOO_STALE.value
    NO_DATA = Verdict.NO_DATA.value
    MIN_VALID_ELSEWHERE = Verdict.MIN_VALID_ELSEWHERE.value
    BEFORE_MIN_VALID = Verdict.BEFORE_MIN_VALID.value


@dataclass(frozen=True, slots=True)
class Reaction:
    deny_ms: int = 0
    roll_back: bool = False
    too_stale: bool = False
    pause_ms: int = 0
    message: str = ""


def check_first_batch(first: OpTime | None, last_fetched: OpTime) -> Verdict:
    """What the first entry of a new cursor (None: no entry) says about the source."""
    if last_fetched == NULL_OPTIME:
        return Verdict.NO_DATA
    if first is None or first.ts_key > last_fetched.ts_key:
        return Verdict.MISSING
    if first != last_fetched:
        return Verdict.DIVERGED
    return Verdict.CONTINUES


def diagnose_missing(last_fetched: OpTime, source_oldest: OpTime | None) -> Verdict:
    """Our entry is missing from the source: it trimmed past us (too stale), or the histories diverged."""
    if source_oldest is not None and source_oldest.ts_key > last_fetched.ts_key:
        return Verdict.TOO_STALE
    return Verdict.DIVERGED


def check_min_valid(min_valid: OpTime | None, held: bool, source_applied: OpTime | None) -> Verdict:
    """While RECOVERING after a rollback, can a source that continues our oplog make our data consistent?

    The rollback refetched documents as its source had them at `min_valid` (its newest entry then), and
    our data is a consistent snapshot only once we applied that very entry (MongoDB's requiredOpTime).
    A source whose oplog `held` it can take us there. One that went past it without holding it
    (`source_applied` is newer) is on another branch: the refetched documents may carry writes of a
    branch that lost, which no entry of this source will undo, so they are refetched again from it (a
    new rollback). One that has not reached it yet is passed over for a while.
    """
    if min_valid is None or held:
        return Verdict.CONTINUES
    if source_applied is not None and source_applied > min_valid:
        return Verdict.MIN_VALID_ELSEWHERE
    return Verdict.BEFORE_MIN_VALID


def react(problem: Problem, *, source_applied: OpTime | None, my_term: int, primary_seen: bool = True) -> Reaction:
    """What the fetcher does when fetching from a source ended with `problem`.

    `source_applied` is the source's newest entry as heartbeats reported it (None: unknown);
    `primary_seen`: we see a primary of our term (or newer).
    """
    if problem in (Problem.DIVERGED, Problem.MIN_VALID_ELSEWHERE):
        stale = ("it is not a member we heard from" if source_applied is None
                 else stale_branch_problem(source_applied, my_term, primary_seen=primary_seen))
        if stale is not None:
            return Reaction(deny_ms=ERROR_DENY_MS, message=f"diverged, but not rolling back to it: {stale}")
        return Reaction(roll_back=True)
    if problem is Problem.TOO_STALE:
        return Reaction(deny_ms=DIVERGED_DENY_MS, too_stale=True, message=problem.value)
    if problem is Problem.BEFORE_MIN_VALID:
        return Reaction(deny_ms=ERROR_DENY_MS, message=problem.value)
    if problem is Problem.NO_DATA:
        return Reaction(deny_ms=DIVERGED_DENY_MS, pause_ms=PROBLEM_PAUSE_MS, message=problem.value)
    return Reaction(deny_ms=ERROR_DENY_MS)
