"""Rollback on a real set: a deposed primary's unreplicated writes are undone, saved to
rollback files, and every member converges to the new primary's data."""

from __future__ import annotations

import glob
import os
from typing import Any

import bson
from bson.raw_bson import RawBSONDocument
from pymongo import ASCENDING, MongoClient, ReadPreference, WriteConcern
from pymongo.database import Database

from tests.support.members import Member, wait_for
from tests.support.replica_set import ReplicaSet

W1 = WriteConcern(w=1)


def _db(rs: ReplicaSet, member: Member) -> Database[Any]:
    client = rs.direct(member)
    return client.get_database("app", read_preference=ReadPreference.SECONDARY_PREFERRED)


def _snapshot(client: MongoClient[Any]) -> dict[str, list[bytes]]:
    """Every collection of `app` as raw BSON documents in _id order."""
    db = client.get_database("app", read_preference=ReadPreference.SECONDARY_PREFERRED,
                             codec_options=bson.CodecOptions(document_class=RawBSONDocument))
    return {name: [doc.raw for doc in db[name].find().sort("_id", ASCENDING)]
            for name in sorted(db.list_collection_names())}


def _converged(clients: list[MongoClient[Any]]) -> bool:
    first, *rest = [_snapshot(c) for c in clients]
    return all(snap == first for snap in rest)


def _rbid(rs: ReplicaSet, member: Member) -> int:
    return int(rs.direct(member).admin.command("replSetGetRBID")["rbid"])


def _rollback_docs(member: Member, ns: str) -> list[dict[str, Any]]:
    docs: list[dict[str, Any]] = []
    for path in sorted(glob.glob(os.path.join(member.dbpath, "rollback", ns, "*.bson"))):
        with open(path, "rb") as f:
            docs.extend(bson.decode_file_iter(f))
    return docs


def test_deposed_primary_rolls_back_and_saves_its_unreplicated_writes(rs3: ReplicaSet) -> None:
    rs = rs3
    old = rs.wait_primary()
    others = [m for m in rs.members if m is not old]
    app = rs.client().app
    majority = WriteConcern(w="majority", wtimeout=10_000)
    app.docs.with_options(write_concern=majority).insert_many(
        [{"_id": "u", "v": 1}, {"_id": "d", "v": 1}, {"_id": "keep", "v": 1}])
    assert _rbid(rs, old) == 0

    # The secondaries stop fetching: what the primary writes now reaches no one.
    for m in others:
        rs.fail_point(m, "stopReplProducer", "alwaysOn")
    on_old = rs.direct(old).app
    on_old.docs.with_options(write_concern=W1).update_one({"_id": "u"}, {"$set": {"v": 2}})
    on_old.docs.with_options(write_concern=W1).delete_one({"_id": "d"})
    on_old.docs.with_options(write_concern=W1).insert_one({"_id": "n", "v": 1})
    on_old.fresh.with_options(write_concern=W1).insert_one({"_id": 1, "k": "x"})
    on_old.fresh.with_options(write_concern=W1).create_index("k", unique=True)

    # Depose it: one of the others wins an election in a new term and writes there.
    rs.direct(old).admin.command("replSetStepDown", 60, force=True)
    new = wait_for(lambda: (p := rs.primary()) is not None and p is not old and p, 30, "a new primary")
    other = next(m for m in others if m is not new)

    # The old primary finds its last entry missing on the new primary, and rolls back.
    wait_for(lambda: _rbid(rs, old) == 1, 30, "the old primary to roll back")
    wait_for(lambda: rs.status(old)["myState"] == 2, 30, "the old primary to be SECONDARY again")
    rs.fail_point(other, "stopReplProducer", "off")
    rs.fail_point(new, "stopReplProducer", "off")
    rs.client().app.docs.with_options(write_concern=WriteConcern(w=3, wtimeout=10_000)).insert_one(
        {"_id": "after", "v": 1})

    # Nothing of the unreplicated branch survives anywhere; the majority-written data does.
    docs = {d["_id"]: d for d in _db(rs, old).docs.find()}
    assert docs["u"]["v"] == 1 and "d" in docs and "n" not in docs and "after" in docs
    assert "fresh" not in _db(rs, old).list_collection_names()
    clients = [rs.direct(m) for m in (old, new, other)]
    try:
        wait_for(lambda: _converged(clients), 30, "all members to hold identical data")
    except TimeoutError:
        for c in clients:
            print({k: [bson.decode(b) for b in v] for k, v in _snapshot(c).items()})
        raise

    # ...but the undone writes are saved, as they were, in rollback files.
    saved = {d["_id"]: d for d in _rollback_docs(old, "app.docs")}
    assert saved["u"]["v"] == 2 and saved["n"]["v"] == 1
    assert [d["_id"] for d in _rollback_docs(old, "app.fresh")] == [1]
    assert _rbid(rs, new) == 0
    # A collection has one UUID on every member (chosen when its create entry is written).
    uuids = {c.app.command("listCollections", filter={"name": "docs"})["cursor"]["firstBatch"][0]["info"]["uuid"]
             for c in clients}
    assert len(uuids) == 1
    assert rs.status(old)["myState"] == 2
