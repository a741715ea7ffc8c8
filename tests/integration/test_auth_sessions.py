"""Sessions, cursors, transactions and read snapshots belong to the user that made them, on a real set
started with `replset up --auth`: a `read` user and a `readWrite` user of database A beside root. Neither
sees, ends, kills, commits nor aborts root's session, transaction or cursor (13, or left alone as mongod
leaves them), and root's transaction then commits whole. Limits are per user and refuse the one who hits
them: the user past its share of open cursors, transactions or snapshots is refused (96) while root's
cursor still answers and root's next transaction commits. The shares are set small through
`setParameter` so the test stays fast."""

from __future__ import annotations

import hashlib
import socket
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from bson.binary import Binary
from bson.int64 import Int64
from pymongo import MongoClient
from pymongo.errors import OperationFailure
from pymongo.write_concern import WriteConcern

from base.codec import encode_op_msg_request
from base.scram import SHA256, client_exchange
from tests.support.up_process import running_up
from tests.support.wire import roundtrip

ROOT = ("admin", "root pass")
READER = ("reader", "reader pass")  # read on A, defined on A: "reader@A"
WRITER = ("writer", "writer pass")  # readWrite on A: "writer@A"


@pytest.fixture(scope="module")
def auth_set(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    directory = str(tmp_path_factory.mktemp("authsessions"))
    with running_up(directory, extra_args=("--auth", "--user", ROOT[0], "--password", ROOT[1])) as (ports, _out):
        uri = f"mongodb://{','.join(f'127.0.0.1:{p}' for p in ports)}/?replicaSet=rs0"
        with MongoClient(uri, username=ROOT[0], password=ROOT[1], serverSelectionTimeoutMS=20_000) as root:
            for name, pwd in (READER, WRITER):
                role = "read" if name == READER[0] else "readWrite"
                root.A.command("createUser", name, pwd=pwd, roles=[role])
            root.A.many.insert_many([{"_id": i} for i in range(20)])
            yield {"uri": uri, "ports": ports, "root": root}


def _client(auth_set: dict[str, Any], user: tuple[str, str], source: str = "A") -> MongoClient[dict[str, Any]]:
    return MongoClient(auth_set["uri"], username=user[0], password=user[1], authSource=source,
                       serverSelectionTimeoutMS=20_000)


@contextmanager
def _raw(port: int, user: tuple[str, str]) -> Iterator[Any]:
    """A connection logged in as `user` (of A) that sends commands exactly as given: no session of its
    own, any lsid the test puts in them."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        def send(body: dict[str, Any]) -> dict[str, Any]:
            return roundtrip(sock, encode_op_msg_request(body, 1))

        scram = client_exchange(SHA256, user[0], user[1])
        first = send({"saslStart": 1, "mechanism": SHA256, "payload": Binary(scram.get_client_first().encode()),
                      "$db": "A"})
        scram.set_server_first(bytes(first["payload"]).decode())
        final = send({"saslContinue": 1, "conversationId": first["conversationId"],
                      "payload": Binary(scram.get_client_final().encode()), "$db": "A"})
        assert final["ok"] == 1.0, final
        yield send


def _primary_port(auth_set: dict[str, Any]) -> int:
    return int(auth_set["root"].primary[1])


def _uid(name: str) -> bytes:
    """mongod's digest of a user's sessions (pymongo reads a subtype-0 binary as bytes)."""
    return hashlib.sha256(name.encode()).digest()


@contextmanager
def _shares(auth_set: dict[str, Any], **small: int) -> Iterator[None]:
    """Sets per-user shares on the primary for the block, then puts back what was there."""
    admin = auth_set["root"].admin
    was = {name: admin.command("setParameter", 1, **{name: value})["was"] for name, value in small.items()}
    try:
        yield
    finally:
        for name, value in was.items():
            admin.command("setParameter", 1, **{name: value})


def test_another_users_transaction_is_out_of_reach_and_commits_whole(auth_set: dict[str, Any]) -> None:
    root = auth_set["root"]
    with root.start_session() as session:
        session.start_transaction()
        root.A.txn.insert_one({"_id": "first"}, session=session)
        lsid, number = session.session_id, Int64(session._transaction_id)  # type: ignore[attr-defined]
        in_txn = {"lsid": lsid, "txnNumber": number, "autocommit": False}
        for user in (READER, WRITER):
            with _raw(_primary_port(auth_set), user) as send:
                for command in ({"commitTransaction": 1, "$db": "admin"}, {"abortTransaction": 1, "$db": "admin"},
                                {"find": "txn", "$db": "A"}, {"insert": "txn", "documents": [{"_id": "evil"}],
                                                              "$db": "A"}):
                    refused = send({**command, **in_txn})
                    assert refused["code"] == 13, (user, command, refused)
                mismatch = send({"find": "many", "lsid": lsid, "$db": "A"})
                assert mismatch["code"] == 13 and "Users mismatch" in mismatch["errmsg"]
                # Naming root's digest on a session of one's own is refused too.
                spoofed = send({"find": "many", "lsid": {"id": Binary(uuid.uuid4().bytes, 4), "uid": _uid("admin@admin")},
                                "$db": "A"})
                assert spoofed["code"] == 13
                # endSessions / killSessions leave root's session alone (as mongod: not the caller's)...
                assert send({"endSessions": [lsid], "$db": "admin"})["ok"] == 1.0
                assert send({"killSessions": [lsid], "$db": "admin"})["ok"] == 1.0
                # ...and naming its digest, or killing everybody's, is refused.
                by_uid = send({"killSessions": [{**lsid, "uid": _uid("admin@admin")}], "$db": "admin"})
                assert by_uid["code"] == 13
                assert send({"killAllSessions": [], "$db": "admin"})["code"] == 13
        root.A.txn.insert_one({"_id": "second"}, session=session)
        session.commit_transaction()
    assert sorted(d["_id"] for d in root.A.txn.find()) == ["first", "second"]


def test_list_local_sessions_shows_ones_own_unless_allowed(auth_set: dict[str, Any]) -> None:
    root = auth_set["root"]
    with _client(auth_set, READER) as reader, reader.start_session() as mine, root.start_session() as roots:
        reader.A.many.find_one({}, session=mine)
        root.A.many.find_one({}, session=roots)
        listed = list(reader.A.aggregate([{"$listLocalSessions": {}}]))
        assert mine.session_id["id"] in [s["_id"]["id"] for s in listed]
        assert roots.session_id["id"] not in [s["_id"]["id"] for s in listed]
        assert {s["_id"]["uid"] for s in listed} == {_uid("reader@A")}
        assert {s["user"]["name"] for s in listed} == {"reader@A"}
        for spec in ({"allUsers": True}, {"users": [{"user": "admin", "db": "admin"}]}):
            with pytest.raises(OperationFailure) as refused:
                list(reader.A.aggregate([{"$listLocalSessions": spec}]))
            assert refused.value.code == 13
        every = {s["_id"]["id"]: s for s in root.admin.aggregate([{"$listLocalSessions": {"allUsers": True}}])}
        assert every[mine.session_id["id"]]["_id"]["uid"] == _uid("reader@A")
        assert every[roots.session_id["id"]]["_id"]["uid"] == _uid("admin@admin")


def test_cursors_are_their_users_and_counted_per_user(auth_set: dict[str, Any]) -> None:
    root = auth_set["root"]
    roots = root.A.many.find(batch_size=1)
    assert next(roots)["_id"] == 0
    cursor_id = Int64(roots.cursor_id)
    with _raw(_primary_port(auth_set), READER) as send:
        assert send({"getMore": cursor_id, "collection": "many", "$db": "A"})["code"] == 13
        assert send({"killCursors": "many", "cursors": [cursor_id], "$db": "A"})["code"] == 13
    with _shares(auth_set, maxOpenCursorsPerUser=3), _client(auth_set, READER) as reader:
        opened = []
        for _ in range(3):
            opened.append(reader.A.many.find(batch_size=1))
            next(opened[-1])
        with pytest.raises(OperationFailure) as refused:
            next(reader.A.many.find(batch_size=1))
        assert refused.value.code == 96 and "maxOpenCursorsPerUser" in str(refused.value)
        assert next(roots)["_id"] == 1  # root's cursor is still there and answers
        with _client(auth_set, WRITER) as writer:
            assert next(writer.A.many.find(batch_size=1))["_id"] == 0  # another user is not refused
        opened.pop().close()
        next(reader.A.many.find(batch_size=1))  # a place given back is free again
        # The members' own cursors are apart: the set still replicates.
        root.A.get_collection("majority", write_concern=WriteConcern(w="majority", wtimeout=20_000)).insert_one({})
    assert [d["_id"] for d in roots] == list(range(2, 20))


def test_open_transactions_are_counted_per_user(auth_set: dict[str, Any]) -> None:
    root = auth_set["root"]
    with _shares(auth_set, maxOpenTransactionsPerUser=2), _client(auth_set, WRITER) as writer:
        sessions = [writer.start_session() for _ in range(3)]
        try:
            for i, session in enumerate(sessions[:2]):
                session.start_transaction()
                writer.A.shares.insert_one({"_id": f"w{i}"}, session=session)
            sessions[2].start_transaction()
            with pytest.raises(OperationFailure) as refused:
                writer.A.shares.insert_one({"_id": "w2"}, session=sessions[2])
            assert refused.value.code == 96 and "maxOpenTransactionsPerUser" in str(refused.value)
            sessions[2].abort_transaction()
            with root.start_session() as session:  # root's next transaction is not refused
                session.start_transaction()
                root.A.shares.insert_one({"_id": "root"}, session=session)
                session.commit_transaction()
            sessions[0].commit_transaction()  # ended: its place is free again
            sessions[2].start_transaction()
            writer.A.shares.insert_one({"_id": "w2"}, session=sessions[2])
            sessions[2].commit_transaction()
        finally:
            for session in sessions:
                session.end_session()
    assert sorted(d["_id"] for d in root.A.shares.find()) == ["root", "w0", "w2"]


def test_read_snapshots_are_bounded_per_user(auth_set: dict[str, Any]) -> None:
    root = auth_set["root"]
    root.A.command({"createPartsTable": "events", "columns": [{"name": "k", "type": "int64"}], "orderBy": ["k"]})
    with _client(auth_set, READER) as reader:
        with pytest.raises(OperationFailure) as too_long:
            reader.A.command({"openPartsSnapshot": "events", "key": "long", "ttlSecs": 86_401})
        assert too_long.value.code == 2
        with pytest.raises(OperationFailure) as named:
            reader.A.command({"openPartsSnapshot": "events", "key": "mine", "owner": "admin@admin"})
        assert named.value.code == 13  # only a member may say whose a snapshot is
        with _shares(auth_set, maxPartsSnapshotsPerUser=2):
            assert reader.A.command({"openPartsSnapshot": "events", "key": "q1", "ttlSecs": 60})["ok"] == 1.0
            # Through a secondary (forwarded to the primary): still the reader's.
            secondary = next(p for p in auth_set["ports"] if p != _primary_port(auth_set))
            with MongoClient(f"mongodb://127.0.0.1:{secondary}/?directConnection=true", username=READER[0],
                             password=READER[1], authSource="A") as direct:
                snapshot = direct.A.command({"openPartsSnapshot": "events", "key": "q2", "ttlSecs": 60})
                assert snapshot["snapshot"]["owner"] == "reader@A"
            with pytest.raises(OperationFailure) as refused:
                reader.A.command({"openPartsSnapshot": "events", "key": "q3", "ttlSecs": 60})
            assert refused.value.code == 96 and "maxPartsSnapshotsPerUser" in str(refused.value)
            assert reader.A.command({"openPartsSnapshot": "events", "key": "q1"})["ok"] == 1.0  # (its own, again)
            assert root.A.command({"openPartsSnapshot": "events", "key": "r1", "ttlSecs": 60})["ok"] == 1.0
