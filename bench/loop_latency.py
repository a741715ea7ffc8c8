"""Does one expensive query stall the member? Heartbeat and ping round trips on the primary while a
catastrophic regex and an unindexed sort over a big collection run.

    python -m bench.loop_latency [--docs 1000000] [--json]

A three-member set (heartbeats every 250 ms, 2 s election timeout) is loaded with `--docs` small
documents. Two probe threads then measure, on connections of their own, the round trip of a
`replSetHeartbeat` (as a peer's heartbeat is served) and of a `ping`, every 10 ms, while the main
thread runs, one after the other:
- `regex`: find {s: {$regex: "^(a|aa)+$"}} over the collection, one document holding "a" * 34 + "!"
  (exponential backtracking in a backtracking engine);
- `regex maxTimeMS`: the same with maxTimeMS 500;
- `sort`: find().sort({r: 1}).limit(1) on an unindexed field (every document decoded, keyed, sorted);
- `group`: an aggregation grouping every document;
- `update many`: an update of every document (found off the loop, applied 64 per commit, replicated);
- `unique index`: building a unique index over every document;
- `drop`: dropping the collection.
For each phase it prints the probes' p50 / p99 / max in ms, how the query ended and how long it took,
and whether the primary and its term stayed the same.
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pymongo import MongoClient
from pymongo.errors import OperationFailure, PyMongoError
from pymongo.write_concern import WriteConcern

from base.codec import encode_op_msg_request
from tests.support.replica_set import ReplicaSet, make_replica_set
from tests.support.wire import roundtrip

EVIL = "a" * 34 + "!"
CATASTROPHIC = "^(a|aa)+$"
PROBE_INTERVAL_S = 0.01
LOAD_BATCH = 100_000


@dataclass
class Probe:
    """Round trips of one command, sent every `PROBE_INTERVAL_S` on a connection of its own."""

    name: str
    port: int
    body: dict[str, Any]
    samples: list[tuple[float, float]] = field(default_factory=list)  # (sent at, round trip s)
    errors: list[str] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(30)

    def _run(self) -> None:
        with socket.create_connection(("127.0.0.1", self.port), timeout=60) as sock:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            request_id = 0
            while not self._stop.is_set():
                request_id += 1
                sent = time.perf_counter()
                reply = roundtrip(sock, encode_op_msg_request(self.body, request_id))
                self.samples.append((sent, time.perf_counter() - sent))
                if reply.get("ok") != 1:
                    self.errors.append(str(reply.get("errmsg")))
                self._stop.wait(PROBE_INTERVAL_S)

    def window(self, start: float, end: float) -> list[float]:
        """Round trips that overlap [start, end] (one sent before a stall began and answered after it
        ended is the stall)."""
        return [rtt for sent, rtt in self.samples if sent <= end and sent + rtt >= start]


def percentiles(values: list[float]) -> dict[str, float]:
    if not values:
        return {"n": 0, "p50_ms": 0.0, "p99_ms": 0.0, "max_ms": 0.0}
    ordered = sorted(values)
    p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
    return {"n": len(values), "p50_ms": round(statistics.median(ordered) * 1000, 2),
            "p99_ms": round(p99 * 1000, 2), "max_ms": round(ordered[-1] * 1000, 2)}


def load(client: MongoClient[dict[str, Any]], docs: int) -> float:
    """`docs` small documents with a random sort key, plus the one the catastrophic regex chokes on."""
    coll = client.test.big
    started = time.perf_counter()
    state = 12345
    for start in range(0, docs, LOAD_BATCH):
        batch = []
        for i in range(start, min(docs, start + LOAD_BATCH)):
            state = (state * 1103515245 + 12345) % (1 << 31)
            batch.append({"_id": i, "r": state, "s": "x"})
        coll.insert_many(batch, ordered=False)
    coll.insert_one({"_id": "evil", "r": -1, "s": EVIL})
    client.test.command({"ping": 1})
    return time.perf_counter() - started


def run_phase(name: str, query: Callable[[], Any]) -> dict[str, Any]:
    """Runs one query; the probes' figures for its window are added once the probes have stopped (a
    round trip that a stall holds up completes only after the query)."""
    started = time.perf_counter()
    try:
        query()
        outcome = "ok"
    except OperationFailure as exc:
        outcome = f"error {exc.code}"
    except PyMongoError as exc:  # the member stepped down, say
        outcome = type(exc).__name__
    ended = time.perf_counter()
    return {"phase": name, "query_s": round(ended - started, 2), "outcome": outcome,
            "window": (started, ended)}


def measure(rs: ReplicaSet, docs: int) -> dict[str, Any]:
    primary = rs.wait_primary()
    client = rs.client()
    load_s = load(client, docs)
    # Every member holds the data before the measurement starts.
    client.test.big.with_options(write_concern=WriteConcern(w=3, wtimeout=600_000)).insert_one({"_id": "last"})
    term_before = rs.status(primary)["term"]
    heartbeat = Probe("heartbeat", primary.port, {"replSetHeartbeat": rs.name, "configVersion": -2, "hbv": 1, "from": "",
                                     "fromId": -1, "term": -1, "$db": "admin"})
    ping = Probe("ping", primary.port, {"ping": 1, "$db": "admin"})
    probes = [heartbeat, ping]
    direct = primary.direct_client(socketTimeoutMS=600_000)
    coll = direct.test.big
    list(coll.find({"s": "warm-up"}))  # the query pool's threads and connections exist before measuring
    for p in probes:
        p.start()
    try:
        phases = [
            run_phase("idle", lambda: time.sleep(1.0)),
            run_phase("regex", lambda: list(coll.find({"s": {"$regex": CATASTROPHIC}}))),
            run_phase("regex maxTimeMS 500",
                      lambda: list(coll.find({"s": {"$regex": CATASTROPHIC}}, max_time_ms=500))),
            run_phase("sort", lambda: list(coll.find({}, {"r": 1}).sort("r", 1).limit(1))),
            run_phase("group", lambda: list(coll.aggregate([{"$group": {"_id": {"$mod": ["$r", 1000]},
                                                                         "n": {"$sum": 1}}}]))),
            run_phase("update many", lambda: coll.update_many({"s": "x"}, {"$set": {"t": 1}})),
            run_phase("unique index", lambda: coll.create_index([("r", 1), ("_id", 1)], unique=True)),
            run_phase("drop", lambda: coll.drop()),
        ]
    finally:
        for p in probes:
            p.stop()
        direct.close()
    windows = [phase.pop("window") for phase in phases]
    for phase, (started, ended) in zip(phases, windows):
        phase.update({p.name: percentiles(p.window(started, ended)) for p in probes})
    # Over every query phase together (a phase alone may hold too few round trips for a p99).
    busy = {p.name: percentiles([rtt for started, ended in windows[1:] for rtt in p.window(started, ended)])
            for p in probes}
    after = rs.status(primary)
    return {"docs": docs, "load_s": round(load_s, 1), "phases": phases, "during_queries": busy,
            "probe_errors": sorted({e for p in probes for e in p.errors}),
            "kept_primary": after["myState"] == 1 and after["term"] == term_before}


def run(base_dir: str, docs: int) -> dict[str, Any]:
    """Starts a three-member set under `base_dir`, measures, stops it."""
    rs = make_replica_set(base_dir, 3, extra_args=("--oplogSizeMB", "256"))
    try:
        rs.start()
        rs.initiate()
        return measure(rs, docs)
    finally:
        rs.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--docs", type=int, default=1_000_000)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="loop-latency-") as base:
        result = run(base, args.docs)
    if args.json:
        print(json.dumps(result))
        return 0
    print(f"{result['docs']:,} documents loaded in {result['load_s']} s; primary kept: {result['kept_primary']}")
    print(f"{'phase':<22}{'query s':>8}  {'outcome':<16}{'heartbeat n, p50/p99/max ms':>30}"
          f"{'ping n, p50/p99/max ms':>30}")
    for ph in result["phases"]:
        cells = [f"{f['n']}, {f['p50_ms']}/{f['p99_ms']}/{f['max_ms']}" for f in (ph["heartbeat"], ph["ping"])]
        print(f"{ph['phase']:<22}{ph['query_s']:>8}  {ph['outcome']:<16}{cells[0]:>30}{cells[1]:>30}")
    cells = [f"{f['n']}, {f['p50_ms']}/{f['p99_ms']}/{f['max_ms']}" for f in result["during_queries"].values()]
    print(f"{'all query phases':<40}{cells[0]:>30}{cells[1]:>30}")
    if result["probe_errors"]:
        print("probe errors:", result["probe_errors"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
