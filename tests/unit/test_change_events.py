"""Change events from oplog entries (oplog/change_events.py): each kind of entry, what each scope
sees, invalidation, and resume tokens that sort in oplog order and round-trip."""

from __future__ import annotations

import datetime

import pytest
from bson.timestamp import Timestamp
from hypothesis import given
from hypothesis import strategies as st

from base.errors import MongoError
from oplog.change_events import ResumePoint, StreamScope, events_of, parse_token, ts_key_of, update_entry_of
from oplog.entry import command_entry, delete_entry, insert_entry, noop_entry, update_entry
from oplog.update import apply_oplog_update, apply_pipeline_update, apply_update

WALL = datetime.datetime(2026, 1, 1)
COLL = StreamScope("app", "users")
DB = StreamScope("app")
CLUSTER = StreamScope()


def stamped(entry: dict, secs: int = 100, inc: int = 1) -> dict:
    return {**entry, "ts": Timestamp(secs, inc), "t": 1, "wall": WALL}


def kinds(entry: dict, scope: StreamScope) -> list[str]:
    return [e["operationType"] for e in events_of(stamped(entry), scope)]


def test_insert_update_replace_delete() -> None:
    [insert] = events_of(stamped(insert_entry("app.users", {"_id": 1, "a": 1})), COLL)
    assert insert["operationType"] == "insert" and insert["fullDocument"] == {"_id": 1, "a": 1}
    assert insert["documentKey"] == {"_id": 1} and insert["ns"] == {"db": "app", "coll": "users"}
    assert insert["clusterTime"] == Timestamp(100, 1) and insert["wallTime"] == WALL
    [update] = events_of(stamped(update_entry("app.users", 1, {"$set": {"a": 2, "b.c": 3}, "$unset": {"d": True}})),
                         COLL)
    assert update["operationType"] == "update" and update["documentKey"] == {"_id": 1}
    assert update["updateDescription"] == {"updatedFields": {"a": 2, "b.c": 3}, "removedFields": ["d"],
                                           "truncatedArrays": []}
    [replace] = events_of(stamped(update_entry("app.users", 1, {"_id": 1, "z": 9})), COLL)
    assert replace["operationType"] == "replace" and replace["fullDocument"] == {"_id": 1, "z": 9}
    [delete] = events_of(stamped(delete_entry("app.users", 1)), COLL)
    assert delete["operationType"] == "delete" and delete["documentKey"] == {"_id": 1}


def test_an_update_describes_truncated_arrays_and_ambiguous_paths() -> None:
    """A pipeline that shortens an array logs the new size (`truncatedArrays`), not the array; a path
    with a numeric part is told apart (field name or array index) with `showExpandedEvents`."""
    doc = {"_id": 1, "a": {"1": 1}, "b": [{"1": 1}], "array": ["foo", {"a": "bar"}, 1, 2, 3]}
    shortened = apply_pipeline_update(doc, [{"$set": {"array": ["foo", {"a": "baz"}]}}], now=WALL)
    [event] = events_of(stamped(update_entry("app.users", 1, shortened.oplog_update)), COLL)
    assert event["updateDescription"] == {"updatedFields": {"array.1": {"a": "baz"}}, "removedFields": [],
                                          "truncatedArrays": [{"field": "array", "newSize": 2}]}
    assert apply_oplog_update(doc, update_entry_of(event["updateDescription"])) == shortened.document
    numeric = apply_update(doc, {"$set": {"a.1": 2, "b.0.1": 2}}, now=WALL)
    [plain] = events_of(stamped(update_entry("app.users", 1, numeric.oplog_update)), COLL)
    assert "disambiguatedPaths" not in plain["updateDescription"]
    [expanded] = events_of(stamped(update_entry("app.users", 1, numeric.oplog_update)),
                           StreamScope("app", "users", expanded=True))
    assert expanded["updateDescription"]["disambiguatedPaths"] == {"a.1": ["a", "1"], "b.0.1": ["b", 0, "1"]}


def test_scopes_see_their_namespaces_only() -> None:
    other = insert_entry("app.orders", {"_id": 1})
    elsewhere = insert_entry("shop.users", {"_id": 1})
    assert kinds(other, COLL) == [] and kinds(other, DB) == ["insert"] and kinds(other, CLUSTER) == ["insert"]
    assert kinds(elsewhere, DB) == [] and kinds(elsewhere, CLUSTER) == ["insert"]
    for internal in ("local.x", "admin.x", "config.transactions", "app.system.parts.t.log", "app.system.views"):
        assert kinds(insert_entry(internal, {"_id": 1}), CLUSTER) == []
    assert kinds(noop_entry("new primary"), CLUSTER) == []
    assert kinds(command_entry("app", {"create": "users"}), CLUSTER) == []


def test_drop_rename_and_drop_database_invalidate_the_streams_they_end() -> None:
    drop = command_entry("app", {"drop": "users"})
    assert kinds(drop, COLL) == ["drop", "invalidate"]
    assert kinds(drop, DB) == ["drop"] and kinds(drop, CLUSTER) == ["drop"]
    rename = command_entry("app", {"renameCollection": "app.users", "to": "app.people"})
    assert kinds(rename, COLL) == ["rename", "invalidate"]
    assert kinds(rename, StreamScope("app", "people")) == ["rename"]
    [event] = events_of(stamped(rename), DB)
    assert event["to"] == {"db": "app", "coll": "people"}
    drop_db = command_entry("app", {"dropDatabase": 1})
    assert kinds(drop_db, COLL) == []  # (the collection's own drop entry, logged before it, ended that stream)
    assert kinds(drop_db, DB) == ["dropDatabase", "invalidate"]
    assert kinds(drop_db, CLUSTER) == ["dropDatabase"]
    assert kinds(command_entry("shop", {"dropDatabase": 1}), DB) == []


def test_the_events_of_one_entry_have_increasing_tokens() -> None:
    drop, invalidate = events_of(stamped(command_entry("app", {"drop": "users"})), COLL)
    assert drop["_id"]["_data"] < invalidate["_id"]["_data"]
    assert parse_token(invalidate["_id"]).invalidate


points = st.builds(ResumePoint, st.integers(0, 2**64 - 1), st.integers(0, 0xFFFF), st.booleans())


@given(points)
def test_a_token_round_trips(point: ResumePoint) -> None:
    assert parse_token(point.token()) == point


@given(points, points)
def test_tokens_sort_as_their_points(a: ResumePoint, b: ResumePoint) -> None:
    assert (a.token()["_data"] < b.token()["_data"]) == ((a.ts_key, a.index, a.invalidate) <
                                                        (b.ts_key, b.index, b.invalidate))


def test_a_whole_entry_point_resumes_after_all_its_events() -> None:
    key = ts_key_of(Timestamp(100, 1))
    whole = parse_token(ResumePoint(key, whole=True).token())
    assert whole.whole and not whole.is_after(key, 0) and not whole.is_after(key, 1) and whole.is_after(key + 1, 0)
    first = ResumePoint(key, 0)
    assert not first.is_after(key, 0) and first.is_after(key, 1)


@pytest.mark.parametrize("token", [None, {}, {"_data": 5}, {"_data": "zz"}, {"_data": "x" * 21}])
def test_a_token_it_cannot_read_is_refused(token: object) -> None:
    with pytest.raises(MongoError):
        parse_token(token)


def test_a_large_event_splits_into_fragments_that_fit_in_order() -> None:
    from oplog.change_events import split_event

    token = ResumePoint(5 << 32, 2).token()
    event = {"_id": token, "operationType": "update", "a": "x" * 600, "b": "y" * 600, "c": 1}
    assert split_event(event, limit=2000) == [event]  # (fits: one piece)
    pieces = split_event(event, limit=800)
    assert [p["splitEvent"] for p in pieces] == [{"fragment": i, "of": 2} for i in (1, 2)]
    assert [[k for k in p if k not in ("_id", "splitEvent")] for p in pieces] == [["operationType", "a"], ["b", "c"]]
    assert [parse_token(p["_id"]).fragment for p in pieces] == [1, 2]
    assert all(parse_token(p["_id"]).index == 2 for p in pieces)
    with pytest.raises(MongoError):
        split_event({"_id": token, "a": "x" * 900}, limit=800)
