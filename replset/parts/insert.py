"""Inserting a block of rows into a parts table: parts written locally, one commit through the oplog.

Theory of operation
-------------------
The rows are conformed to the table's schema, split by partition and sorted by
the order key; each partition's rows are one block with a block id
(`oplog.parts.blocks`: the hash of the sorted rows, or of the client's dedup
token and the block's index). Off the event loop each block is written as a
part under `tmp_insert_<block id>`. Then one write transaction, for each block:

* a block id already in the log is a duplicate: no new part; the reply names the
  part that holds it and says `deduplicated` (not an error);
* otherwise it takes the next log sequence number and the partition's next block
  number (`<db>.system.parts.<table>.counters`), inserts the GET_PART log document
  (`_id` = the block id, so the dedup check and the log entry are one document)
  and renames the temporary part to its name, before the transaction commits.

The counters are written before the log document, and each is one oplog entry:
a secondary may hold any prefix of a transaction's entries when it becomes
primary, and every prefix here is consistent - at worst a block number or a
sequence number is skipped, which parts tolerate (ClickHouse's numbers have gaps
too). A crash after the rename but before the commit leaves a part directory no
log entry names: start-up moves it aside, never deletes it.

The reply waits for the write concern (`w: "majority"` unless the client asks
otherwise): a part-log commit is a quorum write, as Keeper's are.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import shutil
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from base.errors import MongoError
from oplog.durable_files import fsync_path
from oplog.entry import insert_entry, update_entry
from oplog.parts import part_files
from oplog.parts.blocks import block_id_of_rows, block_id_of_token
from oplog.parts.part_info import inserted_part
from oplog.parts.table import TableDef
from oplog.writes import WriteEnv, ensure_collection
from replset.parts.names import state_ns, table_dir, tables_ns

if TYPE_CHECKING:
    from oplog.sqlite_store import StoreTxn

NAMESPACE_NOT_FOUND = 26
_temp_names = itertools.count(1)   # two inserts of one block at once write different temporary parts


def load_table(txn: StoreTxn | Any, db: str, name: str) -> TableDef:
    doc = txn.get(tables_ns(db), name)
    if doc is None:
        raise MongoError(NAMESPACE_NOT_FOUND, f"parts table {db}.{name} not found")
    return TableDef.from_document(db, doc)


@dataclass(slots=True)
class Block:
    """One partition's rows, written as a temporary part, and what became of it."""

    partition_id: str
    block_id: str
    tmp_name: str
    files: part_files.PartFiles
    part: str = ""
    deduplicated: bool = False

    def reply(self) -> dict[str, Any]:
        return {"partition": self.partition_id, "blockId": self.block_id, "part": self.part,
                "rows": self.files.rows, "deduplicated": self.deduplicated}


def prepare_blocks(directory: str, table: TableDef, data: pa.Table, dedup_token: str | None) -> list[Block]:
    """Conforms, splits and sorts the rows and writes each partition's block as a temporary part."""
    rows = part_files.conform(table, data)
    blocks = []
    for index, (pid, block_rows) in enumerate(part_files.split_by_partition(table, rows).items()):
        if dedup_token is not None:
            block_id = block_id_of_token(pid, dedup_token, index)
        else:
            block_id = block_id_of_rows(pid, part_files.rows_bytes(block_rows))
        tmp_name = f"{part_files.TMP_INSERT}{block_id}_{os.getpid()}_{next(_temp_names)}"
        files = part_files.write_temp_part(directory, tmp_name, block_rows, table)
        blocks.append(Block(pid, block_id, tmp_name, files))
    return blocks


def _next(env: WriteEnv, ns: str, counter: str) -> int:
    doc = env.txn.get(ns, counter)
    value = (int(doc["n"]) if doc is not None else 0) + 1
    env.emit(update_entry(ns, counter, {"$set": {"n": value}}, upsert=True))
    return value


def commit_blocks(env: WriteEnv, *, db: str, table: TableDef, blocks: list[Block], directory: str,
                  source: str, http: str) -> None:
    """Inside the write transaction: dedup, numbers, log documents, and the renames (see the module doc)."""
    log_ns, counters_ns = state_ns(db, table.name, "log"), state_ns(db, table.name, "counters")
    ensure_collection(env, counters_ns)
    ensure_collection(env, log_ns)
    fresh = []
    for block in blocks:
        existing = env.txn.get(log_ns, block.block_id)
        if existing is not None:
            block.part, block.deduplicated = str(existing["part"]), True
            continue
        seq = _next(env, counters_ns, "seq")
        number = _next(env, counters_ns, f"block.{block.partition_id}")
        block.part = inserted_part(block.partition_id, number).name
        env.emit(insert_entry(log_ns, {
            "_id": block.block_id, "seq": seq, "type": "GET_PART", "part": block.part,
            "partition": block.partition_id, "blockId": block.block_id, "source": source, "http": http,
            "createTime": env.now, "rows": block.files.rows, "bytes": block.files.bytes,
            "checksums": [{"file": file, "size": size, "sha256": digest}
                          for file, (size, digest) in sorted(block.files.checksums.items())]}))
        fresh.append(block)
    for block in fresh:
        part_files.publish(directory, block.tmp_name, block.part, sync=False)
    if fresh:
        fsync_path(directory)


def discard_temporary(directory: str, blocks: list[Block]) -> None:
    """The temporary parts not published: duplicates, and every block of a commit that failed."""
    for block in blocks:
        shutil.rmtree(os.path.join(directory, block.tmp_name), ignore_errors=True)


async def insert_rows(node: Any, db: str, name: str, data: pa.Table, *, dedup_token: str | None,
                      run_write: Any) -> dict[str, Any]:
    """The `insertBlock` command's work; `run_write` runs the commit and waits for its write concern."""
    table = load_table(node.store.reader, db, name)
    directory = table_dir(node.options.dbpath, table.ns)
    blocks = await asyncio.to_thread(prepare_blocks, directory, table, data, dedup_token)

    def body(env: WriteEnv) -> dict[str, Any]:
        commit_blocks(env, db=db, table=load_table(env.txn, db, name), blocks=blocks, directory=directory,
                      source=node.options.me, http=node.options.http_address)
        return {"blocks": [b.reply() for b in blocks], "inserted": sum(not b.deduplicated for b in blocks),
                "deduplicated": sum(b.deduplicated for b in blocks), "ok": 1.0}

    try:
        return await run_write(body)
    finally:
        await asyncio.to_thread(discard_temporary, directory, blocks)
