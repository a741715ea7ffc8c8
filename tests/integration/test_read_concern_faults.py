"""Read concerns under faults, on real processes: writers with `w:1` and `w:"majority"`, readers with
`readConcern: "majority"` on every member and `"linearizable"` on the primary, while the nemesis kills,
pauses and partitions members (deposing primaries, so `w:1` writes get rolled back).

Afterwards, once the set converged:

* no majority or linearizable read returned a write that is not in the final data (a rolled-back
  write: the only writes are inserts of unique `_id`s, so every document read must still be there);
* every linearizable read saw every `w:"majority"` write acknowledged before the read began;
* reads were answered at all (the check is not empty).

Set NEMESIS_SEED to replay a schedule; `make soak` runs longer ones.
"""

from __future__ import annotations

import asyncio
import os
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from motor.motor_asyncio import AsyncIOMotorClient
from pymongo import MongoClient, ReadPreference
from pymongo.errors import PyMongoError
from pymongo.read_concern import ReadConcern
from pymongo.write_concern import WriteConcern

from tests.integration.test_nemesis import seed_for, wait_converged
from tests.support.nemesis import nemesis_run
from tests.support.replica_set import FAST_SETTINGS, ReplicaSet, make_replica_set

CLIENT_OPTIONS: dict[str, Any] = {
    "retryWrites": False, "wTimeoutMS": 5000, "socketTimeoutMS": 8000, "connectTimeoutMS": 2000,
    "serverSelectionTimeoutMS": 5000, "heartbeatFrequencyMS": 500,
}
READ_MAX_TIME_MS = 3000
WRITE_PACE_S = 0.01   # each writer's pause between writes: a collection a read can take whole
READ_PACE_S = 0.05
CONVERGE_TIMEOUT_S = 90.0


@dataclass(slots=True)
class Write:
    key: str
    w: Any
    started: float
    ended: float = 0.0
    acknowledged: bool = False


@dataclass(slots=True)
class Read:
    member: str
    level: str
    started: float
    ended: float
    keys: frozenset[str]


@dataclass
class Record:
    writes: list[Write] = field(default_factory=list)
    reads: list[Read] = field(default_factory=list)
    read_errors: int = 0


async def writer(client: AsyncIOMotorClient[dict[str, Any]], w: Any, record: Record, stop: asyncio.Event) -> None:
    coll = client.app.get_collection("rc", write_concern=WriteConcern(w=w, wtimeout=5000))
    for seq in range(10**9):
        if stop.is_set():
            return
        op = Write(f"w{w}-{seq}", w, time.monotonic())
        record.writes.append(op)
        try:
            await coll.insert_one({"_id": op.key})
            op.acknowledged = True
        except PyMongoError:
            pass
        op.ended = time.monotonic()
        await asyncio.sleep(WRITE_PACE_S)


async def reader(client: AsyncIOMotorClient[dict[str, Any]], name: str, level: str, record: Record,
                 stop: asyncio.Event) -> None:
    coll = client.app.get_collection("rc", read_concern=ReadConcern(level),
                                      read_preference=ReadPreference.PRIMARY if level == "linearizable"
                                      else ReadPreference.SECONDARY_PREFERRED)
    while not stop.is_set():
        started = time.monotonic()
        try:
            docs = await coll.find({}, {"_id": 1}, max_time_ms=READ_MAX_TIME_MS).to_list(None)
        except PyMongoError:
            record.read_errors += 1
        else:
            record.reads.append(Read(name, level, started, time.monotonic(), frozenset(d["_id"] for d in docs)))
        await asyncio.sleep(READ_PACE_S)


def final_keys(rs: ReplicaSet) -> set[str]:
    wait_converged(rs, CONVERGE_TIMEOUT_S)
    primary = rs.wait_primary()
    with MongoClient(f"mongodb://{primary.host}/?directConnection=true") as client:
        return {d["_id"] for d in client.app.rc.find({}, {"_id": 1})}


def check(record: Record, final: set[str]) -> list[str]:
    problems = []
    for read in record.reads:
        rolled_back = read.keys - final
        if rolled_back:
            problems.append(f"a {read.level} read on {read.member} returned {len(rolled_back)} rolled-back "
                            f"writes, e.g. {sorted(rolled_back)[:3]}")
    majority_acks = [w for w in record.writes if w.acknowledged and w.w == "majority"]
    for read in record.reads:
        if read.level != "linearizable":
            continue
        missed = [w.key for w in majority_acks if w.ended < read.started and w.key not in read.keys]
        if missed:
            problems.append(f"a linearizable read missed {len(missed)} writes acknowledged before it began, "
                            f"e.g. {missed[:3]}")
    return problems


async def run(tmp_path: Path, seed: int, duration_s: float) -> None:
    rs = make_replica_set(str(tmp_path), 3)
    record = Record()
    async with nemesis_run(rs, seed, dict(FAST_SETTINGS)) as run:
        stop = run.stop_workload
        for w in (1, "majority"):
            client: AsyncIOMotorClient[dict[str, Any]] = AsyncIOMotorClient(rs.uri, **CLIENT_OPTIONS)
            run.clients.append(client)
            run.spawn(writer(client, w, record, stop))
        linearizable: AsyncIOMotorClient[dict[str, Any]] = AsyncIOMotorClient(rs.uri, **CLIENT_OPTIONS)
        run.clients.append(linearizable)
        run.spawn(reader(linearizable, "the primary", "linearizable", record, stop))
        for m in rs.members:
            direct: AsyncIOMotorClient[dict[str, Any]] = AsyncIOMotorClient(
                f"mongodb://{m.host}/?directConnection=true", **CLIENT_OPTIONS)
            run.clients.append(direct)
            run.spawn(reader(direct, m.host, "majority", record, stop))
        await run.faults(duration_s)
        stop.set()
        await asyncio.wait_for(asyncio.gather(*run.tasks), 60)
        final = await asyncio.to_thread(final_keys, rs)
    nemesis = run.nemesis
    problems = check(record, final)
    by_level = {level: sum(r.level == level for r in record.reads) for level in ("majority", "linearizable")}
    rolled_back_w1 = sum(w.acknowledged and w.w == 1 and w.key not in final for w in record.writes)
    print(f"read concerns, seed {seed}: faults {dict(nemesis.counts)}, writes acknowledged "
          f"{sum(w.acknowledged for w in record.writes)} (w:1 rolled back {rolled_back_w1}), reads {by_level}, "
          f"read errors {record.read_errors}, problems {len(problems)}")
    if problems:
        print(nemesis.describe())
    assert not problems, f"seed {seed}: " + "; ".join(problems[:5])
    assert by_level["majority"] > 0 and by_level["linearizable"] > 0, by_level


async def test_majority_and_linearizable_reads_under_faults(tmp_path: Path) -> None:
    await run(tmp_path, seed_for(8103), duration_s=18)


@pytest.mark.soak
async def test_majority_and_linearizable_reads_under_faults_soak(tmp_path: Path) -> None:
    await run(tmp_path, seed_for(random.SystemRandom().randrange(1, 10**6)),
              duration_s=float(os.environ.get("NEMESIS_SOAK_S", "180")))
