"""The part-log core (`oplog.parts.table_replica.TableReplica`) on its own: events in with a clock,
actions out - damaged parts, the check schedule, merge results, fetch failures, finished tasks."""

from __future__ import annotations

from typing import Any

from oplog.parts.part_info import PartInfo
from oplog.parts.queue import EntryType, ReplicationQueue
from oplog.parts.table import parse_table_def
from oplog.parts.table_replica import (
    BROKEN,
    SEND_CHECK_AGE_MS,
    UNEXPECTED,
    Check,
    Gone,
    Held,
    NotHeld,
    RemoveOld,
    Run,
    SetAside,
    TableReplica,
    checksum_docs,
)

TABLE = parse_table_def("db", "t", {"columns": [{"name": "n", "type": "int64"}], "orderBy": ["n"],
                                    "settings": {"oldPartsLifetimeSecs": 2}})
GOOD = {"data.parquet": (10, "a"), "columns.txt": (1, "c")}
OTHER = {"data.parquet": (10, "b"), "columns.txt": (1, "c")}
ME = "m0"


def P(name: str) -> PartInfo:
    return PartInfo.parse(name)


def replica(*parts: str) -> TableReplica:
    return TableReplica(TABLE, "/nowhere", ReplicationQueue([P(p) for p in parts]))


def get_doc(part: str, n: int, source: str = "m1") -> dict[str, Any]:
    return {"_id": f"b{n}", "type": "GET_PART", "part": part, "source": source, "checksums": checksum_docs(GOOD)}


def test_a_damaged_part_leaves_current_at_once_and_is_fetched_again_only_once_aside() -> None:
    r = replica("all_1_1_0")
    r.log_doc(get_doc("all_1_1_0", 1))   # its task, queued while the part is here, waits a turn
    r.take_actions()
    r.damaged("all_1_1_0", ME)
    assert r.take_actions() == [SetAside("all_1_1_0", BROKEN), Gone("all_1_1_0")]
    assert P("all_1_1_0") not in r.queue.current
    r.damaged("all_1_1_0", ME)   # found again (a read, a merge) while it is being moved: nothing more
    assert r.take_actions() == []
    r.schedule(1_000)
    assert not [a for a in r.take_actions() if isinstance(a, Run)], "no fetch before the directory is aside"
    r.set_aside_done("all_1_1_0", 1_000)
    r.take_actions()
    r.schedule(100_000)   # the log's own task fetches it (it backed off a turn meanwhile): no second one
    (run,) = [a for a in r.take_actions() if isinstance(a, Run)]
    assert (run.how, run.entry.node_name) == ("get", "b1")
    r.task_finished(run.entry, 100_001, produced=P("all_1_1_0"), checksums=GOOD, me=ME)
    r.damaged("all_1_1_0", ME)   # damaged again later, no task of the log left: a fetch of its own
    r.set_aside_done("all_1_1_0", 100_002)
    r.take_actions()
    r.schedule(100_002)
    (run,) = [a for a in r.take_actions() if isinstance(a, Run)]
    assert (run.how, run.entry.node_name) == ("get", "refetch_all_1_1_0")
    assert r.docs["refetch_all_1_1_0"]["checksums"] == checksum_docs(GOOD)   # what the log recorded


def test_a_merge_runs_with_its_sources_to_hash_and_a_fetch_when_a_source_is_missing() -> None:
    r = replica("all_1_1_0", "all_2_2_0")
    r.log_doc({"_id": "merge_all_1_2_1", "type": "MERGE_PARTS", "part": "all_1_2_1",
               "sources": ["all_1_1_0", "all_2_2_0"]})
    r.schedule(0)
    (run,) = [a for a in r.take_actions() if isinstance(a, Run)]
    assert run.how == "produce" and run.verify == ("all_1_1_0", "all_2_2_0")
    r2 = replica("all_1_1_0")
    r2.log_doc({"_id": "merge_all_1_2_1", "type": "MERGE_PARTS", "part": "all_1_2_1",
                "sources": ["all_1_1_0", "all_2_2_0"]})
    r2.schedule(0)
    (run,) = [a for a in r2.take_actions() if isinstance(a, Run)]
    assert run.how == "fetch" and run.verify == ()


def test_a_merge_result_is_kept_unless_another_registered_copy_has_other_bytes() -> None:
    r = replica()
    assert r.merge_result_usable("all_1_2_1", GOOD, ME)
    r.registry_added("all_1_2_1", ME, "h0", OTHER, ME)
    assert r.merge_result_usable("all_1_2_1", GOOD, ME), "this member's own registration is not another copy"
    r.registry_added("all_1_2_1", "m1", "h1", OTHER, ME)
    assert not r.merge_result_usable("all_1_2_1", GOOD, ME)
    assert r.merge_result_usable("all_1_2_1", OTHER, ME)


def test_reads_hash_again_when_files_change_and_sends_when_not_hashed_lately() -> None:
    r = replica("all_1_1_0")
    assert r.needs_hashing("all_1_1_0", ("sig", 1))
    r.verified("all_1_1_0", ("sig", 1), 1_000, whole=True)
    assert not r.needs_hashing("all_1_1_0", ("sig", 1))
    assert r.needs_hashing("all_1_1_0", ("sig", 2))
    assert not r.needs_hashing("all_1_1_0", ("sig", 1), now_ms=1_000 + SEND_CHECK_AGE_MS)
    assert r.needs_hashing("all_1_1_0", ("sig", 1), now_ms=1_001 + SEND_CHECK_AGE_MS)


def test_the_check_schedule_names_the_part_hashed_longest_ago_once_a_period() -> None:
    r = replica("all_1_1_0", "all_2_2_0")
    r.check_period_ms = 10_000
    r.verified("all_1_1_0", (), 5_000, whole=True)
    r.verified("all_2_2_0", (), 3_000, whole=True)
    r.check_due(12_000)
    assert r.take_actions() == []
    r.check_due(13_000)
    assert r.take_actions() == [Check("all_2_2_0")]
    r.check_due(13_000)
    assert r.take_actions() == [], "not named again before its next period"
    r.check_due(15_000)
    assert r.take_actions() == [Check("all_1_1_0")]
    for part in ("all_3_3_0", "all_4_4_0", "all_5_5_0"):   # never hashed: due at once, one per call
        r.queue.current.add(P(part))
    r.check_due(15_000)   # the last walk (15,000) came before them: the next one is a tenth of a period later
    assert r.take_actions() == []
    for now in (16_000, 16_001, 16_002):
        r.check_due(now)
    assert r.take_actions() == [Check("all_3_3_0"), Check("all_4_4_0"), Check("all_5_5_0")]


def test_a_finished_fetch_makes_the_covered_parts_old_and_asks_for_a_registration() -> None:
    r = replica("all_1_1_0", "all_2_2_0")
    r.log_doc({"_id": "merge_all_1_2_1", "type": "MERGE_PARTS", "part": "all_1_2_1",
               "sources": ["all_1_1_0", "all_2_2_0"]})
    r.schedule(0)
    (run,) = [a for a in r.take_actions() if isinstance(a, Run)]
    r.task_finished(run.entry, 100, produced=P("all_1_2_1"), checksums=GOOD, me=ME)
    actions = r.take_actions()
    assert Held("all_1_2_1", GOOD, True) in actions
    assert list(r.queue.current) == [P("all_1_2_1")] and set(r.outdated) == {"all_1_1_0", "all_2_2_0"}
    r.expire(2_099)
    assert r.take_actions() == []
    r.expire(2_100)
    assert r.take_actions() == [RemoveOld("all_1_1_0"), RemoveOld("all_2_2_0")]


def test_a_holder_answering_404_three_times_to_the_primary_is_unregistered() -> None:
    r = replica()
    r.registry_added("all_1_1_0", "m1", "h1", GOOD, ME)
    r.take_actions()
    for _ in range(2):
        r.fetch_failed("all_1_1_0", "all_1_1_0", "h1", missing=True, primary=True, http_of=lambda m: "h1")
    assert r.take_actions() == []
    r.fetch_failed("all_1_1_0", "all_1_1_0", "h1", missing=True, primary=True, http_of=lambda m: "h1")
    assert r.take_actions() == [NotHeld("all_1_1_0", "m1")]
    assert r.failed_sources["all_1_1_0"] == {"h1"}


def test_a_part_here_that_the_log_contradicts_is_set_aside_unexpected() -> None:
    r = replica("all_1_2_1")   # a merge of a history a rollback undid
    r.log_doc(get_doc("all_2_3_1", 7))
    assert r.take_actions() == [SetAside("all_1_2_1", UNEXPECTED)]
    assert P("all_1_2_1") not in r.queue.current
    assert [e.type for e in r.queue.entries] == [EntryType.GET_PART]


# -- a rebuild's look at the disk, lost parts, stale registrations -------------------------------------


def merge_doc(part: str, *sources: str) -> dict[str, Any]:
    return {"_id": f"merge_{part}", "type": "MERGE_PARTS", "part": part, "sources": list(sources)}


def test_a_rebuild_sets_aside_parts_no_log_entry_produces_parks_recent_inserts_and_ages_out_dropped_ones() -> None:
    r = replica("all_1_1_0", "all_2_2_0", "all_3_3_0", "all_5_5_0")
    r.log_doc(get_doc("all_1_1_0", 1))
    r.log_doc({"_id": "drop", "type": "DROP_RANGE", "part": "all_0_3_999999999_999999999"})
    r.take_actions()
    r.unlogged_here(1_000, kept_until=lambda name: 5_000 if name == "all_5_5_0" else 0)
    assert [a for a in r.take_actions() if isinstance(a, SetAside)] == []   # dropped ones age out instead
    assert set(r.outdated) >= {"all_2_2_0", "all_3_3_0"} and r.parked == {"all_5_5_0": 5_000}
    r = replica("all_1_1_0", "all_4_4_0")
    r.log_doc(get_doc("all_1_1_0", 1))
    r.take_actions()
    r.unlogged_here(1_000, kept_until=lambda name: 0)
    assert r.take_actions() == [SetAside("all_4_4_0", UNEXPECTED)]
    assert [p.name for p in r.queue.current] == ["all_1_1_0"]


def test_a_rebuild_sets_aside_a_part_whose_bytes_are_not_the_ones_the_log_records() -> None:
    r = replica("all_1_1_0", "all_2_2_0")
    r.log_doc(get_doc("all_1_1_0", 1))
    r.log_doc(get_doc("all_2_2_0", 2))
    r.take_actions()
    assert r.bytes_expected() == {"all_1_1_0": [GOOD], "all_2_2_0": [GOOD]}
    r.bytes_found("all_1_1_0", GOOD)
    r.bytes_found("all_2_2_0", OTHER)   # the same block number, rows of a history a rollback undid
    assert r.take_actions() == [SetAside("all_2_2_0", UNEXPECTED)]


def test_after_a_rollback_a_part_nothing_in_the_new_history_vouches_for_is_set_aside() -> None:
    r = replica("all_1_1_0", "all_2_2_0")
    r.log_doc(get_doc("all_1_1_0", 1))        # its entry records its bytes
    r.log_doc(merge_doc("all_1_3_1", "all_1_1_0", "all_2_2_0", "all_3_3_0"))   # all_2_2_0's entry is gone
    r.take_actions()
    r.unverifiable_after_rollback()
    assert r.take_actions() == [SetAside("all_2_2_0", UNEXPECTED)]


def test_a_rebuilt_member_reports_gone_the_registrations_of_parts_it_does_not_have() -> None:
    r = replica("all_1_1_0")
    for part in ("all_1_1_0", "all_2_2_0", "all_3_3_0"):
        r.add_holder(part, ME, ME, GOOD)
    r.add_holder("all_3_3_0", "m1", "m1", GOOD)
    r.registrations_not_here(ME)
    assert r.take_actions() == [Gone("all_2_2_0"), Gone("all_3_3_0")]
    r.registrations_not_here(ME, coming=["all_2_2_0"])   # an insert here is publishing it
    assert r.take_actions() == [Gone("all_3_3_0")]


def test_a_registration_goes_with_every_part_of_that_member_the_new_part_contains() -> None:
    r = replica()
    for part in ("all_1_1_0", "all_2_2_0", "all_1_2_1", "all_3_3_0"):
        r.add_holder(part, ME, ME, GOOD)
    r.add_holder("all_2_2_0", "m1", "m1", GOOD)
    assert sorted(r.replaced_registrations("all_1_3_2", ME)) == ["all_1_1_0", "all_1_2_1", "all_2_2_0", "all_3_3_0"]
    assert r.replaced_registrations("all_1_3_2", "m1") == ["all_2_2_0"]


def test_a_pending_quorum_part_no_live_member_holds_is_lost_after_quorum_lost_after_ms() -> None:
    r = replica()
    r.quorum_pending("all_1_1_0", "blk")
    r.add_holder("all_1_1_0", "m1", "m1", GOOD)
    after = TABLE.settings.quorum_lost_after_ms
    assert r.lost_parts(ME, {ME, "m1"}, 0, 0) == []
    assert r.lost_parts(ME, {ME}, 1_000, 0) == []                 # m1 is down: the wait starts
    assert r.lost_parts(ME, {ME}, 1_000 + after - 1, 0) == []
    ((part, log_id, block, why),) = r.lost_parts(ME, {ME}, 1_000 + after, 0)
    assert (part, log_id, block) == ("all_1_1_0", None, "blk") and "quorum failed" in why
    r.quorum_settled("blk")
    assert r.lost_parts(ME, {ME}, 10 * after, 0) == [] and r.orphaned == {}
