"""Write concern: parsing, validation against the config, and satisfaction checks.

Pure. Counting which members have reached a write lives in `replset.quorum`
(`write_concern_satisfied`); this module parses the concern and rejects the ones
that can never be met. Nothing here waits or sleeps.
"""

from __future__ import annotations

__layer__ = "core"  # pure: no I/O, clock or randomness (tests/unit/test_layering.py)

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from base.config import MAX_MEMBERS, ReplSetConfig
from base.errors import MongoError
from base.numbers import INT32_MAX, safe_number_long

MAJORITY = "majority"


@dataclass(frozen=True, slots=True)
class WriteConcern:
    w: int | str = MAJORITY
    j: bool | None = None
    wtimeout_ms: int = 0
    provenance: str = "implicitDefault"

    @property
    def unacknowledged(self) -> bool:
        return self.w == 0 and not self.j

    @property
    def waits_for_journal(self) -> bool:
        """The write waits on durability: our journal is flushed at once for it (as MongoDB does)."""
        return bool(self.j) or self.w == MAJORITY

    def to_document(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"w": self.w}
        if self.j is not None:
            doc["j"] = self.j
        doc["wtimeout"] = self.wtimeout_ms
        doc["provenance"] = self.provenance
        return doc


def parse_write_concern(raw: Any) -> WriteConcern:
    if raw is None:
        return WriteConcern()
    if not isinstance(raw, Mapping):
        raise MongoError(14, "writeConcern must be an object")
    if not raw:
        return WriteConcern()
    w = raw.get("w", 1)
    if isinstance(w, bool) or not isinstance(w, (int, float, str)):
        raise MongoError(9, "w has to be a number or string")
    if isinstance(w, float):
        if math.isnan(w):
            raise MongoError(9, "w cannot be NaN")
        w = safe_number_long(w)
    if isinstance(w, int) and not 0 <= w <= MAX_MEMBERS:
        raise MongoError(9, f"w has to be a non-negative number and not greater than {MAX_MEMBERS}; found: {w}")
    j = raw.get("j", raw.get("fsync"))
    wtimeout = raw.get("wtimeout", raw.get("wtimeoutMS", 0)) or 0
    if not isinstance(wtimeout, (int, float)) or isinstance(wtimeout, bool):
        raise MongoError(14, "wtimeout must be a number")
    # As mongod's parseWTimeoutFromBSON: the number as a 64-bit integer (NaN is 0: no limit), at most int32.
    wtimeout_ms = safe_number_long(wtimeout)
    if wtimeout_ms > INT32_MAX:
        raise MongoError(9, "wtimeout must be a 32-bit integer")
    return WriteConcern(w=w, j=None if j is None else bool(j), wtimeout_ms=wtimeout_ms,
                        provenance="clientSupplied")


def check_satisfiable(wc: WriteConcern, config: ReplSetConfig | None) -> MongoError | None:
    """The writeConcernError to report at once, if the concern can never be met."""
    if isinstance(wc.w, str) and wc.w != MAJORITY:
        if config is None or wc.w not in config.settings.get_last_error_modes:
            return MongoError(79, f"No write concern mode named '{wc.w}' found in replica set configuration",
                              extra={"errInfo": {"writeConcern": wc.to_document()}})
    if isinstance(wc.w, int):
        data_bearing = config.data_bearing_count if config is not None else 1
        if wc.w > data_bearing:
            return MongoError(100, "Not enough data-bearing nodes",
                              extra={"errInfo": {"writeConcern": wc.to_document()}})
    return None


def timeout_error(wc: WriteConcern) -> MongoError:
    return MongoError(64, "waiting for replication timed out",
                      extra={"errInfo": {"wtimeout": True, "writeConcern": wc.to_document()}})


def write_concern_error_field(error: MongoError) -> dict[str, Any]:
    """A write concern failure as a reply's `writeConcernError` (the error document without `ok`)."""
    return {k: v for k, v in error.to_document().items() if k != "ok"}
