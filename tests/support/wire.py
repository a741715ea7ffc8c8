"""Raw OP_MSG round trips for tests that must control every byte a driver would add."""

from __future__ import annotations

import json
import socket
import struct
import urllib.request
from typing import Any

from base.codec import decode_reply, encode_op_msg_request


def roundtrip(sock: socket.socket, data: bytes) -> dict[str, Any]:
    sock.sendall(data)
    header = recv_exact(sock, 16)
    (length,) = struct.unpack_from("<i", header)
    return decode_reply(header + recv_exact(sock, length - 16))[1]


def recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("closed")
        buf += chunk
    return buf


def raw_command(port: int, body: dict[str, Any]) -> dict[str, Any]:
    """One command on a fresh connection, exactly as given (no read preference, no session)."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        return roundtrip(sock, encode_op_msg_request(body, 1))


def member_health(http_port: int) -> dict[str, Any]:
    """A member's /health document (its `connections` are the wire server's admission counts)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{http_port}/health", timeout=5) as resp:
        return dict(json.loads(resp.read()))
