"""The oplog fetcher's control loop, as a pure state machine: which read comes next, and what each answer means.

Theory of operation
-------------------
A secondary fetches its source's oplog in *sessions*. Each session goes:

1. **Choose** a sync source (the replica core decides: `ChooseSource`). None: wait
   for a topology change, at most `NO_SOURCE_RETRY_MS` (`AwaitTopology`).
2. **Find**: open a tailable cursor with `{ts: {$gte: <last fetched ts>}}`. The
   first entry judges the source (`sync.fetching.check_first_batch`). Our entry
   missing there: read the source's oldest entry (`ReadOldest`) to tell too
   stale from diverged. While RECOVERING after a rollback: check the source holds
   the rollback's minValid (`ReadMinValid`).
3. **Tail**: take the batch (`Take`), wait until it is applied (`AwaitApplied`)
   and, for at most `REPORT_LINGER_MS`, for the journal flush under way
   (`AwaitDurable`), then `GetMore`, which carries our positions. Between a batch
   and its getMore the core knows its reports ride on the fetch (`Riding`).
4. A session ends when the source closes the cursor (choose again), when the
   runtime asks for another source (`change`), or badly (`failed`): then
   `sync.fetching.react` says what follows — deny the source, roll back, report
   too stale, pause — and the loop chooses again.

The asyncio fetcher (`sync.worker.SyncWorker`) and the simulator's
(`tests/sim/fetcher.py`) both carry these actions out; they only move messages,
entries and time. Each input returns the actions that follow it, in order; the
last one is what the shell waits on next (a read, a wait), unless the loop stopped.

Pure: optimes and host names in, actions out; the clock is passed in.
"""

from __future__ import annotations

__layer__ = "core"  # pure: no I/O, clock or randomness (tests/unit/test_layering.py)

import enum
from dataclasses import dataclass

from base.optime import OpTime
from sync import fetching
from sync.fetching import Problem, Verdict, check_first_batch, diagnose_missing, react
from sync.too_stale import describe_optime

NO_SOURCE_RETRY_MS = 1000
REPORT_LINGER_MS = 2


class Phase(enum.Enum):
    CHOOSE = "choosing a sync source"
    WAIT = "waiting before choosing again"
    FIND = "opening a cursor"
    OLDEST = "reading the source's oldest entry"
    MIN_VALID = "checking that the source holds our minValid"
    APPLY = "waiting for the last batch to be applied"
    SETTLE = "waiting briefly for the last batch's journal flush"
    GET_MORE = "waiting for a getMore"
    ROLLBACK = "rolling back"
    STOPPED = "stopped"


# -- actions ------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ChooseSource:
    """Ask the replica core for a sync source for `last_fetched`; answer with `chosen`."""
    last_fetched: OpTime


@dataclass(frozen=True, slots=True)
class AwaitTopology:
    """No source: wait for a topology change or until `until_ms`, then `wake`."""
    until_ms: int


@dataclass(frozen=True, slots=True)
class Pause:
    """Wait until `until_ms`, then `wake`."""
    until_ms: int


@dataclass(frozen=True, slots=True)
class Find:
    """Open a tailable cursor on `source`'s oplog from `after.ts`; answer with `found` (or `failed`)."""
    source: str
    after: OpTime


@dataclass(frozen=True, slots=True)
class ReadOldest:
    """Read the source's oldest entry; answer with `oldest` (or `failed`)."""
    source: str


@dataclass(frozen=True, slots=True)
class ReadMinValid:
    """Read the source's first entry at or after `min_valid`; answer with `min_valid_read` (or `failed`)."""
    source: str
    min_valid: OpTime


@dataclass(frozen=True, slots=True)
class Take:
    """Hand the entries of the last reply from index `start` on to the applier."""
    start: int


@dataclass(frozen=True, slots=True)
class AwaitApplied:
    """Wait until every batch handed on is applied; answer with `applied`."""


@dataclass(frozen=True, slots=True)
class AwaitDurable:
    """Wait until the applied batch is journaled, or until `until_ms`; answer with `settled`."""
    until_ms: int


@dataclass(frozen=True, slots=True)
class GetMore:
    """`getMore` on the open cursor, carrying our positions; answer with `batch` (or `failed`)."""
    source: str


@dataclass(frozen=True, slots=True)
class CloseCursor:
    """The session with `source` ended: drop a read still out and release the cursor if one is open (best
    effort). An answer to that read that comes later is not this session's."""
    source: str


@dataclass(frozen=True, slots=True)
class Moved:
    """The fetcher's source or last fetched entry changed: tell the replica core (`FetcherMoved`)."""
    source: str | None
    last_fetched: OpTime
    new_source: bool = False


@dataclass(frozen=True, slots=True)
class Riding:
    """Our next position reports ride on the fetch (True) or need their own message (False)."""
    riding: bool


@dataclass(frozen=True, slots=True)
class Deny:
    source: str
    for_ms: int


@dataclass(frozen=True, slots=True)
class RollBack:
    """Roll back against `source`; answer with `rolled_back`."""
    source: str


@dataclass(frozen=True, slots=True)
class ReportTooStale:
    """The source trimmed entries we never fetched (`sync.too_stale` decides what follows)."""
    source: str
    our_last: OpTime
    source_oldest: OpTime


Action = (ChooseSource | AwaitTopology | Pause | Find | ReadOldest | ReadMinValid | Take | AwaitApplied
          | AwaitDurable | GetMore | CloseCursor | Moved | Riding | Deny | RollBack | ReportTooStale)


@dataclass(slots=True)
class FetchLoop:
    last_fetched: OpTime
    source: str | None = None       # the source we fetch from, or last chose
    phase: Phase = Phase.CHOOSE
    message: str = ""               # why the last session ended badly (status `infoMessage`)
    carrying_reports: bool = False  # tailing: each getMore carries our positions
    awaiting_source: bool = False   # a getMore is out
    _pending_last: OpTime | None = None   # the last entry of a first batch being judged
    _cursor_open: bool = True             # the source kept the cursor of the first batch
    _source_oldest: OpTime | None = None

    @property
    def riding(self) -> bool:
        return self.carrying_reports and not self.awaiting_source

    @property
    def in_session(self) -> bool:
        """A cursor is being opened or read: `change` ends it."""
        return self.phase in (Phase.FIND, Phase.OLDEST, Phase.MIN_VALID, Phase.APPLY, Phase.SETTLE,
                              Phase.GET_MORE)

    # -- inputs -------------------------------------------------------------------------------------

    def start(self) -> list[Action]:
        self.phase = Phase.CHOOSE
        return [ChooseSource(self.last_fetched)]

    def wake(self) -> list[Action]:
        """A `Pause` or `AwaitTopology` ended."""
        if self.phase is not Phase.WAIT:
            return []
        return self.start()

    def chosen(self, source: str | None, now_ms: int) -> list[Action]:
        if self.phase is not Phase.CHOOSE:
            return []
        if source is None:
            actions: list[Action] = []
            if self.source is not None:
                self.source = None
                actions.append(Moved(None, self.last_fetched))
            self.phase = Phase.WAIT
            return [*actions, AwaitTopology(now_ms + NO_SOURCE_RETRY_MS)]
        new_source = source != self.source
        self.source = source
        self.phase = Phase.FIND
        return [Moved(source, self.last_fetched, new_source), Find(source, self.last_fetched)]

    def found(self, first: OpTime | None, last: OpTime | None, *, min_valid: OpTime | None,
              source_applied: OpTime | None, my_term: int, now_ms: int, cursor_open: bool = True,
              primary_seen: bool = True) -> list[Action]:
        """The first batch of a new cursor: its first and last entries (None: it is empty). `min_valid`
        is the rollback's minValid while RECOVERING, else None. `cursor_open`: the source kept the cursor
        (if not, the batch is taken and the loop chooses again)."""
        if self.phase is not Phase.FIND:
            return []
        assert self.source is not None
        self._cursor_open = cursor_open
        verdict = check_first_batch(first, self.last_fetched)
        if verdict is Verdict.MISSING:
            self.phase = Phase.OLDEST
            return [ReadOldest(self.source)]
        if verdict is not Verdict.CONTINUES:
            return self.failed(Problem[verdict.name], source_applied=source_applied, my_term=my_term,
                               now_ms=now_ms, primary_seen=primary_seen)
        self._pending_last = last if first != last else None
        if min_valid is not None:
            self.phase = Phase.MIN_VALID
            return [ReadMinValid(self.source, min_valid)]
        return self._tail()

    def oldest(self, source_oldest: OpTime | None, *, source_applied: OpTime | None, my_term: int,
               now_ms: int, primary_seen: bool = True) -> list[Action]:
        """The source's oldest entry (None: its oplog is empty), after our entry was missing there."""
        if self.phase is not Phase.OLDEST:
            return []
        self._source_oldest = source_oldest
        verdict = diagnose_missing(self.last_fetched, source_oldest)
        return self.failed(Problem[verdict.name], source_applied=source_applied, my_term=my_term, now_ms=now_ms,
                           primary_seen=primary_seen)

    def min_valid_read(self, min_valid: OpTime, held: bool, *, source_applied: OpTime | None, my_term: int,
                       now_ms: int, primary_seen: bool = True) -> list[Action]:
        """Whether the source holds `min_valid` (the first entry at or after it is that very entry)."""
        if self.phase is not Phase.MIN_VALID:
            return []
        verdict = fetching.check_min_valid(min_valid, held, source_applied)
        if verdict is not Verdict.CONTINUES:
            return self.failed(Problem[verdict.name], source_applied=source_applied, my_term=my_term,
                               now_ms=now_ms, primary_seen=primary_seen)
        return self._tail()

    def applied(self, *, flush_pending: bool, now_ms: int) -> list[Action]:
        """Every batch handed on is applied. `flush_pending`: a journal flush would make it durable soon."""
        if self.phase is not Phase.APPLY:
            return []
        if flush_pending:
            self.phase = Phase.SETTLE
            return [AwaitDurable(now_ms + REPORT_LINGER_MS)]
        return self._get_more()

    def settled(self) -> list[Action]:
        """The applied batch is durable, or the short wait for it ended."""
        if self.phase is not Phase.SETTLE:
            return []
        return self._get_more()

    def batch(self, last: OpTime | None, *, cursor_open: bool) -> list[Action]:
        """A getMore answered: its last entry (None: empty), and whether the source keeps the cursor."""
        if self.phase is not Phase.GET_MORE:
            return []
        actions = self._reports(awaiting=False)
        if last is not None:
            self.last_fetched = last
            actions += [Moved(self.source, last), Take(0)]
        if not cursor_open:
            return [*actions, *self._close(), *self.start()]
        self.phase = Phase.APPLY
        return [*actions, AwaitApplied()]

    def failed(self, problem: Problem, *, source_applied: OpTime | None, my_term: int,
               now_ms: int, primary_seen: bool = True) -> list[Action]:
        """The session ended badly (`sync.fetching.react` says what follows). `source_applied`: the
        source's newest entry as heartbeats reported it; `primary_seen`: we see a primary of our term."""
        if not self.in_session:
            return []
        source, source_oldest = self.source, self._source_oldest
        assert source is not None
        actions = self._close()
        reaction = react(problem, source_applied=source_applied, my_term=my_term, primary_seen=primary_seen)
        self.message = f"sync source {source}: {reaction.message}" if reaction.message else self.message
        if reaction.deny_ms:
            actions.append(Deny(source, reaction.deny_ms))
        if reaction.too_stale and source_oldest is not None:
            self.message = (f"too stale to catch up: our last entry {describe_optime(self.last_fetched)} is "
                            f"older than the source's oldest entry {describe_optime(source_oldest)}")
            actions.append(ReportTooStale(source, self.last_fetched, source_oldest))
        if reaction.roll_back:
            self.phase = Phase.ROLLBACK
            return [*actions, RollBack(source)]
        if reaction.pause_ms:
            self.phase = Phase.WAIT
            return [*actions, Pause(now_ms + reaction.pause_ms)]
        return [*actions, *self.start()]

    def rollback_started(self, message: str) -> None:
        """The rollback's buffer is drained and it runs (`message` says against what)."""
        if self.phase is Phase.ROLLBACK:
            self.message = message

    def rolled_back(self, common_point: OpTime | None, message: str = "") -> list[Action]:
        """The rollback ended: at `common_point` (None: nothing changed), `message` saying why not. A
        rollback runs to its end even when the loop stopped meanwhile: the fetcher still moves."""
        if self.phase not in (Phase.ROLLBACK, Phase.STOPPED):
            return []
        self.message = message
        actions: list[Action] = []
        if common_point is not None:
            self.last_fetched = common_point
            actions.append(Moved(self.source, common_point))
        return actions if self.phase is Phase.STOPPED else [*actions, *self.start()]

    def change(self) -> list[Action]:
        """The runtime decided another source is better: end the session (not a rollback)."""
        if not self.in_session:
            return []
        return [*self._close(), *self.start()]

    def stop(self) -> list[Action]:
        """Fetching stops (a rollback under way is the shell's to end)."""
        actions = self._close() if self.in_session else []
        self.phase = Phase.STOPPED
        return actions

    # -- helpers ------------------------------------------------------------------------------------

    def _tail(self) -> list[Action]:
        """The first batch continues our oplog: take what follows our entry, then tail."""
        assert self.source is not None
        self.message = ""
        actions: list[Action] = []
        if self._pending_last is not None:
            self.last_fetched = self._pending_last
            actions.append(Moved(self.source, self._pending_last))
            self._pending_last = None
        actions.append(Take(1))
        if not self._cursor_open:
            return [*actions, *self._close(), *self.start()]
        self.phase = Phase.APPLY
        return [*actions, *self._reports(carrying=True), AwaitApplied()]

    def _get_more(self) -> list[Action]:
        assert self.source is not None
        self.phase = Phase.GET_MORE
        return [*self._reports(awaiting=True), GetMore(self.source)]

    def _reports(self, *, carrying: bool | None = None, awaiting: bool | None = None) -> list[Action]:
        before = self.riding
        if carrying is not None:
            self.carrying_reports = carrying
        if awaiting is not None:
            self.awaiting_source = awaiting
        return [Riding(self.riding)] if self.riding != before else []

    def _close(self) -> list[Action]:
        """Leaves the session: the cursor released, reports no longer ride on the fetch."""
        assert self.source is not None
        actions: list[Action] = [CloseCursor(self.source)]
        self._pending_last = self._source_oldest = None
        return [*actions, *self._reports(carrying=False, awaiting=False)]
