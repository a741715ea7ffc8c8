"""The part-log simulator (tests/sim/parts.py) on seeds 0..99, and known bugs put back into the
product's part-log core, each failing seeds: a queue that never looks again at a merge waiting for a
source, and a fetch that never takes a covering part. The primary's log clean-up runs on every seed
(members restart mid-run and rebuild from what it left)."""

from __future__ import annotations

import pytest

import oplog.parts.queue
from oplog.parts import replica_rules
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

    monkeypatch.setattr(parts, "choose_source", no_covering)
    assert any(not parts.run_seed(seed).ok for seed in range(20))


def test_the_log_clean_up_removes_entries_on_the_seeds() -> None:
    sims = [parts.PartSim(seed, members=3 + seed % 3) for seed in range(10)]
    for sim in sims:
        assert sim.run().ok
    assert all(sim.removed for sim in sims)

