"""Multi-document transactions through pymongo on a real three-member set: `with_transaction`
transfers under 16 concurrent clients keep the total (and read-only transactions see it whole, at
every moment); a transaction is one oplog entry, invisible until committed; a second writer of the
same document gets WriteConflict with TransientTransactionError; a stepdown aborts an open
transaction and leaves nothing; a commit retried after a failover finds its outcome; a transaction
that outlives `transactionLifetimeLimitSeconds` is aborted."""

from __future__ import annotations

import random
import threading
from typing import Any

import pytest
from bson.int64 import Int64
from bson.raw_bson import RawBSONDocument
from pymongo import MongoClient, ReadPreference
from pymongo.errors import OperationFailure, PyMongoError
from pymongo.write_concern import WriteConcern

from tests.support.members import wait_for
from tests.support.replica_set import ReplicaSet
from tests.support.wire import raw_command

ACCOUNTS = 10
START_BALANCE = 1000


def _raw_docs(rs: ReplicaSet, db: str, coll: str) -> dict[str, list[bytes]]:
    out = {}
    for m in rs.members:
        with MongoClient(f"mongodb://{m.host}/?directConnection=true", document_class=RawBSONDocument,
                         read_preference=ReadPreference.SECONDARY_PREFERRED) as c:
            out[m.host] = [d.raw for d in c[db][coll].find().sort("_id", 1)]
    return out


def _same_everywhere(rs: ReplicaSet, db: str, coll: str) -> dict[str, list[bytes]]:
    rs.client()[db].barrier.with_options(write_concern=WriteConcern(w=3, wtimeout=30000)).insert_one({})
    docs = _raw_docs(rs, db, coll)
    first = next(iter(docs.values()))
    assert all(d == first for d in docs.values()), "members differ"
    return docs


def test_transfers_under_16_clients_keep_the_total_on_every_member(rs: ReplicaSet) -> None:
    client = rs.client(maxPoolSize=32)
    accounts = client.bank.get_collection("accounts", write_concern=WriteConcern(w="majority"))
    accounts.drop()
    accounts.insert_many([{"_id": i, "balance": START_BALANCE} for i in range(ACCOUNTS)])
    total = ACCOUNTS * START_BALANCE
    errors: list[BaseException] = []
    seen_totals: list[int] = []
    stop = threading.Event()

    def transfers(seed: int) -> None:
        rng = random.Random(seed)
        try:
            for _ in range(15):
                a, b = rng.sample(range(ACCOUNTS), 2)
                amount = rng.randint(1, 50)

                def move(session: Any, a: int = a, b: int = b, amount: int = amount) -> None:
                    source = accounts.find_one({"_id": a}, session=session)
                    assert source is not None
                    accounts.update_one({"_id": a}, {"$set": {"balance": source["balance"] - amount}},
                                        session=session)
                    accounts.update_one({"_id": b}, {"$inc": {"balance": amount}}, session=session)

                with client.start_session() as session:
                    session.with_transaction(move)
        except BaseException as exc:
            errors.append(exc)

    def audits() -> None:
        try:
            while not stop.is_set():
                with client.start_session() as session, session.start_transaction():
                    seen_totals.append(sum(d["balance"] for d in accounts.find({}, session=session)))
        except BaseException as exc:
            errors.append(exc)

    writers = [threading.Thread(target=transfers, args=(i,)) for i in range(16)]
    auditor = threading.Thread(target=audits)
    auditor.start()
    for t in writers:
        t.start()
    for t in writers:
        t.join(300)
    stop.set()
    auditor.join(60)
    assert not errors, errors[:3]
    assert seen_totals and set(seen_totals) == {total}, sorted(set(seen_totals))[:5]
    docs = _same_everywhere(rs, "bank", "accounts")
    assert len(next(iter(docs.values()))) == ACCOUNTS
    assert sum(d["balance"] for d in accounts.find()) == total


def test_a_transaction_is_one_entry_invisible_until_committed(rs: ReplicaSet) -> None:
    client = rs.client()
    coll = client.txn.orders
    coll.drop()
    with client.start_session() as session:
        session.start_transaction()
        coll.insert_one({"_id": 1}, session=session)
        coll.insert_one({"_id": 2}, session=session)
        coll.update_one({"_id": 1}, {"$set": {"paid": True}}, session=session)
        assert coll.count_documents({}, session=session) == 2
        # Every read path sees the transaction's writes: a filtered find, a hinted one, distinct, aggregate.
        assert [d["_id"] for d in coll.find({"paid": True}, session=session)] == [1]
        assert [d["_id"] for d in coll.find({}, session=session).hint("_id_")] == [1, 2]
        assert [d["_id"] for d in coll.find({}, session=session).hint([("$natural", -1)])] == [2, 1]
        assert coll.distinct("paid", session=session) == [True]
        assert list(coll.aggregate([{"$match": {"_id": 2}}], session=session)) == [{"_id": 2}]
        assert coll.find_one({"_id": 1}) is None, "an uncommitted write is visible outside"
        session.commit_transaction()
    assert list(coll.find().sort("_id", 1)) == [{"_id": 1, "paid": True}, {"_id": 2}]
    entry = client.local["oplog.rs"].find_one({"o.applyOps.ns": "txn.orders"}, sort=[("$natural", -1)])
    assert entry is not None and entry["op"] == "c"
    writes = [op for op in entry["o"]["applyOps"] if op["ns"] == "txn.orders"]
    assert [op["op"] for op in writes] == ["i", "i", "u"]
    assert _same_everywhere(rs, "txn", "orders")


def test_an_aborted_transaction_leaves_nothing(rs: ReplicaSet) -> None:
    client = rs.client()
    coll = client.txn.aborted
    coll.drop()
    with client.start_session() as session:
        session.start_transaction()
        coll.insert_one({"_id": "never"}, session=session)
        session.abort_transaction()
    assert coll.find_one({"_id": "never"}) is None
    with client.start_session() as session:
        session.start_transaction()
        coll.insert_one({"_id": "dup"}, session=session)
        with pytest.raises(OperationFailure) as failed:
            coll.insert_one({"_id": "dup"}, session=session)  # a write error aborts the transaction
        assert failed.value.code == 11000
        with pytest.raises(OperationFailure) as gone:
            session.commit_transaction()
        assert gone.value.code == 251 and gone.value.has_error_label("TransientTransactionError")
    assert coll.count_documents({}) == 0


def test_internal_databases_and_other_commands_are_refused_in_a_transaction(rs: ReplicaSet) -> None:
    client = rs.client()
    with client.start_session() as session:
        session.start_transaction()
        with pytest.raises(OperationFailure) as local:
            client.local.scratch.insert_one({"_id": 1}, session=session)
        assert local.value.code == 263
    with client.start_session() as session:
        session.start_transaction()
        with pytest.raises(OperationFailure) as count:
            client.txn.orders.database.command("count", "orders", session=session)
        assert count.value.code == 263


def test_the_second_writer_of_a_document_gets_a_write_conflict(rs: ReplicaSet) -> None:
    client = rs.client()
    coll = client.txn.conflicts
    coll.drop()
    coll.insert_one({"_id": 1, "n": 0})
    with client.start_session() as first, client.start_session() as second:
        first.start_transaction()
        coll.update_one({"_id": 1}, {"$inc": {"n": 1}}, session=first)
        second.start_transaction()
        with pytest.raises(OperationFailure) as conflict:
            coll.update_one({"_id": 1}, {"$inc": {"n": 10}}, session=second)
        assert conflict.value.code == 112 and conflict.value.has_error_label("TransientTransactionError")
        first.commit_transaction()
    # A write outside any transaction after the snapshot: the transaction's commit fails.
    with client.start_session() as session:
        session.start_transaction()
        coll.update_one({"_id": 1}, {"$inc": {"n": 100}}, session=session)
        coll.update_one({"_id": 1}, {"$set": {"outside": True}})
        with pytest.raises(OperationFailure) as late:
            session.commit_transaction()
        assert late.value.code == 112 and late.value.has_error_label("TransientTransactionError")
    assert coll.find_one({"_id": 1}) == {"_id": 1, "n": 1, "outside": True}


def test_a_stepdown_aborts_an_open_transaction(rs3: ReplicaSet) -> None:
    client = rs3.client()
    coll = client.txn.stepdown
    coll.insert_one({"_id": "before"}, )
    old = rs3.wait_primary()
    with client.start_session() as session:
        session.start_transaction()
        coll.insert_one({"_id": "inside"}, session=session)
        rs3.direct(old).admin.command("replSetStepDown", 30, force=True)
        wait_for(lambda: (p := rs3.primary()) is not None and p is not old, 60, "a new primary")
        with pytest.raises(PyMongoError) as failed:
            session.commit_transaction()
        assert failed.value.has_error_label("TransientTransactionError") or getattr(
            failed.value, "code", None) == 251
    assert coll.find_one({"_id": "inside"}) is None
    assert _same_everywhere(rs3, "txn", "stepdown")


def test_a_commit_retried_after_a_failover_finds_its_outcome(rs3: ReplicaSet) -> None:
    client = rs3.client()
    coll = client.txn.retried
    coll.insert_one({"_id": 0})
    with client.start_session() as session:
        session.start_transaction(write_concern=WriteConcern(w=3))
        coll.insert_one({"_id": 1}, session=session)
        session.commit_transaction()
        lsid, number = session.session_id, session._transaction_id  # type: ignore[attr-defined]
    old = rs3.wait_primary()
    rs3.direct(old).admin.command("replSetStepDown", 30, force=True)
    new = wait_for(lambda: (p := rs3.primary()) is not None and p is not old and p, 60, "a new primary")
    commit = {"commitTransaction": 1, "lsid": lsid, "txnNumber": Int64(number), "autocommit": False,
              "$db": "admin"}
    assert raw_command(new.port, commit)["ok"] == 1.0
    later = raw_command(new.port, {"insert": "retried", "documents": [{"_id": 2}], "lsid": lsid,
                                   "txnNumber": Int64(number), "autocommit": False, "$db": "txn"})
    assert later["code"] == 256  # that transaction committed: it takes no more statements
    assert coll.count_documents({}) == 2


def test_a_transaction_past_its_lifetime_is_aborted(rs: ReplicaSet) -> None:
    client = rs.client()
    primary = rs.direct(rs.wait_primary())
    was = primary.admin.command("setParameter", 1, transactionLifetimeLimitSeconds=1)["was"]
    coll = client.txn.lifetime
    try:
        with client.start_session() as session:
            session.start_transaction()
            coll.insert_one({"_id": 1}, session=session)

            def aborted() -> bool:
                try:
                    coll.find_one({}, session=session)
                except OperationFailure as err:
                    return err.code == 251
                return False

            wait_for(aborted, 30, "the transaction to be aborted")
            with pytest.raises(OperationFailure):
                session.commit_transaction()
    finally:
        primary.admin.command("setParameter", 1, transactionLifetimeLimitSeconds=was)
    assert coll.find_one({"_id": 1}) is None
