"""Replica-set configuration: parsing and validation of the `replSetInitiate` document.

Pure. Field names and defaults follow MongoDB's `rs.conf()` output.
"""

from __future__ import annotations

__layer__ = "core"  # pure: no I/O, clock or randomness (tests/unit/test_layering.py)

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from bson.int64 import Int64
from bson.objectid import ObjectId

from base.errors import MongoError

MAX_MEMBERS = 50
MAX_VOTERS = 7


def _invalid(msg: str) -> MongoError:
    return MongoError(93, msg)


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
    member = MemberConfig(
        id=int(raw["_id"]), host=raw["host"].lower(), priority=float(raw.get("priority", 1.0)),
        votes=int(raw.get("votes", 1)), hidden=bool(raw.get("hidden", False)),
        arbiter_only=bool(raw.get("arbiterOnly", False)),
        secondary_delay_secs=int(raw.get("secondaryDelaySecs", raw.get("slaveDelay", 0))),
        tags=dict(raw.get("tags", {})), build_indexes=bool(raw.get("buildIndexes", True)),
    )
    if member.votes not in (0, 1):
        raise _invalid("votes must be 0 or 1")
    if not 0 <= member.priority <= 1000:
        raise _invalid("priority must be between 0 and 1000")
    if member.priority > 0 and (member.hidden or member.arbiter_only or member.votes == 0
                                or member.secondary_delay_secs):
        raise _invalid("priority must be 0 for hidden, delayed, non-voting and arbiter members")
    return member


def _parse_settings(raw: Mapping[str, Any]) -> Settings:
    defaults = Settings()
    rsid = raw.get("replicaSetId")
    return Settings(
        chaining_allowed=bool(raw.get("chainingAllowed", defaults.chaining_allowed)),
        heartbeat_interval_ms=int(raw.get("heartbeatIntervalMillis", defaults.heartbeat_interval_ms)),
        heartbeat_timeout_secs=int(raw.get("heartbeatTimeoutSecs", defaults.heartbeat_timeout_secs)),
        election_timeout_ms=int(raw.get("electionTimeoutMillis", defaults.election_timeout_ms)),
        catch_up_timeout_ms=int(raw.get("catchUpTimeoutMillis", defaults.catch_up_timeout_ms)),
        catch_up_takeover_delay_ms=int(
            raw.get("catchUpTakeoverDelayMillis", defaults.catch_up_takeover_delay_ms)),
        get_last_error_modes=dict(raw.get("getLastErrorModes", {})),
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
    return ReplSetConfig(
        name=raw["_id"], version=int(raw.get("version", 1)), term=int(raw.get("term", default_term)),
        members=members, settings=_parse_settings(settings),
    )
