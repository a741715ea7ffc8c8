"""Change-stream delivery on a three-member set: 64 writers insert with `w: "majority"` while one
`watch()` on the collection receives the events.

    python -m bench.change_streams [--writers 64] [--per-writer 50] [--json]

Prints the delivery latency p50 / p99 (from a write's acknowledgement to its event's arrival; negative
when the event came first), events/s received against the acknowledged writes/s of the same run
(ratio), and whether every acknowledged insert arrived exactly once.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import threading
import time
from typing import Any

from pymongo import MongoClient

from tests.support.replica_set import make_replica_set

WAIT_MS = 100


def run(writers: int, per_writer: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="bench-cs-") as base:
        rs = make_replica_set(base, 3, test_commands=False)
        try:
            rs.start()
            rs.initiate()
            client: MongoClient[dict[str, Any]] = MongoClient(rs.uri, w="majority", maxPoolSize=writers + 4)
            coll = client.bench.events
            coll.insert_one({"_id": "warm-up"})
            acked: dict[str, float] = {}
            received: dict[str, float] = {}
            duplicates = 0
            total = writers * per_writer
            stream = coll.watch(max_await_time_ms=WAIT_MS)
            stream.try_next()   # open before the first write

            def watch() -> None:
                nonlocal duplicates
                deadline = time.monotonic() + 300
                while len(received) < total and time.monotonic() < deadline:
                    change = stream.try_next()
                    if change is None or change["operationType"] != "insert":
                        continue
                    key = change["documentKey"]["_id"]
                    duplicates += key in received
                    received[key] = time.perf_counter()

            def write(index: int) -> None:
                for seq in range(per_writer):
                    key = f"{index}-{seq}"
                    coll.insert_one({"_id": key, "pad": "x" * 64})
                    acked[key] = time.perf_counter()

            watcher = threading.Thread(target=watch)
            watcher.start()
            started = time.perf_counter()
            threads = [threading.Thread(target=write, args=(i,)) for i in range(writers)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            writes_done = time.perf_counter()
            watcher.join()
            last_event = max(received.values(), default=writes_done)
            stream.close()
            client.close()
        finally:
            rs.stop()
    latencies = [(received[k] - acked[k]) * 1000 for k in acked if k in received]
    ordered = sorted(latencies)
    return {
        "writers": writers, "inserts": total, "received": len(received), "duplicates": duplicates,
        "p50_ms": statistics.median(ordered), "p99_ms": ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))],
        "writes_per_s": total / (writes_done - started), "events_per_s": len(received) / (last_event - started),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--writers", type=int, default=64)
    parser.add_argument("--per-writer", type=int, default=50)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    result = run(args.writers, args.per_writer)
    if args.json:
        print(json.dumps(result))
        return
    print(f"change streams, {result['writers']} writers, {result['inserts']:,} w:majority inserts: delivery p50 "
          f"{result['p50_ms']:.1f} ms p99 {result['p99_ms']:.1f} ms after the acknowledgement; "
          f"{result['events_per_s']:,.0f} events/s received against {result['writes_per_s']:,.0f} acknowledged "
          f"writes/s (ratio {result['events_per_s'] / result['writes_per_s']:.2f}); received "
          f"{result['received']:,} of {result['inserts']:,}, duplicates {result['duplicates']}")


if __name__ == "__main__":
    main()
