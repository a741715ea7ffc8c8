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
    Role,
    Verdict,
    default_max_conns,
    effective_max_conns,
    is_member_request,
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
def test_members_are_recognised_by_their_first_message(body: dict[str, object], member: bool) -> None:
    assert is_member_request(_msg(body)) is member


def test_at_the_limit_only_members_get_in_and_they_never_count() -> None:
    adm = Admission(max_conns=2, max_pending=1)
    a, b = adm.on_accept(), adm.on_accept()
    assert (a, b) == (Role.CLIENT, Role.CLIENT)
    assert adm.on_accept() is Role.PENDING
    assert adm.on_accept() is None  # past the bound on pending connections: refused at accept
    assert adm.on_message(Role.PENDING, member=True) == (Role.MEMBER, Verdict.SERVE)
    assert adm.on_accept() is Role.PENDING
    assert adm.on_message(Role.PENDING, member=False) == (Role.PENDING, Verdict.REFUSE)
    adm.on_close(Role.PENDING)
    assert adm.on_message(Role.CLIENT, member=True) == (Role.MEMBER, Verdict.SERVE)  # a client was a member
    assert adm.snapshot() | {} == {"current": 3, "clients": 1, "members": 2, "pending": 0, "refused": 2,
                                   "maxConns": 2}
    assert adm.on_accept() is Role.CLIENT


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
