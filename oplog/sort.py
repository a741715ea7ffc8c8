"""Sorting documents in MongoDB sort order: sort specs, sort keys, and the run-and-merge sort
behind `sort_documents` and `sort_payloads`.

A field's sort key is the smallest value its path reaches when ascending and the
largest when descending (arrays sort by their elements); missing sorts as ``null``,
an empty array below ``null``. Keys are flat tuples that compare natively for common
types (`_native_sort_key`); a descending field among ascending ones is wrapped in
`_Descending`. Big inputs are sorted in runs of `SORT_RUN` documents, merged lazily.

Pure: no I/O, no clocks, no randomness.
"""

from __future__ import annotations

__layer__ = "core"  # pure: no I/O, clock or randomness (tests/unit/test_layering.py)

import heapq
from collections.abc import Iterable, Iterator, Mapping
from typing import Any, TypeVar

from bson.decimal128 import Decimal128
from bson.int64 import Int64
from bson.min_key import MinKey

from base.errors import MongoError
from oplog.expr_values import MISSING
from oplog.query_common import (
    _ARRAY,
    _DOC,
    _TRAVERSE_OMIT,
    _check_field_path,
    _iter_doc,
    _shell_repr,
    _truncate_to_long,
)
from oplog.values import RANK_NULL, RANK_NUMBER, RANK_STRING, SortKey, compare_values, is_number, type_rank

T = TypeVar("T")

__all__ = [
    "SORT_RUN",
    "sort_documents",
    "sort_payloads",
]


_BUCKET_MINKEY, _BUCKET_EMPTY_ARRAY, _BUCKET_VALUE = 0, 1, 2


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
