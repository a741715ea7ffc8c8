"""The live page in a real browser: headless Chromium loads `/` from a member of a real 3-member set,
runs its script and the test reads the drawn DOM: three members and two sync edges, a chain P <- S1 <- S2
drawn as a chain, a paused member turning "unreachable". A screenshot of the chain is saved to
build/artifacts/page.png.

Chromium is Debian's `chromium` package (`.ci/run` installs it). Without it the test fails in CI
(`CI` set) and is skipped elsewhere with a message that says so.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.members import REPO_ROOT, Member, wait_for
from tests.support.replica_set import ReplicaSet, make_replica_set

MEMBER = re.compile(r'class="member [^"]*" data-name="([^"]+)" data-state="([^"]+)"')
EDGE = re.compile(r'class="sync-edge" data-from="([^"]+)" data-to="([^"]+)"')
PARTS_ROW = re.compile(r"<tr><td>app\.blocks</td><td>1</td>")
ARTIFACTS = Path(REPO_ROOT) / "build" / "artifacts"


def _chromium() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        message = "CHROMIUM IS MISSING: the page is not tested (install Debian's chromium package)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return found


def _browser(chromium: str, *args: str) -> str:
    done = subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                           "--virtual-time-budget=3000", *args],
                          capture_output=True, text=True, timeout=60)
    return done.stdout


def drawn(chromium: str, member: Member) -> tuple[dict[str, str], set[tuple[str, str]]]:
    """The members (name -> state shown) and sync edges (from, to) the page of `member` draws."""
    dom = _browser(chromium, "--dump-dom", f"http://127.0.0.1:{member.http_port}/")
    return dict(MEMBER.findall(dom)), set(EDGE.findall(dom))


@pytest.fixture(scope="module")
def rs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ReplicaSet]:
    replica_set = make_replica_set(str(tmp_path_factory.mktemp("page")), 3)
    replica_set.start()
    try:
        replica_set.initiate()
        yield replica_set
    finally:
        for m in replica_set.members:
            if m.process is not None and m.process.poll() is None:
                os.kill(m.process.pid, signal.SIGCONT)
        replica_set.stop()


def test_the_page_draws_the_set_its_chains_and_a_paused_member(rs: ReplicaSet) -> None:
    chromium = _chromium()
    primary = rs.wait_primary()
    s1, s2 = [m for m in rs.members if m is not primary]

    def three_members_two_edges() -> bool:
        members, edges = drawn(chromium, s1)  # a secondary's page shows the whole set too
        return sorted(members.values()) == ["PRIMARY", "SECONDARY", "SECONDARY"] and len(edges) == 2
    wait_for(three_members_two_edges, 30, "the page to draw three members and two sync edges")

    with rs.client() as client:  # a parts table gets a row of its own
        client.app.command({"createPartsTable": "blocks", "columns": [{"name": "k", "type": "string"}],
                            "orderBy": ["k"]})
        client.app.command({"insertBlock": "blocks", "rows": [{"k": "a"}, {"k": "b"}]})
    wait_for(lambda: PARTS_ROW.search(_browser(chromium, "--dump-dom", f"http://127.0.0.1:{s1.http_port}/"))
             is not None, 30, "the page to show the parts table with its part")

    with rs.direct(s1) as client:
        client.admin.command("replSetSyncFrom", primary.host)
    with rs.direct(s2) as client:
        client.admin.command("replSetSyncFrom", s1.host)
    chain = {(s2.host, s1.host), (s1.host, primary.host)}
    wait_for(lambda: drawn(chromium, primary)[1] == chain, 30, "the page to draw the chain P <- S1 <- S2")

    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    shot = ARTIFACTS / "page.png"
    shot.unlink(missing_ok=True)
    _browser(chromium, "--window-size=1280,640", f"--screenshot={shot}", f"http://127.0.0.1:{primary.http_port}/")
    assert shot.exists() and shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 10_000

    assert s2.process is not None
    os.kill(s2.process.pid, signal.SIGSTOP)
    try:
        wait_for(lambda: drawn(chromium, primary)[0].get(s2.host) == "unreachable", 30,
                 "the paused member to be drawn unreachable")
        members, _edges = drawn(chromium, s1)
        assert members[s2.host] == "unreachable" and members[primary.host] == "PRIMARY"
    finally:
        os.kill(s2.process.pid, signal.SIGCONT)
    # (Resumed, it may even win an election: its timers stood still while the others' term stayed.)
    wait_for(lambda: drawn(chromium, s1)[0].get(s2.host) in ("PRIMARY", "SECONDARY"), 60,
             "the resumed member to be drawn healthy again")
