"""A real three-member set: w:N across members, idempotent entries everywhere,
sync chains (by replSetSyncFrom and by ping), write-concern failures, roles."""

from __future__ import annotations

from typing import Any

import pytest
from motor.motor_asyncio import AsyncIOMotorClient
from pymongo import ReadPreference, WriteConcern
from pymongo.errors import NotPrimaryError, OperationFailure

from tests.support.members import wait_for
from tests.support.replica_set import ReplicaSet
from tests.support.wire import raw_command


def _docs(rs: ReplicaSet, coll: str, query: dict[str, Any]) -> list[list[dict[str, Any]]]:
    return [list(rs.direct(m).app[coll].with_options(read_preference=ReadPreference.SECONDARY_PREFERRED)
                 .find(query).sort("_id", 1)) for m in rs.members]


async def test_w3_insert_is_on_every_member_and_inc_is_logged_as_set(rs: ReplicaSet) -> None:
    client: AsyncIOMotorClient[dict[str, Any]] = AsyncIOMotorClient(rs.uri, serverSelectionTimeoutMS=10000)
    try:
        coll = client.app.events.with_options(write_concern=WriteConcern(w=3, wtimeout=5000))
        await coll.insert_one({"_id": 1, "n": 1})
        # w:3 returned, so every member has applied it: read each one directly, no waiting.
        assert _docs(rs, "events", {"_id": 1}) == [[{"_id": 1, "n": 1}]] * 3
        await coll.update_one({"_id": 1}, {"$inc": {"n": 1}})
        assert _docs(rs, "events", {"_id": 1}) == [[{"_id": 1, "n": 2}]] * 3
        for m in rs.members:
            entry = rs.direct(m).local["oplog.rs"].find_one({"ns": "app.events", "op": "u"})
            assert entry is not None and entry["o"] == {"$set": {"n": 2}}
    finally:
        client.close()


def test_status_shows_every_member_with_ping_and_sync_source(rs: ReplicaSet) -> None:
    primary = rs.wait_primary()
    for m in rs.members:
        wait_for(lambda m=m: sorted(x["stateStr"] for x in rs.status(m)["members"])
                 == ["PRIMARY", "SECONDARY", "SECONDARY"], 10, f"{m.host} to see the whole set")
        for status in (rs.status(m), rs.http_status(m)):
            assert status["set"] == "rs0"
            assert sorted(x["stateStr"] for x in status["members"]) == ["PRIMARY", "SECONDARY", "SECONDARY"]
            others = [x for x in status["members"] if not x.get("self")]
            assert all("pingMs" in x and "lastHeartbeat" in x for x in others)
            if m is not primary:
                assert status["syncSourceHost"] in {x.host for x in rs.members if x is not m}


def test_default_write_concern_is_majority_and_errors_have_mongodb_codes(rs: ReplicaSet) -> None:
    client = rs.client()
    coll = client.app.wc
    coll.insert_one({"_id": "default"})  # no write concern: {w: "majority"}
    with pytest.raises(OperationFailure) as too_many:
        coll.with_options(write_concern=WriteConcern(w=5)).insert_one({"_id": "w5"})
    assert too_many.value.code == 100
    with pytest.raises(OperationFailure) as unknown_tag:
        coll.with_options(write_concern=WriteConcern(w="nosuchtag")).insert_one({"_id": "tag"})
    assert unknown_tag.value.code == 79
    # The writes themselves happened (a write-concern error is reported next to a successful write).
    assert coll.count_documents({}) == 3


def test_secondaries_refuse_writes_and_primary_only_reads(rs: ReplicaSet) -> None:
    primary = rs.wait_primary()
    secondary = next(m for m in rs.members if m is not primary)
    direct = rs.direct(secondary)
    with pytest.raises(NotPrimaryError) as write_err:
        direct.app.roles.insert_one({"x": 1})
    assert write_err.value.details["code"] == 10107
    # A read without a non-primary read preference (pymongo always adds one on a direct connection).
    reply = raw_command(secondary.port, {"find": "roles", "$db": "app"})
    assert (reply["ok"], reply["code"], reply["codeName"]) == (0.0, 13435, "NotPrimaryNoSecondaryOk")
    rs.client().app.roles.with_options(write_concern=WriteConcern(w=3)).insert_one({"_id": "r"})
    # A fresh client: the first one marked the secondary Unknown after NotWritablePrimary.
    fresh = rs.direct(secondary)
    assert fresh.app.roles.with_options(read_preference=ReadPreference.SECONDARY).find_one() == {"_id": "r"}


def test_chain_by_sync_from_then_w3_fails_while_the_tail_is_stopped(rs: ReplicaSet) -> None:
    primary = rs.wait_primary()
    s1, s2 = [m for m in rs.members if m is not primary]
    client = rs.client()
    rs.direct(s1).admin.command("replSetSyncFrom", primary.host)
    rs.direct(s2).admin.command("replSetSyncFrom", s1.host)
    wait_for(lambda: rs.sync_source(s2) == s1.host and rs.sync_source(s1) == primary.host, 20, "the chain")
    assert rs.http_status(s2)["syncSourceHost"] == s1.host
    wait_for(lambda: {x["name"]: x["syncSourceHost"] for x in rs.status(primary)["members"]}[s2.host]
             == s1.host, 20, "the primary to see the chain in heartbeats")
    coll = client.app.chain
    coll.with_options(write_concern=WriteConcern(w=3, wtimeout=5000)).insert_one({"_id": "through-s1"})
    assert _docs(rs, "chain", {}) == [[{"_id": "through-s1"}]] * 3

    rs.check_stalled_tail(s2, coll, all_members=3, wtimeout_ms=1000)
    assert len(_docs(rs, "chain", {})[2]) == 4
