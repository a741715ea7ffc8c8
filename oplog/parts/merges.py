"""Which parts the primary merges next (ClickHouse's merge predicate and a size-tiered selector).

Theory of operation
-------------------
Only adjacent parts of one partition merge, and only when nothing can land
between them (`can_merge`, ClickHouse's `DistributedMergePredicate`):

* no block number is being committed between them (an insert or a mutation
  holding a number there; its part would end up inside the merged range);
* no other part - here or queued anywhere (`virtual`) - lies in the gap;
* both have had the same mutations applied (the merged part gets one version);
* neither is already being merged (the virtual set holds a bigger part over it);
* neither is pinned by a quorum insert still waiting for its replicas.

Among runs of mergeable parts the selector (`select_merge`) prefers merging many
small parts of similar size, like ClickHouse's `SimpleMergeSelector`: a range
qualifies when its size is at least `base` times its largest part (so one big
part is not rewritten to absorb a small one), where `base` falls from 5 to 1 as
the range's youngest part ages from 10 s to an hour (old small parts merge
anyway); of the qualifying ranges it takes the one with the lowest cost per
merged part. A range never exceeds `max_parts` parts or `max_bytes`.

Pure: part infos and sizes in, a range out.
"""

from __future__ import annotations

__layer__ = "core"  # pure: no I/O, clock or randomness (tests/unit/test_layering.py)

import itertools
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

from oplog.parts.active_set import ActivePartSet
from oplog.parts.part_info import PartInfo

MAX_PARTS_TO_MERGE = 100
MAX_BYTES_TO_MERGE = 5 * 1024**3
SIZE_FIXED_COST = 5 * 1024 * 1024        # what merging one more part costs, in bytes, whatever its size
BASE_YOUNG, BASE_OLD = 5.0, 1.0
YOUNG_AGE_MS, OLD_AGE_MS = 10_000, 3_600_000


@dataclass(frozen=True, slots=True)
class MergeCandidate:
    part: PartInfo
    bytes: int
    age_ms: int          # since the part was committed


def current_mutation_version(part: PartInfo, mutations: Collection[int]) -> int:
    """The newest of the partition's mutation numbers `part` already reflects (0: none)."""
    return max((m for m in mutations if m <= part.data_version), default=0)


def can_merge(left: PartInfo, right: PartInfo, *, virtual: ActivePartSet, committing: Collection[int] = (),
              mutations: Collection[int] = (), pinned: Collection[PartInfo] = ()) -> str | None:
    """Why `left` and `right` (left first) must not merge now, or None.

    `committing`: the partition's block numbers held by inserts and mutations not yet committed;
    `mutations`: the partition's mutation numbers; `pinned`: parts whose quorum is not reached yet.
    """
    if left.partition_id != right.partition_id:
        return f"{left} and {right} are in different partitions"
    if left.max_block >= right.min_block:
        return f"{left} is not before {right}"
    for part in (left, right):
        if virtual.containing(part) != part:
            return f"{part} is already assigned to a merge or mutation"
        if part in pinned:
            return f"{part} waits for its quorum"
    if any(left.max_block < n < right.min_block for n in committing):
        return f"a block number between {left} and {right} is being committed"
    if left.max_block + 1 < right.min_block:
        gap = PartInfo(left.partition_id, left.max_block + 1, right.min_block - 1, 0)
        in_gap = next(iter(virtual.overlapping(gap)), None)
        if in_gap is not None:
            return f"part {in_gap} lies between {left} and {right}"
    if current_mutation_version(left, mutations) != current_mutation_version(right, mutations):
        return f"{left} and {right} have different mutation versions"
    return None


def merge_base(youngest_age_ms: int) -> float:
    """How many times its largest part a range must weigh to be worth merging, by the youngest part's age."""
    if youngest_age_ms <= YOUNG_AGE_MS:
        return BASE_YOUNG
    if youngest_age_ms >= OLD_AGE_MS:
        return BASE_OLD
    share = (youngest_age_ms - YOUNG_AGE_MS) / (OLD_AGE_MS - YOUNG_AGE_MS)
    return BASE_YOUNG + (BASE_OLD - BASE_YOUNG) * share


def select_merge(candidates: Sequence[MergeCandidate], mergeable: Sequence[bool], *,
                 max_parts: int = MAX_PARTS_TO_MERGE, max_bytes: int = MAX_BYTES_TO_MERGE) -> list[PartInfo]:
    """The range of `candidates` (one partition's active parts in block order) to merge next, or [].

    `mergeable[i]` says whether candidates i and i+1 may merge (`can_merge`).
    """
    if len(mergeable) != max(0, len(candidates) - 1):
        raise ValueError("one mergeable flag per pair of neighbours")
    best: tuple[float, int, int] | None = None
    for start in range(len(candidates)):
        total = largest = 0
        youngest = None
        for end in range(start, min(len(candidates), start + max_parts)):
            if end > start and not mergeable[end - 1]:
                break
            c = candidates[end]
            total += c.bytes
            if total > max_bytes:
                break
            largest = max(largest, c.bytes)
            youngest = c.age_ms if youngest is None else min(youngest, c.age_ms)
            count = end - start + 1
            if count < 2:
                continue
            weight = (total + count * SIZE_FIXED_COST) / (largest + SIZE_FIXED_COST)
            if weight < merge_base(youngest):
                continue
            cost = (total + count * SIZE_FIXED_COST) / (count - 1.9)
            if best is None or cost < best[0]:
                best = (cost, start, end)
    if best is None:
        return []
    return [c.part for c in candidates[best[1]:best[2] + 1]]


def plan_merges(current: ActivePartSet, virtual: ActivePartSet, sizes: Mapping[str, tuple[int, int]], now_ms: int,
                *, pinned: Collection[PartInfo] = (), mutations: Mapping[str, Collection[int]] | None = None,
                max_parts: int = MAX_PARTS_TO_MERGE, max_bytes: int = MAX_BYTES_TO_MERGE) -> list[list[PartInfo]]:
    """At most one merge per partition, over the parts this replica has (`current`) that no queued task
    already takes (`virtual`). `sizes`: part name -> (bytes, commit time in ms); a part it lacks counts
    as empty and just committed."""
    chosen = []
    for partition in current.partitions():
        parts = [p for p in current.parts_of(partition) if virtual.containing(p) == p]
        if len(parts) < 2:
            continue
        partition_mutations = (mutations or {}).get(partition, ())
        candidates = [MergeCandidate(p, sizes.get(p.name, (0, now_ms))[0],
                                     max(0, now_ms - sizes.get(p.name, (0, now_ms))[1])) for p in parts]
        mergeable = [can_merge(a, b, virtual=virtual, mutations=partition_mutations, pinned=pinned) is None
                     for a, b in itertools.pairwise(parts)]
        selected = select_merge(candidates, mergeable, max_parts=max_parts, max_bytes=max_bytes)
        if selected:
            chosen.append(selected)
    return chosen
