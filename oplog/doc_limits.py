"""The size, depth and memory limits a document or a computed value is held to, as mongod holds them.

Theory of operation
-------------------
Values computed by expressions and pipelines may share objects: ``{a: "$big", b: "$big"}``
references one array twice, and a `$map` over a long range can put the same string in every
element. Python holds such a value in little memory, but its BSON form repeats every shared part,
so encoding it to learn its size could build gigabytes. `measure` walks a value instead, measuring
an object met twice once, and stops as soon as a part of it is over the size asked about or holds
fields deeper than the depth asked about (it never recurses past that depth): checking a document
costs at most the work of the limit and of the objects Python really holds, never the size of the
BSON the value would make.

Two measures:

* **BSON size** (`bson_size`, `check_document`): exact for the types documents hold, to check
  the 16 MiB document limit (`BSONObjMaxUserSize`) and, for a command's results, the 16 MiB +
  16 KiB internal limit (`BSONObjMaxInternalSize`).
* **Memory** (`memory_size`): mongod's ``Value::getApproximateSize``-like estimate (16 bytes per
  value plus its payload), for the 100 MiB limits of builders and accumulators: ``$range``
  (``internalQueryMaxRangeBytes``), ``$push`` / ``$addToSet`` (``internalQueryMaxPushBytes`` /
  ``internalQueryMaxAddToSetBytes``), ``$map`` / ``$reduce``
  (``internalQueryMaxMapReduceExpressionBytes``), ``$group``
  (``internalDocumentSourceGroupMaxMemoryBytes``).

Nesting is counted as mongod's storage validation counts it: a top-level field is at level 1, and
a stored document may hold fields down to level 180 (``BSONDepth::getMaxDepthForUserStorage``:
the 200-level limit less room for the system's own). Field paths may have at most 200 parts
(``BSONDepth::getMaxAllowableDepth``, "FieldPath is too long").

Pure: no I/O, no clock.
"""

from __future__ import annotations

__layer__ = "core"  # pure: no I/O, clock or randomness (tests/unit/test_layering.py)

import datetime
import sys
from collections.abc import Mapping
from typing import Any, NamedTuple

import bson
from bson.decimal128 import Decimal128
from bson.int64 import Int64
from bson.objectid import ObjectId
from bson.raw_bson import RawBSONDocument
from bson.timestamp import Timestamp

from base.errors import MongoError

__all__ = [
    "C_STEP",
    "MAX_DEPTH",
    "MAX_INTERNAL_BSON_SIZE",
    "MAX_STORED_DEPTH",
    "MAX_USER_BSON_SIZE",
    "MEMORY_LIMIT",
    "VALUE_SIZE",
    "GrowingValue",
    "Measure",
    "bson_size",
    "check_document",
    "check_field_path_length",
    "check_string_size",
    "exceeded_memory",
    "measure",
    "memory_size",
    "nesting_error",
]

MAX_USER_BSON_SIZE = 16 * 1024 * 1024  # BSONObjMaxUserSize
MAX_INTERNAL_BSON_SIZE = MAX_USER_BSON_SIZE + 16 * 1024  # BSONObjMaxInternalSize
MAX_DEPTH = 200  # BSONDepth::kDefaultMaxAllowableDepth: field path parts, nesting of any BSON
MAX_STORED_DEPTH = 180  # BSONDepth::getMaxDepthForUserStorage()
MEMORY_LIMIT = 100 * 1024 * 1024  # mongod's default for every per-operator memory knob named above
VALUE_SIZE = 16  # sizeof(mongo::Value): what one value costs before its payload
# A string value holds less than 16 MiB with its NUL and RCString header (mongod's RCString::create).
_STRING_OVERHEAD = 16 + 1
# Elements one C-level step (a list extend, a split) handles at most: a few milliseconds, so a thread
# building a large value gives the interpreter back to the event loop between steps.
C_STEP = 65_536

CODE_OVERFLOW = 15
CODE_EXCEEDED_MEMORY_LIMIT = 146
CODE_BSON_OBJECT_TOO_LARGE = 10334

_INT32_MIN, _INT32_MAX = -(2**31), 2**31 - 1
_FIXED_SIZES: dict[type, int] = {
    float: 8, bool: 1, type(None): 0, Int64: 8, datetime.datetime: 8, ObjectId: 12, Decimal128: 16,
    Timestamp: 8,
}


class Measure(NamedTuple):
    """What `measure` found: the size (over the limit once it stopped early) and the deepest level
    of a field (or array element) it reached; `stopped`: it stopped at a limit."""

    size: int
    depth: int
    stopped: bool


def exceeded_memory(what: str, used: int | None = None, limit: int = MEMORY_LIMIT) -> MongoError:
    """ExceededMemoryLimit (146), worded as mongod words it for ``$range`` and the accumulators."""
    needed = "" if used is None else f" ({used} bytes)"
    verb = "used" if used is None else "would use"
    return MongoError(CODE_EXCEEDED_MEMORY_LIMIT, f"{what} {verb} too much memory{needed} and cannot spill to "
                                                  f"disk. Memory limit: {limit} bytes")


def check_string_size(nbytes: int) -> None:
    """A string of `nbytes` UTF-8 bytes that mongod could not hold in a value (16493)."""
    if nbytes + _STRING_OVERHEAD >= MAX_USER_BSON_SIZE:
        raise MongoError(16493, f"Tried to create string longer than {MAX_USER_BSON_SIZE // 1024 // 1024}MB")


class GrowingValue:
    """The memory of the successive values of one accumulator (a `$reduce`'s ``$$value``), checked
    against `limit` as each comes: ExceededMemoryLimit (146) for `what` past it. A list that starts
    with the previous list's very elements (``$concatArrays: ["$$value", [...]]``, the usual way to
    collect) costs only its new elements to measure, so collecting n elements costs O(n), not O(n²)."""

    def __init__(self, what: str, limit: int = MEMORY_LIMIT) -> None:
        self.what, self.limit = what, limit
        self._previous: list[Any] | None = None  # (held, so the identity of its elements stays valid)
        self._payload = 0  # what the previous list's elements take
        self._depth = 0

    def check(self, value: Any) -> None:
        previous, self._previous = self._previous, None
        if not isinstance(value, (dict, list)):
            return  # (a string is held to 16 MiB where it is built)
        # (Equality of the prefix, at C speed: identical elements compare equal at once; elements equal
        # but not identical, such as 1 and 1.0, differ in size by a few bytes at most.)
        if isinstance(value, list) and previous is not None and len(value) >= len(previous) \
                and value[:len(previous)] == previous:
            added = value[len(previous):]
            found = measure(added, limit=self.limit, memory=True)
            payload, depth = self._payload + found.size - VALUE_SIZE * (len(added) + 1), max(self._depth, found.depth)
        else:
            found = measure(value, limit=self.limit, memory=True)
            payload, depth = found.size - VALUE_SIZE * (len(value) + 1), found.depth
        if depth > MAX_DEPTH:
            raise nesting_error()
        if VALUE_SIZE * (len(value) + 1) + payload >= self.limit:
            raise exceeded_memory(self.what, limit=self.limit)
        if isinstance(value, list):
            self._previous, self._payload, self._depth = value, payload, depth


def nesting_error(max_depth: int = MAX_DEPTH) -> MongoError:
    """What mongod answers for a value it cannot turn into BSON: more than 200 levels of nesting."""
    return MongoError(CODE_OVERFLOW, "cannot convert document to BSON because it exceeds the limit of "
                                     f"{max_depth} levels of nesting")


def check_field_path_length(parts: int, code: int = CODE_OVERFLOW, limit: int = MAX_DEPTH) -> None:
    """A field path of more than `limit` parts (200: mongod's FieldPath; its match parser allows 180
    and answers 5729100): "FieldPath is too long"."""
    if parts > limit:
        raise MongoError(code, "FieldPath is too long")


def _text_size(text: str) -> int:
    return len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))


def _index_keys_size(n: int) -> int:
    """The bytes the keys "0", "1", ... "n-1" of an array's n elements take (each with its NUL)."""
    total, digits, low = n, 1, 0
    while low < n:
        high = min(n, 10 ** digits)
        total += (high - low) * digits
        low, digits = high, digits + 1
    return total


def _other_size(value: Any) -> int:
    """The BSON payload size of a value of a rarer type (not a document or an array)."""
    if isinstance(value, bytes):
        return 4 + 1 + len(value) + (4 if getattr(value, "subtype", 0) == 2 else 0)
    if isinstance(value, str) and type(value) is not str and not hasattr(value, "scope"):
        return 4 + _text_size(value) + 1  # (a Code without scope is a string)
    try:
        return len(bson.encode({"": value})) - 7
    except Exception:  # a value bson cannot encode is refused where it is stored, not here
        return VALUE_SIZE


def _is_container(value: Any) -> bool:
    return isinstance(value, (Mapping, list, tuple)) and not isinstance(value, RawBSONDocument)


class _Stop(Exception):
    """Measuring stopped: a size over the limit, or a field deeper than allowed."""

    def __init__(self, size: int, depth: int) -> None:
        super().__init__()
        self.size, self.depth = size, depth


class _Walk:
    """One `measure`: its limits, and the containers measured so far (by identity). Two Python frames
    per level of nesting (`container` and `document` / `array`), and none past `max_depth`."""

    __slots__ = ("known", "limit", "max_depth", "memory")

    def __init__(self, limit: int, max_depth: int, memory: bool) -> None:
        self.limit, self.max_depth, self.memory = limit, max_depth, memory
        self.known: dict[int, tuple[int, int]] = {}

    def container(self, value: Any, level: int) -> tuple[int, int]:
        """(size, levels of fields) of a document or array whose fields are at `level`."""
        found = self.known.get(id(value))
        if found is not None:
            return found
        if level > self.max_depth and len(value):
            raise _Stop(0, level)
        kind = type(value)
        is_doc = kind is dict or (kind is not list and isinstance(value, Mapping))
        result = self.document(value, level) if is_doc else self.array(value, level)
        self.known[id(value)] = result
        return result

    def document(self, doc: Mapping[str, Any], level: int) -> tuple[int, int]:
        header = VALUE_SIZE if self.memory else 2
        size = VALUE_SIZE if self.memory else 5
        below = 1 if doc else 0
        for key, child in doc.items():
            size += header + (len(key) if key.isascii() else _text_size(key))
            kind = type(child)
            if kind is str:
                size += 5 + (len(child) if child.isascii() else _text_size(child))
            elif kind is int:
                size += 4 if _INT32_MIN <= child <= _INT32_MAX else 8
            elif kind in _FIXED_SIZES:
                size += _FIXED_SIZES[kind]
            elif kind is dict or kind is list or _is_container(child):
                child_size, child_below = self.container(child, level + 1)
                size += child_size
                below = max(below, child_below + 1)
                if size > self.limit:
                    raise _Stop(size, level + below - 1)
            else:
                size += len(child.raw) if isinstance(child, RawBSONDocument) else _other_size(child)
        return size, below

    def array(self, items: Any, level: int) -> tuple[int, int]:
        n = len(items)
        size = VALUE_SIZE * (n + 1) if self.memory else 5 + n + _index_keys_size(n)
        if not n:
            return size, 0
        flat = _flat_size(items) if n > _FLAT_FROM else None
        if flat is not None:
            return size + flat, 1
        below = 1
        for child in items:
            kind = type(child)
            if kind is str:
                size += 5 + (len(child) if child.isascii() else _text_size(child))
            elif kind is int:
                size += 4 if _INT32_MIN <= child <= _INT32_MAX else 8
            elif kind in _FIXED_SIZES:
                size += _FIXED_SIZES[kind]
            elif kind is dict or kind is list or _is_container(child):
                child_size, child_below = self.container(child, level + 1)
                size += child_size
                below = max(below, child_below + 1)
                if size > self.limit:
                    raise _Stop(size, level + below - 1)
            else:
                size += len(child.raw) if isinstance(child, RawBSONDocument) else _other_size(child)
        return size, below


_FLAT_FROM = 32  # arrays longer than this are first tried as arrays of one scalar type


def _flat_size(items: Any) -> int | None:
    """The payload of an array of one scalar type, counted at C speed (None: another kind of array)."""
    kinds = set(map(type, items))
    if len(kinds) != 1:
        return None
    kind = kinds.pop()
    n = len(items)
    if kind is int:
        return 4 * n if _INT32_MIN <= min(items) and max(items) <= _INT32_MAX else None
    if kind is str:
        if all(map(str.isascii, items)):
            return 5 * n + sum(map(len, items))
        return 5 * n + sum(_text_size(text) for text in items)
    fixed = _FIXED_SIZES.get(kind)
    return None if fixed is None else fixed * n


def measure(value: Any, *, limit: int = sys.maxsize, max_depth: int = MAX_DEPTH,
            memory: bool = False) -> Measure:
    """The BSON size of `value` as a document (`memory`: mongod's memory estimate instead), and how
    many levels of fields it holds. Stops once a part of it is over `limit` bytes or holds a field
    deeper than `max_depth` (`stopped`; then `size` or `depth` is over its limit). An object met
    twice is measured once."""
    walk = _Walk(limit, max_depth, memory)
    try:
        if isinstance(value, RawBSONDocument):
            size, depth = len(value.raw), 1
        elif _is_container(value):
            size, depth = walk.container(value, 1)
        else:
            size, depth = walk.document({"": value}, 0)
            size -= VALUE_SIZE if memory else 7  # the value alone (with its own Value, in memory)
            depth -= 1
    except _Stop as stop:
        return Measure(stop.size, stop.depth, True)
    return Measure(size, depth, size > limit or depth > max_depth)


def bson_size(doc: Any, limit: int = sys.maxsize) -> int:
    """The BSON size of `doc`; once over `limit`, some size over `limit`."""
    return measure(doc, limit=limit).size


def memory_size(value: Any, limit: int = sys.maxsize) -> int:
    """mongod's approximate memory for `value`; once over `limit`, some size over `limit`."""
    kind = type(value)
    if kind is str:
        return VALUE_SIZE + 5 + (len(value) if value.isascii() else _text_size(value))
    if kind is int or kind in _FIXED_SIZES:
        return VALUE_SIZE + 8
    return measure(value, limit=limit, memory=True).size


def check_document(doc: Any, *, limit: int, too_large: MongoError | None = None,
                   max_depth: int = MAX_DEPTH, too_deep: MongoError | None = None) -> int:
    """Raises `too_large` (default: mongod's 10334 for a document it cannot build) when `doc` is over
    `limit` bytes of BSON, and `too_deep` (default: 15 Overflow) when it holds a field deeper than
    `max_depth`; returns its size otherwise."""
    found = measure(doc, limit=limit, max_depth=max_depth)
    if found.depth > max_depth:
        raise too_deep or nesting_error(max_depth)
    if found.size > limit:
        if too_large is not None:
            raise too_large
        raise MongoError(CODE_BSON_OBJECT_TOO_LARGE,
                         f"BSONObj size: {found.size} (0x{found.size:X}) is invalid. Size must be between 0 "
                         f"and {MAX_INTERNAL_BSON_SIZE}(16MB){_first_element(doc)}")
    return found.size


def _first_element(doc: Any) -> str:
    """mongod's " First element: name: value" of an error about a document, for a small value only
    (a value of the document is not worth printing in full, nor safe to: it may be shared many times)."""
    first = next(iter(doc.items()), None) if isinstance(doc, Mapping) else None
    if first is None or _is_container(first[1]) or (isinstance(first[1], (str, bytes)) and len(first[1]) > 64):
        return ""
    return f" First element: {first[0]}: {first[1]!r}"
