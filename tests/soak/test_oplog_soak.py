"""Long runs, behind `make soak`: 1,000,000 entries through a small capped oplog."""

from __future__ import annotations

from typing import Any

import pytest
from pymongo import MongoClient

from tests.support.members import Member, wait_for
from tests.support.members import rss_kb as _rss_kb

pytestmark = pytest.mark.soak


def test_a_million_entries_through_a_4mb_oplog(tmp_path: Any) -> None:
    m = Member(dbpath=str(tmp_path / "db"), extra_args=["--oplogSizeMB", "4"])
    m.start()
    try:
        m.initiate()
        assert m.process is not None
        with MongoClient(m.uri, serverSelectionTimeoutMS=10000) as client:
            coll = client.db.c
            rss = []
            for round_ in range(100):
                coll.insert_many([{"r": round_, "i": i} for i in range(10_000)])
                coll.delete_many({"r": round_})  # keep the data small; the log sees 2 entries a document
                if round_ % 10 == 9:
                    rss.append(_rss_kb(m.process.pid))
            oplog = client.local["oplog.rs"]

            def trimmed() -> bool:
                stats = next(oplog.aggregate([{"$collStats": {"storageStats": {}}}]))["storageStats"]
                return stats["size"] <= 4 * 1024 * 1024

            wait_for(trimmed, 60, "the oplog to be trimmed under 4 MB")
            newest = oplog.find_one({"ns": "db.c"}, sort=[("$natural", -1)])
            assert newest["op"] == "d"
            print("RSS (kB) every 200,000 entries:", rss)
            assert max(rss[2:]) - rss[1] < 50_000, rss
    finally:
        m.stop()
