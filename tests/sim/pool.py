"""Seeds in several processes: `in_processes(fn, work, jobs)` is `[fn(w) for w in work]`, spread over
`jobs` forked processes (in this one when `jobs` is 1), with the results in the order of `work`. Both
simulators' sweeps use it (`tests.sim.runner.run_seeds`, `tests.sim.parts.run_seeds`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")
R = TypeVar("R")


def in_processes(fn: Callable[[T], R], work: list[T], jobs: int) -> list[R]:
    if jobs <= 1 or len(work) < 2:
        return [fn(w) for w in work]
    import multiprocessing

    with multiprocessing.get_context("fork").Pool(jobs) as pool:
        return pool.map(fn, work, chunksize=max(1, len(work) // (jobs * 8)))
