"""Hostile floods on a real member process: connections that never finish a message, and unfinished
messages of tens of MiB. The member's budgets (replset/wire/admission.py) close what floods hold,
oldest first, so that a fresh client is answered at once and the member's memory stays bounded.

Every wait has a deadline and every figure is measured (a ping's round trip, /health's counts, the
kernel's peak RSS of the member), never slept for.

The flood is paced (FLOOD_RATE a second). A client opening connections faster than the member
accepts them fills the kernel's accept queue (net.core.somaxconn, 4,096 here), and a full queue
drops the SYN of every new connection, a fresh ping's too, which then waits for the client's TCP
to retry (a second): no server-side budget can change that, only the rate at which the member
accepts (about 45 us of the member's CPU a connection here, so over 20,000 a second on one core).
"""

from __future__ import annotations

import socket
import struct
import threading
import time
from collections.abc import Callable
from typing import Any

import bson
import pytest

from base.codec import MAX_MESSAGE_SIZE, encode_op_msg_request
from replset.wire.admission import DEFAULT_MAX_NEW_PER_SOURCE, DEFAULT_MAX_PARTIAL_BYTES
from tests.support.flood import start_flood
from tests.support.members import Member, wait_for
from tests.support.wire import member_health, roundtrip

PING = {"ping": 1, "$db": "admin"}
FLOOD_CONNECTIONS = 22_000
FLOOD_RATE = 4_000  # connections a second
PING_BOUND_S = 0.25
PEAK_PINGS = 20
PING_EVERY_S = 0.01
MIB = 1 << 20


def connections(member: Member) -> dict[str, int]:
    return dict(member_health(member.http_port)["connections"])


def ping_seconds(member: Member) -> float:
    """A fresh client's ping: connect, send, read the reply. A reply later than 4 x PING_BOUND_S is a
    timeout (the assertion on the figure fails either way)."""
    started = time.monotonic()
    with socket.create_connection(("127.0.0.1", member.port), timeout=4 * PING_BOUND_S) as sock:
        assert roundtrip(sock, encode_op_msg_request(PING, 1))["ok"] == 1.0
    return time.monotonic() - started


def vm_kib(pid: int, field: str) -> int:
    with open(f"/proc/{pid}/status") as f:
        line = next(line for line in f if line.startswith(field + ":"))
    return int(line.split()[1])


@pytest.mark.alone   # ping latencies are judged
def test_a_flood_of_half_sent_headers_leaves_a_fresh_ping_answered_at_once(
        start_member: Callable[..., Member]) -> None:
    member = start_member(initiate=False)
    ping_seconds(member)  # (the first connection warms the member up)
    flood = start_flood(member.port, FLOOD_CONNECTIONS, FLOOD_RATE)
    try:
        filling: list[float] = []
        while not flood.done:
            filling.append(ping_seconds(member))
            flood.wait(PING_EVERY_S)  # (the pings' own connections stay few)
        assert sum(flood.failed) == 0 and flood.open_count == FLOOD_CONNECTIONS, (flood.opened, flood.failed)
        # The peak: every connection is in, and all but the budget's are closed.
        closed_all_but_budget = FLOOD_CONNECTIONS - DEFAULT_MAX_NEW_PER_SOURCE - 2
        wait_for(lambda: connections(member)["closedUnfinished"] >= closed_all_but_budget, 60,
                 "the member to take in the whole flood")
        peak = [ping_seconds(member) for _ in range(PEAK_PINGS)]
        counts = connections(member)
    finally:
        flood.stop()
    print(f"\nflood of {FLOOD_CONNECTIONS} from {len(flood.processes)} process(es) (hard limit raised: "
          f"{flood.raised_fd_limit}); pings while filling: {len(filling)}, slowest "
          f"{max(filling) * 1000:.1f} ms; at the peak: slowest {max(peak) * 1000:.1f} ms; {counts}")
    assert len(filling) >= 10, "the flood filled before the member was pinged while it filled"
    assert max(filling) < PING_BOUND_S, sorted(filling)[-5:]
    assert max(peak) < PING_BOUND_S, peak
    assert counts["current"] <= DEFAULT_MAX_NEW_PER_SOURCE + 1, counts
    assert "Traceback" not in member.read_log()


def _unfinished_message(length: int, body_bytes: int) -> bytes:
    """The header of a `length`-byte OP_MSG and the first `body_bytes` of it."""
    return struct.pack("<iiii", length, 1, 0, 2013) + b"\x00" * body_bytes


def _send_quietly(sock: socket.socket, data: bytes) -> None:
    try:
        sock.sendall(data)
    except OSError:
        pass  # closed by the member, as it should be for all but the newest


@pytest.mark.alone   # (the member's memory, and that it answers a ping within a second, are judged)
def test_unfinished_messages_of_tens_of_mib_cannot_push_the_member_past_its_byte_cap(
        start_member: Callable[..., Member]) -> None:
    member = start_member()  # (a primary, for the insert at the end)
    assert member.process is not None
    pid = member.process.pid
    ping_seconds(member)
    rss_before_kib = vm_kib(pid, "VmRSS")
    senders = [socket.create_connection(("127.0.0.1", member.port), timeout=30) for _ in range(6)]
    try:
        data = _unfinished_message(47_000_000, 40 * MIB)
        threads = [threading.Thread(target=_send_quietly, args=(s, data)) for s in senders]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        counts = connections(member)
        peak_growth = (vm_kib(pid, "VmHWM") - rss_before_kib) * 1024
        assert ping_seconds(member) < 1.0
        # A client's whole 45 MB message still goes through: the stalled ones began first and go first.
        _insert_a_45_mb_message(member)
        after = connections(member)
    finally:
        for s in senders:
            s.close()
    print(f"\nRSS {rss_before_kib // 1024} MiB before, peak growth {peak_growth / MIB:.0f} MiB "
          f"(cap {DEFAULT_MAX_PARTIAL_BYTES / MIB:.0f} MiB); {counts}; after a 45 MB insert: {after}")
    assert counts["closedForBytes"] >= 4, counts  # 6 x 40 MiB against a 91.5 MiB cap: 2 fit
    assert counts["partialBytes"] <= DEFAULT_MAX_PARTIAL_BYTES, counts
    # The cap, the bytearrays' growth margin (1/8) and the member's transient copies of read chunks.
    assert peak_growth <= DEFAULT_MAX_PARTIAL_BYTES * 1.125 + 32 * MIB, peak_growth / MIB


def _insert_a_45_mb_message(member: Member) -> None:
    docs = [{"_id": i, "blob": bson.Binary(b"x" * (15 * 1000 * 1000))} for i in range(3)]
    request = encode_op_msg_request({"insert": "big", "$db": "test"}, 7, sequences={"documents": docs})
    assert len(request) < MAX_MESSAGE_SIZE
    with socket.create_connection(("127.0.0.1", member.port), timeout=60) as sock:
        reply: dict[str, Any] = roundtrip(sock, request)
    assert reply["ok"] == 1.0 and reply["n"] == 3, reply
