"""What the replica core (`replset.replica`) asks its shell to do.

The core never performs I/O: every event it handles appends actions here, and
the shell (the asyncio member, or the simulator's member) carries them out in
order, then reports back the ones that complete later (`Persist` ->
`Replica.persisted`, `Send` -> `Replica.reply` / `Replica.call_failed`,
`WriteNoop` -> `Replica.noop_written`, `StopFetching(drain=True)` ->
`Replica.sync_drained`, `CheckMinValid` -> `Replica.min_valid_checked`).

Ordering contract: actions are carried out in the order given. In particular an
`Answer` or `Send` that announces a term or a vote is only emitted by the core
after the `Persist` of that term and vote was reported done, so a shell that
simply executes in order never tells anyone what is not on disk.
"""

from __future__ import annotations

__layer__ = "core"  # pure: no I/O, clock or randomness (tests/unit/test_layering.py)

import enum
from dataclasses import dataclass
from typing import Any

from base.errors import MongoError
from base.member import MemberState
from base.optime import OpTime
from base.votes import LastVote


class CallKind(enum.Enum):
    HEARTBEAT = "replSetHeartbeat"
    VOTE = "replSetRequestVotes"
    POSITIONS = "replSetUpdatePosition"


@dataclass(frozen=True, slots=True)
class Persist:
    """Write the term and the last vote durably (fsynced); then call `persisted(now, token)`."""

    term: int
    last_vote: LastVote | None
    token: int


@dataclass(frozen=True, slots=True)
class Send:
    """Send `body` to member `to`; its answer goes to `reply(now, call, doc)`, a failure (or no answer
    within `timeout_ms`) to `call_failed(now, call, ...)`."""

    to: int
    kind: CallKind
    body: dict[str, Any]
    call: int
    timeout_ms: int


@dataclass(frozen=True, slots=True)
class Answer:
    """The answer to a request the shell delivered with `reply_to` (a vote, answered after its fsync)."""

    reply_to: object
    body: dict[str, Any]


@dataclass(frozen=True, slots=True)
class StateChanged:
    old: MemberState
    new: MemberState


@dataclass(frozen=True, slots=True)
class StartFetching:
    """Start the sync pipeline (fetcher and applier) if it is not running."""


@dataclass(frozen=True, slots=True)
class StopFetching:
    """Stop the sync pipeline. With `drain`, apply what is buffered first and report the outcome with
    `sync_drained(now, drained)` (an election's last step before the "new primary" no-op)."""

    drain: bool


@dataclass(frozen=True, slots=True)
class ChangeSyncSource:
    """Drop the current sync source (the core decided another one is better, or was told to)."""

    reason: str


@dataclass(frozen=True, slots=True)
class WriteNoop:
    """Write the "new primary" no-op in `term`; report with `noop_written(now, term, ok)`. Inside the
    write's transaction, `may_write_noop(term)` says whether it may still go ahead."""

    term: int


@dataclass(frozen=True, slots=True)
class Wake:
    """A write-concern waiter is done: satisfied (`error` None) or failed."""

    waiter: object
    error: MongoError | None


@dataclass(frozen=True, slots=True)
class Flush:
    """Flush the journal now (a write waits for durability)."""


@dataclass(frozen=True, slots=True)
class AdoptConfig:
    """A heartbeat brought a newer config document: validate, store it, then `install_config`."""

    document: dict[str, Any]


@dataclass(frozen=True, slots=True)
class CheckMinValid:
    """RECOVERING reached `optime` (the rollback's minValid): say with `min_valid_checked(now, held)`
    whether our oplog holds that very entry (or went past it on another branch)."""

    optime: OpTime


@dataclass(frozen=True, slots=True)
class ForgetMinValid:
    """`optime`, the rollback's minValid, is reached with that very entry: drop its durable record (and
    what the rollback refetched), so that a restart after the oplog was trimmed past it does not take it
    for a minValid not reached yet."""

    optime: OpTime


@dataclass(frozen=True, slots=True)
class Resync:
    """Our data cannot be made consistent by fetching: drop it and run an initial sync."""

    reason: str


@dataclass(frozen=True, slots=True)
class CloseOplogCursors:
    """Kill every cursor other members hold on our oplog: it is about to hold another history, and a
    getMore would read on from a key of the old one (downstream members must find, and check, again)."""

    reason: str


@dataclass(frozen=True, slots=True)
class TopologyChanged:
    """What we know of the other members changed (wakes waiters on the view, e.g. a stepdown's catch-up)."""


@dataclass(frozen=True, slots=True)
class PositionsMoved:
    """A member's reported position moved forward."""


@dataclass(frozen=True, slots=True)
class TermRefused:
    """A term beyond `base.numbers.MAX_TERM` (from `source`) was not adopted: it could not be persisted, and
    no election could follow it. Log it; the core asks once however often such a term comes."""

    term: int
    source: str


Action = (Persist | Send | Answer | StateChanged | StartFetching | StopFetching | ChangeSyncSource | WriteNoop
          | Wake | Flush | AdoptConfig | CheckMinValid | ForgetMinValid | Resync | CloseOplogCursors | TopologyChanged
          | PositionsMoved | TermRefused)
