"""Initial sync and resync for one member: when to run `InitialSyncer`, and what to do
when steady-state replication cannot go on because the member is too stale.

A shell, owned by the replication coordinator (`replset.replication`), which calls:

* `start_initial_sync()` when the member is in STARTUP2 (no data, or an initial
  sync was interrupted: see `SyncHost.data_state`); on success the member goes
  SECONDARY and steady-state replication starts.
* `on_too_stale(verdict)` from the fetcher when a source no longer holds our last
  entry, and `on_applied()` whenever a batch was applied. The pure
  `sync.too_stale.TooStaleTracker` decides; once every reachable source is too
  far ahead the member goes RECOVERING, explains why in `infoMessage`, and resyncs
  after the tracker's bounded delay unless replication resumed meanwhile.
* `resync(reason)` for the `resync` command and that automatic case: stop the
  fetcher, STARTUP2, copy the database file (if the member had data) to
  `<dbpath>/rollback/resync-<UTC time>/` with SQLite's online backup
  (`sync.initial_sync.save_data_aside`), then initial sync. Nothing that might
  hold writes is dropped without that copy; a crash before the initial-sync flag
  is set leaves the old data in place.

`status_fields()` gives `initialSyncStatus` while an initial sync runs and for
`STATUS_KEEP_S` after it ends (MongoDB: "while in STARTUP2"; the final figures
stay readable a little longer).
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

from base.clock import Clock
from base.errors import MongoError
from base.member import MemberState
from sync.initial_sync import INITIAL_SYNC_META, InitialSyncer, save_data_aside
from sync.initial_sync_progress import initial_sync_status
from sync.too_stale import StaleVerdict, TooStaleTracker, resync_delay_ms

if TYPE_CHECKING:
    from sync.host import SyncHost

log = logging.getLogger(__name__)

STATUS_KEEP_S = 60.0
UP_STATES = (MemberState.PRIMARY, MemberState.SECONDARY)


class ResyncCoordinator:
    def __init__(self, node: SyncHost, *, clock: Clock | None = None) -> None:
        self.node = node
        self.clock = node.clock if clock is None else clock
        self.syncer: InitialSyncer | None = None
        self.tracker = TooStaleTracker()
        self._finished: tuple[dict[str, Any], float] | None = None
        self._timer: asyncio.Task[None] | None = None
        self._done = asyncio.Event()

    @property
    def sync_source(self) -> str:
        return (self.syncer.sync_source or "") if self.syncer is not None else ""

    # -- initial sync -------------------------------------------------------------------------------

    def start_initial_sync(self, *, data_saved: bool = False) -> None:
        if self.syncer is not None or self.node.state is not MemberState.STARTUP2:
            return
        interrupted = self.node.store.reader.meta(INITIAL_SYNC_META) is not None
        log.info("initial sync: %s", "an interrupted initial sync starts over" if interrupted
                 else "this member has no data")
        self.tracker.clear()
        self._done.clear()
        self.syncer = InitialSyncer(self.node, self._on_initial_sync_done, data_saved=data_saved)
        self.syncer.start()

    def _on_initial_sync_done(self) -> None:
        syncer, self.syncer = self.syncer, None
        node = self.node
        if syncer is not None:
            self._finished = (initial_sync_status(syncer.progress, node.now()), self.clock.monotonic())
        if node.state is MemberState.STARTUP2:
            node.set_state(node.data_state())
            node.repl.start_steady_state()
        self._done.set()

    async def wait_done(self) -> None:
        await self._done.wait()

    async def stop(self) -> None:
        if self._timer is not None and self._timer is not asyncio.current_task():
            self._timer.cancel()
        self._timer = None
        syncer, self.syncer = self.syncer, None
        if syncer is not None:
            await syncer.stop()

    def status_fields(self) -> dict[str, Any]:
        if self.syncer is not None:
            return {"initialSyncStatus": initial_sync_status(self.syncer.progress, self.node.now())}
        if self._finished is not None and self.clock.monotonic() - self._finished[1] < STATUS_KEEP_S:
            return {"initialSyncStatus": self._finished[0]}
        return {}

    # -- too stale ----------------------------------------------------------------------------------

    def reachable_sources(self) -> list[str]:
        """Members we could sync from now: healthy PRIMARY/SECONDARY data-bearing members but us."""
        repl, node = self.node.repl, self.node
        if repl.topology is None or node.config is None:
            return []
        hosts = []
        for m in node.config.members:
            data = repl.topology.members.get(m.id)
            if m.host != node.options.me and not m.arbiter_only and data is not None and data.healthy \
                    and data.state in UP_STATES:
                hosts.append(m.host)
        return hosts

    def on_too_stale(self, verdict: StaleVerdict) -> None:
        node = self.node
        self.tracker.record(verdict)
        delay = resync_delay_ms(node.repl.election_timeout_base_ms)
        if not self.tracker.maybe_schedule(self.reachable_sources(), self.clock.monotonic_ms(), delay):
            return
        log.warning("%s", self.tracker.message(self.clock.monotonic_ms()))
        if node.state is MemberState.SECONDARY:
            node.set_state(MemberState.RECOVERING)
        self._timer = asyncio.get_running_loop().create_task(self._resync_when_due(), name="stale-resync")

    def on_applied(self) -> None:
        """A batch was applied: a member that was too stale found a source after all."""
        node = self.node
        if not self.tracker.stale:
            return
        log.info("replication resumed: no longer too stale")
        self.tracker.clear()
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if node.state is MemberState.RECOVERING and node.min_valid is None:
            node.set_state(MemberState.SECONDARY)

    def info_message(self) -> str:
        return self.tracker.message(self.clock.monotonic_ms())

    async def _resync_when_due(self) -> None:
        tracker = self.tracker
        clock = self.clock
        while tracker.resync_due_ms is not None and not tracker.resync_due(clock.monotonic_ms()):
            await asyncio.sleep((tracker.resync_due_ms - clock.monotonic_ms()) / 1000)  # a deadline, re-checked
        if not tracker.stale:
            return
        try:
            await self.resync("too stale to catch up from any member")
        except MongoError as exc:
            log.error("automatic resync failed: %s", exc)

    # -- resync -------------------------------------------------------------------------------------

    async def resync(self, reason: str) -> str | None:
        """Drops this member's data and initial-syncs; returns where the old data was copied."""
        node = self.node
        if node.is_primary:
            raise MongoError(95, "primaries cannot resync")
        if self.syncer is not None or node.state is MemberState.STARTUP2:
            return None  # already syncing from scratch
        if node.state not in (MemberState.SECONDARY, MemberState.RECOVERING):
            raise MongoError(95, f"cannot resync in state {node.state.name}")
        log.warning("resync: %s", reason)
        previous = node.state
        node.set_state(MemberState.STARTUP2)  # first: no election may start while the fetcher stops
        await self.stop()
        self.tracker.clear()
        await node.repl.stop_steady_state()
        try:
            backup = await save_data_aside(node)
        except OSError as exc:
            node.set_state(previous)
            node.repl.start_steady_state()
            raise MongoError(1, f"resync: could not copy the current data aside, nothing dropped: {exc}") from exc
        self.start_initial_sync(data_saved=True)
        return backup
