"""The simulator's checkers fail on bad histories (and pass a good one).

Each test builds a `History` by hand with exactly one thing wrong: if a
checker stayed silent here, a simulator run with that bug would pass too.
"""

from __future__ import annotations

from base.optime import NULL_OPTIME, OpTime
from tests.sim.checkers import (
    acknowledged_writes_kept,
    check,
    committed_prefixes_agree,
    converged_in_time,
    cut_off_primaries_step_down,
    majority_reads_committed,
    one_primary_per_term,
    sync_sources_follow_ping,
    w_n_acks_had_holders,
)
from tests.sim.history import (
    Ack,
    Committed,
    CutOff,
    FinalState,
    History,
    MajorityRead,
    RolledBack,
    Stored,
    SyncView,
)

A, B, C = 101, 102, 103   # entry hashes (a hash chain value stands for the whole prefix)
T1 = OpTime(10, 1, 1)
T2 = OpTime(11, 1, 1)
T3 = OpTime(12, 1, 1)


def final(hashes: list[int], write_ids: list[int]) -> FinalState:
    last = OpTime(10 + len(hashes), 1, 1)
    return FinalState("SECONDARY", hashes, write_ids, last, last, {}, {})


def good() -> History:
    """Three members, one primary (m0, term 1), writes 1 (w:majority) and 2 (w:1) replicated everywhere."""
    h = History(write_majority=2, voting_data_members=frozenset({0, 1, 2}), liveness_bound_ms=10_000)
    h.primaries.append((100, 0, 1))
    for member, t in ((0, 200), (1, 210), (2, 220)):   # applied, then durable a little later
        h.applied += [Stored(t - 5, member, A), Stored(t + 95, member, B)]
        h.stored += [Stored(t, member, A), Stored(t + 100, member, B)]
    h.acks.append(Ack(215, 0, 1, "majority", T1, A))
    h.acks.append(Ack(300, 0, 2, 1, T2, B))
    h.committed += [Committed(216, 0, T1, A), Committed(330, 0, T2, B), Committed(400, 1, T2, B)]
    h.majority_reads.append(MajorityRead(500, 1, 0, 1))
    h.heal_ms, h.converged_ms = 1000, 1500
    for member in (0, 1, 2):
        h.final[member] = final([A, B], [1, 2])
    h.stepdown_bound_ms = 3000
    h.cut_offs.append(CutOff(0, 1, 600, 2900, stepped_down=True))
    h.sync_views.append(view({1: 0, 2: 1}))
    return h


def view(sources: dict[int, int | None], *, primary: int = 0) -> SyncView:
    """m0 primary; m2 is 12 ms from m0 and 4 ms from m1, m1 is 3 ms from m0 (true round trips)."""
    rtt = {(1, 0): 3, (2, 0): 12, (2, 1): 4}
    rtt |= {(b, a): ms for (a, b), ms in rtt.items()}
    return SyncView(2000, "a drift", primary, sources, frozenset({0, 1, 2}), rtt, margin_ms=1.0)


def test_a_good_history_passes_every_checker() -> None:
    assert check(good()) == []


def test_two_primaries_in_one_term_fail() -> None:
    h = good()
    h.primaries.append((900, 1, 1))
    assert one_primary_per_term(h) == ["two primaries in term 1: m0 and m1 (at 900 ms)"]
    h2 = good()
    h2.primaries.append((900, 1, 2))  # a new primary in a new term is fine
    assert one_primary_per_term(h2) == []


def test_a_lost_majority_write_fails() -> None:
    h = good()
    for member in (0, 1, 2):
        h.final[member] = final([C], [3])  # the acknowledged entry A is not in the final oplog
    assert any("w:majority write 1" in v and "lost" in v for v in acknowledged_writes_kept(h))


def test_a_majority_write_rolled_back_after_its_ack_fails() -> None:
    h = good()
    h.rolled_back.append(RolledBack(600, 2, T1, A, 1))
    assert any("was rolled back at 600 ms" in v for v in acknowledged_writes_kept(h))


def test_a_w1_write_may_roll_back_if_saved_or_be_lost_in_a_crash_but_never_vanish() -> None:
    h = good()
    for member in (0, 1, 2):
        h.final[member] = final([A], [1])           # write 2 (w:1) is gone from the final oplog...
    assert any("write 2" in v and "vanished" in v for v in acknowledged_writes_kept(h))
    h.rolled_back.append(RolledBack(700, 0, T2, B, 2))  # truncated is not enough...
    assert any("vanished" in v for v in acknowledged_writes_kept(h))
    h.saved_writes.add(2)                                # ...it must be saved to a rollback file
    assert acknowledged_writes_kept(h) == []
    h.saved_writes.clear()
    h.lost_in_crash.add(2)                               # or a crash took it before it was durable
    assert acknowledged_writes_kept(h) == []


def test_a_wn_ack_with_fewer_holders_fails() -> None:
    h = good()
    h.acks.append(Ack(200, 0, 1, 2, T1, A))          # only m0 had applied A at 200 ms (m1 at 205)
    assert w_n_acks_had_holders(h) == ["w:2 ack of write 1 by m0 at 200 ms: only [0] had it"]


def test_a_majority_ack_before_a_majority_stored_it_fails() -> None:
    h = good()
    h.acks.append(Ack(209, 0, 1, "majority", T1, A))   # m1 had applied A at 205 ms, but not journaled it
    assert len(w_n_acks_had_holders(h)) == 1


def test_divergent_committed_prefixes_fail() -> None:
    h = good()
    h.committed.append(Committed(450, 2, T2, C))     # m2 calls a different entry committed at T2
    assert any("committed prefixes disagree" in v for v in committed_prefixes_agree(h))


def test_a_committed_entry_rolled_back_fails_but_an_earlier_rollback_is_fine() -> None:
    h = good()
    h.rolled_back.append(RolledBack(100, 2, T2, B, 2))   # before anyone committed B: allowed
    assert committed_prefixes_agree(h) == []
    h.rolled_back.append(RolledBack(800, 2, T2, B, 2))   # after m0 committed it at 330 ms: not allowed
    assert any("rolled back" in v for v in committed_prefixes_agree(h))


def test_a_committed_entry_missing_from_the_final_oplog_fails() -> None:
    h = good()
    h.committed.append(Committed(450, 0, T3, C))
    assert any("not in the final oplog" in v for v in committed_prefixes_agree(h))


def test_a_failed_write_that_shows_up_fails() -> None:
    h = good()
    h.failed_writes.add(2)
    assert any("answered with an error" in v for v in acknowledged_writes_kept(h))


def test_a_write_applied_twice_fails() -> None:
    h = good()
    for member in (0, 1, 2):
        h.final[member] = final([A, B, C], [1, 2, 2])
    assert any("twice" in v for v in acknowledged_writes_kept(h))


def test_a_majority_read_of_a_lost_write_fails() -> None:
    h = good()
    h.majority_reads.append(MajorityRead(600, 2, 0, 99))
    assert len(majority_reads_committed(h)) == 1


def test_no_convergence_fails() -> None:
    h = good()
    h.converged_ms = None
    h.final[2] = FinalState("RECOVERING", [A], [1], T1, NULL_OPTIME, {}, {})
    assert len(converged_in_time(h)) == 1
    assert converged_in_time(History(2, frozenset())) == ["the run never reached the liveness phase"]


def test_recorded_problems_fail() -> None:
    h = good()
    h.problems.append("IllegalTransition at 5 ms")
    assert check(h) == ["recorded_problems: IllegalTransition at 5 ms"]


def test_a_primary_cut_off_longer_than_the_bound_fails() -> None:
    h = good()
    h.cut_offs.append(CutOff(1, 2, 5000, 8001, stepped_down=False))
    assert cut_off_primaries_step_down(h) == [
        "m1 stayed primary in term 2 for 3001 ms (from 5000 ms) while it could reach no majority of voters, "
        "and was still primary when it could reach one again (bound 3000 ms)"]


def test_a_secondary_that_stays_on_a_far_source_fails() -> None:
    h = good()
    h.sync_views = [view({1: 0, 2: 0})]   # m2 keeps the primary (12 ms) though m1 (4 ms) syncs from it
    assert sync_sources_follow_ping(h) == [
        "m2 syncs from m0 (round trip 12 ms) at 2000 ms (a drift), but m1 is 8 ms closer "
        "(change threshold 5 ms, ping noise 1 ms)"]


def test_a_level_secondary_not_syncing_from_the_primary_is_not_a_candidate() -> None:
    h = good()
    h.sync_views = [view({1: 2, 2: 0})]   # m1 chains through m2: m1 is no candidate for m2, and m1 -> m2 is fine
    assert sync_sources_follow_ping(h) == []


def test_a_cycle_or_a_missing_source_fails() -> None:
    h = good()
    h.sync_views = [view({1: 2, 2: 1})]
    assert [v.split(" never")[0] for v in sync_sources_follow_ping(h)] == [
        "m1's chain of sync sources m1 -> m2 -> m1", "m2's chain of sync sources m2 -> m1 -> m2"]
    h.sync_views = [view({1: 0, 2: None})]
    assert sync_sources_follow_ping(h) == ["m2 has no sync source at 2000 ms (a drift)"]


def test_a_member_still_deciding_is_not_judged_yet() -> None:
    h = good()
    late = view({1: 0, 2: 0})
    h.sync_views = [SyncView(late.time_ms, late.after, 0, late.sources, late.voters, late.rtt_ms, late.margin_ms,
                             earlier={1: 2, 2: 0})]   # m1 moved to the primary only lately: m2 has not seen it
    assert sync_sources_follow_ping(h) == []
    h.sync_views = [SyncView(late.time_ms, late.after, 0, {1: 0, 2: 1}, late.voters, late.rtt_ms, late.margin_ms,
                             earlier={1: 0, 2: 0})]   # m2 changed its source lately: still deciding
    assert sync_sources_follow_ping(h) == []
