"""MongoDB query filters: `compile_filter` turns a filter document into a reusable `Matcher`.

A filter is *compiled once* into a tree of small closures; all validation (unknown
operators, malformed arguments, bad regex options) happens then, so a `Matcher` can
be run over many documents cheaply. `Matcher.match_result` also reports the index of
the array element that decided a match (the server's "elemMatchKey"), for the
positional ``$``. ``$$NOW`` inside ``$expr`` is the ``now`` given to `compile_filter`
(the Unix epoch when none is given).

The query language is split by concern:

* `oplog.query_parse`: a filter document validated and compiled into a match tree;
* `oplog.query_match`: the single-value predicates and match nodes it is made of;
* `oplog.query_regex`: regular expressions and the time budget of one match;
* `oplog.query_common`: dotted paths through documents (`get_path`,
  `resolve_field`) and the helpers the modules share;
* `oplog.sort`: MongoDB sort order (`sort_documents`, `sort_payloads`);
* `oplog.projection`: find() projections (`compile_projection`, `apply_projection`).

Aggregation expressions (``$expr`` and computed projection fields) belong to
`oplog.expressions`.

Pure: no I/O, no clocks, no randomness.
"""

from __future__ import annotations

__layer__ = "core"  # pure: no I/O, clock or randomness (tests/unit/test_layering.py)

import datetime
from collections.abc import Mapping
from typing import Any, NamedTuple

from oplog.query_common import _EPOCH
from oplog.query_match import MatchFn, _const
from oplog.query_parse import _parse_filter

__all__ = [
    "MatchResult",
    "Matcher",
    "compile_filter",
    "matches",
]


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
