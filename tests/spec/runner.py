"""Runs pymongo's own test suites (unified format and spec JSON) against a real 3-member set.

The suites come from the pymongo source distribution matching the installed pymongo (it ships
`test/` with the unified runner and the spec JSON). They run with pytest in a child process,
pointed at the set through `DB_IP` / `DB_PORT`, as pymongo's own CI points them at a mongod.
Each test's outcome is read from the JUnit XML file pytest writes.

`KNOWN_FAILURES` (known_failures.txt) lists the tests that fail today, each under its area. A
run is clean when no other test fails: a new failure is a regression, a listed test that passes
is reported so the list can shrink.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
import tempfile
import xml.etree.ElementTree as ET
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import pymongo
from tenacity import retry, stop_after_attempt, wait_exponential

REPO_ROOT = Path(__file__).resolve().parents[2]
CACHE_DIR = REPO_ROOT / "build" / "spec"
KNOWN_FAILURES = Path(__file__).with_name("known_failures.txt")


@dataclass(frozen=True, slots=True)
class Area:
    name: str
    module: str  # a file under the suite's test/ directory
    select: str = ""  # a pytest -k expression, for modules that mix prose tests with spec tests
    kind: str = "spec"  # "spec": the drivers' spec areas; "module": pymongo's own test modules
    test_limit_s: int = 20  # one test's time limit (SPEC_TEST_TIMEOUT_S in the child)


AREAS = (
    Area("crud", "test_crud_unified.py"),
    Area("transactions", "test_transactions_unified.py"),
    Area("change_streams", "test_change_stream.py", "Unified"),
    Area("sessions", "test_sessions_unified.py"),
    Area("causal_consistency", "test_causal_consistency.py"),
    Area("retryable_reads", "test_retryable_reads_unified.py"),
    Area("retryable_writes", "test_retryable_writes_unified.py"),
    Area("read_write_concern", "test_read_write_concern_spec.py"),
    Area("command_monitoring", "test_command_monitoring.py"),
    Area("collection_management", "test_collection_management.py"),
    Area("cursor", "test_cursor.py", kind="module"),
    Area("collection", "test_collection.py", kind="module"),
    Area("bulk", "test_bulk.py", kind="module"),
    Area("database", "test_database.py", kind="module"),
    Area("session", "test_session.py", kind="module"),
    Area("retryable_writes_module", "test_retryable_writes.py", kind="module", test_limit_s=90),
    # (two of its tests wait each time for the driver to find the primary again after ShutdownInProgress:
    # an awaitable hello's 10 s; as test_retryable_writes' error-propagation tests do)
    Area("retryable_reads_module", "test_retryable_reads.py", kind="module", test_limit_s=60),
    Area("change_stream_module", "test_change_stream.py", "not Unified", kind="module"),
)
AREAS_BY_NAME = {area.name: area for area in AREAS}


@dataclass(slots=True)
class Outcome:
    """One area's results: test ids by outcome, and the reasons tests were skipped."""

    area: str
    passed: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)  # test id -> first line of the failure
    skipped: dict[str, str] = field(default_factory=dict)  # test id -> reason

    @property
    def ran(self) -> int:
        return len(self.passed) + len(self.failed)


@retry(stop=stop_after_attempt(4), wait=wait_exponential(multiplier=2, max=30), reraise=True)
def _download(version: str, into: Path) -> Path:
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-binary", ":all:", "--no-deps",
                    f"pymongo=={version}", "-d", str(into)], check=True)
    found = sorted(into.glob(f"pymongo-{version}.tar.gz"))
    if not found:
        raise FileNotFoundError(f"pip left no pymongo-{version}.tar.gz in {into}")
    return found[0]


def suite_dir(version: str = pymongo.__version__) -> Path:
    """The suite's root (holding `test/`), downloaded and unpacked once into build/spec."""
    root = CACHE_DIR / f"pymongo-{version}"
    if (root / "test" / "unified_format.py").exists():
        return root
    CACHE_DIR.mkdir(parents=True, exist_ok=True)
    archive = _download(version, CACHE_DIR)
    prefix = f"pymongo-{version}/test/"
    with tarfile.open(archive) as tar:
        members = [m for m in tar.getmembers() if m.name.startswith(prefix)]
        tar.extractall(CACHE_DIR, members=members, filter="data")
    return root


def known_failures() -> dict[str, set[str]]:
    """Area -> test ids listed in known_failures.txt (`area test-id` per line, # comments)."""
    known: dict[str, set[str]] = {}
    for line in KNOWN_FAILURES.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            area, test_id = line.split(None, 1)
            known.setdefault(area, set()).add(test_id)
    return known


def _test_id(case: ET.Element) -> str:
    return f"{case.get('classname', '').rsplit('.', 1)[-1]}::{case.get('name', '')}"


def parse_junit(area: str, path: Path) -> Outcome:
    outcome = Outcome(area)
    for case in ET.parse(path).iter("testcase"):
        test_id = _test_id(case)
        bad = case.find("failure")
        if bad is None:
            bad = case.find("error")
        skip = case.find("skipped")
        if bad is not None:
            outcome.failed[test_id] = (bad.get("message") or "").splitlines()[0][:300] if bad.get("message") else ""
        elif skip is not None:
            outcome.skipped[test_id] = skip.get("message") or ""
        else:
            outcome.passed.append(test_id)
    return outcome


def run_area(area: Area, suite: Path, host: str, port: int, timeout_s: float = 1800) -> Outcome:
    """Runs one area's tests in a child pytest against the set at host:port."""
    with tempfile.TemporaryDirectory(prefix="spec-") as scratch:
        junit = Path(scratch) / "junit.xml"
        args = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", f"test/{area.module}",
                "-o", "addopts=", "-o", "xfail_strict=true", f"--junitxml={junit}",
                "-o", "junit_family=xunit2", "--rootdir", str(suite), "-p", "tests.spec.time_limit"]
        if area.select:
            args += ["-k", area.select]
        env = {**os.environ, "DB_IP": host, "DB_PORT": str(port), "SPEC_TEST_TIMEOUT_S": str(area.test_limit_s)}
        env["PYTHONPATH"] = str(REPO_ROOT)  # for the time_limit plugin
        subprocess.run(args, cwd=suite, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                       timeout=timeout_s, check=False)
        if not junit.exists():
            raise RuntimeError(f"the {area.name} suite wrote no results (pytest could not start)")
        return parse_junit(area.name, junit)


def regressions(outcomes: Iterable[Outcome], known: dict[str, set[str]]) -> dict[str, str]:
    """Failed tests not listed as known failures: test id -> message."""
    return {f"{o.area} {test_id}": message for o in outcomes for test_id, message in o.failed.items()
            if test_id not in known.get(o.area, set())}


def fixed(outcomes: Iterable[Outcome], known: dict[str, set[str]]) -> list[str]:
    """Listed known failures that passed this time."""
    return sorted(f"{o.area} {test_id}" for o in outcomes for test_id in o.passed
                  if test_id in known.get(o.area, set()))
