"""Directed stories for bugs whose timing random seeds rarely hit.

Each story builds one member - a simulated one around the product's replica
core, or the core alone - puts it exactly where the bug needs it, and steps it:
as the core stands the member ends well; with the bug re-introduced
(`tests.sim.mutations`) it ends in the bad state.
"""

from __future__ import annotations

import itertools
import random
from typing import Any

import pytest

from base.member import MemberState
from base.messages import HeartbeatReply, MemberPosition, update_position_command, vote_request
from base.optime import OpTime
from base.votes import LastVote, VoteRequest
from replset import actions as act
from replset import events as ev
from replset.candidacy import Candidacy
from replset.replica import Replica
from replset.write_concern import WriteConcern
from sync.rollback_flow import Outcome, RollbackRun
from tests.sim import mutations, rpc
from tests.sim.clock import SimClock
from tests.sim.disk import Disk, Entry, EntryKind, SimInvariantError, fold
from tests.sim.node import SimNode
from tests.sim.scenario import SHAPES, host_of, make_config
from tests.sim.source import FetchReply

STORY_BUGS = frozenset({"drain-cancels-rollback", "term-adopted-while-becoming-primary", "wn-counts-other-branches",
                        "recovering-ignores-min-valid-branch", "positions-counted-before-term",
                        "rollback-ignores-late-commits"})


def member_with_a_diverged_tail() -> SimNode:
    """m1 was primary of term 1 and kept entries nobody else has; m0 reports entries of term 4 (the story
    needs a source it may roll back to while it stands in term 3 and sees no primary of it: a newer
    term's branch; in a real run that term's votes would end the candidacy first, so the fetcher never
    finds such a source during a candidacy)."""
    config = make_config(SHAPES[0][1], 1000, 5000, heartbeat_timeout_secs=5, catch_up_timeout_ms=-1)
    disk = Disk()
    disk.commit([Entry(OpTime(100, 1, -1), EntryKind.INITIATE),
                 Entry(OpTime(101, 1, 1), EntryKind.NEW_PRIMARY),
                 Entry(OpTime(102, 1, 1), EntryKind.WRITE, 7, 0, 7)])
    disk.sync()
    node = SimNode(1, config, disk, SimClock(0, 0, 0), random.Random(1), 0, itertools.count(1).__next__)
    reply = HeartbeatReply("rs0", MemberState.SECONDARY, 3, OpTime(105, 1, 4), OpTime(105, 1, 4), 1, 1, "",
                           OpTime(105, 1, 4), -1)
    node.topology.on_heartbeat_reply(0, reply, 1.0, 0, node.term)
    return node


def win_term_3_and_diverge_during_catch_up(node: SimNode) -> Candidacy:
    core = node.core
    node.disk.persist_term(3, LastVote(3, node.id))
    core.term, core.last_vote = 3, LastVote(3, node.id)
    run = Candidacy(core, "electionTimeout", 3)
    core.candidacy = run
    run._start_catch_up()                           # target: m0's (4, 105) - we are behind
    assert run.phase == "catch-up"
    fetcher = node.fetcher
    assert fetcher is not None
    fetcher.fetch_from(host_of(0))
    assert fetcher.call is not None
    theirs = (Entry(OpTime(102, 1, 4), EntryKind.NEW_PRIMARY),)   # m0 does not have our (1, 102): roll back
    found = FetchReply(theirs, node.metadata_document(), 1, oldest=OpTime(100, 1, -1))
    node.deliver(1, rpc.Reply(fetcher.call, 0, rpc.FETCH, found))   # the rollback starts: ROLLBACK, scan sent
    assert node.state is MemberState.ROLLBACK
    node.tick(node.clock.global_ms_at(run.deadline_ms) + 1)   # catch-up would time out here: drain
    return run


def test_a_rollback_ends_the_candidacy_and_goes_on() -> None:
    node = member_with_a_diverged_tail()
    win_term_3_and_diverge_during_catch_up(node)
    assert node.core.candidacy is None
    assert node.fetcher is not None and node.fetcher.rollback is not None


def test_with_the_bug_a_drain_cancels_the_rollback_and_the_member_is_stuck() -> None:
    with mutations.applied(["drain-cancels-rollback"]):
        node = member_with_a_diverged_tail()
        win_term_3_and_diverge_during_catch_up(node)
        node.tick(node.clock.global_ms_at(node.now) + 10_000)   # the drain ends: nothing buffered
        assert node.core.candidacy is None and node.state is MemberState.ROLLBACK
        assert node.fetcher is None                  # no fetcher: nothing will ever leave ROLLBACK


def member_writing_its_new_primary_entry() -> SimNode:
    """m1 won term 3 and its "new primary" no-op is in the group commit, its fsync not yet done."""
    node = member_with_a_diverged_tail()
    core = node.core
    node.disk.persist_term(3, LastVote(3, node.id))
    core.term, core.last_vote = 3, LastVote(3, node.id)
    node.fetcher = None
    core.fetching = False
    run = Candidacy(core, "electionTimeout", 3)
    core.candidacy = run
    run.phase = "drain"
    run.on_drained(True)                             # -> WriteNoop(3)
    node.deliver(1, rpc.Reply(-1, 0, rpc.HEARTBEAT, None))   # a step: the no-op's batch starts
    assert run.phase == "new primary no-op" and node.fsync_started
    return node


def grant_a_vote_for_term_4_then_finish_the_fsync(node: SimNode) -> None:
    config = node.config
    ask = VoteRequest(config.name, False, 4, 0, config.version, config.term, OpTime(200, 1, 3))
    node.deliver(2, rpc.Request(99, 0, rpc.VOTE, vote_request(ask)))
    assert node.term == 4                            # decided: the term moves in memory at once
    node.on_fsync_done(3)                            # the no-op commits; then the vote's fsync


def test_a_vote_for_a_newer_term_ends_a_candidacy_writing_its_no_op() -> None:
    node = member_writing_its_new_primary_entry()
    grant_a_vote_for_term_4_then_finish_the_fsync(node)
    assert node.state is MemberState.SECONDARY and node.core.candidacy is None
    node.check_invariants()


def test_with_the_bug_the_member_leads_a_term_it_did_not_win() -> None:
    with mutations.applied(["term-adopted-while-becoming-primary"]):
        node = member_writing_its_new_primary_entry()
        grant_a_vote_for_term_4_then_finish_the_fsync(node)
        assert node.state is MemberState.PRIMARY and node.term == 4   # a PRIMARY in term 4, elected in 3
        with pytest.raises(SimInvariantError, match="PRIMARY of term 3 runs in term 4"):
            node.check_invariants()


WRITE_OF_TERM_2 = OpTime(101, 1, 2)


def primary_of_term_2_holding_a_write() -> Replica:
    """m0 (the core alone), primary of term 2, with `WRITE_OF_TERM_2` committed and fsynced on its oplog."""
    config = make_config(SHAPES[0][1], 1000, 5000, heartbeat_timeout_secs=5, catch_up_timeout_ms=-1)
    start = OpTime(100, 1, 2)
    core = Replica(me=host_of(0), config=config, state=MemberState.SECONDARY, term=2, last_vote=None,
                   applied=start, durable=start, min_valid=None, rng=random.Random(1), now=0)
    core.start(0)
    core.became_primary(2, None)
    core.step(1, ev.LocalCommit(WRITE_OF_TERM_2))
    core.step(1, ev.LocalDurable(WRITE_OF_TERM_2))
    return core


def old_primary_answering_w2_after_a_newer_primary_was_heard_of() -> Any:
    """m0 was primary of term 2; its write's fsync ran while a heartbeat told it of term 3, whose primary
    m1 has entries of term 3 (which sort above the write without holding it); then the write concern."""
    core = primary_of_term_2_holding_a_write()
    write = WRITE_OF_TERM_2
    newer = OpTime(102, 1, 3)
    assert core.topology is not None
    core.topology.on_heartbeat_reply(1, HeartbeatReply("rs0", MemberState.PRIMARY, 3, newer, newer, 1, 1, "",
                                                       newer, 1), 1.0, 2, core.term)
    core.update_term(3, "a heartbeat")
    core.await_write_concern(3, "client", WriteConcern(w=2), write)
    return [a for a in core.take_actions() if isinstance(a, act.Wake)]


def test_w2_is_not_satisfied_by_a_member_on_a_newer_branch() -> None:
    (wake,) = old_primary_answering_w2_after_a_newer_primary_was_heard_of()
    assert wake.error is not None and wake.error.code == 189


def test_with_the_bug_w2_counts_the_newer_branch() -> None:
    with mutations.applied(["wn-counts-other-branches"]):
        (wake,) = old_primary_answering_w2_after_a_newer_primary_was_heard_of()
    assert wake.error is None  # acknowledged: a write only m0 holds, which m1's branch will roll back


B1_VALUE = (70, 70)   # key 7 as the lost branch B1 had it (write 70, never committed)


def member_recovering_from_a_branch_that_lost() -> SimNode:
    """m1 rolled back against a member of branch B1 (term 2): it refetched key 7 as B1 had it and must
    reach B1's top (2, 105) - minValid. B1 lost since: m0, of the new branch B2 (term 3), continues
    m1's oplog after the common point but never had (2, 105) or B1's write to key 7."""
    config = make_config(SHAPES[0][1], 1000, 5000, heartbeat_timeout_secs=5, catch_up_timeout_ms=-1)
    disk = Disk()
    disk.commit([Entry(OpTime(100, 1, -1), EntryKind.INITIATE),
                 Entry(OpTime(101, 1, 1), EntryKind.NEW_PRIMARY)])
    disk.sync()
    disk.persist_term(3, None)
    disk.put(7, B1_VALUE)
    disk.min_valid, disk.refetched_keys = OpTime(105, 1, 2), frozenset({7})
    node = SimNode(1, config, disk, SimClock(0, 0, 0), random.Random(1), 0, itertools.count(1).__next__)
    assert node.state is MemberState.RECOVERING
    b2_top = OpTime(106, 1, 3)
    node.topology.on_heartbeat_reply(0, HeartbeatReply("rs0", MemberState.PRIMARY, 3, b2_top, b2_top, 1, 1, "",
                                                       b2_top, 0), 1.0, 0, node.term)
    return node


def fetch_b2_from_m0(node: SimNode) -> None:
    """m0 answers m1's `find` with the common point and B2's entry (3, 106); it lacks minValid."""
    fetcher = node.fetcher
    assert fetcher is not None
    fetcher.fetch_from(host_of(0))
    assert fetcher.call is not None
    b2 = (Entry(OpTime(101, 1, 1), EntryKind.NEW_PRIMARY), Entry(OpTime(106, 1, 3), EntryKind.NEW_PRIMARY))
    found = FetchReply(b2, node.metadata_document(), 1, has_required=False, required=node.min_valid,
                       oldest=OpTime(100, 1, -1))
    node.deliver(1, rpc.Reply(fetcher.call, 0, rpc.FETCH, found))    # judged; the applier takes the batch
    if node.fsync_started:
        node.on_fsync_done(2)


def test_a_source_past_min_valid_on_another_branch_makes_the_member_refetch() -> None:
    node = member_recovering_from_a_branch_that_lost()
    fetch_b2_from_m0(node)
    assert node.fetcher is not None and node.fetcher.rollback is not None   # refetch key 7 from m0
    assert node.state is MemberState.ROLLBACK and node.disk.last == OpTime(101, 1, 1)


def test_with_the_bug_the_lost_branch_write_lives_on() -> None:
    with mutations.applied(["recovering-ignores-min-valid-branch"]):
        node = member_recovering_from_a_branch_that_lost()
        fetch_b2_from_m0(node)
        assert node.state is MemberState.SECONDARY and node.min_valid is None
        # key 7 holds B1's write, which no entry of m1's oplog produces
        assert node.disk.data.get(7) == B1_VALUE and fold(node.disk.oplog).get(7) is None


def old_primary_hearing_a_report_of_term_3() -> Replica:
    """m0 is primary of term 2 with a write only it holds; m1, which already voted in term 3 (whose primary
    lacks the write), reports a position of term 3 - it sorts above the write without holding it."""
    core = primary_of_term_2_holding_a_write()
    newer = OpTime(102, 1, 3)
    report = update_position_command([MemberPosition(1, newer, newer, 1)], 3)
    core.step(2, ev.PositionsIn(report, "m1's report"))
    return core


def test_a_report_of_a_newer_term_steps_the_primary_down_and_commits_nothing() -> None:
    core = old_primary_hearing_a_report_of_term_3()
    assert core.state is MemberState.SECONDARY and core.commit_point < WRITE_OF_TERM_2


def test_with_the_bug_the_old_primary_commits_a_write_only_it_holds() -> None:
    with mutations.applied(["positions-counted-before-term"]):
        core = old_primary_hearing_a_report_of_term_3()
    assert core.commit_point == WRITE_OF_TERM_2   # majority-committed, and term 3's primary will roll it back


def rollback_whose_oplog_moved_while_it_was_planned() -> Any:
    """A rollback planned from our oplog ending at (2, 105); a batch of client writes committed at (2, 106)
    before the rollback's own transaction ran (a write in flight when the primary stepped down)."""
    run = RollbackRun(host_of(0), 0)
    run.drained(OpTime(105, 1, 2), recovering=False)
    ours = [OpTime(105, 1, 2), OpTime(104, 1, 2), OpTime(103, 1, 1)]
    theirs = [OpTime(107, 1, 3), OpTime(103, 1, 1)]
    assert run.scanned(ours, theirs, ours_done=True, theirs_done=True, commit_point=OpTime(102, 1, 1)).name == "FOUND"
    run.refetched(OpTime(107, 1, 3))
    return run.commit_verdict(OpTime(106, 1, 2), OpTime(102, 1, 1))


def test_a_rollback_whose_oplog_moved_fails_and_is_tried_again() -> None:
    ending = rollback_whose_oplog_moved_while_it_was_planned()
    assert ending is not None and ending.outcome is Outcome.FAILED and "moved" in ending.why


def test_with_the_bug_the_late_batch_is_truncated_unsaved() -> None:
    with mutations.applied(["rollback-ignores-late-commits"]):
        assert rollback_whose_oplog_moved_while_it_was_planned() is None   # it commits, truncating (2, 106)
