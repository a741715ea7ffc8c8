"""Collations: how strings compare in a command's filter, sort and distinct.

`{locale: "simple"}` (or none) compares strings by their bytes. Any other locale is served at
`strength` 1, 2 or 3 (3 is the default), locale-independently:

- strength 2 ignores case (strings compare by their Unicode case folding);
- strength 1 also ignores accents (combining marks are dropped after NFD decomposition);
- strength 3 compares equal strings only when equal, as bytes do, and sorts them as ICU's tertiary
  level does for Latin text: by their case-folded form, then lower case before upper case.

It works by folding: a filter's literal strings and each document's string values are folded
before the ordinary matcher compares them (field names never are), and a sort orders documents by
their folded form. Differences from ICU: no language's own rules (no Turkish dotless i, no German
phonebook order); a `$regex` under strength 1 or 2 matches case-insensitively; `$expr` compares
as bytes. Options other than `locale` and `strength` must have their default values; strengths 4
and 5 are refused (2 BadValue), as is any malformed collation.
"""

from __future__ import annotations

__layer__ = "core"  # pure: no I/O, clock or randomness (tests/unit/test_layering.py)

import datetime
import unicodedata
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from base.errors import MongoError
from oplog.query import Matcher, MatchResult, compile_filter
from oplog.sort import sort_documents, sort_payloads

_STATEMENTS = {"update": "updates", "delete": "deletes", "createIndexes": "indexes"}
_DEFAULTS = {"caseLevel": False, "caseFirst": "off", "numericOrdering": False, "alternate": "non-ignorable",
             "maxVariable": "punct", "normalization": False, "backwards": False}
_NOT_FOLDED = frozenset({"$regex", "$options", "$type", "$exists", "$size", "$mod", "$expr", "$where",
                         "$jsonSchema", "$bitsAllSet", "$bitsAnySet", "$bitsAllClear", "$bitsAnyClear"})


@dataclass(frozen=True, slots=True)
class Collation:
    strength: int

    def fold_string(self, text: str) -> str:
        if self.strength >= 3:
            return text
        folded = text.casefold()
        if self.strength == 1:
            folded = "".join(c for c in unicodedata.normalize("NFD", folded) if not unicodedata.combining(c))
        return folded

    def fold(self, value: Any) -> Any:
        """`value` with every string folded (field names kept)."""
        return _map_strings(value, self.fold_string)

    def sort_form(self, value: Any) -> Any:
        """`value` as a sort compares it under this collation."""
        if self.strength >= 3:
            return _map_strings(value, lambda text: f"{text.casefold()}\x00{text.swapcase()}")
        return self.fold(value)

    def fold_filter(self, query: Any) -> Any:
        """A filter with its literal strings folded (not field names, nor the operands of `$regex`,
        `$expr` and the other operators that do not compare strings)."""
        if isinstance(query, Mapping):
            return {k: query[k] if k in _NOT_FOLDED else self.fold_filter(v) for k, v in query.items()}
        if isinstance(query, list):
            return [self.fold_filter(v) for v in query]
        if isinstance(query, str):
            return self.fold_string(query)
        return query


def _map_strings(value: Any, change: Callable[[str], str]) -> Any:
    """`value` with `change` applied to every string in it (field names kept)."""
    if isinstance(value, str):
        return change(value)
    if isinstance(value, Mapping):
        return {k: _map_strings(v, change) for k, v in value.items()}
    if isinstance(value, list):
        return [_map_strings(v, change) for v in value]
    return value


class CollatedMatcher:
    """A matcher that folds each document before the ordinary matcher compares it."""

    __slots__ = ("_inner", "collation", "filter")

    def __init__(self, query: Mapping[str, Any] | None, collation: Collation, *,
                 now: datetime.datetime | None = None) -> None:
        self.collation = collation
        self._inner = compile_filter(collation.fold_filter(query) if query else query, now=now)
        self.filter = query

    def matches(self, doc: Mapping[str, Any]) -> bool:
        return self._inner.matches(self.collation.fold(doc))

    def match_result(self, doc: Mapping[str, Any]) -> MatchResult:
        return self._inner.match_result(self.collation.fold(doc))

    def tests_field(self, field: str) -> bool:
        return self._inner.tests_field(field)


def parse_collation(raw: Any) -> Collation | None:
    """A command's or statement's collation; None for `simple` or none."""
    if raw is None:
        return None
    if not isinstance(raw, Mapping):
        raise MongoError(14, "collation must be an object")
    if not raw:
        return None  # (an empty collation document asks for none, as mongod reads it)
    locale = raw.get("locale")
    if not isinstance(locale, str) or not locale:
        raise MongoError(9, "collation requires a 'locale' string")
    if locale == "simple":
        if set(raw) - {"locale", "version"}:
            raise MongoError(2, "the simple collation takes no other options")
        return None
    for key, value in raw.items():
        if key in ("locale", "strength", "version"):
            continue
        if key not in _DEFAULTS:
            raise MongoError(40415, f"BSON field 'collation.{key}' is an unknown field.")
        if value != _DEFAULTS[key]:
            raise MongoError(2, f"collation option {key}: {value!r} is not supported by this server")
    strength = raw.get("strength", 3)
    if isinstance(strength, bool) or not isinstance(strength, int) or not 1 <= strength <= 5:
        raise MongoError(2, "collation strength must be an integer from 1 to 5")
    if strength > 3:
        raise MongoError(2, f"collation strength {strength} is not supported by this server (1 to 3 are)")
    return Collation(strength)


def has_strings(value: Any) -> bool:
    """Whether a value holds a string a collation would compare differently."""
    if isinstance(value, str):
        return True
    if isinstance(value, Mapping):
        return any(has_strings(v) for v in value.values())
    if isinstance(value, list):
        return any(has_strings(v) for v in value)
    return False


def collated_sort(docs: list[dict[str, Any]], sort: Mapping[str, Any] | None,
                  collation: Collation | None) -> list[dict[str, Any]]:
    """`docs` in `sort` order under `collation` (stable)."""
    if not sort:
        return list(docs)
    if collation is None:
        return sort_documents(docs, sort)
    return list(sort_payloads(((collation.sort_form(doc), doc) for doc in docs), sort))


def collated_matcher(query: Mapping[str, Any] | None, collation: Collation | None, *,
                     now: datetime.datetime | None = None) -> Matcher | CollatedMatcher:
    return compile_filter(query, now=now) if collation is None else CollatedMatcher(query, collation, now=now)


def _collations(name: str, cmd: Mapping[str, Any]) -> Iterator[Any]:
    if "collation" in cmd:
        yield cmd["collation"]
    field = _STATEMENTS.get(name)
    statements = cmd.get(field) if field else None
    if isinstance(statements, list):
        for statement in statements:
            if isinstance(statement, Mapping) and "collation" in statement:
                yield statement["collation"]


def check_collations(name: str, cmd: Mapping[str, Any]) -> None:
    """Every collation a command names is one this member serves; indexes and collections keep
    only `simple` (their order would have to be kept in the index)."""
    for raw in _collations(name, cmd):
        collation = parse_collation(raw)
        if collation is not None and name in ("createIndexes", "create"):
            raise MongoError(2, "collections and indexes only keep the simple collation on this server")
