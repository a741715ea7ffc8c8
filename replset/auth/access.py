"""The check every command passes when auth is on (`--auth`, `--keyFile`): the connection's users,
their roles as stored now (replset/auth/roles.py), and what the command needs from every namespace it
touches (replset/auth/privileges.py)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from replset.auth.privileges import authorize
from replset.auth.roles import CLUSTER, Resource, database, holds
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
    authorize(name, db, cmd, authenticated=present, held=held, me=auth.users)


def acts_as_member(auth_enabled: bool, auth: ConnectionAuth) -> bool:
    """Whether what a connection sends may count as a member's own word (a position report riding on an
    oplog getMore): with auth on, only once it logged in as the internal user with the keyfile; never
    because a message says so. Without auth there are no identities (as with mongod)."""
    return not auth_enabled or INTERNAL_USER in auth.users


def connection_holds(reader: Any, auth: ConnectionAuth, action: str, resource: Resource, *,
                     cache: UserGrants | None = None) -> bool:
    """Whether the connection's users may take `action` on `resource` now (a reply that shows only what
    they may see: listDatabases' databases, others' sessions)."""
    _present, held = held_grants(reader, auth, cache)
    return holds(held, action, resource)


def visible_databases(reader: Any, auth: ConnectionAuth, names: list[str], *,
                      cache: UserGrants | None = None) -> list[str]:
    """The databases `listDatabases` shows a user: all with `listDatabases` on the cluster, else those
    it holds some privilege on (mongod's `authorizedDatabases`)."""
    _present, held = held_grants(reader, auth, cache)
    if holds(held, "listDatabases", CLUSTER):
        return names
    return [name for name in names if any(grant.matches(database(name)) for grant in held)]
