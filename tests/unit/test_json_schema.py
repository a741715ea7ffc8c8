"""$jsonSchema as a query predicate: the keywords mongod supports, and the schemas it refuses."""

from __future__ import annotations

import datetime
from typing import Any

import pytest
from bson.int64 import Int64
from bson.objectid import ObjectId

from base.errors import MongoError
from oplog.query import compile_filter

PERSON = {"bsonType": "object", "required": ["name"], "additionalProperties": False, "properties": {
    "_id": {"bsonType": "objectId"}, "name": {"bsonType": "string", "minLength": 1, "pattern": "^[A-Z]"},
    "age": {"bsonType": ["int", "long"], "minimum": 0, "maximum": 150, "exclusiveMaximum": True},
    "tags": {"bsonType": "array", "items": {"enum": ["a", "b"]}, "uniqueItems": True, "maxItems": 2},
    "born": {"bsonType": "date"},
    "kind": {"oneOf": [{"enum": ["x"]}, {"bsonType": "int"}]},
}}


@pytest.mark.parametrize(("doc", "valid"), [
    ({"_id": ObjectId(), "name": "Ann"}, True),
    ({"name": "Ann", "age": 30, "tags": ["a"], "born": datetime.datetime(2000, 1, 1)}, True),
    ({"name": "Ann", "age": Int64(149)}, True),
    ({"name": "Ann", "age": 150}, False),
    ({"name": "Ann", "age": 3.5}, False),
    ({"name": "ann"}, False),
    ({"name": ""}, False),
    ({"age": 3}, False),
    ({"name": "Ann", "tags": ["a", "a"]}, False),
    ({"name": "Ann", "tags": ["c"]}, False),
    ({"name": "Ann", "other": 1}, False),
    ({"name": "Ann", "kind": "x"}, True),
    ({"name": "Ann", "kind": "y"}, False),
])
def test_documents_against_a_schema(doc: dict[str, Any], valid: bool) -> None:
    assert compile_filter({"$jsonSchema": PERSON}).matches(doc) is valid


@pytest.mark.parametrize("schema", [
    {"$ref": "#/x"}, {"format": "email"}, {"bsonType": "integer"}, {"required": []}, {"minLength": -1},
    {"exclusiveMinimum": True}, {"pattern": "("}, {"type": "int"}, [],
])
def test_bad_schemas_are_refused(schema: Any) -> None:
    with pytest.raises(MongoError) as err:
        compile_filter({"$jsonSchema": schema})
    assert err.value.code == 2
