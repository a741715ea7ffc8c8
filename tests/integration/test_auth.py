"""Access control on a real set started with `replset up --auth`: a keyfile the members prove
themselves with, a first user made through the localhost exception, SCRAM-SHA-256 and SCRAM-SHA-1
logins from pymongo and motor, MongoDB's codes for the refused (13) and the failed (18), roles
checked per command and database, SASLprep on passwords but not on user names (the drivers' auth
spec users), and a member without the key that can neither replicate nor vote nor be synced from."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import urllib.parse
from collections.abc import Iterator
from typing import Any

import pytest
from bson.int64 import Int64
from motor.motor_asyncio import AsyncIOMotorClient
from pymongo import MongoClient
from pymongo.errors import OperationFailure
from pymongo.write_concern import WriteConcern

from replset.auth.keyfile import read_keyfile, write_keyfile
from tests.support.members import REPO_ROOT, Member, wait_for
from tests.support.node_tools import NODE_MODULES, mongosh_logged_in_users
from tests.support.up_process import running_up

ADMIN = ("admin", "s3cret pass")


@pytest.fixture(scope="module")
def auth_set(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    directory = str(tmp_path_factory.mktemp("authset"))
    with running_up(directory, extra_args=("--auth", "--user", ADMIN[0], "--password", ADMIN[1])) as (ports, out):
        hosts = ",".join(f"127.0.0.1:{p}" for p in ports)
        yield {"uri": f"mongodb://{hosts}/?replicaSet=rs0", "ports": ports, "out": out, "dir": directory}


def _client(auth_set: dict[str, Any], **kwargs: Any) -> MongoClient[dict[str, Any]]:
    return MongoClient(auth_set["uri"], serverSelectionTimeoutMS=10_000, **kwargs)


def test_up_made_a_private_keyfile_and_the_first_user(auth_set: dict[str, Any]) -> None:
    assert auth_set["out"].has(f"created user {ADMIN[0]} (root on admin)")
    mode = os.stat(os.path.join(auth_set["dir"], "keyfile")).st_mode
    assert stat.S_IMODE(mode) == 0o600
    with _client(auth_set, username=ADMIN[0], password=ADMIN[1]) as client:
        users = client.admin.command("usersInfo", ADMIN[0])["users"]
        assert users[0]["roles"] == [{"role": "root", "db": "admin"}]
        assert "credentials" not in users[0] and users[0]["mechanisms"] == ["SCRAM-SHA-1", "SCRAM-SHA-256"]
        shown = client.admin.command("usersInfo", ADMIN[0], showCredentials=True)["users"][0]["credentials"]
        assert set(shown["SCRAM-SHA-256"]) == {"iterationCount", "salt", "storedKey", "serverKey"}
        assert shown["SCRAM-SHA-256"]["iterationCount"] == 15_000 and shown["SCRAM-SHA-1"]["iterationCount"] == 10_000
        assert ADMIN[1] not in repr(shown)
    host = f"127.0.0.1:{auth_set['ports'][0]}"
    status = [sys.executable, "-m", "replset", "status", "--host", host]
    refused = subprocess.run(status, capture_output=True, text=True, cwd=REPO_ROOT, timeout=60)
    assert refused.returncode == 1 and "requires authentication (code 13)" in refused.stderr
    table = subprocess.run([*status, "--user", ADMIN[0], "--password", ADMIN[1]], capture_output=True, text=True,
                           cwd=REPO_ROOT, timeout=60, check=True).stdout
    assert "PRIMARY" in table and table.count("SECONDARY") >= 2


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "SCRAM-SHA-1"])
def test_pymongo_logs_in_with_each_mechanism_and_writes_with_majority(auth_set: dict[str, Any],
                                                                      mechanism: str) -> None:
    with _client(auth_set, username=ADMIN[0], password=ADMIN[1], authMechanism=mechanism) as client:
        status = client.admin.command("connectionStatus")["authInfo"]
        assert status["authenticatedUsers"] == [{"user": ADMIN[0], "db": "admin"}]
        coll = client.app.get_collection("things", write_concern=WriteConcern(w="majority", wtimeout=20_000))
        coll.insert_one({"mechanism": mechanism})
        assert coll.count_documents({"mechanism": mechanism}) == 1


async def test_motor_logs_in(auth_set: dict[str, Any]) -> None:
    client: AsyncIOMotorClient[dict[str, Any]] = AsyncIOMotorClient(
        auth_set["uri"], username=ADMIN[0], password=ADMIN[1], serverSelectionTimeoutMS=10_000)
    try:
        await client.app.motor.insert_one({"_id": 1})
        assert await client.app.motor.find_one() == {"_id": 1}
    finally:
        client.close()


NODE_LOGIN = """
const { MongoClient } = require("mongodb");
(async () => {
  const client = new MongoClient(process.env.URI, { serverSelectionTimeoutMS: 10000 });
  try {
    await client.connect();
    const status = await client.db("admin").command({ connectionStatus: 1 });
    await client.db("app").collection("node").insertOne({ mechanism: process.env.MECHANISM });
    const n = await client.db("app").collection("node").countDocuments({ mechanism: process.env.MECHANISM });
    console.log(JSON.stringify({ users: status.authInfo.authenticatedUsers, n }));
  } catch (err) {
    console.log(JSON.stringify({ error: err.message, code: err.code }));
  } finally {
    await client.close();
  }
})();
"""


@pytest.mark.parametrize(("mechanism", "password", "expected"), [
    ("SCRAM-SHA-256", ADMIN[1], None), ("SCRAM-SHA-1", ADMIN[1], None), ("SCRAM-SHA-256", "wrong", 18)])
def test_the_node_driver_logs_in(auth_set: dict[str, Any], mechanism: str, password: str,
                                 expected: int | None) -> None:
    """The MongoDB Node.js driver (`make install` puts it and mongosh under build/node)."""
    node = shutil.which("node")
    assert node is not None and os.path.isdir(os.path.join(NODE_MODULES, "mongodb")), \
        "the Node.js driver is missing: run `make install` (it needs node and npm)"
    hosts = ",".join(f"127.0.0.1:{p}" for p in auth_set["ports"])
    uri = (f"mongodb://{ADMIN[0]}:{urllib.parse.quote(password)}@{hosts}/?replicaSet=rs0"
           f"&authMechanism={mechanism}")
    done = subprocess.run([node, "-e", NODE_LOGIN], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "NODE_PATH": NODE_MODULES, "URI": uri, "MECHANISM": mechanism})
    result = json.loads(done.stdout.strip().splitlines()[-1])
    if expected is None:
        assert result == {"users": [{"user": ADMIN[0], "db": "admin"}], "n": 1}, done.stderr
    else:
        assert result["code"] == expected, result


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "SCRAM-SHA-1"])
def test_mongosh_logs_in(auth_set: dict[str, Any], mechanism: str) -> None:
    hosts = ",".join(f"127.0.0.1:{p}" for p in auth_set["ports"])
    uri = (f"mongodb://{ADMIN[0]}:{urllib.parse.quote(ADMIN[1])}@{hosts}/?replicaSet=rs0"
           f"&authMechanism={mechanism}")
    assert mongosh_logged_in_users(uri) == [{"user": ADMIN[0], "db": "admin"}]


def test_refusals_carry_mongodbs_codes_and_roles_are_checked(auth_set: dict[str, Any]) -> None:
    with _client(auth_set, username=ADMIN[0], password=ADMIN[1]) as admin:
        admin.app.docs.insert_one({"_id": "seen"})
        admin.admin.command("createUser", "reader", pwd="reader pwd", roles=[{"role": "read", "db": "app"}])
        with pytest.raises(OperationFailure) as exists:
            admin.admin.command("createUser", "reader", pwd="x", roles=[])
        assert exists.value.code == 51003
        with pytest.raises(OperationFailure) as bad_role:
            admin.admin.command("createUser", "nobody", pwd="x", roles=["clusterAdmin@app"])
        assert bad_role.value.code == 31
    with _client(auth_set) as anonymous:
        with pytest.raises(OperationFailure) as unauthenticated:
            anonymous.app.docs.find_one()
        assert unauthenticated.value.code == 13
        assert anonymous.admin.command("ping")["ok"] == 1  # the handshake and ping need no user
        with pytest.raises(OperationFailure) as exception_over:  # the localhost exception ended with a user
            anonymous.admin.command("createUser", "sneaky", pwd="x", roles=["root"])
        assert exception_over.value.code == 13
        for member_only in ({"replSetHeartbeat": "rs0", "configVersion": 1, "from": "x:1", "term": 1},
                            {"replSetRequestVotes": 1, "setName": "rs0", "dryRun": True, "term": 99,
                             "candidateIndex": 0, "configVersion": 1, "lastAppliedOpTime": {}}):
            with pytest.raises(OperationFailure) as refused:
                anonymous.admin.command(member_only)
            assert refused.value.code == 13
    with _client(auth_set, username=ADMIN[0], password="wrong") as wrong:
        with pytest.raises(OperationFailure) as failed:
            wrong.app.docs.find_one()
        assert failed.value.code == 18
    with _client(auth_set, username="reader", password="reader pwd") as reader:
        assert reader.app.docs.find_one({"_id": "seen"}) == {"_id": "seen"}
        with pytest.raises(OperationFailure) as cannot_write:
            reader.app.docs.insert_one({"_id": "nope"})
        assert cannot_write.value.code == 13 and "not authorized on app" in str(cannot_write.value)
        with pytest.raises(OperationFailure) as other_db:
            reader.other.docs.find_one()
        assert other_db.value.code == 13
        with pytest.raises(OperationFailure) as no_admin:
            reader.admin.command("replSetStepDown", 10)
        assert no_admin.value.code == 13
    with _client(auth_set, username=ADMIN[0], password=ADMIN[1]) as admin:  # a cursor is its user's
        admin.app.docs.insert_many([{"n": i} for i in range(5)])
        reply = admin.app.command({"find": "docs", "batchSize": 1})
        cursor_id = reply["cursor"]["id"]
        primary = admin.primary
        with MongoClient(f"mongodb://{primary[0]}:{primary[1]}/?directConnection=true", username="reader",
                         password="reader pwd", serverSelectionTimeoutMS=10_000) as other:
            for command in ({"getMore": cursor_id, "collection": "docs"}, {"killCursors": "docs",
                                                                            "cursors": [cursor_id]}):
                with pytest.raises(OperationFailure) as not_theirs:
                    other.app.command(command)
                assert not_theirs.value.code == 13
        assert admin.app.command({"getMore": cursor_id, "collection": "docs"})["cursor"]["nextBatch"]
    with _client(auth_set, username=ADMIN[0], password=ADMIN[1]) as admin:  # a grant counts at once
        admin.admin.command("grantRolesToUser", "reader", roles=[{"role": "readWrite", "db": "app"}])
        with _client(auth_set, username="reader", password="reader pwd") as reader:
            reader.app.docs.insert_one({"_id": "now allowed"})
        admin.admin.command("dropUser", "reader")
        with pytest.raises(OperationFailure) as dropped:
            admin.admin.command("dropUser", "reader")
        assert dropped.value.code == 11


def test_a_hello_flag_grants_nothing_and_member_commands_need_the_keyfile(auth_set: dict[str, Any]) -> None:
    """A user who says `internalClient` in its hello is still that user: the members' own commands
    (the parts commit, position reports, heartbeats) are refused with 13; the keyfile's internal user
    (`__system@local`) may run them."""
    with _client(auth_set, username=ADMIN[0], password=ADMIN[1]) as admin:
        admin.admin.command("createUser", "writer", pwd="writer pwd", roles=[{"role": "readWrite", "db": "app"}])
        admin.app.command({"createPartsTable": "events", "columns": [{"name": "k", "type": "int64"}],
                           "orderBy": ["k"]})
        primary = admin.primary
    direct = f"mongodb://{primary[0]}:{primary[1]}/?directConnection=true"
    block = {"partition": "all", "blockId": "all_x", "rows": 1, "bytes": 10,
             "checksums": [{"file": "data.parquet", "size": 10, "sha256": "0" * 64}]}
    try:
        with MongoClient(direct, username="writer", password="writer pwd", maxPoolSize=1,
                         serverSelectionTimeoutMS=10_000) as writer:
            hello = writer.admin.command({"hello": 1, "internalClient": {"minWireVersion": 0, "maxWireVersion": 21}})
            assert hello["ok"] == 1.0
            for db, command in (
                    ("app", {"_partsCommit": "events", "blocks": [block], "source": f"{primary[0]}:{primary[1]}",
                             "http": "127.0.0.1:9", "attempt": "a", "quorum": 0}),
                    ("admin", {"replSetUpdatePosition": 1, "optimes": []}),
                    ("admin", {"replSetHeartbeat": "rs0", "configVersion": 1, "from": "x:1", "term": 1}),
                    ("admin", {"replSetGetRBID": 1})):
                with pytest.raises(OperationFailure) as refused:
                    writer[db].command(command)
                assert refused.value.code == 13, command
            writer.app.docs.insert_one({"_id": "still a writer"})
        key = read_keyfile(os.path.join(auth_set["dir"], "keyfile"))
        with MongoClient(direct, username="__system", password=key, authSource="local",
                         authMechanism="SCRAM-SHA-256", serverSelectionTimeoutMS=10_000) as member:
            assert "rbid" in member.admin.command("replSetGetRBID")
    finally:
        with _client(auth_set, username=ADMIN[0], password=ADMIN[1]) as admin:
            admin.app.command({"dropPartsTable": "events"})
            admin.admin.command("dropUser", "writer")


def test_even_a_member_login_cannot_unseat_the_set_with_one_message(auth_set: dict[str, Any]) -> None:
    """With auth on only the keyfile's user may send the members' messages; from it too, a term no
    member could follow and a config version at the int64 limit are refused, and the set goes on."""
    key = read_keyfile(os.path.join(auth_set["dir"], "keyfile"))
    with _client(auth_set, username=ADMIN[0], password=ADMIN[1]) as admin:
        config = admin.admin.command("replSetGetConfig")["config"]
        primary = admin.primary
    direct = f"mongodb://{primary[0]}:{primary[1]}/?directConnection=true"
    with MongoClient(direct, username="__system", password=key, authSource="local",
                     authMechanism="SCRAM-SHA-256", serverSelectionTimeoutMS=10_000) as member:
        for command in (
                {"replSetHeartbeat": "rs0", "configVersion": config["version"], "configTerm": config["term"],
                 "hbv": 1, "from": "127.0.0.1:1", "fromId": 1, "term": Int64(2**63 - 1)},
                {"replSetRequestVotes": 1, "setName": "rs0", "dryRun": False, "term": 1e300, "candidateIndex": 1,
                 "configVersion": config["version"], "configTerm": config["term"], "lastAppliedOpTime": {}},
                {"replSetUpdatePosition": 1, "optimes": [], "$replData": {"term": Int64(2**63 - 1)}},
                {"replSetReconfig": {**config, "version": Int64(2**63 - 1)}, "force": True}):
            with pytest.raises(OperationFailure) as refused:
                member.admin.command(command)
            assert refused.value.code in (2, 93), (command, refused.value)
        assert int(member.admin.command("replSetGetStatus")["term"]) < 2**62
    with _client(auth_set, username=ADMIN[0], password=ADMIN[1]) as admin:
        admin.app.get_collection("after", write_concern=WriteConcern(w="majority", wtimeout=10_000)).insert_one({})
    for port in auth_set["ports"]:
        with open(os.path.join(auth_set["dir"], f"{port}.log"), encoding="utf-8", errors="replace") as f:
            assert "Traceback" not in f.read(), port


def test_the_auth_spec_users_saslprep_passwords_not_user_names(auth_set: dict[str, Any]) -> None:
    """The drivers' auth spec: IX/IX and \u2168 (ROMAN NUMERAL NINE)/\u2163 (ROMAN NUMERAL FOUR),
    SCRAM-SHA-256 only. Passwords are SASLprepped (a soft hyphen vanishes, \u2163 is IV); the name
    \u2168 stays itself, so it is not IX."""
    with _client(auth_set, username=ADMIN[0], password=ADMIN[1]) as admin:
        admin.admin.command("createUser", "IX", pwd="IX", roles=["root"], mechanisms=["SCRAM-SHA-256"])
        admin.admin.command("createUser", "\u2168", pwd="\u2163", roles=["root"], mechanisms=["SCRAM-SHA-256"])
    for user, password in (("IX", "IX"), ("IX", "I\u00adX"), ("\u2168", "IV"), ("\u2168", "I\u00adV")):
        with _client(auth_set, username=user, password=password, authMechanism="SCRAM-SHA-256") as client:
            assert client.admin.command("connectionStatus")["authInfo"]["authenticatedUsers"] == [
                {"user": user, "db": "admin"}]
    with _client(auth_set, username="\u2168", password="IX", authMechanism="SCRAM-SHA-256") as client:
        with pytest.raises(OperationFailure) as failed:
            client.app.docs.find_one()
        assert failed.value.code == 18
    with _client(auth_set, username="IX", password="IX", authMechanism="SCRAM-SHA-1") as client:
        with pytest.raises(OperationFailure):  # no SCRAM-SHA-1 credentials for this user
            client.app.docs.find_one()


def test_a_member_without_the_key_can_neither_replicate_nor_vote(auth_set: dict[str, Any],
                                                                 tmp_path: Any) -> None:
    other_key = str(tmp_path / "other.key")
    write_keyfile(other_key)
    intruder = Member(dbpath=str(tmp_path / "intruder"), extra_args=["--keyFile", other_key])
    intruder.start()
    try:
        with _client(auth_set, username=ADMIN[0], password=ADMIN[1]) as admin:
            config = admin.admin.command("replSetGetConfig")["config"]
            config["version"] += 1
            config["members"].append({"_id": 9, "host": intruder.host, "votes": 1, "priority": 0})
            admin.admin.command("replSetReconfig", config)

            def seen_as_down() -> bool:
                row = next(m for m in admin.admin.command("replSetGetStatus")["members"]
                           if m["name"] == intruder.host)
                return row["health"] == 0 and "Authentication failed" in row.get("lastHeartbeatMessage", "")
            wait_for(seen_as_down, 30, "the primary to find the intruder cannot authenticate")
            # The set goes on: 3 of 4 voters are a majority.
            admin.app.after.with_options(write_concern=WriteConcern(w="majority", wtimeout=20_000)).insert_one({})
            config["version"] += 1
            config["members"] = [m for m in config["members"] if m["host"] != intruder.host]
            admin.admin.command("replSetReconfig", config)
        with intruder.direct_client(username=ADMIN[0], password=ADMIN[1]) as direct:
            with pytest.raises(OperationFailure) as nothing:  # nothing was replicated to it, users included
                direct.app.after.count_documents({})
            assert nothing.value.code == 18
    finally:
        intruder.stop()
