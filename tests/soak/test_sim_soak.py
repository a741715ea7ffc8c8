"""Long runs, behind `make soak`: 10,000 fresh seeds of each simulator, beyond the fixed ones of `make test`.

Each sweep starts at a random base, printed first, so every soak explores seeds no run has seen;
`SIM_SOAK_START` / `PART_SOAK_START` run a sweep's range again, `SIM_SOAK_SEEDS` / `PART_SOAK_SEEDS` change
how many seeds it runs. Every failing seed is printed with the command that replays it
(`python -m tests.sim --seed S`, `python -m tests.sim.parts --seed S`) as it is found, and all of them
are listed again in the assertion.
"""

from __future__ import annotations

import os
import random
import time
from collections.abc import Callable

import pytest

from tests.sim import parts
from tests.sim.__main__ import replay_command
from tests.sim.runner import run_seeds

pytestmark = pytest.mark.soak

FRESH_BASES = range(1_000_000, 1_000_000_000)   # far beyond the seeds make test runs (0..199, 0..99, regressions)
CHUNK = 200
JOBS = min(2, os.cpu_count() or 1)
Failures = Callable[[list[int]], list[tuple[int, str]]]   # seeds -> (seed, first violation) of those that failed


def _start(variable: str) -> int:
    given = os.environ.get(variable)
    return int(given) if given else random.SystemRandom().choice(FRESH_BASES)


def _soak(what: str, variable: str, count: int, replay: Callable[[int], str], failures_of: Failures) -> None:
    start = _start(variable)
    print(f"\n{what}: {count} seeds from {start} ({variable}={start} runs them again)", flush=True)
    started, failed = time.monotonic(), []
    for first in range(start, start + count, CHUNK):
        for seed, why in failures_of(list(range(first, min(first + CHUNK, start + count)))):
            failed.append(f"seed {seed} FAILED: {why} -- replay: {replay(seed)}")
            print(failed[-1], flush=True)
    print(f"{what}: {count} seeds from {start}, {len(failed)} failures in {time.monotonic() - started:.0f} s")
    assert not failed, "\n".join(failed)


def test_ten_thousand_fresh_seeds() -> None:
    _soak("simulator", "SIM_SOAK_START", int(os.environ.get("SIM_SOAK_SEEDS", "10000")),
          lambda seed: replay_command(seed, []),
          lambda seeds: [(r.seed, r.failures[0]) for r in run_seeds(seeds, jobs=JOBS) if r.failures])


def test_ten_thousand_fresh_part_log_seeds() -> None:
    _soak("part-log simulator", "PART_SOAK_START", int(os.environ.get("PART_SOAK_SEEDS", "10000")),
          parts.replay_command,
          lambda seeds: [(r.seed, r.reason) for r in parts.run_seeds(seeds, jobs=JOBS) if not r.ok])
