"""Read concern arguments: what a read asks for, checked as mongod checks them.

`readConcern: {level, afterClusterTime, afterOpTime, atClusterTime}` on find, aggregate, count,
distinct. The levels, in what they promise:

* `local` / `available`: the member's newest data (as before; `available` is `local` here).
* `majority`: only data a majority of the set holds, so no rollback can take it back.
* `linearizable`: `majority`, and the read saw every write acknowledged before it began (primary only).
* `snapshot`: one point in time across every batch; refused here (see `refusal`).

`afterClusterTime` / `afterOpTime`: answer only once this member applied (for `majority`: the commit
point reached) that time. Pure: parsing and refusals only.
"""

from __future__ import annotations

__layer__ = "core"  # pure: no I/O, clock or randomness (tests/unit/test_layering.py)

from dataclasses import dataclass
from typing import Any

from bson.timestamp import Timestamp

from base.errors import MongoError
from base.optime import OpTime

LOCAL = "local"
AVAILABLE = "available"
MAJORITY = "majority"
LINEARIZABLE = "linearizable"
SNAPSHOT = "snapshot"
LEVELS = (LOCAL, MAJORITY, LINEARIZABLE, AVAILABLE, SNAPSHOT)

INVALID_OPTIONS = 72
FAILED_TO_PARSE = 9
SNAPSHOT_UNAVAILABLE = 246
SNAPSHOT_TOO_OLD = 239


@dataclass(frozen=True, slots=True)
class ReadConcern:
    level: str = LOCAL
    after_cluster_time: Timestamp | None = None
    after_optime: OpTime | None = None
    at_cluster_time: Timestamp | None = None

    @property
    def majority(self) -> bool:
        """Answers only majority-committed data (`linearizable` is `majority` and more)."""
        return self.level in (MAJORITY, LINEARIZABLE)

    @property
    def waits(self) -> bool:
        return self.after_cluster_time is not None or self.after_optime is not None


DEFAULT = ReadConcern()


def parse_read_concern(raw: Any) -> ReadConcern:
    """The command's `readConcern`, or MongoDB's error for a malformed one."""
    if raw is None:
        return DEFAULT
    if not isinstance(raw, dict):
        raise MongoError(FAILED_TO_PARSE, "readConcern must be an object")
    unknown = set(raw) - {"level", "afterClusterTime", "afterOpTime", "atClusterTime", "provenance"}
    if unknown:
        raise MongoError(FAILED_TO_PARSE, f"Unrecognized option in readConcern: {sorted(unknown)[0]}")
    level = raw.get("level", LOCAL)
    if level not in LEVELS:
        raise MongoError(FAILED_TO_PARSE, "readConcern.level must be either 'local', 'majority', "
                                          "'linearizable', 'available', or 'snapshot'")
    after_cluster_time = _timestamp(raw, "afterClusterTime")
    at_cluster_time = _timestamp(raw, "atClusterTime")
    after_optime = None
    if "afterOpTime" in raw:
        value = raw["afterOpTime"]
        if not isinstance(value, dict) or not isinstance(value.get("ts"), Timestamp):
            raise MongoError(FAILED_TO_PARSE, "readConcern.afterOpTime must be {ts: Timestamp, t: long}")
        after_optime = OpTime.from_document(value)
    if after_cluster_time is not None and after_optime is not None:
        raise MongoError(INVALID_OPTIONS, "Can not specify both afterClusterTime and afterOpTime")
    if after_cluster_time is not None and level == LINEARIZABLE:
        raise MongoError(INVALID_OPTIONS, "afterClusterTime is not allowed for linearizable read concern")
    if at_cluster_time is not None and level != SNAPSHOT:
        raise MongoError(INVALID_OPTIONS, "atClusterTime is only allowed with readConcern level 'snapshot'")
    if at_cluster_time is not None and after_cluster_time is not None:
        raise MongoError(INVALID_OPTIONS, "Specifying a timestamp for readConcern snapshot with "
                                          "afterClusterTime is not allowed")
    return ReadConcern(level, after_cluster_time, after_optime, at_cluster_time)


def _timestamp(raw: dict[str, Any], field: str) -> Timestamp | None:
    if field not in raw:
        return None
    value = raw[field]
    if not isinstance(value, Timestamp):
        raise MongoError(FAILED_TO_PARSE, f"readConcern.{field} must be a Timestamp")
    if value == Timestamp(0, 0):
        raise MongoError(INVALID_OPTIONS, f"readConcern.{field} cannot be a null timestamp")
    return value


SNAPSHOT_COMMANDS = frozenset({"find", "aggregate", "distinct"})


def refusal(concern: ReadConcern, *, in_transaction: bool = False, command: str = "find") -> MongoError | None:
    """What this member cannot serve: `snapshot` outside a transaction on a command that does not
    read at a point in time (mongod's InvalidOptions)."""
    if concern.level != SNAPSHOT or in_transaction or command in SNAPSHOT_COMMANDS:
        return None
    return MongoError(INVALID_OPTIONS, f"readConcern level 'snapshot' is not supported by '{command}' outside "
                                       "a multi-document transaction")

