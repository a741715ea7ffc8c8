"""Oplog benchmarks: apply rate, and what writing the oplog costs a single-member write.

    python -m bench.oplog [--entries 100000] [--batch 1000]

1. Apply rate: 100,000 mixed entries (inserts, `$set` updates, deletes) produced
   by the real write path, applied in replay mode in batches of `--batch` (one
   transaction each, as a secondary would).
2. Write cost: inserts/s through the write path with the oplog (entry stamped,
   applied and appended) against direct store inserts without it, both grouped
   `--batch` per commit. The ratio is measured in the same run.
"""

from __future__ import annotations

import argparse
import datetime
import os
import tempfile
import time
from typing import Any

import bson

from base.optime import NULL_OPTIME
from oplog.apply import apply_entry
from oplog.codec_options import DOC_OPTIONS
from oplog.log_writer import LogWriter
from oplog.sqlite_store import SQLiteStore
from oplog.writes import WriteEnv, delete_documents, insert_documents, update_documents

NOW = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)
NS = "bench.c"


def _produce(store: SQLiteStore, n: int, batch: int) -> list[dict[str, Any]]:
    writer = LogWriter(NULL_OPTIME)
    i = 0
    while i < n:
        txn = store.begin()
        env = WriteEnv(txn=txn, log=writer, term=1, now=NOW)
        for _ in range(batch // 4):
            insert_documents(env, NS, [{"_id": i, "n": i, "s": "x" * 32}, {"_id": i + 1, "n": 0}], True)
            update_documents(env, NS, [{"q": {"_id": i}, "u": {"$inc": {"n": 1}}}], True)
            delete_documents(env, NS, [{"q": {"_id": i + 1}, "limit": 1}], True)
            i += 4
        store.commit()
    rows = store.reader.oplog_after(0, n * 2)
    return [bson.decode(blob, DOC_OPTIONS) for _k, blob in rows]


def apply_rate(tmp: str, n: int, batch: int) -> float:
    source = SQLiteStore(os.path.join(tmp, "source"))
    entries = _produce(source, n, batch)
    source.close()
    target = SQLiteStore(os.path.join(tmp, "target"))
    start = time.perf_counter()
    for k in range(0, len(entries), batch):
        txn = target.begin()
        for entry in entries[k:k + batch]:
            apply_entry(txn, entry, replay=True)
        target.commit()
    elapsed = time.perf_counter() - start
    target.close()
    return len(entries) / elapsed


def insert_rate(tmp: str, n: int, batch: int, *, with_oplog: bool) -> float:
    store = SQLiteStore(os.path.join(tmp, f"insert-{with_oplog}"))
    writer = LogWriter(NULL_OPTIME)
    start = time.perf_counter()
    for k in range(0, n, batch):
        txn = store.begin()
        if with_oplog:
            env = WriteEnv(txn=txn, log=writer, term=1, now=NOW)
            insert_documents(env, NS, [{"_id": j, "s": "x" * 32} for j in range(k, k + batch)], True)
        else:
            for j in range(k, k + batch):
                txn.insert(NS, {"_id": j, "s": "x" * 32})
        store.commit()
    elapsed = time.perf_counter() - start
    store.close()
    return n / elapsed


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--entries", type=int, default=100_000)
    parser.add_argument("--batch", type=int, default=1000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        rate = apply_rate(tmp, args.entries, args.batch)
        print(f"apply: {rate:,.0f} entries/s (mixed i/u/d, batches of {args.batch})")
        without = insert_rate(tmp, args.entries, args.batch, with_oplog=False)
        with_log = insert_rate(tmp, args.entries, args.batch, with_oplog=True)
        print(f"inserts without oplog: {without:,.0f}/s   with oplog: {with_log:,.0f}/s   "
              f"ratio with/without: {with_log / without:.2f}")


if __name__ == "__main__":
    main()
