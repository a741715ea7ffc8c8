"""`python -m tests.sim --seeds N [--start S]`: run seeds S..S+N-1 of the simulator.

Prints one line per failing seed, with the command that replays it, then
`N seeds, F failures`; exits 1 if F > 0. `--seed S` replays one seed with its
event log. `--mutate NAME` re-introduces a known bug into the product's code
(`tests.sim.mutations`).
"""

from __future__ import annotations

import argparse
import sys
import time

from tests.sim.mutations import MUTATIONS
from tests.sim.runner import run_seed, run_seeds


def replay_command(seed: int, bugs: list[str]) -> str:
    flags = "".join(f" --mutate {b}" for b in bugs)
    return f"python -m tests.sim --seed {seed}{flags}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.sim", description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, default=None, help="how many seeds to run")
    parser.add_argument("--start", type=int, default=0, help="the first seed (default 0)")
    parser.add_argument("--seed", type=int, default=None, help="replay one seed with its event log")
    parser.add_argument("--mutate", action="append", default=[], choices=sorted(MUTATIONS),
                        help="re-introduce a known bug")
    parser.add_argument("--quiet", action="store_true", help="with --seed: no event log")
    parser.add_argument("--jobs", type=int, default=1, help="run seeds in this many processes")
    args = parser.parse_args(argv)
    bugs = frozenset(args.mutate)
    if args.seed is not None:
        result = run_seed(args.seed, bugs=bugs, verbose=not args.quiet)
        print("\n".join(result.trace))
        if not args.quiet:
            for member, log in sorted(result.final_logs.items()):
                print(f"m{member} final oplog: " + " ".join(log))
        print(result.description)
        print(" ".join(f"{k}={v}" for k, v in result.stats.items()))
        for failure in result.failures:
            print(f"FAIL {failure}")
        print(f"1 seeds, {1 if result.failures else 0} failures")
        return 1 if result.failures else 0
    if args.seeds is None or args.seeds < 0:
        parser.error("give --seeds N (N >= 0) or --seed S")
    failed = 0
    started = time.monotonic()
    seeds = list(range(args.start, args.start + args.seeds))
    chunk = max(1, args.jobs) * 16
    for i in range(0, len(seeds), chunk):  # chunks: failures print as they are found
        for result in run_seeds(seeds[i:i + chunk], bugs=bugs, jobs=args.jobs):
            if result.failures:
                failed += 1
                print(f"seed {result.seed} FAILED: {result.failures[0]} ({len(result.failures)} violations) "
                      f"-- replay: {replay_command(result.seed, args.mutate)}", flush=True)
    print(f"{args.seeds} seeds, {failed} failures", flush=True)
    print(f"({time.monotonic() - started:.1f} s)", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
