"""The wire server's bounds on real member processes: --maxConns, stalled messages, unread replies.

Each test waits on an observable condition (a reply, an end of stream, a counter on
the member's /health endpoint, a line in its log) with a deadline, never on a sleep.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import time
from collections.abc import Callable, Iterator
from typing import Any

import bson
import pytest
from pymongo import MongoClient

from base.codec import decode_reply, encode_op_msg_request
from replset.auth.keyfile import read_keyfile, write_keyfile
from tests.support.members import Member, wait_for
from tests.support.replica_set import make_replica_set
from tests.support.wire import member_health, raw_command, recv_exact, roundtrip

PING = {"ping": 1, "$db": "admin"}
MEMBER_HELLO = {"hello": 1, "internalClient": {"minWireVersion": 0, "maxWireVersion": 21}, "$db": "admin"}
ANSWER_BOUND_S = 2.0


def connections(member: Member) -> dict[str, int]:
    return dict(member_health(member.http_port)["connections"])


@contextlib.contextmanager
def open_sockets() -> Iterator[list[socket.socket]]:
    socks: list[socket.socket] = []
    try:
        yield socks
    finally:
        for s in socks:
            s.close()


def connect(member: Member, timeout_s: float = 5.0) -> socket.socket:
    return socket.create_connection(("127.0.0.1", member.port), timeout=timeout_s)


def closed_by_server(sock: socket.socket, timeout_s: float) -> bool:
    """True once the server ends the stream (EOF or reset) within `timeout_s`, reading past any replies."""
    sock.settimeout(timeout_s)
    try:
        while sock.recv(65536):
            pass
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False
    return True


def timed(fn: Callable[[], dict[str, Any]]) -> tuple[dict[str, Any], float]:
    started = time.monotonic()
    reply = fn()
    return reply, time.monotonic() - started


def test_clients_over_max_conns_are_refused_and_a_member_claim_is_not_an_exemption(
        start_member: Callable[..., Member]) -> None:
    member = start_member("--maxConns", "20", initiate=False)  # no driver whose monitor holds a connection
    with open_sockets() as socks:
        for i in range(20):
            socks.append(connect(member))
            assert roundtrip(socks[-1], encode_op_msg_request(MEMBER_HELLO if i % 2 else PING, 1))["ok"] == 1.0
        assert connections(member)["clients"] == 20  # saying internalClient made nobody a member

        refused = connect(member)
        socks.append(refused)
        refused.sendall(encode_op_msg_request({"find": "c", "$db": "test"}, 2))
        assert closed_by_server(refused, 10), "a client over the limit got an answer"
        silent = connect(member)
        socks.append(silent)
        assert closed_by_server(silent, 10), "a silent connection over the limit was kept"

        claims = connect(member)  # says it is a member: may say hello (and log in), nothing more
        socks.append(claims)
        assert roundtrip(claims, encode_op_msg_request(MEMBER_HELLO, 3))["ok"] == 1.0
        claims.sendall(encode_op_msg_request({"replSetHeartbeat": "rs0", "term": 1, "$db": "admin"}, 4))
        assert closed_by_server(claims, 10), "a member message over the limit was served without a login"
        fetcher = connect(member)
        socks.append(fetcher)
        fetcher.sendall(encode_op_msg_request({"find": "oplog.rs", "limit": 1, "$db": "local"}, 5))
        assert closed_by_server(fetcher, 10), "an oplog read over the limit was served without a login"
        counts = connections(member)
        assert counts["clients"] == 20 and counts["members"] == 0 and counts["refused"] >= 4, counts
        assert roundtrip(socks[0], encode_op_msg_request(PING, 6))["ok"] == 1.0  # existing clients go on

        socks.pop(0).close()
        wait_for(lambda: connections(member)["clients"] == 19, 10, "a client slot to free up")
        assert raw_command(member.port, PING)["ok"] == 1.0
    assert "refused because too many open connections" in member.read_log()


def test_a_thousand_stalled_connections_do_not_stop_hello_and_ping(start_member: Callable[..., Member]) -> None:
    # Budgets wide enough to keep them all: what is measured is a loop holding them, not the budgets.
    member = start_member("--maxNewConnsPerSource", "2000", "--maxPartialConns", "2000")
    frame = encode_op_msg_request({"insert": "c", "documents": [{"x": "y" * 1000}], "$db": "test"}, 9)
    with open_sockets() as socks:
        for i in range(1200):
            s = connect(member)
            socks.append(s)
            if i % 3 == 1:
                s.sendall(frame[:7])  # part of a header
            elif i % 3 == 2:
                s.sendall(frame[: len(frame) // 2])  # a header and part of the body
        wait_for(lambda: connections(member)["current"] >= 1200, 30, "the member to accept 1,200 connections")
        for request_id, body in enumerate([PING, {"hello": 1, "$db": "admin"}, PING], start=1):
            reply, took = timed(lambda body=body: raw_command(member.port, body))
            assert reply["ok"] == 1.0 and took < ANSWER_BOUND_S, (body, took)
            reply, took = timed(lambda r=request_id, b=body: roundtrip(socks[0], encode_op_msg_request(b, r)))
            assert reply["ok"] == 1.0 and took < ANSWER_BOUND_S, (body, took)
        with member.direct_client() as client:
            assert client.admin.command("hello")["isWritablePrimary"]
        socks[2].sendall(frame[len(frame) // 2:])  # a stalled message, completed, is served
        assert decode_reply(_read_frame(socks[2]))[1]["ok"] == 1.0


def _read_frame(sock: socket.socket) -> bytes:
    header = recv_exact(sock, 16)
    return header + recv_exact(sock, struct.unpack_from("<i", header)[0] - 16)


def test_a_stalled_partial_message_is_closed_but_an_idle_connection_is_not(
        start_member: Callable[..., Member]) -> None:
    member = start_member("--stalledMessageTimeoutSecs", "1", initiate=False)
    frame = encode_op_msg_request(PING, 1)
    with open_sockets() as socks:
        idle = connect(member)
        socks.append(idle)
        assert roundtrip(idle, frame)["ok"] == 1.0
        half_header, half_body = connect(member), connect(member)
        socks += [half_header, half_body]
        half_header.sendall(frame[:6])
        half_body.sendall(frame[:20])
        assert closed_by_server(half_header, 10) and closed_by_server(half_body, 10)
        # The idle connection has now been idle for longer than the stall timeout: still served.
        assert roundtrip(idle, encode_op_msg_request(PING, 2))["ok"] == 1.0
    assert "in the middle of a message" in member.read_log()


def test_unframeable_lengths_close_and_bad_contents_get_an_error_reply(
        start_member: Callable[..., Member]) -> None:
    member = start_member(initiate=False)
    with open_sockets() as socks:
        for length in (48_000_001, 2**31 - 1, 15, -16):
            s = connect(member)
            socks.append(s)
            s.sendall(struct.pack("<iiii", length, 1, 0, 2013))  # the body never comes
            assert closed_by_server(s, 10), length
        s = connect(member)
        socks.append(s)
        body = struct.pack("<I", 0) + b"\x00" + struct.pack("<i", 9) + b"\x10a\x00\x01"  # truncated int32
        reply = roundtrip(s, struct.pack("<iiii", 16 + len(body), 7, 0, 2013) + body)
        assert reply["ok"] == 0 and reply["code"] == 22, reply
        legacy = roundtrip(s, struct.pack("<iiii", 20, 8, 0, 2002) + b"\x00" * 4)
        assert legacy["ok"] == 0, legacy
        assert roundtrip(s, encode_op_msg_request(PING, 9))["ok"] == 1.0


def test_a_client_that_never_reads_its_replies_is_closed(start_member: Callable[..., Member]) -> None:
    member = start_member("--writeStallTimeoutSecs", "1")
    with member.direct_client() as client:
        client.test.big.insert_many([{"_id": i, "blob": bson.Binary(b"x" * 1_000_000)} for i in range(8)])
    with open_sockets() as socks:
        s = socket.socket()
        socks.append(s)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        s.connect(("127.0.0.1", member.port))
        find = encode_op_msg_request({"find": "big", "batchSize": 8, "$db": "test"}, 1)
        s.sendall(find * 4)  # about 32 MB of replies that are never read
        port = s.getsockname()[1]
        wait_for(lambda: f"127.0.0.1:{port}: it read none of" in member.read_log(), 20,
                 "the member to close a connection that does not read")
        assert raw_command(member.port, PING)["ok"] == 1.0


@pytest.mark.alone   # which comes first on a loaded machine, an eviction or an election, is timing
def test_member_connections_get_through_a_primary_full_of_idle_clients(tmp_path: Any) -> None:
    """Replication and elections keep working when application connections fill every member: without
    auth nothing tells a member from a client, so the restarted member's connections take the places
    of the clients idle longest."""
    rs = make_replica_set(str(tmp_path), 3, extra_args=("--maxConns", "16"))
    with open_sockets() as socks:
        try:
            rs.start()
            primary = rs.initiate()
            for c in rs.clients:
                c.close()
            # A driver's monitor may sit in an awaitable hello (up to 10 s) before its close is seen.
            # The other members' own connections count too: 2 or 3 each.
            wait_for(lambda: connections(primary)["clients"] <= 6, 30, "the set-up clients to go")
            while connections(primary)["clients"] < 16:
                socks.append(connect(primary))
                assert roundtrip(socks[-1], encode_op_msg_request(PING, 1))["ok"] == 1.0
            secondary = next(m for m in rs.members if m is not primary)
            secondary.stop()  # its new heartbeat and fetcher connections must get in
            # Its old connections freed places: taken again, so that only an eviction lets it back in.
            wait_for(lambda: connections(primary)["clients"] < 16, 10, "the stopped member's connections to go")
            while connections(primary)["clients"] < 16:
                socks.append(connect(primary))
                assert roundtrip(socks[-1], encode_op_msg_request(PING, 1))["ok"] == 1.0
            secondary.start()
            upsert = {"update": "c", "updates": [{"q": {"_id": 1}, "u": {"$set": {"x": 1}}, "upsert": True}],
                      "writeConcern": {"w": 3, "wtimeout": 3000}, "$db": "test"}
            replies: list[dict[str, Any]] = []

            def written() -> bool:  # a new connection at the limit gets a place once a client idled 5 s
                # To whichever member is primary: while the old primary refused the others' connections,
                # they may have elected one of themselves (a loaded machine takes longer than an election
                # timeout to free a place); elections keep working too.
                for member in rs.members:
                    try:
                        reply = raw_command(member.port, upsert)
                    except (ConnectionError, OSError):
                        continue
                    replies.append(reply)
                    if reply["ok"] == 1.0 and "writeConcernError" not in reply:
                        answered.append(member)
                        return True
                return False

            answered: list[Member] = []
            wait_for(written, 60, "a w:3 write on a new connection")
            counts = connections(primary)
            if answered[0] is primary and counts["evicted"] == 0 and counts["clients"] >= counts["maxConns"]:
                # No place was freed: then the restarted member never needed one. It syncs through the other
                # secondary (a chain), whose reports carry its position upstream; the primary's heartbeats to
                # it go out on connections of the primary's own.
                status = raw_command(secondary.port, {"replSetGetStatus": 1, "$db": "admin"})
                assert status["syncSourceHost"] not in ("", primary.host), (counts, status["syncSourceHost"])
        finally:
            rs.stop()


def _sent(sock: socket.socket, body: dict[str, Any]) -> socket.socket:
    sock.sendall(encode_op_msg_request(body, 99))
    return sock


def test_idle_clients_past_the_budget_are_closed_oldest_first(start_member: Callable[..., Member]) -> None:
    member = start_member("--maxIdleConns", "50", initiate=False)
    with open_sockets() as socks:
        for i in range(300):
            socks.append(connect(member))
            assert roundtrip(socks[-1], encode_op_msg_request(PING, i))["ok"] == 1.0  # idle from now on
        wait_for(lambda: connections(member)["evicted"] >= 250, 30, "the oldest idle connections to be closed")
        assert connections(member)["idle"] <= 50
        assert closed_by_server(socks[0], 10), "the connection idle longest was kept"
        reply, took = timed(lambda: raw_command(member.port, PING))
        assert reply["ok"] == 1.0 and took < ANSWER_BOUND_S
        assert roundtrip(socks[-1], encode_op_msg_request(PING, 1))["ok"] == 1.0  # the newest stay open
    assert "client connections were idle" in member.read_log()


def test_at_the_cap_only_a_keyfile_login_makes_a_member(start_member: Callable[..., Member], tmp_path: Any) -> None:
    key_file = str(tmp_path / "keyfile")
    write_keyfile(key_file)
    member = start_member("--keyFile", key_file, "--maxConns", "2", initiate=False)
    with open_sockets() as socks:
        for _ in range(2):
            socks.append(connect(member))
            assert roundtrip(socks[-1], encode_op_msg_request(PING, 1))["ok"] == 1.0
        claims = connect(member)  # a member's hello without a login: refused at its next command
        socks.append(claims)
        assert roundtrip(claims, encode_op_msg_request(MEMBER_HELLO, 2))["ok"] == 1.0
        claims.sendall(encode_op_msg_request({"replSetGetRBID": 1, "$db": "admin"}, 3))
        assert closed_by_server(claims, 10)
        with MongoClient(f"mongodb://{member.host}/?directConnection=true", username="__system",
                         password=read_keyfile(key_file), authSource="local", authMechanism="SCRAM-SHA-256",
                         serverSelectionTimeoutMS=10_000) as internal:
            assert internal.admin.command("ping")["ok"] == 1.0  # a pending connection is served a login only
            counts = connections(member)
            assert counts["members"] >= 1 and counts["clients"] == 2, counts
