"""Group commit's decisions (`oplog.journal`): batches, and which flush answers whom."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from oplog.journal import (
    INLINE_FSYNC_LIMIT_S,
    JOURNAL_COMMIT_INTERVAL_MS,
    MAX_BATCH,
    FsyncPace,
    Journal,
    batch_cut,
)


def test_a_batch_takes_the_queue_up_to_a_write_that_runs_alone() -> None:
    assert batch_cut([]) == (0, False)
    assert batch_cut([False, False, True, False]) == (2, False)
    assert batch_cut([True, False]) == (1, True)
    assert batch_cut([False] * (MAX_BATCH + 5)) == (MAX_BATCH, False)


def test_a_durable_write_is_answered_by_the_flush_that_began_after_its_commit() -> None:
    journal: Journal[str] = Journal()
    journal.committed(0, ["vote"])
    assert journal.start_flush(0) == 1
    journal.committed(1, ["config"])            # while the fsync runs: the next flush covers it
    assert journal.start_flush(1) is None       # one flush at a time
    assert journal.flushed() == ["vote"]
    assert journal.start_flush(2) == 2          # wanted at once: someone still waits
    assert journal.flushed() == ["config"] and journal.durable_seq == 2


def test_a_commit_nobody_waits_for_is_flushed_within_the_interval() -> None:
    journal: Journal[str] = Journal()
    journal.committed(1000)
    assert journal.next_deadline() == 1000 + JOURNAL_COMMIT_INTERVAL_MS
    assert journal.start_flush(1000 + JOURNAL_COMMIT_INTERVAL_MS - 1) is None
    journal.committed(1050)                      # the first commit's deadline stands
    assert journal.start_flush(1000 + JOURNAL_COMMIT_INTERVAL_MS) == 2
    assert journal.flushed() == [] and journal.next_deadline() is None
    journal.want_flush()                         # nothing new committed: no fsync
    assert journal.start_flush(2000) is None and not journal.pending


def test_waiting_for_a_commit_already_durable_returns_at_once() -> None:
    journal: Journal[str] = Journal()
    journal.committed(0)
    assert journal.start_flush(JOURNAL_COMMIT_INTERVAL_MS) == 1
    journal.flushed()
    assert journal.wait_durable("j", 1) and not journal.pending
    journal.committed(200)
    assert not journal.wait_durable("j2") and journal.pending
    assert journal.abandon() == ["j2"] and not journal.pending


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(["commit", "durable", "want", "start", "end", "wait"]), max_size=60))
def test_no_waiter_is_answered_before_its_commit_is_flushed_and_none_is_forgotten(steps: list[str]) -> None:
    journal: Journal[int] = Journal()
    now, flushing_since, durable_upto = 0, None, 0
    waiting: dict[int, int] = {}   # token -> the commit it waits for
    tokens = iter(range(10_000))
    for step in steps:
        now += 7
        if step in ("commit", "durable"):
            token = next(tokens)
            seq = journal.committed(now, [token] if step == "durable" else [])
            if step == "durable":
                waiting[token] = seq
        elif step == "want":
            journal.want_flush()
        elif step == "wait":
            token = next(tokens)
            if not journal.wait_durable(token):
                waiting[token] = journal.committed_seq
        elif step == "start":
            started = journal.start_flush(now)
            if started is not None:
                assert flushing_since is None
                flushing_since = started
        elif step == "end" and flushing_since is not None:
            durable_upto, flushing_since = flushing_since, None
            for token in journal.flushed():
                assert waiting.pop(token) <= durable_upto
    assert all(seq > durable_upto for seq in waiting.values())
    while waiting:   # whoever still waits gets a flush without anything else happening
        now += JOURNAL_COMMIT_INTERVAL_MS
        if flushing_since is None:
            flushing_since = journal.start_flush(now)
            assert flushing_since is not None
        durable_upto, flushing_since = flushing_since, None
        for token in journal.flushed():
            assert waiting.pop(token) <= durable_upto


def test_a_commit_made_while_a_flush_runs_is_due_once_it_ends() -> None:
    journal: Journal[str] = Journal()
    journal.committed(0, ["vote"])
    assert journal.start_flush(0) == 1
    journal.committed(10)                               # nobody waits for it
    assert journal.next_deadline() is None              # not while the flush runs...
    assert journal.flushed() == ["vote"]
    assert journal.next_deadline() == 10 + JOURNAL_COMMIT_INTERVAL_MS   # ...but once it ended
    assert journal.start_flush(10 + JOURNAL_COMMIT_INTERVAL_MS) == 2


def test_one_slow_fsync_sends_only_the_next_few_flushes_to_the_thread() -> None:
    pace = FsyncPace()
    assert pace.inline_ok
    for _ in range(20):
        pace.observed(0.0003)
    assert pace.inline_ok
    pace.observed(0.010)                      # a checkpoint's fsync beside ours
    assert not pace.inline_ok
    fast_ones = 0
    while not pace.inline_ok:
        pace.observed(0.0003)
        fast_ones += 1
    assert 1 <= fast_ones <= 10


def test_a_disk_that_stays_slow_keeps_the_flushes_off_the_loop() -> None:
    pace = FsyncPace()
    for _ in range(100):
        pace.observed(INLINE_FSYNC_LIMIT_S * 3)
        assert not pace.inline_ok
    for _ in range(100):
        pace.observed(0.0002)
    assert pace.inline_ok
