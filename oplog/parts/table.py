"""A parts table's definition: columns with Arrow types, the partition key, the order key.

`createPartsTable` takes

    {createPartsTable: "events", columns: [{name: "ts", type: "timestamp[ms]"}, {name: "user", type: "string"},
     {name: "n", type: "int64", default: 0}], partitionBy: "toYYYYMM(ts)", orderBy: ["user", "ts"]}

A column's type is one of `ARROW_TYPES`, named as Arrow prints the type;
`arrow_type` gives the Arrow type (pyarrow's aliases know no time zone, so
`timestamp[ms, tz=UTC]` is built here). The names are what `columns.txt` and
the replicated definition record.

`partitionBy` is a column name, `toYYYYMM(<date or timestamp column>)`, or absent
(every row in partition `all`). Partition ids follow ClickHouse: an integer key
is its value, a date `YYYYMMDD`, a timestamp its Unix time in seconds,
`toYYYYMM` gives `YYYYMM`, any other value the hex of a 128-bit hash of its text. The definition is replicated as a document
(`to_document` / `from_document`) with a metadata version that every
`alterPartsTable` bumps.

Pure: documents in, definitions out (MongoError 2 BadValue / 9 FailedToParse on bad input).
"""

from __future__ import annotations

__layer__ = "core"  # pure: no I/O, clock or randomness (tests/unit/test_layering.py)

import datetime
import hashlib
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from base.errors import MongoError

BAD_VALUE = 2
FAILED_TO_PARSE = 9
# Arrow type names a column may have (pyarrow's aliases).
ARROW_TYPES = frozenset({
    "bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "float32", "float64",
    "string", "large_string", "binary", "date32", "timestamp[s]", "timestamp[ms]", "timestamp[us]",
    "timestamp[ns]", "timestamp[ms, tz=UTC]", "timestamp[us, tz=UTC]"})
INTEGER_TYPES = frozenset({"int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64"})
DATE_TYPES = frozenset({"date32"} | {t for t in ARROW_TYPES if t.startswith("timestamp")})
TIMESTAMP = re.compile(r"^timestamp\[(s|ms|us|ns)(?:, tz=(UTC))?\]$")
NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
TO_YYYYMM = re.compile(r"^toYYYYMM\(\s*([A-Za-z_][A-Za-z0-9_]*)\s*\)$")
ALL_PARTITION = "all"


def arrow_type(type_name: str) -> pa.DataType:
    """The Arrow type of a column type name of `ARROW_TYPES`."""
    timestamp = TIMESTAMP.match(type_name)
    if timestamp is not None:
        return pa.timestamp(timestamp.group(1), tz=timestamp.group(2))
    return pa.type_for_alias(type_name)


@dataclass(frozen=True, slots=True)
class Column:
    name: str
    type: str
    default: Any = None


@dataclass(frozen=True, slots=True)
class PartitionKey:
    """No key (`column` None), a column's value, or `toYYYYMM(column)`."""

    column: str | None = None
    by_month: bool = False

    @property
    def expression(self) -> str:
        if self.column is None:
            return ""
        return f"toYYYYMM({self.column})" if self.by_month else self.column


@dataclass(frozen=True, slots=True)
class TableSettings:
    """A table's MergeTree settings (`settings: {...}` of `createPartsTable`), ClickHouse's defaults."""

    old_parts_lifetime_secs: int = 480          # old_parts_lifetime: merged-away parts stay readable this long
    parts_to_delay_insert: int = 1000           # active parts in a partition before inserts are slowed
    parts_to_throw_insert: int = 3000           # ... and refused
    max_delay_to_insert_ms: int = 1000
    replicated_deduplication_window: int = 1000
    replicated_deduplication_window_seconds: int = 604800
    merge_selecting_sleep_ms: int = 5000        # how often the primary looks for merges when nothing changed
    fetch_progress_timeout_ms: int = 30000      # a fetch that receives nothing this long moves to another replica
    quorum_lost_after_ms: int = 30000           # a pending quorum's part no live member holds this long: failed
    cleanup_delay_period_secs: int = 30         # how often the primary looks for part-log entries to remove
    staged_parts_timeout_secs: int = 3600       # a job's staged blocks, uncommitted this long after its last: removed
    zero_copy: bool = False                     # part files once in the set's shared storage (docs/zero-copy.md)
    zero_copy_grace_secs: int = 600             # ... and an object nothing marks stays this long after its write
    max_partitions_per_insert_block: int = 100  # partitions one insert block may write (0: no limit)

    NAMES = {"oldPartsLifetimeSecs": "old_parts_lifetime_secs", "partsToDelayInsert": "parts_to_delay_insert",
             "partsToThrowInsert": "parts_to_throw_insert", "maxDelayToInsertMS": "max_delay_to_insert_ms",
             "replicatedDeduplicationWindow": "replicated_deduplication_window",
             "replicatedDeduplicationWindowSeconds": "replicated_deduplication_window_seconds",
             "mergeSelectingSleepMS": "merge_selecting_sleep_ms",
             "fetchProgressTimeoutMS": "fetch_progress_timeout_ms", "quorumLostAfterMS": "quorum_lost_after_ms",
             "cleanupDelayPeriodSecs": "cleanup_delay_period_secs",
             "stagedPartsTimeoutSecs": "staged_parts_timeout_secs", "zeroCopy": "zero_copy",
             "zeroCopyGraceSecs": "zero_copy_grace_secs",
             "maxPartitionsPerInsertBlock": "max_partitions_per_insert_block"}
    FLAGS = frozenset({"zero_copy"})   # true or false; the others are non-negative integers

    def to_document(self) -> dict[str, int | bool]:
        return {doc_name: getattr(self, attr) for doc_name, attr in self.NAMES.items()}

    @classmethod
    def parse(cls, raw: Any) -> TableSettings:
        if raw is None:
            return cls()
        if not isinstance(raw, Mapping):
            raise _bad("'settings' must be an object", FAILED_TO_PARSE)
        values = {}
        for key, value in raw.items():
            attr = cls.NAMES.get(key)
            if attr is None:
                raise _bad(f"unknown table setting {key!r}; known: {', '.join(cls.NAMES)}")
            if attr in cls.FLAGS:
                if not isinstance(value, bool):
                    raise _bad(f"table setting {key!r} must be true or false, not {value!r}")
                values[attr] = value
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float)) or int(value) != value or value < 0:
                raise _bad(f"table setting {key!r} must be a non-negative integer, not {value!r}")
            values[attr] = int(value)
        return cls(**values)


@dataclass(frozen=True, slots=True)
class TableDef:
    db: str
    name: str
    columns: tuple[Column, ...]
    partition: PartitionKey = field(default_factory=PartitionKey)
    order_by: tuple[str, ...] = ()
    metadata_version: int = 0
    settings: TableSettings = field(default_factory=TableSettings)
    # Renames and drops so far, as (kind, column, new name, metadata version): a part written before one
    # reads through it (`oplog.parts.part_files.read_part`).
    changes: tuple[tuple[str, str, str, int], ...] = ()
    # Given at creation, never reused: a dropped table's and a new one's shared objects never share a key.
    uuid: str = ""

    @property
    def ns(self) -> str:
        return f"{self.db}.{self.name}"

    def column(self, name: str) -> Column | None:
        return next((c for c in self.columns if c.name == name), None)

    def to_document(self) -> dict[str, Any]:
        return {"_id": self.name, "columns": [{"name": c.name, "type": c.type, "default": c.default}
                                               for c in self.columns],
                "partitionBy": self.partition.expression, "orderBy": list(self.order_by),
                "metadataVersion": self.metadata_version, "settings": self.settings.to_document(),
                "changes": [list(c) for c in self.changes], **({"uuid": self.uuid} if self.uuid else {})}

    @classmethod
    def from_document(cls, db: str, doc: Mapping[str, Any]) -> TableDef:
        table = parse_table_def(db, str(doc["_id"]), doc)
        changes = tuple((str(k), str(c), str(n), int(v)) for k, c, n, v in doc.get("changes", []))
        return TableDef(table.db, table.name, table.columns, table.partition, table.order_by,
                        int(doc.get("metadataVersion", 0)), table.settings, changes, str(doc.get("uuid", "")))


def alter_table(table: TableDef, spec: Mapping[str, Any]) -> TableDef:
    """The definition after `alterPartsTable`'s one change (`addColumn: {name, type, default}`,
    `dropColumn: <name>` or `renameColumn: {from, to}`), one metadata version up. Columns of the sort
    or partition key cannot be dropped or renamed (their parts are sorted and split by them)."""
    given = [k for k in ("addColumn", "dropColumn", "renameColumn") if k in spec]
    if len(given) != 1:
        raise _bad("alterPartsTable takes exactly one of addColumn, dropColumn, renameColumn")
    version = table.metadata_version + 1
    columns, changes = list(table.columns), list(table.changes)
    keys = {*table.order_by, *([table.partition.column] if table.partition.column else [])}
    kind, arg = given[0], spec[given[0]]
    if kind == "addColumn":
        added = parse_table_def(table.db, table.name, {"columns": [arg]}).columns[0] if isinstance(arg, Mapping) \
            else None
        if added is None:
            raise _bad("addColumn takes {name, type[, default]}", FAILED_TO_PARSE)
        if table.column(added.name) is not None:
            raise _bad(f"column {added.name!r} already exists")
        columns.append(added)
    else:
        old = arg if kind == "dropColumn" else (arg.get("from") if isinstance(arg, Mapping) else None)
        if not isinstance(old, str) or table.column(old) is None:
            raise _bad(f"{kind}: {old!r} is not a column of {table.ns}")
        if old in keys:
            raise _bad(f"{kind}: {old!r} is part of the sort or partition key")
        if kind == "dropColumn":
            if len(columns) == 1:
                raise _bad("dropColumn: a table keeps at least one column")
            columns = [c for c in columns if c.name != old]
            changes.append(("drop", old, "", version))
        else:
            new = arg.get("to")
            if not isinstance(new, str) or not NAME.match(new) or table.column(new) is not None:
                raise _bad(f"renameColumn: {new!r} is not a free column name")
            columns = [Column(new, c.type, c.default) if c.name == old else c for c in columns]
            changes.append(("rename", old, new, version))
    return TableDef(table.db, table.name, tuple(columns), table.partition, table.order_by, version,
                    table.settings, tuple(changes), table.uuid)


def _bad(message: str, code: int = BAD_VALUE) -> MongoError:
    return MongoError(code, message)


def parse_table_def(db: str, name: str, spec: Mapping[str, Any]) -> TableDef:
    """The definition `createPartsTable` describes (its fields `columns`, `partitionBy`, `orderBy`)."""
    if not NAME.match(name):
        raise _bad(f"bad table name {name!r}: letters, digits and '_', not starting with a digit", 73)
    raw_columns = spec.get("columns")
    if not isinstance(raw_columns, Sequence) or isinstance(raw_columns, (str, bytes)) or not raw_columns:
        raise _bad("'columns' must be a non-empty array of {name, type[, default]}", FAILED_TO_PARSE)
    columns: list[Column] = []
    for raw in raw_columns:
        if not isinstance(raw, Mapping) or not isinstance(raw.get("name"), str) or not isinstance(raw.get("type"), str):
            raise _bad(f"bad column {raw!r}: expected {{name: <string>, type: <Arrow type>}}", FAILED_TO_PARSE)
        column_name, type_name = raw["name"], raw["type"]
        if not NAME.match(column_name):
            raise _bad(f"bad column name {column_name!r}")
        if type_name not in ARROW_TYPES:
            raise _bad(f"column {column_name!r}: unknown type {type_name!r}; one of {sorted(ARROW_TYPES)}")
        if any(c.name == column_name for c in columns):
            raise _bad(f"column {column_name!r} is defined twice")
        columns.append(Column(column_name, type_name, raw.get("default")))
    by_name = {c.name: c for c in columns}
    partition = _parse_partition(spec.get("partitionBy"), by_name)
    raw_order = spec.get("orderBy", [])
    order = [raw_order] if isinstance(raw_order, str) else raw_order
    if not isinstance(order, Sequence) or not all(isinstance(c, str) for c in order):
        raise _bad("'orderBy' must be a column name or an array of column names", FAILED_TO_PARSE)
    for c in order:
        if c not in by_name:
            raise _bad(f"orderBy column {c!r} is not a column of the table")
    return TableDef(db, name, tuple(columns), partition, tuple(order), settings=TableSettings.parse(spec.get("settings")))


def _parse_partition(raw: Any, columns: Mapping[str, Column]) -> PartitionKey:
    if raw in (None, "", "tuple()"):
        return PartitionKey()
    if not isinstance(raw, str):
        raise _bad("'partitionBy' must be a column name or toYYYYMM(<column>)", FAILED_TO_PARSE)
    month = TO_YYYYMM.match(raw)
    name = month.group(1) if month else raw
    column = columns.get(name)
    if column is None:
        raise _bad(f"partitionBy column {name!r} is not a column of the table")
    if month and column.type not in DATE_TYPES:
        raise _bad(f"toYYYYMM needs a date or timestamp column; {name!r} is {column.type}")
    return PartitionKey(name, bool(month))


def partition_id(key: PartitionKey, value: Any) -> str:
    """The partition a row whose partition column holds `value` belongs to."""
    if key.column is None:
        return ALL_PARTITION
    if key.by_month:
        if not isinstance(value, (datetime.date, datetime.datetime)):
            raise _bad(f"toYYYYMM({key.column}): {value!r} is not a date")
        return f"{value.year:04d}{value.month:02d}"
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, datetime.datetime):  # the Unix time in seconds, as ClickHouse's DateTime keys
        aware = value if value.tzinfo is not None else value.replace(tzinfo=datetime.UTC)
        return str(int(aware.timestamp()))
    if isinstance(value, datetime.date):
        return value.strftime("%Y%m%d")
    if value is None:
        return "null"
    return hashlib.blake2b(str(value).encode(), digest_size=16).hexdigest()
