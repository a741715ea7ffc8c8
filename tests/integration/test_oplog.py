"""local.oplog.rs as drivers and mongosh see it: tailing, natural order, stats, trimming."""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from pymongo import CursorType, MongoClient

from tests.support.members import Member, rss_kb, wait_for


def test_tailable_await_data_cursor_sees_a_write_within_50ms(member: Member) -> None:
    received: queue.Queue[tuple[float, dict[str, Any]]] = queue.Queue()
    with member.direct_client() as reader_client, member.direct_client() as writer_client:
        oplog = reader_client.local["oplog.rs"]
        last = oplog.find_one(sort=[("$natural", -1)])
        cursor = oplog.find({"ts": {"$gt": last["ts"]}, "ns": "tail.c"},
                            cursor_type=CursorType.TAILABLE_AWAIT).max_await_time_ms(5000)

        def tail() -> None:
            deadline = time.monotonic() + 30
            got = 0
            while got < 5 and cursor.alive and time.monotonic() < deadline:
                try:
                    entry = cursor.next()  # a getMore that waits for new entries
                except StopIteration:  # an empty batch after maxAwaitTimeMS; the cursor stays open
                    continue
                received.put((time.perf_counter(), entry))
                got += 1

        thread = threading.Thread(target=tail, daemon=True)
        thread.start()
        writer_client.admin.command("ping")
        latencies = []
        for i in range(5):
            started = time.perf_counter()
            writer_client.tail.c.insert_one({"_id": i})
            at, entry = received.get(timeout=10)
            assert entry["o"] == {"_id": i} and entry["op"] == "i"
            latencies.append(at - started)
        thread.join(10)
        cursor.close()
    assert sorted(latencies)[2] < 0.05, latencies


def test_print_replication_info_pieces(member: Member) -> None:
    with member.direct_client() as client:
        assert "oplog.rs" in client.local.list_collection_names()
        stats = next(client.local["oplog.rs"].aggregate([{"$collStats": {"storageStats": {}}}]))
        assert stats["storageStats"]["maxSize"] == 1024 * 1024 * 1024
        assert stats["storageStats"]["size"] > 0
        first = client.local["oplog.rs"].find().sort("$natural", 1).limit(1).next()
        last = client.local["oplog.rs"].find().sort("$natural", -1).limit(1).next()
        assert first["ts"] < last["ts"]
        assert first["o"] == {"msg": "initiating set"}
        assert client.local["system.replset"].count_documents({}) == 1


@pytest.fixture()
def small_oplog_member(start_member: Callable[..., Member]) -> Member:
    return start_member("--oplogSizeMB", "1")


def test_capped_oplog_keeps_the_newest_entries_and_flat_memory(small_oplog_member: Member) -> None:
    m = small_oplog_member
    assert m.process is not None
    with MongoClient(m.uri, serverSelectionTimeoutMS=10000) as client:
        coll = client.db.c
        rss = []
        for round_ in range(6):
            coll.insert_many([{"round": round_, "i": i, "pad": "x" * 40} for i in range(5000)])
            rss.append(rss_kb(m.process.pid))
        oplog = client.local["oplog.rs"]

        def trimmed() -> bool:
            stats = next(oplog.aggregate([{"$collStats": {"storageStats": {}}}]))["storageStats"]
            return stats["size"] <= 1024 * 1024

        wait_for(trimmed, 20, "the oplog to be trimmed under 1 MB")
        newest = oplog.find_one({"ns": "db.c"}, sort=[("$natural", -1)])
        assert newest["o"]["round"] == 5 and newest["o"]["i"] == 4999
        oldest = oplog.find_one({"ns": "db.c"}, sort=[("$natural", 1)])
        assert oldest["o"].get("round", 0) >= 3  # the oldest rounds are gone
        assert coll.count_documents({}) == 30000  # trimming the log never touches the data
    # 30,000 entries passed through a 1 MB oplog: memory did not grow with them.
    assert rss[-1] - rss[1] < 30_000, rss

