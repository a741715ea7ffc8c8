"""The logical sessions this member has seen (`lsid` on a command), for `$listLocalSessions`: each
session's id and last use, kept 30 minutes after that use (`logicalSessionTimeoutMinutes`, as
`hello` reports), forgotten at `endSessions`. At most `MAX_SESSIONS` are kept; past that the
least recently used go first."""

from __future__ import annotations

import datetime
import hashlib
from collections import OrderedDict
from typing import Any

from bson.binary import Binary

from oplog.values import canonical_key

TIMEOUT = datetime.timedelta(minutes=30)
MAX_SESSIONS = 100_000
# Without authentication every session belongs to the empty user name, whose uid is its SHA-256.
NO_USER_UID = Binary(hashlib.sha256(b"").digest())


class LocalSessions:
    def __init__(self) -> None:
        self._seen: OrderedDict[bytes, tuple[Any, datetime.datetime]] = OrderedDict()

    def used(self, lsid: Any, now: datetime.datetime) -> None:
        if not isinstance(lsid, dict) or "id" not in lsid:
            return
        key = canonical_key(lsid["id"])
        self._seen[key] = (lsid["id"], now)
        self._seen.move_to_end(key)
        if len(self._seen) > MAX_SESSIONS:
            self._seen.popitem(last=False)

    def ended(self, session_ids: list[Any]) -> None:
        for session_id in session_ids:
            self._seen.pop(canonical_key(session_id), None)

    def listing(self, now: datetime.datetime) -> list[dict[str, Any]]:
        while self._seen:
            _key, (_, last) = next(iter(self._seen.items()))
            if now - last <= TIMEOUT:
                break
            self._seen.popitem(last=False)
        return [{"_id": {"id": session_id, "uid": NO_USER_UID}, "lastUse": last}
                for session_id, last in self._seen.values()]
