"""MongoDB query semantics: filters, sort and find projections, as a pure module.

Theory of operation
-------------------
A filter is *compiled once* into a tree of small closures (`compile_filter`);
all validation (unknown operators, malformed arguments, bad regex options) happens
then, so a `Matcher` can be run over many documents cheaply.

Compilation has two layers, mirroring the MongoDB server's matcher:

* An operator document such as ``{$gt: 1, $ne: 5}`` is parsed into a tiny
  intermediate form (`_IR`): *single-value predicates* (``x -> bool`` on one BSON
  value, which may be the `MISSING` sentinel), negations and conjunctions.
* That form is then bound either to a **path** (a `_leaf` closure walks the document
  along the dotted path and asks "does any reachable value satisfy the predicate?")
  or, inside a value-form ``$elemMatch``, to a **single element** (no traversal).

Path traversal (`_iter_doc`) follows the server's element iterator: embedded
documents are entered, arrays met *before* the end of the path are traversed
element by element (documents inside are searched for the rest of the path; a
numeric component also selects the element at that index), and an array *at* the
end of the path yields each element and then the array itself (so ``{a: 1}`` and
``{a: [1, 2]}`` both work). A path that reaches nothing yields `MISSING` (the
sentinel `oplog.expressions` uses too), which
equality to ``null`` (and ``$exists: false``) matches. Each yielded value carries
the index of the outermost array traversed; the first one that satisfies the query
is the ``array_index`` reported by `Matcher.match_result` for the positional ``$``.

Negations (``$ne``, ``$nin``, ``$not``, ``$nor``) wrap the *whole* path test, so
``{a: {$ne: 1}}`` rejects ``{a: [1, 2]}`` just as MongoDB does. Comparisons are
type-bracketed with `oplog.values` ordering (``{$gt: 5}`` never matches strings),
except ``MinKey``/``MaxKey`` bounds and ``null`` which also cover missing fields.

`sort_documents` orders by MongoDB sort keys (arrays sort by their smallest element
ascending and largest descending, missing sorts as ``null``, an empty array below
``null``). `apply_projection` implements find() projections: inclusion/exclusion
trees, ``$slice``, ``$elemMatch``, positional ``field.$`` and computed fields.

Aggregation expressions (``$expr`` and computed projection fields) belong to
`oplog.expressions`: they are validated there when the filter or projection is
compiled and evaluated per document. ``$$NOW`` is the ``now`` given to
`compile_filter`/`compile_projection` (the Unix epoch when none is given).

Pure: no I/O, no clocks, no randomness.
"""

from __future__ import annotations

__layer__ = "core"  # pure: no I/O, clock or randomness (tests/unit/test_layering.py)

import contextvars
import datetime
import heapq
import math
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from decimal import Decimal
from typing import Any, NamedTuple, TypeVar

import regex
from bson.binary import Binary
from bson.decimal128 import Decimal128
from bson.int64 import Int64
from bson.max_key import MaxKey
from bson.min_key import MinKey
from bson.objectid import ObjectId
from bson.regex import Regex

from oplog.errors import MongoError
from oplog.expressions import MISSING, evaluate, is_operator, is_truthy, type_name, validate_expression
from oplog.values import (
    RANK_NULL,
    RANK_NUMBER,
    RANK_STRING,
    TYPE_ALIASES,
    SortKey,
    bson_type_code,
    compare_values,
    is_number,
    type_rank,
)

T = TypeVar("T")

__all__ = [
    "MISSING",
    "MatchResult",
    "Matcher",
    "Projection",
    "apply_projection",
    "compile_filter",
    "compile_projection",
    "get_path",
    "matches",
    "resolve_field",
    "sort_documents",
    "validate_projection",
]


_ARRAY = (list, tuple)
_DOC = (dict, Mapping)
_CONTAINER = (dict, Mapping, list, tuple)
_EPOCH = datetime.datetime(1970, 1, 1)  # $$NOW when the caller gives no time
_PLAIN_NUM = frozenset({int, float, Int64})
_REGEX_TYPES = (Regex, re.Pattern)
Pred = Callable[[Any], bool]

# Leaf-array behaviour of a path walk (MongoDB's ElementPath::LeafArrayBehavior).
_NO_TRAVERSE = 0  # an array at the end of the path is one value ($size, $elemMatch)
_TRAVERSE = 1  # each element, then the array itself (comparisons, $type, ...)
_TRAVERSE_OMIT = 2  # each element only (sort keys)


def _bad(msg: str) -> MongoError:
    return MongoError(2, msg)


# ---------------------------------------------------------------------------
# Path traversal
# ---------------------------------------------------------------------------


def _array_offset(part: str) -> int:
    """The array index a path component names, or -1 (``"01"`` names none, like MongoDB)."""
    if part.isascii() and part.isdigit() and (part == "0" or part[0] != "0"):
        return int(part)
    return -1


def _iter_doc(doc: Any, parts: tuple[str, ...], i: int, mode: int) -> Iterator[tuple[Any, int | None]]:
    """Yield ``(value, outer_array_index)`` for ``parts[i:]`` starting at document `doc`."""
    n = len(parts)
    cur = doc
    while True:
        cur = cur.get(parts[i], MISSING)
        i += 1
        if i == n or cur is MISSING or isinstance(cur, _ARRAY):
            break
        if not isinstance(cur, _DOC):
            cur = MISSING  # a scalar with path left over
            break
    if not isinstance(cur, _ARRAY):
        yield cur, None
    elif i < n:
        yield from _iter_array(cur, parts, i, mode)
    elif mode == _NO_TRAVERSE:
        yield cur, None
    else:
        yield from ((e, k) for k, e in enumerate(cur))
        if mode == _TRAVERSE:
            yield cur, None


def _iter_array(arr: Any, parts: tuple[str, ...], i: int, mode: int) -> Iterator[tuple[Any, int | None]]:
    """Traverse an array met with ``parts[i:]`` still to walk (implicit array traversal)."""
    offset = _array_offset(parts[i])
    last = i + 1 == len(parts)
    found = False
    for k, elem in enumerate(arr):
        if isinstance(elem, _DOC):
            for value, _inner in _iter_doc(elem, parts, i, mode):
                found = True
                yield value, k  # the outermost array index wins
            if k == offset:
                if last:
                    yield elem, None
                else:
                    yield from _iter_doc(elem, parts, i + 1, mode)
        elif k == offset:
            if last:
                found = True
                yield elem, None
            elif isinstance(elem, _ARRAY):
                found = True
                yield from _iter_array(elem, parts, i + 1, mode)
    if not found:
        # Nothing along the path: the field is missing. This gives the server's (8.0+) null
        # semantics: {"a.b": null} matches {a: []} and {a: [1, 2]} but not {a: [{b: 1}]}.
        yield MISSING, None


def _split(path: str) -> tuple[str, ...]:
    return tuple(path.split("."))


def get_path(doc: Mapping[str, Any], path: str, *, expand_trailing: bool = False) -> list[Any]:
    """All values reachable by dotted `path`, traversing arrays like MongoDB; ``[]`` if none.

    Arrays met before the end of the path are traversed (documents inside them are
    searched, numeric components index them). An array at the end of the path is
    returned whole unless `expand_trailing`, in which case its elements are returned.
    """
    mode = _TRAVERSE_OMIT if expand_trailing else _NO_TRAVERSE
    return [v for v, _ in _iter_doc(doc, _split(path), 0, mode) if v is not MISSING]


def resolve_field(doc: Any, path: str) -> tuple[bool, Any]:
    """``(found, value)`` for a plain dotted path; arrays are entered only by numeric index."""
    cur = doc
    for part in path.split("."):
        if isinstance(cur, _DOC):
            if part not in cur:
                return False, None
            cur = cur[part]
        elif isinstance(cur, _ARRAY):
            k = _array_offset(part)
            if k < 0 or k >= len(cur):
                return False, None
            cur = cur[k]
        else:
            return False, None
    return True, cur


# ---------------------------------------------------------------------------
# Single-value predicates
# ---------------------------------------------------------------------------


def _is_nan(x: Any) -> bool:
    if x.__class__ is float:
        return x != x
    return isinstance(x, Decimal128) and x.to_decimal().is_nan()


def _eq_pred(v: Any) -> Pred:
    """Equality with `v` as the server's $eq: type-bracketed, numbers by value, null ~ missing."""
    if v is None:
        return lambda x: x is None or x is MISSING
    cls = v.__class__
    if cls in _PLAIN_NUM and v == v:

        def num_eq(x: Any) -> bool:
            c = x.__class__
            if c in _PLAIN_NUM:
                return x == v  # type: ignore[no-any-return]
            return c is Decimal128 and compare_values(x, v) == 0

        return num_eq
    if cls is str:
        return lambda x: x.__class__ is str and x == v
    if cls is bool:
        return lambda x: x is v
    if cls is ObjectId:
        return lambda x: x.__class__ is ObjectId and x == v
    rank = type_rank(v)
    return lambda x: x is not MISSING and type_rank(x) == rank and compare_values(x, v) == 0


_CMP_TESTS: dict[str, Callable[[int], bool]] = {
    "$lt": lambda c: c < 0,
    "$lte": lambda c: c <= 0,
    "$gt": lambda c: c > 0,
    "$gte": lambda c: c >= 0,
}


def _cmp_pred(op: str, v: Any) -> Pred:
    """$lt/$lte/$gt/$gte against `v` (type-bracketed; NaN only equals NaN)."""
    test = _CMP_TESTS[op]
    inclusive = op in ("$lte", "$gte")
    if v.__class__ in _PLAIN_NUM and v == v:
        fast = _fast_num_cmp(op, v)
        if fast is not None:
            return fast
    if v.__class__ is str:
        return _fast_str_cmp(op, v)
    rank = type_rank(v)
    # Against MinKey/MaxKey every other value (even a missing one) is in range.
    bound = (op in ("$lt", "$lte")) if isinstance(v, MaxKey) else None
    if isinstance(v, MinKey):
        bound = op in ("$gt", "$gte")
    v_nan = _is_nan(v)

    def pred(x: Any) -> bool:
        if x is MISSING:
            return inclusive if rank == RANK_NULL else bool(bound)
        if type_rank(x) != rank:
            return bool(bound)
        if rank == RANK_NUMBER and (v_nan or _is_nan(x)):
            return inclusive and v_nan and _is_nan(x)
        return test(compare_values(x, v))

    return pred


def _fast_num_cmp(op: str, v: Any) -> Pred | None:
    def slow(x: Any) -> bool:
        return x.__class__ is Decimal128 and not _is_nan(x) and _CMP_TESTS[op](compare_values(x, v))

    num = _PLAIN_NUM
    if op == "$lt":
        return lambda x: x < v if x.__class__ in num else slow(x)
    if op == "$lte":
        return lambda x: x <= v if x.__class__ in num else slow(x)
    if op == "$gt":
        return lambda x: x > v if x.__class__ in num else slow(x)
    if op == "$gte":
        return lambda x: x >= v if x.__class__ in num else slow(x)
    return None


def _fast_str_cmp(op: str, v: str) -> Pred:
    test = _CMP_TESTS[op]
    return lambda x: x.__class__ is str and test((x > v) - (x < v))


def _fast_key(x: Any) -> tuple[int, Any] | None:
    """A hashable key for values whose Python equality matches MongoDB's, else None."""
    c = x.__class__
    if c is str:
        return (4, x)
    if c is int or c is Int64 or (c is float and x == x):
        return (3, x)
    if c is bool:
        return (9, x)
    if c is ObjectId:
        return (8, x)
    if x is None:
        return (2, None)
    return None


def _in_pred(values: list[Any], regexes: list[Pred]) -> Pred:
    """$in: equal to any value or matching any regex; null in the list also matches missing."""
    has_null = any(v is None for v in values)
    fast = {k for k in map(_fast_key, values) if k is not None}
    slow = [_eq_pred(v) for v in values if _fast_key(v) is None]
    every = [_eq_pred(v) for v in values]

    def pred(x: Any) -> bool:
        if x is MISSING:
            return has_null
        key = _fast_key(x)
        if key is not None:
            if key in fast or any(p(x) for p in slow):
                return True
        elif any(p(x) for p in every):
            return True
        return any(r(x) for r in regexes)

    return pred


def _type_pred(codes: frozenset[int]) -> Pred:
    def pred(x: Any) -> bool:
        if x is MISSING:
            return False
        try:
            return bson_type_code(x) in codes
        except TypeError:
            return False

    return pred


def _size_pred(n: int) -> Pred:
    return lambda x: isinstance(x, _ARRAY) and len(x) == n


def _exists_pred(x: Any) -> bool:
    return x is not MISSING


def _truncate_to_long(x: Any) -> int | None:
    """MongoDB's truncation of a number to a 64-bit integer; None if not representable."""
    c = x.__class__
    if c is int or c is Int64:
        return int(x)
    if c is float:
        if not math.isfinite(x):
            return None
        value = int(x)
    elif c is Decimal128:
        d = x.to_decimal()
        if not d.is_finite():
            return None
        value = int(d)
    else:
        return None
    return value if -(2**63) <= value < 2**63 else None


def _c_mod(dividend: int, divisor: int) -> int:
    r = abs(dividend) % abs(divisor)
    return -r if dividend < 0 else r


def _mod_pred(divisor: int, remainder: int) -> Pred:
    def pred(x: Any) -> bool:
        if x.__class__ is bool or not is_number(x):
            return False
        d = _truncate_to_long(x)
        return d is not None and _c_mod(d, divisor) == remainder

    return pred


# ---------------------------------------------------------------------------
# Regular expressions
# ---------------------------------------------------------------------------

_REGEX_FLAG_CHARS = "imsxu"
_RE_FLAG_BITS = {"i": regex.IGNORECASE, "m": regex.MULTILINE, "s": regex.DOTALL, "x": regex.VERBOSE}


class RegexBudget(NamedTuple):
    """How long one regex match may run, and the error when it runs longer (the `regex` engine checks
    its timeout while it backtracks, so a pattern such as ``^(a|aa)+$`` cannot run away)."""

    seconds: float
    code: int
    message: str

    def error(self) -> MongoError:
        """A new error each time (one shared exception object would collect every raise's traceback)."""
        return MongoError(self.code, self.message)

    @classmethod
    def limited_to(cls, seconds: float) -> RegexBudget:
        """A budget of `seconds` per match, past which the query fails with BadValue."""
        return cls(seconds, 2, f"Regular expression match exceeded its limit of {int(seconds * 1000)} ms")


# A single match may take this long by default: a legitimate pattern on a document's string takes
# microseconds; this bounds a catastrophic one. Query execution off the event loop sets a budget per
# operation (the smaller of this and what its maxTimeMS leaves).
REGEX_MATCH_LIMIT_S = 0.1
DEFAULT_REGEX_BUDGET = RegexBudget.limited_to(REGEX_MATCH_LIMIT_S)
REGEX_BUDGET: contextvars.ContextVar[RegexBudget | None] = contextvars.ContextVar("regex_budget", default=None)
_INT_FLAG_CHARS = ((re.IGNORECASE, "i"), (re.MULTILINE, "m"), (re.DOTALL, "s"), (re.VERBOSE, "x"))


def _flag_chars(flags: Any) -> str:
    """A regex's options as MongoDB letters (sorted, only i/m/s/x matter for equality)."""
    if isinstance(flags, str):
        return "".join(sorted(set(flags) & set("imsx")))
    return "".join(ch for bit, ch in _INT_FLAG_CHARS if int(flags) & bit)


def _regex_source(value: Any) -> tuple[str, str]:
    """``(pattern, options)`` of a bson Regex or compiled Python pattern."""
    pattern = value.pattern
    return (pattern.decode() if isinstance(pattern, bytes) else str(pattern), _flag_chars(value.flags))


def _translate_pcre(pattern: str) -> str:
    """Rewrite the PCRE spellings Python's `re` lacks or reads differently.

    ``(?<name>`` becomes ``(?P<name>``; PCRE's ``\\z`` (very end) is Python's ``\\Z``, and
    PCRE's ``\\Z`` (end, or before a final newline) becomes ``(?=\\n?\\Z)``.
    """
    out: list[str] = []
    i, n = 0, len(pattern)
    while i < n:
        ch = pattern[i]
        if ch == "\\" and i + 1 < n:
            nxt = pattern[i + 1]
            out.append({"z": "\\Z", "Z": "(?=\\n?\\Z)"}.get(nxt, ch + nxt))
            i += 2
            continue
        if pattern.startswith("(?<", i) and i + 3 < n and pattern[i + 3] not in "=!":
            out.append("(?P<")
            i += 3
            continue
        out.append(ch)
        i += 1
    return "".join(out)


def _compile_regex(pattern: str, options: str) -> regex.Pattern[str]:
    for ch in options:
        if ch not in _REGEX_FLAG_CHARS:
            raise MongoError(51108, f"invalid flag in regex options: {ch}")
    if "\x00" in pattern:
        raise _bad("Regular expression cannot contain an embedded null byte")
    bits = 0
    for ch in options:
        bits |= _RE_FLAG_BITS.get(ch, 0)
    try:
        return regex.compile(_translate_pcre(pattern), bits)
    except (regex.error, re.error) as exc:
        raise MongoError(51091, f"Regular expression is invalid: {exc}") from None


def _regex_pred(pattern: str, options: str) -> Pred:
    """Matches strings the regex finds, and stored regexes with the same pattern and options."""
    rx = _compile_regex(pattern, options)
    source = (pattern, _flag_chars(options))
    search = rx.search

    def pred(x: Any) -> bool:
        if x.__class__ is str:
            budget = REGEX_BUDGET.get() or DEFAULT_REGEX_BUDGET
            try:
                return search(x, timeout=budget.seconds, concurrent=True) is not None
            except TimeoutError:
                raise budget.error() from None
        if isinstance(x, _REGEX_TYPES):
            return _regex_source(x) == source
        return False

    return pred


def _regex_value_pred(value: Any) -> Pred:
    pattern, flags = _regex_source(value)
    if isinstance(value, Regex) and isinstance(value.flags, str):
        flags = value.flags
    return _regex_pred(pattern, flags)


# ---------------------------------------------------------------------------
# Bit test operators
# ---------------------------------------------------------------------------


def _bit_positions(op: str, arg: Any) -> list[int]:
    if isinstance(arg, bool):
        raise _bad(f"{op} takes an Array, a number, or a BinData but received: {arg!r}")
    if is_number(arg):
        mask = _truncate_to_long(arg)
        if mask is None or mask < 0 or (arg.__class__ is float and arg != int(arg)):
            raise MongoError(9, f"{op} bitmask must be a non-negative integer, got: {arg!r}")
        return [b for b in range(64) if mask >> b & 1]
    if isinstance(arg, (bytes, Binary)):
        data = bytes(arg)
        return [i * 8 + b for i, byte in enumerate(data) for b in range(8) if byte >> b & 1]
    if isinstance(arg, _ARRAY):
        out = []
        for p in arg:
            pos = _truncate_to_long(p) if is_number(p) and p.__class__ is not bool else None
            if pos is None or pos < 0 or (p.__class__ is float and p != int(p)):
                raise _bad(f"bit positions must be non-negative integers, got: {p!r}")
            out.append(pos)
        return out
    raise _bad(f"{op} takes an Array, a number, or a BinData but received: {arg!r}")


def _bit_set(x: Any, pos: int) -> bool | None:
    if isinstance(x, (bytes, Binary)):
        data = bytes(x)
        return pos // 8 < len(data) and bool(data[pos // 8] >> (pos % 8) & 1)
    if x.__class__ is bool or not is_number(x):
        return None
    if x.__class__ is float and (not math.isfinite(x) or x != int(x)):
        return None
    if isinstance(x, Decimal128) and (not x.to_decimal().is_finite() or x.to_decimal() % 1 != 0):
        return None
    value = _truncate_to_long(x)
    if value is None:
        return None
    return value < 0 if pos >= 64 else bool(value >> pos & 1)


def _bits_pred(op: str, positions: list[int]) -> Pred:
    want_set = op in ("$bitsAllSet", "$bitsAnySet")
    want_all = op in ("$bitsAllSet", "$bitsAllClear")

    def pred(x: Any) -> bool:
        if x is MISSING:
            return False
        results = []
        for pos in positions:
            bit = _bit_set(x, pos)
            if bit is None:
                return False
            results.append(bit == want_set)
        return all(results) if want_all else any(results)

    return pred


# ---------------------------------------------------------------------------
# Match tree nodes
# ---------------------------------------------------------------------------


# A compiled predicate over a whole document. `rec` (``[index]`` or None) records the
# array index that made a path match, for the positional operator (MongoDB's elemMatchKey).
MatchFn = Callable[[Any, "list[Any] | None"], bool]


def _leaf(path: str, pred: Pred, mode: int) -> MatchFn:
    """Does any value reachable along `path` satisfy `pred`?"""
    parts = _split(path)
    if len(parts) > 1:

        def match_path(doc: Any, rec: list[Any] | None) -> bool:
            # Fast walk through plain embedded documents; anything else takes the full walk.
            value = doc
            for part in parts:
                if value.__class__ is not dict:
                    break
                value = value.get(part, MISSING)
            else:
                if value.__class__ is not list and value.__class__ is not tuple:
                    return pred(value)
            if value is MISSING or (value.__class__ is not dict and not isinstance(value, (*_ARRAY, Mapping))):
                return pred(MISSING)
            for value, offset in _iter_doc(doc, parts, 0, mode):
                if pred(value):
                    if rec is not None and offset is not None:
                        rec[0] = offset
                    return True
            return False

        return match_path
    name = path
    if mode == _NO_TRAVERSE:
        return lambda doc, rec: pred(doc.get(name, MISSING))

    def match_field(doc: Any, rec: list[Any] | None) -> bool:
        value = doc.get(name, MISSING)
        if value.__class__ is list or value.__class__ is tuple:
            for k, elem in enumerate(value):
                if pred(elem):
                    if rec is not None:
                        rec[0] = k
                    return True
        return pred(value)

    return match_field


class _ElemMatch:
    """The array test of ``$elemMatch``: index of the first matching element, or -1."""

    __slots__ = ("elem_pred", "sub")

    def __init__(self, sub: MatchFn | None, elem_pred: Pred | None) -> None:
        self.sub = sub  # document form: a compiled sub-filter
        self.elem_pred = elem_pred  # value form: a single-value predicate

    def find(self, arr: Any) -> int:
        if not isinstance(arr, _ARRAY):
            return -1
        pred = self.elem_pred
        if pred is not None:
            for k, elem in enumerate(arr):
                if pred(elem):
                    return k
            return -1
        sub = self.sub
        assert sub is not None
        for k, elem in enumerate(arr):
            if isinstance(elem, _DOC):
                if sub(elem, None):
                    return k
            elif isinstance(elem, _ARRAY) and sub({str(i): e for i, e in enumerate(elem)}, None):
                return k  # an array element is matched as the object {"0": ..., "1": ...}
        return -1


def _elem_leaf(path: str, elem: _ElemMatch) -> MatchFn:
    parts = _split(path)
    find = elem.find

    def match(doc: Any, rec: list[Any] | None) -> bool:
        for value, offset in _iter_doc(doc, parts, 0, _NO_TRAVERSE):
            k = find(value)
            if k >= 0:
                if rec is not None:
                    rec[0] = k if offset is None else offset
                return True
        return False

    return match


def _and(children: list[MatchFn]) -> MatchFn:
    if len(children) == 1:
        return children[0]
    if len(children) == 2:
        first, second = children
        return lambda doc, rec: first(doc, rec) and second(doc, rec)

    def match(doc: Any, rec: list[Any] | None) -> bool:
        for child in children:
            if not child(doc, rec):
                return False
        return True

    return match


def _or(children: list[MatchFn]) -> MatchFn:
    # $or, $nor and $not never report an array index (the server passes no details down).
    return lambda doc, rec: any(child(doc, None) for child in children)


def _nor(children: list[MatchFn]) -> MatchFn:
    return lambda doc, rec: not any(child(doc, None) for child in children)


def _not(child: MatchFn) -> MatchFn:
    return lambda doc, rec: not child(doc, None)


def _const(value: bool) -> MatchFn:
    return lambda doc, rec: value


def _expr(expr: Any, now: datetime.datetime) -> MatchFn:
    return lambda doc, rec: is_truthy(evaluate(expr, doc, now=now))


# ---------------------------------------------------------------------------
# Operator documents -> intermediate form
# ---------------------------------------------------------------------------

# _IR items: ("leaf", pred, mode) | ("elem", _ElemMatch) | ("not", [ir]) | ("and", [ir]) | ("const", bool)
_IR = tuple[Any, ...]

_TOP_LEVEL_OPS = frozenset(
    {"$and", "$or", "$nor", "$expr", "$comment", "$where", "$text", "$jsonSchema", "$alwaysTrue",
     "$alwaysFalse", "$sampleRate"}
)
_UNSUPPORTED_FIELD_OPS = frozenset(
    {"$near", "$nearSphere", "$geoWithin", "$geoIntersects", "$within", "$geometry", "$maxDistance",
     "$minDistance", "$center", "$centerSphere", "$box", "$polygon", "$uniqueDocs"}
)
_DBREF_KEYS = frozenset({"$ref", "$id", "$db"})


def _is_operator_doc(value: Any) -> bool:
    """An object whose first key is an operator (not a DBRef's ``$ref``/``$id``/``$db``)."""
    if not isinstance(value, _DOC) or not value:
        return False
    first = next(iter(value))
    return isinstance(first, str) and first.startswith("$") and first not in _DBREF_KEYS


def _value_ir(value: Any) -> _IR:
    """Implicit equality ``{path: value}``; a regex value means a regex match."""
    if isinstance(value, _REGEX_TYPES):
        return ("leaf", _regex_value_pred(value), _TRAVERSE)
    return ("leaf", _eq_pred(value), _TRAVERSE)


def _parse_ops(ops: Mapping[str, Any]) -> list[_IR]:
    """Parse ``{$op: arg, ...}`` (all keys must be operators) into intermediate form."""
    out: list[_IR] = []
    regex_done = False
    for op, arg in ops.items():
        if op in ("$regex", "$options"):
            if not regex_done:
                out.append(_parse_regex_ops(ops))
                regex_done = True
            continue
        out.append(_parse_op(op, arg))
    return out


def _parse_op(op: str, arg: Any) -> _IR:
    if op == "$eq":
        return ("leaf", _eq_pred(arg), _TRAVERSE)
    if op == "$ne":
        return ("not", [("leaf", _eq_pred(arg), _TRAVERSE)])
    if op in _CMP_TESTS:
        if isinstance(arg, _REGEX_TYPES):
            raise _bad(f"Can't have RegEx as arg to {op} predicate.")
        return ("leaf", _cmp_pred(op, arg), _TRAVERSE)
    if op in ("$in", "$nin"):
        leaf = ("leaf", _parse_in(op, arg), _TRAVERSE)
        return leaf if op == "$in" else ("not", [leaf])
    if op == "$exists":
        exists = ("leaf", _exists_pred, _TRAVERSE)
        return exists if is_truthy(arg) else ("not", [exists])
    if op == "$not":
        return ("not", _parse_not(arg))
    parser = _OP_PARSERS.get(op)
    if parser is not None:
        return parser(op, arg)
    if op in _UNSUPPORTED_FIELD_OPS:
        raise _bad(f"{op} is not supported")
    raise _bad(f"unknown operator: {op}")


def _parse_in(op: str, arg: Any) -> Pred:
    if not isinstance(arg, _ARRAY):
        raise _bad(f"{op} needs an array")
    values: list[Any] = []
    regexes: list[Pred] = []
    for item in arg:
        if isinstance(item, _REGEX_TYPES):
            regexes.append(_regex_value_pred(item))
        elif _is_operator_doc(item):
            raise _bad(f"cannot nest $ under {op}")
        else:
            values.append(item)
    return _in_pred(values, regexes)


def _parse_not(arg: Any) -> list[_IR]:
    if isinstance(arg, _REGEX_TYPES):
        return [("leaf", _regex_value_pred(arg), _TRAVERSE)]
    if not isinstance(arg, _DOC):
        raise _bad("$not needs a regex or a document")
    if not arg:
        raise _bad("$not cannot be empty")
    return _parse_ops(arg)


def _parse_regex_ops(ops: Mapping[str, Any]) -> _IR:
    if "$regex" not in ops:
        raise _bad("$options needs a $regex")
    regex = ops["$regex"]
    options = ops.get("$options")
    if options is not None and not isinstance(options, str):
        raise _bad("$options has to be a string")
    if isinstance(regex, _REGEX_TYPES):
        pattern, flags = _regex_source(regex)
        if isinstance(regex, Regex) and isinstance(regex.flags, str):
            flags = regex.flags
        if flags and options:
            raise MongoError(51075, "options set in both $regex and $options")
        return ("leaf", _regex_pred(pattern, options or flags), _TRAVERSE)
    if not isinstance(regex, str):
        raise _bad("$regex has to be a string")
    return ("leaf", _regex_pred(regex, options or ""), _TRAVERSE)


def _parse_size(op: str, arg: Any) -> _IR:
    if not is_number(arg) or arg.__class__ is bool:
        raise _bad("$size needs a number")
    if _is_nan(arg) or (arg.__class__ is float and not math.isfinite(arg)):
        raise _bad("$size must be a whole number")
    n = _truncate_to_long(arg)
    if n is None or Decimal(str(arg)) != n:
        raise _bad("$size must be a whole number")
    if n < 0:
        raise _bad("$size may not be negative")
    return ("leaf", _size_pred(n), _NO_TRAVERSE)


def _type_code(spec: Any) -> list[int]:
    if isinstance(spec, str):
        if spec == "number":
            return [1, 16, 18, 19]
        if spec not in TYPE_ALIASES:
            raise _bad(f"Unknown type name alias: {spec}")
        return [TYPE_ALIASES[spec]]
    if is_number(spec) and spec.__class__ is not bool:
        code = _truncate_to_long(spec)
        if code is None or code != spec or code not in set(TYPE_ALIASES.values()):
            raise _bad(f"Invalid numerical type code: {spec}")
        return [code]
    raise MongoError(14, "type must be represented as a number or a string")


def _parse_type(op: str, arg: Any) -> _IR:
    specs = list(arg) if isinstance(arg, _ARRAY) else [arg]
    codes = frozenset(c for spec in specs for c in _type_code(spec))
    return ("leaf", _type_pred(codes), _TRAVERSE)


def _parse_mod(op: str, arg: Any) -> _IR:
    if not isinstance(arg, _ARRAY):
        raise _bad("malformed mod, needs to be an array")
    if len(arg) < 2:
        raise _bad("malformed mod, not enough elements")
    if len(arg) > 2:
        raise _bad("malformed mod, too many elements")
    parsed = []
    for what, value in zip(("divisor", "remainder"), arg, strict=True):
        if not is_number(value) or value.__class__ is bool:
            raise _bad(f"malformed mod, {what} not a number")
        number = _truncate_to_long(value)
        if number is None:
            raise _bad(f"malformed mod, {what} value is invalid")
        parsed.append(number)
    divisor, remainder = parsed
    if divisor == 0:
        raise _bad("divisor cannot be 0")
    return ("leaf", _mod_pred(divisor, remainder), _TRAVERSE)


def _parse_all(op: str, arg: Any) -> _IR:
    if not isinstance(arg, _ARRAY):
        raise _bad("$all needs an array")
    if not arg:
        return ("const", False)
    first = arg[0]
    if isinstance(first, _DOC) and first and next(iter(first)) == "$elemMatch":
        items = []
        for item in arg:
            if not (isinstance(item, _DOC) and len(item) == 1 and "$elemMatch" in item):
                raise _bad("$all/$elemMatch has to be consistent")
            items.append(_parse_elem_match("$elemMatch", item["$elemMatch"]))
        return ("and", items)
    out: list[_IR] = []
    for item in arg:
        if _is_operator_doc(item):
            raise _bad("no $ expressions in $all")
        out.append(_value_ir(item))
    return ("and", out)


def _parse_elem_match(op: str, arg: Any) -> _IR:
    if not isinstance(arg, _DOC):
        raise _bad("$elemMatch needs an Object")
    if _is_operator_doc(arg) and next(iter(arg)) not in _TOP_LEVEL_OPS:
        return ("elem", _ElemMatch(None, _ir_to_pred(("and", _parse_ops(arg)))))
    return ("elem", _ElemMatch(_parse_filter(arg, None), None))


def _parse_bits(op: str, arg: Any) -> _IR:
    return ("leaf", _bits_pred(op, _bit_positions(op, arg)), _TRAVERSE)


_OP_PARSERS: dict[str, Callable[[str, Any], _IR]] = {
    "$size": _parse_size,
    "$type": _parse_type,
    "$mod": _parse_mod,
    "$all": _parse_all,
    "$elemMatch": _parse_elem_match,
    "$bitsAllSet": _parse_bits,
    "$bitsAllClear": _parse_bits,
    "$bitsAnySet": _parse_bits,
    "$bitsAnyClear": _parse_bits,
}


def _ir_to_pred(ir: _IR) -> Pred:
    """Bind intermediate form to one value (value-form $elemMatch: no array traversal)."""
    kind = ir[0]
    if kind == "leaf":
        return ir[1]  # type: ignore[no-any-return]
    if kind == "elem":
        elem: _ElemMatch = ir[1]
        return lambda x: elem.find(x) >= 0
    if kind == "const":
        value = ir[1]
        return lambda x: value
    preds = [_ir_to_pred(sub) for sub in ir[1]]
    if kind == "not":
        return lambda x: not all(p(x) for p in preds)
    if len(preds) == 1:
        return preds[0]
    return lambda x: all(p(x) for p in preds)


def _ir_to_node(path: str, ir: _IR) -> MatchFn:
    """Bind intermediate form to a document path."""
    kind = ir[0]
    if kind == "leaf":
        return _leaf(path, ir[1], ir[2])
    if kind == "elem":
        return _elem_leaf(path, ir[1])
    if kind == "const":
        return _const(ir[1])
    children = [_ir_to_node(path, sub) for sub in ir[1]]
    if kind == "not":
        return _not(_and(children))
    return _and(children)


# ---------------------------------------------------------------------------
# Filter documents
# ---------------------------------------------------------------------------


def _parse_filter(filt: Mapping[str, Any], now: datetime.datetime | None) -> MatchFn:
    """Compile a filter document; `now` is $$NOW for ``$expr``, None where ``$expr`` is not
    allowed (inside ``$elemMatch``, as on the server)."""
    if not isinstance(filt, _DOC):
        raise _bad("query filter must be an object")
    nodes: list[MatchFn] = []
    for key, value in filt.items():
        if not isinstance(key, str):
            raise _bad(f"field names must be strings: {key!r}")
        if key.startswith("$"):
            node = _parse_top_level(key, value, now)
            if node is not None:
                nodes.append(node)
        else:
            nodes.append(_parse_field(key, value))
    if not nodes:
        return _const(True)
    return _and(nodes)


def _parse_field(path: str, value: Any) -> MatchFn:
    if _is_operator_doc(value):
        irs = _parse_ops(value)
        return _and([_ir_to_node(path, ir) for ir in irs])
    return _ir_to_node(path, _value_ir(value))


def _parse_top_level(op: str, value: Any, now: datetime.datetime | None) -> MatchFn | None:
    if op in ("$and", "$or", "$nor"):
        if not isinstance(value, _ARRAY):
            raise _bad(f"{op} must be an array")
        if not value:
            raise _bad("$and/$or/$nor must be a nonempty array")
        children = []
        for sub in value:
            if not isinstance(sub, _DOC):
                raise _bad("$or/$and/$nor entries need to be full objects")
            children.append(_parse_filter(sub, now))
        if op == "$and":
            return _and(children)
        return _or(children) if op == "$or" else _nor(children)
    if op == "$comment":
        return None
    if op == "$expr":
        if now is None:
            raise _bad("$expr can only be applied to the top-level document")
        validate_expression(value)
        return _expr(value, now)
    if op in ("$alwaysTrue", "$alwaysFalse"):
        if value != 1:
            raise _bad(f"{op} must be an integer value of 1")
        return _const(op == "$alwaysTrue")
    if op == "$text":
        raise MongoError(27, "text index required for $text query")
    if op in ("$where", "$jsonSchema", "$sampleRate"):
        raise _bad(f"{op} is not supported")
    raise _bad(
        f"unknown top level operator: {op}. If you have a field name that starts with a '$' symbol, "
        "consider using $getField or $setField."
    )


def _first_components(filt: Mapping[str, Any], out: set[str]) -> None:
    """Top-level field names a filter tests (through $and/$or/$nor), for positional checks."""
    for key, value in filt.items():
        if key in ("$and", "$or", "$nor"):
            for sub in value:
                _first_components(sub, out)
        elif not key.startswith("$"):
            out.add(key.split(".", 1)[0])


class MatchResult(NamedTuple):
    """Outcome of `Matcher.match_result`.

    `array_index` is the index of the first array element that made the query match (the
    server's "elemMatchKey", used by the positional ``$`` update and projection), or None
    when no array element decided the match.
    """

    matched: bool
    array_index: int | None


class Matcher:
    """A compiled, validated filter; reuse it for many documents."""

    __slots__ = ("_fields", "_root", "filter")

    def __init__(self, filt: Mapping[str, Any] | None, *, now: datetime.datetime | None = None) -> None:
        self.filter = filt
        self._root: MatchFn = _const(True) if filt is None else _parse_filter(filt, _EPOCH if now is None else now)
        fields: set[str] = set()
        if filt:
            _first_components(filt, fields)
        self._fields = frozenset(fields)

    def matches(self, doc: Mapping[str, Any]) -> bool:
        return self._root(doc, None)

    def match_result(self, doc: Mapping[str, Any]) -> MatchResult:
        """Whether `doc` matches and, if an array element decided it, that element's index."""
        rec: list[Any] = [None]
        if self._root(doc, rec):
            return MatchResult(True, rec[0])
        return MatchResult(False, None)

    def tests_field(self, field: str) -> bool:
        """Whether the filter has a predicate on top-level `field` (or a path starting with it)."""
        return field in self._fields

    def __repr__(self) -> str:
        return f"Matcher({self.filter!r})"


def compile_filter(filt: Mapping[str, Any] | None, *, now: datetime.datetime | None = None) -> Matcher:
    """Validate and compile a query filter; None or ``{}`` matches every document.

    `now` is ``$$NOW`` inside ``$expr`` (the Unix epoch when None)."""
    return Matcher(filt, now=now)


def matches(doc: Mapping[str, Any], filt: Mapping[str, Any] | None) -> bool:
    """One-off convenience: compile `filt` and test `doc` (compile once for many documents)."""
    return Matcher(filt).matches(doc)


# ---------------------------------------------------------------------------
# Sort
# ---------------------------------------------------------------------------

_BUCKET_MINKEY, _BUCKET_EMPTY_ARRAY, _BUCKET_VALUE = 0, 1, 2


def _shell_repr(value: Any) -> str:
    if isinstance(value, str):
        return '"' + value + '"'
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    return repr(value)


def _check_field_path(path: str) -> tuple[str, ...]:
    if path == "":
        raise MongoError(40352, "FieldPath cannot be constructed with empty string")
    parts = _split(path)
    for part in parts:
        if part == "":
            raise MongoError(15998, "FieldPath field names may not be empty strings.")
        if part.startswith("$"):
            raise MongoError(
                16410, "FieldPath field names may not start with '$'. Consider using $getField or $setField."
            )
    return parts


def _parse_sort(sort: Mapping[str, Any]) -> list[tuple[tuple[str, ...], int]]:
    """Validate a sort spec into ``[(path parts, direction)]``; direction 0 = $meta (no-op)."""
    keys = []
    for field, spec in sort.items():
        parts = _check_field_path(field)
        if isinstance(spec, _DOC):
            if len(spec) != 1 or "$meta" not in spec:
                raise MongoError(17312, "$meta is the only expression supported by $sort right now")
            if not isinstance(spec["$meta"], str):
                raise MongoError(17312, "$meta is the only expression supported by $sort right now")
            keys.append((parts, 0))
            continue
        if not is_number(spec) or spec.__class__ is bool:
            raise MongoError(15974, f"Illegal key in $sort specification: {field}: {_shell_repr(spec)}")
        order = _truncate_to_long(spec)
        if order not in (1, -1):
            raise MongoError(15975, "$sort key ordering must be 1 (for ascending) or -1 (for descending)")
        keys.append((parts, order))
    return keys


def _native_sort_key(value: Any) -> tuple[Any, ...]:
    """A tuple key that orders like `compare_values`, natively comparable for common types."""
    cls = value.__class__
    if cls is int or cls is Int64 or cls is float:
        return (_BUCKET_VALUE, RANK_NUMBER, 0, value) if value == value else (_BUCKET_VALUE, RANK_NUMBER, -1, 0)
    if cls is str:
        return (_BUCKET_VALUE, RANK_STRING, 0, value)
    if value is None:
        return (_BUCKET_VALUE, RANK_NULL, 0, 0)
    if cls is Decimal128:
        d = value.to_decimal()
        return (_BUCKET_VALUE, RANK_NUMBER, -1, 0) if d.is_nan() else (_BUCKET_VALUE, RANK_NUMBER, 0, d)
    if isinstance(value, MinKey):
        return (_BUCKET_MINKEY, 0, 0, 0)
    if isinstance(value, str):  # bson Code and other str subclasses order as strings
        return (_BUCKET_VALUE, RANK_STRING, 0, str(value))
    # Within one rank every value gets the same wrapper, so comparisons stay consistent.
    return (_BUCKET_VALUE, type_rank(value), 0, SortKey(value))


def _sort_key(doc: Any, parts: tuple[str, ...], direction: int) -> tuple[Any, ...]:
    """The MongoDB sort key of one field: min (asc) / max (desc) over reachable values."""
    if len(parts) == 1:
        value = doc.get(parts[0], MISSING)
        if not isinstance(value, _ARRAY):
            return _native_sort_key(None if value is MISSING else value)
        candidates = list(value)
    else:
        candidates = [v for v, _ in _iter_doc(doc, parts, 0, _TRAVERSE_OMIT)]
    if not candidates:
        return (_BUCKET_EMPTY_ARRAY, 0, 0, 0)
    best = None if candidates[0] is MISSING else candidates[0]
    for cand in candidates[1:]:
        cand = None if cand is MISSING else cand
        c = compare_values(cand, best)
        if (c < 0 and direction > 0) or (c > 0 and direction < 0):
            best = cand
    return _native_sort_key(best)


# Documents sorted by one call of the C sort. A sort holds the interpreter until it returns, so a big
# input is sorted in runs of this size and the runs are merged lazily: another thread (the event loop)
# never waits long for its turn, however many documents a query sorts.
SORT_RUN = 2048


class _Descending:
    """A sort key compared the other way round (for a descending field among ascending ones)."""

    __slots__ = ("key",)

    def __init__(self, key: tuple[Any, ...]) -> None:
        self.key = key

    def __lt__(self, other: _Descending) -> bool:
        return other.key < self.key

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Descending) and self.key == other.key

    __hash__ = None  # type: ignore[assignment]


def sort_documents(docs: list[dict[str, Any]], sort: Mapping[str, Any] | None) -> list[dict[str, Any]]:
    """A new list of `docs` in MongoDB sort order (stable); validates `sort`."""
    if not sort:
        return list(docs)
    return list(sort_payloads(((doc, doc) for doc in docs), sort))


def sort_payloads(entries: Iterable[tuple[dict[str, Any], T]], sort: Mapping[str, Any]) -> Iterator[T]:
    """The payloads of `(document, payload)` entries in the MongoDB sort order of their documents
    (stable); validates `sort`. A document is used for its key and then let go, so a caller sorting
    many documents can keep something smaller as the payload (the stored BSON) and decode again only
    what it returns. All entries are read at the first `next`; payloads then come out lazily, and the
    memory of each goes as it comes out (in pieces, on close too: freeing a million objects in one
    call would hold the interpreter as long as a big sort)."""
    keys = [(parts, direction) for parts, direction in _parse_sort(sort) if direction != 0]
    directions = {direction for _parts, direction in keys}
    descending = directions == {-1}
    mixed = len(directions) > 1

    def entry(i: int, doc: dict[str, Any], payload: T) -> tuple[Any, ...]:
        flat: list[Any] = []
        for parts, direction in keys:
            key = _sort_key(doc, parts, direction)
            if mixed and direction < 0:
                flat.append(_Descending(key))
            else:
                flat.extend(key)
        flat.append(-i if descending else i)
        flat.append(payload)
        return tuple(flat)

    # Each entry is one flat tuple: the fields' keys (four items each), a tiebreak, the payload. Flat
    # tuples compare several times faster than nested ones; the tiebreak keeps equal keys in input
    # order, so a payload is never compared.
    runs: list[list[tuple[Any, ...]]] = []
    run: list[tuple[Any, ...]] = []
    for i, (doc, payload) in enumerate(entries):
        run.append(entry(i, doc, payload))
        if len(run) == SORT_RUN:
            runs.append(run)
            run = []
    if run:
        runs.append(run)
    for r in runs:
        r.sort(reverse=not descending)  # reversed, so that `_drain` pops entries in order
    try:
        for item in heapq.merge(*map(_drain, runs), reverse=descending):
            yield item[-1]
    finally:
        for r in runs:
            while r:
                del r[-SORT_RUN // 8:]


def _drain(run: list[tuple[Any, ...]]) -> Iterator[tuple[Any, ...]]:
    """The entries of a run sorted the other way round, in order, each freed as it is taken."""
    while run:
        yield run.pop()


# ---------------------------------------------------------------------------
# Projection
# ---------------------------------------------------------------------------

_INCLUSION, _EXCLUSION = "inclusion", "exclusion"


class _PNode:
    """A level of the projection tree: field name -> spec or sub-level."""

    __slots__ = ("children", "computed")

    def __init__(self) -> None:
        self.children: dict[str, Any] = {}
        self.computed = False  # whether any computed field lies below; set by `finalize`

    def finalize(self) -> bool:
        flags = [c.finalize() if isinstance(c, _PNode) else isinstance(c, _Computed) for c in self.children.values()]
        self.computed = any(flags)
        return self.computed


class _Slice:
    __slots__ = ("limit", "skip")

    def __init__(self, skip: int | None, limit: int) -> None:
        self.skip = skip
        self.limit = limit

    def apply(self, arr: list[Any]) -> list[Any]:
        n = len(arr)
        if self.skip is None:
            if self.limit < 0:
                return list(arr[max(0, n + self.limit) :])
            return list(arr[: self.limit])
        start = max(0, n + self.skip) if self.skip < 0 else min(n, self.skip)
        return list(arr[start : start + self.limit])


class _Positional:
    __slots__ = ()


class _ElemProj:
    __slots__ = ("matcher",)

    def __init__(self, matcher: Matcher) -> None:
        self.matcher = matcher


class _Computed:
    """A computed field: a validated aggregation expression, evaluated per document."""

    __slots__ = ("expr", "now")

    def __init__(self, expr: Any, now: datetime.datetime) -> None:
        validate_expression(expr)
        self.expr = expr
        self.now = now

    def value(self, root_doc: Any) -> Any:
        return evaluate(self.expr, root_doc, now=self.now)


class _Meta:
    __slots__ = ("name",)

    def __init__(self, name: Any) -> None:
        self.name = name


class _PCtx:
    """Parse state, as in the server's projection parser."""

    def __init__(self, matcher: Matcher | None, now: datetime.datetime) -> None:
        self.matcher = matcher
        self.now = now
        self.type: str | None = None
        self.id_specified = self.id_included = self.id_excluded = False
        self.has_positional = self.has_elem_match = self.has_slice = self.has_meta = False
        self.positional_path: tuple[str, ...] | None = None
        self.elem_fields: list[str] = []


def _add_at_path(root: _PNode, parts: tuple[str, ...], child: Any, *, merge: bool = False) -> Any:
    node = root
    for i, part in enumerate(parts):
        existing = node.children.get(part)
        if i == len(parts) - 1:
            if existing is not None:
                if merge and isinstance(existing, _PNode) and isinstance(child, _PNode):
                    return existing
                raise MongoError(31250, f"Path collision at {'.'.join(parts)}")
            node.children[part] = child
            return child
        if existing is None:
            existing = node.children[part] = _PNode()
        elif not isinstance(existing, _PNode):
            raise MongoError(
                31249, f"Path collision at {'.'.join(parts)} remaining portion {'.'.join(parts[1:])}"
            )
        node = existing
    return child


def _find_positional(path: str) -> tuple[int, int] | None:
    first = path.find(".$.")
    if first >= 0:
        return (first, first + 3)
    if path.endswith(".$"):
        return (len(path) - 2, len(path))
    if path == "$":
        return (0, 1)
    return None


def _parse_pelem(ctx: _PCtx, key: str, value: Any, parent: _PNode, prefix: tuple[str, ...]) -> None:
    pos = _find_positional(key)
    if isinstance(value, _DOC):
        if pos is not None:
            raise MongoError(31271, "positional projection cannot be used with an expression or sub object")
        _parse_psub(ctx, key, value, parent, prefix)
    elif isinstance(value, bool) or is_number(value):
        if is_truthy(value):
            _parse_inclusion(ctx, key, parent, prefix, pos)
        else:
            _parse_exclusion(ctx, key, parent, prefix)
    else:
        if pos is not None:
            raise MongoError(31308, "positional projection cannot be used with a literal")
        if ctx.type == _EXCLUSION:
            raise MongoError(31310, f"Cannot use an expression {key}: {_shell_repr(value)} in an exclusion projection")
        parts = _check_field_path(key)
        _add_at_path(parent, parts, _Computed(value, ctx.now))
        ctx.type = _INCLUSION


def _parse_psub(ctx: _PCtx, key: str, obj: Mapping[str, Any], parent: _PNode, prefix: tuple[str, ...]) -> None:
    parts = _check_field_path(key)
    if len(obj) == 1 and str(next(iter(obj))).startswith("$"):
        if _parse_pexpr(ctx, parts, obj, parent, prefix):
            return
        raise MongoError(31325, f"Unknown expression {next(iter(obj))}")
    node = _add_at_path(parent, parts, _PNode(), merge=True)
    for sub_key, sub_value in obj.items():
        _parse_pelem(ctx, sub_key, sub_value, node, prefix + parts)


def _parse_pexpr(
    ctx: _PCtx, parts: tuple[str, ...], obj: Mapping[str, Any], parent: _PNode, prefix: tuple[str, ...]
) -> bool:
    name, arg = next(iter(obj.items()))
    if name == "$slice":
        _add_at_path(parent, parts, _parse_slice(arg))
        ctx.has_slice = True
        return True
    if name == "$elemMatch":
        if not isinstance(arg, _DOC):
            raise MongoError(31274, f"elemMatch: Invalid argument, object required, but got {type_name(arg)}")
        if ctx.has_positional:
            raise MongoError(31255, "Cannot specify positional operator and $elemMatch.")
        if len(parts) != 1 or prefix:
            raise MongoError(31275, "Cannot use $elemMatch projection on a nested field.")
        _add_at_path(parent, parts, _ElemProj(Matcher({parts[0]: {"$elemMatch": arg}})))
        ctx.has_elem_match = True
        return True
    is_meta = name == "$meta"
    if not is_meta and not is_operator(name):
        return False  # the caller raises 31325 (the server's projection code, not 168)
    if ctx.type == _EXCLUSION and not is_meta:
        raise MongoError(31252, "Cannot use expression other than $meta in exclusion projection")
    if is_meta:
        _add_at_path(parent, parts, _Meta(arg))
        ctx.has_meta = True
    else:
        _add_at_path(parent, parts, _Computed(obj, ctx.now))
        ctx.type = _INCLUSION
    return True


def _parse_slice(arg: Any) -> _Slice:
    if is_number(arg) and arg.__class__ is not bool:
        return _Slice(None, _clamp_int(arg))
    if isinstance(arg, _ARRAY):
        if len(arg) != 2:
            raise MongoError(31272, "$slice array argument should be of form [skip, limit]")
        skip, limit = arg
        if not is_number(skip) or skip.__class__ is bool:
            raise MongoError(31257, f"$slice expects the skip argument to be a number, got {type_name(skip)}")
        if not is_number(limit) or limit.__class__ is bool:
            raise MongoError(31258, f"$slice expects the limit argument to be a number, got {type_name(limit)}")
        if _clamp_int(limit) <= 0:
            raise MongoError(31259, f"$slice limit must be positive, got {_clamp_int(limit)}")
        return _Slice(_clamp_int(skip), _clamp_int(limit))
    raise MongoError(31273, "$slice only supports numbers and [skip, limit] arrays")


def _clamp_int(value: Any) -> int:
    """A number as a 32-bit int, the way the server reads $slice arguments."""
    number = _truncate_to_long(value)
    if number is None:
        return 0 if _is_nan(value) else (2**31 - 1 if float(str(value)) > 0 else -(2**31))
    return max(-(2**31), min(2**31 - 1, number))


def _parse_inclusion(
    ctx: _PCtx, key: str, parent: _PNode, prefix: tuple[str, ...], pos: tuple[int, int] | None
) -> None:
    is_top_id = key == "_id" and not prefix
    if pos is None:
        _add_at_path(parent, _check_field_path(key), True)
        ctx.id_included = ctx.id_included or is_top_id
    else:
        _parse_positional(ctx, key, parent, prefix, pos)
    if not is_top_id:
        if ctx.type == _EXCLUSION:
            raise MongoError(31253, f"Cannot do inclusion on field {key} in exclusion projection")
        ctx.type = _INCLUSION


def _parse_positional(ctx: _PCtx, key: str, parent: _PNode, prefix: tuple[str, ...], pos: tuple[int, int]) -> None:
    if ctx.has_positional:
        raise MongoError(31276, "Cannot specify more than one positional projection per query.")
    if ctx.has_elem_match:
        raise MongoError(31256, "Cannot specify positional operator and $elemMatch.")
    match_field = prefix[0] if prefix else key.split(".", 1)[0]
    if ctx.matcher is not None and not ctx.matcher.tests_field(match_field):
        raise MongoError(31277, f"Positional projection '{key}' does not match the query document.")
    if key.endswith(".$."):
        raise MongoError(31270, "Path cannot end with '.$.'")
    rest = key[pos[1] :]
    if _find_positional(rest) is not None or rest == "$":
        raise MongoError(31287, f"Cannot use positional operator twice: {key}")
    parts = _check_field_path(key[: pos[0]])
    _add_at_path(parent, parts, _Positional())
    ctx.has_positional = True
    ctx.positional_path = prefix + parts


def _parse_exclusion(ctx: _PCtx, key: str, parent: _PNode, prefix: tuple[str, ...]) -> None:
    _add_at_path(parent, _check_field_path(key), False)
    if key == "_id" and not prefix:
        ctx.id_excluded = True
        return
    if ctx.type == _INCLUSION:
        raise MongoError(31254, f"Cannot do exclusion on field {key} in inclusion projection")
    ctx.type = _EXCLUSION


def _projection_type(ctx: _PCtx) -> str:
    """The server's rules for projections with no plain inclusion/exclusion field."""
    if ctx.type is not None:
        return ctx.type
    if ctx.has_slice:
        return _INCLUSION if ctx.id_included else _EXCLUSION
    if ctx.has_elem_match:
        return _INCLUSION
    if ctx.has_meta:
        return _INCLUSION if ctx.id_included and not ctx.id_excluded else _EXCLUSION
    return _INCLUSION if ctx.id_included else _EXCLUSION


class Projection:
    """A parsed, validated find() projection; `apply` projects one document."""

    __slots__ = ("elem_fields", "kind", "matcher", "positional_path", "root")

    def __init__(
        self, spec: Mapping[str, Any], matcher: Matcher | None = None, *, now: datetime.datetime | None = None
    ) -> None:
        if not isinstance(spec, _DOC):
            raise _bad("projection must be an object")
        ctx = _PCtx(matcher, _EPOCH if now is None else now)
        root = _PNode()
        for key, value in spec.items():
            ctx.id_specified |= key == "_id" or key.startswith("_id.")
            _parse_pelem(ctx, key, value, root, ())
        self.kind = _projection_type(ctx)
        if not ctx.id_specified and self.kind == _INCLUSION:
            root.children["_id"] = True
        if self.kind == _EXCLUSION and ctx.id_included:
            root.children.pop("_id", None)
        root.finalize()
        self.root = root
        self.matcher = matcher
        self.positional_path = ctx.positional_path
        self.elem_fields = [k for k, v in root.children.items() if isinstance(v, _ElemProj)]

    def apply(self, doc: Mapping[str, Any], *, matcher: Matcher | None = None) -> dict[str, Any]:
        """Project `doc`. Values are shared with `doc`, not copied."""
        if self.kind == _INCLUSION:
            out = _include(doc, self.root, doc)
        else:
            out = _exclude(doc, self.root)
        if self.positional_path is not None:
            _apply_positional(doc, out, self.positional_path, matcher or self.matcher)
        for field in self.elem_fields:
            _apply_elem_match(doc, out, field, self.root.children[field], self.kind)
        return out


def _include(doc: Mapping[str, Any], node: _PNode, root_doc: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    children = node.children
    for key, value in doc.items():
        spec = children.get(key)
        if spec is None or spec is False or isinstance(spec, (_ElemProj, _Meta, _Computed)):
            continue
        if spec is True or isinstance(spec, _Positional):
            out[key] = value
        elif isinstance(spec, _Slice):
            out[key] = spec.apply(value) if isinstance(value, _ARRAY) else value
        elif isinstance(value, _DOC):
            out[key] = _include(value, spec, root_doc)
        elif isinstance(value, _ARRAY):
            out[key] = _include_array(value, spec, root_doc)
        elif spec.computed:
            out[key] = _include({}, spec, root_doc)
    for key, spec in children.items():
        if isinstance(spec, _Computed):
            result = spec.value(root_doc)
            if result is not MISSING:
                out[key] = result
        elif isinstance(spec, _PNode) and key not in out and spec.computed:
            out[key] = _include({}, spec, root_doc)
    return out


def _include_array(arr: Any, node: _PNode, root_doc: Any) -> list[Any]:
    out = []
    computed = node.computed
    for elem in arr:
        if isinstance(elem, _DOC):
            out.append(_include(elem, node, root_doc))
        elif isinstance(elem, _ARRAY):
            out.append(_include_array(elem, node, root_doc))
        elif computed:
            out.append(_include({}, node, root_doc))
    return out


def _exclude(doc: Mapping[str, Any], node: _PNode) -> dict[str, Any]:
    out: dict[str, Any] = {}
    children = node.children
    for key, value in doc.items():
        spec = children.get(key)
        if spec is None or spec is True or isinstance(spec, _ElemProj):
            out[key] = value
        elif spec is False or isinstance(spec, _Meta):
            continue
        elif isinstance(spec, _Slice):
            out[key] = spec.apply(value) if isinstance(value, _ARRAY) else value
        elif isinstance(spec, _PNode) and isinstance(value, _DOC):
            out[key] = _exclude(value, spec)
        elif isinstance(spec, _PNode) and isinstance(value, _ARRAY):
            out[key] = _exclude_array(value, spec)
        else:
            out[key] = value
    return out


def _exclude_array(arr: Any, node: _PNode) -> list[Any]:
    out = []
    for elem in arr:
        if isinstance(elem, _DOC):
            out.append(_exclude(elem, node))
        elif isinstance(elem, _ARRAY):
            out.append(_exclude_array(elem, node))
        else:
            out.append(elem)
    return out


def _apply_positional(pre: Any, out: dict[str, Any], parts: tuple[str, ...], matcher: Matcher | None) -> None:
    """Replace the first array along `parts` in `out` by ``[element at the matched index]``."""
    if matcher is None:
        raise MongoError(51050, "Projections with a positional operator require a matcher")
    index = matcher.match_result(pre).array_index
    sub: Any = out
    for depth, part in enumerate(parts):
        value = sub.get(part, MISSING)
        if isinstance(value, _ARRAY):
            if index is None:
                raise MongoError(51246, "positional operator '.$' couldn't find a matching element in the array")
            if not 0 <= index < len(value):
                raise MongoError(51247, "positional operator '.$' element mismatch")
            _set_nested(out, parts[: depth + 1], [value[index]])
            return
        if not isinstance(value, _DOC):
            return
        sub = value


def _set_nested(out: dict[str, Any], parts: tuple[str, ...], value: Any) -> None:
    cur = out
    for part in parts[:-1]:
        nxt = cur[part]
        if not isinstance(nxt, dict):
            nxt = cur[part] = dict(nxt)
        cur = nxt
    cur[parts[-1]] = value


def _apply_elem_match(pre: Any, out: dict[str, Any], field: str, spec: _ElemProj, kind: str) -> None:
    result = spec.matcher.match_result(pre)
    if not result.matched or result.array_index is None:
        out.pop(field, None)
        return
    value = [pre[field][result.array_index]]
    if kind == _INCLUSION:
        out.pop(field, None)
    out[field] = value


def compile_projection(
    projection: Mapping[str, Any], *, matcher: Matcher | None = None, now: datetime.datetime | None = None
) -> Projection:
    """Parse and validate a find() projection once, for projecting many documents.

    `now` is ``$$NOW`` in computed fields (the Unix epoch when None)."""
    return Projection(projection, matcher, now=now)


def validate_projection(projection: Mapping[str, Any] | None, *, matcher: Matcher | None = None) -> None:
    """Raise MongoError if `projection` is invalid (checked against `matcher` when given)."""
    if projection:
        Projection(projection, matcher)


def apply_projection(
    doc: dict[str, Any], projection: Mapping[str, Any] | None, *, matcher: Matcher | None = None
) -> dict[str, Any]:
    """Project `doc` with a find() projection; None or ``{}`` returns a shallow copy."""
    if not projection:
        return dict(doc)
    return Projection(projection, matcher).apply(doc)
