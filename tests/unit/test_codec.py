"""The sans-I/O wire codec against pymongo's own encoder and decoder."""

from __future__ import annotations

import struct
from typing import Any

import bson
import pytest
from bson.codec_options import DEFAULT_CODEC_OPTIONS
from bson.int64 import Int64
from bson.timestamp import Timestamp
from pymongo.message import _op_msg, _OpMsg

from base.codec import (
    FLAG_CHECKSUM_PRESENT,
    FLAG_MORE_TO_COME,
    OP_QUERY,
    MessageDecoder,
    OpMsgRequest,
    OpQueryRequest,
    ProtocolError,
    decode_message,
    decode_raw_reply,
    decode_reply,
    encode_op_msg,
    encode_op_msg_request,
    encode_op_reply,
)


def _decode_all(data: bytes) -> list[OpMsgRequest | OpQueryRequest]:
    decoder = MessageDecoder()
    decoder.receive_data(data)
    out = []
    while (msg := decoder.next_message()) is not None:
        out.append(msg)
    return out


@pytest.mark.parametrize(
    "command",
    [
        {"insert": "c", "ordered": True, "documents": [{"_id": 1, "a": "x"}, {"_id": 2, "b": [1, 2]}]},
        {"update": "c", "updates": [{"q": {"_id": 1}, "u": {"$inc": {"n": 1}}, "multi": False}]},
        {"delete": "c", "deletes": [{"q": {}, "limit": 0}]},
        {"find": "c", "filter": {"a": {"$gt": 1}}, "limit": 5},
        {"getMore": Int64(1 << 40), "collection": "c", "batchSize": 10},
        {"hello": 1, "helloOk": True, "client": {"driver": {"name": "PyMongo"}}},
    ],
)
def test_pymongo_requests_decode_to_the_same_command(command: dict[str, object]) -> None:
    request_id, data, _size, _max = _op_msg(0, dict(command), "db", None, DEFAULT_CODEC_OPTIONS)
    (msg,) = _decode_all(data)
    assert isinstance(msg, OpMsgRequest)
    assert msg.request_id == request_id
    merged = msg.command()
    assert merged.pop("$db") == "db"
    assert bson.encode(merged) == bson.encode(command)


def test_documents_travel_in_a_kind_1_section() -> None:
    _rid, data, _s, _m = _op_msg(0, {"insert": "c", "documents": [{"_id": 1}]}, "db", None,
                                 DEFAULT_CODEC_OPTIONS)
    (msg,) = _decode_all(data)
    assert isinstance(msg, OpMsgRequest)
    assert msg.sequences == {"documents": [{"_id": 1}]}


def test_replies_parse_with_pymongo() -> None:
    reply = {"cursor": {"firstBatch": [{"_id": 1}], "id": Int64(0), "ns": "db.c"}, "ok": 1.0}
    data = encode_op_msg(reply, request_id=7, response_to=42)
    length, request_id, response_to, opcode = struct.unpack_from("<iiii", data)
    assert (length, request_id, response_to, opcode) == (len(data), 7, 42, 2013)
    parsed = _OpMsg.unpack(data[16:])
    assert parsed.unpack_response()[0] == reply


def test_decoder_handles_one_byte_at_a_time() -> None:
    data = b"".join(encode_op_msg_request({"ping": 1, "$db": "admin"}, i) for i in range(3))
    decoder = MessageDecoder()
    seen = []
    for byte in data:
        decoder.receive_data(bytes([byte]))
        while (msg := decoder.next_message()) is not None:
            seen.append(msg.request_id)
    assert seen == [0, 1, 2]
    assert decoder.buffered == 0


def test_checksum_is_verified() -> None:
    data = encode_op_msg_request({"ping": 1, "$db": "admin"}, 1, flags=FLAG_CHECKSUM_PRESENT)
    (msg,) = _decode_all(data)
    assert isinstance(msg, OpMsgRequest) and msg.body["ping"] == 1
    corrupted = data[:-1] + bytes([data[-1] ^ 0xFF])
    with pytest.raises(ProtocolError, match="checksum"):
        _decode_all(corrupted)


def test_more_to_come_flag() -> None:
    data = encode_op_msg_request({"insert": "c", "$db": "d"}, 1, flags=FLAG_MORE_TO_COME)
    (msg,) = _decode_all(data)
    assert isinstance(msg, OpMsgRequest) and msg.more_to_come


def _op_query(query: dict[str, object], collection: str = "admin.$cmd") -> bytes:
    body = struct.pack("<i", 0) + collection.encode() + b"\x00" + struct.pack("<ii", 0, -1) + bson.encode(query)
    return struct.pack("<iiii", 16 + len(body), 5, 0, OP_QUERY) + body


def test_legacy_op_query_handshake_and_op_reply() -> None:
    (msg,) = _decode_all(_op_query({"isMaster": 1, "helloOk": True}))
    assert isinstance(msg, OpQueryRequest)
    assert msg.collection == "admin.$cmd" and msg.limit == -1 and msg.query == {"isMaster": 1, "helloOk": True}
    reply = encode_op_reply({"ismaster": True, "ok": 1.0}, request_id=9, response_to=5)
    response_to, doc = decode_reply(reply)
    assert response_to == 5 and doc == {"ismaster": True, "ok": 1.0}
    flags, cursor_id, start, count = struct.unpack_from("<iqii", reply, 16)
    assert (flags & 3, cursor_id, start, count) == (0, 0, 0, 1)


def _header(length: int, opcode: int = 2013) -> bytes:
    return struct.pack("<iiii", length, 1, 0, opcode)


def _msg(flags: int, sections: bytes) -> bytes:
    body = struct.pack("<I", flags) + sections
    return _header(16 + len(body)) + body


BODY = b"\x00" + bson.encode({"ping": 1, "$db": "admin"})


@pytest.mark.parametrize(
    ("data", "error"),
    [
        (_header(8), "invalid message length"),
        (_header(49_000_000), "invalid message length"),
        (_header(-5), "invalid message length"),
        (_msg(0, b""), "too short"),
        (_msg(0, BODY + BODY), "more than one body"),
        (_msg(0, b"\x07" + bson.encode({"a": 1})), "unknown OP_MSG section kind"),
        (_msg(1 << 5, BODY), "unknown required OP_MSG flag"),
        (_msg(0, b"\x00" + b"\x10\x00\x00\x00garbage-garbage"), "BSON"),
        (_msg(0, b"\x00" + struct.pack("<i", 1000) + b"\x00" * 8), "out of bounds"),
        (_msg(0, b"\x01" + struct.pack("<i", 8) + b"abcd"), "identifier is not terminated"),
        (_msg(0, b"\x01" + struct.pack("<i", 3)), "length out of bounds"),
        (_header(20, 2012) + b"\x00" * 4, "compression"),
        (_header(20, 2004) + b"\x00" * 4, "not terminated"),
        (_header(20, 2001) + b"\x00" * 4, "unsupported opcode"),
    ],
)
def test_malformed_messages_raise_protocol_error(data: bytes, error: str) -> None:
    with pytest.raises(ProtocolError, match=error):
        _decode_all(data)


def test_decode_message_rejects_body_and_sequence_conflict() -> None:
    data = encode_op_msg_request({"insert": "c", "documents": [], "$db": "d"}, 1,
                                 sequences={"documents": [{"_id": 1}]})
    msg = decode_message(data)
    assert isinstance(msg, OpMsgRequest)
    with pytest.raises(ProtocolError, match="duplicate"):
        msg.command()


def test_a_raw_reply_keeps_the_bytes_of_its_sub_documents() -> None:
    """An oplog fetcher stores entries with the bytes the source sent (no decode and re-encode)."""
    entries = [{"ts": Timestamp(1, i), "op": "i", "ns": "db.c", "o": {"_id": i, "x": 1.5}} for i in range(3)]
    frame = encode_op_msg({"cursor": {"nextBatch": entries, "id": Int64(7)}, "ok": 1.0}, 1, 42)
    response_to, reply = decode_raw_reply(frame)
    assert response_to == 42 and reply["ok"] == 1.0 and reply["cursor"]["id"] == 7
    assert [doc.raw for doc in reply["cursor"]["nextBatch"]] == [bson.encode(e) for e in entries]
    body = b"\x00\x00\x00\x00" + b"\x00" + struct.pack("<i", 1000) + b"\x00" * 8  # says 1,000 bytes, has 12
    with pytest.raises(ProtocolError):
        decode_raw_reply(struct.pack("<iiii", 16 + len(body), 1, 42, 2013) + body)


def _nested(depth: int) -> dict[str, Any]:
    doc: dict[str, Any] = {"leaf": [1, "x", {"y": b"z"}]}
    for i in range(depth):
        doc = {"a": doc} if i % 2 else {"b": [doc]}
    return doc


def test_nesting_depth_is_measured_without_recursion() -> None:
    from base.codec import nesting_exceeds

    shallow = bson.encode(_nested(20))
    assert not nesting_exceeds(shallow, 200)
    assert nesting_exceeds(shallow, 10)
    # Deeper than Python's decoder can go: built by hand, byte by byte.
    blob = b"\x10n\x00\x01\x00\x00\x00"
    for _ in range(5000):
        body = b"\x03d\x00" + struct.pack("<i", len(blob) + 5) + blob + b"\x00"
        blob = body
    deep = struct.pack("<i", len(blob) + 5) + blob + b"\x00"
    assert nesting_exceeds(deep, 200)
    assert not nesting_exceeds(b"\x05\x00\x00\x00", 200)
    assert not nesting_exceeds(b"\xff\xff", 200)  # not BSON: not a depth problem


def test_a_command_too_deep_to_decode_gets_overflow() -> None:
    from base.codec import MalformedRequest, decode_request

    blob = b"\x10n\x00\x01\x00\x00\x00"
    for _ in range(5000):
        blob = b"\x03d\x00" + struct.pack("<i", len(blob) + 5) + blob + b"\x00"
    body = b"\x10ping\x00\x01\x00\x00\x00\x02$db\x00\x06\x00\x00\x00admin\x00" + b"\x03f\x00" + \
        struct.pack("<i", len(blob) + 5) + blob + b"\x00"
    doc = struct.pack("<i", len(body) + 5) + body + b"\x00"
    payload = struct.pack("<I", 0) + b"\x00" + doc
    frame = struct.pack("<iiii", 16 + len(payload), 7, 0, 2013) + payload
    request = decode_request(frame)
    assert isinstance(request, MalformedRequest) and request.code == 15


def test_negative_lengths_cannot_make_the_depth_scan_loop() -> None:
    from base.codec import MessageDecoder, nesting_exceeds

    body = b"\x02\x00" + struct.pack("<i", -6) + b"ab\x00"
    doc = struct.pack("<i", len(body) + 5) + body + b"\x00"
    assert not nesting_exceeds(doc, 200)
    for kind in (b"\x05", b"\x0f", b"\x03", b"\x0d"):
        odd = kind + b"x\x00" + struct.pack("<i", -100) + b"\x00" * 8
        blob = struct.pack("<i", len(odd) + 5) + odd + b"\x00"
        assert not nesting_exceeds(blob, 200)
    payload = struct.pack("<I", 0) + b"\x00" + doc
    decoder = MessageDecoder()
    decoder.receive_data(struct.pack("<iiii", 16 + len(payload), 9, 0, 2013) + payload)
    request = decoder.next_request()
    assert request is not None and getattr(request, "code", None) == 22
