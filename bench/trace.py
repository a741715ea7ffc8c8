"""Where one w:"majority" write spends its time: the median of each hop, client to client.

Starts a three-member set with hop tracing on (`replset.hops`, `REPLSET_TRACE_HOPS=1`), runs pymongo
`insert_one` with w:"majority" at concurrency 1, then reads every member's marks (`GET /hops`) and lines
them up per write (the monotonic clock is shared by every process of the machine). For each write the
secondary counted is the one whose report reached the primary first. Printed: the median and p90 of
each hop, their sum against the median latency the client saw, and the CPU each member and the client
spent per write (user + system, from /proc). Timings are printed, never asserted.

    python -m bench.trace [--writes N] [--w majority|1|2|3]
"""

from __future__ import annotations

import argparse
import bisect
import json
import os
import statistics
import tempfile
import time
import urllib.request
from collections import defaultdict

from pymongo import MongoClient
from pymongo.write_concern import WriteConcern

from bench.wire_load import proc_cpu_s
from replset.hops import ENV
from tests.support.members import Member
from tests.support.replica_set import make_replica_set

WARM_UP = 300

# (label, from (member, hop), to (member, hop)); "P" is the primary, "S" the secondary counted
HOPS = [
    ("client -> primary has request", ("C", "sent"), ("P", "request")),
    ("request -> primary commit", ("P", "request"), ("P", "commit")),
    ("commit -> getMore answered", ("P", "commit"), ("P", "served")),
    ("answered -> secondary got it", ("P", "served"), ("S", "received")),
    ("got it -> applied (commit)", ("S", "received"), ("S", "commit")),
    ("applied -> journaled", ("S", "commit"), ("S", "durable")),
    ("journaled -> report sent", ("S", "durable"), ("S", "report")),
    ("report -> commit point moved", ("S", "report"), ("P", "commit_pt")),
    ("commit point -> write released", ("P", "commit_pt"), ("P", "acked")),
    ("released -> reply sent", ("P", "acked"), ("P", "reply")),
    ("reply sent -> client has it", ("P", "reply"), ("C", "replied")),
]
UNKEYED = ("request", "reply")   # marked by the wire server before the entry has a key
PARALLEL = [("primary commit -> journaled", ("P", "commit"), ("P", "durable"))]


def _marks(member: Member) -> list[tuple[str, int, float]]:
    with urllib.request.urlopen(f"http://127.0.0.1:{member.http_port}/hops", timeout=10) as reply:
        return [tuple(m) for m in json.load(reply)["marks"]]


class Timeline:
    """One member's marks: for a hop, the first time it reached (or passed) a timestamp key."""

    def __init__(self, marks: list[tuple[str, int, float]]) -> None:
        by_hop: dict[str, list[tuple[int, float]]] = defaultdict(list)
        self.unkeyed: dict[str, list[float]] = defaultdict(list)
        for hop, key, at in marks:
            if hop in UNKEYED:
                self.unkeyed[hop].append(at)
            else:
                by_hop[hop].append((key, at))
        for times in self.unkeyed.values():
            times.sort()
        self.hops: dict[str, tuple[list[int], list[float]]] = {}
        for hop, points in by_hop.items():
            points.sort(key=lambda p: p[1])
            keys, times, top = [], [], -1
            for key, at in points:   # the running maximum: "reached key K" is the first mark with key >= K
                if key > top:
                    top = key
                    keys.append(key)
                    times.append(at)
            self.hops[hop] = (keys, times)

    def reached(self, hop: str, key: int, after: float) -> float | None:
        if hop in UNKEYED:   # the first mark at or after `after`
            times = self.unkeyed.get(hop, [])
            i = bisect.bisect_left(times, after)
            return times[i] if i < len(times) else None
        keys, times = self.hops.get(hop, ([], []))
        i = bisect.bisect_left(keys, key)
        return times[i] if i < len(keys) and times[i] >= after - 1e-4 else None


def run(writes: int, w: str) -> None:
    os.environ[ENV] = "1"   # the members inherit it
    with tempfile.TemporaryDirectory(prefix="bench-trace-") as base:
        rs = make_replica_set(base, 3)
        rs.start()
        try:
            rs.initiate()
            primary = rs.wait_primary()
            secondaries = [m for m in rs.members if m is not primary]
            client = MongoClient(primary.host, directConnection=True)
            coll = client.bench.get_collection("c", write_concern=WriteConcern(w=int(w) if w.isdigit() else w))
            for n in range(WARM_UP):
                coll.insert_one({"n": n, "pad": "x" * 64})
            for member in rs.members:
                _marks(member)
            sent_replied: list[tuple[float, float]] = []
            pids = [m.process.pid for m in [primary, *secondaries] if m.process is not None]
            cpu_before, client_before = [proc_cpu_s(pid) for pid in pids], time.process_time()
            for n in range(writes):
                sent = time.monotonic()
                coll.insert_one({"n": n, "pad": "x" * 64})
                sent_replied.append((sent, time.monotonic()))
            cpu_ms = [(proc_cpu_s(pid) - before) / writes * 1000 for pid, before in zip(pids, cpu_before)]
            cpu_ms.append((time.process_time() - client_before) / writes * 1000)
            client.close()
            p_line = Timeline(_marks(primary))
            s_lines = [Timeline(_marks(m)) for m in secondaries]
        finally:
            rs.stop()
    commits = sorted(zip(p_line.hops["commit"][1], p_line.hops["commit"][0], strict=True))
    spans: dict[str, list[float]] = defaultdict(list)
    latencies: list[float] = []
    for sent, replied in sent_replied:
        i = bisect.bisect_left(commits, (sent, -1))
        if i >= len(commits) or commits[i][0] > replied:
            continue
        key = commits[i][1]
        reports = [(t, s) for s in s_lines if (t := s.reached("report", key, sent)) is not None]
        if not reports:
            continue
        secondary = min(reports, key=lambda r: r[0])[1]
        lines = {"P": p_line, "S": secondary}
        at: dict[tuple[str, str], float | None] = {("C", "sent"): sent, ("C", "replied"): replied}
        for _label, start, end in HOPS + PARALLEL:
            for member, hop in (start, end):
                if (member, hop) not in at:
                    at[(member, hop)] = lines[member].reached(hop, key, sent)
        if any(v is None for v in at.values()):
            continue
        latencies.append(replied - sent)
        for label, start, end in HOPS + PARALLEL:
            spans[label].append(at[end] - at[start])  # type: ignore[operator]
    if not latencies:
        print("no write could be lined up with the members' marks")
        return
    print(f"w:{w} at concurrency 1: {len(latencies)} of {writes} writes lined up; "
          f"client median {statistics.median(latencies) * 1000:.3f} ms")
    print(f"{'hop':<34} {'p50 ms':>8} {'p90 ms':>8}")
    total = 0.0
    for label, _start, _end in HOPS:
        values = sorted(spans[label])
        p50 = statistics.median(values) * 1000
        total += p50
        print(f"{label:<34} {p50:>8.3f} {values[int(len(values) * 0.9)] * 1000:>8.3f}")
    print(f"{'sum of the hop medians':<34} {total:>8.3f}")
    for label, _start, _end in PARALLEL:
        values = sorted(spans[label])
        print(f"{label + ' (alongside)':<34} {statistics.median(values) * 1000:>8.3f} "
              f"{values[int(len(values) * 0.9)] * 1000:>8.3f}")
    print("CPU per write (ms, user+system): " + ", ".join(
        f"{who} {ms:.3f}" for who, ms in zip(("primary", "secondary", "secondary", "client"), cpu_ms)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--writes", type=int, default=2000)
    parser.add_argument("--w", default="majority")
    args = parser.parse_args()
    run(args.writes, args.w)


if __name__ == "__main__":
    main()
