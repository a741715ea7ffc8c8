"""A replica's part-log decisions that are not the queue's: which task a log document is, where to
fetch a part from, and when a part counts as lost.

Theory of operation
-------------------
The member's runner (`replset.parts.manager`) and the primary's duties
(`replset.parts.leader`) are shells: they read documents, disks and clocks and
carry out what these functions decide; the part simulator (`tests/sim/parts.py`)
drives the same functions with a simulated clock and network.

**Tasks.** A log document becomes one queue task (`task_of`), keyed by its `_id`.

**Fetch source** (`choose_source`). As today's ClickHouse
(`findReplicaHavingCoveringPart`): among the live members registered as holding
the part, one at random - so the fetches of many replicas spread over every
holder. A holder that failed this part is not chosen again while another one has
not. With no live exact holder left untried: the widest (then newest) registered
part covering it that this replica's own log also produces, from a random live
holder that has not failed it, if there is one (a
registration can outlive its copy: a member that fetched a covering part drops
the parts it covers); with none, the exact holders again, their failures
forgotten. With none either: the member that inserted it (its
log document says so), while nobody is registered yet. The seed's "largest log
pointer, smallest queue" ranking is today used by ClickHouse only to clone a lost
replica; `rank` may pass it in (the part simulator measures both).

**Lost parts** (`seems_lost`, `quorum_orphaned`). A part is lost when this
replica failed to fetch it `LOST_AFTER_TRIES` times, no other member is
registered as holding it or a part covering it, and it was committed at least
`LOST_MIN_AGE_MS` ago (its source may still be publishing it); or when it is the
part of a pending quorum insert that no live member has held for the table's
`quorumLostAfterMS`.

**Old log entries** (`log_entry_obsolete`, ClickHouse's `clearOldLogs`). The
primary removes a log document once nobody needs it to build a queue: it is
older than `oldPartsLifetimeSecs`, its part is contained in another part the log
produces that every live data-bearing member is registered as holding, no quorum
on it is pending, and no dedup key names it (an insert's duplicate check reads the
log document its key names). A member that was away rebuilds its queue from what
is left: the covering part's entry, fetched or made from the sources it has.

Pure: documents, part names and times in, decisions out; randomness is passed in.
"""

from __future__ import annotations

__layer__ = "core"  # pure: no I/O, clock or randomness (tests/unit/test_layering.py)

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from oplog.parts.part_info import PartInfo
from oplog.parts.queue import EntryType, QueueEntry

LOST_AFTER_TRIES = 5         # fetches of the part failed here this often ...
LOST_MIN_AGE_MS = 120_000    # ... and it was committed at least this long ago

T = TypeVar("T")


def task_of(doc: Mapping[str, Any]) -> QueueEntry | None:
    """The queue task of a part-log document (None: not a task). Raises KeyError / ValueError /
    MongoError on a malformed one."""
    kind, part = doc.get("type"), str(doc.get("part", ""))
    node = str(doc["_id"])
    if kind == "GET_PART":
        return QueueEntry(node, EntryType.GET_PART, PartInfo.parse(part), source_replica=str(doc.get("source", "")),
                          quorum=int(doc.get("quorum", 0)))
    if kind in ("MERGE_PARTS", "MUTATE_PART"):
        return QueueEntry(node, EntryType(kind), PartInfo.parse(part),
                          source_parts=tuple(PartInfo.parse(str(s)) for s in doc.get("sources", ())))
    if kind == "ALTER_METADATA":
        return QueueEntry(node, EntryType.ALTER_METADATA, alter_version=int(doc.get("version", 0)))
    if kind == "DROP_RANGE":
        return QueueEntry(node, EntryType.DROP_RANGE, PartInfo.parse(part))
    return None


@dataclass(frozen=True, slots=True)
class Copy:
    """A member's copy of a part, as the registry lists it."""

    member: str
    address: str          # where it is fetched from (the member's HTTP address)
    checksums: Any        # what the fetched files must match


@dataclass(frozen=True, slots=True)
class Source:
    copy: Copy
    part: PartInfo           # what to fetch: the part, or a part covering it
    forget_failures: bool    # every exact holder failed it once: start over


def choose_source(part: PartInfo, exact: Mapping[str, Copy], covering: Sequence[tuple[PartInfo, Mapping[str, Copy]]],
                  *, me: str, live: set[str], failed: set[str], inserter: Copy | None,
                  choose: Callable[[Sequence[Copy]], Copy],
                  rank: Callable[[Copy], Any] | None = None) -> Source | None:
    """Where to fetch `part` from (see the module doc). `exact`: the registered copies of the part by
    member; `covering`: registered parts containing it that this replica's log produces, with their
    copies; `failed`: the addresses that failed this part lately; `choose`: a random pick; `rank`: when
    given, the lowest-ranked copy wins instead of a random one (the seed's rule)."""
    def pick(copies: Sequence[Copy]) -> Copy:
        return min(copies, key=rank) if rank is not None else choose(copies)

    usable = [c for m, c in exact.items() if m != me and m in live and c.checksums]
    untried = [c for c in usable if c.address not in failed]
    if untried:
        return Source(pick(untried), part, forget_failures=False)
    wider = [(info, c) for info, copies in covering for m, c in copies.items() if m != me and m in live and c.checksums]
    if wider:   # no exact holder, or every one failed it (a registration can outlive its part)
        wider = [(info, c) for info, c in wider if c.address not in failed] or wider
        widest = max((info for info, _ in wider), key=lambda p: (p.max_block - p.min_block, p.level, p.data_version))
        return Source(pick([c for info, c in wider if info == widest]), widest, forget_failures=False)
    if usable:
        return Source(pick(usable), part, forget_failures=True)
    if inserter is not None and inserter.member != me and inserter.address and inserter.checksums:
        return Source(inserter, part, forget_failures=False)
    return None


def seems_lost(entry: QueueEntry, *, here: bool, held_elsewhere: bool, already_lost: bool, created_ms: int | None,
               now_ms: int) -> bool:
    """Whether a fetch task's part is lost: see the module doc. `here`: this replica has it or a part
    containing it; `held_elsewhere`: another member is registered with it or a part covering it."""
    if (entry.type is not EntryType.GET_PART or entry.new_part is None or entry.currently_executing
            or entry.num_tries < LOST_AFTER_TRIES or here or already_lost or held_elsewhere):
        return False
    return created_ms is not None and now_ms - created_ms >= LOST_MIN_AGE_MS


def quorum_orphaned(since_ms: int | None, *, held_live: bool, now_ms: int, after_ms: int) -> tuple[bool, int | None]:
    """A pending quorum part: whether it is lost now, and since when no live member has held it (None:
    one does). `since_ms` is the previous answer's."""
    if held_live:
        return False, None
    since = now_ms if since_ms is None else since_ms
    return (True, None) if now_ms - since >= after_ms else (False, since)


def log_entry_obsolete(*, created_ms: int, now_ms: int, lifetime_ms: int, covering_holders: Collection[str] | None,
                       members: Collection[str], quorum_pending: bool, names_a_dedup_key: bool) -> bool:
    """Whether a log document can go (see the module doc). `covering_holders`: the members registered as
    holding the part the log produces that contains this one (None: no such part); `members`: the live
    data-bearing members, the primary included."""
    if now_ms - created_ms < lifetime_ms or quorum_pending or names_a_dedup_key or covering_holders is None:
        return False
    return bool(members) and all(m in covering_holders for m in members)
