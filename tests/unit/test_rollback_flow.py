"""One rollback run, stage by stage: how each stage can end (`sync.rollback_flow`)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from base.optime import NULL_OPTIME, OpTime
from sync.rollback_flow import DRAIN_TIMEOUT_MS, Outcome, RollbackRun, ScanStep, Stage

SHARED = [OpTime(100 + i, 1, 1) for i in range(5)]
OURS = [*SHARED, OpTime(200, 1, 1), OpTime(201, 1, 1)]          # our branch: term 1 after the shared prefix
THEIRS = [*SHARED, OpTime(199, 1, 2), OpTime(205, 1, 2)]        # the source's branch: term 2


def newest_first(optimes: list[OpTime]) -> list[OpTime]:
    return sorted(optimes, key=lambda o: o.ts_key, reverse=True)


def scanning_run() -> RollbackRun:
    run = RollbackRun("m2:1", started_ms=1000)
    run.drained(OURS[-1], recovering=False)
    return run


def test_drain_that_takes_too_long_ends_the_run_before_it_starts() -> None:
    run = RollbackRun("m2:1", started_ms=1000)
    assert not run.drain_overdue(1000 + DRAIN_TIMEOUT_MS - 1)
    assert run.stage is Stage.DRAIN and run.message == ""
    assert run.drain_overdue(1000 + DRAIN_TIMEOUT_MS)
    assert run.ending is not None and run.ending.outcome is Outcome.NOT_STARTED


def test_a_run_that_finds_the_common_point_refetches_and_commits() -> None:
    run = scanning_run()
    assert "m2:1" in run.message
    step = run.scanned(newest_first(OURS), newest_first(THEIRS), ours_done=True, theirs_done=True,
                       commit_point=SHARED[-1])
    assert step is ScanStep.FOUND and run.common_point == SHARED[-1] and run.stage is Stage.REFETCH
    run.refetched(THEIRS[-1])
    assert run.commit_verdict(OURS[-1], SHARED[-1]) is None
    ending = run.committed()
    assert (ending.outcome, ending.common_point, ending.min_valid) == (Outcome.ROLLED_BACK, SHARED[-1], THEIRS[-1])


def test_the_scan_reads_on_until_the_windows_meet() -> None:
    run = scanning_run()
    theirs = newest_first(THEIRS)
    assert run.scanned(newest_first(OURS), theirs[:2], ours_done=True, theirs_done=False,
                       commit_point=NULL_OPTIME) is ScanStep.MORE
    assert run.scanned([], theirs[2:], ours_done=True, theirs_done=True,
                       commit_point=NULL_OPTIME) is ScanStep.FOUND
    assert run.common_point == SHARED[-1]


def test_no_common_point_within_reach_fails_the_run() -> None:
    run = scanning_run()
    step = run.scanned([OpTime(300, 1, 1)], [OpTime(299, 1, 2)], ours_done=True, theirs_done=True,
                       commit_point=NULL_OPTIME)
    assert step is ScanStep.ENDED
    assert run.ending is not None and run.ending.outcome is Outcome.FAILED and "resynced" in run.ending.why


def test_a_common_point_older_than_the_commit_point_is_refused() -> None:
    run = scanning_run()
    step = run.scanned(newest_first(OURS), newest_first(THEIRS), ours_done=True, theirs_done=True,
                       commit_point=OURS[-2])
    assert step is ScanStep.ENDED
    assert run.ending is not None and run.ending.outcome is Outcome.REFUSED


def test_an_oplog_that_moved_since_the_plan_fails_the_commit() -> None:
    run = scanning_run()
    run.scanned(newest_first(OURS), newest_first(THEIRS), ours_done=True, theirs_done=True, commit_point=NULL_OPTIME)
    run.refetched(THEIRS[-1])
    ending = run.commit_verdict(OpTime(202, 1, 1), NULL_OPTIME)
    assert ending is not None and ending.outcome is Outcome.FAILED and run.stage is Stage.ENDED


def test_a_commit_point_that_passed_the_common_point_meanwhile_refuses_the_commit() -> None:
    run = scanning_run()
    run.scanned(newest_first(OURS), newest_first(THEIRS), ours_done=True, theirs_done=True, commit_point=NULL_OPTIME)
    run.refetched(THEIRS[-1])
    ending = run.commit_verdict(OURS[-1], OURS[-1])
    assert ending is not None and ending.outcome is Outcome.REFUSED


def test_a_failure_after_an_ending_keeps_the_first_ending() -> None:
    run = scanning_run()
    run.scanned(newest_first(OURS), newest_first(THEIRS), ours_done=True, theirs_done=True, commit_point=OURS[-1])
    assert run.failed("the source went away").outcome is Outcome.REFUSED


@given(window=st.integers(1, 8), shared=st.integers(1, 20), ours_extra=st.integers(0, 10),
       theirs_extra=st.integers(0, 10))
def test_windowed_scan_finds_what_one_scan_finds(window: int, shared: int, ours_extra: int,
                                                 theirs_extra: int) -> None:
    prefix = [OpTime(100 + i, 1, 1) for i in range(shared)]
    ours = newest_first(prefix + [OpTime(500 + i, 1, 1) for i in range(ours_extra)])
    theirs = newest_first(prefix + [OpTime(400 + i, 1, 2) for i in range(theirs_extra)])
    run = RollbackRun("m2:1", started_ms=0)
    run.drained(ours[0], recovering=False)
    step, at = ScanStep.MORE, 0
    while step is ScanStep.MORE:
        step = run.scanned(ours[at:at + window], theirs[at:at + window], ours_done=at + window >= len(ours),
                           theirs_done=at + window >= len(theirs), commit_point=NULL_OPTIME)
        at += window
    assert step is ScanStep.FOUND and run.common_point == prefix[-1]
