"""Mutations and partition drops of a parts table: the primary's transactions, and the rewrite of one part.

Theory of operation
-------------------
`alterDelete` / `alterUpdate` record a mutation document in
`<db>.system.parts.<table>.mutations` with a block number in every partition
the table has (`oplog.parts.mutations`). The primary's leader duty
(`replset.parts.leader`) then logs a MUTATE_PART entry for each part the
mutation affects; every member rewrites its copy (`rewrite_part`, off the event
loop) or fetches the rewritten part when it lacks the source.

`dropPartition` takes the partition's next block number and logs a DROP_RANGE
covering every block below it: every member drops the parts it covers (they stay
readable for `oldPartsLifetimeSecs`, like merged-away parts) and cancels queued
fetches of them. In the same transaction the partition's part-log documents, its
dedup keys, its registry documents and its quorum records go, so a block of the dropped partition can be inserted again: a dedup key never
outlives its part.

A command sent to a member that is not primary is passed to the primary over
the member connection (`replset.parts.commit.PrimaryLink.forward`) with an
`attempt` id: a retry after a lost reply finds the mutation it already recorded.
"""

from __future__ import annotations

import os
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from base.errors import MongoError
from oplog.entry import delete_entry, insert_entry, update_entry
from oplog.parts import part_files
from oplog.parts.filters import filter_expression, update_expressions
from oplog.parts.mutations import Mutation
from oplog.parts.part_info import PartInfo, drop_range
from oplog.parts.table import TableDef, alter_table, partition_id
from oplog.writes import WriteEnv, ensure_collection
from replset.parts.insert import load_table, next_counter
from replset.parts.names import state_ns, tables_ns

BAD_VALUE = 2


def _partitions(env: WriteEnv, counters_ns: str) -> list[str]:
    if env.txn.collection(counters_ns) is None:
        return []
    return sorted(str(doc["_id"])[len("block."):] for doc in env.txn.scan(counters_ns)
                  if str(doc["_id"]).startswith("block."))


def record_mutation(env: WriteEnv, db: str, name: str, *, kind: str, filter_doc: dict[str, Any],
                    set_doc: dict[str, Any], attempt: str) -> dict[str, Any]:
    """The primary's transaction for `alterDelete` / `alterUpdate`: the mutation document, with a block
    number in every partition. The same `attempt` again answers the mutation already recorded."""
    table = load_table(env.txn, db, name)
    filter_expression(filter_doc, table)   # refuse a bad filter before anything is written
    if kind == "update":
        update_expressions(set_doc, table)
    mutations_ns, counters_ns = state_ns(db, name, "mutations"), state_ns(db, name, "counters")
    ensure_collection(env, mutations_ns)
    ensure_collection(env, counters_ns)
    for doc in env.txn.scan(mutations_ns):
        if doc.get("attempt") == attempt:
            return doc
    seq = next_counter(env, counters_ns, "mutation")
    versions = {pid: next_counter(env, counters_ns, f"block.{pid}") for pid in _partitions(env, counters_ns)}
    doc = {"_id": f"mutation_{seq:010d}", "kind": kind, "filter": filter_doc, "set": set_doc,
           "blockNumbers": versions, "createTime": env.now, "createMs": int(env.now.timestamp() * 1000),
           "attempt": attempt}
    env.emit(insert_entry(mutations_ns, doc))
    return doc


def drop_partition(env: WriteEnv, db: str, name: str, pid: str, attempt: str) -> str | None:
    """The primary's transaction for `dropPartition`: a DROP_RANGE log entry over every block of the
    partition so far, and the partition's log documents, dedup keys, registry documents and quorum
    records removed. Returns the drop range's name (None: the partition never had a block)."""
    load_table(env.txn, db, name)
    log_ns, counters_ns = state_ns(db, name, "log"), state_ns(db, name, "counters")
    if env.txn.collection(counters_ns) is None or env.txn.get(counters_ns, f"block.{pid}") is None:
        return None
    done = next((doc for doc in env.txn.scan(log_ns) if doc.get("type") == "DROP_RANGE"
                 and doc.get("attempt") == attempt), None) if env.txn.collection(log_ns) is not None else None
    if done is not None:   # a retry of a drop that went through: never a second drop (it would take new blocks)
        return str(done["part"])
    number = next_counter(env, counters_ns, f"block.{pid}")
    fake = drop_range(pid, number)
    assert fake is not None
    for what in ("log", "blocks", "replicas", "quorum"):
        ns = state_ns(db, name, what)
        if env.txn.collection(ns) is None:
            continue
        doomed = [doc["_id"] for doc in env.txn.scan(ns) if in_range(doc, fake)]
        for doc_id in doomed:
            env.emit(delete_entry(ns, doc_id))
    seq = next_counter(env, counters_ns, "seq")
    env.emit(insert_entry(log_ns, {"_id": f"drop_{fake.name}", "seq": seq, "type": "DROP_RANGE",
                                   "part": fake.name, "partition": pid, "createTime": env.now,
                                   "attempt": attempt}))
    return fake.name


def in_range(doc: dict[str, Any], fake: PartInfo) -> bool:
    try:
        part = PartInfo.parse(str(doc.get("part", "")))
    except MongoError:
        return False
    return fake.contains(part)


def alter_definition(env: WriteEnv, db: str, name: str, spec: dict[str, Any], attempt: str) -> int:
    """The primary's transaction for `alterPartsTable`: the new definition and its ALTER_METADATA log
    entry; returns the new metadata version (the one already made, for a retry of the same attempt)."""
    table = load_table(env.txn, db, name)
    log_ns, counters_ns = state_ns(db, name, "log"), state_ns(db, name, "counters")
    ensure_collection(env, log_ns)
    ensure_collection(env, counters_ns)
    done = env.txn.get(counters_ns, f"alter.{attempt}")
    if done is not None:
        return int(done["n"])
    new = alter_table(table, spec)
    definition = new.to_document()
    definition.pop("_id")
    env.emit(update_entry(tables_ns(db), name, {"$set": definition}))
    env.emit(update_entry(counters_ns, f"alter.{attempt}", {"$set": {"n": new.metadata_version}}, upsert=True))
    env.emit(insert_entry(log_ns, {"_id": f"alter_{new.metadata_version:010d}", "seq": next_counter(
        env, counters_ns, "seq"), "type": "ALTER_METADATA", "version": new.metadata_version,
        "change": spec, "createTime": env.now}))
    return new.metadata_version


def partition_of(table: TableDef, raw: Any) -> str:
    """`dropPartition`'s `partition`: a partition id as `partsStatus` shows it, or `{value: v}` for the
    partition a row whose partition column holds v belongs to."""
    if isinstance(raw, str) and raw:
        return raw
    if isinstance(raw, dict) and set(raw) == {"value"}:
        return partition_id(table.partition, raw["value"])
    raise MongoError(BAD_VALUE, "'partition' must be a partition id (a string) or {value: <partition key value>}")


def rewrite_part(table_dir: str, source: str, tmp_name: str, table: TableDef, mutation: Mutation
                 ) -> part_files.PartFiles:
    """Writes `source` with `mutation` applied as the temporary part `tmp_name` (on a worker thread)."""
    data = part_files.read_part(os.path.join(table_dir, source), table)
    condition = filter_expression(mutation.filter, table)
    hit = pc.scalar(True) if condition is None else pc.coalesce(condition, pc.scalar(False))
    if mutation.kind == "delete":
        data = data.filter(~hit)
    else:
        updates = update_expressions(mutation.set, table)
        columns = {c.name: (pc.if_else(hit, updates[c.name], pc.field(c.name)) if c.name in updates
                            else pc.field(c.name)) for c in table.columns}
        import pyarrow.dataset as ds  # here: it imports pandas, a quarter second of every member's start

        data = ds.dataset(data).to_table(columns=columns)
        data = pa.Table.from_arrays([data.column(c.name) for c in table.columns],
                                    schema=part_files.arrow_schema(table))
    return part_files.write_temp_part(table_dir, tmp_name, part_files.sort_rows(table, data), table)
