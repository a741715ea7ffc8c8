"""$lookup (both forms), $unionWith and $sample over collections handed to the pipeline."""

from __future__ import annotations

import datetime
import random
from typing import Any

import pytest

from base.errors import MongoError
from oplog.aggregate import Sampler, run_pipeline

NOW = datetime.datetime(2026, 1, 1)
ORDERS = [{"_id": 1, "item": "a", "qty": 2}, {"_id": 2, "item": ["b", "c"], "qty": 1}, {"_id": 3}]
STOCK = [{"_id": 10, "sku": "a", "n": 5}, {"_id": 11, "sku": "b", "n": 0}, {"_id": 12, "sku": "c", "n": 1},
         {"_id": 13}]


def run(pipeline: list[dict[str, Any]], sampler: Sampler | None = None) -> list[dict[str, Any]]:
    return run_pipeline([dict(d) for d in ORDERS], pipeline, now=NOW,
                        collections=lambda name: [dict(d) for d in {"stock": STOCK}.get(name, [])],
                        sampler=sampler)


def test_lookup_by_equality_matches_array_elements_and_missing_as_null() -> None:
    out = run([{"$lookup": {"from": "stock", "localField": "item", "foreignField": "sku", "as": "s"}}])
    assert [[d["_id"] for d in doc["s"]] for doc in out] == [[10], [11, 12], [13]]


def test_lookup_with_let_and_a_pipeline() -> None:
    out = run([{"$lookup": {"from": "stock", "let": {"want": "$qty"}, "as": "enough", "pipeline": [
        {"$match": {"$expr": {"$gte": ["$n", "$$want"]}}}, {"$project": {"_id": 1}}]}}])
    assert [doc["enough"] for doc in out[:2]] == [[{"_id": 10}], [{"_id": 10}, {"_id": 12}]]


def test_union_with_runs_its_pipeline_on_the_other_collection() -> None:
    out = run([{"$project": {"_id": 1}}, {"$unionWith": {"coll": "stock", "pipeline": [{"$match": {"n": 0}}]}}])
    assert [d["_id"] for d in out] == [1, 2, 3, 11]


class _Seeded(Sampler):
    def __init__(self) -> None:
        self._random = random.Random(5)

    def sample(self, population: list[dict[str, Any]], k: int) -> list[dict[str, Any]]:
        return self._random.sample(population, k)


def test_sample_draws_distinct_documents_with_the_given_source() -> None:
    out = run([{"$sample": {"size": 2}}], sampler=_Seeded())
    assert len(out) == 2 and len({d["_id"] for d in out}) == 2
    assert len(run([{"$sample": {"size": 10}}], sampler=_Seeded())) == 3


@pytest.mark.parametrize("stage", [
    {"$lookup": {"from": "stock", "as": "x"}},
    {"$lookup": {"from": "stock", "localField": "a", "as": "x"}},
    {"$lookup": {"from": "stock", "localField": "a", "foreignField": "b"}},
    {"$sample": {"size": -1}},
    {"$unionWith": {"pipeline": []}},
])
def test_bad_stages_are_refused(stage: dict[str, Any]) -> None:
    with pytest.raises(MongoError):
        run([stage], sampler=_Seeded())


def test_bucket_auto_cuts_sorted_values_into_even_buckets_without_splitting_a_value() -> None:
    docs = [{"_id": i, "v": v} for i, v in enumerate([5, 1, 3, 3, 3, 9, 7, 2])]
    out = run_pipeline(docs, [{"$bucketAuto": {"groupBy": "$v", "buckets": 3,
                                               "output": {"n": {"$sum": 1}, "ids": {"$push": "$_id"}}}}], now=NOW)
    # sorted 1 2 3 3 3 5 7 9, about 3 a bucket: the first takes every 3, the last what is left
    assert [(b["_id"], b["n"]) for b in out] == [({"min": 1, "max": 5}, 5), ({"min": 5, "max": 9}, 3)]
    assert out[0]["ids"] == [1, 7, 2, 3, 4]
    assert run_pipeline(docs, [{"$bucketAuto": {"groupBy": "$v", "buckets": 1}}], now=NOW) == [
        {"_id": {"min": 1, "max": 9}, "count": 8}]
    with pytest.raises(MongoError):
        run_pipeline(docs, [{"$bucketAuto": {"groupBy": "$v", "buckets": 2, "granularity": "R5"}}], now=NOW)
