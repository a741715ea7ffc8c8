"""Random BSON values and command documents: the command grammar of the wire fuzzer.

Every function takes the run's seeded `random.Random`, so a seed names one exact
sequence of messages. The values lean on the edges handlers get wrong: wrong
types, NaN and infinities, int64 extremes, empty and huge strings, deep nesting,
dotted and `$`-prefixed field names, unknown operators.
"""

from __future__ import annotations

import datetime
import random
from collections.abc import Callable
from typing import Any

from bson import SON, Code, Decimal128, Int64, MaxKey, MinKey, ObjectId, Regex, Timestamp
from bson.binary import Binary

FIELD_NAMES = (
    "filter", "sort", "projection", "limit", "skip", "batchSize", "documents", "updates", "deletes", "q", "u",
    "upsert", "multi", "pipeline", "cursor", "key", "query", "new", "remove", "fields", "indexes", "index",
    "name", "cursors", "collection", "maxTimeMS", "writeConcern", "readConcern", "lsid", "txnNumber",
    "$readPreference", "ordered", "nameOnly", "comment", "to", "dropTarget", "members", "version", "_id",
    "settings", "term", "candidateIndex", "configVersion", "optimes", "force", "secondaryCatchUpPeriodSecs",
    "awaitData", "tailable", "singleBatch", "hint", "collation", "let", "arrayFilters", "allowDiskUse",
    "explain", "ids", "capped", "size", "max", "autocommit", "startTransaction", "topologyVersion",
    "maxAwaitTimeMS", "helloOk", "client", "internalClient", "wait", "dryRun", "lastCommittedOp", "$db",
    "$replData", "$clusterTime", "featureCompatibilityVersion", "getParameter", "apiVersion", "a", "a.b", "$x",
    "", "x" * 300, "_id.x", "a.$", "a.0", "a..b",
)
QUERY_OPS = ("$eq", "$ne", "$gt", "$gte", "$lt", "$lte", "$in", "$nin", "$exists", "$type", "$regex",
             "$options", "$size", "$all", "$elemMatch", "$not", "$mod", "$where", "$expr", "$text", "$near",
             "$bitsAllSet", "$comment", "$jsonSchema", "$bogus")
LOGICAL_OPS = ("$and", "$or", "$nor")
UPDATE_OPS = ("$set", "$unset", "$inc", "$mul", "$min", "$max", "$rename", "$push", "$addToSet", "$pull",
              "$pullAll", "$pop", "$currentDate", "$setOnInsert", "$bit", "$each", "$position", "$slice",
              "$sort", "$bogus")
STAGES = ("$match", "$group", "$sort", "$project", "$limit", "$skip", "$unwind", "$count", "$lookup", "$out",
          "$merge", "$collStats", "$indexStats", "$addFields", "$set", "$unset", "$replaceRoot", "$facet",
          "$sample", "$changeStream", "$currentOp", "$listSessions", "$bogus")
DB_NAMES = ("test", "admin", "local", "config", "fuzz", "", "a.b", "$x", "x" * 200, "a b", "\x00", "test\u00e9")
COLLECTION_NAMES = ("c", "fuzz", "oplog.rs", "system.users", "system.replset", "", "$cmd", "a$b", "x" * 300,
                    "c.d", ".", "\u00e9t\u00e9", "system.views")
PATHS = ("a", "b", "_id", "a.b", "a.0", "a.$", "a.$[]", "a.$[x]", "$a", "", "a..b", ".a", "a.", "x" * 200,
         "a.b.c.d.e", "\u00e9")


def scalar(rng: random.Random) -> Any:
    """One BSON value of a random type, biased toward edge cases."""
    return rng.choice(_SCALARS)(rng)


_SCALARS: tuple[Callable[[random.Random], Any], ...] = (
    lambda r: r.randint(-5, 5),
    lambda r: r.choice((0, 1, -1, 2**31 - 1, -(2**31), 2**31, 101, 16 * 1024 * 1024)),
    lambda r: Int64(r.choice((0, 1, -1, 2**63 - 1, -(2**63), 2**40))),
    lambda r: r.choice((0.0, -0.0, 1.5, float("nan"), float("inf"), float("-inf"), 1e308, 5e-324)),
    lambda r: r.choice((True, False, None)),
    lambda r: r.choice(("", "a", "x" * r.randint(0, 2000), "$a", "a.b", "\u00e9\u4e2d", "\x00a", "1")),
    lambda r: ObjectId(r.randbytes(12)),
    lambda r: datetime.datetime(r.choice((1, 1970, 2262, 9999)), 1, 1, tzinfo=datetime.UTC),
    lambda r: Timestamp(r.choice((0, 1, 2**32 - 1)), r.choice((0, 1, 2**32 - 1))),
    lambda r: Binary(r.randbytes(r.randint(0, 20)), r.choice((0, 3, 4, 5, 128))),
    lambda r: Regex(r.choice(("a", ".*", "(", "[", "\\", "a{99999999}")), r.choice(("", "i", "imsx", "zz"))),
    lambda r: Code(r.choice(("return 1", "", "while(1){}"))),
    lambda r: r.choice((MinKey(), MaxKey())),
    lambda r: Decimal128(r.choice(("0", "-0", "NaN", "Infinity", "1E+6144", "1.5"))),
    lambda r: [],
    lambda r: {},
)


def value(rng: random.Random, depth: int = 0) -> Any:
    """A scalar, or (less often, and less with depth) an array or a sub-document."""
    roll = rng.random()
    if depth < 4 and roll < 0.12:
        return [value(rng, depth + 1) for _ in range(rng.randint(0, 4))]
    if depth < 4 and roll < 0.24:
        return {rng.choice(PATHS): value(rng, depth + 1) for _ in range(rng.randint(0, 3))}
    return scalar(rng)


def nested(depth: int, leaf: Any = 1, key: str = "a") -> Any:
    doc = leaf
    for _ in range(depth):
        doc = {key: doc}
    return doc


def query(rng: random.Random, depth: int = 0) -> dict[str, Any]:
    """A find filter: field conditions, operators with wrong operands, logical nesting."""
    out: dict[str, Any] = {}
    for _ in range(rng.randint(0, 3)):
        roll = rng.random()
        if roll < 0.15 and depth < 3:
            out[rng.choice(LOGICAL_OPS)] = rng.choice(
                ([query(rng, depth + 1) for _ in range(rng.randint(0, 3))], value(rng), []))
        elif roll < 0.6:
            op = rng.choice(QUERY_OPS)
            operand = _query_operand(rng, op, depth)
            out[rng.choice(PATHS)] = {op: operand} if rng.random() < 0.9 else {op: operand, "$x": 1}
        elif roll < 0.65:
            out[rng.choice(("$where", "$expr", "$text", "$comment", "$bogus"))] = value(rng)
        else:
            out[rng.choice(PATHS)] = value(rng)
    return out


def _query_operand(rng: random.Random, op: str, depth: int) -> Any:
    if op in ("$in", "$nin", "$all") and rng.random() < 0.7:
        return [value(rng) for _ in range(rng.randint(0, 4))]
    if op == "$mod" and rng.random() < 0.7:
        return rng.choice(([0, 0], [1], [1, 2, 3], [Int64(-(2**63)), -1], [float("nan"), 1], []))
    if op in ("$elemMatch", "$not") and depth < 3 and rng.random() < 0.6:
        return query(rng, depth + 1)
    if op == "$size" and rng.random() < 0.5:
        return rng.choice((-1, 1.5, 2**40, "a"))
    if op == "$type" and rng.random() < 0.5:
        return rng.choice((0, 100, "bogus", "number", [2, "string"], -1))
    return value(rng)


def update(rng: random.Random) -> Any:
    """An update: operator document, replacement, pipeline, or garbage."""
    roll = rng.random()
    if roll < 0.6:
        return {rng.choice(UPDATE_OPS): {rng.choice(PATHS): value(rng) for _ in range(rng.randint(0, 3))}
                for _ in range(rng.randint(0, 3))}
    if roll < 0.8:
        return {rng.choice(PATHS): value(rng) for _ in range(rng.randint(0, 3))}
    if roll < 0.9:
        return pipeline(rng)
    return value(rng)


def pipeline(rng: random.Random) -> list[Any]:
    return [{rng.choice(STAGES): value(rng) if rng.random() < 0.5 else query(rng)}
            for _ in range(rng.randint(0, 4))]


def document(rng: random.Random) -> dict[str, Any]:
    """A document to insert: ordinary, with odd `_id`s, `$`/dotted keys, or deeply nested."""
    roll = rng.random()
    if roll < 0.05:
        return {"_id": value(rng), "deep": nested(rng.choice((50, 99, 100, 101, 200)))}
    doc: dict[str, Any] = {}
    if rng.random() < 0.7:
        doc["_id"] = value(rng)
    for _ in range(rng.randint(0, 4)):
        doc[rng.choice(PATHS)] = value(rng)
    return doc


def field_value(rng: random.Random, name: str) -> Any:
    """A plausible value for a known field name half of the time, any value otherwise."""
    if rng.random() < 0.5:
        return value(rng)
    match name:
        case "filter" | "query" | "q":
            return query(rng)
        case "update" | "u":
            return update(rng)
        case "pipeline":
            return pipeline(rng)
        case "documents":
            return [document(rng) for _ in range(rng.randint(0, 5))]
        case "updates":
            return [{"q": query(rng), "u": update(rng), **({"upsert": True} if rng.random() < 0.3 else {}),
                     **({"multi": True} if rng.random() < 0.3 else {})} for _ in range(rng.randint(0, 3))]
        case "deletes":
            return [{"q": query(rng), "limit": rng.choice((0, 1, 2, -1, "x"))} for _ in range(rng.randint(0, 3))]
        case "indexes":
            return [{"key": {rng.choice(PATHS): rng.choice((1, -1, "text", "2d", "hashed", 0, "x"))},
                     "name": rng.choice(("i", "", "_id_", "x" * 200)),
                     **({"unique": True} if rng.random() < 0.3 else {})} for _ in range(rng.randint(0, 3))]
        case "sort" | "projection" | "key" | "hint":
            return {rng.choice(PATHS): rng.choice((1, -1, 0, True, "text", {"$meta": "textScore"}, {}))
                    for _ in range(rng.randint(0, 3))}
        case "writeConcern":
            return {"w": rng.choice((0, 1, 2, 50, "majority", "bogus", -1)),
                    "wtimeout": rng.choice((0, 1, 100, -1)), "j": rng.choice((True, False, 1))}
        case "$readPreference":
            return {"mode": rng.choice(("primary", "secondary", "nearest", "bogus", 5))}
        case "lsid":
            return {"id": Binary(rng.randbytes(16), 4)}
        case "cursor":
            return {"batchSize": rng.choice((0, 1, -1, 2**31 - 1, "x"))}
        case _:
            return value(rng)


# Commands that legitimately wait as long as their arguments say (a step-down waits up to
# secondaryCatchUpPeriodSecs for a secondary to catch up, then keeps the member out of elections for
# stepDownSecs): their numbers are kept small so that a wait is not mistaken for a hang and the member
# is primary again soon; every other argument stays random.
_BOUNDED_WAITS = {"replSetStepDown": ("replSetStepDown", "secondaryCatchUpPeriodSecs"),
                  "replSetFreeze": ("replSetFreeze",)}
_SMALL_NUMBERS = (0, 1, -1, 0.5, 2, "x", None, True, {}, [])
RARE = frozenset(_BOUNDED_WAITS)


def command_body(rng: random.Random, names: list[str]) -> dict[str, Any]:
    """One command document: a registered (or unknown) name, random fields, usually a `$db`."""
    name = rng.choice(names) if rng.random() < 0.95 else rng.choice(("bogus", "", "$cmd", "HELLO", "x" * 200))
    if name in RARE and rng.random() < 0.8:
        name = rng.choice(names)
    body: dict[str, Any] = SON()
    body[name] = rng.choice((1, rng.choice(COLLECTION_NAMES), value(rng), Int64(rng.getrandbits(63))))
    for _ in range(rng.randint(0, 6)):
        field = rng.choice(FIELD_NAMES)
        body[field] = field_value(rng, field)
    for field in _BOUNDED_WAITS.get(name, ()):
        body[field] = rng.choice(_SMALL_NUMBERS)
    if name in _BOUNDED_WAITS and "secondaryCatchUpPeriodSecs" not in body:
        body["secondaryCatchUpPeriodSecs"] = rng.choice((0, 1))
    if rng.random() < 0.93:
        body["$db"] = rng.choice(DB_NAMES) if rng.random() < 0.9 else value(rng)
    return body
