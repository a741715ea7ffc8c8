"""The recorded history of one run: what the checkers judge.

The runner records, in global simulated milliseconds:

* `primaries`: every time a member became PRIMARY, with its term;
* `applied` and `stored`: every time an entry was committed (applied: enough
  for `w:N`) and became durable (journaled: what `w:"majority"` counts) on a
  member (entries are named by their hash-chain value, which stands for the
  whole prefix up to them);
* `committed`: every entry a member's commit point passed over (the member
  told the world it is majority-committed: hello's `majorityOpTime`, majority
  reads);
* `rolled_back`: every entry a rollback truncated from a member's oplog, and
  `saved_writes`: the writes a rollback saved to its rollback file first;
* `lost_in_crash`: the writes a crash took from a member before they were
  durable there (a machine that lost power: MongoDB keeps a write that was
  acknowledged without `j` only if it was durable somewhere);
* `acks` and `failed_writes`: what members answered clients (an ack names the
  entry it acknowledges), and `majority_reads`;
* at the end, every member's final oplog and data, and when (if) the set
  converged after the faults healed;
* `problems`: invariants the runner saw break while the run went on;
* `cut_offs`: every stretch a primary could reach no majority of voters (its
  links cut either way, the others down or paused) and how it ended;
* `sync_views`: after convergence, who syncs from whom and the true round
  trips between members, taken once a link's delay drifted and once it healed
  (with who synced from whom a few heartbeat intervals before).

Checkers (`tests.sim.checkers`) only read this; unit tests build bad histories
by hand to prove each checker fails when it should.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from base.optime import OpTime


@dataclass(frozen=True, slots=True)
class Stored:
    time_ms: int
    member: int
    entry_hash: int


@dataclass(frozen=True, slots=True)
class Committed:
    time_ms: int
    member: int
    optime: OpTime
    entry_hash: int


@dataclass(frozen=True, slots=True)
class RolledBack:
    time_ms: int
    member: int
    optime: OpTime
    entry_hash: int
    write_id: int


@dataclass(frozen=True, slots=True)
class Ack:
    time_ms: int
    member: int
    write_id: int
    w: int | str
    optime: OpTime
    entry_hash: int


@dataclass(frozen=True, slots=True)
class MajorityRead:
    time_ms: int
    member: int
    key: int
    write_id: int | None   # the write whose value was read, None for "no document"


@dataclass(frozen=True, slots=True)
class CutOff:
    member: int
    term: int
    since_ms: int
    end_ms: int
    stepped_down: bool      # False: the cut healed (or the run ended) while it was still primary


@dataclass(frozen=True, slots=True)
class SyncView:
    time_ms: int
    after: str                              # what happened before this look, for the message
    primary: int
    sources: dict[int, int | None]          # data-bearing secondary -> the member it syncs from
    voters: frozenset[int]
    rtt_ms: dict[tuple[int, int], int]      # true round trip (both base delays and any drift)
    margin_ms: float                        # ping noise allowed on top of the change threshold
    earlier: dict[int, int | None] | None = None   # the sources a few heartbeat intervals before


@dataclass(slots=True)
class FinalState:
    state: str
    hashes: list[int]
    write_ids: list[int]
    last_optime: OpTime
    commit_point: OpTime
    data: dict[int, tuple[int, int]]
    folded: dict[int, tuple[int, int]]    # the data the oplog produces (equal to `data` once consistent)


@dataclass(slots=True)
class History:
    write_majority: int                     # config.write_majority_count
    voting_data_members: frozenset[int]
    primaries: list[tuple[int, int, int]] = field(default_factory=list)   # (time, member, term)
    applied: list[Stored] = field(default_factory=list)
    stored: list[Stored] = field(default_factory=list)
    committed: list[Committed] = field(default_factory=list)
    rolled_back: list[RolledBack] = field(default_factory=list)
    saved_writes: set[int] = field(default_factory=set)
    lost_in_crash: set[int] = field(default_factory=set)
    acks: list[Ack] = field(default_factory=list)
    failed_writes: set[int] = field(default_factory=set)
    majority_reads: list[MajorityRead] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    cut_offs: list[CutOff] = field(default_factory=list)
    stepdown_bound_ms: int = 0
    sync_views: list[SyncView] = field(default_factory=list)
    final: dict[int, FinalState] = field(default_factory=dict)
    heal_ms: int | None = None
    converged_ms: int | None = None
    liveness_bound_ms: int = 0
