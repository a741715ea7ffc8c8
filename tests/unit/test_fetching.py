"""The fetcher's decisions (sync/fetching.py) and the rollback's last check (sync/rollback.py)."""

from __future__ import annotations

from base.optime import NULL_OPTIME, OpTime
from sync.fetching import (
    DIVERGED_DENY_MS,
    ERROR_DENY_MS,
    Problem,
    Verdict,
    check_first_batch,
    check_min_valid,
    diagnose_missing,
    react,
)
from sync.rollback import commit_problem

OURS = OpTime(100, 3, 2)


def test_the_first_batch_continues_our_oplog_only_from_our_very_entry() -> None:
    assert check_first_batch(OURS, OURS) is Verdict.CONTINUES
    assert check_first_batch(OpTime(100, 3, 3), OURS) is Verdict.DIVERGED  # same ts, another term
    assert check_first_batch(OpTime(100, 2, 2), OURS) is Verdict.DIVERGED  # our entry is not there
    assert check_first_batch(OpTime(100, 4, 2), OURS) is Verdict.MISSING
    assert check_first_batch(None, OURS) is Verdict.MISSING
    assert check_first_batch(OURS, NULL_OPTIME) is Verdict.NO_DATA


def test_a_missing_entry_is_too_stale_only_when_the_source_trimmed_past_it() -> None:
    assert diagnose_missing(OURS, OpTime(200, 1, 2)) is Verdict.TOO_STALE
    assert diagnose_missing(OURS, OpTime(50, 1, 1)) is Verdict.DIVERGED
    assert diagnose_missing(OURS, None) is Verdict.DIVERGED


def test_reactions() -> None:
    assert react(Problem.UNREACHABLE, source_applied=None, my_term=2).deny_ms == ERROR_DENY_MS
    assert react(Problem.ERROR, source_applied=OURS, my_term=2).deny_ms == ERROR_DENY_MS
    stale = react(Problem.TOO_STALE, source_applied=OURS, my_term=2)
    assert stale.too_stale and stale.deny_ms == DIVERGED_DENY_MS
    no_data = react(Problem.NO_DATA, source_applied=OURS, my_term=2)
    assert no_data.pause_ms > 0 and no_data.deny_ms == DIVERGED_DENY_MS and not no_data.roll_back


def test_a_member_rolls_back_only_to_a_source_on_the_current_branch() -> None:
    current = react(Problem.DIVERGED, source_applied=OpTime(300, 1, 4), my_term=4)
    assert current.roll_back and current.deny_ms == 0
    deposed = react(Problem.DIVERGED, source_applied=OpTime(300, 1, 3), my_term=4)
    assert not deposed.roll_back and deposed.deny_ms == ERROR_DENY_MS and "deposed" in deposed.message
    unknown = react(Problem.DIVERGED, source_applied=None, my_term=4)
    assert not unknown.roll_back


def test_m1_does_not_roll_back_to_the_branch_of_a_primary_of_its_term_it_no_longer_sees() -> None:
    """Simulator seed 700002893: m0 won term 6 without m1's term-5 no-op and stepped down, cut off
    with m1 from the other three, where m2 won term 7 and committed the no-op. m1, still in term 6, saw
    m0's term-6 entry ahead of it; rolling back to it undid a committed entry. With no primary of term 6
    in sight, m1 passes m0 over instead, and later finds the no-op on m2's branch."""
    m0_branch = OpTime(1_700_000_018, 8, 6)
    gone = react(Problem.DIVERGED, source_applied=m0_branch, my_term=6, primary_seen=False)
    assert not gone.roll_back and gone.deny_ms == ERROR_DENY_MS and "no longer see" in gone.message
    assert react(Problem.DIVERGED, source_applied=m0_branch, my_term=6, primary_seen=True).roll_back
    newer = react(Problem.DIVERGED, source_applied=OpTime(1_700_000_020, 1, 7), my_term=6, primary_seen=False)
    assert newer.roll_back   # an entry of a newer term than ours: written by that term's primary


def test_the_rollback_commits_only_from_the_oplog_it_planned_from() -> None:
    common, commit_point = OpTime(90, 1, 1), OpTime(80, 1, 1)
    assert commit_problem(OURS, OURS, common, commit_point) is None
    moved = commit_problem(OURS, OpTime(101, 1, 2), common, commit_point)
    assert moved is not None and "moved" in moved
    assert commit_problem(OURS, OURS, common, OpTime(95, 1, 1)) == "refused"


def test_a_recovering_member_needs_a_source_holding_its_min_valid() -> None:
    min_valid = OpTime(150, 1, 2)
    assert check_min_valid(None, False, OpTime(200, 1, 3)) is Verdict.CONTINUES     # not recovering
    assert check_min_valid(min_valid, True, OpTime(200, 1, 2)) is Verdict.CONTINUES
    # went past it without holding it: another branch
    assert check_min_valid(min_valid, False, OpTime(140, 1, 3)) is Verdict.MIN_VALID_ELSEWHERE
    assert check_min_valid(min_valid, False, OpTime(149, 1, 2)) is Verdict.BEFORE_MIN_VALID
    assert check_min_valid(min_valid, False, None) is Verdict.BEFORE_MIN_VALID


def test_a_source_past_min_valid_on_another_branch_gets_a_rollback_one_behind_gets_passed_over() -> None:
    assert react(Problem.MIN_VALID_ELSEWHERE, source_applied=OpTime(200, 1, 3), my_term=3).roll_back
    stale = react(Problem.MIN_VALID_ELSEWHERE, source_applied=OpTime(200, 1, 2), my_term=3)
    assert not stale.roll_back and stale.deny_ms == ERROR_DENY_MS
    behind = react(Problem.BEFORE_MIN_VALID, source_applied=OpTime(149, 1, 2), my_term=2)
    assert not behind.roll_back and behind.deny_ms == ERROR_DENY_MS and behind.message
