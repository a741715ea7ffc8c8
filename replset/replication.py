"""The replication shell: carries the replica core's decisions to sockets, storage and tasks.

Every decision - terms and votes, elections, member state, the commit point,
heartbeats and position reports, write-concern waiters, the sync source - is
made by `replset.replica.Replica`, the same core the deterministic simulator
(`tests/sim`) drives. This module is its pump for the asyncio member:

    a request or reply, a commit, a flush, a timer --event(now)--> Replica
    Replica --actions--> `_carry_out`: persist the term and vote through the group
        commit, send heartbeats / vote requests / position reports, answer a vote,
        start or stop the sync worker, write the "new primary" no-op, wake waiters

`_ticker` calls `Replica.tick` at the core's next deadline (woken early when a
step makes that deadline earlier). Actions that finish later report back:
`persisted`, `reply` / `call_failed`, `noop_written`, `sync_drained`,
`min_valid_checked`. The clock is read here and nowhere in the core.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any

import bson

from base.clock import Clock
from base.config import ReplSetConfig, parse_config
from base.errors import MongoError
from base.member import MemberState
from base.messages import (
    HeartbeatRequest,
    ReplMetadata,
    heartbeat_request,
    parse_heartbeat_request,
    repl_metadata,
)
from base.optime import OpTime
from oplog.sqlite_store import StoreTxn
from replset import actions as act
from replset import events as ev
from replset.election import config_is_older
from replset.member_http import HTTP_PORT_FIELD
from replset.parts.registry import HELD_FIELD
from replset.pulse import Pulse
from replset.replica import NEVER, NoConfig, Replica
from replset.status import MemberView
from replset.topology import Topology
from replset.write_concern import WriteConcern, check_satisfiable
from sync.peer import PeerClient, PeerError
from sync.resync import ResyncCoordinator
from sync.rollback_flow import RollbackRun
from sync.rollback_runner import MIN_VALID_META, REFETCHED_META
from sync.worker import SyncWorker

if TYPE_CHECKING:
    from replset.node import Node

log = logging.getLogger(__name__)

STOP_TIMEOUT_S = 5.0
PERSIST_RETRY_MAX_S = 5.0  # the longest pause between two tries to persist the term and vote
# A secondary's report waits this long at most for the journal flush that follows an applied batch, so
# one report usually carries both positions instead of two reports a batch (fsync here: ~0.5 ms).


class Replication:
    def __init__(self, node: Node, *, clock: Clock | None = None) -> None:
        self.node = node
        self.clock = node.clock if clock is None else clock
        self.core = Replica(me=node.options.me, config=None, state=MemberState.STARTUP, term=0, last_vote=None,
                            applied=node.last_committed_optime, durable=node.last_durable_optime, min_valid=None,
                            rng=node.rng, now=self.clock.monotonic_ms())
        self.topology_changed = Pulse()
        self.worker: SyncWorker | None = None
        self.resync = ResyncCoordinator(node)  # initial sync (STARTUP2), too stale, resync
        self._positions_moved = Pulse()
        self._durable_moved = Pulse()
        self._stepped = Pulse()  # fired after every step of the core (a candidacy may have ended)
        self._wake = Pulse()
        self._sleeping_until = 0
        self._tasks: set[asyncio.Task[Any]] = set()
        self._ticker_task: asyncio.Task[None] | None = None
        self._clients: dict[tuple[str, act.CallKind], PeerClient] = {}
        self._worker_lock = asyncio.Lock()
        self._config_fetches: set[str] = set()
        self._config_lock = asyncio.Lock()
        self._stopped = False

    # -- settings -------------------------------------------------------------------------------------

    @property
    def config(self) -> ReplSetConfig:
        assert self.node.config is not None
        return self.node.config

    @property
    def topology(self) -> Topology | None:
        return self.core.topology

    @property
    def commit_point(self) -> OpTime:
        return self.core.commit_point

    @property
    def stepped(self) -> Pulse:
        """Fired after every step of the core: the commit point, positions or state may have moved."""
        return self._stepped

    @property
    def election_date(self) -> datetime.datetime | None:
        return self.core.election_date

    @property
    def election_timeout_base_ms(self) -> int:
        return self.core.election_timeout_base

    @property
    def heartbeat_timeout_s(self) -> float:
        return self.core.heartbeat_timeout_ms / 1000

    @property
    def await_data_ms(self) -> int:
        return self.core.await_data_ms

    # -- pumping the core -----------------------------------------------------------------------------

    def _step(self, event: ev.Event) -> None:
        """Hands `event` to the core at the clock's current reading and carries out what it asks for (also
        when the core refuses it: what it decided before the refusal is carried out, then the error goes on)."""
        try:
            actions = self.core.step(self.clock.monotonic_ms(), event)
        except Exception:
            self._carry_out()
            raise
        self._carry_out(actions)

    def _ask(self, event: Callable[[asyncio.Future[Any]], ev.Event]) -> Any:
        """Steps a request the core answers at once (`Answer` to the future it is given); returns the answer."""
        answer: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._step(event(answer))
        return answer.result()

    def _carry_out(self, first: list[act.Action] | None = None) -> None:
        core = self.core
        actions = first or core.take_actions()
        while actions:
            for action in actions:
                try:
                    self._do(action)
                except Exception:  # one failed action must not drop the ones after it
                    log.exception("carrying out %r failed", action)
            actions = core.take_actions()
        self._stepped.fire()
        if core.next_deadline() < self._sleeping_until:
            self._wake.fire()

    def _do(self, action: act.Action) -> None:
        match action:
            case act.Send():
                self._spawn(self._send(action))
            case act.Persist(term=term, token=token):
                self._spawn(self._persist(term, token))
            case act.Answer(reply_to=future, body=body):
                assert isinstance(future, asyncio.Future)
                if not future.done():
                    future.set_result(body)
            case act.StateChanged(old=old, new=new):
                self.node.on_state_changed(old, new)
                if new is MemberState.REMOVED:
                    self._spawn(self.resync.stop())  # an initial sync of a member no longer in the set
            case act.StartFetching():
                self._spawn(self._start_worker())
            case act.StopFetching(drain=drain):
                self._spawn(self._stop_worker_for_core(drain))
            case act.ChangeSyncSource(reason=reason):
                if self.worker is not None:
                    log.info("changing sync source: %s", reason)
                    self.worker.request_change()
            case act.WriteNoop(term=term):
                self._spawn(self._write_noop(term))
            case act.Wake(waiter=future, error=error):
                assert isinstance(future, asyncio.Future)
                if not future.done():
                    future.set_result(error)
            case act.Flush():
                self.node.request_flush()
            case act.AdoptConfig(document=document):
                self._spawn(self._adopt_config(document))
            case act.CheckMinValid(optime=optime):
                held = self.oplog_holds(optime)
                if held:
                    log.info("reached minValid %s: data consistent again", optime)
                self._step(ev.MinValidChecked(optime, held))
            case act.ForgetMinValid(optime=optime):
                self._spawn(self._forget_min_valid(optime))
            case act.Resync(reason=reason):
                log.error("%s: resyncing", reason)
                self._spawn(self._resync(reason))
            case act.CloseOplogCursors(reason=reason):
                self.node.cursors.kill_all(reason)
            case act.TopologyChanged():
                self.topology_changed.fire()
            case act.PositionsMoved():
                self._positions_moved.fire()
            case act.TermRefused(term=term, source=source):
                log.error("refused term %d from %s: beyond the largest term a member may hold", term, source)
            case _:
                raise TypeError(f"unknown action {action!r}")

    async def _ticker(self) -> None:
        while True:
            deadline = self.core.next_deadline()
            now = self.clock.monotonic_ms()
            if deadline > now:
                self._sleeping_until = deadline
                await self._wake.wait(min((deadline - now) / 1000, 3600.0))
                self._sleeping_until = 0
                continue
            try:
                self._step(ev.Tick())
            except Exception:  # a bug here must not stop every timer of the member
                log.exception("replication tick failed")
                await asyncio.sleep(0.1)

    def _spawn(self, coro: Coroutine[Any, Any, Any]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # -- carrying out actions -------------------------------------------------------------------------

    def _client(self, host: str, kind: act.CallKind) -> PeerClient:
        client = self._clients.get((host, kind))
        if client is None:
            client = self.node.peer(host)
            self._clients[(host, kind)] = client
        return client

    async def _send(self, send: act.Send) -> None:
        member = self.config.member_by_id(send.to) if self.node.config is not None else None
        if member is None:
            self._step(ev.CallFailed(send.call, why="not in the config"))
            return
        # A vote request gets a connection of its own: an abandoned round's request must not hold up the next.
        own = send.kind is act.CallKind.VOTE
        client = self.node.peer(member.host) if own else self._client(member.host, send.kind)
        try:
            body = send.body
            if send.kind is act.CallKind.POSITIONS:
                body = self._with_holdings(body)
                self.node.hops.mark("report", self.node.last_durable_optime.ts_key)
            raw = await client.command(body, timeout_s=send.timeout_ms / 1000)
        except (PeerError, MongoError) as exc:
            refused = isinstance(exc, PeerError) and exc.refused
            if send.kind is act.CallKind.HEARTBEAT:
                log.debug("heartbeat to %s failed: %s", member.host, exc)
            self._step(ev.CallFailed(send.call, refused=refused, why=str(exc)))
        else:
            if send.kind is act.CallKind.HEARTBEAT:
                self.node.member_http.learn(member.host, raw.get(HTTP_PORT_FIELD))
            try:
                self._step(ev.Replied(send.call, raw))
            except Exception as exc:  # a malformed reply must not leave the call open for good
                log.exception("%s reply from %s could not be used", send.kind.value, member.host)
                self._step(ev.CallFailed(send.call, why=f"malformed reply: {exc}"))
        finally:
            if own:
                client.close()
        self._carry_out()

    async def _persist(self, term: int, token: int) -> None:
        """Persists the core's term and vote *as they are when the write runs*: a retry, or a write
        queued behind a newer decision, never puts an older term or vote back on disk. A failure is
        retried with a growing pause; its traceback is logged once, then a line at each doubling."""
        failures = 0
        while True:
            try:
                await self.node.persist_election(lambda: (self.core.term, self.core.last_vote))
                break
            except Exception as exc:  # a storage error: retried, the answer waits (never announced before)
                if self._stopped or self.node.shutting_down:
                    return  # a restart recovers the last durable term and vote
                failures += 1
                if failures == 1:
                    log.exception("persisting term %d failed; retrying", term)
                elif failures & (failures - 1) == 0:
                    log.error("persisting term %d failed %d times, still retrying: %s", term, failures, exc)
                await asyncio.sleep(min(0.1 * 2 ** min(failures - 1, 6), PERSIST_RETRY_MAX_S))
        self._step(ev.Persisted(token))

    async def _start_worker(self) -> None:
        async with self._worker_lock:
            if self.worker is None and self.core.fetching and not self._stopped:
                self.worker = SyncWorker(self.node)
                self.worker.start()

    async def _stop_worker(self, *, drain: bool) -> bool:
        async with self._worker_lock:
            worker, self.worker = self.worker, None
            if worker is None:
                return True
            return await worker.stop(drain=drain)

    async def _stop_worker_for_core(self, drain: bool) -> None:
        drained = await self._stop_worker(drain=drain)
        if drain:
            self._step(ev.SyncDrained(drained))

    async def _write_noop(self, term: int) -> None:
        try:
            await self.node.write_new_primary_noop(term, self.core.may_write_noop)
            ok = True
        except MongoError as exc:
            log.warning("could not become primary in term %d: %s", term, exc)
            ok = False
        except Exception:  # the candidacy must hear back whatever happened
            log.exception("writing the new primary entry of term %d failed", term)
            ok = False
        self._step(ev.NoopWritten(term, ok, self.node.now()))
        if self.node.is_primary:
            log.info("became primary in term %d", term)
            self.node.metrics.elections.inc()
            self.node.elections.append({"term": term, "primary": self.node.options.me,
                                        "at": self.node.now().isoformat(timespec="seconds")})
        self._carry_out()

    async def _forget_min_valid(self, optime: OpTime) -> None:
        def write(txn: StoreTxn) -> None:
            if txn.meta(MIN_VALID_META) == optime.to_document():  # not a newer rollback's
                txn.delete_meta(MIN_VALID_META)
                txn.delete_meta(REFETCHED_META)

        try:
            await self.node.writer.submit(write)
        except MongoError as exc:  # kept: a restart then checks it against our oplog again
            log.warning("could not drop the reached minValid %s: %s", optime, exc)

    def oplog_holds(self, optime: OpTime) -> bool:
        """Whether our oplog holds that very entry (its timestamp with its term)."""
        blob = self.node.store.reader.oplog_entry(optime.ts_key)
        return blob is not None and OpTime.from_document(bson.decode(blob)) == optime

    async def _resync(self, reason: str) -> None:
        try:
            await self.resync.resync(reason)
        except MongoError as exc:
            log.error("resync failed: %s", exc)

    # -- lifecycle ------------------------------------------------------------------------------------

    def recover(self, *, term: int, last_vote: Any, min_valid: OpTime | None) -> None:
        """What `Node.start` read back from disk."""
        self._step(ev.Recovered(term, last_vote, min_valid, self.node.last_committed_optime,
                                self.node.last_durable_optime))

    def enter_state(self, state: MemberState) -> None:
        self._step(ev.EnterState(state))

    def start(self, *, initiator: bool = False) -> None:
        """Begins replication under `node.config`, which must name this member."""
        node = self.node
        actions = self.core.step(self.clock.monotonic_ms(), ev.Started(
            initiator, config=node.config, applied=node.last_committed_optime, durable=node.last_durable_optime))
        if self._ticker_task is None:
            self._ticker_task = asyncio.get_running_loop().create_task(self._ticker(), name="replication-timer")
        self._carry_out(actions)
        self._maybe_start_initial_sync()

    def _maybe_start_initial_sync(self) -> None:
        if self.node.state is MemberState.STARTUP2:
            self.resync.start_initial_sync()

    async def stop(self) -> None:
        self._stopped = True
        tasks = [*self._tasks, *([self._ticker_task] if self._ticker_task else [])]
        for task in tasks:
            task.cancel()
        if tasks:
            # Bounded: a task that swallowed its cancellation must not keep the member alive.
            await asyncio.wait(tasks, timeout=STOP_TIMEOUT_S)
        self._tasks, self._ticker_task = set(), None
        await self.resync.stop()
        await self._stop_worker(drain=False)
        self._step(ev.ShutDown())
        for client in self._clients.values():
            client.close()
        self._clients = {}

    # -- configs --------------------------------------------------------------------------------------

    async def install_config(self, config: ReplSetConfig) -> None:
        """Adopts a newer config (from a heartbeat or a reconfig): persist, then act on it."""
        async with self._config_lock:  # two heartbeats may bring configs at once; the newest wins
            node = self.node
            current = node.config
            if current is not None and not config_is_older(current.version, current.term,
                                                           config.version, config.term):
                return
            await node.store_config(config)
            node.config = config
            log.info("installed config version %d term %d", config.version, config.term)
            if self.core.topology is None and config.member_by_host(node.options.me) is not None:
                # Not replicating yet (STARTUP or REMOVED): take a state, then start.
                me = config.member_by_host(node.options.me)
                assert me is not None
                self.enter_state(MemberState.ARBITER if me.arbiter_only else node.data_state())
                self.start()
            else:
                self._step(ev.ConfigInstalled(config, node.data_state()))
                self._carry_out()
                self._maybe_start_initial_sync()
            node.notify_state_change()

    async def _adopt_config(self, document: dict[str, Any]) -> None:
        try:
            await self.install_config(parse_config(document))
        except MongoError as exc:
            log.warning("a heartbeat brought a config we cannot use: %s", exc)

    def schedule_config_fetch(self, host: str) -> None:
        """An uninitiated member was heartbeated by `host`: ask it for its config."""
        if host in self._config_fetches or not host:
            return
        self._config_fetches.add(host)

        async def fetch() -> None:
            client = self.node.peer(host)
            try:
                req = HeartbeatRequest(self.node.options.repl_set, -2, -1, self.node.options.me, -1, self.node.term)
                reply = await client.command(heartbeat_request(req), timeout_s=5.0)
                raw = reply.get("config")
                if reply.get("ok") and isinstance(raw, dict):
                    config = parse_config(raw)
                    if config.name == self.node.options.repl_set:
                        await self.install_config(config)
            except (PeerError, MongoError) as exc:
                log.info("could not fetch the config from %s: %s", host, exc)
            finally:
                client.close()
                self._config_fetches.discard(host)

        self._spawn(fetch())

    # -- requests from other members ------------------------------------------------------------------

    def on_heartbeat_request(self, cmd: dict[str, Any]) -> dict[str, Any]:
        try:
            reply = dict(self._ask(lambda answer: ev.HeartbeatIn(cmd, answer)))
        except NoConfig:
            req = parse_heartbeat_request(cmd)
            if req.set_name == self.node.options.repl_set:
                self.schedule_config_fetch(req.sender_host)
            raise
        reply[HTTP_PORT_FIELD] = self.node.options.effective_http_port  # where our part files are served
        return reply

    async def on_vote_request(self, cmd: dict[str, Any]) -> dict[str, Any]:
        answer: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._step(ev.VoteRequestIn(cmd, answer))
        return await answer

    def on_update_position(self, cmd: dict[str, Any]) -> dict[str, Any]:
        reply: dict[str, Any] = self._ask(lambda answer: ev.PositionsIn(cmd, answer))
        self.node.hops.mark("commit_pt", self.core.commit_point.ts_key)
        if HELD_FIELD in cmd:
            self.node.parts.on_held_report(cmd[HELD_FIELD])
        return reply

    def holdings_changed(self) -> None:
        """The part log has "has part" acknowledgements to send upstream (`replset.parts.registry`)."""
        self._step(ev.HoldingsChanged())

    def _with_holdings(self, report: dict[str, Any]) -> dict[str, Any]:
        held = self.node.parts.held_report()
        return report | {HELD_FIELD: held} if held else report

    def on_sync_source_metadata(self, meta: ReplMetadata) -> None:
        self._step(ev.SourceMetadata(meta))

    def metadata_document(self) -> dict[str, Any]:
        config = self.node.config
        return repl_metadata(self.core.metadata(), config.version if config else -2, config.term if config else -1)

    # -- our own progress -----------------------------------------------------------------------------

    def on_local_commit(self) -> None:
        """Our applied optime moved (a primary write or an applied batch, committed, maybe not fsynced)."""
        node = self.node
        actions = self.core.step(self.clock.monotonic_ms(), ev.LocalCommit(node.last_committed_optime))
        if not node.is_primary and self.core.configured:
            self.resync.on_applied()
        self._carry_out(actions)

    def on_local_durable(self) -> None:
        """The journal flusher made our entries durable up to `node.last_durable_optime`."""
        self._durable_moved.fire()
        self._step(ev.LocalDurable(self.node.last_durable_optime))

    def set_min_valid(self, optime: OpTime | None) -> None:
        """A rollback recorded its minValid (or an initial sync dropped the data: None)."""
        self._step(ev.MinValidSet(optime))

    def reports_ride_on_fetch(self, riding: bool) -> None:
        """The fetcher's next getMore will carry our new positions (it is between a batch and its next
        getMore): then no separate replSetUpdatePosition is needed for them."""
        self._step(ev.FetchCarriesReports(riding))

    def fetch_position_report(self) -> dict[str, Any] | None:
        """Our positions and those reported to us, for the fetcher's next getMore (`POSITIONS_FIELD`)."""
        report: dict[str, Any] = self._ask(ev.PositionsWanted)
        return self._with_holdings(report) if report else None

    def flush_pending(self) -> bool:
        """A journal flush under way or due will make our applied entries durable soon."""
        node = self.node
        return node.last_durable_optime < node.last_committed_optime and node.writer.flush_pending

    async def durable_moved(self, timeout_s: float) -> None:
        """Waits (at most `timeout_s`) for our durable position to move."""
        if self.flush_pending():
            await self._durable_moved.wait(timeout_s)

    # -- write concern ----------------------------------------------------------------------------------

    def write_concern_error(self, wc: WriteConcern) -> MongoError | None:
        return check_satisfiable(wc, self.node.config)

    async def wait_for_write_concern(self, wc: WriteConcern, target: OpTime) -> MongoError | None:
        """Waits until the write at `target` satisfies `wc`; returns a writeConcernError or None."""
        decided = self.core.write_concern_problem(wc, target)
        if decided is True:
            return None
        if isinstance(decided, MongoError):
            return decided
        waiter: asyncio.Future[MongoError | None] = asyncio.get_running_loop().create_future()
        self._step(ev.AwaitWriteConcern(waiter, wc, target))
        try:
            error = await waiter
            self.node.hops.mark("acked", target.ts_key)
            return error
        finally:
            if not waiter.done():
                self._step(ev.GiveUpWaiting(waiter))

    async def wait_for_positions(self, timeout_s: float) -> None:
        """Returns when a member's position moved or a heartbeat updated the view, or at the timeout."""
        waits = [asyncio.ensure_future(self._positions_moved.wait(timeout_s)),
                 asyncio.ensure_future(self.topology_changed.wait(timeout_s))]
        _done, pending = await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        for task in pending:
            task.cancel()

    # -- the sync source ------------------------------------------------------------------------------

    @property
    def sync_source_host(self) -> str:
        worker = self.worker
        return worker.sync_source or "" if worker is not None else self.resync.sync_source

    def choose_sync_source(self, last_fetched: OpTime) -> str | None:
        return self.core.choose_sync_source(self.clock.monotonic_ms(), last_fetched)

    def on_fetched(self) -> None:
        """The fetcher's source or its last fetched entry changed."""
        worker = self.worker
        source = self.sync_source_host or None
        last = worker.last_fetched if worker is not None else self.core.last_fetched
        self._step(ev.FetcherMoved(source, last))

    def source_applied(self, host: str) -> OpTime | None:
        return self.core.member_applied(host)

    def primary_seen(self) -> bool:
        """Whether we see a primary of our term or newer (a rollback's source must be on its branch)."""
        return self.core.primary_id() is not None

    def rollback_started(self) -> None:
        self._step(ev.RollbackStarted())

    def rollback_ended(self, run: RollbackRun) -> None:
        self._step(ev.RollbackEnded(run))

    def deny(self, host: str, for_ms: int) -> None:
        self._step(ev.Deny(host, for_ms))

    def sync_from(self, host: str) -> str:
        """`replSetSyncFrom`: returns the previous sync source."""
        return str(self._ask(lambda answer: ev.SyncFromAsked(host, answer))["prevSyncTarget"])

    def start_steady_state(self) -> None:
        """An initial sync ended (or a resync was abandoned): fetch and apply from our last entry."""
        self._step(ev.InitialSyncEnded())
        self.node.notify_state_change()

    async def stop_steady_state(self) -> None:
        """A resync is about to drop the data: stop fetching and applying."""
        self._step(ev.ResyncBegan())
        await self._stop_worker(drain=False)  # done here, before the data goes

    # -- admin ------------------------------------------------------------------------------------------

    async def step_down(self, step_down_secs: float, catch_up_secs: float, force: bool) -> None:
        node, topology = self.node, self.core.topology
        if not node.is_primary or topology is None:
            raise MongoError(10107, "not primary so can't step down")
        deadline = self.clock.monotonic() + catch_up_secs
        target = topology.caught_up_electable(node.last_committed_optime)
        while target is None and self.clock.monotonic() < deadline:
            await self.wait_for_positions(max(deadline - self.clock.monotonic(), 0.0))
            target = topology.caught_up_electable(node.last_committed_optime)
        if target is None and not force:
            raise MongoError(262, "No electable secondaries caught up as of now. Please use the "
                                  "{force: true} option if you really want to step down.")
        log.info("stepping down: replSetStepDown")
        self._step(ev.StepDownAsked(int(step_down_secs * 1000), "replSetStepDown"))
        if target is not None:
            self._spawn(self._hand_off(target))

    async def _hand_off(self, host: str) -> None:
        """Election handoff: ask a caught-up secondary to stand at once, without a dry run."""
        client = self.node.peer(host)
        try:
            await client.command({"replSetStepUp": 1, "skipDryRun": True, "$db": "admin"},
                                 timeout_s=self.heartbeat_timeout_s)
        except PeerError as exc:
            log.info("election handoff to %s failed: %s", host, exc)
        finally:
            client.close()

    async def run_election(self, reason: str, *, skip_dry_run: bool = False) -> bool:
        """`replSetStepUp`: stand now; True when this member became primary."""
        core = self.core
        started = self._ask(lambda answer: ev.StepUpAsked(skip_dry_run, answer))["started"]
        if not started:
            return False
        candidacy = core.candidacy
        # Every phase has a deadline of its own in the core; this bound only guards against a shell bug.
        config = self.node.config
        catch_up_ms = config.settings.catch_up_timeout_ms if config is not None else 0
        bound_ms = 3 * core.election_timeout_base + max(catch_up_ms, 0) + 70_000
        deadline = self.clock.monotonic() + bound_ms / 1000
        while core.candidacy is candidacy and candidacy is not None and self.clock.monotonic() < deadline:
            await self._stepped.wait(deadline - self.clock.monotonic())
        return self.node.is_primary

    def freeze(self, secs: float) -> str:
        return str(self._ask(lambda answer: ev.FreezeAsked(secs, answer))["info"])

    # -- status -----------------------------------------------------------------------------------------

    def member_views(self) -> tuple[MemberView, ...]:
        node, config, core = self.node, self.config, self.core
        topology = core.topology
        now, wall = self.clock.monotonic_ms(), node.now()

        def ago(ms: int | None) -> datetime.datetime | None:
            return None if ms is None else wall - datetime.timedelta(milliseconds=now - ms)

        views = []
        for m in config.members:
            data = topology.members.get(m.id) if topology is not None else None
            if m.host == node.options.me or data is None:
                views.append(MemberView(
                    id=m.id, name=m.host, is_self=m.host == node.options.me, health=True, state=node.state,
                    optime=node.last_committed_optime, durable_optime=node.last_durable_optime,
                    sync_source_host=self.sync_source_host, sync_source_id=self._member_id_or(self.sync_source_host),
                    uptime_s=int(node.uptime_s()), config_version=config.version, config_term=config.term,
                    election_date=core.election_date if node.is_primary else None,
                    info_message=self._info_message() if m.host == node.options.me else ""))
                continue
            ping = data.ping.value_ms
            views.append(MemberView(
                id=m.id, name=m.host, is_self=False, health=data.healthy,
                state=data.state if data.healthy else MemberState.DOWN, optime=data.applied,
                durable_optime=data.durable, sync_source_host=data.sync_source,
                sync_source_id=self._member_id_or(data.sync_source),
                ping_ms=None if ping is None else round(ping), last_heartbeat=ago(data.last_heartbeat_ms),
                last_heartbeat_recv=ago(data.last_heartbeat_recv_ms), last_heartbeat_message=data.message,
                election_date=data.election_date if data.state is MemberState.PRIMARY else None,
                config_version=data.config_version, config_term=data.config_term))
        return tuple(views)

    def _member_id_or(self, host: str) -> int:
        member_id = self.core.member_id_of(host)
        return -1 if member_id is None else member_id

    def status_extra(self) -> dict[str, Any]:
        extra: dict[str, Any] = {}
        core = self.core
        if self.node.is_primary and core.election_date is not None:
            extra["electionCandidateMetrics"] = {
                "lastElectionReason": core.last_election_reason, "lastElectionDate": core.election_date,
                "electionTerm": core.primary_term, "numVotesNeeded": self.config.majority_vote_count,
                "electionTimeoutMillis": core.election_timeout_base,
            }
        if self._info_message():
            extra["infoMessage"] = self._info_message()
        extra.update(self.resync.status_fields())
        return extra

    def _info_message(self) -> str:
        return self.resync.info_message() or (self.worker.message if self.worker is not None else "")


__all__ = ["NEVER", "Replication"]
