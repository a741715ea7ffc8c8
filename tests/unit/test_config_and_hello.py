"""Config parsing, member states, write-concern rules and the hello reply."""

from __future__ import annotations

import datetime
import math
from typing import Any

import pytest
from bson.int64 import Int64
from bson.objectid import ObjectId

from base.config import MAX_TIMER_MS, parse_config
from base.errors import MongoError
from base.hello import HelloView, build_hello, election_id
from base.member import IllegalTransition, MemberState, check_transition
from base.numbers import MAX_TERM
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


def _with(settings: dict[str, Any] | None = None, **top: Any) -> dict[str, Any]:
    raw: dict[str, Any] = {**THREE, **top}
    if settings is not None:
        raw["settings"] = settings
    return raw


def _member(**fields: Any) -> dict[str, Any]:
    return {"_id": "rs0", "members": [{"_id": 0, "host": "a:1", **fields}]}


BAD_NUMBERS: list[tuple[str, dict[str, Any]]] = [
    # repl_set_config.idl: version `gt: 0, lt: 2147483648`; term `gte: -1` (our upper bound: MAX_TERM).
    ("version int64 max", _with(version=Int64(2**63 - 1))),
    ("version 2**31", _with(version=Int64(2**31))),
    ("version 0", _with(version=0)),
    ("version NaN", _with(version=math.nan)),
    ("version 1.5", _with(version=1.5)),
    ("version bool", _with(version=True)),
    ("term int64 max", _with(term=Int64(2**63 - 1))),
    ("term -2", _with(term=-2)),
    # settings: mongod's `gt: 0` / `gte: -1`, and at most one day here.
    ("heartbeatIntervalMillis 0", _with({"heartbeatIntervalMillis": 0})),
    ("heartbeatIntervalMillis -1", _with({"heartbeatIntervalMillis": -1})),
    ("heartbeatIntervalMillis 2**62", _with({"heartbeatIntervalMillis": Int64(2**62)})),
    ("heartbeatIntervalMillis NaN", _with({"heartbeatIntervalMillis": math.nan})),
    ("heartbeatIntervalMillis inf", _with({"heartbeatIntervalMillis": math.inf})),
    ("heartbeatIntervalMillis 2.5", _with({"heartbeatIntervalMillis": 2.5})),
    ("heartbeatIntervalMillis string", _with({"heartbeatIntervalMillis": "2000"})),
    ("electionTimeoutMillis 0", _with({"electionTimeoutMillis": 0})),
    ("electionTimeoutMillis 2**62", _with({"electionTimeoutMillis": Int64(2**62)})),
    ("electionTimeoutMillis -inf", _with({"electionTimeoutMillis": -math.inf})),
    ("heartbeatTimeoutSecs 0", _with({"heartbeatTimeoutSecs": 0})),
    ("heartbeatTimeoutSecs a day and a second", _with({"heartbeatTimeoutSecs": MAX_TIMER_MS // 1000 + 1})),
    ("catchUpTimeoutMillis -2", _with({"catchUpTimeoutMillis": -2})),
    ("catchUpTimeoutMillis NaN", _with({"catchUpTimeoutMillis": math.nan})),
    ("catchUpTakeoverDelayMillis -2", _with({"catchUpTakeoverDelayMillis": -2})),
    ("catchUpTakeoverDelayMillis 1e300", _with({"catchUpTakeoverDelayMillis": 1e300})),
    # member_config.idl: votes 0..1, priority 0..1000, secondaryDelaySecs 0..31622400; MemberId >= 0.
    ("votes 0.5", _member(votes=0.5, priority=0)),
    ("votes NaN", _member(votes=math.nan)),
    ("priority NaN", _member(priority=math.nan)),
    ("priority inf", _member(priority=math.inf)),
    ("priority 1001", _member(priority=1001)),
    ("priority bool", _member(priority=True)),
    ("secondaryDelaySecs past 366 days", _member(secondaryDelaySecs=31_622_401, priority=0)),
    ("member _id -1", _member(_id=-1)),
    ("member _id 2**31", {"_id": "rs0", "members": [{"_id": Int64(2**31), "host": "a:1"}]}),
    ("member _id 1.5", {"_id": "rs0", "members": [{"_id": 1.5, "host": "a:1"}]}),
]


@pytest.mark.parametrize("raw", [r for _, r in BAD_NUMBERS], ids=[n for n, _ in BAD_NUMBERS])
def test_config_numbers_are_checked_like_mongods_idl(raw: dict[str, Any]) -> None:
    # mongod answers any config it cannot parse with InvalidReplicaSetConfig and the parser's reason.
    with pytest.raises(MongoError) as excinfo:
        parse_config(raw)
    assert excinfo.value.code == 93


def test_config_numbers_at_their_bounds_are_accepted() -> None:
    config = parse_config(_with({"heartbeatIntervalMillis": 1, "electionTimeoutMillis": MAX_TIMER_MS,
                                 "heartbeatTimeoutSecs": 1, "catchUpTimeoutMillis": -1,
                                 "catchUpTakeoverDelayMillis": -1}, version=Int64(2**31 - 1), term=MAX_TERM))
    assert (config.version, config.term) == (2**31 - 1, MAX_TERM)
    s = config.settings
    assert (s.heartbeat_interval_ms, s.election_timeout_ms, s.heartbeat_timeout_secs) == (1, MAX_TIMER_MS, 1)
    assert (s.catch_up_timeout_ms, s.catch_up_takeover_delay_ms) == (-1, -1)
    # An exact double is its integer, as mongod's smallExactInt64 takes it (a mongosh number is a double).
    assert parse_config(_with({"electionTimeoutMillis": 5000.0})).settings.election_timeout_ms == 5000
    assert isinstance(parse_config(_with({"electionTimeoutMillis": 5000.0})).settings.election_timeout_ms, int)


def test_a_bad_setting_says_which_and_why() -> None:
    with pytest.raises(MongoError) as excinfo:
        parse_config(_with({"heartbeatIntervalMillis": 0}))
    assert excinfo.value.errmsg == "BSON field 'settings.heartbeatIntervalMillis' value must be >= 1, actual value '0'"
    with pytest.raises(MongoError) as nan:
        parse_config(_with({"electionTimeoutMillis": math.nan}))
    assert "exactly representable as a 64-bit integer" in nan.value.errmsg


@pytest.mark.parametrize(("raw", "code"), [
    ({"w": math.nan}, 9), ({"w": math.inf}, 9), ({"w": -math.inf}, 9), ({"w": 51}, 9), ({"w": 1e300}, 9),
    ({"w": 1, "wtimeout": math.inf}, 9), ({"w": 1, "wtimeout": 2**31}, 9), ({"w": 1, "wtimeout": 1e300}, 9),
])
def test_write_concern_numbers_are_refused_as_mongod_refuses_them(raw: dict[str, Any], code: int) -> None:
    with pytest.raises(MongoError) as excinfo:
        parse_write_concern(raw)
    assert excinfo.value.code == code


def test_write_concern_numbers_mongod_accepts() -> None:
    assert parse_write_concern({"w": 2.7}).w == 2  # truncated, as safeNumberLong does
    assert parse_write_concern({"w": 1, "wtimeout": math.nan}).wtimeout_ms == 0  # NaN is 0: no limit
    assert parse_write_concern({"w": 1, "wtimeout": 2**31 - 1}).wtimeout_ms == 2**31 - 1


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
