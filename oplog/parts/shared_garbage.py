"""Which of a zero-copy table's objects in shared storage may be deleted, and when (docs/zero-copy.md).

Only the primary deletes, and only a key that
* no part the registry lists maps to (the marks: a holder's checksums give its copy's key), nor an active
  or pinned part the log recorded checksums for, nor a part directory on this member;
* was written at least `grace_ms` ago (an insert stores its objects before its commit names the part, a
  merge before its result is registered);
* was found so twice: once when this primary's log stood at some optime, and again once the majority
  commit point reached that optime in the same term. Whatever removed its last mark is then majority
  committed: no rollback can bring the mark back after the objects are gone. A new mark since the first
  look is seen by the second.

Pure: the shell lists the objects, reads the local parts and deletes (`replset.parts.leader`).
"""

from __future__ import annotations

__layer__ = "core"  # pure: no I/O, clock or randomness (tests/unit/test_layering.py)

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from base.errors import MongoError
from base.optime import OpTime
from oplog.parts.part_info import PartInfo
from oplog.parts.storage_url import part_key

Checksums = Mapping[str, tuple[int, str]]


def referenced_keys(table_uuid: str, copies: Iterable[tuple[str, Checksums]]) -> set[str]:
    """The keys of `copies` ((part name, checksums) of every registered, logged, pinned or local copy)."""
    keys = set()
    for part, checksums in copies:
        if not checksums:
            continue
        try:
            keys.add(part_key(table_uuid, PartInfo.parse(part).partition_id, checksums))
        except MongoError:   # a name or checksums that make no key mark nothing
            continue
    return keys


@dataclass
class SharedGarbage:
    """One table's candidates between the two looks."""

    grace_ms: int
    # key -> (the optime the first look saw the log at, the term it was primary in)
    candidates: dict[str, tuple[OpTime, int]] = field(default_factory=dict)

    def look(self, stored: Mapping[str, int], referenced: set[str], *, now_ms: int, last: OpTime,
             commit_point: OpTime, term: int) -> list[str]:
        """`stored`: every key in the storage -> when it was written (ms). Returns the keys to delete now;
        remembers the others that are unreferenced and old enough for a second look."""
        due = []
        kept: dict[str, tuple[OpTime, int]] = {}
        for key, written_ms in stored.items():
            if key in referenced or now_ms - written_ms < self.grace_ms:
                continue   # marked, or too young: a first look again later
            first = self.candidates.get(key)
            if first is None or first[1] != term:
                kept[key] = (last, term)
            elif commit_point >= first[0]:
                due.append(key)
            else:
                kept[key] = first   # the commit point has not reached the first look yet
        self.candidates = kept
        return sorted(due)

    def forget(self) -> None:
        """No longer primary, or the history was replaced: every candidate starts over."""
        self.candidates.clear()
