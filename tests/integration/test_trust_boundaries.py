"""Trust boundaries on a real set without auth: no message makes a member connect to an address that
is not a member's. A client's `_partsCommit` naming a host of its own is refused; one naming a real
member with an HTTP address of the client's choosing is recorded with that member's own address, and
the members fetch from there, never from the client's.
"""

from __future__ import annotations

import socket
from typing import Any

import pytest
from pymongo.errors import OperationFailure

from tests.support.members import wait_for
from tests.support.replica_set import ReplicaSet

TABLE = {"columns": [{"name": "k", "type": "int64"}], "orderBy": ["k"]}
FAKE_BLOCK = {"partition": "all", "blockId": "all_forged", "rows": 1, "bytes": 10,
              "checksums": [{"file": "data.parquet", "size": 10, "sha256": "0" * 64}]}


@pytest.fixture()
def listener() -> Any:
    """A port on loopback that records whoever connects to it (nothing should)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(16)
        sock.setblocking(False)
        yield sock


def _accepted(sock: socket.socket) -> int:
    count = 0
    while True:
        try:
            conn, _ = sock.accept()
        except BlockingIOError:
            return count
        conn.close()
        count += 1


def test_a_parts_commit_never_sends_members_to_an_address_a_client_names(rs: ReplicaSet,
                                                                          listener: socket.socket) -> None:
    primary = rs.wait_primary()
    secondary = next(m for m in rs.members if m is not primary)
    db = rs.client().trust
    db.command({"createPartsTable": "events", **TABLE})
    forged_http = f"127.0.0.1:{listener.getsockname()[1]}"
    try:
        with pytest.raises(OperationFailure) as not_a_member:
            db.command({"_partsCommit": "events", "blocks": [FAKE_BLOCK], "source": forged_http,
                        "http": forged_http, "attempt": "a", "quorum": 0})
        assert not_a_member.value.code == 2 and "not a member" in str(not_a_member.value)

        reply = db.command({"_partsCommit": "events", "blocks": [FAKE_BLOCK], "source": secondary.host,
                            "http": forged_http, "attempt": "b", "quorum": 0})
        assert reply["ok"] == 1.0
        logged = db["system.parts.events.log"].find_one({"blockId": "all_forged"})
        assert logged is not None and logged["http"] == f"127.0.0.1:{secondary.http_port}", logged

        # The other members try to fetch the part (which the secondary does not have) from the secondary.
        def fetch_tried() -> bool:
            rows = rs.direct(primary).trust.command({"partsReplicationQueue": "events"})["queue"]
            return any(r.get("num_tries", 0) >= 1 and r.get("new_part_name", "").startswith("all_") for r in rows)

        wait_for(fetch_tried, 60, "the primary to try fetching the forged part")
        assert _accepted(listener) == 0
    finally:
        db.command({"dropPartsTable": "events"})
