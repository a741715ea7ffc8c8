"""oplog.update: MongoDB's update operators and the idempotent oplog form of their result.

Cases come from the examples on MongoDB's documentation pages for each update operator
(https://www.mongodb.com/docs/manual/reference/operator/update/) and from the server's
semantics (src/mongo/db/update/). Every successful case also checks the oplog contract:
applying `oplog_update` to the original document gives the new document, and applying it
again to the new document changes nothing. Documents are compared as BSON bytes, so
field order and numeric types count.
"""

from __future__ import annotations

import calendar
import datetime
from typing import Any

import bson
import pytest
from bson.decimal128 import Decimal128
from bson.int64 import Int64
from bson.objectid import ObjectId
from bson.regex import Regex
from bson.timestamp import Timestamp
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from base.errors import MongoError
from oplog.update import (
    DISAMBIGUATED,
    UpdateOutcome,
    apply_oplog_update,
    apply_pipeline_update,
    apply_replacement,
    apply_update,
    is_operator_update,
    upsert_seed,
    validate_update,
)
from oplog.update_paths import array_index, get_path

NOW = datetime.datetime(2024, 5, 6, 7, 8, 9, 123000)
NOW_TS = Timestamp(calendar.timegm(NOW.utctimetuple()), 1)
ANY = object()  # "don't compare the oplog form exactly" (it is still replayed and checked)
UNCHANGED = object()  # expected document: the input, unmodified, with oplog_update None


def enc(doc: Any) -> bytes:
    return bson.encode(doc)


def assert_doc(actual: Any, expected: Any) -> None:
    assert enc(actual) == enc(expected), f"\n  got:      {actual!r}\n  expected: {expected!r}"


def assert_oplog_contract(before: dict[str, Any], out: UpdateOutcome) -> None:
    if not out.modified:
        assert out.oplog_update is None
        assert_doc(out.document, before)
        return
    assert out.oplog_update
    assert "$v" not in out.oplog_update
    assert_doc(apply_oplog_update(before, out.oplog_update), out.document)
    assert_doc(apply_oplog_update(out.document, out.oplog_update), out.document)


def run_case(doc: dict[str, Any], update: dict[str, Any], expected: Any, oplog: Any,
             kwargs: dict[str, Any]) -> None:
    snapshot = enc(doc)
    out = apply_update(doc, update, now=NOW, **kwargs)
    assert enc(doc) == snapshot, "the input document was mutated"
    if expected is UNCHANGED:
        assert not out.modified
        assert out.oplog_update is None
        assert_doc(out.document, doc)
        return
    assert_doc(out.document, expected)
    assert out.modified
    if oplog is not ANY:  # (what change streams add, `$disambiguated`, has tests of its own)
        assert_doc({k: v for k, v in out.oplog_update.items() if k != DISAMBIGUATED}, oplog)
    assert_oplog_contract(doc, out)


def case(name: str, doc: dict[str, Any], update: dict[str, Any], expected: Any, oplog: Any = ANY,
         **kwargs: Any) -> Any:
    return pytest.param(doc, update, expected, oplog, kwargs, id=name)


def error(name: str, doc: dict[str, Any], update: Any, code: int, message: str | None = None,
          **kwargs: Any) -> Any:
    return pytest.param(doc, update, code, message, kwargs, id=name)


def run_error(doc: dict[str, Any], update: Any, code: int, message: str | None,
              kwargs: dict[str, Any]) -> None:
    with pytest.raises(MongoError) as info:
        apply_update(doc, update, now=NOW, **kwargs)
    assert info.value.code == code, info.value.errmsg
    if message is not None:
        assert info.value.errmsg == message


def _has_query_module() -> bool:
    try:
        from oplog.query import compile_filter  # noqa: F401
    except ImportError:
        return False
    return True


needs_query = pytest.mark.skipif(not _has_query_module(), reason="oplog.query not available yet")


# -- $set ---------------------------------------------------------------------------
PRODUCT = {
    "_id": 100, "quantity": 250, "instock": True, "reorder": False,
    "details": {"model": "14QQ", "make": "Clothes Corp"},
    "tags": ["apparel", "clothing"], "ratings": [{"by": "Customer007", "rating": 4}],
}


def product(**changes: Any) -> dict[str, Any]:
    return {**PRODUCT, **changes}


SET_CASES = [
    case("docs-top-level", PRODUCT,
         {"$set": {"quantity": 500, "details": {"model": "2600", "make": "Fashionaires"},
                   "tags": ["coats", "outerwear", "clothing"]}},
         product(quantity=500, details={"model": "2600", "make": "Fashionaires"},
                 tags=["coats", "outerwear", "clothing"]),
         {"$set": {"details": {"model": "2600", "make": "Fashionaires"}, "quantity": 500,
                   "tags": ["coats", "outerwear", "clothing"]}}),
    case("docs-embedded", PRODUCT, {"$set": {"details.make": "Kustom Kidz"}},
         product(details={"model": "14QQ", "make": "Kustom Kidz"}), {"$set": {"details.make": "Kustom Kidz"}}),
    case("docs-array-elements", PRODUCT, {"$set": {"tags.1": "rain gear", "ratings.0.rating": 2}},
         product(tags=["apparel", "rain gear"], ratings=[{"by": "Customer007", "rating": 2}]),
         {"$set": {"ratings.0.rating": 2, "tags.1": "rain gear"}}),
    case("docs-new-field-appended", PRODUCT, {"$set": {"cost": 10}}, {**PRODUCT, "cost": 10},
         {"$set": {"cost": 10}}),
    case("new-fields-lexicographic", {"_id": 1}, {"$set": {"z": 1, "b": 2, "a": 3}},
         {"_id": 1, "a": 3, "b": 2, "z": 1}, {"$set": {"a": 3, "b": 2, "z": 1}}),
    case("new-fields-across-operators", {"_id": 1}, {"$set": {"z": 1}, "$inc": {"m": 1}, "$push": {"a": 1}},
         {"_id": 1, "a": [1], "m": 1, "z": 1}, {"$set": {"a": [1], "m": 1, "z": 1}}),
    case("numeric-field-names-by-value", {"_id": 1}, {"$set": {"x.10": 1, "x.9": 2}},
         {"_id": 1, "x": {"9": 2, "10": 1}}, {"$set": {"x.9": 2, "x.10": 1}}),
    case("existing-fields-keep-position", {"_id": 1, "b": 0, "c": 0}, {"$set": {"c": 1, "a": 2}},
         {"_id": 1, "b": 0, "c": 1, "a": 2}, {"$set": {"a": 2, "c": 1}}),
    case("replace-in-middle", {"_id": 1, "a": 1, "b": 2}, {"$set": {"a": 9}}, {"_id": 1, "a": 9, "b": 2},
         {"$set": {"a": 9}}),
    case("same-value-is-noop", {"_id": 1, "a": 1}, {"$set": {"a": 1}}, UNCHANGED),
    case("same-subdocument-is-noop", {"_id": 1, "a": {"b": [1, 2]}}, {"$set": {"a": {"b": [1, 2]}}}, UNCHANGED),
    case("int-to-double-is-a-change", {"_id": 1, "a": 1}, {"$set": {"a": 1.0}}, {"_id": 1, "a": 1.0},
         {"$set": {"a": 1.0}}),
    case("int-to-long-is-a-change", {"_id": 1, "a": 1}, {"$set": {"a": Int64(1)}}, {"_id": 1, "a": Int64(1)},
         {"$set": {"a": Int64(1)}}),
    case("field-order-of-value-counts", {"_id": 1, "a": {"x": 1, "y": 2}}, {"$set": {"a": {"y": 2, "x": 1}}},
         {"_id": 1, "a": {"y": 2, "x": 1}}, {"$set": {"a": {"y": 2, "x": 1}}}),
    case("pad-array-with-nulls", {"_id": 1, "a": [0]}, {"$set": {"a.3": 1}}, {"_id": 1, "a": [0, None, None, 1]},
         {"$set": {"a.3": 1}}),
    case("append-at-array-end", {"_id": 1, "a": [0]}, {"$set": {"a.1": 1}}, {"_id": 1, "a": [0, 1]},
         {"$set": {"a.1": 1}}),
    case("create-object-in-padded-array", {"_id": 1, "a": []}, {"$set": {"a.2.b": 1}},
         {"_id": 1, "a": [None, None, {"b": 1}]}, {"$set": {"a.2.b": 1}}),
    case("numeric-part-on-object-is-a-field", {"_id": 1, "a": {}}, {"$set": {"a.0": 5}}, {"_id": 1, "a": {"0": 5}},
         {"$set": {"a.0": 5}}),
    case("deep-creation", {"_id": 1, "a": {}}, {"$set": {"a.b.c.d": 1}}, {"_id": 1, "a": {"b": {"c": {"d": 1}}}},
         {"$set": {"a.b.c.d": 1}}),
    case("create-siblings-under-new-parent", {"_id": 1}, {"$set": {"p.y": 2, "p.x": 1}},
         {"_id": 1, "p": {"x": 1, "y": 2}}, {"$set": {"p.x": 1, "p.y": 2}}),
    case("add-to-existing-subdocument", {"_id": 1, "a": {"b": 1}, "z": 0}, {"$set": {"a.c": 3}},
         {"_id": 1, "a": {"b": 1, "c": 3}, "z": 0}, {"$set": {"a.c": 3}}),
    case("element-of-embedded-array", {"_id": 1, "a": [{"b": 1}, {"b": 2}]}, {"$set": {"a.1.b": 5}},
         {"_id": 1, "a": [{"b": 1}, {"b": 5}]}, {"$set": {"a.1.b": 5}}),
    case("nested-arrays", {"_id": 1, "a": [[1, 2]]}, {"$set": {"a.0.1": 9}}, {"_id": 1, "a": [[1, 9]]},
         {"$set": {"a.0.1": 9}}),
    case("array-replaced-by-scalar", {"_id": 1, "a": [1]}, {"$set": {"a": 5}}, {"_id": 1, "a": 5},
         {"$set": {"a": 5}}),
    case("set-null", {"_id": 1, "a": 1}, {"$set": {"a": None}}, {"_id": 1, "a": None}, {"$set": {"a": None}}),
    case("same-id-is-allowed", {"_id": 1}, {"$set": {"_id": 1, "a": 2}}, {"_id": 1, "a": 2},
         {"$set": {"a": 2}}),
    case("same-embedded-id-part", {"_id": {"x": 1}}, {"$set": {"_id.x": 1}}, UNCHANGED),
    case("nested-dollar-field-allowed", {"_id": 1}, {"$set": {"a": {"$x": 1}}}, {"_id": 1, "a": {"$x": 1}},
         {"$set": {"a": {"$x": 1}}}),
    case("dotted-dollar-field-allowed", {"_id": 1, "a": {}}, {"$set": {"a.$x": 1}}, {"_id": 1, "a": {"$x": 1}},
         {"$set": {"a.$x": 1}}),
    case("bson-types", {"_id": 1},
         {"$set": {"d": Decimal128("1.5"), "l": Int64(7), "o": ObjectId("0123456789ab0123456789ab"),
                   "t": datetime.datetime(2020, 1, 1), "r": Regex("^a", "i")}},
         {"_id": 1, "d": Decimal128("1.5"), "l": Int64(7), "o": ObjectId("0123456789ab0123456789ab"),
          "r": Regex("^a", "i"), "t": datetime.datetime(2020, 1, 1)}),
    case("many-paths-one-parent", {"_id": 1, "a": {"x": 0}}, {"$set": {"a.x": 1, "a.y": 2, "a.z.w": 3}},
         {"_id": 1, "a": {"x": 1, "y": 2, "z": {"w": 3}}}, {"$set": {"a.x": 1, "a.y": 2, "a.z.w": 3}}),
    case("one-changed-one-same", {"_id": 1, "a": 1, "b": 2}, {"$set": {"a": 1, "b": 3}},
         {"_id": 1, "a": 1, "b": 3}, {"$set": {"b": 3}}),
    case("empty-object-value", {"_id": 1, "a": {"b": 1}}, {"$set": {"a": {}}}, {"_id": 1, "a": {}},
         {"$set": {"a": {}}}),
    case("leading-zero-index", {"_id": 1, "a": [1, 2]}, {"$set": {"a.01": 7}}, {"_id": 1, "a": [1, 7]}),
    case("set-on-insert-like-set-when-inserting", {"_id": 1}, {"$setOnInsert": {"a": 1}}, {"_id": 1, "a": 1},
         {"$set": {"a": 1}}, is_upsert_insert=True),
]


@pytest.mark.parametrize(("doc", "update", "expected", "oplog", "kwargs"), SET_CASES)
def test_set(doc: Any, update: Any, expected: Any, oplog: Any, kwargs: Any) -> None:
    run_case(doc, update, expected, oplog, kwargs)


# -- $unset -------------------------------------------------------------------------
UNSET_CASES = [
    case("docs", {"_id": 1, "item": "chisel", "sku": "C001", "quantity": 4, "instock": True},
         {"$unset": {"quantity": "", "instock": ""}}, {"_id": 1, "item": "chisel", "sku": "C001"},
         {"$unset": {"instock": True, "quantity": True}}),
    case("missing-field-noop", {"_id": 1, "a": 1}, {"$unset": {"b": ""}}, UNCHANGED),
    case("embedded", {"_id": 1, "a": {"b": 1, "c": 2}}, {"$unset": {"a.b": 1}}, {"_id": 1, "a": {"c": 2}},
         {"$unset": {"a.b": True}}),
    case("whole-subdocument", {"_id": 1, "a": {"b": 1}, "c": 1}, {"$unset": {"a": 1}}, {"_id": 1, "c": 1},
         {"$unset": {"a": True}}),
    case("array-element-becomes-null", {"_id": 1, "a": [1, 2, 3]}, {"$unset": {"a.1": 1}},
         {"_id": 1, "a": [1, None, 3]}, {"$set": {"a.1": None}}),
    case("null-array-element-noop", {"_id": 1, "a": [1, None]}, {"$unset": {"a.1": 1}}, UNCHANGED),
    case("index-past-end-noop", {"_id": 1, "a": [1]}, {"$unset": {"a.5": 1}}, UNCHANGED),
    case("through-scalar-noop", {"_id": 1, "a": 5}, {"$unset": {"a.b": 1}}, UNCHANGED),
    case("no-implicit-array-traversal", {"_id": 1, "a": [{"b": 1}]}, {"$unset": {"a.b": 1}}, UNCHANGED),
    case("inside-array-element", {"_id": 1, "a": [{"b": 1, "c": 1}]}, {"$unset": {"a.0.b": 1}},
         {"_id": 1, "a": [{"c": 1}]}, {"$unset": {"a.0.b": True}}),
    case("all-elements", {"_id": 1, "a": [{"b": 1, "c": 1}, {"b": 2}]}, {"$unset": {"a.$[].b": 1}},
         {"_id": 1, "a": [{"c": 1}, {}]}, {"$set": {"a": [{"c": 1}, {}]}}),
    case("with-set", {"_id": 1, "a": 1, "b": 2}, {"$unset": {"a": 1}, "$set": {"c": 3}},
         {"_id": 1, "b": 2, "c": 3}, {"$set": {"c": 3}, "$unset": {"a": True}}),
    case("value-is-ignored", {"_id": 1, "a": 1}, {"$unset": {"a": False}}, {"_id": 1}, {"$unset": {"a": True}}),
    case("last-field", {"_id": 1, "a": 1}, {"$unset": {"a": 1}}, {"_id": 1}, {"$unset": {"a": True}}),
]


@pytest.mark.parametrize(("doc", "update", "expected", "oplog", "kwargs"), UNSET_CASES)
def test_unset(doc: Any, update: Any, expected: Any, oplog: Any, kwargs: Any) -> None:
    run_case(doc, update, expected, oplog, kwargs)


# -- $inc / $mul --------------------------------------------------------------------
INC_DOC = {"_id": 1, "sku": "abc123", "quantity": 10, "metrics": {"orders": 2, "ratings": 3.5}}

ARITHMETIC_CASES = [
    case("inc-docs", INC_DOC, {"$inc": {"quantity": -2, "metrics.orders": 1}},
         {"_id": 1, "sku": "abc123", "quantity": 8, "metrics": {"orders": 3, "ratings": 3.5}},
         {"$set": {"metrics.orders": 3, "quantity": 8}}),
    case("inc-counter-verbatim", {"_id": 1, "counter": 1}, {"$inc": {"counter": 1}}, {"_id": 1, "counter": 2},
         {"$set": {"counter": 2}}),
    case("inc-missing-creates", {"_id": 1}, {"$inc": {"a": 5}}, {"_id": 1, "a": 5}, {"$set": {"a": 5}}),
    case("inc-missing-long", {"_id": 1}, {"$inc": {"a": Int64(5)}}, {"_id": 1, "a": Int64(5)}),
    case("inc-missing-nested", {"_id": 1, "a": {}}, {"$inc": {"a.b": 1}}, {"_id": 1, "a": {"b": 1}},
         {"$set": {"a.b": 1}}),
    case("inc-int32-overflow-widens", {"_id": 1, "a": 2147483647}, {"$inc": {"a": 1}},
         {"_id": 1, "a": Int64(2147483648)}, {"$set": {"a": Int64(2147483648)}}),
    case("inc-int32-underflow-widens", {"_id": 1, "a": -2147483648}, {"$inc": {"a": -1}},
         {"_id": 1, "a": Int64(-2147483649)}),
    case("inc-long-plus-int", {"_id": 1, "a": Int64(5)}, {"$inc": {"a": 1}}, {"_id": 1, "a": Int64(6)}),
    case("inc-int-plus-long", {"_id": 1, "a": 5}, {"$inc": {"a": Int64(1)}}, {"_id": 1, "a": Int64(6)}),
    case("inc-int-plus-double", {"_id": 1, "a": 1}, {"$inc": {"a": 0.5}}, {"_id": 1, "a": 1.5}),
    case("inc-double-plus-int", {"_id": 1, "a": 1.5}, {"$inc": {"a": 1}}, {"_id": 1, "a": 2.5}),
    case("inc-decimal", {"_id": 1, "a": Decimal128("1.1")}, {"$inc": {"a": 1}}, {"_id": 1, "a": Decimal128("2.1")}),
    case("inc-int-by-decimal", {"_id": 1, "a": 2}, {"$inc": {"a": Decimal128("0.25")}},
         {"_id": 1, "a": Decimal128("2.25")}),
    case("inc-decimal-by-double", {"_id": 1, "a": Decimal128("1")}, {"$inc": {"a": 0.5}},
         {"_id": 1, "a": Decimal128("1.500000000000000")}),
    case("inc-zero-noop", {"_id": 1, "a": 5}, {"$inc": {"a": 0}}, UNCHANGED),
    case("inc-double-zero-changes-type", {"_id": 1, "a": 5}, {"$inc": {"a": 0.0}}, {"_id": 1, "a": 5.0}),
    case("inc-array-element", {"_id": 1, "a": [1, 2]}, {"$inc": {"a.1": 1}}, {"_id": 1, "a": [1, 3]},
         {"$set": {"a.1": 3}}),
    case("inc-several", {"_id": 1, "a": 1, "b": 1}, {"$inc": {"a": 1, "b": -1, "c": 2}},
         {"_id": 1, "a": 2, "b": 0, "c": 2}, {"$set": {"a": 2, "b": 0, "c": 2}}),
    case("mul-docs", {"_id": 1, "item": "Hats", "price": Decimal128("10.99"), "quantity": 25},
         {"$mul": {"price": Decimal128("1.25"), "quantity": 2}},
         {"_id": 1, "item": "Hats", "price": Decimal128("13.7375"), "quantity": 50},
         {"$set": {"price": Decimal128("13.7375"), "quantity": 50}}),
    case("mul-docs-missing-field", {"_id": 2, "item": "Unknown"}, {"$mul": {"price": Int64(100)}},
         {"_id": 2, "item": "Unknown", "price": Int64(0)}, {"$set": {"price": Int64(0)}}),
    case("mul-docs-mixed-types", {"_id": 3, "item": "Scarf", "price": Int64(10)}, {"$mul": {"price": 5}},
         {"_id": 3, "item": "Scarf", "price": Int64(50)}),
    case("mul-int-by-double", {"_id": 1, "a": 3}, {"$mul": {"a": 1.5}}, {"_id": 1, "a": 4.5}),
    case("mul-missing-double", {"_id": 1}, {"$mul": {"a": 2.5}}, {"_id": 1, "a": 0.0}),
    case("mul-missing-negative-double", {"_id": 1}, {"$mul": {"a": -2.5}}, {"_id": 1, "a": -0.0}),
    case("mul-missing-int", {"_id": 1}, {"$mul": {"a": 7}}, {"_id": 1, "a": 0}),
    case("mul-by-one-noop", {"_id": 1, "a": 7}, {"$mul": {"a": 1}}, UNCHANGED),
    case("mul-int32-overflow-widens", {"_id": 1, "a": 65536}, {"$mul": {"a": 65536}},
         {"_id": 1, "a": Int64(4294967296)}),
    case("mul-nested", {"_id": 1, "a": {"b": 2}}, {"$mul": {"a.b": 3}}, {"_id": 1, "a": {"b": 6}},
         {"$set": {"a.b": 6}}),
]


@pytest.mark.parametrize(("doc", "update", "expected", "oplog", "kwargs"), ARITHMETIC_CASES)
def test_arithmetic(doc: Any, update: Any, expected: Any, oplog: Any, kwargs: Any) -> None:
    run_case(doc, update, expected, oplog, kwargs)


# -- $min / $max --------------------------------------------------------------------
SCORES = {"_id": 1, "highScore": 800, "lowScore": 200}
TAGS = {"_id": 1, "desc": "crafts", "dateEntered": datetime.datetime(2013, 10, 1, 5),
        "dateExpired": datetime.datetime(2013, 10, 1, 16, 38, 16)}

MIN_MAX_CASES = [
    case("min-docs-lower", SCORES, {"$min": {"lowScore": 150}}, {**SCORES, "lowScore": 150},
         {"$set": {"lowScore": 150}}),
    case("min-docs-higher-noop", SCORES, {"$min": {"lowScore": 250}}, UNCHANGED),
    case("max-docs-higher", SCORES, {"$max": {"highScore": 950}}, {**SCORES, "highScore": 950},
         {"$set": {"highScore": 950}}),
    case("max-docs-lower-noop", {**SCORES, "highScore": 950}, {"$max": {"highScore": 870}}, UNCHANGED),
    case("dates-docs", TAGS,
         {"$min": {"dateEntered": datetime.datetime(2013, 9, 25)},
          "$max": {"dateExpired": datetime.datetime(2013, 10, 1, 16, 38, 16)}},
         {**TAGS, "dateEntered": datetime.datetime(2013, 9, 25)},
         {"$set": {"dateEntered": datetime.datetime(2013, 9, 25)}}),
    case("min-missing-sets", {"_id": 1}, {"$min": {"a": 3}}, {"_id": 1, "a": 3}, {"$set": {"a": 3}}),
    case("max-missing-sets", {"_id": 1}, {"$max": {"a": 3}}, {"_id": 1, "a": 3}, {"$set": {"a": 3}}),
    case("max-equal-keeps-type", {"_id": 1, "a": 1}, {"$max": {"a": 1.0}}, UNCHANGED),
    case("min-equal-keeps-type", {"_id": 1, "a": Int64(1)}, {"$min": {"a": 1}}, UNCHANGED),
    case("min-number-below-string", {"_id": 1, "a": 1}, {"$min": {"a": "x"}}, UNCHANGED),
    case("max-string-above-number", {"_id": 1, "a": 1}, {"$max": {"a": "x"}}, {"_id": 1, "a": "x"}),
    case("min-null-below-number", {"_id": 1, "a": 1}, {"$min": {"a": None}}, {"_id": 1, "a": None}),
    case("max-double-over-int", {"_id": 1, "a": 1}, {"$max": {"a": 1.5}}, {"_id": 1, "a": 1.5}),
    case("max-nested", {"_id": 1, "a": {"b": 1}}, {"$max": {"a.b": 2}}, {"_id": 1, "a": {"b": 2}},
         {"$set": {"a.b": 2}}),
    case("min-array-element", {"_id": 1, "a": [5, 6]}, {"$min": {"a.1": 1}}, {"_id": 1, "a": [5, 1]},
         {"$set": {"a.1": 1}}),
    case("max-documents-compared", {"_id": 1, "a": {"x": 1}}, {"$max": {"a": {"x": 2}}},
         {"_id": 1, "a": {"x": 2}}),
]


@pytest.mark.parametrize(("doc", "update", "expected", "oplog", "kwargs"), MIN_MAX_CASES)
def test_min_max(doc: Any, update: Any, expected: Any, oplog: Any, kwargs: Any) -> None:
    run_case(doc, update, expected, oplog, kwargs)


# -- $rename ------------------------------------------------------------------------
STUDENT = {"_id": 1, "alias": ["The American Cincinnatus", "The American Fabius"], "mobile": "555-555-5555",
           "nmae": {"first": "george", "last": "washington"}}

RENAME_CASES = [
    case("docs-rename-field", STUDENT, {"$rename": {"nmae": "name"}},
         {"_id": 1, "alias": STUDENT["alias"], "mobile": "555-555-5555",
          "name": {"first": "george", "last": "washington"}},
         {"$set": {"name": {"first": "george", "last": "washington"}}, "$unset": {"nmae": True}}),
    case("docs-embedded", {"_id": 1, "name": {"first": "george", "last": "washington"}},
         {"$rename": {"name.first": "name.fname"}}, {"_id": 1, "name": {"last": "washington", "fname": "george"}},
         {"$set": {"name.fname": "george"}, "$unset": {"name.first": True}}),
    case("docs-missing-noop", STUDENT, {"$rename": {"wife": "spouse"}}, UNCHANGED),
    case("overwrite-existing-in-place", {"_id": 1, "a": 1, "b": 2, "c": 3}, {"$rename": {"a": "b"}},
         {"_id": 1, "b": 1, "c": 3}, {"$set": {"b": 1}, "$unset": {"a": True}}),
    case("overwrite-earlier-field", {"_id": 1, "a": 1, "b": 2}, {"$rename": {"b": "a"}}, {"_id": 1, "a": 2},
         {"$set": {"a": 2}, "$unset": {"b": True}}),
    case("into-new-subdocument", {"_id": 1, "a": 1}, {"$rename": {"a": "x.y"}}, {"_id": 1, "x": {"y": 1}},
         {"$set": {"x.y": 1}, "$unset": {"a": True}}),
    case("out-of-subdocument", {"_id": 1, "a": {"b": 1, "d": 2}}, {"$rename": {"a.b": "c"}},
         {"_id": 1, "a": {"d": 2}, "c": 1}, {"$set": {"c": 1}, "$unset": {"a.b": True}}),
    case("with-other-new-fields-sorted", {"_id": 1, "a": 1}, {"$rename": {"a": "z"}, "$set": {"m": 1}},
         {"_id": 1, "m": 1, "z": 1}, {"$set": {"m": 1, "z": 1}, "$unset": {"a": True}}),
    case("array-value", {"_id": 1, "a": [1, 2]}, {"$rename": {"a": "b"}}, {"_id": 1, "b": [1, 2]},
         {"$set": {"b": [1, 2]}, "$unset": {"a": True}}),
    case("two-renames", {"_id": 1, "a": 1, "b": 2}, {"$rename": {"a": "c", "b": "d"}}, {"_id": 1, "c": 1, "d": 2},
         {"$set": {"c": 1, "d": 2}, "$unset": {"a": True, "b": True}}),
    case("missing-parent-noop", {"_id": 1}, {"$rename": {"a.b": "c"}}, UNCHANGED),
    case("missing-in-subdocument-noop", {"_id": 1, "a": {}}, {"$rename": {"a.b": "c"}}, UNCHANGED),
]


@pytest.mark.parametrize(("doc", "update", "expected", "oplog", "kwargs"), RENAME_CASES)
def test_rename(doc: Any, update: Any, expected: Any, oplog: Any, kwargs: Any) -> None:
    run_case(doc, update, expected, oplog, kwargs)


# -- $currentDate / $setOnInsert ----------------------------------------------------
CUSTOMER = {"_id": 1, "status": "a", "lastModified": datetime.datetime(2013, 10, 2, 1, 11, 18, 965000)}

DATE_AND_INSERT_CASES = [
    case("current-date-docs", CUSTOMER,
         {"$currentDate": {"lastModified": True, "cancellation.date": {"$type": "timestamp"}},
          "$set": {"cancellation.reason": "user request", "status": "D"}},
         {"_id": 1, "status": "D", "lastModified": NOW,
          "cancellation": {"date": NOW_TS, "reason": "user request"}},
         {"$set": {"cancellation.date": NOW_TS, "cancellation.reason": "user request", "lastModified": NOW,
                   "status": "D"}}),
    case("current-date-type-date", {"_id": 1}, {"$currentDate": {"d": {"$type": "date"}}}, {"_id": 1, "d": NOW},
         {"$set": {"d": NOW}}),
    case("current-date-false-is-still-a-date", {"_id": 1}, {"$currentDate": {"d": False}}, {"_id": 1, "d": NOW}),
    case("current-date-replaces-other-type", {"_id": 1, "d": 5}, {"$currentDate": {"d": True}},
         {"_id": 1, "d": NOW}),
    case("current-date-same-value-noop", {"_id": 1, "d": NOW}, {"$currentDate": {"d": True}}, UNCHANGED),
    case("current-date-nested-timestamp", {"_id": 1, "a": {"b": 1}},
         {"$currentDate": {"a.t": {"$type": "timestamp"}}}, {"_id": 1, "a": {"b": 1, "t": NOW_TS}}),
    case("set-on-insert-docs", {"_id": 1}, {"$set": {"item": "apple"}, "$setOnInsert": {"defaultQty": 100}},
         {"_id": 1, "defaultQty": 100, "item": "apple"}, is_upsert_insert=True),
    case("set-on-insert-ignored-on-update", {"_id": 1, "item": "pear"},
         {"$set": {"item": "apple"}, "$setOnInsert": {"defaultQty": 100}}, {"_id": 1, "item": "apple"},
         {"$set": {"item": "apple"}}),
    case("set-on-insert-only-noop-on-update", {"_id": 1}, {"$setOnInsert": {"a": 1}}, UNCHANGED),
    case("set-on-insert-nested", {"_id": 1}, {"$setOnInsert": {"a.b": 1}}, {"_id": 1, "a": {"b": 1}},
         is_upsert_insert=True),
    case("upsert-id-moved-first", {"a": 1}, {"$set": {"_id": 5}}, {"_id": 5, "a": 1}, {"_id": 5, "a": 1},
         is_upsert_insert=True),
    case("upsert-may-set-id-when-seed-has-none", {}, {"$set": {"_id": 7, "b": 1}}, {"_id": 7, "b": 1},
         is_upsert_insert=True),
]


@pytest.mark.parametrize(("doc", "update", "expected", "oplog", "kwargs"), DATE_AND_INSERT_CASES)
def test_current_date_and_set_on_insert(doc: Any, update: Any, expected: Any, oplog: Any, kwargs: Any) -> None:
    run_case(doc, update, expected, oplog, kwargs)


def test_current_date_truncates_to_milliseconds() -> None:
    now = datetime.datetime(2024, 1, 1, 0, 0, 0, 999999)
    out = apply_update({"_id": 1}, {"$currentDate": {"d": True}}, now=now)
    assert out.document["d"] == datetime.datetime(2024, 1, 1, 0, 0, 0, 999000)


def test_current_date_timestamp_of_aware_now() -> None:
    now = datetime.datetime(2024, 1, 1, 1, 0, 0, tzinfo=datetime.timezone(datetime.timedelta(hours=1)))
    out = apply_update({"_id": 1}, {"$currentDate": {"t": {"$type": "timestamp"}}}, now=now)
    assert out.document["t"] == Timestamp(calendar.timegm((2024, 1, 1, 0, 0, 0)), 1)


# -- $push --------------------------------------------------------------------------
QUIZZES = [{"wk": 1, "score": 10}, {"wk": 2, "score": 8}, {"wk": 3, "score": 5}, {"wk": 4, "score": 6}]

PUSH_CASES = [
    case("docs-append", {"_id": 1, "scores": [44, 78, 38, 80]}, {"$push": {"scores": 89}},
         {"_id": 1, "scores": [44, 78, 38, 80, 89]}, {"$set": {"scores": [44, 78, 38, 80, 89]}}),
    case("docs-each", {"_id": 1, "scores": [44]}, {"$push": {"scores": {"$each": [90, 92, 85]}}},
         {"_id": 1, "scores": [44, 90, 92, 85]}),
    case("docs-each-sort-slice", {"_id": 5, "quizzes": QUIZZES},
         {"$push": {"quizzes": {"$each": [{"wk": 5, "score": 8}, {"wk": 6, "score": 7}, {"wk": 7, "score": 6}],
                                "$sort": {"score": -1}, "$slice": 3}}},
         {"_id": 5, "quizzes": [{"wk": 1, "score": 10}, {"wk": 2, "score": 8}, {"wk": 5, "score": 8}]}),
    case("docs-position-0", {"_id": 1, "scores": [100]}, {"$push": {"scores": {"$each": [50, 60, 70], "$position": 0}}},
         {"_id": 1, "scores": [50, 60, 70, 100]}),
    case("docs-position-2", {"_id": 1, "scores": [50, 60, 70, 100]},
         {"$push": {"scores": {"$each": [20, 30], "$position": 2}}}, {"_id": 1, "scores": [50, 60, 20, 30, 70, 100]}),
    case("docs-position-negative", {"_id": 1, "scores": [50, 60, 20, 30, 70, 100]},
         {"$push": {"scores": {"$each": [90, 80], "$position": -2}}},
         {"_id": 1, "scores": [50, 60, 20, 30, 90, 80, 70, 100]}),
    case("position-beyond-end-appends", {"_id": 1, "a": [1, 2]}, {"$push": {"a": {"$each": [3], "$position": 10}}},
         {"_id": 1, "a": [1, 2, 3]}),
    case("position-equal-size-appends", {"_id": 1, "a": [1, 2]}, {"$push": {"a": {"$each": [3], "$position": 2}}},
         {"_id": 1, "a": [1, 2, 3]}),
    case("negative-position-beyond-front", {"_id": 1, "a": [1, 2]}, {"$push": {"a": {"$each": [0], "$position": -5}}},
         {"_id": 1, "a": [0, 1, 2]}),
    case("docs-slice-last-five", {"_id": 1, "scores": [40, 50, 60]},
         {"$push": {"scores": {"$each": [80, 78, 86], "$slice": -5}}}, {"_id": 1, "scores": [50, 60, 80, 78, 86]}),
    case("docs-slice-first-three", {"_id": 2, "scores": [89, 90]}, {"$push": {"scores": {"$each": [100, 20], "$slice": 3}}},
         {"_id": 2, "scores": [89, 90, 100]}),
    case("docs-slice-only", {"_id": 3, "scores": [89, 70, 100, 20]}, {"$push": {"scores": {"$each": [], "$slice": -3}}},
         {"_id": 3, "scores": [70, 100, 20]}),
    case("slice-zero-empties", {"_id": 1, "a": [1, 2]}, {"$push": {"a": {"$each": [3], "$slice": 0}}},
         {"_id": 1, "a": []}),
    case("slice-no-trim-noop", {"_id": 1, "a": [1, 2]}, {"$push": {"a": {"$each": [], "$slice": 5}}}, UNCHANGED),
    case("docs-sort-embedded", {"_id": 1, "quizzes": [{"id": 1, "score": 6}, {"id": 2, "score": 9}]},
         {"$push": {"quizzes": {"$each": [{"id": 3, "score": 8}, {"id": 4, "score": 7}, {"id": 5, "score": 6}],
                                "$sort": {"score": 1}}}},
         {"_id": 1, "quizzes": [{"id": 1, "score": 6}, {"id": 5, "score": 6}, {"id": 4, "score": 7},
                                {"id": 3, "score": 8}, {"id": 2, "score": 9}]}),
    case("docs-sort-values", {"_id": 2, "tests": [89, 70, 89, 50]}, {"$push": {"tests": {"$each": [40, 60], "$sort": 1}}},
         {"_id": 2, "tests": [40, 50, 60, 70, 89, 89]}),
    case("docs-sort-only", {"_id": 3, "tests": [89, 70, 100, 20]}, {"$push": {"tests": {"$each": [], "$sort": -1}}},
         {"_id": 3, "tests": [100, 89, 70, 20]}),
    case("sort-dotted-field", {"_id": 1, "a": [{"g": {"s": 2}}, {"g": {"s": 1}}]},
         {"$push": {"a": {"$each": [{"g": {"s": 0}}], "$sort": {"g.s": 1}}}},
         {"_id": 1, "a": [{"g": {"s": 0}}, {"g": {"s": 1}}, {"g": {"s": 2}}]}),
    case("sort-fields-non-documents-are-null", {"_id": 1, "a": [{"x": 2}, 5, {"x": 1}]},
         {"$push": {"a": {"$each": [], "$sort": {"x": 1}}}}, {"_id": 1, "a": [5, {"x": 1}, {"x": 2}]}),
    case("sort-mixed-types", {"_id": 1, "a": ["b", 1, None, {"x": 1}]}, {"$push": {"a": {"$each": [], "$sort": 1}}},
         {"_id": 1, "a": [None, 1, "b", {"x": 1}]}),
    case("sort-and-position-sort-wins", {"_id": 1, "a": [3, 1]},
         {"$push": {"a": {"$each": [2], "$position": 0, "$sort": 1}}}, {"_id": 1, "a": [1, 2, 3]}),
    case("missing-creates-array", {"_id": 1}, {"$push": {"a": 1}}, {"_id": 1, "a": [1]}, {"$set": {"a": [1]}}),
    case("missing-with-modifiers", {"_id": 1}, {"$push": {"a": {"$each": [3, 1, 2], "$sort": 1, "$slice": 2}}},
         {"_id": 1, "a": [1, 2]}, {"$set": {"a": [1, 2]}}),
    case("push-document", {"_id": 1, "a": []}, {"$push": {"a": {"b": 1}}}, {"_id": 1, "a": [{"b": 1}]}),
    case("push-array-as-one-element", {"_id": 1, "a": [0]}, {"$push": {"a": [1, 2]}}, {"_id": 1, "a": [0, [1, 2]]}),
    case("push-each-empty-noop", {"_id": 1, "a": [1]}, {"$push": {"a": {"$each": []}}}, UNCHANGED),
    case("push-into-nested-array", {"_id": 1, "a": [[]]}, {"$push": {"a.0": 1}}, {"_id": 1, "a": [[1]]},
         {"$set": {"a.0": [1]}}),
    case("push-into-embedded", {"_id": 1, "a": {"b": [1]}}, {"$push": {"a.b": 2}}, {"_id": 1, "a": {"b": [1, 2]}},
         {"$set": {"a.b": [1, 2]}}),
    case("push-missing-embedded", {"_id": 1, "a": {}}, {"$push": {"a.b": 2}}, {"_id": 1, "a": {"b": [2]}},
         {"$set": {"a.b": [2]}}),
    case("push-duplicates-allowed", {"_id": 1, "a": [1]}, {"$push": {"a": 1}}, {"_id": 1, "a": [1, 1]}),
    case("push-each-with-$-keyed-document", {"_id": 1, "a": []}, {"$push": {"a": {"$each": [{"$x": 1}]}}},
         {"_id": 1, "a": [{"$x": 1}]}),
]


@pytest.mark.parametrize(("doc", "update", "expected", "oplog", "kwargs"), PUSH_CASES)
def test_push(doc: Any, update: Any, expected: Any, oplog: Any, kwargs: Any) -> None:
    run_case(doc, update, expected, oplog, kwargs)


# -- $addToSet / $pop / $pullAll / $pull / $bit -------------------------------------
INVENTORY = {"_id": 1, "item": "polarizing_filter", "tags": ["electronics", "camera"]}
STORES = {"_id": 1, "fruits": ["apples", "pears", "oranges", "grapes", "bananas"],
          "vegetables": ["carrots", "celery", "squash", "carrots"]}
SURVEY = {"_id": 1, "results": [{"item": "A", "score": 5, "answers": [{"q": 1, "a": 4}, {"q": 2, "a": 6}]},
                                {"item": "B", "score": 8, "answers": [{"q": 1, "a": 8}, {"q": 2, "a": 9}]}]}

ARRAY_CASES = [
    case("add-to-set-docs", INVENTORY, {"$addToSet": {"tags": "accessories"}},
         {**INVENTORY, "tags": ["electronics", "camera", "accessories"]},
         {"$set": {"tags": ["electronics", "camera", "accessories"]}}),
    case("add-to-set-docs-present-noop", INVENTORY, {"$addToSet": {"tags": "camera"}}, UNCHANGED),
    case("add-to-set-docs-each", {"_id": 2, "item": "cable", "tags": ["electronics", "supplies"]},
         {"$addToSet": {"tags": {"$each": ["camera", "electronics", "accessories"]}}},
         {"_id": 2, "item": "cable", "tags": ["electronics", "supplies", "camera", "accessories"]}),
    case("add-to-set-docs-array-value", {"_id": 1, "letters": ["a", "b"]}, {"$addToSet": {"letters": ["c", "d"]}},
         {"_id": 1, "letters": ["a", "b", ["c", "d"]]}),
    case("add-to-set-missing-creates", {"_id": 1}, {"$addToSet": {"a": 1}}, {"_id": 1, "a": [1]},
         {"$set": {"a": [1]}}),
    case("add-to-set-each-dedups", {"_id": 1, "a": []}, {"$addToSet": {"a": {"$each": [1, 1, 2, 1.0]}}},
         {"_id": 1, "a": [1, 2]}),
    case("add-to-set-missing-each-dedups", {"_id": 1}, {"$addToSet": {"a": {"$each": [2, 2, 3]}}},
         {"_id": 1, "a": [2, 3]}),
    case("add-to-set-numeric-equality", {"_id": 1, "a": [1]}, {"$addToSet": {"a": 1.0}}, UNCHANGED),
    case("add-to-set-document-field-order-counts", {"_id": 1, "a": [{"x": 1, "y": 1}]},
         {"$addToSet": {"a": {"y": 1, "x": 1}}}, {"_id": 1, "a": [{"x": 1, "y": 1}, {"y": 1, "x": 1}]}),
    case("add-to-set-equal-document-noop", {"_id": 1, "a": [{"x": 1, "y": 1}]},
         {"$addToSet": {"a": {"x": 1, "y": 1}}}, UNCHANGED),
    case("add-to-set-each-empty-noop", {"_id": 1, "a": [1]}, {"$addToSet": {"a": {"$each": []}}}, UNCHANGED),
    case("add-to-set-object-not-each", {"_id": 1, "a": []}, {"$addToSet": {"a": {"b": 1, "$each": [1]}}},
         {"_id": 1, "a": [{"b": 1, "$each": [1]}]}),
    case("pop-docs-first", {"_id": 1, "scores": [8, 9, 10]}, {"$pop": {"scores": -1}}, {"_id": 1, "scores": [9, 10]},
         {"$set": {"scores": [9, 10]}}),
    case("pop-docs-last", {"_id": 10, "scores": [9, 10]}, {"$pop": {"scores": 1}}, {"_id": 10, "scores": [9]}),
    case("pop-double-argument", {"_id": 1, "a": [1, 2]}, {"$pop": {"a": -1.0}}, {"_id": 1, "a": [2]}),
    case("pop-to-empty", {"_id": 1, "a": [1]}, {"$pop": {"a": 1}}, {"_id": 1, "a": []}, {"$set": {"a": []}}),
    case("pop-empty-noop", {"_id": 1, "a": []}, {"$pop": {"a": 1}}, UNCHANGED),
    case("pop-missing-noop", {"_id": 1}, {"$pop": {"a": 1}}, UNCHANGED),
    case("pop-missing-nested-noop", {"_id": 1, "a": {}}, {"$pop": {"a.b.c": 1}}, UNCHANGED),
    case("pop-missing-index-noop", {"_id": 1, "a": [{"b": [1]}]}, {"$pop": {"a.3.b": 1}}, UNCHANGED),
    case("pop-embedded", {"_id": 1, "a": {"b": [1, 2]}}, {"$pop": {"a.b": 1}}, {"_id": 1, "a": {"b": [1]}},
         {"$set": {"a.b": [1]}}),
    case("pull-all-docs", {"_id": 1, "scores": [0, 2, 5, 5, 1, 0]}, {"$pullAll": {"scores": [0, 5]}},
         {"_id": 1, "scores": [2, 1]}, {"$set": {"scores": [2, 1]}}),
    case("pull-all-none-noop", {"_id": 1, "a": [1]}, {"$pullAll": {"a": [2]}}, UNCHANGED),
    case("pull-all-missing-noop", {"_id": 1}, {"$pullAll": {"a": [2]}}, UNCHANGED),
    case("pull-all-documents", {"_id": 1, "a": [{"x": 1}, {"x": 2}]}, {"$pullAll": {"a": [{"x": 1}]}},
         {"_id": 1, "a": [{"x": 2}]}),
    case("pull-value", {"_id": 1, "a": [1, 2, 1, 3]}, {"$pull": {"a": 1}}, {"_id": 1, "a": [2, 3]},
         {"$set": {"a": [2, 3]}}),
    case("pull-numeric-equality", {"_id": 1, "a": [1, 1.0, Int64(1), 2]}, {"$pull": {"a": 1}}, {"_id": 1, "a": [2]}),
    case("pull-array-value-exact", {"_id": 1, "a": [[1, 2], 1, [2, 1]]}, {"$pull": {"a": [1, 2]}},
         {"_id": 1, "a": [1, [2, 1]]}),
    case("pull-nothing-noop", {"_id": 1, "a": [1]}, {"$pull": {"a": 5}}, UNCHANGED),
    case("pull-missing-noop", {"_id": 1}, {"$pull": {"a": 5}}, UNCHANGED),
    case("pull-empty-document-removes-documents", {"_id": 1, "a": [{"x": 1}, 2, {}]}, {"$pull": {"a": {}}},
         {"_id": 1, "a": [2]}),
    case("pull-all-elements", {"_id": 1, "a": [[1, 2], [2, 3]]}, {"$pull": {"a.$[]": 2}},
         {"_id": 1, "a": [[1], [3]]}, {"$set": {"a": [[1], [3]]}}),
    case("bit-docs-and", {"_id": 1, "expdata": 13}, {"$bit": {"expdata": {"and": 10}}}, {"_id": 1, "expdata": 8},
         {"$set": {"expdata": 8}}),
    case("bit-docs-or", {"_id": 2, "expdata": 3}, {"$bit": {"expdata": {"or": 5}}}, {"_id": 2, "expdata": 7}),
    case("bit-docs-xor", {"_id": 3, "expdata": 1}, {"$bit": {"expdata": {"xor": 5}}}, {"_id": 3, "expdata": 4}),
    case("bit-long", {"_id": 1, "a": Int64(12)}, {"$bit": {"a": {"or": 1}}}, {"_id": 1, "a": Int64(13)}),
    case("bit-int-with-long", {"_id": 1, "a": 12}, {"$bit": {"a": {"and": Int64(4)}}}, {"_id": 1, "a": Int64(4)}),
    case("bit-several-ops", {"_id": 1, "a": 12}, {"$bit": {"a": {"and": 6, "or": 1}}}, {"_id": 1, "a": 5}),
    case("bit-noop", {"_id": 1, "a": 12}, {"$bit": {"a": {"or": 4}}}, UNCHANGED),
    case("bit-missing-or", {"_id": 1}, {"$bit": {"a": {"or": 5}}}, {"_id": 1, "a": 5}),
    case("bit-missing-and", {"_id": 1}, {"$bit": {"a": {"and": 5}}}, {"_id": 1, "a": 0}),
]


@pytest.mark.parametrize(("doc", "update", "expected", "oplog", "kwargs"), ARRAY_CASES)
def test_array_operators(doc: Any, update: Any, expected: Any, oplog: Any, kwargs: Any) -> None:
    run_case(doc, update, expected, oplog, kwargs)


PULL_CONDITION_CASES = [
    case("docs-in-and-value", STORES, {"$pull": {"fruits": {"$in": ["apples", "oranges"]}, "vegetables": "carrots"}},
         {"_id": 1, "fruits": ["pears", "grapes", "bananas"], "vegetables": ["celery", "squash"]},
         {"$set": {"fruits": ["pears", "grapes", "bananas"], "vegetables": ["celery", "squash"]}}),
    case("docs-gte", {"_id": 1, "votes": [3, 5, 6, 7, 7, 8]}, {"$pull": {"votes": {"$gte": 6}}},
         {"_id": 1, "votes": [3, 5]}),
    case("docs-document-condition", {"_id": 1, "results": [{"item": "A", "score": 5}, {"item": "B", "score": 8}]},
         {"$pull": {"results": {"score": 8, "item": "B"}}}, {"_id": 1, "results": [{"item": "A", "score": 5}]}),
    case("docs-elem-match", SURVEY, {"$pull": {"results": {"answers": {"$elemMatch": {"q": 2, "a": {"$gte": 8}}}}}},
         {"_id": 1, "results": [SURVEY["results"][0]]}),
    case("docs-all-positional", SURVEY, {"$pull": {"results.$[].answers": {"q": 2, "a": {"$gte": 8}}}},
         {"_id": 1, "results": [SURVEY["results"][0],
                                {"item": "B", "score": 8, "answers": [{"q": 1, "a": 8}]}]},
         {"$set": {"results.1.answers": [{"q": 1, "a": 8}]}}),
    case("condition-matches-nothing-noop", {"_id": 1, "a": [1, 2]}, {"$pull": {"a": {"$gt": 5}}}, UNCHANGED),
    case("document-condition-skips-scalars", {"_id": 1, "a": [1, {"b": 1}, {"b": 2}]}, {"$pull": {"a": {"b": 1}}},
         {"_id": 1, "a": [1, {"b": 2}]}),
    case("document-condition-partial-match", {"_id": 1, "a": [{"b": 1, "c": 2}, {"b": 2}]}, {"$pull": {"a": {"b": 1}}},
         {"_id": 1, "a": [{"b": 2}]}),
    case("regex", {"_id": 1, "a": ["apple", "banana", "avocado", 5]}, {"$pull": {"a": Regex("^a")}},
         {"_id": 1, "a": ["banana", 5]}),
    case("nin", {"_id": 1, "a": [1, 2, 3]}, {"$pull": {"a": {"$nin": [2]}}}, {"_id": 1, "a": [2]}),
    case("or-on-documents", {"_id": 1, "a": [{"x": 1}, {"x": 2}, {"x": 3}]},
         {"$pull": {"a": {"$or": [{"x": 1}, {"x": 3}]}}}, {"_id": 1, "a": [{"x": 2}]}),
    case("array-filter-then-pull", {"_id": 1, "a": [{"k": 1, "v": [1, 2]}, {"k": 2, "v": [1, 2]}]},
         {"$pull": {"a.$[e].v": 1}}, {"_id": 1, "a": [{"k": 1, "v": [2]}, {"k": 2, "v": [1, 2]}]},
         {"$set": {"a.0.v": [2]}}, array_filters=[{"e.k": 1}]),
]


@needs_query
@pytest.mark.parametrize(("doc", "update", "expected", "oplog", "kwargs"), PULL_CONDITION_CASES)
def test_pull_with_condition(doc: Any, update: Any, expected: Any, oplog: Any, kwargs: Any) -> None:
    run_case(doc, update, expected, oplog, kwargs)


# -- positional $, $[] and $[<identifier>] ------------------------------------------
GRADES_DOCS = {"_id": 4, "grades": [{"grade": 80, "mean": 75, "std": 8}, {"grade": 85, "mean": 90, "std": 5},
                                    {"grade": 85, "mean": 85, "std": 8}]}
QUESTIONS = {"_id": 1, "grades": [{"type": "quiz", "questions": [10, 8, 5]},
                                  {"type": "quiz", "questions": [8, 9, 6]},
                                  {"type": "hw", "questions": [5, 4, 3]},
                                  {"type": "exam", "questions": [25, 10, 23, 0]}]}

POSITIONAL_CASES = [
    case("docs-positional", {"_id": 1, "grades": [85, 80, 80]}, {"$set": {"grades.$": 82}},
         {"_id": 1, "grades": [85, 82, 80]}, {"$set": {"grades.1": 82}}, match_index=1),
    case("docs-positional-embedded", GRADES_DOCS, {"$set": {"grades.$.std": 6}},
         {"_id": 4, "grades": [GRADES_DOCS["grades"][0], {"grade": 85, "mean": 90, "std": 6},
                               GRADES_DOCS["grades"][2]]},
         {"$set": {"grades.1.std": 6}}, match_index=1),
    case("positional-inc", {"_id": 1, "a": [1, 2, 3]}, {"$inc": {"a.$": 10}}, {"_id": 1, "a": [1, 2, 13]},
         {"$set": {"a.2": 13}}, match_index=2),
    case("positional-unset-nulls", {"_id": 1, "a": [1, 2]}, {"$unset": {"a.$": 1}}, {"_id": 1, "a": [None, 2]},
         {"$set": {"a.0": None}}, match_index=0),
    case("positional-push", {"_id": 1, "a": [{"t": []}, {"t": [1]}]}, {"$push": {"a.$.t": 2}},
         {"_id": 1, "a": [{"t": []}, {"t": [1, 2]}]}, {"$set": {"a.1.t": [1, 2]}}, match_index=1),
    case("positional-merged-with-index", {"_id": 1, "a": [{}, {}]}, {"$set": {"a.$.x": 1, "a.1.y": 2}},
         {"_id": 1, "a": [{}, {"x": 1, "y": 2}]}, {"$set": {"a.1.x": 1, "a.1.y": 2}}, match_index=1),
    case("positional-beside-other-index", {"_id": 1, "a": [0, 0, 0]}, {"$set": {"a.$": 1, "a.2": 2}},
         {"_id": 1, "a": [1, 0, 2]}, match_index=0),
    case("positional-same-value-noop", {"_id": 1, "a": [5]}, {"$set": {"a.$": 5}}, UNCHANGED, match_index=0),
    case("positional-setOnInsert-ignored", {"_id": 1, "a": [5]}, {"$setOnInsert": {"a.$": 6}}, UNCHANGED,
         match_index=0),
    case("docs-all-elements", {"_id": 1, "grades": [85, 82, 80]}, {"$inc": {"grades.$[]": 10}},
         {"_id": 1, "grades": [95, 92, 90]}, {"$set": {"grades": [95, 92, 90]}}),
    case("docs-all-elements-embedded", GRADES_DOCS, {"$inc": {"grades.$[].std": -2}},
         {"_id": 4, "grades": [{"grade": 80, "mean": 75, "std": 6}, {"grade": 85, "mean": 90, "std": 3},
                               {"grade": 85, "mean": 85, "std": 6}]},
         {"$set": {"grades": [{"grade": 80, "mean": 75, "std": 6}, {"grade": 85, "mean": 90, "std": 3},
                              {"grade": 85, "mean": 85, "std": 6}]}}),
    case("all-elements-one-changes", {"_id": 1, "a": [5, 1]}, {"$set": {"a.$[]": 5}}, {"_id": 1, "a": [5, 5]},
         {"$set": {"a.1": 5}}),
    case("all-elements-empty-array-noop", {"_id": 1, "a": []}, {"$set": {"a.$[]": 5}}, UNCHANGED),
    case("all-elements-create-field", {"_id": 1, "a": [{}, {"b": 0}]}, {"$set": {"a.$[].b": 1}},
         {"_id": 1, "a": [{"b": 1}, {"b": 1}]}, {"$set": {"a": [{"b": 1}, {"b": 1}]}}),
    case("all-elements-nested-arrays", {"_id": 1, "a": [[1, 2], [3]]}, {"$inc": {"a.$[].$[]": 1}},
         {"_id": 1, "a": [[2, 3], [4]]}, {"$set": {"a": [[2, 3], [4]]}}),
    case("all-elements-two-fields", {"_id": 1, "a": [{"x": 0}, {"x": 0}]}, {"$set": {"a.$[].y": 1, "a.$[].x": 2}},
         {"_id": 1, "a": [{"x": 2, "y": 1}, {"x": 2, "y": 1}]}),
]

FILTERED_CASES = [
    case("docs-identifier", {"_id": 2, "grades": [98, 100, 102]}, {"$set": {"grades.$[element]": 100}},
         {"_id": 2, "grades": [98, 100, 100]}, {"$set": {"grades.2": 100}},
         array_filters=[{"element": {"$gte": 100}}]),
    case("docs-identifier-no-match-noop", {"_id": 1, "grades": [95, 92, 90]}, {"$set": {"grades.$[element]": 100}},
         UNCHANGED, array_filters=[{"element": {"$gte": 100}}]),
    case("docs-identifier-embedded", GRADES_DOCS, {"$set": {"grades.$[elem].mean": 100}},
         {"_id": 4, "grades": [GRADES_DOCS["grades"][0], {"grade": 85, "mean": 100, "std": 5},
                               {"grade": 85, "mean": 100, "std": 8}]},
         {"$set": {"grades": [GRADES_DOCS["grades"][0], {"grade": 85, "mean": 100, "std": 5},
                              {"grade": 85, "mean": 100, "std": 8}]}},
         array_filters=[{"elem.grade": {"$gte": 85}}]),
    case("docs-nested-identifiers", QUESTIONS, {"$inc": {"grades.$[t].questions.$[score]": 2}},
         {"_id": 1, "grades": [{"type": "quiz", "questions": [12, 10, 5]},
                               {"type": "quiz", "questions": [10, 11, 6]},
                               QUESTIONS["grades"][2], QUESTIONS["grades"][3]]},
         array_filters=[{"t.type": "quiz"}, {"score": {"$gte": 8}}]),
    case("docs-all-and-identifier", QUESTIONS, {"$inc": {"grades.$[].questions.$[score]": 2}},
         {"_id": 1, "grades": [{"type": "quiz", "questions": [12, 10, 5]},
                               {"type": "quiz", "questions": [10, 11, 6]},
                               {"type": "hw", "questions": [5, 4, 3]},
                               {"type": "exam", "questions": [27, 12, 25, 0]}]},
         array_filters=[{"score": {"$gte": 8}}]),
    case("two-identifiers-merge", {"_id": 1, "a": [{"k": 1}, {"k": 2}]}, {"$set": {"a.$[i].x": 1, "a.$[j].y": 2}},
         {"_id": 1, "a": [{"k": 1, "x": 1, "y": 2}, {"k": 2}]}, {"$set": {"a.0.x": 1, "a.0.y": 2}},
         array_filters=[{"i.k": 1}, {"j.k": {"$lt": 2}}]),
    case("identifier-and-all-merge", {"_id": 1, "a": [{"k": 1}, {"k": 2}]}, {"$set": {"a.$[i].x": 1, "a.$[].y": 0}},
         {"_id": 1, "a": [{"k": 1, "x": 1, "y": 0}, {"k": 2, "y": 0}]}, array_filters=[{"i.k": 1}]),
    case("identifier-with-or", {"_id": 1, "a": [1, 2, 3]}, {"$set": {"a.$[e]": 0}}, {"_id": 1, "a": [0, 2, 0]},
         array_filters=[{"$or": [{"e": 1}, {"e": 3}]}]),
    case("identifier-unset", {"_id": 1, "a": [{"k": 1, "v": 1}, {"k": 2, "v": 2}]}, {"$unset": {"a.$[e].v": 1}},
         {"_id": 1, "a": [{"k": 1}, {"k": 2, "v": 2}]}, {"$unset": {"a.0.v": True}},
         array_filters=[{"e.k": 1}]),
    case("identifier-matches-array-element-by-traversal", {"_id": 1, "a": [[1, 5], [2]]}, {"$set": {"a.$[e]": []}},
         {"_id": 1, "a": [[], [2]]}, array_filters=[{"e": 5}]),
]


@pytest.mark.parametrize(("doc", "update", "expected", "oplog", "kwargs"), POSITIONAL_CASES)
def test_positional(doc: Any, update: Any, expected: Any, oplog: Any, kwargs: Any) -> None:
    run_case(doc, update, expected, oplog, kwargs)


@needs_query
@pytest.mark.parametrize(("doc", "update", "expected", "oplog", "kwargs"), FILTERED_CASES)
def test_array_filters(doc: Any, update: Any, expected: Any, oplog: Any, kwargs: Any) -> None:
    run_case(doc, update, expected, oplog, kwargs)


# -- errors -------------------------------------------------------------------------
MODIFIER_HINT = "Expected a valid update modifier or pipeline-style update specified as an array"

PARSE_ERRORS = [
    error("unknown-modifier", {"_id": 1}, {"$foo": {"a": 1}}, 9, f"Unknown modifier: $foo. {MODIFIER_HINT}"),
    error("removed-pushAll", {"_id": 1}, {"$pushAll": {"a": [1]}}, 9),
    error("mixed-keys", {"_id": 1}, {"$set": {"a": 1}, "b": 2}, 9, f"Unknown modifier: b. {MODIFIER_HINT}"),
    error("modifier-not-object", {"_id": 1}, {"$set": 1}, 9,
          "Modifiers operate on fields but we found type int instead. For example: {$mod: {<field>: ...}} "
          "not {$set: 1}"),
    error("modifier-array", {"_id": 1}, {"$inc": []}, 9),
    error("empty-modifier", {"_id": 1}, {"$set": {}}, 9,
          "'$set' is empty. You must specify a field like so: {$set: {<field>: ...}}"),
    error("empty-path", {"_id": 1}, {"$set": {"": 1}}, 56, "An empty update path is not valid."),
    error("empty-path-part", {"_id": 1}, {"$set": {"a..b": 1}}, 56,
          "The update path 'a..b' contains an empty field name, which is not allowed."),
    error("trailing-dot", {"_id": 1}, {"$unset": {"a.": 1}}, 56),
    error("conflict-same-path", {"_id": 1}, {"$set": {"a": 1}, "$inc": {"a": 1}}, 40,
          "Updating the path 'a' would create a conflict at 'a'"),
    error("conflict-prefix", {"_id": 1}, {"$set": {"a.b": 1, "a": 1}}, 40,
          "Updating the path 'a' would create a conflict at 'a'"),
    error("conflict-child-after-parent", {"_id": 1}, {"$set": {"a": 1}, "$unset": {"a.b": 1}}, 40,
          "Updating the path 'a.b' would create a conflict at 'a'"),
    error("conflict-rename-target", {"_id": 1}, {"$set": {"b": 1}, "$rename": {"a": "b"}}, 40),
    error("conflict-rename-source", {"_id": 1}, {"$set": {"a": 1}, "$rename": {"a": "b"}}, 40),
    error("conflict-rename-chain", {"_id": 1, "a": 1, "b": 2}, {"$rename": {"a": "x", "b": "a"}}, 40),
    error("conflict-array-and-index", {"_id": 1}, {"$set": {"a.$[]": 1, "a.0": 1}}, 40,
          "Updating the path 'a.0' would create a conflict at 'a'"),
    error("conflict-set-on-insert", {"_id": 1}, {"$set": {"a": 1}, "$setOnInsert": {"a": 2}}, 40),
    error("too-many-positional", {"_id": 1}, {"$set": {"a.$.b.$": 1}}, 2,
          "Too many positional (i.e. '$') elements found in path 'a.$.b.$'"),
    error("positional-first", {"_id": 1}, {"$set": {"$": 1}}, 2,
          "Cannot have positional (i.e. '$') element in the first position in path '$'"),
    error("identifier-first", {"_id": 1}, {"$set": {"$[]": 1}}, 2,
          "Cannot have array filter identifier (i.e. '$[<id>]') element in the first position in path '$[]'"),
    error("inc-non-numeric-argument", {"_id": 1}, {"$inc": {"a": "x"}}, 14,
          'Cannot increment with non-numeric argument: {a: "x"}'),
    error("mul-non-numeric-argument", {"_id": 1}, {"$mul": {"a": None}}, 14,
          "Cannot multiply with non-numeric argument: {a: null}"),
    error("inc-bool-argument", {"_id": 1}, {"$inc": {"a": True}}, 14),
    error("rename-not-string", {"_id": 1}, {"$rename": {"a": 1}}, 2, "The 'to' field for $rename must be a string: a: 1"),
    error("rename-same", {"_id": 1}, {"$rename": {"a": "a"}}, 2,
          'The source and target field for $rename must differ: a: "a"'),
    error("rename-same-path", {"_id": 1}, {"$rename": {"a": "a.b"}}, 2,
          'The source and target field for $rename must not be on the same path: a: "a.b"'),
    error("rename-same-path-reverse", {"_id": 1}, {"$rename": {"a.b": "a"}}, 2),
    error("rename-dynamic-source", {"_id": 1}, {"$rename": {"a.$": "b"}}, 2,
          "The source field for $rename may not be dynamic: a.$"),
    error("rename-dynamic-target", {"_id": 1}, {"$rename": {"a": "b.$[]"}}, 2,
          "The destination field for $rename may not be dynamic: b.$[]"),
    error("rename-empty-target", {"_id": 1}, {"$rename": {"a": ""}}, 56),
    error("current-date-bad-type", {"_id": 1}, {"$currentDate": {"a": 1}}, 2,
          "int is not valid type for $currentDate. Please use a boolean ('true') or a $type expression "
          "({$type: 'timestamp/date'})."),
    error("current-date-bad-type-name", {"_id": 1}, {"$currentDate": {"a": {"$type": "time"}}}, 2,
          "The '$type' string field is required to be 'date' or 'timestamp': "
          "{$currentDate: {field : {$type: 'date'}}}"),
    error("current-date-bad-option", {"_id": 1}, {"$currentDate": {"a": {"type": "date"}}}, 2,
          "Unrecognized $currentDate option: type"),
    error("pop-two", {"_id": 1}, {"$pop": {"a": 2}}, 9, "$pop expects 1 or -1, found: 2"),
    error("pop-string", {"_id": 1}, {"$pop": {"a": "x"}}, 9, 'Expected a number in: a: "x"'),
    error("pop-fraction", {"_id": 1}, {"$pop": {"a": 1.5}}, 9, "Expected an integer: a: 1.5"),
    error("pull-all-not-array", {"_id": 1}, {"$pullAll": {"a": 1}}, 2,
          "$pullAll requires an array argument but was given a int"),
    error("push-each-not-array", {"_id": 1}, {"$push": {"a": {"$each": 1}}}, 2,
          "The argument to $each in $push must be an array but it was of type: int"),
    error("push-unknown-clause", {"_id": 1}, {"$push": {"a": {"$each": [], "$foo": 1}}}, 2,
          "Unrecognized clause in $push: $foo"),
    error("push-slice-not-integer", {"_id": 1}, {"$push": {"a": {"$each": [], "$slice": "x"}}}, 2,
          "The value for $slice must be an integer value but was given type: string"),
    error("push-slice-fraction", {"_id": 1}, {"$push": {"a": {"$each": [], "$slice": 1.5}}}, 2),
    error("push-position-not-integer", {"_id": 1}, {"$push": {"a": {"$each": [], "$position": "x"}}}, 2,
          "The value for $position must be an integer value, not of type: string"),
    error("push-sort-two", {"_id": 1}, {"$push": {"a": {"$each": [], "$sort": 2}}}, 2),
    error("push-sort-string", {"_id": 1}, {"$push": {"a": {"$each": [], "$sort": "x"}}}, 2),
    error("push-sort-empty-pattern", {"_id": 1}, {"$push": {"a": {"$each": [], "$sort": {}}}}, 2),
    error("push-sort-bad-direction", {"_id": 1}, {"$push": {"a": {"$each": [], "$sort": {"x": 0}}}}, 2),
    error("push-sort-empty-part", {"_id": 1}, {"$push": {"a": {"$each": [], "$sort": {"x..y": 1}}}}, 2),
    error("add-to-set-each-not-array", {"_id": 1}, {"$addToSet": {"a": {"$each": 1}}}, 14,
          "The argument to $each in $addToSet must be an array but it was of type int"),
    error("add-to-set-each-extra", {"_id": 1}, {"$addToSet": {"a": {"$each": [1], "b": 2}}}, 2),
    error("bit-not-object", {"_id": 1}, {"$bit": {"a": 5}}, 2),
    error("bit-unknown-op", {"_id": 1}, {"$bit": {"a": {"nand": 5}}}, 2),
    error("bit-double-operand", {"_id": 1}, {"$bit": {"a": {"and": 5.0}}}, 2),
    error("bit-empty", {"_id": 1}, {"$bit": {"a": {}}}, 2),
    error("missing-array-filter", {"_id": 1, "a": [1]}, {"$set": {"a.$[i]": 1}}, 2,
          "No array filter found for identifier 'i' in path 'a.$[i]'"),
]

APPLY_ERRORS = [
    error("set-id", {"_id": 1}, {"$set": {"_id": 2}}, 66,
          "Performing an update on the path '_id' would modify the immutable field '_id'"),
    error("set-id-other-type", {"_id": 1}, {"$set": {"_id": 1.0}}, 66),
    error("unset-id", {"_id": 1, "a": 1}, {"$unset": {"_id": 1}}, 66),
    error("inc-id", {"_id": 1}, {"$inc": {"_id": 1}}, 66),
    error("set-inside-id", {"_id": {"a": 1}}, {"$set": {"_id.a": 2}}, 66,
          "Performing an update on the path '_id.a' would modify the immutable field '_id'"),
    error("add-inside-id", {"_id": {"a": 1}}, {"$set": {"_id.b": 2}}, 66),
    error("rename-id", {"_id": 1}, {"$rename": {"_id": "x"}}, 66),
    error("rename-onto-id", {"_id": 1, "a": 2}, {"$rename": {"a": "_id"}}, 66),
    error("upsert-seed-id-immutable", {"_id": 1}, {"$set": {"_id": 2}}, 66, is_upsert_insert=True),
    error("upsert-array-id", {}, {"$set": {"_id": [1]}}, 53, "The '_id' value cannot be of type array",
          is_upsert_insert=True),
    error("inc-string", {"_id": 1, "a": "s"}, {"$inc": {"a": 1}}, 14,
          "Cannot apply $inc to a value of non-numeric type. {_id: 1} has the field 'a' of non-numeric type string"),
    error("mul-null", {"_id": 1, "a": None}, {"$mul": {"a": 2}}, 14),
    error("inc-long-overflow", {"_id": 1, "a": Int64(2**63 - 1)}, {"$inc": {"a": 1}}, 2,
          "Failed to apply $inc operations to current value ((NumberLong)9223372036854775807) for document {_id: 1}"),
    error("mul-long-overflow", {"_id": 1, "a": Int64(2**62)}, {"$mul": {"a": 4}}, 2),
    error("set-through-scalar", {"_id": 1, "a": 5}, {"$set": {"a.b": 1}}, 28, "Cannot create field 'b' in element {a: 5}"),
    error("set-through-null", {"_id": 1, "a": None}, {"$set": {"a.b": 1}}, 28),
    error("set-name-in-array", {"_id": 1, "a": [1]}, {"$set": {"a.b": 1}}, 28,
          "Cannot create field 'b' in element {a: [ 1 ]}"),
    error("inc-through-scalar", {"_id": 1, "a": {"b": 5}}, {"$inc": {"a.b.c": 1}}, 28),
    error("push-through-string", {"_id": 1, "a": "s"}, {"$push": {"a.b": 1}}, 28),
    error("pop-through-scalar", {"_id": 1, "a": 5}, {"$pop": {"a.b": 1}}, 28,
          "Cannot use the part (b) of (a.b) to traverse the element ({a: 5})"),
    error("pull-through-array-by-name", {"_id": 1, "a": [1]}, {"$pull": {"a.b": 1}}, 28),
    error("backfill-limit", {"_id": 1, "a": []}, {"$set": {"a.1500001": 1}}, 34,
          "can't backfill more than 1500000 elements"),
    error("push-not-array", {"_id": 1, "a": 1}, {"$push": {"a": 1}}, 2,
          "The field 'a' must be an array but is of type int in document {_id: 1}"),
    error("push-not-array-nested", {"_id": "x", "a": {"b": {}}}, {"$push": {"a.b": 1}}, 2,
          "The field 'a.b' must be an array but is of type object in document {_id: \"x\"}"),
    error("add-to-set-not-array", {"_id": 1, "colors": "blue,green,red"}, {"$addToSet": {"colors": "c"}}, 2,
          "Cannot apply $addToSet to non-array field. Field named 'colors' has non-array type string"),
    error("pop-not-array", {"_id": 1, "a": 1}, {"$pop": {"a": 1}}, 14,
          "Path 'a' contains an element of non-array type 'int'"),
    error("pull-not-array", {"_id": 1, "a": 1}, {"$pull": {"a": 1}}, 2, "Cannot apply $pull to a non-array value"),
    error("pull-all-not-array-field", {"_id": 1, "a": {}}, {"$pullAll": {"a": [1]}}, 2),
    error("bit-double-field", {"_id": 1, "a": 1.5}, {"$bit": {"a": {"and": 1}}}, 2,
          "Cannot apply $bit to a value of non-integral type._id: 1 has the field a of non-integer type double"),
    error("positional-without-match", {"_id": 1, "a": [1]}, {"$set": {"a.$": 2}}, 2,
          "The positional operator did not find the match needed from the query."),
    error("positional-on-upsert", {}, {"$set": {"a.$": 2}}, 2, is_upsert_insert=True),
    error("all-elements-missing-path", {"_id": 1}, {"$set": {"a.$[]": 1}}, 2,
          "The path 'a' must exist in the document in order to apply array updates."),
    error("all-elements-not-array", {"_id": 1, "a": 5}, {"$set": {"a.$[]": 1}}, 2,
          "Cannot apply array updates to non-array element a: 5"),
    error("all-elements-scalar-child", {"_id": 1, "a": [1]}, {"$set": {"a.$[].b": 1}}, 28,
          "Cannot create field 'b' in element {0: 1}"),
    error("rename-source-in-array", {"_id": 1, "a": [{"b": 1}]}, {"$rename": {"a.0.b": "c"}}, 2,
          "The source field cannot be an array element, 'a.0.b' in doc with _id: 1 has an array field called 'a'"),
    error("rename-target-in-array", {"_id": 1, "x": 1, "a": [1]}, {"$rename": {"x": "a.5"}}, 2,
          "The destination field cannot be an array element, 'a.5' in doc with _id: 1 has an array field called 'a'"),
    error("rename-target-through-array", {"_id": 1, "x": 1, "a": [{}]}, {"$rename": {"x": "a.0.b"}}, 2),
    error("rename-source-through-scalar", {"_id": 1, "a": 5}, {"$rename": {"a.b": "c"}}, 28),
    error("rename-target-not-viable", {"_id": 1, "x": 1, "a": 5}, {"$rename": {"x": "a.b"}}, 28),
    error("top-level-dollar-field", {"_id": 1}, {"$set": {"$x": 1}}, 52),
    error("top-level-dollar-parent", {"_id": 1}, {"$set": {"$x.y": 1}}, 52),
]


@pytest.mark.parametrize(("doc", "update", "code", "message", "kwargs"), PARSE_ERRORS + APPLY_ERRORS)
def test_errors(doc: Any, update: Any, code: int, message: str | None, kwargs: Any) -> None:
    run_error(doc, update, code, message, kwargs)


@pytest.mark.parametrize(("doc", "update", "code", "message", "kwargs"), PARSE_ERRORS)
def test_validate_update_reports_parse_errors(doc: Any, update: Any, code: int, message: str | None,
                                              kwargs: Any) -> None:
    with pytest.raises(MongoError) as info:
        validate_update(update, array_filters=[])
    assert info.value.code == code
    if message is not None:
        assert info.value.errmsg == message


FILTER_ERRORS = [
    error("unused-filter", {"_id": 1, "a": [1]}, {"$set": {"a.$[]": 1}}, 9,
          "The array filter for identifier 'i' was not used in the update { $set: { a.$[]: 1 } }",
          array_filters=[{"i": 1}]),
    error("uppercase-identifier", {"_id": 1, "a": [1]}, {"$set": {"a.$[I]": 1}}, 2, array_filters=[{"I": 1}]),
    error("two-identifiers-in-one-filter", {"_id": 1, "a": [1]}, {"$set": {"a.$[i]": 1}}, 9,
          array_filters=[{"i": 1, "j": 1}]),
    error("duplicate-identifier", {"_id": 1, "a": [1]}, {"$set": {"a.$[i]": 1}}, 9,
          "Found multiple array filters with the same top-level field name i",
          array_filters=[{"i": 1}, {"i": 2}]),
    error("merge-conflict", {"_id": 1, "a": [0]}, {"$set": {"a.$[i]": 2, "a.$[j]": 3}}, 40,
          "Update created a conflict at 'a.0'", array_filters=[{"i": 0}, {"j": 0}]),
    error("merge-conflict-all", {"_id": 1, "a": [0]}, {"$set": {"a.$[i]": 2, "a.$[]": 3}}, 40,
          array_filters=[{"i": 0}]),
    error("nested-merge-conflict", {"_id": 0, "a": [{"x": 0, "b": [{"y": 0, "c": 0}]}]},
          {"$set": {"a.$[i].b.$[k].c": 1, "a.$[j].b.$[k].c": 2}}, 40,
          "Update created a conflict at 'a.0.b.$[k].c'", array_filters=[{"i.x": 0}, {"j.x": 0}, {"k.y": 0}]),
]


@needs_query
@pytest.mark.parametrize(("doc", "update", "code", "message", "kwargs"), FILTER_ERRORS)
def test_array_filter_errors(doc: Any, update: Any, code: int, message: str | None, kwargs: Any) -> None:
    run_error(doc, update, code, message, kwargs)


def test_merge_without_conflict_when_elements_differ() -> None:
    pytest.importorskip("oplog.query")
    doc = {"_id": 0, "a": [{"x": 0, "b": [{"y": 0, "c": 0}]}, {"x": 1, "b": [{"y": 0, "c": 0}]}]}
    out = apply_update(doc, {"$set": {"a.$[i].b.$[k].c": 1, "a.$[j].b.$[k].c": 2}}, now=NOW,
                       array_filters=[{"i.x": 0}, {"j.x": 1}, {"k.y": 0}])
    assert_doc(out.document, {"_id": 0, "a": [{"x": 0, "b": [{"y": 0, "c": 1}]}, {"x": 1, "b": [{"y": 0, "c": 2}]}]})
    assert_oplog_contract(doc, out)


def test_validate_update_without_filters_skips_identifier_checks() -> None:
    validate_update({"$set": {"a.$[i]": 1}})
    with pytest.raises(MongoError) as info:
        validate_update({"$set": {"a.$[i]": 1}}, array_filters=[])
    assert info.value.code == 2


def test_validate_update_accepts_valid_updates() -> None:
    validate_update({"$set": {"a": 1}, "$inc": {"b": 1}, "$rename": {"c": "d"}, "$push": {"e": {"$each": [1]}}})
    validate_update({"a": 1})
    validate_update([{"$set": {"a": 1}}, {"$unset": "b"}])


@pytest.mark.parametrize(("pipeline", "code"), [
    ([{"$match": {}}], 72),
    ([{"a": 1}], 40324),
    ([{"$set": {}, "$unset": "a"}], 40323),
    ([1], 14),
])
def test_validate_update_pipeline_errors(pipeline: list[Any], code: int) -> None:
    with pytest.raises(MongoError) as info:
        validate_update(pipeline)
    assert info.value.code == code


# -- replacement --------------------------------------------------------------------
REPLACEMENT_CASES = [
    pytest.param({"_id": 1, "a": 1, "b": 2}, {"c": 3}, {"_id": 1, "c": 3}, id="replace-all"),
    pytest.param({"_id": 1, "a": 1}, {"c": 3, "_id": 1}, {"_id": 1, "c": 3}, id="id-moved-first"),
    pytest.param({"_id": 1, "a": 1}, {"_id": 1.0, "a": 2}, {"_id": 1, "a": 2}, id="equal-id-other-type"),
    pytest.param({"_id": 1, "a": 1}, {"z": 1, "b": {"$x": 1}, "a.b": 2}, {"_id": 1, "z": 1, "b": {"$x": 1}, "a.b": 2},
                 id="order-nested-dollar-and-dots-kept"),
    pytest.param({"_id": 1, "a": 1}, {}, {"_id": 1}, id="empty-replacement"),
    pytest.param({"a": 1}, {"_id": 3, "b": 1}, {"_id": 3, "b": 1}, id="seed-without-id"),
]


@pytest.mark.parametrize(("doc", "replacement", "expected"), REPLACEMENT_CASES)
def test_replacement(doc: dict[str, Any], replacement: dict[str, Any], expected: dict[str, Any]) -> None:
    out = apply_replacement(doc, replacement)
    assert_doc(out.document, expected)
    assert out.modified
    assert_doc(out.oplog_update, expected)
    assert_oplog_contract(doc, out)


def test_identical_replacement_is_unmodified() -> None:
    out = apply_replacement({"_id": 1, "a": [1, {"b": 2}]}, {"a": [1, {"b": 2}]})
    assert not out.modified
    assert out.oplog_update is None


def test_replacement_does_not_share_values() -> None:
    replacement = {"a": {"b": [1]}}
    out = apply_replacement({"_id": 1}, replacement)
    out.document["a"]["b"].append(2)
    assert replacement == {"a": {"b": [1]}}


@pytest.mark.parametrize(("doc", "replacement", "code", "message"), [
    ({"_id": 1}, {"_id": 2}, 66,
     "After applying the update, the (immutable) field '_id' was found to have been altered to _id: 2"),
    ({"_id": "a"}, {"_id": "b", "x": 1}, 66,
     "After applying the update, the (immutable) field '_id' was found to have been altered to _id: \"b\""),
    ({"_id": 1}, {"$set": {"a": 1}, "b": 1}, 52, None),
    ({"_id": 1}, {"a": 1, "$inc": {"b": 1}}, 52,
     "The dollar ($) prefixed field '$inc' in '$inc' is not allowed in the context of an update's replacement "
     "document. Consider using an aggregation pipeline with $replaceWith."),
    ({}, {"_id": [1, 2]}, 53, "The '_id' value cannot be of type array"),
])
def test_replacement_errors(doc: dict[str, Any], replacement: dict[str, Any], code: int, message: str | None) -> None:
    with pytest.raises(MongoError) as info:
        apply_replacement(doc, replacement)
    assert info.value.code == code
    if message is not None:
        assert info.value.errmsg == message


@pytest.mark.parametrize(("update", "expected"), [
    ({"$set": {"a": 1}}, True),
    ({"$inc": {"a": 1}, "$set": {"b": 1}}, True),
    ({"a": 1}, False),
    ({}, False),
    ({"a": {"$set": 1}}, False),
])
def test_is_operator_update(update: dict[str, Any], expected: bool) -> None:
    assert is_operator_update(update) is expected


@pytest.mark.parametrize(("update", "code"), [
    ({"$set": {"a": 1}, "b": 1}, 9),
    ({"b": 1, "$set": {"a": 1}}, 52),
])
def test_is_operator_update_mixed(update: dict[str, Any], code: int) -> None:
    with pytest.raises(MongoError) as info:
        is_operator_update(update)
    assert info.value.code == code


# -- upsert seed --------------------------------------------------------------------
SEED_CASES = [
    pytest.param({"a": 1, "b.c": 2, "$and": [{"d": 3}]}, {"a": 1, "b": {"c": 2}, "d": 3}, id="brief-example"),
    pytest.param({"_id": 5, "a": {"$gt": 1}}, {"_id": 5}, id="operators-skipped"),
    pytest.param({"a": {"$eq": 2}}, {"a": 2}, id="eq-used"),
    pytest.param({"a": {"$gt": 1, "$eq": 3}}, {"a": 3}, id="eq-among-operators"),
    pytest.param({"a": {"b": 1}}, {"a": {"b": 1}}, id="whole-document"),
    pytest.param({"a": {"$eq": {"b": 1}}}, {"a": {"b": 1}}, id="eq-document"),
    pytest.param({"a": [1, 2]}, {"a": [1, 2]}, id="array"),
    pytest.param({"a.b": 1, "a.c": 2}, {"a": {"b": 1, "c": 2}}, id="shared-parent"),
    pytest.param({"a.0": 1}, {"a": {"0": 1}}, id="numeric-part-is-field"),
    pytest.param({"a": Regex("^x")}, {}, id="regex-skipped"),
    pytest.param({"a": {"$eq": Regex("^x")}}, {"a": Regex("^x")}, id="eq-regex-used"),
    pytest.param({"$or": [{"a": 1}]}, {"a": 1}, id="single-or"),
    pytest.param({"$or": [{"a": 1}, {"b": 2}]}, {}, id="or-skipped"),
    pytest.param({"$nor": [{"a": 1}]}, {}, id="nor-skipped"),
    pytest.param({"$and": [{"$and": [{"x": 1}]}, {"y": {"$in": [1]}}]}, {"x": 1}, id="nested-and"),
    pytest.param({"b": 1, "a": 2}, {"a": 2, "b": 1}, id="sorted-by-path"),
    pytest.param({"B": 1, "_id": 2, "a": 3}, {"_id": 2, "B": 1, "a": 3}, id="id-first"),
    pytest.param({"B": 1, "_id.x": 2}, {"_id": {"x": 2}, "B": 1}, id="embedded-id-first"),
    pytest.param({"a": None}, {"a": None}, id="null"),
    pytest.param({"a": {"$ref": "c", "$id": 1}}, {"a": {"$ref": "c", "$id": 1}}, id="dbref"),
    pytest.param({"$expr": {"$eq": ["$a", 1]}, "$comment": "x"}, {}, id="top-level-operators-skipped"),
    pytest.param({}, {}, id="empty"),
]


@pytest.mark.parametrize(("query", "expected"), SEED_CASES)
def test_upsert_seed(query: dict[str, Any], expected: dict[str, Any]) -> None:
    assert_doc(upsert_seed(query), expected)


@pytest.mark.parametrize(("query", "message"), [
    ({"a": 1, "a.b": 2}, "cannot infer query fields to set, both paths 'a.b' and 'a' are matched"),
    ({"$and": [{"a": 1}, {"a": 2}]}, "cannot infer query fields to set, path 'a' is matched twice"),
    ({"a.b": 1, "$and": [{"a": {"b": 1}}]}, None),
])
def test_upsert_seed_conflicts(query: dict[str, Any], message: str | None) -> None:
    with pytest.raises(MongoError) as info:
        upsert_seed(query)
    assert info.value.code == 54
    if message is not None:
        assert info.value.errmsg == message


def test_upsert_flow_seed_then_update() -> None:
    seed = upsert_seed({"_id": 7, "name": "x", "n": {"$gt": 0}})
    out = apply_update(seed, {"$inc": {"n": 1}, "$setOnInsert": {"created": NOW}}, now=NOW, is_upsert_insert=True)
    assert_doc(out.document, {"_id": 7, "name": "x", "created": NOW, "n": 1})


# -- apply_oplog_update -------------------------------------------------------------
OPLOG_APPLY_CASES = [
    pytest.param({"_id": 1, "a": 5}, {"$set": {"a.b": 1}}, {"_id": 1, "a": 5}, id="non-viable-set-skipped"),
    pytest.param({"_id": 1}, {"$unset": {"x.y": True}}, {"_id": 1}, id="missing-unset"),
    pytest.param({"_id": 1, "a": 1}, {"$set": {"b": 2}, "$unset": {"a": True}}, {"_id": 1, "b": 2}, id="set-and-unset"),
    pytest.param({"_id": 1, "a": 1}, {"$v": 1, "$set": {"a": 2}}, {"_id": 1, "a": 2}, id="v-ignored"),
    pytest.param({"_id": 1, "a": 1}, {"_id": 1, "b": 2}, {"_id": 1, "b": 2}, id="replacement"),
    pytest.param({"_id": 1, "a": 1}, {"b": 2}, {"_id": 1, "b": 2}, id="replacement-keeps-id"),
    pytest.param({"_id": 1}, {"$set": {"a": 1, "a.b": 2}}, {"_id": 1, "a": 1}, id="colliding-paths-one-by-one"),
    pytest.param({"_id": 1, "a": [1]}, {"$set": {"a.3": 4}}, {"_id": 1, "a": [1, None, None, 4]}, id="padding"),
    pytest.param({"_id": 1}, {"$set": {"z": 1, "m.b": 2, "m.a": 1}}, {"_id": 1, "m": {"a": 1, "b": 2}, "z": 1},
                 id="sorted-creation"),
    pytest.param({"_id": 1, "a": 1}, {"$set": {"_id": 1, "a": 3}}, {"_id": 1, "a": 3}, id="id-same"),
    pytest.param({"_id": 1, "a": [{"b": 1}]}, {"$unset": {"a.b": True}}, {"_id": 1, "a": [{"b": 1}]},
                 id="no-array-traversal"),
    pytest.param({"_id": 1}, {"$set": {}}, {"_id": 1}, id="empty-set"),
]


@pytest.mark.parametrize(("doc", "o", "expected"), OPLOG_APPLY_CASES)
def test_apply_oplog_update(doc: dict[str, Any], o: dict[str, Any], expected: dict[str, Any]) -> None:
    snapshot = enc(doc)
    once = apply_oplog_update(doc, o)
    assert enc(doc) == snapshot
    assert_doc(once, expected)
    assert_doc(apply_oplog_update(once, o), expected)


# -- properties ---------------------------------------------------------------------
FIELDS = ["a", "b", "c", "d", "e", "f"]
SUBFIELDS = ["x", "y", "0", "1"]

scalars = st.one_of(
    st.integers(-3, 3),
    st.sampled_from([2**31 - 1, -(2**31), 2**40]),
    st.builds(Int64, st.integers(-3, 3)),
    st.floats(-10, 10, allow_nan=False).map(lambda f: round(f, 2)),
    st.sampled_from(["x", "y", ""]),
    st.none(),
    st.booleans(),
    st.sampled_from([Decimal128("1.5"), datetime.datetime(2020, 1, 1), ObjectId("0123456789ab0123456789ab")]),
)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(st.sampled_from(SUBFIELDS), inner, max_size=3)),
    max_leaves=6,
)
documents = st.dictionaries(st.sampled_from(FIELDS), values, max_size=5).map(lambda d: {"_id": 1, **d})
numbers = st.one_of(st.integers(-3, 3), st.builds(Int64, st.integers(-3, 3)), st.sampled_from([0.5, -1.25, 2.0]))

ARGUMENTS: dict[str, Any] = {
    "$set": values,
    "$setOnInsert": values,
    "$unset": st.just(""),
    "$inc": numbers,
    "$mul": numbers,
    "$min": scalars,
    "$max": scalars,
    "$currentDate": st.sampled_from([True, {"$type": "timestamp"}, {"$type": "date"}]),
    "$push": st.one_of(values, st.fixed_dictionaries(
        {"$each": st.lists(scalars, max_size=3)},
        optional={"$slice": st.integers(-3, 3), "$sort": st.sampled_from([1, -1]), "$position": st.integers(-3, 3)})),
    "$addToSet": st.one_of(scalars, st.fixed_dictionaries({"$each": st.lists(scalars, max_size=3)})),
    "$pop": st.sampled_from([1, -1]),
    "$pull": scalars,
    "$pullAll": st.lists(scalars, max_size=3),
    "$bit": st.sampled_from([{"and": 6}, {"or": 1}, {"xor": Int64(3)}]),
}


@st.composite
def updates(draw: st.DrawFn) -> dict[str, dict[str, Any]]:
    heads = draw(st.lists(st.sampled_from(FIELDS), min_size=1, max_size=4, unique=True))
    update: dict[str, dict[str, Any]] = {}
    while heads:
        head = heads.pop()
        op = draw(st.sampled_from([*ARGUMENTS, "$rename"]))
        suffix = draw(st.lists(st.sampled_from([*SUBFIELDS, "$[]", "$"]), max_size=2))
        if op == "$rename":
            if not heads:
                continue
            target = heads.pop()
            source = ".".join([head, *draw(st.lists(st.sampled_from(SUBFIELDS), max_size=1))])
            update.setdefault(op, {})[source] = ".".join([target, *draw(st.lists(st.sampled_from(["x", "y"]), max_size=1))])
            continue
        if "$" in suffix and suffix.count("$") > 1:
            suffix = [part for part in suffix if part != "$"]
        update.setdefault(op, {})[".".join([head, *suffix])] = draw(ARGUMENTS[op])
    return update


def _top_level_order_kept(before: dict[str, Any], after: dict[str, Any]) -> bool:
    kept_before = [key for key in before if key in after]
    kept_after = [key for key in after if key in before]
    added = [i for i, key in enumerate(after) if key not in before]
    return kept_before == kept_after and all(i >= len(kept_after) for i in added)


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(doc=documents, update=updates(), match_index=st.one_of(st.none(), st.integers(0, 2)),
       insert=st.booleans())
def test_property_oplog_form_replays_and_is_idempotent(doc: dict[str, Any], update: dict[str, Any],
                                                        match_index: int | None, insert: bool) -> None:
    snapshot = enc(doc)
    try:
        out = apply_update(doc, update, now=NOW, match_index=match_index, is_upsert_insert=insert)
    except MongoError:
        return
    assert enc(doc) == snapshot
    assert_oplog_contract(doc, out)
    assert _top_level_order_kept(doc, out.document)
    if out.modified:
        assert set(out.oplog_update) <= {"$set", "$unset", DISAMBIGUATED}
        assert all(out.oplog_update.values())
        logged = [*out.oplog_update.get("$set", {}), *out.oplog_update.get("$unset", {})]
        described = out.oplog_update.get(DISAMBIGUATED, {})
        assert set(described) == {p for p in logged if "." in p and any(array_index(x) is not None for x in p.split("."))}
        for path, parts in described.items():  # an integer exactly where the part indexes an array
            assert ".".join(str(x) for x in parts) == path
            for i, part in enumerate(parts):
                found, container = get_path(out.document, path.split(".")[:i])
                assert isinstance(part, int) == (found and isinstance(container, list))


@settings(max_examples=200, deadline=None)
@given(doc=documents, replacement=st.dictionaries(st.sampled_from(FIELDS), values, max_size=4))
def test_property_replacement_oplog(doc: dict[str, Any], replacement: dict[str, Any]) -> None:
    out = apply_replacement(doc, replacement)
    assert next(iter(out.document)) == "_id"
    assert_oplog_contract(doc, out)


@settings(max_examples=200, deadline=None)
@given(doc=documents, update=updates())
def test_property_validate_agrees_with_apply(doc: dict[str, Any], update: dict[str, Any]) -> None:
    try:
        validate_update(update)
    except MongoError as exc:
        with pytest.raises(MongoError) as info:
            apply_update(doc, update, now=NOW, match_index=0)
        assert info.value.code == exc.code


def test_outcome_does_not_share_values_with_the_update() -> None:
    update = {"$set": {"a": {"b": [1]}}, "$push": {"c": {"$each": [{"d": 1}]}}}
    out = apply_update({"_id": 1}, update, now=NOW)
    out.document["a"]["b"].append(2)
    out.document["c"][0]["d"] = 2
    assert update == {"$set": {"a": {"b": [1]}}, "$push": {"c": {"$each": [{"d": 1}]}}}
    assert out.oplog_update == {"$set": {"a": {"b": [1]}, "c": [{"d": 1}]}}


def test_outcome_is_frozen() -> None:
    out = apply_update({"_id": 1}, {"$set": {"a": 1}}, now=NOW)
    with pytest.raises(AttributeError):
        out.modified = False  # type: ignore[misc]


def test_pipeline_updates_are_rejected_by_apply_update() -> None:
    with pytest.raises(MongoError) as info:
        apply_update({"_id": 1}, [{"$set": {"a": 1}}], now=NOW)  # type: ignore[arg-type]
    assert info.value.code == 2


def test_an_inserted_document_nested_deeper_than_180_levels_is_refused() -> None:
    from oplog.writes import MAX_STORED_DEPTH, prepare_insert_document

    def nested(levels: int) -> dict[str, Any]:
        """`levels` levels of fields: the innermost `v` is at level `levels`."""
        doc: dict[str, Any] = {"v": 1}
        for _ in range(levels - 1):
            doc = {"a": doc}
        return doc

    # As mongod's validateDepth: the document and 179 nested objects hold fields down to level 180.
    prepare_insert_document(nested(MAX_STORED_DEPTH))
    prepare_insert_document({"list": [[[1]]]})
    with pytest.raises(MongoError) as err:
        prepare_insert_document(nested(MAX_STORED_DEPTH + 1))
    assert err.value.code == 15
    assert "180 levels of nesting" in err.value.errmsg


@settings(max_examples=300, deadline=None)
@given(doc=documents, field=st.sampled_from(FIELDS), old=st.lists(values, max_size=5),
       new=st.lists(values, max_size=5))
def test_property_pipeline_array_changes_replay_and_are_idempotent(doc: dict[str, Any], field: str,
                                                                   old: list[Any], new: list[Any]) -> None:
    """A pipeline that changes an array logs the elements it changed and the new size when it shrank:
    applied to the old document that gives the new one, and applied again it changes nothing."""
    before = {**doc, field: old}
    out = apply_pipeline_update(before, [{"$set": {field: {"$literal": new}}}], now=NOW)
    if not out.modified:
        return
    assert_doc(apply_oplog_update(before, out.oplog_update), out.document)
    assert_doc(apply_oplog_update(out.document, out.oplog_update), out.document)


# -- bounded work: what an update may leave ----------------------------------------
_MB9 = "x" * (9 * 1024 * 1024)


def _update_error(fn: Any, *args: Any, **kwargs: Any) -> MongoError:
    with pytest.raises(MongoError) as info:
        fn(*args, **kwargs)
    return info.value


def test_an_update_path_of_100000_parts_is_refused_cleanly() -> None:
    long_path = ".".join(["a"] * 100_000)
    for update in ({"$set": {long_path: 1}}, {"$unset": {long_path: 1}}, {"$inc": {long_path: 1}}):
        err = _update_error(apply_update, {"_id": 1}, update, now=NOW)
        assert err.code == 15 and "FieldPath is too long" in err.errmsg
        assert _update_error(validate_update, update).code == 15


def test_an_update_may_nest_fields_down_to_level_180() -> None:
    def path(parts: int) -> str:
        return ".".join(["a"] * parts)

    out = apply_update({"_id": 1}, {"$set": {path(180): 1}}, now=NOW)
    assert out.modified
    err = _update_error(apply_update, {"_id": 1}, {"$set": {path(181): 1}}, now=NOW)
    assert err.code == 15 and err.errmsg == "Document exceeds maximum nesting depth of 180"
    err = _update_error(apply_update, {"_id": 1}, {"$set": {path(100): {"b": _nested_value(81)}}}, now=NOW)
    assert err.code == 15


def _nested_value(levels: int) -> Any:
    value: Any = 1
    for _ in range(levels):
        value = {"a": value}
    return value


def test_an_update_that_leaves_more_than_16_mib_is_refused() -> None:
    doc = {"_id": 1, "a": _MB9}
    err = _update_error(apply_update, doc, {"$set": {"b": _MB9}}, now=NOW)
    assert (err.code, err.errmsg) == (17419, "Resulting document after update is larger than 16777216")
    err = _update_error(apply_pipeline_update, doc, [{"$set": {"b": {"$concat": ["$a", "x"]}}}], now=NOW)
    assert err.code == 17419
    err = _update_error(apply_replacement, doc, {"a": _MB9, "b": _MB9})
    assert err.code == 17419
    assert apply_update(doc, {"$set": {"b": "x" * (6 * 1024 * 1024)}}, now=NOW).modified


def test_an_upsert_that_builds_more_than_16_mib_is_refused() -> None:
    seed = upsert_seed({"_id": 7})
    err = _update_error(apply_update, seed, {"$set": {"a": _MB9, "b": _MB9}}, now=NOW, is_upsert_insert=True)
    assert (err.code, err.errmsg) == (17420, "Document to upsert is larger than 16777216")
    err = _update_error(apply_pipeline_update, seed, [{"$set": {"a": {"$literal": _MB9}, "b": {"$literal": _MB9}}}],
                        now=NOW, is_upsert_insert=True)
    assert err.code == 17420


def test_a_pipeline_update_sharing_one_value_many_times_is_measured_not_encoded() -> None:
    import time

    doc = {"_id": 1, "a": _MB9}
    wide = {f"f{i}": "$a" for i in range(2000)}  # 18 GB of BSON, were it encoded
    started = time.monotonic()
    assert _update_error(apply_pipeline_update, doc, [{"$set": wide}], now=NOW).code == 17419
    assert time.monotonic() - started < 1.0


def test_an_oversize_insert_names_its_size() -> None:
    from oplog.writes import prepare_insert_document

    doc = {"_id": 1, "a": "x" * (16 * 1024 * 1024)}
    err = _update_error(prepare_insert_document, doc)
    assert err.code == 10334
    assert err.errmsg == f"object to insert too large. size in bytes: {len(bson.encode(doc))}, max size: 16777216"
