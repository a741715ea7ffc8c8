"""Bugs of the sync pipeline the simulator's fetcher (`tests.sim.fetcher`) can still replay.

The replica core's bugs are re-introduced into the product's own code by
`tests.sim.mutations`; the three below live in the fetcher, applier and
rollback, which the simulator still models in `tests/sim/fetcher.py` until
that pipeline's decisions move into the core. The fetcher follows the fix by
default; `python -m tests.sim --seed S --mutate NAME` follows the old
behaviour.
"""

from __future__ import annotations

from dataclasses import dataclass

from tests.sim.mutations import MUTATIONS

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
    """The bugs a run re-introduces: fetcher flags (`SHELL_BUGS`) and core mutations (`MUTATIONS`)."""

    bugs: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        unknown = self.bugs - SHELL_BUGS.keys() - MUTATIONS.keys()
        if unknown:
            raise ValueError(f"unknown bug(s) {sorted(unknown)}; known: {sorted(KNOWN_BUGS)}")

    @property
    def mutations(self) -> frozenset[str]:
        return self.bugs & MUTATIONS.keys()

    def has(self, bug: str) -> bool:
        return bug in self.bugs


KNOWN_BUGS = frozenset(SHELL_BUGS) | frozenset(MUTATIONS)
