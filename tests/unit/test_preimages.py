"""Pre-images recorded while entries are applied: for collections that keep them only, keyed by the
entry's optime and the write's position in a transaction; expired once the oplog has moved on."""

from __future__ import annotations

from bson.timestamp import Timestamp

from oplog.apply import apply_entry
from oplog.preimages import PREIMAGES_NS, expired_before, preimage_id
from oplog.sqlite_store import SQLiteStore


def test_updates_and_deletes_keep_their_pre_images_where_asked() -> None:
    store = SQLiteStore(None)
    try:
        txn = store.begin()
        kept = txn.create_collection("db.kept", {"changeStreamPreAndPostImages": {"enabled": True}})
        txn.create_collection("db.plain")
        for ns in ("db.kept", "db.plain"):
            txn.insert(ns, {"_id": 1, "n": 1})
            txn.insert(ns, {"_id": 2, "n": 2})
        ts = Timestamp(100, 1)
        for ns in ("db.kept", "db.plain"):
            apply_entry(txn, {"op": "u", "ns": ns, "o": {"$set": {"n": 5}}, "o2": {"_id": 1}, "ts": ts},
                        replay=True)
        writes = [{"op": "d", "ns": "db.kept", "o": {"_id": 2}}, {"op": "d", "ns": "db.kept", "o": {"_id": 1}}]
        apply_entry(txn, {"op": "c", "ns": "admin.$cmd", "o": {"applyOps": writes}, "ts": Timestamp(101, 1)},
                    replay=True)
        apply_entry(txn, {"op": "u", "ns": "db.kept", "o": {"$set": {"n": 9}}, "o2": {"_id": 3}}, replay=True)
        images = {(d["_id"]["ts"].time, int(d["_id"]["applyOpsIndex"])): d["preImage"]
                  for d in txn.scan(PREIMAGES_NS)}
        assert images == {(100, 0): {"_id": 1, "n": 1}, (101, 0): {"_id": 2, "n": 2}, (101, 1): {"_id": 1, "n": 5}}
        assert txn.get(PREIMAGES_NS, preimage_id(kept.uuid, ts, 0)) is not None
        store.rollback()
    finally:
        store.close()


def test_a_pre_image_expires_with_its_entry() -> None:
    doc = {"_id": {"nsUUID": None, "ts": Timestamp(100, 1), "applyOpsIndex": 0}}
    assert expired_before(doc, Timestamp(100, 2)) and not expired_before(doc, Timestamp(100, 1))
