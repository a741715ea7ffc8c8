"""The fetcher's control loop (`sync.fetch_loop`): what each answer of a source leads to."""

from __future__ import annotations

from base.optime import OpTime
from sync import fetch_loop as fl
from sync.fetching import DIVERGED_DENY_MS, ERROR_DENY_MS, Problem

OURS = OpTime(100, 1, 1)
NEXT = OpTime(101, 1, 1)
LATER = OpTime(105, 1, 1)
JUDGING = {"source_applied": LATER, "my_term": 1, "now_ms": 0}


def tailing(source: str = "m1") -> fl.FetchLoop:
    loop = fl.FetchLoop(OURS)
    assert loop.start() == [fl.ChooseSource(OURS)]
    assert loop.chosen(source, 0) == [fl.Moved(source, OURS, True), fl.Find(source, OURS)]
    actions = loop.found(OURS, NEXT, min_valid=None, **JUDGING)
    assert actions == [fl.Moved(source, NEXT), fl.Take(1), fl.Riding(True), fl.AwaitApplied()]
    return loop


def test_no_source_waits_for_a_topology_change_then_chooses_again() -> None:
    loop = fl.FetchLoop(OURS, source="m1")
    loop.start()
    assert loop.chosen(None, 50) == [fl.Moved(None, OURS), fl.AwaitTopology(50 + fl.NO_SOURCE_RETRY_MS)]
    assert loop.wake() == [fl.ChooseSource(OURS)]


def test_a_source_that_continues_our_oplog_is_tailed_and_each_getmore_waits_for_apply() -> None:
    loop = tailing()
    assert loop.riding
    # applied, no flush due: the getMore goes at once, and reports stop riding while it is out
    assert loop.applied(flush_pending=False, now_ms=10) == [fl.Riding(False), fl.GetMore("m1")]
    assert loop.batch(LATER, cursor_open=True) == [fl.Riding(True), fl.Moved("m1", LATER), fl.Take(0),
                                                   fl.AwaitApplied()]
    assert loop.last_fetched == LATER
    # a flush under way: wait briefly, so one report carries the applied and the durable position
    assert loop.applied(flush_pending=True, now_ms=20) == [fl.AwaitDurable(20 + fl.REPORT_LINGER_MS)]
    assert loop.settled() == [fl.Riding(False), fl.GetMore("m1")]
    # an empty batch moves nothing
    assert loop.batch(None, cursor_open=True) == [fl.Riding(True), fl.AwaitApplied()]


def test_a_cursor_the_source_closed_ends_the_session_and_the_loop_chooses_again() -> None:
    loop = tailing()
    loop.applied(flush_pending=False, now_ms=0)
    assert loop.batch(None, cursor_open=False) == [fl.Riding(True), fl.CloseCursor("m1"), fl.Riding(False),
                                                   fl.ChooseSource(NEXT)]


def test_our_entry_missing_there_reads_the_oldest_entry_to_tell_too_stale_from_diverged() -> None:
    loop = fl.FetchLoop(OURS)
    loop.start()
    loop.chosen("m1", 0)
    assert loop.found(LATER, LATER, min_valid=None, **JUDGING) == [fl.ReadOldest("m1")]
    actions = loop.oldest(NEXT, **JUDGING)   # the source trimmed past us
    assert actions == [fl.CloseCursor("m1"), fl.Deny("m1", DIVERGED_DENY_MS), fl.ReportTooStale("m1", OURS, NEXT),
                       fl.ChooseSource(OURS)]
    assert "too stale to catch up" in loop.message

    loop.chosen("m2", 0)
    loop.found(LATER, LATER, min_valid=None, **JUDGING)
    assert loop.oldest(OpTime(90, 1, 1), **JUDGING) == [fl.CloseCursor("m2"), fl.RollBack("m2")]
    assert loop.rolled_back(OpTime(99, 1, 1)) == [fl.Moved("m2", OpTime(99, 1, 1)), fl.ChooseSource(OpTime(99, 1, 1))]


def test_an_entry_at_our_time_of_another_term_rolls_back_only_to_a_source_of_a_newer_branch() -> None:
    loop = fl.FetchLoop(OURS)
    loop.start()
    loop.chosen("m1", 0)
    other_term = OpTime(100, 1, 2)
    assert loop.found(other_term, other_term, min_valid=None, source_applied=other_term, my_term=2,
                      now_ms=0) == [fl.CloseCursor("m1"), fl.RollBack("m1")]
    # a source on an older branch than our term's: not rolled back to, denied for a while
    loop.rolled_back(None, "rollback against m1 failed: the source failed")
    assert loop.message.startswith("rollback against m1 failed")
    loop.chosen("m1", 0)
    actions = loop.found(other_term, other_term, min_valid=None, source_applied=other_term, my_term=5, now_ms=0)
    assert actions == [fl.CloseCursor("m1"), fl.Deny("m1", ERROR_DENY_MS), fl.ChooseSource(OURS)]


def test_recovering_checks_the_source_holds_min_valid_before_tailing() -> None:
    min_valid = OpTime(103, 1, 1)
    loop = fl.FetchLoop(OURS)
    loop.start()
    loop.chosen("m1", 0)
    assert loop.found(OURS, NEXT, min_valid=min_valid, **JUDGING) == [fl.ReadMinValid("m1", min_valid)]
    assert loop.last_fetched == OURS     # nothing taken before the source is judged
    actions = loop.min_valid_read(min_valid, True, **JUDGING)
    assert actions == [fl.Moved("m1", NEXT), fl.Take(1), fl.Riding(True), fl.AwaitApplied()]

    loop = fl.FetchLoop(OURS)
    loop.start()
    loop.chosen("m1", 0)
    loop.found(OURS, NEXT, min_valid=min_valid, **JUDGING)
    # the source has not reached minValid yet: passed over for a while
    assert loop.min_valid_read(min_valid, False, source_applied=NEXT, my_term=1, now_ms=0) == [
        fl.CloseCursor("m1"), fl.Deny("m1", ERROR_DENY_MS), fl.ChooseSource(OURS)]


def test_no_data_pauses_and_an_unreachable_source_is_denied() -> None:
    loop = fl.FetchLoop(OpTime(0, 0, -1))
    loop.start()
    loop.chosen("m1", 0)
    actions = loop.found(None, None, min_valid=None, **JUDGING)
    assert actions[-2:] == [fl.Deny("m1", DIVERGED_DENY_MS), fl.Pause(100)]
    assert loop.wake() == [fl.ChooseSource(OpTime(0, 0, -1))]

    loop = tailing()
    loop.applied(flush_pending=False, now_ms=0)
    assert loop.failed(Problem.UNREACHABLE, **JUDGING) == [fl.CloseCursor("m1"), fl.Deny("m1", ERROR_DENY_MS),
                                                           fl.ChooseSource(NEXT)]


def test_a_change_ends_a_session_but_not_a_rollback_and_answers_after_it_are_ignored() -> None:
    loop = tailing()
    assert loop.change() == [fl.CloseCursor("m1"), fl.Riding(False), fl.ChooseSource(NEXT)]
    assert loop.batch(LATER, cursor_open=True) == []     # the old session's late answer
    assert loop.applied(flush_pending=False, now_ms=0) == []
    loop.chosen("m2", 0)
    loop.found(OpTime(100, 1, 3), None, min_valid=None, source_applied=OpTime(100, 1, 3), my_term=3, now_ms=0)
    assert loop.phase is fl.Phase.ROLLBACK
    assert loop.change() == []
    assert loop.stop() == []
    assert loop.phase is fl.Phase.STOPPED


def test_stopping_a_tailing_loop_releases_its_cursor() -> None:
    loop = tailing()
    assert loop.stop() == [fl.CloseCursor("m1"), fl.Riding(False)]
    assert not loop.riding


def test_a_rollback_that_ends_after_the_loop_stopped_still_moves_the_fetcher() -> None:
    loop = fl.FetchLoop(OURS)
    loop.start()
    loop.chosen("m1", 0)
    loop.found(OpTime(100, 1, 3), None, min_valid=None, source_applied=OpTime(100, 1, 3), my_term=3, now_ms=0)
    loop.stop()
    assert loop.rolled_back(OpTime(99, 1, 1)) == [fl.Moved("m1", OpTime(99, 1, 1))]
    assert loop.last_fetched == OpTime(99, 1, 1)


def test_a_session_that_ends_before_its_find_answered_drops_the_find() -> None:
    """The shell must not take that late answer for the next session's (a simulator seed stalled on it)."""
    loop = fl.FetchLoop(OURS)
    loop.start()
    loop.chosen("m1", 0)
    assert loop.change() == [fl.CloseCursor("m1"), fl.ChooseSource(OURS)]
    assert loop.chosen(None, 0)[-1] == fl.AwaitTopology(fl.NO_SOURCE_RETRY_MS)
    assert loop.found(OURS, NEXT, min_valid=None, **JUDGING) == []


def test_a_first_batch_on_a_cursor_the_source_did_not_keep_is_taken_then_the_loop_chooses_again() -> None:
    loop = fl.FetchLoop(OURS)
    loop.start()
    loop.chosen("m1", 0)
    assert loop.found(OURS, NEXT, min_valid=None, **JUDGING, cursor_open=False) == [
        fl.Moved("m1", NEXT), fl.Take(1), fl.CloseCursor("m1"), fl.ChooseSource(NEXT)]
