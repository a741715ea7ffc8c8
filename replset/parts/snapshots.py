"""Read snapshots: one query's list of parts, the same for all its tasks, pinned so no member removes them.

Theory of operation
-------------------
A Spark query's tasks read a table at different moments, on different
executors, each fetching some of its parts. They must read one state of the
table: the parts active when the query started, each exactly once - never a
part merged meanwhile together with the part it replaced, and never half a job.
The first task of a query calls `openPartsSnapshot` with the query's key; the
primary lists its visible parts (`TableReplica.visible_parts`, a job's parts
only once all are there), each with the members holding it and their
checksums, and records the list as a pin, `<db>.system.parts.<table>.snapshots`
(`_id` = the key, `expiresAt`). Every later task of the query gets the same
document. While a pin is unexpired, no member removes the parts it names when
they are merged away (`TableReplica.expire` keeps them), so a long scan still
finds them. The primary's leader marks expired pins so (their parts then go as
any old part) and keeps their keys a week: a late task of a query that outlived
its pin is refused (SnapshotTooOld, 239), never handed another list.

A pin belongs to the user who opened it (`owner`, the user's full name; "" without access control):
each user may hold `maxPartsSnapshotsPerUser` unexpired pins (`PinOwners`, counted by every member from
the pins it applies, answered by the primary's), and a pin lasts at most a day (`MAX_TTL_S`): past the
share the user's next snapshot is refused, and nobody else's is touched.
"""

from __future__ import annotations

import asyncio
import datetime
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from base.errors import MongoError
from oplog.entry import insert_entry
from oplog.parts import part_files
from oplog.writes import WriteEnv, ensure_collection
from replset.owner_shares import Shares
from replset.parts.insert import load_table
from replset.parts.names import state_ns, tables_ns
from replset.parts.registry import checksum_docs
from replset.parts.views import readable_parts
from replset.write_concern import MAJORITY, WriteConcern

if TYPE_CHECKING:
    from replset.node import Node

BAD_VALUE = 2
SNAPSHOT_TOO_OLD = 239
PIN_WRITE_CONCERN = WriteConcern(w=MAJORITY)   # a pin a failover lost would give a query's later tasks other parts
DEFAULT_TTL_S = 3600
# A pin keeps the parts it names on every member's disk, merged away or not, for its whole life: a day is
# far longer than any one query (Spark's default is an hour) and bounds what a forgotten pin holds.
MAX_TTL_S = 86_400
MAX_PINS_PER_USER = 1_000   # unexpired pins each user may hold (`maxPartsSnapshotsPerUser`)
MAX_PINS = 100_000   # all users' together


class PinOwners:
    """Whose each unexpired pin is, counted per user: every member keeps it from the pins it applies
    (`PartsManager`); the primary's answers `openPartsSnapshot`."""

    def __init__(self) -> None:
        self.shares = Shares("read snapshots", "maxPartsSnapshotsPerUser", per_owner=MAX_PINS_PER_USER,
                             total=MAX_PINS)
        self._owners: dict[tuple[str, str], str] = {}   # (table ns, key) -> owner

    def pinned(self, ns: str, key: str, owner: str) -> None:
        if (ns, key) not in self._owners:
            self._owners[(ns, key)] = owner
            self.shares.add(owner)   # (counted, never refused: the pin is there)

    def unpinned(self, ns: str, key: str) -> None:
        owner = self._owners.pop((ns, key), None)
        if owner is not None:
            self.shares.give_back(owner)

    def clear(self) -> None:
        self._owners.clear()
        self.shares.clear()


async def visible_parts(node: Node, db: str, name: str) -> list[dict[str, Any]]:
    """This member's visible parts of the table, each with every copy known (its own first, with the
    checksums its directory holds when the registry has none for it yet)."""
    table = load_table(node.store.reader, db, name)
    rt = node.parts.tables.get(table.ns)
    if rt is None:
        return []
    me = node.options.me
    out = []
    for part in readable_parts(rt):
        logged = rt.logged.get(part.name)
        copies = {m: (h.http, h.checksums) for m, h in rt.holders.get(part.name, {}).items() if h.checksums}
        if me not in copies:
            sums = rt.recorded_checksums(part.name, me) or await asyncio.to_thread(
                _checksums_here, os.path.join(rt.directory, part.name))
            if sums:
                copies[me] = (node.options.http_address, sums)
        holders = [{"member": m, "http": http, "checksums": checksum_docs(sums)}
                   for m, (http, sums) in sorted(copies.items(), key=lambda kv: kv[0] != me)]
        out.append({"name": part.name, "partition": part.partition_id, "bytes": logged.bytes if logged else 0,
                    "holders": holders})
    return out


def _checksums_here(path: str) -> dict[str, tuple[int, str]]:
    try:
        return part_files.read_checksums(path)
    except (OSError, ValueError, MongoError):
        return {}


def pin_body(db: str, name: str, key: str, parts: list[dict[str, Any]], ttl_s: int, *,
             owner: str = "", shares: Shares | None = None) -> Callable[[WriteEnv], dict[str, Any]]:
    """The primary's transaction: the pin of `key` as it was first recorded, or recorded now as `owner`'s
    (refused past its share of `shares`)."""
    def body(env: WriteEnv) -> dict[str, Any]:
        load_table(env.txn, db, name)
        ns = state_ns(db, name, "snapshots")
        existing = env.txn.get(ns, key) if env.txn.collection(ns) is not None else None
        if existing is not None and (existing.get("expired") or _expired(existing, env.now)):
            # A late task of a query that outlived its pin: its parts may be gone, and another list would
            # read rows twice or not at all.
            raise MongoError(SNAPSHOT_TOO_OLD, f"the read snapshot {key} of {db}.{name} expired (ttlSecs) before "
                                               "this task of its query started: run the query again with a "
                                               "larger snapshotTtlSecs")
        if existing is None:
            error = None if shares is None else shares.refusal(owner)
            if error is not None:
                raise error
            ensure_collection(env, ns)
            existing = {"_id": key, "parts": parts, "definition": env.txn.get(tables_ns(db), name),
                        "createTime": env.now, "expiresAt": env.now + datetime.timedelta(seconds=ttl_s),
                        "owner": owner}
            env.emit(insert_entry(ns, existing))
        return {"snapshot": existing, "ok": 1.0}
    return body


def pin_of(doc: dict[str, Any]) -> tuple[str, list[str], int]:
    """A pin document as the core keeps it: its key, its parts, until when (wall ms)."""
    until = doc.get("expiresAt")
    until_ms = int(until.timestamp() * 1000) if isinstance(until, datetime.datetime) else 0
    return str(doc["_id"]), [str(p.get("name")) for p in doc.get("parts", ())], until_ms


def _expired(doc: dict[str, Any], now: datetime.datetime) -> bool:
    until = doc.get("expiresAt")
    if not isinstance(until, datetime.datetime):
        return False
    if until.tzinfo is None and now.tzinfo is not None:
        until = until.replace(tzinfo=datetime.UTC)
    return until <= now


def parse_ttl(raw: Any) -> int:
    if raw is None:
        return DEFAULT_TTL_S
    if isinstance(raw, bool) or not isinstance(raw, (int, float)) or int(raw) != raw or not 0 < raw <= MAX_TTL_S:
        raise MongoError(BAD_VALUE, f"ttlSecs must be a whole number of seconds from 1 to {MAX_TTL_S}, not {raw!r}")
    return int(raw)
