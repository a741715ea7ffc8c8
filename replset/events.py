"""What a shell tells the replica core (`replset.replica`): the inputs of `Replica.step`.

Theory of operation
-------------------
etcd's raft has one entry point, `Step(msg)`, and hands back everything to do in a
`Ready`. `Replica.step(now, event)` is that entry point here: each event below is one
thing that happened outside the core - time passed, a message arrived, a `Send` was
answered or failed, something the core asked for completed (`Persist`, `WriteNoop`,
a drain), the member's own oplog moved, the fetcher moved - and `step` returns the
actions (`replset.actions`) to carry out, in order. A transcript of events in and
actions out (`tests/transcripts`) is the whole protocol of one member.

Events that arrive with a request someone waits on (`HeartbeatIn`, `PositionsIn`,
`VoteRequestIn`, the admin commands, `PositionsWanted`) carry the shell's `reply_to`
handle; the core answers them with an `Answer(reply_to, body)` action (a vote only
after the `Persist` of the vote is done). A request the core refuses raises its
`MongoError` out of `step` (the shell answers the client with it); actions decided
before the refusal stay queued for the next `step`/`take_actions`. What the shells
only read (the state, term, commit point, topology, `choose_sync_source`,
`write_concern_problem`, `metadata`) they read from the core's attributes and
queries, never by writing them.

Pure data: no I/O, clocks or randomness.
"""

from __future__ import annotations

__layer__ = "core"  # pure: no I/O, clock or randomness (tests/unit/test_layering.py)

import datetime
from dataclasses import dataclass
from typing import Any

from base.config import ReplSetConfig
from base.member import MemberState
from base.messages import ReplMetadata
from base.optime import OpTime
from base.votes import LastVote
from replset.write_concern import WriteConcern
from sync.rollback_flow import RollbackRun


@dataclass(frozen=True, slots=True)
class Recovered:
    """What the member read back from disk at startup, before `Started`: its term and last vote, its
    rollback's minValid, and how far its oplog is committed and fsynced."""

    term: int
    last_vote: LastVote | None
    min_valid: OpTime | None
    applied: OpTime
    durable: OpTime


@dataclass(frozen=True, slots=True)
class Started:
    """Replication begins (`initiator`: this member ran replSetInitiate), under `config` when given (else
    the one the core holds), in `state` when given (the state the member's data allows: SECONDARY,
    ARBITER, STARTUP2, ...), from `applied`/`durable` when given (what the oplog holds by then)."""

    initiator: bool = False
    state: MemberState | None = None
    config: ReplSetConfig | None = None
    applied: OpTime | None = None
    durable: OpTime | None = None


@dataclass(frozen=True, slots=True)
class Tick:
    """Time passed: deadlines up to `now` fire (call timeouts, heartbeats, the election timer, wtimeouts)."""


@dataclass(frozen=True, slots=True)
class ShutDown:
    """The member is shutting down: waiters fail with 91, calls are forgotten."""


@dataclass(frozen=True, slots=True)
class ConfigInstalled:
    """A newer config is stored (`data_state`: the state a member new to the set takes)."""

    config: ReplSetConfig
    data_state: MemberState | None = None


@dataclass(frozen=True, slots=True)
class Replied:
    """The answer to the core's `Send` number `call`."""

    call: int
    doc: dict[str, Any]


@dataclass(frozen=True, slots=True)
class CallFailed:
    """The core's `Send` number `call` got no answer (timeout, refused connection, an error)."""

    call: int
    refused: bool = False
    why: str = "failed"


@dataclass(frozen=True, slots=True)
class HeartbeatIn:
    """`replSetHeartbeat` from another member; answered with `Answer(reply_to, reply)`."""

    doc: dict[str, Any]
    reply_to: object


@dataclass(frozen=True, slots=True)
class VoteRequestIn:
    """`replSetRequestVotes`; answered with `Answer(reply_to, reply)` once a granted vote is durable."""

    doc: dict[str, Any]
    reply_to: object


@dataclass(frozen=True, slots=True)
class PositionsIn:
    """`replSetUpdatePosition` from a member downstream; answered with `Answer(reply_to, reply)`."""

    doc: dict[str, Any]
    reply_to: object


@dataclass(frozen=True, slots=True)
class Persisted:
    """The `Persist` with this token is on disk."""

    token: int


@dataclass(frozen=True, slots=True)
class NoopWritten:
    """The "new primary" no-op of `term` was written (`ok`) or could not be."""

    term: int
    ok: bool
    wall: datetime.datetime | None = None


@dataclass(frozen=True, slots=True)
class SyncDrained:
    """`StopFetching(drain=True)` ended: everything buffered was applied (`drained`) or the drain gave up."""

    drained: bool


@dataclass(frozen=True, slots=True)
class LocalCommit:
    """Our oplog's last committed (visible, maybe not yet fsynced) entry is now `applied`."""

    applied: OpTime


@dataclass(frozen=True, slots=True)
class LocalDurable:
    """Our oplog is fsynced up to `durable`."""

    durable: OpTime


@dataclass(frozen=True, slots=True)
class MinValidChecked:
    """The answer to `CheckMinValid`: whether our oplog holds that very entry."""

    optime: OpTime
    held: bool


@dataclass(frozen=True, slots=True)
class SourceMetadata:
    """The replication metadata our sync source sent with a batch (its term, commit point, ...)."""

    meta: ReplMetadata


@dataclass(frozen=True, slots=True)
class MinValidSet:
    """A rollback's transaction recorded `optime` as minValid (RECOVERING until applied up to it), or an
    initial sync dropped the data (None)."""

    optime: OpTime | None


@dataclass(frozen=True, slots=True)
class FetchCarriesReports:
    """The fetcher is between a batch and its next getMore, which will carry our positions (`riding`):
    no replSetUpdatePosition of their own is needed meanwhile."""

    riding: bool


@dataclass(frozen=True, slots=True)
class FetcherMoved:
    """The fetcher's source or its last fetched entry changed."""

    source: str | None
    last_fetched: OpTime


@dataclass(frozen=True, slots=True)
class EnterState:
    """The sync pipeline drives a transition: ROLLBACK, RECOVERING after a rollback, STARTUP2 for a resync,
    the data state after an initial sync, or the state a member new to the set takes."""

    state: MemberState


@dataclass(frozen=True, slots=True)
class HoldingsChanged:
    """The part log has "has part" acknowledgements to send upstream."""


@dataclass(frozen=True, slots=True)
class AwaitWriteConcern:
    """A write at `target` waits for `wc`; `Wake(waiter, error)` ends the wait."""

    waiter: object
    wc: WriteConcern
    target: OpTime


@dataclass(frozen=True, slots=True)
class GiveUpWaiting:
    """The client of `waiter` went away: forget the wait."""

    waiter: object


@dataclass(frozen=True, slots=True)
class RollbackStarted:
    """The fetcher found our oplog diverged from its source's and starts a rollback."""


@dataclass(frozen=True, slots=True)
class RollbackEnded:
    """A rollback ended (`run` says how: committed, refused, failed, abandoned)."""

    run: RollbackRun


@dataclass(frozen=True, slots=True)
class Deny:
    """Do not choose `host` as a sync source for `for_ms`."""

    host: str
    for_ms: int


@dataclass(frozen=True, slots=True)
class InitialSyncEnded:
    """An initial sync ended (or a resync was abandoned): fetch and apply from our last entry."""


@dataclass(frozen=True, slots=True)
class ResyncBegan:
    """A resync is about to drop the data: stop fetching and applying."""


@dataclass(frozen=True, slots=True)
class PositionsWanted:
    """The fetcher's next getMore carries our positions: `Answer(reply_to, report)` (empty: none yet)."""

    reply_to: object


@dataclass(frozen=True, slots=True)
class StepDownAsked:
    """`replSetStepDown` decided to go (the shell waited for a caught-up secondary): no election for
    `freeze_ms`. Refused with 10107 when we are not primary."""

    freeze_ms: int
    reason: str


@dataclass(frozen=True, slots=True)
class StepUpAsked:
    """`replSetStepUp`: stand now; `Answer(reply_to, {"started": bool})`."""

    skip_dry_run: bool
    reply_to: object


@dataclass(frozen=True, slots=True)
class FreezeAsked:
    """`replSetFreeze`: no election for `secs` (0 unfreezes); `Answer(reply_to, {"info": text})`."""

    secs: float
    reply_to: object


@dataclass(frozen=True, slots=True)
class SyncFromAsked:
    """`replSetSyncFrom`: sync from `host`; `Answer(reply_to, {"prevSyncTarget": host})`."""

    host: str
    reply_to: object


Event = (Recovered | Started | Tick | ShutDown | ConfigInstalled | Replied | CallFailed | HeartbeatIn
         | VoteRequestIn | PositionsIn | Persisted | NoopWritten | SyncDrained | LocalCommit | LocalDurable
         | MinValidChecked | SourceMetadata | MinValidSet | FetchCarriesReports | FetcherMoved | EnterState
         | HoldingsChanged | AwaitWriteConcern | GiveUpWaiting | RollbackStarted | RollbackEnded | Deny
         | InitialSyncEnded | ResyncBegan | PositionsWanted | StepDownAsked | StepUpAsked | FreezeAsked
         | SyncFromAsked)
