"""`$jsonSchema`: MongoDB's JSON Schema (draft 4 with `bsonType`) as a document predicate.

Keywords: `bsonType`, `type`, `required`, `properties`, `additionalProperties` (bool or schema),
`patternProperties`, `minProperties` / `maxProperties`, `minimum` / `maximum` (and their
`exclusive*` flags), `minLength` / `maxLength`, `pattern`, `enum`, `items` (a schema or a list),
`additionalItems`, `minItems` / `maxItems`, `uniqueItems`, `allOf` / `anyOf` / `oneOf` / `not`,
and the annotations `title` and `description`. Any other keyword is refused when the schema is
compiled (2 BadValue), as mongod refuses `$ref` or `format`.
"""

from __future__ import annotations

__layer__ = "core"  # pure: no I/O, clock or randomness (tests/unit/test_layering.py)

import datetime
import re
from collections.abc import Callable, Mapping
from typing import Any

from bson.binary import Binary
from bson.decimal128 import Decimal128
from bson.int64 import Int64
from bson.max_key import MaxKey
from bson.min_key import MinKey
from bson.objectid import ObjectId
from bson.regex import Regex
from bson.timestamp import Timestamp

from base.errors import MongoError
from oplog.values import canonical_key, compare_values, is_number, values_equal

Check = Callable[[Any], bool]

_BSON_TYPES: dict[str, Callable[[Any], bool]] = {
    "double": lambda v: isinstance(v, float),
    "string": lambda v: isinstance(v, str),
    "object": lambda v: isinstance(v, Mapping),
    "array": lambda v: isinstance(v, list),
    "binData": lambda v: isinstance(v, (bytes, Binary)),
    "objectId": lambda v: isinstance(v, ObjectId),
    "bool": lambda v: isinstance(v, bool),
    "date": lambda v: isinstance(v, datetime.datetime),
    "null": lambda v: v is None,
    "regex": lambda v: isinstance(v, (Regex, re.Pattern)),
    "int": lambda v: isinstance(v, int) and not isinstance(v, (bool, Int64)),
    "long": lambda v: isinstance(v, Int64),
    "timestamp": lambda v: isinstance(v, Timestamp),
    "decimal": lambda v: isinstance(v, Decimal128),
    "minKey": lambda v: isinstance(v, MinKey),
    "maxKey": lambda v: isinstance(v, MaxKey),
    "number": lambda v: is_number(v),
}
_JSON_TYPES: dict[str, Callable[[Any], bool]] = {
    "object": _BSON_TYPES["object"], "array": _BSON_TYPES["array"], "number": _BSON_TYPES["number"],
    "boolean": _BSON_TYPES["bool"], "string": _BSON_TYPES["string"], "null": _BSON_TYPES["null"],
}
_ANNOTATIONS = frozenset({"title", "description"})


def _bad(message: str) -> MongoError:
    return MongoError(2, f"$jsonSchema: {message}")


def _count(schema: Mapping[str, Any], key: str) -> int:
    value = schema[key]
    if isinstance(value, bool) or not is_number(value) or value < 0 or int(value) != value:
        raise _bad(f"{key} must be a non-negative integer")
    return int(value)


def _types(table: Mapping[str, Callable[[Any], bool]], value: Any, key: str) -> Check:
    names = [value] if isinstance(value, str) else value
    if not isinstance(names, list) or not names or not all(isinstance(n, str) for n in names):
        raise _bad(f"{key} must be a string or an array of strings")
    unknown = [n for n in names if n not in table]
    if unknown:
        raise _bad(f"unknown {key} '{unknown[0]}'")
    tests = [table[n] for n in names]
    return lambda v: any(test(v) for test in tests)


def compile_schema(schema: Any) -> Check:
    """The predicate `schema` describes (raises BadValue for a schema mongod would refuse)."""
    if not isinstance(schema, Mapping):
        raise _bad("a schema must be an object")
    checks: list[Check] = []
    for key in schema:
        if key in _ANNOTATIONS:
            continue
        rule = _KEYWORDS.get(key)
        if rule is None:
            raise _bad(f"unknown keyword '{key}'")
        checks.append(rule(schema))
    return lambda value: all(check(value) for check in checks)


def _applies_to(test: Callable[[Any], bool], check: Check) -> Check:
    """A keyword constrains only values of its kind (JSON Schema: `minimum` says nothing of strings)."""
    return lambda v: not test(v) or check(v)


def _numeric_bound(schema: Mapping[str, Any], key: str) -> Check:
    bound = schema[key]
    if not is_number(bound) or isinstance(bound, bool):
        raise _bad(f"{key} must be a number")
    exclusive = bool(schema.get("exclusiveMinimum" if key == "minimum" else "exclusiveMaximum", False))
    if key == "minimum":
        return _applies_to(is_number, lambda v: compare_values(v, bound) > (0 if exclusive else -1))
    return _applies_to(is_number, lambda v: compare_values(v, bound) < (0 if exclusive else 1))


def _exclusive_flag(schema: Mapping[str, Any], key: str) -> Check:
    if not isinstance(schema[key], bool):
        raise _bad(f"{key} must be a boolean")
    if (key == "exclusiveMinimum" and "minimum" not in schema) or (
            key == "exclusiveMaximum" and "maximum" not in schema):
        raise _bad(f"{key} needs {'minimum' if key == 'exclusiveMinimum' else 'maximum'}")
    return lambda v: True


def _size_bound(schema: Mapping[str, Any], key: str, kind: str) -> Check:
    """`minLength`/`maxLength` (strings), `minProperties`/`maxProperties` (objects), `minItems`/
    `maxItems` (arrays): a bound on the size of values of that kind."""
    n = _count(schema, key)
    if key.startswith("min"):
        return _applies_to(_BSON_TYPES[kind], lambda v: len(v) >= n)
    return _applies_to(_BSON_TYPES[kind], lambda v: len(v) <= n)


def _pattern(schema: Mapping[str, Any]) -> Check:
    if not isinstance(schema["pattern"], str):
        raise _bad("pattern must be a string")
    try:
        compiled = re.compile(schema["pattern"])
    except re.error as err:
        raise _bad(f"pattern is not a valid regular expression: {err}") from None
    return _applies_to(_BSON_TYPES["string"], lambda v: compiled.search(v) is not None)


def _enum(schema: Mapping[str, Any]) -> Check:
    values = schema["enum"]
    if not isinstance(values, list) or not values:
        raise _bad("enum must be a non-empty array")
    return lambda v: any(values_equal(v, allowed) for allowed in values)


def _required(schema: Mapping[str, Any]) -> Check:
    names = schema["required"]
    if not isinstance(names, list) or not names or not all(isinstance(n, str) for n in names):
        raise _bad("required must be a non-empty array of strings")
    return _applies_to(_BSON_TYPES["object"], lambda v: all(n in v for n in names))


def _properties(schema: Mapping[str, Any]) -> Check:
    props = schema["properties"]
    if not isinstance(props, Mapping):
        raise _bad("properties must be an object")
    checks = {name: compile_schema(sub) for name, sub in props.items()}
    return _applies_to(_BSON_TYPES["object"],
                       lambda v: all(check(v[name]) for name, check in checks.items() if name in v))


def _pattern_properties(schema: Mapping[str, Any]) -> Check:
    patterns = schema["patternProperties"]
    if not isinstance(patterns, Mapping):
        raise _bad("patternProperties must be an object")
    checks = [(re.compile(p), compile_schema(sub)) for p, sub in patterns.items()]
    return _applies_to(_BSON_TYPES["object"], lambda v: all(
        check(value) for name, value in v.items() for regex, check in checks if regex.search(name)))


def _additional_properties(schema: Mapping[str, Any]) -> Check:
    extra = schema["additionalProperties"]
    known = set(schema.get("properties") or {})
    patterns = [re.compile(p) for p in schema.get("patternProperties") or {}]
    check: Check = (lambda _v: bool(extra)) if isinstance(extra, bool) else compile_schema(extra)

    def additional(doc: Mapping[str, Any]) -> bool:
        return all(check(value) for name, value in doc.items()
                   if name not in known and not any(p.search(name) for p in patterns))

    return _applies_to(_BSON_TYPES["object"], additional)


def _items(schema: Mapping[str, Any]) -> Check:
    items = schema["items"]
    is_array = _BSON_TYPES["array"]
    if isinstance(items, list):
        checks = [compile_schema(sub) for sub in items]
        extra = schema.get("additionalItems", True)
        extra_check: Check = (lambda _v: bool(extra)) if isinstance(extra, bool) else compile_schema(extra)
        return _applies_to(is_array, lambda v: all(
            (checks[i](item) if i < len(checks) else extra_check(item)) for i, item in enumerate(v)))
    check = compile_schema(items)
    return _applies_to(is_array, lambda v: all(check(item) for item in v))


def _unique_items(schema: Mapping[str, Any]) -> Check:
    if not isinstance(schema["uniqueItems"], bool):
        raise _bad("uniqueItems must be a boolean")
    if not schema["uniqueItems"]:
        return lambda v: True
    return _applies_to(_BSON_TYPES["array"], lambda v: len({canonical_key(i) for i in v}) == len(v))


def _combination(schema: Mapping[str, Any], key: str) -> Check:
    subs = schema[key]
    if key == "not":
        check = compile_schema(subs)
        return lambda v: not check(v)
    if not isinstance(subs, list) or not subs:
        raise _bad(f"{key} must be a non-empty array")
    checks = [compile_schema(sub) for sub in subs]
    if key == "allOf":
        return lambda v: all(c(v) for c in checks)
    if key == "anyOf":
        return lambda v: any(c(v) for c in checks)
    return lambda v: sum(1 for c in checks if c(v)) == 1


_KEYWORDS: dict[str, Callable[[Mapping[str, Any]], Check]] = {
    "bsonType": lambda s: _types(_BSON_TYPES, s["bsonType"], "bsonType"),
    "type": lambda s: _types(_JSON_TYPES, s["type"], "type"),
    "required": _required,
    "properties": _properties,
    "patternProperties": _pattern_properties,
    "additionalProperties": _additional_properties,
    "minProperties": lambda s: _size_bound(s, "minProperties", "object"),
    "maxProperties": lambda s: _size_bound(s, "maxProperties", "object"),
    "minimum": lambda s: _numeric_bound(s, "minimum"),
    "maximum": lambda s: _numeric_bound(s, "maximum"),
    "exclusiveMinimum": lambda s: _exclusive_flag(s, "exclusiveMinimum"),
    "exclusiveMaximum": lambda s: _exclusive_flag(s, "exclusiveMaximum"),
    "minLength": lambda s: _size_bound(s, "minLength", "string"),
    "maxLength": lambda s: _size_bound(s, "maxLength", "string"),
    "pattern": _pattern,
    "enum": _enum,
    "items": _items,
    "additionalItems": lambda s: (lambda v: True),  # read by `items`
    "minItems": lambda s: _size_bound(s, "minItems", "array"),
    "maxItems": lambda s: _size_bound(s, "maxItems", "array"),
    "uniqueItems": _unique_items,
    "allOf": lambda s: _combination(s, "allOf"),
    "anyOf": lambda s: _combination(s, "anyOf"),
    "oneOf": lambda s: _combination(s, "oneOf"),
    "not": lambda s: _combination(s, "not"),
}
