"""Three-member replica-set benchmark at steady state: write-concern cost, empty vs full.

Every figure is measured twice on one 3-member set (default settings, as `replset up`): **empty** (just initiated) and **full** (after a prefill of a
collection of 1,200,000 documents, 1,200,000 oplog entries through a capped oplog sized to
hold about 1,000,000 of them, so trimming runs during the measurement). Measurements insert
into that same big collection. Printed for each figure: empty, full, and full/empty as a
cost ratio (latency full/empty, throughput empty/full: above 1 means "costs more when full").

Figures (each with the members' CPU per write, P+S1+S2, from /proc):
* ceiling: synchronous pymongo `insert_one` at concurrency 1 against a do-nothing OP_MSG
  server (`bench.wire_load.NullServer`) — what a client reaches on this machine;
* pymongo `insert_one` w:1 and w:"majority" at concurrency 1 (rate, p50, p99);
* raw OP_MSG inserts (`bench.wire_load.run_load`: generator processes of their own, one
  request outstanding per connection) at 64 concurrent writers, w:1 and w:"majority".
Each cell runs `--rounds` times (2; 1 with --quick), the cells of a phase interleaved, and the
median of each number is printed (with each round's rate). Before the set starts, the Python peer in
the same run (`bench.peer_pysyncobj`: pysyncobj, three nodes, its sync commit p50 and its rate with
1000 calls outstanding), and with more than one round again after the full phase: the peer keeps the
better of its two figures of each kind. Then (full run only) the
failover: a w:"majority" writer with retryWrites, SIGKILL to the primary, time to the next
acknowledged write. Finally the targets, each "met" or "NOT met", as ratios against the
do-nothing server and pysyncobj.
Timings are printed, never asserted.

    python -m bench.replset [--quick] [--seconds S] [--docs N] [--rounds R]
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import math
import statistics
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import bson
from bson.int64 import Int64
from bson.objectid import ObjectId
from bson.timestamp import Timestamp
from pymongo import AsyncMongoClient, MongoClient, monitoring
from pymongo.errors import PyMongoError
from pymongo.write_concern import WriteConcern

from bench import peer_pysyncobj
from bench.peer_pysyncobj import PeerFigures
from bench.progress import loading
from bench.wire_load import NullServer, insert_message, proc_cpu_s, run_load, timed_calls
from tests.support.replica_set import ReplicaSet, make_replica_set

SETTINGS = {"heartbeatIntervalMillis": 2000, "electionTimeoutMillis": 10_000}  # MongoDB's defaults
DB, COLL = "bench", "c"
PAD = 64  # the measured and the prefilled documents: {n, pad: "x" * 64}, about 100 bytes
CONCURRENCY = 64
FULL_DOCS, QUICK_DOCS = 1_200_000, 20_000
HELD_ENTRIES = 1_000_000  # the capped oplog is sized to hold about this many entries
PREFILL_BATCH = 1_000  # one insert_many is one group commit: keep each short
PREFILL_THREADS = 8
FAILOVER_TIMEOUT_S = 30.0

TARGET_MAJORITY_VS_W1 = 0.80
TARGET_PYMONGO_VS_CEILING = 0.60
TARGET_MAJORITY_P50_VS_PEER = 3.0   # w:majority p50 at c1 / pysyncobj's sync commit p50
TARGET_MAJORITY_C64_VS_PEER = 0.5   # w:majority at c64 / pysyncobj's rate with 1000 outstanding
TARGET_FULL_VS_EMPTY = 1.15


@dataclass
class Figure:
    name: str
    rate: float
    p50_ms: float
    p99_ms: float
    member_cpu_ms: list[float]  # CPU per write of P, S1, S2
    generator_cpu: float = 0.0  # cores used by the load generator (raw cells)
    errors: int = 0
    first_error: str = ""

    round_rates: tuple[float, ...] = ()   # each round's rate, when the figure is the median of several

    def row(self) -> str:
        cpu = "+".join(f"{c:.3f}" for c in self.member_cpu_ms)
        extra = f"  gen {self.generator_cpu:.2f} cores" if self.generator_cpu else ""
        if len(self.round_rates) > 1:
            extra += "  rounds " + "/".join(f"{r:.0f}" for r in self.round_rates)
        extra += f"  ({self.errors} errors, first: {self.first_error})" if self.errors else ""
        return (f"{self.name:<26} {self.rate:>9.0f}/s  p50 {self.p50_ms:>7.2f} ms  p99 {self.p99_ms:>7.2f} ms  "
                f"cpu ms/write {sum(self.member_cpu_ms):.3f} (P+S1+S2 {cpu}){extra}")


def _median_figure(rounds: list[Figure]) -> Figure:
    """One figure from several rounds of the same cell: the median of each number."""
    first = rounds[0]
    return Figure(first.name, statistics.median(f.rate for f in rounds), statistics.median(f.p50_ms for f in rounds),
                  statistics.median(f.p99_ms for f in rounds),
                  [statistics.median(cpu) for cpu in zip(*(f.member_cpu_ms for f in rounds), strict=True)],
                  statistics.median(f.generator_cpu for f in rounds), sum(f.errors for f in rounds),
                  next((f.first_error for f in rounds if f.first_error), ""), tuple(f.rate for f in rounds))


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(len(ordered) * q) - 1))]


def _met(ok: bool) -> str:
    return "met" if ok else "NOT met"


def oplog_entry_size() -> int:
    """The stored size of one measured insert's oplog entry (what the capped oplog holds)."""
    entry = {"op": "i", "ns": f"{DB}.{COLL}", "ui": bson.Binary(bytes(16), 4),
             "o": {"_id": ObjectId(), "n": 1, "pad": "x" * PAD}, "ts": Timestamp(1_800_000_000, 1),
             "t": Int64(1), "v": Int64(2), "wall": datetime.datetime.now(datetime.UTC)}
    return len(bson.encode(entry))


class Bench:
    def __init__(self, rs: ReplicaSet, seconds: float) -> None:
        self.rs = rs
        self.seconds = seconds
        primary = rs.primary()
        if primary is None:
            raise RuntimeError("no primary after initiate")
        self.primary = primary
        self.pids: list[int] = []
        self._advance: Callable[[int], None] = lambda _n: None
        self.find_primary()

    def _cpu(self) -> list[float]:
        return [proc_cpu_s(p) for p in self.pids]

    def _per_write(self, before: list[float], writes: int) -> list[float]:
        return [(after - b) / max(writes, 1) * 1000 for b, after in zip(before, self._cpu())]

    def pymongo_c1(self, name: str, w: int | str) -> Figure:
        with MongoClient(self.rs.uri, serverSelectionTimeoutMS=10_000) as client:
            coll = client[DB].get_collection(COLL, write_concern=WriteConcern(w=w))
            coll.insert_one({"n": 0, "pad": "x" * PAD})  # connection and topology warm
            before = self._cpu()
            calls, latencies = timed_calls(lambda: coll.insert_one({"n": 1, "pad": "x" * PAD}), self.seconds)
            cpu = self._per_write(before, calls)
        return Figure(name, calls / self.seconds, statistics.median(latencies) * 1000,
                      _percentile(latencies, 0.99) * 1000, cpu)

    def raw_c64(self, name: str, w: int | str) -> Figure:
        before = self._cpu()
        result = run_load(self.primary.port, insert_message(COLL, DB, w, PAD), CONCURRENCY, self.seconds)
        cpu = self._per_write(before, result.ok)
        if not result.latencies_s:
            raise RuntimeError(f"{name}: no write succeeded ({result.errors} errors: {result.first_error})")
        return Figure(name, result.ok / result.seconds, statistics.median(result.latencies_s) * 1000,
                      _percentile(result.latencies_s, 0.99) * 1000, cpu, result.cpu_s / result.seconds,
                      result.errors, result.first_error)

    def measure(self, phase: str, rounds: int = 1) -> dict[str, Figure]:
        """Every cell `rounds` times, the cells interleaved (a slow minute of the machine hits every cell
        alike); each figure is the median of its rounds."""
        print(f"-- {phase}: {self.oplog_line()}", flush=True)
        cells: tuple[tuple[str, Callable[[], Figure]], ...] = (
            ("w1_c1", lambda: self.pymongo_c1("pymongo w:1 c1", 1)),
            ("majority_c1", lambda: self.pymongo_c1("pymongo majority c1", "majority")),
            ("w1_c64", lambda: self.raw_c64("raw w:1 c64", 1)),
            ("majority_c64", lambda: self.raw_c64("raw majority c64", "majority")))
        measured: dict[str, list[Figure]] = {key: [] for key, _run in cells}
        for _round in range(rounds):
            for key, run in cells:
                measured[key].append(run())
        figures = {key: _median_figure(found) for key, found in measured.items()}
        for key, _run in cells:
            print("   " + figures[key].row(), flush=True)
        return figures

    def oplog_line(self) -> str:
        with self.primary.direct_client() as client:
            oplog = next(client.local["oplog.rs"].aggregate([{"$collStats": {"storageStats": {}}}]))
            stats = oplog["storageStats"]
            docs = client[DB][COLL].estimated_document_count()
            members = client.admin.command("replSetGetStatus")["members"]
        # Which member each one pulls from: the set chooses (closest by ping), the bench does not force it.
        sources = ", ".join(f"{m['name'].rsplit(':', 1)[1]}<-{m['syncSourceHost'].rsplit(':', 1)[1]}"
                            for m in members if m.get("syncSourceHost"))
        return (f"collection {docs:,} documents; oplog {stats['count']:,} entries, "
                f"{stats['size'] / 1e6:.1f} of {stats['maxSize'] / 1e6:.1f} MB; sync sources {sources}")

    # -- prefill ----------------------------------------------------------------------------------

    def prefill(self, docs: int) -> float:
        """Inserts `docs` documents with w:"majority" (nothing a step-down could roll back) from several
        threads, then waits until all three members have them; returns the seconds it took."""
        started = time.perf_counter()
        batches = [min(PREFILL_BATCH, docs - i) for i in range(0, docs, PREFILL_BATCH)]
        lock = threading.Lock()
        errors: list[str] = []

        def work() -> None:
            with MongoClient(self.rs.uri, serverSelectionTimeoutMS=10_000) as client:
                coll = client[DB].get_collection(COLL, write_concern=WriteConcern(w="majority"))
                while True:
                    with lock:
                        if not batches:
                            return
                        size = batches.pop()
                    try:
                        coll.insert_many([{"n": i, "pad": "x" * PAD} for i in range(size)], ordered=False)
                        self._advance(size)
                    except PyMongoError as exc:
                        errors.append(str(exc)[:200])
                        return

        with loading("prefill", docs) as advance:
            self._advance = advance
            threads = [threading.Thread(target=work) for _ in range(PREFILL_THREADS)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
        if errors:
            raise RuntimeError(f"prefill failed: {errors[0]}")
        with MongoClient(self.rs.uri, serverSelectionTimeoutMS=10_000) as client:
            client[DB].get_collection(COLL, write_concern=WriteConcern(w=3, wtimeout=600_000)).insert_one({})
        took = time.perf_counter() - started
        self.find_primary()
        return took

    def find_primary(self) -> None:
        """The primary now, with the CPU columns in the order P, S1, S2 (a step-down under the prefill's
        load would otherwise send the measurements to a secondary)."""
        primary = self.rs.wait_primary()
        if primary is not self.primary:
            print(f"   note: the primary is now {primary.host} (was {self.primary.host})")
        self.primary = primary
        members = [primary, *(m for m in self.rs.members if m is not primary)]
        self.pids = [m.process.pid if m.process is not None else 0 for m in members]

    # -- failover -----------------------------------------------------------------------------------

    async def failover(self) -> tuple[float | None, int]:
        """Seconds from SIGKILL of the primary to the next w:"majority" write acknowledged by another
        member, and the writes acknowledged before the kill."""
        acked_by = LastAck()
        client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(
            self.rs.uri, serverSelectionTimeoutMS=15_000, event_listeners=[acked_by])
        old = ("127.0.0.1", self.primary.port)
        coll = client[DB].get_collection("failover", write_concern=WriteConcern(w="majority", wtimeout=15_000))
        killed_at: float | None = None
        acked_after: asyncio.Future[float] = asyncio.get_running_loop().create_future()
        acks_before = 0
        stop = False

        async def writer() -> None:
            nonlocal acks_before
            while not stop:
                try:
                    await coll.insert_one({"at": time.time()})
                except PyMongoError:
                    await asyncio.sleep(0.01)
                    continue
                if killed_at is None:
                    acks_before += 1
                elif acked_by.address not in (None, old) and not acked_after.done():
                    acked_after.set_result(time.perf_counter())

        task = asyncio.get_running_loop().create_task(writer())
        try:
            await asyncio.sleep(1.0)
            killed_at = time.perf_counter()
            self.primary.kill()
            try:
                return await asyncio.wait_for(asyncio.shield(acked_after), FAILOVER_TIMEOUT_S) - killed_at, acks_before
            except TimeoutError:
                return None, acks_before
        finally:
            stop = True
            task.cancel()
            try:
                await task
            except (asyncio.CancelledError, PyMongoError):
                pass
            await client.close()


class LastAck(monitoring.CommandListener):
    """The server that acknowledged the latest insert."""

    address: tuple[str, int] | None = None

    def started(self, event: monitoring.CommandStartedEvent) -> None:
        pass

    def succeeded(self, event: monitoring.CommandSucceededEvent) -> None:
        if event.command_name == "insert":
            self.address = event.connection_id

    def failed(self, event: monitoring.CommandFailedEvent) -> None:
        pass


def ceiling(seconds: float) -> Figure:
    with NullServer() as server, MongoClient(f"mongodb://127.0.0.1:{server.port}/?directConnection=true") as c:
        coll = c[DB][COLL]
        coll.insert_one({"n": 0})
        calls, latencies = timed_calls(lambda: coll.insert_one({"n": 1, "pad": "x" * PAD}), seconds)
    return Figure("pymongo c1 do-nothing", calls / seconds, statistics.median(latencies) * 1000,
                  _percentile(latencies, 0.99) * 1000, [0.0, 0.0, 0.0])


def report(empty: dict[str, Figure], full: dict[str, Figure], ceiling_fig: Figure, peer: PeerFigures) -> None:
    print()
    print(f"{'figure':<26} {'empty':>10} {'full':>10} {'full/empty':>11}   (cost ratio: latency full/empty, "
          "rate empty/full)")
    ratios: list[tuple[str, float]] = []
    for key, fig in full.items():
        e = empty[key]
        for label, a, b, ratio in ((f"{fig.name} rate/s", e.rate, fig.rate, e.rate / fig.rate),
                                   (f"{fig.name} p50 ms", e.p50_ms, fig.p50_ms, fig.p50_ms / e.p50_ms),
                                   (f"{fig.name} cpu ms/w", sum(e.member_cpu_ms), sum(fig.member_cpu_ms),
                                    sum(fig.member_cpu_ms) / max(sum(e.member_cpu_ms), 1e-9))):
            print(f"{label:<34} {a:>10.3f} {b:>10.3f} {ratio:>8.2f}")
            if "cpu" not in label:
                ratios.append((label, ratio))
    print()
    print("targets (full data):")
    maj_vs_w1 = full["majority_c64"].rate / full["w1_c64"].rate
    vs_ceiling = full["w1_c1"].rate / ceiling_fig.rate
    p50 = full["majority_c1"].p50_ms
    maj64 = full["majority_c64"].rate
    worst = max(ratios, key=lambda r: r[1])
    print(f"  w:majority / w:1 at c64 (raw)          >= {TARGET_MAJORITY_VS_W1:.2f}: {maj_vs_w1:.2f} "
          f"{_met(maj_vs_w1 >= TARGET_MAJORITY_VS_W1)}")
    print(f"  pymongo w:1 c1 / do-nothing server     >= {TARGET_PYMONGO_VS_CEILING:.2f}: {vs_ceiling:.2f} "
          f"({full['w1_c1'].rate:.0f} vs {ceiling_fig.rate:.0f}/s) {_met(vs_ceiling >= TARGET_PYMONGO_VS_CEILING)}")
    p50_vs_peer = p50 / peer.sync_p50_ms
    print(f"  w:majority p50 at c1 / pysyncobj sync   <= {TARGET_MAJORITY_P50_VS_PEER:.1f}x: {p50_vs_peer:.1f}x "
          f"({p50:.2f} vs {peer.sync_p50_ms:.2f} ms) {_met(p50_vs_peer <= TARGET_MAJORITY_P50_VS_PEER)}")
    maj64_vs_peer = maj64 / peer.outstanding_rate
    print(f"  w:majority c64 (raw) / pysyncobj 1000   >= {TARGET_MAJORITY_C64_VS_PEER:.2f}: {maj64_vs_peer:.2f} "
          f"({maj64:.0f} vs {peer.outstanding_rate:.0f}/s) {_met(maj64_vs_peer >= TARGET_MAJORITY_C64_VS_PEER)}")
    print(f"  every full/empty cost ratio            <= {TARGET_FULL_VS_EMPTY}: worst {worst[1]:.2f} "
          f"({worst[0]}) {_met(worst[1] <= TARGET_FULL_VS_EMPTY)}")


def _peer(seconds: float, earlier: PeerFigures | None = None) -> PeerFigures:
    """pysyncobj's figures; with `earlier`, the better of each between both measurements."""
    peer = peer_pysyncobj.measure(seconds)
    print(f"   pysyncobj (3 nodes): sync commit {peer.sync_rate:.0f}/s p50 {peer.sync_p50_ms:.3f} ms; "
          f"{peer_pysyncobj.OUTSTANDING} outstanding {peer.outstanding_rate:.0f}/s", flush=True)
    if earlier is None:
        return peer
    best_sync = min(earlier, peer, key=lambda f: f.sync_p50_ms)
    return PeerFigures(best_sync.sync_rate, best_sync.sync_p50_ms, max(earlier.outstanding_rate, peer.outstanding_rate))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help=f"{QUICK_DOCS:,} documents, 1 s cells, no failover")
    parser.add_argument("--seconds", type=float, default=None, help="seconds per cell (default 5, quick 1)")
    parser.add_argument("--docs", type=int, default=None, help="documents to prefill")
    parser.add_argument("--rounds", type=int, default=None, help="rounds of every cell (default 2, quick 1)")
    args = parser.parse_args()
    rounds = args.rounds or (1 if args.quick else 2)
    seconds = args.seconds or (1.0 if args.quick else 5.0)
    docs = args.docs or (QUICK_DOCS if args.quick else FULL_DOCS)
    held = min(HELD_ENTRIES, int(docs / 1.2))
    # Size the cap so that about `held` entries stay (trimming keeps the oplog within a MB of it).
    oplog_mb = max(1, math.ceil(held * oplog_entry_size() / (1024 * 1024)))
    print(f"3-member set, settings {SETTINGS}; {seconds:g} s per cell, {rounds} round(s) each, the median kept; "
          f"prefill {docs:,} documents; --oplogSizeMB {oplog_mb} (about {held:,} entries)")
    with tempfile.TemporaryDirectory() as tmp:
        peer = _peer(seconds)
        rs = make_replica_set(tmp, 3, extra_args=("--oplogSizeMB", str(oplog_mb)))
        try:
            rs.start()
            rs.initiate(SETTINGS)
            bench = Bench(rs, seconds)
            ceiling_fig = ceiling(seconds)
            print("   " + ceiling_fig.row())
            empty = bench.measure("empty", rounds)
            took = bench.prefill(docs)
            print(f"-- prefill: {docs:,} documents in {took:.1f} s ({docs / took:,.0f}/s, all three members)")
            full = bench.measure("full", rounds)
            if rounds > 1:   # the peer again, on a set that is idle now: it keeps its better figures
                peer = _peer(seconds, peer)
            report(empty, full, ceiling_fig, peer)
            if not args.quick:
                print()
                seconds_to_ack, before = asyncio.run(bench.failover())
                shown = f"{seconds_to_ack:.2f} s" if seconds_to_ack is not None else f"none in {FAILOVER_TIMEOUT_S:g} s"
                print(f"failover: SIGKILL to the primary -> next acknowledged w:majority write: {shown} "
                      f"({before} acknowledged before the kill)")
        finally:
            rs.stop()


if __name__ == "__main__":
    main()
