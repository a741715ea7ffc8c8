"""pymongo's own test suites (transactions, change streams: unified format; its test_cursor module:
capped collections, tailable, exhaust and raw-batch cursors; from the pymongo source distribution
matching the installed pymongo) against a real three-member set: no test fails that is not listed in
tests/spec/known_failures.txt. `make spec` runs every area (CRUD among them: a minute
of its own, left out of `make test`) and prints the table."""

from __future__ import annotations

import pytest

from tests.spec.runner import AREAS_BY_NAME, fixed, known_failures, regressions, run_area, suite_dir
from tests.support.replica_set import ReplicaSet

IN_MAKE_TEST = ("transactions", "change_streams", "cursor")  # (cursor: pymongo's own test_cursor module)


@pytest.mark.parametrize("area", IN_MAKE_TEST)
def test_pymongo_suite_has_no_failure_beyond_the_known_ones(rs: ReplicaSet, area: str) -> None:
    primary = rs.wait_primary()
    host, port = primary.host.rsplit(":", 1)
    outcome = run_area(AREAS_BY_NAME[area], suite_dir(), host, int(port))
    assert outcome.passed, f"no test of {area} passed: the suite did not run"
    known = known_failures()
    new = regressions([outcome], known)
    assert not new, "failures not in tests/spec/known_failures.txt:\n" + "\n".join(
        f"{test_id}: {message}" for test_id, message in sorted(new.items()))
    passing = fixed([outcome], known)
    if passing:
        print(f"{area}: listed as failing but passed (shorten the list): {passing}")
