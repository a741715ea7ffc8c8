"""`replset up` run by tests: free port ranges for a whole set, the output of a child read on a
thread, and process checks."""

from __future__ import annotations

import contextlib
import os
import random
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from typing import Any

from tests.support.members import REPO_ROOT, wait_for


def port_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_base_port(n: int) -> int:
    """A base port P where P..P+n-1 and their HTTP ports P+1000.. are free (below the ephemeral range,
    away from 27017/28017)."""
    rng = random.Random()
    for _ in range(200):
        base = rng.randrange(20000, 26000)
        if all(port_free(p) and port_free(p + 1000) for p in range(base, base + n)):
            return base
    raise RuntimeError("no free port range found")


def listening(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


class Output:
    """Collects a child's stdout lines on a thread, so the test can wait on them with a deadline."""

    def __init__(self, stream: Any) -> None:
        self.lines: list[str] = []
        self._thread = threading.Thread(target=self._read, args=(stream,), daemon=True)
        self._thread.start()

    def _read(self, stream: Any) -> None:
        for line in stream:
            self.lines.append(line.rstrip("\n"))

    def join(self, timeout_s: float) -> None:
        self._thread.join(timeout_s)

    def has(self, text: str) -> bool:
        return any(text in line for line in self.lines)

    def __str__(self) -> str:
        return "\n".join(self.lines)


@contextlib.contextmanager
def running_up(directory: str, nodes: int = 3, extra_args: tuple[str, ...] = ()) -> Iterator[tuple[list[int], Output]]:
    """`replset up` on free ports until the block ends (then SIGINT, and SIGKILL to its whole process
    group for anything left): the members' ports, and its output."""
    base = free_base_port(nodes)
    up = subprocess.Popen(
        [sys.executable, "-m", "replset", "up", "--nodes", str(nodes), "--port", str(base), "--dir", directory,
         *extra_args],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=REPO_ROOT,
        start_new_session=True)  # its own process group, which the members share
    out = Output(up.stdout)
    try:
        wait_for(lambda: out.has("connection string") or up.poll() is not None, 90, "`up` to report the set")
        assert up.poll() is None, f"`up` exited early:\n{out}"
        yield [base + i for i in range(nodes)], out
    finally:
        up.send_signal(signal.SIGINT)
        try:
            up.wait(30)
        except subprocess.TimeoutExpired:
            pass
        with contextlib.suppress(ProcessLookupError):
            os.killpg(up.pid, signal.SIGKILL)
        up.wait(10)
        out.join(10)
        if up.stdout is not None:
            up.stdout.close()
