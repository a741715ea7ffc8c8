"""Collations by folding: strengths 1-3, the filter's literal strings folded but not its field names
or regex operands, sorts by the folded form, and the collations that are refused."""

from __future__ import annotations

from typing import Any

import pytest

from base.errors import MongoError
from oplog.collation import Collation, collated_matcher, collated_sort, parse_collation

DOCS = [{"_id": i, "w": w} for i, w in enumerate(["b", "B", "a", "A", "é", "E", "e"])]


@pytest.mark.parametrize(("strength", "query", "expected"), [
    (3, {"w": "a"}, [2]),
    (2, {"w": "a"}, [2, 3]),
    (2, {"w": "e"}, [5, 6]),
    (1, {"w": "e"}, [4, 5, 6]),
    (2, {"w": {"$in": ["B", "x"]}}, [0, 1]),
    (2, {"W": "a"}, []),  # field names are not folded
])
def test_matching(strength: int, query: dict[str, Any], expected: list[int]) -> None:
    matcher = collated_matcher(query, Collation(strength))
    assert [d["_id"] for d in DOCS if matcher.matches(d)] == expected


def test_sorts() -> None:
    by = {"w": 1}
    assert [d["w"] for d in collated_sort(DOCS, by, None)] == ["A", "B", "E", "a", "b", "e", "é"]
    assert [d["w"] for d in collated_sort(DOCS, by, Collation(2))][:4] == ["a", "A", "b", "B"]
    assert [d["w"] for d in collated_sort(DOCS, by, Collation(3))][:4] == ["a", "A", "b", "B"]


@pytest.mark.parametrize(("raw", "code"), [
    ("en", 14), ({"strength": 2}, 9), ({"locale": "en", "strength": 4}, 2),
    ({"locale": "en", "caseFirst": "upper"}, 2), ({"locale": "en", "bogus": 1}, 40415),
    ({"locale": "simple", "strength": 2}, 2),
])
def test_refused(raw: Any, code: int) -> None:
    with pytest.raises(MongoError) as err:
        parse_collation(raw)
    assert err.value.code == code


def test_simple_is_none() -> None:
    assert parse_collation(None) is None and parse_collation({"locale": "simple"}) is None
    assert parse_collation({"locale": "en_US"}) == Collation(3)
