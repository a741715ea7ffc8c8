"""What the replication shells ask of the member they run in: narrow interfaces.

The fetcher and applier (`sync.worker`), a rollback (`sync.rollback_runner`),
initial sync (`sync.initial_sync`) and resync (`sync.resync`) run inside a
member (`replset.node.Node`, whose replication pump is `replset.replication`),
but `sync` sits below `replset` and never imports it: each shell is typed
against the members of these protocols it uses, and the member satisfies them
structurally. What a shell may touch is listed here, in one place.
"""

from __future__ import annotations

import asyncio
import datetime
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Protocol, TypeVar

from base.clock import Clock
from base.config import MemberConfig
from base.member import MemberState
from base.messages import ReplMetadata
from base.optime import OpTime
from oplog.log_writer import LogWriter
from oplog.sqlite_store import SQLiteStore, StoreTxn
from sync.peer import PeerClient
from sync.rollback_flow import RollbackRun
from sync.too_stale import StaleVerdict

T = TypeVar("T")


class Failpoints(Protocol):
    """Test-only fail points and injected latency/routes for member-to-member connections."""

    def is_on(self, name: str) -> bool: ...
    def latency_ms(self, host: str) -> float: ...
    def peer_route(self, host: str) -> str: ...


class Observer(Protocol):
    def observe(self, amount: float) -> None: ...


class SyncMetrics(Protocol):
    """The member's event series the replication shells observe (`replset.metrics.Metrics`)."""

    @property
    def apply_batch(self) -> Observer: ...
    @property
    def fetch_batch(self) -> Observer: ...


class Writer(Protocol):
    """The group-commit writer: `fn` runs inside the next storage transaction."""

    def submit(self, fn: Callable[[StoreTxn], T], *, durable: bool = True, flush: bool = False,
               off_loop: bool = False) -> Awaitable[T]: ...

    def commit_now(self, fn: Callable[[StoreTxn], T], *, flush: bool = False) -> asyncio.Future[T] | None: ...


class Signal(Protocol):
    """Fires when something changed (the topology): waiters wake, or time out."""

    def wait(self, timeout_s: float) -> Awaitable[Any]: ...


class Members(Protocol):
    """What heartbeats say of the other members (`replset.topology.Topology`)."""

    @property
    def members(self) -> dict[int, Any]: ...


class TooStaleHandler(Protocol):
    def on_too_stale(self, verdict: StaleVerdict) -> None: ...


class SetConfig(Protocol):
    @property
    def members(self) -> Sequence[MemberConfig]: ...


class Options(Protocol):
    @property
    def dbpath(self) -> str | None: ...
    @property
    def me(self) -> str: ...


class Replication(Protocol):
    """The member's replication pump, as the fetcher, a rollback and initial sync use it."""

    @property
    def commit_point(self) -> OpTime: ...
    @property
    def await_data_ms(self) -> int: ...
    @property
    def heartbeat_timeout_s(self) -> float: ...
    @property
    def election_timeout_base_ms(self) -> int: ...
    @property
    def topology(self) -> Members | None: ...
    topology_changed: Signal
    resync: TooStaleHandler

    def choose_sync_source(self, last_fetched: OpTime) -> str | None: ...
    def on_fetched(self) -> None: ...
    def source_applied(self, host: str) -> OpTime | None: ...
    def primary_seen(self) -> bool: ...
    def deny(self, host: str, for_ms: int) -> None: ...
    def rollback_started(self) -> None: ...
    def rollback_ended(self, run: RollbackRun) -> None: ...
    def reports_ride_on_fetch(self, riding: bool) -> None: ...
    def fetch_position_report(self) -> dict[str, Any] | None: ...
    def flush_pending(self) -> bool: ...
    def durable_moved(self, timeout_s: float) -> Awaitable[None]: ...
    def on_sync_source_metadata(self, meta: ReplMetadata) -> None: ...
    def start_steady_state(self) -> None: ...
    def stop_steady_state(self) -> Awaitable[None]: ...


class HopMarks(Protocol):
    """`replset.hops.Hops`: a timestamp per hop of the write path, for `python -m bench.trace`."""

    def mark(self, hop: str, ts_key: int) -> None: ...


class SyncHost(Protocol):
    """The member, as the replication shells see it."""

    repl: Replication
    clock: Clock
    store: SQLiteStore
    log: LogWriter
    writer: Writer
    failpoints: Failpoints
    metrics: SyncMetrics
    hops: HopMarks
    options: Options
    rbid: int
    shutting_down: bool
    last_committed_optime: OpTime
    last_durable_optime: OpTime

    @property
    def config(self) -> SetConfig | None: ...
    @property
    def term(self) -> int: ...
    @property
    def state(self) -> MemberState: ...
    @property
    def is_primary(self) -> bool: ...
    @property
    def min_valid(self) -> OpTime | None: ...
    @min_valid.setter
    def min_valid(self, value: OpTime | None) -> None: ...

    def set_state(self, new: MemberState) -> None: ...
    def peer(self, host: str) -> PeerClient: ...
    def data_state(self) -> MemberState: ...
    def now(self) -> datetime.datetime: ...
    def request_flush(self) -> None: ...
    def on_history_replaced(self) -> None: ...
    def on_data_dropped(self) -> None: ...
