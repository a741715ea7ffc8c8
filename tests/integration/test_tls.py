"""A set with TLS and access control both on (`--tlsMode requireTLS`, certificates from a throwaway
`trustme` CA, `--keyFile`): members replicate to each other over TLS, pymongo and motor connect with
`tls=true&tlsCAFile=...` and log in, a plaintext client gets nowhere, the HTTP port speaks HTTPS and
wants a user except on `/health`, and a killed primary is replaced with no acknowledged write lost."""

from __future__ import annotations

import asyncio
import base64
import json
import ssl
import subprocess
import sys
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from motor.motor_asyncio import AsyncIOMotorClient
from pymongo import MongoClient
from pymongo.errors import ServerSelectionTimeoutError
from pymongo.write_concern import WriteConcern

from replset.spark import fetch_with_uri
from sync.part_fetch import FetchFailed
from tests.support.members import REPO_ROOT, Member, wait_for
from tests.support.node_tools import mongosh_logged_in_users
from tests.support.replica_set import ReplicaSet
from tests.support.secure import PASSWORD, USER, create_first_user, secure_options


@pytest.fixture(scope="module")
def secure_set(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    base = tmp_path_factory.mktemp("tlsset")
    args, tls_client, ca_file = secure_options(base / "secrets")
    members = [Member(dbpath=str(base / f"m{i}"), extra_args=list(args), client_kwargs=dict(tls_client))
               for i in range(3)]
    rs = ReplicaSet(members)
    rs.start()
    try:
        rs.initiate()  # through the localhost exception: no user yet
        create_first_user(rs)
        yield {"rs": rs, "ca_file": ca_file, "tls_client": tls_client}
    finally:
        rs.stop()


def test_members_replicate_over_tls_and_drivers_connect_with_the_ca(secure_set: dict[str, Any]) -> None:
    rs: ReplicaSet = secure_set["rs"]
    with rs.client() as client:
        coll = client.app.get_collection("secure", write_concern=WriteConcern(w=3, wtimeout=20_000))
        coll.insert_one({"_id": 1, "over": "tls"})  # every member has it: they fetched over TLS

        def all_healthy() -> bool:  # (heartbeats, over TLS with the key, bring the states in)
            status = client.admin.command("replSetGetStatus")
            return (sorted(m["stateStr"] for m in status["members"]) == ["PRIMARY", "SECONDARY", "SECONDARY"]
                    and all(m["health"] == 1 for m in status["members"]))
        wait_for(all_healthy, 30, "every member healthy in the primary's view")
    with MongoClient(rs.uri, serverSelectionTimeoutMS=1500) as plaintext:
        with pytest.raises(ServerSelectionTimeoutError):
            plaintext.admin.command("ping")


async def test_motor_connects_with_tls(secure_set: dict[str, Any]) -> None:
    rs: ReplicaSet = secure_set["rs"]
    client: AsyncIOMotorClient[dict[str, Any]] = AsyncIOMotorClient(
        rs.uri, username=USER, password=PASSWORD, serverSelectionTimeoutMS=10_000, **secure_set["tls_client"])
    try:
        await client.app.motor_tls.insert_one({"_id": "m"})
        assert await client.app.motor_tls.find_one() == {"_id": "m"}
    finally:
        client.close()


def test_replset_status_connects_with_tls(secure_set: dict[str, Any]) -> None:
    rs: ReplicaSet = secure_set["rs"]
    table = subprocess.run([sys.executable, "-m", "replset", "status", "--host", rs.members[1].host,
                            "--user", USER, "--password", PASSWORD, "--tlsCAFile", secure_set["ca_file"]],
                           capture_output=True, text=True, cwd=REPO_ROOT, timeout=60, check=True).stdout
    assert "PRIMARY" in table and table.count("SECONDARY") >= 2


def test_mongosh_connects_with_tls(secure_set: dict[str, Any]) -> None:
    rs: ReplicaSet = secure_set["rs"]
    hosts = ",".join(m.host for m in rs.members)
    uri = (f"mongodb://{USER}:{urllib.parse.quote(PASSWORD)}@{hosts}/?replicaSet=rs0&tls=true"
           f"&tlsCAFile={urllib.parse.quote(secure_set['ca_file'])}")
    assert mongosh_logged_in_users(uri) == [{"user": USER, "db": "admin"}]


def test_the_spark_source_fetches_parts_over_https_with_the_uris_login(secure_set: dict[str, Any],
                                                                        tmp_path: Path) -> None:
    """What the Spark source's reader does for each part, without Spark: the part files come from a
    member's HTTPS port, with the connection string's user as HTTP Basic and its CA."""
    rs: ReplicaSet = secure_set["rs"]
    with rs.client() as client:
        client.app.command({"createPartsTable": "blocks", "columns": [{"name": "k", "type": "string"}],
                            "orderBy": ["k"]})
        client.app.command({"insertBlock": "blocks", "rows": [{"k": "x"}, {"k": "y"}]})
        copy = client.app.get_collection("system.parts.blocks.replicas").find_one()
    assert copy is not None
    hosts = ",".join(m.host for m in rs.members)
    uri = (f"mongodb://{USER}:{urllib.parse.quote(PASSWORD)}@{hosts}/?replicaSet=rs0&tls=true"
           f"&tlsCAFile={urllib.parse.quote(secure_set['ca_file'])}")
    sums = {str(c["file"]): (int(c["size"]), str(c["sha256"])) for c in copy["checksums"]}
    asyncio.run(fetch_with_uri(uri, str(copy["http"]), "app.blocks", copy["part"], sums, str(tmp_path)))
    assert (tmp_path / copy["part"]).is_dir()
    anonymous = uri.replace(f"{USER}:{urllib.parse.quote(PASSWORD)}@", "")
    with pytest.raises(FetchFailed, match="401"):
        asyncio.run(fetch_with_uri(anonymous, str(copy["http"]), "app.blocks", copy["part"], sums,
                                   str(tmp_path / "again")))


def _get(url: str, ca_file: str, user: str | None = None, password: str | None = None) -> tuple[int, Any]:
    request = urllib.request.Request(url)
    if user is not None:
        token = base64.b64encode(f"{user}:{password}".encode()).decode()
        request.add_header("Authorization", f"Basic {token}")
    try:
        with urllib.request.urlopen(request, timeout=10, context=ssl.create_default_context(cafile=ca_file)) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def test_the_http_port_speaks_https_and_wants_a_user(secure_set: dict[str, Any]) -> None:
    rs: ReplicaSet = secure_set["rs"]
    ca_file = secure_set["ca_file"]
    port = rs.members[0].http_port
    assert _get(f"https://127.0.0.1:{port}/health", ca_file)[0] == 200
    code, body = _get(f"https://127.0.0.1:{port}/replSetGetStatus", ca_file)
    assert code == 401 and body["code"] == 13
    code, body = _get(f"https://127.0.0.1:{port}/replSetGetStatus", ca_file, USER, "wrong")
    assert code == 401 and body["code"] == 18
    code, body = _get(f"https://127.0.0.1:{port}/replSetGetStatus", ca_file, USER, PASSWORD)
    assert code == 200 and body["set"] == "rs0" and len(body["members"]) == 3
    with pytest.raises(OSError):  # plain HTTP on the TLS port: refused or cut off
        urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5)


def test_failover_with_tls_and_auth_keeps_acknowledged_writes(secure_set: dict[str, Any]) -> None:
    rs: ReplicaSet = secure_set["rs"]
    with rs.client() as client:
        coll = client.app.get_collection("failover", write_concern=WriteConcern(w="majority", wtimeout=20_000))
        coll.insert_many([{"_id": i} for i in range(100)])
        old = rs.wait_primary()
        old.kill()
        try:
            new = wait_for(lambda: (p := rs.primary()) is not None and p is not old and p, 30, "a new primary")
            assert new is not old
            coll.insert_one({"_id": "after"})
            assert coll.count_documents({}) == 101
        finally:
            old.start()
        with rs.direct(old) as direct:  # the old primary rejoins over TLS with the key and catches up
            wait_for(lambda: direct.app.failover.count_documents({}) == 101, 30, "the old primary to catch up")
