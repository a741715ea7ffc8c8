"""Long runs, behind `make soak`: 10,000 simulator seeds beyond the ones `make test` runs.

`SIM_SOAK_SEEDS` and `SIM_SOAK_START` change the range (the same seeds replay
identically: `python -m tests.sim --seed S`).
"""

from __future__ import annotations

import os
import time

import pytest

from tests.sim.runner import run_seeds
from tests.sim.test_seeds import CI_SEEDS

pytestmark = pytest.mark.soak

SEEDS = int(os.environ.get("SIM_SOAK_SEEDS", "10000"))
START = int(os.environ.get("SIM_SOAK_START", str(CI_SEEDS.stop)))
CHUNK = 200


def test_ten_thousand_seeds() -> None:
    started = time.monotonic()
    failed = []
    for first in range(START, START + SEEDS, CHUNK):
        seeds = list(range(first, min(first + CHUNK, START + SEEDS)))
        failed += [r for r in run_seeds(seeds, jobs=min(2, os.cpu_count() or 1)) if r.failures]
    print(f"\n{SEEDS} seeds from {START}: {len(failed)} failures in {time.monotonic() - started:.0f} s")
    assert not failed, "\n".join(f"seed {r.seed}: {r.failures[0]} -- replay: python -m tests.sim --seed {r.seed}"
                                 for r in failed[:20])


def test_part_log_seeds() -> None:
    """10,000 part-log simulator seeds beyond the 100 of `make test` (`python -m tests.sim.parts --seed S`;
    `PART_SOAK_SEEDS` changes how many)."""
    from tests.sim.parts import run_seed

    count = int(os.environ.get("PART_SOAK_SEEDS", "10000"))
    started = time.monotonic()
    failed = [r for r in map(run_seed, range(100, 100 + count)) if not r.ok]
    print(f"\n{count} part-log seeds from 100: {len(failed)} failures in {time.monotonic() - started:.0f} s")
    assert not failed, failed[0].report
