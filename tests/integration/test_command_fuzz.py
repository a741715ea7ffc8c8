"""Every registered command, malformed on purpose, gets a MongoDB-shaped error reply.

For each command in `COMMANDS`, hypothesis builds documents from the command's argument table
(`replset.wire.command_args`): fields of the right type, of a random wrong type, missing
required fields, unknown extra fields and query/update/pipeline operators with random
arguments. Each goes to a real one-member set as a raw OP_MSG (pymongo would refuse to send
many of them, e.g. a `documents` field that is not a list). The test fails on a reply with
InternalError (1), a dropped connection, or a "Traceback" in the member's log; at the end the
member must still be a healthy primary.

Commands that act on the member itself (step down, reconfig, vote, heartbeat...) always carry
a poisoned field that makes them fail before they act, so the member stays primary.

`KNOWN_INTERNAL_ERRORS` lists handler bugs the argument layer cannot prevent (in modules owned
elsewhere). Each entry is matched against the InternalError's message; the list should shrink
to nothing.
"""

from __future__ import annotations

import datetime
import os
import re
import socket
import struct
from collections.abc import Iterator
from typing import Any

import bson
import pytest
from bson.decimal128 import Decimal128
from bson.errors import InvalidDocument
from bson.int64 import Int64
from bson.max_key import MaxKey
from bson.min_key import MinKey
from bson.objectid import ObjectId
from bson.regex import Regex
from bson.timestamp import Timestamp
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pymongo import MongoClient
from pymongo.write_concern import WriteConcern

from base.numbers import MAX_TERM
from replset.wire.command_args import Arg, args_for
from replset.wire.commands import load_commands
from tests.fuzz import wrong_types
from tests.support.members import Member

MAX_EXAMPLES = int(os.environ.get("COMMAND_FUZZ_EXAMPLES", "60"))
FUZZ_DB = "fuzz"
ADMIN_COMMANDS = frozenset({
    "replSetInitiate", "replSetGetConfig", "replSetGetStatus", "replSetStepDown", "replSetFreeze",
    "replSetStepUp", "replSetSyncFrom", "replSetReconfig", "replSetHeartbeat", "replSetRequestVotes",
    "replSetUpdatePosition", "replSetGetRBID", "configureFailPoint", "resync", "listDatabases",
    "getCmdLineOpts", "getLog", "getParameter", "hostInfo", "killAllSessions",
})

# Fields forced into every case of a command that would otherwise act on the member (step it
# down, change its config or term): each makes the command fail before it does anything.
POISON: dict[str, dict[str, Any]] = {
    "replSetStepDown": {"replSetStepDown": "poison"},
    "replSetFreeze": {"replSetFreeze": "poison"},
    "replSetReconfig": {"replSetReconfig": "poison"},
    "replSetSyncFrom": {"replSetSyncFrom": 0},
    "replSetHeartbeat": {"replSetHeartbeat": 0},
    "replSetRequestVotes": {"setName": 0},
    "replSetUpdatePosition": {"optimes": "poison"},
    "replSetInitiate": {},  # already initiated: AlreadyInitialized before anything else
    "replSetStepUp": {},  # already primary: a no-op
    "resync": {},  # refused on a primary
}

# InternalError replies the argument layer cannot prevent: (command, pattern of the errmsg,
# where the bug is). Each one is a handler bug in a module owned elsewhere.
KNOWN_INTERNAL_ERRORS: list[tuple[str, str, str]] = [
]

OPERATORS = (
    "$eq", "$ne", "$gt", "$gte", "$lt", "$lte", "$in", "$nin", "$and", "$or", "$nor", "$not", "$exists",
    "$type", "$regex", "$options", "$elemMatch", "$size", "$all", "$mod", "$expr", "$where", "$text",
    "$comment", "$set", "$unset", "$inc", "$mul", "$min", "$max", "$rename", "$push", "$pull", "$addToSet",
    "$pop", "$each", "$slice", "$sort", "$position", "$currentDate", "$setOnInsert", "$bit",
    "$match", "$group", "$project", "$limit", "$skip", "$unwind", "$count", "$addFields", "$lookup",
    "$replaceRoot", "$sortByCount", "$facet", "$collStats", "$sum", "$avg", "$first", "$cond", "$concat",
    "$meta", "$literal", "$toUpper", "$arrayElemAt", "$add", "$divide", "$$ROOT", "$natural",
)
FIELD_NAMES = st.sampled_from(["a", "b", "a.b", "_id", "x.0", "", "$", "$a", "a.$", "a.$[]", "ts", "."])

scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**31), 2**31 - 1), st.integers(-(2**63), 2**63 - 1).map(Int64),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=8), st.binary(max_size=8),
    st.sampled_from([Decimal128("1.5"), Decimal128("NaN"), Decimal128("-Infinity"), ObjectId("0" * 24),
                     datetime.datetime(2020, 1, 1, tzinfo=datetime.UTC), Regex("a.*", "i"), Timestamp(1, 1),
                     MinKey(), MaxKey(), "$a", "$$ROOT", "_id_", "*", -1, 0, 1, 2**31, -(2**63)]),
)


def _documents(children: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    keys = st.one_of(FIELD_NAMES, st.sampled_from(OPERATORS))
    return st.one_of(st.lists(children, max_size=3), st.dictionaries(keys, children, max_size=3))


values = st.recursive(scalars, _documents, max_leaves=8)


def _value_of_type(type_name: str) -> st.SearchStrategy[Any]:
    match type_name:
        case "object":
            return st.dictionaries(st.one_of(FIELD_NAMES, st.sampled_from(OPERATORS)), values, max_size=3)
        case "array":
            return st.lists(values, max_size=3)
        case "string":
            return st.one_of(st.text(max_size=6), st.sampled_from(["c", "a", "_id_", "*", "$a"]))
        case "bool":
            return st.booleans()
        case "int":
            return st.integers(-3, 10)
        case "long":
            return st.one_of(st.integers(-3, 10).map(Int64), st.just(Int64(2**40)))
        case "double":
            return st.one_of(st.floats(-3, 10), st.sampled_from([2.5, float("nan"), float("inf")]))
        case "decimal":
            return st.sampled_from([Decimal128("2"), Decimal128("-1"), Decimal128("0.5")])
        case "binData":
            return st.binary(min_size=16, max_size=16)
    return values


def valid_looking(arg: Arg) -> st.SearchStrategy[Any]:
    """A value of one of the types the argument accepts (its content may still be wrong)."""
    if arg.struct is not None:
        entry = fields_of(arg.struct.fields)
        return st.lists(entry, min_size=1, max_size=3) if "array" in arg.types else entry
    if arg.items:
        return st.lists(st.one_of(*[_value_of_type(t) for t in arg.items]), min_size=1, max_size=3)
    if not arg.types:
        return values
    return st.one_of(*[_value_of_type(t) for t in arg.types])


@st.composite
def fields_of(draw: st.DrawFn, fields: dict[str, Arg]) -> dict[str, Any]:
    """Required fields and some optional ones, each of a type the field accepts."""
    doc: dict[str, Any] = {}
    for key, arg in fields.items():
        if arg.required or draw(st.integers(0, 3)) == 0:
            doc[key] = draw(valid_looking(arg))
    return doc


MUTATIONS = ("none", "wrong type", "wrong type", "missing", "unknown field", "command value")
EXTRA_FIELDS = st.one_of(FIELD_NAMES, st.sampled_from(["comment", "maxTimeMS", "writeConcern", "readConcern",
                                                       "cursor", "filter", "documents", "let"]))


@st.composite
def command_documents(draw: st.DrawFn, name: str) -> dict[str, Any]:
    """A well-typed command with at most one mutation: a wrong type, a missing required field,
    an unknown field or a random command value (contents of well-typed fields are random too)."""
    spec = args_for(name)
    if spec.collection:
        value = draw(st.sampled_from(["c", "c", "c", "d", "system.views", "a.b", "$x"]))
    else:
        value = draw(valid_looking(spec.value))
    doc: dict[str, Any] = {name: value}
    doc.update(draw(fields_of(dict(spec.fields))))
    mutation = draw(st.sampled_from(MUTATIONS))
    required = [k for k, a in spec.fields.items() if a.required]
    if mutation == "wrong type" and spec.fields:
        doc[draw(st.sampled_from(sorted(spec.fields)))] = draw(values)
    elif mutation == "missing" and required:
        del doc[draw(st.sampled_from(required))]
    elif mutation == "unknown field":
        doc[draw(EXTRA_FIELDS)] = draw(values)
    elif mutation == "command value":
        doc[name] = draw(values)
    doc.update(POISON.get(name, {}))
    return doc


@pytest.fixture(scope="module")
def client(member: Member) -> Iterator[MongoClient[dict[str, Any]]]:
    with member.direct_client(serverSelectionTimeoutMS=10000, socketTimeoutMS=20000) as c:
        yield c


class RawConnection:
    """One OP_MSG socket: the command goes out exactly as built, the reply comes back decoded."""

    def __init__(self, member: Member) -> None:
        self._sock = socket.create_connection(("127.0.0.1", member.port), timeout=30)
        self._request_id = 0

    def command(self, doc: dict[str, Any]) -> dict[str, Any]:
        return self.command_bytes(bson.encode(doc))

    def command_bytes(self, body: bytes) -> dict[str, Any]:
        self._request_id += 1
        payload = struct.pack("<I", 0) + b"\0" + body
        self._sock.sendall(struct.pack("<iiii", 16 + len(payload), self._request_id, 0, 2013) + payload)
        header = self._read(16)
        length = struct.unpack_from("<i", header)[0]
        reply = self._read(length - 16)
        return bson.decode(reply[5:])

    def _read(self, n: int) -> bytes:
        data = b""
        while len(data) < n:
            chunk = self._sock.recv(n - len(data))
            if not chunk:
                raise ConnectionError("the member closed the connection")
            data += chunk
        return data

    def close(self) -> None:
        self._sock.close()


@pytest.fixture(scope="module")
def raw(member: Member) -> Iterator[RawConnection]:
    conn = RawConnection(member)
    try:
        yield conn
    finally:
        conn.close()


def _known(name: str, errmsg: str) -> bool:
    return any(cmd == name and re.search(pattern, errmsg) for cmd, pattern, _ in KNOWN_INTERNAL_ERRORS)


def _db(name: str) -> str:
    return "admin" if name in ADMIN_COMMANDS else FUZZ_DB


def _send(raw: RawConnection, member: Member, name: str, doc: dict[str, Any]) -> dict[str, Any] | None:
    doc = {**doc, "$db": doc.get("$db", _db(name))}
    try:
        body = bson.encode(doc)
    except InvalidDocument:
        return None  # not encodable as BSON: nothing reached the member
    return _send_bytes(raw, member, name, body, doc)


def _send_bytes(raw: RawConnection, member: Member, name: str, body: bytes, doc: Any) -> dict[str, Any]:
    """Sends one command; fails on an internal error (not known) or a traceback in the member's log."""
    log_size = os.path.getsize(member.log_path)
    reply = raw.command_bytes(body)
    with open(member.log_path, encoding="utf-8", errors="replace") as f:
        f.seek(log_size)
        new_log = f.read()
    internal = reply.get("code") == 1
    if internal and not _known(name, str(reply.get("errmsg", ""))):
        pytest.fail(f"InternalError for {doc!r}: {reply!r}\n{new_log[-3000:]}")
    if "Traceback" in new_log and not internal:
        pytest.fail(f"traceback in the member's log after {doc!r} (reply {reply!r}):\n{new_log[-3000:]}")
    return reply


def _assert_healthy_primary(client: MongoClient[dict[str, Any]]) -> None:
    assert client.admin.command("ping")["ok"] == 1.0
    assert client.admin.command("hello")["isWritablePrimary"] is True


@pytest.mark.parametrize("name", sorted(load_commands()))
def test_malformed_command_gets_an_error_reply(client: MongoClient[dict[str, Any]], raw: RawConnection,
                                               member: Member, name: str) -> None:
    @settings(max_examples=MAX_EXAMPLES, derandomize=True, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    @given(doc=command_documents(name))
    def run(doc: dict[str, Any]) -> None:
        _send(raw, member, name, doc)

    run()
    _assert_healthy_primary(client)


@pytest.mark.parametrize("name", sorted(load_commands()))
def test_every_field_given_every_bson_type_gets_mongods_answer(client: MongoClient[dict[str, Any]],
                                                               raw: RawConnection, member: Member,
                                                               name: str) -> None:
    """Each field the command's table knows (its value, its fields, one level into sub-documents, the
    generic arguments) with a value of each BSON type (tests/fuzz/wrong_types.py): never an internal
    error; a type the field refuses gets the IDL parser's error (TypeMismatch 14, "BSON field
    'listCollections.cursor' is the wrong type 'dbPointer', expected type 'object'")."""
    wrong: list[str] = []
    for case in wrong_types.cases(name, POISON.get(name, {})):
        body = wrong_types.encode({**case.document, "$db": _db(name)})
        reply = _send_bytes(raw, member, name, body, case.document)
        if case.expected is None:
            continue
        code, message = case.expected
        if reply.get("code") != code or not str(reply.get("errmsg", "")).startswith(message):
            wrong.append(f"{case.path} = {case.type_name}: {reply.get('code')} {reply.get('errmsg')!r}, "
                         f"expected {code} {message!r}")
    assert not wrong, "\n".join(wrong[:40])
    _assert_healthy_primary(client)


# Codes accepted besides Overflow (15) for a command nested deeper than the BSON decoder can go
# (about 1,000 levels): none, the wire codec measures the depth when decoding fails.
KNOWN_DEEP_DECODE_CODES: frozenset[int] = frozenset()


def _element(type_byte: int, key: str, value: bytes) -> bytes:
    return bytes([type_byte]) + key.encode() + b"\0" + value


def _document(*elements: bytes) -> bytes:
    body = b"".join(elements)
    return struct.pack("<i", len(body) + 5) + body + b"\0"


def _deep_and_filter(depth: int) -> bytes:
    """`{$and: [{$and: [... {a: 1}]}]}`, built bottom-up (no recursion): two levels a step."""
    inner = _document(_element(0x10, "a", struct.pack("<i", 1)))
    for _ in range(depth):
        inner = _document(_element(0x04, "$and", _document(_element(0x03, "0", inner))))
    return inner


def _string(value: str) -> bytes:
    data = value.encode() + b"\0"
    return struct.pack("<i", len(data)) + data


@pytest.mark.parametrize("steps", [99, 100, 300, 5000])
def test_deep_filter_gets_overflow_not_a_closed_connection(raw: RawConnection, member: Member,
                                                          steps: int) -> None:
    """mongod refuses a command nested more than 200 levels with Overflow (15) and keeps the
    connection; 99 `$and` steps (198 levels under the command) are still fine."""
    body = _document(_element(0x02, "find", _string("deep")), _element(0x03, "filter", _deep_and_filter(steps)),
                     _element(0x02, "$db", _string(FUZZ_DB)))
    reply = raw.command_bytes(body)
    if steps < 100:
        assert reply["ok"] == 1.0
        return
    assert reply["ok"] == 0.0
    assert reply["code"] in {15} | KNOWN_DEEP_DECODE_CODES, reply
    if reply["code"] == 15:
        assert reply["codeName"] == "Overflow"
    assert raw.command({"ping": 1, "$db": "admin"})["ok"] == 1.0  # the same connection still serves


def test_deep_document_gets_overflow(client: MongoClient[dict[str, Any]]) -> None:
    deep: dict[str, Any] = {"a": 1}
    for _ in range(300):
        deep = {"x": deep}
    reply = client[FUZZ_DB].command({"insert": "deep", "documents": [deep]}, check=False)
    assert (reply["ok"], reply["code"], reply["codeName"]) == (0.0, 15, "Overflow")


# Numbers a hostile peer may put where a member expects a term, a config version, an id or an optime.
HOSTILE_NUMBERS = (
    Int64(2**63 - 1), Int64(-(2**63)), Int64(2**62 + 1), 2**31 - 1, -(2**31), -2, -1, 0, 1, 1e300, -1e300,
    float("nan"), float("inf"), float("-inf"), 0.5, 2.0, True, Decimal128("1e40"), Decimal128("NaN"),
    Timestamp(2**32 - 1, 2**32 - 1), Timestamp(0, 0), None, "7",
)


def _valid_optime() -> dict[str, Any]:
    return {"ts": Timestamp(1, 1), "t": Int64(1)}


def _valid_member_message(kind: str, cursor_id: int) -> dict[str, Any]:
    positions = [{"appliedOpTime": _valid_optime(), "durableOpTime": _valid_optime(), "memberId": 0, "cfgver": 1}]
    match kind:
        case "heartbeat":
            return {"replSetHeartbeat": "rs0", "configVersion": 1, "configTerm": Int64(1), "hbv": 1,
                    "from": "127.0.0.1:1", "fromId": 0, "term": Int64(1), "$db": "admin"}
        case "votes":
            return {"replSetRequestVotes": 1, "setName": "rs0", "dryRun": True, "term": Int64(1),
                    "candidateIndex": 0, "configVersion": 1, "configTerm": Int64(1),
                    "lastAppliedOpTime": _valid_optime(), "$db": "admin"}
        case "positions":
            return {"replSetUpdatePosition": 1, "optimes": positions, "$replData": {"term": Int64(1)},
                    "$db": "admin"}
    return {"getMore": Int64(cursor_id), "collection": "oplog.rs",
            "$replPositions": {"optimes": positions, "$replData": {"term": Int64(1)}}, "$db": "local"}


def _numeric_paths(doc: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    if isinstance(doc, dict):
        return [p for k, v in doc.items() if k not in ("getMore", "hbv") for p in _numeric_paths(v, (*path, k))]
    if isinstance(doc, list):
        return [p for i, v in enumerate(doc) for p in _numeric_paths(v, (*path, i))]
    return [path] if isinstance(doc, (int, Timestamp)) and not isinstance(doc, bool) else []


def _replace(doc: Any, path: tuple[Any, ...], value: Any) -> None:
    for key in path[:-1]:
        doc = doc[key]
    doc[path[-1]] = value


HOSTILE_KINDS = ("heartbeat", "votes", "positions", "getMore")


def member_messages() -> Iterator[dict[str, Any]]:
    """Every well-formed member-to-member command with one of its numbers (a term, a config version, an
    id, an optime part) replaced by each hostile number: each reaches as far in as it can."""
    for kind in HOSTILE_KINDS:
        for path in _numeric_paths(_valid_member_message(kind, 1)):
            for value in HOSTILE_NUMBERS:
                doc = _valid_member_message(kind, 2**40 + len(path))
                _replace(doc, path, value)
                yield doc


def test_member_messages_with_hostile_numbers_are_refused_not_adopted(
        client: MongoClient[dict[str, Any]], raw: RawConnection, member: Member) -> None:
    """No number from a peer at its type's limit (int64 max, 2**62 + 1, 1e300, NaN) is adopted: the
    member's term stays one that can be followed, and it is a primary again that takes a majority write."""
    sent = 0
    for doc in member_messages():
        _send(raw, member, next(iter(doc)), doc)
        sent += 1
    assert sent > 500
    assert int(client.admin.command("replSetGetStatus")["term"]) <= MAX_TERM
    member.wait_primary()
    client[FUZZ_DB].get_collection("after_hostile", write_concern=WriteConcern("majority")).insert_one({"n": 1})


def test_member_is_still_a_healthy_primary(client: MongoClient[dict[str, Any]]) -> None:
    _assert_healthy_primary(client)
    assert client[FUZZ_DB].command("ping")["ok"] == 1.0
