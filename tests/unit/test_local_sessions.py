"""Sessions seen, for $listLocalSessions: kept 30 minutes after their last use, forgotten at
endSessions, each its first user's (another user's command under it is refused, a member may act on
any), bounded per user and in all by refusing the new session, never by dropping another's."""

from __future__ import annotations

import datetime
import hashlib

import pytest
from bson.binary import Binary

from base.errors import MongoError
from replset import local_sessions
from replset.local_sessions import NO_USER_UID, LocalSessions, SessionUser

T0 = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)
NOBODY = SessionUser()  # without access control
ROOT = SessionUser("root@admin")
READER = SessionUser("read@A")
MEMBER = SessionUser(internal=True)


def _ids(listing: list[dict[str, object]]) -> list[object]:
    return [s["_id"]["id"] for s in listing]  # type: ignore[index]


def test_sessions_expire_end_and_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    seen = LocalSessions()
    seen.used({"id": "a"}, NOBODY, T0)
    seen.used({"id": "b"}, NOBODY, T0 + datetime.timedelta(minutes=20))
    seen.used({"not": "a session"}, NOBODY, T0)
    assert _ids(seen.listing(T0 + datetime.timedelta(minutes=25))) == ["a", "b"]
    assert _ids(seen.listing(T0 + datetime.timedelta(minutes=40))) == ["b"]
    seen.ended(["b"])
    assert seen.listing(T0) == []
    monkeypatch.setattr(local_sessions, "MAX_SESSIONS", 2)
    bounded = LocalSessions(per_user=10)
    for name in "xy":
        bounded.used({"id": name}, NOBODY, T0)
    with pytest.raises(MongoError) as full:
        bounded.used({"id": "z"}, NOBODY, T0)
    assert full.value.code == 261
    bounded.used({"id": "x"}, NOBODY, T0)  # (a session kept is used on)
    assert _ids(bounded.listing(T0)) == ["y", "x"]  # nobody's session was dropped for the new one
    bounded.ended(["y"])
    bounded.used({"id": "z"}, NOBODY, T0)


def test_a_session_is_its_first_users() -> None:
    seen = LocalSessions()
    seen.used({"id": "r"}, ROOT, T0)
    with pytest.raises(MongoError) as mismatch:
        seen.used({"id": "r"}, READER, T0)
    assert mismatch.value.code == 13 and "Users mismatch" in mismatch.value.errmsg
    seen.used({"id": "r"}, MEMBER, T0)  # a member acts on any session...
    seen.used({"id": "m"}, MEMBER, T0)  # ...and owns none: the client's to claim
    seen.used({"id": "m"}, READER, T0)
    assert (seen.owner("r"), seen.owner("m"), seen.owner("unknown")) == ("root@admin", "read@A", None)
    root_uid = hashlib.sha256(b"root@admin").digest()
    seen.used({"id": "r", "uid": root_uid}, ROOT, T0)
    with pytest.raises(MongoError) as spoofed:
        seen.used({"id": "new", "uid": root_uid}, READER, T0)
    assert spoofed.value.code == 13 and "user digest" in spoofed.value.errmsg
    assert seen.owner("new") is None


def test_listing_shows_each_sessions_user() -> None:
    seen = LocalSessions()
    seen.used({"id": "r"}, ROOT, T0)
    seen.used({"id": "a"}, READER, T0)
    mine = seen.listing(T0, {"read@A"})
    assert mine == [{"_id": {"id": "a", "uid": Binary(hashlib.sha256(b"read@A").digest())}, "lastUse": T0,
                     "user": {"name": "read@A"}}]
    assert _ids(seen.listing(T0)) == ["r", "a"]
    assert seen.ids_of({"root@admin"}) == ["r"]
    without_auth = LocalSessions()
    without_auth.used({"id": "x"}, NOBODY, T0)
    assert without_auth.listing(T0, {""}) == [{"_id": {"id": "x", "uid": NO_USER_UID}, "lastUse": T0}]


def test_each_user_keeps_its_share_of_sessions() -> None:
    seen = LocalSessions(per_user=2)
    seen.used({"id": "a1"}, READER, T0)
    seen.used({"id": "a2"}, READER, T0)
    with pytest.raises(MongoError) as refused:
        seen.used({"id": "a3"}, READER, T0)
    assert refused.value.code == 261 and "read@A holds 2 sessions" in refused.value.errmsg
    seen.used({"id": "r1"}, ROOT, T0)  # root is not refused, and read@A lost nothing
    assert _ids(seen.listing(T0)) == ["a1", "a2", "r1"]
    seen.used({"id": "a3"}, READER, T0 + datetime.timedelta(minutes=31))  # expired ones freed the places
    assert _ids(seen.listing(T0 + datetime.timedelta(minutes=31))) == ["a3"]
