"""Block ids and the dedup window (oplog/parts/blocks.py)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from oplog.parts.blocks import (
    DEDUP_WINDOW_SECS,
    RememberedBlock,
    block_id_of_rows,
    block_id_of_token,
    blocks_to_forget,
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
    blocks = [RememberedBlock(f"b{i}", i * day) for i in range(10)]     # one block a day
    assert blocks_to_forget(blocks, window_count=3) == ["b6", "b5", "b4", "b3", "b2", "b1", "b0"]
    assert blocks_to_forget(blocks, window_count=100, window_secs=2 * 24 * 3600) == [
        "b6", "b5", "b4", "b3", "b2", "b1", "b0"]
    assert blocks_to_forget([RememberedBlock("lone", 0)], window_count=1, window_secs=0) == []   # never the newest
    assert blocks_to_forget(blocks[:2], window_count=0) == ["b1", "b0"]                        # dedup off
    assert blocks_to_forget([], window_count=5) == []


@given(st.lists(st.integers(0, 10**10), max_size=60), st.integers(1, 20), st.integers(0, DEDUP_WINDOW_SECS))
def test_the_window_is_a_newest_first_prefix(times: list[int], count: int, secs: int) -> None:
    blocks = [RememberedBlock(f"b{i}", t) for i, t in enumerate(times)]
    forgotten = set(blocks_to_forget(blocks, window_count=count, window_secs=secs))
    kept = [b for b in blocks if b.block_id not in forgotten]
    assert len(kept) <= count and (not blocks or kept)
    if kept:
        newest = max(b.committed_ms for b in blocks)
        assert all(b.committed_ms >= newest - secs * 1000 for b in kept)
        oldest_kept = min(b.committed_ms for b in kept)
        # nothing forgotten is newer than something kept
        assert all(b.committed_ms <= oldest_kept for b in blocks if b.block_id in forgotten)
