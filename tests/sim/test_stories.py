"""Directed stories for runtime bugs whose timing random seeds rarely hit.

Each story builds one simulated member, puts it exactly where the bug needs it,
and steps it: with the runtime's current behaviour (`--shell-bug NAME`) the
member ends in the bad state, with the fix it does not.
"""

from __future__ import annotations

import itertools
import random

from oplog.optime import OpTime
from replset.election import LastVote
from replset.member import MemberState
from replset.messages import HeartbeatReply
from tests.sim import rpc
from tests.sim.candidate import ElectionRun
from tests.sim.clock import SimClock
from tests.sim.disk import Disk, Entry, EntryKind
from tests.sim.model import ShellModel
from tests.sim.node import SimNode
from tests.sim.scenario import SHAPES, host_of, make_config

STORY_BUGS = frozenset({"drain-cancels-rollback"})


def member_with_a_diverged_tail(model: ShellModel) -> SimNode:
    """m1 was primary of term 1 and kept entries nobody else has; m0 has term-2 entries."""
    config = make_config(SHAPES[0][1], 1000, 5000, heartbeat_timeout_secs=5, catch_up_timeout_ms=-1)
    disk = Disk()
    disk.write_unsynced([Entry(OpTime(100, 1, -1), EntryKind.INITIATE),
                         Entry(OpTime(101, 1, 1), EntryKind.NEW_PRIMARY),
                         Entry(OpTime(102, 1, 1), EntryKind.WRITE, 7, 0, 7)])
    disk.sync()
    node = SimNode(1, config, disk, SimClock(0, 0, 0), random.Random(1), 0, itertools.count(1).__next__, model)
    reply = HeartbeatReply("rs0", MemberState.SECONDARY, 2, OpTime(105, 1, 2), OpTime(105, 1, 2), 1, 1, "",
                           OpTime(105, 1, 2), -1)
    node.topology.on_heartbeat_reply(0, reply, 1.0, 0, node.term)
    return node


def win_term_3_and_diverge_during_catch_up(node: SimNode) -> None:
    node.disk.persist_term(3, LastVote(3, node.id))
    node.term, node.last_vote = 3, LastVote(3, node.id)
    run = ElectionRun("electionTimeout", 3)
    node.election = run
    run._start_catch_up(node)                       # target: m0's (2, 105) - we are behind
    assert run.phase == "catch-up"
    fetcher = node.fetcher
    assert fetcher is not None
    fetcher.sync_source = fetcher.cursor_source = host_of(0)
    fetcher._diverged(OpTime(105, 1, 2))            # m0 does not have our (1, 102): roll back
    stray = rpc.Reply(-1, 0, rpc.HEARTBEAT, None)    # an unknown reply: ignored, but the member takes a step
    node.deliver(1, stray)                           # the rollback starts: ROLLBACK, scan sent
    assert node.state is MemberState.ROLLBACK and fetcher.rollback is not None
    node.tick(node.clock.global_ms_at(run.deadline_ms) + 1)   # catch-up times out: drain


def test_a_drain_never_cancels_a_rollback() -> None:
    node = member_with_a_diverged_tail(ShellModel())
    win_term_3_and_diverge_during_catch_up(node)
    assert node.election is None                     # the election is abandoned...
    assert node.fetcher is not None and node.fetcher.rollback is not None   # ...the rollback goes on


def test_the_runtime_today_leaves_the_member_stuck_in_rollback() -> None:
    node = member_with_a_diverged_tail(ShellModel(frozenset({"drain-cancels-rollback"})))
    win_term_3_and_diverge_during_catch_up(node)
    assert node.election is None and node.state is MemberState.ROLLBACK
    assert node.fetcher is None                      # no worker: nothing will ever leave ROLLBACK
    node.start_worker()
    assert node.fetcher is None
