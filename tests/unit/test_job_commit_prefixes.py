"""A job's commit cut by a failover at every point of its transaction (`replset.parts.jobs`): a new
primary may hold any prefix of the commit's oplog entries. Each prefix publishes none of the job or all
of it (through the part-log core, as every member reads the log), and the driver's retry of the commit
(same attempt) or an abort on that primary ends with the job published exactly once, or not at all."""

from __future__ import annotations

import datetime
from collections.abc import Callable
from typing import Any

import bson
import pytest

from base.optime import NULL_OPTIME, OpTime
from oplog.apply import apply_entry
from oplog.codec_options import DOC_OPTIONS
from oplog.entry import insert_entry
from oplog.log_writer import LogWriter
from oplog.parts.jobs import job_id_of
from oplog.parts.part_files import PartFiles
from oplog.parts.queue import ReplicationQueue
from oplog.parts.table import TableDef, parse_table_def
from oplog.parts.table_replica import TableReplica
from oplog.sqlite_store import SQLiteStore
from oplog.writes import WriteEnv, ensure_collection
from replset.parts.insert import Block
from replset.parts.jobs import abort_job_body, commit_job_body, stage_body
from replset.parts.names import state_ns, tables_ns

DB = "db"
TABLE: TableDef = parse_table_def(DB, "t", {"columns": [{"name": "m", "type": "string"}, {"name": "n", "type": "int64"}],
                                            "partitionBy": "m", "orderBy": ["n"]})
NOW = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)
SUMS = {"data.parquet": (10, "a" * 64)}


def _write(store: SQLiteStore, writer: LogWriter, fn: Callable[[WriteEnv], Any]) -> Any:
    env = WriteEnv(store.begin(), writer, 1, NOW)
    out = fn(env)
    store.commit()
    return out


def _entries(store: SQLiteStore, after: int = 0) -> list[dict[str, Any]]:
    return [bson.decode(blob, DOC_OPTIONS) for _key, blob in store.reader.oplog_after(after, 1_000_000)]


def _block(pid: str, stage: str, rows: int) -> Block:
    return Block(pid, stage, "", PartFiles("", rows, 100, SUMS), metadata_version=TABLE.metadata_version)


def _replay(entries: list[dict[str, Any]]) -> tuple[SQLiteStore, LogWriter]:
    store = SQLiteStore(None)
    txn = store.begin()
    for entry in entries:
        apply_entry(txn, entry, replay=True)
    store.commit()
    return store, LogWriter(OpTime.from_document(entries[-1]))


def _published(store: SQLiteStore) -> tuple[set[str], list[str]]:
    """What a member reading this log publishes (the job's parts, and the drops it carries out)."""
    rt = TableReplica(TABLE, "/nowhere", ReplicationQueue([]))
    log_ns = state_ns(DB, "t", "log")
    docs = list(store.reader.scan(log_ns)) if store.reader.collection(log_ns) is not None else []
    for doc in sorted(docs, key=lambda d: int(d.get("seq", 0))):
        rt.log_doc(doc)
    rt.schedule(0)
    return {p for p, logged in rt.logged.items() if logged.dedup_token == "w"}, [d.name for d in rt.drop_ranges]


def _setup(*, replace: bool) -> tuple[list[dict[str, Any]], list[dict[str, Any]], int]:
    """The history up to the job's commit (the table, an older insert if `replace`, three stages), the
    commit's own entries, and how many parts it publishes."""
    store, writer = SQLiteStore(None), LogWriter(NULL_OPTIME)
    def create(env: WriteEnv) -> None:
        ensure_collection(env, tables_ns(DB))
        env.emit(insert_entry(tables_ns(DB), TABLE.to_document()))
    _write(store, writer, create)
    if replace:
        old = [_block("a", "old1", 5)]
        _write(store, writer, stage_body(DB, "t", old, write_id="old", source="m1", http="h1"))
        _write(store, writer, commit_job_body(DB, "t", write_id="old", stage_ids=["old1"], rows=5, digest="d",
                                              quorum=0, attempt="x"))
    stages = [_block("a", "s1", 3), _block("b", "s2", 4), _block("a", "s3", 2)]
    _write(store, writer, stage_body(DB, "t", stages, write_id="w", source="m1", http="h1"))
    _write(store, writer, stage_body(DB, "t", [_block("a", "loser", 3)], write_id="w", source="m2", http="h2"))
    before = _entries(store)
    reply = _write(store, writer, commit_job_body(DB, "t", write_id="w", stage_ids=["s1", "s2", "s3"], rows=9,
                                                  digest="d", quorum=2, attempt="try1", replace=replace))
    commit = _entries(store)[len(before):]
    store.close()
    return before, commit, len(reply["parts"])


@pytest.mark.parametrize("replace", [False, True])
def test_every_prefix_publishes_all_or_nothing_and_a_retry_publishes_exactly_once(replace: bool) -> None:
    before, commit, count = _setup(replace=replace)
    switch_at = next(i for i, e in enumerate(commit) if e.get("o", {}).get("type") == "COMMIT_JOB")
    for k in range(len(commit) + 1):
        store, writer = _replay(before + commit[:k])
        parts, drops = _published(store)
        if k <= switch_at:   # the switch is not in the prefix: nothing of the job
            assert parts == set() and drops == [], k
        else:
            assert len(parts) == count == 3, k
        # The driver's retry of the same commit on this new primary.
        reply = _write(store, writer, commit_job_body(DB, "t", write_id="w", stage_ids=["s1", "s2", "s3"], rows=9,
                                                      digest="d", quorum=2, attempt="try1", replace=replace))
        assert not reply["alreadyCommitted"] and len(reply["parts"]) == 3
        parts, drops = _published(store)
        assert parts == set(reply["parts"]), k
        log = list(store.reader.scan(state_ns(DB, "t", "log")))
        tagged = [d for d in log if d.get("dedupToken") == "w" and d["type"] == "GET_PART"]
        assert len(tagged) == 3, f"prefix {k}: a remnant was left: {sorted(d['_id'] for d in tagged)}"
        assert [d for d in log if d["type"] == "COMMIT_JOB" and d["writeId"] == "w"] != []
        assert list(store.reader.scan(state_ns(DB, "t", "staged"))) == []   # the loser's stage too
        if replace:   # the older write's rows are dropped by the job's own drop
            assert [d for d in log if d.get("dedupToken") == "old" and d["type"] == "GET_PART"] == []
        store.close()


def test_an_abort_after_a_cut_commit_leaves_no_inert_document() -> None:
    before, commit, _count = _setup(replace=True)
    switch_at = next(i for i, e in enumerate(commit) if e.get("o", {}).get("type") == "COMMIT_JOB")
    for k in range(switch_at + 1):
        store, writer = _replay(before + commit[:k])
        reply = _write(store, writer, abort_job_body(DB, "t", "w"))
        assert not reply["committed"] and reply["removed"] == 4
        log = list(store.reader.scan(state_ns(DB, "t", "log")))
        assert [d["_id"] for d in log if d.get("job") == job_id_of("w")] == [], k
        assert list(store.reader.scan(state_ns(DB, "t", "staged"))) == []
        store.close()
