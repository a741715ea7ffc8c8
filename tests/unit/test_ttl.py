"""The TTL rule: which documents an index has expired, and which specs are refused."""

from __future__ import annotations

import datetime

import pytest

from base.errors import MongoError
from oplog.query import compile_filter
from oplog.ttl import check_ttl_spec, expired_filter

NOW = datetime.datetime(2026, 1, 1, 12, 0, 0, tzinfo=datetime.UTC)
SPEC = {"key": {"d": 1}, "name": "d_1", "expireAfterSeconds": 60}


@pytest.mark.parametrize(("doc", "expired"), [
    ({"d": datetime.datetime(2026, 1, 1, 11, 58)}, True),
    ({"d": datetime.datetime(2026, 1, 1, 11, 59, 30)}, False),
    ({"d": [datetime.datetime(2026, 1, 1, 13), datetime.datetime(2026, 1, 1, 10)]}, True),
    ({"d": "2026-01-01"}, False),
    ({"d": 5}, False),
    ({}, False),
])
def test_expired_documents(doc: dict[str, object], expired: bool) -> None:
    flt = expired_filter(SPEC, NOW)
    assert flt is not None
    assert compile_filter(flt).matches({"_id": 1, **doc}) is expired


def test_only_ttl_indexes_expire_anything() -> None:
    assert expired_filter({"key": {"d": 1}, "name": "d_1"}, NOW) is None


@pytest.mark.parametrize(("spec", "code"), [
    ({"key": {"d": 1}, "expireAfterSeconds": -1}, 2),
    ({"key": {"d": 1}, "expireAfterSeconds": "60"}, 2),
    ({"key": {"d": 1, "e": 1}, "expireAfterSeconds": 60}, 67),
    ({"key": {"_id": 1}, "expireAfterSeconds": 60}, 67),
])
def test_bad_ttl_specs(spec: dict[str, object], code: int) -> None:
    with pytest.raises(MongoError) as err:
        check_ttl_spec(spec)
    assert err.value.code == code
