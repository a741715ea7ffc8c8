"""Rollback decisions: common point, the majority-commit guard, and the refetch plan."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from base.optime import OpTime
from oplog.entry import command_entry, delete_entry, insert_entry, update_entry
from sync import rollback
from sync.rollback import find_common_point, majority_committed_past, plan_rollback, recalled


def newest_first(optimes: list[OpTime]) -> list[OpTime]:
    return sorted(optimes, key=lambda o: o.ts_key, reverse=True)


def test_common_point_is_the_last_shared_entry() -> None:
    shared = [OpTime(10, 1, 1), OpTime(11, 1, 1)]
    ours = [*shared, OpTime(12, 1, 1), OpTime(13, 1, 1)]
    theirs = [*shared, OpTime(12, 5, 2), OpTime(14, 1, 2)]
    assert find_common_point(newest_first(ours), newest_first(theirs)) == OpTime(11, 1, 1)


def test_same_timestamp_in_another_term_is_a_different_entry() -> None:
    ours = [OpTime(12, 1, 1), OpTime(11, 1, 1)]
    theirs = [OpTime(12, 1, 2), OpTime(11, 1, 1)]
    assert find_common_point(ours, theirs) == OpTime(11, 1, 1)


def test_no_common_point_when_windows_do_not_meet() -> None:
    assert find_common_point([OpTime(5, 1, 1)], [OpTime(9, 1, 2), OpTime(6, 1, 2)]) is None
    assert find_common_point([], [OpTime(1, 1, 1)]) is None


@given(shared=st.integers(0, 30), ours_extra=st.integers(0, 20), theirs_extra=st.integers(0, 20),
       offset=st.integers(0, 3))
def test_common_point_property(shared: int, ours_extra: int, theirs_extra: int, offset: int) -> None:
    prefix = [OpTime(100 + i, 1, 1) for i in range(shared)]
    ours = prefix + [OpTime(200 + i, 1, 1) for i in range(ours_extra)]
    theirs = prefix + [OpTime(200 + offset + i, 1, 2) for i in range(theirs_extra)]
    expected = prefix[-1] if prefix else None
    assert find_common_point(newest_first(ours), newest_first(theirs)) == expected


def test_majority_committed_entries_are_never_rolled_back() -> None:
    assert not majority_committed_past(OpTime(11, 1, 1), OpTime(11, 1, 1))
    assert not majority_committed_past(OpTime(11, 1, 1), OpTime(10, 1, 1))
    assert majority_committed_past(OpTime(11, 1, 1), OpTime(12, 1, 1))


def test_plan_collects_documents_and_collections() -> None:
    undone = [
        insert_entry("db.a", {"_id": 1, "x": 1}),
        update_entry("db.a", 1, {"$v": 2, "diff": {"u": {"x": 2}}}),
        update_entry("db.a", 1.0, {"$v": 2, "diff": {"u": {"x": 3}}}),
        delete_entry("db.b", "k"),
        command_entry("db", {"create": "c"}),
        insert_entry("db.c", {"_id": 7}),
        command_entry("db", {"renameCollection": "db.d", "to": "db.e"}),
        command_entry("other", {"dropDatabase": 1}),
    ]
    plan = plan_rollback(undone)
    assert plan.entries == len(undone)
    assert plan.ids("db.a") == [1, 1.0]  # 1 and 1.0 are distinct _id values in BSON
    assert plan.ids("db.b") == ["k"]
    assert plan.collections == {"db.c", "db.d", "db.e"}
    assert "db.c" not in plan.documents  # recloned whole
    assert plan.databases == {"other"}
    assert plan.document_count == 3


def test_a_transaction_can_drop_and_recreate_a_collection_and_an_index() -> None:
    """A rollback recloning a collection drops and recreates it in one transaction."""
    from oplog.sqlite_store import SQLiteStore

    store = SQLiteStore(None)
    txn = store.begin()
    txn.insert("db.c", {"_id": 1, "k": 1})
    txn.create_index("db.c", {"v": 2, "key": {"k": 1}, "name": "k_1", "unique": True})
    txn.drop_index("db.c", "k_1")
    txn.insert("db.c", {"_id": 2, "k": 1})  # no stale unique index left behind
    txn.drop_collection("db.c")
    txn.create_collection("db.c")
    txn.insert("db.c", {"_id": 3})
    store.commit()
    assert [d["_id"] for d in store.reader.scan("db.c")] == [3]
    store.close()


def test_a_remembered_plan_is_recalled_and_merged() -> None:
    first = plan_rollback([insert_entry("db.a", {"_id": 1}), insert_entry("db.a", {"_id": "x"}),
                           command_entry("db", {"create": "c"})])
    second = plan_rollback([update_entry("db.a", 2, {"$v": 2, "diff": {"u": {"x": 2}}}),
                            insert_entry("db.c", {"_id": 5})])
    second.merge(recalled(first.remembered()))
    assert sorted(map(str, second.ids("db.a"))) == ["1", "2", "x"]
    assert second.collections == {"db.c"} and "db.c" not in second.documents
    assert recalled(None).document_count == 0


def test_a_plan_too_big_to_remember_by_id_is_remembered_by_collection(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(rollback, "MAX_REMEMBERED_BYTES", 200)
    plan = plan_rollback([insert_entry("db.a", {"_id": i}) for i in range(100)])
    again = recalled(plan.remembered())
    assert again.document_count == 0 and again.collections == {"db.a"}
