"""Clients cannot change the replication log or the member's own records: every protected namespace by
every changing command gets mongod's code, reads stay allowed, and other `local` collections stay
writable (and unreplicated)."""

from __future__ import annotations

from typing import Any

import pytest
from pymongo.errors import OperationFailure

from tests.support.members import Member

PROTECTED = [
    "local.oplog.rs",
    "local.system.replset",
    "local.system.rollback.docs",
    "local.replset.election",
    "config.transactions",
    "admin.system.version",
    "admin.system.keys",
    "admin.system.users",
    "admin.system.roles",
    "analytics.system.parts",
    "analytics.system.parts.events.log",
]


def _commands(ns: str) -> dict[str, tuple[str, dict[str, Any]]]:
    """Operation name -> (database to run it on, command document)."""
    db, coll = ns.split(".", 1)
    return {
        "insert": (db, {"insert": coll, "documents": [{"_id": "x", "op": "n"}]}),
        "update": (db, {"update": coll, "updates": [{"q": {}, "u": {"$set": {"a": 1}}, "multi": True}]}),
        "delete": (db, {"delete": coll, "deletes": [{"q": {}, "limit": 0}]}),
        "findAndModify": (db, {"findAndModify": coll, "query": {}, "remove": True}),
        "createIndexes": (db, {"createIndexes": coll, "indexes": [{"key": {"a": 1}, "name": "a_1"}]}),
        "dropIndexes": (db, {"dropIndexes": coll, "index": "*"}),
        "create": (db, {"create": coll}),
        "drop": (db, {"drop": coll}),
        "renameFrom": ("admin", {"renameCollection": ns, "to": f"{db}.renamed"}),
        "renameTo": ("admin", {"renameCollection": f"{db}.scratch_source", "to": ns}),
    }


def _expected(ns: str, op: str) -> int:
    if op == "drop":
        return 5255000 if ns == "local.oplog.rs" else 20  # can't drop live oplog / system collection
    if op in ("renameFrom", "renameTo"):
        return 20  # IllegalOperation
    return 73  # InvalidNamespace: "cannot write to <ns>"


TABLE = [(ns, op) for ns in PROTECTED for op in _commands(ns)]


def _run(member: Member, db: str, cmd: dict[str, Any]) -> dict[str, Any]:
    with member.direct_client() as client:
        try:
            return client[db].command(cmd)
        except OperationFailure as exc:
            return exc.details or {"ok": 0, "code": exc.code}


def _oplog_count(member: Member) -> int:
    with member.direct_client() as client:
        return client.local["oplog.rs"].count_documents({})


@pytest.mark.parametrize(("ns", "op"), TABLE, ids=[f"{ns}-{op}" for ns, op in TABLE])
def test_protected_namespace_refuses_change(member: Member, ns: str, op: str) -> None:
    db, cmd = _commands(ns)[op]
    reply = _run(member, db, cmd)
    assert reply.get("ok") == 0, reply
    assert reply.get("code") == _expected(ns, op), reply


def test_protected_namespaces_stay_readable_and_the_oplog_intact(member: Member) -> None:
    with member.direct_client() as client:
        client.test.probe.insert_one({"_id": 1})
        before = _oplog_count(member)
        for ns in PROTECTED:
            db, coll = ns.split(".", 1)
            client[db].command({"find": coll, "filter": {}, "limit": 1})
        assert _oplog_count(member) == before
        # The log still takes new writes after every refused command (a retryable write logs its
        # session record too).
        client.test.probe.insert_one({"_id": 2})
        assert client.local["oplog.rs"].find_one({"ns": "test.probe", "o._id": 2}) is not None
        assert _oplog_count(member) > before
        assert client.local.system.replset.find_one() is not None


def test_drop_of_system_databases_is_refused(member: Member) -> None:
    for db in ("local", "admin", "config"):
        reply = _run(member, db, {"dropDatabase": 1})
        assert reply.get("code") == 20, reply


def test_other_local_collections_stay_writable_and_unreplicated(member: Member) -> None:
    before = _oplog_count(member)
    with member.direct_client() as client:
        scratch = client.local.scratch
        scratch.insert_one({"_id": 1, "a": 1})
        scratch.update_one({"_id": 1}, {"$set": {"a": 2}})
        assert scratch.find_one({"_id": 1}) == {"_id": 1, "a": 2}
        scratch.create_index("a")
        client.admin.command({"renameCollection": "local.scratch", "to": "local.scratch2"})
        assert client.local.scratch2.count_documents({}) == 1
        scratch2 = client.local.scratch2
        scratch2.delete_one({"_id": 1})
        scratch2.drop()
    assert _oplog_count(member) == before


def test_rename_collection_replicates_within_a_database(member: Member) -> None:
    with member.direct_client() as client:
        client.test.rename_a.insert_one({"_id": 1})
        client.admin.command({"renameCollection": "test.rename_a", "to": "test.rename_b"})
        assert client.test.rename_b.find_one() == {"_id": 1}
        assert "rename_a" not in client.test.list_collection_names()
        entry = client.local["oplog.rs"].find_one({"o.renameCollection": "test.rename_a"})
        assert entry is not None and entry["o"]["to"] == "test.rename_b"
        reply = _run(member, "admin", {"renameCollection": "test.missing", "to": "test.other"})
        assert reply.get("code") == 26, reply
