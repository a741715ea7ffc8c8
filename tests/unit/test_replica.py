"""The replica core (replset/replica.py): events in, actions out, in the order its contracts promise.

Three members A (id 0, us), B (id 1), C (id 2). Time is a plain millisecond count;
randomness a seeded `random.Random`.
"""

from __future__ import annotations

import math
import random
from typing import Any

import pytest
from bson.int64 import Int64

from base.config import parse_config
from base.errors import MongoError
from base.member import MemberState
from base.messages import (
    HeartbeatReply,
    MemberPosition,
    ReplMetadata,
    heartbeat_reply,
    update_position_command,
    vote_reply,
    vote_request,
)
from base.numbers import MAX_TERM
from base.optime import OpTime
from base.votes import LastVote, VoteRequest, VoteResponse
from replset import actions as act
from replset.replica import NEVER, Replica
from replset.write_concern import MAJORITY, WriteConcern
from tests.sim import mutations

A, B, C = "a:1", "b:1", "c:1"
CONFIG = parse_config({"_id": "rs0", "version": 1, "term": 1,
                       "members": [{"_id": i, "host": h} for i, h in enumerate((A, B, C))]})
AT = OpTime(100, 1, 1)


def replica(state: MemberState = MemberState.SECONDARY, term: int = 1) -> Replica:
    r = Replica(me=A, config=CONFIG, state=MemberState.STARTUP, term=term, last_vote=None, applied=AT,
                durable=AT, min_valid=None, rng=random.Random(7), now=0)
    r.set_state(state)
    r.start(0)
    r.started_with = r.take_actions()  # type: ignore[attr-defined]
    return r


def of(kind: type, actions: list[act.Action]) -> list[Any]:
    return [a for a in actions if isinstance(a, kind)]


def make_primary(r: Replica) -> None:
    """Win term 2 at once: votes from B, the drain, the no-op."""
    assert r.step_up(10, skip_dry_run=True)
    persist = of(act.Persist, r.take_actions())[0]
    r.persisted(11, persist.token)
    send = next(s for s in of(act.Send, r.take_actions()) if s.to == 1)
    r.reply(12, send.call, vote_reply(VoteResponse(2, True, "")))
    r.take_actions()
    r.sync_drained(13, True)
    assert of(act.WriteNoop, r.take_actions()) == [act.WriteNoop(2)]
    r.local_commit(14, OpTime(101, 1, 2))
    r.noop_written(14, 2, ok=True)
    r.take_actions()
    assert r.is_primary and r.term == 2


def commit(r: Replica, write: OpTime) -> None:
    """Our own write at `write`, committed and flushed."""
    r.local_commit(20, write)
    r.local_durable(20, write)
    r.take_actions()


def test_a_vote_is_answered_only_after_it_is_persisted() -> None:
    r = replica()
    ask = VoteRequest("rs0", False, 2, 1, 1, 1, AT)
    r.vote_request(5, vote_request(ask), reply_to="B's request")
    actions = r.take_actions()
    assert of(act.Answer, actions) == []
    (persist,) = of(act.Persist, actions)
    assert (persist.term, persist.last_vote) == (2, LastVote(2, 1))
    assert r.term == 2  # in memory at once: reports and heartbeats carry it from now on
    r.persisted(6, persist.token)
    (answer,) = of(act.Answer, r.take_actions())
    assert answer.reply_to == "B's request" and answer.body["voteGranted"] is True


def test_a_candidate_asks_for_votes_only_after_its_own_vote_is_persisted() -> None:
    r = replica()
    assert r.step_up(10, skip_dry_run=True)
    actions = r.take_actions()
    assert of(act.Send, actions) == []
    (persist,) = of(act.Persist, actions)
    r.persisted(11, persist.token)
    sends = of(act.Send, r.take_actions())
    assert {s.to for s in sends if s.kind is act.CallKind.VOTE} == {1, 2}


def test_a_primary_counts_nothing_from_a_report_of_a_newer_term() -> None:
    r = replica()
    make_primary(r)
    write = OpTime(102, 1, 2)
    commit(r, write)
    report = update_position_command([MemberPosition(1, write, write, 1)], term=3)
    r.update_position(21, report)
    assert r.state is MemberState.SECONDARY
    assert r.commit_point < write
    assert any(isinstance(a, act.Persist) and a.term == 3 for a in r.take_actions())


def test_a_majority_waiter_wakes_when_a_secondary_reports_and_times_out_otherwise() -> None:
    r = replica()
    make_primary(r)
    first, second = OpTime(102, 1, 2), OpTime(103, 1, 2)
    commit(r, first)
    commit(r, second)
    r.await_write_concern(21, "w1", WriteConcern(w=MAJORITY), first)
    r.await_write_concern(21, "w2", WriteConcern(w=MAJORITY, wtimeout_ms=50), second)
    assert of(act.Flush, r.take_actions())
    r.update_position(22, update_position_command([MemberPosition(1, first, first, 1)], term=2))
    assert of(act.Wake, r.take_actions()) == [act.Wake("w1", None)]
    assert r.next_deadline() <= 71
    r.tick(71)
    (wake,) = of(act.Wake, r.take_actions())
    assert wake.waiter == "w2" and wake.error is not None and wake.error.code == 64


def test_w2_does_not_count_a_member_on_a_newer_branch() -> None:
    r = replica()
    make_primary(r)
    write = OpTime(102, 1, 2)
    commit(r, write)
    # B's heartbeat shows an optime of term 3, which sorts above our write without holding it
    assert not r.satisfied(WriteConcern(w=2), write)
    r.topology.members[1].applied = OpTime(101, 5, 3)  # type: ignore[union-attr]
    assert not r.satisfied(WriteConcern(w=2), write)
    r.topology.members[1].applied = write  # type: ignore[union-attr]
    assert r.satisfied(WriteConcern(w=2), write)


def test_a_heartbeat_of_a_newer_term_steps_a_primary_down_and_persists_the_term() -> None:
    r = replica()
    heartbeats = [s for s in of(act.Send, r.started_with) if s.kind is act.CallKind.HEARTBEAT]  # type: ignore[attr-defined]
    make_primary(r)
    send = next(s for s in heartbeats if s.to == 1)
    reply = heartbeat_reply(HeartbeatReply("rs0", MemberState.PRIMARY, 5, AT, AT, 1, 1, "", AT, 1))
    r.reply(30, send.call, reply)
    actions = r.take_actions()
    assert r.state is MemberState.SECONDARY and r.term == 5
    assert any(isinstance(a, act.Persist) and a.term == 5 for a in actions)
    assert act.StartFetching() in actions


def test_a_new_config_during_the_drain_does_not_restart_fetching() -> None:
    r = replica()
    assert r.fetching
    assert r.step_up(10, skip_dry_run=True)
    r.persisted(11, of(act.Persist, r.take_actions())[0].token)
    send = next(s for s in of(act.Send, r.take_actions()) if s.to == 1)
    r.reply(12, send.call, vote_reply(VoteResponse(2, True, "")))
    assert act.StopFetching(drain=True) in r.take_actions() and not r.fetching
    newer = parse_config({**CONFIG.to_document(), "version": 2})
    r.install_config(13, newer)
    assert act.StartFetching() not in r.take_actions()  # no fetcher under a member about to lead
    r.sync_drained(14, True)
    assert of(act.WriteNoop, r.take_actions()) == [act.WriteNoop(2)]


def rolled_back_to(min_valid: OpTime) -> Replica:
    r = replica()
    r.rolled_back(30, common_point=AT, min_valid=min_valid)
    r.take_actions()
    assert r.state is MemberState.RECOVERING
    return r


def test_recovering_ends_at_min_valid_and_forgets_it_only_holding_that_very_entry() -> None:
    min_valid = OpTime(105, 1, 2)
    r = rolled_back_to(min_valid)
    r.local_commit(31, OpTime(104, 1, 2))
    assert of(act.CheckMinValid, r.take_actions()) == []           # not there yet
    r.local_commit(32, min_valid)
    assert of(act.CheckMinValid, r.take_actions()) == [act.CheckMinValid(min_valid)]
    r.min_valid_checked(33, min_valid, True)
    assert r.state is MemberState.SECONDARY and r.min_valid is None
    assert of(act.ForgetMinValid, r.take_actions()) == [act.ForgetMinValid(min_valid)]


def test_passing_min_valid_on_another_branch_resyncs_and_keeps_its_record() -> None:
    min_valid = OpTime(105, 1, 2)
    r = rolled_back_to(min_valid)
    r.local_commit(31, OpTime(106, 1, 3))                          # past it, by term: another branch
    assert of(act.CheckMinValid, r.take_actions()) == [act.CheckMinValid(min_valid)]
    r.min_valid_checked(32, min_valid, False)
    actions = r.take_actions()
    assert of(act.Resync, actions) and not of(act.ForgetMinValid, actions)
    assert r.state is not MemberState.SECONDARY


# -- a term no member could follow is never adopted ----------------------------------------------------


def _no_term_change(r: Replica, term: int, actions: list[act.Action]) -> None:
    assert r.term == term
    assert of(act.Persist, actions) == []


def test_hostile_terms_in_messages_are_refused_before_anything_moves() -> None:
    r = replica()
    make_primary(r)
    hostile: list[Any] = [Int64(2**63 - 1), 1e300, math.nan, math.inf, True, 2.5]
    for term in hostile:
        with pytest.raises(MongoError):
            r.heartbeat_request(30, {"replSetHeartbeat": "rs0", "term": term, "from": B, "fromId": 1})
        with pytest.raises(MongoError):
            r.vote_request(30, {"replSetRequestVotes": 1, "setName": "rs0", "term": term, "candidateIndex": 1,
                                "configVersion": 1, "configTerm": 1, "lastAppliedOpTime": AT.to_document()},
                           reply_to="B")
        with pytest.raises(MongoError):
            r.update_position(30, {"replSetUpdatePosition": 1, "optimes": [], "$replData": {"term": term}})
        _no_term_change(r, 2, r.take_actions())
        assert r.is_primary
    # A heartbeat reply carrying one counts as a failed heartbeat, nothing more.
    heartbeat = next(call for call, record in r._calls.items() if record.kind is act.CallKind.HEARTBEAT)
    reply = heartbeat_reply(HeartbeatReply("rs0", MemberState.SECONDARY, 2, AT, AT, 1, 1, "", AT, 0))
    reply["term"] = Int64(2**63 - 1)
    r.reply(40, heartbeat, reply)
    _no_term_change(r, 2, r.take_actions())
    assert r.is_primary


def test_the_core_itself_refuses_a_term_beyond_max_term_and_says_so_once() -> None:
    r = replica()
    make_primary(r)
    vote = r.last_vote
    # As if a path had skipped the parsers: metadata built in-process with a term past MAX_TERM.
    r.sync_source_metadata(30, ReplMetadata(MAX_TERM + 1, AT, 1))
    first = r.take_actions()
    _no_term_change(r, 2, first)
    assert r.is_primary and r.last_vote == vote  # a primary does not even step down for it
    assert of(act.TermRefused, first) == [act.TermRefused(MAX_TERM + 1, "sync source metadata")]
    r.update_term(2**63 - 1, "a test")
    assert not r.persist_term(2**63, LastVote(2**63, 1))
    again = r.take_actions()
    _no_term_change(r, 2, again)
    assert of(act.TermRefused, again) == []  # logged once, however often it comes
    assert r.terms_refused == 3 and r.is_primary and r.last_vote == vote


def test_a_member_at_the_largest_term_does_not_stand() -> None:
    r = replica(term=MAX_TERM)
    assert r.step_up(10, skip_dry_run=True)  # it may try...
    actions = r.take_actions()
    _no_term_change(r, MAX_TERM, actions)  # ...but term + 1 could not be persisted: it never asks for votes
    assert of(act.Send, actions) == [] and r.candidacy is None
    assert [a.term for a in of(act.TermRefused, actions)] == [MAX_TERM + 1]
    # It still votes for, and follows, a candidate in the largest term.
    r.vote_request(20, vote_request(VoteRequest("rs0", False, MAX_TERM, 1, 1, 1, AT)), reply_to="B")
    (persist,) = of(act.Persist, r.take_actions())
    assert persist.last_vote == LastVote(MAX_TERM, 1)


# -- the sync source follows the ping ----------------------------------------------------------------------

M0, M1, M2 = "m0:1", "m1:1", "m2:1"
IDLE_SET = parse_config({"_id": "rs0", "version": 1, "term": 1,
                         "members": [{"_id": i, "host": h} for i, h in enumerate((M0, M1, M2))]})


def replies_of_an_idle_set(peer: int) -> dict[str, Any]:
    """m2 is the primary; m0 is a secondary level with everyone that syncs from it."""
    if peer == 2:
        return heartbeat_reply(HeartbeatReply("rs0", MemberState.PRIMARY, 1, AT, AT, 1, 1, "", AT, 2))
    return heartbeat_reply(HeartbeatReply("rs0", MemberState.SECONDARY, 1, AT, AT, 1, 1, M2, AT, 2))


def heartbeats_from_m1(round_trips_ms: dict[int, list[int]], until_ms: int) -> list[tuple[int, str]]:
    """m1's core, syncing from m2, with its heartbeats answered after the given round trips (one list per
    member, one per heartbeat, the last repeating): the changes of sync source it asks for, with their times."""
    r = Replica(me=M1, config=IDLE_SET, state=MemberState.STARTUP, term=1, last_vote=None, applied=AT,
                durable=AT, min_valid=None, rng=random.Random(7), now=0)
    r.set_state(MemberState.SECONDARY)
    r.start(0)
    r.fetcher_moved(0, source=M2, last_fetched=AT)
    answered = dict.fromkeys(round_trips_ms, 0)
    in_flight: list[tuple[int, int, dict[str, Any]]] = []   # (when the answer arrives, call, answer)
    changes: list[tuple[int, str]] = []
    now = 0
    while now <= until_ms:
        for send in of(act.Send, r.take_actions()):
            if send.kind is act.CallKind.HEARTBEAT:
                trips = round_trips_ms[send.to]
                rtt = trips[min(answered[send.to], len(trips) - 1)]
                answered[send.to] += 1
                in_flight.append((now + rtt, send.call, replies_of_an_idle_set(send.to)))
            else:
                in_flight.append((now + 1, send.call, {"ok": 1.0}))
        in_flight.sort(key=lambda answer: answer[0])
        now = min([r.next_deadline(), *(at for at, _, _ in in_flight[:1])])
        if in_flight and in_flight[0][0] == now:
            _, call, doc = in_flight.pop(0)
            r.reply(now, call, doc)
        else:
            r.tick(now)
        changes += [(now, a.reason) for a in r.actions if isinstance(a, act.ChangeSyncSource)]
    return changes


def test_m1_leaves_m2_for_m0_once_m0_is_54_ms_closer_for_five_heartbeat_intervals() -> None:
    """Simulator seed 20219: m1's first heartbeat to m0 after a restart was answered 7,666 ms later (m1
    was paused and the reply waited); since then m0 answers in 3 ms and the primary m2, m1's source, in 57.
    MongoDB's plain average keeps m0 above 52 ms for 23 heartbeats (0.8 ** 22 * 7,666 = 57); capped by the
    slowest of the last five round trips, the stall is gone after five, and m1 moves to m0 (which syncs
    from the primary, level with m1 on the idle set)."""
    interval = IDLE_SET.settings.heartbeat_interval_ms
    stall = {0: [7_666, 3], 2: [57]}
    changes = heartbeats_from_m1(stall, until_ms=7_666 + 18 * interval)
    assert changes, "m1 stayed on m2 for 18 heartbeat intervals"
    when, reason = changes[0]
    assert reason.startswith(f"{M0} (ping 3.0 ms) is closer than sync source {M2}")
    assert 7_666 + 4 * interval < when <= 7_666 + 5 * interval + 100   # the fifth prompt answer
    with mutations.applied(["ping-remembers-stalls"]):   # MongoDB's average, uncapped
        assert heartbeats_from_m1(stall, until_ms=7_666 + 18 * interval) == []


# -- priority takeover -----------------------------------------------------------------------------------

GRADED = parse_config({"_id": "rs0", "version": 1, "term": 1, "members": [
    {"_id": 0, "host": A, "priority": 2}, {"_id": 1, "host": B, "priority": 1}, {"_id": 2, "host": C, "priority": 3}]})


def answer_heartbeats(r: Replica, now: int, states: dict[int, tuple[MemberState, int]]) -> None:
    """Every heartbeat in flight answered at `now`: member -> (its state, its term)."""
    for call, record in list(r._calls.items()):
        if record.kind is act.CallKind.HEARTBEAT:
            state, term = states[record.peer]
            r.reply(now, call, heartbeat_reply(HeartbeatReply("rs0", state, term, AT, AT, 1, 1, "", AT, -1)))
    r.take_actions()


def stood_after_a_higher_primary_took_over() -> bool:
    """We (priority 2) schedule a takeover of B (priority 1, primary); C (priority 3) takes over first and
    stays primary. Whether we stood for election anyway, up to 10 s past our takeover's deadline."""
    r = Replica(me=A, config=GRADED, state=MemberState.STARTUP, term=1, last_vote=None, applied=AT, durable=AT,
                min_valid=None, rng=random.Random(7), now=0)
    r.set_state(MemberState.SECONDARY)
    r.start(0)
    answer_heartbeats(r, 10, {1: (MemberState.PRIMARY, 1), 2: (MemberState.SECONDARY, 1)})
    deadline = r.takeover_deadline
    assert 10 < deadline < NEVER
    while r.now < deadline + 10_000:
        r.tick(r.next_deadline())
        answer_heartbeats(r, r.now + 5, {1: (MemberState.SECONDARY, 2), 2: (MemberState.PRIMARY, 2)})
        if r.candidacy is not None or r.state is not MemberState.SECONDARY:
            return True
    return False


def test_a_takeover_scheduled_against_a_lower_primary_is_dropped_once_a_higher_one_took_over() -> None:
    """Simulator seed 605306315: when our deadline came we stood against C, won, and C took over again:
    two needless failovers. C's heartbeat now cancels our takeover."""
    assert not stood_after_a_higher_primary_took_over()
    with mutations.applied(["takeover-outlives-its-primary"]):   # the takeover kept
        assert stood_after_a_higher_primary_took_over()
