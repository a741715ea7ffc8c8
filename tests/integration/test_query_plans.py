"""No hot-path statement scans the oplog or a collection.

A 3-member set runs with `--traceSQL`, so each member writes down every SQL statement it
runs, values bound. After the set is up and a collection is seeded, the test marks where
the traces end, then drives the hot paths: inserts, updates, replacements, deletes,
findAndModify and upserts with w:"majority" (the secondaries tail the oplog with
`getMore`, apply batches and report positions), reads by `_id`, `replSetGetStatus` as a
command and over HTTP, `hello`, heartbeats all along, and a capped oplog small enough
that trimming runs too. Every distinct statement run in that window is then explained
(`EXPLAIN QUERY PLAN`) against the member's own database file, and any full `SCAN` of
the oplog, a collection or a unique index table fails the test: such a statement costs
O(data) per write, which is how a `min(ts), max(ts)` on every getMore once made each
replicated write cost O(oplog size).
"""

from __future__ import annotations

import json
import os
import re
import sqlite3
from collections.abc import Iterator
from typing import Any

import pytest
from pymongo import ReturnDocument
from pymongo.write_concern import WriteConcern

from oplog.sqlite_store import SQLiteStore
from tests.support.members import Member, wait_for
from tests.support.replica_set import ReplicaSet

# A full scan of one of the tables that grow with the data: the oplog, a collection (c<N>)
# or a unique index (u<N>).
FULL_SCAN = re.compile(r"^SCAN (oplog|c\d+|u\d+)\b")
PLANNED = ("SELECT", "INSERT", "UPDATE", "DELETE", "REPLACE", "WITH")


def full_scans(conn: sqlite3.Connection, statement: str) -> list[str]:
    """The plan lines of `statement` that scan a growing table from end to end."""
    rows = conn.execute("EXPLAIN QUERY PLAN " + statement).fetchall()
    return [row[3] for row in rows if FULL_SCAN.match(row[3])]


def test_the_checker_catches_the_scan_that_once_cost_o_oplog_per_write(tmp_path: Any) -> None:
    store = SQLiteStore(str(tmp_path))
    txn = store.begin()
    txn.create_collection("db.c")
    store.commit()
    conn = sqlite3.connect(store.path)
    try:
        assert full_scans(conn, "SELECT min(ts), max(ts) FROM oplog") == ["SCAN oplog"]
        assert full_scans(conn, "SELECT count(*) FROM c1")  # a count walks the whole table
        assert full_scans(conn, "SELECT min(ts) FROM oplog") == []
        assert full_scans(conn, "SELECT doc FROM c1 WHERE idkey=x'01'") == []
    finally:
        conn.close()
        store.close()


@pytest.fixture()
def traced_set(tmp_path: Any) -> Iterator[ReplicaSet]:
    members = []
    for i in range(3):
        dbpath = str(tmp_path / f"m{i}")
        os.makedirs(dbpath)
        members.append(Member(dbpath=dbpath, extra_args=[
            "--enableTestCommands", "--oplogSizeMB", "1", "--traceSQL", os.path.join(dbpath, "sql.trace")]))
    rs = ReplicaSet(members)
    try:
        rs.start()
        rs.initiate()
        yield rs
    finally:
        rs.stop()


def _trace_path(m: Member) -> str:
    return os.path.join(m.dbpath, "sql.trace")


def _statements_since(path: str, offset: int) -> set[str]:
    with open(path, encoding="utf-8") as f:
        f.seek(offset)
        return {json.loads(line) for line in f if line.strip()}


def _drive_hot_paths(rs: ReplicaSet) -> None:
    client = rs.client()
    coll = client.shop.get_collection("orders", write_concern=WriteConcern(w="majority", wtimeout=30_000))
    for i in range(300):
        coll.insert_one({"_id": 10_000 + i, "sku": f"new-{i}", "qty": i, "pad": "p" * 200})
    coll.insert_many([{"sku": f"bulk-{i}", "qty": i, "pad": "q" * 200} for i in range(3000)])
    for i in range(100):
        coll.update_one({"_id": i}, {"$inc": {"qty": 1}, "$set": {"seen": True}})
        coll.replace_one({"_id": 1000 + i}, {"sku": f"replaced-{i}", "qty": -i})
        coll.delete_one({"_id": 2000 + i})
        coll.find_one_and_update({"_id": 3000 + i}, {"$push": {"tags": "x"}},
                                 return_document=ReturnDocument.AFTER)
        coll.update_one({"_id": 50_000 + i}, {"$set": {"qty": 0, "sku": f"up-{i}"}}, upsert=True)
        assert coll.find_one({"_id": i})["seen"] is True
    coll.with_options(write_concern=WriteConcern(w=3, wtimeout=30_000)).insert_one({"_id": "last", "sku": "last"})
    for m in rs.members:
        rs.status(m)
        rs.http_status(m)
        with m.direct_client() as direct:
            direct.admin.command("hello")


def test_no_hot_path_statement_scans_a_growing_table(traced_set: ReplicaSet) -> None:
    rs = traced_set
    client = rs.client()
    coll = client.shop.get_collection("orders", write_concern=WriteConcern(w=3, wtimeout=30_000))
    coll.create_index("sku", unique=True)
    coll.create_index("qty")
    coll.insert_many([{"_id": i, "sku": f"s{i}", "qty": i, "pad": "x" * 200} for i in range(5000)])
    offsets = {m.host: os.path.getsize(_trace_path(m)) for m in rs.members}

    _drive_hot_paths(rs)
    primary = rs.primary()
    assert primary is not None
    with primary.direct_client() as direct:
        oplog = next(direct.local["oplog.rs"].aggregate([{"$collStats": {"storageStats": {}}}]))["storageStats"]
        assert oplog["size"] <= oplog["maxSize"]  # trimmed while the workload ran

    wait_for(lambda: all(rs.status(m)["myState"] in (1, 2) for m in rs.members), 30, "members to settle")
    statements = {m.host: _statements_since(_trace_path(m), offsets[m.host]) for m in rs.members}
    rs.stop()  # the database files are then complete and quiet

    offenders: dict[str, list[str]] = {}
    explained = 0
    for m in rs.members:
        conn = sqlite3.connect(os.path.join(m.dbpath, SQLiteStore.FILE_NAME))
        try:
            for statement in sorted(statements[m.host]):
                if not statement.lstrip().upper().startswith(PLANNED):
                    continue
                explained += 1
                scans = full_scans(conn, statement)
                if scans:
                    offenders.setdefault(statement[:300], []).extend(f"{m.host}: {s}" for s in scans)
        finally:
            conn.close()
    # Inserts, updates, deletes, the oplog append and trim, getMore, apply, meta: dozens of shapes.
    assert explained >= 20, f"only {explained} statements traced: is --traceSQL working?"
    assert not offenders, "statements that scan a growing table:\n" + "\n".join(
        f"  {stmt}\n    {scans[:3]}" for stmt, scans in offenders.items())
