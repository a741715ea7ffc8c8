"""Admission under --maxConns (pure) and the codec's split between unframeable and malformed messages."""

from __future__ import annotations

import struct

import bson
import pytest

from base.codec import (
    FLAG_MORE_TO_COME,
    MalformedRequest,
    MessageDecoder,
    OpMsgRequest,
    ProtocolError,
    encode_op_msg_request,
)
from replset.wire.admission import (
    Admission,
    Admitted,
    Role,
    claims_member,
    default_max_conns,
    effective_max_conns,
)


def _msg(body: dict[str, object]) -> OpMsgRequest:
    return OpMsgRequest(1, 0, body)


def test_default_is_eighty_percent_of_the_descriptor_limit_capped_at_a_million() -> None:
    assert default_max_conns(20_000) == 16_000
    assert default_max_conns(10**9) == 1_000_000
    assert effective_max_conns(50, 20_000) == 50
    assert effective_max_conns(100_000, 20_000) == 16_000


@pytest.mark.parametrize(("body", "member"), [
    ({"hello": 1, "internalClient": {"maxWireVersion": 21}, "$db": "admin"}, True),
    ({"replSetHeartbeat": "rs0", "$db": "admin"}, True),
    ({"replSetUpdatePosition": 1, "$db": "admin"}, True),
    ({"find": "oplog.rs", "filter": {}, "$db": "local"}, True),
    ({"getMore": 5, "collection": "oplog.rs", "$db": "local"}, True),
    ({"hello": 1, "client": {"driver": {"name": "PyMongo"}}, "$db": "admin"}, False),
    ({"find": "oplog.rs", "$db": "app"}, False),
    ({"ping": 1, "$db": "admin"}, False),
])
def test_messages_only_members_send_are_claims_for_fail_points(body: dict[str, object], member: bool) -> None:
    assert claims_member(_msg(body)) is member


def test_a_member_message_grants_nothing_only_a_member_login_does() -> None:
    adm = Admission(max_conns=2, max_pending=1)
    a, b = adm.on_accept(0), adm.on_accept(0)
    assert a == b == Admitted(Role.CLIENT)
    pending = adm.on_accept(0)
    assert pending == Admitted(Role.PENDING)
    assert adm.on_accept(0) is None  # past the bound on pending connections: refused at accept
    # A pending connection may say hello (with internalClient or not) and log in; nothing else.
    assert adm.may_serve_pending("hello") and adm.may_serve_pending("saslStart")
    assert not adm.may_serve_pending("replSetHeartbeat")
    assert not adm.may_serve_pending("find")
    assert adm.on_member_login(3, Role.PENDING) is Role.MEMBER
    assert adm.on_member_login(1, Role.CLIENT) is Role.MEMBER  # a client that logged in with the keyfile
    assert adm.snapshot()["members"] == 2 and adm.snapshot()["clients"] == 1 and adm.snapshot()["pending"] == 0
    assert adm.on_accept(0) == Admitted(Role.CLIENT)


def test_at_the_cap_a_new_connection_takes_the_place_of_the_longest_idle_client() -> None:
    adm = Admission(max_conns=2, max_pending=4, preempt_idle_ms=5_000)
    adm.on_accept(0), adm.on_accept(0)
    adm.on_idle(1, Role.CLIENT, now_ms=1_000)
    adm.on_idle(2, Role.CLIENT, now_ms=2_000)
    assert adm.on_accept(now_ms=5_500) == Admitted(Role.PENDING)  # nobody idle for 5 s yet
    adm.on_busy(1)
    adm.on_idle(1, Role.CLIENT, now_ms=6_000)  # 1 was used again: 2 is now the longest idle
    assert adm.on_accept(now_ms=7_100) == Admitted(Role.CLIENT, evict=2)
    adm.on_close(2, Role.CLIENT)
    assert adm.snapshot()["clients"] == 2 and adm.snapshot()["evicted"] == 1
    assert adm.on_accept(now_ms=7_200) == Admitted(Role.PENDING)  # 1 has been idle 1.2 s only
    members = Admission(max_conns=1, preempt_idle_ms=0)
    members.on_accept(0)
    members.on_member_login(1, Role.CLIENT)
    members.on_idle(1, Role.MEMBER, now_ms=0)  # members are never idle-closed
    assert members.over_idle_budget() == [] and members.on_accept(10_000) == Admitted(Role.CLIENT)


def test_idle_clients_past_the_budget_are_closed_oldest_first() -> None:
    adm = Admission(max_conns=100, max_idle=2)
    for conn_id in range(1, 5):
        adm.on_accept(0)
        adm.on_idle(conn_id, Role.CLIENT, now_ms=conn_id)
    assert adm.over_idle_budget() == [1, 2]
    assert adm.over_idle_budget() == []
    adm.on_busy(3)
    adm.on_accept(0)
    adm.on_idle(5, Role.CLIENT, now_ms=9)
    adm.on_idle(3, Role.CLIENT, now_ms=10)
    assert adm.over_idle_budget() == [4]


def _decode_one(data: bytes) -> object:
    decoder = MessageDecoder()
    decoder.receive_data(data)
    return decoder.next_request()


def test_an_unframeable_length_raises_before_the_body_arrives() -> None:
    for length in (15, -1, 48_000_001):
        decoder = MessageDecoder()
        decoder.receive_data(struct.pack("<i", length))
        with pytest.raises(ProtocolError, match="invalid message length"):
            decoder.next_request()


def test_framed_messages_with_bad_contents_become_malformed_requests() -> None:
    bad_bson = struct.pack("<I", 0) + b"\x00" + struct.pack("<i", 9) + b"\x10a\x00\x01"
    frame = struct.pack("<iiii", 16 + len(bad_bson), 77, 0, 2013) + bad_bson
    got = _decode_one(frame)
    assert isinstance(got, MalformedRequest) and (got.request_id, got.code, got.more_to_come) == (77, 22, False)
    silent = struct.pack("<iiii", 21, 78, 0, 2013) + struct.pack("<I", FLAG_MORE_TO_COME) + b"\x07"
    got = _decode_one(silent)
    assert isinstance(got, MalformedRequest) and got.more_to_come
    got = _decode_one(struct.pack("<iiii", 20, 79, 0, 2002) + b"\x00" * 4)
    assert isinstance(got, MalformedRequest) and got.opcode == 2002
    ok = _decode_one(encode_op_msg_request({"ping": 1, "$db": "admin"}, 80))
    assert isinstance(ok, OpMsgRequest) and ok.body == bson.decode(bson.encode({"ping": 1, "$db": "admin"}))
