"""The part-log simulator (tests/sim/parts.py) on seeds 0..99, and known bugs put back into the
product's part-log core (`oplog.parts.table_replica`, the queue, the fetch-source rule), each failing
seeds: a queue that never looks again at a merge waiting for a source; a fetch that never takes a
covering part; a merge that reads its sources unchecked (the defect that made a damaged part every
member's "byte-identical" merged copy); a damaged part set aside and never fetched again; a check
schedule that never runs. The primary's log clean-up runs on every seed (members restart mid-run
and rebuild from what it left), and a bit flips in a stored part on about half of them."""

from __future__ import annotations

import pytest

import oplog.parts.queue
from oplog.parts import replica_rules, table_replica
from oplog.parts.table_replica import Run, TableReplica
from tests.sim import parts


def test_seeds_converge() -> None:
    failed = [r for r in map(parts.run_seed, range(100)) if not r.ok]
    assert not failed, failed[0].report


def test_a_waiting_merge_never_looked_at_again_fails_seeds(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(oplog.parts.queue.ReplicationQueue, "_unblock_within", lambda self, part: None)
    assert any(not parts.run_seed(seed).ok for seed in range(20))


def test_a_fetch_that_never_takes_a_covering_part_fails_seeds(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_covering(part, exact, covering, **kwargs):  # type: ignore[no-untyped-def]
        return replica_rules.choose_source(part, exact, [], **kwargs)

    monkeypatch.setattr(table_replica, "choose_source", no_covering)
    assert any(not parts.run_seed(seed).ok for seed in range(20))


def test_a_merge_of_unchecked_sources_fails_seeds(monkeypatch: pytest.MonkeyPatch) -> None:
    schedule = TableReplica.schedule

    def unchecked(self: TableReplica, now_ms: int) -> None:
        schedule(self, now_ms)
        self.actions = [Run(a.entry, a.how) if isinstance(a, Run) else a for a in self.actions]

    monkeypatch.setattr(TableReplica, "schedule", unchecked)
    failed = [r for r in map(parts.run_seed, range(40)) if not r.ok]
    assert any("damaged, into" in r.report for r in failed), [r.report for r in failed[:1]]


def test_a_damaged_part_never_fetched_again_fails_seeds(monkeypatch: pytest.MonkeyPatch) -> None:
    def forgetful(self: TableReplica, name: str, now_ms: int) -> None:
        self.broken.discard(name)
        self.refetch.pop(name, None)

    monkeypatch.setattr(TableReplica, "set_aside_done", forgetful)
    assert any(not parts.run_seed(seed).ok for seed in range(40))


def test_a_check_schedule_that_never_runs_fails_seeds(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(TableReplica, "check_due", lambda self, now_ms: None)
    assert any(not parts.run_seed(seed).ok for seed in range(40))


def test_bits_flip_on_the_seeds_and_damaged_parts_are_fetched_again() -> None:
    """Liveness of the damage path, not only safety: the seeds do damage parts, and members do set them
    aside and fetch them again (a core that quietly stopped doing so would still be "safe")."""
    sims = [parts.PartSim(seed, members=3 + seed % 3) for seed in range(20)]
    assert all(sim.run().ok for sim in sims)
    assert sum(any(" damage " in e for e in sim.events) for sim in sims) >= 5
    assert sum(sim.refetched for sim in sims) >= 5


def test_the_log_clean_up_removes_entries_on_the_seeds() -> None:
    sims = [parts.PartSim(seed, members=3 + seed % 3) for seed in range(10)]
    for sim in sims:
        assert sim.run().ok
    assert all(sim.removed for sim in sims)

