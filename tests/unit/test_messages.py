"""The documents members exchange (base/messages.py).

Every builder's output goes through real BSON (`bson.encode` then `bson.decode`) before it is parsed,
as it would on the wire. Malformed input from a peer must come back as FailedToParse (code 9) for a
field of the wrong type, or BadValue (2) for a number that is not an exact integer or is out of its
field's range - never as another exception that would take down the caller's loop, and never as a
term no member could follow.
"""

from __future__ import annotations

import datetime
import math
from collections.abc import Callable, Mapping
from typing import Any

import bson
import pytest
from bson.int64 import Int64
from bson.timestamp import Timestamp
from hypothesis import given, settings
from hypothesis import strategies as st

from base.errors import MongoError
from base.member import MemberState
from base.messages import (
    HeartbeatReply,
    HeartbeatRequest,
    MemberPosition,
    ReplMetadata,
    heartbeat_reply,
    heartbeat_request,
    parse_heartbeat_reply,
    parse_heartbeat_request,
    parse_repl_metadata,
    parse_update_position,
    parse_vote_reply,
    parse_vote_request,
    repl_metadata,
    update_position_command,
    vote_reply,
    vote_request,
)
from base.numbers import MAX_TERM
from base.optime import NULL_OPTIME, OpTime
from base.votes import VoteRequest, VoteResponse

INT32 = st.integers(-(2**31), 2**31 - 1)
CONFIG_VERSIONS = st.integers(-2, 2**31 - 1)  # -2: a member without a config
TERMS = st.integers(-1, MAX_TERM)
U32 = st.integers(0, 2**32 - 1)
HOSTS = st.from_regex(r"[a-z][a-z0-9.-]{0,20}:[0-9]{1,5}", fullmatch=True)
NAMES = st.text(st.characters(min_codepoint=32, max_codepoint=0x2FFF, exclude_categories=["Cs"]),
                min_size=1, max_size=20)
OPTIMES = st.builds(OpTime, U32, U32, TERMS)
# BSON datetimes are naive UTC with millisecond precision.
DATES = st.datetimes(datetime.datetime(1970, 1, 1), datetime.datetime(2100, 1, 1)).map(
    lambda d: d.replace(microsecond=d.microsecond // 1000 * 1000))


def wire(doc: Mapping[str, Any]) -> dict[str, Any]:
    """The document as the receiving member sees it."""
    return bson.decode(bson.encode(doc))


def ot(secs: int, inc: int = 1, term: int = 1) -> OpTime:
    return OpTime(secs, inc, term)


def code_of(parse: Callable[[Any], object], doc: Any) -> int:
    with pytest.raises(MongoError) as excinfo:
        parse(doc)
    return excinfo.value.code


HB_REQ = HeartbeatRequest(set_name="rs0", config_version=3, config_term=2, sender_host="s1:27017",
                          sender_id=1, term=5)
HB_REPLY = HeartbeatReply(set_name="rs0", state=MemberState.PRIMARY, term=5, applied=ot(200, 3, 5),
                          durable=ot(199, 1, 5), config_version=3, config_term=2, sync_source="",
                          commit_point=ot(190, 1, 5), primary_id=0)
VOTE_REQ = VoteRequest(set_name="rs0", dry_run=True, term=5, candidate_id=2, config_version=3, config_term=2,
                       last_applied=ot(200, 3, 5))


# --- heartbeats -------------------------------------------------------------------------------------------


def test_heartbeat_request_uses_mongodb_field_names() -> None:
    doc = heartbeat_request(HB_REQ)
    assert doc["replSetHeartbeat"] == "rs0" and doc["$db"] == "admin"
    assert (doc["configVersion"], doc["configTerm"], doc["from"], doc["fromId"], doc["term"]) == (
        3, 2, "s1:27017", 1, 5)
    assert isinstance(doc["term"], Int64)


@settings(max_examples=150, deadline=None)
@given(st.builds(HeartbeatRequest, set_name=NAMES, config_version=CONFIG_VERSIONS, config_term=TERMS,
                 sender_host=HOSTS, sender_id=st.integers(0, 255), term=TERMS))
def test_heartbeat_request_round_trips(req: HeartbeatRequest) -> None:
    assert parse_heartbeat_request(wire(heartbeat_request(req))) == req


def test_heartbeat_request_defaults_for_missing_fields() -> None:
    assert parse_heartbeat_request({"replSetHeartbeat": "rs0"}) == HeartbeatRequest(
        set_name="rs0", config_version=-2, config_term=-1, sender_host="", sender_id=-1, term=-1)


def test_heartbeat_reply_uses_mongodb_field_names() -> None:
    doc = heartbeat_reply(HB_REPLY)
    assert (doc["ok"], doc["set"], doc["state"], doc["term"]) == (1.0, "rs0", 1, 5)
    assert doc["opTime"] == {"ts": Timestamp(200, 3), "t": 5}
    assert doc["durableOpTime"] == {"ts": Timestamp(199, 1), "t": 5}
    assert (doc["configVersion"], doc["v"], doc["configTerm"]) == (3, 3, 2)
    assert doc["$replData"]["lastOpCommitted"]["opTime"] == {"ts": Timestamp(190, 1), "t": 5}
    assert doc["$replData"]["term"] == 5 and doc["$replData"]["primaryIndex"] == 0
    assert doc["wallTime"] == datetime.datetime.fromtimestamp(200, datetime.UTC)
    assert "electionDate" not in doc and "config" not in doc


@settings(max_examples=150, deadline=None)
@given(st.builds(HeartbeatReply, set_name=NAMES, state=st.sampled_from(MemberState), term=TERMS,
                 applied=OPTIMES, durable=OPTIMES, config_version=CONFIG_VERSIONS, config_term=TERMS,
                 sync_source=st.one_of(st.just(""), HOSTS), commit_point=OPTIMES,
                 primary_id=st.integers(-1, 255), election_date=st.none() | DATES,
                 config=st.none() | st.fixed_dictionaries({"_id": NAMES, "version": INT32})))
def test_heartbeat_reply_round_trips(reply: HeartbeatReply) -> None:
    assert parse_heartbeat_reply(wire(heartbeat_reply(reply))) == reply


def test_heartbeat_reply_from_an_older_member_falls_back_to_v() -> None:
    assert parse_heartbeat_reply({"v": 4}).config_version == 4


def test_an_empty_heartbeat_reply_parses_to_defaults() -> None:
    got = parse_heartbeat_reply({})
    assert (got.state, got.term, got.applied, got.durable, got.commit_point) == (
        MemberState.UNKNOWN, -1, NULL_OPTIME, NULL_OPTIME, NULL_OPTIME)
    assert (got.config_version, got.config_term, got.primary_id, got.config, got.election_date) == (
        -2, -1, -1, None, None)


# --- votes ------------------------------------------------------------------------------------------------


def test_vote_request_uses_mongodb_field_names() -> None:
    doc = vote_request(VOTE_REQ)
    assert (doc["replSetRequestVotes"], doc["setName"], doc["dryRun"], doc["term"]) == (1, "rs0", True, 5)
    assert (doc["candidateIndex"], doc["configVersion"], doc["configTerm"]) == (2, 3, 2)
    assert doc["lastAppliedOpTime"] == {"ts": Timestamp(200, 3), "t": 5}


@settings(max_examples=150, deadline=None)
@given(st.builds(VoteRequest, set_name=NAMES, dry_run=st.booleans(), term=TERMS,
                 candidate_id=st.integers(0, 255), config_version=CONFIG_VERSIONS, config_term=TERMS,
                 last_applied=OPTIMES))
def test_vote_request_round_trips(req: VoteRequest) -> None:
    assert parse_vote_request(wire(vote_request(req))) == req


def test_vote_reply_uses_mongodb_field_names() -> None:
    doc = vote_reply(VoteResponse(term=6, vote_granted=False, reason="already voted"))
    assert (doc["term"], doc["voteGranted"], doc["reason"], doc["ok"]) == (6, False, "already voted", 1.0)


@settings(max_examples=100, deadline=None)
@given(st.builds(VoteResponse, term=TERMS, vote_granted=st.booleans(), reason=st.text(max_size=40)))
def test_vote_reply_round_trips(resp: VoteResponse) -> None:
    assert parse_vote_reply(wire(vote_reply(resp))) == resp


# --- positions --------------------------------------------------------------------------------------------


def test_update_position_uses_mongodb_field_names() -> None:
    doc = update_position_command([MemberPosition(2, ot(200), ot(199), 3)], term=5)
    assert doc["replSetUpdatePosition"] == 1 and doc["$replData"] == {"term": 5}
    [entry] = doc["optimes"]
    assert (entry["memberId"], entry["cfgver"]) == (2, 3)
    assert entry["appliedOpTime"] == {"ts": Timestamp(200, 1), "t": 1}
    assert entry["durableOpTime"] == {"ts": Timestamp(199, 1), "t": 1}
    assert isinstance(entry["appliedWallTime"], datetime.datetime)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.builds(MemberPosition, member_id=st.integers(0, 255), applied=OPTIMES, durable=OPTIMES,
                          config_version=CONFIG_VERSIONS), max_size=7), TERMS)
def test_update_position_round_trips(positions: list[MemberPosition], term: int) -> None:
    assert parse_update_position(wire(update_position_command(positions, term))) == (positions, term)


def test_update_position_without_repl_data_has_no_term() -> None:
    assert parse_update_position({"optimes": []}) == ([], -1)


# --- $replData --------------------------------------------------------------------------------------------


def test_repl_metadata_uses_mongodb_field_names() -> None:
    doc = repl_metadata(ReplMetadata(term=5, commit_point=ot(190), primary_id=0), 3, 2)
    assert (doc["term"], doc["configVersion"], doc["configTerm"], doc["primaryIndex"]) == (5, 3, 2, 0)
    assert doc["lastOpCommitted"]["opTime"] == {"ts": Timestamp(190, 1), "t": 1}


@settings(max_examples=100, deadline=None)
@given(st.builds(ReplMetadata, term=TERMS, commit_point=OPTIMES, primary_id=st.integers(-1, 255)),
       CONFIG_VERSIONS, TERMS)
def test_repl_metadata_round_trips(meta: ReplMetadata, version: int, config_term: int) -> None:
    reply = wire({"ok": 1.0, "cursor": {"nextBatch": []}, "$replData": repl_metadata(meta, version, config_term)})
    assert parse_repl_metadata(reply) == meta


def test_a_reply_without_repl_data_has_no_metadata() -> None:
    assert parse_repl_metadata({"ok": 1.0}) is None
    assert parse_repl_metadata({"ok": 1.0, "$replData": "junk"}) is None


# --- malformed input is FailedToParse ---------------------------------------------------------------------

GOOD_OPTIME = {"ts": Timestamp(1, 1), "t": 1}

MALFORMED: list[tuple[str, Callable[[Any], object], dict[str, Any]]] = [
    ("heartbeat without set name", parse_heartbeat_request, {"configVersion": 1}),
    ("heartbeat with numeric set name", parse_heartbeat_request, {"replSetHeartbeat": 1}),
    ("heartbeat with string term", parse_heartbeat_request, {"replSetHeartbeat": "rs0", "term": "5"}),
    ("heartbeat with boolean configVersion", parse_heartbeat_request,
     {"replSetHeartbeat": "rs0", "configVersion": True}),
    ("heartbeat with null fromId", parse_heartbeat_request, {"replSetHeartbeat": "rs0", "fromId": None}),
    ("reply with string term", parse_heartbeat_reply, {"term": "x"}),
    ("reply with state name", parse_heartbeat_reply, {"state": "PRIMARY"}),
    ("reply with numeric ts", parse_heartbeat_reply, {"opTime": {"ts": 5, "t": 1}}),
    ("reply with string optime term", parse_heartbeat_reply, {"opTime": {"ts": Timestamp(1, 1), "t": "x"}}),
    ("reply with list configVersion", parse_heartbeat_reply, {"configVersion": [1]}),
    ("vote request without set name", parse_vote_request, {"replSetRequestVotes": 1, "term": 3}),
    ("vote request with string term", parse_vote_request, {"setName": "rs0", "term": "3"}),
    ("vote request with list candidate", parse_vote_request, {"setName": "rs0", "candidateIndex": [1]}),
    ("vote request with bad optime", parse_vote_request, {"setName": "rs0", "lastAppliedOpTime": {"ts": "x"}}),
    ("vote reply with string term", parse_vote_reply, {"term": "6", "voteGranted": True}),
    ("update without optimes", parse_update_position, {"replSetUpdatePosition": 1}),
    ("update with optimes object", parse_update_position, {"optimes": {"0": GOOD_OPTIME}}),
    ("update with optimes string", parse_update_position, {"optimes": "none"}),
    ("update with non-object entry", parse_update_position, {"optimes": [5]}),
    ("update with string memberId", parse_update_position, {"optimes": [{"memberId": "1"}]}),
    ("update with string cfgver", parse_update_position, {"optimes": [{"memberId": 1, "cfgver": "2"}]}),
    ("update with bad applied optime", parse_update_position,
     {"optimes": [{"memberId": 1, "appliedOpTime": {"ts": None}}]}),
    ("update with string term", parse_update_position, {"optimes": [], "$replData": {"term": "5"}}),
    ("metadata with string term", parse_repl_metadata, {"$replData": {"term": "5"}}),
    ("metadata with string primaryIndex", parse_repl_metadata, {"$replData": {"primaryIndex": "0"}}),
]


@pytest.mark.parametrize(("parse", "doc"), [(p, d) for _, p, d in MALFORMED], ids=[n for n, _, _ in MALFORMED])
def test_malformed_input_is_failed_to_parse(parse: Callable[[Any], object], doc: dict[str, Any]) -> None:
    assert code_of(parse, wire(doc)) == 9


# A number that is not an exact integer, or is out of its field's range, is BadValue, as mongod's
# bsonExtractIntegerField and IDL validators answer.
NON_FINITE: list[tuple[str, Callable[[Any], object], dict[str, Any]]] = [
    ("reply with out-of-range state", parse_heartbeat_reply, {"state": 42}),
    ("reply with NaN state", parse_heartbeat_reply, {"state": math.nan}),
    ("reply with NaN optime term", parse_heartbeat_reply, {"durableOpTime": {"ts": Timestamp(1, 1), "t": math.nan}}),
    ("heartbeat with NaN term", parse_heartbeat_request, {"replSetHeartbeat": "rs0", "term": math.nan}),
    ("heartbeat with infinite term", parse_heartbeat_request, {"replSetHeartbeat": "rs0", "term": math.inf}),
    ("reply with infinite state", parse_heartbeat_reply, {"state": math.inf}),
    ("reply with infinite optime term", parse_heartbeat_reply, {"opTime": {"ts": Timestamp(1, 1), "t": math.inf}}),
    ("vote request with NaN term", parse_vote_request, {"setName": "rs0", "term": math.nan}),
    ("vote reply with infinite term", parse_vote_reply, {"term": -math.inf}),
    ("update with NaN memberId", parse_update_position, {"optimes": [{"memberId": math.nan}]}),
    ("metadata with NaN term", parse_repl_metadata, {"$replData": {"term": math.nan}}),
]


@pytest.mark.parametrize(("parse", "doc"), [(p, d) for _, p, d in NON_FINITE], ids=[n for n, _, _ in NON_FINITE])
def test_non_finite_numbers_are_bad_value(parse: Callable[[Any], object], doc: dict[str, Any]) -> None:
    assert code_of(parse, wire(doc)) == 2


# A peer may send anything BSON can carry; finite numbers only here (non-finite ones are tested above).
SCALARS = (st.none() | st.booleans() | INT32 | st.integers(-(2**63), 2**63 - 1).map(Int64)
           | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=5)
           | st.builds(Timestamp, U32, U32) | DATES)
FIELDS = st.sampled_from(["replSetHeartbeat", "setName", "set", "state", "term", "t", "ts", "opTime",
                          "durableOpTime", "lastAppliedOpTime", "configVersion", "configTerm", "v", "from",
                          "fromId", "candidateIndex", "dryRun", "voteGranted", "reason", "optimes", "memberId",
                          "appliedOpTime", "cfgver", "$replData", "lastOpCommitted", "primaryIndex",
                          "primaryId", "electionDate", "config", "syncingTo"])
DOCS = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(FIELDS, inner, max_size=5),
                    max_leaves=12)
PARSERS = [parse_heartbeat_request, parse_heartbeat_reply, parse_vote_request, parse_vote_reply,
           parse_update_position, parse_repl_metadata]


@settings(max_examples=400, deadline=None)
@given(st.sampled_from(PARSERS), st.dictionaries(FIELDS, DOCS, max_size=8))
def test_parsers_either_parse_or_fail_to_parse(parse: Callable[[Any], object], doc: dict[str, Any]) -> None:
    try:
        parse(wire(doc))
    except MongoError as exc:
        assert exc.code in (2, 9)


# --- every term, config version and member id is range-checked where it enters ---------------------------

# What a hostile (or broken) peer may put where a term goes: the int64 limit (term + 1 could never be
# stored), one past MAX_TERM, doubles that are no integer at all, a bool, a negative term.
HOSTILE_TERMS: list[tuple[str, Any, int]] = [
    ("int64 max", Int64(2**63 - 1), 2),
    ("max term + 1", Int64(MAX_TERM + 1), 2),
    ("1e300", 1e300, 2),
    ("NaN", math.nan, 2),
    ("infinity", math.inf, 2),
    ("minus infinity", -math.inf, 2),
    ("a float", 2.5, 2),
    ("below -1", Int64(-2), 2),
    ("bool", True, 9),
]


def _term_carriers(term: Any) -> list[tuple[str, Callable[[Any], object], dict[str, Any]]]:
    """Every place a term crosses from another member into this one."""
    optime = {"ts": Timestamp(1, 1), "t": term}
    return [
        ("heartbeat term", parse_heartbeat_request, {"replSetHeartbeat": "rs0", "term": term}),
        ("heartbeat configTerm", parse_heartbeat_request, {"replSetHeartbeat": "rs0", "configTerm": term}),
        ("heartbeat reply term", parse_heartbeat_reply, {"ok": 1.0, "term": term}),
        ("heartbeat reply $replData", parse_repl_metadata, {"ok": 1.0, "$replData": {"term": term}}),
        ("heartbeat reply opTime", parse_heartbeat_reply, {"ok": 1.0, "opTime": optime}),
        ("vote request term", parse_vote_request, {"setName": "rs0", "term": term, "candidateIndex": 1}),
        ("vote request lastAppliedOpTime", parse_vote_request,
         {"setName": "rs0", "term": 1, "candidateIndex": 1, "lastAppliedOpTime": optime}),
        ("vote reply term", parse_vote_reply, {"term": term, "voteGranted": True}),
        ("updatePosition $replData", parse_update_position, {"optimes": [], "$replData": {"term": term}}),
        ("updatePosition optime", parse_update_position,
         {"optimes": [{"memberId": 1, "appliedOpTime": optime}]}),
        ("getMore reply $replData", parse_repl_metadata, {"ok": 1.0, "cursor": {}, "$replData": {"term": term}}),
    ]


HOSTILE_CASES = [(f"{where} {name}", parse, doc, code)
                 for name, term, code in HOSTILE_TERMS for where, parse, doc in _term_carriers(term)]


@pytest.mark.parametrize(("parse", "doc", "code"), [(p, d, c) for _, p, d, c in HOSTILE_CASES],
                         ids=[n for n, _, _, _ in HOSTILE_CASES])
def test_a_term_no_member_could_follow_is_refused_where_it_enters(
        parse: Callable[[Any], object], doc: dict[str, Any], code: int) -> None:
    assert code_of(parse, wire(doc)) == code


def test_the_largest_term_is_accepted_and_an_exact_double_is_an_integer() -> None:
    assert parse_heartbeat_request(wire({"replSetHeartbeat": "rs0", "term": Int64(MAX_TERM)})).term == MAX_TERM
    # As mongod's bsonExtractIntegerField: a double with an exact integral value is that integer.
    assert parse_vote_reply(wire({"term": 7.0})).term == 7
    assert isinstance(parse_vote_reply(wire({"term": 7.0})).term, int)


def test_the_refusals_say_what_was_wrong() -> None:
    with pytest.raises(MongoError) as too_big:
        parse_heartbeat_request({"replSetHeartbeat": "rs0", "term": Int64(2**63 - 1)})
    assert too_big.value.errmsg == (f"BSON field 'term' value must be <= {MAX_TERM}, "
                                    f"actual value '{2**63 - 1}'")
    with pytest.raises(MongoError) as huge:
        parse_heartbeat_request({"replSetHeartbeat": "rs0", "term": 1e300})
    assert huge.value.errmsg == ('Expected field "term" to have a value exactly representable as a 64-bit '
                                 'integer, but found term: 1e+300')


OTHER_NUMBERS: list[tuple[str, Callable[[Any], object], dict[str, Any]]] = [
    ("config version at the int64 limit", parse_heartbeat_request,
     {"replSetHeartbeat": "rs0", "configVersion": Int64(2**63 - 1)}),
    ("config version past int32", parse_vote_request,
     {"setName": "rs0", "term": 1, "candidateIndex": 1, "configVersion": Int64(2**31)}),
    ("config version below -2", parse_heartbeat_reply, {"configVersion": -3}),
    ("fractional config version", parse_heartbeat_reply, {"v": 2.5}),
    ("member id past int32", parse_heartbeat_request, {"replSetHeartbeat": "rs0", "fromId": Int64(2**40)}),
    ("negative candidate index", parse_vote_request, {"setName": "rs0", "term": 1, "candidateIndex": -5}),
    ("NaN candidate index", parse_vote_request, {"setName": "rs0", "term": 1, "candidateIndex": math.nan}),
    ("huge memberId", parse_update_position, {"optimes": [{"memberId": Int64(2**62)}]}),
    ("huge primaryIndex", parse_repl_metadata, {"$replData": {"primaryIndex": 1e300}}),
    ("huge state", parse_heartbeat_reply, {"state": Int64(2**63 - 1)}),
]


@pytest.mark.parametrize(("parse", "doc"), [(p, d) for _, p, d in OTHER_NUMBERS], ids=[n for n, _, _ in OTHER_NUMBERS])
def test_config_versions_and_member_ids_are_range_checked(parse: Callable[[Any], object], doc: dict[str, Any]) -> None:
    assert code_of(parse, wire(doc)) in (2, 9)


def test_an_optime_is_parsed_strictly_wherever_it_comes_from() -> None:
    assert OpTime.from_document({"ts": Timestamp(5, 1), "t": Int64(3)}) == OpTime(5, 1, 3)
    assert OpTime.from_document({"ts": Timestamp(5, 1)}) == OpTime(5, 1, -1)
    for bad_term, code in ((Int64(2**63 - 1), 2), (math.nan, 2), (1e300, 2), (1.5, 2), ("3", 9), (None, 9)):
        with pytest.raises(MongoError) as excinfo:
            OpTime.from_document({"ts": Timestamp(5, 1), "t": bad_term})
        assert excinfo.value.code == code, bad_term
    with pytest.raises(MongoError) as no_ts:
        OpTime.from_document({"ts": 5, "t": 1})
    assert no_ts.value.code == 9
