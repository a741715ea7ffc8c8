"""The replication queue's scheduler (oplog/parts/queue.py): ClickHouse's postponement rules, and a
property: a queue fed a consistent part log always drains to the log's part set (no livelock)."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from oplog.parts.active_set import ActivePartSet
from oplog.parts.part_info import PartInfo, drop_range, inserted_part, merged_part, mutated_part
from oplog.parts.queue import EntryType, QueueEntry, ReplicationQueue

P = PartInfo.parse


def get(n: int, part: str) -> QueueEntry:
    return QueueEntry(f"log-{n:010d}", EntryType.GET_PART, P(part))


def merge(n: int, sources: list[str]) -> QueueEntry:
    parts = tuple(P(s) for s in sources)
    return QueueEntry(f"log-{n:010d}", EntryType.MERGE_PARTS, merged_part(parts), parts)


def test_a_task_is_queued_once_and_drop_ranges_go_first() -> None:
    q = ReplicationQueue()
    assert q.add(get(1, "all_1_1_0")) and not q.add(get(1, "all_1_1_0"))
    drop = QueueEntry("log-0000000002", EntryType.DROP_RANGE, drop_range("all", 2))
    q.add(drop)
    assert [e.node_name for e in q.entries] == ["log-0000000002", "log-0000000001"]
    assert [p.name for p in q.virtual] == ["all_0_1_999999999_999999999"]


def test_a_fetch_waits_for_a_running_merge_that_covers_it_then_needs_no_work() -> None:
    q = ReplicationQueue([P("all_1_1_0")])               # the merge runs (it fetches its result)
    m = merge(3, ["all_1_1_0", "all_2_2_0"])
    q.add(m)
    assert q.next_to_run(0) is m
    q.started(m, 0)
    g = get(4, "all_2_2_0")
    q.add(g)
    assert q.next_to_run(1) is None
    assert g.postpone_reason == "another log entry for the same part (all_1_2_1) is being processed"
    assert g.num_postponed == 1 and g.last_postpone_time_ms == 1
    q.finished(m, 2)
    assert q.next_to_run(3) is g and q.already_done(g)


def test_no_livelock_between_a_fetch_and_the_merge_that_needs_its_part() -> None:
    """ClickHouse #23313: a GET waited for a covering MERGE while the MERGE waited for that GET."""
    q = ReplicationQueue([P("all_1_1_0")], fetch_pool_size=1)
    busy = get(1, "x_1_1_0")
    q.add(busy)
    q.started(busy, 0)                                         # the fetch pool is full
    g, m = get(2, "all_2_2_0"), merge(3, ["all_1_1_0", "all_2_2_0"])
    q.add(g)
    q.add(m)
    assert q.next_to_run(1) is None
    assert m.postpone_reason == "source part all_2_2_0 is not ready yet"
    why = {row["node_name"]: row["postpone_reason"] for row in q.view(1)}   # the full pool was not walked
    assert why[g.node_name] == "1 fetches are already executing, at most 1"
    assert why[m.node_name] == "source part all_2_2_0 is not ready yet"
    q.finished(busy, 2)
    assert q.next_to_run(3) is g                              # the fetch goes first, the merge after it
    q.started(g, 3)
    q.finished(g, 4)
    assert q.next_to_run(5) is m


def test_a_merge_whose_source_nobody_produces_runs_and_fetches_its_result() -> None:
    q = ReplicationQueue([P("all_1_1_0")])
    m = merge(3, ["all_1_1_0", "all_2_2_0"])
    q.add(m)
    assert q.next_to_run(0) is m


def test_a_merge_never_waits_for_a_task_that_comes_after_it() -> None:
    """After a rebuild a merge's source may be gone for good (set aside), while a mutation of the merge's own
    result is queued: that mutation's part contains the source, but waiting for it would wait for ever.
    The merge runs (and fetches its result, or a part covering it)."""
    q = ReplicationQueue([P("all_2_2_0")])
    m = merge(1, ["all_1_1_0", "all_2_2_0"])
    q.add(m)
    q.add(QueueEntry("log-0000000002", EntryType.MUTATE_PART, mutated_part(P("all_1_2_1"), 9), (P("all_1_2_1"),)))
    assert q.next_to_run(0) is m


def test_a_failed_task_backs_off_exponentially() -> None:
    q = ReplicationQueue()
    g = get(1, "all_1_1_0")
    q.add(g)
    for tries, at in ((1, 100), (2, 200), (3, 300)):
        q.started(g, at)
        q.finished(g, at, error="connection refused")
        assert g.num_tries == tries and g.last_exception == "connection refused"
        assert q.next_to_run(at + 2**tries - 1) is None and "backing off" in g.postpone_reason
        assert q.next_to_run(at + 2**tries) is g
    g.num_tries = 40
    assert q.postpone_reason(g, 300 + 59_999) is not None and q.postpone_reason(g, 300 + 60_000) is None


def test_a_finished_drop_range_removes_covered_parts_and_cancels_their_fetches() -> None:
    q = ReplicationQueue([P("all_1_1_0"), P("b_1_1_0")])
    g = get(2, "all_2_2_0")
    q.add(g)
    drop = QueueEntry("log-0000000003", EntryType.DROP_RANGE, drop_range("all", 3))
    q.add(drop)
    assert q.next_to_run(0) is drop
    assert q.postpone_reason(g, 0) == ("it produces part all_2_2_0, which is going to be dropped by "
                                       "all_0_2_999999999_999999999")
    q.started(drop, 0)
    assert q.finished(drop, 1) == [g]
    assert list(q.current) == [P("b_1_1_0")] and len(q) == 0


def test_alters_run_in_version_order_and_their_mutations_after_the_metadata() -> None:
    q = ReplicationQueue([P("all_1_1_0")])
    a2 = QueueEntry("log-0000000002", EntryType.ALTER_METADATA, alter_version=2)
    a1 = QueueEntry("log-0000000001", EntryType.ALTER_METADATA, alter_version=1)
    mut = QueueEntry("log-0000000003", EntryType.MUTATE_PART, mutated_part(P("all_1_1_0"), 5),
                     (P("all_1_1_0"),), alter_version=2)
    for e in (a2, a1, mut):
        q.add(e)
    assert q.postpone_reason(a2, 0) == "alter version 2 waits for alter version 1"
    assert q.postpone_reason(mut, 0) == "waits for the metadata of alter version 2"
    assert q.next_to_run(0) is a1
    q.started(a1, 0)
    q.finished(a1, 1)
    assert q.next_to_run(1) is a2
    q.started(a2, 1)
    q.finished(a2, 2)
    assert q.metadata_version == 2 and q.next_to_run(2) is mut


def test_the_view_has_clickhouse_columns() -> None:
    q = ReplicationQueue()
    q.add(merge(1, ["all_1_1_0", "all_2_2_0"]))
    (row,) = q.view(0)
    assert row["type"] == "MERGE_PARTS" and row["new_part_name"] == "all_1_2_1"
    assert row["parts_to_merge"] == ["all_1_1_0", "all_2_2_0"] and row["merge_type"] == "REGULAR"
    assert {"position", "node_name", "num_tries", "postpone_reason", "last_exception", "required_quorum",
            "is_currently_executing", "num_postponed", "create_time", "source_replica"} <= set(row)


def test_a_full_pool_is_not_walked_and_a_merge_finds_its_sources_by_lookup() -> None:
    """Thousands of queued fetches with the fetch pool full: a decision looks at the merges only, and
    the queue keeps its order and its counts through removals from the middle."""
    q = ReplicationQueue(fetch_pool_size=2)
    fetches = [get(i, f"all_{i}_{i}_0") for i in range(1, 3001)]
    for g in fetches:
        q.add(g)
    m = merge(5000, ["all_1_1_0", "all_2_2_0"])
    q.add(m)
    for _ in range(2):
        q.started(q.next_to_run(0), 0)
    assert q.next_to_run(1) is None and m.postpone_reason == "source part all_1_1_0 is not ready yet"
    assert all(g.num_postponed == 0 for g in fetches[2:])   # never walked
    q.finished(fetches[0], 2)
    q.finished(fetches[1], 2)
    assert [e.node_name for e in q.entries][:2] == [fetches[2].node_name, fetches[3].node_name]
    for g in fetches[2:4]:                                   # queue order: the next fetches first
        assert q.next_to_run(3) is g
        q.started(g, 3)
    assert q.next_to_run(3) is m                             # the fetch pool full again; the merge's sources here
    assert len(q) == len(q.entries) == 2999 and q.has(m) and not q.has(fetches[0])


def leader_log(rng: random.Random, steps: int) -> tuple[list[QueueEntry], ActivePartSet]:
    """A consistent part log as a leader writes it: inserts into two partitions, merges of adjacent
    active parts, mutations, and now and then a partition drop; and the part set it leads to."""
    active, log, blocks = ActivePartSet(), [], {"a": 0, "b": 0}
    for n in range(steps):
        pid = rng.choice("ab")
        kind = rng.random()
        parts = active.parts_of(pid)
        name = f"log-{n:010d}"
        if kind < 0.55 or len(parts) < 2:
            blocks[pid] += 1
            part = inserted_part(pid, blocks[pid])
            log.append(QueueEntry(name, EntryType.GET_PART, part))
        elif kind < 0.85:
            start = rng.randrange(len(parts) - 1)
            sources = tuple(parts[start:start + rng.randint(2, 4)])
            part = merged_part(sources)
            log.append(QueueEntry(name, EntryType.MERGE_PARTS, part, sources))
        elif kind < 0.95:
            blocks[pid] += 1
            source = rng.choice(parts)
            part = mutated_part(source, blocks[pid])
            log.append(QueueEntry(name, EntryType.MUTATE_PART, part, (source,)))
        else:
            blocks[pid] += 1
            dropped = drop_range(pid, blocks[pid])
            assert dropped is not None
            log.append(QueueEntry(name, EntryType.DROP_RANGE, dropped))
            active.remove_covered(dropped)
            continue
        active.add(part)
    return log, active


@settings(max_examples=150, deadline=None)
@given(st.integers(0, 2**32), st.integers(1, 60), st.integers(1, 4), st.integers(1, 3))
def test_a_replica_queue_always_drains_to_the_leaders_part_set(seed: int, steps: int, fetches: int,
                                                               merges: int) -> None:
    rng = random.Random(seed)
    log, expected = leader_log(rng, steps)
    q = ReplicationQueue(fetch_pool_size=fetches, merge_pool_size=merges)
    pending, running, now = list(log), [], 0
    for _ in range(20 * len(log) + 20):
        now += 1
        if pending and rng.random() < 0.5:
            q.add(pending.pop(0))                            # the log arrives in order, interleaved with work
        elif running and rng.random() < 0.5:
            entry = running.pop(rng.randrange(len(running)))
            if entry in q.entries:                           # not cancelled by a drop range meanwhile
                q.finished(entry, now)
        else:
            entry = q.next_to_run(now)
            if entry is not None and q.already_done(entry):
                q.started(entry, now)
                q.finished(entry, now)
            elif entry is not None:
                q.started(entry, now)
                running.append(entry)
            elif not running and not pending:
                break
        assert sum(q.running.values()) == sum(e.currently_executing for e in q.entries)
    assert not pending and not running and len(q) == 0, [e.view(0) for e in q.entries]
    assert list(q.current) == list(expected)
