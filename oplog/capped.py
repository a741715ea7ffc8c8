"""Capped collections: a size in bytes and, optionally, a number of documents, kept by removing the
oldest documents (natural order is insertion order) as new ones come in.

The primary trims: each document an insert pushes out is logged as a delete entry in the same write,
so every member removes exactly the documents the primary removed (as MongoDB 5.0+ replicates capped
deletes), and a secondary never trims on its own. Pure: the transaction and the log writer come in
through the `WriteEnv`.
"""

from __future__ import annotations

__layer__ = "core"  # pure: no I/O, clock or randomness (tests/unit/test_layering.py)

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import bson

from base.errors import MongoError
from oplog.codec_options import DOC_OPTIONS
from oplog.entry import delete_entry

if TYPE_CHECKING:
    from oplog.writes import WriteEnv

MAX_CAPPED_SIZE = 0x4000000000000  # 1 PB, mongod's ceiling for `size`
MAX_CAPPED_DOCS = 0x7FFFFFFF  # mongod's ceiling for `max`
_TRIM_CHUNK = 256


@dataclass(frozen=True, slots=True)
class CappedLimits:
    size: int  # bytes of BSON the collection may hold
    max_docs: int  # 0: no limit on the number of documents


MIN_CAPPED_SIZE = 4096


def capped_limits(options: Mapping[str, Any]) -> CappedLimits | None:
    """A collection's limits from its stored options; None for a collection that is not capped. As
    mongod's: a size of at most 4096 bytes is 4096, a larger one rounds up to a multiple of 256."""
    if not options.get("capped"):
        return None
    size = int(options.get("size") or 0)
    size = MIN_CAPPED_SIZE if size <= MIN_CAPPED_SIZE else (size + 0xFF) & ~0xFF
    return CappedLimits(size, int(options.get("max") or 0))


def check_capped_options(options: Mapping[str, Any]) -> dict[str, Any]:
    """`create`'s capped options as mongod checks them; returns the options to store."""
    out = dict(options)
    if not options.get("capped"):
        for name in ("size", "max"):
            out.pop(name, None)  # (mongod ignores them on a collection that is not capped)
        return out
    size = options.get("size")
    if isinstance(size, bool) or not isinstance(size, (int, float)):
        raise MongoError(72, "the 'size' field is required when 'capped' is true")
    if size <= 0 or size > MAX_CAPPED_SIZE:
        raise MongoError(72, f"capped size must be greater than 0 and at most {MAX_CAPPED_SIZE}")
    out["size"] = int(size)
    max_docs = options.get("max")
    if max_docs is not None:
        if isinstance(max_docs, bool) or not isinstance(max_docs, (int, float)):
            raise MongoError(14, "'max' must be a number")
        if max_docs > MAX_CAPPED_DOCS:
            raise MongoError(72, f"capped max must be at most {MAX_CAPPED_DOCS}")
        if max_docs <= 0:
            out.pop("max")  # (no limit on the count, as mongod takes 0 and negatives)
        else:
            out["max"] = int(max_docs)
    return out


def check_capped_insert(env: WriteEnv, ns: str, limits: CappedLimits, doc_size: int) -> None:
    """Refusals before a document goes into a capped collection."""
    if env.in_transaction:
        raise MongoError(263, f"Collection '{ns}' is a capped collection. Writes in transactions are not "
                              "allowed on capped collections.")
    if doc_size > limits.size:
        raise MongoError(10003, f"object to insert exceeds cappedMaxSize: {doc_size} > {limits.size}")


def trim_capped(env: WriteEnv, ns: str, limits: CappedLimits, ui: Any) -> int:
    """Removes the oldest documents until the collection is within its limits, logging a delete for
    each; returns how many went. The collection's totals are kept on the `WriteEnv` for the rest of
    the write (counted once per write, not once per document)."""
    totals = env.capped_totals.get(ns)
    if totals is None:
        totals = env.capped_totals[ns] = list(env.txn.totals(ns))
    removed = 0
    while totals[1] > limits.size or (limits.max_docs and totals[0] > limits.max_docs):
        rows = env.txn.oldest_rows(ns, _TRIM_CHUNK)
        if len(rows) <= 1:
            break  # (the newest document stays: it fits on its own)
        for _rid, blob in rows[:-1]:
            if not (totals[1] > limits.size or (limits.max_docs and totals[0] > limits.max_docs)):
                break
            id_value = bson.decode(blob, DOC_OPTIONS)["_id"]
            env.emit(delete_entry(ns, id_value, ui))
            totals[0] -= 1
            totals[1] -= len(blob)
            env.capped_totals[ns] = totals  # (emitting a delete forgot them: this one is counted here)
            removed += 1
    return removed


def note_capped_insert(env: WriteEnv, ns: str, doc_size: int) -> None:
    """Counts an inserted document in the write's totals (when they were counted already)."""
    totals = env.capped_totals.get(ns)
    if totals is not None:
        totals[0] += 1
        totals[1] += doc_size
