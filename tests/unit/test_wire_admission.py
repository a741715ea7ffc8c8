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
    Budgets,
    Close,
    Reason,
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


def _proven(adm: Admission, conn_id: int, now_ms: int, source: str = "10.0.0.1") -> Admitted | None:
    """A client connection that sent one whole message and now waits for its next one."""
    admitted = adm.on_accept(conn_id, source, now_ms)
    adm.on_receive(conn_id, 50, now_ms)
    adm.on_message(conn_id, 0, now_ms)
    adm.on_wait(conn_id, 0, now_ms)
    return admitted


def _ids(closes: list[Close]) -> list[int]:
    return [c.conn_id for c in closes]


def test_a_member_message_grants_nothing_only_a_member_login_does() -> None:
    adm = Admission(max_conns=2, max_pending=1)
    a, b = adm.on_accept(1, "h", 0), adm.on_accept(2, "h", 0)
    assert a == b == Admitted(Role.CLIENT)
    pending = adm.on_accept(3, "h", 0)
    assert pending == Admitted(Role.PENDING)
    assert adm.on_accept(4, "h", 0) is None  # past the bound on pending connections: refused at accept
    # A pending connection may say hello (with internalClient or not) and log in; nothing else.
    assert adm.may_serve_pending("hello") and adm.may_serve_pending("saslStart")
    assert not adm.may_serve_pending("replSetHeartbeat")
    assert not adm.may_serve_pending("find")
    assert adm.on_login(3, member=True) is Role.MEMBER
    assert adm.on_login(1, member=True) is Role.MEMBER  # a client that logged in with the keyfile
    assert adm.snapshot()["members"] == 2 and adm.snapshot()["clients"] == 1 and adm.snapshot()["pending"] == 0
    assert adm.on_accept(5, "h", 0) == Admitted(Role.CLIENT)
    assert adm.on_login(2, member=False) is Role.CLIENT  # a user's login: still a client


def test_a_pending_connection_that_does_not_log_in_in_time_is_refused() -> None:
    adm = Admission(max_conns=1, budgets=Budgets(identify_ms=2_000))
    _proven(adm, 1, 0)
    assert adm.on_accept(2, "h", 100) == Admitted(Role.PENDING)
    assert adm.overdue(now_ms=2_099) == []
    assert adm.overdue(now_ms=2_100) == [Close(2, Reason.IDENTIFY)]
    assert adm.overdue(now_ms=9_000) == [] and adm.refused == 1
    adm.on_close(2)
    assert adm.snapshot()["pending"] == 0


def test_at_the_cap_a_new_connection_takes_the_place_of_the_client_waiting_longest() -> None:
    adm = Admission(max_conns=2, max_pending=4, budgets=Budgets(preempt_idle_ms=5_000))
    _proven(adm, 1, 1_000)
    _proven(adm, 2, 2_000)
    assert adm.on_accept(3, "h", now_ms=5_500) == Admitted(Role.PENDING)  # nobody idle for 5 s yet
    adm.on_receive(1, 20, 6_000)  # 1 was used again: 2 is now the longest idle
    adm.on_message(1, 0, 6_000)
    adm.on_wait(1, 0, 6_000)
    assert adm.on_accept(4, "h", now_ms=7_100) == Admitted(Role.CLIENT, evict=2)
    adm.on_close(2)
    assert adm.snapshot()["clients"] == 2 and adm.snapshot()["evicted"] == 1
    assert adm.on_accept(5, "h", now_ms=7_200) == Admitted(Role.PENDING)  # 1 has been idle 1.2 s only
    adm.on_receive(1, 20, 8_000)  # busy (mid-message) since 8_000
    # A connection that never finished its message (4, since 7_100) waits longest at 12_200.
    assert adm.on_accept(6, "h", now_ms=12_200) == Admitted(Role.CLIENT, evict=4)
    members = Admission(max_conns=1, budgets=Budgets(preempt_idle_ms=0))
    _proven(members, 1, 0)
    members.on_login(1, member=True)
    members.on_wait(1, 0, now_ms=0)  # members are never idle-closed
    assert members.over_budget(10_000) == [] and members.on_accept(2, "h", 10_000) == Admitted(Role.CLIENT)


def test_idle_clients_past_the_budget_are_closed_oldest_first() -> None:
    adm = Admission(max_conns=100, budgets=Budgets(max_idle=2))
    for conn_id in range(1, 5):
        _proven(adm, conn_id, conn_id)
    assert _ids(adm.over_budget(10)) == [1, 2]
    assert adm.over_budget(10) == []
    adm.on_receive(3, 20, 11)
    _proven(adm, 5, 12)
    adm.on_message(3, 0, 13)
    adm.on_wait(3, 0, 13)
    assert adm.over_budget(14) == [Close(4, Reason.IDLE)]


def test_connections_without_a_whole_message_are_budgeted_oldest_first_after_a_grace() -> None:
    adm = Admission(max_conns=100, budgets=Budgets(max_partial=3, max_new_per_source=100, grace_ms=100))
    for conn_id in range(1, 6):  # silent, or half a header: neither is idle, both are partial
        adm.on_accept(conn_id, f"10.0.0.{conn_id}", now_ms=conn_id)
        adm.on_receive(conn_id, 7 * (conn_id % 2), now_ms=conn_id)
    assert adm.snapshot()["partial"] == 5 and adm.snapshot()["idle"] == 0
    assert adm.over_budget(now_ms=100) == []  # none has waited the grace: what they sent may be unread
    assert adm.over_budget(now_ms=101) == [Close(1, Reason.PARTIAL)]
    assert _ids(adm.over_budget(now_ms=500)) == [2]
    _proven(adm, 6, 600)  # a whole message: out of the budget
    adm.on_receive(6, 10, 700)  # the start of its next message: partial again, the newest
    assert adm.snapshot()["partial"] == 4 and _ids(adm.over_budget(now_ms=900)) == [3]
    adm.on_message(6, 0, 710)  # whole: busy, neither partial nor idle
    assert adm.snapshot()["partial"] == 2
    adm.on_login(4, member=False)  # authenticated clients are not in the budget
    assert adm.snapshot()["partial"] == 1


def test_connections_from_one_address_that_never_finish_a_first_message_are_capped() -> None:
    adm = Admission(max_conns=100, budgets=Budgets(max_new_per_source=2, grace_ms=0))
    for conn_id in range(1, 5):
        adm.on_accept(conn_id, "10.0.0.9", now_ms=conn_id)
    adm.on_accept(5, "10.0.0.8", now_ms=5)
    assert adm.over_budget(now_ms=10) == [Close(1, Reason.SOURCE), Close(2, Reason.SOURCE)]
    adm.on_close(1)
    adm.on_close(2)
    _proven(adm, 6, 11, source="10.0.0.9")  # one that finished its first message does not count
    assert adm.over_budget(now_ms=12) == []
    adm.on_accept(7, "10.0.0.9", now_ms=13)
    assert adm.over_budget(now_ms=14) == [Close(3, Reason.SOURCE)]


def test_bytes_of_unfinished_messages_are_capped_oldest_message_first_members_never() -> None:
    mib = 1 << 20
    adm = Admission(max_conns=100, budgets=Budgets(max_partial_bytes=100 * mib))
    for conn_id in (1, 2, 3, 4):
        _proven(adm, conn_id, 0)
    adm.on_login(1, member=True)
    adm.on_login(2, member=False)
    adm.on_receive(1, 40 * mib, 10)  # a member's (never closed)
    adm.on_receive(2, 40 * mib, 20)  # a logged-in client's (closed after the others)
    adm.on_receive(3, 10 * mib, 30)
    adm.on_receive(4, 5 * mib, 40)
    assert adm.over_budget(50) == [] and adm.held_total == 95 * mib
    adm.on_receive(4, 15 * mib, 50)  # 4's message grows: 3's began before it
    assert adm.over_budget(50) == [Close(3, Reason.BYTES)] and adm.held_total == 95 * mib
    adm.on_receive(4, 30 * mib, 60)
    assert adm.over_budget(60) == [Close(4, Reason.BYTES)]
    adm.on_close(3)
    adm.on_close(4)
    _proven(adm, 5, 70)
    adm.on_receive(5, 30 * mib, 70)
    assert adm.over_budget(70) == [Close(5, Reason.BYTES)]  # newer than 2's, but not logged in
    adm.on_receive(1, 70 * mib, 80)
    assert adm.over_budget(80) == [Close(2, Reason.BYTES)]  # the last one that may be closed
    adm.on_receive(1, 120 * mib, 90)
    assert adm.over_budget(90) == [] and adm.held_total == 120 * mib


def test_a_message_that_stops_half_way_is_overdue_an_idle_connection_is_not() -> None:
    adm = Admission(max_conns=100, budgets=Budgets(stalled_ms=1_000))
    _proven(adm, 1, 0)  # idle: never overdue
    adm.on_accept(2, "h", 0)
    adm.on_receive(2, 7, 0)  # half a header
    _proven(adm, 3, 0)
    adm.on_receive(3, 100, 0)  # a long message, still arriving
    adm.on_receive(3, 200, 900)
    assert adm.overdue(999) == []
    assert adm.overdue(1_000) == [Close(2, Reason.STALLED)]
    assert adm.overdue(1_899) == [] and adm.overdue(1_900) == [Close(3, Reason.STALLED)]
    assert adm.overdue(10_000) == [] and adm.snapshot()["stalled"] == 2


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


def test_budgets_out_of_range_are_refused() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        Budgets(max_partial=0)
    with pytest.raises(ValueError, match="one largest message"):
        Budgets(max_partial_bytes=1_000_000)  # a lone client's 48 MB message would never fit
