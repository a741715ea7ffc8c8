"""Collations: this member compares strings by their bytes (`{locale: "simple"}`) and refuses any
other collation where a command, statement, collection or index names one (2 BadValue), rather
than accept it and answer by binary comparison anyway."""

from __future__ import annotations

__layer__ = "core"  # pure: no I/O, clock or randomness (tests/unit/test_layering.py)

from collections.abc import Iterator, Mapping
from typing import Any

from base.errors import MongoError

_STATEMENTS = {"update": "updates", "delete": "deletes", "createIndexes": "indexes"}


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
    for collation in _collations(name, cmd):
        if not isinstance(collation, Mapping):
            raise MongoError(14, "collation must be an object")
        if collation.get("locale") != "simple" or set(collation) - {"locale", "version"}:
            raise MongoError(2, f"collation {dict(collation)} is not supported: this server compares strings "
                                "by their bytes; use {locale: 'simple'} or leave collation out")
