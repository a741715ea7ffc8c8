"""Start and stop real member processes on loopback for integration tests."""

from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from pymongo import MongoClient

from replset.cli import wait_until

T = TypeVar("T")
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


_HANDED_OUT: set[int] = set()
# Ports for members come from below the kernel's ephemeral range (32768-60999 on Linux): a port picked
# there may be taken as the local port of some outgoing connection before the member binds it. Each
# pytest-xdist worker takes its own slice, so two workers never hand out the same port.
PORTS_FROM, PORTS_TO = 12000, 32000


def _port_slice() -> range:
    worker, count = os.environ.get("PYTEST_XDIST_WORKER", ""), os.environ.get("PYTEST_XDIST_WORKER_COUNT", "")
    if not worker.startswith("gw") or not count.isdigit():
        return range(PORTS_FROM, PORTS_TO)
    width = (PORTS_TO - PORTS_FROM) // int(count)
    start = PORTS_FROM + int(worker[2:]) * width
    return range(start, start + width)


def free_port() -> int:
    """A port nothing listens on now, in this worker's slice, and never one this process handed out
    before (two members, a wire port and another's HTTP port, given the same one would answer each
    other's clients)."""
    ports = _port_slice()
    offset = random.randrange(len(ports))
    for i in range(len(ports)):
        port = ports[(offset + i) % len(ports)]
        if port in _HANDED_OUT:
            continue
        with socket.socket() as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)   # as the member will bind it
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        _HANDED_OUT.add(port)
        return port
    raise RuntimeError(f"no free port left in {ports}")


# Deadlines tell "hung" from "slow": every wait of the real-process tests is for a condition, and its
# deadline is the time the condition takes on a quiet machine with room for a loaded one (a CI machine
# shared with other jobs, one core kept busy by `make test-loaded`) - this factor times the one a test
# names. A condition met returns at once, so the factor costs time only when something truly hangs.
PATIENCE = float(os.environ.get("REPLSET_TEST_PATIENCE", "3"))


def wait_for(predicate: Callable[[], T], timeout_s: float = 20.0, what: str = "condition",
             interval_s: float = 0.02) -> T:
    """`replset.cli.wait_until` with the deadline times `PATIENCE`; a timeout says what the condition
    returned last, and its last error."""
    seen: list[object] = []

    def noted() -> T:
        result = predicate()
        seen[:] = [result]
        return result

    try:
        return wait_until(noted, timeout_s * PATIENCE, what, interval_s)
    except TimeoutError as exc:
        last = f"; it returned {seen[0]!r} last" if seen else ""
        raise TimeoutError(f"{exc} after {timeout_s * PATIENCE:.0f} s{last}") from None


def rss_kb(pid: int) -> int:
    """The resident memory of process `pid` (its VmRSS), in KiB."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError("no VmRSS")


@dataclass
class Member:
    dbpath: str
    port: int = field(default_factory=free_port)
    http_port: int = field(default_factory=free_port)
    repl_set: str = "rs0"
    extra_args: list[str] = field(default_factory=list)
    client_kwargs: dict[str, Any] = field(default_factory=dict)  # what a client needs (TLS, a login)
    process: subprocess.Popen[bytes] | None = None
    log_path: str = ""

    @property
    def host(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def uri(self) -> str:
        return f"mongodb://{self.host}/?replicaSet={self.repl_set}"

    def start(self) -> None:
        self.launch()
        self.wait_listening()

    def launch(self) -> None:
        """Starts the process without waiting for it (`wait_listening` waits): a set's members start at once."""
        os.makedirs(self.dbpath, exist_ok=True)
        self.log_path = os.path.join(self.dbpath, "member.log")
        log = open(self.log_path, "ab")
        cmd = [sys.executable, "-m", "replset", "node", "--port", str(self.port), "--replSet", self.repl_set,
               "--dbpath", self.dbpath, "--httpPort", str(self.http_port), *self.extra_args]
        self.process = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=REPO_ROOT)
        log.close()

    def wait_listening(self) -> None:
        wait_for(self._ping, 30, f"member {self.host} to accept connections")

    def direct_client(self, **kwargs: Any) -> MongoClient[dict[str, Any]]:
        kwargs.setdefault("serverSelectionTimeoutMS", 5000)
        return MongoClient(f"mongodb://{self.host}/?directConnection=true", **{**self.client_kwargs, **kwargs})

    def _ping(self) -> bool:
        if self.process is not None and self.process.poll() is not None:
            raise RuntimeError(f"member exited with {self.process.returncode}: {self.read_log()[-2000:]}")
        with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
            return True

    def initiate(self) -> None:
        with self.direct_client() as client:
            client.admin.command("replSetInitiate", {"_id": self.repl_set,
                                                     "members": [{"_id": 0, "host": self.host}]})
        self.wait_primary()

    def wait_primary(self) -> None:
        def is_primary() -> bool:
            with self.direct_client() as client:
                return bool(client.admin.command("hello").get("isWritablePrimary"))

        wait_for(is_primary, 30, f"{self.host} to become primary")

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(10)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)

    def read_log(self) -> str:
        try:
            with open(self.log_path, encoding="utf-8", errors="replace") as f:
                return f.read()
        except OSError:
            return ""
