"""Numbers from outside, range-checked where they enter, on a live three-member set.

Each hostile message goes straight to a member with `db.command`: a term at the int64 limit or of
1e300 in a heartbeat, a vote request or a position report; a config version at the int64 limit; a
forced reconfig that leaves the member out; timers of 0 or 2**62; NaN and infinities where seconds
or a write concern go. Each gets mongod's error code, and afterwards the set still elects, takes
`w: "majority"` writes within one election timeout, and no member has logged a traceback.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from bson.int64 import Int64
from bson.son import SON
from pymongo import WriteConcern
from pymongo.database import Database
from pymongo.errors import OperationFailure

from base.numbers import MAX_TERM
from tests.support.members import Member, wait_for
from tests.support.replica_set import FAST_SETTINGS, ReplicaSet

INT64_MAX = Int64(2**63 - 1)
ELECTION_TIMEOUT_MS = FAST_SETTINGS["electionTimeoutMillis"]
HOSTILE_TERMS: list[Any] = [INT64_MAX, Int64(MAX_TERM + 1), 1e300, math.nan, math.inf]


def _code(db: Database[dict[str, Any]], command: SON[str, Any]) -> int:
    """The error code `db.command(command)` fails with (it must fail)."""
    with pytest.raises(OperationFailure) as err:
        db.command(command)
    return int(err.value.code or 0)


def _terms(rs: ReplicaSet) -> list[int]:
    return [int(rs.status(m)["term"]) for m in rs.members]


def _config(rs: ReplicaSet, member: Member) -> dict[str, Any]:
    return dict(rs.direct(member).admin.command("replSetGetConfig")["config"])


def _majority_write(rs: ReplicaSet, doc_id: str) -> None:
    """A w:"majority" write acknowledged within one election timeout."""
    coll = rs.client().app.hostile.with_options(
        write_concern=WriteConcern(w="majority", wtimeout=ELECTION_TIMEOUT_MS))
    coll.insert_one({"_id": doc_id})


def _no_tracebacks(rs: ReplicaSet) -> None:
    for m in rs.members:
        lines = [line for line in m.read_log().splitlines() if "Traceback" in line]
        assert not lines, f"{m.host} logged a traceback:\n{m.read_log()[-4000:]}"


@pytest.fixture(scope="module")
def hostile_rs(rs: ReplicaSet) -> Iterator[ReplicaSet]:
    rs.wait_primary()
    yield rs
    _no_tracebacks(rs)


def test_terms_no_member_could_follow_are_refused_by_every_member(hostile_rs: ReplicaSet) -> None:
    rs = hostile_rs
    primary = rs.wait_primary()
    config = _config(rs, primary)
    for member in rs.members:
        admin = rs.direct(member).admin
        for term in HOSTILE_TERMS:
            heartbeat = SON([("replSetHeartbeat", "rs0"), ("configVersion", config["version"]),
                             ("configTerm", config["term"]), ("hbv", 1), ("from", "127.0.0.1:1"),
                             ("fromId", 1), ("term", term)])
            assert _code(admin, heartbeat) == 2, (member.host, "heartbeat", term)
            votes = SON([("replSetRequestVotes", 1), ("setName", "rs0"), ("dryRun", False), ("term", term),
                         ("candidateIndex", 1), ("configVersion", config["version"]),
                         ("configTerm", config["term"])])
            assert _code(admin, votes) == 2, (member.host, "votes", term)
            positions = SON([("replSetUpdatePosition", 1), ("optimes", []), ("$replData", {"term": term})])
            assert _code(admin, positions) == 2, (member.host, "updatePosition", term)
        # The other numbers of the same messages: a candidate index, a config version past their range.
        bad_candidate = SON([("replSetRequestVotes", 1), ("setName", "rs0"), ("dryRun", True), ("term", Int64(1)),
                             ("candidateIndex", INT64_MAX), ("configVersion", config["version"])])
        assert _code(admin, bad_candidate) == 2
        bad_version = SON([("replSetHeartbeat", "rs0"), ("configVersion", INT64_MAX), ("term", Int64(1))])
        assert _code(admin, bad_version) == 2
    assert max(_terms(rs)) < 1000  # no member took any of those terms
    _majority_write(rs, "after hostile terms")


def test_reconfigs_with_numbers_out_of_range_are_refused(hostile_rs: ReplicaSet) -> None:
    rs = hostile_rs
    primary = rs.wait_primary()
    secondary = next(m for m in rs.members if m is not primary)
    config = _config(rs, primary)

    def reconfig(member: Member, change: Callable[[dict[str, Any]], None], *, force: bool = False) -> int:
        new = copy.deepcopy(config)
        new["version"] = config["version"] + 1
        change(new)
        return _code(rs.direct(member).admin, SON([("replSetReconfig", new), ("force", force)]))

    def setting(name: str, value: Any) -> Callable[[dict[str, Any]], None]:
        return lambda new: new["settings"].__setitem__(name, value)

    assert reconfig(primary, lambda new: new.__setitem__("version", INT64_MAX)) == 93
    assert reconfig(primary, lambda new: new.__setitem__("version", Int64(2**31))) == 93
    for name, value in [("heartbeatIntervalMillis", 0), ("heartbeatIntervalMillis", -1),
                        ("heartbeatIntervalMillis", Int64(2**62)), ("heartbeatIntervalMillis", math.nan),
                        ("heartbeatIntervalMillis", 2.5), ("electionTimeoutMillis", 0),
                        ("electionTimeoutMillis", Int64(2**62)), ("electionTimeoutMillis", math.inf),
                        ("heartbeatTimeoutSecs", 0), ("catchUpTimeoutMillis", -2),
                        ("catchUpTimeoutMillis", math.nan), ("catchUpTakeoverDelayMillis", -2),
                        ("catchUpTakeoverDelayMillis", -math.inf)]:
        assert reconfig(primary, setting(name, value)) == 93, (name, value)
    for field, value in [("votes", math.nan), ("priority", math.inf), ("priority", 1001.0)]:
        assert reconfig(primary, lambda new, f=field, v=value: new["members"][1].__setitem__(f, v)) == 93

    # A config that does not name the member it is sent to: refused, forced or not (mongod's NodeNotFound).
    def without(member: Member) -> Callable[[dict[str, Any]], None]:
        return lambda new: new.__setitem__("members", [m for m in new["members"] if m["host"] != member.host])

    assert reconfig(secondary, without(secondary), force=True) == 74
    assert reconfig(primary, without(primary), force=True) == 74
    assert reconfig(primary, without(primary)) == 74
    for m in rs.members:
        assert rs.status(m)["myState"] in (1, 2), m.host
    assert [_config(rs, m)["version"] for m in rs.members] == [config["version"]] * 3

    # Reconfigs still work: one to the largest version there is...
    largest = copy.deepcopy(config)
    largest["version"] = Int64(2**31 - 1)
    rs.direct(primary).admin.command(SON([("replSetReconfig", largest)]))
    for m in rs.members:
        wait_for(lambda m=m: _config(rs, m)["version"] == 2**31 - 1, 10, f"{m.host} to install the config")
    # ...after which a forced one has no next version to take: refused, not wrapped around.
    assert _code(rs.direct(secondary).admin, SON([("replSetReconfig", copy.deepcopy(config)), ("force", True)])) == 93
    _majority_write(rs, "after hostile reconfigs")


def test_nan_and_infinities_in_seconds_and_write_concerns_are_refused(hostile_rs: ReplicaSet) -> None:
    rs = hostile_rs
    primary = rs.wait_primary()
    secondary = next(m for m in rs.members if m is not primary)
    admin, secondary_admin = rs.direct(primary).admin, rs.direct(secondary).admin
    for secs in (math.nan, math.inf, -math.inf, 1e300):
        assert _code(admin, SON([("replSetStepDown", secs)])) == 2, secs
        assert _code(admin, SON([("replSetStepDown", 60), ("force", True), ("secondaryCatchUpPeriodSecs", secs)])) == 2
        assert _code(secondary_admin, SON([("replSetFreeze", secs)])) == 2, secs
    # mongod: secondaryCatchUpPeriodSecs is an integer >= 0 and no longer than the stepdown period.
    for catch_up in (-1, 1.5, 61):
        assert _code(admin, SON([("replSetStepDown", 60), ("secondaryCatchUpPeriodSecs", catch_up)])) == 2, catch_up
    assert rs.primary() is primary  # none of those stepped it down
    db = rs.direct(primary).app
    for wc in ({"w": math.nan}, {"w": math.inf}, {"w": -math.inf}, {"w": 1e300}, {"w": 1, "wtimeout": math.inf},
               {"w": "majority", "wtimeout": 1e300}):
        insert = SON([("insert", "hostile"), ("documents", [{"wc": repr(wc)}]), ("writeConcern", wc)])
        assert _code(db, insert) == 9, wc
    assert db.hostile.count_documents({"wc": {"$exists": True}}) == 0  # refused before writing
    _majority_write(rs, "after hostile seconds")


def test_the_set_still_elects_and_logged_no_traceback(hostile_rs: ReplicaSet) -> None:
    rs = hostile_rs
    old = rs.wait_primary()
    terms_before = _terms(rs)
    rs.direct(old).admin.command(SON([("replSetStepDown", 10), ("force", True)]))
    new = wait_for(lambda: (p := rs.primary()) is not None and p is not old and p, 3 * ELECTION_TIMEOUT_MS / 1000,
                   "a new primary")
    assert int(rs.status(new)["term"]) > max(terms_before)
    assert max(_terms(rs)) < 1000
    _majority_write(rs, "after an election")
    _no_tracebacks(rs)
