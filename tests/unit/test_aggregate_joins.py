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
