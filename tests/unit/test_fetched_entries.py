"""A fetched batch's entries keep the bytes the source sent, as `bytes`: pymongo hands a large
sub-document's bytes as a view of the reply, and a view is not searched as bytes are (the part log's
runner looks for its marker in each committed entry's bytes)."""

from __future__ import annotations

import bson

from base.codec import decode_raw_reply, encode_op_msg
from replset.parts.manager import MARKER
from sync.worker import fetched_entries


def _reply_batch(entries: list[dict]) -> list:
    frame = encode_op_msg({"cursor": {"nextBatch": entries, "id": 0, "ns": "local.oplog.rs"}, "ok": 1}, 8, 7)
    _to, reply = decode_raw_reply(frame)
    return reply["cursor"]["nextBatch"]


def test_every_entry_keeps_its_bytes_as_bytes_whatever_its_size() -> None:
    small = {"ts": bson.Timestamp(1, 1), "t": 1, "op": "i", "ns": "db.c", "o": {"_id": 1}}
    large = {"ts": bson.Timestamp(1, 2), "t": 1, "op": "i", "ns": "sp.system.parts.t.log",
             "o": {"_id": "job", "parts": [f"202401_{i}_{i}_0" for i in range(2_000)]}}
    batch = _reply_batch([small, large])
    assert any(type(doc.raw) is not bytes for doc in batch)   # what pymongo does with the large one

    entries = fetched_entries(batch)

    assert [type(raw) for _doc, raw in entries] == [bytes, bytes]
    assert [raw for _doc, raw in entries] == [bson.encode(small), bson.encode(large)]
    assert [doc for doc, _raw in entries] == [small, large]
    assert MARKER in entries[1][1] and MARKER not in entries[0][1]
