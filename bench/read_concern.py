"""What a read concern costs: point reads by `_id` with `local`, `majority` and `linearizable`, on the
primary of a three-member set, idle and while writers keep it busy.

    python -m bench.read_concern [--docs 100000] [--reads 2000] [--json]

The collection holds `--docs` documents first (steady state: a loaded set, not an empty one). Each
phase times `--reads` `find_one({_id})` round trips at each level and prints p50 / p99 in ms and the
ratio of each p50 to the `local` p50 measured in the same phase:
- `idle`: nothing else runs;
- `busy`: four threads insert with `w:1` meanwhile (a majority read answers from the committed
  snapshot holding the commit point; a linearizable read waits for its data to be majority committed,
  then writes a no-op and waits for it too).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import tempfile
import threading
import time
from typing import Any

from pymongo import MongoClient
from pymongo.read_concern import ReadConcern
from pymongo.write_concern import WriteConcern

from bench.progress import loading
from tests.support.replica_set import make_replica_set

LEVELS = ("local", "majority", "linearizable")
WRITERS = 4
LOAD_BATCH = 10_000


def _percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def time_reads(client: MongoClient[dict[str, Any]], docs: int, reads: int, rng: random.Random) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for level in LEVELS:
        coll = client.bench.get_collection("items", read_concern=ReadConcern(level))
        samples = []
        for _ in range(reads):
            key = rng.randrange(docs)
            started = time.perf_counter()
            found = coll.find_one({"_id": key})
            samples.append(time.perf_counter() - started)
            assert found is not None and found["_id"] == key
        out[level] = {"p50_ms": statistics.median(samples) * 1000, "p99_ms": _percentile(samples, 0.99) * 1000}
    base = out["local"]["p50_ms"]
    for level in LEVELS:
        out[level]["ratio"] = out[level]["p50_ms"] / base
    return out


def busy_writers(uri: str, stop: threading.Event, counts: list[int]) -> list[threading.Thread]:
    def write(index: int) -> None:
        with MongoClient(uri) as client:
            coll = client.bench.get_collection("noise", write_concern=WriteConcern(w=1))
            seq = 0
            while not stop.is_set():
                coll.insert_one({"_id": f"{index}-{seq}", "pad": "x" * 100})
                seq += 1
            counts[index] = seq

    threads = [threading.Thread(target=write, args=(i,), daemon=True) for i in range(WRITERS)]
    for t in threads:
        t.start()
    return threads


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--docs", type=int, default=100_000)
    parser.add_argument("--reads", type=int, default=2_000)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    rng = random.Random(7)
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="bench-rc-") as base:
        rs = make_replica_set(base, 3, test_commands=False)
        try:
            rs.start()
            primary = rs.initiate()
            client: MongoClient[dict[str, Any]] = MongoClient(f"mongodb://{primary.host}/?directConnection=true")
            with loading("loading", args.docs) as advance:
                for start in range(0, args.docs, LOAD_BATCH):
                    batch = [{"_id": i, "v": i, "pad": "y" * 100} for i in range(start, min(args.docs, start + LOAD_BATCH))]
                    client.bench.items.insert_many(batch)
                    advance(len(batch))
            results["idle"] = time_reads(client, args.docs, args.reads, rng)
            stop = threading.Event()
            counts = [0] * WRITERS
            threads = busy_writers(f"mongodb://{primary.host}/?directConnection=true", stop, counts)
            started = time.perf_counter()
            try:
                results["busy"] = time_reads(client, args.docs, args.reads, rng)
            finally:
                stop.set()
                for t in threads:
                    t.join()
            results["busy"]["writes_per_s"] = sum(counts) / (time.perf_counter() - started)
            client.close()
        finally:
            rs.stop()
    if args.json:
        print(json.dumps(results))
        return
    for phase, by_level in results.items():
        extra = f" ({by_level['writes_per_s']:,.0f} w:1 writes/s beside)" if "writes_per_s" in by_level else ""
        line = "; ".join(f"{level} p50 {by_level[level]['p50_ms']:.2f} ms p99 {by_level[level]['p99_ms']:.2f} ms"
                         f" (ratio {by_level[level]['ratio']:.2f})" for level in LEVELS)
        print(f"read concern, {phase}{extra}: {line}")


if __name__ == "__main__":
    main()
