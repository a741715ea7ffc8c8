"""What an Arrow IPC message says about its body, read from its metadata before the body is decoded.

Theory of operation
-------------------
An Arrow IPC stream is a sequence of messages, each a flatbuffer `Message`
(Arrow's `format/Message.fbs`) followed by a body. A record batch's (or a
dictionary batch's) metadata gives its number of rows and lists the buffers of
its body, each as an offset and a length in the body. When the body is
compressed (`BodyCompression`: LZ4 frame or zstd, buffer by buffer), every
non-empty buffer begins with its uncompressed length as a little-endian int64
(-1: this one is stored as it is). So what a batch takes once decoded is known
from its metadata and 8 bytes per buffer, before anything is decompressed.

This reads only those fields of the flatbuffer. A flatbuffer is one byte string
of offsets: the root offset leads to a table, a table's vtable says where each
of its fields lies (0: absent, the default), a field that is a table or a
vector holds an offset to it. Every offset is checked against the bytes there
are; metadata that does not fit them is BadValue (2), never an IndexError.

Pure: bytes in, numbers out.
"""

from __future__ import annotations

__layer__ = "core"  # pure: no I/O, clock or randomness (tests/unit/test_layering.py)

import struct
from dataclasses import dataclass

from base.errors import MongoError

BAD_VALUE = 2
# The MessageHeader union's types (Message.fbs).
SCHEMA, DICTIONARY_BATCH, RECORD_BATCH = 1, 2, 3
STORED_AS_IS = -1   # a compressed body's buffer prefix: this buffer is not compressed
PREFIX_BYTES = 8
_BUFFER = struct.Struct("<qq")   # struct Buffer {offset: long; length: long}


@dataclass(frozen=True, slots=True)
class BatchLayout:
    """One message as its metadata describes it."""

    kind: int                                # SCHEMA, DICTIONARY_BATCH, RECORD_BATCH (or another header)
    rows: int = 0                            # a batch's length; 0 for other messages
    buffers: tuple[tuple[int, int], ...] = ()  # (offset, length) of each buffer in the body
    compressed: bool = False


def malformed(why: str) -> MongoError:
    return MongoError(BAD_VALUE, f"the Arrow IPC stream is malformed: {why}")


def _read(buf: memoryview, fmt: str, pos: int) -> int:
    size = struct.calcsize(fmt)
    if pos < 0 or pos + size > len(buf):
        raise malformed(f"an offset ({pos}) lies outside the {len(buf)} bytes it points into")
    value: int = struct.unpack_from(fmt, buf, pos)[0]
    return value


class _Table:
    """A flatbuffer table at `pos` of `buf`."""

    __slots__ = ("buf", "pos", "vtable", "vtable_size")

    def __init__(self, buf: memoryview, pos: int) -> None:
        self.buf, self.pos = buf, pos
        self.vtable = pos - _read(buf, "<i", pos)
        self.vtable_size = _read(buf, "<H", self.vtable)

    def _field(self, index: int) -> int | None:
        slot = 4 + 2 * index
        if slot + 2 > self.vtable_size:
            return None
        offset = _read(self.buf, "<H", self.vtable + slot)
        return self.pos + offset if offset else None

    def scalar(self, index: int, fmt: str, default: int = 0) -> int:
        at = self._field(index)
        return default if at is None else _read(self.buf, fmt, at)

    def table(self, index: int) -> _Table | None:
        at = self._field(index)
        return None if at is None else _Table(self.buf, at + _read(self.buf, "<I", at))

    def buffers(self, index: int) -> tuple[tuple[int, int], ...]:
        """A vector of `Buffer` structs."""
        at = self._field(index)
        if at is None:
            return ()
        vector = at + _read(self.buf, "<I", at)
        count = _read(self.buf, "<I", vector)
        start, end = vector + 4, vector + 4 + count * _BUFFER.size
        if end > len(self.buf):
            raise malformed(f"{count} buffers do not fit in the message metadata")
        return tuple((int(o), int(n)) for o, n in _BUFFER.iter_unpack(self.buf[start:end]))


def _record_batch(kind: int, batch: _Table) -> BatchLayout:
    # RecordBatch {length: long; nodes: [FieldNode]; buffers: [Buffer]; compression: BodyCompression}
    rows = batch.scalar(0, "<q")
    if rows < 0:
        raise malformed(f"a batch of {rows} rows")
    return BatchLayout(kind, rows, batch.buffers(2), compressed=batch.table(3) is not None)


def batch_layout(metadata: bytes | memoryview) -> BatchLayout:
    """The layout of one message, from its flatbuffer metadata."""
    buf = memoryview(metadata).cast("B")
    # Message {version: short; header_type: ubyte; header: MessageHeader; bodyLength: long; ...}
    message = _Table(buf, _read(buf, "<I", 0))
    kind = message.scalar(1, "<B")
    header = message.table(2)
    if kind == RECORD_BATCH and header is not None:
        return _record_batch(kind, header)
    if kind == DICTIONARY_BATCH and header is not None:
        data = header.table(1)   # DictionaryBatch {id: long; data: RecordBatch; isDelta: bool}
        return _record_batch(kind, data) if data is not None else BatchLayout(kind)
    return BatchLayout(kind)


def decoded_bytes(layout: BatchLayout, body: bytes | memoryview) -> int:
    """The bytes the batch's buffers take once decoded: their lengths, or for a compressed body each
    buffer's uncompressed length (its first 8 bytes). BadValue if a buffer lies outside the body."""
    view = memoryview(body).cast("B")
    total = 0
    for offset, length in layout.buffers:
        if offset < 0 or length < 0 or offset + length > len(view):
            raise malformed(f"a buffer ({offset}, {length}) lies outside the batch's body ({len(view)} bytes)")
        if not layout.compressed or length == 0:
            total += length
            continue
        if length < PREFIX_BYTES:
            raise malformed(f"a compressed buffer of {length} bytes has no length prefix")
        uncompressed = _read(view, "<q", offset)
        if uncompressed < STORED_AS_IS:
            raise malformed(f"a compressed buffer says it decodes to {uncompressed} bytes")
        total += length - PREFIX_BYTES if uncompressed == STORED_AS_IS else uncompressed
    return total
