"""The parts a load's `filter` option prunes: only partitions none of whose rows can match, whatever the
filter's literal types (a 1.0 for an int64 key is the row's 1: pruning its partition away would answer no
rows without an error)."""

from __future__ import annotations

import pytest

from oplog.parts.table import parse_table_def, partition_id

pytest.importorskip("pyspark")
from replset.spark import _may_hold, _pruning_filters

TABLE = parse_table_def("d", "t", {"columns": [{"name": "bucket", "type": "int64"}, {"name": "n", "type": "int64"}],
                                   "partitionBy": "bucket", "orderBy": ["n"]})


def held(query: dict[str, object]) -> list[int]:
    filters = _pruning_filters(TABLE, query)
    return [b for b in range(5) if _may_hold(TABLE, partition_id(TABLE.partition, b), filters)]


def test_equality_and_in_prune_other_partitions_in_the_key_s_own_type() -> None:
    assert held({"bucket": 1}) == [1]
    assert held({"bucket": 1.0}) == [1]
    assert held({"bucket": {"$in": [1.0, 3]}, "n": {"$lt": 5}}) == [1, 3]
    assert held({"$and": [{"bucket": {"$eq": 2}}, {"n": 1}]}) == [2]


def test_a_term_that_does_not_convert_exactly_prunes_nothing() -> None:
    assert held({"bucket": 1.5}) == [0, 1, 2, 3, 4]
    assert held({"bucket": {"$in": [1, "x"]}}) == [0, 1, 2, 3, 4]
    assert held({"$or": [{"bucket": 1}, {"bucket": 2}]}) == [0, 1, 2, 3, 4]   # not read: nothing pruned
