"""Sync chains: built by ping (a latency fail point) and as a four-member chain by
replSetSyncFrom; acknowledgements from the end of the chain travel upstream."""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import pytest
from pymongo import ReadPreference, WriteConcern

from tests.support.members import Member, wait_for
from tests.support.replica_set import ReplicaSet, make_replica_set

LATENCY_MS = 40


@pytest.fixture()
def rs_factory(tmp_path: pytest.TempPathFactory) -> Iterator[object]:
    made: list[ReplicaSet] = []

    def make(n: int) -> ReplicaSet:
        s = make_replica_set(str(tmp_path / f"rs{len(made)}"), n)  # type: ignore[operator]
        made.append(s)
        s.start()
        return s

    try:
        yield make
    finally:
        for s in made:
            s.stop()


def test_s2_syncs_from_s1_because_its_ping_is_lower(rs_factory: object) -> None:
    rs = rs_factory(3)  # type: ignore[operator]
    primary = rs.initiate()
    s1, s2 = [m for m in rs.members if m is not primary]
    # Everything S2 sends to the primary (heartbeats, fetches, reports) is 40 ms slower, and so is
    # everything S1 sends to S2 (members may have chained either way while the set formed).
    rs.fail_point(s2, "peerLatency", "alwaysOn", {"host": primary.host, "delayMs": LATENCY_MS})
    rs.fail_point(s1, "peerLatency", "alwaysOn", {"host": s2.host, "delayMs": LATENCY_MS})
    coll = rs.client().app.by_ping
    counter = itertools.count()

    def pings() -> dict[str, int]:
        return {x["name"]: x.get("pingMs") for x in rs.status(s2)["members"]}

    def chained() -> bool:
        # Keep writing: S2 only moves to S1 when S1 is ahead of what S2 has fetched.
        coll.with_options(write_concern=WriteConcern(w=1)).insert_one({"_id": next(counter)})
        return rs.sync_source(s2) == s1.host and rs.sync_source(s1) == primary.host

    def primary_farther() -> bool:
        # The ping is smoothed (a fifth of each new sample), so the added latency shows after a few
        # heartbeats: S1 must look closer than the primary by more than changeSyncSourceThresholdMillis
        # (5 ms). S2 may have chained to S1 while the set formed, before the pings told them apart.
        seen = pings()
        return seen[primary.host] > seen[s1.host] + 5

    wait_for(primary_farther, 30, "S2 to measure the primary as farther than S1")
    wait_for(chained, 30, "S2 to choose S1 as its sync source, and S1 the primary")
    assert primary_farther()
    assert rs.http_status(s2)["syncSourceHost"] == s1.host
    coll.with_options(write_concern=WriteConcern(w=3, wtimeout=5000)).insert_one({"_id": "w3"})
    tail = rs.direct(s2).app.by_ping.with_options(read_preference=ReadPreference.SECONDARY_PREFERRED)
    assert tail.find_one({"_id": "w3"}) == {"_id": "w3"}


def test_four_member_chain_acknowledges_w4(rs_factory: object) -> None:
    rs = rs_factory(4)  # type: ignore[operator]
    primary = rs.initiate()
    s1, s2, s3 = [m for m in rs.members if m is not primary]
    wanted = ((s1, primary), (s2, s1), (s3, s2))

    def chain_formed() -> bool:
        # replSetSyncFrom holds for one choice, as in mongod: a first fetch that fails (the source busy
        # starting its own fetch, say) drops it, so a member not on its wanted source is asked again.
        formed = True
        for member, source in wanted:
            if rs.sync_source(member) != source.host:
                rs.direct(member).admin.command("replSetSyncFrom", source.host)
                formed = False
        return formed

    for member, source in wanted:
        rs.direct(member).admin.command("replSetSyncFrom", source.host)
    wait_for(chain_formed, 30, "the chain P <- S1 <- S2 <- S3", interval_s=0.5)
    coll = rs.client().app.chain4
    result = coll.with_options(write_concern=WriteConcern(w=4, wtimeout=5000)).insert_many(
        [{"_id": i} for i in range(100)])
    assert len(result.inserted_ids) == 100
    for m in rs.members:
        direct = rs.direct(m).app.chain4.with_options(read_preference=ReadPreference.SECONDARY_PREFERRED)
        assert direct.count_documents({}) == 100
    # The end of the chain stops fetching: w:4 times out, w:3 still succeeds.
    rs.check_stalled_tail(s3, coll, all_members=4, wtimeout_ms=800)


def _s1_kept_on_the_primary(rs_factory: object) -> tuple[ReplicaSet, Member, Member, Member]:
    """A 3-member set whose S1 is slower to reach from S2's side than the primary (S1 stays on it)."""
    rs = rs_factory(3)  # type: ignore[operator]
    primary = rs.initiate()
    s1, s2 = [m for m in rs.members if m is not primary]
    rs.fail_point(s1, "peerLatency", "alwaysOn", {"host": s2.host, "delayMs": 30})
    return rs, primary, s1, s2


def test_an_idle_secondary_follows_the_ping_to_the_closer_member_and_back(rs_factory: object) -> None:
    """No writes: a ping that drifts is all that changes. 30 ms added to S2's traffic to the primary moves
    S2 to S1 within three heartbeat intervals of the pings telling them apart; the delay moved to S2's
    traffic to S1 moves it back."""
    rs, primary, s1, s2 = _s1_kept_on_the_primary(rs_factory)
    # On loopback S1 may look a little closer than the primary and S2 may have chosen it: S2's traffic to
    # S1 is slowed first, so that S2 starts on the primary too.
    rs.fail_point(s2, "peerLatency", "alwaysOn", {"host": s1.host, "delayMs": 30})
    wait_for(lambda: rs.sync_source(s1) == primary.host and rs.sync_source(s2) == primary.host, 30,
             "both secondaries on the primary", interval_s=0.2)

    def pings() -> dict[str, int]:
        return {x["name"]: x.get("pingMs") for x in rs.status(s2)["members"]}

    rs.fail_point(s2, "peerLatency", "alwaysOn", {"host": primary.host, "delayMs": 30})   # the delay moves
    wait_for(lambda: pings()[primary.host] > pings()[s1.host] + 5, 30, "S2 to measure the primary as farther")
    wait_for(lambda: rs.sync_source(s2) == s1.host, 3 * 0.25 + 2, "S2 to move to S1", interval_s=0.05)
    rs.fail_point(s2, "peerLatency", "alwaysOn", {"host": s1.host, "delayMs": 30})
    wait_for(lambda: pings()[s1.host] > pings()[primary.host] + 5, 30, "S2 to measure S1 as farther")
    wait_for(lambda: rs.sync_source(s2) == primary.host, 3 * 0.25 + 2, "S2 to move back to the primary",
             interval_s=0.05)


def test_a_secondary_behind_a_stalled_chained_source_leaves_it_and_majority_writes_go_on(rs_factory: object) -> None:
    """S2 chains to S1 on an idle set (the primary is slower to reach), then S1's fetching stops while its
    heartbeats go on: S1 stays level with S2 and says it syncs from the primary. A w:"majority" write needs
    S2: S2 must leave S1 for the member ahead of it instead of waiting behind S1 for good."""
    rs, primary, s1, s2 = _s1_kept_on_the_primary(rs_factory)
    rs.fail_point(s2, "peerLatency", "alwaysOn", {"host": primary.host, "delayMs": 30})
    wait_for(lambda: rs.sync_source(s2) == s1.host and rs.sync_source(s1) == primary.host, 30,
             "S2 chained to S1, S1 on the primary", interval_s=0.1)
    rs.fail_point(s1, "stopReplProducer", "alwaysOn")
    try:
        coll = rs.client().app.stall.with_options(write_concern=WriteConcern(w="majority", wtimeout=20_000))
        coll.insert_one({"_id": "past the stalled member"})
        assert rs.sync_source(s2) == primary.host
    finally:
        rs.fail_point(s1, "stopReplProducer", "off")
