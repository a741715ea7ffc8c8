"""MongoDB's durability semantics on a real 3-member set, proven with kill -9.

`w:1` is acknowledged once applied (no fsync); `j:true` once this member's journal is
fsynced; `w:"majority"` once a majority has the write durable. The test writes with all
three concerns from concurrent motor clients, then kills every member with SIGKILL at
once in the middle of the stream, restarts them, and checks that every acknowledged
write is there. A process crash loses no committed write at all (the WAL is in the
operating system's page cache), so the `w:1` writes must survive too; what a power cut
may take from `w:1` (up to the 100 ms journal interval) is not something a test on one
machine can show, so the journal flusher's barrier is checked directly instead: after a
`j:true` or `w:"majority"` reply the member's `durableOpTime` has reached the write.
"""

from __future__ import annotations

import asyncio
from typing import Any

from bson.timestamp import Timestamp
from motor.motor_asyncio import AsyncIOMotorClient
from pymongo.errors import PyMongoError
from pymongo.write_concern import WriteConcern

from oplog.sqlite_store import SQLiteStore
from tests.support.members import wait_for
from tests.support.replica_set import ReplicaSet

CONCERNS = {"w1": WriteConcern(w=1), "j": WriteConcern(w=1, j=True),
            "majority": WriteConcern(w="majority", wtimeout=20_000)}
WRITERS_PER_CONCERN = 4


def _optime_ts(status: dict[str, Any], field: str) -> Timestamp:
    return status["optimes"][field]["ts"]


def test_j_and_majority_replies_come_after_the_journal_barrier(rs3: ReplicaSet) -> None:
    primary = rs3.primary()
    assert primary is not None
    client = rs3.client()
    for name in ("j", "majority"):
        coll = client.db.get_collection("barrier", write_concern=CONCERNS[name])
        coll.insert_one({"concern": name})
        with primary.direct_client() as direct:  # the only writer: the newest entry is that write
            written = direct.local["oplog.rs"].find_one({"o.concern": name}, sort=[("$natural", -1)])["ts"]
        status = rs3.status(primary)
        assert _optime_ts(status, "durableOpTime") >= written, (name, status["optimes"])
    # Without a waiting write the flusher still runs within its interval: durable catches up with applied.
    client.db.get_collection("barrier", write_concern=CONCERNS["w1"]).insert_one({"concern": "w1"})
    wait_for(lambda: _optime_ts(rs3.status(primary), "durableOpTime")
             == _optime_ts(rs3.status(primary), "appliedOpTime"), 5, "the journal interval flush")


async def _write_until_killed(uri: str, acked: dict[str, set[int]], stop: asyncio.Event) -> None:
    client: AsyncIOMotorClient[dict[str, Any]] = AsyncIOMotorClient(
        uri, serverSelectionTimeoutMS=2000, retryWrites=False)

    async def writer(name: str, lane: int) -> None:
        coll = client.db.get_collection(f"acked_{name}", write_concern=CONCERNS[name])
        n = lane * 1_000_000
        while not stop.is_set():
            n += 1
            try:
                await coll.insert_one({"_id": n, "pad": "x" * 100})
            except PyMongoError:
                return  # the members are gone: an unacknowledged write proves nothing either way
            acked[name].add(n)

    try:
        await asyncio.gather(*(writer(name, lane) for name in CONCERNS for lane in range(WRITERS_PER_CONCERN)))
    finally:
        client.close()


def test_every_acknowledged_write_survives_kill_9_of_every_member(rs3: ReplicaSet) -> None:
    acked: dict[str, set[int]] = {name: set() for name in CONCERNS}
    old_primary = rs3.primary()
    assert old_primary is not None

    async def run() -> None:
        stop = asyncio.Event()
        task = asyncio.get_running_loop().create_task(_write_until_killed(rs3.uri, acked, stop))
        deadline = asyncio.get_running_loop().time() + 30
        while min(len(ids) for ids in acked.values()) < 300:
            assert asyncio.get_running_loop().time() < deadline, {k: len(v) for k, v in acked.items()}
            await asyncio.sleep(0.05)
        for m in rs3.members:  # all at once, in the middle of the stream
            m.kill()
        stop.set()
        await asyncio.wait_for(task, 30)

    asyncio.run(run())
    # The member that acknowledged them holds every write it acknowledged, whatever the concern (a
    # w:1 write may later be rolled back by an election, by design, but it was not lost to the crash).
    store = SQLiteStore(old_primary.dbpath)
    try:
        for name, ids in acked.items():
            present = {d["_id"] for d in store.reader.scan(f"db.acked_{name}")}
            missing = ids - present
            assert not missing, f"{len(missing)} acknowledged {name} writes lost, e.g. {sorted(missing)[:5]}"
    finally:
        store.close()
    # And whoever the set elects next holds every majority write.
    for m in rs3.members:
        m.start()
    primary = rs3.wait_primary()
    with primary.direct_client() as client:
        present = {d["_id"] for d in client.db["acked_majority"].find({}, {"_id": 1})}
        assert not acked["majority"] - present
