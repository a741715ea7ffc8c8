"""Parts tables on a real three-member set: insert rate, fetch speed, catch-up, scheduler cost.

    python -m bench.parts [--quick] [--only fetch,insert,...]

Each figure is printed next to a baseline measured in the same run, as a ratio:

* **insert rows/s** with `insertQuorum: 2`, blocks of 10,000 and 100,000 rows, one client: the
  baseline is writing the same rows as a sorted zstd Parquet file on this machine (what an insert
  can never beat: the part's own write);
* **fetch MB/s** of one big part (about 200 MB of rows, about 100 MB of Parquet; `--quick`: a
  tenth): the time from the commit on the primary until both secondaries hold the part (queue,
  fetch, every byte checked, fsync, rename - the two fetch at once), next to two raw loopback HTTP
  downloads of the same file from the same member at once (no checks, no fsync); the goal is 0.5
  of the raw copy or more;
* **catch-up** of a secondary stopped while 1,000 parts (`--quick`: 200) were inserted, from its
  restart until it holds them all (merges may have joined some meanwhile: it then fetches the
  merged parts); the baseline is the time the inserts took on the primary;
* **scheduler cost** per `next_to_run` decision with 10,000 queued fetches (a pure-core figure),
  next to one `ActivePartSet.containing` lookup, the cheapest thing a decision does; and per
  decision of a catch-up: 10,000 fetches and 1,000 merges of ten of them queued, the fetch pool
  full, each decision following the end of one fetch;
* **memory**: the RSS of every member after 100,000 parts (`--quick`: 10,000; one-row blocks in
  1,000 partitions) were inserted, fetched everywhere and merged, next to the RSS with the table
  empty;
* **checksums**: on one part (2,000,000 rows; `--quick`: 200,000), writing with a CRC-32 per page
  against without, reading with every page's CRC verified against without, and hashing the part
  whole (what a merge does to each source before it reads it) against reading it;
* **zero-copy**: on a set whose members share a directory as their parts storage, the same inserts
  (quorum 2) and a full read on a secondary of a zero-copy table next to an ordinary one, and the bytes
  each keeps (members' disks plus the storage);
* **fetch source**: in the part-log simulator (`tests/sim/parts.py`, simulated time), the catch-up
  after a heal with a random live holder (today's ClickHouse, and this product) against the seed's
  "largest log pointer, smallest queue", on the same 100 seeds.

Timings are printed, never asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import tempfile
import time
import urllib.request
from typing import Any

import aiohttp
import pyarrow as pa
import pyarrow.parquet as pq

from oplog.parts import part_files
from oplog.parts.active_set import ActivePartSet
from oplog.parts.part_info import PartInfo
from oplog.parts.queue import EntryType, QueueEntry, ReplicationQueue
from oplog.parts.table import parse_table_def
from tests.support.members import Member, wait_for
from tests.support.parts import part_dirs
from tests.support.replica_set import ReplicaSet, make_replica_set

TABLE = {"columns": [{"name": "day", "type": "timestamp[ms]"}, {"name": "user", "type": "string"},
                     {"name": "n", "type": "int64"}, {"name": "value", "type": "float64"}],
         "partitionBy": "toYYYYMM(day)", "orderBy": ["user", "day"]}


def rows(n: int, start: int = 0, month: int = 1, text: int = 8) -> pa.Table:
    return pa.table({
        "day": pa.array([datetime.datetime(2024, month, 1 + i % 28, i % 24) for i in range(start, start + n)],
                        pa.timestamp("ms")),
        "user": pa.array([f"user-{i % 997:04d}-{'x' * text}" for i in range(start, start + n)]),
        "n": pa.array(range(start, start + n), pa.int64()),
        "value": pa.array([i * 0.5 for i in range(start, start + n)], pa.float64())})


def arrow_bytes(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return bytes(sink.getvalue().to_pybytes())


def parquet_baseline(data: pa.Table, directory: str) -> float:
    """Seconds to sort and write `data` as one zstd Parquet part: the floor under any insert of it."""
    table = parse_table_def("bench", "t", TABLE)
    started = time.perf_counter()
    part_files.write_part(directory, "202401_1_1_0", part_files.sort_rows(table, data), table)
    return time.perf_counter() - started


_clients: dict[tuple[int, int], Any] = {}


def _direct(rs: ReplicaSet, member: Member) -> Any:
    """One direct client per member for the whole run (`rs.direct` opens a new one per call)."""
    key = (id(rs), member.port)
    if key not in _clients:
        _clients[key] = rs.direct(member)
    return _clients[key]


def insert_rate(rs: ReplicaSet, block_rows: int, blocks: int, directory: str) -> None:
    db = rs.client().bench
    primary = rs.wait_primary()
    baseline_s = 0.0
    started = time.perf_counter()
    for i in range(blocks):
        data = rows(block_rows, start=i * block_rows, month=1 + i % 12)
        reply = _direct(rs, primary).bench.command({"insertBlock": "ins", "arrow": arrow_bytes(data),
                                                  "insertQuorum": 2, "quorumTimeoutMS": 120_000})
        assert reply["quorumStatus"] == "reached", reply
    elapsed = time.perf_counter() - started
    for i in range(blocks):
        baseline_s += parquet_baseline(rows(block_rows, start=i * block_rows),
                                       os.path.join(directory, f"baseline-{block_rows}-{i}"))
    rate, base = block_rows * blocks / elapsed, block_rows * blocks / baseline_s
    print(f"insert, quorum 2, {block_rows:>7,}-row blocks x {blocks}: {rate:>10,.0f} rows/s; "
          f"Parquet write alone {base:>10,.0f} rows/s; ratio {rate / base:.2f}")
    del db


async def raw_download(url: str, path: str) -> float:
    started = time.perf_counter()
    async with aiohttp.ClientSession() as session, session.get(url) as response:
        with open(path, "wb") as f:
            async for chunk in response.content.iter_chunked(1 << 20):
                f.write(chunk)
    return time.perf_counter() - started


def fetch_speed(rs: ReplicaSet, target_mb: int, directory: str) -> None:
    primary = rs.wait_primary()
    rs.client().bench.command({"createPartsTable": "big", **TABLE})
    # Random-ish text so zstd cannot shrink the part to nothing.
    n = target_mb * 1024 * 1024 // 60
    data = rows(n, text=0).append_column("blob", pa.array([os.urandom(24).hex() for _ in range(n)]))
    rs.client().bench.command({"alterPartsTable": "big", "addColumn": {"name": "blob", "type": "string"}})
    body = arrow_bytes(data)   # far above a command's 16 MB: through the HTTP insert route
    request = urllib.request.Request(f"http://127.0.0.1:{primary.http_port}/tables/bench.big/insert", data=body,
                                     method="POST", headers={"Content-Type": "application/vnd.apache.arrow.stream"})
    started = time.perf_counter()
    with urllib.request.urlopen(request, timeout=600) as response:
        reply = json.loads(response.read())
    committed = time.perf_counter()
    part = reply["blocks"][0]["part"]
    secondaries = [m for m in rs.members if m is not primary]
    wait_for(lambda: all(part in part_dirs(m, "bench.big") for m in secondaries), 600,
             "the big part on both secondaries", interval_s=0.01)
    fetched_s = time.perf_counter() - committed
    size = os.path.getsize(os.path.join(primary.dbpath, "parts", "bench.big", part, "data.parquet"))
    url = f"http://127.0.0.1:{primary.http_port}/parts/bench.big/{part}/data.parquet"

    async def raw_copies() -> float:   # what the two secondaries do at once, without checks or fsync
        started = time.perf_counter()
        await asyncio.gather(*(raw_download(url, os.path.join(directory, f"raw-{i}.parquet")) for i in range(2)))
        return time.perf_counter() - started

    raw_s = asyncio.run(raw_copies())
    mb = size / 1e6
    print(f"fetch of a {mb:,.0f} MB part by both secondaries at once (insert took {committed - started:.1f} s): "
          f"{mb / fetched_s:,.0f} MB/s each, commit-to-held; two raw HTTP copies at once {mb / raw_s:,.0f} MB/s "
          f"each; ratio {raw_s / fetched_s:.2f} (goal >= 0.5)")


def catch_up(rs: ReplicaSet, parts: int) -> None:
    primary = rs.wait_primary()
    lagging = next(m for m in rs.members if m is not primary)
    rs.client().bench.command({"createPartsTable": "cu", **TABLE})
    lagging.stop()
    started = time.perf_counter()
    for i in range(parts):
        _direct(rs, primary).bench.command({"insertBlock": "cu", "arrow": arrow_bytes(rows(50, start=i * 50,
                                                                                         month=1 + i % 12)),
                                          "writeConcern": {"w": 1}})
    inserted_s = time.perf_counter() - started
    wait_for(lambda: len(part_dirs(primary, "bench.cu")) > 0, 10, "the parts on the primary")
    lagging.start()
    restarted = time.perf_counter()

    def caught_up() -> bool:
        want = {r["name"] for r in _direct(rs, primary).bench.command({"partsStatus": "cu"})["parts"] if r["active"]}
        have = {r["name"] for r in _direct(rs, lagging).bench.command({"partsStatus": "cu"})["parts"] if r["active"]}
        return bool(want) and want == have

    wait_for(caught_up, 900, "the restarted member to catch up", interval_s=0.2)
    took = time.perf_counter() - restarted
    print(f"catch-up of a member restarted {parts:,} parts behind: {took:.1f} s; the {parts:,} inserts took "
          f"{inserted_s:.1f} s on the primary; ratio {took / inserted_s:.2f}")


def _rss_mb(rs: ReplicaSet) -> list[float]:
    out = []
    for member in rs.members:
        assert member.process is not None
        with open(f"/proc/{member.process.pid}/status") as f:
            kb = next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))
        out.append(kb / 1024)
    return out


def memory_after_parts(rs: ReplicaSet, parts: int, partitions: int = 1000) -> None:
    """RSS of every member once `parts` parts were inserted (inserts of one row into each of
    `partitions` monthly partitions), fetched by every member and merged, next to the RSS with the
    table empty."""
    client = rs.client()
    client.bench.command({"createPartsTable": "mem", **TABLE,
                          "settings": {"oldPartsLifetimeSecs": 10, "cleanupDelayPeriodSecs": 1}})
    before = _rss_mb(rs)
    started = time.perf_counter()
    months = [datetime.datetime(1900 + m // 12, 1 + m % 12, 1) for m in range(partitions)]
    for i in range(parts // partitions):
        table = pa.table({"day": pa.array(months, pa.timestamp("ms")),
                          "user": pa.array([f"u{i}"] * partitions), "n": pa.array([i] * partitions, pa.int64()),
                          "value": pa.array([float(i)] * partitions)})
        client.bench.command({"insertBlock": "mem", "arrow": arrow_bytes(table), "writeConcern": {"w": 1}})
    inserted_s = time.perf_counter() - started

    def settled() -> bool:
        views = []
        for member in rs.members:
            db = _direct(rs, member).bench
            if db.command({"partsReplicationQueue": "mem"})["queue"]:
                return False
            views.append(sorted(r["name"] for r in db.command({"partsStatus": "mem"})["parts"] if r["active"]))
        return all(v == views[0] for v in views)

    wait_for(settled, 3600, "every member to fetch and merge every part", interval_s=2.0)
    settled_s = time.perf_counter() - started
    merged = _rss_mb(rs)
    log_coll = client.bench.get_collection("system.parts.mem.log")
    logged_then = log_coll.estimated_document_count()
    active = len([r for r in client.bench.command({"partsStatus": "mem"})["parts"] if r["active"]])
    # The log entries of merged-away parts go once every member holds the merged part (`log_entry_obsolete`);
    # the dedup keys of the last 1,000 blocks keep theirs.
    window = 1000
    wait_for(lambda: log_coll.estimated_document_count() <= active + window, 600,
             "the log clean-up", interval_s=2.0)
    after = _rss_mb(rs)
    print(f"memory: {parts:,} parts inserted ({inserted_s:.0f} s), fetched and merged on 3 members "
          f"({settled_s:.0f} s): RSS {', '.join(f'{a:.0f}' for a in merged)} MB with {logged_then:,} log entries; "
          f"{', '.join(f'{a:.0f}' for a in after)} MB once the log was cleaned up to "
          f"{log_coll.estimated_document_count():,} entries ({active:,} active parts); with the table empty "
          f"{', '.join(f'{b:.0f}' for b in before)} MB; ratio {sum(after) / sum(before):.2f}")


def _lookup_us(parts_count: int, lookups: int) -> float:
    """The baseline: one `ActivePartSet.containing` lookup among `parts_count` parts, in microseconds."""
    parts = ActivePartSet(PartInfo("202401", i, i, 0) for i in range(1, parts_count + 1))
    started = time.perf_counter()
    for i in range(lookups):
        parts.containing(PartInfo("202401", i + 1, i + 1, 0))
    return (time.perf_counter() - started) / lookups * 1e6


def scheduler_cost(queued: int = 10_000, decisions: int = 2_000) -> None:
    queue = ReplicationQueue(fetch_pool_size=8)
    for i in range(1, queued + 1):
        queue.add(QueueEntry(f"block-{i}", EntryType.GET_PART, PartInfo("202401", i, i, 0)))
    now = 1_000_000
    started = time.perf_counter()
    for i in range(decisions):
        entry = queue.next_to_run(now + i)
        if entry is not None:
            queue.started(entry, now + i)
            queue.finished(entry, now + i)
    per_decision = (time.perf_counter() - started) / decisions * 1e6
    lookup = _lookup_us(queued, decisions)
    print(f"scheduler: {per_decision:,.1f} us per decision with {queued:,} queued fetches; one covering lookup "
          f"{lookup:.1f} us; ratio {per_decision / lookup:,.1f}")


def catch_up_scheduler_cost(fetches: int = 10_000, decisions: int = 2_000) -> None:
    queue = ReplicationQueue()
    for i in range(1, fetches + 1):
        queue.add(QueueEntry(f"block-{i}", EntryType.GET_PART, PartInfo("202401", i, i, 0)))
    for i in range(0, fetches - 10, 10):
        sources = tuple(PartInfo("202401", j, j, 0) for j in range(i + 1, i + 11))
        queue.add(QueueEntry(f"merge-{i}", EntryType.MERGE_PARTS, PartInfo("202401", i + 1, i + 10, 1), sources))
    now, running = 1_000_000, []
    while (entry := queue.next_to_run(now)) is not None:
        queue.started(entry, now)
        running.append(entry)
    started, made = time.perf_counter(), 0
    while running and made < decisions:
        queue.finished(running.pop(0), now)
        while (entry := queue.next_to_run(now)) is not None:
            queue.started(entry, now)
            running.append(entry)
        made += 1
    per_decision = (time.perf_counter() - started) / made * 1e6
    lookup = _lookup_us(fetches, decisions)
    print(f"scheduler, catch-up: {per_decision:,.1f} us per finished fetch and the decisions after it, "
          f"{fetches:,} fetches and {fetches // 10:,} merges queued; one covering lookup {lookup:.1f} us; "
          f"ratio {per_decision / lookup:,.1f}")


def source_choice(seeds: int = 100) -> None:
    """The fetch-source rule in the part-log simulator: today's ClickHouse (a random live holder) against
    the seed document's "largest log pointer, smallest queue", on the same seeds (simulated time)."""
    from tests.sim.parts import run_seed

    catch_up = {rule: sum(run_seed(s, rule=rule).catch_up_ms for s in range(seeds)) for rule in ("random", "seed")}
    print(f"fetch source, {seeds} simulated seeds: catch-up after the heal {catch_up['random'] / seeds / 1000:.2f} s "
          f"(random holder) vs {catch_up['seed'] / seeds / 1000:.2f} s (least lag + queue); "
          f"ratio {catch_up['seed'] / max(1, catch_up['random']):.2f}")


def _best_s(fn: Any, repeat: int = 3) -> float:
    best = float("inf")
    for _ in range(repeat):
        started = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - started)
    return best


def checksum_cost(n_rows: int, directory: str) -> None:
    """What checking bytes costs on one part: writing it with a CRC-32 per page against without, reading
    it with every page's CRC verified against without, and hashing it whole (`verify_part`, what a merge
    does to each source first) against reading it."""
    table = parse_table_def("bench", "t", TABLE)
    data = part_files.sort_rows(table, part_files.conform(table, rows(n_rows)))
    path = os.path.join(directory, "crc.parquet")
    plain = os.path.join(directory, "plain.parquet")

    def write(page_checksum: bool, where: str) -> None:
        pq.write_table(data, where, compression=part_files.COMPRESSION, row_group_size=part_files.ROW_GROUP_ROWS,
                       write_statistics=True, write_page_checksum=page_checksum)

    with_crc, without = _best_s(lambda: write(True, path)), _best_s(lambda: write(False, plain))
    read_crc = _best_s(lambda: pq.read_table(path, page_checksum_verification=True))
    read_plain = _best_s(lambda: pq.read_table(path))
    written = part_files.write_part(directory, "202401_1_1_0_crc", data, table)
    part_dir = os.path.join(directory, written.name)
    hashing = _best_s(lambda: part_files.verify_part(part_dir, written.checksums))
    mb = os.path.getsize(path) / 1e6
    print(f"checksums, one part of {n_rows:,} rows ({mb:.0f} MB of Parquet):")
    print(f"  write with page CRCs {with_crc * 1000:.0f} ms, without {without * 1000:.0f} ms: "
          f"ratio {with_crc / without:.2f}")
    print(f"  read verifying page CRCs {read_crc * 1000:.0f} ms, without {read_plain * 1000:.0f} ms: "
          f"ratio {read_crc / read_plain:.2f}")
    print(f"  hash the part whole (SHA-256) {hashing * 1000:.0f} ms, read it {read_plain * 1000:.0f} ms: "
          f"ratio {hashing / read_plain:.2f}")


def _tree_bytes(root: str) -> int:
    return sum(os.path.getsize(os.path.join(d, f)) for d, _dirs, files in os.walk(root) for f in files)


def zero_copy(blocks: int, block_rows: int, directory: str) -> None:
    """The same inserts (quorum 2) and full reads on a zero-copy table and on an ordinary one of one set
    whose members share a directory as their parts storage; and the bytes each keeps."""
    shared = os.path.join(directory, "shared")
    os.makedirs(shared)
    rs = make_replica_set(os.path.join(directory, "zc-set"), 3, test_commands=True,
                          extra_args=("--partsStorage", f"file://{shared}"))
    rs.start()
    try:
        rs.initiate()
        figures = {}
        for name, settings in (("plain", {}), ("zero", {"zeroCopy": True})):
            rs.client().bench.command({"createPartsTable": name, **TABLE, "settings": {
                **settings, "mergeSelectingSleepMS": 3_600_000}})   # no merges: the same parts in both
            primary = rs.wait_primary()
            before = [_tree_bytes(m.dbpath) for m in rs.members]
            started = time.perf_counter()
            for i in range(blocks):
                data = rows(block_rows, start=i * block_rows, month=1 + i % 12)
                reply = _direct(rs, primary).bench.command({"insertBlock": name, "arrow": arrow_bytes(data),
                                                          "insertQuorum": 2, "quorumTimeoutMS": 120_000})
                assert reply["quorumStatus"] == "reached", reply
            insert_s = time.perf_counter() - started
            secondary = next(m for m in rs.members if m is not primary)
            wait_for(lambda n=name: all(len(part_dirs(m, f"bench.{n}")) == blocks for m in rs.members), 600,
                     f"every part of {name} everywhere")
            started = time.perf_counter()
            count = sum(1 for _ in _direct(rs, secondary).bench.cursor_command("selectParts", name, columns=["n"]))
            read_s = time.perf_counter() - started
            assert count == blocks * block_rows
            kept = sum(_tree_bytes(m.dbpath) - b for m, b in zip(rs.members, before, strict=True))
            figures[name] = (insert_s, read_s, kept)
        plain, zero = figures["plain"], figures["zero"]
        stored = _tree_bytes(shared)
        rows_total = blocks * block_rows
        print(f"zero-copy, {blocks} blocks of {block_rows:,} rows, quorum 2, a shared directory as the storage:")
        print(f"  insert {rows_total / zero[0]:,.0f} rows/s, ordinary table {rows_total / plain[0]:,.0f} rows/s; "
              f"ratio {plain[0] / zero[0]:.2f}")
        print(f"  full read on a secondary {rows_total / zero[1]:,.0f} rows/s, ordinary {rows_total / plain[1]:,.0f} "
              f"rows/s; ratio {plain[1] / zero[1]:.2f}")
        print(f"  bytes kept: members {zero[2] / 1e6:,.1f} MB + storage {stored / 1e6:,.1f} MB, ordinary "
              f"members {plain[2] / 1e6:,.1f} MB; ratio {(zero[2] + stored) / plain[2]:.2f}")
    finally:
        rs.stop()


FIGURES = ("checksums", "scheduler", "source", "insert", "fetch", "catchup", "memory", "zerocopy")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--checksums-only", action="store_true", help="only the checksum costs (no members)")
    parser.add_argument("--only", default=",".join(FIGURES),
                        help=f"a comma-separated choice of figures ({', '.join(FIGURES)}); all by default")
    args = parser.parse_args()
    only = {"checksums"} if args.checksums_only else set(args.only.split(","))
    if only - set(FIGURES):
        parser.error(f"unknown figures: {', '.join(sorted(only - set(FIGURES)))}")
    if "checksums" in only:
        with tempfile.TemporaryDirectory() as directory:
            checksum_cost(200_000 if args.quick else 2_000_000, directory)
    if "scheduler" in only:
        scheduler_cost()
        catch_up_scheduler_cost()
    if "source" in only:
        source_choice()
    if "zerocopy" in only:
        with tempfile.TemporaryDirectory() as directory:
            zero_copy(6 if args.quick else 20, 20_000 if args.quick else 100_000, directory)
    if not only & {"insert", "fetch", "catchup", "memory"}:
        return
    with tempfile.TemporaryDirectory() as directory:
        rs = make_replica_set(directory, 3, test_commands=True)
        rs.start()
        try:
            rs.initiate()
            rs.client().bench.command({"createPartsTable": "ins", **TABLE})
            if "insert" in only:
                insert_rate(rs, 10_000, 5 if args.quick else 20, directory)
                insert_rate(rs, 100_000, 2 if args.quick else 5, directory)
            if "fetch" in only:
                fetch_speed(rs, 20 if args.quick else 200, directory)
            if "catchup" in only:
                catch_up(rs, 200 if args.quick else 1000)
            if "memory" in only:
                memory_after_parts(rs, 10_000 if args.quick else 100_000)
        finally:
            rs.stop()


if __name__ == "__main__":
    main()
