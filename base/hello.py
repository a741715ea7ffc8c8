"""The `hello` / `isMaster` reply of a replica-set member, built from a snapshot.

Pure: the runtime passes a `HelloView` (who we are, our state, the config, the
last write); this module only shapes MongoDB's reply (replication fields first,
then process fields), which drivers use to discover and classify the member.
"""

from __future__ import annotations

__layer__ = "core"  # pure: no I/O, clock or randomness (tests/unit/test_layering.py)

import datetime
from dataclasses import dataclass
from typing import Any

from bson.int64 import Int64
from bson.objectid import ObjectId

from base.config import ReplSetConfig
from base.member import MemberState
from base.optime import OpTime

MAX_BSON_OBJECT_SIZE = 16 * 1024 * 1024
MAX_MESSAGE_SIZE_BYTES = 48_000_000
MAX_WRITE_BATCH_SIZE = 100_000
MIN_WIRE_VERSION = 0
MAX_WIRE_VERSION = 21


def election_id(term: int) -> ObjectId:
    """MongoDB's electionId for protocol version 1: 7fffffff followed by the 8-byte term."""
    return ObjectId(b"\x7f\xff\xff\xff" + term.to_bytes(8, "big", signed=True))


@dataclass(frozen=True, slots=True)
class HelloView:
    me: str
    set_name: str | None
    config: ReplSetConfig | None
    state: MemberState
    term: int
    primary: str | None
    last_write: OpTime
    last_write_date: datetime.datetime
    majority_write: OpTime
    majority_write_date: datetime.datetime
    topology_process_id: ObjectId
    topology_counter: int
    connection_id: int
    now: datetime.datetime


def build_hello(view: HelloView, *, legacy: bool, hello_ok: bool,
                with_topology_version: bool) -> dict[str, Any]:
    doc: dict[str, Any] = {}
    if with_topology_version:
        doc["topologyVersion"] = {"processId": view.topology_process_id, "counter": Int64(view.topology_counter)}
    if view.config is None:
        _uninitiated(doc, legacy)
    else:
        _replica_set_fields(doc, view, legacy)
    doc.update(
        maxBsonObjectSize=MAX_BSON_OBJECT_SIZE,
        maxMessageSizeBytes=MAX_MESSAGE_SIZE_BYTES,
        maxWriteBatchSize=MAX_WRITE_BATCH_SIZE,
        localTime=view.now,
        logicalSessionTimeoutMinutes=30,
        connectionId=view.connection_id,
        minWireVersion=MIN_WIRE_VERSION,
        maxWireVersion=MAX_WIRE_VERSION,
        readOnly=False,
    )
    if hello_ok:
        doc["helloOk"] = True
    doc["ok"] = 1.0
    return doc


def _uninitiated(doc: dict[str, Any], legacy: bool) -> None:
    doc["ismaster" if legacy else "isWritablePrimary"] = False
    doc["secondary"] = False
    doc["info"] = "Does not have a valid replica set config"
    doc["isreplicaset"] = True


def _replica_set_fields(doc: dict[str, Any], view: HelloView, legacy: bool) -> None:
    config = view.config
    assert config is not None
    hosts = [m.host for m in config.members if m.electable and not m.secondary_delay_secs]
    passives = [m.host for m in config.members if not m.electable and not m.hidden and not m.arbiter_only]
    arbiters = [m.host for m in config.members if m.arbiter_only]
    me = config.member_by_host(view.me)
    doc["hosts"] = hosts
    if passives:
        doc["passives"] = passives
    if arbiters:
        doc["arbiters"] = arbiters
    doc["setName"] = config.name
    doc["setVersion"] = config.version
    is_primary = view.state is MemberState.PRIMARY
    doc["ismaster" if legacy else "isWritablePrimary"] = is_primary
    doc["secondary"] = view.state is MemberState.SECONDARY
    if view.primary:
        doc["primary"] = view.primary
    if me is not None:
        if me.hidden:
            doc["hidden"] = True
        if me.arbiter_only:
            doc["arbiterOnly"] = True
        if me.priority == 0 and not me.arbiter_only:
            doc["passive"] = True
        if me.tags:
            doc["tags"] = dict(me.tags)
    doc["me"] = view.me
    if is_primary:
        doc["electionId"] = election_id(view.term)
    doc["lastWrite"] = {
        "opTime": view.last_write.to_document(),
        "lastWriteDate": view.last_write_date,
        "majorityOpTime": view.majority_write.to_document(),
        "majorityWriteDate": view.majority_write_date,
    }
