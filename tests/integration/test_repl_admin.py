"""Operator commands on a real set: replSetStepDown (with election handoff),
replSetFreeze, replSetStepUp, replSetReconfig, priority takeover, and the
errors MongoDB gives for each misuse."""

from __future__ import annotations

from typing import Any

import pytest
from pymongo import ReadPreference, WriteConcern
from pymongo.errors import NotPrimaryError, OperationFailure

from tests.support.members import Member, wait_for
from tests.support.replica_set import ReplicaSet


def _code(fn: Any) -> int:
    with pytest.raises((OperationFailure, NotPrimaryError)) as err:
        fn()
    return int(err.value.details["code"])  # type: ignore[union-attr,index]


def test_step_down_hands_off_to_a_caught_up_secondary(rs: ReplicaSet) -> None:
    old = rs.wait_primary()
    rs.client().app.sd.with_options(write_concern=WriteConcern(w=3)).insert_one({"_id": 1})
    rs.direct(old).admin.command("replSetStepDown", 30)
    new = wait_for(lambda: (p := rs.primary()) is not None and p is not old and p, 10, "a new primary")
    # Handoff: the caught-up secondary stands at once instead of waiting for its election timeout (the
    # election's reason below says so; a time bound would judge the machine's load, not the handoff).
    assert rs.status(old)["myState"] == 2
    # The stepped-down member may not stand again during the stepdown period.
    assert _code(lambda: rs.direct(old).admin.command("replSetStepUp")) == 125
    assert rs.status(new)["electionCandidateMetrics"]["lastElectionReason"] == "stepUpRequestSkipDryRun"
    # Writes go on through the new primary, and the old one has them.
    rs.client().app.sd.with_options(write_concern=WriteConcern(w=3, wtimeout=5000)).insert_one({"_id": 2})
    assert rs.direct(old).app.sd.with_options(
        read_preference=ReadPreference.SECONDARY_PREFERRED).count_documents({}) == 2


def test_misused_commands_get_mongodb_codes(rs: ReplicaSet) -> None:
    primary = rs.wait_primary()
    secondary = next(m for m in rs.members if m is not primary)
    assert _code(lambda: rs.direct(secondary).admin.command("replSetStepDown", 10)) == 10107
    assert _code(lambda: rs.direct(primary).admin.command("replSetFreeze", 10)) == 95
    assert _code(lambda: rs.direct(primary).admin.command("replSetSyncFrom", secondary.host)) == 95
    assert _code(lambda: rs.direct(secondary).admin.command("replSetSyncFrom", "127.0.0.1:1")) == 74
    assert _code(lambda: rs.direct(secondary).admin.command("replSetReconfig", {})) == 10107
    config = rs.direct(primary).admin.command("replSetGetConfig")["config"]
    assert _code(lambda: rs.direct(primary).admin.command("replSetReconfig", config)) == 103  # same version
    assert _code(lambda: rs.direct(primary).admin.command("configureFailPoint", "nope", mode="alwaysOn")) == 2
    assert _code(lambda: rs.direct(primary).admin.command("replSetInitiate")) == 23
    assert _code(lambda: rs.direct(primary).admin.command("replSetStepDown", 5,
                                                           secondaryCatchUpPeriodSecs=10)) == 2


def test_freeze_then_step_up(rs: ReplicaSet) -> None:
    primary = rs.wait_primary()
    secondary = next(m for m in rs.members if m is not primary)
    reply = rs.direct(secondary).admin.command("replSetFreeze", 0)
    assert reply["ok"] == 1.0 and reply.get("info") == "unfreezing"
    rs.direct(secondary).admin.command("replSetStepUp")
    assert rs.primary() is secondary
    wait_for(lambda: rs.status(primary)["myState"] == 2, 10, "the old primary to step down")


def test_reconfig_priority_makes_a_member_take_over(rs: ReplicaSet) -> None:
    primary = rs.wait_primary()
    favourite: Member = next(m for m in rs.members if m is not primary)
    config = rs.direct(primary).admin.command("replSetGetConfig")["config"]
    for m in config["members"]:
        m["priority"] = 5 if m["host"] == favourite.host else 1
    config["version"] += 1
    rs.direct(primary).admin.command("replSetReconfig", config)
    # Every member installs the new version through heartbeats...
    for m in rs.members:
        wait_for(lambda m=m: rs.direct(m).admin.command("replSetGetConfig")["config"]["version"]
                 == config["version"], 10, f"{m.host} to install the new config")
    # ...and the higher-priority member takes over after its takeover delay (one election timeout).
    wait_for(lambda: rs.primary() is favourite, 15, "priority takeover")
    metrics = rs.status(favourite)["electionCandidateMetrics"]
    assert metrics["lastElectionReason"] == "priorityTakeover"


def test_forced_reconfig_on_a_secondary_reaches_every_member(rs: ReplicaSet) -> None:
    primary = rs.wait_primary()
    secondary = next(m for m in rs.members if m is not primary)
    config = rs.direct(secondary).admin.command("replSetGetConfig")["config"]
    config["version"] += 1
    config["settings"]["heartbeatIntervalMillis"] = 300
    # Not on a primary: refused unless forced; a forced config has no term and wins by version.
    assert _code(lambda: rs.direct(secondary).admin.command("replSetReconfig", config)) == 10107
    rs.direct(secondary).admin.command("replSetReconfig", config, force=True)
    for m in rs.members:
        wait_for(lambda m=m: rs.direct(m).admin.command("replSetGetConfig")["config"]["settings"]
                 ["heartbeatIntervalMillis"] == 300, 10, f"{m.host} to install the forced config")
    assert rs.direct(primary).admin.command("replSetGetConfig")["config"]["term"] == -1


def test_arbiter_votes_but_holds_no_data(tmp_path: Any) -> None:
    from tests.support.replica_set import make_replica_set

    psa = make_replica_set(str(tmp_path), 3)
    try:
        psa.start()
        primary = psa.initiate(m2={"arbiterOnly": True, "priority": 0})
        arbiter = psa.members[2]
        assert primary is psa.members[0]
        assert psa.status(arbiter)["myState"] == 7
        coll = psa.client().app.psa
        coll.insert_one({"_id": 1})  # default w:"majority": both data-bearing members
        assert _code(lambda: coll.with_options(write_concern=WriteConcern(w=3)).insert_one({"_id": 2})) == 100
        hello = psa.direct(primary).admin.command("hello")
        assert hello["arbiters"] == [arbiter.host]
        # An arbiter holds no data and serves no reads.
        assert _code(lambda: psa.direct(arbiter).app.psa.with_options(
            read_preference=ReadPreference.SECONDARY_PREFERRED).find_one()) == 13436
        me = next(x for x in psa.status(arbiter)["members"] if x.get("self"))
        assert me["optime"]["ts"].time == 0  # it never fetched or applied an entry
        # With the secondary gone, the arbiter's vote still lets the primary keep a majority.
        psa.members[1].kill()
        coll.with_options(write_concern=WriteConcern(w=1)).insert_one({"_id": 3})
        assert psa.primary() is primary
    finally:
        psa.stop()
