"""What the filter, sort and projection modules share: dotted paths through documents, and a
few helpers for reading their arguments.

Path traversal (`_iter_doc`) follows the server's element iterator: embedded
documents are entered, arrays met *before* the end of the path are traversed
element by element (documents inside are searched for the rest of the path; a
numeric component also selects the element at that index), and an array *at* the
end of the path yields each element and then the array itself (so ``{a: 1}`` and
``{a: [1, 2]}`` both work), or only the elements, or only the array, as the walk's
leaf-array mode says. A path that reaches nothing yields `MISSING` (the sentinel
`oplog.expressions` uses too), which equality to ``null`` (and ``$exists: false``)
matches. Each yielded value carries the index of the outermost array traversed.
`get_path` and `resolve_field` are the public faces of path lookup.

Also here: field path checks for sort and projection keys (`_check_field_path`),
MongoDB's truncation of a number to a 64-bit integer (`_truncate_to_long`), the
shell-like rendering of a value in error messages (`_shell_repr`), BadValue errors
(`_bad`), and the Unix epoch that is ``$$NOW`` when the caller gives no time.

Pure: no I/O, no clocks, no randomness.
"""

from __future__ import annotations

__layer__ = "core"  # pure: no I/O, clock or randomness (tests/unit/test_layering.py)

import datetime
import math
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from bson.decimal128 import Decimal128
from bson.int64 import Int64

from base.errors import MongoError
from oplog.expr_values import MISSING

__all__ = [
    "get_path",
    "resolve_field",
]


_ARRAY = (list, tuple)
_DOC = (dict, Mapping)
_EPOCH = datetime.datetime(1970, 1, 1)  # $$NOW when the caller gives no time
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
# Numbers, field paths and messages
# ---------------------------------------------------------------------------


def _is_nan(x: Any) -> bool:
    if x.__class__ is float:
        return x != x
    return isinstance(x, Decimal128) and x.to_decimal().is_nan()


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
