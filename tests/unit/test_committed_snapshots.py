"""Committed snapshots for majority reads: which snapshot a read gets, what it holds, and when one is
let go. A real SQLite store on disk (WAL mode: a snapshot is an open read transaction) and a clock
passed in."""

from __future__ import annotations

import datetime
from collections.abc import Iterator
from pathlib import Path

import pytest

from base.optime import OpTime
from oplog.entry import insert_entry
from oplog.log_writer import LogWriter
from oplog.sqlite_store import SQLiteStore
from replset.committed_snapshots import MAX_CANDIDATES, MAX_IDLE_S, CommittedSnapshots, MajorityView

NS = "db.items"
NOW = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)


class Clock:
    def __init__(self) -> None:
        self.s = 1000.0

    def __call__(self) -> float:
        return self.s


class Member:
    """A store and its log: `insert` commits one write, as the group commit would."""

    def __init__(self, path: Path) -> None:
        self.store = SQLiteStore(str(path))
        txn = self.store.begin()
        txn.create_collection(NS)
        self.store.commit()
        self.log = LogWriter(OpTime(1, 0, 1))

    def insert(self, n: int) -> OpTime:
        txn = self.store.begin()
        self.log.write(txn, insert_entry(NS, {"_id": n}), term=1, now=NOW + datetime.timedelta(seconds=n))
        self.store.commit()
        return self.log.last


@pytest.fixture
def member(tmp_path: Path) -> Iterator[Member]:
    m = Member(tmp_path)
    yield m
    m.store.close()


def ids(view: MajorityView) -> list[int]:
    return [d["_id"] for d in view.scan(NS)]


def with_demand(member: Member, clock: Clock) -> tuple[CommittedSnapshots, MajorityView, OpTime]:
    """Snapshots after one majority read of the first write (so commits leave candidates now)."""
    snapshots = CommittedSnapshots(member.store, clock)
    target = member.insert(0)
    view = MajorityView(snapshots)
    view.bind(0, target)
    view.release()
    return snapshots, view, target


def test_a_read_gets_the_oldest_snapshot_holding_the_commit_point(member: Member) -> None:
    clock = Clock()
    snapshots = CommittedSnapshots(member.store, clock)
    first = member.insert(1)
    view = MajorityView(snapshots)
    view.bind(0, first)  # no demand yet: a snapshot is taken for the read
    assert view.optime == first and ids(view) == [1]
    view.release()
    optimes = []
    for n in (2, 3, 4):  # demand now: each commit leaves a candidate
        optimes.append(member.insert(n))
        snapshots.on_commit(0, first)
    assert len(snapshots) == 4
    view.bind(0, optimes[0])  # commit point at the write of 2: the snapshot of then, not the newest
    assert view.optime == optimes[0] and ids(view) == [1, 2]
    assert len(snapshots) == 3  # the one below the commit point can never be chosen again
    other = MajorityView(snapshots)
    other.bind(0, optimes[2])
    assert ids(other) == [1, 2, 3, 4]
    assert len(snapshots) == 1
    assert ids(view) == [1, 2]  # still readable while its read holds it, though out of the list
    view.release()
    other.release()


def test_without_demand_commits_take_no_snapshot_and_idle_ones_are_let_go(member: Member) -> None:
    clock = Clock()
    snapshots = CommittedSnapshots(member.store, clock)
    snapshots.on_commit(0, member.insert(1))
    assert len(snapshots) == 0
    snapshots, _view, target = with_demand(member, clock)
    assert len(snapshots) == 1
    clock.s += MAX_IDLE_S + 1
    snapshots.on_commit(0, target)  # no read chose it for a while: closed (the WAL is not pinned)
    assert len(snapshots) == 0


def test_a_new_history_epoch_drops_every_candidate(member: Member) -> None:
    snapshots, view, target = with_demand(member, Clock())
    member.insert(2)
    snapshots.on_commit(0, target)
    assert len(snapshots) == 2
    view.bind(1, target)  # after a rollback: nothing from the old history is reused
    assert len(snapshots) == 1 and ids(view) == [0, 2]
    view.release()


def test_candidates_are_bounded_and_a_closed_view_fails_cleanly(member: Member) -> None:
    snapshots, view, target = with_demand(member, Clock())
    view.bind(0, target)
    for n in range(1, MAX_CANDIDATES + 10):
        member.insert(n)
        snapshots.on_commit(0, target)
    assert len(snapshots) == MAX_CANDIDATES
    view.release()
    with pytest.raises(Exception) as caught:
        ids(view)
    assert getattr(caught.value, "code", None) == 239
    snapshots.close_all()
    assert len(snapshots) == 0
