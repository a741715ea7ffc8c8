"""What an operator and a reader see of a parts table on one member: its active parts (ClickHouse's
`system.parts`), its replication queue (`system.replication_queue`), and the rows of its parts.

Rows are read from this member's own active parts, a part at a time, filtered by Arrow
(`oplog.parts.filters`) - on the query pool, never on the event loop. The part list is taken
when the read starts: a merge meanwhile replaces parts, but the replaced ones stay on disk
for `oldPartsLifetimeSecs`, so a running read finishes on the parts it began with.
"""

from __future__ import annotations

import datetime
import os
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from base.errors import MongoError
from oplog.parts import part_files
from oplog.parts.mutations import mutation_done, parts_to_do
from oplog.parts.part_info import PartInfo
from oplog.parts.queue import EntryType
from oplog.parts.shared_storage import StorageUnavailable
from oplog.parts.table import TableDef
from replset.query_pool import check_time_limit

if TYPE_CHECKING:
    from oplog.parts.table_replica import TableReplica
    from replset.node import Node

NOT_IN_QUORUM = 134   # ReadConcernMajorityNotAvailableYet: this member cannot yet serve what was promised
READ_BATCH_ROWS = 4096
OPERATION_FAILED = 96   # a part here is damaged: read another member, or retry
EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)   # ClickHouse's DateTime "never"
# Row counts of part copies, by path, with the identity of the data file they were read from (a part
# never changes; another copy under the same name - after a rollback - is another file).
_ROWS: dict[str, tuple[tuple[int, int], int]] = {}


async def parts_status(node: Node, table: TableDef) -> list[dict[str, Any]]:
    """`system.parts`-like rows for this member's active parts (sizes from the part log), then its old
    parts still on disk, then the lost ones. `rows` is read from the part's Parquet footer the first
    time a copy is shown (None when it is not on disk here): the rows are taken on the event loop, the
    files looked at on the query pool."""
    rt = node.parts.tables.get(table.ns)
    if rt is None:
        return []
    rows = _status_rows(rt, table)
    directory = rt.directory

    def count() -> list[dict[str, Any]]:
        for row in rows:
            if not row.get("lost"):
                row["rows"] = _part_rows(directory, row["name"])
        _forget_rows(directory, {r["name"] for r in rows})
        return rows

    return list(await node.queries.run(count))


def _status_rows(rt: TableReplica, table: TableDef) -> list[dict[str, Any]]:
    """The rows of `parts_status`, from memory only (`rows` still None)."""
    rows = []
    visible = {p.name for p in rt.visible_parts()}
    for part in rt.queue.current:
        logged = rt.logged.get(part.name)
        # A part holding rows of a job not wholly here yet is not read: shown inactive, `committing`.
        committing = {"committing": True} if part.name not in visible else {}
        rows.append({"database": table.db, "table": table.name, "partition_id": part.partition_id,
                     "name": part.name, "active": part.name in visible, **committing, "level": part.level,
                     "min_block_number": part.min_block, "max_block_number": part.max_block,
                     "data_version": part.data_version, "rows": None,
                     "bytes_on_disk": logged.bytes if logged is not None else None,
                     "replicas": sorted(rt.holders.get(part.name, {}))})
    for name in sorted(rt.outdated):
        part = PartInfo.parse(name)
        rows.append({"database": table.db, "table": table.name, "partition_id": part.partition_id,
                     "name": name, "active": False, "level": part.level, "min_block_number": part.min_block,
                     "max_block_number": part.max_block, "data_version": part.data_version,
                     "rows": None, "bytes_on_disk": None, "replicas": []})
    for name, reason in sorted(rt.lost.items()):
        part = PartInfo.parse(name)
        rows.append({"database": table.db, "table": table.name, "partition_id": part.partition_id,
                     "name": name, "active": False, "lost": True, "lost_reason": reason, "level": part.level,
                     "min_block_number": part.min_block, "max_block_number": part.max_block,
                     "data_version": part.data_version, "rows": None, "bytes_on_disk": None, "replicas": []})
    return rows


def _part_rows(directory: str, name: str) -> int | None:
    """The rows of the part copy `directory/name`: a stat of its data file, and its footer read once."""
    part_dir = os.path.join(directory, name)
    path = os.path.join(part_dir, part_files.DATA_FILE)
    try:
        shared = not os.path.exists(path)   # a zero-copy part: its objects never change
        stat = os.stat(os.path.join(part_dir, part_files.STORAGE_FILE) if shared else path)
        identity = (stat.st_ino, stat.st_mtime_ns)
        known = _ROWS.get(path)
        if known is not None and known[0] == identity:
            return known[1]
        if shared:
            with part_files.data_source(part_dir) as source:
                rows = pq.read_metadata(source).num_rows
        else:
            rows = pq.read_metadata(path).num_rows
    except (OSError, MongoError, pa.ArrowException):   # not here (a part being removed): no count
        return None
    _ROWS[path] = (identity, rows)
    return rows


def _forget_rows(directory: str, shown: set[str]) -> None:
    """Forgets the counts of the table's parts no longer shown (what is kept stays that of the table)."""
    prefix = directory.rstrip(os.sep) + os.sep
    for path in [p for p in _ROWS if p.startswith(prefix)]:
        if os.path.basename(os.path.dirname(path)) not in shown:
            del _ROWS[path]


def _wall_time(monotonic_ms: int, wall_minus_monotonic_ms: int) -> datetime.datetime:
    """A time of the queue (the runner's monotonic ms, `replset.parts.manager`) as a wall time, with the
    runner's one offset between its clocks (`PartsManager.wall_minus_monotonic_ms`)."""
    return datetime.datetime.fromtimestamp((monotonic_ms + wall_minus_monotonic_ms) / 1000, datetime.UTC)


def mutations_view(node: Node, table: TableDef) -> list[dict[str, Any]]:
    """`system.mutations`-like rows, as this member stands: `parts_to_do` the parts it is still to rewrite
    here (none once killed: nothing more is planned for it); `is_done` when no part here, or coming
    here, needs it (`oplog.parts.mutations.mutation_done`) - a mutation killed after it finished stays
    done. `latest_failed_part`, `latest_fail_time` and `latest_fail_reason` are those of its rewrite
    here that failed last ("", 1970-01-01 and "" as in ClickHouse when none is failing: a rewrite that
    succeeds leaves the queue, and its failures with it)."""
    rt = node.parts.tables.get(table.ns)
    if rt is None:
        return []
    offset_ms = node.parts.wall_minus_monotonic_ms
    rows = []
    for mutation in sorted(rt.mutations.values(), key=lambda m: m.id):
        todo = [] if mutation.killed else parts_to_do(mutation, rt.queue.current)
        failed = [e for e in rt.queue.entries if e.type is EntryType.MUTATE_PART and e.last_exception
                  and rt.docs.get(e.node_name, {}).get("mutation") == mutation.id]
        last = max(failed, key=lambda e: e.last_exception_time_ms, default=None)   # the first of a tie
        rows.append({"database": table.db, "table": table.name, "mutation_id": mutation.id,
                     "command": mutation.command(), "create_time": mutation.create_ms,
                     "block_numbers": dict(mutation.versions), "parts_to_do_names": [p.name for p in todo],
                     "parts_to_do": len(todo),
                     "is_done": mutation_done(mutation, rt.queue.current, rt.queue.virtual),
                     "is_killed": mutation.killed,
                     "latest_failed_part": last.new_part.name if last is not None and last.new_part else "",
                     "latest_fail_time": (_wall_time(last.last_exception_time_ms, offset_ms) if last is not None
                                          else EPOCH),
                     "latest_fail_reason": last.last_exception if last is not None else ""})
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


def readable_parts(rt: TableReplica) -> list[PartInfo]:
    """The parts a read of the table uses here (`visible_parts`), or OperationFailed while a damaged part
    set aside is not here again: the others alone would be an answer with rows missing."""
    holes = rt.read_holes()
    if holes:
        raise MongoError(OPERATION_FAILED, f"{rt.table.ns} on this member lacks the rows of {', '.join(holes)}: "
                                           "damaged here, set aside and being fetched again from a replica; "
                                           "read from another member or retry")
    return rt.visible_parts()


def read_rows(node: Node, table: TableDef, expression: pc.Expression | None,
              columns: Sequence[str] | None) -> Iterator[dict[str, Any]]:
    """The matching rows of this member's active parts, part by part (in part order)."""
    rt = node.parts.tables.get(table.ns)
    if rt is None:
        return iter(())
    paths = [os.path.join(rt.directory, part.name) for part in readable_parts(rt)]
    return _rows(node, paths, table, expression, list(columns) if columns else None)


def _damaged(path: str, exc: BaseException) -> bool:
    """Whether a read that failed says the part here is damaged. A zero-copy part's failed read may be
    the storage not answering: its objects are checked whole first, and only bytes that do not match are
    damage (an unanswered check is not)."""
    try:
        if part_files.shared_location(path) is None:
            return True
    except MongoError:   # its storage.txt is unreadable
        return True
    try:
        return part_files.verify_part(path) is not None
    except StorageUnavailable:
        return False


def _rows(node: Node, paths: list[str], table: TableDef, expression: pc.Expression | None,
          columns: list[str] | None) -> Iterator[dict[str, Any]]:
    """Each part checked before it is read (`PartsManager.check_for_read`: hashed when its files changed
    since they were last verified), each page against its CRC as it is read: a damaged part fails the
    read, never answers other rows."""
    for path in paths:
        check_time_limit()
        part = os.path.basename(path)
        node.parts.check_for_read(table.ns, part)
        batches = part_files.iter_part(path, table, READ_BATCH_ROWS)
        while True:
            try:
                data = next(batches, None)
            except (OSError, pa.ArrowException) as exc:   # damaged, or removed under us (long after its lifetime)
                if os.path.isdir(path) and _damaged(path, exc):
                    node.parts.report_damage(table.ns, part, str(exc))
                raise MongoError(96, f"part {part} could not be read: {exc}") from None
            if data is None:
                break
            if expression is not None:
                data = data.filter(expression)
            if columns is not None:
                data = data.select(columns)
            check_time_limit()
            yield from data.to_pylist()
