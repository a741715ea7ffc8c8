"""The voter's rules, the candidate's tally, the jittered timeout and takeover ranks."""

from __future__ import annotations

import dataclasses
import random
from typing import Any

import pytest

from base.config import MemberConfig, ReplSetConfig, Settings
from base.optime import OpTime
from base.votes import LastVote, VoteRequest, VoteResponse
from replset.election import (
    ElectionTally,
    config_is_older,
    decide_vote,
    election_timeout_ms,
    priority_takeover_delay_ms,
)

MINE = OpTime(100, 5, 3)
REQ = VoteRequest(set_name="rs0", dry_run=False, term=4, candidate_id=1, config_version=2, config_term=3,
                  last_applied=MINE)
VOTER: dict[str, Any] = {
    "set_name": "rs0", "my_term": 3, "my_last_applied": MINE, "config_version": 2, "config_term": 3,
    "last_vote": None, "i_am_arbiter": False, "healthy_primary_priority_ge_candidate": False,
}


def vote(req: VoteRequest = REQ, **overrides: Any) -> tuple[VoteResponse, LastVote | None]:
    return decide_vote(req, **{**VOTER, **overrides})


def ask(**changes: Any) -> VoteRequest:
    return dataclasses.replace(REQ, **changes)


# ---------------------------------------------------------------- refusals


@pytest.mark.parametrize(
    ("req", "overrides", "reason_start"),
    [
        (ask(term=2), {}, "candidate's term (2) is lower than mine (3)"),
        (ask(term=3), {"last_vote": LastVote(4, 2)}, "candidate's term (3) is lower than mine (4)"),
        (ask(set_name="other"), {}, "candidate's set name (other) differs from mine (rs0)"),
        (ask(config_version=1), {}, "candidate's config with {version: 1, term: 3} is older"),
        (ask(config_term=2, config_version=9), {}, "candidate's config with {version: 9, term: 2} is older"),
        (ask(last_applied=OpTime(100, 4, 3)), {}, "candidate's data is staler than mine"),
        (ask(last_applied=OpTime(101, 9, 2)), {}, "candidate's data is staler than mine"),
        (REQ, {"last_vote": LastVote(4, 2)}, "already voted for another candidate (2) this term (4)"),
        (REQ, {"last_vote": LastVote(4, 2), "my_term": 4}, "already voted for another candidate (2)"),
        (REQ, {"i_am_arbiter": True, "healthy_primary_priority_ge_candidate": True},
         "can see a healthy primary of equal or greater priority"),
    ],
)
def test_refusals(req: VoteRequest, overrides: dict[str, Any], reason_start: str) -> None:
    response, to_persist = vote(req, **overrides)
    assert not response.vote_granted
    assert response.reason.startswith(reason_start), response.reason
    assert to_persist is None


@pytest.mark.parametrize("dry_run", [False, True])
def test_refusals_apply_to_dry_runs_too(dry_run: bool) -> None:
    response, _ = vote(ask(dry_run=dry_run, last_applied=OpTime(1, 1, 1)))
    assert not response.vote_granted


def test_refused_real_election_still_adopts_the_higher_term() -> None:
    response, to_persist = vote(ask(term=7, last_applied=OpTime(1, 1, 1)))
    assert (response.term, response.vote_granted, to_persist) == (7, False, None)


def test_a_foreign_set_cannot_raise_our_term() -> None:
    response, _ = vote(ask(set_name="other", term=50))
    assert response.term == 3


def test_lower_term_refusal_reports_our_term() -> None:
    response, _ = vote(ask(term=1))
    assert response.term == 3


# ---------------------------------------------------------------- grants


@pytest.mark.parametrize(
    ("req", "overrides"),
    [
        (REQ, {}),
        (ask(last_applied=OpTime(100, 6, 3)), {}),  # candidate ahead of us
        (ask(last_applied=OpTime(101, 1, 4)), {}),
        (ask(config_version=3), {}),  # a newer config than ours is fine: we learn it by heartbeat
        (ask(config_term=4, config_version=1), {}),
        (ask(config_term=-1, config_version=2), {}),  # an unset term compares by version alone
        (REQ, {"last_vote": LastVote(3, 2)}),  # a vote in an earlier term does not bind
        (REQ, {"last_vote": LastVote(4, 1)}),  # the same candidate asking again (retransmission)
        (REQ, {"i_am_arbiter": True}),  # arbiter that sees no better primary
        (REQ, {"healthy_primary_priority_ge_candidate": True}),  # only arbiters act on this
        (ask(config_version=3), {"i_am_arbiter": True, "healthy_primary_priority_ge_candidate": True}),
        (ask(term=3), {}),  # same term, no vote yet (e.g. the candidate's term was already ours)
    ],
)
def test_grants_record_the_vote_to_persist(req: VoteRequest, overrides: dict[str, Any]) -> None:
    response, to_persist = vote(req, **overrides)
    assert response.vote_granted, response.reason
    assert response.reason == ""
    assert to_persist == LastVote(req.term, req.candidate_id)
    assert response.term == max(req.term, VOTER["my_term"], getattr(overrides.get("last_vote"), "term", 0))


# ---------------------------------------------------------------- dry run


def test_dry_run_grants_without_recording_a_vote_or_changing_term() -> None:
    response, to_persist = vote(ask(dry_run=True, term=3))
    assert (response.vote_granted, response.term, to_persist) == (True, 3, None)


def test_dry_run_with_a_higher_term_does_not_change_ours() -> None:
    response, to_persist = vote(ask(dry_run=True, term=9))
    assert (response.vote_granted, response.term, to_persist) == (True, 3, None)


def test_dry_run_ignores_a_vote_already_cast_this_term() -> None:
    response, to_persist = vote(ask(dry_run=True), last_vote=LastVote(4, 2), my_term=4)
    assert (response.vote_granted, to_persist) == (True, None)


def test_one_vote_per_term_across_candidates() -> None:
    """Two candidates in the same term: the second is refused once the first vote is persisted."""
    first, persisted = vote(ask(candidate_id=1))
    assert first.vote_granted and persisted == LastVote(4, 1)
    second, again = vote(ask(candidate_id=2), my_term=first.term, last_vote=persisted)
    assert not second.vote_granted and again is None


def test_config_order() -> None:
    assert config_is_older(1, 5, 2, 5)
    assert config_is_older(9, 4, 1, 5)
    assert not config_is_older(1, 6, 9, 5)
    assert config_is_older(1, -1, 2, 5) and not config_is_older(3, -1, 2, 5)
    assert not config_is_older(2, 3, 2, 3)


# ---------------------------------------------------------------- tally


def make_config(priorities: list[float], *, arbiters: tuple[int, ...] = (),
                non_voters: tuple[int, ...] = (), hidden: tuple[int, ...] = ()) -> ReplSetConfig:
    members = tuple(
        MemberConfig(id=i, host=f"h:{i}", priority=p, votes=0 if i in non_voters else 1,
                     arbiter_only=i in arbiters, hidden=i in hidden)
        for i, p in enumerate(priorities)
    )
    return ReplSetConfig(name="rs0", version=1, term=1, members=members, settings=Settings())


def test_single_voter_wins_alone() -> None:
    tally = ElectionTally(make_config([1.0]), candidate_id=0)
    assert tally.won and not tally.lost


@pytest.mark.parametrize(
    ("voters", "answers", "won", "lost"),
    [
        (3, [], False, False),
        (3, [(1, True)], True, False),
        (3, [(1, False)], False, False),
        (3, [(1, False), (2, False)], False, True),
        (3, [(1, False), (2, True)], True, False),
        (5, [(1, True)], False, False),
        (5, [(1, True), (2, True)], True, False),
        (5, [(1, False), (2, False)], False, False),
        (5, [(1, False), (2, False), (3, False)], False, True),
        (5, [(1, False), (2, True), (3, False), (4, True)], True, False),
        (5, [(1, True), (1, True)], False, False),  # a duplicate answer counts once
        (5, [(1, False), (1, True)], False, False),  # the first answer sticks
        (5, [(0, False), (1, False), (2, False)], False, False),  # the candidate's own vote stays
        (5, [(9, True), (8, True)], False, False),  # strangers do not vote
    ],
)
def test_tally(voters: int, answers: list[tuple[int, bool]], won: bool, lost: bool) -> None:
    tally = ElectionTally(make_config([1.0] * voters), candidate_id=0)
    for member_id, granted in answers:
        tally.record(member_id, granted)
    assert (tally.won, tally.lost) == (won, lost)


def test_tally_counts_arbiters_but_not_non_voters() -> None:
    config = make_config([1.0, 1.0, 0.0, 0.0], arbiters=(2,), non_voters=(3,))  # 3 voters
    tally = ElectionTally(config, candidate_id=0)
    tally.record(3, True)
    assert not tally.won and tally.granted == 1
    tally.record(2, True)
    assert tally.won and tally.granted == 2


def test_tally_counts_granted_and_refused() -> None:
    tally = ElectionTally(make_config([1.0] * 5), candidate_id=0)
    tally.record(1, False)
    tally.record(2, True)
    assert (tally.granted, tally.refused) == (2, 1)


# ---------------------------------------------------------------- timers


@pytest.mark.parametrize("seed", range(20))
def test_election_timeout_jitter_bounds(seed: int) -> None:
    rng = random.Random(seed)
    for _ in range(200):
        timeout = election_timeout_ms(10_000, rng)
        assert 10_000 <= timeout < 11_500


def test_election_timeout_spreads_and_is_reproducible() -> None:
    first = [election_timeout_ms(10_000, random.Random(7)) for _ in range(3)]
    assert len(set(first)) == 1  # same seed, same draw
    values = {election_timeout_ms(10_000, random.Random(seed)) for seed in range(50)}
    assert len(values) > 40


class Fixed:
    def __init__(self, value: float) -> None:
        self.value = value

    def random(self) -> float:
        return self.value


@pytest.mark.parametrize(
    ("base", "draw", "expected"),
    [(10_000, 0.0, 10_000), (10_000, 0.5, 10_750), (10_000, 0.9999999, 11_499), (10_000, 1.0, 11_499),
     (5, 0.9, 5), (0, 0.5, 0), (1000, 0.5, 1075)],
)
def test_election_timeout_edges(base: int, draw: float, expected: int) -> None:
    assert election_timeout_ms(base, Fixed(draw)) == expected


@pytest.mark.parametrize(
    ("my_id", "expected_rank"),
    [(0, 0), (1, 1), (2, 1), (3, 3), (4, 3)],
)
def test_priority_takeover_delay_ranks(my_id: int, expected_rank: int) -> None:
    # priorities: 3, 2, 2, 1, 1; member 5 is hidden with priority 0, member 6 an arbiter.
    config = make_config([3.0, 2.0, 2.0, 1.0, 1.0, 0.0, 0.0], hidden=(5,), arbiters=(6,))
    assert priority_takeover_delay_ms(config, my_id, 10_000) == (expected_rank + 1) * 10_000


def test_priority_takeover_ignores_unelectable_members() -> None:
    # A hidden member cannot have priority > 0 after parsing; build it directly to show it is skipped.
    config = make_config([1.0, 5.0], hidden=(1,))
    assert priority_takeover_delay_ms(config, 0, 2000) == 2000


def test_priority_takeover_unknown_member() -> None:
    with pytest.raises(ValueError):
        priority_takeover_delay_ms(make_config([1.0]), 7, 10_000)


def test_priority_takeover_needs_a_higher_priority_and_fresh_data() -> None:
    from base.config import parse_config
    from replset.election import wants_priority_takeover

    cfg = parse_config({"_id": "rs0", "members": [{"_id": 0, "host": "a:1", "priority": 1},
                                                  {"_id": 1, "host": "b:1", "priority": 5},
                                                  {"_id": 2, "host": "c:1", "priority": 1}]})
    fresh, stale = OpTime(100, 1, 1), OpTime(97, 1, 1)
    primary_at = OpTime(101, 1, 1)
    assert wants_priority_takeover(cfg, 1, 0, my_applied=fresh, primary_applied=primary_at)
    assert not wants_priority_takeover(cfg, 1, 0, my_applied=stale, primary_applied=primary_at)
    assert not wants_priority_takeover(cfg, 2, 0, my_applied=fresh, primary_applied=primary_at)  # equal
    assert not wants_priority_takeover(cfg, 0, 1, my_applied=fresh, primary_applied=primary_at)  # lower
