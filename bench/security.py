"""What access control and TLS cost: the same writes on a plain 3-member set and on one with TLS and
keyfile auth (every client logged in over TLS), both at steady state, measured in one run.

    python -m bench.security [--docs 100000] [--seconds 5]

Each set is filled with `--docs` documents first. Figures per set: pymongo `insert_one` at
concurrency 1 with w:1 and w:"majority" (rate, p50, p99), and 64 concurrent `insert_one`s from
`AsyncMongoClient` with w:"majority" (rate, p50, p99); then, per figure, the secure/plain ratio of
the rate (below 1: slower) and of the p50 (above 1: slower). Also the cost of a new connection that
logs in (a SCRAM-SHA-256 exchange with 15,000 iterations on each side) against one that does not.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pymongo import AsyncMongoClient, MongoClient
from pymongo.write_concern import WriteConcern

from bench.loop_latency import percentiles
from bench.progress import loading
from bench.wire_load import timed_calls
from tests.support.replica_set import ReplicaSet, make_replica_set
from tests.support.secure import create_first_user, secure_options

DB, COLL = "bench", "c"
PAD = 64
CONCURRENCY = 64
CONNECTS = 20


@dataclass
class Figure:
    rate: float
    p50_ms: float
    p99_ms: float

    def row(self, name: str) -> str:
        return f"{name:<26} {self.rate:>9,.0f}/s  p50 {self.p50_ms:6.2f} ms  p99 {self.p99_ms:6.2f} ms"


def _figure(calls: int, latencies: list[float], seconds: float) -> Figure:
    summary = percentiles(latencies)
    return Figure(calls / seconds, summary["p50_ms"], summary["p99_ms"])


def c1(rs: ReplicaSet, w: int | str, seconds: float) -> Figure:
    with MongoClient(rs.uri, serverSelectionTimeoutMS=10_000, **rs.members[0].client_kwargs) as client:
        coll = client[DB].get_collection(COLL, write_concern=WriteConcern(w=w))
        coll.insert_one({"n": 0, "pad": "x" * PAD})
        calls, latencies = timed_calls(lambda: coll.insert_one({"n": 1, "pad": "x" * PAD}), seconds)
    return _figure(calls, latencies, seconds)


async def _c64(rs: ReplicaSet, seconds: float) -> Figure:
    client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(
        rs.uri, serverSelectionTimeoutMS=10_000, maxPoolSize=CONCURRENCY, **rs.members[0].client_kwargs)
    coll = client[DB].get_collection(COLL, write_concern=WriteConcern(w="majority"))
    latencies: list[float] = []
    await asyncio.gather(*(coll.insert_one({"warm": i}) for i in range(CONCURRENCY)))
    deadline = time.perf_counter() + seconds

    async def writer() -> None:
        while (start := time.perf_counter()) < deadline:
            await coll.insert_one({"n": 1, "pad": "x" * PAD})
            latencies.append(time.perf_counter() - start)

    await asyncio.gather(*(writer() for _ in range(CONCURRENCY)))
    await client.close()
    return _figure(len(latencies), latencies, seconds)


def connect_ms(rs: ReplicaSet) -> float:
    """p50 of opening a connection to the primary and running one command (logging in first if the
    set wants it)."""
    primary = rs.wait_primary()
    samples = []
    for _ in range(CONNECTS):
        start = time.perf_counter()
        with primary.direct_client() as client:
            client[DB].command("ping")  # (a client with credentials logs in on connecting)
        samples.append((time.perf_counter() - start) * 1000)
    return statistics.median(samples)


def measure(base: Path, secure: bool, docs: int, seconds: float) -> dict[str, Figure | float]:
    extra: list[str] = []
    client_options: dict[str, Any] = {}
    if secure:
        extra, client_options, _ca = secure_options(base / "secrets")
    rs = make_replica_set(str(base), 3, extra_args=tuple(extra))
    for m in rs.members:
        m.client_kwargs.update(client_options)
    try:
        rs.start()
        rs.initiate()
        if secure:
            create_first_user(rs)
        with rs.client() as client, loading("loading", docs) as advance:
            for start in range(0, docs, 10_000):
                batch = [{"n": i, "pad": "x" * PAD} for i in range(start, min(docs, start + 10_000))]
                client[DB][COLL].insert_many(batch)
                advance(len(batch))
        out: dict[str, Figure | float] = {
            "w1_c1": c1(rs, 1, seconds), "majority_c1": c1(rs, "majority", seconds),
            "majority_c64": asyncio.run(_c64(rs, seconds)), "connect_ms": connect_ms(rs)}
        return out
    finally:
        rs.stop()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--docs", type=int, default=100_000)
    parser.add_argument("--seconds", type=float, default=5.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        plain = measure(Path(tmp) / "plain", False, args.docs, args.seconds)
        secure = measure(Path(tmp) / "secure", True, args.docs, args.seconds)
    print(f"3-member sets, {args.docs:,} documents each, {args.seconds:g} s per figure")
    for key, name in (("w1_c1", "pymongo w:1 c1"), ("majority_c1", "pymongo majority c1"),
                      ("majority_c64", "async majority c64")):
        a, b = plain[key], secure[key]
        assert isinstance(a, Figure) and isinstance(b, Figure)
        print(a.row(f"plain  {name}"))
        print(b.row(f"secure {name}") + f"   rate ratio {b.rate / a.rate:.2f}, p50 ratio {b.p50_ms / a.p50_ms:.2f}")
    print(f"new connection + one command: plain {plain['connect_ms']:.1f} ms, with TLS and a SCRAM-SHA-256 login "
          f"{secure['connect_ms']:.1f} ms (ratio {float(secure['connect_ms']) / float(plain['connect_ms']):.1f})")


if __name__ == "__main__":
    main()
