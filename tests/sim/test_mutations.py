"""The simulator catches broken cores.

Each test swaps one product core, as the simulated member calls it, for a
deliberately wrong version (a voter that forgets its vote, a commit point
counted without a majority or without Raft's current-term rule, the plain
`min()` follower commit point, `w: N` counting one member short) and checks
that a handful of seeds find it. A simulator whose checkers cannot see these
would pass every seed and prove nothing.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from types import ModuleType
from typing import Any

import pytest

import tests.sim.clients as sim_clients
import tests.sim.node as sim_node
from oplog.optime import NULL_OPTIME, OpTime
from replset import election, quorum
from replset.config import ReplSetConfig
from replset.write_concern import WriteConcern
from tests.sim.runner import run_seed

SEED_BUDGET = 40  # the first failing seed must come within this many


def _voter_forgets_its_vote(req: election.VoteRequest, **kwargs: Any) -> Any:
    kwargs["last_vote"] = None
    return election.decide_vote(req, **kwargs)


def _commit_with_one_member_short(config: ReplSetConfig, durable: Mapping[int, OpTime], current_term: int,
                                  prior: OpTime) -> OpTime:
    voting = [m for m in config.members if m.votes > 0 and m.data_bearing]
    newest_first = sorted((durable.get(m.id, NULL_OPTIME) for m in voting), reverse=True)
    candidate = newest_first[max(0, config.write_majority_count - 2)]
    return candidate if candidate.term == current_term and candidate > prior else prior


def _commit_without_term_rule(config: ReplSetConfig, durable: Mapping[int, OpTime], current_term: int,
                              prior: OpTime) -> OpTime:
    voting = [m for m in config.members if m.votes > 0 and m.data_bearing]
    newest_first = sorted((durable.get(m.id, NULL_OPTIME) for m in voting), reverse=True)
    return max(prior, newest_first[config.write_majority_count - 1])


def _follower_plain_min(learned: OpTime, last_applied: OpTime, prior: OpTime) -> OpTime:
    return max(prior, min(learned, last_applied))


def _w_n_one_short(wc: WriteConcern, target: OpTime, **kwargs: Any) -> bool:
    if isinstance(wc.w, int) and wc.w > 1:
        wc = dataclasses.replace(wc, w=wc.w - 1)
    return quorum.write_concern_satisfied(wc, target, **kwargs)


# what breaks -> (the simulator module that calls the core, the core's name there, the broken twin,
# the checker that must report it; "" for any)
MUTATIONS: dict[str, tuple[ModuleType, str, Callable[..., Any], str]] = {
    "a voter grants two votes in one term": (sim_node, "decide_vote", _voter_forgets_its_vote, ""),
    "the commit point needs one member less than a majority": (
        sim_node, "majority_commit_point", _commit_with_one_member_short, ""),
    "the commit point ignores the current-term rule": (
        sim_node, "majority_commit_point", _commit_without_term_rule, ""),
    "a secondary takes min(learned, last applied) in any term": (
        sim_node, "follower_commit_point", _follower_plain_min, ""),
    "w:N counts one member short": (
        sim_clients, "write_concern_satisfied", _w_n_one_short, "w_n_acks_had_holders"),
}


@pytest.mark.parametrize("mutation", sorted(MUTATIONS))
def test_the_simulator_catches_a_broken_core(mutation: str, monkeypatch: pytest.MonkeyPatch) -> None:
    module, name, broken, checker = MUTATIONS[mutation]
    monkeypatch.setattr(module, name, broken)
    for seed in range(SEED_BUDGET):
        failures = run_seed(seed).failures
        if failures and any(f.startswith(checker) for f in failures):
            return
    pytest.fail(f"no seed below {SEED_BUDGET} noticed that {mutation}")


def test_two_votes_per_term_show_as_two_primaries(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sim_node, "decide_vote", _voter_forgets_its_vote)
    for seed in range(SEED_BUDGET * 2):
        if any(f.startswith("one_primary_per_term") for f in run_seed(seed).failures):
            return
    pytest.fail("a voter granting two votes per term never produced two primaries in one term")
