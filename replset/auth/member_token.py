"""The token a member proves the keyfile with on another member's HTTP port (part fetches).

    Authorization: Bearer <expiry_ms>.<nonce>.<HMAC-SHA-256 under the key of
                   (label, audience, method, path, expiry_ms, nonce)>

Theory of operation
-------------------
A member that fetches `GET /parts/db.t/<part>/data.parquet` from the member whose HTTP address (as the
config names it) is `audience` makes a token for that one request: a fresh random nonce, an expiry
`LIFETIME_MS` ahead on its wall clock, and a MAC that binds them to the audience, the method and the
path. Only a holder of the keyfile can make one. The receiving member (`TokenCheck`) recomputes the MAC
for its own address and the request it is answering, then admits the token if:

- the MAC matches (the key, this member, this method, this path; any other request needs another MAC);
- it has not expired, and its expiry is at most `LIFETIME_MS + MAX_SKEW_MS` ahead (a token cannot be made
  to live longer than that, so the replay cache below never has to remember a nonce longer either);
- its nonce was never admitted before (`ReplayCache`: every admitted nonce is kept until its token's
  expiry, then pruned).

Why it cannot be replayed: a token seen once (a log, a proxy, a capture) names one request to one member.
Sent again to that member, its nonce is already in the cache; sent with another path or method, or to
another member, its MAC does not match; edited (a later expiry, another nonce), its MAC does not match;
kept until the cache forgot the nonce, it has expired. The cache is bounded (`REPLAY_CAPACITY`): when it is
full of live nonces a new token is refused, never admitted unremembered (the fetch is retried later).

The members' wall clocks must agree within `MAX_SKEW_MS` (a member far ahead makes tokens the others refuse
as too long-lived; one far behind makes tokens that have already expired): a refusal says which.

Pure: the clock reading (`now_ms`, wall milliseconds) and the nonce come in from the caller
(`replset.node` draws nonces from `secrets`).
"""

from __future__ import annotations

__layer__ = "core"  # pure: no I/O, clock or randomness (tests/unit/test_layering.py)

import hashlib
import heapq
import hmac
import re
from dataclasses import dataclass

LIFETIME_MS = 60_000          # how long a token is good for after it is made
MAX_SKEW_MS = 30_000          # how far ahead of this member's clock another member's may be
REPLAY_CAPACITY = 200_000     # live nonces remembered (a nonce lives at most LIFETIME_MS + MAX_SKEW_MS)
SCHEME = "Bearer "
_LABEL = b"replset member http request"
_TOKEN = re.compile(r"([0-9]{1,15})\.([0-9a-f]{32})\.([0-9a-f]{64})")
_NONCE = re.compile(r"[0-9a-f]{32}")


def _mac(key: str, audience: str, method: str, path: str, expiry_ms: int, nonce: str) -> str:
    fields = (audience.lower(), method.upper(), path, str(expiry_ms), nonce)
    message = _LABEL + b"".join(b"\0" + f.encode("utf-8", "surrogateescape") for f in fields)
    return hmac.new(key.encode(), message, hashlib.sha256).hexdigest()


def make_token(key: str, *, audience: str, method: str, path: str, now_ms: int, nonce: str) -> str:
    """The `Authorization` header for one request to the member at `audience` (its HTTP address as the
    config names it); `nonce` is 32 random hex digits, never used twice."""
    if not _NONCE.fullmatch(nonce):
        raise ValueError("a token's nonce is 32 lowercase hex digits")
    expiry_ms = now_ms + LIFETIME_MS
    return f"{SCHEME}{expiry_ms}.{nonce}.{_mac(key, audience, method, path, expiry_ms, nonce)}"


@dataclass(frozen=True, slots=True)
class Verified:
    nonce: str
    expiry_ms: int


@dataclass(frozen=True, slots=True)
class Refused:
    reason: str
    signed: bool   # the MAC matched: a member made it (the refusal is worth a log line), not a stranger


def verify(key: str, header: str, *, audience: str, method: str, path: str, now_ms: int) -> Verified | Refused:
    """Whether `header` is a token made with `key` for this request to this member and alive at `now_ms`
    (the replay cache is the caller's next step: `TokenCheck`)."""
    if not header.startswith(SCHEME):
        return Refused("not a member token", signed=False)
    match = _TOKEN.fullmatch(header[len(SCHEME):])
    if match is None:
        return Refused("a malformed member token", signed=False)
    expiry_ms, nonce, mac = int(match[1]), match[2], match[3]
    if not hmac.compare_digest(mac, _mac(key, audience, method, path, expiry_ms, nonce)):
        return Refused("a member token for another key, member or request", signed=False)
    if expiry_ms <= now_ms:
        return Refused(f"a member token that expired {(now_ms - expiry_ms) / 1000:.1f} s ago (or the member "
                       "that made it has a clock behind this one's)", signed=True)
    if expiry_ms > now_ms + LIFETIME_MS + MAX_SKEW_MS:
        return Refused(f"a member token that lives {(expiry_ms - now_ms) / 1000:.1f} s more, longer than "
                       f"{(LIFETIME_MS + MAX_SKEW_MS) / 1000:g} s (the member that made it has a clock ahead "
                       "of this one's)", signed=True)
    return Verified(nonce, expiry_ms)


class ReplayCache:
    """The nonces admitted, each until its token's expiry: a nonce is admitted once."""

    def __init__(self, capacity: int = REPLAY_CAPACITY) -> None:
        self._capacity = capacity
        self._expiry_ms: dict[str, int] = {}
        self._by_expiry: list[tuple[int, str]] = []   # a heap, to prune the expired first

    def __len__(self) -> int:
        return len(self._expiry_ms)

    def admit(self, nonce: str, expiry_ms: int, now_ms: int) -> Refused | None:
        """None, remembering `nonce` until `expiry_ms`; or why not (seen before, or the cache is full)."""
        self._prune(now_ms)
        if nonce in self._expiry_ms:
            return Refused("a member token used before (a replay)", signed=True)
        if len(self._expiry_ms) >= self._capacity:
            return Refused(f"a member token while {self._capacity} others are alive (try again later)",
                           signed=True)
        self._expiry_ms[nonce] = expiry_ms
        heapq.heappush(self._by_expiry, (expiry_ms, nonce))
        return None

    def _prune(self, now_ms: int) -> None:
        while self._by_expiry and self._by_expiry[0][0] <= now_ms:
            _expiry, nonce = heapq.heappop(self._by_expiry)
            del self._expiry_ms[nonce]


class TokenCheck:
    """The receiving member's side: `verify`, then the replay cache."""

    def __init__(self, key: str, audience: str, capacity: int = REPLAY_CAPACITY) -> None:
        self._key = key
        self._audience = audience
        self._seen = ReplayCache(capacity)

    def check(self, header: str, method: str, path: str, now_ms: int) -> Refused | None:
        """None when `header` admits this request (its nonce is then spent), else why not."""
        result = verify(self._key, header, audience=self._audience, method=method, path=path, now_ms=now_ms)
        if isinstance(result, Refused):
            return result
        return self._seen.admit(result.nonce, result.expiry_ms, now_ms)
