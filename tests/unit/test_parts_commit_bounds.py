"""The small rules that bound a quorum insert (`replset.parts.commit`): which replicas count as live,
the write concern a commit is sent with, and the error a client hears when a commit's outcome is not
known."""

from __future__ import annotations

import pytest

from base.clock import ManualClock
from base.config import parse_config
from base.errors import MongoError
from replset.parts.commit import (
    CommitNotConfirmed,
    _raise_if_unconfirmed,
    _retryable,
    bounded_write_concern,
    in_doubt_error,
    live_replicas,
)
from replset.write_concern import WriteConcern, parse_write_concern, timeout_error, write_concern_error_field
from sync.peer import PeerError

CLOCK = ManualClock(100.0)
CONFIG = parse_config({"_id": "rs0", "members": [
    {"_id": 0, "host": "a:1"}, {"_id": 1, "host": "b:1"}, {"_id": 2, "host": "c:1"},
    {"_id": 3, "host": "arb:1", "arbiterOnly": True, "priority": 0}]})


def test_live_replicas_are_this_member_and_the_data_bearing_members_it_sees_up() -> None:
    assert live_replicas(CONFIG, "a:1", set()) == ["a:1"]
    assert live_replicas(CONFIG, "a:1", {"b:1", "arb:1", "gone:1"}) == ["a:1", "b:1"]   # no arbiter, no stranger
    assert live_replicas(CONFIG, "b:1", {"a:1", "c:1"}) == ["a:1", "b:1", "c:1"]
    assert live_replicas(None, "a:1", {"b:1"}) == ["a:1"]


def test_a_commit_without_a_deadline_keeps_its_write_concern() -> None:
    wc = WriteConcern()
    assert bounded_write_concern(wc, None, clock=CLOCK) is wc


@pytest.mark.parametrize(("asked_ms", "expected_ms"), [(0, 2000), (500, 500), (60_000, 2000)])
def test_a_quorum_commit_waits_for_its_write_concern_no_longer_than_its_deadline(asked_ms: int,
                                                                                  expected_ms: int) -> None:
    wc = parse_write_concern({"w": "majority", "wtimeout": asked_ms})
    bounded = bounded_write_concern(wc, CLOCK.monotonic() + 2.0, clock=CLOCK)
    assert bounded.w == "majority" and expected_ms - 100 <= bounded.wtimeout_ms <= expected_ms
    sent = bounded_write_concern(wc, CLOCK.monotonic() + 2.0, margin_s=0.25, clock=CLOCK)   # what a member sends on
    assert sent.wtimeout_ms <= min(asked_ms or 2000, 1750)
    assert parse_write_concern(sent.to_document()).wtimeout_ms == sent.wtimeout_ms


def test_a_spent_deadline_is_the_shortest_wait_never_no_limit() -> None:
    assert bounded_write_concern(WriteConcern(), CLOCK.monotonic() - 5, clock=CLOCK).wtimeout_ms == 1   # 0 means "forever"


def test_a_write_concern_timeout_is_an_unconfirmed_commit_tried_no_more() -> None:
    _raise_if_unconfirmed(None)
    _raise_if_unconfirmed(write_concern_error_field(MongoError(100, "Not enough data-bearing nodes")))
    with pytest.raises(CommitNotConfirmed) as unconfirmed:
        _raise_if_unconfirmed(write_concern_error_field(timeout_error(WriteConcern(wtimeout_ms=1750))))
    assert unconfirmed.value.code == 6 and not _retryable(unconfirmed.value)
    assert _retryable(MongoError(189, "stepped down")) and _retryable(PeerError("no reply"))


@pytest.mark.parametrize(("exc", "stepped_down", "code"), [
    (MongoError(10107, "no primary is known to run the command"), False, 6),
    (MongoError(10107, "no primary is known to run the command"), True, 189),
    (MongoError(13436, "not primary or secondary"), False, 6),
    (MongoError(189, "Primary stepped down while waiting for replication"), False, 189),
    (MongoError(91, "shutting down"), False, 91),
    (PeerError("no reply within the timeout"), False, 6),
    (CommitNotConfirmed(6, "the primary committed it"), False, 6),
])
def test_an_insert_whose_commit_may_have_happened_is_a_labelled_retryable_error(
        exc: PeerError | MongoError, stepped_down: bool, code: int) -> None:
    doc = in_doubt_error(exc, stepped_down=stepped_down).to_document()
    assert doc["code"] == code and doc["errorLabels"] == ["RetryableWriteError"]
    assert "same dedupToken" in doc["errmsg"]
