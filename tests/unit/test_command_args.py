"""The argument layer answers malformed commands as mongod's IDL parser does."""

from __future__ import annotations

from typing import Any

import pytest
from bson.code import Code
from bson.dbref import DBRef
from bson.decimal128 import Decimal128
from bson.int64 import Int64
from bson.objectid import ObjectId

from base.errors import MongoError
from replset.wire.command_args import (
    COMMAND_ARGS,
    GENERIC_FIELDS,
    MAX_BSON_DEPTH,
    bson_type,
    check_command,
    exceeds_depth,
    safe_number_long,
)
from replset.wire.commands import load_commands


def error_of(cmd: dict[str, Any]) -> tuple[int, str]:
    with pytest.raises(MongoError) as info:
        check_command(next(iter(cmd)), cmd)
    return info.value.code, info.value.errmsg


def nested(depth: int) -> dict[str, Any]:
    doc: dict[str, Any] = {"a": 1}
    for _ in range(depth):
        doc = {"x": doc}
    return doc


def test_every_table_entry_is_a_registered_command() -> None:
    assert set(COMMAND_ARGS) <= set(load_commands())


@pytest.mark.parametrize(("cmd", "code", "message"), [
    ({"find": "c", "filter": "x"}, 14,
     "BSON field 'find.filter' is the wrong type 'string', expected type 'object'"),
    ({"find": "c", "skip": "1"}, 14,
     "BSON field 'find.skip' is the wrong type 'string', expected types '[long, int, decimal, double]'"),
    ({"find": "c", "limit": True}, 14,
     "BSON field 'find.limit' is the wrong type 'bool', expected types '[long, int, decimal, double]'"),
    ({"find": "c", "skip": -1}, 51024, "BSON field 'find.skip' value must be >= 0, actual value '-1'"),
    ({"find": "c", "singleBatch": 1}, 14, "Field 'singleBatch' should be a boolean value, but found: int"),
    ({"find": "c", "singleBatch": None}, 14, "Field 'singleBatch' should be a boolean value, but found: null"),
    ({"find": "c", "foo": 1}, 40415, "BSON field 'find.foo' is an unknown field."),
    # A statement's sort is MongoDB 8.0's; 7.0, which this server reports, does not know the field.
    ({"update": "c", "updates": [{"q": {}, "u": {"$set": {"a": 1}}, "sort": {"a": 1}}]}, 40415,
     "BSON field 'update.updates.sort' is an unknown field."),
    ({"find": 3}, 73, "collection name has invalid type int"),
    ({"find": "", "$db": "test"}, 73, "Invalid namespace specified 'test.'"),
    ({"find": "c", "hint": 1}, 9, "Hint must be a string or an object"),
    ({"find": "c", "maxTimeMS": "1"}, 2, "maxTimeMS must be a number"),
    ({"getMore": Int64(1)}, 40414, "BSON field 'getMore.collection' is missing but a required field"),
    ({"getMore": "1", "collection": "c"}, 14,
     "BSON field 'getMore' is the wrong type 'string', expected type 'long'"),
    ({"getMore": Int64(1), "collection": []}, 14,
     "BSON field 'getMore.collection' is the wrong type 'array', expected type 'string'"),
    ({"insert": "c", "documents": [{}, 5]}, 14,
     "BSON field 'insert.documents.1' is the wrong type 'int', expected type 'object'"),
    ({"insert": "c"}, 40414, "BSON field 'insert.documents' is missing but a required field"),
    ({"insert": "c", "documents": []}, 16, "Write batch sizes must be between 1 and 100000. Got 0 operations."),
    ({"insert": "c", "documents": [{}], "ordered": 1}, 14,
     "BSON field 'insert.ordered' is the wrong type 'int', expected type 'bool'"),
    ({"update": "c", "updates": [{"u": {}}]}, 40414, "BSON field 'update.updates.q' is missing but a required field"),
    ({"update": "c", "updates": [{"q": {}, "u": 1}]}, 9, "Update argument must be either an object or an array"),
    ({"update": "c", "updates": ["x"]}, 14,
     "BSON field 'update.updates.0' is the wrong type 'string', expected type 'object'"),
    ({"delete": "c", "deletes": [{"q": {}, "limit": 2}]}, 9,
     "The limit field in delete objects must be 0 or 1. Got 2"),
    ({"aggregate": "c", "cursor": {}}, 40414, "BSON field 'aggregate.pipeline' is missing but a required field"),
    ({"aggregate": "c", "pipeline": [1], "cursor": {}}, 14,
     "BSON field 'aggregate.pipeline.0' is the wrong type 'int', expected type 'object'"),
    ({"aggregate": "c", "pipeline": [], "cursor": []}, 14,
     "BSON field 'aggregate.cursor' is the wrong type 'array', expected type 'object'"),
    ({"listCollections": 1, "cursor": {"batchSize": -1}}, 51024,
     "BSON field 'listCollections.cursor.batchSize' value must be >= 0, actual value '-1'"),
    ({"killCursors": "c", "cursors": [1.5]}, 14,
     "BSON field 'killCursors.cursors.0' is the wrong type 'double', expected types '[long, int]'"),
    ({"distinct": "c"}, 40414, "BSON field 'distinct.key' is missing but a required field"),
    ({"dropIndexes": "c"}, 40414, "BSON field 'dropIndexes.index' is missing but a required field"),
    ({"replSetStepDown": "60"}, 14,
     "BSON field 'replSetStepDown' is the wrong type 'string', expected types '[long, int, decimal, double]'"),
    ({"getLog": 1}, 14, "Argument to getLog must be of type String; found 1 of type int"),
])
def test_malformed_commands_get_mongod_errors(cmd: dict[str, Any], code: int, message: str) -> None:
    assert error_of(cmd) == (code, message)


@pytest.mark.parametrize("cmd", [
    {"find": "c", "filter": {"a": 1}, "sort": None, "skip": 0, "limit": Int64(5), "batchSize": 2.0,
     "singleBatch": False, "hint": "_id_", "$db": "t", "lsid": {"id": 1}, "$clusterTime": {},
     "readConcern": {"level": "majority"}, "comment": "x", "apiVersion": "1", "maxTimeMS": 10},
    {"getMore": Int64(7), "collection": "oplog.rs", "batchSize": 10, "maxTimeMS": 500,
     "$replPositions": {"optimes": []}, "term": Int64(3), "$db": "local"},
    {"insert": "c", "documents": [{"_id": 1}], "ordered": False, "writeConcern": {"w": "majority"},
     "txnNumber": Int64(1), "bypassDocumentValidation": 1},
    {"update": "c", "updates": [{"q": {}, "u": [{"$set": {"a": 1}}], "multi": True, "upsert": False,
                                 "arrayFilters": [{"x.a": 1}], "collation": {"locale": "simple"}}]},
    {"delete": "c", "deletes": [{"q": {}, "limit": 0.0}, {"q": {}, "limit": Decimal128("1")}]},
    {"aggregate": 1, "pipeline": [{"$match": {}}], "cursor": {"batchSize": 0}},
    {"hello": 1, "helloOk": True, "client": {"driver": {}}, "compression": ["zlib"], "loadBalanced": False},
    {"isMaster": 1, "topologyVersion": {"processId": ObjectId(), "counter": Int64(0)},
     "maxAwaitTimeMS": 10000},
    {"create": "c", "capped": True, "size": 4096},
    {"listCollections": 1, "nameOnly": True, "authorizedCollections": True, "filter": {}},
    {"endSessions": [{"id": b"0" * 16}]},
    {"replSetHeartbeat": "rs0", "configVersion": 1, "from": "h:1", "fromId": 0, "term": Int64(1)},
    {"someFutureCommand": {"anything": [1]}, "what": "ever"},
])
def test_well_formed_commands_pass(cmd: dict[str, Any]) -> None:
    check_command(next(iter(cmd)), cmd)


def test_generic_fields_are_never_unknown() -> None:
    for name in ("find", "insert", "getMore", "aggregate", "createIndexes", "listDatabases"):
        cmd: dict[str, Any] = {name: "c" if name != "getMore" else Int64(1), "collection": "c",
                               "documents": [{}], "pipeline": [], "indexes": [{}]}
        cmd = {k: v for k, v in cmd.items() if k == name or k in COMMAND_ARGS[name].fields}
        for generic in GENERIC_FIELDS:
            check_command(name, {**cmd, generic: {"x": 1}} if generic != "maxTimeMS" else {**cmd, generic: 5})


def test_numbers_are_normalised_as_mongod_converts_them() -> None:
    cmd: dict[str, Any] = {"find": "c", "skip": 2.9, "limit": Decimal128("3.5"), "batchSize": float("nan"),
                           "maxTimeMS": 7.0}
    check_command("find", cmd)
    assert (cmd["skip"], cmd["limit"], cmd["batchSize"], cmd["maxTimeMS"]) == (2, 3, 0, 7)
    assert all(type(cmd[k]) is int for k in ("skip", "limit", "batchSize", "maxTimeMS"))
    assert safe_number_long(float("inf")) == 2**63 - 1
    assert safe_number_long(-1e300) == -(2**63)
    assert safe_number_long(Decimal128("-Infinity")) == -(2**63)


def test_depth_limit_is_mongods() -> None:
    assert not exceeds_depth({"filter": nested(MAX_BSON_DEPTH - 1)})
    assert exceeds_depth({"filter": nested(MAX_BSON_DEPTH)})
    check_command("find", {"find": "c", "filter": nested(MAX_BSON_DEPTH - 1)})
    err = error_of({"find": "c", "filter": nested(5000)})
    assert err == (15, "BSONObj exceeds maximum nested object depth")


def test_overflow_reply_has_mongods_code_name() -> None:
    with pytest.raises(MongoError) as info:
        check_command("insert", {"insert": "c", "documents": [nested(MAX_BSON_DEPTH)]})
    assert info.value.to_document()["codeName"] == "Overflow"


@pytest.mark.parametrize(("value", "name"), [
    (None, "null"), (True, "bool"), (1, "int"), (2**40, "long"), (Int64(1), "long"), (1.5, "double"),
    ("s", "string"), ({}, "object"), ([], "array"), (Decimal128("1"), "decimal"), (b"x", "binData"),
    (ObjectId(), "objectId"),
])
def test_bson_type_names(value: Any, name: str) -> None:
    assert bson_type(value) == name


def test_every_registered_command_has_a_table_entry() -> None:
    """A command without one would take any field of any type to its handler."""
    assert set(load_commands()) <= set(COMMAND_ARGS)


@pytest.mark.parametrize(("cmd", "code", "message"), [
    # pymongo decodes a dbPointer (0x0C) to a DBRef of a collection and an ObjectId.
    ({"listCollections": 1, "cursor": DBRef("c", ObjectId())}, 14,
     "BSON field 'listCollections.cursor' is the wrong type 'dbPointer', expected type 'object'"),
    ({"listCollections": 1, "cursor": {"batchSize": "x"}}, 14,
     "BSON field 'listCollections.cursor.batchSize' is the wrong type 'string', expected types "
     "'[long, int, decimal, double]'"),
    ({"listCollections": 1, "filter": "x"}, 14,
     "BSON field 'listCollections.filter' is the wrong type 'string', expected type 'object'"),
    ({"find": "c", "hint": DBRef("c", ObjectId())}, 9, "Hint must be a string or an object"),
    ({"find": Code("c")}, 73, "collection name has invalid type javascript"),
    ({"getLog": Code("global")}, 14, "Argument to getLog must be of type String; found Code('global', None) of "
                                     "type javascript"),
    ({"explain": {"find": "c", "filter": "x"}}, 14,
     "BSON field 'find.filter' is the wrong type 'string', expected type 'object'"),
    ({"explain": {"update": "c", "updates": [{"q": 1, "u": {}}]}}, 14,
     "BSON field 'update.updates.q' is the wrong type 'int', expected type 'object'"),
    ({"collMod": "c", "index": {"expireAfterSeconds": "x"}}, 14,
     "BSON field 'collMod.index.expireAfterSeconds' is the wrong type 'string', expected types "
     "'[long, int, decimal, double]'"),
    ({"renameCollection": "a.b", "to": 1}, 14, "BSON field 'renameCollection.to' is the wrong type 'int', "
                                                "expected type 'string'"),
    ({"saslContinue": 1, "conversationId": "1"}, 14,
     "BSON field 'saslContinue.conversationId' is the wrong type 'string', expected types '[long, int]'"),
    ({"dropUser": None}, 40414, "BSON field 'dropUser' is missing but a required field"),
    # Sub-documents a handler takes apart (both were internal errors).
    ({"hello": 1, "topologyVersion": {"processId": ObjectId(), "counter": "x"}, "maxAwaitTimeMS": 1}, 14,
     "BSON field 'hello.topologyVersion.counter' is the wrong type 'string', expected type 'long'"),
    ({"create": "c", "clusteredIndex": {"key": "x", "unique": True}}, 14,
     "BSON field 'create.clusteredIndex.key' is the wrong type 'string', expected type 'object'"),
])
def test_wrong_types_anywhere_get_a_type_mismatch(cmd: dict[str, Any], code: int, message: str) -> None:
    assert error_of(cmd) == (code, message)


def test_a_dbref_sent_as_an_object_reaches_the_handler_as_that_object() -> None:
    ref = DBRef("c", 1, "test", extra=1)  # not a dbPointer's shape: an object {$ref, $id, $db, extra}
    cmd: dict[str, Any] = {"listCollections": 1, "filter": ref, "cursor": DBRef("c", 2, "test")}
    check_command("listCollections", cmd)
    assert cmd["filter"] == {"$ref": "c", "$id": 1, "$db": "test", "extra": 1} and type(cmd["filter"]) is dict
    assert cmd["cursor"] == {"$ref": "c", "$id": 2, "$db": "test"}
    docs: dict[str, Any] = {"insert": "c", "documents": [{"a": 1}, DBRef("c", 3, "test")]}
    check_command("insert", docs)
    assert type(docs["documents"][1]) is dict
