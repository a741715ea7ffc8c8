"""Oplog entries: builders for each kind, and stamping with an optime.

An entry records the *result* of a write, never the operation, so that applying
it twice equals applying it once (see `oplog.apply`). Shapes follow MongoDB's
`local.oplog.rs`: `{op, ns, ui?, o, o2?, b?, lsid?, txnNumber?, stmtId?, ts, t, v, wall}`.
"""

from __future__ import annotations

__layer__ = "core"  # pure: no I/O, clock or randomness (tests/unit/test_layering.py)

import datetime
from collections.abc import Mapping
from typing import Any

from bson.binary import Binary
from bson.int64 import Int64

from base.optime import OpTime

SESSIONS_NS = "config.transactions"  # each session's last retryable write or transaction

def insert_entry(ns: str, doc: Mapping[str, Any], ui: Binary | None = None) -> dict[str, Any]:
    return _base("i", ns, ui) | {"o": dict(doc)}


def update_entry(ns: str, id_value: Any, o: Mapping[str, Any], ui: Binary | None = None,
                 *, upsert: bool = False) -> dict[str, Any]:
    entry = _base("u", ns, ui) | {"o": dict(o), "o2": {"_id": id_value}}
    if upsert:
        entry["b"] = True
    return entry


def delete_entry(ns: str, id_value: Any, ui: Binary | None = None) -> dict[str, Any]:
    return _base("d", ns, ui) | {"o": {"_id": id_value}}


def command_entry(db: str, o: Mapping[str, Any], ui: Binary | None = None) -> dict[str, Any]:
    return _base("c", f"{db}.$cmd", ui) | {"o": dict(o)}


def noop_entry(msg: str) -> dict[str, Any]:
    return {"op": "n", "ns": "", "o": {"msg": msg}}


def _base(op: str, ns: str, ui: Binary | None) -> dict[str, Any]:
    entry: dict[str, Any] = {"op": op, "ns": ns}
    if ui is not None:
        entry["ui"] = ui
    return entry


def stamp(entry: Mapping[str, Any], optime: OpTime, wall: datetime.datetime) -> dict[str, Any]:
    """The entry as stored: with `ts`, `t`, `v` and `wall`."""
    stamped = dict(entry)
    stamped.update(ts=optime.ts, t=Int64(optime.term), v=Int64(2), wall=wall)
    return stamped


def entry_optime(entry: Mapping[str, Any]) -> OpTime:
    return OpTime.from_document(dict(entry))


def cost_grows_with_data(entry: Mapping[str, Any]) -> bool:
    """Whether applying `entry` costs in proportion to a collection's size: building a unique index
    (every document's keys) or dropping a collection or a database (freeing every page)."""
    if entry.get("op") != "c":
        return False
    o = entry.get("o")
    if not isinstance(o, Mapping) or not o:
        return False
    name = next(iter(o))
    return name in ("drop", "dropDatabase") or (name == "createIndexes" and bool(o.get("unique")))


def flattened(entry: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """A transaction's `applyOps` entry as the entries it holds, each with the outer entry's `ts`,
    `t` and `wall` (and its `lsid` / `txnNumber`); any other entry as itself."""
    o = entry.get("o")
    if entry.get("op") != "c" or not isinstance(o, Mapping) or "applyOps" not in o:
        return [entry]
    outer = {k: entry[k] for k in ("ts", "t", "wall", "lsid", "txnNumber") if k in entry}
    return [{**inner, **outer} for inner in o["applyOps"]]
