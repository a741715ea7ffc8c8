"""`replSetGetStatus`: the operator's view of the set, built from a snapshot.

Pure. Field names follow MongoDB 7.0 (`set`, `date`, `myState`, `term`,
`syncSourceHost`, `optimes`, `members[]` with `health`, `state`, `stateStr`,
`optime`, `optimeDate`, `pingMs`, `lastHeartbeat`, `self`, ...). The same document
is served as a command and as JSON over HTTP. During an initial sync (STARTUP2)
the runtime adds `initialSyncStatus` (built by `sync.initial_sync_progress`).
"""

from __future__ import annotations

__layer__ = "core"  # pure: no I/O, clock or randomness (tests/unit/test_layering.py)

import datetime
from dataclasses import dataclass, field
from typing import Any

from bson.int64 import Int64

from base.member import MemberState
from base.optime import OpTime

EPOCH = datetime.datetime.fromtimestamp(0, datetime.UTC)


@dataclass(frozen=True, slots=True)
class MemberView:
    id: int
    name: str
    is_self: bool
    health: bool
    state: MemberState
    optime: OpTime
    durable_optime: OpTime
    sync_source_host: str = ""
    sync_source_id: int = -1
    ping_ms: int | None = None
    last_heartbeat: datetime.datetime | None = None
    last_heartbeat_recv: datetime.datetime | None = None
    last_heartbeat_message: str = ""
    uptime_s: int = 0
    election_date: datetime.datetime | None = None
    config_version: int = 1
    config_term: int = 0
    info_message: str = ""  # why this member is not replicating normally (self only: too stale, ...)


@dataclass(frozen=True, slots=True)
class StatusView:
    set_name: str
    now: datetime.datetime
    state: MemberState
    term: int
    sync_source_host: str
    sync_source_id: int
    heartbeat_interval_ms: int
    majority_vote_count: int
    write_majority_count: int
    voting_members: int
    writable_voting_members: int
    commit_point: OpTime
    applied: OpTime
    durable: OpTime
    members: tuple[MemberView, ...] = field(default_factory=tuple)
    extra: dict[str, Any] = field(default_factory=dict)


def optime_date(optime: OpTime) -> datetime.datetime:
    return datetime.datetime.fromtimestamp(max(optime.secs, 0), datetime.UTC)


def _member(m: MemberView) -> dict[str, Any]:
    doc: dict[str, Any] = {"_id": m.id, "name": m.name, "health": 1.0 if m.health else 0.0,
                           "state": int(m.state), "stateStr": m.state.state_str}
    if m.is_self:
        doc["uptime"] = m.uptime_s
    doc["optime"] = m.optime.to_document()
    if not m.is_self:
        doc["optimeDurable"] = m.durable_optime.to_document()
    doc["optimeDate"] = optime_date(m.optime) if m.health else EPOCH
    if not m.is_self:
        doc["optimeDurableDate"] = optime_date(m.durable_optime) if m.health else EPOCH
        doc["lastHeartbeat"] = m.last_heartbeat or EPOCH
        doc["lastHeartbeatRecv"] = m.last_heartbeat_recv or EPOCH
        doc["pingMs"] = Int64(m.ping_ms or 0)
        doc["lastHeartbeatMessage"] = m.last_heartbeat_message
    doc["syncSourceHost"] = m.sync_source_host
    doc["syncSourceId"] = m.sync_source_id
    doc["infoMessage"] = m.info_message
    if m.election_date is not None:
        doc["electionDate"] = m.election_date
    doc["configVersion"] = m.config_version
    doc["configTerm"] = m.config_term
    if m.is_self:
        doc["self"] = True
        doc["lastHeartbeatMessage"] = ""
    return doc


def replset_status(view: StatusView) -> dict[str, Any]:
    commit = view.commit_point.to_document()
    doc: dict[str, Any] = {
        "set": view.set_name, "date": view.now, "myState": int(view.state), "term": Int64(view.term),
        "syncSourceHost": view.sync_source_host, "syncSourceId": view.sync_source_id,
        "heartbeatIntervalMillis": Int64(view.heartbeat_interval_ms),
        "majorityVoteCount": view.majority_vote_count, "writeMajorityCount": view.write_majority_count,
        "votingMembersCount": view.voting_members, "writableVotingMembersCount": view.writable_voting_members,
        "optimes": {
            "lastCommittedOpTime": commit, "lastCommittedWallTime": optime_date(view.commit_point),
            "readConcernMajorityOpTime": commit,
            "readConcernMajorityWallTime": optime_date(view.commit_point),
            "appliedOpTime": view.applied.to_document(), "durableOpTime": view.durable.to_document(),
            "lastAppliedWallTime": optime_date(view.applied), "lastDurableWallTime": optime_date(view.durable),
        },
        "members": [_member(m) for m in view.members],
    }
    doc.update(view.extra)
    return doc
