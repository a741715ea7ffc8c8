"""The one bug the simulator's fetcher (`tests.sim.fetcher`) replays by a flag of its own.

Every other known bug is re-introduced into the product's own code by
`tests.sim.mutations`. This one is about which source a RECOVERING member may
fetch from and what its rollback refetches; the simulated fetcher follows
MongoDB's requiredOpTime rule here, while the asyncio member resyncs when it
passes minValid on another branch (the replica core's `CheckMinValid`). Until
the two agree on one rule in the core, the flag stays. The fetcher follows the
fix by default; `python -m tests.sim --seed S --mutate NAME` follows the bug.
"""

from __future__ import annotations

from dataclasses import dataclass

from tests.sim.mutations import MUTATIONS

# name -> what the runtime does today (the model's default is the fix).
SHELL_BUGS: dict[str, str] = {
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
