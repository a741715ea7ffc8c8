"""The Python peer, measured on the same machine: pysyncobj, three nodes, one process each.

Each node runs `Counter`, a replicated counter (`@replicated incr`). The node that is leader once the
set has one measures, on itself:

* **sync commit**: `incr(sync=True)` one after another (returns once a majority logged it and the
  leader applied it): rate and p50;
* **1000 outstanding**: `incr(callback=...)` with 1000 calls in flight at all times: rate.

Both are measured on two sets, one with pysyncobj's default batching of appendEntries (once per
tick: the best throughput) and one sending each command at once (`appendEntriesUseBatch=False`, woken
through its pipe notifier: the best latency); each figure is the better of the two.

pysyncobj keeps its log in memory and does not fsync; this set's w:"majority" is journaled on a
majority. The comparison is of CPU per write and round trips, which is what bench.replset's ratios
stand for.

    python -m bench.peer_pysyncobj [--seconds S]        # the three nodes, the figures as one JSON line
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass

from pysyncobj import SyncObj, SyncObjConf, SyncObjException, replicated

from tests.support.members import free_port

LEADER_TIMEOUT_S = 30.0
OUTSTANDING = 1000
WARM_UP_CALLS = 500
CALL_TIMEOUT_S = 5.0
ATTEMPTS = 3   # a set that lost its leader or a port on a loaded machine is started again


class Counter(SyncObj):  # type: ignore[misc]
    def __init__(self, me: str, partners: list[str], *, batch: bool) -> None:
        # Election timeouts above pysyncobj's defaults (0.4-1.4 s): a loaded machine must not make the leader
        # change during a measurement. Steady-state commits do not depend on them.
        super().__init__(me, partners, conf=SyncObjConf(dynamicMembershipChange=False, appendEntriesUseBatch=batch,
                                                         raftMinTimeout=1.0, raftMaxTimeout=2.0))
        self._count = 0

    @replicated  # type: ignore[misc]
    def incr(self) -> int:
        self._count += 1
        return self._count


@dataclass
class PeerFigures:
    sync_rate: float
    sync_p50_ms: float
    outstanding_rate: float


def _sync_commits(counter: Counter, seconds: float) -> tuple[float, float]:
    latencies = []
    end = time.perf_counter() + seconds
    while (started := time.perf_counter()) < end:
        try:
            counter.incr(sync=True, timeout=CALL_TIMEOUT_S)
        except SyncObjException:
            continue   # not committed (a leader change): not counted
        latencies.append(time.perf_counter() - started)
    if not latencies:
        raise SyncObjException("no sync commit succeeded")
    return len(latencies) / seconds, statistics.median(latencies) * 1000


def _outstanding(counter: Counter, seconds: float) -> float:
    slots = threading.Semaphore(OUTSTANDING)
    done = [0]

    def committed(_result: object, error: object) -> None:
        if error is None or error == 0:   # FAIL_REASON.SUCCESS
            done[0] += 1
        slots.release()

    end = time.perf_counter() + seconds
    started = time.perf_counter()
    while time.perf_counter() < end:
        slots.acquire()
        counter.incr(callback=committed)
    for _ in range(OUTSTANDING):   # the calls still in flight end
        slots.acquire()
    return done[0] / (time.perf_counter() - started)


def _node(index: int, ports: list[int], seconds: float, batch: bool) -> None:
    addresses = [f"127.0.0.1:{port}" for port in ports]
    counter = Counter(addresses[index], [a for i, a in enumerate(addresses) if i != index], batch=batch)
    deadline = time.monotonic() + LEADER_TIMEOUT_S
    while counter._getLeader() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    if not counter._isLeader():
        signal.pause()   # a follower serves until the bench stops it
        return
    try:
        _sync_commits(counter, min(seconds, 1.0))   # warm-up
        sync_rate, sync_p50 = _sync_commits(counter, seconds)
        rate = _outstanding(counter, seconds)
    except SyncObjException as exc:
        print(json.dumps({"error": str(exc)}), flush=True)
    else:
        print(json.dumps({"sync_rate": sync_rate, "sync_p50_ms": sync_p50, "outstanding_rate": rate}), flush=True)
    signal.pause()


def measure(seconds: float) -> PeerFigures:
    """Both sets, one after the other: the better figure of each kind."""
    batched, immediate = _with_attempts(seconds, batch=True), _with_attempts(seconds, batch=False)
    best_sync = min(batched, immediate, key=lambda f: f.sync_p50_ms)
    return PeerFigures(best_sync.sync_rate, best_sync.sync_p50_ms,
                       max(batched.outstanding_rate, immediate.outstanding_rate))


def _with_attempts(seconds: float, *, batch: bool) -> PeerFigures:
    for attempt in range(1, ATTEMPTS + 1):
        try:
            return _measure_set(seconds, batch=batch)
        except RuntimeError as exc:
            if attempt == ATTEMPTS:
                raise
            print(f"   pysyncobj: {exc}; starting the three nodes again", flush=True)
    raise AssertionError("unreachable")


def _measure_set(seconds: float, *, batch: bool) -> PeerFigures:
    """Starts the three nodes, returns the leader's figures, stops them."""
    ports = [free_port() for _ in range(3)]
    procs = [subprocess.Popen([sys.executable, "-m", "bench.peer_pysyncobj", "--node", str(i),
                               "--ports", ",".join(map(str, ports)), "--seconds", str(seconds),
                               "--batch", "1" if batch else "0"],
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env={**os.environ, "PYTHONHASHSEED": "0"})
             for i in range(3)]
    result: list[PeerFigures | str] = []

    def read(proc: subprocess.Popen[str]) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.startswith("{"):
                doc = json.loads(line)
                result.append(str(doc["error"]) if "error" in doc else PeerFigures(**doc))
                return

    readers = [threading.Thread(target=read, args=(p,), daemon=True) for p in procs]
    for reader in readers:
        reader.start()
    try:
        deadline = time.monotonic() + LEADER_TIMEOUT_S + 2 * seconds + 30
        while not result and time.monotonic() < deadline and all(p.poll() is None for p in procs):
            time.sleep(0.1)
        if not result:
            raise RuntimeError("pysyncobj gave no figures (no leader, or a node failed)")
        if isinstance(result[0], str):
            raise RuntimeError(f"pysyncobj's measurement failed: {result[0]}")
        return result[0]
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--node", type=int)
    parser.add_argument("--ports")
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--batch", default="1")
    args = parser.parse_args()
    if args.node is not None:
        _node(args.node, [int(p) for p in args.ports.split(",")], args.seconds, args.batch == "1")
        return
    figures = measure(args.seconds)
    print(f"pysyncobj sync commit: {figures.sync_rate:.0f}/s p50 {figures.sync_p50_ms:.3f} ms; "
          f"{OUTSTANDING} outstanding: {figures.outstanding_rate:.0f}/s")


if __name__ == "__main__":
    main()
