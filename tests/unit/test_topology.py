"""The cluster view (replset/topology.py): health, pings, positions, the primary, majority contact.

The set is the one of test_sync_source.py: P (the primary, id 0), S1 (id 1), S2 (id 2) and S3
(id 3). Unless a test says otherwise we are S2. Time is a plain millisecond count passed in.
"""

from __future__ import annotations

import datetime
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from base.config import ReplSetConfig, parse_config
from base.member import MemberState
from base.messages import (
    HeartbeatReply,
    MemberPosition,
    parse_update_position,
    update_position_command,
)
from base.optime import NULL_OPTIME, OpTime
from replset.topology import HeartbeatOutcome, Topology
from sync.ping_stats import ALPHA
from sync.sync_source import SyncSourceInputs, choose_sync_source

P, S1, S2, S3 = "p:27017", "s1:27017", "s2:27017", "s3:27017"
P_ID, S1_ID, S2_ID, S3_ID = 0, 1, 2, 3
PRIMARY, SECONDARY, ROLLBACK = MemberState.PRIMARY, MemberState.SECONDARY, MemberState.ROLLBACK
TIMEOUT_MS = 10_000  # heartbeatTimeoutSecs defaults to 10
AT_100 = OpTime(100, 1, 1)  # where the set is in most stories
FETCHED = OpTime(50, 1, 1)  # where we (S2) have fetched to


def ot(secs: int, inc: int = 1, term: int = 1) -> OpTime:
    return OpTime(secs, inc, term)


def config(*members: dict[str, Any], version: int = 1, term: int = 1, **settings_: Any) -> ReplSetConfig:
    if not members:
        members = tuple({"_id": i, "host": h} for i, h in enumerate((P, S1, S2, S3)))
    return parse_config({"_id": "rs0", "version": version, "term": term, "members": list(members),
                         "settings": settings_})


def topology(cfg: ReplSetConfig | None = None, *, me: int = S2_ID, now_ms: int = 0) -> Topology:
    return Topology(cfg or config(), me, now_ms)


def reply(state: MemberState = SECONDARY, *, term: int = 1, applied: OpTime = AT_100,
          durable: OpTime | None = None, **kw: Any) -> HeartbeatReply:
    base: dict[str, Any] = {
        "set_name": "rs0", "state": state, "term": term, "applied": applied,
        "durable": applied if durable is None else durable, "config_version": 1, "config_term": 1,
        "sync_source": "", "commit_point": NULL_OPTIME, "primary_id": P_ID,
    }
    base.update(kw)
    return HeartbeatReply(**base)


def fail(topo: Topology, member_id: int, now_ms: int, *, refused: bool = False) -> bool:
    return topo.on_heartbeat_failure(member_id, now_ms, refused=refused, message="no answer")


def inputs_for(topo: Topology, *, last_fetched: OpTime = FETCHED, now_ms: int = 0, **kw: Any) -> SyncSourceInputs:
    base: dict[str, Any] = {"last_fetched": last_fetched, "my_state": SECONDARY, "my_term": 1,
                            "forced_host": None, "denylist": frozenset(), "now_ms": now_ms}
    base.update(kw)
    return topo.sync_source_inputs(**base)


# --- the starting view -----------------------------------------------------------------------------


def test_the_view_holds_every_other_member_healthy_and_unknown() -> None:
    topo = topology()
    assert sorted(topo.members) == [P_ID, S1_ID, S3_ID]
    s1 = topo.members[S1_ID]
    assert (s1.host, s1.state, s1.healthy, s1.applied, s1.ping.value_ms) == (
        S1, MemberState.UNKNOWN, True, NULL_OPTIME, None)
    assert s1.last_contact_ms is None and not s1.reported_position


# --- health: slow is not dead, refused is ------------------------------------------------------------


def test_a_silent_member_stays_healthy_until_the_heartbeat_timeout_passes() -> None:
    topo = topology(now_ms=1_000)
    assert fail(topo, S1_ID, 1_000 + TIMEOUT_MS - 1) is False
    assert topo.members[S1_ID].healthy
    assert fail(topo, S1_ID, 1_000 + TIMEOUT_MS) is True
    assert not topo.members[S1_ID].healthy and topo.members[S1_ID].state is MemberState.DOWN


def test_the_timeout_runs_from_the_last_reply() -> None:
    topo = topology()
    topo.on_heartbeat_reply(S1_ID, reply(), 2.0, 50_000, my_term=1)
    assert fail(topo, S1_ID, 50_000 + TIMEOUT_MS - 1) is False
    assert topo.members[S1_ID].state is SECONDARY
    assert fail(topo, S1_ID, 50_000 + TIMEOUT_MS) is True


def test_the_timeout_follows_heartbeat_timeout_secs() -> None:
    topo = topology(config(heartbeatTimeoutSecs=2))
    assert fail(topo, S1_ID, 1_999) is False
    assert fail(topo, S1_ID, 2_000) is True


def test_a_refused_connection_marks_the_member_down_at_once() -> None:
    topo = topology()
    topo.on_heartbeat_reply(S1_ID, reply(), 2.0, 1_000, my_term=1)
    assert fail(topo, S1_ID, 1_001, refused=True) is True
    s1 = topo.members[S1_ID]
    assert not s1.healthy and s1.state is MemberState.DOWN and s1.message == "no answer"


def test_becoming_down_is_reported_once() -> None:
    topo = topology()
    assert fail(topo, S1_ID, 0, refused=True) is True
    assert fail(topo, S1_ID, 1, refused=True) is False
    assert fail(topo, S1_ID, TIMEOUT_MS * 5) is False


def test_a_failure_keeps_the_ping_estimate_and_counts_the_failure() -> None:
    topo = topology()
    topo.on_heartbeat_reply(S1_ID, reply(), 4.0, 0, my_term=1)
    fail(topo, S1_ID, 100)
    assert topo.members[S1_ID].ping.value_ms == 4.0 and topo.members[S1_ID].ping.failures == 1


def test_a_reply_brings_a_down_member_back() -> None:
    topo = topology()
    fail(topo, S1_ID, 0, refused=True)
    topo.on_heartbeat_reply(S1_ID, reply(), 3.0, 500, my_term=1)
    s1 = topo.members[S1_ID]
    assert s1.healthy and s1.state is SECONDARY and s1.message == "" and s1.ping.failures == 0


def test_failures_for_members_outside_the_config_are_ignored() -> None:
    topo = topology()
    assert fail(topo, 42, 0, refused=True) is False
    assert fail(topo, S2_ID, 0, refused=True) is False  # ourselves
    assert 42 not in topo.members and S2_ID not in topo.members


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3 * TIMEOUT_MS), st.sampled_from(["reply", "timeout", "refused"])),
                max_size=30))
def test_down_is_reported_exactly_when_a_healthy_member_turns_unhealthy(
        events: list[tuple[int, str]]) -> None:
    topo = topology()
    now, last_reply = 0, 0
    for step, kind in events:
        now += step
        was_healthy = topo.members[S1_ID].healthy
        if kind == "reply":
            topo.on_heartbeat_reply(S1_ID, reply(), 1.0, now, my_term=1)
            last_reply = now
            assert topo.members[S1_ID].healthy
            continue
        became_down = fail(topo, S1_ID, now, refused=kind == "refused")
        healthy = topo.members[S1_ID].healthy
        assert became_down == (was_healthy and not healthy)
        if was_healthy:
            assert healthy == (kind == "timeout" and now - last_reply < TIMEOUT_MS)
        else:
            assert not healthy  # only a reply brings a member back


# --- heartbeat replies ---------------------------------------------------------------------------------


def test_a_reply_records_what_the_member_reports() -> None:
    topo = topology()
    elected = datetime.datetime(2024, 5, 1, 12, 0, 0)
    topo.on_heartbeat_reply(P_ID, reply(PRIMARY, term=3, applied=ot(120, term=3), durable=ot(110, term=3),
                                        sync_source=S1, config_version=4, config_term=3,
                                        election_date=elected), 7.0, 9_000, my_term=3)
    p = topo.members[P_ID]
    assert (p.state, p.term, p.applied, p.durable) == (PRIMARY, 3, ot(120, term=3), ot(110, term=3))
    assert (p.sync_source, p.config_version, p.config_term, p.election_date) == (S1, 4, 3, elected)
    assert p.last_contact_ms == p.last_heartbeat_ms == 9_000
    assert p.ping.value_ms == 7.0 and p.ping.samples == 1


def test_ping_is_smoothed_over_replies() -> None:
    topo = topology()
    topo.on_heartbeat_reply(S1_ID, reply(), 10.0, 0, my_term=1)
    topo.on_heartbeat_reply(S1_ID, reply(), 20.0, 2_000, my_term=1)
    assert topo.members[S1_ID].ping.value_ms == pytest.approx(ALPHA * 20.0 + (1 - ALPHA) * 10.0)


def test_a_negative_round_trip_counts_as_zero() -> None:
    topo = topology()
    topo.on_heartbeat_reply(S1_ID, reply(), -3.0, 0, my_term=1)
    assert topo.members[S1_ID].ping.value_ms == 0.0


def test_an_up_member_never_moves_backwards_by_heartbeat() -> None:
    topo = topology()
    topo.on_heartbeat_reply(S1_ID, reply(applied=ot(100)), 1.0, 0, my_term=1)
    topo.on_heartbeat_reply(S1_ID, reply(applied=ot(90)), 1.0, 2_000, my_term=1)
    assert topo.members[S1_ID].applied == ot(100) and topo.members[S1_ID].durable == ot(100)


def test_a_member_in_rollback_reports_its_optime_as_is() -> None:
    topo = topology()
    topo.on_heartbeat_reply(S1_ID, reply(applied=ot(100)), 1.0, 0, my_term=1)
    topo.on_heartbeat_reply(S1_ID, reply(ROLLBACK, applied=ot(90)), 1.0, 2_000, my_term=1)
    assert topo.members[S1_ID].applied == ot(90)


@pytest.mark.parametrize(
    ("state", "term", "my_term", "expected"),
    [
        (SECONDARY, 5, 4, HeartbeatOutcome(newer_term=5, primary_seen=False, newer_config=False)),
        (SECONDARY, 4, 4, HeartbeatOutcome(newer_term=None, primary_seen=False, newer_config=False)),
        (PRIMARY, 4, 4, HeartbeatOutcome(newer_term=None, primary_seen=True, newer_config=False)),
        (PRIMARY, 5, 4, HeartbeatOutcome(newer_term=5, primary_seen=True, newer_config=False)),
        (PRIMARY, 3, 4, HeartbeatOutcome(newer_term=None, primary_seen=False, newer_config=False)),
    ],
)
def test_the_outcome_reports_a_newer_term_and_a_live_primary(
        state: MemberState, term: int, my_term: int, expected: HeartbeatOutcome) -> None:
    assert topology().on_heartbeat_reply(P_ID, reply(state, term=term), 1.0, 0, my_term=my_term) == expected


@pytest.mark.parametrize(
    ("config_term", "config_version", "carries_config", "newer"),
    [
        (1, 2, True, True),    # same config term, higher version
        (2, 1, True, True),    # higher config term wins even at the same version
        (1, 1, True, False),   # the config we have
        (0, 9, True, False),   # older config term, whatever the version
        (1, 2, False, False),  # a newer version announced but no config document attached
    ],
)
def test_the_outcome_reports_a_newer_config_only_when_the_reply_carries_one(
        config_term: int, config_version: int, carries_config: bool, newer: bool) -> None:
    topo = topology()  # our config: version 1, term 1
    doc = {"_id": "rs0", "version": config_version, "term": config_term} if carries_config else None
    outcome = topo.on_heartbeat_reply(P_ID, reply(config_version=config_version, config_term=config_term,
                                                  config=doc), 1.0, 0, my_term=1)
    assert outcome.newer_config is newer


def test_a_reply_from_a_stranger_changes_nothing() -> None:
    topo = topology()
    assert topo.on_heartbeat_reply(42, reply(PRIMARY, term=9), 1.0, 0, my_term=1) == HeartbeatOutcome(
        None, False, False)
    assert 42 not in topo.members


def test_a_heartbeat_request_records_the_senders_config() -> None:
    topo = topology()
    topo.on_heartbeat_request(S1_ID, 3_000, config_version=5, config_term=2)
    s1 = topo.members[S1_ID]
    assert (s1.last_heartbeat_recv_ms, s1.config_version, s1.config_term) == (3_000, 5, 2)
    topo.on_heartbeat_request(42, 3_000, config_version=5, config_term=2)  # stranger: ignored
    assert 42 not in topo.members


# --- positions -----------------------------------------------------------------------------------------


def test_a_position_moving_forward_is_recorded() -> None:
    topo = topology()
    assert topo.on_position(MemberPosition(S1_ID, ot(100), ot(90), 1), 1_000) is True
    s1 = topo.members[S1_ID]
    assert (s1.applied, s1.durable, s1.last_contact_ms, s1.reported_position) == (ot(100), ot(90), 1_000, True)


def test_positions_never_move_backwards() -> None:
    topo = topology()
    topo.on_position(MemberPosition(S1_ID, ot(100), ot(100), 1), 1_000)
    assert topo.on_position(MemberPosition(S1_ID, ot(80), ot(70), 1), 2_000) is False
    assert (topo.members[S1_ID].applied, topo.members[S1_ID].durable) == (ot(100), ot(100))
    assert topo.members[S1_ID].last_contact_ms == 2_000  # a stale report is still contact


def test_applied_and_durable_advance_independently() -> None:
    topo = topology()
    topo.on_position(MemberPosition(S1_ID, ot(100), ot(80), 1), 0)
    assert topo.on_position(MemberPosition(S1_ID, ot(90), ot(95), 1), 1) is True
    assert (topo.members[S1_ID].applied, topo.members[S1_ID].durable) == (ot(100), ot(95))


def test_positions_of_strangers_and_of_ourselves_are_ignored() -> None:
    topo = topology()
    assert topo.on_position(MemberPosition(42, ot(100), ot(100), 1), 0) is False
    assert topo.on_position(MemberPosition(S2_ID, ot(100), ot(100), 1), 0) is False
    assert S2_ID not in topo.members


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.integers(0, 1_000), st.integers(0, 3), st.integers(0, 1_000)),
                max_size=25))
def test_reported_positions_are_the_running_maximum(reports: list[tuple[int, int, int, int]]) -> None:
    topo = topology()
    for i, (a_term, a_secs, d_term, d_secs) in enumerate(reports):
        before = (topo.members[S1_ID].applied, topo.members[S1_ID].durable)
        applied, durable = ot(a_secs, term=a_term), ot(d_secs, term=d_term)
        moved = topo.on_position(MemberPosition(S1_ID, applied, durable, 1), i)
        after = (topo.members[S1_ID].applied, topo.members[S1_ID].durable)
        assert after == (max(before[0], applied), max(before[1], durable))
        assert moved == (after != before)


def test_positions_include_ourselves() -> None:
    topo = topology()
    topo.on_position(MemberPosition(S1_ID, ot(100), ot(90), 1), 0)
    applied, durable = topo.positions(ot(120), ot(110))
    assert applied == {P_ID: NULL_OPTIME, S1_ID: ot(100), S3_ID: NULL_OPTIME, S2_ID: ot(120)}
    assert durable == {P_ID: NULL_OPTIME, S1_ID: ot(90), S3_ID: NULL_OPTIME, S2_ID: ot(110)}


def test_positions_to_report_start_with_our_own() -> None:
    topo = topology(config(version=7))
    report = topo.positions_to_report(ot(120), ot(110))
    assert report == [MemberPosition(S2_ID, ot(120), ot(110), 7)]


def test_only_positions_reported_to_us_are_relayed() -> None:
    topo = topology()
    topo.on_heartbeat_reply(P_ID, reply(PRIMARY, applied=ot(130)), 1.0, 0, my_term=1)  # heard, not reported
    topo.on_position(MemberPosition(S3_ID, ot(100), ot(95), 1), 0)
    report = topo.positions_to_report(ot(120), ot(110))
    assert [p.member_id for p in report] == [S2_ID, S3_ID]
    assert report[1] == MemberPosition(S3_ID, ot(100), ot(95), 1)


def test_a_reported_member_without_an_optime_is_not_relayed() -> None:
    topo = topology()
    topo.on_position(MemberPosition(S3_ID, NULL_OPTIME, NULL_OPTIME, 1), 0)
    assert [p.member_id for p in topo.positions_to_report(ot(120), ot(110))] == [S2_ID]


def test_chain_relay_s1_forwards_s2s_position_to_the_primary() -> None:
    """P <- S1 <- S2: S2 reports to S1, S1's next report carries S2, and P learns S2's position."""
    s1_view = topology(me=S1_ID)
    s1_view.on_position(MemberPosition(S2_ID, ot(95), ot(94), 1), 1_000)
    report = s1_view.positions_to_report(ot(100), ot(99))
    assert report[0] == MemberPosition(S1_ID, ot(100), ot(99), 1)
    assert MemberPosition(S2_ID, ot(95), ot(94), 1) in report

    positions, term = parse_update_position(update_position_command(report, term=1))
    p_view = topology(me=P_ID)
    for pos in positions:
        p_view.on_position(pos, 1_100)
    assert term == 1
    assert (p_view.members[S2_ID].applied, p_view.members[S2_ID].durable) == (ot(95), ot(94))
    assert (p_view.members[S1_ID].applied, p_view.members[S1_ID].durable) == (ot(100), ot(99))


def test_newest_applied_is_the_newest_healthy_optime() -> None:
    topo = topology()
    assert topo.newest_applied() == NULL_OPTIME
    topo.on_heartbeat_reply(S1_ID, reply(applied=ot(100)), 1.0, 0, my_term=1)
    topo.on_heartbeat_reply(S3_ID, reply(applied=ot(140)), 1.0, 0, my_term=1)
    assert topo.newest_applied() == ot(140)
    fail(topo, S3_ID, 1, refused=True)
    assert topo.newest_applied() == ot(100)


# --- who is primary --------------------------------------------------------------------------------------


def test_we_are_the_primary_when_our_state_says_so() -> None:
    topo = topology()
    topo.on_heartbeat_reply(P_ID, reply(PRIMARY, term=9), 1.0, 0, my_term=1)
    assert topo.primary_id(PRIMARY, 9) == S2_ID


def test_no_primary_is_known_until_one_reports() -> None:
    topo = topology()
    topo.on_heartbeat_reply(S1_ID, reply(), 1.0, 0, my_term=1)
    assert topo.primary_id(SECONDARY, 1) is None


def test_the_primary_is_the_healthy_member_reporting_primary() -> None:
    topo = topology()
    topo.on_heartbeat_reply(P_ID, reply(PRIMARY, term=2), 1.0, 0, my_term=2)
    assert topo.primary_id(SECONDARY, 2) == P_ID


def test_the_primary_of_the_highest_term_wins() -> None:
    topo = topology()
    topo.on_heartbeat_reply(P_ID, reply(PRIMARY, term=2), 1.0, 0, my_term=2)
    topo.on_heartbeat_reply(S3_ID, reply(PRIMARY, term=3), 1.0, 0, my_term=2)
    assert topo.primary_id(SECONDARY, 2) == S3_ID


def test_a_primary_of_an_older_term_is_not_the_primary() -> None:
    topo = topology()
    topo.on_heartbeat_reply(P_ID, reply(PRIMARY, term=2), 1.0, 0, my_term=2)
    assert topo.primary_id(SECONDARY, 3) is None


def test_a_primary_that_went_down_is_not_the_primary() -> None:
    topo = topology()
    topo.on_heartbeat_reply(P_ID, reply(PRIMARY, term=2), 1.0, 0, my_term=2)
    fail(topo, P_ID, 10, refused=True)
    assert topo.primary_id(SECONDARY, 2) is None


# --- majority contact ------------------------------------------------------------------------------------


def three() -> ReplSetConfig:
    return config({"_id": 0, "host": P}, {"_id": 1, "host": S1}, {"_id": 2, "host": S2})


def test_alone_we_do_not_see_a_majority_of_three() -> None:
    assert topology(three(), me=P_ID).sees_majority(0, 10_000) is False


def test_one_other_voter_heard_recently_makes_a_majority_of_three() -> None:
    topo = topology(three(), me=P_ID)
    topo.on_heartbeat_reply(S1_ID, reply(), 1.0, 1_000, my_term=1)
    assert topo.sees_majority(1_000 + 9_999, 10_000) is True
    assert topo.sees_majority(1_000 + 10_000, 10_000) is False


def test_a_position_report_or_any_answer_counts_as_contact() -> None:
    topo = topology(three(), me=P_ID)
    topo.on_position(MemberPosition(S1_ID, ot(100), ot(100), 1), 5_000)
    assert topo.sees_majority(6_000, 10_000) is True
    topo2 = topology(three(), me=P_ID)
    topo2.touch(S2_ID, 5_000)
    assert topo2.sees_majority(6_000, 10_000) is True


def test_a_down_member_does_not_count_even_if_heard_recently() -> None:
    topo = topology(three(), me=P_ID)
    topo.on_heartbeat_reply(S1_ID, reply(), 1.0, 1_000, my_term=1)
    fail(topo, S1_ID, 1_001, refused=True)
    assert topo.sees_majority(1_002, 10_000) is False


def test_non_voters_do_not_count_towards_the_majority() -> None:
    cfg = config({"_id": 0, "host": P}, {"_id": 1, "host": S1, "votes": 0, "priority": 0},
                 {"_id": 2, "host": S2}, {"_id": 3, "host": S3})
    topo = topology(cfg, me=P_ID)
    topo.on_heartbeat_reply(S1_ID, reply(), 1.0, 0, my_term=1)
    assert topo.sees_majority(1, 10_000) is False  # P + S1 of voters {P, S2, S3}
    topo.on_heartbeat_reply(S3_ID, reply(), 1.0, 0, my_term=1)
    assert topo.sees_majority(1, 10_000) is True


def test_five_voters_need_two_others() -> None:
    cfg = config(*({"_id": i, "host": f"m{i}:27017"} for i in range(5)))
    topo = topology(cfg, me=0)
    topo.on_heartbeat_reply(1, reply(), 1.0, 0, my_term=1)
    assert topo.sees_majority(1, 10_000) is False
    topo.on_heartbeat_reply(4, reply(), 1.0, 0, my_term=1)
    assert topo.sees_majority(1, 10_000) is True


# --- reconfiguration -------------------------------------------------------------------------------------


def test_reconfigure_keeps_members_that_stay_and_drops_removed_ones() -> None:
    topo = topology()
    topo.on_heartbeat_reply(S1_ID, reply(applied=ot(100)), 6.0, 0, my_term=1)
    topo.on_heartbeat_reply(S3_ID, reply(applied=ot(90)), 6.0, 0, my_term=1)
    new = config({"_id": 0, "host": P}, {"_id": 1, "host": S1}, {"_id": 2, "host": S2},
                 {"_id": 4, "host": "s4:27017"}, version=2)
    topo.reconfigure(new, S2_ID)
    assert topo.config is new and sorted(topo.members) == [P_ID, S1_ID, 4]
    assert topo.members[S1_ID].applied == ot(100) and topo.members[S1_ID].ping.value_ms == 6.0
    assert topo.members[4].host == "s4:27017" and topo.members[4].applied == NULL_OPTIME
    assert topo.positions_to_report(ot(1), ot(1))[0].config_version == 2


def test_reconfigure_matches_members_by_host_not_id() -> None:
    topo = topology()
    topo.on_heartbeat_reply(S3_ID, reply(applied=ot(90)), 6.0, 0, my_term=1)
    new = config({"_id": 0, "host": P}, {"_id": 1, "host": S1}, {"_id": 2, "host": S2},
                 {"_id": 7, "host": S3}, {"_id": 3, "host": "s4:27017"}, version=2)
    topo.reconfigure(new, S2_ID)
    assert topo.members[7].host == S3 and topo.members[7].id == 7 and topo.members[7].applied == ot(90)
    assert topo.members[3].host == "s4:27017" and topo.members[3].applied == NULL_OPTIME


# --- sync source inputs ------------------------------------------------------------------------------------


def test_sync_source_inputs_carry_our_config_and_the_view() -> None:
    cfg = config({"_id": 0, "host": P}, {"_id": 1, "host": S1, "hidden": True, "priority": 0},
                 {"_id": 2, "host": S2}, {"_id": 3, "host": S3}, chainingAllowed=False)
    topo = topology(cfg)
    topo.on_heartbeat_reply(P_ID, reply(PRIMARY, applied=ot(100)), 9.0, 0, my_term=1)
    fail(topo, S3_ID, 0, refused=True)
    got = inputs_for(topo, last_fetched=ot(60), forced_host=S1, denylist=frozenset({S3}), now_ms=77)
    assert (got.self_id, got.self_last_fetched, got.self_votes, got.primary_id) == (S2_ID, ot(60), 1, P_ID)
    assert (got.chaining_allowed, got.forced_host, got.denylist, got.now_ms) == (False, S1, frozenset({S3}), 77)
    by_id = {m.id: m for m in got.members}
    assert sorted(by_id) == [P_ID, S1_ID, S3_ID]
    assert (by_id[P_ID].state, by_id[P_ID].ping_ms, by_id[P_ID].last_applied) == (PRIMARY, 9.0, ot(100))
    assert by_id[S1_ID].hidden and by_id[S1_ID].ping_ms is None
    assert not by_id[S3_ID].healthy and by_id[S3_ID].state is MemberState.DOWN


def test_s2_picks_s1_because_its_ping_is_lower() -> None:
    topo = topology()
    topo.on_heartbeat_reply(P_ID, reply(PRIMARY, applied=ot(100)), 20.0, 1_000, my_term=1)
    topo.on_heartbeat_reply(S1_ID, reply(applied=ot(100)), 3.0, 1_000, my_term=1)
    topo.on_heartbeat_reply(S3_ID, reply(applied=ot(100)), 8.0, 1_000, my_term=1)
    assert choose_sync_source(inputs_for(topo, now_ms=1_000)) == S1


def test_s2_moves_to_s3_once_s1s_smoothed_ping_grows() -> None:
    topo = topology()
    topo.on_heartbeat_reply(P_ID, reply(PRIMARY, applied=ot(100)), 20.0, 0, my_term=1)
    topo.on_heartbeat_reply(S1_ID, reply(applied=ot(100)), 3.0, 0, my_term=1)
    topo.on_heartbeat_reply(S3_ID, reply(applied=ot(100)), 8.0, 0, my_term=1)
    topo.on_heartbeat_reply(S1_ID, reply(applied=ot(100)), 12.0, 2_000, my_term=1)  # 3 -> 4.8
    assert choose_sync_source(inputs_for(topo, now_ms=2_000)) == S1  # one slow reply is not enough
    for t in (4_000, 6_000, 8_000):
        topo.on_heartbeat_reply(S1_ID, reply(applied=ot(100)), 12.0, t, my_term=1)
    assert topo.members[S1_ID].ping.value_ms > 8.0
    assert choose_sync_source(inputs_for(topo, now_ms=8_000)) == S3


def test_s2_skips_s1_once_s1_refuses_connections() -> None:
    topo = topology()
    topo.on_heartbeat_reply(P_ID, reply(PRIMARY, applied=ot(100)), 20.0, 0, my_term=1)
    topo.on_heartbeat_reply(S1_ID, reply(applied=ot(100)), 3.0, 0, my_term=1)
    topo.on_heartbeat_reply(S3_ID, reply(applied=ot(100)), 8.0, 0, my_term=1)
    fail(topo, S1_ID, 500, refused=True)
    assert choose_sync_source(inputs_for(topo, now_ms=500)) == S3


def test_no_sync_source_while_we_are_primary() -> None:
    topo = topology()
    topo.on_heartbeat_reply(S1_ID, reply(applied=ot(100)), 3.0, 0, my_term=1)
    got = inputs_for(topo, my_state=PRIMARY)
    assert got.primary_id == S2_ID and choose_sync_source(got) is None


# --- initiation and stepdown handoff ----------------------------------------------------------------


def test_the_initiator_stands_once_a_majority_of_voters_has_the_config() -> None:
    topo = topology(me=P_ID)  # four voters: a majority is three, ourselves included
    topo.on_heartbeat_reply(S1_ID, reply(), 1.0, 0, my_term=0)
    assert not topo.majority_has_config()
    topo.on_heartbeat_reply(S2_ID, reply(config_version=0), 1.0, 0, my_term=0)
    assert not topo.majority_has_config()  # S2 still has an older config
    topo.on_heartbeat_request(S2_ID, 1, config_version=1, config_term=1)
    assert topo.majority_has_config()


def test_the_handoff_target_is_a_caught_up_electable_secondary() -> None:
    topo = topology(config({"_id": 0, "host": P}, {"_id": 1, "host": S1, "priority": 0},
                           {"_id": 2, "host": S2}, {"_id": 3, "host": S3}), me=P_ID)
    topo.on_heartbeat_reply(S1_ID, reply(applied=ot(120)), 1.0, 0, my_term=1)  # priority 0: not electable
    topo.on_heartbeat_reply(S2_ID, reply(applied=ot(90)), 1.0, 0, my_term=1)   # behind
    assert topo.caught_up_electable(ot(100)) is None
    topo.on_heartbeat_reply(S3_ID, reply(applied=ot(100)), 1.0, 0, my_term=1)
    assert topo.caught_up_electable(ot(100)) == S3

