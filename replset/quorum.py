"""Quorum arithmetic: the majority commit point and write-concern satisfaction.

Theory of operation
-------------------
The primary learns every member's positions (`lastApplied`, `lastDurable`) from
`replSetUpdatePosition` reports. Two questions are asked of those positions, and
both are answered here, without I/O, from a config and plain mappings
`member id -> OpTime`:

1. **How far is the log committed?** Sort the durable optimes of the voting,
   data-bearing members from newest to oldest; the k-th one, with
   k = `config.write_majority_count`, is the newest optime that k of them hold.
   Like etcd-io/raft `quorum/majority.go` (`CommittedIndex`), a member we have
   not heard from counts as holding nothing. Two Raft rules then guard the
   result: the commit point only *advances* to an optime of the current term (an
   older-term entry is committed indirectly, by the new primary's "new primary"
   no-op reaching a majority), and it never moves backwards.

2. **Is this write acknowledged?** `w: N` counts data-bearing members (hidden,
   delayed and priority-0 members count; arbiters never do) whose applied — or,
   with `j: true`, durable — optime reached the write. `w: "majority"` asks the
   commit point. A tag mode from `settings.getLastErrorModes`
   (`{"mode": {"tag": count}}`) needs, for every tag, `count` distinct values of
   that tag among the members that reached the write.

Positions of members that are not in `config` are ignored, so a report from a
member removed by a reconfig cannot commit anything.
"""

from __future__ import annotations

__layer__ = "core"  # pure: no I/O, clock or randomness (tests/unit/test_layering.py)

from collections.abc import Iterable, Mapping

from base.config import MemberConfig, ReplSetConfig
from base.optime import NULL_OPTIME, OpTime
from replset.write_concern import MAJORITY, WriteConcern


def majority_commit_point(config: ReplSetConfig, durable: Mapping[int, OpTime], current_term: int,
                          prior: OpTime) -> OpTime:
    """The new commit point: `prior`, or a newer optime of `current_term` held by a write majority.

    `durable` maps member id to the member's durable optime (the primary's own
    entry included); missing members hold nothing.
    """
    quorum = config.write_majority_count
    if quorum <= 0:
        return prior
    voting_data = [m for m in config.members if m.votes > 0 and m.data_bearing]
    newest_first = sorted((durable.get(m.id, NULL_OPTIME) for m in voting_data), reverse=True)
    candidate = newest_first[quorum - 1]
    # Raft §5.4.2: counting replicas only commits entries of the current term.
    if candidate.term != current_term or candidate <= prior:
        return prior
    return candidate


def _reached(config: ReplSetConfig, positions: Mapping[int, OpTime], target: OpTime) -> list[MemberConfig]:
    """The data-bearing members of `config` whose position is at or past `target`."""
    return [m for m in config.members
            if m.data_bearing and m.id in positions and positions[m.id] >= target]


def count_members_at(config: ReplSetConfig, positions: Mapping[int, OpTime], target: OpTime) -> int:
    """How many data-bearing members of `config` have reached `target` (arbiters never count)."""
    return len(_reached(config, positions, target))


def tag_mode_satisfied(mode: Mapping[str, int], members: Iterable[MemberConfig]) -> bool:
    """Whether `members` cover `mode`: for each tag, at least `count` distinct values of it."""
    tagged = [m.tags for m in members]
    for tag, count in mode.items():
        values = {tags[tag] for tags in tagged if tag in tags}
        if len(values) < int(count):
            return False
    return True


def write_concern_satisfied(wc: WriteConcern, target: OpTime, *, config: ReplSetConfig,
                            applied: Mapping[int, OpTime], durable: Mapping[int, OpTime],
                            commit_point: OpTime) -> bool:
    """Whether a write at `target` meets `wc`, given every member's applied and durable optimes.

    An unknown tag mode is never satisfied; `write_concern.check_satisfiable`
    reports it to the client up front.
    """
    if wc.w == MAJORITY:
        return commit_point >= target
    positions = durable if wc.j else applied
    if isinstance(wc.w, int):
        needed = max(wc.w, 1 if wc.j else 0)
        return needed == 0 or count_members_at(config, positions, target) >= needed
    mode = config.settings.get_last_error_modes.get(wc.w)
    if not isinstance(mode, Mapping):
        return False
    return tag_mode_satisfied(mode, _reached(config, positions, target))


def follower_commit_point(learned: OpTime, last_applied: OpTime, prior: OpTime) -> OpTime:
    """A secondary's commit point: the newest one it heard of, capped at its own last entry.

    Only safe on our own history. If our last entry is in an older term than the
    learned commit point, our tail may be a deposed primary's entries that diverge
    from the committed branch (min() would then call them committed, and a later
    rollback would be refused); so the commit point does not move until we have
    an entry of that term. An entry of the commit point's term, or a newer one,
    proves our log holds the committed prefix (one primary per term; every newer
    primary's log holds every committed entry).
    """
    if last_applied.term < learned.term:
        return prior
    return max(prior, min(learned, last_applied))
