"""Change-stream pre-images: the document as it was before an update, replacement or delete, kept
for collections created or modified with `changeStreamPreAndPostImages: {enabled: true}`.

Each member records them itself while applying an entry (the primary as it writes, secondaries as
they replicate), into `config.system.preimages`, which is not logged: `_id` is
`{nsUUID, ts, applyOpsIndex}` (the entry's optime, and the write's position in a transaction's
entry). Change streams read them for `fullDocumentBeforeChange`, and compute post-images (the
pre-image with the update applied) for `fullDocument: whenAvailable / required`. They are let go
once their entry has left the oplog (`expired_before`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from bson.int64 import Int64
from bson.timestamp import Timestamp

from oplog.sqlite_store import StoreTxn

PREIMAGES_NS = "config.system.preimages"


def enabled(options: Mapping[str, Any]) -> bool:
    setting = options.get("changeStreamPreAndPostImages")
    return isinstance(setting, Mapping) and setting.get("enabled") is True


def preimage_id(ui: Any, ts: Timestamp, index: int) -> dict[str, Any]:
    return {"nsUUID": ui, "ts": ts, "applyOpsIndex": Int64(index)}


def record(txn: StoreTxn, ns: str, before: Mapping[str, Any], ts: Timestamp, index: int,
           wall: Any) -> None:
    """Keeps `before` as the pre-image of the write at (`ts`, `index`) to `ns`, if `ns` keeps them."""
    info = txn.collection(ns)
    if info is None or not enabled(info.options):
        return
    if txn.collection(PREIMAGES_NS) is None:
        txn.create_collection(PREIMAGES_NS)
    txn.insert(PREIMAGES_NS, {"_id": preimage_id(info.uuid, ts, index), "operationTime": wall,
                              "preImage": dict(before)}, upsert=True)


def expired_before(doc: Mapping[str, Any], oldest: Timestamp) -> bool:
    """Whether a pre-image's entry is older than the oplog's oldest entry."""
    ident = doc.get("_id")
    return isinstance(ident, Mapping) and isinstance(ident.get("ts"), Timestamp) and ident["ts"] < oldest
