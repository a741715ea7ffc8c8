"""Table-driven tests of oplog.query against MongoDB's documented query semantics.

Most tables are the example collections and queries from the MongoDB manual pages of
each operator (query, projection and sort), plus server behaviours checked against the
server's own jstests (null semantics, path traversal, error codes).
"""

from __future__ import annotations

import datetime
import itertools
import math
import re
from typing import Any

import pytest
from bson.binary import Binary
from bson.code import Code
from bson.decimal128 import Decimal128
from bson.int64 import Int64
from bson.max_key import MaxKey
from bson.min_key import MinKey
from bson.objectid import ObjectId
from bson.regex import Regex
from hypothesis import given, settings
from hypothesis import strategies as st

import oplog.sort
from base.errors import MongoError
from oplog import query_regex
from oplog.projection import apply_projection, compile_projection, validate_projection
from oplog.query import Matcher, MatchResult, compile_filter, matches
from oplog.query_common import get_path, resolve_field
from oplog.sort import sort_documents
from oplog.values import compare_values

OID1 = ObjectId("5234cc89687ea597eabee675")
OID2 = ObjectId("5234cc8a687ea597eabee676")
OID3 = ObjectId("5234cc8a687ea597eabee677")
OID4 = ObjectId("5234d665687ea597eabee678")
DATE1 = datetime.datetime(2020, 1, 1)
DATE2 = datetime.datetime(2021, 6, 15, 12, 30)

# ---------------------------------------------------------------------------
# Example collections from the MongoDB manual
# ---------------------------------------------------------------------------

COLLECTIONS: dict[str, list[dict[str, Any]]] = {
    # $eq page
    "eq_inventory": [
        {"_id": 1, "item": {"name": "ab", "code": "123"}, "qty": 15, "tags": ["A", "B", "C"]},
        {"_id": 2, "item": {"name": "cd", "code": "123"}, "qty": 20, "tags": ["B"]},
        {"_id": 3, "item": {"name": "ij", "code": "456"}, "qty": 25, "tags": ["A", "B"]},
        {"_id": 4, "item": {"name": "xy", "code": "456"}, "qty": 30, "tags": ["B", "A"]},
        {"_id": 5, "item": {"name": "mn", "code": "000"}, "qty": 20, "tags": [["A", "B"], "C"]},
    ],
    "companies": [
        {"_id": 1, "company": "MongoDB"},
        {"_id": 2, "company": "MongoDB2"},
        {"_id": 3, "company": Regex("MongoDB")},
    ],
    # $gt/$gte/$lt/$lte/$ne pages
    "carriers": [
        {"_id": 1, "item": "nuts", "quantity": 30, "carrier": {"name": "Shipit", "fee": 3}},
        {"_id": 2, "item": "bolts", "quantity": 50, "carrier": {"name": "Shipit", "fee": 4}},
        {"_id": 3, "item": "washers", "quantity": 10, "carrier": {"name": "Shipit", "fee": 1}},
    ],
    # $in / $nin pages
    "in_inventory": [
        {"_id": 1, "item": "Pens", "quantity": 350, "tags": ["school", "office"]},
        {"_id": 2, "item": "Erasers", "quantity": 15, "tags": ["school", "home"]},
        {"_id": 3, "item": "Maps", "tags": ["office", "storage"]},
        {"_id": 4, "item": "Books", "quantity": 5, "tags": ["school", "storage", "home"]},
    ],
    # $exists page
    "records": [
        {"_id": 1, "a": 5, "b": 5, "c": None},
        {"_id": 2, "a": 3, "b": None, "c": 8},
        {"_id": 3, "a": None, "b": 3, "c": 9},
        {"_id": 4, "a": 1, "b": 2, "c": 3},
        {"_id": 5, "b": 2, "c": 4},
        {"_id": 6, "b": 2},
        {"_id": 7, "c": 6},
    ],
    # $type page
    "address_book": [
        {"_id": 1, "address": "2030 Martian Way", "zipCode": "90698345"},
        {"_id": 2, "address": "156 Lunar Place", "zipCode": 43339374.0},
        {"_id": 3, "address": "2324 Pluto Place", "zipCode": Int64(3921412)},
        {"_id": 4, "address": "55 Saturn Ring", "zipCode": 88602117},
        {"_id": 5, "address": "104 Venus Drive", "zipCode": ["834847278", "1893289032"]},
    ],
    "grades": [
        {"_id": 1, "name": "Alice King", "classAverage": 87.333333333333333},
        {"_id": 2, "name": "Bob Jenkins", "classAverage": "83.52"},
        {"_id": 3, "name": "Cathy Hart", "classAverage": "94.06"},
        {"_id": 4, "name": "Drew Williams", "classAverage": 93},
    ],
    "readings": [
        {"_id": 1, "readings": [25, 23, ["Warm"], ["Hot"], ["Cold"]]},
        {"_id": 2, "readings": [25, 25, 24, 23]},
        {"_id": 3, "readings": [22, 24, []]},
        {"_id": 4, "readings": []},
        {"_id": 5, "readings": 24},
    ],
    "restaurants": [
        {"_id": 1, "grades": [{"grade": "A", "score": 5}, {"grade": "A", "score": 4}]},
        {"_id": 2, "grades": [{"grade": MinKey(), "score": 2}, {"grade": "A", "score": 6}]},
        {"_id": 3, "grades": [{"grade": MaxKey(), "score": 2}]},
    ],
    # $regex page
    "products": [
        {"_id": 100, "sku": "abc123", "description": "Single line description."},
        {"_id": 101, "sku": "abc789", "description": "First line\nSecond line"},
        {"_id": 102, "sku": "xyz456", "description": "Many spaces before     line"},
        {"_id": 103, "sku": "xyz789", "description": "Multiple\nline description"},
        {"_id": 104, "sku": "Abc789", "description": "SKU starts with A"},
    ],
    # $all page
    "all_inventory": [
        {
            "_id": 1,
            "code": "xyz",
            "tags": ["school", "book", "bag", "headphone", "appliance"],
            "qty": [
                {"size": "S", "num": 10, "color": "blue"},
                {"size": "M", "num": 45, "color": "blue"},
                {"size": "L", "num": 100, "color": "green"},
            ],
        },
        {
            "_id": 2,
            "code": "abc",
            "tags": ["appliance", "school", "book"],
            "qty": [
                {"size": "6", "num": 100, "color": "green"},
                {"size": "6", "num": 50, "color": "blue"},
                {"size": "8", "num": 100, "color": "brown"},
            ],
        },
        {
            "_id": 3,
            "code": "efg",
            "tags": ["school", "book"],
            "qty": [
                {"size": "S", "num": 10, "color": "blue"},
                {"size": "M", "num": 100, "color": "blue"},
                {"size": "L", "num": 100, "color": "green"},
            ],
        },
        {
            "_id": 4,
            "code": "ijk",
            "tags": ["electronics", "school"],
            "qty": [{"size": "M", "num": 100, "color": "green"}],
        },
    ],
    # $elemMatch page
    "scores": [
        {"_id": 1, "results": [82, 85, 88]},
        {"_id": 2, "results": [75, 88, 89]},
    ],
    "survey": [
        {"_id": 1, "results": [{"product": "abc", "score": 10}, {"product": "xyz", "score": 5}]},
        {"_id": 2, "results": [{"product": "abc", "score": 8}, {"product": "xyz", "score": 7}]},
        {"_id": 3, "results": [{"product": "abc", "score": 7}, {"product": "xyz", "score": 8}]},
        {"_id": 4, "results": [{"product": "abc", "score": 7}, {"product": "def", "score": 8}]},
        {"_id": 5, "results": {"product": "xyz", "score": 7}},
    ],
    # $mod page
    "mod_inventory": [
        {"_id": 1, "item": "abc123", "qty": 0},
        {"_id": 2, "item": "xyz123", "qty": 5},
        {"_id": 3, "item": "ijk123", "qty": 12},
        {"_id": 4, "item": "neg", "qty": -12},
        {"_id": 5, "item": "flt", "qty": 12.9},
    ],
    # Query on embedded/nested documents tutorial
    "nested": [
        {"_id": 1, "item": "journal", "qty": 25, "size": {"h": 14, "w": 21, "uom": "cm"}, "status": "A"},
        {"_id": 2, "item": "notebook", "qty": 50, "size": {"h": 8.5, "w": 11, "uom": "in"}, "status": "A"},
        {"_id": 3, "item": "paper", "qty": 100, "size": {"h": 8.5, "w": 11, "uom": "in"}, "status": "D"},
        {"_id": 4, "item": "planner", "qty": 75, "size": {"h": 22.85, "w": 30, "uom": "cm"}, "status": "D"},
        {"_id": 5, "item": "postcard", "qty": 45, "size": {"h": 10, "w": 15.25, "uom": "cm"}, "status": "A"},
    ],
    # Query an array tutorial
    "arrays": [
        {"_id": 1, "item": "journal", "qty": 25, "tags": ["blank", "red"], "dim_cm": [14, 21]},
        {"_id": 2, "item": "notebook", "qty": 50, "tags": ["red", "blank"], "dim_cm": [14, 21]},
        {"_id": 3, "item": "paper", "qty": 100, "tags": ["red", "blank", "plain"], "dim_cm": [14, 21]},
        {"_id": 4, "item": "planner", "qty": 75, "tags": ["blank", "red"], "dim_cm": [22.85, 30]},
        {"_id": 5, "item": "postcard", "qty": 45, "tags": ["blue"], "dim_cm": [10, 15.25]},
    ],
    # Query an array of embedded documents tutorial
    "instock": [
        {"_id": 1, "item": "journal", "instock": [{"warehouse": "A", "qty": 5}, {"warehouse": "C", "qty": 15}]},
        {"_id": 2, "item": "notebook", "instock": [{"warehouse": "C", "qty": 5}]},
        {"_id": 3, "item": "paper", "instock": [{"warehouse": "A", "qty": 60}, {"warehouse": "B", "qty": 15}]},
        {"_id": 4, "item": "planner", "instock": [{"warehouse": "A", "qty": 40}, {"warehouse": "B", "qty": 5}]},
        {"_id": 5, "item": "postcard", "instock": [{"warehouse": "B", "qty": 15}, {"warehouse": "C", "qty": 35}]},
    ],
    # Query for null or missing fields tutorial
    "nulls": [{"_id": 1, "item": None}, {"_id": 2}],
    # $and/$or/$nor/$not pages
    "prices": [
        {"_id": 1, "price": 1.99, "sale": True, "qty": 10},
        {"_id": 2, "price": 2.5, "sale": False, "qty": 30},
        {"_id": 3, "price": 1.5, "qty": 100},
        {"_id": 4, "sale": True, "qty": 5},
        {"_id": 5, "item": "pencil"},
        {"_id": 6, "price": 1.99, "sale": False, "item": "pen"},
    ],
    # jstests/core/query/null_query_semantics.js (8.0+ semantics; undefined omitted)
    "null_semantics": [
        {"_id": "a_empty_subobject", "a": {}},
        {"_id": "a_null", "a": None},
        {"_id": "a_number", "a": 4},
        {"_id": "a_subobject_b_not_null", "a": {"b": "hi"}},
        {"_id": "a_subobject_b_null", "a": {"b": None}},
        {"_id": "no_a"},
        {"_id": "a_double_array", "a": [[]]},
        {"_id": "a_empty_array", "a": []},
        {"_id": "a_object_array_b_mix_null_missing", "a": [{"b": None}, {"b": None}, {}]},
        {"_id": "a_object_array_no_b_nulls", "a": [{"b": 1}, {"b": 3}, {"b": "string"}]},
        {"_id": "a_object_array_some_b_nulls", "a": [{"b": None}, {"b": 3}, {"b": None}]},
        {"_id": "a_object_array_some_b_missing", "a": [{"b": 3}, {}]},
        {"_id": "a_value_array_all_nulls", "a": [None, None]},
        {"_id": "a_value_array_no_nulls", "a": [1, "string", 4]},
        {"_id": "a_value_array_with_null", "a": [1, "string", None, 4]},
    ],
    # BSON type bracketing and numeric equality across widths
    "mixed": [
        {"_id": 1, "v": 1},
        {"_id": 2, "v": 1.0},
        {"_id": 3, "v": Int64(1)},
        {"_id": 4, "v": Decimal128("1")},
        {"_id": 5, "v": "1"},
        {"_id": 6, "v": True},
        {"_id": 7, "v": None},
        {"_id": 8},
        {"_id": 9, "v": float("nan")},
        {"_id": 10, "v": [1, 2]},
        {"_id": 11, "v": {"x": 1}},
        {"_id": 12, "v": DATE1},
        {"_id": 13, "v": OID1},
        {"_id": 14, "v": MinKey()},
        {"_id": 15, "v": MaxKey()},
        {"_id": 16, "v": 2.5},
        {"_id": 17, "v": "abc"},
        {"_id": 18, "v": Binary(b"\x01\x02")},
        {"_id": 19, "v": False},
        {"_id": 20, "v": 0},
    ],
}

ALL_IDS = {name: [d["_id"] for d in docs] for name, docs in COLLECTIONS.items()}
NULL_VALUE_ARRAYS = [
    "a_double_array",
    "a_empty_array",
    "a_value_array_all_nulls",
    "a_value_array_no_nulls",
    "a_value_array_with_null",
]

# (collection, filter, ids of the matching documents)
COLLECTION_CASES: list[tuple[str, dict[str, Any], list[Any]]] = [
    # $eq
    ("eq_inventory", {"qty": {"$eq": 20}}, [2, 5]),
    ("eq_inventory", {"qty": 20}, [2, 5]),
    ("eq_inventory", {"item.name": {"$eq": "ab"}}, [1]),
    ("eq_inventory", {"item.name": "ab"}, [1]),
    ("eq_inventory", {"tags": {"$eq": "B"}}, [1, 2, 3, 4]),
    ("eq_inventory", {"tags": "B"}, [1, 2, 3, 4]),
    ("eq_inventory", {"tags": {"$eq": ["A", "B"]}}, [3, 5]),
    ("eq_inventory", {"tags": ["A", "B"]}, [3, 5]),
    ("eq_inventory", {"tags": ["B", "A"]}, [4]),
    ("eq_inventory", {"tags": "A"}, [1, 3, 4]),
    ("eq_inventory", {"item": {"name": "ab", "code": "123"}}, [1]),
    ("eq_inventory", {"item": {"code": "123", "name": "ab"}}, []),
    ("eq_inventory", {"item.code": "123", "qty": {"$gte": 20}}, [2]),
    ("eq_inventory", {"tags.0": "A"}, [1, 3]),
    ("eq_inventory", {"tags.0": ["A", "B"]}, [5]),
    ("eq_inventory", {"tags.0.1": "B"}, [5]),
    ("companies", {"company": "MongoDB"}, [1]),
    ("companies", {"company": {"$eq": "MongoDB"}}, [1]),
    ("companies", {"company": {"$eq": Regex("MongoDB")}}, [3]),
    ("companies", {"company": Regex("MongoDB")}, [1, 2, 3]),
    ("companies", {"company": re.compile("MongoDB")}, [1, 2, 3]),
    ("companies", {"company": {"$in": ["MongoDB", "MongoDB2"]}}, [1, 2]),
    ("companies", {"company": {"$regex": "^MongoDB$"}}, [1]),
    # $gt / $gte / $lt / $lte / $ne
    ("carriers", {"quantity": {"$gt": 20}}, [1, 2]),
    ("carriers", {"quantity": {"$gte": 30}}, [1, 2]),
    ("carriers", {"quantity": {"$lt": 20}}, [3]),
    ("carriers", {"quantity": {"$lte": 10}}, [3]),
    ("carriers", {"carrier.fee": {"$gt": 2}}, [1, 2]),
    ("carriers", {"carrier.fee": {"$lte": 3}}, [1, 3]),
    ("carriers", {"quantity": {"$ne": 20}}, [1, 2, 3]),
    ("carriers", {"quantity": {"$ne": 30}}, [2, 3]),
    ("carriers", {"carrier.state": {"$ne": "NY"}}, [1, 2, 3]),
    ("carriers", {"quantity": {"$gt": 10, "$lt": 50}}, [1]),
    ("carriers", {"quantity": {"$gt": "10"}}, []),
    ("carriers", {"item": {"$gt": "c"}}, [1, 3]),
    ("carriers", {"item": {"$lt": "c"}}, [2]),
    ("carriers", {"carrier": {"$gt": {"name": "Shipit", "fee": 3}}}, [2]),
    # $in / $nin
    ("in_inventory", {"quantity": {"$in": [5, 15]}}, [2, 4]),
    ("in_inventory", {"tags": {"$in": ["home", "school"]}}, [1, 2, 4]),
    ("in_inventory", {"tags": {"$in": [re.compile("^be"), re.compile("^st")]}}, [3, 4]),
    ("in_inventory", {"tags": {"$in": [Regex("^OFF", "i")]}}, [1, 3]),
    ("in_inventory", {"quantity": {"$nin": [5, 15]}}, [1, 3]),
    ("in_inventory", {"tags": {"$nin": ["school"]}}, [3]),
    ("in_inventory", {"tags": {"$nin": ["school", "office"]}}, []),
    ("in_inventory", {"quantity": {"$in": []}}, []),
    ("in_inventory", {"quantity": {"$nin": []}}, [1, 2, 3, 4]),
    ("in_inventory", {"quantity": {"$in": [None]}}, [3]),
    ("in_inventory", {"quantity": {"$nin": [None]}}, [1, 2, 4]),
    ("in_inventory", {"tags": {"$in": [["school", "home"]]}}, [2]),
    # $exists
    ("records", {"a": {"$exists": True}}, [1, 2, 3, 4]),
    ("records", {"b": {"$exists": False}}, [7]),
    ("records", {"c": {"$exists": False}}, [6]),
    ("records", {"a": {"$exists": 1}}, [1, 2, 3, 4]),
    ("records", {"a": {"$exists": 0}}, [5, 6, 7]),
    ("records", {"a": {"$exists": "false"}}, [1, 2, 3, 4]),
    ("records", {"a": {"$exists": None}}, [5, 6, 7]),
    ("records", {"a": {"$exists": True, "$nin": [5, 15]}}, [2, 3, 4]),
    ("records", {"a": None}, [3, 5, 6, 7]),
    ("records", {"a": {"$type": "null"}}, [3]),
    ("records", {"a": {"$ne": None}}, [1, 2, 4]),
    # $type
    ("address_book", {"zipCode": {"$type": 2}}, [1, 5]),
    ("address_book", {"zipCode": {"$type": "string"}}, [1, 5]),
    ("address_book", {"zipCode": {"$type": 1}}, [2]),
    ("address_book", {"zipCode": {"$type": "double"}}, [2]),
    ("address_book", {"zipCode": {"$type": "number"}}, [2, 3, 4]),
    ("address_book", {"zipCode": {"$type": "long"}}, [3]),
    ("address_book", {"zipCode": {"$type": 16}}, [4]),
    ("address_book", {"zipCode": {"$type": "int"}}, [4]),
    ("address_book", {"zipCode": {"$type": "array"}}, [5]),
    ("address_book", {"zipCode": {"$type": 4}}, [5]),
    ("address_book", {"zipCode": {"$type": 2.0}}, [1, 5]),
    ("grades", {"classAverage": {"$type": [2, 1]}}, [1, 2, 3]),
    ("grades", {"classAverage": {"$type": ["string", "double"]}}, [1, 2, 3]),
    ("grades", {"classAverage": {"$type": ["int"]}}, [4]),
    ("grades", {"classAverage": {"$type": []}}, []),
    ("readings", {"readings": {"$type": "array"}}, [1, 2, 3, 4]),
    ("readings", {"readings": {"$type": "number"}}, [1, 2, 3, 5]),
    ("restaurants", {"grades.grade": {"$type": "minKey"}}, [2]),
    ("restaurants", {"grades.grade": {"$type": "maxKey"}}, [3]),
    ("restaurants", {"grades.grade": {"$type": -1}}, [2]),
    ("restaurants", {"grades.grade": {"$type": 127}}, [3]),
    ("restaurants", {"grades.grade": {"$lt": MaxKey()}}, [1, 2]),
    ("restaurants", {"grades.grade": {"$gt": MinKey()}}, [1, 2, 3]),
    ("restaurants", {"grades.grade": MinKey()}, [2]),
    # $regex
    ("products", {"sku": {"$regex": Regex("789$")}}, [101, 103, 104]),
    ("products", {"sku": {"$regex": "789$"}}, [101, 103, 104]),
    ("products", {"sku": Regex("789$")}, [101, 103, 104]),
    ("products", {"sku": {"$regex": Regex("^ABC", "i")}}, [100, 101, 104]),
    ("products", {"sku": {"$regex": "^ABC", "$options": "i"}}, [100, 101, 104]),
    ("products", {"sku": {"$options": "i", "$regex": "^ABC"}}, [100, 101, 104]),
    ("products", {"sku": re.compile("^ABC", re.IGNORECASE)}, [100, 101, 104]),
    ("products", {"description": {"$regex": "^S", "$options": "m"}}, [100, 101, 104]),
    ("products", {"description": {"$regex": "^S"}}, [100, 104]),
    ("products", {"description": {"$regex": Regex("S"), "$options": "m"}}, [100, 101, 104]),
    ("products", {"description": {"$regex": "m.*line", "$options": "si"}}, [102, 103]),
    ("products", {"description": {"$regex": "m.*line", "$options": "i"}}, [102]),
    ("products", {"sku": {"$regex": "abc #category code\n123 #item number", "$options": "x"}}, [100]),
    ("products", {"sku": {"$in": [re.compile("^abc"), "xyz456"]}}, [100, 101, 102]),
    ("products", {"sku": {"$not": re.compile("^abc", re.I)}}, [102, 103]),
    ("products", {"sku": {"$not": {"$regex": "^abc"}}}, [102, 103, 104]),
    ("products", {"sku": {"$nin": [re.compile("^xyz")]}}, [100, 101, 104]),
    ("products", {"description": {"$regex": r"line\z"}}, [101, 102]),
    ("products", {"sku": {"$regex": r"(?<prefix>abc)\d+"}}, [100, 101]),
    ("products", {"sku": {"$regex": ""}}, [100, 101, 102, 103, 104]),
    # $all
    ("all_inventory", {"tags": {"$all": ["appliance", "school", "book"]}}, [1, 2]),
    ("all_inventory", {"tags": {"$all": ["school"]}}, [1, 2, 3, 4]),
    ("all_inventory", {"tags": {"$all": []}}, []),
    ("all_inventory", {"tags": {"$all": [re.compile("^elec"), "school"]}}, [4]),
    (
        "all_inventory",
        {
            "qty": {
                "$all": [
                    {"$elemMatch": {"size": "M", "num": {"$gt": 50}}},
                    {"$elemMatch": {"num": 100, "color": "green"}},
                ]
            }
        },
        [3, 4],
    ),
    ("all_inventory", {"qty.num": {"$all": [50]}}, [2]),
    ("all_inventory", {"qty.num": 50}, [2]),
    ("all_inventory", {"qty.num": {"$all": [10, 100]}}, [1, 3]),
    ("all_inventory", {"code": {"$all": ["xyz"]}}, [1]),
    # $elemMatch
    ("scores", {"results": {"$elemMatch": {"$gte": 80, "$lt": 85}}}, [1]),
    ("scores", {"results": {"$gte": 80, "$lt": 85}}, [1, 2]),
    ("scores", {"results": {"$elemMatch": {"$gt": 88}}}, [2]),
    ("scores", {"results": {"$elemMatch": {"$in": [75, 100]}}}, [2]),
    ("scores", {"results": {"$elemMatch": {"$not": {"$gte": 80}}}}, [2]),
    ("survey", {"results": {"$elemMatch": {"product": "xyz", "score": {"$gte": 8}}}}, [3]),
    ("survey", {"results": {"$elemMatch": {"product": "xyz"}}}, [1, 2, 3]),
    ("survey", {"results.product": "xyz"}, [1, 2, 3, 5]),
    ("survey", {"results": {"$elemMatch": {"product": {"$ne": "xyz"}}}}, [1, 2, 3, 4]),
    ("survey", {"results.product": {"$ne": "xyz"}}, [4]),
    ("survey", {"results": {"$elemMatch": {}}}, [1, 2, 3, 4]),
    ("survey", {"results": {"$elemMatch": {"$or": [{"score": 10}, {"product": "def"}]}}}, [1, 4]),
    ("survey", {"results": {"$elemMatch": {"product": "abc", "score": {"$lt": 8}}}}, [3, 4]),
    ("survey", {"results.product": "abc", "results.score": {"$lt": 8}}, [1, 2, 3, 4]),
    # $mod
    ("mod_inventory", {"qty": {"$mod": [4, 0]}}, [1, 3, 4, 5]),
    ("mod_inventory", {"qty": {"$mod": [4.0, 0]}}, [1, 3, 4, 5]),
    ("mod_inventory", {"qty": {"$mod": [4.5, 0]}}, [1, 3, 4, 5]),
    ("mod_inventory", {"qty": {"$mod": [4.99, 0]}}, [1, 3, 4, 5]),
    ("mod_inventory", {"qty": {"$mod": [5, 0]}}, [1, 2]),
    ("mod_inventory", {"qty": {"$mod": [5, 2]}}, [3, 5]),
    ("mod_inventory", {"qty": {"$mod": [5, -2]}}, [4]),
    ("mod_inventory", {"qty": {"$mod": [-5, 2]}}, [3, 5]),
    ("mod_inventory", {"item": {"$mod": [2, 0]}}, []),
    # Embedded documents
    ("nested", {"size": {"h": 14, "w": 21, "uom": "cm"}}, [1]),
    ("nested", {"size": {"w": 21, "h": 14, "uom": "cm"}}, []),
    ("nested", {"size": {"h": 14, "w": 21}}, []),
    ("nested", {"size.uom": "in"}, [2, 3]),
    ("nested", {"size.h": {"$lt": 15}}, [1, 2, 3, 5]),
    ("nested", {"size.h": {"$lt": 15}, "size.uom": "in", "status": "D"}, [3]),
    ("nested", {"status": "A", "$or": [{"qty": {"$lt": 30}}, {"item": re.compile("^p")}]}, [1, 5]),
    ("nested", {"status": {"$in": ["A", "D"]}}, [1, 2, 3, 4, 5]),
    ("nested", {"status": "A", "qty": {"$lt": 30}}, [1]),
    ("nested", {"$or": [{"status": "A"}, {"qty": {"$lt": 30}}]}, [1, 2, 5]),
    ("nested", {"size.h.x": None}, [1, 2, 3, 4, 5]),
    ("nested", {"size.h.x": {"$exists": True}}, []),
    # Arrays
    ("arrays", {"tags": ["red", "blank"]}, [2]),
    ("arrays", {"tags": {"$all": ["red", "blank"]}}, [1, 2, 3, 4]),
    ("arrays", {"tags": "red"}, [1, 2, 3, 4]),
    ("arrays", {"dim_cm": {"$gt": 25}}, [4]),
    ("arrays", {"dim_cm": {"$gt": 15, "$lt": 20}}, [1, 2, 3, 5]),
    ("arrays", {"dim_cm": {"$elemMatch": {"$gt": 22, "$lt": 30}}}, [4]),
    ("arrays", {"dim_cm.1": {"$gt": 25}}, [4]),
    ("arrays", {"tags": {"$size": 3}}, [3]),
    ("arrays", {"tags": {"$size": 2}}, [1, 2, 4]),
    ("arrays", {"tags": {"$size": 0}}, []),
    ("arrays", {"dim_cm.5": {"$exists": False}}, [1, 2, 3, 4, 5]),
    ("arrays", {"dim_cm.0": {"$exists": True}}, [1, 2, 3, 4, 5]),
    ("arrays", {"dim_cm.2": None}, [1, 2, 3, 4, 5]),
    ("arrays", {"tags.01": "red"}, []),
    # Arrays of embedded documents
    ("instock", {"instock": {"warehouse": "A", "qty": 5}}, [1]),
    ("instock", {"instock": {"qty": 5, "warehouse": "A"}}, []),
    ("instock", {"instock.0.qty": {"$lte": 20}}, [1, 2, 5]),
    ("instock", {"instock.qty": {"$lte": 20}}, [1, 2, 3, 4, 5]),
    ("instock", {"instock": {"$elemMatch": {"qty": 5, "warehouse": "A"}}}, [1]),
    ("instock", {"instock": {"$elemMatch": {"qty": {"$gt": 10, "$lte": 20}}}}, [1, 3, 5]),
    ("instock", {"instock.qty": {"$gt": 10, "$lte": 20}}, [1, 3, 4, 5]),
    ("instock", {"instock.qty": 5, "instock.warehouse": "A"}, [1, 4]),
    ("instock", {"instock.1.warehouse": "B"}, [3, 4]),
    ("instock", {"instock.warehouse": {"$nin": ["A", "B"]}}, [2]),
    ("instock", {"instock.qty": {"$size": 2}}, []),
    ("instock", {"instock": {"$size": 1}}, [2]),
    # Null or missing fields
    ("nulls", {"item": None}, [1, 2]),
    ("nulls", {"item": {"$eq": None}}, [1, 2]),
    ("nulls", {"item": {"$type": 10}}, [1]),
    ("nulls", {"item": {"$exists": False}}, [2]),
    ("nulls", {"item": {"$ne": None}}, []),
    ("nulls", {"item": {"$gte": None}}, [1, 2]),
    ("nulls", {"item": {"$lte": None}}, [1, 2]),
    ("nulls", {"item": {"$gt": None}}, []),
    ("nulls", {"item": {"$lt": None}}, []),
    # $and / $or / $nor / $not
    ("prices", {"$and": [{"price": {"$ne": 1.99}}, {"price": {"$exists": True}}]}, [2, 3]),
    ("prices", {"$or": [{"qty": {"$lt": 20}}, {"price": 1.5}]}, [1, 3, 4]),
    ("prices", {"$nor": [{"price": 1.99}, {"sale": True}]}, [2, 3, 5]),
    ("prices", {"$nor": [{"price": 1.99}, {"qty": {"$lt": 20}}, {"sale": True}]}, [2, 3, 5]),
    ("prices", {"price": {"$not": {"$gt": 1.99}}}, [1, 3, 4, 5, 6]),
    ("prices", {"price": {"$lte": 1.99}}, [1, 3, 6]),
    ("prices", {"item": {"$not": re.compile("^p.*")}}, [1, 2, 3, 4]),
    ("prices", {"item": {"$not": {"$regex": "^p.*"}}}, [1, 2, 3, 4]),
    ("prices", {"$and": [{"$or": [{"qty": {"$lt": 10}}, {"qty": {"$gt": 50}}]}, {"sale": True}]}, [4]),
    ("prices", {"$and": [{"price": 1.99}], "sale": False}, [6]),
    ("prices", {"$or": [{"price": {"$exists": False}}], "$comment": "no price"}, [4, 5]),
    ("prices", {"sale": {"$in": [True, False]}}, [1, 2, 4, 6]),
    ("prices", {"sale": {"$not": {"$eq": True}}}, [2, 3, 5, 6]),
    ("prices", {"price": {"$not": {"$gt": 1, "$lt": 2}}}, [2, 4, 5]),
    # null semantics (server jstests)
    ("null_semantics", {"a": {"$eq": None}}, ["a_null", "no_a", "a_value_array_all_nulls", "a_value_array_with_null"]),
    (
        "null_semantics",
        {"a": {"$ne": None}},
        [
            "a_empty_subobject",
            "a_number",
            "a_subobject_b_not_null",
            "a_subobject_b_null",
            "a_double_array",
            "a_empty_array",
            "a_object_array_b_mix_null_missing",
            "a_object_array_no_b_nulls",
            "a_object_array_some_b_nulls",
            "a_object_array_some_b_missing",
            "a_value_array_no_nulls",
        ],
    ),
    ("null_semantics", {"a": {"$in": [None, 75]}}, ["a_null", "no_a", "a_value_array_all_nulls", "a_value_array_with_null"]),
    ("null_semantics", {"a": {"$elemMatch": {"$eq": None}}}, ["a_value_array_all_nulls", "a_value_array_with_null"]),
    ("null_semantics", {"a": {"$exists": False}}, ["no_a"]),
    (
        "null_semantics",
        {"a.b": {"$eq": None}},
        [
            "a_empty_subobject",
            "a_null",
            "a_number",
            "a_subobject_b_null",
            "no_a",
            "a_object_array_b_mix_null_missing",
            "a_object_array_some_b_nulls",
            "a_object_array_some_b_missing",
            *NULL_VALUE_ARRAYS,
        ],
    ),
    ("null_semantics", {"a.b": {"$ne": None}}, ["a_subobject_b_not_null", "a_object_array_no_b_nulls"]),
    ("null_semantics", {"a.b": {"$nin": [None, 75]}}, ["a_subobject_b_not_null", "a_object_array_no_b_nulls"]),
    (
        "null_semantics",
        {"a.b": {"$exists": False}},
        ["a_empty_subobject", "a_null", "a_number", "no_a", *NULL_VALUE_ARRAYS],
    ),
    (
        "null_semantics",
        {"a.b": {"$exists": True}},
        [
            "a_subobject_b_not_null",
            "a_subobject_b_null",
            "a_object_array_b_mix_null_missing",
            "a_object_array_no_b_nulls",
            "a_object_array_some_b_nulls",
            "a_object_array_some_b_missing",
        ],
    ),
    (
        "null_semantics",
        {"a": {"$elemMatch": {"b": {"$eq": None}}}},
        [
            "a_double_array",
            "a_object_array_b_mix_null_missing",
            "a_object_array_some_b_nulls",
            "a_object_array_some_b_missing",
        ],
    ),
    (
        "null_semantics",
        {"a": {"$elemMatch": {"b": {"$ne": None}}}},
        ["a_object_array_no_b_nulls", "a_object_array_some_b_nulls", "a_object_array_some_b_missing"],
    ),
    ("null_semantics", {"a.b": {"$elemMatch": {"$eq": None}}}, []),
    ("null_semantics", {"a.b": {"$elemMatch": {"$ne": None}}}, []),
    (
        "null_semantics",
        {"a": {"$elemMatch": {"$ne": None}}},
        [
            "a_double_array",
            "a_object_array_b_mix_null_missing",
            "a_object_array_no_b_nulls",
            "a_object_array_some_b_nulls",
            "a_object_array_some_b_missing",
            "a_value_array_no_nulls",
            "a_value_array_with_null",
        ],
    ),
    (
        "null_semantics",
        {"a": {"$not": {"$gte": None}}},
        [
            "a_empty_subobject",
            "a_number",
            "a_subobject_b_not_null",
            "a_subobject_b_null",
            "a_double_array",
            "a_empty_array",
            "a_object_array_b_mix_null_missing",
            "a_object_array_no_b_nulls",
            "a_object_array_some_b_nulls",
            "a_object_array_some_b_missing",
            "a_value_array_no_nulls",
        ],
    ),
    (
        "null_semantics",
        {"a": {"$nin": [None, []]}},
        [
            "a_empty_subobject",
            "a_number",
            "a_subobject_b_not_null",
            "a_subobject_b_null",
            "a_object_array_b_mix_null_missing",
            "a_object_array_no_b_nulls",
            "a_object_array_some_b_nulls",
            "a_object_array_some_b_missing",
            "a_value_array_no_nulls",
        ],
    ),
    (
        "null_semantics",
        {"a.b": {"$in": [None, 75]}},
        [
            "a_empty_subobject",
            "a_null",
            "a_number",
            "a_subobject_b_null",
            "no_a",
            "a_object_array_b_mix_null_missing",
            "a_object_array_some_b_nulls",
            "a_object_array_some_b_missing",
            *NULL_VALUE_ARRAYS,
        ],
    ),
    # Type bracketing and numeric widths
    ("mixed", {"v": 1}, [1, 2, 3, 4, 10]),
    ("mixed", {"v": Int64(1)}, [1, 2, 3, 4, 10]),
    ("mixed", {"v": Decimal128("1.0")}, [1, 2, 3, 4, 10]),
    ("mixed", {"v": 1.0}, [1, 2, 3, 4, 10]),
    ("mixed", {"v": "1"}, [5]),
    ("mixed", {"v": True}, [6]),
    ("mixed", {"v": False}, [19]),
    ("mixed", {"v": 0}, [20]),
    ("mixed", {"v": None}, [7, 8]),
    ("mixed", {"v": float("nan")}, [9]),
    ("mixed", {"v": {"$gt": 0}}, [1, 2, 3, 4, 10, 16]),
    ("mixed", {"v": {"$gte": 1, "$lte": 1}}, [1, 2, 3, 4, 10]),
    ("mixed", {"v": {"$lt": 2}}, [1, 2, 3, 4, 10, 20]),
    ("mixed", {"v": {"$gt": float("nan")}}, []),
    ("mixed", {"v": {"$gte": float("nan")}}, [9]),
    ("mixed", {"v": {"$lt": float("nan")}}, []),
    ("mixed", {"v": {"$gt": "0"}}, [5, 17]),
    ("mixed", {"v": {"$gte": DATE1}}, [12]),
    ("mixed", {"v": {"$lt": DATE2}}, [12]),
    ("mixed", {"v": {"$gt": MinKey()}}, [i for i in range(1, 21) if i != 14]),
    ("mixed", {"v": {"$lt": MaxKey()}}, [i for i in range(1, 21) if i != 15]),
    ("mixed", {"v": {"$lte": MaxKey()}}, list(range(1, 21))),
    ("mixed", {"v": {"$gt": False}}, [6]),
    ("mixed", {"v": {"$gte": {"x": 0}}}, [11]),
    ("mixed", {"v": {"$gt": [1]}}, [10]),
    ("mixed", {"v": {"$lt": [1]}}, []),
    ("mixed", {"v": {"$eq": [1, 2]}}, [10]),
    ("mixed", {"v": {"$eq": OID1}}, [13]),
    ("mixed", {"v": {"$gt": ObjectId("000000000000000000000000")}}, [13]),
    ("mixed", {"v": Binary(b"\x01\x02")}, [18]),
    ("mixed", {"v": {"$in": [2.5, "abc", OID1]}}, [13, 16, 17]),
    ("mixed", {"v": {"$in": [Decimal128("2.5"), 1]}}, [1, 2, 3, 4, 10, 16]),
    ("mixed", {"v": {"$in": [True]}}, [6]),
    ("mixed", {"v": {"$in": [0]}}, [20]),
    ("mixed", {"v": {"$type": "bool"}}, [6, 19]),
    ("mixed", {"v": {"$type": "decimal"}}, [4]),
    ("mixed", {"v": {"$type": "date"}}, [12]),
    ("mixed", {"v": {"$type": "objectId"}}, [13]),
    ("mixed", {"v": {"$type": "object"}}, [11]),
    ("mixed", {"v": {"$type": "binData"}}, [18]),
    ("mixed", {"v": {"$type": "number"}}, [1, 2, 3, 4, 9, 10, 16, 20]),
    ("mixed", {"v": {"$exists": False}}, [8]),
    ("mixed", {"v": {"$mod": [2, 1]}}, [1, 2, 3, 4, 10]),
    ("mixed", {"v": {"$size": 2}}, [10]),
    ("mixed", {"v.x": 1}, [11]),
    ("mixed", {"v": {"$bitsAllSet": [0]}}, [1, 2, 3, 4, 10, 18]),
    ("mixed", {"v": {"$bitsAnySet": 3}}, [1, 2, 3, 4, 10, 18]),
    ("mixed", {"v": {"$bitsAllClear": 1}}, [10, 20]),
    ("mixed", {"v": {"$bitsAnyClear": [0, 1]}}, [1, 2, 3, 4, 10, 18, 20]),
]


def _expand_collection_cases() -> list[Any]:
    rows = []
    for name, filt, expected in COLLECTION_CASES:
        assert set(expected) <= set(ALL_IDS[name]), (name, filt, expected)
        for doc in COLLECTIONS[name]:
            rows.append(pytest.param(doc, filt, doc["_id"] in expected, id=f"{name}-{filt}-{doc['_id']}"))
    return rows


@pytest.mark.parametrize(("doc", "filt", "expected"), _expand_collection_cases())
def test_collection_examples(doc: dict[str, Any], filt: dict[str, Any], expected: bool) -> None:
    assert compile_filter(filt).matches(doc) is expected


@pytest.mark.parametrize(("name", "filt", "expected"), COLLECTION_CASES)
def test_collection_examples_as_find(name: str, filt: dict[str, Any], expected: list[Any]) -> None:
    matcher = compile_filter(filt)
    assert [d["_id"] for d in COLLECTIONS[name] if matcher.matches(d)] == [
        i for i in ALL_IDS[name] if i in expected
    ]


# ---------------------------------------------------------------------------
# Single-document rows: (doc, filter, expected)
# ---------------------------------------------------------------------------

DOC_CASES: list[tuple[dict[str, Any], dict[str, Any] | None, bool]] = [
    # empty filters
    ({"a": 1}, None, True),
    ({"a": 1}, {}, True),
    ({}, {}, True),
    ({}, {"$comment": "anything"}, True),
    # implicit equality, arrays and documents
    ({"a": 1}, {"a": 1}, True),
    ({"a": 1}, {"a": 2}, False),
    ({"a": [1, 2, 3]}, {"a": 2}, True),
    ({"a": [1, 2, 3]}, {"a": [1, 2, 3]}, True),
    ({"a": [1, 2, 3]}, {"a": [1, 2]}, False),
    ({"a": [1, 2, 3]}, {"a": [3, 2, 1]}, False),
    ({"a": [[1, 2], 3]}, {"a": [1, 2]}, True),
    ({"a": [[1, 2], 3]}, {"a": 1}, False),
    ({"a": [[1]]}, {"a": [[1]]}, True),
    ({"a": []}, {"a": []}, True),
    ({"a": [[]]}, {"a": []}, True),
    ({"a": []}, {"a": None}, False),
    ({"a": {"b": 1}}, {"a": {"b": 1}}, True),
    ({"a": {"b": 1, "c": 2}}, {"a": {"b": 1}}, False),
    ({"a": {"b": 1, "c": 2}}, {"a": {"c": 2, "b": 1}}, False),
    ({"a": [{"b": 1}, {"b": 2}]}, {"a": {"b": 2}}, True),
    ({"a": {"b": {"c": 1}}}, {"a.b": {"c": 1}}, True),
    ({"a": {"b": {"c": 1}}}, {"a.b.c": 1}, True),
    ({"a": {}}, {"a": {}}, True),
    ({"a": {"$ref": "coll", "$id": 1}}, {"a": {"$ref": "coll", "$id": 1}}, True),
    ({"a": 1, "b": 2}, {"a": 1, "b": 2}, True),
    ({"a": 1, "b": 2}, {"a": 1, "b": 3}, False),
    ({"": 5}, {"": 5}, True),
    # dotted paths through arrays of documents
    ({"a": [{"b": 1}, {"b": 2}]}, {"a.b": 1}, True),
    ({"a": [{"b": 1}, {"b": 2}]}, {"a.b": 2}, True),
    ({"a": [{"b": 1}, {"b": 2}]}, {"a.b": 3}, False),
    ({"a": [{"b": 1}, {"b": 2}]}, {"a.b": [1, 2]}, False),
    ({"a": [{"b": [1, 2]}, {"b": 3}]}, {"a.b": [1, 2]}, True),
    ({"a": [{"b": [1, 2]}, {"b": 3}]}, {"a.b": 2}, True),
    ({"a": [{"b": {"c": 5}}]}, {"a.b.c": 5}, True),
    ({"a": [{"b": [{"c": 5}]}]}, {"a.b.c": 5}, True),
    ({"a": {"b": [{"c": [5, 6]}]}}, {"a.b.c": 6}, True),
    ({"a": [[{"b": 1}]]}, {"a.b": 1}, False),
    ({"a": [1, {"b": 1}]}, {"a.b": 1}, True),
    ({"a": [1, {"b": 2}]}, {"a.b": None}, False),
    ({"a": [1, {"c": 2}]}, {"a.b": None}, True),
    # numeric path components
    ({"a": [10, 20, 30]}, {"a.1": 20}, True),
    ({"a": [10, 20, 30]}, {"a.1": 10}, False),
    ({"a": [10, 20, 30]}, {"a.3": None}, True),
    ({"a": [10, 20, 30]}, {"a.3": {"$exists": True}}, False),
    ({"a": [{"b": 1}, {"b": 2}]}, {"a.1.b": 2}, True),
    ({"a": [{"b": 1}, {"b": 2}]}, {"a.0.b": 2}, False),
    ({"a": {"1": "x"}}, {"a.1": "x"}, True),
    ({"a": [{"1": "x"}]}, {"a.1": "x"}, True),
    ({"a": [[1, 2], [3, 4]]}, {"a.1": [3, 4]}, True),
    ({"a": [[1, 2], [3, 4]]}, {"a.1.0": 3}, True),
    ({"a": [[1, 2], [3, 4]]}, {"a.0.1": 4}, False),
    ({"a": [[{"b": 7}]]}, {"a.0.b": 7}, True),
    ({"a": [{"b": [1, 2]}]}, {"a.b.1": 2}, True),
    ({"a": [{"b": [1, 2]}]}, {"a.0.b.1": 2}, True),
    ({"a": {"b": [{"c": 1}, {"c": 2}]}}, {"a.b.1.c": 2}, True),
    ({"a": [1, 2]}, {"a.-1": 2}, False),
    # scalar in the middle of a path
    ({"a": 5}, {"a.b": None}, True),
    ({"a": 5}, {"a.b": {"$exists": False}}, True),
    ({"a": "str"}, {"a.length": 3}, False),
    ({"a": None}, {"a.b": None}, True),
    # $eq / $ne
    ({"a": 1}, {"a": {"$eq": 1}}, True),
    ({"a": [1, 2]}, {"a": {"$ne": 1}}, False),
    ({"a": [1, 2]}, {"a": {"$ne": 3}}, True),
    ({"a": [1, 2]}, {"a": {"$ne": [1, 2]}}, False),
    ({}, {"a": {"$ne": 1}}, True),
    ({"a": None}, {"a": {"$ne": None}}, False),
    ({"a": {"b": 1}}, {"a": {"$eq": {"b": 1}}}, True),
    ({"a": {"$gt": 1}}, {"a": {"$eq": {"$gt": 1}}}, True),
    ({"a": "x"}, {"a": {"$ne": re.compile("x")}}, True),
    ({"a": Regex("x")}, {"a": {"$ne": Regex("x")}}, False),
    # comparisons
    ({"a": 5}, {"a": {"$gt": 4}}, True),
    ({"a": 5}, {"a": {"$gt": 5}}, False),
    ({"a": 5}, {"a": {"$gte": 5}}, True),
    ({"a": 5}, {"a": {"$lt": 5.5}}, True),
    ({"a": 5}, {"a": {"$lte": Decimal128("5")}}, True),
    ({"a": Decimal128("5.5")}, {"a": {"$gt": 5}}, True),
    ({"a": Decimal128("NaN")}, {"a": {"$gt": 5}}, False),
    ({"a": Decimal128("NaN")}, {"a": float("nan")}, True),
    ({"a": Int64(2**40)}, {"a": {"$gt": 2**39}}, True),
    ({"a": 2**53 + 1}, {"a": float(2**53)}, False),
    ({"a": 2**53 + 1}, {"a": {"$gt": float(2**53)}}, True),
    ({"a": "abc"}, {"a": {"$gt": 5}}, False),
    ({"a": 5}, {"a": {"$gt": "abc"}}, False),
    ({"a": "b"}, {"a": {"$gt": "abc"}}, True),
    ({"a": "B"}, {"a": {"$gt": "a"}}, False),
    ({"a": [1, 10]}, {"a": {"$gt": 5, "$lt": 8}}, True),
    ({"a": [1, 10]}, {"a": {"$elemMatch": {"$gt": 5, "$lt": 8}}}, False),
    ({"a": [[6]]}, {"a": {"$gt": 5}}, False),
    ({"a": [6, [7]]}, {"a": {"$gt": [6]}}, True),
    ({"a": True}, {"a": {"$gt": 0}}, False),
    ({"a": DATE2}, {"a": {"$gt": DATE1}}, True),
    ({"a": DATE1}, {"a": {"$gt": 0}}, False),
    ({"a": DATE1.replace(tzinfo=datetime.UTC)}, {"a": DATE1}, True),
    ({}, {"a": {"$gt": MinKey()}}, True),
    ({}, {"a": {"$lt": MaxKey()}}, True),
    ({}, {"a": {"$gt": 0}}, False),
    ({}, {"a": {"$lte": None}}, True),
    ({"a": [None, 1]}, {"a": {"$gt": None}}, False),
    ({"a": MinKey()}, {"a": {"$lt": 0}}, False),
    ({"a": MinKey()}, {"a": {"$lte": MinKey()}}, True),
    ({"a": MaxKey()}, {"a": {"$gt": MinKey()}}, True),
    ({"a": float("inf")}, {"a": {"$gt": 1e308}}, True),
    ({"a": float("-inf")}, {"a": {"$lt": -1e308}}, True),
    ({"a": float("nan")}, {"a": {"$lt": float("inf")}}, False),
    ({"a": float("nan")}, {"a": {"$lte": float("nan")}}, True),
    # $in / $nin
    ({"a": 1}, {"a": {"$in": [1, 2]}}, True),
    ({"a": [5, 6]}, {"a": {"$in": [6, 7]}}, True),
    ({"a": [5, 6]}, {"a": {"$in": [[5, 6]]}}, True),
    ({"a": [5, 6]}, {"a": {"$nin": [6, 7]}}, False),
    ({}, {"a": {"$nin": [1]}}, True),
    ({}, {"a": {"$in": [1]}}, False),
    ({"a": "Hello"}, {"a": {"$in": [re.compile("^h", re.I)]}}, True),
    ({"a": 1.0}, {"a": {"$in": [Int64(1)]}}, True),
    ({"a": Decimal128("2")}, {"a": {"$in": [1, 2, 3]}}, True),
    ({"a": {"b": 1}}, {"a": {"$in": [{"b": 1}]}}, True),
    ({"a": 1}, {"a": {"$in": [True]}}, False),
    ({"a": ObjectId("0" * 24)}, {"a": {"$in": [ObjectId("0" * 24)]}}, True),
    ({"a": list(range(50))}, {"a": {"$in": list(range(49, 100))}}, True),
    ({"a": list(range(50))}, {"a": {"$in": list(range(50, 100))}}, False),
    # $all
    ({"a": [1, 2, 3]}, {"a": {"$all": [1, 3]}}, True),
    ({"a": [1, 2, 3]}, {"a": {"$all": [1, 4]}}, False),
    ({"a": 1}, {"a": {"$all": [1]}}, True),
    ({"a": [[1, 2], 3]}, {"a": {"$all": [[1, 2]]}}, True),
    ({"a": [1, 2]}, {"a": {"$all": [[1, 2]]}}, True),
    ({"a": [{"b": 1, "c": 2}]}, {"a": {"$all": [{"$elemMatch": {"b": 1, "c": 2}}]}}, True),
    ({"a": [{"b": 1}, {"c": 2}]}, {"a": {"$all": [{"$elemMatch": {"b": 1, "c": 2}}]}}, False),
    ({"a": []}, {"a": {"$all": []}}, False),
    # $exists
    ({"a": None}, {"a": {"$exists": True}}, True),
    ({"a": []}, {"a": {"$exists": True}}, True),
    ({"a": [{"b": 1}]}, {"a.b": {"$exists": True}}, True),
    ({"a": [{"c": 1}]}, {"a.b": {"$exists": True}}, False),
    ({"a": [1, 2]}, {"a.b": {"$exists": True}}, False),
    ({"a": [{"c": 1}, {"b": None}]}, {"a.b": {"$exists": True}}, True),
    # $type
    ({"a": [1, "x"]}, {"a": {"$type": "string"}}, True),
    ({"a": [[1]]}, {"a": {"$type": "array"}}, True),
    ({"a": 2**40}, {"a": {"$type": "long"}}, True),
    ({"a": 7}, {"a": {"$type": "int"}}, True),
    ({"a": Regex("x")}, {"a": {"$type": "regex"}}, True),
    ({"a": re.compile("x")}, {"a": {"$type": 11}}, True),
    ({"a": {"b": 1}}, {"a": {"$type": "object"}}, True),
    ({}, {"a": {"$type": "null"}}, False),
    ({"a": None}, {"a": {"$not": {"$type": "string"}}}, True),
    # $size
    ({"a": [1, 2]}, {"a": {"$size": 2}}, True),
    ({"a": [1, 2]}, {"a": {"$size": 2.0}}, True),
    ({"a": [1, 2]}, {"a": {"$size": Int64(2)}}, True),
    ({"a": [1, 2]}, {"a": {"$size": 1}}, False),
    ({"a": []}, {"a": {"$size": 0}}, True),
    ({"a": [[1, 2]]}, {"a": {"$size": 1}}, True),
    ({"a": [[1, 2]]}, {"a": {"$size": 2}}, False),
    ({"a": "ab"}, {"a": {"$size": 2}}, False),
    ({}, {"a": {"$size": 0}}, False),
    ({"a": [{"b": [1, 2, 3]}, {"b": [1]}]}, {"a.b": {"$size": 3}}, True),
    ({"a": [1, 2]}, {"a": {"$not": {"$size": 2}}}, False),
    # $mod
    ({"a": 10}, {"a": {"$mod": [3, 1]}}, True),
    ({"a": -10}, {"a": {"$mod": [3, -1]}}, True),
    ({"a": -10}, {"a": {"$mod": [3, 2]}}, False),
    ({"a": 10.5}, {"a": {"$mod": [3, 1]}}, True),
    ({"a": Decimal128("10.9")}, {"a": {"$mod": [3, 1]}}, True),
    ({"a": float("nan")}, {"a": {"$mod": [3, 0]}}, False),
    ({"a": float("inf")}, {"a": {"$mod": [3, 0]}}, False),
    ({"a": [4, 7]}, {"a": {"$mod": [3, 1]}}, True),
    ({"a": True}, {"a": {"$mod": [2, 1]}}, False),
    # bit tests
    ({"a": 54}, {"a": {"$bitsAllSet": [1, 2, 4, 5]}}, True),
    ({"a": 54}, {"a": {"$bitsAllSet": 50}}, True),
    ({"a": 54}, {"a": {"$bitsAllClear": [0, 3]}}, True),
    ({"a": 54}, {"a": {"$bitsAnySet": [0, 1]}}, True),
    ({"a": 54}, {"a": {"$bitsAnyClear": [1, 2]}}, False),
    ({"a": -1}, {"a": {"$bitsAllSet": [0, 63, 200]}}, True),
    ({"a": 5.5}, {"a": {"$bitsAnySet": [0]}}, False),
    ({"a": float("inf")}, {"a": {"$bitsAnySet": [0]}}, False),
    ({"a": "5"}, {"a": {"$bitsAnySet": [0]}}, False),
    ({"a": Binary(b"\x20")}, {"a": {"$bitsAllSet": Binary(b"\x20")}}, True),
    ({"a": Binary(b"\x20")}, {"a": {"$bitsAnySet": [5, 20]}}, True),
    # $regex
    ({"a": "abc"}, {"a": {"$regex": "b"}}, True),
    ({"a": "abc"}, {"a": {"$regex": "^b"}}, False),
    ({"a": "ABC"}, {"a": {"$regex": "abc", "$options": "i"}}, True),
    ({"a": "a\nb"}, {"a": {"$regex": "a.b"}}, False),
    ({"a": "a\nb"}, {"a": {"$regex": "a.b", "$options": "s"}}, True),
    ({"a": "a\nb"}, {"a": {"$regex": "^b$", "$options": "m"}}, True),
    ({"a": "a b"}, {"a": {"$regex": "a b", "$options": "x"}}, False),
    ({"a": "ab"}, {"a": {"$regex": "a b", "$options": "x"}}, True),
    ({"a": ["x", "yz"]}, {"a": {"$regex": "z$"}}, True),
    ({"a": 123}, {"a": {"$regex": "1"}}, False),
    ({"a": Regex("^x", "i")}, {"a": Regex("^x", "i")}, True),
    ({"a": Regex("^x", "i")}, {"a": Regex("^x")}, False),
    ({"a": Regex("^x")}, {"a": re.compile("^x")}, True),
    ({"a": "café"}, {"a": {"$regex": "^caf.$"}}, True),
    ({"a": "x"}, {"a": {"$regex": Regex("X", "i")}}, True),
    ({"a": "x"}, {"a": {"$regex": re.compile("X", re.I)}}, True),
    ({"a": "a(b"}, {"a": {"$regex": r"a\(b"}}, True),
    ({"a": "2024-01-05"}, {"a": {"$regex": r"^\d{4}-\d{2}"}}, True),
    ({"a": "ab\n"}, {"a": {"$regex": r"b\Z"}}, True),
    ({"a": "ab\n"}, {"a": {"$regex": r"b\z"}}, False),
    ({"a": "ab\n"}, {"a": {"$regex": "b$"}}, True),
    ({"a": "a\\z"}, {"a": {"$regex": r"a\\z"}}, True),
    ({"a": "xyzzy"}, {"a": {"$regex": r"(?<first>x)(?=y)"}}, True),
    ({"a": "ab"}, {"a": {"$regex": r"(?<!x)b"}}, True),
    # $not
    ({"a": 5}, {"a": {"$not": {"$gt": 3}}}, False),
    ({"a": 2}, {"a": {"$not": {"$gt": 3}}}, True),
    ({}, {"a": {"$not": {"$gt": 3}}}, True),
    ({"a": [1, 5]}, {"a": {"$not": {"$gt": 3}}}, False),
    ({"a": "xyz"}, {"a": {"$not": re.compile("^x")}}, False),
    ({"a": 7}, {"a": {"$not": re.compile("^x")}}, True),
    ({"a": 5}, {"a": {"$not": {"$not": {"$gt": 3}}}}, True),
    ({"a": [1, 2]}, {"a": {"$not": {"$elemMatch": {"$gt": 1}}}}, False),
    ({"a": [1, 2]}, {"a": {"$not": {"$all": [1, 3]}}}, True),
    # $elemMatch
    ({"a": [1, 2, 3]}, {"a": {"$elemMatch": {"$gt": 2}}}, True),
    ({"a": [1, 2, 3]}, {"a": {"$elemMatch": {"$gt": 3}}}, False),
    ({"a": 5}, {"a": {"$elemMatch": {"$gt": 2}}}, False),
    ({"a": []}, {"a": {"$elemMatch": {}}}, False),
    ({"a": [1]}, {"a": {"$elemMatch": {}}}, False),
    ({"a": [{}]}, {"a": {"$elemMatch": {}}}, True),
    ({"a": [[1, 2]]}, {"a": {"$elemMatch": {"$elemMatch": {"$gt": 1}}}}, True),
    ({"a": [[1, 2]]}, {"a": {"$elemMatch": {"$gt": 1}}}, False),
    ({"a": [[1, 2]]}, {"a": {"$elemMatch": {"0": 1}}}, True),
    ({"a": [{"b": [1, 5]}]}, {"a": {"$elemMatch": {"b": {"$gt": 2, "$lt": 4}}}}, True),
    ({"a": [{"b": [1, 5]}]}, {"a": {"$elemMatch": {"b": {"$elemMatch": {"$gt": 2, "$lt": 4}}}}}, False),
    ({"a": [{"b": 1, "c": 1}, {"b": 2, "c": 2}]}, {"a": {"$elemMatch": {"b": 1, "c": 2}}}, False),
    ({"a": [{"b": 1, "c": 2}]}, {"a": {"$elemMatch": {"b": 1, "c": 2}}}, True),
    ({"x": [{"a": [{"b": 1}]}]}, {"x.a": {"$elemMatch": {"b": 1}}}, True),
    ({"a": [{"b": 1}]}, {"a": {"$elemMatch": {"$and": [{"b": 1}]}}}, True),
    ({"a": [{"b": 1}]}, {"a": {"$elemMatch": {"b": {"$exists": False}}}}, False),
    ({"a": [1, None]}, {"a": {"$elemMatch": {"$exists": True}}}, True),
    ({"a": [1, "x"]}, {"a": {"$elemMatch": {"$type": "string"}}}, True),
    ({"a": ["ab", "cd"]}, {"a": {"$elemMatch": {"$regex": "^c"}}}, True),
    ({"a": [3, 4]}, {"a": {"$elemMatch": {"$ne": 3}}}, True),
    ({"a": [3, 3]}, {"a": {"$elemMatch": {"$ne": 3}}}, False),
    ({"a": [3, 4]}, {"a": {"$elemMatch": {"$nin": [3, 4]}}}, False),
    ({"a": [[5]]}, {"a": {"$elemMatch": {"$size": 1}}}, True),
    ({"a": [[5]]}, {"a": {"$elemMatch": {"$all": [5]}}}, False),
    # $and / $or / $nor
    ({"a": 1}, {"$and": [{"a": 1}, {"a": {"$lt": 5}}]}, True),
    ({"a": 1}, {"$and": [{"a": 1}, {"a": {"$gt": 5}}]}, False),
    ({"a": 1}, {"$or": [{"a": 2}, {"b": None}]}, True),
    ({"a": 1}, {"$or": [{"a": 2}, {"b": 3}]}, False),
    ({"a": 1}, {"$nor": [{"a": 2}, {"b": 3}]}, True),
    ({"a": 1}, {"$nor": [{"a": 1}]}, False),
    ({"a": 1}, {"$or": [{}]}, True),
    ({"a": 1}, {"$nor": [{}]}, False),
    ({"a": 1}, {"$and": [{"$or": [{"a": 1}, {"a": 2}]}, {"$nor": [{"a": 3}]}]}, True),
    ({"a": [1, 2]}, {"$and": [{"a": 1}, {"a": 2}]}, True),
    ({"a": 1}, {"$alwaysTrue": 1}, True),
    ({"a": 1}, {"$alwaysFalse": 1}, False),
    # $expr
    ({"a": 5, "b": 3}, {"$expr": {"$gt": ["$a", "$b"]}}, True),
    ({"a": 2, "b": 3}, {"$expr": {"$gt": ["$a", "$b"]}}, False),
    ({"a": 3, "b": 3.0}, {"$expr": {"$eq": ["$a", "$b"]}}, True),
    ({"a": 3}, {"$expr": {"$eq": ["$a", "$b"]}}, False),
    ({"a": None}, {"$expr": {"$eq": ["$a", None]}}, True),
    ({}, {"$expr": {"$eq": ["$a", None]}}, False),
    ({}, {"$expr": {"$lt": ["$a", None]}}, True),
    ({"a": 1}, {"$expr": {"$lt": ["$a", "x"]}}, True),
    ({"a": [1, 2]}, {"$expr": {"$eq": ["$a", 1]}}, False),
    ({"a": [1, 2]}, {"$expr": {"$in": [2, "$a"]}}, True),
    ({"a": [1, 2]}, {"$expr": {"$eq": [{"$size": "$a"}, 2]}}, True),
    ({"a": {"b": 4}}, {"$expr": {"$eq": ["$a.b", 4]}}, True),
    ({"a": [{"b": 4}, {"b": 5}]}, {"$expr": {"$eq": ["$a.b", [4, 5]]}}, True),
    ({"a": 2, "b": 3}, {"$expr": {"$eq": [{"$add": ["$a", "$b"]}, 5]}}, True),
    ({"a": 2, "b": 3}, {"$expr": {"$lt": [{"$multiply": ["$a", "$b"]}, {"$subtract": [10, 3]}]}}, True),
    ({"a": 6}, {"$expr": {"$eq": [{"$divide": ["$a", 4]}, 1.5]}}, True),
    ({"a": 1}, {"$expr": {"$and": [{"$gt": ["$a", 0]}, {"$lt": ["$a", 2]}]}}, True),
    ({"a": 1}, {"$expr": {"$or": [{"$gt": ["$a", 5]}, {"$not": [{"$eq": ["$a", 2]}]}]}}, True),
    ({"a": 0}, {"$expr": "$a"}, False),
    ({"a": "x"}, {"$expr": "$a"}, True),
    ({}, {"$expr": {"$eq": [{"$ifNull": ["$a", 7]}, 7]}}, True),
    ({"a": 1}, {"$expr": {"$eq": [{"$cond": [{"$gt": ["$a", 0]}, "pos", "neg"]}, "pos"]}}, True),
    ({"a": "ab"}, {"$expr": {"$eq": [{"$concat": ["$a", "c"]}, "abc"]}}, True),
    ({"a": "Ab"}, {"$expr": {"$eq": [{"$toLower": "$a"}, "ab"]}}, True),
    ({"a": 1}, {"$expr": {"$eq": [{"$type": "$a"}, "int"]}}, True),
    ({}, {"$expr": {"$eq": [{"$type": "$a"}, "missing"]}}, True),
    ({"a": [1, 2, 3]}, {"$expr": {"$eq": [{"$arrayElemAt": ["$a", -1]}, 3]}}, True),
    ({"a": "$x"}, {"$expr": {"$eq": ["$a", {"$literal": "$x"}]}}, True),
    ({"a": {"b": 1}}, {"$expr": {"$eq": ["$$ROOT.a", {"b": 1}]}}, True),
    ({"a": -3}, {"$expr": {"$eq": [{"$abs": "$a"}, 3]}}, True),
    ({"a": 5, "b": 3}, {"$expr": {"$eq": [{"$cmp": ["$a", "$b"]}, 1]}}, True),
    ({"a": [1]}, {"$expr": {"$isArray": "$a"}}, True),
    # $expr runs oplog.expressions, so the whole expression language is available
    ({"a": 7}, {"$expr": {"$eq": [{"$switch": {"branches": [{"case": {"$gt": ["$a", 5]}, "then": "big"}], "default": "small"}}, "big"]}}, True),
    ({"a": 7}, {"$expr": {"$eq": [{"$toString": "$a"}, "7"]}}, True),
    ({"a": 2}, {"$expr": {"$let": {"vars": {"double": {"$multiply": ["$a", 2]}}, "in": {"$eq": ["$$double", 4]}}}}, True),
    ({"a": [1, 5, 9]}, {"$expr": {"$eq": [{"$size": {"$filter": {"input": "$a", "cond": {"$gt": ["$$this", 2]}}}}, 2]}}, True),
    ({"a": [1, 2]}, {"$expr": {"$eq": [{"$map": {"input": "$a", "as": "x", "in": {"$add": ["$$x", 1]}}}, [2, 3]]}}, True),
    ({"a": "x"}, {"$expr": {"$eq": [{"$strLenCP": "$a"}, 1]}}, True),
    ({}, {"$expr": {"$gt": ["$a", MinKey()]}}, True),  # missing sorts above MinKey, as on the server
    ({"a": [[{"b": 1}]]}, {"$expr": {"$eq": ["$a.b", []]}}, True),  # paths skip nested arrays
]


@pytest.mark.parametrize(("doc", "filt", "expected"), DOC_CASES)
def test_doc_cases(doc: dict[str, Any], filt: dict[str, Any] | None, expected: bool) -> None:
    assert compile_filter(filt).matches(doc) is expected
    assert matches(doc, filt) is expected


# ---------------------------------------------------------------------------
# array_index (elemMatchKey) for the positional update operator
# ---------------------------------------------------------------------------

ARRAY_INDEX_CASES: list[tuple[dict[str, Any], dict[str, Any], int | None]] = [
    ({"_id": 1, "grades": [85, 80, 80]}, {"_id": 1, "grades": 80}, 1),
    ({"grades": [85, 80, 80]}, {"grades": {"$gte": 80}}, 0),
    ({"grades": [70, 87, 90]}, {"grades": {"$gte": 85}}, 1),
    ({"a": 5}, {"a": 5}, None),
    ({"a": [1, 2]}, {"a": [1, 2]}, None),
    ({"a": [[1, 2], 3]}, {"a": [1, 2]}, 0),
    ({"grades": [{"grade": 80}, {"grade": 85}, {"grade": 90}]}, {"grades.grade": 85}, 1),
    ({"a": [{"b": [1, 2]}]}, {"a.b": 2}, 0),
    ({"a": [{"b": [1, 2]}, {"b": [3, 4]}]}, {"a.b": 4}, 1),
    ({"a": {"b": [1, 2, 3]}}, {"a.b": 3}, 2),
    ({"a": [5, 6, 7]}, {"a": {"$elemMatch": {"$gt": 5}}}, 1),
    ({"a": [{"b": 1}, {"b": 2, "c": 3}]}, {"a": {"$elemMatch": {"b": 2, "c": 3}}}, 1),
    ({"x": [{"a": [1]}, {"a": [2, 9]}]}, {"x.a": {"$elemMatch": {"$gt": 5}}}, 1),
    ({"a": [1, 2, 3]}, {"a": {"$in": [3, 2]}}, 1),
    ({"a": [1, 2, 3]}, {"a.2": 3}, None),
    ({"a": [{"b": [3, 5]}]}, {"a.0.b": 5}, 1),
    ({"a": ["x", "yz"]}, {"a": {"$regex": "z"}}, 1),
    ({"a": [1, 2]}, {"a": {"$ne": 5}}, None),
    ({"a": [1, 2]}, {"$or": [{"a": 2}]}, None),
    ({"a": [1, 2], "b": [3, 4]}, {"a": 2, "b": 3}, 0),
    ({"a": [1, 2], "b": 4}, {"a": 2, "b": 4}, 1),
    ({"a": [1, 2]}, {"a": 3}, None),
    ({"students": [{"school": 100}, {"school": 102}]}, {"students": {"$elemMatch": {"school": 102}}}, 1),
    ({"a": [1, 5]}, {"a": {"$all": [5]}}, 1),
]


@pytest.mark.parametrize(("doc", "filt", "index"), ARRAY_INDEX_CASES)
def test_array_index(doc: dict[str, Any], filt: dict[str, Any], index: int | None) -> None:
    result = compile_filter(filt).match_result(doc)
    assert result.matched is (compile_filter(filt).matches(doc))
    if result.matched:
        assert result == MatchResult(True, index)
    else:
        assert result == MatchResult(False, None)


# ---------------------------------------------------------------------------
# Validation errors
# ---------------------------------------------------------------------------

ERROR_CASES: list[tuple[Any, int]] = [
    ({"a": {"$foo": 1}}, 2),
    ({"$foo": 1}, 2),
    ({"a": {"$gt": 1, "b": 2}}, 2),
    ({"a": {"$and": [{"b": 1}]}}, 2),
    ({"a": {"$in": 5}}, 2),
    ({"a": {"$in": {"x": 1}}}, 2),
    ({"a": {"$nin": "x"}}, 2),
    ({"a": {"$in": [{"$gt": 1}]}}, 2),
    ({"$and": []}, 2),
    ({"$or": []}, 2),
    ({"$nor": []}, 2),
    ({"$and": {"a": 1}}, 2),
    ({"$or": [1]}, 2),
    ({"$nor": "x"}, 2),
    ({"a": {"$regex": "x", "$options": "z"}}, 51108),
    ({"a": {"$regex": "x", "$options": "iq"}}, 51108),
    ({"a": {"$options": "i"}}, 2),
    ({"a": {"$regex": 5}}, 2),
    ({"a": {"$regex": "x", "$options": 1}}, 2),
    ({"a": {"$regex": Regex("x", "i"), "$options": "m"}}, 51075),
    ({"a": {"$regex": "("}}, 51091),
    ({"a": {"$size": "2"}}, 2),
    ({"a": {"$size": None}}, 2),
    ({"a": {"$size": -1}}, 2),
    ({"a": {"$size": 1.5}}, 2),
    ({"a": {"$type": "foo"}}, 2),
    ({"a": {"$type": 99}}, 2),
    ({"a": {"$type": ["string", "nope"]}}, 2),
    ({"a": {"$type": {"x": 1}}}, 14),
    ({"a": {"$mod": 5}}, 2),
    ({"a": {"$mod": [5]}}, 2),
    ({"a": {"$mod": [5, 1, 2]}}, 2),
    ({"a": {"$mod": [0, 1]}}, 2),
    ({"a": {"$mod": ["5", 1]}}, 2),
    ({"a": {"$mod": [5, "1"]}}, 2),
    ({"a": {"$mod": [float("nan"), 1]}}, 2),
    ({"a": {"$all": 5}}, 2),
    ({"a": {"$all": [{"$elemMatch": {"b": 1}}, 5]}}, 2),
    ({"a": {"$all": [{"$gt": 5}]}}, 2),
    ({"a": {"$elemMatch": 5}}, 2),
    ({"a": {"$elemMatch": {"$gt": 1, "b": 2}}}, 2),
    ({"a": {"$not": 5}}, 2),
    ({"a": {"$not": {}}}, 2),
    ({"a": {"$not": {"b": 1}}}, 2),
    ({"a": {"$gt": re.compile("x")}}, 2),
    ({"a": {"$lte": Regex("x")}}, 2),
    ({"a": {"$near": [0, 0]}}, 2),
    ({"a": {"$geoWithin": {}}}, 2),
    ({"$where": "this.a == 1"}, 2),
    ({"$text": {"$search": "x"}}, 27),
    ({"$jsonSchema": {"format": "email"}}, 2),
    ({"$alwaysTrue": 0}, 2),
    ({"a": {"$bitsAllSet": "x"}}, 2),
    ({"a": {"$bitsAllSet": -1}}, 9),
    ({"a": {"$bitsAnySet": [-1]}}, 2),
    ({"$expr": {"$foo": 1}}, 168),
    ({"$expr": {"$eq": [1]}}, 16020),
    ({"$expr": {"$eq": 1, "$ne": 2}}, 15983),
    ({"$expr": "$$nope"}, 17276),
    ({"$expr": {"$and": [{"$gt": ["$a", 1]}], "x": 1}}, 15983),
    ({"$expr": {"$let": {"vars": {"x": 1}, "in": "$$y"}}}, 17276),
    ({"$expr": {"$eq": [{"$map": {"input": [1], "in": 1}}, "$$this"]}}, 17276),
    ({"$expr": {"$cond": {"if": True, "then": 1}}}, 17080),
    ({"$expr": {"$cond": [True, 1]}}, 16020),
    ({"$expr": {"$switch": {"branches": [{"case": True}]}}}, 40064),
    ({"$expr": {"$eq": [{"a": 1, "$b": 2}, 1]}}, 16410),
    ({"$expr": {"$eq": [{"a.b": 1}, 1]}}, 16412),
    ({"$expr": {"$eq": ["$a..b", 1]}}, 15998),
    ({"a": {"$elemMatch": {"$expr": {"$eq": ["$b", 1]}}}}, 2),
    ({"a": {"$elemMatch": {"$or": [{"$expr": True}]}}}, 2),
    ({"a": {"$elemMatch": {"b": {"$foo": 1}}}}, 2),
    ({"$or": [{"a": {"$bad": 1}}]}, 2),
    (["a"], 2),
]


@pytest.mark.parametrize(("filt", "code"), ERROR_CASES)
def test_invalid_filters(filt: Any, code: int) -> None:
    with pytest.raises(MongoError) as info:
        compile_filter(filt)
    assert info.value.code == code


def test_error_messages() -> None:
    with pytest.raises(MongoError, match=r"^unknown operator: \$foo$"):
        compile_filter({"a": {"$foo": 1}})
    with pytest.raises(MongoError, match=r"^unknown top level operator: \$foo\. "):
        compile_filter({"$foo": 1})
    with pytest.raises(MongoError, match=r"^\$in needs an array$"):
        compile_filter({"a": {"$in": 1}})
    with pytest.raises(MongoError, match=r"^invalid flag in regex options: z$"):
        compile_filter({"a": {"$regex": "x", "$options": "z"}})
    with pytest.raises(MongoError, match="must be a nonempty array"):
        compile_filter({"$or": []})
    with pytest.raises(MongoError) as info:
        compile_filter({"$foo": 1})
    assert info.value.to_document()["codeName"] == "BadValue"


def test_expr_runtime_errors() -> None:
    matcher = compile_filter({"$expr": {"$eq": [{"$size": "$a"}, 1]}})
    with pytest.raises(MongoError) as info:
        matcher.matches({"a": 5})
    assert info.value.code == 17124
    with pytest.raises(MongoError) as info:
        compile_filter({"$expr": {"$in": [1, "$a"]}}).matches({})
    assert info.value.code == 40081


def test_expr_is_validated_once_at_compile_time() -> None:
    # An invalid branch fails when the filter is compiled, even if it would never run.
    with pytest.raises(MongoError) as info:
        compile_filter({"$expr": {"$cond": [True, 1, {"$nope": 1}]}})
    assert info.value.code == 168
    matcher = compile_filter({"$expr": {"$gt": ["$a", 1]}})
    assert [matcher.matches({"a": a}) for a in (0, 1, 2, 3)] == [False, False, True, True]


def test_expr_now_is_the_compile_time_argument() -> None:
    filt = {"$expr": {"$lt": ["$t", "$$NOW"]}}
    doc = {"t": DATE1}
    assert not compile_filter(filt).matches(doc)  # without `now`, $$NOW is the Unix epoch
    assert compile_filter(filt, now=DATE2).matches(doc)
    assert compile_filter({"$or": [{"$expr": {"$eq": ["$$NOW", DATE2]}}]}, now=DATE2).matches({})


def test_non_mapping_filters_are_rejected_and_none_matches_all() -> None:
    for bad in ([], "", 5, [{"a": 1}]):
        with pytest.raises(MongoError) as info:
            compile_filter(bad)  # type: ignore[arg-type]
        assert info.value.code == 2
    assert compile_filter(None).match_result({"a": [1]}) == MatchResult(True, None)


def test_tests_field_reports_top_level_paths() -> None:
    matcher = compile_filter({"a.b": 1, "$or": [{"c": 1}, {"$and": [{"d.e": {"$gt": 1}}]}], "$comment": "x"})
    assert all(matcher.tests_field(f) for f in ("a", "c", "d"))
    assert not matcher.tests_field("b")
    assert not matcher.tests_field("$comment")


def test_matcher_is_reusable_and_regex_options_compile_once() -> None:
    matcher = compile_filter({"a": {"$regex": "^x", "$options": "i"}, "b": {"$in": [1, 2]}})
    docs = [{"a": "X1", "b": 1}, {"a": "y", "b": 1}, {"a": "xx", "b": 3}, {"a": ["z", "x"], "b": [0, 2]}]
    assert [matcher.matches(d) for d in docs] == [True, False, False, True]
    assert [matcher.matches(d) for d in docs] == [True, False, False, True]
    assert isinstance(matcher, Matcher)


# ---------------------------------------------------------------------------
# get_path / resolve_field
# ---------------------------------------------------------------------------

GET_PATH_CASES: list[tuple[dict[str, Any], str, list[Any], list[Any]]] = [
    ({"a": 1}, "a", [1], [1]),
    ({"a": 1}, "b", [], []),
    ({"a": {"b": 2}}, "a.b", [2], [2]),
    ({"a": [1, 2]}, "a", [[1, 2]], [1, 2]),
    ({"a": [{"b": 1}, {"b": 2}, {"c": 3}]}, "a.b", [1, 2], [1, 2]),
    ({"a": [{"b": [1, 2]}, {"b": 3}]}, "a.b", [[1, 2], 3], [1, 2, 3]),
    ({"a": [10, 20]}, "a.1", [20], [20]),
    ({"a": [{"b": 1}, {"b": 2}]}, "a.1.b", [2], [2]),
    ({"a": 5}, "a.b", [], []),
    ({"a": [[{"b": 1}]]}, "a.b", [], []),
    ({"a": None}, "a", [None], [None]),
    ({"a": []}, "a", [[]], []),
]


@pytest.mark.parametrize(("doc", "path", "values", "expanded"), GET_PATH_CASES)
def test_get_path(doc: dict[str, Any], path: str, values: list[Any], expanded: list[Any]) -> None:
    assert get_path(doc, path) == values
    assert get_path(doc, path, expand_trailing=True) == expanded


RESOLVE_CASES: list[tuple[Any, str, tuple[bool, Any]]] = [
    ({"a": 1}, "a", (True, 1)),
    ({"a": None}, "a", (True, None)),
    ({}, "a", (False, None)),
    ({"a": {"b": {"c": 3}}}, "a.b.c", (True, 3)),
    ({"a": {"b": 1}}, "a.c", (False, None)),
    ({"a": [{"b": 1}]}, "a.b", (False, None)),
    ({"a": [{"b": 1}]}, "a.0.b", (True, 1)),
    ({"a": [1, 2]}, "a.1", (True, 2)),
    ({"a": [1, 2]}, "a.2", (False, None)),
    ({"a": [1, 2]}, "a.01", (False, None)),
    ({"a": 5}, "a.b", (False, None)),
    ({"a": {"0": "x"}}, "a.0", (True, "x")),
]


@pytest.mark.parametrize(("doc", "path", "expected"), RESOLVE_CASES)
def test_resolve_field(doc: Any, path: str, expected: tuple[bool, Any]) -> None:
    assert resolve_field(doc, path) == expected


# ---------------------------------------------------------------------------
# Sort
# ---------------------------------------------------------------------------

SORT_CASES: list[tuple[list[dict[str, Any]], dict[str, Any] | None, list[Any]]] = [
    ([{"_id": 1, "a": 2}, {"_id": 2, "a": 1}], {"a": 1}, [2, 1]),
    ([{"_id": 1, "a": 2}, {"_id": 2, "a": 1}], {"a": -1}, [1, 2]),
    ([{"_id": 1, "a": 2}, {"_id": 2, "a": 1}], None, [1, 2]),
    ([{"_id": 1, "a": 2}, {"_id": 2, "a": 1}], {}, [1, 2]),
    # shoes example (sort on an array field: min ascending, max descending)
    ([{"_id": "A", "sizes": [7, 11]}, {"_id": "B", "sizes": [8, 9, 10]}], {"sizes": 1}, ["A", "B"]),
    ([{"_id": "A", "sizes": [7, 11]}, {"_id": "B", "sizes": [8, 9, 10]}], {"sizes": -1}, ["A", "B"]),
    ([{"_id": "A", "sizes": [7, 9]}, {"_id": "B", "sizes": [8, 10]}], {"sizes": -1}, ["B", "A"]),
    # DOCS-2760: empty array < missing/null; ties keep insertion order
    (
        [{"_id": 1}, {"_id": 2, "a": 1}, {"_id": 3, "a": []}, {"_id": 4, "a": [1]}, {"_id": 5, "a": [0, 1]}],
        {"a": 1},
        [3, 1, 5, 2, 4],
    ),
    (
        [{"_id": 1}, {"_id": 2, "a": 1}, {"_id": 3, "a": []}, {"_id": 4, "a": [1]}, {"_id": 5, "a": [0, 1]}],
        {"a": -1},
        [2, 4, 5, 1, 3],
    ),
    # BSON type order
    (
        [
            {"_id": "str", "v": "a"},
            {"_id": "num", "v": 5},
            {"_id": "null", "v": None},
            {"_id": "obj", "v": {"x": 1}},
            {"_id": "oid", "v": OID1},
            {"_id": "bool", "v": False},
            {"_id": "date", "v": DATE1},
            {"_id": "min", "v": MinKey()},
            {"_id": "max", "v": MaxKey()},
            {"_id": "missing"},
            {"_id": "bin", "v": Binary(b"x")},
        ],
        {"v": 1},
        ["min", "null", "missing", "num", "str", "obj", "bin", "oid", "bool", "date", "max"],
    ),
    # numbers of every width compare by value
    (
        [{"_id": 1, "n": 2.5}, {"_id": 2, "n": Int64(2)}, {"_id": 3, "n": Decimal128("3")}, {"_id": 4, "n": 1}],
        {"n": 1},
        [4, 2, 1, 3],
    ),
    ([{"_id": 1, "n": 1}, {"_id": 2, "n": float("nan")}, {"_id": 3, "n": -5}], {"n": 1}, [2, 3, 1]),
    # compound keys
    (
        [
            {"_id": 1, "a": 1, "b": 1},
            {"_id": 2, "a": 1, "b": 2},
            {"_id": 3, "a": 0, "b": 9},
            {"_id": 4, "a": 1, "b": 0},
        ],
        {"a": 1, "b": -1},
        [3, 2, 1, 4],
    ),
    (
        [{"_id": 1, "a": 1, "b": 1}, {"_id": 2, "a": 1, "b": 2}, {"_id": 3, "a": 0, "b": 9}],
        {"b": 1, "a": 1},
        [1, 2, 3],
    ),
    # dotted paths and arrays of documents
    (
        [{"_id": 1, "a": {"b": 3}}, {"_id": 2, "a": {"b": 1}}, {"_id": 3, "a": {}}],
        {"a.b": 1},
        [3, 2, 1],
    ),
    (
        [{"_id": 1, "a": [{"b": 5}, {"b": 1}]}, {"_id": 2, "a": [{"b": 2}, {"b": 3}]}],
        {"a.b": 1},
        [1, 2],
    ),
    (
        [{"_id": 1, "a": [{"b": 5}, {"b": 1}]}, {"_id": 2, "a": [{"b": 2}, {"b": 3}]}],
        {"a.b": -1},
        [1, 2],
    ),
    (
        [{"_id": 1, "a": [{"b": 5}, {"c": 1}]}, {"_id": 2, "a": [{"b": 2}]}],
        {"a.b": 1},
        [1, 2],
    ),
    ([{"_id": 1, "a": [3, 1]}, {"_id": 2, "a": [2]}], {"a.0": 1}, [2, 1]),
    # mixed-type arrays: min element by BSON order
    ([{"_id": 1, "a": [{"x": 3}, 1]}, {"_id": 2, "a": [2, {"x": 1}]}], {"a": 1}, [1, 2]),
    ([{"_id": 1, "a": ["b", 5]}, {"_id": 2, "a": ["a"]}], {"a": -1}, [1, 2]),
    # strings compare by code point, case-sensitive
    ([{"_id": 1, "s": "b"}, {"_id": 2, "s": "B"}, {"_id": 3, "s": "a"}], {"s": 1}, [2, 3, 1]),
    # stable for equal keys in both directions
    ([{"_id": i, "k": i % 2} for i in range(6)], {"k": 1}, [0, 2, 4, 1, 3, 5]),
    ([{"_id": i, "k": i % 2} for i in range(6)], {"k": -1}, [1, 3, 5, 0, 2, 4]),
    # $meta sort keys are accepted and ignored
    ([{"_id": 1}, {"_id": 2}], {"score": {"$meta": "textScore"}}, [1, 2]),
    # 1.0 / Int64 directions
    ([{"_id": 1, "a": 2}, {"_id": 2, "a": 1}], {"a": 1.0}, [2, 1]),
    ([{"_id": 1, "a": 1}, {"_id": 2, "a": 2}], {"a": Int64(-1)}, [2, 1]),
    # bson Code sorts with strings; Decimal128 with the other numbers
    ([{"_id": 1, "v": Code("b")}, {"_id": 2, "v": "a"}, {"_id": 3, "v": "c"}], {"v": 1}, [2, 1, 3]),
    ([{"_id": 1, "v": Decimal128("NaN")}, {"_id": 2, "v": Decimal128("-Infinity")}, {"_id": 3, "v": 0}], {"v": 1}, [1, 2, 3]),
    ([{"_id": 1, "v": DATE2}, {"_id": 2, "v": DATE1.replace(tzinfo=datetime.UTC)}], {"v": 1}, [2, 1]),
    ([{"_id": 1, "v": [MinKey(), 5]}, {"_id": 2, "v": None}], {"v": 1}, [1, 2]),
]


@pytest.mark.parametrize(("docs", "sort", "expected"), SORT_CASES)
def test_sort(docs: list[dict[str, Any]], sort: dict[str, Any] | None, expected: list[Any]) -> None:
    original = list(docs)
    assert [d["_id"] for d in sort_documents(docs, sort)] == expected
    assert docs == original  # input untouched


SORT_ERRORS: list[tuple[dict[str, Any], int]] = [
    ({"a": "asc"}, 15974),
    ({"a": True}, 15974),
    ({"a": None}, 15974),
    ({"a": 0}, 15975),
    ({"a": 2}, 15975),
    ({"a": 42.12}, 15975),
    ({"a": Int64(2**63 - 1)}, 15975),
    ({"a": {"$foo": 1}}, 17312),
    ({"a": {"x": 1, "y": 2}}, 17312),
    ({"": 1}, 40352),
    ({"a..b": 1}, 15998),
    ({"$a": 1}, 16410),
]


@pytest.mark.parametrize(("sort", "code"), SORT_ERRORS)
def test_sort_errors(sort: dict[str, Any], code: int) -> None:
    with pytest.raises(MongoError) as info:
        sort_documents([{"a": 1}, {"a": 2}], sort)
    assert info.value.code == code


def test_sort_error_message() -> None:
    with pytest.raises(MongoError, match=r'^Illegal key in \$sort specification: asc: "123"$'):
        sort_documents([], {"asc": "123"})


# ---------------------------------------------------------------------------
# Projection
# ---------------------------------------------------------------------------

JOURNAL = {
    "_id": 1,
    "item": "journal",
    "status": "A",
    "size": {"h": 14, "w": 21, "uom": "cm"},
    "instock": [{"warehouse": "A", "qty": 5}],
}
POSTCARD = {
    "_id": 5,
    "item": "postcard",
    "status": "A",
    "size": {"h": 10, "w": 15.25, "uom": "cm"},
    "instock": [{"warehouse": "B", "qty": 15}, {"warehouse": "C", "qty": 35}],
}
POST = {
    "_id": 1,
    "title": "Bagels are not croissants.",
    "comments": [{"comment": "0. true"}, {"comment": "1. croissants aren't bagels."}],
}
SOCKS = {"_id": 1, "item": "socks", "qty": 100, "details": {"colors": ["blue", "red"], "sizes": ["S", "M", "L"]}}
SCHOOL_1 = {
    "_id": 1,
    "zipcode": "63109",
    "students": [
        {"name": "john", "school": 102, "age": 10},
        {"name": "jess", "school": 102, "age": 11},
        {"name": "jeff", "school": 108, "age": 15},
    ],
}
SCHOOL_3 = {
    "_id": 3,
    "zipcode": "63109",
    "students": [{"name": "ajax", "school": 100, "age": 7}, {"name": "achilles", "school": 100, "age": 8}],
    "athletics": ["baseball", "basketball", "soccer"],
}
PLAYER = {
    "_id": 1,
    "name": "player1",
    "games": [{"game": "abc", "score": 8}, {"game": "xyz", "score": 5}],
    "joined": DATE1,
    "lastLogin": DATE2,
}
STUDENT_3 = {"_id": 3, "semester": 1, "grades": [85, 100, 90]}
STUDENT_1 = {"_id": 1, "semester": 1, "grades": [70, 87, 90]}
STUDENT_7 = {
    "_id": 7,
    "semester": 3,
    "grades": [
        {"grade": 80, "mean": 75, "std": 8},
        {"grade": 85, "mean": 90, "std": 5},
        {"grade": 90, "mean": 85, "std": 3},
    ],
}

# (document, projection, query filter or None, expected output)
PROJECTION_CASES: list[tuple[dict[str, Any], dict[str, Any] | None, dict[str, Any] | None, dict[str, Any]]] = [
    (JOURNAL, None, None, JOURNAL),
    (JOURNAL, {}, None, JOURNAL),
    (JOURNAL, {"item": 1, "status": 1}, None, {"_id": 1, "item": "journal", "status": "A"}),
    (JOURNAL, {"status": 1, "item": 1}, None, {"_id": 1, "item": "journal", "status": "A"}),
    (JOURNAL, {"item": 1, "status": 1, "_id": 0}, None, {"item": "journal", "status": "A"}),
    (JOURNAL, {"item": True, "status": 5}, None, {"_id": 1, "item": "journal", "status": "A"}),
    (JOURNAL, {"item": 1.5, "_id": False}, None, {"item": "journal"}),
    (
        JOURNAL,
        {"status": 0, "instock": 0},
        None,
        {"_id": 1, "item": "journal", "size": {"h": 14, "w": 21, "uom": "cm"}},
    ),
    (
        JOURNAL,
        {"item": 1, "status": 1, "size.uom": 1},
        None,
        {"_id": 1, "item": "journal", "status": "A", "size": {"uom": "cm"}},
    ),
    (
        JOURNAL,
        {"item": 1, "status": 1, "size": {"uom": 1}},
        None,
        {"_id": 1, "item": "journal", "status": "A", "size": {"uom": "cm"}},
    ),
    (
        JOURNAL,
        {"size.uom": 0},
        None,
        {"_id": 1, "item": "journal", "status": "A", "size": {"h": 14, "w": 21}, "instock": [{"warehouse": "A", "qty": 5}]},
    ),
    (
        JOURNAL,
        {"item": 1, "status": 1, "instock.qty": 1},
        None,
        {"_id": 1, "item": "journal", "status": "A", "instock": [{"qty": 5}]},
    ),
    (
        POSTCARD,
        {"item": 1, "status": 1, "instock": {"$slice": -1}},
        None,
        {"_id": 5, "item": "postcard", "status": "A", "instock": [{"warehouse": "C", "qty": 35}]},
    ),
    (JOURNAL, {"_id": 1}, None, {"_id": 1}),
    (JOURNAL, {"_id": 0}, None, {k: v for k, v in JOURNAL.items() if k != "_id"}),
    (JOURNAL, {"_id": 1, "status": 0}, None, {k: v for k, v in JOURNAL.items() if k != "status"}),
    (JOURNAL, {"missing": 1}, None, {"_id": 1}),
    (JOURNAL, {"missing": 0}, None, JOURNAL),
    (JOURNAL, {"item.sub": 1}, None, {"_id": 1}),
    (JOURNAL, {"size.h.x": 0}, None, JOURNAL),
    ({"a": {"b": 1}}, {"a.c": 1}, None, {"a": {}}),
    ({"_id": 2, "a": [1, {"b": 1, "c": 2}, [{"b": 3}]]}, {"a.b": 1}, None, {"_id": 2, "a": [{"b": 1}, [{"b": 3}]]}),
    ({"_id": 2, "a": [1, {"b": 1, "c": 2}, [{"b": 3}]]}, {"a.b": 0}, None, {"_id": 2, "a": [1, {"c": 2}, [{}]]}),
    ({"_id": 2, "x": {"y": {"z": 1, "w": 2}, "v": 3}}, {"x.y.z": 1, "_id": 0}, None, {"x": {"y": {"z": 1}}}),
    # literals and computed fields (4.4+)
    (JOURNAL, {"item": 1, "status": "Available"}, None, {"_id": 1, "item": "journal", "status": "Available"}),
    (JOURNAL, {"_id": 0, "label": "x", "item": 1}, None, {"item": "journal", "label": "x"}),
    (JOURNAL, {"_id": 0, "height": "$size.h"}, None, {"height": 14}),
    (JOURNAL, {"_id": 0, "height": "$size.nope"}, None, {}),
    (JOURNAL, {"_id": 0, "pair": ["$item", "$status"]}, None, {"pair": ["journal", "A"]}),
    (JOURNAL, {"_id": 0, "lit": {"$literal": 1}}, None, {"lit": 1}),
    (JOURNAL, {"_id": 0, "isBig": {"$gt": ["$size.h", 10]}}, None, {"isBig": True}),
    (JOURNAL, {"_id": 0, "none": None}, None, {"none": None}),
    (JOURNAL, {"_id": 0, "size.area": {"$multiply": ["$size.h", "$size.w"]}}, None, {"size": {"area": 294}}),
    ({"_id": 1}, {"_id": 0, "a.b": "x"}, None, {"a": {"b": "x"}}),
    (JOURNAL, {"_id": 0, "qty": {"$toString": {"$first": "$instock.qty"}}}, None, {"qty": "5"}),
    (JOURNAL, {"_id": 0, "dims": {"$concat": [{"$toString": "$size.h"}, "x", {"$toString": "$size.w"}]}}, None, {"dims": "14x21"}),
    (JOURNAL, {"_id": 0, "gone": "$$REMOVE", "kind": {"$switch": {"branches": [], "default": "k"}}}, None, {"kind": "k"}),
    # $slice
    (POST, {"comments": {"$slice": 1}}, None, {**POST, "comments": [{"comment": "0. true"}]}),
    (POST, {"comments": {"$slice": -1}}, None, {**POST, "comments": [{"comment": "1. croissants aren't bagels."}]}),
    (POST, {"comments": {"$slice": [1, 1]}}, None, {**POST, "comments": [{"comment": "1. croissants aren't bagels."}]}),
    (POST, {"comments": {"$slice": [-1, 1]}}, None, {**POST, "comments": [{"comment": "1. croissants aren't bagels."}]}),
    (POST, {"comments": {"$slice": [5, 1]}}, None, {**POST, "comments": []}),
    (POST, {"comments": {"$slice": [-5, 1]}}, None, {**POST, "comments": [{"comment": "0. true"}]}),
    (POST, {"comments": {"$slice": 0}}, None, {**POST, "comments": []}),
    (POST, {"comments": {"$slice": 10}}, None, POST),
    (POST, {"title": {"$slice": 1}}, None, POST),
    (POST, {"comments": {"$slice": 1}, "_id": 1}, None, {"_id": 1, "comments": [{"comment": "0. true"}]}),
    (POST, {"comments": {"$slice": 1}, "title": 0}, None, {"_id": 1, "comments": [{"comment": "0. true"}]}),
    (
        POST,
        {"title": 1, "comments": {"$slice": 1}},
        None,
        {"_id": 1, "title": "Bagels are not croissants.", "comments": [{"comment": "0. true"}]},
    ),
    (SOCKS, {"qty": 1, "details.colors": {"$slice": 1}}, None, {"_id": 1, "qty": 100, "details": {"colors": ["blue"]}}),
    (
        SOCKS,
        {"_id": 0, "details.colors": {"$slice": 1}},
        None,
        {"item": "socks", "qty": 100, "details": {"colors": ["blue"], "sizes": ["S", "M", "L"]}},
    ),
    ({"_id": 1, "a": [{"b": [1, 2, 3]}, {"b": [4, 5]}]}, {"a.b": {"$slice": 1}}, None, {"_id": 1, "a": [{"b": [1]}, {"b": [4]}]}),
    # $elemMatch projection
    (SCHOOL_1, {"students": {"$elemMatch": {"school": 102}}}, None, {"_id": 1, "students": [{"name": "john", "school": 102, "age": 10}]}),
    (SCHOOL_3, {"students": {"$elemMatch": {"school": 102}}}, None, {"_id": 3}),
    (
        SCHOOL_1,
        {"students": {"$elemMatch": {"school": 102, "age": {"$gt": 10}}}},
        None,
        {"_id": 1, "students": [{"name": "jess", "school": 102, "age": 11}]},
    ),
    (
        PLAYER,
        {"games": {"$elemMatch": {"score": {"$gt": 5}}}, "joined": 1, "lastLogin": 1},
        None,
        {"_id": 1, "joined": DATE1, "lastLogin": DATE2, "games": [{"game": "abc", "score": 8}]},
    ),
    (
        PLAYER,
        {"games": {"$elemMatch": {"score": {"$gt": 5}}}, "name": 0},
        None,
        {"_id": 1, "games": [{"game": "abc", "score": 8}], "joined": DATE1, "lastLogin": DATE2},
    ),
    (SCHOOL_3, {"athletics": {"$elemMatch": {"$regex": "^bask"}}, "_id": 0}, None, {"athletics": ["basketball"]}),
    # positional projection
    (STUDENT_1, {"grades.$": 1}, {"semester": 1, "grades": {"$gte": 85}}, {"_id": 1, "grades": [87]}),
    (STUDENT_3, {"grades.$": 1}, {"semester": 1, "grades": {"$gte": 85}}, {"_id": 3, "grades": [85]}),
    (STUDENT_3, {"grades.$": 1, "semester": 1}, {"grades": {"$gte": 95}}, {"_id": 3, "semester": 1, "grades": [100]}),
    (
        STUDENT_7,
        {"grades.$": 1},
        {"grades.mean": {"$gt": 70}},
        {"_id": 7, "grades": [{"grade": 80, "mean": 75, "std": 8}]},
    ),
    (
        STUDENT_7,
        {"grades.$": 1},
        {"grades": {"$elemMatch": {"mean": {"$gt": 80}, "std": {"$lt": 4}}}},
        {"_id": 7, "grades": [{"grade": 90, "mean": 85, "std": 3}]},
    ),
    ({"_id": 1, "a": {"b": [1, 2, 3]}}, {"a.b.$": 1}, {"a.b": 2}, {"_id": 1, "a": {"b": [2]}}),
    ({"_id": 1, "a": 5}, {"a.$": 1}, {"a": 5}, {"_id": 1, "a": 5}),
]


@pytest.mark.parametrize(("doc", "projection", "filt", "expected"), PROJECTION_CASES)
def test_projection(
    doc: dict[str, Any], projection: dict[str, Any] | None, filt: dict[str, Any] | None, expected: dict[str, Any]
) -> None:
    matcher = compile_filter(filt) if filt is not None else None
    if matcher is not None:
        assert matcher.matches(doc)
    out = apply_projection(doc, projection, matcher=matcher)
    assert out == expected
    assert list(out) == list(expected)  # field order too
    validate_projection(projection, matcher=matcher)
    if projection:
        assert compile_projection(projection, matcher=matcher).apply(doc) == expected


PROJECTION_ERRORS: list[tuple[dict[str, Any], dict[str, Any] | None, int]] = [
    ({"a": 1, "b": 0}, None, 31254),
    ({"a": 0, "b": 1}, None, 31253),
    ({"a": 0, "b": "lit"}, None, 31310),
    ({"a": 0, "b": {"$add": [1, 2]}}, None, 31252),
    ({"a": 1, "a.b": 1}, None, 31249),
    ({"a.b": 1, "a": 1}, None, 31250),
    ({"a": {"$slice": "x"}}, None, 31273),
    ({"a": {"$slice": [1]}}, None, 31272),
    ({"a": {"$slice": ["x", 1]}}, None, 31257),
    ({"a": {"$slice": [1, "x"]}}, None, 31258),
    ({"a": {"$slice": [1, 0]}}, None, 31259),
    ({"a": {"$slice": [1, -1]}}, None, 31259),
    ({"a": {"$elemMatch": 5}}, None, 31274),
    ({"a.b": {"$elemMatch": {"c": 1}}}, None, 31275),
    ({"a": {"b": {"$elemMatch": {"c": 1}}}}, None, 31275),
    ({"a.$": 1, "b.$": 1}, {"a": 1, "b": 1}, 31276),
    ({"a.$": 1, "b": {"$elemMatch": {"c": 1}}}, {"a": 1}, 31255),
    ({"b": {"$elemMatch": {"c": 1}}, "a.$": 1}, {"a": 1}, 31256),
    ({"a.$": 1}, {"b": 1}, 31277),
    ({"a.$": 0}, {"a": 1}, 16410),
    ({"a.$.$": 1}, {"a": 1}, 31287),
    ({"a.$": {"$slice": 1}}, {"a": 1}, 31271),
    ({"a.$": "x"}, {"a": 1}, 31308),
    ({"a": {"$foo": 1}}, None, 31325),
    ({"": 1}, None, 40352),
    ({"a..b": 1}, None, 15998),
    ({"$a": 1}, None, 16410),
    ({"a": {"$eq": [1]}}, None, 16020),
    ({"a": {"$add": [{"$foo": 1}]}}, None, 168),  # 31325 is only for the outermost operator
    ({"a": "$$nope"}, None, 17276),
    ({"a": {"$let": {"vars": {"x": 1}, "in": "$$y"}}}, None, 17276),
    ({"a": {"$cond": {"if": 1}}}, None, 17080),
    ({"a": {"b": {"$foo": 1}}}, None, 31325),
]


@pytest.mark.parametrize(("projection", "filt", "code"), PROJECTION_ERRORS)
def test_projection_errors(projection: dict[str, Any], filt: dict[str, Any] | None, code: int) -> None:
    matcher = compile_filter(filt) if filt is not None else None
    with pytest.raises(MongoError) as info:
        validate_projection(projection, matcher=matcher)
    assert info.value.code == code


def test_projection_now_is_the_compile_time_argument() -> None:
    assert compile_projection({"_id": 0, "t": "$$NOW"}).apply({"_id": 1}) == {"t": datetime.datetime(1970, 1, 1)}
    assert compile_projection({"_id": 0, "t": "$$NOW"}, now=DATE2).apply({"_id": 1}) == {"t": DATE2}


def test_projection_error_messages() -> None:
    with pytest.raises(MongoError, match=r"^Cannot do exclusion on field x in inclusion projection$"):
        apply_projection({"x": 1}, {"y": 1, "x": 0})
    with pytest.raises(MongoError, match=r"^Cannot do inclusion on field y in exclusion projection$"):
        apply_projection({"x": 1}, {"x": 0, "y": 1})


POSITIONAL_RUNTIME_ERRORS: list[tuple[dict[str, Any], dict[str, Any], dict[str, Any] | None, int]] = [
    ({"a": [1, 2]}, {"a.$": 1}, None, 51050),
    ({"a": [1, 2], "b": 1}, {"a.$": 1}, {"a": {"$size": 2}, "b": 1}, 51246),
    ({"a": [1, 2], "b": [0, 0, 5]}, {"a.$": 1}, {"a": {"$size": 2}, "b": 5}, 51247),
]


@pytest.mark.parametrize(("doc", "projection", "filt", "code"), POSITIONAL_RUNTIME_ERRORS)
def test_positional_runtime_errors(
    doc: dict[str, Any], projection: dict[str, Any], filt: dict[str, Any] | None, code: int
) -> None:
    matcher = compile_filter(filt) if filt is not None else None
    with pytest.raises(MongoError) as info:
        apply_projection(doc, projection, matcher=matcher)
    assert info.value.code == code


def test_projection_does_not_mutate_input() -> None:
    doc = {"_id": 1, "a": [{"b": 1, "c": 2}], "d": {"e": 1}}
    snapshot = {"_id": 1, "a": [{"b": 1, "c": 2}], "d": {"e": 1}}
    for projection in ({"a.b": 1}, {"a.c": 0}, {"a": {"$slice": 0}}, {"d.e": 0}, {"x": "$d.e"}):
        apply_projection(doc, projection)
    positional = compile_filter({"a.b": 1})
    apply_projection(doc, {"a.$": 1}, matcher=positional)
    assert doc == snapshot


# ---------------------------------------------------------------------------
# Property tests
# ---------------------------------------------------------------------------

SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-3, 3),
    st.sampled_from([0.5, -1.0, 2.0, float("nan")]),
    st.sampled_from(["", "a", "b", "ab"]),
)
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.dictionaries(st.sampled_from(["a", "b", "c"]), inner, max_size=2),
    ),
    max_leaves=6,
)
DOCS = st.dictionaries(st.sampled_from(["a", "b", "c"]), VALUES, max_size=3)
PATHS = st.sampled_from(["a", "b", "a.b", "a.c", "b.a", "a.0", "a.b.c"])
COMPARISON_OPS = st.sampled_from(["$eq", "$ne", "$gt", "$gte", "$lt", "$lte"])


@st.composite
def leaf_filters(draw: st.DrawFn) -> dict[str, Any]:
    path = draw(PATHS)
    kind = draw(st.sampled_from(["eq", "cmp", "in", "nin", "exists", "type", "size", "elem", "not"]))
    if kind == "eq":
        return {path: draw(VALUES)}
    if kind == "cmp":
        return {path: {draw(COMPARISON_OPS): draw(SCALARS)}}
    if kind in ("in", "nin"):
        return {path: {f"${kind}": draw(st.lists(SCALARS, max_size=3))}}
    if kind == "exists":
        return {path: {"$exists": draw(st.booleans())}}
    if kind == "type":
        return {path: {"$type": draw(st.sampled_from(["number", "string", "array", "object", "null", "bool"]))}}
    if kind == "size":
        return {path: {"$size": draw(st.integers(0, 2))}}
    if kind == "elem":
        return {path: {"$elemMatch": {draw(COMPARISON_OPS): draw(SCALARS)}}}
    return {path: {"$not": {draw(COMPARISON_OPS): draw(SCALARS)}}}


FILTERS = st.recursive(
    leaf_filters(),
    lambda inner: st.one_of(
        st.builds(lambda fs: {"$and": fs}, st.lists(inner, min_size=1, max_size=3)),
        st.builds(lambda fs: {"$or": fs}, st.lists(inner, min_size=1, max_size=3)),
        st.builds(lambda fs: {"$nor": fs}, st.lists(inner, min_size=1, max_size=3)),
    ),
    max_leaves=4,
)


@settings(max_examples=150, deadline=None)
@given(doc=DOCS, f=FILTERS, g=FILTERS)
def test_logical_identities(doc: dict[str, Any], f: dict[str, Any], g: dict[str, Any]) -> None:
    mf, mg = matches(doc, f), matches(doc, g)
    assert matches(doc, {"$or": [f]}) is mf
    assert matches(doc, {"$and": [f]}) is mf
    assert matches(doc, {"$nor": [f]}) is (not mf)
    assert matches(doc, {"$or": [f, g]}) is (mf or mg)
    assert matches(doc, {"$and": [f, g]}) is (mf and mg)
    assert matches(doc, {"$nor": [f, g]}) is (not (mf or mg))


@settings(max_examples=150, deadline=None)
@given(doc=DOCS, path=PATHS, op=COMPARISON_OPS, value=SCALARS)
def test_not_negates_operator(doc: dict[str, Any], path: str, op: str, value: Any) -> None:
    plain = matches(doc, {path: {op: value}})
    assert matches(doc, {path: {"$not": {op: value}}}) is (not plain)


@settings(max_examples=150, deadline=None)
@given(doc=DOCS, path=PATHS, values=st.lists(SCALARS, max_size=4))
def test_in_is_or_of_equalities_and_nin_negates(doc: dict[str, Any], path: str, values: list[Any]) -> None:
    any_eq = any(matches(doc, {path: {"$eq": v}}) for v in values)
    assert matches(doc, {path: {"$in": values}}) is any_eq
    assert matches(doc, {path: {"$nin": values}}) is (not any_eq)
    assert matches(doc, {path: {"$ne": values[0] if values else 0}}) is not matches(
        doc, {path: values[0] if values else 0}
    )


@settings(max_examples=150, deadline=None)
@given(doc=DOCS, f=FILTERS)
def test_match_result_agrees_with_matches(doc: dict[str, Any], f: dict[str, Any]) -> None:
    matcher = compile_filter(f)
    result = matcher.match_result(doc)
    assert result.matched is matcher.matches(doc)
    if not result.matched:
        assert result.array_index is None


SORT_DOCS = st.lists(st.fixed_dictionaries({}, optional={"a": VALUES, "b": SCALARS}), max_size=8)


def _min_or_max(value: Any, direction: int) -> Any:
    if isinstance(value, list):
        if not value:
            return None
        best = value[0]
        for v in value[1:]:
            c = compare_values(v, best)
            if (direction > 0 and c < 0) or (direction < 0 and c > 0):
                best = v
        return best
    return value


@settings(max_examples=150, deadline=None)
@given(docs=SORT_DOCS, direction=st.sampled_from([1, -1]))
def test_sort_is_ordered_stable_permutation(docs: list[dict[str, Any]], direction: int) -> None:
    tagged = [{**d, "_id": i} for i, d in enumerate(docs)]
    out = sort_documents(tagged, {"a": direction})
    assert sorted(d["_id"] for d in out) == list(range(len(docs)))
    keys = [_min_or_max(d.get("a"), direction) for d in out]
    for (prev, prev_doc), (cur, cur_doc) in zip(zip(keys, out), zip(keys[1:], out[1:]), strict=False):
        empty_prev = prev_doc.get("a") == []
        empty_cur = cur_doc.get("a") == []
        if empty_prev or empty_cur:
            continue  # empty arrays sort below null, checked in the table
        c = compare_values(prev, cur)
        assert c * direction <= 0
        if c == 0:
            assert prev_doc["_id"] < cur_doc["_id"]  # stable


@settings(max_examples=100, deadline=None)
@given(docs=SORT_DOCS)
def test_compound_sort_matches_lexicographic_comparison(docs: list[dict[str, Any]]) -> None:
    tagged = [{**d, "_id": i} for i, d in enumerate(docs)]
    out = sort_documents(tagged, {"b": 1, "_id": -1})
    for prev, cur in itertools.pairwise(out):
        c = compare_values(prev.get("b"), cur.get("b"))
        assert c < 0 or (c == 0 and prev["_id"] > cur["_id"])


@settings(max_examples=100, deadline=None)
@given(doc=DOCS)
def test_projection_inclusion_exclusion_partition(doc: dict[str, Any]) -> None:
    doc = {"_id": 0, **doc}
    included = apply_projection(doc, {"a": 1, "_id": 0})
    excluded = apply_projection(doc, {"a": 0, "_id": 0})
    assert set(included) | set(excluded) == set(doc) - {"_id"}
    assert not set(included) & set(excluded)
    merged = {**included, **excluded}
    assert all(merged[k] is doc[k] for k in merged)


def test_float_nan_never_orders_above_numbers() -> None:
    assert not matches({"a": math.nan}, {"a": {"$gt": -math.inf}})
    assert not matches({"a": math.nan}, {"a": {"$lt": math.inf}})


# -- bounded work: sorted runs, regex budgets ------------------------------------------------------
@given(st.lists(st.fixed_dictionaries({
    "a": st.one_of(st.integers(-3, 3), st.none(), st.text("xy", max_size=2), st.lists(st.integers(-2, 2))),
    "b": st.one_of(st.integers(-3, 3), st.floats(allow_nan=False, allow_infinity=False)),
}), max_size=60), st.sampled_from([{"a": 1}, {"a": -1}, {"a": 1, "b": -1}, {"b": -1, "a": -1}]))
def test_sorting_in_runs_gives_the_single_sort_order(docs: list[dict[str, Any]], spec: dict[str, int]) -> None:
    docs = [dict(d, _id=i) for i, d in enumerate(docs)]
    # The reference: stable sorts from the last key to the first.
    reference = list(docs)
    for field, direction in reversed(list(spec.items())):
        reference.sort(key=lambda d, f=field, s=direction: oplog.sort._sort_key(d, (f,), s), reverse=direction < 0)
    whole = [d["_id"] for d in oplog.sort.sort_documents(docs, spec)]
    assert whole == [d["_id"] for d in reference]
    saved = oplog.sort.SORT_RUN
    oplog.sort.SORT_RUN = 7
    try:
        in_runs = [d["_id"] for d in oplog.sort.sort_documents(docs, spec)]
    finally:
        oplog.sort.SORT_RUN = saved
    assert in_runs == whole


def test_a_catastrophic_regex_stops_at_its_budget() -> None:
    matcher = compile_filter({"s": {"$regex": "^(a|aa)+$"}})
    budget = query_regex.RegexBudget(0.05, 50, "operation exceeded time limit")
    token = query_regex.REGEX_BUDGET.set(budget)
    try:
        with pytest.raises(MongoError) as err:
            matcher.matches({"s": "a" * 60 + "!"})
    finally:
        query_regex.REGEX_BUDGET.reset(token)
    assert err.value.code == 50
    assert matcher.matches({"s": "aaaa"})
