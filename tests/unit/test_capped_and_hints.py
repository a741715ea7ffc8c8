"""The pure pieces of capped collections (their options) and of a find's hint / min / max."""

from __future__ import annotations

import pytest

from base.errors import MongoError
from oplog.capped import MAX_CAPPED_SIZE, capped_limits, check_capped_options
from oplog.index_hint import IndexScan, index_scan, resolve_hint

SPECS = [
    {"v": 2, "key": {"_id": 1}, "name": "_id_"},
    {"v": 2, "key": {"a": -1}, "name": "a_-1"},
    {"v": 2, "key": {"j": 1, "k": 1}, "name": "j_1_k_1"},
    {"v": 2, "key": {"s": 1}, "name": "s_1", "sparse": True},
    {"v": 2, "key": {"p": 1}, "name": "p_1", "partialFilterExpression": {"p": {"$gt": 5}}},
]


def test_capped_options_as_mongod_checks_them() -> None:
    assert check_capped_options({"capped": True, "size": 4096}) == {"capped": True, "size": 4096}
    assert check_capped_options({"capped": True, "size": 1000.0, "max": 3}) == {"capped": True, "size": 1000, "max": 3}
    assert check_capped_options({"capped": True, "size": 1000, "max": 0}) == {"capped": True, "size": 1000}
    assert check_capped_options({"size": 10, "max": 3}) == {}  # (not capped: both ignored)
    for bad in ({"capped": True}, {"capped": True, "size": "x"}, {"capped": True, "size": 0},
                {"capped": True, "size": MAX_CAPPED_SIZE + 1}, {"capped": True, "size": 10, "max": 2**31}):
        with pytest.raises(MongoError) as refused:
            check_capped_options(bad)
        assert refused.value.code == 72
    assert capped_limits({"capped": True, "size": 100, "max": 2}).max_docs == 2  # type: ignore[union-attr]
    assert capped_limits({"size": 100}) is None


def test_a_hint_names_an_index_by_name_or_pattern() -> None:
    assert resolve_hint(SPECS, "a_-1") is SPECS[1]
    assert resolve_hint(SPECS, {"a": -1.0}) is SPECS[1]
    assert resolve_hint(SPECS, {"j": 1, "k": 1}) is SPECS[2]
    for natural in (None, {}, {"$natural": 1}, {"$natural": -1}):
        assert resolve_hint(SPECS, natural) is None
    for unknown in ("nope", {"a": 1}, {"k": 1, "j": 1}):
        with pytest.raises(MongoError) as refused:
            resolve_hint(SPECS, unknown)
        assert refused.value.code == 2


def test_an_index_scan_holds_what_the_index_holds_in_its_order() -> None:
    assert IndexScan(SPECS[1]).order == {"a": -1}
    assert IndexScan({"key": {"t": "text"}}).order is None
    sparse = IndexScan(SPECS[3])
    assert sparse.includes({"s": None}) and not sparse.includes({"x": 1})
    partial = IndexScan(SPECS[4])
    assert partial.includes({"p": 6}) and not partial.includes({"p": 5})


def test_min_and_max_bound_the_index_order() -> None:
    scan = index_scan(SPECS, "j_1_k_1", {"j": 3, "k": 3}, {"j": 5, "k": 0})
    assert scan is not None
    kept = [(j, k) for j in range(7) for k in range(5) if scan.includes({"j": j, "k": k})]
    assert kept[0] == (3, 3) and kept[-1] == (4, 4) and (5, 0) not in kept and (3, 2) not in kept
    descending = index_scan(SPECS, "a_-1", {"a": 5}, {"a": 2})  # (min is where the scan starts: 5)
    assert descending is not None
    assert [a for a in range(8) if descending.includes({"a": a})] == [3, 4, 5]
    assert [a for a in range(8) if descending.includes({"a": [0, a]})] == [3, 4, 5]  # (any key of an array)
    with pytest.raises(MongoError) as no_hint:
        index_scan(SPECS, None, {"j": 1}, None)
    assert no_hint.value.code == 51173
    with pytest.raises(MongoError) as wrong_fields:
        index_scan(SPECS, "j_1_k_1", {"k": 1, "j": 1}, None)
    assert wrong_fields.value.code == 51174


def test_the_index_a_find_reads_with_gives_its_key() -> None:
    from oplog.index_hint import index_for_key, key_of

    assert index_for_key(SPECS, "a_-1", {}, None) is SPECS[1]
    assert index_for_key(SPECS, None, {}, {"a": 1}) is SPECS[1]  # (read backwards)
    assert index_for_key(SPECS, None, {}, {"j": -1}) is SPECS[2]
    assert index_for_key(SPECS, None, {}, {"j": 1, "k": -1}) is None  # mixed directions: no index serves it
    assert index_for_key(SPECS, None, {}, {"s": 1}) is None  # (a sparse index does not hold every document)
    assert index_for_key(SPECS, None, {"_id": 3}, None) is SPECS[0]
    assert index_for_key(SPECS, None, {"x": 3}, None) is None
    assert key_of({"_id": 1, "j": 2, "k": [5, 6]}, SPECS[2]) == {"j": 2, "k": 5}
    assert key_of({"_id": 1}, None) == {}


def test_clustered_options_as_mongod_checks_them() -> None:
    import datetime

    from oplog.clustered import check_clustered_options, clustered_index_spec, expired_clustered_filter

    stored = check_clustered_options({"clusteredIndex": {"key": {"_id": 1}, "unique": True}, "expireAfterSeconds": 60})
    assert stored["clusteredIndex"] == {"v": 2, "key": {"_id": 1}, "name": "_id_", "unique": True}
    assert clustered_index_spec(stored)["clustered"] is True
    now = datetime.datetime(2026, 1, 1, 0, 1)
    assert expired_clustered_filter(stored, now) == {"_id": {"$lt": datetime.datetime(2026, 1, 1)}}
    assert check_clustered_options({"capped": False}) == {"capped": False}
    for bad in ({"clusteredIndex": {"key": {"a": 1}, "unique": True}}, {"clusteredIndex": {"key": {"_id": 1}}},
                {"expireAfterSeconds": 1}, {"clusteredIndex": {"key": {"_id": 1}, "unique": True}, "capped": True}):
        with pytest.raises(MongoError):
            check_clustered_options(bad)
