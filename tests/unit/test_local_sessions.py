"""Sessions seen, for $listLocalSessions: kept 30 minutes after their last use, forgotten at
endSessions, least recently used first to go past the bound."""

from __future__ import annotations

import datetime

from replset import local_sessions
from replset.local_sessions import LocalSessions

T0 = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)


def test_sessions_expire_end_and_are_bounded(monkeypatch: object) -> None:
    seen = LocalSessions()
    seen.used({"id": "a"}, T0)
    seen.used({"id": "b"}, T0 + datetime.timedelta(minutes=20))
    seen.used({"not": "a session"}, T0)
    assert [s["_id"]["id"] for s in seen.listing(T0 + datetime.timedelta(minutes=25))] == ["a", "b"]
    assert [s["_id"]["id"] for s in seen.listing(T0 + datetime.timedelta(minutes=40))] == ["b"]
    seen.ended(["b"])
    assert seen.listing(T0) == []
    monkeypatch.setattr(local_sessions, "MAX_SESSIONS", 2)  # type: ignore[attr-defined]
    for name in "xyz":
        seen.used({"id": name}, T0)
    assert [s["_id"]["id"] for s in seen.listing(T0)] == ["y", "z"]
