"""Index key extraction: the keys a document contributes to an index.

Pure. A key pattern such as `{a: 1, "b.c": -1}` yields one key per combination of
values (an array value contributes each element: a "multikey" index). A missing
field contributes null, except in sparse indexes where a document missing every
indexed field contributes no key. Keys are canonical bytes (equal values, equal
bytes) so a unique index is a primary key on those bytes.
"""

from __future__ import annotations

__layer__ = "core"  # pure: no I/O, clock or randomness (tests/unit/test_layering.py)

from collections.abc import Mapping
from itertools import product
from typing import Any

from oplog.values import canonical_key

_MISSING = object()


def _values_at(value: Any, parts: list[str]) -> list[Any]:
    if not parts:
        if isinstance(value, list):
            return list(value) if value else [None]
        return [value]
    if isinstance(value, Mapping):
        child = value.get(parts[0], _MISSING)
        return [] if child is _MISSING else _values_at(child, parts[1:])
    if isinstance(value, list):
        if parts[0].isdigit() and int(parts[0]) < len(value):
            return _values_at(value[int(parts[0])], parts[1:])
        out: list[Any] = []
        for element in value:
            if isinstance(element, Mapping):
                out.extend(_values_at(element, parts))
        return out
    return []


def index_values(doc: Mapping[str, Any], path: str) -> list[Any]:
    """Values a document holds at `path` for indexing (arrays expanded one level)."""
    return _values_at(doc, path.split("."))


def index_keys(doc: Mapping[str, Any], key_pattern: Mapping[str, Any], *, sparse: bool = False) -> set[bytes]:
    """Canonical keys of `doc` in an index with `key_pattern`."""
    per_field: list[list[Any]] = []
    present = False
    for path in key_pattern:
        values = index_values(doc, path)
        if values:
            present = True
        per_field.append(values or [None])
    if sparse and not present:
        return set()
    return {canonical_key(list(combo)) for combo in product(*per_field)}


def key_document(doc: Mapping[str, Any], key_pattern: Mapping[str, Any]) -> dict[str, Any]:
    """`{field: value}` of a document for an index, as shown in DuplicateKey errors."""
    out: dict[str, Any] = {}
    for path in key_pattern:
        values = index_values(doc, path)
        out[path] = values[0] if len(values) == 1 else (values or None)
    return out
