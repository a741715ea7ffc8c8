"""Sans-I/O codec for the MongoDB wire protocol (OP_MSG, legacy OP_QUERY / OP_REPLY).

Theory of operation: `MessageDecoder.receive_data(bytes)` buffers input (bounded by
the largest legal message); `next_message()` returns one decoded request or None
when more bytes are needed. Encoders turn reply documents into bytes. No sockets,
no asyncio: the server shell feeds bytes in and writes bytes out.

Two kinds of bad input, told apart because they call for different answers:
- An *unframeable* stream: the length prefix is below 16 or above maxMessageSizeBytes.
  Nothing after it can be trusted to start a message, so `next_frame()` raises
  `ProtocolError` as soon as the 4 length bytes are in, before buffering the body,
  and the server closes that one connection (as mongod does).
- A *framed* message with bad contents (corrupt BSON, bad sections, checksum, an
  opcode we do not serve). The length still says where the next message starts,
  so `next_request()` returns a `MalformedRequest` the server answers with an
  error, keeping the connection, unless the message asked for no reply.
`next_message()` keeps the strict contract (raise on both kinds) for callers that
want it.
"""

from __future__ import annotations

__layer__ = "core"  # pure: no I/O, clock or randomness (tests/unit/test_layering.py)

import struct
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import bson
import google_crc32c
from bson.codec_options import CodecOptions
from bson.raw_bson import RawBSONDocument

OP_REPLY = 1
OP_QUERY = 2004
OP_COMPRESSED = 2012
OP_MSG = 2013

FLAG_CHECKSUM_PRESENT = 1 << 0
FLAG_MORE_TO_COME = 1 << 1
FLAG_EXHAUST_ALLOWED = 1 << 16
_REQUIRED_FLAG_MASK = 0xFFFF
_KNOWN_REQUIRED = FLAG_CHECKSUM_PRESENT | FLAG_MORE_TO_COME

MAX_MESSAGE_SIZE = 48_000_000
MAX_BSON_SIZE = 16 * 1024 * 1024
HEADER = struct.Struct("<iiii")
_INT32 = struct.Struct("<i")
_UINT32 = struct.Struct("<I")
_REPLY_PREFIX = struct.Struct("<iqii")

# Documents decode to plain dicts; binary subtype 4 stays a bson Binary so that
# session ids round-trip byte for byte.
DECODE_OPTIONS: CodecOptions[dict[str, Any]] = CodecOptions(document_class=dict)
RAW_OPTIONS: CodecOptions[RawBSONDocument] = CodecOptions(document_class=RawBSONDocument)

# Kind-1 payloads the server accepts and merges into the command body.
_SEQUENCE_FIELDS = {"insert": "documents", "update": "updates", "delete": "deletes"}


FAILED_TO_PARSE = 9
INVALID_BSON = 22
OVERFLOW = 15
MAX_BSON_DEPTH = 200  # mongod's BSONDepth::kDefaultMaxAllowableDepth


class ProtocolError(Exception):
    """The peer broke the wire protocol. `code` is the MongoDB error code an error reply carries when the
    message was framed (the stream is still in step); an unframeable stream closes the connection."""

    def __init__(self, message: str, code: int = FAILED_TO_PARSE) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True, slots=True)
class MalformedRequest:
    """A message whose length framed it correctly but whose contents are invalid: answered with an
    error (`code`, `reason`) in the reply format of its opcode, or not at all with `more_to_come`."""

    request_id: int
    opcode: int
    more_to_come: bool
    code: int
    reason: str


@dataclass(frozen=True, slots=True)
class OpMsgRequest:
    request_id: int
    flags: int
    body: dict[str, Any]
    sequences: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    depth_checked: bool = False   # its nesting was found within bounds off the event loop (a large message)

    @property
    def more_to_come(self) -> bool:
        return bool(self.flags & FLAG_MORE_TO_COME)

    def command(self) -> dict[str, Any]:
        """The body with every document sequence merged in as an array field."""
        if not self.sequences:
            return self.body
        merged = dict(self.body)
        for ident, docs in self.sequences.items():
            if ident in merged:
                raise ProtocolError(f"duplicate field {ident!r} in body and document sequence")
            merged[ident] = docs
        return merged


@dataclass(frozen=True, slots=True)
class OpQueryRequest:
    request_id: int
    flags: int
    collection: str
    skip: int
    limit: int
    query: dict[str, Any]


Request = OpMsgRequest | OpQueryRequest


class MessageDecoder:
    """Splits a byte stream into requests. Buffers at most one maximal message."""

    def __init__(self, max_message_size: int = MAX_MESSAGE_SIZE) -> None:
        self._buffer = bytearray()
        self._max = max_message_size

    def receive_data(self, data: bytes) -> None:
        self._buffer += data

    def has_message(self) -> bool:
        """Whether a whole message is buffered. Raises `ProtocolError` on a length no legal message
        has, as soon as the length is readable (nothing more is buffered)."""
        return self._whole_length() is not None

    def _whole_length(self) -> int | None:
        buf = self._buffer
        if len(buf) < 4:
            return None
        (length,) = _INT32.unpack_from(buf, 0)
        if length < HEADER.size or length > self._max:
            raise ProtocolError(f"invalid message length {length}")
        return length if len(buf) >= length else None

    def next_frame(self) -> bytes | None:
        """The next whole message's bytes, or None until they are all in. Raises `ProtocolError` as
        `has_message` does."""
        length = self._whole_length()
        if length is None:
            return None
        buf = self._buffer
        if len(buf) == length:  # the usual case: one copy, and the buffer's memory goes at once
            frame = bytes(buf)
            self._buffer = bytearray()
            return frame
        with memoryview(buf) as view:  # (a slice of the bytearray would be a second copy)
            frame = bytes(view[:length])
        del buf[:length]
        return frame

    def clear(self) -> None:
        """Drops what is buffered (the connection is gone)."""
        self._buffer = bytearray()

    def next_message(self) -> Request | None:
        """The next request; raises `ProtocolError` for an unframeable length *and* for bad contents."""
        frame = self.next_frame()
        return None if frame is None else decode_message(frame)

    def next_request(self) -> Request | MalformedRequest | None:
        """The next request, or a `MalformedRequest` for a framed message with bad contents; raises
        `ProtocolError` only for an unframeable length."""
        frame = self.next_frame()
        return None if frame is None else decode_request(frame)

    @property
    def partial(self) -> bool:
        """Some bytes of a message are in but not all of it (the connection is mid-message)."""
        return bool(self._buffer)

    @property
    def buffered(self) -> int:
        return len(self._buffer)


def decode_request(frame: bytes) -> Request | MalformedRequest:
    """Decodes one framed message; bad contents become a `MalformedRequest` instead of an exception."""
    try:
        return decode_message(frame)
    except ProtocolError as exc:
        _length, request_id, _response_to, opcode = HEADER.unpack_from(frame, 0)
        more_to_come = False
        if opcode == OP_MSG and len(frame) >= HEADER.size + 4:
            more_to_come = bool(_UINT32.unpack_from(frame, HEADER.size)[0] & FLAG_MORE_TO_COME)
        return MalformedRequest(request_id, opcode, more_to_come, exc.code, str(exc))


def decode_message(frame: bytes) -> Request:
    _length, request_id, _response_to, opcode = HEADER.unpack_from(frame, 0)
    if opcode == OP_MSG:
        return _decode_op_msg(frame, request_id)
    if opcode == OP_QUERY:
        return _decode_op_query(frame, request_id)
    if opcode == OP_COMPRESSED:
        raise ProtocolError("compression was not negotiated")
    raise ProtocolError(f"unsupported opcode {opcode}")


def _decode_bson(data: bytes | memoryview) -> dict[str, Any]:
    try:
        return bson.decode(data, DECODE_OPTIONS)
    except Exception as exc:  # bson raises several types for corrupt input
        if nesting_exceeds(bytes(data), MAX_BSON_DEPTH):
            # The decoder recurses and gives up on very deep documents: answer as mongod does.
            raise ProtocolError("BSONObj exceeds maximum nested object depth", OVERFLOW) from None
        raise ProtocolError(f"invalid BSON: {exc}", INVALID_BSON) from None


# Fixed sizes of BSON values by type; -1: a string (int32 length first), -2: binary, -3: regex (two
# cstrings), -4: a db pointer (string + ObjectId), -5: code with scope (int32 total length first).
_VALUE_SIZES = {0x01: 8, 0x02: -1, 0x05: -2, 0x06: 0, 0x07: 12, 0x08: 1, 0x09: 8, 0x0A: 0, 0x0B: -3,
                0x0C: -4, 0x0D: -1, 0x0E: -1, 0x0F: -5, 0x10: 4, 0x11: 8, 0x12: 8, 0x13: 16, 0xFF: 0,
                0x7F: 0}


def nesting_exceeds(data: bytes, limit: int) -> bool:
    """Whether the BSON document in `data` nests objects and arrays deeper than `limit` levels.
    Iterative (no recursion, whatever the depth); False when the bytes are not BSON in another way.
    Every step moves strictly forward within `data`, so no input can make it loop."""
    end = len(data)

    def length_at(at: int) -> int:
        (value,) = _INT32.unpack_from(data, at)
        if value < 0 or at + value > end:
            raise ValueError("bad length")
        return int(value)

    try:
        ends = [length_at(0)]
        pos = 4
        while ends:
            if pos >= end:
                return False
            kind = data[pos]
            pos += 1
            if kind == 0:
                ends.pop()
                continue
            pos = data.index(b"\x00", pos) + 1  # the element's name
            if kind in (0x03, 0x04):
                ends.append(pos + length_at(pos))
                if len(ends) > limit:
                    return True
                pos += 4
                continue
            size = _VALUE_SIZES[kind]
            if size >= 0:
                pos += size
            elif size in (-1, -4):
                pos += 4 + length_at(pos) + (12 if size == -4 else 0)
            elif size == -2:
                pos += 5 + length_at(pos)
            elif size == -3:
                pos = data.index(b"\x00", data.index(b"\x00", pos) + 1) + 1
            else:
                pos += max(4, length_at(pos))
    except (IndexError, KeyError, ValueError, struct.error):
        return False
    return False


def _bson_length(frame: bytes, pos: int, end: int) -> int:
    if pos + 5 > end:
        raise ProtocolError("truncated BSON document", INVALID_BSON)
    (size,) = _INT32.unpack_from(frame, pos)
    if size < 5 or pos + size > end:
        raise ProtocolError("BSON document length out of bounds", INVALID_BSON)
    return size


def _decode_op_msg(frame: bytes, request_id: int) -> OpMsgRequest:
    if len(frame) < HEADER.size + 5:
        raise ProtocolError("OP_MSG too short")
    (flags,) = _UINT32.unpack_from(frame, HEADER.size)
    unknown_required = flags & _REQUIRED_FLAG_MASK & ~_KNOWN_REQUIRED
    if unknown_required:
        raise ProtocolError(f"unknown required OP_MSG flag bits {unknown_required:#x}")
    end = len(frame)
    if flags & FLAG_CHECKSUM_PRESENT:
        end -= 4
        if end < HEADER.size + 5:
            raise ProtocolError("OP_MSG too short for checksum")
        (expected,) = _UINT32.unpack_from(frame, end)
        if google_crc32c.value(frame[:end]) != expected:
            raise ProtocolError("OP_MSG checksum mismatch")
    return _decode_sections(frame, HEADER.size + 4, end, request_id, flags)


SLICE_BYTES = 1 << 20   # a large body's arrays are decoded this much at a time (`decode_request_sliced`)


def decode_request_sliced(frame: bytes) -> Request | MalformedRequest:
    """`decode_request` for a large message, meant for a worker thread: an OP_MSG body's large arrays
    (an insert's `rows`, `documents`, `updates` sent in the body) are decoded `SLICE_BYTES` at a time.
    The BSON decoder holds the GIL for a whole call: one call for 27 MB of rows held it 0.7 s, which
    the event loop's thread waited out; slices hand it back every few milliseconds. The result is the
    one `decode_request` gives (it decodes the frame itself when slicing finds anything unusual)."""
    try:
        _length, request_id, _response_to, opcode = HEADER.unpack_from(frame, 0)
        (flags,) = _UINT32.unpack_from(frame, HEADER.size)
        if opcode != OP_MSG or flags & ~FLAG_EXHAUST_ALLOWED or frame[HEADER.size + 4] != 0:
            return decode_request(frame)
        body_at = HEADER.size + 5
        size = _bson_length(frame, body_at, len(frame))
        if body_at + size != len(frame):   # document sequences after the body: decoded one by one anyway
            return decode_request(frame)
        return OpMsgRequest(request_id, flags, _decode_sliced(frame[body_at : body_at + size]))
    except (ProtocolError, ValueError, KeyError, IndexError, struct.error):
        return decode_request(frame)


def _elements(data: bytes, start: int, end: int) -> list[tuple[int, int, int]]:
    """The (type, start, end) of each element of the BSON document whose elements run from `start` to
    its terminating zero before `end`. ValueError for anything it does not walk (the caller then
    decodes the usual way, which says what is wrong)."""
    out = []
    pos = start
    while pos < end - 1 and data[pos] != 0:
        kind, at = data[pos], data.index(b"\x00", pos + 1) + 1
        size = _VALUE_SIZES.get(kind)
        if kind in (0x03, 0x04, 0x0F):   # a document, an array, code with scope: their length first
            size = _INT32.unpack_from(data, at)[0]
        elif size in (-1, -2):           # a string (its length first), binary (length, then a subtype)
            size = _INT32.unpack_from(data, at)[0] + (4 if size == -1 else 5)
        elif size is None or size < 0:
            raise ValueError(f"element type {kind:#x} is not walked")
        if size < 0 or at + size >= end:
            raise ValueError("element out of bounds")
        out.append((kind, pos, at + size))
        pos = at + size
    if pos != end - 1 or data[pos] != 0:   # the terminator must be where the length said the document ends
        raise ValueError("the document does not end where its length says")
    return out


def _as_document(parts: list[bytes]) -> bytes:
    body = b"".join(parts)
    return _INT32.pack(len(body) + 5) + body + b"\x00"


def _array_slice(parts: list[bytes]) -> list[Any]:
    """Array elements decoded as an array (`{v: [...]}`): their keys are not looked at, as the plain
    decoder does not look at an array's keys (a document would keep one value of each repeated key)."""
    array = _as_document(parts)
    return list(_decode_bson(_INT32.pack(len(array) + 8) + b"\x04v\x00" + array + b"\x00")["v"])


def _decode_sliced(data: bytes) -> dict[str, Any]:
    """A document whose large arrays are decoded a slice of elements at a time (each slice an array of
    its own, so the values come back in order whatever the keys). Every length is checked against
    where its document ends; a repeated field is left to the plain decoder."""
    if _INT32.unpack_from(data, 0)[0] != len(data):
        raise ValueError("the body's length is not its size")
    top = _elements(data, 4, len(data))
    names = [data[a + 1 : data.index(b"\x00", a + 1)] for _kind, a, _b in top]
    if len(set(names)) != len(names):
        raise ValueError("a repeated field: decoded the usual way")
    small = _decode_bson(_as_document([data[a:b] for kind, a, b in top if kind != 0x04 or b - a <= SLICE_BYTES]))
    out: dict[str, Any] = {}
    for kind, a, b in top:
        name = data[a + 1 : data.index(b"\x00", a + 1)].decode()
        if kind != 0x04 or b - a <= SLICE_BYTES:
            out[name] = small[name]
            continue
        array_at = a + 1 + len(name.encode()) + 1
        values: list[Any] = []
        chunk: list[bytes] = []
        chunk_bytes = 0
        for _kind, x, y in _elements(data, array_at + 4, b):
            chunk.append(data[x:y])
            chunk_bytes += y - x
            if chunk_bytes >= SLICE_BYTES:
                values.extend(_array_slice(chunk))
                chunk, chunk_bytes = [], 0
        if chunk:
            values.extend(_array_slice(chunk))
        out[name] = values
    return out


def _decode_sections(frame: bytes, pos: int, end: int, request_id: int, flags: int) -> OpMsgRequest:
    body: dict[str, Any] | None = None
    sequences: dict[str, list[dict[str, Any]]] = {}
    view = memoryview(frame)
    while pos < end:
        kind = frame[pos]
        pos += 1
        if kind == 0:
            if body is not None:
                raise ProtocolError("OP_MSG has more than one body section")
            size = _bson_length(frame, pos, end)
            body = _decode_bson(view[pos : pos + size])
            pos += size
        elif kind == 1:
            pos = _decode_sequence(frame, pos, end, sequences)
        else:
            raise ProtocolError(f"unknown OP_MSG section kind {kind}")
    if body is None:
        raise ProtocolError("OP_MSG has no body section")
    return OpMsgRequest(request_id, flags, body, sequences)


def _decode_sequence(frame: bytes, pos: int, end: int, sequences: dict[str, list[dict[str, Any]]]) -> int:
    if pos + 4 > end:
        raise ProtocolError("truncated document sequence")
    (size,) = _INT32.unpack_from(frame, pos)
    seq_end = pos + size
    if size < 5 or seq_end > end:
        raise ProtocolError("document sequence length out of bounds")
    name_end = frame.find(b"\x00", pos + 4, seq_end)
    if name_end < 0:
        raise ProtocolError("document sequence identifier is not terminated")
    try:
        ident = frame[pos + 4 : name_end].decode()
    except UnicodeDecodeError:
        raise ProtocolError("document sequence identifier is not UTF-8") from None
    if ident in sequences:
        raise ProtocolError(f"duplicate document sequence {ident!r}")
    docs: list[dict[str, Any]] = []
    cur = name_end + 1
    view = memoryview(frame)
    while cur < seq_end:
        doc_size = _bson_length(frame, cur, seq_end)
        docs.append(_decode_bson(view[cur : cur + doc_size]))
        cur += doc_size
    sequences[ident] = docs
    return seq_end


def _decode_op_query(frame: bytes, request_id: int) -> OpQueryRequest:
    pos = HEADER.size
    if len(frame) < pos + 4:
        raise ProtocolError("OP_QUERY too short")
    (flags,) = _INT32.unpack_from(frame, pos)
    pos += 4
    name_end = frame.find(b"\x00", pos)
    if name_end < 0:
        raise ProtocolError("OP_QUERY collection name is not terminated")
    try:
        collection = frame[pos:name_end].decode()
    except UnicodeDecodeError:
        raise ProtocolError("OP_QUERY collection name is not UTF-8") from None
    pos = name_end + 1
    if len(frame) < pos + 8:
        raise ProtocolError("OP_QUERY too short")
    skip, limit = struct.unpack_from("<ii", frame, pos)
    pos += 8
    size = _bson_length(frame, pos, len(frame))
    query = _decode_bson(memoryview(frame)[pos : pos + size])
    return OpQueryRequest(request_id, flags, collection, skip, limit, query)


def sequence_field(command_name: str) -> str | None:
    return _SEQUENCE_FIELDS.get(command_name)


def encode_op_msg(reply: Mapping[str, Any] | bytes, request_id: int, response_to: int, flags: int = 0) -> bytes:
    """One OP_MSG with exactly one kind-0 section and no checksum."""
    body = reply if isinstance(reply, bytes) else bson.encode(reply)
    length = HEADER.size + 4 + 1 + len(body)
    return b"".join(
        (HEADER.pack(length, request_id, response_to, OP_MSG), _UINT32.pack(flags), b"\x00", body)
    )


def encode_op_reply(reply: Mapping[str, Any], request_id: int, response_to: int) -> bytes:
    """An OP_REPLY carrying one document (answers a legacy OP_QUERY handshake)."""
    body = bson.encode(reply)
    length = HEADER.size + _REPLY_PREFIX.size + len(body)
    header = HEADER.pack(length, request_id, response_to, OP_REPLY)
    return header + _REPLY_PREFIX.pack(8, 0, 0, 1) + body


def encode_op_msg_request(
    body: Mapping[str, Any],
    request_id: int,
    *,
    sequences: Mapping[str, list[Mapping[str, Any]]] | None = None,
    flags: int = 0,
) -> bytes:
    """An OP_MSG request (used by members talking to each other and by tests)."""
    parts = [b"\x00", bson.encode(body)]
    for ident, docs in (sequences or {}).items():
        payload = ident.encode() + b"\x00" + b"".join(bson.encode(d) for d in docs)
        parts += [b"\x01", _INT32.pack(len(payload) + 4), payload]
    sections = b"".join(parts)
    checksum = bool(flags & FLAG_CHECKSUM_PRESENT)
    length = HEADER.size + 4 + len(sections) + (4 if checksum else 0)
    msg = HEADER.pack(length, request_id, 0, OP_MSG) + _UINT32.pack(flags) + sections
    if checksum:
        msg += _UINT32.pack(google_crc32c.value(msg))
    return msg


def decode_raw_reply(frame: bytes) -> tuple[int, Mapping[str, Any]]:
    """Like `decode_reply`, but an OP_MSG reply's body stays a `RawBSONDocument`: its fields decode
    when read, and its sub-documents keep their bytes (an oplog fetcher stores them as they came)."""
    _length, _rid, response_to, opcode = HEADER.unpack_from(frame, 0)
    pos = HEADER.size + 4
    if opcode != OP_MSG or len(frame) < pos + 5 or frame[pos] != 0:
        return decode_reply(frame)
    size = _bson_length(frame, pos + 1, len(frame))
    try:
        return response_to, RawBSONDocument(frame[pos + 1:pos + 1 + size], RAW_OPTIONS)
    except Exception as exc:  # bson raises several types for corrupt input
        raise ProtocolError(f"invalid BSON: {exc}") from None


def decode_reply(frame: bytes) -> tuple[int, dict[str, Any]]:
    """Decode a reply frame (OP_MSG or OP_REPLY) into (response_to, document)."""
    _length, _rid, response_to, opcode = HEADER.unpack_from(frame, 0)
    if opcode == OP_MSG:
        msg = _decode_sections(frame, HEADER.size + 4, len(frame), 0, 0)
        return response_to, msg.body
    if opcode == OP_REPLY:
        pos = HEADER.size + _REPLY_PREFIX.size
        return response_to, _decode_bson(memoryview(frame)[pos:])
    raise ProtocolError(f"unexpected reply opcode {opcode}")
