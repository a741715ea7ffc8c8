"""motor and pymongo's AsyncMongoClient against a real member; raw-socket protocol cases."""

from __future__ import annotations

import asyncio
import socket
import struct
from typing import Any

import bson
import pytest
from bson.int64 import Int64
from motor.motor_asyncio import AsyncIOMotorClient
from pymongo import AsyncMongoClient
from pymongo.errors import DuplicateKeyError

from base.codec import HEADER, encode_op_msg_request
from tests.support.members import Member
from tests.support.wire import roundtrip


async def test_motor_crud(member: Member) -> None:
    client: AsyncIOMotorClient[dict[str, Any]] = AsyncIOMotorClient(member.uri, serverSelectionTimeoutMS=10000)
    try:
        coll = client.shop.orders
        await coll.drop()
        await coll.insert_one({"_id": 1, "qty": 5})
        await coll.update_one({"_id": 1}, {"$inc": {"qty": 1}})
        assert await coll.count_documents({"qty": {"$gt": 3}}) == 1
        await coll.insert_many([{"_id": i, "qty": i} for i in range(2, 300)])
        seen = [d["_id"] async for d in coll.find({}, batch_size=40).sort("_id", 1)]
        assert seen == list(range(1, 300))
        await coll.create_index("sku", unique=True, sparse=True)
        await coll.insert_one({"_id": "a", "sku": "x"})
        with pytest.raises(DuplicateKeyError):
            await coll.insert_one({"_id": "b", "sku": "x"})
    finally:
        client.close()


async def test_async_mongo_client_concurrent_writes(member: Member) -> None:
    client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(member.uri, serverSelectionTimeoutMS=10000)
    try:
        coll = client.app.events
        await coll.drop()
        await asyncio.gather(*(coll.insert_one({"_id": i, "n": i}) for i in range(200)))
        assert await coll.count_documents({}) == 200
        counter = client.app.counter
        await counter.drop()
        await counter.insert_one({"_id": 1, "n": 0})
        await asyncio.gather(*(counter.update_one({"_id": 1}, {"$inc": {"n": 1}}) for _ in range(100)))
        assert (await counter.find_one({"_id": 1}))["n"] == 100
    finally:
        await client.close()


def test_legacy_op_query_handshake(member: Member) -> None:
    query = bson.encode({"isMaster": 1, "helloOk": True, "client": {"driver": {"name": "nodejs"}}})
    body = struct.pack("<i", 0) + b"admin.$cmd\x00" + struct.pack("<ii", 0, -1) + query
    with socket.create_connection(("127.0.0.1", member.port), timeout=5) as sock:
        reply = roundtrip(sock, HEADER.pack(16 + len(body), 3, 0, 2004) + body)
        assert reply["ismaster"] is True and reply["helloOk"] is True and reply["setName"] == "rs0"
        # The same connection then speaks OP_MSG.
        reply = roundtrip(sock, encode_op_msg_request({"ping": 1, "$db": "admin"}, 4))
        assert reply["ok"] == 1.0 and set(reply) == {"ok", "$clusterTime", "operationTime"}


def test_malformed_bytes_get_an_error_or_close_only_that_connection(member: Member) -> None:
    with socket.create_connection(("127.0.0.1", member.port), timeout=5) as bad:
        # A framed message with a broken document gets InvalidBSON, and the connection goes on.
        reply = roundtrip(bad, HEADER.pack(40, 1, 0, 2013) + b"\x00\x00\x00\x00\x00" + b"\xff" * 19)
        assert (reply["ok"], reply["code"]) == (0.0, 22)
        assert roundtrip(bad, encode_op_msg_request({"ping": 1, "$db": "admin"}, 2))["ok"] == 1.0
    with socket.create_connection(("127.0.0.1", member.port), timeout=5) as bad:
        bad.sendall(struct.pack("<i", 100_000_000))
        assert bad.recv(100) == b""
    with socket.create_connection(("127.0.0.1", member.port), timeout=5) as good:
        assert roundtrip(good, encode_op_msg_request({"ping": 1, "$db": "admin"}, 1))["ok"] == 1.0


def test_unknown_command_and_missing_db_keep_the_connection(member: Member) -> None:
    with socket.create_connection(("127.0.0.1", member.port), timeout=5) as sock:
        reply = roundtrip(sock, encode_op_msg_request({"frobnicate": 1, "$db": "admin"}, 1))
        assert (reply["ok"], reply["code"], reply["codeName"]) == (0.0, 59, "CommandNotFound")
        reply = roundtrip(sock, encode_op_msg_request({"ping": 1}, 2))
        assert reply["ok"] == 0.0
        reply = roundtrip(sock, encode_op_msg_request({"insert": "c", "documents": "x", "$db": "t"}, 3))
        assert reply["ok"] == 0.0 and reply["code"] == 14  # TypeMismatch, as mongod's IDL answers
        assert roundtrip(sock, encode_op_msg_request({"ping": 1, "$db": "admin"}, 4))["ok"] == 1.0


def test_more_to_come_gets_no_reply(member: Member) -> None:
    with socket.create_connection(("127.0.0.1", member.port), timeout=5) as sock:
        unacked = encode_op_msg_request(
            {"insert": "mtc", "documents": [{"_id": 1}], "writeConcern": {"w": 0}, "$db": "t"}, 1, flags=2)
        sock.sendall(unacked)
        reply = roundtrip(sock, encode_op_msg_request({"count": "mtc", "$db": "t"}, 2))
        assert reply["n"] == 1  # the first reply on the socket answers the count


def test_awaitable_hello_waits_for_a_change(member: Member) -> None:
    """A hello with topologyVersion waits (drivers would spin otherwise)."""
    import time

    with socket.create_connection(("127.0.0.1", member.port), timeout=10) as sock:
        first = roundtrip(sock, encode_op_msg_request({"hello": 1, "$db": "admin"}, 1))
        topology = first["topologyVersion"]
        started = time.perf_counter()
        again = roundtrip(sock, encode_op_msg_request(
            {"hello": 1, "topologyVersion": topology, "maxAwaitTimeMS": 400, "$db": "admin"}, 2, flags=1 << 16))
        assert time.perf_counter() - started >= 0.35
        assert again["topologyVersion"] == topology
        stale = {"processId": bson.ObjectId(), "counter": Int64(0)}
        started = time.perf_counter()
        roundtrip(sock, encode_op_msg_request(
            {"hello": 1, "topologyVersion": stale, "maxAwaitTimeMS": 60_000, "$db": "admin"}, 3))
        assert time.perf_counter() - started < 15.0  # another process id: at once, not after the 60 s wait
        reply = roundtrip(sock, encode_op_msg_request({"hello": 1, "maxAwaitTimeMS": 10, "$db": "admin"}, 4))
        assert reply["code"] == 31368
