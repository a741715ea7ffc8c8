"""The check every command passes when auth is on (`--auth`, `--keyFile`): the connection's users,
their roles as stored now, and what the command needs (replset/auth/roles.py)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from replset.auth.roles import authorize
from replset.auth.users import INTERNAL_USER, USERS_NS, ConnectionAuth, UserGrants, held_grants, is_loopback

LOCALHOST_EXCEPTION = frozenset({"createUser", "replSetInitiate", "replSetGetStatus", "replSetGetConfig"})


def check_access(reader: Any, auth: ConnectionAuth, peer: str, name: str, db: str, cmd: Mapping[str, Any], *,
                 test_commands: bool = False, cache: UserGrants | None = None) -> None:
    """Refuses (13) a command the connection's users may not run. With no user created yet, a
    connection from the loopback interface may initiate the set, see its status and configuration and
    create the first user on `admin` (MongoDB's localhost exception; it ends with that user); with
    `--enableTestCommands`, set fail points too (tests route peer traffic before the set exists)."""
    present, held = held_grants(reader, auth, cache) if auth.users else (False, frozenset())
    excepted = name in LOCALHOST_EXCEPTION or (test_commands and name == "configureFailPoint")
    if not present and excepted and db == "admin" and is_loopback(peer) and reader.count(USERS_NS) == 0:
        return
    authorize(name, db, cmd, authenticated=present, held=held)


def acts_as_member(auth_enabled: bool, auth: ConnectionAuth) -> bool:
    """Whether what a connection sends may count as a member's own word (a position report riding on an
    oplog getMore): with auth on, only once it logged in as the internal user with the keyfile; never
    because a message says so. Without auth there are no identities (as with mongod)."""
    return not auth_enabled or INTERNAL_USER in auth.users
