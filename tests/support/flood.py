"""A hostile client for tests: many connections that each send half a message header and then nothing.

`start_flood(port, count, rate)` starts helper processes that together open `count` connections to
127.0.0.1:`port` at about `rate` a second, send the first 7 bytes of a header on each and hold them
all until `Flood.stop()`. One process holds at most its open-file limit of sockets: where the hard
limit may be raised (root with CAP_SYS_RESOURCE) one process holds them all, otherwise the count is
split across as many processes as the limit requires (`Flood.processes` says how many).

Run as a process (`python -m tests.support.flood PORT COUNT RATE`) it is one helper: it prints
`opened N` every 1,000 connections, `done N FAILED` at the end, then holds its sockets until its
standard input closes.
"""

from __future__ import annotations

import contextlib
import errno
import math
import resource
import select
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field

from tests.support.members import REPO_ROOT

HALF_HEADER = bytes([0x20, 0, 0, 0, 1, 0, 0])  # 7 of a header's 16 bytes: a 32-byte message, never sent
FD_MARGIN = 64  # descriptors a helper keeps for itself (stdio, epoll, the interpreter)
TICK_S = 0.005
CONNECT_WAIT_S = 15.0  # after the last connect is started, how long the unfinished ones may take


@dataclass
class Flood:
    processes: list[subprocess.Popen[str]]
    raised_fd_limit: bool  # one process could hold them all (the hard limit was raised)
    opened: list[int] = field(default_factory=list)  # per helper: connections open so far
    failed: list[int] = field(default_factory=list)  # per helper: connections that failed to open
    finished: list[threading.Event] = field(default_factory=list)

    @property
    def done(self) -> bool:
        return all(e.is_set() for e in self.finished)

    @property
    def open_count(self) -> int:
        return sum(self.opened)

    def wait(self, timeout_s: float) -> bool:
        """Whether every helper is done, waiting at most `timeout_s` for it."""
        deadline = time.monotonic() + timeout_s
        return all(event.wait(max(0.0, deadline - time.monotonic())) for event in self.finished)

    def stop(self) -> None:
        for p in self.processes:
            with contextlib.suppress(OSError):
                if p.stdin is not None:
                    p.stdin.close()
        for p in self.processes:
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(10)


def can_raise_fd_limit(to: int) -> bool:
    """Whether a child process may raise its open-file hard limit to `to`."""
    code = f"import resource; resource.setrlimit(resource.RLIMIT_NOFILE, ({to}, {to}))"
    return subprocess.run([sys.executable, "-c", code], capture_output=True).returncode == 0


def start_flood(port: int, count: int, rate: int) -> Flood:
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    raised = hard < count + FD_MARGIN and can_raise_fd_limit(count + FD_MARGIN)
    per_process = count if raised or hard >= count + FD_MARGIN else hard - FD_MARGIN
    helpers = math.ceil(count / per_process)
    shares = [count // helpers + (1 if i < count % helpers else 0) for i in range(helpers)]
    flood = Flood([], raised)
    for i, share in enumerate(shares):
        cmd = [sys.executable, "-m", "tests.support.flood", str(port), str(share), str(max(1, rate // helpers))]
        p = subprocess.Popen(cmd, cwd=REPO_ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        flood.processes.append(p)
        flood.opened.append(0)
        flood.failed.append(0)
        flood.finished.append(threading.Event())
        threading.Thread(target=_follow, args=(flood, i, p), daemon=True).start()
    return flood


def _follow(flood: Flood, i: int, p: subprocess.Popen[str]) -> None:
    assert p.stdout is not None
    for line in p.stdout:
        words = line.split()
        if words[:1] == ["opened"]:
            flood.opened[i] = int(words[1])
        elif words[:1] == ["done"]:
            flood.opened[i], flood.failed[i] = int(words[1]), int(words[2])
            flood.finished[i].set()
    flood.finished[i].set()  # (a helper that died is done too; `opened` says how far it got)


# -- the helper process ----------------------------------------------------------------------------
def _raise_own_limit(count: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = count + FD_MARGIN
    if soft >= want:
        return
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, max(want, hard)))
    except (ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def _open_one(port: int, poller: select.epoll, connecting: dict[int, socket.socket],
              held: list[socket.socket]) -> bool:
    s = socket.socket()
    s.setblocking(False)
    err = s.connect_ex(("127.0.0.1", port))
    if err == 0:
        s.send(HALF_HEADER)
        held.append(s)
    elif err == errno.EINPROGRESS:
        connecting[s.fileno()] = s
        poller.register(s.fileno(), select.EPOLLOUT)
    else:
        s.close()
        return False
    return True


def _connected(poller: select.epoll, connecting: dict[int, socket.socket], held: list[socket.socket],
               timeout_s: float) -> int:
    """Sends the half header on every connection whose connect finished; the number that failed."""
    failed = 0
    for fd, _events in poller.poll(timeout_s):
        poller.unregister(fd)
        s = connecting.pop(fd)
        if s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == 0:
            with contextlib.suppress(OSError):
                s.send(HALF_HEADER)
            held.append(s)
        else:
            s.close()
            failed += 1
    return failed


def main(port: int, count: int, rate: int) -> None:
    _raise_own_limit(count)
    poller = select.epoll()
    connecting: dict[int, socket.socket] = {}
    held: list[socket.socket] = []
    started, started_at, failed = 0, time.monotonic(), 0
    while started < count:
        due = min(count, int((time.monotonic() - started_at) * rate) + 1)
        while started < due:
            started += 1
            failed += 0 if _open_one(port, poller, connecting, held) else 1
            if started % 1000 == 0:
                print(f"opened {started}", flush=True)
        failed += _connected(poller, connecting, held, TICK_S)
    give_up = time.monotonic() + CONNECT_WAIT_S
    while connecting and time.monotonic() < give_up:
        failed += _connected(poller, connecting, held, TICK_S)
    failed += len(connecting)  # (SYNs dropped again and again: a full accept queue)
    print(f"done {len(held)} {failed}", flush=True)
    sys.stdin.read()
    for s in held:
        s.close()


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]))
