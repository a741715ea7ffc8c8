"""The primary's log writer: allocate an optime, stamp, apply, append — in one transaction.

Every replicated write on the primary goes through `LogWriter.write`, which runs the
entry through the same `apply_entry` a secondary uses, so the primary's data is, by
construction, what replaying its oplog produces. Writes to the `local` database
are applied but not logged (MongoDB does not replicate `local`).
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping
from typing import Any

import bson

from base.optime import OpTime, next_optime
from oplog.apply import apply_entry
from oplog.entry import stamp
from oplog.sqlite_store import StoreTxn


def is_replicated(ns: str) -> bool:
    return not ns.startswith("local.")


class LogWriter:
    """Allocates strictly increasing optimes; `last` may include uncommitted entries."""

    def __init__(self, last: OpTime) -> None:
        self.last = last

    def mark(self) -> OpTime:
        """Where the log stands, for `undo_to` when what was written after is rolled back (a savepoint)."""
        return self.last

    def undo_to(self, mark: OpTime) -> None:
        self.last = mark

    def write(self, txn: StoreTxn, entry: Mapping[str, Any], *, term: int,
              now: datetime.datetime) -> dict[str, Any]:
        if not is_replicated(str(entry.get("ns", ""))):
            apply_entry(txn, entry, replay=False)
            return dict(entry)
        optime = next_optime(self.last, int(now.timestamp()), term)
        stamped = stamp(entry, optime, now)
        apply_entry(txn, stamped, replay=False)
        blob = bson.encode(stamped)
        txn.append_oplog([(optime.ts_key, blob)])
        self.last = optime
        return stamped
