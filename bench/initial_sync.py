"""Initial-sync benchmark: documents/s for a new member cloning a loaded primary.

A one-member set is loaded with `--docs` small documents (`{_id, n, s}`, ~50 bytes
of BSON each) in `insert_many` batches of 10,000 (`w:1`), plus one secondary index.
Then, in the same run:

* baseline: a plain pymongo `find()` reading every document from the primary;
* initial sync: a second member (votes 0, priority 0, so the primary keeps its
  majority) is added with `replSetReconfig`, and the time from the reconfig to the
  new member reporting SECONDARY is measured (its `initialSyncStatus` supplies the
  clone and apply split).

It prints documents/s for the load, the read and the initial sync, the ratio of the
initial sync rate to the read rate, the CPU of both members during the sync and
their peak RSS (`VmHWM`).

    python -m bench.initial_sync [--docs 1000000]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from typing import Any

from pymongo import MongoClient

from tests.support.members import Member, wait_for

BATCH = 10_000
SYNC_TIMEOUT_S = 1800.0


def _proc_cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _peak_rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return 0.0


def _load(client: MongoClient[dict[str, Any]], docs: int) -> float:
    coll = client.bench.docs
    started = time.perf_counter()
    for first in range(0, docs, BATCH):
        coll.insert_many([{"_id": i, "n": i, "s": "abcdefgh"} for i in range(first, min(first + BATCH, docs))],
                         ordered=False)
    coll.create_index("n")
    return time.perf_counter() - started


def _read_all(client: MongoClient[dict[str, Any]]) -> tuple[int, float]:
    started = time.perf_counter()
    count = sum(1 for _ in client.bench.docs.find())
    return count, time.perf_counter() - started


def _add_member(primary: Member, new: Member) -> None:
    with primary.direct_client() as client:
        config = client.admin.command("replSetGetConfig")["config"]
        config["members"].append({"_id": len(config["members"]), "host": new.host, "votes": 0, "priority": 0})
        config["version"] += 1
        client.admin.command("replSetReconfig", config)


def _status(member: Member) -> dict[str, Any]:
    with member.direct_client() as client:
        return dict(client.admin.command("replSetGetStatus"))


def main(docs: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        primary = Member(dbpath=os.path.join(tmp, "primary"))
        new = Member(dbpath=os.path.join(tmp, "new"))
        try:
            primary.start()
            primary.initiate()
            client: MongoClient[dict[str, Any]] = MongoClient(primary.uri)
            with client:
                load_s = _load(client, docs)
                count, read_s = _read_all(client)
            assert count == docs, (count, docs)
            new.start()
            assert primary.process is not None and new.process is not None
            cpu_primary, cpu_new = _proc_cpu_s(primary.process.pid), _proc_cpu_s(new.process.pid)
            started = time.perf_counter()
            _add_member(primary, new)
            wait_for(lambda: _status(new)["myState"] == 2, SYNC_TIMEOUT_S, "the new member to become SECONDARY",
                     interval_s=0.05)
            sync_s = time.perf_counter() - started
            cpu_primary = _proc_cpu_s(primary.process.pid) - cpu_primary
            cpu_new = _proc_cpu_s(new.process.pid) - cpu_new
            peak_primary, peak_new = _peak_rss_mb(primary.process.pid), _peak_rss_mb(new.process.pid)
            status = _status(new).get("initialSyncStatus", {})
            with new.direct_client(readPreference="secondary") as client:
                synced = client.bench.docs.count_documents({})
        finally:
            new.stop()
            primary.stop()
    assert synced == docs, (synced, docs)
    read_rate, sync_rate = docs / read_s, docs / sync_s
    print(f"documents:                  {docs:>12,}")
    print(f"load (insert_many, w:1):    {docs / load_s:>12,.0f} docs/s  ({load_s:.1f} s)")
    print(f"baseline find() read:       {read_rate:>12,.0f} docs/s  ({read_s:.1f} s)")
    print(f"initial sync to SECONDARY:  {sync_rate:>12,.0f} docs/s  ({sync_s:.1f} s; "
          f"{status.get('approxTotalBytesCopied', 0) / 1e6:.1f} MB copied, "
          f"{status.get('appliedOps', 0)} entries applied)")
    print(f"initial sync / find():      {sync_rate / read_rate:>12.2f}")
    print(f"CPU during the sync:        primary {cpu_primary / sync_s:.2f} cores, "
          f"new member {cpu_new / sync_s:.2f} cores")
    print(f"peak RSS:                   primary {peak_primary:.0f} MB (load, read and sync), "
          f"new member {peak_new:.0f} MB")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--docs", type=int, default=1_000_000)
    main(parser.parse_args().docs)
