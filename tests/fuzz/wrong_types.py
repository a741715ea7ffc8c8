"""Every argument of every command, given a value of every BSON type: the cases of the generated
wrong-type test (tests/integration/test_command_fuzz.py).

For each registered command, a minimal well-formed document is built from its argument table
(`replset.wire.command_args`: the command's value and its required fields), then one field at a
time gets each value of `WRONG_VALUES`: the command's own value, each field the table knows, each
field of a known sub-document (`cursor.batchSize`, `updates.q`...) and the generic arguments every
command takes. A case knows the error an IDL parser gives when the value's type is not one the
field accepts (`expected_code`); otherwise only "no internal error" is asked of it.

The BSON is built here, element by element, because two values have no Python form that encodes
to them: the deprecated dbPointer (type 0x0C, which pymongo decodes to a DBRef) and a DBRef as
drivers send it (an object `{$ref, $id}`).
"""

from __future__ import annotations

import datetime
import struct
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import bson
from bson import Code, DBRef, Decimal128, Int64, MaxKey, MinKey, ObjectId, Regex, Timestamp
from bson.binary import Binary

from replset.wire.command_args import Arg, CommandArgs, args_for

_OID = ObjectId("5f0000000000000000000001")


class DbPointer:
    """The deprecated BSON dbPointer (0x0C): a namespace and an ObjectId."""

    def __repr__(self) -> str:
        return "DbPointer('c', ObjectId('5f0000000000000000000001'))"


WRONG_VALUES: tuple[tuple[str, Any], ...] = (
    ("dbPointer", DbPointer()),
    ("object", DBRef("c", 1, "test", extra=1)),  # a DBRef as drivers send it: an object
    ("string", "x"), ("int", 7), ("long", Int64(2**40)), ("double", 2.5), ("decimal", Decimal128("1.5")),
    ("array", [1, "a"]), ("object", {"x": 1}), ("null", None), ("bool", True), ("binData", Binary(b"ab", 0)),
    ("timestamp", Timestamp(1, 1)), ("minKey", MinKey()), ("maxKey", MaxKey()), ("objectId", _OID),
    ("date", datetime.datetime(2020, 1, 1, tzinfo=datetime.UTC)), ("regex", Regex("a", "i")),
    ("javascript", Code("1")),
)
# Generic arguments (any command takes them) whose values the dispatcher reads.
GENERIC_FIELDS = ("maxTimeMS", "readConcern", "writeConcern", "lsid", "txnNumber", "autocommit",
                  "startTransaction", "comment", "$readPreference", "apiVersion", "$clusterTime", "let")
_VALID_BY_TYPE: dict[str, Any] = {
    "object": {}, "array": [], "string": "c", "bool": True, "int": 1, "long": Int64(1), "double": 1.0,
    "decimal": Decimal128("1"), "binData": Binary(bytes(16), 4),
}


@dataclass(frozen=True, slots=True)
class Case:
    command: str
    path: str  # the field given the value: "cursor", "cursor.batchSize", or the command's own name
    type_name: str
    value: Any
    document: dict[str, Any]
    # When the field refuses the type: the code an IDL parser answers, and the start of its message
    # ("" for a field with a message of its own). None: any reply but an internal error.
    expected: tuple[int, str] | None

    def encode(self) -> bytes:
        return encode(self.document)


def minimal(arg: Arg) -> Any:
    """A value the argument accepts, with the required fields of its sub-document."""
    if arg.struct is not None:
        doc = {k: minimal(a) for k, a in arg.struct.fields.items() if a.required}
        return [doc] if "array" in arg.types else doc
    if arg.min_items:
        return [_VALID_BY_TYPE[arg.items[0]] if arg.items else {}]
    if not arg.types:
        return 1
    if arg.allowed:
        return arg.allowed[-1]
    return _VALID_BY_TYPE.get(arg.types[0], 1)


def base_document(name: str, spec: CommandArgs) -> dict[str, Any]:
    value = "c" if spec.collection else minimal(spec.value)
    doc = {name: value}
    doc.update({k: minimal(a) for k, a in spec.fields.items() if a.required})
    return doc


def cases(name: str, poison: Mapping[str, Any]) -> Iterator[Case]:
    """Every field of `name` with every wrong value; `poison`'s fields are put in every document (a
    command that acts on the member fails before it does)."""
    spec = args_for(name)
    base = base_document(name, spec)
    checked = not poison  # (a poisoned document fails on the poison, wherever the field is)
    for type_name, value in WRONG_VALUES:
        expected = _value_expectation(name, spec, type_name) if checked else None
        yield Case(name, name, type_name, value, {**base, name: value, **poison}, expected)
        for key, arg in spec.fields.items():
            doc = {name: base[name], key: value, **{k: v for k, v in base.items() if k not in (name, key)}}
            expected = _expectation(arg, type_name, f"{name}.{key}") if checked else None
            yield Case(name, key, type_name, value, {**doc, **poison}, expected)
            if arg.struct is not None:
                yield from _sub_cases(name, key, arg, type_name, value, base, poison)
        for key in GENERIC_FIELDS:
            yield Case(name, key, type_name, value, {**base, key: value, **poison}, None)


def _sub_cases(name: str, key: str, arg: Arg, type_name: str, value: Any, base: dict[str, Any],
               poison: Mapping[str, Any]) -> Iterator[Case]:
    assert arg.struct is not None
    for sub, sub_arg in arg.struct.fields.items():
        inner = {sub: value, **{k: minimal(a) for k, a in arg.struct.fields.items() if a.required and k != sub}}
        parent: Any = [inner] if "array" in arg.types else inner
        doc = {name: base[name], key: parent, **{k: v for k, v in base.items() if k not in (name, key)}}
        expected = None if poison else _expectation(sub_arg, type_name, f"{name}.{key}.{sub}")
        yield Case(name, f"{key}.{sub}", type_name, value, {**doc, **poison}, expected)


def _value_expectation(name: str, spec: CommandArgs, type_name: str) -> tuple[int, str] | None:
    if spec.collection:
        return None if type_name == "string" else (73, "collection name has invalid type")
    return _expectation(spec.value, type_name, name)


def _expectation(arg: Arg, type_name: str, path: str) -> tuple[int, str] | None:
    """What an IDL parser answers for a value of `type_name`, or None when the field takes the type."""
    if type_name == "null" or not arg.types or type_name in arg.types:
        return None
    if arg.optional_bool:
        return 14, f"Field '{path.rpartition('.')[2]}' should be a boolean value"
    if arg.wrong_type is not None:
        return arg.wrong_type[0], ""
    return 14, f"BSON field '{path}' is the wrong type '{type_name}'"


# -- BSON, element by element --------------------------------------------------------------------------
def encode(doc: Mapping[str, Any]) -> bytes:
    body = b"".join(_element(str(k), v) for k, v in doc.items())
    return struct.pack("<i", len(body) + 5) + body + b"\0"


def _element(key: str, value: Any) -> bytes:
    name = key.encode() + b"\0"
    if isinstance(value, DbPointer):
        namespace = b"c\0"
        return b"\x0c" + name + struct.pack("<i", len(namespace)) + namespace + _OID.binary
    if isinstance(value, dict):
        return b"\x03" + name + encode(value)
    if isinstance(value, list):
        return b"\x04" + name + encode({str(i): v for i, v in enumerate(value)})
    return bson.encode({key: value})[4:-1]
