"""Mutations (`alterDelete`, `alterUpdate`): which parts one affects, and in what order they apply.

Theory of operation
-------------------
As in ClickHouse, a mutation takes a block number in every partition of the table
when it is recorded (`versions`: partition -> number). It applies to exactly the
parts written before it: those of a listed partition whose blocks all lie below
its number and whose data version (the last mutation they reflect, or their
first block) is below it too. Parts inserted later get higher block numbers and
are never touched. A killed mutation (ClickHouse's KILL MUTATION) has no more
parts planned for it; the rewrites already logged still run on every member (a
logged rewrite must give the same bytes everywhere), and what it rewrote stays
rewritten. Whether a mutation is done on a member (`mutation_done`) is a fact
about that member's parts, killed or not: a mutation killed after it finished
stays done, one killed before leaves parts it never rewrites and stays not done.
A part is rewritten by one mutation at a time, oldest first,
into `mutated_part(part, version)`; merges only join parts at the same mutation
version, so a merged part never mixes rows from before and after a mutation.

Pure: definitions and part names in, decisions out.
"""

from __future__ import annotations

__layer__ = "core"  # pure: no I/O, clock or randomness (tests/unit/test_layering.py)

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from oplog.parts.active_set import ActivePartSet
from oplog.parts.part_info import PartInfo


@dataclass(frozen=True, slots=True)
class Mutation:
    id: str
    kind: str                                   # "delete" | "update"
    filter: Mapping[str, Any]
    set: Mapping[str, Any] = field(default_factory=dict)
    versions: Mapping[str, int] = field(default_factory=dict)   # partition -> block number
    create_ms: int = 0
    killed: bool = False                        # `killPartsMutation`: rewrites no more parts

    @classmethod
    def from_document(cls, doc: Mapping[str, Any]) -> Mutation:
        return cls(str(doc["_id"]), str(doc["kind"]), dict(doc.get("filter") or {}), dict(doc.get("set") or {}),
                   {str(k): int(v) for k, v in (doc.get("blockNumbers") or {}).items()}, int(doc.get("createMs", 0)),
                   bool(doc.get("killed", False)))

    def affects(self, part: PartInfo) -> bool:
        version = self.versions.get(part.partition_id)
        return version is not None and part.max_block < version and part.data_version < version

    def command(self) -> dict[str, Any]:
        return {"kind": self.kind, "filter": dict(self.filter), "set": dict(self.set)}


def next_mutation(part: PartInfo, mutations: Iterable[Mutation]) -> Mutation | None:
    """The oldest mutation `part` still needs (the lowest version above its data version; a killed one
    is needed no more)."""
    pending = [m for m in mutations if m.affects(part) and not m.killed]
    return min(pending, key=lambda m: m.versions[part.partition_id], default=None)


def parts_to_do(mutation: Mutation, parts: ActivePartSet) -> list[PartInfo]:
    """The parts of `parts` that `mutation` has yet to rewrite."""
    return [p for pid in mutation.versions for p in parts.parts_of(pid) if mutation.affects(p)]


def mutation_done(mutation: Mutation, current: ActivePartSet, virtual: ActivePartSet) -> bool:
    """No part of a member needs `mutation` any more: none it has (`current`) nor any its queue is to
    bring (`virtual`: a fetch of a part written before the mutation is work still to do). The kill
    does not enter into it."""
    return not parts_to_do(mutation, current) and not parts_to_do(mutation, virtual)


def versions_by_partition(mutations: Iterable[Mutation]) -> dict[str, list[int]]:
    """Every partition's mutation numbers (what the merge predicate compares). A killed mutation's number
    separates nothing: parts it rewrote and parts it never will may merge."""
    out: dict[str, list[int]] = {}
    for m in mutations:
        if m.killed:
            continue
        for pid, version in m.versions.items():
            out.setdefault(pid, []).append(version)
    return out
