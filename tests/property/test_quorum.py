"""Quorum arithmetic against naive twins, plus tables for the cases worth naming.

The twins count instead of sorting: "the newest optime that at least k voting
data-bearing members hold" is found by trying every reported optime as a
candidate. Same answer, different algorithm (etcd-io/raft `quorum/quick_test.go`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from base.config import MemberConfig, ReplSetConfig, Settings
from base.optime import NULL_OPTIME, OpTime
from replset.quorum import (
    count_members_at,
    follower_commit_point,
    majority_commit_point,
    write_concern_satisfied,
)
from replset.write_concern import WriteConcern

# ---------------------------------------------------------------- naive twins


def naive_commit_point(config: ReplSetConfig, durable: Mapping[int, OpTime], current_term: int,
                       prior: OpTime) -> OpTime:
    voting_data = [m.id for m in config.members if m.votes >= 1 and not m.arbiter_only]
    voters = sum(1 for m in config.members if m.votes >= 1)
    needed = min(voters // 2 + 1, len(voting_data))
    best = None
    for candidate in durable.values():
        holders = 0
        for member_id in voting_data:
            if durable.get(member_id, NULL_OPTIME) >= candidate:
                holders += 1
        if holders >= needed and (best is None or candidate > best):
            best = candidate
    if best is not None and best.term == current_term and best > prior:
        return best
    return prior


def naive_count(config: ReplSetConfig, positions: Mapping[int, OpTime], target: OpTime) -> int:
    total = 0
    for member in config.members:
        if member.arbiter_only:
            continue
        if member.id in positions and not positions[member.id] < target:
            total += 1
    return total


def naive_satisfied(wc: WriteConcern, target: OpTime, config: ReplSetConfig, applied: Mapping[int, OpTime],
                    durable: Mapping[int, OpTime], commit_point: OpTime) -> bool:
    if wc.w == "majority":
        return not commit_point < target
    positions = durable if wc.j else applied
    if isinstance(wc.w, int):
        if wc.w == 0 and not wc.j:
            return True
        return naive_count(config, positions, target) >= max(wc.w, 1)
    mode = config.settings.get_last_error_modes.get(wc.w)
    if mode is None:
        return False
    for tag, count in mode.items():
        seen: list[str] = []
        for member in config.members:
            reached = member.id in positions and not positions[member.id] < target
            if not member.arbiter_only and reached and tag in member.tags and member.tags[tag] not in seen:
                seen.append(member.tags[tag])
        if len(seen) < count:
            return False
    return True


# ---------------------------------------------------------------- strategies

optimes = st.builds(OpTime, secs=st.integers(0, 4), inc=st.integers(0, 2), term=st.integers(-1, 3))
KINDS = ("voter", "arbiter", "non_voter")


@st.composite
def configs(draw: st.DrawFn) -> ReplSetConfig:
    kinds = draw(st.lists(st.sampled_from(KINDS), min_size=1, max_size=7))
    if "voter" not in kinds:
        kinds[0] = "voter"  # parse_config requires an electable voter
    dcs = draw(st.lists(st.sampled_from(["east", "west", "north"]), min_size=len(kinds), max_size=len(kinds)))
    members = []
    for i, (kind, dc) in enumerate(zip(kinds, dcs)):
        tags = {} if i % 3 == 2 else {"dc": dc, "host": f"h{i}"}
        members.append(MemberConfig(id=i, host=f"h:{i}", priority=1.0 if kind == "voter" else 0.0,
                                    votes=0 if kind == "non_voter" else 1,
                                    arbiter_only=kind == "arbiter", tags=tags))
    modes = {"twoDCs": {"dc": 2}, "threeDCs": {"dc": 3}, "dcAndHosts": {"dc": 2, "host": 3}, "empty": {},
             "anyDC": {"dc": 1}}
    return ReplSetConfig(name="rs0", version=1, term=1, members=tuple(members),
                         settings=Settings(get_last_error_modes=modes))


@st.composite
def positions_for(draw: st.DrawFn, config: ReplSetConfig) -> dict[int, OpTime]:
    """Optimes for a random subset of members, sometimes with an id that is not in the config."""
    ids = [m.id for m in config.members] + [99]
    chosen = draw(st.lists(st.sampled_from(ids), unique=True))
    return {i: draw(optimes) for i in chosen}


write_concerns = st.builds(
    WriteConcern,
    w=st.one_of(st.integers(0, 8), st.sampled_from(["majority", "twoDCs", "threeDCs", "dcAndHosts",
                                                    "empty", "anyDC", "noSuchMode"])),
    j=st.sampled_from([None, False, True]),
)

# ---------------------------------------------------------------- properties


@settings(max_examples=300, deadline=None)
@given(st.data(), st.integers(-1, 3), optimes)
def test_commit_point_matches_naive_twin(data: st.DataObject, current_term: int, prior: OpTime) -> None:
    config = data.draw(configs())
    durable = data.draw(positions_for(config))
    assert majority_commit_point(config, durable, current_term, prior) == \
        naive_commit_point(config, durable, current_term, prior)


@settings(max_examples=200, deadline=None)
@given(st.data(), st.integers(-1, 3), optimes)
def test_commit_point_is_safe_and_never_regresses(data: st.DataObject, current_term: int,
                                                  prior: OpTime) -> None:
    config = data.draw(configs())
    durable = data.draw(positions_for(config))
    result = majority_commit_point(config, durable, current_term, prior)
    assert result >= prior
    if result != prior:
        holders = [m for m in config.members
                   if m.votes and m.data_bearing and durable.get(m.id, NULL_OPTIME) >= result]
        assert result.term == current_term
        assert len(holders) >= config.write_majority_count


@settings(max_examples=200, deadline=None)
@given(st.data(), st.integers(0, 3))
def test_commit_point_is_monotone_in_progress(data: st.DataObject, current_term: int) -> None:
    """Within one term, more progress by any member never lowers the commit point."""
    config = data.draw(configs())
    in_term = {i: OpTime(o.secs, o.inc, current_term) for i, o in data.draw(positions_for(config)).items()}
    ahead = dict(in_term)
    for member_id in data.draw(st.lists(st.sampled_from([m.id for m in config.members]))):
        pushed = OpTime(data.draw(st.integers(0, 6)), 0, current_term)
        ahead[member_id] = max(ahead.get(member_id, NULL_OPTIME), pushed)
    before = majority_commit_point(config, in_term, current_term, NULL_OPTIME)
    assert majority_commit_point(config, ahead, current_term, NULL_OPTIME) >= before


@settings(max_examples=200, deadline=None)
@given(st.data(), st.integers(-1, 3))
def test_arbiters_non_voters_and_strangers_do_not_move_the_commit_point(data: st.DataObject,
                                                                       current_term: int) -> None:
    config = data.draw(configs())
    durable = data.draw(positions_for(config))
    ignored = {m.id for m in config.members if m.arbiter_only or m.votes == 0} | {99}
    pushed = {i: (OpTime(9, 9, current_term) if i in ignored else t) for i, t in durable.items()}
    pushed.update({i: OpTime(9, 9, current_term) for i in ignored})
    assert majority_commit_point(config, pushed, current_term, NULL_OPTIME) == \
        majority_commit_point(config, durable, current_term, NULL_OPTIME)


@settings(max_examples=300, deadline=None)
@given(st.data(), optimes)
def test_count_members_at_matches_naive_twin(data: st.DataObject, target: OpTime) -> None:
    config = data.draw(configs())
    positions = data.draw(positions_for(config))
    assert count_members_at(config, positions, target) == naive_count(config, positions, target)


@settings(max_examples=500, deadline=None)
@given(st.data(), write_concerns, optimes, optimes)
def test_write_concern_matches_naive_twin(data: st.DataObject, wc: WriteConcern, target: OpTime,
                                          commit_point: OpTime) -> None:
    config = data.draw(configs())
    applied = data.draw(positions_for(config))
    durable = data.draw(positions_for(config))
    got = write_concern_satisfied(wc, target, config=config, applied=applied, durable=durable,
                                  commit_point=commit_point)
    assert got == naive_satisfied(wc, target, config, applied, durable, commit_point)


# ---------------------------------------------------------------- tables


def make_config(*kinds: str, modes: dict[str, Any] | None = None,
                tags: list[dict[str, str]] | None = None) -> ReplSetConfig:
    members = tuple(
        MemberConfig(id=i, host=f"h:{i}", priority=1.0 if kind == "voter" else 0.0,
                     votes=0 if kind == "non_voter" else 1, arbiter_only=kind == "arbiter",
                     tags=(tags[i] if tags else {}))
        for i, kind in enumerate(kinds)
    )
    return ReplSetConfig(name="rs0", version=1, term=1, members=members,
                         settings=Settings(get_last_error_modes=modes or {}))


def t(secs: int, term: int = 2) -> OpTime:
    return OpTime(secs, 1, term)


THREE = make_config("voter", "voter", "voter")
FIVE = make_config("voter", "voter", "voter", "voter", "voter")
WITH_ARBITER = make_config("voter", "voter", "arbiter")
WITH_NON_VOTER = make_config("voter", "voter", "voter", "non_voter")


@pytest.mark.parametrize(
    ("name", "config", "durable", "term", "prior", "expected"),
    [
        ("3 members: the middle one", THREE, {0: t(5), 1: t(3), 2: t(1)}, 2, NULL_OPTIME, t(3)),
        ("3 members: one reported", THREE, {0: t(5)}, 2, NULL_OPTIME, NULL_OPTIME),
        ("3 members: two equal", THREE, {0: t(4), 1: t(4)}, 2, NULL_OPTIME, t(4)),
        ("5 members: third newest", FIVE, {0: t(9), 1: t(8), 2: t(7), 3: t(2), 4: t(1)}, 2,
         NULL_OPTIME, t(7)),
        ("5 members: two down", FIVE, {0: t(9), 1: t(8), 2: t(7)}, 2, NULL_OPTIME, t(7)),
        ("5 members: three down", FIVE, {0: t(9), 1: t(8)}, 2, NULL_OPTIME, NULL_OPTIME),
        # PSA: majority of 3 voters is 2, both data-bearing voters are needed; the arbiter's
        # position (had it one) is irrelevant.
        ("arbiter needs both data members", WITH_ARBITER, {0: t(6), 1: t(4), 2: t(9)}, 2,
         NULL_OPTIME, t(4)),
        ("arbiter cannot stand in", WITH_ARBITER, {0: t(6), 2: t(9)}, 2, NULL_OPTIME, NULL_OPTIME),
        ("non-voter does not count", WITH_NON_VOTER, {0: t(6), 3: t(6), 1: t(1)}, 2,
         NULL_OPTIME, t(1)),
        ("older term holds the commit point back", THREE, {0: t(5, term=1), 1: t(5, term=1)}, 2,
         t(2, term=1), t(2, term=1)),
        ("current term advances past older prior", THREE, {0: t(6), 1: t(6), 2: t(5, term=1)}, 2,
         t(2, term=1), t(6)),
        ("never backwards", THREE, {0: t(3), 1: t(3)}, 2, t(4), t(4)),
        ("stranger's report ignored", THREE, {0: t(5), 7: t(5)}, 2, NULL_OPTIME, NULL_OPTIME),
    ],
)
def test_commit_point_table(name: str, config: ReplSetConfig, durable: dict[int, OpTime], term: int,
                            prior: OpTime, expected: OpTime) -> None:
    assert majority_commit_point(config, durable, term, prior) == expected, name


def test_count_members_at_skips_arbiters_and_counts_non_voters() -> None:
    config = make_config("voter", "voter", "arbiter", "non_voter")
    positions = {0: t(5), 1: t(2), 2: t(9), 3: t(5)}
    assert count_members_at(config, positions, t(5)) == 2
    assert count_members_at(config, positions, t(1)) == 3


DC_TAGS = [{"dc": "east"}, {"dc": "east"}, {"dc": "west"}, {}]
TAGGED = make_config("voter", "voter", "voter", "non_voter", modes={"multiDC": {"dc": 2}}, tags=DC_TAGS)


@pytest.mark.parametrize(
    ("wc", "applied", "durable", "commit_point", "expected"),
    [
        (WriteConcern(w=0, j=False), {}, {}, NULL_OPTIME, True),
        (WriteConcern(w=1), {0: t(5)}, {}, NULL_OPTIME, True),
        (WriteConcern(w=2), {0: t(5), 1: t(4)}, {}, NULL_OPTIME, False),
        (WriteConcern(w=2), {0: t(5), 3: t(5)}, {}, NULL_OPTIME, True),  # a non-voter counts for w:N
        (WriteConcern(w=2, j=True), {0: t(5), 1: t(5)}, {0: t(5)}, NULL_OPTIME, False),
        (WriteConcern(w=2, j=True), {0: t(5), 1: t(5)}, {0: t(5), 1: t(6)}, NULL_OPTIME, True),
        (WriteConcern(w=0, j=True), {0: t(5)}, {}, NULL_OPTIME, False),
        (WriteConcern(w="majority"), {0: t(5), 1: t(5), 2: t(5)}, {}, t(4), False),
        (WriteConcern(w="majority"), {}, {}, t(5), True),
        (WriteConcern(w="multiDC"), {0: t(5), 1: t(5)}, {}, NULL_OPTIME, False),  # both east
        (WriteConcern(w="multiDC"), {0: t(5), 2: t(5)}, {}, NULL_OPTIME, True),
        (WriteConcern(w="multiDC", j=True), {0: t(5), 2: t(5)}, {0: t(5)}, NULL_OPTIME, False),
        (WriteConcern(w="noSuchMode"), {0: t(5), 1: t(5), 2: t(5)}, {}, t(9), False),
    ],
)
def test_write_concern_table(wc: WriteConcern, applied: dict[int, OpTime], durable: dict[int, OpTime],
                             commit_point: OpTime, expected: bool) -> None:
    got = write_concern_satisfied(wc, t(5), config=TAGGED, applied=applied, durable=durable,
                                  commit_point=commit_point)
    assert got is expected


def test_arbiter_tags_never_count() -> None:
    config = make_config("voter", "voter", "arbiter", modes={"multiDC": {"dc": 2}},
                         tags=[{"dc": "east"}, {"dc": "east"}, {"dc": "west"}])
    wc = WriteConcern(w="multiDC")
    assert not write_concern_satisfied(wc, t(5), config=config, applied={0: t(5), 2: t(5)}, durable={},
                                       commit_point=NULL_OPTIME)


def test_follower_commit_point_stays_off_a_diverged_tail() -> None:
    prior = OpTime(100, 1, 1)
    learned = OpTime(105, 1, 2)  # committed by the primary of term 2
    # Our tail is term-1 entries past ts 105 that term 2 never had: not committed.
    assert follower_commit_point(learned, OpTime(110, 1, 1), prior) == prior
    # An entry of term 2 proves we are on the committed branch.
    assert follower_commit_point(learned, OpTime(103, 1, 2), prior) == OpTime(103, 1, 2)
    assert follower_commit_point(learned, OpTime(107, 1, 2), prior) == learned
    assert follower_commit_point(learned, OpTime(90, 1, 3), prior) == learned
    assert follower_commit_point(OpTime(99, 1, 1), OpTime(110, 1, 1), prior) == prior  # never backwards
