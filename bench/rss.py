"""Memory benchmark: a member's RSS across rounds of creating and deleting documents.

One member (a one-member set). Each round inserts `--docs` small documents with
`insert_many` (batches of 10,000, `w:1`) and deletes them all with `delete_many({})`;
after each round the member's resident set size is read from `/proc/<pid>/status`
(`VmRSS`). The figure must not keep growing: it is compared with the first round's,
measured in the same run (last/first), and the rounds after the first must level off
(the last round within `MAX_LATE_GROWTH` of the second). Most of the rise over the
first two rounds is SQLite's page cache filling up (64 MiB per connection, a writer
and a reader: bounded by design), not Python objects.

    python -m bench.rss [--rounds 5] [--docs 100000]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from typing import Any

from pymongo import MongoClient

from tests.support.members import Member

BATCH = 10_000
MAX_LATE_GROWTH = 0.10  # last round vs the second: caches are warm by then, so this is growth


def rss_kb(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for pid {pid}")


def _round(client: MongoClient[dict[str, Any]], docs: int) -> float:
    coll = client.bench.rss
    started = time.perf_counter()
    for first in range(0, docs, BATCH):
        coll.insert_many([{"_id": i, "n": i, "s": "abcdefgh" * 4} for i in range(first, min(first + BATCH, docs))],
                         ordered=False)
    deleted = coll.delete_many({}).deleted_count
    assert deleted == docs, (deleted, docs)
    return time.perf_counter() - started


def main(rounds: int, docs: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        member = Member(dbpath=os.path.join(tmp, "db"))
        member.start()
        try:
            member.initiate()
            assert member.process is not None
            pid = member.process.pid
            figures = []
            print(f"start: RSS {rss_kb(pid) / 1024:.1f} MB")
            client: MongoClient[dict[str, Any]] = MongoClient(member.uri)
            with client:
                for n in range(1, rounds + 1):
                    seconds = _round(client, docs)
                    figures.append(rss_kb(pid))
                    print(f"round {n}: {docs:,} inserted and deleted in {seconds:.1f} s; "
                          f"RSS {figures[-1] / 1024:.1f} MB")
        finally:
            member.stop()
    print(f"RSS last/first: {figures[-1] / figures[0]:.2f}")
    if len(figures) >= 3:
        late = figures[-1] / figures[1] - 1
        verdict = "levels off" if late <= MAX_LATE_GROWTH else "KEEPS GROWING"
        print(f"RSS last/second: {figures[-1] / figures[1]:.2f} ({verdict}; limit +{MAX_LATE_GROWTH:.0%})")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--docs", type=int, default=100_000)
    args = parser.parse_args()
    main(args.rounds, args.docs)
