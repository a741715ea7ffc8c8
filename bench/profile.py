"""Where a member's CPU goes under a write load: py-spy samples of the primary and a secondary, summed.

Starts a three-member set, runs one load, records each member with `py-spy record` (raw stacks) while it
runs, and prints for each the frames that hold the most samples: by themselves ("self") and with what
they call ("inclusive"). With `--gil` only the samples where the thread held the GIL count (the event
loop's own work). Percentages are of the member's samples.

    python -m bench.profile [--load w1-c1|majority-c1|majority-c64] [--seconds S] [--gil] [--top N]
"""

from __future__ import annotations

import argparse
import collections
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from pymongo import MongoClient
from pymongo.write_concern import WriteConcern

from bench.wire_load import insert_message, run_load
from tests.support.members import Member
from tests.support.replica_set import make_replica_set

RATE_HZ = 300


def _pymongo_load(member: Member, w: int | str, seconds: float) -> None:
    with MongoClient(member.host, directConnection=True) as client:
        coll = client.bench.get_collection("c", write_concern=WriteConcern(w=w))
        end = time.monotonic() + seconds
        n = 0
        while time.monotonic() < end:
            coll.insert_one({"n": n, "pad": "x" * 64})
            n += 1


def _summary(raw: Path, top: int) -> list[str]:
    own: collections.Counter[str] = collections.Counter()
    within: collections.Counter[str] = collections.Counter()
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack:
            continue
        n = int(count)
        total += n
        frames = stack.split(";")
        own[frames[-1]] += n
        for frame in set(frames):
            within[frame] += n
    lines = [f"  {total} samples; self:"]
    lines += [f"  {n / total * 100:5.1f}% {frame}" for frame, n in own.most_common(top)]
    lines.append("  inclusive:")
    lines += [f"  {n / total * 100:5.1f}% {frame}" for frame, n in within.most_common(2 * top)]
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--load", choices=("w1-c1", "majority-c1", "majority-c64"), default="majority-c64")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--gil", action="store_true")
    parser.add_argument("--top", type=int, default=25)
    args = parser.parse_args()
    # The one installed beside this interpreter (the project's virtualenv) when it is not on PATH.
    py_spy = shutil.which("py-spy") or shutil.which("py-spy", path=str(Path(sys.executable).parent))
    if py_spy is None:
        raise SystemExit("py-spy is not installed (make install installs it with the dev dependencies)")
    with tempfile.TemporaryDirectory(prefix="bench-profile-") as base:
        rs = make_replica_set(base, 3)
        rs.start()
        try:
            rs.initiate()
            primary = rs.wait_primary()
            secondary = next(m for m in rs.members if m is not primary)
            w: int | str = 1 if args.load.startswith("w1") else "majority"
            port = int(primary.host.rsplit(":", 1)[1])
            if args.load.endswith("c64"):
                message = insert_message("c", "bench", w)
                run_load(port, message, 64, 2.0)   # warm-up
                load = threading.Thread(target=run_load, args=(port, message, 64, args.seconds + 2))
            else:
                _pymongo_load(primary, w, 2.0)
                load = threading.Thread(target=_pymongo_load, args=(primary, w, args.seconds + 2))
            load.start()
            time.sleep(1.0)
            records = {}
            for name, member in (("primary", primary), ("secondary", secondary)):
                assert member.process is not None
                out = Path(base) / f"{name}.txt"
                cmd = [py_spy, "record", "--nonblocking", "-r", str(RATE_HZ), "-d", str(int(args.seconds)),
                       "-f", "raw", "-o", str(out), "-p", str(member.process.pid)] + (["--gil"] if args.gil else [])
                records[name] = (out, subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
            for _out, proc in records.values():
                proc.wait()
            load.join()
            print(f"{args.load}, {args.seconds:g} s, {RATE_HZ} Hz{', GIL held only' if args.gil else ''}")
            for name, (out, _proc) in records.items():
                print(f"{name}:")
                print("\n".join(_summary(out, args.top)))
        finally:
            rs.stop()


if __name__ == "__main__":
    main()
