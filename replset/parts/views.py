"""What an operator and a reader see of a parts table on one member: its active parts (ClickHouse's
`system.parts`), its replication queue (`system.replication_queue`), and the rows of its parts.

Rows are read from this member's own active parts, a part at a time, filtered by Arrow
(`oplog.parts.filters`) - on the query pool, never on the event loop. The part list is taken
when the read starts: a merge meanwhile replaces parts, but the replaced ones stay on disk
for `oldPartsLifetimeSecs`, so a running read finishes on the parts it began with.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import pyarrow.compute as pc
import pyarrow.parquet as pq

from base.errors import MongoError
from oplog.parts import part_files
from oplog.parts.mutations import parts_to_do
from oplog.parts.part_info import PartInfo
from oplog.parts.queue import EntryType
from oplog.parts.table import TableDef
from replset.query_pool import check_time_limit

if TYPE_CHECKING:
    from replset.node import Node

NOT_IN_QUORUM = 134   # ReadConcernMajorityNotAvailableYet: this member cannot yet serve what was promised
READ_BATCH_ROWS = 4096


def parts_status(node: Node, table: TableDef) -> list[dict[str, Any]]:
    """`system.parts`-like rows for this member's active parts (sizes from the part log)."""
    rt = node.parts.tables.get(table.ns)
    if rt is None:
        return []
    rows = []
    for part in rt.queue.current:
        logged = rt.logged.get(part.name)
        rows.append({"database": table.db, "table": table.name, "partition_id": part.partition_id,
                     "name": part.name, "active": True, "level": part.level,
                     "min_block_number": part.min_block, "max_block_number": part.max_block,
                     "data_version": part.data_version,
                     "bytes_on_disk": logged.bytes if logged is not None else None,
                     "replicas": sorted(rt.holders.get(part.name, {}))})
    for name in sorted(rt.outdated):
        part = PartInfo.parse(name)
        rows.append({"database": table.db, "table": table.name, "partition_id": part.partition_id,
                     "name": name, "active": False, "level": part.level, "min_block_number": part.min_block,
                     "max_block_number": part.max_block, "data_version": part.data_version,
                     "bytes_on_disk": None, "replicas": []})
    for name, reason in sorted(rt.lost.items()):
        part = PartInfo.parse(name)
        rows.append({"database": table.db, "table": table.name, "partition_id": part.partition_id,
                     "name": name, "active": False, "lost": True, "lost_reason": reason, "level": part.level,
                     "min_block_number": part.min_block, "max_block_number": part.max_block,
                     "data_version": part.data_version, "bytes_on_disk": None, "replicas": []})
    return rows


def mutations_view(node: Node, table: TableDef) -> list[dict[str, Any]]:
    """`system.mutations`-like rows; `parts_to_do` and `is_done` as this member stands."""
    rt = node.parts.tables.get(table.ns)
    if rt is None:
        return []
    rows = []
    for mutation in sorted(rt.mutations.values(), key=lambda m: m.id):
        todo = [] if mutation.killed else parts_to_do(mutation, rt.queue.current)
        failed = [e for e in rt.queue.entries if e.type is EntryType.MUTATE_PART and e.last_exception
                  and rt.docs.get(e.node_name, {}).get("mutation") == mutation.id]
        rows.append({"database": table.db, "table": table.name, "mutation_id": mutation.id,
                     "command": mutation.command(), "create_time": mutation.create_ms,
                     "block_numbers": dict(mutation.versions), "parts_to_do_names": [p.name for p in todo],
                     "parts_to_do": len(todo), "is_done": not todo and not mutation.killed,
                     "is_killed": mutation.killed,
                     "latest_failed_part": failed[-1].new_part.name if failed and failed[-1].new_part else "",
                     "latest_fail_reason": failed[-1].last_exception if failed else ""})
    return rows


def local_metadata_version(node: Node, table: TableDef) -> int:
    rt = node.parts.tables.get(table.ns)
    return rt.queue.metadata_version if rt is not None else 0


def replication_queue(node: Node, table: TableDef) -> list[dict[str, Any]]:
    """`system.replication_queue`-like rows of this member's queue for the table."""
    rows = node.parts.queue_view(table.ns)
    return [{"database": table.db, "table": table.name, "replica_name": node.options.me, **row} for row in rows]


def check_sequential_consistency(node: Node, table: TableDef) -> None:
    """ClickHouse's `select_sequential_consistency`: refuse to read on a member that lacks a part whose
    quorum insert was reached (the client was told every such part is on `insertQuorum` members)."""
    rt = node.parts.tables.get(table.ns)
    if rt is None:
        return
    missing = [p for p in rt.quorum_reached.values() if rt.queue.current.containing(PartInfo.parse(p)) is None]
    if missing:
        raise MongoError(NOT_IN_QUORUM, f"this member does not have {missing[0]} of {table.ns} yet, which a "
                                        "quorum insert wrote: read from another member or retry")


def read_rows(node: Node, table: TableDef, expression: pc.Expression | None,
              columns: Sequence[str] | None) -> Iterator[dict[str, Any]]:
    """The matching rows of this member's active parts, part by part (in part order)."""
    rt = node.parts.tables.get(table.ns)
    if rt is None:
        return iter(())
    paths = [os.path.join(rt.directory, part.name) for part in rt.queue.current]
    return _rows(paths, table, expression, list(columns) if columns else None)


def _rows(paths: list[str], table: TableDef, expression: pc.Expression | None,
          columns: list[str] | None) -> Iterator[dict[str, Any]]:
    for path in paths:
        check_time_limit()
        batches = part_files.iter_part(path, table, READ_BATCH_ROWS)
        while True:
            try:
                data = next(batches, None)
            except (OSError, pq.lib.ArrowException) as exc:   # removed under us: long after its lifetime
                raise MongoError(96, f"part {os.path.basename(path)} could not be read: {exc}") from None
            if data is None:
                break
            if expression is not None:
                data = data.filter(expression)
            if columns is not None:
                data = data.select(columns)
            check_time_limit()
            yield from data.to_pylist()
