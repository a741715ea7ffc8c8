"""Users as stored in `admin.system.users` (replicated like any collection, written only through the
user commands) and what a connection has proven.

A user document is mongod's shape: `{_id: "<db>.<user>", userId: UUID, user, db, credentials:
{"SCRAM-SHA-1": {...}, "SCRAM-SHA-256": {...}}, roles: [{role, db}], customData?}`; credentials hold
salt, StoredKey, ServerKey and the iteration count (replset/auth/scram.py), never the password.

A connection's users are checked against the stored documents on every command (one indexed read),
so a role granted or revoked, or a user dropped, takes effect on open connections at once.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from base.scram import INTERNAL_USER_NAME, ScramConversation
from replset.auth.roles import Grant, grants

USERS_NS = "admin.system.users"
INTERNAL_USER = (INTERNAL_USER_NAME, "local")
INTERNAL_GRANTS = grants([{"role": "__system", "db": "local"}])


def user_id(user: str, db: str) -> str:
    return f"{db}.{user}"


@dataclass
class ConnectionAuth:
    """What one connection has proven: the users it authenticated as, and SCRAM exchanges under way."""

    users: list[tuple[str, str]] = field(default_factory=list)  # (user, db)
    conversations: dict[int, ScramConversation] = field(default_factory=dict)
    next_conversation: int = 0

    def login(self, user: str, db: str) -> None:
        if (user, db) not in self.users:
            self.users.append((user, db))

    def logout(self, db: str) -> None:
        self.users = [u for u in self.users if u[1] != db]


class UserGrants:
    """What each stored user's roles grant, read once and kept until `admin.system.users` changes (the
    member clears it after any commit that wrote there, and when a rollback or a resync replaces its
    data): a command's check costs a dictionary lookup, and a grant or a drop still counts at once."""

    def __init__(self) -> None:
        self._known: dict[str, frozenset[Grant] | None] = {}

    def clear(self) -> None:
        self._known.clear()

    def of(self, reader: Any, uid: str) -> frozenset[Grant] | None:
        """The user's grants, or None if there is no such user."""
        if uid not in self._known:
            doc = reader.get(USERS_NS, uid)
            self._known[uid] = None if doc is None else grants(doc.get("roles") or [])
        return self._known[uid]


def held_grants(reader: Any, auth: ConnectionAuth, cache: UserGrants | None = None) -> tuple[bool, frozenset[Grant]]:
    """(whether any user of the connection still exists, what their roles grant now)."""
    out: set[Grant] = set()
    present = False
    for user, db in auth.users:
        if (user, db) == INTERNAL_USER:
            present = True
            out |= INTERNAL_GRANTS
            continue
        held = (cache or UserGrants()).of(reader, user_id(user, db))
        if held is not None:
            present = True
            out |= held
    return present, frozenset(out)


def is_loopback(peer: str) -> bool:
    host = peer.rpartition(":")[0].strip("[]") or peer
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def public_user(doc: Mapping[str, Any], *, show_credentials: bool) -> dict[str, Any]:
    """A user document as `usersInfo` shows it."""
    out = {k: v for k, v in doc.items() if k != "credentials"}
    out["mechanisms"] = sorted(doc.get("credentials") or {})
    if show_credentials:
        out["credentials"] = doc.get("credentials")
    return out
