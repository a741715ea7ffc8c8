"""Change events: what a change stream shows for an oplog entry, and resume tokens.

An entry records a write's result (see `oplog.entry`), which is what a change event describes:

* `i` -> `insert` with `fullDocument`;
* `u` in operator form (`$set` / `$unset` of the changed paths) -> `update` with `updateDescription`
  (`updatedFields`, `removedFields`, `truncatedArrays`, with `showExpandedEvents` `disambiguatedPaths`:
  the entry's `$set`, `$unset`, `$truncate` and `$disambiguated`, see `oplog.update`);
  a whole new document -> `replace` with `fullDocument`;
* `d` -> `delete`;
* commands: `drop` -> `drop`, `renameCollection` -> `rename` (with `to`), `dropDatabase` ->
  `dropDatabase`. A stream on the collection (database) that went away then ends with `invalidate`.
* a transaction's `applyOps` -> the events of its writes, in order, with its `lsid` and `txnNumber`
  (event index = the write's position in the transaction);
* with `showExpandedEvents`: `create`, `createIndexes`, `dropIndexes`, `modify` (collMod), each with
  `operationDescription`,
  `collectionUUID` on every event, and `operationDescription` on `rename`.
* No-ops, and without `showExpandedEvents` index builds and collection creation, show nothing; nor
  does the member's own state (`local`, `admin`, `config`, `system.*` collections, the part log's
  state).

A resume token is `{_data: <hex>}`: the entry's timestamp as 16 hex digits, then the event's index in
that entry as 4 (an entry may give two events: a `drop` and the `invalidate` after it), then `1` for
an `invalidate` event. Event tokens sort as their strings, in oplog order, like mongod's KeyString tokens;
a token with only a timestamp (`postBatchResumeToken` when no event came) resumes after every event of
that entry. Pure: no I/O, no clock.
"""

from __future__ import annotations

__layer__ = "core"  # pure: no I/O, clock or randomness (tests/unit/test_layering.py)

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import bson
from bson.timestamp import Timestamp

from base.errors import MongoError
from oplog.entry import flattened
from oplog.update import DISAMBIGUATED, TRUNCATE

INTERNAL_DBS = frozenset({"admin", "config", "local"})
BAD_TOKEN = 50811  # ChangeStreamFatalError's neighbour: "KeyString format error" for a token we cannot read
INVALIDATE = "invalidate"


@dataclass(frozen=True, slots=True)
class StreamScope:
    """What a stream watches: one collection, one database, or every user database (`db` None)."""

    db: str | None = None
    coll: str | None = None
    expanded: bool = False  # showExpandedEvents: DDL events (create, createIndexes, dropIndexes) too

    def watches(self, db: str, coll: str | None) -> bool:
        if db in INTERNAL_DBS:
            return False
        if coll is not None and (coll.startswith("system.")):
            return False
        if self.db is not None and db != self.db:
            return False
        return self.coll is None or coll is None or coll == self.coll


@dataclass(frozen=True, order=True, slots=True)
class ResumePoint:
    """Where a stream stands: after event `index` of the entry at `ts_key` (`index` -1: before any event
    of that entry; `whole`: after all of them)."""

    ts_key: int
    index: int = 0
    invalidate: bool = False
    whole: bool = False
    fragment: int = 0  # after this fragment of a split event (`split_event`); 0: the event as a whole

    def token(self) -> dict[str, str]:
        if self.whole:
            return {"_data": f"{self.ts_key:016x}"}
        fragment = f"{self.fragment:04x}" if self.fragment else ""
        return {"_data": f"{self.ts_key:016x}{self.index:04x}{int(self.invalidate)}{fragment}"}

    @property
    def ts(self) -> Timestamp:
        return Timestamp(self.ts_key >> 32, self.ts_key & 0xFFFFFFFF)

    def is_after(self, ts_key: int, index: int) -> bool:
        """Whether event `index` of entry `ts_key` comes after this point (so a resumed stream shows it)."""
        if ts_key != self.ts_key:
            return ts_key > self.ts_key
        return not self.whole and index > self.index


def parse_token(token: Any) -> ResumePoint:
    data = token.get("_data") if isinstance(token, Mapping) else None
    if not isinstance(data, str) or len(data) not in (16, 21, 25):
        raise MongoError(BAD_TOKEN, f"invalid resume token: {token!r}")
    try:
        ts_key = int(data[:16], 16)
        if len(data) == 16:
            return ResumePoint(ts_key, whole=True)
        fragment = int(data[21:25], 16) if len(data) == 25 else 0
        return ResumePoint(ts_key, int(data[16:20], 16), invalidate=data[20] == "1", fragment=fragment)
    except ValueError:
        raise MongoError(BAD_TOKEN, f"invalid resume token: {token!r}") from None


COLLECTION_UUID = "$collectionUUID"  # on update/replace/delete events until their images are looked up


def ts_key_of(ts: Timestamp) -> int:
    return (ts.time << 32) | ts.inc


def _ns(ns: str) -> tuple[str, str | None]:
    db, _, coll = ns.partition(".")
    return db, coll or None


def events_of(entry: Mapping[str, Any], scope: StreamScope) -> list[dict[str, Any]]:
    """The change events `entry` gives a stream on `scope`, in order, each with its `_id` token (the
    caller adds `fullDocument` lookups and drops events a resume point has passed). A transaction's
    entry gives the events of each write it holds, in order, each with the session's `lsid` and
    `txnNumber`."""
    inner = flattened(entry)
    if len(inner) > 1 or inner[0] is not entry:
        out: list[dict[str, Any]] = []
        for position, write in enumerate(inner):
            for event in _events_of(write, scope, position):
                out.append(event | {k: write[k] for k in ("lsid", "txnNumber") if k in write})
        return out
    return _events_of(entry, scope, 0)


def _events_of(entry: Mapping[str, Any], scope: StreamScope, first_index: int) -> list[dict[str, Any]]:
    op = entry.get("op")
    ns = str(entry.get("ns", ""))
    ts = entry["ts"]
    key = ts_key_of(ts)
    base = {"clusterTime": ts, "wallTime": entry.get("wall")}

    def event(index: int, body: dict[str, Any], *, invalidate: bool = False) -> dict[str, Any]:
        token = ResumePoint(key, first_index + index, invalidate=invalidate).token()
        return {"_id": token, **body, **base}

    if scope.expanded and "ui" in entry:
        base["collectionUUID"] = entry["ui"]
    if op in ("i", "u", "d"):
        db, coll = _ns(ns)
        if coll is None or not scope.watches(db, coll):
            return []
        target = {"db": db, "coll": coll}
        if op != "i" and "ui" in entry:
            base[COLLECTION_UUID] = entry["ui"]  # (for its pre-image; the runtime takes it out again)
        o = entry.get("o") or {}
        if op == "i":
            return [event(0, {"operationType": "insert", "ns": target, "documentKey": {"_id": o.get("_id")},
                              "fullDocument": dict(o)})]
        if op == "d":
            return [event(0, {"operationType": "delete", "ns": target, "documentKey": {"_id": o.get("_id")}})]
        doc_key = {"_id": (entry.get("o2") or {}).get("_id")}
        if any(str(k).startswith("$") for k in o):
            return [event(0, {"operationType": "update", "ns": target, "documentKey": doc_key,
                              "updateDescription": update_description(o, expanded=scope.expanded)})]
        return [event(0, {"operationType": "replace", "ns": target, "documentKey": doc_key,
                          "fullDocument": dict(o)})]
    if op == "c":
        return _command_events(entry, scope, event)
    return []


def update_description(o: Mapping[str, Any], *, expanded: bool) -> dict[str, Any]:
    """An update entry's `updateDescription`; `disambiguatedPaths` with `showExpandedEvents` only."""
    description: dict[str, Any] = {
        "updatedFields": dict(o.get("$set") or {}),
        "removedFields": list(o.get("$unset") or {}),
        "truncatedArrays": [{"field": path, "newSize": size} for path, size in (o.get(TRUNCATE) or {}).items()]}
    if expanded:
        description["disambiguatedPaths"] = dict(o.get(DISAMBIGUATED) or {})
    return description


def update_entry_of(description: Mapping[str, Any]) -> dict[str, Any]:
    """The update entry an `updateDescription` describes (to apply it to a pre-image)."""
    return {"$set": description["updatedFields"], "$unset": dict.fromkeys(description["removedFields"], True),
            TRUNCATE: {t["field"]: t["newSize"] for t in description["truncatedArrays"]}}


def _command_events(entry: Mapping[str, Any], scope: StreamScope, event: Any) -> list[dict[str, Any]]:
    db = str(entry.get("ns", "")).partition(".")[0]
    o = entry.get("o") or {}
    name = next(iter(o), "")
    if name == "drop":
        coll = str(o["drop"])
        if not scope.watches(db, coll):
            return []
        out = [event(0, {"operationType": "drop", "ns": {"db": db, "coll": coll}})]
        if scope.coll is not None:
            out.append(event(1, {"operationType": INVALIDATE}, invalidate=True))
        return out
    if name == "renameCollection":
        source_db, source_coll = _ns(str(o["renameCollection"]))
        target_db, target_coll = _ns(str(o["to"]))
        if not (scope.watches(source_db, source_coll) or scope.watches(target_db, target_coll)):
            return []
        body: dict[str, Any] = {"operationType": "rename", "ns": {"db": source_db, "coll": source_coll},
                                "to": {"db": target_db, "coll": target_coll}}
        if scope.expanded:
            body["operationDescription"] = {"to": body["to"], "dropTarget": bool(o.get("dropTarget"))}
        out = [event(0, body)]
        if scope.coll is not None and scope.watches(source_db, source_coll):
            out.append(event(1, {"operationType": INVALIDATE}, invalidate=True))
        return out
    if scope.expanded and name == "collMod":
        coll = str(o["collMod"])
        if not scope.watches(db, coll):
            return []
        description = {k: v for k, v in o.items() if k != "collMod"}
        return [event(0, {"operationType": "modify", "ns": {"db": db, "coll": coll},
                          "operationDescription": description})]
    if scope.expanded and name in ("create", "createIndexes", "dropIndexes"):
        coll = str(o[name])
        if not scope.watches(db, coll):
            return []
        if name == "create":
            description = {k: v for k, v in o.items() if k != "create"}
            if "viewOn" not in description:  # (a view has no _id index)
                description.setdefault("idIndex", {"v": 2, "key": {"_id": 1}, "name": "_id_"})
        elif name == "createIndexes":
            description = {"indexes": [{k: v for k, v in o.items() if k != "createIndexes"}]}
        else:
            description = {"indexes": [{"name": o.get("index")}]}
        return [event(0, {"operationType": name, "ns": {"db": db, "coll": coll},
                          "operationDescription": description})]
    if name == "dropDatabase":
        if db in INTERNAL_DBS or (scope.db is not None and scope.db != db):
            return []
        if scope.coll is not None:   # (its collection's own drop entry came first: the stream ended there)
            return []
        out = [event(0, {"operationType": "dropDatabase", "ns": {"db": db}})]
        if scope.db is not None:
            out.append(event(1, {"operationType": INVALIDATE}, invalidate=True))
        return out
    return []


SPLIT_STAGE = "$changeStreamSplitLargeEvent"
EVENT_SIZE_LIMIT = 16 * 1024 * 1024  # an event (or a fragment of one) fits a document


def split_event(event: dict[str, Any], limit: int = EVENT_SIZE_LIMIT) -> list[dict[str, Any]]:
    """`$changeStreamSplitLargeEvent`: an event too large for a document, as fragments that each fit,
    in order: each has its own resume token (the event's, with the fragment's number), `splitEvent:
    {fragment, of}`, and the next top-level fields of the event. A field that cannot fit a fragment on
    its own is BSONObjectTooLarge (10334)."""
    if len(bson.encode(event)) <= limit:
        return [event]
    point = parse_token(event["_id"])
    # What every fragment carries beside its fields: its token and splitEvent (sized for the largest).
    base = len(bson.encode({"_id": dataclasses.replace(point, fragment=0xFFFF).token(),
                            "splitEvent": {"fragment": 0x7FFFFFFF, "of": 0x7FFFFFFF}}))
    groups: list[list[tuple[str, Any]]] = [[]]
    size = base
    for name, value in event.items():
        if name == "_id":
            continue
        field_size = len(bson.encode({name: value})) - 5
        if base + field_size > limit:
            raise MongoError(10334, f"BSONObj size: the change event's field {name!r} alone is larger than a "
                                    "fragment may be")
        if groups[-1] and size + field_size > limit:
            groups.append([])
            size = base
        groups[-1].append((name, value))
        size += field_size
    return [{"_id": dataclasses.replace(point, fragment=number).token(),
             "splitEvent": {"fragment": number, "of": len(groups)}, **dict(fields)}
            for number, fields in enumerate(groups, start=1)]


def check_event_size(event: dict[str, Any]) -> None:
    """An event larger than a document, in a stream that does not split events: 10334, as mongod."""
    size = len(bson.encode(event))
    if size > EVENT_SIZE_LIMIT:
        raise MongoError(10334, f"BSONObj size: {size} (0x{size:X}) is invalid. Size must be between 0 and "
                                f"{EVENT_SIZE_LIMIT}(16MB) First element: _id: {event['_id']!r}; add "
                                f"{SPLIT_STAGE} to the pipeline to receive it in fragments")
