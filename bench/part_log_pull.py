"""What the part log's runner adds to every commit: reading the new oplog entries back once.

    python -m bench.part_log_pull [--entries 300000] [--reads 20000]

Each member's `PartsManager` pulls the entries a commit added (one indexed oplog read, a byte search
for `.system.parts` before decoding anything, and one more read that finds nothing). This times that
pull on an oplog of `--entries` entries, for 1 and 10 new entries, next to a baseline measured in the
same run: the read the sync source's `getMore` does for the same entries (`oplog_after` alone).
"""

from __future__ import annotations

import argparse
import tempfile
import time

import bson

from oplog.sqlite_store import SQLiteStore
from replset.parts.manager import MARKER


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--entries", type=int, default=300_000)
    parser.add_argument("--reads", type=int, default=20_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as directory:
        store = SQLiteStore(directory)
        rows = [(key, bson.encode({"ts": key, "ns": "app.c", "o": {"_id": key, "pad": "x" * 100}}))
                for key in range(1, args.entries + 1)]
        for start in range(0, len(rows), 10_000):
            txn = store.begin()
            txn.append_oplog(rows[start:start + 10_000])
            store.commit()
        reader = store.reader
        print(f"oplog of {args.entries:,} entries; {args.reads:,} reads each")
        for new in (1, 10):
            after = args.entries - new

            def getmore_read(after: int = after) -> None:
                reader.oplog_after(after, 1000)

            def pull(after: int = after) -> None:
                seen = after
                while rows := reader.oplog_after(seen, 1000):
                    for key, blob in rows:
                        seen = key
                        if MARKER in blob:
                            bson.decode(blob)

            timings = {}
            for name, fn in (("getMore read", getmore_read), ("part-log pull", pull)):
                started = time.perf_counter()
                for _ in range(args.reads):
                    fn()
                timings[name] = (time.perf_counter() - started) / args.reads * 1e6
            print(f"{new:>3} new entries: getMore read {timings['getMore read']:.1f} us, part-log pull "
                  f"{timings['part-log pull']:.1f} us, ratio {timings['part-log pull'] / timings['getMore read']:.2f}")
        store.close()


if __name__ == "__main__":
    main()
