"""A shared set and small accounts trying to reach beyond them: on a live `--auth` member, each way a
user of one database was found to act on others (a dbOwner making itself root, `$out`/`$merge`
writing into other databases, a rename across databases, the users collection read, an HTTP route
answering more than its wire command) is refused with 13, and the legitimate users' data and work
are untouched. The whole matrix of commands, roles and databases is tests/unit/test_privileges.py."""

from __future__ import annotations

import base64
import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pymongo.synchronous.database
import pytest
from pymongo import MongoClient
from pymongo.errors import OperationFailure

from tests.support.up_process import running_up

ROOT = ("admin", "root pass")
USERS = {  # name -> (password, roles)
    "owner": ("owner pass", [{"role": "dbOwner", "db": "A"}]),
    "writer": ("writer pass", [{"role": "readWrite", "db": "A"}]),
    "reader": ("reader pass", [{"role": "read", "db": "A"}]),
    "adminWriter": ("aw pass", [{"role": "readWrite", "db": "admin"}]),
    "adminReader": ("ar pass", [{"role": "read", "db": "admin"}]),
    "monitor": ("monitor pass", [{"role": "clusterMonitor", "db": "admin"}]),
    "anyReader": ("any pass", [{"role": "readAnyDatabase", "db": "admin"}]),
}


@pytest.fixture(scope="module")
def shared_set(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    directory = str(tmp_path_factory.mktemp("shared"))
    with running_up(directory, nodes=1, extra_args=("--auth", "--user", ROOT[0], "--password", ROOT[1])) as (ports, _):
        port = ports[0]
        with _client(port, *ROOT) as root:
            for name, (password, roles) in USERS.items():
                root.admin.command("createUser", name, pwd=password, roles=roles)
            root.A.docs.insert_many([{"_id": i} for i in range(3)])
            root.B.victim.insert_one({"_id": "victim's"})
            root.B.keep.insert_one({"_id": "kept"})
            root.B.pwned.insert_one({"_id": "B's own"})
            root.B.secret.insert_one({"_id": "secret"})
        yield {"port": port}


def _client(port: int, user: str, password: str) -> MongoClient[dict[str, Any]]:
    return MongoClient(f"mongodb://127.0.0.1:{port}/?directConnection=true", username=user, password=password,
                       serverSelectionTimeoutMS=10_000)


def _as(shared_set: dict[str, Any], user: str) -> MongoClient[dict[str, Any]]:
    password = ROOT[1] if user == ROOT[0] else USERS[user][0]
    return _client(shared_set["port"], user, password)


def _refused(call: Any) -> OperationFailure:
    with pytest.raises(OperationFailure) as refused:
        call()
    assert refused.value.code == 13, refused.value.details
    return refused.value


def test_a_database_owner_cannot_make_itself_root(shared_set: dict[str, Any]) -> None:
    with _as(shared_set, "owner") as owner:
        _refused(lambda: owner.A.command("createUser", "evil", pwd="x", roles=[{"role": "userAdmin", "db": "admin"}]))
        _refused(lambda: owner.A.command("createUser", "evil2", pwd="x", roles=[{"role": "root", "db": "admin"}]))
        _refused(lambda: owner.A.command("grantRolesToUser", "owner", roles=[{"role": "readWrite", "db": "B"}]))
        # what a dbOwner may do: users of its own database with its own database's roles
        owner.A.command("createUser", "helper", pwd="x", roles=["read"])
        _refused(lambda: owner.A.command("grantRolesToUser", "helper", roles=[{"role": "read", "db": "B"}]))
        owner.A.command("dropUser", "helper")
    with _as(shared_set, ROOT[0]) as root:
        names = {d["_id"] for d in root.admin["system.users"].find({}, {"_id": 1})}
        assert not names & {"A.evil", "A.evil2", "A.helper"}
        assert root.admin.command("usersInfo", {"user": "owner", "db": "admin"})["users"][0]["roles"] == \
            USERS["owner"][1]


def test_a_pipeline_cannot_write_into_or_read_from_other_databases(shared_set: dict[str, Any]) -> None:
    with _as(shared_set, "writer") as writer:
        _refused(lambda: writer.A.docs.aggregate([{"$out": {"db": "B", "coll": "pwned"}}]))
        _refused(lambda: writer.A.docs.aggregate([{"$merge": {"into": {"db": "admin", "coll": "x"}}}]))
        _refused(lambda: writer.A.docs.aggregate([{"$lookup": {"from": {"db": "B", "coll": "secret"},
                                                                "pipeline": [], "as": "s"}}]))
        _refused(lambda: writer.A.docs.aggregate([{"$unionWith": {"coll": "docs", "pipeline": [
            {"$lookup": {"from": {"db": "B", "coll": "secret"}, "pipeline": [], "as": "s"}}]}}]))
        _refused(lambda: writer.admin.command("aggregate", 1, pipeline=[{"$changeStream": {"allChangesForCluster":
                                                                                           True}}], cursor={}))
        # within its own database a writer's pipeline writes
        list(writer.A.docs.aggregate([{"$out": "copy"}]))
        assert writer.A.copy.count_documents({}) == 3
    with _as(shared_set, "reader") as reader:
        _refused(lambda: reader.A.docs.aggregate([{"$out": "copy2"}]))
        assert [d["_id"] for d in reader.A.docs.find()] == [0, 1, 2]
        assert reader.admin.command("listDatabases", nameOnly=True)["databases"] == [{"name": "A"}]
    with _as(shared_set, ROOT[0]) as root:
        assert list(root.B.pwned.find()) == [{"_id": "B's own"}]
        assert "x" not in root.admin.list_collection_names()


def test_a_rename_needs_both_sides(shared_set: dict[str, Any]) -> None:
    with _as(shared_set, "adminWriter") as admin_writer:
        _refused(lambda: admin_writer.admin.command("renameCollection", "B.victim", to="B.keep", dropTarget=True))
        _refused(lambda: admin_writer.admin.command("renameCollection", "B.victim", to="admin.stolen"))
    with _as(shared_set, "writer") as writer:
        _refused(lambda: writer.admin.command("renameCollection", "A.docs", to="B.docs"))
    with _as(shared_set, ROOT[0]) as root:
        assert list(root.B.victim.find()) == [{"_id": "victim's"}]
        assert list(root.B.keep.find()) == [{"_id": "kept"}]


def test_reading_admin_is_not_reading_its_users(shared_set: dict[str, Any]) -> None:
    with _as(shared_set, "adminReader") as admin_reader:
        _refused(lambda: admin_reader.admin["system.users"].find_one())
        _refused(lambda: admin_reader.admin.command("usersInfo", "owner", showCredentials=True))
        assert admin_reader.admin.command("usersInfo", "adminReader")["users"][0]["user"] == "adminReader"
    with _as(shared_set, ROOT[0]) as root:
        assert root.admin["system.users"].find_one({"_id": "admin.owner"}) is not None


def _http(port: int, path: str, user: str, password: str) -> int:
    token = base64.b64encode(f"{user}:{password}".encode()).decode()
    request = urllib.request.Request(f"http://127.0.0.1:{port + 1000}{path}",
                                     headers={"Authorization": f"Basic {token}"})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            json.loads(response.read())
            return int(response.status)
    except urllib.error.HTTPError as err:
        return int(err.code)


def test_an_http_route_needs_what_its_wire_command_needs(shared_set: dict[str, Any]) -> None:
    port = shared_set["port"]
    reader = ("reader", USERS["reader"][0])
    monitor = ("monitor", USERS["monitor"][0])
    assert _http(port, "/tables/A.t/replication_queue", *reader) == 403
    assert _http(port, "/tables/A.t/replication_queue", *monitor) != 403  # (no such table: not a refusal)
    assert _http(port, "/replSetGetStatus", *reader) == 403
    assert _http(port, "/replSetGetStatus", *monitor) == 200
    with _as(shared_set, "reader") as wire_reader:
        _refused(lambda: wire_reader.A.command("partsReplicationQueue", "t"))


def test_what_a_name_or_a_stage_could_hide_is_refused(shared_set: dict[str, Any]) -> None:
    """A `$db` with a dot would make `admin.system` + `users` the users collection; a stage of two keys
    could be read by its handler under either; splitVector's value is a whole namespace; an aggregate
    naming a collection reads it whatever its first stage."""
    with _as(shared_set, "anyReader") as any_reader, pytest.MonkeyPatch.context() as patch:
        patch.setattr(pymongo.synchronous.database, "_check_name", lambda name: None)   # (pymongo's own check)
        for db, coll in (("admin.system", "users"), ("local.oplog", "rs")):
            with pytest.raises(OperationFailure) as invalid:
                any_reader[db][coll].find_one()
            assert invalid.value.code == 73, invalid.value.details
    with _as(shared_set, "reader") as reader:
        _refused(lambda: reader.A.docs.aggregate([{"$out": {"db": "B", "coll": "pwned"}, "$set": {"a": 1}}]))
        _refused(lambda: reader.A.command("splitVector", "admin.system.users", keyPattern={"_id": 1},
                                          maxChunkObjects=1))
        _refused(lambda: reader.admin.command("explain", {"aggregate": "system.users", "pipeline": [{"$documents": []}],
                                                          "cursor": {}}))
        assert reader.A.command("splitVector", "A.docs", keyPattern={"_id": 1}, maxChunkObjects=1)["ok"] == 1
    with _as(shared_set, ROOT[0]) as root:
        assert list(root.B.pwned.find()) == [{"_id": "B's own"}]
