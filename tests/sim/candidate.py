"""An election run, from the timer firing to PRIMARY (or giving up), as a state machine.

The runtime's `run_election` coroutine, with each `await` turned into a phase:

    dry run (term unchanged) --won--> persist term + 1 and our own vote --> real election
    real election --won--> catch-up (to the newest optime heartbeats reported, bounded)
        --> drain (stop fetching, apply what is buffered, at most 5 s)
        --> write the "new primary" no-op --> PRIMARY

Each voting round sends `replSetRequestVotes` (built by `replset.messages`) to
every other voter and counts answers with the product's `ElectionTally` until
it is won, lost, a higher term shows up, or the election timeout passes. Any
phase can end the run; the member's election timer is blocked while a run is
in progress, exactly like the runtime's timer loop awaiting `run_election`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from oplog.errors import MongoError
from oplog.optime import OpTime
from replset.election import ElectionTally, LastVote, VoteRequest
from replset.member import MemberState
from replset.messages import parse_vote_reply, vote_request
from tests.sim import rpc
from tests.sim.disk import Entry, EntryKind
from tests.sim.writer import WriteOp

if TYPE_CHECKING:
    from tests.sim.node import SimNode

DRAIN_TIMEOUT_MS = 5000  # SyncWorker.stop(drain=True): STOP_TIMEOUT_S


class ElectionRun:
    __slots__ = ("deadline_ms", "dry_run", "higher", "pending", "phase", "reason", "tally", "target", "term")

    def __init__(self, reason: str, term: int) -> None:
        self.reason = reason
        self.phase = "dry run"
        self.dry_run = True
        self.term = term
        self.tally: ElectionTally | None = None
        self.pending: set[int] = set()
        self.higher: int | None = None
        self.deadline_ms = 0
        self.target: OpTime | None = None

    @classmethod
    def start(cls, node: SimNode, reason: str) -> ElectionRun:
        run = cls(reason, node.term)
        node.trace(f"election timer fired ({reason}): dry run")
        node.election = run
        run._start_round(node, dry_run=True)
        return run

    # -- voting rounds ------------------------------------------------------------------------------

    def _start_round(self, node: SimNode, *, dry_run: bool) -> None:
        self.phase = "dry run" if dry_run else "real election"
        self.dry_run = dry_run
        self.tally = ElectionTally(node.config, node.id)
        self.higher = None
        self.pending = set()
        self.deadline_ms = node.now + node.election_timeout_base
        if self.tally.won:
            self._round_over(node)
            return
        config = node.config
        req = VoteRequest(config.name, dry_run, self.term, node.id, config.version, config.term,
                          node.last_applied)
        body = vote_request(req)
        for m in config.voters:
            if m.id != node.id:
                rpc_id = node.call(m.id, rpc.VOTE, body, node.heartbeat_timeout_ms)
                if rpc_id is not None:
                    self.pending.add(rpc_id)
        if not self.pending:
            self._round_over(node)

    def on_vote_reply(self, node: SimNode, rpc_id: int, peer: int, body: Any) -> None:
        if rpc_id not in self.pending:
            return
        self.pending.discard(rpc_id)
        if not body.get("ok"):
            self._maybe_all_answered(node)
            return
        response = parse_vote_reply(body)
        node.topology.touch(peer, node.now)
        if response.term > self.term:
            self.higher = response.term
            self._round_over(node)
            return
        assert self.tally is not None
        self.tally.record(peer, response.vote_granted)
        if self.tally.won or self.tally.lost:
            self._round_over(node)
        else:
            self._maybe_all_answered(node)

    def on_vote_failed(self, node: SimNode, rpc_id: int) -> None:
        if rpc_id in self.pending:
            self.pending.discard(rpc_id)
            self._maybe_all_answered(node)

    def _maybe_all_answered(self, node: SimNode) -> None:
        if not self.pending and self.phase in ("dry run", "real election"):
            self._round_over(node)

    def _round_over(self, node: SimNode) -> None:
        self.pending = set()  # the runtime cancels the outstanding asks
        assert self.tally is not None
        won, higher = self.tally.won, self.higher
        if self.dry_run:
            self._after_dry_run(node, won, higher)
        else:
            self._after_real_election(node, won, higher)

    def _after_dry_run(self, node: SimNode, won: bool, higher: int | None) -> None:
        if higher is not None:
            node.update_term(higher, "a dry-run vote response")
        if not won:
            self._end(node, "dry run lost")
            return
        term = node.term + 1
        self.phase, self.deadline_ms = "persisting our vote", 1 << 62

        def section() -> bool:
            if node.state is not MemberState.SECONDARY or node.term >= term:
                self._end(node, "no longer a secondary")
                return False
            return node.persist_term(term, LastVote(term, node.id), then=lambda: self._run_real(node, term))

        node.with_vote_lock(section)

    def _run_real(self, node: SimNode, term: int) -> None:
        if node.election is not self:
            return
        node.trace(f"running for election in term {term} ({self.reason})")
        self.term = term
        self._start_round(node, dry_run=False)

    def _after_real_election(self, node: SimNode, won: bool, higher: int | None) -> None:
        if higher is not None:
            node.update_term(higher, "a vote response")
        if not won or node.term != self.term or node.state is not MemberState.SECONDARY:
            self._end(node, f"election in term {self.term} lost")
            return
        self._start_catch_up(node)

    # -- becoming primary ---------------------------------------------------------------------------

    def _start_catch_up(self, node: SimNode) -> None:
        target = node.topology.newest_applied()
        if target <= node.last_applied or node.fetcher is None:
            self._start_drain(node)
            return
        limit = node.config.settings.catch_up_timeout_ms
        if limit < 0:
            limit = node.election_timeout_base
        self.phase, self.target, self.deadline_ms = "catch-up", target, node.now + limit
        node.trace(f"won term {self.term}; catching up to {target}")

    def _catch_up_over(self, node: SimNode) -> bool:
        assert self.target is not None
        return node.last_applied >= self.target or node.term != self.term or node.now >= self.deadline_ms

    def _start_drain(self, node: SimNode) -> None:
        if (node.fetcher is not None and node.fetcher.rollback is not None
                and not node.model.has("drain-cancels-rollback")):
            self._end(node, "our history diverged during catch-up: rolling back, not becoming primary")
            return
        self.phase = "drain"
        self.deadline_ms = node.now + DRAIN_TIMEOUT_MS
        if node.fetcher is not None:
            node.fetcher.stop_fetching()
        self._maybe_drained(node)

    def _maybe_drained(self, node: SimNode) -> None:
        fetcher = node.fetcher
        drained = fetcher is None or fetcher.drained()
        if not drained and node.now < self.deadline_ms:
            return
        node.fetcher = None  # the applier is cancelled; anything still buffered is dropped
        if not drained or node.term != self.term or node.state is not MemberState.SECONDARY:
            node.start_worker()
            self._end(node, "could not drain the applier")
            return
        self._write_new_primary_entry(node)

    def _write_new_primary_entry(self, node: SimNode) -> None:
        self.phase, self.deadline_ms = "new primary no-op", 1 << 62
        term = self.term

        def run() -> list[Entry]:
            if node.term != term or node.state is not MemberState.SECONDARY:
                raise MongoError(189, f"term changed to {node.term} before becoming primary in {term}")
            return [Entry(node.new_optime(term), EntryKind.NEW_PRIMARY)]

        def done(error: BaseException | None) -> None:
            if error is not None or node.term != term:
                node.start_worker()
                self._end(node, f"could not become primary in term {term}")
                return
            node.election = None
            node.became_primary(term)

        if not node.submit(WriteOp("noop", run, done)):
            node.start_worker()
            self._end(node, "writer queue full")

    def _end(self, node: SimNode, why: str) -> None:
        node.trace(f"election over: {why}")
        if node.election is self:
            node.election = None

    # -- events while a phase waits -----------------------------------------------------------------

    def on_local_commit(self, node: SimNode) -> None:
        """`wait_for_oplog` woke the catch-up loop: it re-checks its three conditions."""
        if self.phase == "catch-up" and self._catch_up_over(node):
            self._start_drain(node)

    def poll(self, node: SimNode) -> None:
        """After every step: `buffer.join()` returns once the applier finished the last batch."""
        if self.phase == "drain":
            self._maybe_drained(node)

    def tick(self, node: SimNode) -> None:
        if node.now < self.deadline_ms:
            return
        if self.phase in ("dry run", "real election"):
            self._round_over(node)
        elif self.phase == "catch-up":
            self._start_drain(node)
        elif self.phase == "drain":
            self._maybe_drained(node)
