"""Votes: `replSetRequestVotes` as members exchange it, and the durable record of a member's last vote.

The rules for granting one are the election core's (`replset.election.decide_vote`).
"""

from __future__ import annotations

__layer__ = "core"  # pure: no I/O, clock or randomness (tests/unit/test_layering.py)

from dataclasses import dataclass

from base.optime import OpTime


@dataclass(frozen=True, slots=True)
class VoteRequest:
    """`replSetRequestVotes`: `term` is the candidate's current term in a dry run, term + 1 otherwise."""

    set_name: str
    dry_run: bool
    term: int
    candidate_id: int
    config_version: int
    config_term: int
    last_applied: OpTime


@dataclass(frozen=True, slots=True)
class VoteResponse:
    """The voter's answer; `term` is the voter's term after handling the request."""

    term: int
    vote_granted: bool
    reason: str = ""


@dataclass(frozen=True, slots=True)
class LastVote:
    """The durable record of the last real-election vote (`local.replset.election`)."""

    term: int
    candidate_id: int
