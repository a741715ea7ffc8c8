"""Apply one oplog entry to the store: the only way data changes.

Theory of operation: the primary's own writes and a secondary's replicated writes
both come here. Entries are idempotent, and in *replay* mode (secondaries, initial
sync, crash recovery) this function tolerates what re-application produces, as
MongoDB's secondaries do: an insert of an existing `_id` replaces it, an update of
a missing document is skipped (unless it is an upsert, `b: true`), a delete of a
missing document is a no-op, and DDL on missing or existing collections succeeds.
In steady-state mode (the primary) the same situations raise.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from base.errors import MongoError
from oplog import preimages
from oplog.sqlite_store import StoreTxn
from oplog.update import apply_oplog_update
from oplog.views import apply_view_command

# Collection options `collMod` sets (and a logged collMod entry carries).
COLLMOD_OPTIONS = ("validator", "validationLevel", "validationAction", "changeStreamPreAndPostImages")


def apply_entry(txn: StoreTxn, entry: Mapping[str, Any], *, replay: bool, index: int = 0) -> None:
    """`index`: the write's position in a transaction's `applyOps` entry (whose optime it shares)."""
    op = entry["op"]
    match op:
        case "i":
            txn.insert(entry["ns"], dict(entry["o"]), upsert=replay)
        case "u":
            _apply_update(txn, entry, replay=replay, index=index)
        case "d":
            _keep_preimage(txn, entry, entry["o"]["_id"], index)
            txn.delete(entry["ns"], entry["o"]["_id"])
        case "c" if "applyOps" in entry["o"]:
            outer = {k: entry[k] for k in ("ts", "wall") if k in entry}
            for position, inner in enumerate(entry["o"]["applyOps"]):  # all in this one transaction
                apply_entry(txn, {**inner, **outer}, replay=replay, index=position)
        case "c":
            apply_command(txn, entry["ns"].split(".", 1)[0], entry["o"], entry.get("ui"))
        case "n":
            pass
        case _:
            raise MongoError(2, f"unknown oplog entry op {op!r}")


def _keep_preimage(txn: StoreTxn, entry: Mapping[str, Any], id_value: Any, index: int,
                   current: Mapping[str, Any] | None = None) -> None:
    """The document before a logged update or delete, for change streams (oplog/preimages.py).
    Only entries with an optime have one: a transaction's statements are applied unstamped while
    it runs, and rolled back."""
    info = txn.collection(entry["ns"]) if "ts" in entry else None
    if info is None or not preimages.enabled(info.options):
        return
    before = current if current is not None else txn.get(entry["ns"], id_value)
    if before is not None:
        preimages.record(txn, entry["ns"], before, entry["ts"], index, entry.get("wall"))


def _apply_update(txn: StoreTxn, entry: Mapping[str, Any], *, replay: bool, index: int = 0) -> None:
    ns, id_value = entry["ns"], entry["o2"]["_id"]
    current = txn.get(ns, id_value)
    if current is not None:
        _keep_preimage(txn, entry, id_value, index, current)
    if current is None:
        if entry.get("b"):
            new_doc = apply_oplog_update({"_id": id_value}, entry["o"])
            txn.insert(ns, new_doc, upsert=replay)
        elif not replay:
            raise MongoError(1, f"update of a missing document {id_value!r} in {ns}")
        return
    txn.replace(ns, apply_oplog_update(current, entry["o"]))


def apply_command(txn: StoreTxn, db: str, o: Mapping[str, Any], ui: Any = None) -> None:
    name = next(iter(o))
    if name in ("create", "collMod", "drop") and apply_view_command(txn, db, o):
        return
    match name:
        case "create":
            options = {k: v for k, v in o.items() if k not in ("create", "idIndex")}
            txn.create_collection(f"{db}.{o['create']}", options, ui)
        case "drop":
            txn.drop_collection(f"{db}.{o['drop']}")
        case "dropDatabase":
            for info in txn.collections(db):
                txn.drop_collection(info.ns)
        case "createIndexes":
            ns = f"{db}.{o['createIndexes']}"
            if txn.collection(ns) is None:
                txn.create_collection(ns, None, ui)
            spec = {k: v for k, v in o.items() if k != "createIndexes"}
            txn.create_index(ns, spec)
        case "dropIndexes":
            txn.drop_index(f"{db}.{o['dropIndexes']}", o["index"])
        case "collMod":
            validation = {k: v for k, v in o.items() if k in COLLMOD_OPTIONS}
            if validation:
                txn.set_collection_options(f"{db}.{o['collMod']}", validation)
            index = o.get("index")
            if isinstance(index, Mapping) and "expireAfterSeconds" in index:
                txn.set_index_option(f"{db}.{o['collMod']}", index["name"], "expireAfterSeconds",
                                     index["expireAfterSeconds"])
        case "renameCollection":
            target = o["to"]
            if o.get("dropTarget"):
                txn.drop_collection(target)
            txn.rename_collection(o["renameCollection"], target)
        case _:
            raise MongoError(2, f"unknown oplog command {name!r}")
