"""Block ids and the dedup window, as ClickHouse's replicated inserts use them.

Every block an insert writes into a partition gets a **block id** that does not
depend on who sends it or when: the partition id followed by a 128-bit hash,
printed as ClickHouse prints it (two unsigned 64-bit halves in decimal). The
hash is of the block's rows in their stored form, sorted by the order key (the
same rows give the same id whatever order they came in), or, when the client
gives a dedup token, of `<token>_<block index>` - so a retry of the same insert
is recognised even when its data is not reproducible. The partition id is in
the id, so the same rows in two partitions are two blocks.

A block id already committed is a duplicate: the insert does not make a new
part, and the reply names the part that holds it. The part log remembers the
newest `window_count` block ids (ClickHouse's `replicated_deduplication_window`,
1,000) and only those no older than `window_secs` (7 days) than the newest one
(counted from the newest block's commit time, not the clock, so an idle table
forgets nothing; the newest block is never forgotten). "Newest" is by block
number: each inserted block takes the table's next one, so the window is the
last `window_count` numbers, counting the blocks a drop or a loss removed since.

Pure: bytes in, ids out (hashlib is a pure function).
"""

from __future__ import annotations

__layer__ = "core"  # pure: no I/O, clock or randomness (tests/unit/test_layering.py)

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

DEDUP_WINDOW_COUNT = 1000
DEDUP_WINDOW_SECS = 7 * 24 * 3600


def _id(partition_id: str, digest: bytes) -> str:
    low, high = int.from_bytes(digest[:8], "little"), int.from_bytes(digest[8:16], "little")
    return f"{partition_id}_{low}_{high}"


def block_id_of_rows(partition_id: str, sorted_rows: bytes) -> str:
    """The id of a block whose rows, sorted by the order key and serialised, are `sorted_rows`."""
    return _id(partition_id, hashlib.blake2b(sorted_rows, digest_size=16).digest())


def block_id_of_token(partition_id: str, token: str, block_index: int) -> str:
    """The id of block `block_index` (0-based, within one insert) of an insert carrying a dedup token."""
    return _id(partition_id, hashlib.blake2b(f"{token}_{block_index}".encode(), digest_size=16).digest())


@dataclass(frozen=True, slots=True)
class RememberedBlock:
    """A dedup key: the block, its number in the table's sequence of inserted blocks, its commit time."""

    block_id: str
    number: int
    committed_ms: int


def in_window(block: RememberedBlock, newest: RememberedBlock, *, window_count: int = DEDUP_WINDOW_COUNT,
              window_secs: int = DEDUP_WINDOW_SECS) -> bool:
    """Whether `block` is still a dedup key, `newest` being the table's newest block (ClickHouse's
    `clearOldBlocks`): among the newest `window_count` blocks, and committed at most `window_secs`
    before the newest. The newest is always kept (unless dedup is off: a window of 0)."""
    if window_count <= 0:
        return False
    if block.number >= newest.number:
        return True
    return (newest.number - block.number < window_count
            and block.committed_ms >= newest.committed_ms - window_secs * 1000)


def forgotten_prefix(oldest_first: Sequence[RememberedBlock], newest: RememberedBlock, *,
                     window_count: int = DEDUP_WINDOW_COUNT, window_secs: int = DEDUP_WINDOW_SECS,
                     limit: int | None = None) -> int:
    """How many of the oldest remembered blocks fell out of the window (at most `limit`): the window is
    a newest-first run, so what to forget is always a prefix of the blocks in commit order."""
    count = 0
    for block in oldest_first:
        if (limit is not None and count >= limit) or in_window(block, newest, window_count=window_count,
                                                                window_secs=window_secs):
            break
        count += 1
    return count
