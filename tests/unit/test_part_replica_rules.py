"""A replica's part-log decisions (oplog/parts/replica_rules.py): log documents as tasks, the fetch
source, lost parts, old log entries."""

from __future__ import annotations

import random

import pytest

from oplog.parts.part_info import PartInfo
from oplog.parts.queue import EntryType, QueueEntry
from oplog.parts.replica_rules import (
    LOST_AFTER_TRIES,
    LOST_MIN_AGE_MS,
    Copy,
    choose_source,
    log_entry_obsolete,
    quorum_orphaned,
    seems_lost,
    task_of,
)

P = PartInfo.parse
SUMS = {"data.parquet": (1, "a")}


def copy(member: str) -> Copy:
    return Copy(member, f"http-{member}", SUMS)


def test_log_documents_become_tasks() -> None:
    get = task_of({"_id": "b.1", "type": "GET_PART", "part": "all_1_1_0", "source": "m1", "quorum": 2})
    assert get is not None and get.type is EntryType.GET_PART and get.source_replica == "m1" and get.quorum == 2
    merge = task_of({"_id": "merge_all_1_2_1", "type": "MERGE_PARTS", "part": "all_1_2_1",
                     "sources": ["all_1_1_0", "all_2_2_0"]})
    assert merge is not None and merge.source_parts == (P("all_1_1_0"), P("all_2_2_0"))
    alter = task_of({"_id": "alter_2", "type": "ALTER_METADATA", "version": 2})
    assert alter is not None and alter.alter_version == 2 and alter.new_part is None
    assert task_of({"_id": "x", "type": "SOMETHING_ELSE"}) is None
    with pytest.raises(KeyError):
        task_of({"type": "GET_PART", "part": "all_1_1_0"})


def test_a_random_live_holder_and_a_failed_one_only_when_all_failed() -> None:
    part, rng = P("all_1_1_0"), random.Random(1)
    exact = {m: copy(m) for m in ("me", "a", "b", "down")}
    picked = {choose_source(part, exact, [], me="me", live={"me", "a", "b"}, failed=set(), inserter=None,
                            choose=rng.choice).copy.member for _ in range(50)}
    assert picked == {"a", "b"}   # never itself, never a member that is down; both used
    source = choose_source(part, exact, [], me="me", live={"a", "b"}, failed={"http-a"}, inserter=None,
                           choose=rng.choice)
    assert source is not None and source.copy.member == "b" and not source.forget_failures
    source = choose_source(part, exact, [], me="me", live={"a", "b"}, failed={"http-a", "http-b"}, inserter=None,
                           choose=rng.choice)
    assert source is not None and source.forget_failures


def test_the_widest_covering_part_then_the_inserter() -> None:
    part, rng = P("all_2_2_0"), random.Random(2)
    covering = [(P("all_1_3_1"), {"a": copy("a")}), (P("all_1_5_2"), {"b": copy("b")})]
    source = choose_source(part, {}, covering, me="me", live={"a", "b"}, failed=set(), inserter=None,
                           choose=rng.choice)
    assert source is not None and (source.part, source.copy.member) == (P("all_1_5_2"), "b")
    source = choose_source(part, {}, [], me="me", live=set(), failed=set(), inserter=copy("c"), choose=rng.choice)
    assert source is not None and source.copy.member == "c" and source.part == part
    assert choose_source(part, {}, [], me="me", live=set(), failed=set(), inserter=copy("me"),
                         choose=rng.choice) is None


def test_when_every_exact_holder_failed_a_covering_part_comes_first_from_a_holder_that_has_not_failed() -> None:
    """A registration can outlive its copy (the member fetched a covering part and dropped what it covers):
    an exact holder that failed is tried again only when no covering part is registered."""
    part, rng = P("all_2_2_0"), random.Random(3)
    exact = {"a": copy("a")}
    covering = [(P("all_1_3_1"), {"a": copy("a"), "b": copy("b")}), (P("all_1_3_1_9"), {"c": copy("c")})]
    source = choose_source(part, exact, covering, me="me", live={"a", "b", "c"}, failed={"http-a"}, inserter=None,
                           choose=rng.choice)
    assert source is not None and (source.part, source.copy.member, source.forget_failures) == \
        (P("all_1_3_1_9"), "c", False)   # the same range: the newest data version
    source = choose_source(part, exact, covering, me="me", live={"a", "b", "c"}, failed={"http-a", "http-c"},
                           inserter=None, choose=rng.choice)
    assert source is not None and (source.part, source.copy.member) == (P("all_1_3_1"), "b")
    source = choose_source(part, exact, [], me="me", live={"a"}, failed={"http-a"}, inserter=None, choose=rng.choice)
    assert source is not None and source.copy.member == "a" and source.forget_failures


def test_a_rank_replaces_the_random_pick() -> None:
    exact = {m: copy(m) for m in ("a", "b", "c")}
    lag = {"a": 5, "b": 0, "c": 9}
    source = choose_source(P("all_1_1_0"), exact, [], me="me", live={"a", "b", "c"}, failed=set(), inserter=None,
                           choose=random.Random(3).choice, rank=lambda c: lag[c.member])
    assert source is not None and source.copy.member == "b"


def _fetch(tries: int) -> QueueEntry:
    entry = QueueEntry("b.1", EntryType.GET_PART, P("all_1_1_0"))
    entry.num_tries = tries
    return entry


@pytest.mark.parametrize(("tries", "here", "elsewhere", "age_ms", "lost"), [
    (LOST_AFTER_TRIES, False, False, LOST_MIN_AGE_MS, True),
    (LOST_AFTER_TRIES - 1, False, False, LOST_MIN_AGE_MS, False),
    (LOST_AFTER_TRIES, True, False, LOST_MIN_AGE_MS, False),
    (LOST_AFTER_TRIES, False, True, LOST_MIN_AGE_MS, False),
    (LOST_AFTER_TRIES, False, False, LOST_MIN_AGE_MS - 1, False),   # young: its source may still publish it
])
def test_a_part_is_lost_only_when_every_sign_says_so(tries: int, here: bool, elsewhere: bool, age_ms: int,
                                                     lost: bool) -> None:
    assert seems_lost(_fetch(tries), here=here, held_elsewhere=elsewhere, already_lost=False,
                      created_ms=1_000, now_ms=1_000 + age_ms) is lost


def test_a_quorum_part_no_live_member_holds_is_lost_after_the_delay() -> None:
    assert quorum_orphaned(None, held_live=False, now_ms=100, after_ms=50) == (False, 100)
    assert quorum_orphaned(100, held_live=False, now_ms=140, after_ms=50) == (False, 100)
    assert quorum_orphaned(100, held_live=True, now_ms=140, after_ms=50) == (False, None)
    assert quorum_orphaned(100, held_live=False, now_ms=150, after_ms=50) == (True, None)


LIFETIME_MS = 480_000


@pytest.mark.parametrize("age_ms, holders, pending, keyed, obsolete", [
    (LIFETIME_MS, {"a", "b", "c"}, False, False, True),
    (LIFETIME_MS + 1, {"a", "b", "c", "d"}, False, False, True),   # a member not live: holds nobody back
    (LIFETIME_MS - 1, {"a", "b", "c"}, False, False, False),       # young: readers and lagging queues
    (LIFETIME_MS, {"a", "b"}, False, False, False),                # a live member lacks the covering part
    (LIFETIME_MS, None, False, False, False),                      # nothing covers it: still a part
    (LIFETIME_MS, {"a", "b", "c"}, True, False, False),            # its quorum is pending
    (LIFETIME_MS, {"a", "b", "c"}, False, True, False),            # its dedup key reads it
])
def test_a_log_entry_goes_once_every_live_member_holds_a_part_covering_it(
        age_ms: int, holders: set[str] | None, pending: bool, keyed: bool, obsolete: bool) -> None:
    assert log_entry_obsolete(created_ms=1_000, now_ms=1_000 + age_ms, lifetime_ms=LIFETIME_MS,
                              covering_holders=holders, members={"a", "b", "c"}, quorum_pending=pending,
                              names_a_dedup_key=keyed) is obsolete


def test_no_live_member_means_no_clean_up() -> None:
    assert not log_entry_obsolete(created_ms=0, now_ms=LIFETIME_MS, lifetime_ms=LIFETIME_MS,
                                  covering_holders=set(), members=set(), quorum_pending=False,
                                  names_a_dedup_key=False)
