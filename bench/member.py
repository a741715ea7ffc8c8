"""Single-member insert benchmark: inserts/s and latency for pymongo's AsyncMongoClient.

Runs concurrency 1 and 64 with `w:1` and `j:true` against one real member process,
and reports the CPU used by the client process and by the member during each run
(the member should not be the bottleneck for one client). Ratios are against the
`w:1` run at the same concurrency, measured in the same invocation.

    python -m bench.member [--seconds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import statistics
import tempfile
import time
from typing import Any

from pymongo import AsyncMongoClient
from pymongo.write_concern import WriteConcern

from tests.support.members import Member


def _proc_cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / ticks


def _self_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def _run(client: AsyncMongoClient[dict[str, Any]], wc: WriteConcern, concurrency: int,
               seconds: float, member_pid: int) -> dict[str, float]:
    coll = client.bench.get_collection(f"c{concurrency}_{wc.document.get('j', False)}", write_concern=wc)
    await coll.drop()
    latencies: list[float] = []
    deadline = time.perf_counter() + seconds
    counter = 0

    async def worker() -> None:
        nonlocal counter
        while time.perf_counter() < deadline:
            counter += 1
            start = time.perf_counter()
            await coll.insert_one({"n": counter, "payload": "x" * 64})
            latencies.append(time.perf_counter() - start)

    cpu_client, cpu_member = _self_cpu_s(), _proc_cpu_s(member_pid)
    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    elapsed = time.perf_counter() - started
    latencies.sort()
    return {
        "ops": len(latencies) / elapsed,
        "p50_ms": statistics.median(latencies) * 1000,
        "p99_ms": latencies[int(len(latencies) * 0.99) - 1] * 1000,
        "client_cpu": (_self_cpu_s() - cpu_client) / elapsed,
        "member_cpu": (_proc_cpu_s(member_pid) - cpu_member) / elapsed,
    }


async def main(seconds: float) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        member = Member(dbpath=os.path.join(tmp, "db"))
        member.start()
        try:
            member.initiate()
            assert member.process is not None
            client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(member.uri)
            print(f"{'concurrency':>11} {'concern':>8} {'inserts/s':>10} {'p50 ms':>8} {'p99 ms':>8} "
                  f"{'client cpu':>10} {'member cpu':>10} {'vs w:1':>7}")
            for concurrency in (1, 64):
                baseline = 0.0
                for label, wc in (("w:1", WriteConcern(w=1)), ("j:true", WriteConcern(w=1, j=True))):
                    r = await _run(client, wc, concurrency, seconds, member.process.pid)
                    baseline = baseline or r["ops"]
                    print(f"{concurrency:>11} {label:>8} {r['ops']:>10.0f} {r['p50_ms']:>8.2f} "
                          f"{r['p99_ms']:>8.2f} {r['client_cpu']:>10.2f} {r['member_cpu']:>10.2f} "
                          f"{r['ops'] / baseline:>7.2f}")
            await client.close()
        finally:
            member.stop()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=3.0)
    asyncio.run(main(parser.parse_args().seconds))
