"""Elections (protocol version 1): the voter's decision, the candidate's tally, and timers.

Theory of operation
-------------------
A secondary that has not heard from a primary for `election_timeout_ms` (the
configured timeout plus up to 15 % random jitter, so that members rarely time
out together) becomes a candidate:

    SECONDARY --timeout--> dry run (term unchanged) --majority--> real election (term + 1)
    real election --majority of yes--> PRIMARY (after catch-up and drain)
    any phase --refused by a majority, or a higher term seen--> SECONDARY

The **dry run** asks "would you vote for me?" without touching anyone's term
or vote, so a member cut off from the primary cannot bump the term and depose
a healthy primary. The **real election** increments the term, records a vote
for itself, and asks again. `ElectionTally` counts the answers of either round.

A voter answers with `decide_vote`, MongoDB's rules in order: refuse a lower
term, a different set name, an older config, a candidate whose log is behind
ours, a second candidate in a term we already voted in (real elections only),
and, as an arbiter, any candidate while we see a healthy primary of equal or
higher priority (that stops two members that cannot see each other from
taking turns). Persistence is the caller's job and its order matters: the
vote it returns must be fsynced *before* the response is sent, or a restart
could let this member vote twice in one term (lessons.md, pysyncobj PR #202).

A member of higher priority than the primary runs a **priority takeover**
after `priority_takeover_delay_ms`: one election timeout per rank, so the most
preferred member tries first.

Pure: time is passed in as milliseconds and randomness as an object with
`.random()` (a seeded `random.Random` in tests and the simulator).
"""

from __future__ import annotations

__layer__ = "core"  # pure: no I/O, clock or randomness (tests/unit/test_layering.py)

from fractions import Fraction
from typing import Protocol

from base.config import ReplSetConfig
from base.optime import OpTime
from base.votes import LastVote, VoteRequest, VoteResponse

# replElectionTimeoutOffsetLimitFraction: the jitter is below this share of the timeout.
ELECTION_TIMEOUT_OFFSET_LIMIT_FRACTION = Fraction(15, 100)
# priorityTakeoverFreshnessWindowSeconds: only a member this close to the primary takes over.
PRIORITY_TAKEOVER_FRESHNESS_SECS = 2
UNINITIALIZED_TERM = -1


class RandomSource(Protocol):
    """The part of `random.Random` the election timer uses."""

    def random(self) -> float: ...


def config_is_older(version: int, term: int, than_version: int, than_term: int) -> bool:
    """MongoDB's `ConfigVersionAndTerm` order: by term, then version; by version alone if a term is unset."""
    if term == UNINITIALIZED_TERM or than_term == UNINITIALIZED_TERM:
        return version < than_version
    return (term, version) < (than_term, than_version)


def _refusal(req: VoteRequest, *, set_name: str, my_term: int, my_last_applied: OpTime,
             config_version: int, config_term: int, last_vote: LastVote | None, i_am_arbiter: bool,
             healthy_primary_priority_ge_candidate: bool) -> str | None:
    """Why the vote is refused, or None to grant it. The order follows MongoDB's voter."""
    if req.term < my_term:
        return f"candidate's term ({req.term}) is lower than mine ({my_term})"
    if req.set_name != set_name:
        return f"candidate's set name ({req.set_name}) differs from mine ({set_name})"
    if config_is_older(req.config_version, req.config_term, config_version, config_term):
        return (f"candidate's config with {{version: {req.config_version}, term: {req.config_term}}} "
                f"is older than mine with {{version: {config_version}, term: {config_term}}}")
    if req.last_applied < my_last_applied:
        return (f"candidate's data is staler than mine. candidate's last applied OpTime: "
                f"{req.last_applied}, my last applied OpTime: {my_last_applied}")
    if (not req.dry_run and last_vote is not None and last_vote.term == req.term
            and last_vote.candidate_id != req.candidate_id):
        return (f"already voted for another candidate ({last_vote.candidate_id}) "
                f"this term ({last_vote.term})")
    same_config = (req.config_version, req.config_term) == (config_version, config_term)
    if i_am_arbiter and healthy_primary_priority_ge_candidate and same_config:
        return "can see a healthy primary of equal or greater priority"
    return None


def decide_vote(req: VoteRequest, *, set_name: str, my_term: int, my_last_applied: OpTime,
                config_version: int, config_term: int, last_vote: LastVote | None, i_am_arbiter: bool,
                healthy_primary_priority_ge_candidate: bool) -> tuple[VoteResponse, LastVote | None]:
    """A voter's answer to `replSetRequestVotes`, and the vote record to persist.

    Ordering contract: when the second element is not None the caller must
    write it durably (fsync `local.replset.election`) BEFORE sending the
    response; if that write fails, send nothing. When `response.term` is
    greater than `my_term` the caller adopts that term (a primary steps down)
    and persists it too. A dry run never changes the term or records a vote.

    Deviations from MongoDB, both on the safe side: a repeated request from the
    candidate we already voted for this term is granted again (retransmissions
    are idempotent, as in Raft), and a higher term from another replica set
    (different set name) is not adopted. A vote recorded for a term above
    `my_term` (a term lost on restart) still counts as our term.

    `healthy_primary_priority_ge_candidate` is the caller's heartbeat view: we
    see a healthy primary, other than the candidate, whose priority is at least
    the candidate's. Only arbiters act on it, and only with the candidate's
    config equal to ours (otherwise our view of the primary may be stale).
    """
    my_term = max(my_term, last_vote.term if last_vote is not None else my_term)
    reason = _refusal(req, set_name=set_name, my_term=my_term, my_last_applied=my_last_applied,
                      config_version=config_version, config_term=config_term, last_vote=last_vote,
                      i_am_arbiter=i_am_arbiter,
                      healthy_primary_priority_ge_candidate=healthy_primary_priority_ge_candidate)
    adopts_term = not req.dry_run and req.set_name == set_name and req.term > my_term
    term = req.term if adopts_term else my_term
    if reason is not None:
        return VoteResponse(term=term, vote_granted=False, reason=reason), None
    if req.dry_run:
        return VoteResponse(term=term, vote_granted=True), None
    return VoteResponse(term=term, vote_granted=True), LastVote(req.term, req.candidate_id)


class ElectionTally:
    """The candidate's count of one round's answers (dry run or real election).

    The candidate's own vote counts when it is a voter. Answers from members
    that are not voters of `config`, or a second answer from the same member,
    are ignored, so duplicated or reordered responses cannot change the result.
    """

    __slots__ = ("_granted", "_needed", "_refused", "_voters")

    def __init__(self, config: ReplSetConfig, candidate_id: int) -> None:
        self._voters = frozenset(m.id for m in config.voters)
        self._needed = config.majority_vote_count
        self._granted: set[int] = {candidate_id} & self._voters
        self._refused: set[int] = set()

    def record(self, member_id: int, granted: bool) -> None:
        if member_id not in self._voters or member_id in self._granted or member_id in self._refused:
            return
        (self._granted if granted else self._refused).add(member_id)

    @property
    def granted(self) -> int:
        return len(self._granted)

    @property
    def refused(self) -> int:
        return len(self._refused)

    @property
    def won(self) -> bool:
        """A majority of the voting members (the candidate included) said yes."""
        return len(self._granted) >= self._needed

    @property
    def lost(self) -> bool:
        """So many voters said no that the yes votes can no longer reach a majority."""
        return len(self._voters) - len(self._refused) < self._needed


def election_timeout_ms(base_ms: int, rng: RandomSource) -> int:
    """`base_ms` plus a random offset in [0, 15 % of base_ms), drawn from `rng`."""
    upper = int(base_ms * ELECTION_TIMEOUT_OFFSET_LIMIT_FRACTION)
    if upper <= 0:
        return base_ms
    return base_ms + min(int(rng.random() * upper), upper - 1)


def priority_takeover_delay_ms(config: ReplSetConfig, my_id: int, election_timeout_ms: int) -> int:
    """How long a member of higher priority than the primary waits before a takeover.

    (rank + 1) x election timeout, where rank is the number of electable members
    with a strictly higher priority than ours: the most preferred member goes first.
    """
    me = config.member_by_id(my_id)
    if me is None:
        raise ValueError(f"member {my_id} is not in the replica set config")
    rank = sum(1 for m in config.members if m.electable and m.priority > me.priority)
    return (rank + 1) * election_timeout_ms


def wants_priority_takeover(config: ReplSetConfig, my_id: int, primary_id: int, *, my_applied: OpTime,
                            primary_applied: OpTime) -> bool:
    """Whether we should schedule a priority takeover of `primary_id`: we are electable, of
    strictly higher priority, and within the freshness window of the primary's last write."""
    me, primary = config.member_by_id(my_id), config.member_by_id(primary_id)
    if me is None or primary is None or not me.electable or me.priority <= primary.priority:
        return False
    return primary_applied.secs - my_applied.secs <= PRIORITY_TAKEOVER_FRESHNESS_SECS
