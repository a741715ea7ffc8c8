"""An election run, from the timer firing to PRIMARY (or giving up), as a state machine of the core.

    dry run (term unchanged) --won--> persist term + 1 and our own vote --> real election
    real election --won--> catch-up (to the newest optime heartbeats reported, bounded)
        --> drain (stop fetching, apply what is buffered) --> the "new primary" no-op --> PRIMARY

Each voting round sends `replSetRequestVotes` to every other voter and counts
the answers with `ElectionTally` until it is won, lost, a higher term shows up,
or the election timeout passes. Any phase can end the run; the member's
election timer does not fire while a run is in progress.

Catch-up: the target is the newest optime heartbeats reported; the wait is
bounded by `catchUpTimeoutMillis`, whose default -1 ("no limit" in MongoDB) is
bounded here by the election timeout, so a member that cannot reach the newest
data still takes over rather than leave the set without a primary.

Part of the replica core: no I/O; it acts through the `Replica` it belongs to.
"""

from __future__ import annotations

__layer__ = "core"  # pure: no I/O, clock or randomness (tests/unit/test_layering.py)

import datetime
from typing import TYPE_CHECKING, Any

from base.errors import MongoError
from base.member import MemberState
from base.messages import parse_vote_reply, vote_request
from base.optime import OpTime
from base.votes import LastVote, VoteRequest
from replset.election import ElectionTally

if TYPE_CHECKING:
    from replset.replica import Replica

DRAIN_TIMEOUT_MS = 6000  # the shell's own drain gives up after 5 s; this is the core's backstop
# The no-op waits its turn in the group commit (behind a long index build, say); only a shell that never
# answers hits this.
NOOP_BACKSTOP_MS = 60_000
NEVER = 1 << 62


class Candidacy:
    def __init__(self, replica: Replica, reason: str, term: int) -> None:
        self.replica = replica
        self.reason = reason
        self.phase = "dry run"
        self.dry_run = True
        self.term = term
        self.tally: ElectionTally | None = None
        self.pending: set[int] = set()
        self.higher: int | None = None
        self.deadline_ms = NEVER
        self.target: OpTime | None = None
        self.outcome = ""

    @classmethod
    def start(cls, replica: Replica, reason: str, *, skip_dry_run: bool = False) -> Candidacy:
        run = cls(replica, reason, replica.term)
        replica.candidacy_began(run)
        if skip_dry_run:
            run._stand()
        else:
            run._start_round(dry_run=True)
        return run

    # -- voting rounds ------------------------------------------------------------------------------

    def _start_round(self, *, dry_run: bool) -> None:
        r = self.replica
        config = r.config
        assert config is not None
        self.phase = "dry run" if dry_run else "real election"
        self.dry_run = dry_run
        self.tally = ElectionTally(config, r.self_id)
        self.higher = None
        self.pending = set()
        self.deadline_ms = r.now + r.election_timeout_base
        if self.tally.won:
            self._round_over()
            return
        req = VoteRequest(config.name, dry_run, self.term, r.self_id, config.version, config.term, r.applied)
        body = vote_request(req)
        for m in config.voters:
            if m.id != r.self_id:
                self.pending.add(r.ask_for_vote(m.id, body))
        if not self.pending:
            self._round_over()

    def on_vote_reply(self, call: int, peer: int, doc: dict[str, Any]) -> None:
        if call not in self.pending:
            return
        self.pending.discard(call)
        r = self.replica
        try:
            response = parse_vote_reply(doc)
        except (MongoError, KeyError, TypeError, ValueError):
            self._maybe_all_answered()  # a malformed answer counts as no answer
            return
        assert r.topology is not None and self.tally is not None
        r.topology.touch(peer, r.now)
        if response.term > self.term:
            self.higher = response.term
            self._round_over()
            return
        self.tally.record(peer, response.vote_granted)
        if self.tally.won or self.tally.lost:
            self._round_over()
        else:
            self._maybe_all_answered()

    def on_vote_failed(self, call: int) -> None:
        if call in self.pending:
            self.pending.discard(call)
            self._maybe_all_answered()

    def _maybe_all_answered(self) -> None:
        if not self.pending and self.phase in ("dry run", "real election"):
            self._round_over()

    def _round_over(self) -> None:
        for call in self.pending:  # the outstanding asks are abandoned
            self.replica.forget_call(call)
        self.pending = set()
        assert self.tally is not None
        won, higher = self.tally.won, self.higher
        if self.dry_run:
            self._after_dry_run(won, higher)
        else:
            self._after_real_election(won, higher)

    def _after_dry_run(self, won: bool, higher: int | None) -> None:
        if higher is not None:
            self.replica.update_term(higher, "a dry-run vote response")
        if not won:
            self._end("dry run lost")
            return
        self._stand()

    def _stand(self) -> None:
        """Persist term + 1 and our own vote, then ask for votes in it."""
        r = self.replica
        term = r.term + 1
        # A backstop: the shell reports the persist long before this (it never fails silently).
        self.phase, self.deadline_ms = "persisting our vote", r.now + r.election_timeout_base

        if r.state is not MemberState.SECONDARY:
            self._end("no longer a secondary")
            return
        if not r.persist_term(term, LastVote(term, r.self_id), then=lambda: self._run_real(term),
                              why="our own candidacy"):
            self._end(f"term {term} would be beyond the largest term a member may hold")

    def _run_real(self, term: int) -> None:
        if self.replica.candidacy is not self:
            return
        if self.replica.term != term:
            self._end(f"the term moved past {term} before our vote was persisted")
            return
        self.term = term
        self._start_round(dry_run=False)

    def _after_real_election(self, won: bool, higher: int | None) -> None:
        r = self.replica
        if higher is not None:
            r.update_term(higher, "a vote response")
        if not won or r.term != self.term or r.state is not MemberState.SECONDARY:
            self._end(f"election in term {self.term} lost")
            return
        self._start_catch_up()

    # -- becoming primary ---------------------------------------------------------------------------

    def _start_catch_up(self) -> None:
        r = self.replica
        assert r.topology is not None and r.config is not None
        target = r.topology.newest_applied()
        if target <= r.applied or not r.fetching:
            self._start_drain()
            return
        limit = r.config.settings.catch_up_timeout_ms
        if limit < 0:
            limit = r.election_timeout_base
        self.phase, self.target, self.deadline_ms = "catch-up", target, r.now + limit

    def _catch_up_over(self) -> bool:
        r = self.replica
        assert self.target is not None
        return r.applied >= self.target or r.term != self.term or r.now >= self.deadline_ms

    def _start_drain(self) -> None:
        r = self.replica
        if r.state is not MemberState.SECONDARY:
            self._end(f"no longer a secondary ({r.state.name}) after catch-up")
            return
        self.phase = "drain"
        self.deadline_ms = r.now + DRAIN_TIMEOUT_MS
        if r.fetching:
            r.stop_fetching(drain=True)
        else:
            self.on_drained(True)

    def on_drained(self, drained: bool) -> None:
        if self.phase != "drain":
            return
        r = self.replica
        if not drained or r.term != self.term or r.state is not MemberState.SECONDARY or r.fetching:
            self._end("could not drain the applier" if not drained else "the term moved while draining")
            r.resume_fetching()
            return
        self.phase, self.deadline_ms = "new primary no-op", r.now + NOOP_BACKSTOP_MS
        r.ask_for_noop(self.term)

    def on_noop_written(self, term: int, ok: bool, wall: datetime.datetime | None) -> None:
        r = self.replica
        if self.phase != "new primary no-op" or term != self.term:
            return
        if not ok or r.term != term or r.state is not MemberState.SECONDARY:
            self._end(f"could not become primary in term {term}")
            r.resume_fetching()
            return
        r.candidacy_won(self, term, wall)

    def abandon(self, why: str) -> None:
        self._end(why)

    def _end(self, why: str) -> None:
        self.outcome = why
        r = self.replica
        r.candidacy_over(self)
        for call in self.pending:
            r.forget_call(call)
        self.pending = set()

    # -- events while a phase waits -----------------------------------------------------------------

    def on_local_commit(self) -> None:
        if self.phase == "catch-up" and self._catch_up_over():
            self._start_drain()

    def tick(self) -> None:
        r = self.replica
        if r.now < self.deadline_ms:
            return
        if self.phase in ("dry run", "real election"):
            self._round_over()
        elif self.phase == "catch-up":
            self._start_drain()
        elif self.phase == "drain":
            self.on_drained(False)
        elif self.phase in ("persisting our vote", "new primary no-op"):
            self._end(f"no answer from the shell in phase {self.phase}")  # a lost no-op loses nothing committed
            r.resume_fetching()
