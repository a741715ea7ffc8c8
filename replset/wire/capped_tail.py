"""Tailable cursors on capped collections: documents in natural (insertion) order after the row the
cursor returned last. A cursor whose row was removed meanwhile (the collection trimmed past it) fails
with CappedPositionLost (136), as mongod's does, instead of going on from a later row and silently
skipping what was removed between."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import bson

from base.errors import MongoError
from oplog.capped import capped_limits
from oplog.codec_options import DOC_OPTIONS
from oplog.sqlite_store import scan_rows


def check_tailable(reader: Any, ns: str) -> None:
    """A tailable cursor is for a capped collection (2, as mongod answers one on any other)."""
    info = reader.collection(ns)
    if info is not None and capped_limits(info.options) is None:
        raise MongoError(2, f"error processing query: ns={ns} tailable cursor requested on non capped collection")


def capped_tail_source(reader: Any, ns: str, state: dict[str, int]) -> Iterator[dict[str, Any]]:
    """The collection's documents after row `state["last"]`, recording each returned row there (and,
    first, which table the rows are of: `state["table"]`)."""
    info = reader.collection(ns)
    if info is None:
        return
    state.setdefault("table", int(info.table[1:]))
    for row, blob in scan_rows(lambda: reader, ns, state.get("last", 0)):
        state["last"] = row
        yield bson.decode(blob, DOC_OPTIONS)


def check_capped_position(reader: Any, ns: str, state: dict[str, int]) -> None:
    info = reader.collection(ns)
    if "table" in state and (info is None or int(info.table[1:]) != state["table"]):
        raise MongoError(175, f"the capped collection {ns} was dropped or replaced under this tailable cursor")
    last = state.get("last", 0)
    if last and not reader.holds_row(ns, last):
        raise MongoError(136, f"CappedPositionLost: the capped collection {ns} was trimmed past this "
                              "cursor's position")
