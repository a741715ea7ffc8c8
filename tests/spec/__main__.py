"""`python -m tests.spec [AREA ...]`: pymongo's own test suites against a fresh 3-member set.

Prints passed / failed / skipped per area, then the failures that are not in known_failures.txt
(exit status 1 if there are any) and the listed ones that now pass. `--update-known` rewrites the
list from this run's failures (for the areas run). `--verbose` prints every failure's message.
"""

from __future__ import annotations

import argparse
import socket
import sys
import tempfile
from collections import Counter

from rich.console import Console
from rich.table import Table

from tests.spec.runner import (
    AREAS,
    AREAS_BY_NAME,
    KNOWN_FAILURES,
    Outcome,
    fixed,
    known_failures,
    regressions,
    run_area,
    suite_dir,
)
from tests.support.replica_set import make_replica_set

DEFAULT_PORT = 27017


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _table(outcomes: list[Outcome]) -> Table:
    table = Table(title="pymongo's test suites against a 3-member set")
    for column in ("area", "passed", "failed", "skipped", "passed of ran"):
        table.add_column(column, justify="left" if column == "area" else "right")
    for o in outcomes:
        share = f"{100 * len(o.passed) / o.ran:.1f} %" if o.ran else "-"
        table.add_row(o.area, str(len(o.passed)), str(len(o.failed)), str(len(o.skipped)), share)
    kinds = {area.name: area.kind for area in AREAS}
    totals = [("spec areas", [o for o in outcomes if kinds.get(o.area) == "spec"]),
              ("pymongo's modules", [o for o in outcomes if kinds.get(o.area) == "module"]),
              ("all", outcomes)]
    for label, group in totals:
        if not group:
            continue
        passed = sum(len(o.passed) for o in group)
        ran = sum(o.ran for o in group)
        table.add_row(label, str(passed), str(ran - passed), str(sum(len(o.skipped) for o in group)),
                      f"{100 * passed / ran:.1f} %" if ran else "-", style="bold")
    return table


def _write_known(outcomes: list[Outcome]) -> None:
    ran = {o.area for o in outcomes}
    kept = {area: ids for area, ids in known_failures().items() if area not in ran}
    lines = ["# pymongo suite tests that fail against this server today: `area test-id` per line.",
             "# `python -m tests.spec --update-known` rewrites it; a test that starts to fail and is not",
             "# here fails `make test`."]
    for area in [a.name for a in AREAS]:
        ids = sorted(kept.get(area, set())) if area not in ran else sorted(
            next(o for o in outcomes if o.area == area).failed)
        lines += [f"{area} {test_id}" for test_id in ids]
    KNOWN_FAILURES.write_text("\n".join(lines) + "\n")


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.spec")
    parser.add_argument("areas", nargs="*", metavar="AREA", help=", ".join(a.name for a in AREAS))
    parser.add_argument("--update-known", action="store_true")
    parser.add_argument("--verbose", action="store_true")
    args = parser.parse_args()
    unknown = [name for name in args.areas if name not in AREAS_BY_NAME]
    if unknown:
        parser.error(f"unknown area {', '.join(unknown)}; areas: {', '.join(AREAS_BY_NAME)}")
    areas = [AREAS_BY_NAME[name] for name in args.areas] or list(AREAS)
    console = Console()
    suite = suite_dir()
    outcomes: list[Outcome] = []
    with tempfile.TemporaryDirectory(prefix="spec-set-") as base:
        rs = make_replica_set(base, 3)
        if _port_free(DEFAULT_PORT):
            # A few of pymongo's own tests connect to localhost:27017 whatever DB_PORT says (as its CI
            # runs a mongod there): the first member takes that port when nothing else has it.
            rs.members[0].port = DEFAULT_PORT
        try:
            rs.start()
            rs.initiate()
            host, port = rs.members[0].host.rsplit(":", 1)
            for area in areas:
                with console.status(f"running {area.name}"):
                    outcomes.append(run_area(area, suite, host, int(port)))
                o = outcomes[-1]
                console.print(f"{area.name}: {len(o.passed)} passed, {len(o.failed)} failed, "
                              f"{len(o.skipped)} skipped")
        finally:
            rs.stop()
    console.print(_table(outcomes))
    reasons = Counter(reason.split("\n", 1)[0][:100] for o in outcomes for reason in o.skipped.values())
    for reason, count in reasons.most_common(8):
        console.print(f"  skipped {count:4d}: {reason}")
    if args.verbose:
        for o in outcomes:
            for test_id, message in sorted(o.failed.items()):
                console.print(f"[red]{o.area} {test_id}[/red]: {message}", markup=True, highlight=False)
    if args.update_known:
        _write_known(outcomes)
        console.print(f"rewrote {KNOWN_FAILURES}")
        return 0
    known = known_failures()
    new = regressions(outcomes, known)
    for test_id, message in sorted(new.items()):
        console.print(f"NEW FAILURE {test_id}: {message}", highlight=False)
    for test_id in fixed(outcomes, known):
        console.print(f"now passes (remove from the list): {test_id}", highlight=False)
    return 1 if new else 0


if __name__ == "__main__":
    sys.exit(main())
