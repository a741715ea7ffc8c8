"""A find's `hint` and its `min` / `max`, as a query that runs on the hinted index would answer.

A hint names an index by name or key pattern (an unknown one is refused, 2, as mongod's planner
refuses it; `{$natural: ±1}` asks for natural order). Scanning an index decides what comes back:
documents in the index's key order (its direction per field; ties in insertion order), only those the
index holds (a sparse index skips documents without any of its fields, a partial index those outside
its filter), and with `min` (inclusive) / `max` (exclusive) only keys in that range of the index's
order. Pure: the index specs come in.
"""

from __future__ import annotations

__layer__ = "core"  # pure: no I/O, clock or randomness (tests/unit/test_layering.py)

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import product
from typing import Any

from base.errors import MongoError
from oplog.index_keys import index_values
from oplog.values import compare_values, is_number


def is_natural_hint(hint: Any) -> bool:
    return isinstance(hint, Mapping) and list(hint) == ["$natural"]


def _same_pattern(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    if list(a) != list(b):
        return False
    return all(a[k] == b[k] if not (is_number(a[k]) and is_number(b[k])) else float(a[k]) == float(b[k])
               for k in a)


def resolve_hint(specs: Sequence[Mapping[str, Any]], hint: Any) -> Mapping[str, Any] | None:
    """The spec of the index `hint` names; None for no hint (absent, empty, `$natural`)."""
    if hint is None or hint == "" or hint == {} or is_natural_hint(hint):
        return None
    for spec in specs:
        if (isinstance(hint, str) and spec.get("name") == hint) or (
                isinstance(hint, Mapping) and _same_pattern(spec.get("key") or {}, hint)):
            return spec
    raise MongoError(2, "error processing query: planner returned error :: caused by :: hint provided does "
                        "not correspond to an existing index")


@dataclass(frozen=True, slots=True)
class IndexScan:
    """What a scan of one index returns, as a filter on documents and an order."""

    spec: Mapping[str, Any]
    low: Mapping[str, Any] | None = None
    high: Mapping[str, Any] | None = None

    @property
    def order(self) -> dict[str, Any] | None:
        """The index's key order as a sort, or None for a special index (text, 2d, ...)."""
        key = dict(self.spec.get("key") or {})
        if not key or not all(is_number(d) and not isinstance(d, bool) for d in key.values()):
            return None
        return {field: 1 if direction > 0 else -1 for field, direction in key.items()}

    def includes(self, doc: Mapping[str, Any]) -> bool:
        key = self.spec.get("key") or {}
        per_field = [index_values(doc, path) for path in key]
        if self.spec.get("sparse") and not any(per_field):
            return False
        partial = self.spec.get("partialFilterExpression")
        if partial:
            from oplog.query import matches

            if not matches(dict(doc), partial):
                return False
        if self.low is None and self.high is None:
            return True
        directions = [1 if not is_number(d) or d > 0 else -1 for d in key.values()]
        for combo in product(*[values or [None] for values in per_field]):
            if self.low is not None and _compare(combo, list(self.low.values()), directions) < 0:
                continue
            if self.high is not None and _compare(combo, list(self.high.values()), directions) >= 0:
                continue
            return True
        return False


def _compare(key: Sequence[Any], bound: Sequence[Any], directions: Sequence[int]) -> int:
    for value, limit, direction in zip(key, bound, directions, strict=True):
        c = compare_values(value, limit) * direction
        if c:
            return c
    return 0


def index_scan(specs: Sequence[Mapping[str, Any]], hint: Any, low: Mapping[str, Any] | None,
               high: Mapping[str, Any] | None) -> IndexScan | None:
    """The scan a find's hint and bounds ask for; None when it reads in natural order."""
    if low is None and high is None:
        spec = resolve_hint(specs, hint)
        return None if spec is None else IndexScan(spec)
    if hint is None or hint == {} or is_natural_hint(hint):
        raise MongoError(51173, "When using min()/max() a hint of which index to use must be specified")
    spec = resolve_hint(specs, hint)
    assert spec is not None
    fields = list(spec.get("key") or {})
    for bound in (low, high):
        if bound is not None and list(bound) != fields:
            raise MongoError(51174, "The index chosen is not equal to the index specified by min/max: min and "
                                    "max must name the hinted index's fields, in its order")
    return IndexScan(spec, low, high)


def index_for_key(specs: Sequence[Mapping[str, Any]], hint: Any, query: Mapping[str, Any],
                  sort: Mapping[str, Any] | None) -> Mapping[str, Any] | None:
    """The index a find reads with, for `returnKey`: the hinted one; else one whose key pattern starts
    with the sort's fields (in either direction throughout); else the `_id` index for a filter on
    `_id`; None for a collection scan (whose key is an empty document, as mongod's)."""
    hinted = resolve_hint(specs, hint)
    if hinted is not None:
        return hinted
    if sort:
        wanted = [(field, 1 if is_number(d) and d > 0 else -1) for field, d in sort.items()]
        for spec in specs:
            key = [(field, 1 if is_number(d) and d > 0 else -1) for field, d in (spec.get("key") or {}).items()]
            if len(key) >= len(wanted) and [f for f, _ in key[:len(wanted)]] == [f for f, _ in wanted]:
                signs = {a * b for (_, a), (_, b) in zip(key, wanted, strict=False)}
                if len(signs) == 1 and not spec.get("sparse") and not spec.get("partialFilterExpression"):
                    return spec
    if "_id" in query:
        return next((spec for spec in specs if spec.get("name") == "_id_"), None)
    return None


def key_of(doc: Mapping[str, Any], spec: Mapping[str, Any] | None) -> dict[str, Any]:
    """`returnKey`'s document: the index's key fields and the document's values for them."""
    if spec is None:
        return {}
    out: dict[str, Any] = {}
    for path in spec.get("key") or {}:
        values = index_values(doc, path)
        out[path] = values[0] if values else None
    return out
