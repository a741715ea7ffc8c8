"""The logical sessions this member has seen (`lsid` on a command), whose each is, and their last use, for
`$listLocalSessions`, `endSessions` and `killSessions`. A session is kept 30 minutes after its last use
(`logicalSessionTimeoutMinutes`, as `hello` reports) and forgotten at `endSessions`.

A session belongs to the user who used it first on this member, as mongod binds a session to its user
(the `uid` of an lsid is the SHA-256 of the user's full name, "user@db"): another user's command under it
is refused (Unauthorized, 13), and so is an lsid naming another user's `uid`. A member (the keyfile's
internal user) may act on any session and owns none. Without access control every session is the empty
user's (`NO_USER_UID`) and anyone may use any. Each user may keep `per_user` sessions and all together
`MAX_SESSIONS`; a new session past either is refused (TooManyLogicalSessions, 261), as mongod refuses one
past `maxSessions`: nobody's session is dropped to make room."""

from __future__ import annotations

import datetime
import functools
import hashlib
from collections import OrderedDict
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from typing import Any

from bson.binary import Binary

from base.errors import MongoError
from oplog.values import canonical_key
from replset.owner_shares import Shares

TIMEOUT = datetime.timedelta(minutes=30)
MAX_SESSIONS = 100_000
MAX_SESSIONS_PER_USER = 10_000
UNAUTHORIZED = 13
TOO_MANY_LOGICAL_SESSIONS = 261


@functools.lru_cache(maxsize=1024)
def user_digest(name: str) -> Binary:
    """mongod's `uid` of a user's sessions: the SHA-256 of its full name ("user@db"; "" without auth)."""
    return Binary(hashlib.sha256(name.encode()).digest())


# Without authentication every session belongs to the empty user name, whose uid is its SHA-256.
NO_USER_UID = user_digest("")


@dataclass(frozen=True, slots=True)
class SessionUser:
    """Who a command runs as, for the session it names: `name` is the user's full name ("user@db"; a
    connection's users joined by ","; "" without access control). `internal`: a member, which may act on
    any session and owns none."""

    name: str = ""
    internal: bool = False

    @property
    def uid(self) -> Binary:
        return user_digest(self.name)

    @property
    def any_session(self) -> bool:
        return self.internal or not self.name


@dataclass(slots=True)
class _Session:
    id: Any
    owner: str  # the user's full name
    last_use: datetime.datetime


def foreign_digest(lsid: dict[str, Any], user: SessionUser) -> bool:
    """Whether an lsid names (`uid`) a user other than `user`."""
    given = lsid.get("uid")
    return given is not None and (not isinstance(given, bytes) or bytes(given) != bytes(user.uid))


class LocalSessions:
    def __init__(self, per_user: int = MAX_SESSIONS_PER_USER) -> None:
        self._seen: OrderedDict[bytes, _Session] = OrderedDict()  # least recently used first
        self._shares = Shares("sessions", "the sessions each user may keep", per_owner=per_user,
                              total=MAX_SESSIONS, code=TOO_MANY_LOGICAL_SESSIONS)

    def used(self, lsid: Any, user: SessionUser, now: datetime.datetime) -> None:
        """A command of `user` names `lsid`: the session is recorded as `user`'s if it is new, refused
        (13) if it is another user's."""
        if not isinstance(lsid, dict) or "id" not in lsid:
            return
        if foreign_digest(lsid, user) and not user.any_session:
            raise MongoError(UNAUTHORIZED, "Unauthorized to set user digest in LogicalSessionId")
        self._expire(now)
        key = canonical_key(lsid["id"])
        session = self._seen.get(key)
        if session is None:
            if user.internal:
                return  # (a member acting for a client: the session stays the client's to claim)
            self._shares.take(user.name)
            session = self._seen[key] = _Session(lsid["id"], user.name, now)
        elif session.owner != user.name and not user.any_session:
            raise MongoError(UNAUTHORIZED, f"Users mismatch: the session {lsid['id']} belongs to another user "
                                           f"than {user.name}")
        session.last_use = now
        self._seen.move_to_end(key)

    def owner(self, session_id: Any) -> str | None:
        """The full name of the session's user, None for a session not kept here."""
        session = self._seen.get(canonical_key(session_id))
        return None if session is None else session.owner

    def ids_of(self, owners: Collection[str] | None) -> list[Any]:
        """The ids of the sessions of `owners` (None: everybody's)."""
        return [s.id for s in self._seen.values() if owners is None or s.owner in owners]

    def ended(self, session_ids: Iterable[Any]) -> None:
        for session_id in session_ids:
            session = self._seen.pop(canonical_key(session_id), None)
            if session is not None:
                self._shares.give_back(session.owner)

    def _expire(self, now: datetime.datetime) -> None:
        while self._seen:
            key, session = next(iter(self._seen.items()))
            if now - session.last_use <= TIMEOUT:
                break
            del self._seen[key]
            self._shares.give_back(session.owner)

    def listing(self, now: datetime.datetime, owners: Collection[str] | None = None) -> list[dict[str, Any]]:
        """`$listLocalSessions`' documents: the sessions of `owners` (None: everybody's) used in the
        last 30 minutes, each with its user's digest (and name, with access control)."""
        self._expire(now)
        out = []
        for s in self._seen.values():
            if owners is None or s.owner in owners:
                doc: dict[str, Any] = {"_id": {"id": s.id, "uid": user_digest(s.owner)}, "lastUse": s.last_use}
                if s.owner:
                    doc["user"] = {"name": s.owner}
                out.append(doc)
        return out
