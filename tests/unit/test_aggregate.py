"""Table-driven tests for oplog.aggregate / oplog.expressions.

Most cases are the worked examples on MongoDB's manual pages for each stage, accumulator
and expression operator (collections and expected outputs as documented); a few cover
the error codes a real server returns and the exact shapes drivers send.

Comparison is strict about numeric type families (int vs double vs decimal) and about
field order; it ignores output order only after a $group/$bucket with no $sort, where
MongoDB does not guarantee one.
"""

from __future__ import annotations

import datetime
import itertools
import re
import time
from typing import Any

import pytest
from bson.decimal128 import Decimal128
from bson.int64 import Int64
from bson.objectid import ObjectId
from bson.regex import Regex

from base.errors import MongoError
from oplog.aggregate import iter_pipeline, run_pipeline, validate_pipeline
from oplog.expressions import MISSING, evaluate
from oplog.values import compare_values, is_number

D = datetime.datetime
NOW = D(2024, 5, 17, 12, 0, 0)
Dec = Decimal128


def _family(value: Any) -> str:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, Decimal128):
        return "decimal"
    if isinstance(value, float):
        return "double"
    if isinstance(value, int):
        return "integer"
    return type(value).__name__


def same(actual: Any, expected: Any) -> bool:
    """Deep equality with MongoDB flavour: field order and numeric type family matter."""
    if isinstance(expected, dict):
        return (
            isinstance(actual, dict)
            and list(actual) == list(expected)
            and all(same(actual[k], expected[k]) for k in expected)
        )
    if isinstance(expected, list):
        return isinstance(actual, list) and len(actual) == len(expected) and all(map(same, actual, expected))
    if expected is MISSING or actual is MISSING:
        return actual is expected
    if is_number(expected) or isinstance(expected, bool):
        return _family(actual) == _family(expected) and compare_values(actual, expected) == 0
    return type(actual) is type(expected) and actual == expected


def same_unordered(actual: list[Any], expected: list[Any]) -> bool:
    remaining = list(actual)
    for want in expected:
        for i, got in enumerate(remaining):
            if same(got, want):
                del remaining[i]
                break
        else:
            return False
    return not remaining


def run(docs: list[dict[str, Any]], pipeline: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return run_pipeline(docs, pipeline, now=NOW)


# ---------------------------------------------------------------------------
# Collections from the MongoDB manual

SALES_DEC = [  # $group page
    {"_id": 1, "item": "abc", "price": Dec("10"), "quantity": 2, "date": D(2014, 3, 1, 8, 0, 0)},
    {"_id": 2, "item": "jkl", "price": Dec("20"), "quantity": 1, "date": D(2014, 3, 1, 9, 0, 0)},
    {"_id": 3, "item": "xyz", "price": Dec("5"), "quantity": 10, "date": D(2014, 3, 15, 9, 0, 0)},
    {"_id": 4, "item": "xyz", "price": Dec("5"), "quantity": 20, "date": D(2014, 4, 4, 11, 21, 39, 736000)},
    {"_id": 5, "item": "abc", "price": Dec("10"), "quantity": 10, "date": D(2014, 4, 4, 21, 23, 13, 331000)},
    {"_id": 6, "item": "def", "price": Dec("7.5"), "quantity": 5, "date": D(2015, 6, 4, 5, 8, 13)},
    {"_id": 7, "item": "def", "price": Dec("7.5"), "quantity": 10, "date": D(2015, 9, 10, 8, 43, 0)},
    {"_id": 8, "item": "abc", "price": Dec("10"), "quantity": 5, "date": D(2016, 2, 6, 20, 20, 13)},
]

SALES = [  # accumulator pages ($sum, $avg, $push, $addToSet, $first, ...)
    {"_id": 1, "item": "abc", "price": 10, "quantity": 2, "date": D(2014, 1, 1, 8, 0, 0)},
    {"_id": 2, "item": "jkl", "price": 20, "quantity": 1, "date": D(2014, 2, 3, 9, 0, 0)},
    {"_id": 3, "item": "xyz", "price": 5, "quantity": 5, "date": D(2014, 2, 3, 9, 5, 0)},
    {"_id": 4, "item": "abc", "price": 10, "quantity": 10, "date": D(2014, 2, 15, 8, 0, 0)},
    {"_id": 5, "item": "xyz", "price": 5, "quantity": 10, "date": D(2014, 2, 15, 9, 5, 0)},
    {"_id": 6, "item": "xyz", "price": 5, "quantity": 5, "date": D(2014, 2, 15, 12, 5, 10)},
    {"_id": 7, "item": "xyz", "price": 5, "quantity": 10, "date": D(2014, 2, 15, 14, 12, 12)},
]

BAD_DATA = [  # $first "missing values" example
    {"_id": 1, "price": 6, "quantity": 6},
    {"_id": 2, "item": "album", "price": 5, "quantity": 5},
    {"_id": 7, "item": "tape", "price": 6, "quantity": 6},
    {"_id": 8, "price": 5, "quantity": 5},
    {"_id": 9, "item": "album", "price": 3, "quantity": ""},
    {"_id": 10, "item": "tape", "price": 3, "quantity": 4},
    {"_id": 12, "item": "cd", "price": 7},
]

SCORES = [{"_id": i + 1, "subject": "History", "score": s} for i, s in enumerate([88, 92, 97, 71, 79, 83])]

CLOTHING = [  # $unwind page
    {"_id": 1, "item": "ABC", "price": Dec("80"), "sizes": ["S", "M", "L"]},
    {"_id": 2, "item": "EFG", "price": Dec("120"), "sizes": []},
    {"_id": 3, "item": "IJK", "price": Dec("160"), "sizes": "M"},
    {"_id": 4, "item": "LMN", "price": Dec("10")},
    {"_id": 5, "item": "XYZ", "price": Dec("5.75"), "sizes": None},
]

CLOTHES = [  # $unwind "group by unwound values"
    {"_id": "1", "item": "Shirt", "price": Dec("12.99"), "sizes": ["S", "M", "L"]},
    {"_id": "2", "item": "Shorts", "price": Dec("19.99"), "sizes": []},
    {"_id": "3", "item": "Hat", "price": Dec("4.99"), "sizes": "M"},
    {"_id": "4", "item": "Gloves", "price": Dec("9.99")},
    {"_id": "5", "item": "Scarf", "price": Dec("5.99"), "sizes": None},
]

BOOK = {"_id": 1, "title": "abc123", "isbn": "0001122223334", "author": {"last": "zzz", "first": "aaa"}, "copies": 5, "lastModified": "2016-07-28"}

BOOKS_MIDDLE = [
    BOOK,
    {"_id": 2, "title": "Baked Goods", "isbn": "9999999999999", "author": {"last": "xyz", "first": "abc", "middle": ""}, "copies": 2, "lastModified": "2017-07-21"},
    {"_id": 3, "title": "Ice Cream Cakes", "isbn": "8888888888888", "author": {"last": "xyz", "first": "abc", "middle": "mmm"}, "copies": 5, "lastModified": "2017-07-22"},
]

BOOKMARKS = [
    {"_id": 1, "user": "1234", "stop": {"title": "book1", "author": "xyz", "page": 32}},
    {"_id": 2, "user": "7890", "stop": [{"title": "book2", "author": "abc", "page": 5}, {"title": "book3", "author": "ijk", "page": 100}]},
]

HOMEWORK = [  # $addFields page
    {"_id": 1, "student": "Maya", "homework": [10, 5, 10], "quiz": [10, 8], "extraCredit": 0},
    {"_id": 2, "student": "Ryan", "homework": [5, 6, 5], "quiz": [8, 8], "extraCredit": 8},
]

VEHICLES = [
    {"_id": 1, "type": "car", "specs": {"doors": 4, "wheels": 4}},
    {"_id": 2, "type": "motorcycle", "specs": {"doors": 0, "wheels": 2}},
    {"_id": 3, "type": "jet ski"},
]

UNSET_BOOKS = [
    {"_id": 1, "title": "Antelope Antics", "isbn": "0001122223334", "author": {"last": "An", "first": "Auntie"}, "copies": [{"warehouse": "A", "qty": 5}, {"warehouse": "B", "qty": 15}]},
    {"_id": 2, "title": "Bees Babble", "isbn": "999999999333", "author": {"last": "Bumble", "first": "Bee"}, "copies": [{"warehouse": "A", "qty": 2}, {"warehouse": "B", "qty": 5}]},
]

PEOPLE = [  # $replaceRoot page
    {"_id": 1, "name": "Arlene", "age": 34, "pets": {"dogs": 2, "cats": 1}},
    {"_id": 2, "name": "Sam", "age": 41, "pets": {"cats": 1, "fish": 3}},
    {"_id": 3, "name": "Maria", "age": 25},
]

STUDENT_GRADES = [
    {"_id": 1, "grades": [{"test": 1, "grade": "A", "mean": 75, "std": 6}, {"test": 2, "grade": "B", "mean": 90, "std": 4}, {"test": 3, "grade": "A", "mean": 85, "std": 6}]},
    {"_id": 2, "grades": [{"test": 1, "grade": "C", "mean": 60, "std": 8}, {"test": 2, "grade": "B", "mean": 85, "std": 4}, {"test": 3, "grade": "B", "mean": 85, "std": 4}]},
]

EXHIBITS = [  # $sortByCount page
    {"_id": 1, "title": "The Pillars of Society", "artist": "Grosz", "year": 1926, "tags": ["painting", "satire", "Expressionism", "caricature"]},
    {"_id": 2, "title": "Melancholy III", "artist": "Munch", "year": 1902, "tags": ["woodcut", "Expressionism"]},
    {"_id": 3, "title": "Dancer", "artist": "Miro", "year": 1925, "tags": ["oil", "Surrealism", "painting"]},
    {"_id": 4, "title": "The Great Wave off Kanagawa", "artist": "Hokusai", "tags": ["woodblock", "ukiyo-e"]},
    {"_id": 5, "title": "The Persistence of Memory", "artist": "Dali", "year": 1931, "tags": ["Surrealism", "painting", "oil"]},
    {"_id": 6, "title": "Composition VII", "artist": "Kandinsky", "year": 1913, "tags": ["oil", "painting", "abstract"]},
    {"_id": 7, "title": "The Scream", "artist": "Munch", "year": 1893, "tags": ["Expressionism", "painting", "oil"]},
    {"_id": 8, "title": "Blue Flower", "artist": "O'Keefe", "year": 1918, "tags": ["abstract", "painting"]},
]

ARTISTS = [  # $bucket page
    {"_id": 1, "last_name": "Bernard", "first_name": "Emil", "year_born": 1868, "year_died": 1941, "nationality": "France"},
    {"_id": 2, "last_name": "Rippl-Ronai", "first_name": "Joszef", "year_born": 1861, "year_died": 1927, "nationality": "Hungary"},
    {"_id": 3, "last_name": "Ostroumova", "first_name": "Anna", "year_born": 1871, "year_died": 1955, "nationality": "Russia"},
    {"_id": 4, "last_name": "Van Gogh", "first_name": "Vincent", "year_born": 1853, "year_died": 1890, "nationality": "Holland"},
    {"_id": 5, "last_name": "Maurer", "first_name": "Alfred", "year_born": 1868, "year_died": 1932, "nationality": "USA"},
    {"_id": 6, "last_name": "Munch", "first_name": "Edvard", "year_born": 1863, "year_died": 1944, "nationality": "Norway"},
    {"_id": 7, "last_name": "Redon", "first_name": "Odilon", "year_born": 1840, "year_died": 1916, "nationality": "France"},
    {"_id": 8, "last_name": "Diriks", "first_name": "Edvard", "year_born": 1855, "year_died": 1930, "nationality": "Norway"},
]

THREE = [{"_id": 1, "a": 1}, {"_id": 2, "a": 2}, {"_id": 3, "a": 3}]

# Single documents used by expression examples
SAL = {"_id": 1, "item": "abc", "price": 10, "fee": 2, "discount": 5, "quantity": 2, "date": D(2014, 3, 1, 8, 0, 0)}
QUIZ = {"_id": 1, "quizzes": [10, 6, 7], "labs": [5, 8], "final": 80, "midterm": 75}
INV = {"_id": 1, "item": "abc1", "description": "product 1", "qty": 300}
ISODOC = {"_id": 1, "item": "abc", "date": D(2014, 1, 1, 8, 15, 39, 736000)}
FAV = {"_id": 1, "name": "dave123", "favorites": ["chocolate", "cake", "butter", "apples"]}
ITEMS = {"_id": 0, "items": [{"item_id": 43, "quantity": 2, "price": 10, "name": "pen"}, {"item_id": 2, "quantity": 1, "price": 240, "name": "briefcase"}]}
OID = ObjectId("5a934e000102030405000000")

# ---------------------------------------------------------------------------
# Pipelines whose output order is defined

P = pytest.param
ORDERED = [
    # pymongo count_documents shapes
    P(THREE, [{"$match": {}}, {"$group": {"_id": 1, "n": {"$sum": 1}}}], [{"_id": 1, "n": 3}], id="count_documents"),
    P([], [{"$match": {}}, {"$group": {"_id": 1, "n": {"$sum": 1}}}], [], id="count_documents-empty"),
    P(THREE, [{"$match": {}}, {"$skip": 1}, {"$limit": 1}, {"$group": {"_id": 1, "n": {"$sum": 1}}}], [{"_id": 1, "n": 1}], id="count_documents-skip-limit"),
    P(THREE, [{"$match": {"a": {"$gt": 5}}}, {"$group": {"_id": 1, "n": {"$sum": 1}}}], [], id="count_documents-no-match"),
    # $count
    P(SCORES, [{"$match": {"score": {"$gt": 80}}}, {"$count": "passing_scores"}], [{"passing_scores": 4}], id="count-docs-example"),
    P(THREE, [{"$count": "total"}], [{"total": 3}], id="count-total"),
    P([], [{"$count": "total"}], [], id="count-zero"),
    # $skip / $limit / $sort
    P(THREE, [{"$limit": 2}], THREE[:2], id="limit"),
    P(THREE, [{"$limit": 10}], THREE, id="limit-more-than-docs"),
    P(THREE, [{"$skip": 2}], THREE[2:], id="skip"),
    P(THREE, [{"$skip": 0}], THREE, id="skip-zero"),
    P(THREE, [{"$skip": 5}], [], id="skip-past-end"),
    P(THREE, [{"$sort": {"a": -1}}], THREE[::-1], id="sort-desc"),
    P(THREE, [{"$sort": {"a": -1}}, {"$limit": 1}], [THREE[2]], id="sort-limit"),
    P(THREE, [{"$sort": {"a": 1}}, {"$skip": 1}, {"$limit": 1}], [THREE[1]], id="sort-skip-limit"),
    P(THREE, [{"$limit": 2.0}], THREE[:2], id="limit-integral-double"),
    # $group with $sort
    P(
        SALES_DEC,
        [
            {"$match": {"date": {"$gte": D(2014, 1, 1), "$lt": D(2015, 1, 1)}}},
            {"$group": {
                "_id": {"$dateToString": {"format": "%Y-%m-%d", "date": "$date"}},
                "totalSaleAmount": {"$sum": {"$multiply": ["$price", "$quantity"]}},
                "averageQuantity": {"$avg": "$quantity"},
                "count": {"$sum": 1},
            }},
            {"$sort": {"totalSaleAmount": -1}},
        ],
        [
            {"_id": "2014-04-04", "totalSaleAmount": Dec("200"), "averageQuantity": 15.0, "count": 2},
            {"_id": "2014-03-15", "totalSaleAmount": Dec("50"), "averageQuantity": 10.0, "count": 1},
            {"_id": "2014-03-01", "totalSaleAmount": Dec("40"), "averageQuantity": 1.5, "count": 2},
        ],
        id="group-by-day-docs-example",
    ),
    P(
        SALES_DEC,
        [{"$group": {"_id": None, "totalSaleAmount": {"$sum": {"$multiply": ["$price", "$quantity"]}}, "averageQuantity": {"$avg": "$quantity"}, "count": {"$sum": 1}}}],
        [{"_id": None, "totalSaleAmount": Dec("452.5"), "averageQuantity": 7.875, "count": 8}],
        id="group-null-docs-example",
    ),
    P(SALES_DEC, [{"$group": {"_id": None, "count": {"$count": {}}}}], [{"_id": None, "count": 8}], id="group-count-accumulator"),
    P(
        SALES,
        [{"$sort": {"date": 1, "item": 1}}, {"$group": {"_id": {"day": {"$dayOfYear": "$date"}, "year": {"$year": "$date"}}, "itemsSold": {"$push": {"item": "$item", "quantity": "$quantity"}}}}, {"$sort": {"_id.day": -1}}],
        [
            {"_id": {"day": 46, "year": 2014}, "itemsSold": [{"item": "abc", "quantity": 10}, {"item": "xyz", "quantity": 10}, {"item": "xyz", "quantity": 5}, {"item": "xyz", "quantity": 10}]},
            {"_id": {"day": 34, "year": 2014}, "itemsSold": [{"item": "jkl", "quantity": 1}, {"item": "xyz", "quantity": 5}]},
            {"_id": {"day": 1, "year": 2014}, "itemsSold": [{"item": "abc", "quantity": 2}]},
        ],
        id="push-docs-example",
    ),
    P(
        SALES,
        [{"$sort": {"item": 1, "date": 1}}, {"$group": {"_id": "$item", "firstSale": {"$first": "$date"}, "lastSalesDate": {"$last": "$date"}}}, {"$sort": {"_id": 1}}],
        [
            {"_id": "abc", "firstSale": D(2014, 1, 1, 8), "lastSalesDate": D(2014, 2, 15, 8)},
            {"_id": "jkl", "firstSale": D(2014, 2, 3, 9), "lastSalesDate": D(2014, 2, 3, 9)},
            {"_id": "xyz", "firstSale": D(2014, 2, 3, 9, 5), "lastSalesDate": D(2014, 2, 15, 14, 12, 12)},
        ],
        id="first-last-docs-example",
    ),
    P(
        BAD_DATA,
        [{"$sort": {"item": 1, "price": 1}}, {"$group": {"_id": "$item", "inStock": {"$first": "$quantity"}}}, {"$sort": {"_id": 1}}],
        [{"_id": None, "inStock": 5}, {"_id": "album", "inStock": ""}, {"_id": "cd", "inStock": None}, {"_id": "tape", "inStock": 4}],
        id="first-missing-values-docs-example",
    ),
    # $unwind
    P([{"_id": 1, "item": "ABC1", "sizes": ["S", "M", "L"]}], [{"$unwind": "$sizes"}],
      [{"_id": 1, "item": "ABC1", "sizes": "S"}, {"_id": 1, "item": "ABC1", "sizes": "M"}, {"_id": 1, "item": "ABC1", "sizes": "L"}], id="unwind-docs-example"),
    P(CLOTHING, [{"$unwind": {"path": "$sizes"}}],
      [{"_id": 1, "item": "ABC", "price": Dec("80"), "sizes": "S"}, {"_id": 1, "item": "ABC", "price": Dec("80"), "sizes": "M"},
       {"_id": 1, "item": "ABC", "price": Dec("80"), "sizes": "L"}, {"_id": 3, "item": "IJK", "price": Dec("160"), "sizes": "M"}], id="unwind-non-array-operand"),
    P(CLOTHING, [{"$unwind": {"path": "$sizes", "preserveNullAndEmptyArrays": True}}],
      [{"_id": 1, "item": "ABC", "price": Dec("80"), "sizes": "S"}, {"_id": 1, "item": "ABC", "price": Dec("80"), "sizes": "M"},
       {"_id": 1, "item": "ABC", "price": Dec("80"), "sizes": "L"}, {"_id": 2, "item": "EFG", "price": Dec("120")},
       {"_id": 3, "item": "IJK", "price": Dec("160"), "sizes": "M"}, {"_id": 4, "item": "LMN", "price": Dec("10")},
       {"_id": 5, "item": "XYZ", "price": Dec("5.75"), "sizes": None}], id="unwind-preserve"),
    P(CLOTHING, [{"$unwind": {"path": "$sizes", "includeArrayIndex": "arrayIndex"}}],
      [{"_id": 1, "item": "ABC", "price": Dec("80"), "sizes": "S", "arrayIndex": Int64(0)},
       {"_id": 1, "item": "ABC", "price": Dec("80"), "sizes": "M", "arrayIndex": Int64(1)},
       {"_id": 1, "item": "ABC", "price": Dec("80"), "sizes": "L", "arrayIndex": Int64(2)},
       {"_id": 3, "item": "IJK", "price": Dec("160"), "sizes": "M", "arrayIndex": None}], id="unwind-include-array-index"),
    P(CLOTHING[1:], [{"$unwind": {"path": "$sizes", "includeArrayIndex": "i", "preserveNullAndEmptyArrays": True}}],
      [{"_id": 2, "item": "EFG", "price": Dec("120"), "i": None}, {"_id": 3, "item": "IJK", "price": Dec("160"), "sizes": "M", "i": None},
       {"_id": 4, "item": "LMN", "price": Dec("10"), "i": None}, {"_id": 5, "item": "XYZ", "price": Dec("5.75"), "sizes": None, "i": None}],
      id="unwind-index-and-preserve"),
    P(
        CLOTHES,
        [{"$unwind": {"path": "$sizes", "preserveNullAndEmptyArrays": True}}, {"$group": {"_id": "$sizes", "averagePrice": {"$avg": "$price"}}}, {"$sort": {"averagePrice": -1, "_id": 1}}],
        [{"_id": "L", "averagePrice": Dec("12.99")}, {"_id": "S", "averagePrice": Dec("12.99")}, {"_id": None, "averagePrice": Dec("11.99")}, {"_id": "M", "averagePrice": Dec("8.99")}],
        id="unwind-then-group-docs-example",
    ),
    P([{"_id": 1, "a": {"b": [1, 2]}}], [{"$unwind": "$a.b"}], [{"_id": 1, "a": {"b": 1}}, {"_id": 1, "a": {"b": 2}}], id="unwind-nested-path"),
    # $project
    P([BOOK], [{"$project": {"title": 1, "author": 1}}], [{"_id": 1, "title": "abc123", "author": {"last": "zzz", "first": "aaa"}}], id="project-include"),
    P([BOOK], [{"$project": {"_id": 0, "title": 1, "author": 1}}], [{"title": "abc123", "author": {"last": "zzz", "first": "aaa"}}], id="project-suppress-id"),
    P([BOOK], [{"$project": {"lastModified": 0}}], [{k: v for k, v in BOOK.items() if k != "lastModified"}], id="project-exclude"),
    P([BOOK], [{"$project": {"author.first": 0, "lastModified": 0}}],
      [{"_id": 1, "title": "abc123", "isbn": "0001122223334", "author": {"last": "zzz"}, "copies": 5}], id="project-exclude-embedded"),
    P([BOOK], [{"$project": {"author": {"first": 0}, "lastModified": 0}}],
      [{"_id": 1, "title": "abc123", "isbn": "0001122223334", "author": {"last": "zzz"}, "copies": 5}], id="project-exclude-nested-spec"),
    P([BOOK], [{"$project": {"_id": 0}}], [{k: v for k, v in BOOK.items() if k != "_id"}], id="project-only-id-zero-is-exclusion"),
    P(
        BOOKS_MIDDLE,
        [{"$project": {"title": 1, "author.first": 1, "author.last": 1, "author.middle": {"$cond": {"if": {"$eq": ["", "$author.middle"]}, "then": "$$REMOVE", "else": "$author.middle"}}}}],
        [
            {"_id": 1, "title": "abc123", "author": {"last": "zzz", "first": "aaa"}},
            {"_id": 2, "title": "Baked Goods", "author": {"last": "xyz", "first": "abc"}},
            {"_id": 3, "title": "Ice Cream Cakes", "author": {"last": "xyz", "first": "abc", "middle": "mmm"}},
        ],
        id="project-conditional-remove-docs-example",
    ),
    P(BOOKMARKS, [{"$project": {"stop.title": 1}}],
      [{"_id": 1, "stop": {"title": "book1"}}, {"_id": 2, "stop": [{"title": "book2"}, {"title": "book3"}]}], id="project-embedded-through-array"),
    P(BOOKMARKS, [{"$project": {"stop": {"title": 1}}}],
      [{"_id": 1, "stop": {"title": "book1"}}, {"_id": 2, "stop": [{"title": "book2"}, {"title": "book3"}]}], id="project-embedded-nested-spec"),
    P(
        [BOOK],
        [{"$project": {
            "title": 1,
            "isbn": {
                "prefix": {"$substr": ["$isbn", 0, 3]}, "group": {"$substr": ["$isbn", 3, 2]},
                "publisher": {"$substr": ["$isbn", 5, 4]}, "title": {"$substr": ["$isbn", 9, 3]},
                "checkDigit": {"$substr": ["$isbn", 12, 1]},
            },
            "lastName": "$author.last",
            "copiesSold": "$copies",
        }}],
        [{"_id": 1, "title": "abc123", "isbn": {"prefix": "000", "group": "11", "publisher": "2222", "title": "333", "checkDigit": "4"}, "lastName": "zzz", "copiesSold": 5}],
        id="project-computed-fields-docs-example",
    ),
    P([{"_id": 7, "x": 1, "y": 1}], [{"$project": {"myArray": ["$x", "$y"]}}], [{"_id": 7, "myArray": [1, 1]}], id="project-new-array"),
    P([{"_id": 7, "x": 1, "y": 1}], [{"$project": {"myArray": ["$x", "$someField"]}}], [{"_id": 7, "myArray": [1, None]}], id="project-new-array-missing-is-null"),
    P([{"_id": 7, "x": 1}], [{"$project": {"y": "$nope", "x": 1}}], [{"_id": 7, "x": 1}], id="project-missing-expression-omitted"),
    P([{"_id": 7, "a": 1}], [{"$project": {"a.b": {"$literal": 5}}}], [{"_id": 7, "a": {"b": 5}}], id="project-computed-into-scalar"),
    P([{"_id": 7, "a": [{"x": 1}, 2]}], [{"$project": {"a.b": {"$literal": 5}}}], [{"_id": 7, "a": [{"b": 5}, {"b": 5}]}], id="project-computed-through-array"),
    P([{"_id": 7, "a": 5, "s": "hi"}], [{"$project": {"_id": "$s", "v": {"$literal": 0}}}], [{"_id": "hi", "v": 0}], id="project-computed-id"),
    # $addFields / $set
    P(
        HOMEWORK,
        [{"$addFields": {"totalHomework": {"$sum": "$homework"}, "totalQuiz": {"$sum": "$quiz"}}}, {"$addFields": {"totalScore": {"$add": ["$totalHomework", "$totalQuiz", "$extraCredit"]}}}],
        [
            {**HOMEWORK[0], "totalHomework": 25, "totalQuiz": 18, "totalScore": 43},
            {**HOMEWORK[1], "totalHomework": 16, "totalQuiz": 16, "totalScore": 40},
        ],
        id="addFields-docs-example",
    ),
    P(VEHICLES, [{"$addFields": {"specs.fuel_type": "diesel"}}],
      [{"_id": 1, "type": "car", "specs": {"doors": 4, "wheels": 4, "fuel_type": "diesel"}},
       {"_id": 2, "type": "motorcycle", "specs": {"doors": 0, "wheels": 2, "fuel_type": "diesel"}},
       {"_id": 3, "type": "jet ski", "specs": {"fuel_type": "diesel"}}], id="addFields-embedded-docs-example"),
    P(VEHICLES[:1], [{"$set": {"specs": {"fuel_type": "unleaded"}}}],
      [{"_id": 1, "type": "car", "specs": {"doors": 4, "wheels": 4, "fuel_type": "unleaded"}}], id="set-nested-spec-merges"),
    P([{"_id": 1, "dogs": 10, "cats": 15}], [{"$addFields": {"cats": 20}}], [{"_id": 1, "dogs": 10, "cats": 20}], id="addFields-overwrite"),
    P([{"_id": 1, "item": "tangerine", "type": "citrus"}], [{"$addFields": {"_id": "$item", "item": "fruit"}}],
      [{"_id": "tangerine", "item": "fruit", "type": "citrus"}], id="addFields-overwrite-uses-input-doc"),
    P(HOMEWORK[:1], [{"$addFields": {"homework": {"$concatArrays": ["$homework", [7]]}}}],
      [{**HOMEWORK[0], "homework": [10, 5, 10, 7]}], id="addFields-append-to-array"),
    P([{"_id": 1, "a": 1, "b": 2}], [{"$set": {"a": "$$REMOVE", "c": True}}], [{"_id": 1, "b": 2, "c": True}], id="set-remove-and-literal-bool"),
    P([{"_id": 1}], [{"$set": {"t": "$$NOW"}}], [{"_id": 1, "t": NOW}], id="set-now"),
    P([{"_id": 1}], [{"$addFields": {}}], [{"_id": 1}], id="addFields-empty"),
    # $unset
    P(UNSET_BOOKS, [{"$unset": "copies"}],
      [{k: v for k, v in d.items() if k != "copies"} for d in UNSET_BOOKS], id="unset-field"),
    P(UNSET_BOOKS, [{"$unset": ["isbn", "copies"]}],
      [{k: v for k, v in d.items() if k not in ("isbn", "copies")} for d in UNSET_BOOKS], id="unset-fields"),
    P(UNSET_BOOKS, [{"$unset": ["isbn", "author.first", "copies.warehouse"]}],
      [{"_id": 1, "title": "Antelope Antics", "author": {"last": "An"}, "copies": [{"qty": 5}, {"qty": 15}]},
       {"_id": 2, "title": "Bees Babble", "author": {"last": "Bumble"}, "copies": [{"qty": 2}, {"qty": 5}]}], id="unset-embedded-docs-example"),
    # $replaceRoot / $replaceWith
    P(PEOPLE, [{"$replaceRoot": {"newRoot": {"$mergeObjects": [{"dogs": 0, "cats": 0, "birds": 0, "fish": 0}, "$pets"]}}}],
      [{"dogs": 2, "cats": 1, "birds": 0, "fish": 0}, {"dogs": 0, "cats": 1, "birds": 0, "fish": 3}, {"dogs": 0, "cats": 0, "birds": 0, "fish": 0}],
      id="replaceRoot-mergeObjects-docs-example"),
    P(PEOPLE, [{"$replaceWith": {"$mergeObjects": [{"dogs": 0, "cats": 0, "birds": 0, "fish": 0}, "$pets"]}}],
      [{"dogs": 2, "cats": 1, "birds": 0, "fish": 0}, {"dogs": 0, "cats": 1, "birds": 0, "fish": 3}, {"dogs": 0, "cats": 0, "birds": 0, "fish": 0}],
      id="replaceWith-docs-example"),
    P(STUDENT_GRADES, [{"$unwind": "$grades"}, {"$match": {"grades.grade": {"$gte": "B"}}}, {"$replaceRoot": {"newRoot": "$grades"}}],
      [{"test": 2, "grade": "B", "mean": 90, "std": 4}, {"test": 1, "grade": "C", "mean": 60, "std": 8},
       {"test": 2, "grade": "B", "mean": 85, "std": 4}, {"test": 3, "grade": "B", "mean": 85, "std": 4}], id="replaceRoot-array-element-docs-example"),
    P([{"_id": 1, "first_name": "Gary", "last_name": "Sheffield", "city": "New York"}],
      [{"$replaceRoot": {"newRoot": {"full_name": {"$concat": ["$first_name", " ", "$last_name"]}}}}],
      [{"full_name": "Gary Sheffield"}], id="replaceRoot-new-document-docs-example"),
    P([{"_id": 1, "name": "a"}], [{"$replaceWith": "$$ROOT"}], [{"_id": 1, "name": "a"}], id="replaceWith-root"),
    # $bucket
    P(
        ARTISTS,
        [
            {"$bucket": {
                "groupBy": "$year_born", "boundaries": [1840, 1850, 1860, 1870, 1880], "default": "Other",
                "output": {"count": {"$sum": 1}, "artists": {"$push": {"name": {"$concat": ["$first_name", " ", "$last_name"]}, "year_born": "$year_born"}}},
            }},
            {"$match": {"count": {"$gt": 3}}},
        ],
        [{"_id": 1860, "count": 4, "artists": [
            {"name": "Emil Bernard", "year_born": 1868}, {"name": "Joszef Rippl-Ronai", "year_born": 1861},
            {"name": "Alfred Maurer", "year_born": 1868}, {"name": "Edvard Munch", "year_born": 1863}]}],
        id="bucket-docs-example",
    ),
    P(ARTISTS, [{"$bucket": {"groupBy": "$year_born", "boundaries": [1850, 1860, 1870], "default": "Other"}}],
      [{"_id": 1850, "count": 2}, {"_id": 1860, "count": 4}, {"_id": "Other", "count": 2}], id="bucket-default-count"),
    # $facet
    P(
        THREE,
        [{"$facet": {"total": [{"$count": "n"}], "top": [{"$sort": {"a": -1}}, {"$limit": 1}, {"$project": {"_id": 0, "a": 1}}], "none": [{"$match": {"a": 9}}]}}],
        [{"total": [{"n": 3}], "top": [{"a": 3}], "none": []}],
        id="facet",
    ),
    P(
        [QUIZ, {"_id": 2, "quizzes": [9, 10], "labs": [8, 8], "final": 95, "midterm": 80}, {"_id": 3, "quizzes": [4, 5, 5], "labs": [6, 5], "final": 78, "midterm": 70}],
        [{"$project": {"quizTotal": {"$sum": "$quizzes"}, "labTotal": {"$sum": "$labs"}, "examTotal": {"$sum": ["$final", "$midterm"]}}}],
        [{"_id": 1, "quizTotal": 23, "labTotal": 13, "examTotal": 155}, {"_id": 2, "quizTotal": 19, "labTotal": 16, "examTotal": 175},
         {"_id": 3, "quizTotal": 14, "labTotal": 11, "examTotal": 148}],
        id="sum-in-project-docs-example",
    ),
    # misc
    P(THREE, [], THREE, id="empty-pipeline"),
    P([{"_id": 1, "a": [{"b": 1}, {"b": 2}, {"c": 3}, 5]}], [{"$project": {"_id": 0, "v": "$a.b"}}], [{"v": [1, 2]}], id="field-path-through-array"),
    P([{"_id": 1, "a": [{"b": [{"c": 1}, {"c": 2}]}, {"b": [{"c": 3}]}]}], [{"$project": {"_id": 0, "v": "$a.b.c"}}], [{"v": [[1, 2], [3]]}], id="field-path-nested-arrays"),
    P([{"_id": 1, "a": [1, 2]}], [{"$project": {"_id": 0, "v": "$a.0"}}], [{"v": []}], id="field-path-no-array-index"),
    P([{"_id": 1, "a": {"b": 2}}], [{"$project": {"_id": 0, "r": "$$ROOT.a.b", "c": "$$CURRENT.a"}}], [{"r": 2, "c": {"b": 2}}], id="root-and-current"),
]


@pytest.mark.parametrize(("docs", "pipeline", "expected"), ORDERED)
def test_pipeline(docs: list[dict[str, Any]], pipeline: list[dict[str, Any]], expected: list[dict[str, Any]]) -> None:
    validate_pipeline(pipeline)
    out = run(docs, pipeline)
    assert same(out, expected), f"\n got: {out!r}\nwant: {expected!r}"


# ---------------------------------------------------------------------------
# $group (and friends) without a final $sort: MongoDB promises no order

UNORDERED = [
    P(SALES_DEC, [{"$group": {"_id": "$item"}}], [{"_id": "abc"}, {"_id": "jkl"}, {"_id": "def"}, {"_id": "xyz"}], id="distinct-docs-example"),
    P(SALES_DEC, [{"$group": {"_id": "$item", "totalSaleAmount": {"$sum": {"$multiply": ["$price", "$quantity"]}}}}, {"$match": {"totalSaleAmount": {"$gte": 100}}}],
      [{"_id": "abc", "totalSaleAmount": Dec("170")}, {"_id": "xyz", "totalSaleAmount": Dec("150")}, {"_id": "def", "totalSaleAmount": Dec("112.5")}], id="group-having-docs-example"),
    P(SALES[:5], [{"$group": {"_id": {"day": {"$dayOfYear": "$date"}, "year": {"$year": "$date"}}, "totalAmount": {"$sum": {"$multiply": ["$price", "$quantity"]}}, "count": {"$sum": 1}}}],
      [{"_id": {"day": 46, "year": 2014}, "totalAmount": 150, "count": 2}, {"_id": {"day": 34, "year": 2014}, "totalAmount": 45, "count": 2},
       {"_id": {"day": 1, "year": 2014}, "totalAmount": 20, "count": 1}], id="sum-docs-example"),
    P(SALES[:5], [{"$group": {"_id": {"day": {"$dayOfYear": "$date"}, "year": {"$year": "$date"}}, "totalAmount": {"$sum": "$qty"}, "count": {"$sum": 1}}}],
      [{"_id": {"day": 46, "year": 2014}, "totalAmount": 0, "count": 2}, {"_id": {"day": 34, "year": 2014}, "totalAmount": 0, "count": 2},
       {"_id": {"day": 1, "year": 2014}, "totalAmount": 0, "count": 1}], id="sum-nonexistent-field-docs-example"),
    P(SALES, [{"$group": {"_id": "$item", "avgAmount": {"$avg": {"$multiply": ["$price", "$quantity"]}}, "avgQuantity": {"$avg": "$quantity"}}}],
      [{"_id": "xyz", "avgAmount": 37.5, "avgQuantity": 7.5}, {"_id": "jkl", "avgAmount": 20.0, "avgQuantity": 1.0},
       {"_id": "abc", "avgAmount": 60.0, "avgQuantity": 6.0}], id="avg-docs-example"),
    P(SALES, [{"$group": {"_id": "$item", "maxTotalAmount": {"$max": {"$multiply": ["$price", "$quantity"]}}, "maxQuantity": {"$max": "$quantity"}}}],
      [{"_id": "xyz", "maxTotalAmount": 50, "maxQuantity": 10}, {"_id": "jkl", "maxTotalAmount": 20, "maxQuantity": 1},
       {"_id": "abc", "maxTotalAmount": 100, "maxQuantity": 10}], id="max-docs-example"),
    P(SALES, [{"$group": {"_id": "$item", "minQuantity": {"$min": "$quantity"}}}],
      [{"_id": "xyz", "minQuantity": 5}, {"_id": "jkl", "minQuantity": 1}, {"_id": "abc", "minQuantity": 2}], id="min-docs-example"),
    P([{"_id": 1, "g": 1, "v": None}, {"_id": 2, "g": 1}, {"_id": 3, "g": 2, "v": 4}], [{"$group": {"_id": "$g", "lo": {"$min": "$v"}, "hi": {"$max": "$v"}}}],
      [{"_id": 1, "lo": None, "hi": None}, {"_id": 2, "lo": 4, "hi": 4}], id="min-max-ignore-null"),
    P([{"_id": 1, "v": "a"}, {"_id": 2, "v": 3}, {"_id": 3, "v": [1]}], [{"$group": {"_id": None, "lo": {"$min": "$v"}, "hi": {"$max": "$v"}}}],
      [{"_id": None, "lo": 3, "hi": [1]}], id="min-max-bson-order"),
    P([{"_id": 1, "g": "a", "v": "x"}, {"_id": 2, "g": "a"}, {"_id": 3, "g": "a", "v": None}], [{"$group": {"_id": "$g", "p": {"$push": "$v"}, "s": {"$addToSet": "$v"}}}],
      [{"_id": "a", "p": ["x", None], "s": ["x", None]}], id="push-skips-missing"),
    P([{"_id": 1, "a": 1}, {"_id": 2, "a": 1.0}, {"_id": 3, "a": Int64(1)}, {"_id": 4, "a": 2}], [{"$group": {"_id": None, "s": {"$addToSet": "$a"}}}],
      [{"_id": None, "s": [1, 2]}], id="addToSet-numeric-equality"),
    P([{"_id": 1, "a": None}, {"_id": 2}, {"_id": 3, "a": 1}, {"_id": 4, "a": 1.0}], [{"$group": {"_id": "$a", "n": {"$sum": 1}}}],
      [{"_id": None, "n": 2}, {"_id": 1, "n": 2}], id="group-missing-and-null-together-numbers-equal"),
    P([{"_id": 1, "a": 1, "b": 2}, {"_id": 2, "a": 1}, {"_id": 3, "a": 1, "b": 2}], [{"$group": {"_id": {"a": "$a", "b": "$b"}, "n": {"$sum": 1}}}],
      [{"_id": {"a": 1, "b": 2}, "n": 2}, {"_id": {"a": 1}, "n": 1}], id="group-document-key-omits-missing"),
    P(THREE, [{"$group": {"_id": "constant", "s": {"$sum": "$a"}}}], [{"_id": "constant", "s": 6}], id="group-constant-key"),
    P([{"_id": 1, "v": "x"}, {"_id": 2, "v": None}], [{"$group": {"_id": None, "s": {"$sum": "$v"}, "a": {"$avg": "$v"}}}],
      [{"_id": None, "s": 0, "a": None}], id="sum-no-numbers-is-zero-avg-null"),
    P([{"_id": 1, "v": 2**31 - 1}, {"_id": 2, "v": 1}], [{"$group": {"_id": None, "s": {"$sum": "$v"}}}], [{"_id": None, "s": 2**31}], id="sum-int32-overflow"),
    P([{"_id": 1, "v": Int64(2**63 - 1)}, {"_id": 2, "v": 1}], [{"$group": {"_id": None, "s": {"$sum": "$v"}}}], [{"_id": None, "s": float(2**63)}], id="sum-int64-overflow-double"),
    P([{"_id": 1, "v": 1}, {"_id": 2, "v": 2.5}], [{"$group": {"_id": None, "s": {"$sum": "$v"}}}], [{"_id": None, "s": 3.5}], id="sum-mixed-double"),
    P([{"_id": 1, "v": 0.1}, {"_id": 2, "v": 0.2}, {"_id": 3, "v": 0.3}], [{"$group": {"_id": None, "s": {"$sum": "$v"}}}], [{"_id": None, "s": 0.6}], id="sum-doubles-compensated"),
    P([{"_id": 1, "d": {"a": 1}}, {"_id": 2, "d": {"b": 2, "a": 3}}, {"_id": 3, "d": None}], [{"$group": {"_id": None, "m": {"$mergeObjects": "$d"}}}],
      [{"_id": None, "m": {"a": 3, "b": 2}}], id="mergeObjects-accumulator"),
    P([{"_id": 1, "v": 2}, {"_id": 2, "v": 4}, {"_id": 3, "v": 4}, {"_id": 4, "v": 4}, {"_id": 5, "v": 5}, {"_id": 6, "v": 5}, {"_id": 7, "v": 7}, {"_id": 8, "v": 9}],
      [{"$group": {"_id": None, "p": {"$stdDevPop": "$v"}, "one": {"$stdDevSamp": "$_id"}}}], [{"_id": None, "p": 2.0, "one": 2.449489742783178}], id="stdDev"),
    P(SALES, [{"$group": {"_id": "$item", "docs": {"$push": "$$ROOT._id"}}}],
      [{"_id": "abc", "docs": [1, 4]}, {"_id": "jkl", "docs": [2]}, {"_id": "xyz", "docs": [3, 5, 6, 7]}], id="push-root"),
]


@pytest.mark.parametrize(("docs", "pipeline", "expected"), UNORDERED)
def test_pipeline_unordered(docs: list[dict[str, Any]], pipeline: list[dict[str, Any]], expected: list[dict[str, Any]]) -> None:
    validate_pipeline(pipeline)
    out = run(docs, pipeline)
    assert same_unordered(out, expected), f"\n got: {out!r}\nwant: {expected!r}"


def test_add_to_set_docs_example() -> None:
    pipeline = [{"$group": {"_id": {"day": {"$dayOfYear": "$date"}, "year": {"$year": "$date"}}, "itemsSold": {"$addToSet": "$item"}}}]
    out = {doc["_id"]["day"]: sorted(doc["itemsSold"]) for doc in run(SALES, pipeline)}
    assert out == {46: ["abc", "xyz"], 34: ["jkl", "xyz"], 1: ["abc"]}


def test_sort_by_count_docs_example() -> None:
    out = run(EXHIBITS, [{"$unwind": "$tags"}, {"$sortByCount": "$tags"}])
    counts = [doc["count"] for doc in out]
    assert counts == sorted(counts, reverse=True)
    assert all(list(doc) == ["_id", "count"] for doc in out)
    assert {doc["_id"]: doc["count"] for doc in out} == {
        "painting": 6, "oil": 4, "Expressionism": 3, "Surrealism": 2, "abstract": 2,
        "woodblock": 1, "woodcut": 1, "ukiyo-e": 1, "satire": 1, "caricature": 1,
    }


def test_sort_by_count_expression() -> None:
    out = run(THREE, [{"$sortByCount": {"$mod": ["$a", 2]}}])
    assert out == [{"_id": 1, "count": 2}, {"_id": 0, "count": 1}]


def test_match_and_limit_stream_without_materializing() -> None:
    endless = ({"_id": i, "even": i % 2 == 0} for i in itertools.count())
    out = list(iter_pipeline(endless, [{"$match": {"even": True}}, {"$limit": 3}], now=NOW))
    assert [doc["_id"] for doc in out] == [0, 2, 4]


def test_stages_do_not_mutate_input() -> None:
    docs = [{"_id": 1, "a": {"b": 1, "c": [1, 2]}, "d": [{"e": 1}]}]
    snapshot = repr(docs)
    pipeline = [
        {"$addFields": {"a.x": 1, "d.f": 2}}, {"$set": {"a.b": 5}}, {"$project": {"a.c": 0}},
        {"$unset": "d.e"}, {"$unwind": {"path": "$d", "includeArrayIndex": "a.i"}},
    ]
    run(docs, pipeline)
    run(docs, [{"$unwind": "$a.c"}, {"$project": {"a.b": 1}}])
    assert repr(docs) == snapshot


# ---------------------------------------------------------------------------
# Expressions: (expression, document, expected); MISSING means "no value"


EXPRESSIONS = [
    # arithmetic ($add, $subtract, $multiply, $divide, $mod, $abs ... pages)
    P({"$add": ["$price", "$fee"]}, SAL, 12, id="add"),
    P({"$add": ["$date", 3 * 24 * 60 * 60000]}, SAL, D(2014, 3, 4, 8, 0, 0), id="add-date"),
    P({"$add": [1, 2.5]}, {}, 3.5, id="add-int-double"),
    P({"$add": [1, None, "x"]}, {}, None, id="add-null-first"),
    P({"$add": [1, "$nope"]}, {}, None, id="add-missing"),
    P({"$add": [2**31 - 1, 1]}, {}, 2**31, id="add-int32-overflow-is-long"),
    P({"$add": [Dec("1.1"), 1]}, {}, Dec("2.1"), id="add-decimal"),
    P({"$add": []}, {}, 0, id="add-nothing"),
    P({"$subtract": [{"$add": ["$price", "$fee"]}, "$discount"]}, SAL, 7, id="subtract"),
    P({"$subtract": ["$date", 5 * 60 * 1000]}, SAL, D(2014, 3, 1, 7, 55), id="subtract-ms-from-date"),
    P({"$subtract": ["$$NOW", "$date"]}, SAL, Int64((NOW - D(2014, 3, 1, 8)) // datetime.timedelta(milliseconds=1)), id="subtract-dates"),
    P({"$subtract": [5, 1.5]}, {}, 3.5, id="subtract-double"),
    P({"$multiply": ["$price", "$quantity"]}, SAL, 20, id="multiply"),
    P({"$multiply": [2**40, 2**40]}, {}, float(2**80), id="multiply-overflow-double"),
    P({"$multiply": [Dec("7.5"), 5]}, {}, Dec("37.5"), id="multiply-decimal"),
    P({"$divide": [80, 8]}, {}, 10.0, id="divide-is-double"),
    P({"$divide": [1, 4]}, {}, 0.25, id="divide"),
    P({"$divide": [None, 4]}, {}, None, id="divide-null"),
    P({"$mod": [80, 7]}, {}, 3, id="mod"),
    P({"$mod": [-13, 9]}, {}, -4, id="mod-negative-dividend"),
    P({"$mod": [13, -9]}, {}, 4, id="mod-negative-divisor"),
    P({"$mod": [5.5, 2]}, {}, 1.5, id="mod-double"),
    P({"$abs": {"$subtract": [50, 80]}}, {}, 30, id="abs"),
    P({"$abs": None}, {}, None, id="abs-null"),
    P({"$abs": -(2**31)}, {}, 2**31, id="abs-int-min"),
    P({"$ceil": 9.25}, {}, 10.0, id="ceil"),
    P({"$ceil": -2.5}, {}, -2.0, id="ceil-negative"),
    P({"$floor": -2.5}, {}, -3.0, id="floor-negative"),
    P({"$floor": 7}, {}, 7, id="floor-int"),
    P({"$round": [19.25, 1]}, {}, 19.2, id="round-half-even"),
    P({"$round": [-45.39, 1]}, {}, -45.4, id="round-negative"),
    P({"$round": [10.5, 0]}, {}, 10.0, id="round-10.5"),
    P({"$round": [11.5]}, {}, 12.0, id="round-11.5"),
    P({"$round": [1234, -2]}, {}, 1200, id="round-int-negative-place"),
    P({"$trunc": [19.25, 1]}, {}, 19.2, id="trunc"),
    P({"$sqrt": 25}, {}, 5.0, id="sqrt"),
    P({"$pow": [5, 2]}, {}, 25, id="pow-int"),
    P({"$pow": [5, -2]}, {}, 0.04, id="pow-negative-exponent"),
    # comparison and boolean ($cmp, $eq, $and, $or, $not pages)
    P({"$cmp": ["$qty", 250]}, INV, 1, id="cmp-gt"),
    P({"$cmp": ["$qty", 300]}, INV, 0, id="cmp-eq"),
    P({"$eq": ["$qty", 250]}, INV, False, id="eq"),
    P({"$eq": [1, 1.0]}, {}, True, id="eq-numbers"),
    P({"$eq": ["$nope", None]}, {}, False, id="eq-missing-not-null"),
    P({"$ne": ["$qty", 250]}, INV, True, id="ne"),
    P({"$gt": ["$qty", 250]}, INV, True, id="gt"),
    P({"$gte": ["$qty", 300]}, INV, True, id="gte"),
    P({"$lt": ["$qty", 250]}, INV, False, id="lt"),
    P({"$lte": ["$qty", 300]}, INV, True, id="lte"),
    P({"$gt": ["a", 5]}, {}, True, id="gt-bson-order"),
    P({"$lt": [None, 0]}, {}, True, id="lt-null-below-numbers"),
    P({"$and": [{"$gt": ["$qty", 100]}, {"$lt": ["$qty", 250]}]}, INV, False, id="and"),
    P({"$and": [1, "green"]}, {}, True, id="and-truthy"),
    P({"$and": []}, {}, True, id="and-empty"),
    P({"$and": [[None], [False], [0]]}, {}, True, id="and-arrays-truthy"),
    P({"$and": [None, True]}, {}, False, id="and-null"),
    P({"$and": [0, True]}, {}, False, id="and-zero"),
    P({"$or": [[False], False]}, {}, True, id="or-array-truthy"),
    P({"$or": [None, 0, "$nope"]}, {}, False, id="or-falsy"),
    P({"$or": []}, {}, False, id="or-empty"),
    P({"$not": [True]}, {}, False, id="not-true"),
    P({"$not": [[False]]}, {}, False, id="not-array"),
    P({"$not": [None]}, {}, True, id="not-null"),
    P({"$not": 0}, {}, True, id="not-zero"),
    # conditionals
    P({"$cond": {"if": {"$gte": ["$qty", 250]}, "then": 30, "else": 20}}, INV, 30, id="cond-object"),
    P({"$cond": [{"$gte": ["$qty", 301]}, 30, 20]}, INV, 20, id="cond-array"),
    P({"$ifNull": ["$description", "Unspecified"]}, {"_id": 1, "description": "toy car"}, "toy car", id="ifNull-present"),
    P({"$ifNull": ["$description", "Unspecified"]}, {"_id": 2, "description": None}, "Unspecified", id="ifNull-null"),
    P({"$ifNull": ["$description", "Unspecified"]}, {"_id": 3}, "Unspecified", id="ifNull-missing"),
    P({"$ifNull": ["$description", "$quantity", "Unspecified"]}, {"_id": 2, "description": None, "quantity": 200}, 200, id="ifNull-multiple"),
    P({"$switch": {"branches": [
        {"case": {"$gte": [{"$avg": "$scores"}, 90]}, "then": "Doing great!"},
        {"case": {"$and": [{"$gte": [{"$avg": "$scores"}, 80]}, {"$lt": [{"$avg": "$scores"}, 90]}]}, "then": "Doing pretty well."},
        {"case": {"$lt": [{"$avg": "$scores"}, 80]}, "then": "Needs improvement."}], "default": "No scores found."}},
      {"_id": 1, "name": "Susan Wilkes", "scores": [87, 86, 78]}, "Doing pretty well.", id="switch-docs-example"),
    P({"$switch": {"branches": [{"case": False, "then": 1}], "default": "d"}}, {}, "d", id="switch-default"),
    # literals and variables
    P({"$literal": {"$add": [2, 3]}}, {}, {"$add": [2, 3]}, id="literal-operator"),
    P({"$literal": "$1"}, {}, "$1", id="literal-dollar-string"),
    P({"$let": {"vars": {"total": {"$add": ["$price", "$tax"]}, "discounted": {"$cond": {"if": "$applyDiscount", "then": 0.9, "else": 1}}},
                "in": {"$multiply": ["$$total", "$$discounted"]}}}, {"_id": 1, "price": 10, "tax": 0.50, "applyDiscount": True}, 10.5 * 0.9, id="let-docs-example"),
    P({"a": "$price", "b": {"c": "$nope"}, "d": [1, "$nope"]}, SAL, {"a": 10, "b": {}, "d": [1, None]}, id="expression-object"),
    P("$$REMOVE", {}, MISSING, id="remove"),
    P("$nope.deeper", {}, MISSING, id="missing-path"),
    P(5, {}, 5, id="literal-number"),
    P("plain", {}, "plain", id="literal-string"),
    # strings
    P({"$concat": ["$item", " - ", "$description"]}, INV, "abc1 - product 1", id="concat"),
    P({"$concat": ["a", None]}, {}, None, id="concat-null"),
    P({"$concat": ["a", "$nope"]}, {}, None, id="concat-missing"),
    P({"$toLower": "ABC1"}, {}, "abc1", id="toLower"),
    P({"$toUpper": "$description"}, INV, "PRODUCT 1", id="toUpper"),
    P({"$toUpper": None}, {}, "", id="toUpper-null"),
    P({"$toUpper": 5}, {}, "5", id="toUpper-number"),
    P({"$toUpper": "é"}, {}, "é", id="toUpper-ascii-only"),
    P({"$substr": ["13Q1", 0, 2]}, {}, "13", id="substr"),
    P({"$substr": ["13Q1", 2, -1]}, {}, "Q1", id="substr-rest"),
    P({"$substrBytes": ["éclair", 0, 3]}, {}, "éc", id="substrBytes-utf8"),
    P({"$substrCP": ["13Q1", 2, {"$subtract": [{"$strLenCP": "13Q1"}, 2]}]}, {}, "Q1", id="substrCP-docs-example"),
    P({"$substrCP": ["éclair", 0, 3]}, {}, "écl", id="substrCP-unicode"),
    P({"$strLenCP": "cafétéria"}, {}, 9, id="strLenCP"),
    P({"$strLenBytes": "cafétéria"}, {}, 11, id="strLenBytes"),
    P({"$split": ["June-15-2013", "-"]}, {}, ["June", "15", "2013"], id="split"),
    P({"$split": ["banana split", "a"]}, {}, ["b", "n", "n", " split"], id="split-repeat"),
    P({"$strcasecmp": ["13Q1", "13q4"]}, {}, -1, id="strcasecmp-lt"),
    P({"$strcasecmp": ["13Q4", "13q4"]}, {}, 0, id="strcasecmp-eq"),
    P({"$trim": {"input": "  \n good  bye \t  "}}, {}, "good  bye", id="trim"),
    P({"$trim": {"input": " ggggoodbyeeeee", "chars": "ge"}}, {}, " ggggoodby", id="trim-chars"),
    P({"$ltrim": {"input": "  x  "}}, {}, "x  ", id="ltrim"),
    P({"$trim": {"input": None}}, {}, None, id="trim-null"),
    # arrays
    P({"$size": "$favorites"}, FAV, 4, id="size"),
    P({"$cond": {"if": {"$isArray": "$colors"}, "then": {"$size": "$colors"}, "else": "NA"}}, {"_id": 4}, "NA", id="size-guarded-docs-example"),
    P({"$arrayElemAt": ["$favorites", 0]}, FAV, "chocolate", id="arrayElemAt-first"),
    P({"$arrayElemAt": ["$favorites", -1]}, FAV, "apples", id="arrayElemAt-last"),
    P({"$arrayElemAt": [[1, 2, 3], -2]}, {}, 2, id="arrayElemAt-negative"),
    P({"$arrayElemAt": [[1, 2, 3], 15]}, {}, MISSING, id="arrayElemAt-out-of-range"),
    P({"$arrayElemAt": ["$nope", 0]}, {}, None, id="arrayElemAt-missing"),
    P({"$first": [[1, 2, 3]]}, {}, 1, id="first-array"),
    P({"$last": "$favorites"}, FAV, "apples", id="last-array"),
    P({"$in": [2, [1, 2, 3]]}, {}, True, id="in"),
    P({"$in": ["abc", ["xyz", "abc"]]}, {}, True, id="in-string"),
    P({"$in": ["xy", ["xyz", "abc"]]}, {}, False, id="in-no-substring"),
    P({"$in": [["a"], ["a"]]}, {}, False, id="in-array-needle"),
    P({"$in": [["a"], [["a"]]]}, {}, True, id="in-nested-array"),
    P({"$in": [Regex("^a"), ["a"]]}, {}, False, id="in-regex-is-literal"),
    P({"$in": [Regex("^a"), [Regex("^a")]]}, {}, True, id="in-regex-equal"),
    P({"$concatArrays": [["hello", " "], ["world"]]}, {}, ["hello", " ", "world"], id="concatArrays"),
    P({"$concatArrays": [["hello", " "], [["world"], "again"]]}, {}, ["hello", " ", ["world"], "again"], id="concatArrays-nested"),
    P({"$concatArrays": [[1], None]}, {}, None, id="concatArrays-null"),
    P({"$slice": [[1, 2, 3], 1, 1]}, {}, [2], id="slice-position"),
    P({"$slice": [[1, 2, 3], -2]}, {}, [2, 3], id="slice-from-end"),
    P({"$slice": [[1, 2, 3], 15, 2]}, {}, [], id="slice-past-end"),
    P({"$slice": [[1, 2, 3], -15, 2]}, {}, [1, 2], id="slice-negative-past-start"),
    P({"$range": [0, 10, 2]}, {}, [0, 2, 4, 6, 8], id="range"),
    P({"$range": [10, 0, -2]}, {}, [10, 8, 6, 4, 2], id="range-negative-step"),
    P({"$range": [0, 10, -2]}, {}, [], id="range-empty"),
    P({"$reverseArray": [[1, 2, 3]]}, {}, [3, 2, 1], id="reverseArray"),
    P({"$indexOfArray": [["a", "abc"], "a"]}, {}, 0, id="indexOfArray"),
    P({"$indexOfArray": [[1, 2], 5]}, {}, -1, id="indexOfArray-absent"),
    P({"$indexOfArray": [["a", "abc", "de", ["de"]], ["de"]]}, {}, 3, id="indexOfArray-array"),
    P({"$indexOfArray": [None, 5]}, {}, None, id="indexOfArray-null"),
    P({"$map": {"input": "$quizzes", "as": "grade", "in": {"$add": ["$$grade", 2]}}}, {"quizzes": [5, 6, 7]}, [7, 8, 9], id="map-docs-example"),
    P({"$map": {"input": [1, 2], "in": {"$multiply": ["$$this", 10]}}}, {}, [10, 20], id="map-default-this"),
    P({"$filter": {"input": "$items", "as": "item", "cond": {"$gte": ["$$item.price", 100]}}}, ITEMS, [ITEMS["items"][1]], id="filter-docs-example"),
    P({"$filter": {"input": [1, 2, 3, 4], "cond": {"$gt": ["$$this", 1]}, "limit": 2}}, {}, [2, 3], id="filter-limit"),
    P({"$reduce": {"input": ["a", "b", "c"], "initialValue": "", "in": {"$concat": ["$$value", "$$this"]}}}, {}, "abc", id="reduce-concat"),
    P({"$reduce": {"input": [1, 2, 3, 4], "initialValue": {"sum": 5, "product": 2},
                   "in": {"sum": {"$add": ["$$value.sum", "$$this"]}, "product": {"$multiply": ["$$value.product", "$$this"]}}}},
      {}, {"sum": 15, "product": 48}, id="reduce-object"),
    P({"$reduce": {"input": [[3, 4], [5, 6]], "initialValue": [1, 2], "in": {"$concatArrays": ["$$value", "$$this"]}}}, {}, [1, 2, 3, 4, 5, 6], id="reduce-arrays"),
    P({"$mergeObjects": [{"a": 1}, None]}, {}, {"a": 1}, id="mergeObjects-null"),
    P({"$mergeObjects": [None, None]}, {}, {}, id="mergeObjects-nulls"),
    P({"$mergeObjects": [{"a": 1}, {"a": 2, "b": 2}, {"a": 3, "c": 3}]}, {}, {"a": 3, "b": 2, "c": 3}, id="mergeObjects"),
    P({"$objectToArray": {"item": "foo", "qty": 25}}, {}, [{"k": "item", "v": "foo"}, {"k": "qty", "v": 25}], id="objectToArray"),
    P({"$arrayToObject": [[["item", "abc123"], ["qty", 25]]]}, {}, {"item": "abc123", "qty": 25}, id="arrayToObject-pairs"),
    P({"$arrayToObject": [[{"k": "item", "v": "abc123"}, {"k": "qty", "v": 25}]]}, {}, {"item": "abc123", "qty": 25}, id="arrayToObject-kv"),
    P({"$arrayToObject": [[["item", "abc123"], ["qty", 25], ["item", "def456"]]]}, {}, {"item": "def456", "qty": 25}, id="arrayToObject-repeat"),
    # $sum/$avg/$min/$max expression form ($sum page, students example)
    P({"$sum": "$quizzes"}, QUIZ, 23, id="sum-array"),
    P({"$sum": ["$final", "$midterm"]}, QUIZ, 155, id="sum-operands"),
    P({"$sum": ["$quizzes", 1]}, QUIZ, 1, id="sum-array-among-operands-ignored"),
    P({"$sum": "$nope"}, QUIZ, 0, id="sum-missing"),
    P({"$avg": "$labs"}, QUIZ, 6.5, id="avg-array"),
    P({"$avg": ["$final", "$midterm"]}, QUIZ, 77.5, id="avg-operands"),
    P({"$avg": "$quizzes"}, QUIZ, 23 / 3, id="avg-thirds"),
    P({"$avg": []}, {}, None, id="avg-empty"),
    P({"$max": "$quizzes"}, QUIZ, 10, id="max-array"),
    P({"$max": ["$final", "$midterm"]}, QUIZ, 80, id="max-operands"),
    P({"$min": "$labs"}, QUIZ, 5, id="min-array"),
    P({"$min": [None, "$nope"]}, QUIZ, None, id="min-nothing"),
    # types and conversions
    P({"$type": "a"}, {}, "string", id="type-string"),
    P({"$type": Regex("a")}, {}, "regex", id="type-regex"),
    P({"$type": 1}, {}, "int", id="type-int"),
    P({"$type": Int64(627)}, {}, "long", id="type-long"),
    P({"$type": 1.5}, {}, "double", id="type-double"),
    P({"$type": Dec("1")}, {}, "decimal", id="type-decimal"),
    P({"$type": {"x": 1}}, {}, "object", id="type-object"),
    P({"$type": [[1, 2, 3]]}, {}, "array", id="type-array"),
    P({"$type": "$nope"}, {}, "missing", id="type-missing"),
    P({"$type": None}, {}, "null", id="type-null"),
    P({"$type": True}, {}, "bool", id="type-bool"),
    P({"$type": "$d"}, {"d": D(2020, 1, 1)}, "date", id="type-date"),
    P({"$type": OID}, {}, "objectId", id="type-objectId"),
    P({"$isNumber": "5"}, {}, False, id="isNumber"),
    P({"$toString": 2.5}, {}, "2.5", id="toString-double"),
    P({"$toString": True}, {}, "true", id="toString-bool"),
    P({"$toString": OID}, {}, "5a934e000102030405000000", id="toString-objectId"),
    P({"$toString": "$d"}, {"d": D(2018, 3, 27, 4, 8, 58, 223000)}, "2018-03-27T04:08:58.223Z", id="toString-date"),
    P({"$toInt": "10"}, {}, 10, id="toInt-string"),
    P({"$toInt": 5.9}, {}, 5, id="toInt-truncates"),
    P({"$toLong": True}, {}, Int64(1), id="toLong-bool"),
    P({"$toDouble": "5.5"}, {}, 5.5, id="toDouble-string"),
    P({"$toBool": 0}, {}, False, id="toBool-zero"),
    P({"$toBool": "false"}, {}, True, id="toBool-string"),
    P({"$toInt": None}, {}, None, id="toInt-null"),
    # dates ($year, $dateToString pages)
    P({"$year": "$date"}, ISODOC, 2014, id="year"),
    P({"$month": "$date"}, ISODOC, 1, id="month"),
    P({"$dayOfMonth": "$date"}, ISODOC, 1, id="dayOfMonth"),
    P({"$hour": "$date"}, ISODOC, 8, id="hour"),
    P({"$minute": "$date"}, ISODOC, 15, id="minute"),
    P({"$second": "$date"}, ISODOC, 39, id="second"),
    P({"$millisecond": "$date"}, ISODOC, 736, id="millisecond"),
    P({"$dayOfYear": "$date"}, ISODOC, 1, id="dayOfYear"),
    P({"$dayOfWeek": "$date"}, ISODOC, 4, id="dayOfWeek"),
    P({"$week": "$date"}, ISODOC, 0, id="week"),
    P({"$hour": {"date": "$date", "timezone": "+04:30"}}, ISODOC, 12, id="hour-offset"),
    P({"$year": "$nope"}, {}, None, id="year-missing"),
    P({"$year": OID}, {}, 2018, id="year-objectId"),
    P({"$dateToString": {"format": "%Y-%m-%d", "date": "$date"}}, ISODOC, "2014-01-01", id="dateToString"),
    P({"$dateToString": {"format": "%H:%M:%S:%L%z", "date": "$date", "timezone": "+04:30"}}, ISODOC, "12:45:39:736+0430", id="dateToString-offset"),
    P({"$dateToString": {"format": "%Z", "date": "$date", "timezone": "-05:00"}}, ISODOC, "-300", id="dateToString-minutes-offset"),
    P({"$dateToString": {"date": "$date"}}, ISODOC, "2014-01-01T08:15:39.736Z", id="dateToString-default-format"),
    P({"$dateToString": {"format": "%j %w %u %U %G-W%V %%", "date": "$date"}}, ISODOC, "001 4 3 00 2014-W01 %", id="dateToString-specifiers"),
    P({"$dateToString": {"date": "$nope", "onNull": "none"}}, {}, "none", id="dateToString-onNull"),
    P("$$NOW", {}, NOW, id="now"),
]


@pytest.mark.parametrize(("expr", "doc", "expected"), EXPRESSIONS)
def test_expression(expr: Any, doc: dict[str, Any], expected: Any) -> None:
    got = evaluate(expr, doc, now=NOW)
    assert same(got, expected), f"got {got!r}, want {expected!r}"


def test_expression_in_project_matches_evaluate() -> None:
    out = run([SAL], [{"$project": {"_id": 0, "v": {"$add": ["$price", "$fee"]}, "m": {"$arrayElemAt": [[1], 5]}}}])
    assert out == [{"v": 12}]


# ---------------------------------------------------------------------------
# Errors: (docs, pipeline, code[, message fragment])

ERRORS = [
    P([], {"$match": {}}, 14, "", id="pipeline-not-array"),
    P([], [{"$match": {}, "$limit": 1}], 40323, "exactly one field", id="stage-two-fields"),
    P([], [{}], 40323, "exactly one field", id="stage-empty"),
    P([], ["$match"], 14, "", id="stage-not-object"),
    P([], [{"$foo": {}}], 40324, "Unrecognized pipeline stage name: '$foo'", id="unknown-stage"),
    P([], [{"$graphLookup": {"from": "x"}}], 115, "", id="unsupported-stage"),
    P([], [{"$facet": {"a": [{"$facet": {}}]}}], 40600, "", id="facet-in-facet"),
    P([], [{"$facet": {"a": {}}}], 40170, "", id="facet-not-array"),
    P([], [{"$limit": 0}], 15958, "the limit must be positive", id="limit-zero"),
    P([], [{"$limit": -1}], 15958, "the limit must be positive", id="limit-negative"),
    P([], [{"$limit": "1"}], 15957, "", id="limit-not-number"),
    P([], [{"$limit": 1.5}], 2, "", id="limit-fraction"),
    P([], [{"$skip": -1}], 15956, "Argument to $skip cannot be negative", id="skip-negative"),
    P([], [{"$skip": "1"}], 15972, "", id="skip-not-number"),
    P([], [{"$match": 1}], 15959, "", id="match-not-object"),
    P([], [{"$sort": {"a": 2}}], 15975, "", id="sort-bad-direction"),
    P([], [{"$sort": {}}], 15976, "", id="sort-empty"),
    P([], [{"$sort": 1}], 15973, "", id="sort-not-object"),
    P([], [{"$count": ""}], 40157, "", id="count-empty"),
    P([], [{"$count": 1}], 40156, "", id="count-not-string"),
    P([], [{"$count": "$x"}], 40158, "", id="count-dollar"),
    P([], [{"$count": "a.b"}], 40160, "", id="count-dotted"),
    P([], [{"$group": {"n": {"$sum": 1}}}], 15955, "a group specification must include an _id", id="group-no-id"),
    P([], [{"$group": 1}], 15947, "", id="group-not-object"),
    P([], [{"$group": {"_id": None, "n": {"$foo": 1}}}], 15952, "unknown group operator '$foo'", id="group-unknown-accumulator"),
    P([], [{"$group": {"_id": None, "n": 1}}], 40234, "", id="group-field-not-accumulator"),
    P([], [{"$group": {"_id": None, "n": {"$sum": 1, "$avg": 1}}}], 40238, "", id="group-two-accumulators"),
    P([], [{"$group": {"_id": None, "n": {"$sum": [1, 2]}}}], 40237, "unary", id="group-accumulator-array"),
    P([], [{"$group": {"_id": None, "a.b": {"$sum": 1}}}], 40235, "", id="group-dotted-field"),
    P([], [{"$group": {"_id": None, "n": {"$count": 1}}}], 40237, "", id="group-count-argument"),
    P([], [{"$project": {"a": {"$foo": 1}}}], 168, "Unrecognized expression '$foo'", id="unknown-expression-at-parse"),
    P([], [{"$group": {"_id": {"$bar": "$x"}}}], 168, "Unrecognized expression '$bar'", id="unknown-expression-in-group-id"),
    P([], [{"$project": {"a": {"$eq": [1]}}}], 16020, "takes exactly 2 arguments", id="expression-arity"),
    P([], [{"$project": {"a": {"$add": [1], "$sum": 2}}}], 15983, "", id="expression-two-operators"),
    P([], [{"$project": {"a": 1, "b": 0}}], 31254, "Cannot do exclusion on field b in inclusion projection", id="project-mixed-exclusion"),
    P([], [{"$project": {"a": 0, "b": 1}}], 31253, "Cannot do inclusion on field b in exclusion projection", id="project-mixed-inclusion"),
    P([], [{"$project": {"a": 0, "b": {"$add": [1]}}}], 31252, "", id="project-expression-in-exclusion"),
    P([], [{"$project": {}}], 51272, "", id="project-empty"),
    P([], [{"$project": {"a.b": 1, "a": 1}}], 31250, "Path collision at a", id="project-path-collision"),
    P([], [{"$project": {"a": 1, "a.b": 1}}], 31249, "Path collision at a.b remaining portion b", id="project-path-collision-prefix"),
    P([], [{"$project": {"a": {}}}], 51270, "", id="project-empty-subprojection"),
    P([], [{"$project": {"$a": 1}}], 16410, "", id="project-dollar-field"),
    P([], [{"$unset": []}], 31119, "", id="unset-empty"),
    P([], [{"$unset": [1]}], 31120, "", id="unset-not-strings"),
    P([], [{"$unwind": "sizes"}], 28818, "", id="unwind-no-dollar"),
    P([], [{"$unwind": {"path": 1}}], 28808, "", id="unwind-path-not-string"),
    P([], [{"$unwind": {}}], 28812, "", id="unwind-no-path"),
    P([], [{"$unwind": {"path": "$a", "bogus": 1}}], 28811, "", id="unwind-unknown-option"),
    P([], [{"$unwind": {"path": "$a", "preserveNullAndEmptyArrays": 1}}], 28809, "", id="unwind-preserve-not-bool"),
    P([], [{"$unwind": 5}], 15981, "", id="unwind-bad-spec"),
    P([], [{"$replaceRoot": {}}], 40414, "", id="replaceRoot-no-newRoot"),
    P([], [{"$replaceRoot": {"newRoot": "$a", "x": 1}}], 40415, "", id="replaceRoot-unknown-field"),
    P([], [{"$sortByCount": "tags"}], 40147, "", id="sortByCount-not-path"),
    P([], [{"$bucket": {"groupBy": "$a", "boundaries": [3, 1]}}], 40194, "", id="bucket-unsorted"),
    P([], [{"$bucket": {"groupBy": "$a", "boundaries": [1, 3], "default": 2}}], 40199, "", id="bucket-default-inside"),
    # errors raised while running
    P([{"_id": 1, "name": "x"}], [{"$replaceRoot": {"newRoot": "$nope"}}], 40228, "must evaluate to an object", id="replaceRoot-missing-docs-example"),
    P([{"_id": 1, "a": 5}], [{"$replaceWith": "$a"}], 40228, "", id="replaceWith-scalar"),
    P([{"_id": 1, "a": 5}], [{"$bucket": {"groupBy": "$a", "boundaries": [1, 3]}}], 40066, "", id="bucket-no-default"),
    P([{"_id": 1}], [{"$project": {"a": {"$add": ["x", 1]}}}], 14, "$add only supports numeric or date types, not string", id="add-string"),
    P([{"_id": 1}], [{"$set": {"a": {"$size": "$nope"}}}], 17124, "Type of argument is: missing", id="size-missing"),
]


@pytest.mark.parametrize(("docs", "pipeline", "code", "message"), ERRORS)
def test_pipeline_error(docs: list[dict[str, Any]], pipeline: Any, code: int, message: str) -> None:
    with pytest.raises(MongoError) as info:
        run(docs, pipeline)
    assert info.value.code == code, info.value.errmsg
    assert message in info.value.errmsg
    if not docs:  # parse-time errors are raised by validation alone, with no documents
        with pytest.raises(MongoError) as again:
            validate_pipeline(pipeline)
        assert again.value.code == code


EXPRESSION_ERRORS = [
    P({"$foo": 1}, 168, id="unknown-operator"),
    P({"$add": ["$d", "$d"]}, 16612, id="add-two-dates"),
    P({"$add": [[1], 1]}, 14, id="add-array"),
    P({"$subtract": ["a", 1]}, 14, id="subtract-string"),
    P({"$multiply": [2, "x"]}, 14, id="multiply-string"),
    P({"$divide": [1, 0]}, 2, id="divide-by-zero"),
    P({"$divide": ["a", 1]}, 14, id="divide-string"),
    P({"$mod": [1, 0]}, 16610, id="mod-by-zero"),
    P({"$mod": ["a", 1]}, 16611, id="mod-string"),
    P({"$abs": "x"}, 28765, id="abs-string"),
    P({"$sqrt": -1}, 28714, id="sqrt-negative"),
    P({"$size": 5}, 17124, id="size-not-array"),
    P({"$arrayElemAt": [5, 0]}, 28689, id="arrayElemAt-not-array"),
    P({"$arrayElemAt": [[1], "a"]}, 28690, id="arrayElemAt-index-not-number"),
    P({"$arrayElemAt": [[1], 1.5]}, 28691, id="arrayElemAt-index-fraction"),
    P({"$in": [1, "$nope"]}, 40081, id="in-not-array"),
    P({"$concat": ["a", 1]}, 16702, id="concat-number"),
    P({"$cond": {"if": True, "then": 1}}, 17080, id="cond-missing-else"),
    P({"$cond": {"if": True, "then": 1, "else": 2, "x": 3}}, 17083, id="cond-unknown-field"),
    P({"$cond": [True, 1]}, 16020, id="cond-array-arity"),
    P({"$eq": [1, 2, 3]}, 16020, id="eq-arity"),
    P("$$undefinedVar", 17276, id="undefined-variable"),
    P({"$switch": {"branches": [{"case": False, "then": 1}]}}, 40066, id="switch-no-match"),
    P({"$substrBytes": ["éclair", 1, 2]}, 28656, id="substrBytes-continuation"),
    P({"$substrCP": ["abc", -1, 1]}, 34454, id="substrCP-negative-start"),
    P({"$toUpper": [[1]]}, 16007, id="toUpper-array"),
    P({"$split": ["a", 1]}, 40086, id="split-separator-not-string"),
    P({"$toInt": "abc"}, 241, id="toInt-unparsable"),
    P({"$toInt": 2**40}, 241, id="toInt-overflow"),
    P({"$year": "x"}, 16006, id="year-not-date"),
    P({"$year": {"date": "$d", "timezone": "Mars/Olympus"}}, 40485, id="unknown-timezone"),
    P({"$dateToString": {"date": "$d", "format": "%Q"}}, 18536, id="dateToString-bad-specifier"),
    P({"$map": {"input": 5, "in": 1}}, 16883, id="map-not-array"),
    P({"$filter": {"input": [1]}}, 28648, id="filter-missing-cond"),
    P({"$reduce": {"input": 1, "initialValue": 0, "in": 1}}, 40080, id="reduce-not-array"),
    P({"$mergeObjects": [1]}, 40400, id="mergeObjects-not-object"),
    P({"$range": [0, 5, 0]}, 34449, id="range-zero-step"),
    P({"$slice": [[1], 0, 0]}, 28729, id="slice-non-positive-count"),
    P("$", 16872, id="bare-dollar"),
]


@pytest.mark.parametrize(("expr", "code"), EXPRESSION_ERRORS)
def test_expression_error(expr: Any, code: int) -> None:
    with pytest.raises(MongoError) as info:
        evaluate(expr, {"d": D(2020, 1, 1)}, now=NOW)
    assert info.value.code == code, info.value.errmsg


def test_validate_pipeline_accepts_valid() -> None:
    assert validate_pipeline([{"$match": {"a": 1}}, {"$group": {"_id": "$a", "n": {"$sum": 1}}}, {"$sort": {"n": -1}}]) is None


def test_error_code_name_for_unknown_expression() -> None:
    with pytest.raises(MongoError) as info:
        validate_pipeline([{"$project": {"a": {"$nope": 1}}}])
    assert info.value.code_name == "InvalidPipelineOperator"
    assert re.search(r"Unrecognized expression '\$nope'$", info.value.errmsg)


# ---------------------------------------------------------------------------
# Bounded work: mongod's numeric rules and its limits on what an expression or a stage may build.

_MB8 = "x" * (8 * 1024 * 1024)  # one 8 MiB string, shared by every document that holds it


def _doubled(seed: str, times: int) -> dict[str, Any]:
    """`seed` doubled `times` times by a $reduce: a long string built by expressions."""
    return {"$reduce": {"input": {"$range": [0, times]}, "initialValue": seed,
                        "in": {"$concat": ["$$value", "$$value"]}}}


def _error(expr: Any, doc: dict[str, Any] | None = None) -> MongoError:
    with pytest.raises(MongoError) as info:
        evaluate(expr, doc or {}, now=NOW)
    return info.value


@pytest.mark.parametrize(("expr", "expected"), [
    P({"$pow": [3, 2**31 - 1]}, float("inf"), id="pow-overflows-to-double"),
    P({"$pow": [-3, 2**31 - 1]}, float("-inf"), id="pow-negative-odd-overflow"),
    P({"$pow": [2, 62]}, Int64(2**62), id="pow-fits-long"),
    P({"$pow": [2, 63]}, 9.223372036854776e18, id="pow-past-long-is-double"),
    P({"$pow": [-2, 63]}, Int64(-(2**63)), id="pow-long-min"),
    P({"$pow": [2, 30]}, 2**30, id="pow-int"),
    P({"$pow": [2, 31]}, Int64(2**31), id="pow-int-grows-to-long"),
    P({"$pow": [Int64(2), 3]}, Int64(8), id="pow-long-stays-long"),
    P({"$pow": [-1, 2**31 - 1]}, -1, id="pow-minus-one"),
    P({"$pow": [10.0, 400]}, float("inf"), id="pow-double-overflow"),
    P({"$pow": [Dec("3"), 2**31 - 1]}, Dec("Infinity"), id="pow-decimal-overflow"),
    P({"$multiply": [2**62, 4]}, 1.8446744073709552e19, id="multiply-overflow-to-double"),
    P({"$multiply": [Int64(2)] * 70}, 2.0**70, id="multiply-many-longs"),
    P({"$multiply": [2**31, 2]}, Int64(2**32), id="multiply-long"),
    P({"$exp": 1000}, float("inf"), id="exp-overflow"),
])
def test_arithmetic_never_builds_a_big_integer(expr: Any, expected: Any) -> None:
    started = time.monotonic()
    assert same(evaluate(expr, {}, now=NOW), expected)
    assert time.monotonic() - started < 0.5


def test_abs_of_the_smallest_long() -> None:
    assert _error({"$abs": Int64(-(2**63))}).code == 28680


@pytest.mark.parametrize("end", [2**31 - 1, 12_000_000])
def test_a_range_over_mongods_memory_limit_is_refused_before_it_is_built(end: int) -> None:
    started = time.monotonic()
    err = _error({"$range": [0, end]})
    assert err.code == 146
    assert "$range would use too much memory" in err.errmsg and "Memory limit: 104857600 bytes" in err.errmsg
    assert time.monotonic() - started < 0.1


def test_a_range_under_the_limit_is_built() -> None:
    assert evaluate({"$size": {"$range": [0, 1_000_000]}}, {}, now=NOW) == 1_000_000
    assert evaluate({"$range": [10, 0, -3]}, {}, now=NOW) == [10, 7, 4, 1]


def test_strings_stop_at_16_mib() -> None:
    assert _error(_doubled("x", 30)).code == 16493
    assert _error({"$concat": ["$s", "$s"]}, {"s": _MB8}).code == 16493
    assert evaluate({"$strLenBytes": {"$concat": ["$s", "y"]}}, {"s": _MB8}, now=NOW) == len(_MB8) + 1


def test_array_builders_stop_at_100_mib() -> None:
    many = [0] * 3_500_000
    assert _error({"$concatArrays": ["$a", "$a"]}, {"a": many}).code == 146
    collecting = {"$reduce": {"input": {"$range": [0, 100]}, "initialValue": [],
                              "in": {"$concatArrays": ["$$value", ["$s"]]}}}
    err = _error(collecting, {"s": _MB8})  # (13 references to 8 MiB: the accumulator's 100 MiB)
    assert err.code == 146 and err.errmsg.startswith("$reduce used too much memory")
    assert _error({"$map": {"input": {"$range": [0, 100]}, "in": "$s"}}, {"s": _MB8}).code == 146
    assert _error({"$split": ["$s", ","]}, {"s": "," * 7_000_000}).code == 146
    assert evaluate({"$size": {"$split": ["$s", ","]}}, {"s": "a," * 100_000}, now=NOW) == 100_001


def test_a_reduce_cannot_nest_past_200_levels() -> None:
    err = _error({"$reduce": {"input": {"$range": [0, 1000]}, "initialValue": {}, "in": {"a": "$$value"}}})
    assert err.code == 15


def test_a_long_evaluation_stops_at_its_interrupt_check() -> None:
    from oplog.expr_eval import INTERRUPT_CHECK

    calls = []

    def check() -> None:
        calls.append(1)
        if len(calls) > 3:
            raise MongoError(50, "operation exceeded time limit")

    token = INTERRUPT_CHECK.set(check)
    try:
        assert _error({"$map": {"input": {"$range": [0, 100_000]}, "in": "$$this"}}).code == 50
    finally:
        INTERRUPT_CHECK.reset(token)


def test_field_paths_of_more_than_200_parts_are_refused() -> None:
    long_path = ".".join(["a"] * 201)
    for pipeline in ([{"$project": {"x": "$" + long_path}}], [{"$project": {long_path: 1}}],
                     [{"$set": {long_path: 1}}], [{"$sort": {long_path: 1}}]):
        with pytest.raises(MongoError) as info:
            validate_pipeline(pipeline)
        assert info.value.code == 15 and "FieldPath is too long" in info.value.errmsg
    validate_pipeline([{"$project": {"x": "$" + ".".join(["a"] * 200)}}])
    with pytest.raises(MongoError) as huge:
        validate_pipeline([{"$set": {".".join(["a"] * 100_000): 1}}])
    assert huge.value.code == 15


def _run(docs: list[dict[str, Any]], pipeline: list[Any], **kwargs: Any) -> list[dict[str, Any]]:
    return run_pipeline(docs, pipeline, now=NOW, **kwargs)


def test_push_and_add_to_set_stop_at_100_mib() -> None:
    docs = [{"_id": i, "s": _MB8} for i in range(13)]
    with pytest.raises(MongoError) as push:
        _run(docs, [{"$group": {"_id": None, "all": {"$push": "$s"}}}])
    assert push.value.code == 146 and push.value.errmsg.startswith("$push used too much memory")
    distinct = {"$concat": ["$s", {"$toString": "$_id"}]}
    with pytest.raises(MongoError) as add:
        _run(docs, [{"$group": {"_id": None, "all": {"$addToSet": distinct}}}])
    assert add.value.code == 146 and add.value.errmsg.startswith("$addToSet used too much memory")
    assert len(_run(docs[:12], [{"$group": {"_id": None, "all": {"$push": "$s"}}}])[0]["all"]) == 12


def test_group_past_100_mib_without_disk_use() -> None:
    docs = [{"_id": i, "s": _MB8} for i in range(13)]
    pipeline = [{"$group": {"_id": "$_id", "all": {"$push": "$s"}}}]
    with pytest.raises(MongoError) as info:
        _run(docs, pipeline, allow_disk_use=False)
    assert info.value.code == 292
    assert len(_run(docs, pipeline)) == 13  # (allowDiskUse, mongod's default, lets the groups grow)


def test_facet_and_lookup_stop_at_100_mib() -> None:
    docs = [{"_id": i, "s": _MB8} for i in range(13)]
    with pytest.raises(MongoError) as facet:
        _run(docs, [{"$facet": {"all": [{"$project": {"s": 1}}]}}])
    assert facet.value.code == 4031700
    with pytest.raises(MongoError) as lookup:
        _run([{"_id": 1}], [{"$lookup": {"from": "big", "pipeline": [], "as": "joined"}}],
             collections=lambda name: docs)
    assert lookup.value.code == 4568


def test_a_result_over_16_mib_is_refused_without_encoding_it() -> None:
    from oplog.doc_limits import MAX_INTERNAL_BSON_SIZE

    docs = [{"_id": 1, "s": _MB8}]
    wide = {f"f{i}": "$s" for i in range(1000)}  # 8 GB of BSON, were it encoded
    started = time.monotonic()
    with pytest.raises(MongoError) as info:
        _run(docs, [{"$project": wide}], output_limit=MAX_INTERNAL_BSON_SIZE)
    assert info.value.code == 10334 and "is invalid. Size must be between 0 and 16793600" in info.value.errmsg
    assert time.monotonic() - started < 1.0
    assert _run(docs, [{"$project": {"a": "$s"}}], output_limit=MAX_INTERNAL_BSON_SIZE)[0]["a"] == _MB8
