"""A set of parts with no part covered by another, as ClickHouse's `ActiveDataPartSet`.

Adding a part drops the parts it covers and ignores a part already covered; a
part that intersects one in the set is refused (`PartsIntersect`): that means a
bug or a corrupted log, and going on would lose or double rows. The replica's
active parts, the queue's virtual parts (what the active set will be once every
queued entry ran) and the parts being produced are all such sets.

Per partition the parts are disjoint, so sorted by first block they are sorted
by last block too: the parts overlapping a range are one run found by bisection
(`O(log n + k)`).

Pure: part infos in, part infos out.
"""

from __future__ import annotations

__layer__ = "core"  # pure: no I/O, clock or randomness (tests/unit/test_layering.py)

import bisect
from collections.abc import Iterable, Iterator

from oplog.parts.part_info import PartInfo, PartsIntersect


class ActivePartSet:
    def __init__(self, parts: Iterable[PartInfo] = ()) -> None:
        self._by_partition: dict[str, list[PartInfo]] = {}
        for part in parts:
            self.add(part)

    def __len__(self) -> int:
        return sum(len(parts) for parts in self._by_partition.values())

    def __iter__(self) -> Iterator[PartInfo]:
        for partition in sorted(self._by_partition):
            yield from self._by_partition[partition]

    def __contains__(self, part: object) -> bool:
        if not isinstance(part, PartInfo):
            return False
        parts = self._by_partition.get(part.partition_id, [])
        i = bisect.bisect_left(parts, part)
        return i < len(parts) and parts[i] == part

    def partitions(self) -> list[str]:
        return sorted(self._by_partition)

    def parts_of(self, partition_id: str) -> list[PartInfo]:
        return list(self._by_partition.get(partition_id, []))

    def overlapping(self, part: PartInfo) -> Iterator[PartInfo]:
        """The parts of `part`'s partition whose block ranges overlap it, in block order."""
        parts = self._by_partition.get(part.partition_id, [])
        i = bisect.bisect_left(parts, PartInfo(part.partition_id, part.min_block, part.min_block))
        if i > 0 and parts[i - 1].max_block >= part.min_block:
            i -= 1
        while i < len(parts) and parts[i].min_block <= part.max_block:
            yield parts[i]
            i += 1

    def containing(self, part: PartInfo) -> PartInfo | None:
        """The part of the set that contains `part` (itself included), or None."""
        return next((p for p in self.overlapping(part) if p.contains(part)), None)

    def covered_by(self, part: PartInfo) -> list[PartInfo]:
        """The parts of the set that `part` contains."""
        return [p for p in self.overlapping(part) if part.contains(p)]

    def intersecting(self, part: PartInfo) -> list[PartInfo]:
        return [p for p in self.overlapping(part) if p.intersects(part)]

    def add(self, part: PartInfo) -> list[PartInfo]:
        """Adds `part` and returns the parts it replaced; ignores a part already covered (returns []).
        Raises PartsIntersect, changing nothing, when it intersects a part of the set."""
        overlapping = list(self.overlapping(part))
        if any(p.contains(part) for p in overlapping):
            return []
        clash = next((p for p in overlapping if not part.contains(p)), None)
        if clash is not None:
            raise PartsIntersect(f"part {part} intersects part {clash}")
        parts = self._by_partition.setdefault(part.partition_id, [])
        for p in overlapping:
            parts.remove(p)
        bisect.insort(parts, part)
        return overlapping

    def remove(self, part: PartInfo) -> bool:
        parts = self._by_partition.get(part.partition_id, [])
        i = bisect.bisect_left(parts, part)
        if i < len(parts) and parts[i] == part:
            del parts[i]
            if not parts:
                del self._by_partition[part.partition_id]
            return True
        return False

    def remove_covered(self, part: PartInfo) -> list[PartInfo]:
        """Removes `part` (if present) and every part it contains; returns what was removed."""
        removed = self.covered_by(part)
        for p in removed:
            self.remove(p)
        return removed
