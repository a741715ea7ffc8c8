"""Config parsing, member states, write-concern rules and the hello reply."""

from __future__ import annotations

import datetime

import pytest
from bson.objectid import ObjectId

from base.config import parse_config
from base.errors import MongoError
from base.hello import HelloView, build_hello, election_id
from base.member import IllegalTransition, MemberState, check_transition
from base.optime import OpTime, next_optime
from replset.quorum import write_concern_satisfied
from replset.write_concern import WriteConcern, check_satisfiable, parse_write_concern

THREE = {"_id": "rs0", "members": [{"_id": i, "host": f"127.0.0.1:{27017 + i}"} for i in range(3)]}


def test_config_defaults_and_majorities() -> None:
    config = parse_config(THREE)
    assert config.version == 1 and config.settings.heartbeat_interval_ms == 2000
    assert config.majority_vote_count == 2 and config.write_majority_count == 2
    doc = config.to_document()
    assert doc["members"][0]["host"] == "127.0.0.1:27017" and doc["protocolVersion"] == 1


@pytest.mark.parametrize(
    "raw",
    [
        {"members": [{"_id": 0, "host": "a:1"}]},
        {"_id": "rs0", "members": []},
        {"_id": "rs0", "members": [{"_id": 0, "host": "a:1"}, {"_id": 0, "host": "b:1"}]},
        {"_id": "rs0", "members": [{"_id": 0, "host": "nohostport"}]},
        {"_id": "rs0", "members": [{"_id": 0, "host": "a:1", "votes": 2}]},
        {"_id": "rs0", "members": [{"_id": 0, "host": "a:1", "hidden": True}]},
        {"_id": "rs0", "members": [{"_id": i, "host": f"a:{i}"} for i in range(8)]},
    ],
)
def test_invalid_configs_are_rejected_with_93(raw: dict[str, object]) -> None:
    with pytest.raises(MongoError) as excinfo:
        parse_config(raw)
    assert excinfo.value.code == 93


def test_state_transitions_are_checked() -> None:
    check_transition(MemberState.SECONDARY, MemberState.PRIMARY)
    with pytest.raises(IllegalTransition):
        check_transition(MemberState.STARTUP2, MemberState.PRIMARY)
    assert MemberState.DOWN.state_str == "(not reachable/healthy)"


def test_write_concern_parsing_and_satisfiability() -> None:
    assert parse_write_concern(None).w == "majority"
    wc = parse_write_concern({"w": 2, "wtimeout": 500})
    assert (wc.w, wc.wtimeout_ms, wc.provenance) == (2, 500, "clientSupplied")
    config = parse_config(THREE)
    assert check_satisfiable(parse_write_concern({"w": 4}), config).code == 100  # type: ignore[union-attr]
    assert check_satisfiable(parse_write_concern({"w": "dc"}), config).code == 79  # type: ignore[union-attr]
    assert check_satisfiable(parse_write_concern({"w": 3}), config) is None
    with pytest.raises(MongoError):
        parse_write_concern({"w": -1})


def test_w_n_counts_members_at_or_past_the_write() -> None:
    t = OpTime(10, 1, 1)
    behind, ahead = OpTime(9, 5, 1), OpTime(10, 2, 1)
    config = parse_config(THREE)
    applied = {0: ahead, 1: t, 2: behind}

    def ok(wc: WriteConcern, durable: dict[int, OpTime], commit_point: OpTime) -> bool:
        return write_concern_satisfied(wc, t, config=config, applied=applied, durable=durable,
                                       commit_point=commit_point)

    assert ok(WriteConcern(w=2), {}, behind)
    assert not ok(WriteConcern(w=3), {}, behind)
    assert not ok(WriteConcern(w=1, j=True), {0: behind}, behind)
    assert ok(WriteConcern(w="majority"), {}, ahead)


def test_optimes_strictly_increase_even_if_the_clock_goes_back() -> None:
    a = next_optime(OpTime(100, 7, 1), 90, 1)
    assert a == OpTime(100, 8, 1)
    assert next_optime(a, 101, 2) == OpTime(101, 1, 2)


def _view(**kw: object) -> HelloView:
    now = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)
    base: dict[str, object] = dict(
        me="127.0.0.1:27017", set_name="rs0", config=parse_config(THREE), state=MemberState.PRIMARY, term=3,
        primary="127.0.0.1:27017", last_write=OpTime(5, 1, 3), last_write_date=now,
        majority_write=OpTime(5, 1, 3), majority_write_date=now, topology_process_id=ObjectId(),
        topology_counter=4, connection_id=9, now=now,
    )
    base.update(kw)
    return HelloView(**base)  # type: ignore[arg-type]


def test_hello_of_a_primary_has_what_drivers_need() -> None:
    doc = build_hello(_view(), legacy=False, hello_ok=True, with_topology_version=True)
    assert doc["isWritablePrimary"] is True and doc["secondary"] is False
    assert doc["setName"] == "rs0" and doc["setVersion"] == 1 and doc["me"] == "127.0.0.1:27017"
    assert doc["hosts"] == ["127.0.0.1:27017", "127.0.0.1:27018", "127.0.0.1:27019"]
    assert doc["electionId"] == ObjectId("7fffffff0000000000000003")
    assert doc["logicalSessionTimeoutMinutes"] == 30 and doc["maxWireVersion"] == 21
    assert doc["helloOk"] is True and doc["topologyVersion"]["counter"] == 4
    legacy = build_hello(_view(), legacy=True, hello_ok=False, with_topology_version=False)
    assert legacy["ismaster"] is True and "helloOk" not in legacy and "topologyVersion" not in legacy


def test_hello_of_an_uninitiated_member() -> None:
    doc = build_hello(_view(config=None, state=MemberState.STARTUP), legacy=True, hello_ok=False,
                      with_topology_version=False)
    assert doc["ismaster"] is False and doc["isreplicaset"] is True and "setName" not in doc


def test_election_id_grows_with_the_term() -> None:
    assert election_id(1).binary < election_id(2).binary
