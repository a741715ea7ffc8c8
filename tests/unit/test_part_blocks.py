"""Block ids and the dedup window (oplog/parts/blocks.py)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from oplog.parts.blocks import (
    DEDUP_WINDOW_SECS,
    RememberedBlock,
    block_id_of_rows,
    block_id_of_token,
    forgotten_prefix,
    in_window,
)


def test_a_block_id_is_the_partition_and_two_decimal_halves() -> None:
    block = block_id_of_rows("202405", b"rows")
    pid, low, high = block.split("_")
    assert pid == "202405" and 0 <= int(low) < 2**64 and 0 <= int(high) < 2**64
    assert block == block_id_of_rows("202405", b"rows")              # deterministic
    assert block != block_id_of_rows("202406", b"rows")              # the partition is part of it
    assert block != block_id_of_rows("202405", b"rowz")
    assert block_id_of_token("all", "t", 0) == block_id_of_token("all", "t", 0) != block_id_of_token("all", "t", 1)


def test_the_window_keeps_the_newest_by_count_and_by_age_from_the_newest_block() -> None:
    day = 24 * 3600 * 1000
    blocks = [RememberedBlock(f"b{i}", i, i * day) for i in range(10)]     # one block a day
    newest = blocks[-1]
    assert forgotten_prefix(blocks, newest, window_count=3) == 7
    assert forgotten_prefix(blocks, newest, window_count=100, window_secs=2 * 24 * 3600) == 7
    assert forgotten_prefix(blocks, newest, window_count=100, window_secs=2 * 24 * 3600, limit=5) == 5
    assert forgotten_prefix(blocks, newest) == 2                           # 7 days: b2 .. b9
    assert in_window(newest, newest, window_count=1, window_secs=0)        # never the newest
    assert not in_window(newest, newest, window_count=0)                   # dedup off
    assert forgotten_prefix([], newest, window_count=5) == 0


@given(st.lists(st.integers(0, 10**6), max_size=60), st.integers(1, 20), st.integers(0, DEDUP_WINDOW_SECS))
def test_the_window_is_a_newest_first_run(gaps: list[int], count: int, secs: int) -> None:
    """Blocks in commit order (times never go back): what falls out is a prefix, what stays is within
    `count` numbers and `secs` of the newest, and nothing forgotten could have stayed."""
    times = [sum(gaps[:i + 1]) * 1000 for i in range(len(gaps))]
    blocks = [RememberedBlock(f"b{i}", i, t) for i, t in enumerate(times)]
    if not blocks:
        return
    newest = blocks[-1]
    n = forgotten_prefix(blocks, newest, window_count=count, window_secs=secs)
    kept = blocks[n:]
    assert kept and newest in kept and len(kept) <= count
    assert all(b.committed_ms >= newest.committed_ms - secs * 1000 for b in kept)
    assert all(not in_window(b, newest, window_count=count, window_secs=secs) for b in blocks[:n])
