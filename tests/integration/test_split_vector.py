"""`splitVector` on a real member: split keys by _id every maxChunkObjects documents (or by size at the
average document size), MongoDB's errors for what it does not take."""

from __future__ import annotations

from typing import Any

import pytest
from pymongo import MongoClient
from pymongo.errors import OperationFailure

from tests.support.members import Member


def test_split_keys_cut_the_collection_in_id_order(member: Member) -> None:
    with member.direct_client() as client:
        _cuts(client)


def _cuts(client: MongoClient[dict[str, Any]]) -> None:
    client.sv.docs.insert_many([{"_id": i, "pad": "x" * 100} for i in reversed(range(1_000))])
    reply = client.sv.command({"splitVector": "sv.docs", "keyPattern": {"_id": 1}, "maxChunkObjects": 250})
    assert reply["splitKeys"] == [{"_id": 250}, {"_id": 500}, {"_id": 750}]
    by_size = client.sv.command({"splitVector": "sv.docs", "keyPattern": {"_id": 1}, "maxChunkSizeBytes": 40_000})
    assert 2 <= len(by_size["splitKeys"]) <= 4   # about 130 bytes a document: 300-odd per range
    assert client.sv.command({"splitVector": "sv.none", "keyPattern": {"_id": 1},
                              "maxChunkObjects": 10})["splitKeys"] == []


@pytest.mark.parametrize("command, code", [
    ({"splitVector": "sv.docs", "keyPattern": {"n": 1}, "maxChunkObjects": 10}, 2),
    ({"splitVector": "sv.docs", "keyPattern": {"_id": 1}}, 2),
    ({"splitVector": "sv.docs", "keyPattern": {"_id": 1}, "maxChunkObjects": -1}, 2),
    ({"splitVector": "docs", "keyPattern": {"_id": 1}, "maxChunkObjects": 10}, 73),
])
def test_what_split_vector_does_not_take(member: Member, command: dict[str, object], code: int) -> None:
    with member.direct_client() as client, pytest.raises(OperationFailure) as failure:
        client.sv.command(command)
    assert failure.value.code == code
