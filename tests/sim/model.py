"""Which runtime behaviour the simulated member follows where the shell's choice matters.

The member model (`tests.sim.node`) mirrors the asyncio runtime
(`replset/replication.py`, `sync/worker.py`) step by step. Where the simulator
found the runtime doing something unsafe, the model follows the corrected
behaviour by default and keeps the runtime's current behaviour behind a flag,
so `python -m tests.sim --seed S --shell-bug NAME` replays the failure the
flag causes. Each flag names the decision, the file it lives in, and why it is
wrong.
"""

from __future__ import annotations

from dataclasses import dataclass

# name -> what the runtime does today (the model's default is the fix).
SHELL_BUGS: dict[str, str] = {
    "cursor-survives-rollback": (
        "A sync source that rolls back keeps serving the tailable oplog cursors its downstream members "
        "opened before (replset/wire/crud.py cmd_get_more continues after the cursor's last key; getMore "
        "has no role check; sync/worker.py checks only the first batch of a find). After the source "
        "truncates its oplog and applies the new branch, a downstream member's next getMore returns the new "
        "branch's entries after its old-branch tail: its oplog splices a rolled-back entry onto the new "
        "branch and silently misses the new branch's entries in between. Fix: kill every open oplog cursor "
        "when the member enters ROLLBACK (and/or report the rbid in getMore replies and have the fetcher "
        "restart with a checked find when it changes, as MongoDB's OplogFetcher does)."),
    "heartbeat-positions-ignored": (
        "A primary learns members' optimes from heartbeat replies too (Topology.on_heartbeat_reply), but "
        "replset/replication.py _on_heartbeat_reply never advances the commit point nor wakes write-concern "
        "waiters. When the heartbeat reply overtakes the member's replSetUpdatePosition, the report then "
        "moves nothing (on_update_position only acts when a position moved), so on an idle primary the commit "
        "point and every w:majority / w:N waiter stay stuck until the next write (or wtimeout). Fix: in "
        "_on_heartbeat_reply, when primary, call _advance_commit_point() and _check_waiters()."),
    "positions-counted-before-term": (
        "replset/replication.py on_update_position spawns update_term for a report whose $replData term is "
        "above ours, then counts the report's positions at once: a primary still in the old term advances "
        "its commit point (and acknowledges w:majority waiters) with the position of a member that already "
        "voted in the newer term, before the spawned task steps it down. The newer term's primary may lack "
        "the entry (the voter fetched it from the old primary after voting), so an acknowledged w:majority "
        "write can be rolled back, and members that learn the bogus commit point refuse their rollback and "
        "stay RECOVERING. Fix: when the report's term is above ours, step down (and adopt the term) before "
        "looking at its positions - count nothing from it while primary (Raft: acknowledgements only count "
        "from the leader's own term)."),
    "rollback-ignores-late-commits": (
        "sync/rollback_runner.py plans the rollback from our committed oplog (our_last = "
        "last_committed_optime, undone = oplog_after(common)) but its final transaction truncates whatever "
        "follows the common point by then. A primary that steps down while a group commit of client writes is "
        "in flight starts its fetcher at once (last_fetched = log.last includes those writes), diverges, and "
        "plans before that batch commits; the batch then commits (and w:1 is acknowledged), and the rollback "
        "truncates it from the oplog without saving it to a rollback file or restoring the documents it "
        "changed: that member's data differs from its own oplog and from every other member for good. Fix: "
        "in _commit's transaction, refuse (RollbackFailed, nothing changed, retried) when the oplog's top is "
        "no longer the our_last the plan was made from (or wait for the writer to drain before planning)."),
    "drain-cancels-rollback": (
        "A member that won an election catches up, then replset/replication.py _assume_primary stops the sync "
        "worker with drain=True, which cancels the fetch loop - including a rollback in progress "
        "(sync/worker.py _roll_back: its fetcher diverged during catch-up). CancelledError skips every "
        "state restore, so the member stays in ROLLBACK; _assume_primary then sees it is not SECONDARY and "
        "calls _start_worker(), which starts nothing in ROLLBACK. No fetcher, never electable, stuck until "
        "restarted (the rollback's transaction may even have committed). Fix: never cancel a rollback - "
        "a candidate whose worker is rolling back abandons the election (or SyncWorker.stop waits for the "
        "rollback to finish and _start_worker accepts ROLLBACK/RECOVERING)."),
    "wn-counts-other-branches": (
        "w:N compares every member's position with the write's optime (replset/quorum.py count_members_at: "
        "position >= target), and optimes order by term first. A member on the new primary's branch reports "
        "a higher-term optime that sorts above a write of the old term although it never had that write. "
        "The old primary, which stepped down while the write's fsync was still running, then answers w:2 "
        "as satisfied (replication.py wait_for_write_concern checks _satisfied before 'not primary'), "
        "acknowledging a write that one member has and that will be rolled back. Fix: count a member for "
        "w:N only when its position is in the write's term (members of another term may be on another "
        "branch) - in count_members_at, or in the shell's _satisfied - and/or answer PrimarySteppedDown "
        "before counting anyone when no longer primary."),
    "term-adopted-while-becoming-primary": (
        "A member that won term T is writing its 'new primary' no-op (still SECONDARY) when a vote request "
        "for T+1 arrives: on_vote_request sees no primary to step down, grants the vote and awaits "
        "persist_term(T+1), queued behind the no-op in the group commit. The no-op commits first, "
        "become_primary sees term == T and goes PRIMARY; then persist_term's continuation sets the term to "
        "T+1 and nothing steps the member down (the step-down checks in on_vote_request and update_term ran "
        "before the await). A PRIMARY in term T+1 next to the real primary of T+1: both stamp their writes "
        "with term T+1 (Node.submit_write uses self.term), so two different entries share a term and the "
        "logs fork without any check noticing. Fix: step down where the in-memory term moves - in "
        "Node.persist_term after the fsync, if the term grew while PRIMARY - or hold _vote_lock across "
        "become_primary's no-op and its term check."),
    "recovering-ignores-min-valid-branch": (
        "Rollback via refetch (sync/rollback_runner.py) copies the touched documents as the source has them "
        "now - possibly writes of the source's own branch that are not committed - and sets minValid to the "
        "source's top. The member leaves RECOVERING once last_committed_optime >= minValid "
        "(replication.py _maybe_end_recovering), and optimes order by term first, so entries of any "
        "newer-term branch pass. When the rollback source's branch then loses (the source rolls back too) "
        "and the member syncs from the new primary, the refetched documents keep values that no oplog "
        "produces: a rolled-back write lives on in that member's data, which differs from every other "
        "member for good. Fix (MongoDB's requiredOpTime): while RECOVERING, sync only from a source whose "
        "oplog holds minValid; when a source lacks it, refetch the documents of the last rollback again "
        "from that source (a new rollback with common point = our last entry) and take its top as minValid."),
}


@dataclass(frozen=True, slots=True)
class ShellModel:
    bugs: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        unknown = self.bugs - SHELL_BUGS.keys()
        if unknown:
            raise ValueError(f"unknown shell behaviour(s) {sorted(unknown)}; known: {sorted(SHELL_BUGS)}")

    def has(self, bug: str) -> bool:
        return bug in self.bugs
