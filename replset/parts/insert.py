"""Inserting a block of rows into a parts table: parts written locally, one commit through the oplog.

Theory of operation
-------------------
The rows are conformed to the table's schema, split by partition and sorted by
the order key; each partition's rows are one block with a block id
(`oplog.parts.blocks`: the hash of the sorted rows, or of the client's dedup
token and the block's index). Off the event loop each block is written as a
part under `tmp_insert_<block id>`. Then one write transaction, for each block:

* a block id with a dedup key (`<db>.system.parts.<table>.blocks`, `_id` = the
  block id) inside the dedup window (`oplog.parts.blocks.in_window`) whose log
  document exists is a duplicate: no new part; the reply names the part that
  holds it and says `deduplicated` (not an error);
* otherwise it takes the next log sequence number, the table's next block
  sequence number and the partition's next block number (`.counters`), writes
  the dedup key, then the GET_PART log document (`_id` = `<block id>.<block
  number>`: never used twice, even when a dropped or forgotten block comes back)
  and renames the temporary part to its name, before the transaction commits.

The counters are written first, then the dedup key, then the log document; each
is one oplog entry. A secondary may hold any prefix of a transaction's entries
when it becomes primary, and every prefix here is consistent: at worst a number
is skipped, which parts tolerate (ClickHouse's numbers have gaps too), and a
dedup key whose log document is missing is no duplicate. Dedup keys that fall
out of the window are removed by the primary (`replset.parts.leader`); the
lookup checks the window itself, so a key waiting for that is already no
duplicate. A crash after the rename but before the commit leaves a part directory no
log entry names: start-up moves it aside, never deletes it.

The reply waits for the write concern (`w: "majority"` unless the client asks
otherwise): a part-log commit is a quorum write, as Keeper's are.
"""

from __future__ import annotations

import datetime
import itertools
import os
import shutil
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from base.clock import Clock
from base.errors import MongoError
from oplog.durable_files import fsync_path
from oplog.entry import insert_entry, update_entry
from oplog.parts import part_files
from oplog.parts.blocks import RememberedBlock, block_id_of_rows, block_id_of_token, in_window
from oplog.parts.part_info import inserted_part
from oplog.parts.storage_url import part_key
from oplog.parts.table import TableDef
from oplog.writes import WriteEnv, ensure_collection
from replset.parts.names import state_ns, tables_ns
from replset.parts.registry import PENDING, checksum_docs, holder_doc
from replset.parts.runtime import settle_shared

if TYPE_CHECKING:
    from oplog.sqlite_store import StoreTxn

BAD_VALUE = 2
NAMESPACE_NOT_FOUND = 26
SCHEMA_CHANGED = 117   # ConflictingOperationInProgress
BLOCK_SEQ = "blocks"   # the counter of inserted blocks (the dedup window counts them), with the newest's time
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
    metadata_version: int = 0    # the table's, when the block was written

    def reply(self) -> dict[str, Any]:
        return {"partition": self.partition_id, "blockId": self.block_id, "part": self.part,
                "rows": self.files.rows, "deduplicated": self.deduplicated}

    def to_wire(self) -> dict[str, Any]:
        """What the primary needs to commit a block written on another member (`_partsCommit`)."""
        return {"partition": self.partition_id, "blockId": self.block_id, "rows": self.files.rows,
                "bytes": self.files.bytes, "checksums": checksum_docs(self.files.checksums),
                "metadataVersion": self.metadata_version}

    @classmethod
    def from_wire(cls, doc: Any) -> Block:
        try:
            checksums = {str(c["file"]): (int(c["size"]), str(c["sha256"])) for c in doc["checksums"]}
            for file in checksums:
                part_files.check_file_name(file)
            files = part_files.PartFiles("", int(doc["rows"]), int(doc["bytes"]), checksums)
            return cls(str(doc["partition"]), str(doc["blockId"]), "", files,
                       metadata_version=int(doc.get("metadataVersion", 0)))
        except (KeyError, TypeError, ValueError) as exc:
            raise MongoError(BAD_VALUE, f"_partsCommit: malformed block {exc}") from None


def prepare_blocks(directory: str, table: TableDef, data: pa.Table, dedup_token: str | None,
                   storage_url: str | None = None) -> list[Block]:
    """Conforms, splits and sorts the rows and writes each partition's block as a temporary part (of a
    zero-copy table: its files published in the shared storage at `storage_url` first, before any commit
    can name the part, and the temporary part names them there)."""
    if table.settings.zero_copy and storage_url is None:
        raise MongoError(BAD_VALUE, f"{table.ns} keeps its parts in shared storage (zeroCopy), and this member "
                                    "has none: start it with --partsStorage")
    rows = part_files.conform(table, data)
    blocks = []
    for index, (pid, block_rows) in enumerate(part_files.split_by_partition(table, rows, insert=True).items()):
        if dedup_token is not None:
            block_id = block_id_of_token(pid, dedup_token, index)
        else:
            block_id = block_id_of_rows(pid, part_files.rows_bytes(block_rows))
        tmp_name = f"{part_files.TMP_INSERT}{block_id}_{os.getpid()}_{next(_temp_names)}"
        files = part_files.write_temp_part(directory, tmp_name, block_rows, table)
        if table.settings.zero_copy:
            assert storage_url is not None
            part_files.externalize(os.path.join(directory, tmp_name), storage_url,
                                   part_key(table.uuid, pid, files.checksums), keep_data=True)
        blocks.append(Block(pid, block_id, tmp_name, files, metadata_version=table.metadata_version))
    return blocks


def next_counter(env: WriteEnv, ns: str, counter: str, **also: Any) -> int:
    """The counter's next value, written back (with `also`'s fields, in the same entry)."""
    doc = env.txn.get(ns, counter)
    value = (int(doc["n"]) if doc is not None else 0) + 1
    env.emit(update_entry(ns, counter, {"$set": {"n": value, **also}}, upsert=True))
    return value


def commit_blocks(env: WriteEnv, *, db: str, table: TableDef, blocks: list[Block], source: str, http: str,
                  attempt: str, quorum: int = 0, dedup_token: str | None = None) -> list[Block]:
    """Inside the write transaction: dedup, numbers, the log documents and "`source` has the part"
    (see the module doc). Returns the blocks that became new parts; the caller publishes them.

    A block whose log document carries the same `attempt` was committed by an earlier try of this
    insert (a reply lost, the primary changed): it is this insert's own part, not a duplicate."""
    log_ns, counters_ns = state_ns(db, table.name, "log"), state_ns(db, table.name, "counters")
    replicas_ns, blocks_ns = state_ns(db, table.name, "replicas"), state_ns(db, table.name, "blocks")
    for ns in (counters_ns, blocks_ns, log_ns, replicas_ns):
        ensure_collection(env, ns)
    if quorum > 1:
        ensure_collection(env, state_ns(db, table.name, "quorum"))
    for block in blocks:
        if block.metadata_version != table.metadata_version:
            raise MongoError(SCHEMA_CHANGED, f"{table.ns} changed (metadata version {block.metadata_version} -> "
                                             f"{table.metadata_version}) while this insert was being written: "
                                             "nothing was inserted; send it again in the new schema")
    settings = table.settings
    window = {"window_count": settings.replicated_deduplication_window,
              "window_secs": settings.replicated_deduplication_window_seconds}
    newest = newest_block(env.txn, counters_ns)
    fresh = []
    for block in blocks:
        existing = dedup_hit(env.txn, db, table.name, block.block_id, newest, window)
        if existing is not None:
            block.part = str(existing["part"])
            block.deduplicated = existing.get("attempt") != attempt
            if not block.deduplicated:
                fresh.append(block)
            continue
        seq = next_counter(env, counters_ns, "seq")
        number = next_counter(env, counters_ns, f"block.{block.partition_id}")
        newest = RememberedBlock(block.block_id, next_counter(env, counters_ns, BLOCK_SEQ, time=env.now),
                                 _ms(env.now))
        block.part = inserted_part(block.partition_id, number).name
        log_id = f"{block.block_id}.{number}"
        if quorum > 1:   # before the log document: a prefix never holds a quorum part without its record
            quorum_ns = state_ns(db, table.name, "quorum")
            record = {"part": block.part, "log": log_id, "required": quorum, "status": PENDING,
                      "dedupToken": dedup_token, "createTime": env.now}
            if env.txn.get(quorum_ns, block.block_id) is not None:   # a failed quorum, inserted again
                env.emit(update_entry(quorum_ns, block.block_id, {"$set": record}))
            else:
                env.emit(insert_entry(quorum_ns, {"_id": block.block_id, **record}))
        key = {"part": block.part, "log": log_id, "number": newest.number, "time": env.now, "attempt": attempt}
        if env.txn.get(blocks_ns, block.block_id) is not None:   # a key out of the window, or cut off
            env.emit(update_entry(blocks_ns, block.block_id, {"$set": key}))
        else:
            env.emit(insert_entry(blocks_ns, {"_id": block.block_id, **key}))
        env.emit(insert_entry(log_ns, {
            "_id": log_id, "seq": seq, "type": "GET_PART", "part": block.part,
            "partition": block.partition_id, "blockId": block.block_id, "source": source, "http": http,
            "attempt": attempt, "quorum": quorum, "dedupToken": dedup_token,
            "createTime": env.now, "rows": block.files.rows, "bytes": block.files.bytes,
            "checksums": checksum_docs(block.files.checksums)}))
        env.emit(insert_entry(replicas_ns, holder_doc(block.part, source, http, block.files.checksums)))
        fresh.append(block)
    return fresh


def newest_block(txn: StoreTxn | Any, counters_ns: str) -> RememberedBlock:
    """The table's newest inserted block, as the dedup window counts from it."""
    doc = txn.get(counters_ns, BLOCK_SEQ) if txn.collection(counters_ns) is not None else None
    if doc is None:
        return RememberedBlock("", 0, 0)
    return RememberedBlock("", int(doc.get("n", 0)), _ms(doc.get("time")))


def remembered(key: dict[str, Any]) -> RememberedBlock:
    return RememberedBlock(str(key["_id"]), int(key.get("number", 0)), _ms(key.get("time")))


def _ms(time: Any) -> int:
    return int(time.timestamp() * 1000) if isinstance(time, datetime.datetime) else 0


def dedup_hit(txn: StoreTxn | Any, db: str, table: str, block_id: str, newest: RememberedBlock,
              window: dict[str, int]) -> dict[str, Any] | None:
    """The log document of the committed block `block_id` when it is still a duplicate: its dedup key
    in the window and its log document there (a key without one was cut off with its commit)."""
    blocks_ns, log_ns = state_ns(db, table, "blocks"), state_ns(db, table, "log")
    key = txn.get(blocks_ns, block_id) if txn.collection(blocks_ns) is not None else None
    if key is None or not in_window(remembered(key), newest, **window):
        return None
    return txn.get(log_ns, str(key.get("log"))) if txn.collection(log_ns) is not None else None


def logged_block(txn: StoreTxn | Any, db: str, table: str, block_id: str) -> dict[str, Any] | None:
    """The log document of block `block_id` while its dedup key names it (in the window or not yet
    removed), else None."""
    blocks_ns, log_ns = state_ns(db, table, "blocks"), state_ns(db, table, "log")
    key = txn.get(blocks_ns, block_id) if txn.collection(blocks_ns) is not None else None
    if key is None or txn.collection(log_ns) is None:
        return None
    return txn.get(log_ns, str(key.get("log")))


def publish_blocks(directory: str, blocks: list[Block], *, clock: Clock) -> None:
    """Publishes each block's temporary part under its committed name. A part the part-log runner
    published already (it saw the log name this member before the commit's reply came) is left be."""
    for block in blocks:
        tmp, final = os.path.join(directory, block.tmp_name), os.path.join(directory, block.part)
        if os.path.isdir(tmp) and os.path.isdir(final):
            if _holds(final, block.files.checksums):   # the runner published another try's copy of it
                continue
            # The commit just took this block number: a directory of that name with other bytes is a part
            # of a history a rollback undid (a rebuild no longer reads it: `PartsManager._park_unlogged`).
            part_files.set_aside(directory, block.part, wall_s=clock.wall_ms() // 1000)
        try:
            part_files.publish(directory, block.tmp_name, block.part, sync=False)
        except (MongoError, FileNotFoundError):
            # The runner's publish (`runtime.adopt_temporary`) may have renamed this very temporary part
            # first, even between a look here and the rename: then the part is ours, and published.
            if os.path.exists(tmp) or not os.path.isdir(final):
                raise
    if blocks:
        fsync_path(directory)
    for block in blocks:
        settle_shared(os.path.join(directory, block.part))


def _holds(part_dir: str, checksums: dict[str, tuple[int, str]]) -> bool:
    try:
        here = part_files.read_checksums(part_dir)
    except (OSError, ValueError, MongoError):
        return False
    return all(here.get(file) == sums for file, sums in checksums.items())


def discard_temporary(directory: str, blocks: list[Block]) -> None:
    """The temporary parts not published: duplicates, and every block of a commit that failed."""
    for block in blocks:
        shutil.rmtree(os.path.join(directory, block.tmp_name), ignore_errors=True)
