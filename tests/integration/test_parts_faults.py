"""Parts tables under faults on real members: a stalled fetch source is abandoned for another holder;
the primary killed after committing an insert - retried by the client on another member, or by the
member that sent the commit - leaves exactly one part; a member killed between its commit and the
publish of its part publishes it at restart."""

from __future__ import annotations

import datetime
import os
import threading
from typing import Any

import pytest
from pymongo import ReadPreference
from pymongo.errors import OperationFailure, PyMongoError

from tests.support.members import Member, wait_for
from tests.support.parts import part_dirs, select
from tests.support.proxy import FaultProxy
from tests.support.replica_set import ReplicaSet

TABLE = {"columns": [{"name": "day", "type": "timestamp[ms]"}, {"name": "user", "type": "string"},
                     {"name": "n", "type": "int64"}],
         "partitionBy": "toYYYYMM(day)", "orderBy": ["user", "day"],
         "settings": {"fetchProgressTimeoutMS": 1500}}


def _rows(n: int, month: int = 6, start: int = 0) -> list[dict[str, Any]]:
    return [{"day": datetime.datetime(2024, month, 1 + i % 28), "user": f"u{i % 3}", "n": start + i}
            for i in range(n)]


def _http(member: Member) -> str:
    return f"127.0.0.1:{member.http_port}"


def _log(rs: ReplicaSet, member: Member, db: str) -> Any:
    return rs.direct(member)[db].get_collection("system.parts.events.log",
                                                read_preference=ReadPreference.SECONDARY_PREFERRED)


def test_a_stalled_fetch_source_is_abandoned_for_another_holder(rs3: ReplicaSet) -> None:
    rs3.client().st.command({"createPartsTable": "events", **TABLE})
    primary = rs3.wait_primary()
    s1, s2 = [m for m in rs3.members if m is not primary]
    with FaultProxy() as proxy:
        # S2 reaches the primary's HTTP port only through a link that holds every byte; S1 cannot fetch yet.
        stalled = proxy.add_link(s2.host, _http(primary))
        proxy.set_links([(s2.host, _http(primary))], blackholed=True)
        rs3.fail_point(s2, "peerRoutes", "alwaysOn", {"routes": {_http(primary): stalled}})
        rs3.fail_point(s1, "peerRoutes", "alwaysOn", {"routes": {_http(primary): "127.0.0.1:1"}})
        part = rs3.client().st.command({"insertBlock": "events", "rows": _rows(20)})["blocks"][0]["part"]

        def stalled_fetch_failed() -> bool:
            queue = rs3.direct(s2).st.command({"partsReplicationQueue": "events"})["queue"]
            return bool(queue) and queue[0]["num_tries"] >= 1 and bool(queue[0]["last_exception"])

        wait_for(stalled_fetch_failed, 20, "S2's fetch from the stalled primary to be abandoned")
        assert part_dirs(s2, "st.events") == []
        rs3.fail_point(s1, "peerRoutes", "off")   # S1 fetches from the primary and becomes a holder
        wait_for(lambda: part_dirs(s1, "st.events") == [part], 20, "S1 to fetch the part")
        wait_for(lambda: part_dirs(s2, "st.events") == [part], 30, "S2 to fetch it from S1, the primary still stalled")
        assert proxy.stats()[0].blackholed
        rs3.fail_point(s2, "peerRoutes", "off")


def _insert_in_thread(rs: ReplicaSet, member: Member, db: str, cmd: dict[str, Any]) -> tuple[threading.Thread, list[Any]]:
    outcome: list[Any] = []

    def run() -> None:
        try:
            outcome.append(rs.direct(member)[db].command(cmd))
        except PyMongoError as exc:
            outcome.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, outcome


@pytest.mark.parametrize("retried_by", ["client", "member"])
def test_the_primary_killed_after_committing_an_insert_leaves_exactly_one_part(rs3: ReplicaSet, retried_by: str
                                                                                ) -> None:
    rs3.client().kp.command({"createPartsTable": "events", **TABLE})
    primary = rs3.wait_primary()
    s1, s2 = [m for m in rs3.members if m is not primary]
    rows = _rows(30, 7)
    rs3.fail_point(primary, "partsHangAfterCommit", "alwaysOn")
    # The client's insert goes to the primary itself, or to S1, which sends its commit to the primary.
    sent_to = primary if retried_by == "client" else s1
    thread, outcome = _insert_in_thread(rs3, sent_to, "kp", {"insertBlock": "events", "rows": rows})
    wait_for(lambda: _log(rs3, s1, "kp").count_documents({}) == 1 and _log(rs3, s2, "kp").count_documents({}) == 1,
             20, "the commit on every member")
    primary.kill()
    try:
        if retried_by == "client":
            thread.join(30)
            assert outcome and isinstance(outcome[0], PyMongoError)   # the client never heard back
            new_primary = rs3.wait_primary()
            again = rs3.direct(new_primary).kp.command({"insertBlock": "events", "rows": rows})
            assert again["deduplicated"] == 1   # the retry finds the committed block
        else:
            thread.join(60)
            assert outcome and not isinstance(outcome[0], PyMongoError), outcome
            # S1 retried its commit on the new primary, with the same attempt: its own block, inserted once.
            assert outcome[0]["inserted"] == 1 and outcome[0]["deduplicated"] == 0
    finally:
        primary.start()
    for member in rs3.members:
        wait_for(lambda m=member: len(part_dirs(m, "kp.events")) == 1, 30, f"one part on {member.host}")
        # The restarted member's directory is there before it answers reads (it may still be recovering).
        wait_for(lambda m=member: rs3.status(m)["myState"] in (1, 2), 30, f"{member.host} readable")
        assert _log(rs3, member, "kp").count_documents({}) == 1
        got = list(rs3.direct(member).kp.cursor_command("selectParts", "events", columns=["n"]))
        assert sorted(r["n"] for r in got) == [r["n"] for r in rows]


def test_a_member_killed_between_the_commit_and_its_publish_publishes_at_restart(rs3: ReplicaSet) -> None:
    """S1 fetches nothing (so the log cannot reach it and its runner cannot publish early), writes the
    block, and dies after the primary committed it. At restart S1 keeps the temporary part until the
    log arrives, publishes it, and the others fetch it from S1."""
    rs3.client().cr.command({"createPartsTable": "events", **TABLE})
    primary = rs3.wait_primary()
    s1, s2 = [m for m in rs3.members if m is not primary]
    rows = _rows(25, 8)
    rs3.fail_point(s1, "stopReplProducer", "alwaysOn")
    rs3.fail_point(primary, "partsHangAfterCommit", "alwaysOn")
    thread, _outcome = _insert_in_thread(rs3, s1, "cr", {"insertBlock": "events", "rows": rows})
    wait_for(lambda: _log(rs3, s2, "cr").count_documents({}) == 1, 20, "the commit on a majority")
    s1.kill()   # S1 wrote the part and the primary committed it; S1 never published it
    thread.join(30)
    rs3.fail_point(primary, "partsHangAfterCommit", "off")
    assert [d for d in os.listdir(os.path.join(s1.dbpath, "parts", "cr.events")) if d.startswith("tmp_insert_")]
    s1.start()
    part = _log(rs3, primary, "cr").find_one()["part"]
    for member in rs3.members:   # published once the log reached S1, then fetched from S1 by the others
        wait_for(lambda m=member: part_dirs(m, "cr.events") == [part], 30, f"{part} on {member.host}")
    assert len(select(rs3, s2, "cr")) == 25


def test_a_commit_whose_reply_is_lost_keeps_its_part_until_the_log_names_it(rs3: ReplicaSet) -> None:
    """S1 writes the block, the primary commits it, and every reply S1 gets is lost: the client hears
    a retryable error (HostUnreachable), S1 keeps its temporary part and publishes it when the log
    arrives, the others fetch it from S1, and the client's retry with the same token is deduplicated."""
    rs3.client().ud.command({"createPartsTable": "events", **TABLE})
    primary = rs3.wait_primary()
    s1 = next(m for m in rs3.members if m is not primary)
    rows = _rows(12, 9)
    rs3.fail_point(s1, "partsCommitReplyLost", "alwaysOn", {"deadlineMS": 1500})
    cmd = {"insertBlock": "events", "rows": rows, "dedupToken": "lost-reply"}
    with pytest.raises(OperationFailure) as failed:
        rs3.direct(s1).ud.command(cmd)
    assert failed.value.code == 6, failed.value.details
    part = _log(rs3, primary, "ud").find_one()["part"]
    for member in rs3.members:   # S1 published its kept part; the others fetched it from S1, its only holder
        wait_for(lambda m=member: part_dirs(m, "ud.events") == [part], 30, f"{part} on {member.host}")
    assert not [d for d in os.listdir(os.path.join(s1.dbpath, "parts", "ud.events")) if d.startswith("tmp_")]
    rs3.fail_point(s1, "partsCommitReplyLost", "off")
    again = rs3.direct(s1).ud.command(cmd)
    assert (again["inserted"], again["deduplicated"]) == (0, 1)
    for member in rs3.members:
        assert sorted(r["n"] for r in select(rs3, member, "ud")) == [r["n"] for r in rows]


def test_start_up_sets_aside_a_part_the_log_does_not_know(rs3: ReplicaSet) -> None:
    rs3.client().ux.command({"createPartsTable": "events", **TABLE})
    rs3.client().ux.command({"insertBlock": "events", "rows": _rows(5, 9)})
    member = next(m for m in rs3.members if m is not rs3.wait_primary())
    wait_for(lambda: len(part_dirs(member, "ux.events")) == 1, 20, "the part on the member")
    member.stop()
    stray = os.path.join(member.dbpath, "parts", "ux.events", "202409_77_77_0")
    os.makedirs(stray)
    with open(os.path.join(stray, "data.parquet"), "wb") as f:
        f.write(b"not a part of this table")
    member.start()
    directory = os.path.join(member.dbpath, "parts", "ux.events")
    wait_for(lambda: any(d.startswith("unexpected_202409_77_77_0") for d in os.listdir(directory)), 20,
             "the stray part set aside")
    assert "202409_77_77_0" not in os.listdir(directory)
    names = [p["name"] for p in rs3.direct(member).ux.command({"partsStatus": "events"})["parts"]]
    assert names == [d for d in part_dirs(member, "ux.events") if not d.startswith("unexpected_")]
    assert len(select(rs3, member, "ux")) == 5


def test_too_many_parts_delay_then_refuse_inserts(rs: ReplicaSet) -> None:
    db = rs.client().tm
    db.command({"createPartsTable": "events", **TABLE,
                "settings": {**TABLE["settings"], "partsToDelayInsert": 3, "partsToThrowInsert": 4}})
    for i in range(4):   # young small parts: no merge picks fewer than five
        db.command({"insertBlock": "events", "rows": _rows(3, 10, i * 100)})
    with pytest.raises(OperationFailure) as err:
        db.command({"insertBlock": "events", "rows": _rows(3, 10, 900)})
    assert err.value.code == 96 and "too many parts" in str(err.value)
    assert len(select(rs, rs.wait_primary(), "tm")) == 12


def test_a_quorum_part_no_live_member_holds_fails_and_its_retry_is_not_swallowed(rs3: ReplicaSet) -> None:
    db = "lq"
    rs3.client()[db].command({"createPartsTable": "events", **TABLE, "settings": {"quorumLostAfterMS": 2000}})
    primary = rs3.wait_primary()
    s1, s2 = [m for m in rs3.members if m is not primary]
    dead = "127.0.0.1:1"
    for member in (primary, s2):   # nobody can fetch S1's part
        rs3.fail_point(member, "peerRoutes", "alwaysOn", {"routes": {_http(s1): dead}})
    rows = _rows(12, 10)
    reply = rs3.direct(s1)[db].command({"insertBlock": "events", "rows": rows, "insertQuorum": 2,
                                        "quorumTimeoutMS": 500})
    assert reply["quorumStatus"] == "pending"
    block = reply["blocks"][0]["blockId"]
    s1.kill()   # the only holder is gone
    try:
        def status() -> str:
            answer = rs3.direct(primary)[db].command({"insertStatus": "events", "blockIds": [block]})
            return str(answer["blocks"][0]["status"])

        wait_for(lambda: status() == "failed", 30, "the quorum to fail")
        lost = [p for p in rs3.direct(primary)[db].command({"partsStatus": "events"})["parts"] if p.get("lost")]
        assert [p["name"] for p in lost] == [reply["blocks"][0]["part"]]
        # The dedup key went with the part: the client's retry is a new insert, not a duplicate.
        again = rs3.direct(primary)[db].command({"insertBlock": "events", "rows": rows, "insertQuorum": 2,
                                                 "quorumTimeoutMS": 20_000})
        assert again["inserted"] == 1 and again["quorumStatus"] == "reached"
    finally:
        for member in (primary, s2):
            rs3.fail_point(member, "peerRoutes", "off")
        s1.start()
    # S1 comes back with the failed part: the log no longer names it, so it is set aside, not served.
    for member in rs3.members:
        wait_for(lambda m=member: sorted(r["n"] for r in select(rs3, m, db, columns=["n"])) == [r["n"] for r in rows],
                 30, f"exactly one copy of the rows on {member.host}")


def test_the_queue_view_says_why_tasks_wait_while_the_fetch_pool_is_full(rs3: ReplicaSet) -> None:
    db = "pool"
    rs3.client()[db].command({"createPartsTable": "events", **TABLE,
                              "settings": {"fetchProgressTimeoutMS": 120_000}})
    primary = rs3.wait_primary()
    s1, s2 = [m for m in rs3.members if m is not primary]
    with FaultProxy() as proxy:
        # Every fetch S2 starts hangs: its links to both HTTP ports hold every byte.
        routes = {_http(m): proxy.add_link(s2.host, _http(m)) for m in (primary, s1)}
        proxy.set_links([(s2.host, _http(m)) for m in (primary, s1)], blackholed=True)
        rs3.fail_point(s2, "peerRoutes", "alwaysOn", {"routes": routes})
        for i in range(20):
            rs3.client()[db].command({"insertBlock": "events", "rows": _rows(3, 1 + i % 12, i * 10)})

        def saturated() -> list[dict[str, Any]] | None:
            queue = rs3.direct(s2)[db].command({"partsReplicationQueue": "events"})["queue"]
            running = [e for e in queue if e["type"] == "GET_PART" and e["is_currently_executing"]]
            waiting = [e for e in queue if "fetches are already executing" in e["postpone_reason"]]
            return waiting if len(running) == 16 and waiting else None

        waiting = wait_for(saturated, 30, "S2's fetch pool to be full and the rest to say so")
        # (A full pool is not walked, so num_postponed need not grow: the view gives the reason of now.)
        assert all(e["postpone_reason"] == "16 fetches are already executing, at most 16" for e in waiting)
        proxy.heal()
        wait_for(lambda: len(select(rs3, s2, db)) == 60, 60, "S2 to fetch everything once the links heal")
        rs3.fail_point(s2, "peerRoutes", "off")


def test_a_rolled_back_insert_is_never_read_and_its_block_number_is_taken_again(rs3: ReplicaSet) -> None:
    """A deposed primary's w:1 insert (and any merge of it) is undone by its rollback: the rebuilt queue
    reads none of its rows, and the next block of the new history - same block number, other rows,
    inserted through this very member - replaces the stale directory of that name."""
    rs = rs3
    rs.client().rb.command({"createPartsTable": "events", **TABLE})
    rs.client().rb.command({"insertBlock": "events", "rows": _rows(5)})
    old = rs.wait_primary()
    others = [m for m in rs.members if m is not old]
    for member in rs.members:
        wait_for(lambda m=member: len(part_dirs(m, "rb.events")) == 1, 20, f"the first part on {member.host}")
    for member in others:
        rs.fail_point(member, "stopReplProducer", "alwaysOn")
    lost = rs.direct(old).rb.command({"insertBlock": "events", "rows": _rows(5, start=100),
                                      "writeConcern": {"w": 1}})
    stale = lost["blocks"][0]["part"]
    assert sorted(r["n"] for r in select(rs, old, "rb")) == [*range(5), *range(100, 105)]

    rs.direct(old).admin.command("replSetStepDown", 60, force=True)
    new = wait_for(lambda: (p := rs.primary()) is not None and p is not old and p, 30, "a new primary")
    # (60 s: once, under a full parallel run, the old primary's rollback had not come within 30 s)
    wait_for(lambda: int(rs.direct(old).admin.command("replSetGetRBID")["rbid"]) == 1, 60, "the rollback")
    wait_for(lambda: rs.status(old)["myState"] == 2, 30, "the old primary to be SECONDARY again")
    wait_for(lambda: sorted(r["n"] for r in select(rs, old, "rb")) == list(range(5)), 20,
             "the rolled-back rows gone from reads")
    for member in others:
        rs.fail_point(member, "stopReplProducer", "off")

    # The new history's next block takes the same number; it is inserted through the old primary.
    again = rs.direct(old).rb.command({"insertBlock": "events", "rows": _rows(5, start=200)})
    assert again["blocks"][0]["part"] == stale
    want = [*range(5), *range(200, 205)]
    for member in rs.members:
        wait_for(lambda m=member: sorted(r["n"] for r in select(rs, m, "rb")) == want, 30,
                 f"the new history's rows on {member.host}")
    assert new is not old
    directory = os.path.join(old.dbpath, "parts", "rb.events")
    assert any(d.startswith(f"unexpected_{stale}") for d in os.listdir(directory))


def test_a_member_restarted_before_any_part_of_a_table_reached_it_catches_up(rs3: ReplicaSet) -> None:
    rs3.client().nd.command({"createPartsTable": "events", **TABLE})
    member = next(m for m in rs3.members if m is not rs3.wait_primary())
    definitions = rs3.direct(member).nd.get_collection("system.parts")
    wait_for(lambda: definitions.find_one({"_id": "events"}) is not None, 20, "the definition on the member")
    assert not os.path.exists(os.path.join(member.dbpath, "parts", "nd.events"))   # no part reached it yet
    member.stop()
    rs3.client().nd.command({"insertBlock": "events", "rows": _rows(5), "writeConcern": {"w": 2}})
    member.start()
    wait_for(lambda: len(select(rs3, member, "nd")) == 5, 30, "the restarted member to fetch the part")
