"""Parts tables on a real set: createPartsTable / dropPartsTable replicate at w:"majority", bad
definitions and misuse get MongoDB codes, and the part log's state is not the client's to write."""

from __future__ import annotations

import asyncio
import datetime
import os
import urllib.error
import urllib.request
from typing import Any

import aiohttp
import pytest
from pymongo import ReadPreference
from pymongo.errors import OperationFailure

from oplog.parts import part_files as pf
from sync.part_fetch import FetchFailed, fetch_part
from tests.support.members import Member, wait_for
from tests.support.replica_set import ReplicaSet

EVENTS = {"columns": [{"name": "ts", "type": "timestamp[ms]"}, {"name": "user", "type": "string"},
                      {"name": "n", "type": "int64", "default": 0}],
          "partitionBy": "toYYYYMM(ts)", "orderBy": ["user", "ts"]}


def _code(fn: Any) -> int:
    with pytest.raises(OperationFailure) as err:
        fn()
    return int(err.value.code or 0)


def test_a_parts_table_is_created_on_every_member_and_dropped(rs: ReplicaSet) -> None:
    db = rs.client().analytics
    reply = db.command({"createPartsTable": "events", **EVENTS})
    assert reply["ok"] == 1.0 and "writeConcernError" not in reply
    for member in rs.members:   # acknowledged at w:"majority"; every member gets it
        tables = rs.direct(member).analytics.get_collection(
            "system.parts", read_preference=ReadPreference.SECONDARY_PREFERRED)
        doc = wait_for(lambda t=tables: t.find_one({"_id": "events"}), 10, f"the definition on {member.host}")
        assert doc["partitionBy"] == "toYYYYMM(ts)" and doc["orderBy"] == ["user", "ts"]
        assert [c["name"] for c in doc["columns"]] == ["ts", "user", "n"] and doc["metadataVersion"] == 0
    assert _code(lambda: db.command({"createPartsTable": "events", **EVENTS})) == 48
    assert db.command({"dropPartsTable": "events"})["ok"] == 1.0
    assert db["system.parts"].find_one({"_id": "events"}) is None
    assert _code(lambda: db.command({"dropPartsTable": "events"})) == 26


@pytest.mark.parametrize(("spec", "code"), [
    ({"columns": [{"name": "a", "type": "varchar"}]}, 2),
    ({"columns": [{"name": "a", "type": "int64"}], "partitionBy": "toYYYYMM(a)"}, 2),
    ({"columns": []}, 9),
    ({"columns": "a"}, 14),
    ({"columns": [{"name": "a", "type": "int64"}], "nope": 1}, 40415),
    ({"columns": [{"name": "a", "type": "int64"}], "settings": {"zeroCopy": 1}}, 2),
    # Zero-copy keeps part files in the set's shared storage: these members were started without one.
    ({"columns": [{"name": "a", "type": "int64"}], "settings": {"zeroCopy": True}}, 2),
])
def test_bad_definitions_get_mongodb_codes(rs: ReplicaSet, spec: dict[str, Any], code: int) -> None:
    assert _code(lambda: rs.client().analytics.command({"createPartsTable": "bad", **spec})) == code


def test_the_part_log_state_is_not_the_clients_to_write(rs: ReplicaSet) -> None:
    db = rs.client().analytics
    assert _code(lambda: db["system.parts"].insert_one({"_id": "forged", "columns": []})) == 73
    assert _code(lambda: db["system.parts.events.log"].insert_one({"_id": "log-1"})) == 73


def _rows(n: int, month: int = 5) -> list[dict[str, Any]]:
    return [{"ts": datetime.datetime(2024, month, 1 + i % 28), "user": f"u{i % 7}", "n": i} for i in range(n)]


def _part_dirs(member: Member, ns: str) -> list[str]:
    directory = os.path.join(member.dbpath, "parts", ns)
    return sorted(os.listdir(directory)) if os.path.isdir(directory) else []


def test_a_block_becomes_a_part_per_partition_and_a_repeat_is_deduplicated(rs: ReplicaSet) -> None:
    db = rs.client().shop
    db.command({"createPartsTable": "events", **EVENTS})
    primary = rs.wait_primary()
    rows = _rows(40, 5) + _rows(10, 6)
    first = db.command({"insertBlock": "events", "rows": rows})
    assert first["inserted"] == 2 and first["deduplicated"] == 0 and "writeConcernError" not in first
    parts = {b["partition"]: b["part"] for b in first["blocks"]}
    assert parts == {"202405": "202405_1_1_0", "202406": "202406_1_1_0"}
    assert _part_dirs(primary, "shop.events") == ["202405_1_1_0", "202406_1_1_0"]
    assert pf.verify_part(os.path.join(primary.dbpath, "parts", "shop.events", "202405_1_1_0")) is None
    # The same rows in another order: the same blocks; not an error, and no new part.
    again = db.command({"insertBlock": "events", "rows": list(reversed(rows))})
    assert again["inserted"] == 0 and again["deduplicated"] == 2
    assert {b["part"] for b in again["blocks"]} == set(parts.values())
    assert _part_dirs(primary, "shop.events") == ["202405_1_1_0", "202406_1_1_0"]   # temporaries gone
    # A dedup token makes a retry a duplicate whatever its rows; new rows get the partition's next number.
    token = db.command({"insertBlock": "events", "rows": _rows(3, 5), "dedupToken": "batch-7"})
    assert [b["part"] for b in token["blocks"]] == ["202405_2_2_0"]
    retry = db.command({"insertBlock": "events", "rows": _rows(4, 5), "dedupToken": "batch-7"})
    assert retry["deduplicated"] == 1 and retry["blocks"][0]["part"] == "202405_2_2_0"
    for member in rs.members:   # the log replicates (fetching the parts' bytes comes with the queue runner)
        log = rs.direct(member).shop.get_collection("system.parts.events.log",
                                                    read_preference=ReadPreference.SECONDARY_PREFERRED)
        wait_for(lambda lg=log: lg.count_documents({}) == 3, 10, f"the part log on {member.host}")
    entry = db["system.parts.events.log"].find_one({"part": "202405_1_1_0"})
    assert entry["type"] == "GET_PART" and entry["source"] == primary.host and entry["rows"] == 40


def test_bad_blocks_get_mongodb_codes(rs: ReplicaSet) -> None:
    db = rs.client().shop2
    db.command({"createPartsTable": "events", **EVENTS})
    assert _code(lambda: db.command({"insertBlock": "nope", "rows": _rows(1)})) == 26
    assert _code(lambda: db.command({"insertBlock": "events", "rows": [{"bogus": 1}]})) == 2
    assert _code(lambda: db.command({"insertBlock": "events", "rows": [{"n": "x"}]})) == 2
    assert _code(lambda: db.command({"insertBlock": "events", "rows": []})) == 2
    assert _code(lambda: db.command({"insertBlock": "events"})) == 2
    assert _code(lambda: db.command({"insertBlock": "events", "arrow": b"\x00\x00\x00\x80" + bytes(12)})) == 2
    assert _code(lambda: db.command({"insertBlock": "events", "rows": _rows(1), "insertQuorum": 9})) == 100
    assert _code(lambda: db.command({"insertBlock": "events", "rows": _rows(1), "insertQuorum": -1})) == 2
    assert _code(lambda: db.command({"insertBlock": "events", "rows": _rows(1), "insertQuorum": "most"})) == 2
    assert _code(lambda: db.command({"insertStatus": "events"})) == 2
    assert _part_dirs(rs.wait_primary(), "shop2.events") == []


def _log_checksums(doc: dict[str, Any]) -> dict[str, tuple[int, str]]:
    return {c["file"]: (c["size"], c["sha256"]) for c in doc["checksums"]}


async def _fetch(source: Member, ns: str, part: str, checksums: dict[str, tuple[int, str]], directory: str) -> str:
    async with aiohttp.ClientSession() as session:
        return await fetch_part(session, f"127.0.0.1:{source.http_port}", ns, part, checksums, directory,
                                progress_timeout_s=5)


def test_a_part_is_fetched_byte_for_byte_and_bad_requests_get_no_file(rs: ReplicaSet, tmp_path: Any) -> None:
    db = rs.client().fetchdb
    db.command({"createPartsTable": "events", **EVENTS})
    primary = rs.wait_primary()
    reply = db.command({"insertBlock": "events", "rows": _rows(200)})
    part = reply["blocks"][0]["part"]
    checksums = _log_checksums(db["system.parts.events.log"].find_one({"part": part}))
    path = asyncio.run(_fetch(primary, "fetchdb.events", part, checksums, str(tmp_path)))
    assert pf.verify_part(path) is None and sorted(os.listdir(tmp_path)) == [part]
    assert pf.read_checksums(path) == checksums
    # A recorded checksum the bytes do not match: the fetch fails and leaves nothing.
    forged = dict(checksums, **{pf.DATA_FILE: (checksums[pf.DATA_FILE][0], "0" * 64)})
    with pytest.raises(FetchFailed):
        asyncio.run(_fetch(primary, "fetchdb.events", part, forged, str(tmp_path / "again")))
    assert os.listdir(tmp_path / "again") == []
    base = f"http://127.0.0.1:{primary.http_port}/parts"
    for url, status in [(f"{base}/fetchdb.events/{part}/..%2F..%2Fmember.log", 400),
                        (f"{base}/fetchdb.events/..%2F..%2F/data.parquet", 400),
                        (f"{base}/fetchdb.events/not_a_part/data.parquet", 400),
                        (f"{base}/fetchdb.nope/{part}/data.parquet", 404),
                        (f"{base}/fetchdb.events/all_9_9_0/data.parquet", 404)]:
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(url, timeout=5)
        assert err.value.code == status, url


def test_every_member_fetches_an_inserted_part_byte_for_byte(rs: ReplicaSet) -> None:
    db = rs.client().everywhere
    db.command({"createPartsTable": "events", **EVENTS})
    reply = db.command({"insertBlock": "events", "rows": _rows(500, 5) + _rows(30, 7)})
    parts = sorted(b["part"] for b in reply["blocks"])
    primary = rs.wait_primary()
    expected = {p: pf.read_checksums(os.path.join(primary.dbpath, "parts", "everywhere.events", p)) for p in parts}
    for member in rs.members:
        wait_for(lambda m=member: _part_dirs(m, "everywhere.events") == parts, 20, f"the parts on {member.host}")
        for part in parts:
            path = os.path.join(member.dbpath, "parts", "everywhere.events", part)
            assert pf.verify_part(path) is None and pf.read_checksums(path) == expected[part]
    db.command({"dropPartsTable": "events"})
    for member in rs.members:
        wait_for(lambda m=member: _part_dirs(m, "everywhere.events") == [], 20, f"the parts gone on {member.host}")
