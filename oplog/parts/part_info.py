"""Part names, block ranges and covering, as ClickHouse's `MergeTreePartInfo`.

Theory of operation
-------------------
A part holds the rows of one partition inserted as blocks `min_block..max_block`
(block numbers are allocated per partition, rising). An insert makes a level-0
part of one block (`202405_7_7_0`); a merge of adjacent parts makes a part
spanning their blocks one level up (`202405_3_7_1`); a mutation with block
number M rewrites a part keeping its range and level and records M
(`202405_3_7_1_12`). The name is the whole identity:
`{partition_id}_{min_block}_{max_block}_{level}[_{mutation}]`.

A part **contains** another when it covers its blocks in the same partition at
a level and mutation at least as high, and either the ranges are equal or its
level is higher (`all_0_5_2` does not contain `all_0_4_2`; `all_0_5_3` and
`all_0_4_2_9` do). Two parts of a partition whose ranges overlap without one
containing the other **intersect**: that never happens to a healthy table.

Dropping a partition logs a **fake part** covering everything below a
delimiting block number N: `pid_0_{N-1}_999999999_999999999` (level MAX_LEVEL,
mutation MAX_BLOCK_NUMBER, so concurrently mutated parts are covered too).
Parts inserted later get numbers above N, so no merge mixes dropped and new
data.

Pure: names in, values out.
"""

from __future__ import annotations

__layer__ = "core"  # pure: no I/O, clock or randomness (tests/unit/test_layering.py)

import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from base.errors import MongoError

MAX_LEVEL = 999_999_999
MAX_BLOCK_NUMBER = 999_999_999
LEGACY_MAX_LEVEL = 2**32 - 1       # old drop ranges; read as MAX_LEVEL, printed back as written
PARTITION_ID = re.compile(r"^[A-Za-z0-9-]+$")
ALL_PARTITION = "all"              # the partition of a table without a partition key
BAD_PART_NAME = 2                  # BadValue: a part name that does not parse


class PartsIntersect(Exception):
    """Two parts overlap without one containing the other (ClickHouse's "Part X intersects previous part Y")."""


@dataclass(frozen=True, slots=True, order=True)
class PartInfo:
    """One part's identity. Ordered as ClickHouse's part sets are: partition, then blocks, level, mutation."""

    partition_id: str
    min_block: int
    max_block: int
    level: int = 0
    mutation: int = 0
    legacy_max_level: bool = field(default=False, compare=False)

    def __post_init__(self) -> None:
        if not PARTITION_ID.match(self.partition_id):
            raise ValueError(f"bad partition id {self.partition_id!r}: letters, digits and '-' only")
        if not 0 <= self.min_block <= self.max_block:
            raise ValueError(f"bad block range {self.min_block}..{self.max_block}")
        if self.level < 0 or self.mutation < 0:
            raise ValueError("level and mutation are never negative")

    # -- names -----------------------------------------------------------------------------------

    @property
    def name(self) -> str:
        level = LEGACY_MAX_LEVEL if self.legacy_max_level else self.level
        base = f"{self.partition_id}_{self.min_block}_{self.max_block}_{level}"
        return f"{base}_{self.mutation}" if self.mutation else base

    def __str__(self) -> str:
        return self.name

    @classmethod
    def parse(cls, name: str) -> PartInfo:
        """The part a name stands for; MongoError 2 (BadValue) when it is not a part name."""
        fields = name.split("_")
        if len(fields) not in (4, 5) or not all(f.isdigit() for f in fields[1:]):
            raise MongoError(BAD_PART_NAME, f"{name!r} is not a part name (partition_min_max_level[_mutation])")
        min_block, max_block, level = (int(f) for f in fields[1:4])
        mutation = int(fields[4]) if len(fields) == 5 else 0
        legacy = level == LEGACY_MAX_LEVEL
        try:
            return cls(fields[0], min_block, max_block, MAX_LEVEL if legacy else level, mutation, legacy)
        except ValueError as exc:
            raise MongoError(BAD_PART_NAME, f"{name!r} is not a part name: {exc}") from None

    # -- relations -------------------------------------------------------------------------------

    @property
    def data_version(self) -> int:
        """The mutation version of the rows: a mutation numbered M applies to parts below M."""
        return self.mutation or self.min_block

    @property
    def is_fake_drop_range(self) -> bool:
        return self.level == MAX_LEVEL

    def contains(self, other: PartInfo) -> bool:
        """Whether this part holds everything `other` holds (equal parts contain each other)."""
        strictly = ((self.min_block == other.min_block and self.max_block == other.max_block)
                    or self.level > other.level or self.level == MAX_LEVEL)
        return (self.partition_id == other.partition_id and self.min_block <= other.min_block
                and self.max_block >= other.max_block and self.level >= other.level
                and self.mutation >= other.mutation and strictly)

    def is_disjoint(self, other: PartInfo) -> bool:
        return (self.partition_id != other.partition_id or self.min_block > other.max_block
                or self.max_block < other.min_block)

    def intersects(self, other: PartInfo) -> bool:
        """Overlapping blocks, neither containing the other: never legal in one part set."""
        return not self.is_disjoint(other) and not self.contains(other) and not other.contains(self)


def inserted_part(partition_id: str, block_number: int) -> PartInfo:
    """The level-0 part an insert of one block numbered `block_number` makes."""
    return PartInfo(partition_id, block_number, block_number, 0, 0)


def merged_part(sources: Sequence[PartInfo]) -> PartInfo:
    """The part a merge of `sources` (adjacent, in block order, one partition) makes: its name depends
    only on theirs."""
    if not sources:
        raise ValueError("a merge needs at least one part")
    first, last = sources[0], sources[-1]
    if any(p.partition_id != first.partition_id for p in sources):
        raise ValueError("a merge never spans partitions")
    return PartInfo(first.partition_id, first.min_block, last.max_block,
                    max(p.level for p in sources) + 1, max(p.mutation for p in sources))


def mutated_part(source: PartInfo, mutation: int) -> PartInfo:
    """`source` rewritten by the mutation numbered `mutation` in its partition."""
    if mutation <= source.data_version:
        raise ValueError(f"mutation {mutation} does not apply to {source} (data version {source.data_version})")
    return PartInfo(source.partition_id, source.min_block, source.max_block, source.level, mutation)


def drop_range(partition_id: str, delimiting_block: int) -> PartInfo | None:
    """The fake part covering every part of a partition below `delimiting_block` (None: nothing to drop)."""
    if delimiting_block <= 0:
        return None
    return PartInfo(partition_id, 0, delimiting_block - 1, MAX_LEVEL, MAX_BLOCK_NUMBER)
