"""Replica-set configuration: parsing and validation of the `replSetInitiate` document.

Pure. Field names and defaults follow MongoDB's `rs.conf()` output. Every number
is checked as mongod's IDL checks it (`repl_set_config.idl`, `member_config.idl`):
an exact integer (a double with a fraction, NaN or an infinity is refused), within
the field's range. mongod answers a config it cannot parse with
InvalidReplicaSetConfig (93) and the parser's reason, and so does `parse_config`.

Ranges beyond mongod's (the timers): mongod only bounds them from below, so an
`electionTimeoutMillis` of 2**62 was accepted and a member would never call an
election. Every timer here is at most one day (`MAX_TIMER_MS`): no failure a
replica set should notice takes longer to detect, and `now + timeout` stays far
below any deadline arithmetic's limit.
"""

from __future__ import annotations

__layer__ = "core"  # pure: no I/O, clock or randomness (tests/unit/test_layering.py)

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from bson.int64 import Int64
from bson.objectid import ObjectId

from base.bson_types import bson_type
from base.errors import MongoError
from base.numbers import (
    MAX_CONFIG_VERSION,
    MAX_MEMBER_ID,
    MAX_TERM,
    UNINITIALIZED_TERM,
    int_in_range,
)

MAX_MEMBERS = 50
MAX_VOTERS = 7
MAX_PRIORITY = 1000
# member_config.idl: secondaryDelaySecs `validator: {gte: 0, lte: 31622400}` (366 days).
MAX_SECONDARY_DELAY_SECS = 31_622_400
MAX_TIMER_MS = 86_400_000  # one day: the upper bound of every timer setting (see the module docstring)


def _invalid(msg: str) -> MongoError:
    return MongoError(93, msg)


def _int_field(raw: Mapping[str, Any], field: str, default: int, low: int, high: int, *, path: str = "") -> int:
    """An integer field of the config in `[low, high]`; mongod's reason as InvalidReplicaSetConfig."""
    if field not in raw:
        return default
    try:
        return int_in_range(raw[field], path + field, low, high)
    except MongoError as exc:
        raise _invalid(exc.errmsg) from None


def _priority(raw: Mapping[str, Any]) -> float:
    """member_config.idl: `priority` is a safeDouble with `validator: {gte: 0, lte: 1000}`."""
    value = raw.get("priority", 1.0)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _invalid(f"Expected field \"priority\" to have numeric type, but found {bson_type(value)}")
    priority = float(value)
    if not 0 <= priority <= MAX_PRIORITY:  # NaN fails both comparisons
        raise _invalid(f"BSON field 'priority' value must be >= 0 and <= {MAX_PRIORITY}, "
                       f"actual value '{priority}'")
    return priority


@dataclass(frozen=True, slots=True)
class MemberConfig:
    id: int
    host: str
    priority: float = 1.0
    votes: int = 1
    hidden: bool = False
    arbiter_only: bool = False
    secondary_delay_secs: int = 0
    tags: dict[str, str] = field(default_factory=dict)
    build_indexes: bool = True

    @property
    def electable(self) -> bool:
        return self.priority > 0 and not self.arbiter_only and not self.hidden

    @property
    def data_bearing(self) -> bool:
        return not self.arbiter_only

    def to_document(self) -> dict[str, Any]:
        return {
            "_id": self.id, "host": self.host, "arbiterOnly": self.arbiter_only,
            "buildIndexes": self.build_indexes, "hidden": self.hidden, "priority": self.priority,
            "tags": dict(self.tags), "secondaryDelaySecs": Int64(self.secondary_delay_secs),
            "votes": self.votes,
        }


@dataclass(frozen=True, slots=True)
class Settings:
    chaining_allowed: bool = True
    heartbeat_interval_ms: int = 2000
    heartbeat_timeout_secs: int = 10
    election_timeout_ms: int = 10000
    catch_up_timeout_ms: int = -1
    catch_up_takeover_delay_ms: int = 30000
    get_last_error_modes: dict[str, Any] = field(default_factory=dict)
    replica_set_id: ObjectId = field(default_factory=ObjectId)

    def to_document(self) -> dict[str, Any]:
        return {
            "chainingAllowed": self.chaining_allowed,
            "heartbeatIntervalMillis": self.heartbeat_interval_ms,
            "heartbeatTimeoutSecs": self.heartbeat_timeout_secs,
            "electionTimeoutMillis": self.election_timeout_ms,
            "catchUpTimeoutMillis": self.catch_up_timeout_ms,
            "catchUpTakeoverDelayMillis": self.catch_up_takeover_delay_ms,
            "getLastErrorModes": dict(self.get_last_error_modes),
            "getLastErrorDefaults": {"w": 1, "wtimeout": 0},
            "replicaSetId": self.replica_set_id,
        }


@dataclass(frozen=True, slots=True)
class ReplSetConfig:
    name: str
    version: int
    term: int
    members: tuple[MemberConfig, ...]
    settings: Settings

    def member_by_host(self, host: str) -> MemberConfig | None:
        host = host.lower()
        return next((m for m in self.members if m.host.lower() == host), None)

    def member_by_id(self, member_id: int) -> MemberConfig | None:
        return next((m for m in self.members if m.id == member_id), None)

    @property
    def voters(self) -> list[MemberConfig]:
        return [m for m in self.members if m.votes > 0]

    @property
    def majority_vote_count(self) -> int:
        return len(self.voters) // 2 + 1

    @property
    def write_majority_count(self) -> int:
        data_voters = [m for m in self.voters if m.data_bearing]
        return min(self.majority_vote_count, len(data_voters))

    @property
    def data_bearing_count(self) -> int:
        return sum(1 for m in self.members if m.data_bearing)

    def to_document(self) -> dict[str, Any]:
        return {
            "_id": self.name, "version": self.version, "term": self.term,
            "protocolVersion": Int64(1), "writeConcernMajorityJournalDefault": True,
            "members": [m.to_document() for m in self.members],
            "settings": self.settings.to_document(),
        }


def _parse_member(raw: Any) -> MemberConfig:
    if not isinstance(raw, Mapping) or "_id" not in raw or "host" not in raw:
        raise _invalid("each member needs an _id and a host")
    if not isinstance(raw["host"], str) or ":" not in raw["host"]:
        raise _invalid(f"member host must be host:port, got {raw['host']!r}")
    tags = raw.get("tags", {})
    if not isinstance(tags, Mapping):
        raise _invalid("member tags must be an object")
    delay_field = "secondaryDelaySecs" if "secondaryDelaySecs" in raw else "slaveDelay"
    member = MemberConfig(
        id=_int_field(raw, "_id", 0, 0, MAX_MEMBER_ID), host=raw["host"].lower(), priority=_priority(raw),
        votes=_int_field(raw, "votes", 1, 0, 1), hidden=bool(raw.get("hidden", False)),
        arbiter_only=bool(raw.get("arbiterOnly", False)),
        secondary_delay_secs=_int_field(raw, delay_field, 0, 0, MAX_SECONDARY_DELAY_SECS),
        tags=dict(tags), build_indexes=bool(raw.get("buildIndexes", True)),
    )
    if member.priority > 0 and (member.hidden or member.arbiter_only or member.votes == 0
                                or member.secondary_delay_secs):
        raise _invalid("priority must be 0 for hidden, delayed, non-voting and arbiter members")
    return member


def _parse_settings(raw: Mapping[str, Any]) -> Settings:
    defaults = Settings()
    rsid = raw.get("replicaSetId")
    modes = raw.get("getLastErrorModes", {})
    if not isinstance(modes, Mapping):
        raise _invalid("settings.getLastErrorModes must be an object")

    def timer(field: str, default: int, low: int, high: int = MAX_TIMER_MS) -> int:
        # repl_set_config.idl: heartbeatIntervalMillis, heartbeatTimeoutSecs, electionTimeoutMillis
        # `gt: 0`; catchUpTimeoutMillis, catchUpTakeoverDelayMillis `gte: -1` (-1: no limit / never).
        return _int_field(raw, field, default, low, high, path="settings.")

    return Settings(
        chaining_allowed=bool(raw.get("chainingAllowed", defaults.chaining_allowed)),
        heartbeat_interval_ms=timer("heartbeatIntervalMillis", defaults.heartbeat_interval_ms, 1),
        heartbeat_timeout_secs=timer("heartbeatTimeoutSecs", defaults.heartbeat_timeout_secs, 1,
                                     MAX_TIMER_MS // 1000),
        election_timeout_ms=timer("electionTimeoutMillis", defaults.election_timeout_ms, 1),
        catch_up_timeout_ms=timer("catchUpTimeoutMillis", defaults.catch_up_timeout_ms, -1),
        catch_up_takeover_delay_ms=timer("catchUpTakeoverDelayMillis", defaults.catch_up_takeover_delay_ms, -1),
        get_last_error_modes=dict(modes),
        replica_set_id=rsid if isinstance(rsid, ObjectId) else ObjectId(),
    )


def parse_config(raw: Mapping[str, Any], *, default_term: int = -1) -> ReplSetConfig:
    if not isinstance(raw.get("_id"), str) or not raw["_id"]:
        raise _invalid("the replica set config needs a string _id (the set name)")
    members_raw = raw.get("members")
    if not isinstance(members_raw, list) or not members_raw:
        raise _invalid("the replica set config needs a non-empty members array")
    members = tuple(_parse_member(m) for m in members_raw)
    if len(members) > MAX_MEMBERS:
        raise _invalid(f"at most {MAX_MEMBERS} members")
    if len({m.id for m in members}) != len(members) or len({m.host for m in members}) != len(members):
        raise _invalid("member _id and host values must be unique")
    voters = sum(m.votes for m in members)
    if voters == 0 or voters > MAX_VOTERS:
        raise _invalid(f"a replica set needs between 1 and {MAX_VOTERS} voting members")
    if not any(m.electable for m in members):
        raise _invalid("a replica set needs at least one electable member")
    settings = raw.get("settings") or {}
    if not isinstance(settings, Mapping):
        raise _invalid("settings must be an object")
    # repl_set_config.idl: version `gt: 0, lt: 2147483648`. The config term is the term of the primary
    # that wrote it: any term a member may hold (mongod bounds it by int32 too; our terms go to MAX_TERM).
    return ReplSetConfig(
        name=raw["_id"], version=_int_field(raw, "version", 1, 1, MAX_CONFIG_VERSION),
        term=_int_field(raw, "term", default_term, UNINITIALIZED_TERM, MAX_TERM),
        members=members, settings=_parse_settings(settings),
    )
