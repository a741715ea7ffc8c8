"""SCRAM-SHA-1 and SCRAM-SHA-256 as MongoDB speaks them; the `scramp` library runs the protocol.

What MongoDB adds to RFC 5802 / 7677, and is done here:
- A user's stored credentials are salt, StoredKey and ServerKey (base64) and the iteration count,
  per mechanism, never the password (`make_credentials`).
- SCRAM-SHA-1's password is the hex MD5 digest of `user:mongo:password` (MongoDB's legacy digest);
  SCRAM-SHA-256's is the password SASLprepped (scramp SASLpreps passwords; a hex digest is
  unchanged by it).
- Usernames are not SASLprepped: the name in the client's first message is only unescaped
  (`=2C` -> `,`, `=3D` -> `=`) and looked up as sent (scramp SASLpreps the name it passes on; that
  one is not used).
- Iteration counts: 10,000 for SCRAM-SHA-1 and 15,000 for SCRAM-SHA-256 (mongod's defaults).
"""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Callable, Mapping
from typing import Any

import scramp

SHA1 = "SCRAM-SHA-1"
SHA256 = "SCRAM-SHA-256"
MECHANISMS = (SHA1, SHA256)
ITERATIONS = {SHA1: 10_000, SHA256: 15_000}
INTERNAL_USER_NAME = "__system"  # members authenticate as __system@local, the keyfile's key as password


class AuthenticationFailed(Exception):
    """Wrong password, unknown user or a malformed exchange: all look alike to the client (18)."""


def mechanism_password(mechanism: str, user: str, password: str) -> str:
    if mechanism == SHA1:
        return hashlib.md5(f"{user}:mongo:{password}".encode(), usedforsecurity=False).hexdigest()
    return password


def make_credentials(user: str, password: str, mechanisms: tuple[str, ...] = MECHANISMS) -> dict[str, Any]:
    """The `credentials` of a user document: per mechanism, what verifies a proof and nothing more."""
    out: dict[str, Any] = {}
    for mechanism in mechanisms:
        salt, stored_key, server_key, iterations = scramp.ScramMechanism(mechanism).make_auth_info(
            mechanism_password(mechanism, user, password), iteration_count=ITERATIONS[mechanism])
        out[mechanism] = {"iterationCount": iterations, "salt": _b64(salt), "storedKey": _b64(stored_key),
                          "serverKey": _b64(server_key)}
    return out


def unescape_username(escaped: str) -> str:
    return escaped.replace("=2C", ",").replace("=3D", "=")


def _username_as_sent(client_first: str) -> str | None:
    """The `n=` attribute of a client-first message (`gs2-header n=<name>,r=<nonce>...`), unescaped."""
    parts = client_first.split(",")
    if len(parts) < 4 or not parts[2].startswith("n="):
        return None
    return unescape_username(parts[2][2:])


class ScramConversation:
    """The server's side of one SCRAM exchange. `lookup(user)` gives that user's credentials for this
    mechanism (a `make_credentials` entry) or None."""

    def __init__(self, mechanism: str, lookup: Callable[[str], Mapping[str, Any] | None], *, db: str = "admin",
                 skip_empty_exchange: bool = False) -> None:
        if mechanism not in MECHANISMS:
            raise AuthenticationFailed(f"unsupported mechanism {mechanism}")
        self.mechanism = mechanism
        self.db = db  # the user's database (the command's)
        self.skip_empty_exchange = skip_empty_exchange  # done once the proof is checked, not one step later
        self.user: str | None = None
        self._lookup = lookup
        self._server = scramp.ScramMechanism(mechanism).make_server(self._auth_info)
        self._done = False

    def _auth_info(self, _prepped: str) -> tuple[bytes, bytes, bytes, int] | None:
        # scramp hands over the name SASLprepped (Ⅸ would become IX); the user is the name as sent
        # (`first` took it from the message).
        if self.user is None:
            return None
        stored = self._lookup(self.user)
        if stored is None:
            return None
        return (base64.b64decode(stored["salt"]), base64.b64decode(stored["storedKey"]),
                base64.b64decode(stored["serverKey"]), int(stored["iterationCount"]))

    def first(self, payload: bytes) -> bytes:
        """The client's first message in; the server's first message out."""
        try:
            message = payload.decode()
            self.user = _username_as_sent(message)
            self._server.set_client_first(message)
            return self._server.get_server_first().encode()
        except (scramp.ScramException, UnicodeDecodeError, ValueError) as err:
            raise AuthenticationFailed(str(err)) from None

    def final(self, payload: bytes) -> bytes:
        """The client's proof in; the server's signature out (the user is then authenticated)."""
        try:
            self._server.set_client_final(payload.decode())
            answer = self._server.get_server_final().encode()
        except (scramp.ScramException, UnicodeDecodeError, ValueError) as err:
            raise AuthenticationFailed(str(err)) from None
        self._done = True
        return answer

    @property
    def done(self) -> bool:
        return self._done


def client_exchange(mechanism: str, user: str, password: str) -> scramp.ScramClient:
    """The client's side, for members authenticating to each other (`__system`)."""
    return scramp.ScramClient([mechanism], user, mechanism_password(mechanism, user, password))


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()
