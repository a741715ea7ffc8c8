"""The part-log simulator (tests/sim/parts.py) on seeds 0..99, and the known bugs of the part log put back
into the product's code it runs, each failing seeds `make test` runs:

* this issue's two: a merge that reads its sources unchecked (a damaged part became every member's
  "byte-identical" merged copy), and an insert whose commit may have happened answered with an error
  that is not retryable (10107 NotWritablePrimary with no label, for an insert that was committed);
  with them, a quorum insert taken while fewer replicas are live than its quorum;
* the rollback one fixed earlier: after a change of primary, a block number names other rows than the
  part of that name on a member's disk, and the rebuild must not keep that copy (`bytes_found`,
  `unlogged_here`, `unverifiable_after_rollback`: each alone catches what the seeds do);
* a read that answers without the rows of a damaged part set aside and not fetched again yet (a real run
  answered rows missing and no error);
* the part log's own: a queue that never looks again at a merge waiting for a source; a fetch that never
  takes a covering part; a damaged part set aside and never fetched again; a check schedule that never
  runs (one seed in four has no reader); no lost-part rule; a registration that outlives its copy and
  keeps a member fetching from a holder that no longer has the part (found by this simulator).

Liveness, not only safety: the seeds do damage parts, change primaries, roll back, lose disks, drop,
mutate, refuse and retry inserts, and the product's code does each of the things these flows need."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pytest

import oplog.parts.queue
from base.errors import MongoError
from oplog.parts import replica_rules, table_replica
from oplog.parts.replica_rules import Source
from oplog.parts.table_replica import Run, TableReplica
from replset.parts import commit
from tests.sim import parts

SEEDS = range(100)


def failing(seeds: Any) -> list[parts.Result]:
    return [r for r in map(parts.run_seed, seeds) if not r.ok]


@pytest.mark.parametrize("chunk", range(6))
def test_seeds_converge(chunk: int) -> None:
    failed = failing(SEEDS[chunk::6])
    assert not failed, failed[0].report


def test_an_unlabelled_error_for_an_insert_that_may_have_committed_fails_seeds(monkeypatch: pytest.MonkeyPatch) -> None:
    def as_before(exc: Any, *, stepped_down: bool) -> MongoError:   # the code of the last try, no label
        return MongoError(exc.code if isinstance(exc, MongoError) else commit.NO_PRIMARY, str(exc))

    monkeypatch.setattr(commit, "in_doubt_error", as_before)
    failed = failing(range(3))
    assert any("was answered error, yet its rows are there" in r.report for r in failed), failed[:1]


def test_a_lost_reply_taken_for_a_failed_commit_fails_seeds(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(commit, "outcome_unknown", lambda exc: False)
    failed = failing([10, 28])
    assert any("was answered error, yet its rows are there" in r.report for r in failed), failed[:1]


def test_a_quorum_insert_taken_with_too_few_live_replicas_fails_seeds(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(commit, "check_live_quorum", lambda node, quorum: None)
    assert any("live replicas" in r.report for r in failing(range(3)))


def test_a_rebuild_that_trusts_its_disk_after_a_rollback_fails_seeds(monkeypatch: pytest.MonkeyPatch) -> None:
    """The rollback defect fixed earlier, with the two rules added since that also catch it: after a change of
    primary, a block number names other rows than the part of that name on the disk of a member that had
    the undone history; the rebuild keeps that copy, and a read serves it."""
    monkeypatch.setattr(TableReplica, "bytes_found", lambda self, name, here: None)
    monkeypatch.setattr(TableReplica, "unlogged_here", lambda self, now_ms, kept_until: None)
    monkeypatch.setattr(TableReplica, "unverifiable_after_rollback", lambda self: None)
    failed = failing([40])
    assert any("serves" in r.report and "the log says" in r.report for r in failed), failed[:1]


def test_a_merge_of_unchecked_sources_fails_seeds(monkeypatch: pytest.MonkeyPatch) -> None:
    schedule = TableReplica.schedule

    def unchecked(self: TableReplica, now_ms: int) -> None:
        schedule(self, now_ms)
        self.actions = [Run(a.entry, a.how) if isinstance(a, Run) else a for a in self.actions]

    monkeypatch.setattr(TableReplica, "schedule", unchecked)
    failed = failing([6, 7])
    assert any("damaged, into" in r.report for r in failed), [r.report for r in failed[:1]]


def test_a_waiting_merge_never_looked_at_again_fails_seeds(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(oplog.parts.queue.ReplicationQueue, "_unblock_within", lambda self, part: None)
    assert failing(range(3))


def test_a_fetch_that_never_takes_a_covering_part_fails_seeds(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_covering(part, exact, covering, **kwargs):  # type: ignore[no-untyped-def]
        return replica_rules.choose_source(part, exact, [], **kwargs)

    monkeypatch.setattr(table_replica, "choose_source", no_covering)
    assert failing(range(3))


def test_a_damaged_part_never_fetched_again_fails_seeds(monkeypatch: pytest.MonkeyPatch) -> None:
    def forgetful(self: TableReplica, name: str, now_ms: int) -> None:
        self.broken.discard(name)
        self.refetch.pop(name, None)

    monkeypatch.setattr(TableReplica, "set_aside_done", forgetful)
    assert failing([6, 17])


def test_a_check_schedule_that_never_runs_fails_seeds(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(TableReplica, "check_due", lambda self, now_ms: None)
    assert failing([71])


def test_no_lost_part_rule_fails_seeds(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(TableReplica, "lost_parts", lambda self, me, live, now_ms, wall_ms: [])
    assert failing([27, 31])


@contextlib.contextmanager
def stale_registrations(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """As before: a registration of this member went only with a merge of the very part it held, and a fetch
    kept trying exact holders (forgetting their failures) before any covering part."""
    def direct_sources(self: TableReplica, part: str, member: str) -> list[str]:
        logged = self.logged.get(part)
        return [s for s in (logged.sources if logged else ()) if member in self.holders.get(s, {})]

    def exact_first(part, exact, covering, *, me, live, failed, inserter, choose, rank=None):  # type: ignore[no-untyped-def]
        usable = [c for m, c in exact.items() if m != me and m in live and c.checksums]
        untried = [c for c in usable if c.address not in failed]
        if usable:
            copies = untried or usable
            return Source(min(copies, key=rank) if rank else choose(copies), part, forget_failures=not untried)
        return replica_rules.choose_source(part, {}, covering, me=me, live=live, failed=failed, inserter=inserter,
                                           choose=choose, rank=rank)

    monkeypatch.setattr(TableReplica, "replaced_registrations", direct_sources)
    monkeypatch.setattr(table_replica, "choose_source", exact_first)
    yield


def test_a_registration_that_outlives_its_copy_fails_seeds(monkeypatch: pytest.MonkeyPatch) -> None:
    with stale_registrations(monkeypatch):
        assert failing([80])


def test_the_seeds_exercise_every_flow() -> None:
    """Each flow happens on the seeds, and the product's code does its part in it."""
    sims = [parts.PartSim(seed, members=3 + seed % 3, reads=seed % 4 != 3) for seed in range(30)]
    assert all(sim.run().ok for sim in sims)
    events = [e for sim in sims for e in sim.events]

    def seen(text: str) -> int:
        return sum(text in e for e in events)

    assert seen(" damage ") >= 5 and sum(sim.refetched for sim in sims) >= 5    # damaged, set aside, refetched
    assert sum(sim.holes_refused for sim in sims) >= 3   # ... and read meanwhile: refused, never rows missing
    assert seen(" is primary (") >= 3 and sum(sim.rolled_back for sim in sims) >= 10   # failovers that undo
    assert seen(" rolls back") >= 1 and seen("lose the disk") >= 3 and seen(" lost ") >= 1
    assert seen(" drop ") >= 3 and seen(" mutation ") >= 3 and seen(" is lost") >= 10   # replies lost
    answers = [ins.answer for sim in sims for ins in sim.inserts]
    for answer in ("ok", "reached", "pending", "refused"):
        assert answers.count(answer) >= 5, (answer, {a: answers.count(a) for a in set(answers)})
    assert sum(ins.tries > 1 for sim in sims for ins in sim.inserts) >= 50   # retried with the same token
    assert all(sim.removed for sim in sims[:10])                             # the log clean-up runs



def test_a_read_that_skips_a_damaged_part_set_aside_fails_seeds(monkeypatch: pytest.MonkeyPatch) -> None:
    """The rows of a damaged part are gone from a member until it fetches the part again: a read meanwhile
    must refuse, not answer the other parts' rows (a real run answered rows missing and no error)."""
    monkeypatch.setattr(TableReplica, "read_holes", lambda self: [])
    failed = failing([14, 17])
    assert any("answers a read without the rows of" in r.report for r in failed), failed[:1]


def test_rows_dropped_and_inserted_again_are_missed_until_their_new_part_is_here() -> None:
    """Seed 617: t0's commit (all_1_1_0) lost its reply, a drop took all_1_1_0, and the client's retry wrote
    t0 again as all_6_6_0. m3 had served t0 from all_1_1_0; until it fetches all_6_6_0 it answers without
    t0, as a member answers without any part it has not fetched yet: no part it had is missing. The read
    checker follows the part rows were served from, not the rows alone."""
    result = parts.run_seed(617)
    assert result.ok, result.report
