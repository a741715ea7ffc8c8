"""The members' HTTP token (replset/auth/member_token.py): good once, for one request to one member, for a
minute; a replay, another path or method, another member, another key or an edited token is refused."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from replset.auth.member_token import (
    LIFETIME_MS,
    MAX_SKEW_MS,
    Refused,
    ReplayCache,
    TokenCheck,
    Verified,
    make_token,
    verify,
)

KEY = "c2VjcmV0IGtleWZpbGUgY29udGVudHM="
ME = "127.0.0.1:28017"
PATH = "/parts/app.events/all_1_1_0/data.parquet"
NOW_MS = 1_700_000_000_000
_nonces = (f"{n:032x}" for n in itertools.count(1))


def token(*, key: str = KEY, audience: str = ME, method: str = "GET", path: str = PATH, now_ms: int = NOW_MS,
          nonce: str | None = None) -> str:
    return make_token(key, audience=audience, method=method, path=path, now_ms=now_ms,
                      nonce=next(_nonces) if nonce is None else nonce)


def test_a_token_admits_its_request_once() -> None:
    check = TokenCheck(KEY, ME)
    header = token()
    assert check.check(header, "GET", PATH, NOW_MS + 10) is None
    replay = check.check(header, "GET", PATH, NOW_MS + 20)
    assert isinstance(replay, Refused) and "used before" in replay.reason and replay.signed
    assert check.check(token(), "GET", PATH, NOW_MS + 30) is None   # a fresh token for the same request


def test_an_expired_token_is_refused_and_its_nonce_forgotten() -> None:
    check = TokenCheck(KEY, ME)
    header = token()
    late = check.check(header, "GET", PATH, NOW_MS + LIFETIME_MS)
    assert isinstance(late, Refused) and "expired" in late.reason and late.signed
    assert check.check(token(), "GET", PATH, NOW_MS + LIFETIME_MS - 1) is None
    assert len(check._seen) == 1
    assert check.check(token(now_ms=NOW_MS + 3 * LIFETIME_MS), "GET", PATH, NOW_MS + 3 * LIFETIME_MS) is None
    assert len(check._seen) == 1   # the first nonce was pruned at its expiry


@pytest.mark.parametrize("other", [
    {"path": "/parts/app.events/all_1_1_0/columns.txt"},
    {"path": "/replSetGetStatus"},
    {"method": "POST"},
    {"audience": "127.0.0.1:28018"},   # made for another member
    {"key": "YW5vdGhlciBrZXlmaWxl"},
])
def test_a_token_for_another_request_member_or_key_is_refused(other: dict[str, str]) -> None:
    refused = TokenCheck(KEY, ME).check(token(**other), "GET", PATH, NOW_MS)   # type: ignore[arg-type]
    assert isinstance(refused, Refused) and not refused.signed


def test_a_token_from_a_clock_far_ahead_is_refused() -> None:
    check = TokenCheck(KEY, ME)
    assert check.check(token(now_ms=NOW_MS + MAX_SKEW_MS), "GET", PATH, NOW_MS) is None
    ahead = check.check(token(now_ms=NOW_MS + MAX_SKEW_MS + 1), "GET", PATH, NOW_MS)
    assert isinstance(ahead, Refused) and "clock ahead" in ahead.reason


@pytest.mark.parametrize("header", [
    "", "Basic YWRtaW46cHc=", "Bearer ", "Bearer abc", "Bearer 1.2.3",
    f"Bearer {NOW_MS}.{'0' * 32}.{'0' * 64}",
    f"Bearer {NOW_MS}.{'A' * 32}.{'0' * 64}",
    token() + " ", token().replace("Bearer ", "bearer "),
])
def test_anything_else_is_refused_unsigned(header: str) -> None:
    refused = TokenCheck(KEY, ME).check(header, "GET", PATH, NOW_MS)
    assert isinstance(refused, Refused) and not refused.signed


def test_a_full_cache_refuses_rather_than_forgets() -> None:
    check = TokenCheck(KEY, ME, capacity=2)
    assert check.check(token(), "GET", PATH, NOW_MS) is None
    assert check.check(token(), "GET", PATH, NOW_MS) is None
    full = check.check(token(), "GET", PATH, NOW_MS)
    assert isinstance(full, Refused) and "try again later" in full.reason
    assert check.check(token(now_ms=NOW_MS + LIFETIME_MS), "GET", PATH, NOW_MS + LIFETIME_MS) is None


def test_a_bad_nonce_is_not_made() -> None:
    with pytest.raises(ValueError):
        token(nonce="not hex")


@settings(max_examples=200, deadline=None)
@given(made_ms=st.integers(NOW_MS - 2 * LIFETIME_MS, NOW_MS + 2 * LIFETIME_MS),
       method=st.sampled_from(["GET", "POST"]), path=st.text(min_size=1, max_size=40),
       flip=st.integers(0, 200))
def test_verify_admits_exactly_the_live_unedited_tokens(made_ms: int, method: str, path: str, flip: int) -> None:
    header = token(method=method, path=path, now_ms=made_ms)
    expiry_ms = made_ms + LIFETIME_MS
    alive = NOW_MS < expiry_ms <= NOW_MS + LIFETIME_MS + MAX_SKEW_MS
    result = verify(KEY, header, audience=ME, method=method, path=path, now_ms=NOW_MS)
    assert isinstance(result, Verified) == alive
    assert result.signed if isinstance(result, Refused) else result.expiry_ms == expiry_ms
    at = len("Bearer ") + flip % (len(header) - len("Bearer "))   # one character of the token changed
    edited = header[:at] + ("1" if header[at] != "1" else "2") + header[at + 1:]
    assert isinstance(verify(KEY, edited, audience=ME, method=method, path=path, now_ms=NOW_MS), Refused)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 20), st.integers(1, 200), st.integers(0, 50)), max_size=60))
def test_the_replay_cache_against_a_naive_twin(events: list[tuple[int, int, int]]) -> None:
    """Each (nonce, lifetime, step): the cache admits a nonce iff no admission of it is still alive."""
    cache, admitted, now = ReplayCache(capacity=1_000), [], 0
    for nonce, lifetime, step in events:
        now += step
        alive = any(n == nonce and expiry > now for n, expiry in admitted)
        result = cache.admit(f"{nonce:032x}", now + lifetime, now)
        assert (result is None) == (not alive)
        if result is None:
            admitted.append((nonce, now + lifetime))
        assert len(cache) == len({n for n, expiry in admitted if expiry > now})
