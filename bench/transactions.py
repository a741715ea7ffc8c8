"""What a transaction costs: updating 2 and 10 documents in one transaction (`with_transaction`,
commit at `w: "majority"`) against the same updates without one, on the primary of a three-member
set holding `--docs` documents (steady state, not an empty set).

    python -m bench.transactions [--docs 100000] [--rounds 500] [--json]

Each round updates randomly chosen documents by `_id` with `$inc`. Prints p50 / p99 of a round in ms
and the ratio of the transaction's p50 to the plain writes' p50 measured in the same run. The plain
writes are `w: "majority"` too, each one (so a round of 10 plain writes waits for a majority 10
times, where a transaction waits once, at its commit).
"""

from __future__ import annotations

import argparse
import json
import random
import tempfile
import time
from typing import Any

from pymongo import MongoClient
from pymongo.write_concern import WriteConcern

from bench.loop_latency import percentiles
from bench.progress import loading
from tests.support.replica_set import make_replica_set

SIZES = (2, 10)
LOAD_BATCH = 10_000


def time_rounds(client: MongoClient[dict[str, Any]], docs: int, rounds: int, size: int,
                rng: random.Random) -> dict[str, Any]:
    coll = client.bench.get_collection("accounts", write_concern=WriteConcern(w="majority"))
    plain, in_txn = [], []
    for _ in range(rounds):
        keys = rng.sample(range(docs), size)
        started = time.perf_counter()
        for key in keys:
            coll.update_one({"_id": key}, {"$inc": {"n": 1}})
        plain.append(time.perf_counter() - started)

        keys = rng.sample(range(docs), size)

        def body(session: Any, keys: list[int] = keys) -> None:
            for key in keys:
                coll.update_one({"_id": key}, {"$inc": {"n": 1}}, session=session)

        started = time.perf_counter()
        with client.start_session() as session:
            session.with_transaction(body, write_concern=WriteConcern(w="majority"))
        in_txn.append(time.perf_counter() - started)
    out: dict[str, Any] = {"plain": percentiles(plain), "transaction": percentiles(in_txn)}
    out["ratio"] = out["transaction"]["p50_ms"] / out["plain"]["p50_ms"]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--docs", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=500)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    rng = random.Random(11)
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="bench-txn-") as base:
        rs = make_replica_set(base, 3, test_commands=False)
        try:
            rs.start()
            rs.initiate()
            client: MongoClient[dict[str, Any]] = MongoClient(rs.uri)
            with loading("loading", args.docs) as advance:
                for start in range(0, args.docs, LOAD_BATCH):
                    batch = [{"_id": i, "n": 0, "pad": "y" * 100} for i in range(start, min(args.docs, start + LOAD_BATCH))]
                    client.bench.accounts.insert_many(batch)
                    advance(len(batch))
            for size in SIZES:
                results[f"{size} documents"] = time_rounds(client, args.docs, args.rounds, size, rng)
            client.close()
        finally:
            rs.stop()
    if args.json:
        print(json.dumps(results))
        return
    for name, r in results.items():
        print(f"transactions, {name}: transaction p50 {r['transaction']['p50_ms']:.2f} ms "
              f"p99 {r['transaction']['p99_ms']:.2f} ms; the same writes without one p50 "
              f"{r['plain']['p50_ms']:.2f} ms p99 {r['plain']['p99_ms']:.2f} ms (ratio {r['ratio']:.2f})")


if __name__ == "__main__":
    main()
