"""Rollback decisions: the common point of two diverged oplogs, whether rolling back to
it is allowed, and what must be undone.

Theory of operation
-------------------
A member whose sync source does not hold its last entry has a *diverged* history:
it was primary (or synced from one) in a term whose last entries never reached a
majority, and another member was elected and wrote its own entries. Rollback
finds the **common point** — the newest entry both oplogs hold — by walking both
oplogs backwards from the top in timestamp order (`find_common_point`). An entry
is identified by its timestamp *and* term: two primaries of different terms may
stamp the same timestamp, and only the pair is unique (Raft's index + term).

Everything after the common point on our side is undone. That is only safe if
none of it was majority-committed: a majority-committed entry is on every future
primary's log, so a source that lacks it proves a bug (or lost disk writes on a
majority), and rolling it back would lose an acknowledged write.
`majority_committed_past` tells; the run refuses then (MongoDB fasserts; the
member stops syncing from that source and says so). The steps of one rollback
and how each can end are `sync.rollback_flow`'s.

Undoing follows MongoDB's "rollback via refetch" (`plan_rollback`): every
document an undone entry touched (insert, update, delete; keyed by `_id`) is
refetched from the source and replaces ours (or ours is deleted when the source
has none); every collection an undone DDL entry touched (create, drop, indexes,
rename) is recloned whole from the source. Then the member applies the source's
entries after the common point, which are idempotent, so the refetched documents
(which may be newer than the common point) converge; until it has applied up to
the source's top at refetch time (`minValid`) its data is not a consistent
snapshot and it must not serve reads or stand for election.

Pure: the caller passes optimes and entry documents; no I/O.
"""

from __future__ import annotations

__layer__ = "core"  # pure: no I/O, clock or randomness (tests/unit/test_layering.py)

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from bson import encode

from base.optime import OpTime
from oplog.entry import flattened

# How far back the common point is searched, in entries of our own oplog. A longer
# divergence needs a full resync (as a rollback of more than a day of writes does in MongoDB).
MAX_ROLLBACK_ENTRIES = 1_000_000
# The ids a rollback refetched are kept (in one document) until its minValid is reached.
MAX_REMEMBERED_BYTES = 4 * 1024 * 1024


def find_common_point(ours: Iterable[OpTime], theirs: Iterable[OpTime]) -> OpTime | None:
    """The newest optime present in both oplogs, or None when the windows do not meet.

    Both sequences run newest first. The walk advances whichever side has the
    newer timestamp; on equal timestamps, equal terms mean the common point and
    different terms mean two different entries, so both sides advance.
    """
    our_iter, their_iter = iter(ours), iter(theirs)
    a, b = next(our_iter, None), next(their_iter, None)
    while a is not None and b is not None:
        if a == b:
            return a
        if a.ts_key > b.ts_key:
            a = next(our_iter, None)
        elif b.ts_key > a.ts_key:
            b = next(their_iter, None)
        else:
            a, b = next(our_iter, None), next(their_iter, None)
    return None


def majority_committed_past(common_point: OpTime, majority_committed: OpTime) -> bool:
    """Whether entries after `common_point` include a majority-committed one.

    `majority_committed` is the newest commit point this member learned on its own
    history; the entries being undone are those of our oplog newer than the common point.
    """
    return majority_committed.ts_key > common_point.ts_key


def commit_problem(planned_from: OpTime, our_last_now: OpTime, common_point: OpTime,
                   majority_committed: OpTime) -> str | None:
    """Checked inside the rollback's own transaction: why it must not commit now, or None.

    The plan was made from our oplog ending at `planned_from`; a batch may have committed since
    (a write in flight when the primary stepped down): truncating it now would undo it without
    saving it or restoring what it changed, so the rollback fails (nothing changed; it is tried
    again). "refused" when the commit point moved past the common point meanwhile.
    """
    if our_last_now != planned_from:
        return f"our oplog moved from {planned_from} to {our_last_now} while the rollback was planned"
    if majority_committed_past(common_point, majority_committed):
        return "refused"
    return None


def stale_branch_problem(source_applied: OpTime, my_term: int, *, primary_seen: bool = True) -> str | None:
    """Why we must not roll back to match a source whose newest entry is `source_applied`, or None.
    `primary_seen`: we see a primary of our term (or newer).

    Raft's followers only take entries from the leader of their current term. A source whose newest
    entry is of an older term than ours may be a deposed primary's branch that lost: rolling back to
    it could undo entries the current primary committed that we never heard were committed. An entry
    of our term was written by that term's primary, so a branch holding one is that primary's - the
    current one while we see it primary. Once it is gone (it stepped down, cut off from a majority), a
    newer term may have begun out of our sight and committed entries its branch lacks: seed 700002893's
    m0 became primary of term 6 without m1's term-5 no-op, stepped down alone with m1, and m1 rolled the
    no-op back to m0's branch after the term-7 primary on the other side had committed it. Refusing
    costs a little time: the caller denies the source and picks another (the primary's newest entry is
    always of the current term).
    """
    if source_applied.term < my_term:
        return (f"its newest entry {source_applied} is older than our term {my_term}: it may be a "
                "deposed primary's branch, not the current one")
    if source_applied.term == my_term and not primary_seen:
        return (f"its newest entry {source_applied} is of our term {my_term}, whose primary we no longer "
                "see: a newer term may have begun without it")
    return None


def _id_key(value: Any) -> bytes:
    """A hashable, type-exact key for an `_id` (1 and 1.0 are different ids here, as in BSON)."""
    return encode({"_id": value})


@dataclass(slots=True)
class RollbackPlan:
    """What to refetch: documents by namespace and `_id`, and whole collections to reclone."""

    documents: dict[str, dict[bytes, Any]] = field(default_factory=dict)
    collections: set[str] = field(default_factory=set)
    databases: set[str] = field(default_factory=set)
    entries: int = 0

    def add_document(self, ns: str, id_value: Any) -> None:
        self.documents.setdefault(ns, {})[_id_key(id_value)] = id_value

    def ids(self, ns: str) -> list[Any]:
        return list(self.documents.get(ns, {}).values())

    @property
    def document_count(self) -> int:
        return sum(len(ids) for ids in self.documents.values())

    def merge(self, other: RollbackPlan) -> None:
        """Refetch what `other` refetches as well (a previous rollback whose minValid is not reached)."""
        for ns, ids in other.documents.items():
            self.documents.setdefault(ns, {}).update(ids)
        self.collections |= other.collections
        self.databases |= other.databases
        for ns in self.collections:
            self.documents.pop(ns, None)

    def remembered(self) -> dict[str, Any]:
        """What the plan refetched, as a document kept until minValid is reached (`recalled` reads it).

        Past `MAX_REMEMBERED_BYTES` of ids, the namespaces are remembered whole instead (a next
        rollback reclones them): the record stays one bounded document.
        """
        doc: dict[str, Any] = {"documents": [{"ns": ns, "ids": self.ids(ns)} for ns in sorted(self.documents)],
                               "collections": sorted(self.collections), "databases": sorted(self.databases)}
        if len(encode(doc)) > MAX_REMEMBERED_BYTES:
            doc = {"documents": [], "collections": sorted(self.collections | set(self.documents)),
                   "databases": sorted(self.databases)}
        return doc


def recalled(doc: Mapping[str, Any] | None) -> RollbackPlan:
    """The plan `RollbackPlan.remembered` kept (empty for None)."""
    plan = RollbackPlan()
    if doc is None:
        return plan
    for item in doc.get("documents", []):
        for id_value in item.get("ids", []):
            plan.add_document(str(item["ns"]), id_value)
    plan.collections.update(str(ns) for ns in doc.get("collections", []))
    plan.databases.update(str(db) for db in doc.get("databases", []))
    return plan


def plan_rollback(undone: Sequence[Mapping[str, Any]]) -> RollbackPlan:
    """The documents and collections touched by the entries being undone (ours after the common point)."""
    plan = RollbackPlan(entries=len(undone))
    for entry in (inner for outer in undone for inner in flattened(outer)):
        op, ns = entry.get("op"), str(entry.get("ns", ""))
        if op in ("i", "d"):
            plan.add_document(ns, entry["o"]["_id"])
        elif op == "u":
            plan.add_document(ns, entry["o2"]["_id"])
        elif op == "c":
            _plan_command(plan, ns.split(".", 1)[0], entry["o"])
    # A collection recloned whole needs no per-document refetch.
    for ns in plan.collections:
        plan.documents.pop(ns, None)
    return plan


def _plan_command(plan: RollbackPlan, db: str, o: Mapping[str, Any]) -> None:
    name = next(iter(o))
    match name:
        case "create" | "drop" | "createIndexes" | "dropIndexes" | "collMod":
            plan.collections.add(f"{db}.{o[name]}")
        case "renameCollection":
            plan.collections.update((str(o["renameCollection"]), str(o["to"])))
        case "dropDatabase":
            plan.databases.add(db)
        case _:
            plan.databases.add(db)  # an unknown command: reclone the whole database to be safe
