"""Roles and the per-command check (pure), and the server's side of SCRAM against a client that
does not SASLprep user names (as MongoDB's drivers do not)."""

from __future__ import annotations

import base64
import hashlib
import hmac
import os

import pytest

from base.errors import MongoError
from base.scram import SHA1, SHA256, AuthenticationFailed, ScramConversation, make_credentials
from replset.auth.privileges import authorize
from replset.auth.roles import check_role_name, grants


def held(*roles: tuple[str, str]) -> frozenset:
    return grants([{"role": r, "db": d} for r, d in roles])


@pytest.mark.parametrize(("roles", "command", "db", "allowed"), [
    ((("read", "app"),), "find", "app", True),
    ((("read", "app"),), "insert", "app", False),
    ((("read", "app"),), "find", "other", False),
    ((("readWrite", "app"),), "insert", "app", True),
    ((("readWrite", "app"),), "createIndexes", "app", True),
    ((("readWrite", "app"),), "collMod", "app", False),
    ((("dbAdmin", "app"),), "collMod", "app", True),
    ((("dbAdmin", "app"),), "find", "app", False),
    ((("userAdmin", "app"),), "createUser", "app", True),
    ((("userAdmin", "app"),), "createUser", "admin", False),
    ((("clusterMonitor", "admin"),), "replSetGetStatus", "admin", True),
    ((("clusterMonitor", "admin"),), "replSetStepDown", "admin", False),
    ((("clusterAdmin", "admin"),), "replSetStepDown", "admin", True),
    ((("readAnyDatabase", "admin"),), "find", "anything", True),
    ((("readAnyDatabase", "admin"),), "find", "local", False),
    ((("read", "admin"),), "find", "admin", True),
    ((("readWriteAnyDatabase", "admin"),), "delete", "anything", True),
    ((("root", "admin"),), "dropDatabase", "app", True),
    ((("root", "admin"),), "replSetHeartbeat", "admin", False),  # member to member only
    ((("read", "app"),), "aggregate", "app", True),
    ((), "getMore", "app", True),  # only authentication
])
def test_roles_grant_what_mongodb_grants(roles: tuple, command: str, db: str, allowed: bool) -> None:
    cmd = {command: "c"}
    if allowed:
        authorize(command, db, cmd, authenticated=True, held=held(*roles))
    else:
        with pytest.raises(MongoError) as refused:
            authorize(command, db, cmd, authenticated=True, held=held(*roles))
        assert refused.value.code == 13 and f"not authorized on {db} to execute command" in refused.value.errmsg


def test_without_a_user_only_the_handshake_runs() -> None:
    authorize("hello", "admin", {"hello": 1}, authenticated=False, held=frozenset())
    authorize("saslStart", "admin", {"saslStart": 1}, authenticated=False, held=frozenset())
    with pytest.raises(MongoError) as refused:
        authorize("find", "app", {"find": "c"}, authenticated=False, held=frozenset())
    assert refused.value.errmsg == "command find requires authentication"


def test_an_aggregate_that_writes_needs_write_too() -> None:
    cmd = {"aggregate": "c", "pipeline": [{"$out": "d"}]}
    with pytest.raises(MongoError):
        authorize("aggregate", "app", cmd, authenticated=True, held=held(("read", "app")))
    authorize("aggregate", "app", cmd, authenticated=True, held=held(("readWrite", "app")))


def test_cluster_roles_exist_on_admin_only() -> None:
    check_role_name({"role": "clusterAdmin", "db": "admin"})
    for role in ({"role": "clusterAdmin", "db": "app"}, {"role": "nope", "db": "app"},
                 {"role": "__system", "db": "local"}):
        with pytest.raises(MongoError) as refused:
            check_role_name(role)
        assert refused.value.code == 31


def _client_proof(mechanism: str, user: str, password: str, conversation: ScramConversation) -> bytes:
    """A SCRAM client written out (RFC 5802), sending the user name unprepped as drivers do."""
    digest = hashlib.sha1 if mechanism == SHA1 else hashlib.sha256
    if mechanism == SHA1:
        password = hashlib.md5(f"{user}:mongo:{password}".encode(), usedforsecurity=False).hexdigest()
    nonce = base64.b64encode(os.urandom(18)).decode()
    bare = f"n={user.replace('=', '=3D').replace(',', '=2C')},r={nonce}"
    server_first = conversation.first(f"n,,{bare}".encode()).decode()
    fields = dict(part.split("=", 1) for part in server_first.split(","))
    salted = hashlib.pbkdf2_hmac(digest().name, password.encode(), base64.b64decode(fields["s"]), int(fields["i"]))
    client_key = hmac.digest(salted, b"Client Key", digest)
    without_proof = f"c=biws,r={fields['r']}"
    auth_message = f"{bare},{server_first},{without_proof}".encode()
    signature = hmac.digest(digest(client_key).digest(), auth_message, digest)
    proof = base64.b64encode(bytes(a ^ b for a, b in zip(client_key, signature, strict=True))).decode()
    return conversation.final(f"{without_proof},p={proof}".encode())


@pytest.mark.parametrize("mechanism", [SHA1, SHA256])
def test_a_user_name_is_looked_up_as_sent_not_saslprepped(mechanism: str) -> None:
    stored = {"\u2168": make_credentials("\u2168", "pw", (mechanism,)),
              "IX": make_credentials("IX", "other", (mechanism,)),
              "a,b=c": make_credentials("a,b=c", "pw", (mechanism,))}

    def lookup(user: str) -> dict | None:
        creds = stored.get(user)
        return None if creds is None else creds[mechanism]

    for user in ("\u2168", "a,b=c"):
        conversation = ScramConversation(mechanism, lookup)
        assert _client_proof(mechanism, user, "pw", conversation).startswith(b"v=")
        assert conversation.user == user and conversation.done
    with pytest.raises(AuthenticationFailed):
        _client_proof(mechanism, "IX", "pw", ScramConversation(mechanism, lookup))
    with pytest.raises(AuthenticationFailed):
        _client_proof(mechanism, "nobody", "pw", ScramConversation(mechanism, lookup))
