"""The documents members exchange: heartbeats, votes, position reports, fetcher metadata.

Pure. Builders take values and return the BSON-ready document; parsers take a
reply or request document and return a frozen value, raising a `MongoError` on a
malformed one so that a bad peer gets an error answer and never crashes a member:
FailedToParse (9) for a field of the wrong type, BadValue (2) for a number that
is not an exact integer (1.5, NaN, infinity, 1e300) or is out of its field's
range (`base.numbers`), as mongod's `bsonExtractIntegerField` and IDL answer.
Every term is checked against `MAX_TERM`: a term nobody could follow must never
get into a member. Field names are MongoDB's (`replSetHeartbeat`,
`replSetRequestVotes`, `replSetUpdatePosition`, `$replData`).
"""

from __future__ import annotations

__layer__ = "core"  # pure: no I/O, clock or randomness (tests/unit/test_layering.py)

import datetime
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from bson.int64 import Int64

from base.errors import MongoError
from base.member import MemberState
from base.numbers import (
    MAX_CONFIG_VERSION,
    MAX_MEMBER_ID,
    MAX_TERM,
    UNINITIALIZED_CONFIG_VERSION,
    UNINITIALIZED_TERM,
    int_in_range,
)
from base.optime import NULL_OPTIME, OpTime
from base.votes import VoteRequest, VoteResponse


def _optime(raw: Any) -> OpTime:
    if not isinstance(raw, Mapping) or "ts" not in raw:
        return NULL_OPTIME
    return OpTime.from_document(raw)  # MongoError (9 or 2) on a bad ts or t


def _wall(optime: OpTime) -> datetime.datetime:
    return datetime.datetime.fromtimestamp(max(optime.secs, 0), datetime.UTC)


def _int(doc: Mapping[str, Any], field: str, default: int, low: int, high: int) -> int:
    """An integer field in `[low, high]` (the default when absent)."""
    if field not in doc:
        return default
    return int_in_range(doc[field], field, low, high, type_code=9)


def _term(doc: Mapping[str, Any], field: str = "term") -> int:
    return _int(doc, field, UNINITIALIZED_TERM, UNINITIALIZED_TERM, MAX_TERM)


def _config_version(doc: Mapping[str, Any], field: str, default: int = UNINITIALIZED_CONFIG_VERSION) -> int:
    return _int(doc, field, default, UNINITIALIZED_CONFIG_VERSION, MAX_CONFIG_VERSION)


def _member_id(doc: Mapping[str, Any], field: str) -> int:
    return _int(doc, field, -1, -1, MAX_MEMBER_ID)


# -- heartbeats ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class HeartbeatRequest:
    set_name: str
    config_version: int
    config_term: int
    sender_host: str
    sender_id: int
    term: int


def heartbeat_request(req: HeartbeatRequest) -> dict[str, Any]:
    return {"replSetHeartbeat": req.set_name, "configVersion": req.config_version,
            "configTerm": req.config_term, "hbv": 1, "from": req.sender_host, "fromId": req.sender_id,
            "term": Int64(req.term), "$db": "admin"}


def parse_heartbeat_request(cmd: Mapping[str, Any]) -> HeartbeatRequest:
    name = cmd.get("replSetHeartbeat")
    if not isinstance(name, str):
        raise MongoError(9, "replSetHeartbeat needs the set name")
    sender = cmd.get("from", "")
    return HeartbeatRequest(set_name=name, config_version=_config_version(cmd, "configVersion"),
                            config_term=_term(cmd, "configTerm"),
                            sender_host=sender if isinstance(sender, str) else "",
                            sender_id=_member_id(cmd, "fromId"), term=_term(cmd))


@dataclass(frozen=True, slots=True)
class HeartbeatReply:
    set_name: str
    state: MemberState
    term: int
    applied: OpTime
    durable: OpTime
    config_version: int
    config_term: int
    sync_source: str
    commit_point: OpTime
    primary_id: int
    election_date: datetime.datetime | None = None
    config: Mapping[str, Any] | None = None


def heartbeat_reply(reply: HeartbeatReply) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "ok": 1.0, "set": reply.set_name, "state": int(reply.state), "term": Int64(reply.term),
        "opTime": reply.applied.to_document(), "wallTime": _wall(reply.applied),
        "durableOpTime": reply.durable.to_document(), "durableWallTime": _wall(reply.durable),
        "v": reply.config_version, "configVersion": reply.config_version, "configTerm": reply.config_term,
        "syncingTo": reply.sync_source, "primaryId": reply.primary_id,
        "$replData": {"term": Int64(reply.term),
                      "lastOpCommitted": {"opTime": reply.commit_point.to_document(),
                                          "wallTime": _wall(reply.commit_point)},
                      "configVersion": reply.config_version, "configTerm": reply.config_term,
                      "primaryIndex": reply.primary_id},
    }
    if reply.election_date is not None:
        doc["electionDate"] = reply.election_date
    if reply.config is not None:
        doc["config"] = dict(reply.config)
    return doc


def parse_heartbeat_reply(doc: Mapping[str, Any]) -> HeartbeatReply:
    try:
        state = MemberState(_int(doc, "state", int(MemberState.UNKNOWN), 0, max(MemberState)))
    except ValueError as exc:
        raise MongoError(9, f"bad member state {doc.get('state')!r}") from exc
    repl_data = doc.get("$replData")
    committed = repl_data.get("lastOpCommitted") if isinstance(repl_data, Mapping) else None
    config = doc.get("config")
    election_date = doc.get("electionDate")
    return HeartbeatReply(
        set_name=str(doc.get("set", "")), state=state, term=_term(doc),
        applied=_optime(doc.get("opTime")), durable=_optime(doc.get("durableOpTime")),
        config_version=_config_version(doc, "configVersion", _config_version(doc, "v")),
        config_term=_term(doc, "configTerm"), sync_source=str(doc.get("syncingTo", "")),
        commit_point=_optime(committed.get("opTime")) if isinstance(committed, Mapping) else NULL_OPTIME,
        primary_id=_member_id(doc, "primaryId"),
        election_date=election_date if isinstance(election_date, datetime.datetime) else None,
        config=config if isinstance(config, Mapping) else None,
    )


# -- votes ----------------------------------------------------------------------------------------


def vote_request(req: VoteRequest) -> dict[str, Any]:
    return {"replSetRequestVotes": 1, "setName": req.set_name, "dryRun": req.dry_run,
            "term": Int64(req.term), "candidateIndex": req.candidate_id, "configVersion": req.config_version,
            "configTerm": req.config_term, "lastAppliedOpTime": req.last_applied.to_document(),
            "$db": "admin"}


def parse_vote_request(cmd: Mapping[str, Any]) -> VoteRequest:
    name = cmd.get("setName")
    if not isinstance(name, str):
        raise MongoError(9, "replSetRequestVotes needs setName")
    return VoteRequest(set_name=name, dry_run=bool(cmd.get("dryRun", False)), term=_term(cmd),
                       candidate_id=_member_id(cmd, "candidateIndex"),
                       config_version=_config_version(cmd, "configVersion"), config_term=_term(cmd, "configTerm"),
                       last_applied=_optime(cmd.get("lastAppliedOpTime")))


def vote_reply(resp: VoteResponse) -> dict[str, Any]:
    return {"term": Int64(resp.term), "voteGranted": resp.vote_granted, "reason": resp.reason, "ok": 1.0}


def parse_vote_reply(doc: Mapping[str, Any]) -> VoteResponse:
    return VoteResponse(term=_term(doc), vote_granted=bool(doc.get("voteGranted", False)),
                        reason=str(doc.get("reason", "")))


# -- positions ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class MemberPosition:
    member_id: int
    applied: OpTime
    durable: OpTime
    config_version: int


# A fetcher's getMore on the oplog carries the same report under this field: one message a batch
# instead of a getMore and a replSetUpdatePosition (`sync.worker`).
POSITIONS_FIELD = "$replPositions"


def position_report(positions: Iterable[MemberPosition], term: int) -> dict[str, Any]:
    """The body of a position report: `optimes` and the sender's term."""
    return {"optimes": [
        {"appliedOpTime": p.applied.to_document(), "appliedWallTime": _wall(p.applied),
         "durableOpTime": p.durable.to_document(), "durableWallTime": _wall(p.durable),
         "memberId": p.member_id, "cfgver": p.config_version}
        for p in positions
    ], "$replData": {"term": Int64(term)}}


def update_position_command(positions: Iterable[MemberPosition], term: int) -> dict[str, Any]:
    return {"replSetUpdatePosition": 1, **position_report(positions, term), "$db": "admin"}


def parse_update_position(cmd: Mapping[str, Any]) -> tuple[list[MemberPosition], int]:
    optimes = cmd.get("optimes")
    if not isinstance(optimes, list):
        raise MongoError(9, "replSetUpdatePosition needs an optimes array")
    positions = []
    for raw in optimes:
        if not isinstance(raw, Mapping):
            raise MongoError(9, "each replSetUpdatePosition entry must be an object")
        positions.append(MemberPosition(member_id=_member_id(raw, "memberId"),
                                        applied=_optime(raw.get("appliedOpTime")),
                                        durable=_optime(raw.get("durableOpTime")),
                                        config_version=_config_version(raw, "cfgver", -1)))
    repl_data = cmd.get("$replData")
    term = _term(repl_data) if isinstance(repl_data, Mapping) else UNINITIALIZED_TERM
    return positions, term


# -- fetcher metadata -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ReplMetadata:
    term: int
    commit_point: OpTime
    primary_id: int


def repl_metadata(meta: ReplMetadata, config_version: int, config_term: int) -> dict[str, Any]:
    return {"term": Int64(meta.term),
            "lastOpCommitted": {"opTime": meta.commit_point.to_document(), "wallTime": _wall(meta.commit_point)},
            "configVersion": config_version, "configTerm": config_term, "primaryIndex": meta.primary_id}


def parse_repl_metadata(doc: Mapping[str, Any]) -> ReplMetadata | None:
    raw = doc.get("$replData")
    if not isinstance(raw, Mapping):
        return None
    committed = raw.get("lastOpCommitted")
    return ReplMetadata(term=_term(raw),
                        commit_point=_optime(committed.get("opTime")) if isinstance(committed, Mapping)
                        else NULL_OPTIME,
                        primary_id=_member_id(raw, "primaryIndex"))
