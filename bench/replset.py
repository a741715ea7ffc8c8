"""Three-member replica-set benchmark: write-concern cost by topology, and failover time.

One 3-member set (heartbeatIntervalMillis 500, electionTimeoutMillis 1000) is started
for the whole run. pymongo's AsyncMongoClient inserts small documents with `w:1`, `w:2`,
`w:3` and `w:"majority"` at concurrency 1 and 64 (asyncio tasks on one client), in two
topologies forced with `replSetSyncFrom`:

* star:  P <- S1, P <- S2 (both secondaries pull from the primary)
* chain: P <- S1 <- S2    (S2 pulls from S1; its positions are relayed by S1)

Each cell reports inserts/s, p50/p99 latency, and the CPU of the client process and of
each member during the cell (in cores). Ratios are against the `w:1` cell of the same
topology and concurrency, measured in the same run. Then the failover: a client writes
`w:"majority"` in a loop (retryWrites on), the primary is killed with SIGKILL, and the
time from the kill to the next acknowledged write is reported, along with the time until
a survivor reports itself writable primary.

    python -m bench.replset [--seconds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import signal
import statistics
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any

from pymongo import AsyncMongoClient, monitoring
from pymongo.errors import PyMongoError
from pymongo.write_concern import WriteConcern

from tests.support.members import Member
from tests.support.replica_set import ReplicaSet, make_replica_set

SETTINGS = {"heartbeatIntervalMillis": 500, "electionTimeoutMillis": 1000}
CONCERNS: tuple[tuple[str, int | str], ...] = (("w:1", 1), ("w:2", 2), ("w:3", 3), ("majority", "majority"))
TOPOLOGY_TIMEOUT_S = 30.0
FAILOVER_TIMEOUT_S = 30.0

TARGET_RATIO = 0.7  # majority/w1 throughput at concurrency 64
TARGET_P50_MS = 1.5  # p50 of w:"majority" at concurrency 1
TARGET_FAILOVER_S = 2.0

Client = AsyncMongoClient[dict[str, Any]]


def _proc_cpu_s(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _self_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _percentile(sorted_values: list[float], q: float) -> float:
    return sorted_values[min(len(sorted_values) - 1, max(0, int(len(sorted_values) * q) - 1))]


def _met(ok: bool) -> str:
    return "met" if ok else "NOT met"


@dataclass
class Cell:
    topology: str
    concurrency: int
    concern: str
    ops: float
    p50_ms: float
    p99_ms: float
    client_cpu: float
    member_cpu: list[float]
    errors: int


@dataclass
class InsertAddresses(monitoring.CommandListener):
    """Which server acknowledged the latest insert, and the inserts that failed (the failover)."""

    last_ok: tuple[str, int] | None = None
    failures: list[tuple[float, str]] = field(default_factory=list)

    def started(self, event: monitoring.CommandStartedEvent) -> None:
        pass

    def succeeded(self, event: monitoring.CommandSucceededEvent) -> None:
        if event.command_name == "insert":
            self.last_ok = event.connection_id

    def failed(self, event: monitoring.CommandFailedEvent) -> None:
        if event.command_name == "insert":
            self.failures.append((time.perf_counter(), f"{event.connection_id}: {event.failure}"))


class Bench:
    def __init__(self, rs: ReplicaSet, seconds: float) -> None:
        self.rs = rs
        self.seconds = seconds
        self.direct: dict[str, Client] = {}

    def admin(self, member: Member) -> Any:
        if member.host not in self.direct:
            self.direct[member.host] = AsyncMongoClient(
                f"mongodb://{member.host}/?directConnection=true", serverSelectionTimeoutMS=2000)
        return self.direct[member.host].admin

    async def close(self) -> None:
        for client in self.direct.values():
            await client.close()

    def pids(self) -> list[int]:
        return [m.process.pid if m.process is not None else 0 for m in self.rs.members]

    # -- topology -------------------------------------------------------------------------------

    async def set_topology(self, sources: list[tuple[Member, Member]]) -> float:
        """Forces each secondary's sync source; returns the seconds until all of them report it."""
        started = time.perf_counter()
        for secondary, source in sources:
            await self.admin(secondary).command({"replSetSyncFrom": source.host})
        deadline = started + TOPOLOGY_TIMEOUT_S
        while True:
            seen = {s.host: str((await self.admin(s).command("replSetGetStatus")).get("syncSourceHost", ""))
                    for s, _src in sources}
            if all(seen[s.host] == src.host for s, src in sources):
                return time.perf_counter() - started
            if time.perf_counter() > deadline:
                raise RuntimeError(f"topology not in place after {TOPOLOGY_TIMEOUT_S:.0f} s: {seen}")
            await asyncio.sleep(0.05)

    # -- inserts ----------------------------------------------------------------------------------

    async def run_cell(self, client: Client, topology: str, concurrency: int, label: str,
                       w: int | str) -> Cell:
        coll = client.bench.get_collection(f"{topology}_c{concurrency}_{label.replace(':', '')}",
                                           write_concern=WriteConcern(w=w))
        # Settle: every member has everything written so far before the clock starts.
        settle = client.bench.get_collection("settle", write_concern=WriteConcern(w=3, wtimeout=10_000))
        await settle.insert_one({})
        latencies: list[float] = []
        errors = 0
        deadline = time.perf_counter() + self.seconds
        counter = 0

        async def worker() -> None:
            nonlocal counter, errors
            while time.perf_counter() < deadline:
                counter += 1
                start = time.perf_counter()
                try:
                    await coll.insert_one({"n": counter, "payload": "x" * 64})
                except PyMongoError:
                    errors += 1
                    continue
                latencies.append(time.perf_counter() - start)

        pids = self.pids()
        cpu_client, cpu_members = _self_cpu_s(), [_proc_cpu_s(p) for p in pids]
        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        elapsed = time.perf_counter() - started
        client_cpu = (_self_cpu_s() - cpu_client) / elapsed
        member_cpu = [(_proc_cpu_s(p) - c) / elapsed for p, c in zip(pids, cpu_members)]
        latencies.sort()
        if not latencies:
            raise RuntimeError(f"{topology} c{concurrency} {label}: no write succeeded ({errors} errors)")
        return Cell(topology, concurrency, label, len(latencies) / elapsed,
                    statistics.median(latencies) * 1000, _percentile(latencies, 0.99) * 1000,
                    client_cpu, member_cpu, errors)

    async def run_topology(self, client: Client, topology: str) -> list[Cell]:
        cells = []
        for concurrency in (1, 64):
            baseline = 0.0
            for label, w in CONCERNS:
                cell = await self.run_cell(client, topology, concurrency, label, w)
                baseline = baseline or cell.ops
                cells.append(cell)
                cpus = "/".join(f"{c:.2f}" for c in cell.member_cpu)
                print(f"{topology:>8} {concurrency:>4} {label:>8} {cell.ops:>10.0f} {cell.p50_ms:>8.2f} "
                      f"{cell.p99_ms:>8.2f} {cell.client_cpu:>10.2f} {cpus:>15} {cell.ops / baseline:>7.2f}"
                      + (f"  ({cell.errors} errors)" if cell.errors else ""), flush=True)
        return cells

    # -- failover ---------------------------------------------------------------------------------

    async def failover(self, primary: Member) -> dict[str, Any]:
        listener = InsertAddresses()
        client: Client = AsyncMongoClient(self.rs.uri, serverSelectionTimeoutMS=15_000,
                                          event_listeners=[listener])
        survivors = [m for m in self.rs.members if m is not primary]
        coll = client.bench.get_collection("failover", write_concern=WriteConcern(w="majority",
                                                                                  wtimeout=15_000))
        old = ("127.0.0.1", primary.port)
        killed_at: float | None = None
        acked_after: asyncio.Future[tuple[float, tuple[str, int] | None]] = (
            asyncio.get_running_loop().create_future())
        acks_before = 0
        errors: list[str] = []
        stop = False

        async def writer() -> None:
            nonlocal acks_before
            n = 0
            while not stop:
                n += 1
                try:
                    await coll.insert_one({"n": n})
                except PyMongoError as exc:
                    errors.append(f"{type(exc).__name__}: {str(exc)[:160]}")
                    await asyncio.sleep(0.01)
                    continue
                now = time.perf_counter()
                if killed_at is None:
                    acks_before += 1
                elif listener.last_ok != old and not acked_after.done():
                    acked_after.set_result((now, listener.last_ok))

        elected: asyncio.Future[tuple[float, str]] = asyncio.get_running_loop().create_future()

        async def watch_election() -> None:
            while not elected.done():
                for m in survivors:
                    try:
                        hello = await self.admin(m).command("hello")
                    except PyMongoError:
                        continue
                    if hello.get("isWritablePrimary") and not elected.done():
                        elected.set_result((time.perf_counter(), m.host))
                await asyncio.sleep(0.01)

        task = asyncio.get_running_loop().create_task(writer())
        watcher: asyncio.Task[None] | None = None
        try:
            await asyncio.sleep(1.0)  # steady state first
            if acks_before == 0:
                raise RuntimeError(f"the failover writer got no acknowledgement before the kill: {errors[:3]}")
            assert primary.process is not None
            killed_at = time.perf_counter()
            os.kill(primary.process.pid, signal.SIGKILL)
            watcher = asyncio.get_running_loop().create_task(watch_election())
            result: dict[str, Any] = {"acks_before": acks_before, "errors": errors,
                                      "failures": listener.failures, "killed_at": killed_at}
            try:
                ack_at, by = await asyncio.wait_for(asyncio.shield(acked_after), FAILOVER_TIMEOUT_S)
                result["ack_s"] = ack_at - killed_at
                result["ack_by"] = f"{by[0]}:{by[1]}" if by else "?"
            except TimeoutError:
                result["ack_s"] = None
            try:
                at, host = await asyncio.wait_for(asyncio.shield(elected), 5.0)
                result["elected_s"] = at - killed_at
                result["elected"] = host
            except TimeoutError:
                result["elected_s"] = None
            return result
        finally:
            stop = True
            for t in (task, watcher):
                if t is not None:
                    t.cancel()
                    try:
                        await t
                    except (asyncio.CancelledError, Exception):
                        pass
            if primary.process is not None:
                primary.process.wait(10)
            await client.close()

    # -- the whole run ----------------------------------------------------------------------------

    async def run(self) -> None:
        rs = self.rs
        primary = rs.primary()
        if primary is None:
            raise RuntimeError("no primary after initiate")
        s1, s2 = [m for m in rs.members if m is not primary]
        names = {primary.host: "P", s1.host: "S1", s2.host: "S2"}
        print(f"3-member set: P={primary.host} S1={s1.host} S2={s2.host}; settings {SETTINGS}; "
              f"{self.seconds:g} s per cell")
        # The member CPU columns are in the order of rs.members; make that P/S1/S2.
        rs.members = [primary, s1, s2]
        client: Client = AsyncMongoClient(rs.uri, serverSelectionTimeoutMS=10_000, maxPoolSize=100)
        results: dict[str, list[Cell]] = {}
        try:
            await client.admin.command("ping")
            print(f"{'topology':>8} {'conc':>4} {'concern':>8} {'inserts/s':>10} {'p50 ms':>8} {'p99 ms':>8} "
                  f"{'client cpu':>10} {'cpu P/S1/S2':>15} {'vs w:1':>7}")
            for topology, sources in (("star", [(s1, primary), (s2, primary)]),
                                     ("chain", [(s1, primary), (s2, s1)])):
                took = await self.set_topology(sources)
                shape = ", ".join(f"{names[s.host]}<-{names[src.host]}" for s, src in sources)
                print(f"-- {topology}: {shape} (in place after {took:.2f} s)", flush=True)
                results[topology] = await self.run_topology(client, topology)
                # Still in place after the measurement (a background re-selection would skew it)?
                for s, src in sources:
                    now = str((await self.admin(s).command("replSetGetStatus")).get("syncSourceHost", ""))
                    if now != src.host:
                        print(f"   warning: {names[s.host]} now syncs from {now or 'nobody'}, "
                              f"not {names[src.host]}")
        finally:
            await client.close()

        print()
        print("ratios (same run, majority vs w:1):")
        ok_ratio = ok_p50 = True
        for topology, cells in results.items():
            by = {(c.concurrency, c.concern): c for c in cells}
            ratio64 = by[64, "majority"].ops / by[64, "w:1"].ops
            p50_ratio = by[1, "majority"].p50_ms / by[1, "w:1"].p50_ms
            p50_maj = by[1, "majority"].p50_ms
            ok_ratio &= ratio64 >= TARGET_RATIO
            ok_p50 &= p50_maj <= TARGET_P50_MS
            print(f"  {topology:>5}: majority/w1 throughput at c64 = {ratio64:.2f}   "
                  f"majority/w1 p50 at c1 = {p50_ratio:.2f} "
                  f"(majority p50 {p50_maj:.2f} ms vs w:1 {by[1, 'w:1'].p50_ms:.2f} ms)")

        print()
        print(f"failover: w:\"majority\" writer (retryWrites on), SIGKILL to the primary {primary.host} "
              f"(chain topology still forced)")
        fo = await self.failover(primary)
        elected = (f"{fo['elected_s']:.2f} s ({fo['elected']})" if fo["elected_s"] is not None
                   else "not within 5 s of the ack wait")
        ack = f"{fo['ack_s']:.2f} s (by {fo['ack_by']})" if fo["ack_s"] is not None else \
            f"none within {FAILOVER_TIMEOUT_S:.0f} s"
        print(f"  kill -> a survivor reports isWritablePrimary: {elected}")
        print(f"  kill -> next acknowledged w:majority write:    {ack}")
        print(f"  acknowledged writes before the kill: {fo['acks_before']}; errors raised to the writer: "
              f"{len(fo['errors'])}; insert attempts failed (driver events): {len(fo['failures'])}")
        for text in dict.fromkeys(fo["errors"]):
            print(f"    writer error: {text}")
        for at, text in fo["failures"][:6]:
            print(f"    +{at - fo['killed_at']:.3f} s failed attempt: {text[:200]}")

        print()
        print("targets:")
        for topology, cells in results.items():
            by = {(c.concurrency, c.concern): c for c in cells}
            ratio64 = by[64, "majority"].ops / by[64, "w:1"].ops
            p50_maj = by[1, "majority"].p50_ms
            print(f"  {topology:>5}: majority/w1 at c64 >= {TARGET_RATIO}: {ratio64:.2f} "
                  f"{_met(ratio64 >= TARGET_RATIO)};  p50 majority at c1 <= {TARGET_P50_MS} ms: "
                  f"{p50_maj:.2f} ms {_met(p50_maj <= TARGET_P50_MS)}")
        fo_s = fo["ack_s"]
        print(f"  failover <= {TARGET_FAILOVER_S:g} s: "
              + (f"{fo_s:.2f} s {_met(fo_s <= TARGET_FAILOVER_S)}" if fo_s is not None else "NOT met (no ack)"))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=3.0, help="seconds per cell")
    seconds = parser.parse_args().seconds
    with tempfile.TemporaryDirectory() as tmp:
        rs = make_replica_set(tmp, 3)
        try:
            rs.start()
            rs.initiate(SETTINGS)

            async def go() -> None:
                bench = Bench(rs, seconds)
                try:
                    await bench.run()
                finally:
                    await bench.close()

            asyncio.run(go())
        finally:
            rs.stop()


if __name__ == "__main__":
    main()
