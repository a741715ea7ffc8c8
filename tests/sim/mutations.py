"""Known bugs, re-introduced into the product's replica core on demand (test-only patches).

Each entry names a bug the simulator once found in the runtime (or a broken
core it must be able to see) and patches the *product's* code - the replica
core in `replset/replica.py` and `replset/candidacy.py`, or a pure core the
member calls (`sync.rollback`, `replset.quorum`, ...) - back into the wrong
behaviour. `python -m tests.sim --seed S --mutate
NAME` replays a seed with the bug; `test_mutations.py` proves that, for every
entry, some seed that `make test` runs fails. Since the simulator drives the
same core as the asyncio member, a passing seed says something about the
product, and a mutation that no seed catches says the simulator is blind there.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any
from unittest import mock

import replset.replica as replica_module
from base.config import ReplSetConfig
from base.errors import MongoError
from base.member import MemberState
from base.messages import parse_update_position
from base.optime import NULL_OPTIME, OpTime
from replset import election, quorum
from replset.actions import CloseOplogCursors
from replset.candidacy import DRAIN_TIMEOUT_MS, Candidacy
from replset.replica import STEPPED_DOWN, Replica, majority_commit_point
from replset.write_concern import WriteConcern, check_satisfiable
from sync import fetching, rollback_flow, sync_source
from sync import rollback as rollback_rules
from sync.fetching import Verdict
from sync.ping_stats import ALPHA, PingStats


@dataclass(frozen=True, slots=True)
class Mutation:
    description: str
    patches: tuple[tuple[object, str, Any], ...]   # (owner, attribute, replacement)
    checker: str = ""                               # the checker that must report it ("" for any)


# -- the bugs the simulator found in the runtime ------------------------------------------------------

def _heartbeat_positions_ignored(self: Replica) -> None:
    return None


def _positions_counted_before_term(self: Replica, now: int, doc: dict[str, Any]) -> dict[str, Any]:
    self._enter(now)
    try:
        positions, term = parse_update_position(doc)
        if term > self.term:
            self._deferred.append(lambda: self.update_term(term, "replSetUpdatePosition"))
        self._count_positions(positions)
        return {"ok": 1.0}
    finally:
        self._leave()


def _satisfied_on_any_branch(self: Replica, wc: WriteConcern, target: OpTime, positions: Any = None) -> bool:
    assert self.config is not None and self.topology is not None
    applied, durable = positions or self.topology.positions(self.applied, self.durable)
    return quorum.write_concern_satisfied(wc, target, config=self.config, applied=applied, durable=durable,
                                          commit_point=self.commit_point)


def _counted_before_stepping_down(self: Replica, wc: WriteConcern, target: OpTime) -> MongoError | bool | None:
    error = check_satisfiable(wc, self.config)
    if error is not None:
        return error
    if wc.unacknowledged or self.satisfied(wc, target):
        return True
    local_only = isinstance(wc.w, int) and wc.w <= 1
    if not local_only and not self.is_primary:
        return MongoError(189, STEPPED_DOWN)
    return None


def _noop_without_term_check(self: Replica, term: int) -> bool:
    return self.state is MemberState.SECONDARY


def _noop_written_without_term_check(self: Candidacy, term: int, ok: bool, wall: Any) -> None:
    r = self.replica
    if self.phase != "new primary no-op" or term != self.term:
        return
    if not ok or r.state is not MemberState.SECONDARY:
        self._end(f"could not become primary in term {term}")
        r.resume_fetching()
        return
    r.candidacy_won(self, term, wall)


def _candidacy_not_abandoned(self: Candidacy, why: str) -> None:
    return None


_emit = Replica._emit


def _emit_without_closing_cursors(self: Replica, action: Any) -> None:
    if not isinstance(action, CloseOplogCursors):
        _emit(self, action)


def _commit_ignoring_late_commits(planned_from: OpTime, our_last_now: OpTime, common_point: OpTime,
                                  majority_committed: OpTime) -> str | None:
    return "refused" if rollback_rules.majority_committed_past(common_point, majority_committed) else None


def _min_valid_never_checked(min_valid: OpTime | None, held: bool, source_applied: OpTime | None) -> Verdict:
    return Verdict.CONTINUES


_min_valid_checked = Replica.min_valid_checked


def _recovering_ends_on_any_branch(self: Replica, now: int, optime: OpTime, held: bool) -> None:
    _min_valid_checked(self, now, optime, True)


def _drain_ignores_rollback(self: Candidacy) -> None:
    r = self.replica
    self.phase = "drain"
    self.deadline_ms = r.now + DRAIN_TIMEOUT_MS
    if r.fetching:
        r.stop_fetching(drain=True)
    else:
        self.on_drained(True)


def _level_never_ok(inputs: Any, member: Any) -> bool:
    return False


def _ping_plain_average(self: PingStats, rtt_ms: float) -> PingStats:
    value = rtt_ms if self.value_ms is None else ALPHA * rtt_ms + (1.0 - ALPHA) * self.value_ms
    return PingStats(value_ms=value, samples=self.samples + 1, failures=0)


def _primary_liveness_unchecked(self: Replica) -> None:
    return None


def _stale_branch_by_term_only(source_applied: OpTime, my_term: int, *, primary_seen: bool = True) -> str | None:
    return "older than our term" if source_applied.term < my_term else None


def _takeover_outlives_its_primary(self: Replica, peer: int, reply: Any) -> None:
    if reply.state is not MemberState.PRIMARY or self.state is not MemberState.SECONDARY:
        return
    assert self.config is not None
    if self.takeover_deadline == replica_module.NEVER and election.wants_priority_takeover(
            self.config, self.self_id, peer, my_applied=self.applied, primary_applied=reply.applied):
        timeout = election.election_timeout_ms(self.election_timeout_base, self.rng)
        self.takeover_deadline = self.now + election.priority_takeover_delay_ms(self.config, self.self_id, timeout)


# -- broken cores: a simulator that cannot see these proves nothing ------------------------------------

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


def _commit_point_from_applied(self: Replica) -> None:
    if self.topology is None or self.config is None:
        return
    applied, _durable = self.topology.positions(self.applied, self.durable)
    self.commit_point = majority_commit_point(self.config, applied, self.term, self.commit_point)
    self._check_waiters()


def _follower_plain_min(learned: OpTime, last_applied: OpTime, prior: OpTime) -> OpTime:
    return max(prior, min(learned, last_applied))


def _w_n_one_short(wc: WriteConcern, target: OpTime, **kwargs: Any) -> bool:
    if isinstance(wc.w, int) and wc.w > 1:
        wc = dataclasses.replace(wc, w=wc.w - 1)
    return quorum.write_concern_satisfied(wc, target, **kwargs)


MUTATIONS: dict[str, Mutation] = {
    "heartbeat-positions-ignored": Mutation(
        "A primary learns members' optimes from heartbeat replies too, but does not advance the commit "
        "point nor wake write-concern waiters on them: when a heartbeat reply overtakes the member's "
        "replSetUpdatePosition, the report then moves nothing, and on an idle primary the commit point "
        "and every w:majority / w:N waiter stay stuck until the next write (or wtimeout).",
        ((Replica, "_heartbeat_moved_positions", _heartbeat_positions_ignored),)),
    "positions-counted-before-term": Mutation(
        "A position report whose term is above ours is counted at once and the term adopted afterwards: "
        "a primary still in the old term advances its commit point with the position of a member that "
        "already voted in the newer term, whose primary may lack the entry - an acknowledged w:majority "
        "write can be rolled back.",
        ((Replica, "update_position", _positions_counted_before_term),)),
    "wn-counts-other-branches": Mutation(
        "w:N compares every member's position with the write's optime, and optimes order by term first: "
        "a member on a newer primary's branch counts for a write of the old term it never had, and an old "
        "primary that stepped down while the write's fsync ran answers w:2 as satisfied.",
        ((Replica, "satisfied", _satisfied_on_any_branch),
         (Replica, "write_concern_problem", _counted_before_stepping_down)),
        "w_n_acks_had_holders"),
    "term-adopted-while-becoming-primary": Mutation(
        "A member that won term T writes its 'new primary' no-op without re-checking its term: a vote for "
        "T+1 granted meanwhile leaves it PRIMARY next to the real primary of T+1, both stamping T+1.",
        ((Replica, "may_write_noop", _noop_without_term_check),
         (Candidacy, "on_noop_written", _noop_written_without_term_check))),
    "drain-cancels-rollback": Mutation(
        "A candidate whose fetcher started a rollback during catch-up goes on to drain: stopping the "
        "fetcher cancels the rollback, the member stays in ROLLBACK, no fetcher restarts there, and it is "
        "stuck until restarted.",
        ((Candidacy, "abandon", _candidacy_not_abandoned),
         (Candidacy, "_start_drain", _drain_ignores_rollback))),
    "cursor-survives-rollback": Mutation(
        "A sync source that rolls back keeps serving the tailable oplog cursors its downstream members opened "
        "before: after it truncates its oplog and applies the new branch, a downstream member's next getMore "
        "returns the new branch's entries after its old-branch tail - its oplog splices a rolled-back entry "
        "onto the new branch and silently misses the entries in between.",
        ((Replica, "_emit", _emit_without_closing_cursors),)),
    "rollback-ignores-late-commits": Mutation(
        "The rollback plans from our committed oplog but its transaction truncates whatever follows the "
        "common point by then: a batch of client writes that commits (and is acknowledged w:1) between the "
        "plan and the transaction is truncated without being saved to a rollback file or undone in the "
        "data - that member's data differs from its own oplog for good.",
        ((rollback_flow, "commit_problem", _commit_ignoring_late_commits),)),
    "recovering-ignores-min-valid-branch": Mutation(
        "Rollback via refetch copies the touched documents as the source has them now - possibly writes of "
        "the source's own branch that are not committed - and sets minValid to the source's top. A "
        "RECOVERING member fetches from any source that continues its oplog and leaves RECOVERING once it "
        "applied past minValid, and optimes order by term first, so entries of any newer-term branch pass. "
        "When the rollback source's branch then loses and the member syncs from the new primary, the "
        "refetched documents keep values that no oplog produces: a rolled-back write lives on in that "
        "member's data.",
        ((fetching, "check_min_valid", _min_valid_never_checked),
         (Replica, "min_valid_checked", _recovering_ends_on_any_branch))),
    "idle-source-ignores-ping": Mutation(
        "Only a member ahead of our last fetched entry is a sync source candidate: on a set with no writes "
        "nobody is, so a secondary keeps its source however far its ping drifts (the headline feature "
        "quietly stopped, and every safety checker passed).",
        ((sync_source, "_level_ok", _level_never_ok),), "sync_sources_follow_ping"),
    "ping-remembers-stalls": Mutation(
        "The smoothed ping is MongoDB's plain average, with no cap by the recent round trips: one reply "
        "held up for seconds by a stall (a paused process) still weighs a hundred milliseconds 18 "
        "heartbeats later, and a secondary keeps a source 50 ms slower than a member next to it.",
        ((PingStats, "record", _ping_plain_average),), "sync_sources_follow_ping"),
    "cut-off-primary-stays": Mutation(
        "A primary never checks whether it still sees a majority of voters: cut off, it stays PRIMARY "
        "(taking w:1 writes that will roll back) until it hears of a newer term.",
        ((Replica, "_check_primary_liveness", _primary_liveness_unchecked),), "cut_off_primaries_step_down"),
    "rollback-to-a-primary-gone": Mutation(
        "A member rolls back to any source whose newest entry is of its own term, even when it no longer sees "
        "that term's primary: a primary cut off with it stepped down while a newer term, out of its sight, "
        "committed entries that branch lacks, and the member rolls a committed entry back.",
        ((fetching, "stale_branch_problem", _stale_branch_by_term_only),), "committed_prefixes_agree"),
    "takeover-outlives-its-primary": Mutation(
        "A priority takeover scheduled against a primary of lower priority than ours stays scheduled when one "
        "of higher priority takes over meanwhile: at its deadline the member stands against that one, wins, "
        "and is taken over again - two needless failovers (the ping phase's set saw its sources torn up).",
        ((Replica, "_maybe_priority_takeover", _takeover_outlives_its_primary),)),
    "voter-forgets-its-vote": Mutation(
        "A voter grants two votes in one term.",
        ((replica_module, "decide_vote", _voter_forgets_its_vote),)),
    "commit-point-one-short": Mutation(
        "The commit point needs one member less than a majority.",
        ((replica_module, "majority_commit_point", _commit_with_one_member_short),)),
    "commit-point-any-term": Mutation(
        "The commit point ignores Raft's current-term rule.",
        ((replica_module, "majority_commit_point", _commit_without_term_rule),)),
    "commit-point-from-applied": Mutation(
        "The commit point counts the members' applied positions, not their durable ones: an entry a "
        "majority applied but had not journaled is majority-committed, and a crash of those members "
        "loses an entry a majority read returned (MongoDB's writeConcernMajorityJournalDefault).",
        ((Replica, "_advance_commit_point", _commit_point_from_applied),)),
    "follower-plain-min": Mutation(
        "A secondary takes min(learned, last applied) as its commit point in any term.",
        ((replica_module, "follower_commit_point", _follower_plain_min),)),
    "w-n-one-short": Mutation(
        "w:N counts one member short.",
        ((replica_module, "write_concern_satisfied", _w_n_one_short),), "w_n_acks_had_holders"),
}


@contextlib.contextmanager
def applied(names: Iterable[str]) -> Iterator[None]:
    """Patches the named mutations in for the duration of the block."""
    with contextlib.ExitStack() as stack:
        for name in sorted(names):
            for owner, attribute, replacement in MUTATIONS[name].patches:
                stack.enter_context(mock.patch.object(owner, attribute, replacement))
        yield


def patched(name: str) -> Callable[[], contextlib.AbstractContextManager[None]]:
    return lambda: applied([name])
