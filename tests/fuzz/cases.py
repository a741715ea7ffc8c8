"""Fuzz cases: the bytes to send and what a correct member must do with them.

A case's expectation is worked out here from what the generator built, by a rule
independent of the server's codec (a naive twin of its framing contract):
- the length prefix is outside [16, 48,000,000]: the stream cannot be framed, the
  member must close the connection (CLOSE);
- fewer bytes are sent than the prefix announces, then the sender half-closes:
  the member must close (CLOSE);
- otherwise the message is framed and the member must answer it (REPLY), an
  error reply included, unless it is an OP_MSG whose flag bits set moreToCome
  (SILENT). The connection must stay usable after a REPLY or SILENT case.
"""

from __future__ import annotations

import enum
import random
import struct
from dataclasses import dataclass
from typing import Any

import bson
import google_crc32c
from bson import SON

from base.codec import MAX_MESSAGE_SIZE, OP_COMPRESSED, OP_MSG, OP_QUERY, encode_op_msg_request
from tests.fuzz import values

HEADER = struct.Struct("<iiii")
_I32 = struct.Struct("<i")
_U32 = struct.Struct("<I")
LEGACY_OPCODES = (1, 2001, 2002, 2003, 2005, 2006, 2007, 2010, 2011, OP_COMPRESSED, 0, -1, 9999, 2**31 - 1)


class Expect(enum.Enum):
    REPLY = "reply"
    SILENT = "silent"
    CLOSE = "close"


@dataclass(frozen=True, slots=True)
class Case:
    kind: str  # the generator, for the report
    data: bytes
    expect: Expect
    request_id: int
    command: Any = None  # the command document, when there is one (for reproducers)


def frame(opcode: int, request_id: int, payload: bytes, response_to: int = 0) -> bytes:
    return HEADER.pack(HEADER.size + len(payload), request_id, response_to, opcode) + payload


def classify(data: bytes, truncated: bool) -> Expect:
    """The naive twin of the member's framing contract (see the module docstring)."""
    if len(data) < 4:
        return Expect.CLOSE
    (length,) = _I32.unpack_from(data, 0)
    if truncated or not HEADER.size <= length <= MAX_MESSAGE_SIZE or len(data) < length:
        return Expect.CLOSE
    (opcode,) = _I32.unpack_from(data, 12)
    if opcode == OP_MSG and length >= HEADER.size + 4 and _U32.unpack_from(data, 16)[0] & 2:
        return Expect.SILENT
    return Expect.REPLY


def _case(kind: str, data: bytes, command: Any = None, truncated: bool = False) -> Case:
    request_id = _I32.unpack_from(data, 4)[0] if len(data) >= 8 else 0
    return Case(kind, data, classify(data, truncated), request_id, command)


def _encode(rng: random.Random, body: Any) -> bytes:
    try:
        return bson.encode(body)
    except Exception:  # a key the encoder refuses (NUL, non-str): fall back to a plain command
        return bson.encode({"ping": 1, "$db": "admin", "comment": repr(body)[:100]})


def _request_id(rng: random.Random) -> int:
    return rng.choice((rng.randint(1, 2**31 - 1), 0, -1, -(2**31)))


class CaseFactory:
    """Draws cases from the seeded generator. `commands` are the names registered in COMMANDS."""

    def __init__(self, rng: random.Random, commands: list[str]) -> None:
        self.rng = rng
        self.commands = commands
        self._generators = (
            (self.command, 45), (self.bson_mutation, 20), (self.op_msg_structure, 12),
            (self.op_query, 6), (self.opcode, 5), (self.bad_length, 4), (self.truncated, 3),
            (self.valid_with_checksum, 3), (self.deep_nesting, 2),
        )
        self._weights = [w for _g, w in self._generators]

    def next_case(self) -> Case:
        (generator, _w), = self.rng.choices(self._generators, self._weights)
        return generator()

    # -- command grammar: well-framed OP_MSG, random command documents -------------------
    def command(self) -> Case:
        rng = self.rng
        body = values.command_body(rng, self.commands)
        flags = rng.choice((0, 0, 0, 0, 0, 0, 2, 1 << 16))
        seqs = None
        if rng.random() < 0.15:
            seqs = {rng.choice(("documents", "updates", "deletes", "ops", "x", "")): [
                values.document(rng) for _ in range(rng.randint(0, 3))]}
        try:
            data = encode_op_msg_request(body, _request_id(rng), sequences=seqs, flags=flags)
        except Exception:
            data = encode_op_msg_request({"ping": 1, "$db": "admin"}, _request_id(rng), flags=flags)
        return _case("command", data, body)

    # -- BSON mutations inside a correctly framed OP_MSG -----------------------------------
    def bson_mutation(self) -> Case:
        rng = self.rng
        doc = _encode(rng, values.command_body(rng, self.commands))
        mutated = bytearray(doc)
        how = rng.randrange(7)
        if how == 0:  # bit flips
            for _ in range(rng.randint(1, 4)):
                i = rng.randrange(len(mutated))
                mutated[i] ^= 1 << rng.randrange(8)
        elif how == 1:  # truncation (document length left as it was, or fixed up)
            mutated = mutated[: rng.randrange(len(mutated))]
            if rng.random() < 0.5 and len(mutated) >= 4:
                mutated[0:4] = _I32.pack(len(mutated))
        elif how == 2:  # a bad element type byte
            mutated[4] = rng.choice((0x00, 0x06, 0x0C, 0x0E, 0x14, 0x20, 0x7E, 0x80, 0xFE, 0xFF))
        elif how == 3:  # a wrong string length: an int32 after the first string type byte
            i = bytes(mutated).find(b"\x02", 4)
            if i > 0:
                end = bytes(mutated).find(b"\x00", i + 1) + 1
                if 0 < end <= len(mutated) - 4:
                    mutated[end:end + 4] = _I32.pack(rng.choice((0, -1, 1, 2**31 - 1, len(mutated))))
        elif how == 4:  # an unterminated cstring: every NUL after the type byte replaced
            tail = bytes(mutated[5:]).replace(b"\x00", b"A")
            mutated = mutated[:5] + bytearray(tail)
        elif how == 5:  # a document length that disagrees with the bytes
            mutated[0:4] = _I32.pack(rng.choice((0, 4, 5, len(mutated) + 1, len(mutated) - 1, -1, 2**31 - 1)))
        else:  # random garbage where the body goes
            mutated = bytearray(rng.randbytes(rng.randint(0, 64)))
        payload = _U32.pack(rng.choice((0, 0, 0, 2))) + b"\x00" + bytes(mutated)
        return _case("bson", frame(OP_MSG, _request_id(rng), payload))

    def deep_nesting(self) -> Case:
        rng = self.rng
        depth = rng.choice((100, 101, 150, 200, 1000, 5000))
        inner = b"\x05\x00\x00\x00\x00"
        for _ in range(depth):
            body = b"\x03a\x00" + inner + b"\x00"
            inner = _I32.pack(len(body) + 4) + body
        head = rng.choice(("find", "insert", "ping", "aggregate", "update"))
        prefix = bson.encode(SON([(head, "c"), ("$db", "test")]))[4:-1]
        elements = prefix + b"\x03" + rng.choice((b"filter", b"documents", b"x", b"pipeline")) + b"\x00" + inner
        doc = _I32.pack(len(elements) + 5) + elements + b"\x00"
        return _case("nesting", frame(OP_MSG, _request_id(rng), b"\x00\x00\x00\x00\x00" + doc))

    # -- OP_MSG framing: flags, sections, checksums ----------------------------------------
    def op_msg_structure(self) -> Case:
        rng = self.rng
        body = b"\x00" + _encode(rng, values.command_body(rng, self.commands))
        good_seq = b"documents\x00" + bson.encode({"_id": 1})
        sections = rng.choice((
            b"", body + body, b"\x01" + _I32.pack(len(good_seq) + 4) + good_seq + body,
            body + b"\x01" + _I32.pack(rng.choice((0, 3, 4, 5, 2**31 - 1, -1))) + good_seq,
            body + b"\x01" + _I32.pack(len(good_seq) + 4) + good_seq + b"\x01" + _I32.pack(len(good_seq) + 4)
            + good_seq,
            body + b"\x01" + _I32.pack(9) + b"abcde",
            body + bytes([rng.choice((2, 3, 0x80, 0xFF))]) + bson.encode({"a": 1}),
            body + b"\x00", body + b"\x01", body[:-1],
        ))
        flags = rng.choice((0, 1, 2, 3, 1 << 5, 1 << 15, 1 << 16, 1 << 17, 1 << 31, 0xFFFFFFFF,
                            rng.getrandbits(32)))
        payload = _U32.pack(flags) + sections
        if flags & 1 and rng.random() < 0.7:
            partial = frame(OP_MSG, 0, payload + b"\x00" * 4)
            crc = google_crc32c.value(partial[:-4])
            payload += _U32.pack(crc ^ rng.choice((0, 1, 0xFFFFFFFF)))
        return _case("op_msg", frame(OP_MSG, _request_id(rng), payload))

    def valid_with_checksum(self) -> Case:
        rng = self.rng
        body = values.command_body(rng, ["ping", "hello", "find", "insert", "buildInfo"])
        try:
            data = encode_op_msg_request(body, _request_id(rng), flags=1)
        except Exception:
            data = encode_op_msg_request({"ping": 1, "$db": "admin"}, _request_id(rng), flags=1)
        if rng.random() < 0.5:
            data = data[:-1] + bytes([data[-1] ^ 0x01])
        return _case("checksum", data, body)

    # -- legacy opcodes ------------------------------------------------------------------
    def op_query(self) -> Case:
        rng = self.rng
        name = rng.choice(("hello", "isMaster", "ismaster", "ping", "find", "bogus", "insert"))
        query: dict[str, Any] = SON([(name, 1)])
        if rng.random() < 0.3:
            query = SON([("$query", query), ("$readPreference", {"mode": "secondaryPreferred"})])
        if rng.random() < 0.3:
            query["helloOk"] = values.value(rng)
        collection = rng.choice((b"admin.$cmd", b"test.$cmd", b"test.c", b"", b"$cmd", b"\xff\xfe.$cmd"))
        terminator = b"" if rng.random() < 0.1 else b"\x00"
        doc = _encode(rng, query) if rng.random() < 0.85 else rng.randbytes(8)
        payload = (_I32.pack(rng.choice((0, 4, -1))) + collection + terminator
                   + struct.pack("<ii", rng.choice((0, 5)), rng.choice((-1, 0, 1, 2**31 - 1))) + doc)
        if rng.random() < 0.1:
            payload = payload[: rng.randrange(len(payload) + 1)]
        return _case("op_query", frame(OP_QUERY, _request_id(rng), payload), query)

    def opcode(self) -> Case:
        rng = self.rng
        opcode = rng.choice(LEGACY_OPCODES)
        if opcode == OP_COMPRESSED and rng.random() < 0.7:
            inner = encode_op_msg_request({"ping": 1, "$db": "admin"}, 1)[16:]
            payload = struct.pack("<iiB", OP_MSG, len(inner), rng.choice((0, 1, 2, 3, 99))) + inner
        else:
            payload = rng.randbytes(rng.randint(0, 40))
        return _case("opcode", frame(opcode, _request_id(rng), payload))

    # -- framing errors: the member must close ------------------------------------------
    def bad_length(self) -> Case:
        rng = self.rng
        length = rng.choice((0, 1, 4, 15, -1, -16, -(2**31), MAX_MESSAGE_SIZE + 1, 2**31 - 1, 10**9))
        return _case("bad_length", HEADER.pack(length, _request_id(rng), 0, OP_MSG) + b"\x00" * rng.randint(0, 8))

    def truncated(self) -> Case:
        """Fewer bytes than announced, then end of stream (the runner half-closes after these)."""
        rng = self.rng
        full = encode_op_msg_request({"ping": 1, "$db": "admin"}, _request_id(rng))
        cut = rng.choice((1, 2, 3, 4, 8, 15, 16, 20, len(full) - 1))
        return _case("truncated", full[:cut], truncated=True)

    # -- size edges (rare: a few per run) ------------------------------------------------
    def big(self, which: int) -> Case:
        """An 8 MB insert (must succeed or fail with a reply), or a message of exactly the largest legal
        size whose body is garbage (framed: must get an error reply)."""
        rng = self.rng
        if which % 2 == 0:
            body = {"insert": "big", "documents": [{"blob": "x" * 8_000_000}], "$db": "fuzz"}
            return _case("big", encode_op_msg_request(body, _request_id(rng)), {"insert": "big"})
        payload = b"\x00\x00\x00\x00\x00" + _I32.pack(MAX_MESSAGE_SIZE) + b"\x01" * (MAX_MESSAGE_SIZE - 25)
        return _case("max_size", frame(OP_MSG, _request_id(rng), payload))
