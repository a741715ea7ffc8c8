"""Who may use the HTTP port when auth is on: every route but `/health` needs a user (HTTP Basic,
checked against the same `admin.system.users` credentials as SCRAM logins: the password's SCRAM-SHA-256
ClientKey must hash to the StoredKey) or, for members fetching parts from each other, a token the keyfile
makes for that one request (`Authorization: Bearer <expiry>.<nonce>.<HMAC-SHA-256>`, bound to this member,
the method and the path, good for a minute and once: replset/auth/member_token.py explains why it cannot
be replayed). The route then needs what the wire command it mirrors needs (`mirrored_command`), checked by
the same `replset.auth.privileges.authorize`.

A password check costs 15,000 PBKDF2 rounds, so it runs off the event loop, a few at a time
(`replset.auth.password_checks`), and a success is remembered for `REMEMBER_S` (keyed by the user and a
hash of the password, never the password). An address with too many failed checks is answered 429 before
its password is looked at (`replset.auth.login_limit`).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from collections.abc import Mapping
from typing import Any

from base.scram import SHA256, mechanism_password
from replset.auth.login_limit import FailedLogins
from replset.auth.member_token import Refused, TokenCheck
from replset.auth.roles import Grant, grants
from replset.auth.users import USERS_NS, user_id

REMEMBER_S = 60.0


def password_matches(stored: Mapping[str, Any], user: str, password: str) -> bool:
    """Whether `password` is the one `stored` (a SCRAM-SHA-256 credentials entry) was made from."""
    import scramp.utils

    prepped = scramp.utils.saslprep(mechanism_password(SHA256, user, password))
    salted = hashlib.pbkdf2_hmac("sha256", prepped.encode(), base64.b64decode(stored["salt"]),
                                 int(stored["iterationCount"]))
    client_key = hmac.digest(salted, b"Client Key", hashlib.sha256)
    return hmac.compare_digest(hashlib.sha256(client_key).digest(), base64.b64decode(stored["storedKey"]))


Mirrored = tuple[str, str, dict[str, Any]]  # (command, database, command document)
_TABLE_ROUTES = {("GET", "parts"): "partsStatus", ("GET", "replication_queue"): "partsReplicationQueue",
                 ("POST", "insert"): "insertBlock"}
_MONITORING = ("replSetGetStatus", "admin", {"replSetGetStatus": 1})


def mirrored_command(method: str, path: str) -> Mirrored | None:
    """The wire command a route does the work of, so that it needs exactly what that command needs
    (replset/auth/privileges.py); None for `/health`, which needs no user. A part file is what a
    `selectParts` reads; a table's routes are its `partsStatus`, `partsReplicationQueue` and
    `insertBlock`; the status page, `/replSetGetStatus` and `/hello` are the status command's;
    `/metrics` and `/hops` `serverStatus`'s; anything else the status command's too."""
    if path == "/health":
        return None
    parts = path.strip("/").split("/")
    db, _, table = parts[1].partition(".") if len(parts) >= 2 else ("", "", "")
    if parts[0] == "parts" and len(parts) == 4 and method == "GET":
        return "selectParts", db, {"selectParts": table}
    if parts[0] == "tables" and len(parts) == 3 and (method, parts[2]) in _TABLE_ROUTES:
        name = _TABLE_ROUTES[(method, parts[2])]
        return name, db, {name: table}
    if parts[0] in ("metrics", "hops"):
        return "serverStatus", "admin", {"serverStatus": 1}
    return _MONITORING


class HttpAuth:
    def __init__(self, internal_key: str | None, audience: str) -> None:
        """`audience`: this member's HTTP address as the config names it (what members' tokens name)."""
        self._tokens = None if internal_key is None else TokenCheck(internal_key, audience)
        self._remembered: dict[tuple[str, str], float] = {}  # (user id, password hash) -> until
        self.failed_logins = FailedLogins()

    def member_refusal(self, header: str, method: str, path: str, now_ms: int) -> Refused | None:
        """None when `header` is a member's token for this request (its nonce is then spent), else why not;
        `now_ms` is the wall clock (tokens cross members)."""
        if self._tokens is None:
            return Refused("this member has no keyfile", signed=False)
        return self._tokens.check(header, method, path, now_ms)

    @staticmethod
    def basic(header: str) -> tuple[str, str] | None:
        if not header.startswith("Basic "):
            return None
        try:
            user, _, password = base64.b64decode(header[6:], validate=True).decode().partition(":")
        except (ValueError, UnicodeDecodeError):
            return None
        return user, password

    def remembered(self, uid: str, password: str, now: float) -> bool:
        until = self._remembered.get((uid, hashlib.sha256(password.encode()).hexdigest()))
        return until is not None and until > now

    def remember(self, uid: str, password: str, now: float) -> None:
        if len(self._remembered) > 10_000:
            self._remembered.clear()
        self._remembered[(uid, hashlib.sha256(password.encode()).hexdigest())] = now + REMEMBER_S


def user_grants(doc: Mapping[str, Any] | None) -> frozenset[Grant]:
    return frozenset() if doc is None else grants(doc.get("roles") or [])


def lookup(reader: Any, user: str) -> tuple[str, Mapping[str, Any] | None]:
    """`name` (on admin) or `name@db`: the user's id and document."""
    name, _, db = user.partition("@")
    uid = user_id(name, db or "admin")
    return uid, reader.get(USERS_NS, uid)

