"""The member runtime: wires storage, the log writer, cursors and replication state
to the event loop. A shell: it owns clocks, tasks and the database file; the
decisions it needs come from the pure modules (config, hello, election, quorum),
and the replication coordinator (`replset.replication`) runs heartbeats,
elections, the sync pipeline and write-concern waiting.

Lifecycle: `start()` opens the store, recovers the last optime, the term, the
last vote and the config, and resumes as SECONDARY (a one-voter set elects
itself at once) or waits for `replSetInitiate` or a heartbeat carrying a config.
Writes go through `submit_write` (group commit); waiters for new oplog entries and
for state changes are woken by events, never by polling timers.

    STARTUP --config--> SECONDARY <--election / stepdown--> PRIMARY
    STARTUP --config, no data--> STARTUP2 --initial sync (sync.initial_sync)--> SECONDARY
    SECONDARY --too stale everywhere--> RECOVERING --resync--> STARTUP2
    STARTUP | SECONDARY | PRIMARY --config without us--> REMOVED --config with us--> SECONDARY
"""

from __future__ import annotations

import asyncio
import collections
import datetime
import logging
import os
import random
import secrets
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import aiohttp
import bson
from bson.objectid import ObjectId
from bson.timestamp import Timestamp

from base.clock import SYSTEM_CLOCK, Clock
from base.config import ReplSetConfig, parse_config
from base.errors import MongoError
from base.hello import HelloView
from base.member import MemberState
from base.messages import HeartbeatRequest, heartbeat_request
from base.optime import NULL_OPTIME, OpTime
from base.scram import make_credentials
from base.votes import LastVote
from oplog.codec_options import DOC_OPTIONS
from oplog.entry import noop_entry
from oplog.expr_eval import install_random_source
from oplog.log_writer import LogWriter
from oplog.parts import shared_storage
from oplog.parts.block_size import DEFAULT_MAX_DECODED_BYTES
from oplog.parts.storage_url import redact_url
from oplog.sqlite_store import SQLiteStore, StoreTxn
from oplog.timeseries import BucketCatalog
from oplog.writes import WriteEnv
from replset.auth.keyfile import read_keyfile
from replset.auth.member_token import make_token
from replset.auth.users import INTERNAL_USER, USERS_NS, UserGrants
from replset.committed_snapshots import CommittedSnapshots
from replset.cursors import CursorRegistry
from replset.failpoints import FailPoints
from replset.group_commit import GroupCommitWriter
from replset.hops import Hops
from replset.local_sessions import MAX_SESSIONS, MAX_SESSIONS_PER_USER, LocalSessions
from replset.member_http import MemberHttp
from replset.metrics import Metrics
from replset.parts.manager import PartsManager
from replset.pulse import Pulse
from replset.query_pool import QueryPool
from replset.replication import Replication
from replset.snapshot_reads import SnapshotReads
from replset.status import StatusView
from replset.tls import TlsSettings
from replset.transactions import Transactions
from replset.ttl_monitor import TTLMonitor
from replset.write_concern import WriteConcern
from sync.initial_sync import INITIAL_SYNC_META
from sync.part_fetch import RequestAuth
from sync.peer import PeerClient, PeerError
from sync.rollback_runner import load_min_valid, load_rbid

T = TypeVar("T")
log = logging.getLogger(__name__)

CONFIG_NS = "local.system.replset"
TRIM_STEP_BYTES = 1024 * 1024
ELECTION_META = "election"


@dataclass(frozen=True, slots=True)
class NodeOptions:
    port: int
    repl_set: str = "rs0"
    dbpath: str = "./data/db"
    bind_ip: str = "127.0.0.1"
    oplog_size_mb: int = 1024
    enable_test_commands: bool = False
    http_port: int | None = None
    trace_sql: str | None = None
    auth: bool = False  # clients must authenticate (implied by a keyfile)
    key_file: str | None = None  # members authenticate to each other as __system with its key
    tls: TlsSettings = field(default_factory=TlsSettings)
    parts_storage: str | None = None  # the shared storage of zeroCopy tables' part files (a URL)
    max_decoded_block_bytes: int = DEFAULT_MAX_DECODED_BYTES  # an insert block decoded, at most (0: no limit)

    @property
    def me(self) -> str:
        first = self.bind_ip.split(",")[0].strip()
        host = "127.0.0.1" if first in ("0.0.0.0", "::", "*") else first
        return f"{host}:{self.port}".lower()

    @property
    def listen_hosts(self) -> list[str] | None:
        """The addresses both ports listen on: `--bind_ip`'s comma-separated list, or None (every
        interface, IPv4 and IPv6) for `--bind_ip_all` (`*`)."""
        hosts = [h.strip() for h in self.bind_ip.split(",") if h.strip()]
        return None if "*" in hosts else hosts

    @property
    def effective_http_port(self) -> int:
        """`--httpPort`, else port + 1000."""
        return self.http_port if self.http_port is not None else self.port + 1000

    @property
    def http_address(self) -> str:
        """Where this member's HTTP port answers (status, part files)."""
        return f"{self.me.rpartition(':')[0]}:{self.effective_http_port}"


class Node:
    def __init__(self, options: NodeOptions, clock: Clock | None = None) -> None:
        self.options = options
        self.clock: Clock = SYSTEM_CLOCK if clock is None else clock  # every clock read of the member
        self.started_at = self.clock.monotonic()
        self.store = SQLiteStore(options.dbpath, trace_path=options.trace_sql)
        self.rng = random.Random()
        install_random_source(random.Random().random)  # ($rand's draws)
        self.buckets = BucketCatalog()  # time-series buckets open for inserts, while primary
        self.cursors = CursorRegistry(self.rng)
        # reads whose cost grows with the data run here, not on the loop
        self.queries = QueryPool(clock=self.clock)
        self.config: ReplSetConfig | None = None
        self.log = LogWriter(NULL_OPTIME)
        self.last_committed_optime = NULL_OPTIME  # applied: committed, visible, not necessarily fsynced
        self.last_durable_optime = NULL_OPTIME  # fsynced (the journal flusher's last barrier)
        self._gossiped_cluster_time = Timestamp(0, 0)
        self._history_epoch = 0  # bumped when the oplog is cut back or dropped (rollback, initial sync)
        self.last_committed_wall = datetime.datetime.fromtimestamp(0, datetime.UTC)
        self.topology_process_id = ObjectId()
        self.topology_counter = 0
        self._state_changed = Pulse()
        self._oplog_advanced = Pulse()
        self.metrics = Metrics()
        self.hops = Hops(self.clock)  # `python -m bench.trace`: off unless REPLSET_TRACE_HOPS=1
        self.elections: collections.deque[dict[str, Any]] = collections.deque(maxlen=10)  # won here, newest last
        self.writer = GroupCommitWriter(self.store, self._on_commit, self._on_abort,
                                        position=self._flush_position, on_durable=self._on_durable,
                                        observe_batch=self.metrics.group_commit_batch.observe,
                                        observe_fsync=self.metrics.fsync.observe, clock=self.clock)
        self._connection_ids = 0
        self.shutting_down = False
        self._trimming = False
        self._trim_again = False
        self.max_oplog_bytes = options.oplog_size_mb * 1024 * 1024
        self.rbid = 0  # rollback id: bumped by every rollback (replSetGetRBID)
        self.failpoints = FailPoints()
        self.member_http = MemberHttp(options.me, options.effective_http_port)
        self._recovered_term = 0
        self._recovered_vote: LastVote | None = None
        self.repl = Replication(self)
        self.parts = PartsManager(self)
        self.transactions = Transactions(self)
        self.ttl = TTLMonitor(self)
        self.snapshot_reads = SnapshotReads(self)
        self.committed_snapshots = CommittedSnapshots(self.store, self.clock.monotonic)  # majority reads
        # (without access control every session is the one empty user's: its share is the whole)
        self.local_sessions = LocalSessions(MAX_SESSIONS_PER_USER if options.auth else MAX_SESSIONS)
        # What proves `__system@local` (the keyfile's key as its password), and that key for this
        # member's own connections to the others; None without a keyfile.
        self.internal_key = read_keyfile(options.key_file) if options.key_file else None
        self.internal_credentials = None if self.internal_key is None else make_credentials(
            INTERNAL_USER[0], self.internal_key)
        self.peer_tls = options.tls.client_context()  # None without TLS
        self.user_grants = UserGrants()  # what stored users' roles grant (cleared when they change)

    # -- lifecycle ---------------------------------------------------------------
    async def start(self) -> None:
        # What the last run committed may still sit in the page cache only (it was killed, or a
        # w:1 write was not yet flushed): make it durable before calling it durable.
        await asyncio.to_thread(self.store.sync_wal)
        if self.options.parts_storage is not None:
            problem = await asyncio.to_thread(shared_storage.for_url(self.options.parts_storage).probe)
            if problem is None:
                log.info("parts storage %s: usable", redact_url(self.options.parts_storage))
            else:
                log.warning("%s", problem)
        self.writer.start()
        self.ttl.start()
        self._recover_last_optime()
        if self.store.reader.meta(INITIAL_SYNC_META) is not None:
            self.log = LogWriter(NULL_OPTIME)  # an interrupted initial sync's partial copy is not data
            self.last_committed_optime = NULL_OPTIME
        self.last_durable_optime = self.last_committed_optime
        self.rbid = load_rbid(self)
        min_valid = load_min_valid(self)
        if min_valid is not None and self.last_committed_optime >= min_valid and self.repl.oplog_holds(min_valid):
            min_valid = None  # else a rollback finished but its source's entries (that very one) were not applied
        self.repl.recover(term=self._recovered_term, last_vote=self._recovered_vote, min_valid=min_valid)
        raw = self.store.reader.get(CONFIG_NS, self.options.repl_set)
        if raw is not None:
            self.config = parse_config(raw)
            me = self.config.member_by_host(self.options.me)
            if me is None:
                self.set_state(MemberState.REMOVED)
                return
            self.set_state(MemberState.ARBITER if me.arbiter_only else self.data_state())
            self.repl.start()
        self.parts.start()

    async def stop(self) -> None:
        self.shutting_down = True
        self.notify_state_change()
        await self.ttl.stop()
        self.transactions.abort_all("the member is shutting down")
        self.snapshot_reads.close_all()
        self.committed_snapshots.close_all()
        await self.parts.stop()
        await self.repl.stop()
        await self.writer.stop()
        self.queries.shutdown()
        self.store.close()

    def _recover_last_optime(self) -> None:
        newest = self.store.reader.oplog_newest_key()
        if newest is None:
            self._recover_election_meta()
            return
        blob = self.store.reader.oplog_entry(newest)
        assert blob is not None
        entry = bson.decode(blob, DOC_OPTIONS)
        last = OpTime.from_document(entry)
        self.log = LogWriter(last)
        self.last_committed_optime = last
        self.last_committed_wall = entry.get("wall", self.last_committed_wall)
        self._recover_election_meta()
        self._recovered_term = max(self._recovered_term, last.term)

    def _recover_election_meta(self) -> None:
        election = self.store.reader.meta(ELECTION_META)
        if not election:
            return
        self._recovered_term = max(self._recovered_term, int(election.get("term", 0)))
        vote = election.get("lastVote")
        if isinstance(vote, dict):
            self._recovered_vote = LastVote(int(vote["term"]), int(vote["candidateIndex"]))

    def next_connection_id(self) -> int:
        self._connection_ids += 1
        return self._connection_ids

    @property
    def connections_created(self) -> int:
        return self._connection_ids

    connections_open = 0

    def oplog_size_bytes(self) -> int:
        return self.store.oplog_totals[1]

    def oplog_count(self) -> int:
        return self.store.oplog_totals[0]

    # -- state (the replica core's: `replset.replica`) --------------------------------
    @property
    def state(self) -> MemberState:
        return self.repl.core.state

    @property
    def term(self) -> int:
        return self.repl.core.term

    @property
    def last_vote(self) -> LastVote | None:
        return self.repl.core.last_vote

    @property
    def min_valid(self) -> OpTime | None:
        """After a rollback: RECOVERING until applied up to here."""
        return self.repl.core.min_valid

    @min_valid.setter
    def min_valid(self, value: OpTime | None) -> None:
        self.repl.set_min_valid(value)

    @property
    def is_primary(self) -> bool:
        return self.state is MemberState.PRIMARY

    @property
    def primary_host(self) -> str | None:
        if self.is_primary:
            return self.options.me
        topology, config = self.repl.topology, self.config
        if topology is None or config is None:
            return None
        primary_id = topology.primary_id(self.state, self.term)
        member = config.member_by_id(primary_id) if primary_id is not None else None
        return member.host if member is not None else None

    def live_members(self) -> set[str]:
        """The hosts of the other members that answer heartbeats as primary or secondary."""
        topology = self.repl.topology
        if topology is None:
            return set()
        return {m.host for m in topology.members.values()
                if m.healthy and m.state in (MemberState.PRIMARY, MemberState.SECONDARY)}

    def answering_members(self) -> set[str]:
        """The hosts of the other members that answer heartbeats, whatever their state (one starting up or
        syncing is up: it fetches parts once it is a secondary)."""
        topology = self.repl.topology
        if topology is None:
            return set()
        return {m.host for m in topology.members.values() if m.healthy}

    def set_state(self, new: MemberState) -> None:
        """A transition the sync pipeline or the config drives; the replica core records it."""
        self.repl.enter_state(new)

    def on_state_changed(self, old: MemberState, new: MemberState) -> None:
        """The replica core changed our state."""
        self.writer.inline_fsync = new is not MemberState.PRIMARY  # see GroupCommitWriter._sync_wal
        log.info("member state %s -> %s", old.name, new.name)
        if old is MemberState.PRIMARY:
            self.transactions.abort_all("the member left PRIMARY")
        if old is MemberState.STARTUP2:
            # An initial sync cloned the data without an oplog of it: the part log's runner reloads.
            self.parts.on_history_replaced()
        self.notify_state_change()

    def now(self) -> datetime.datetime:
        return self.clock.wall()

    def notify_state_change(self) -> None:
        self.topology_counter += 1
        self._state_changed.fire()

    async def wait_for_state_change(self, counter: int, timeout_s: float) -> None:
        """Returns when the topology counter moves past `counter` or the timeout ends."""
        if self.topology_counter == counter:
            await self._state_changed.wait(timeout_s)

    def _on_commit(self) -> None:
        self.last_committed_optime = self.log.last
        self.hops.mark("commit", self.log.last.ts_key)
        if USERS_NS in self.store.last_changed:
            self.user_grants.clear()
        if self.last_durable_optime > self.last_committed_optime:
            self.last_durable_optime = self.last_committed_optime  # the log was cut back (rollback)
        self._oplog_advanced.fire()
        self.committed_snapshots.on_commit(self._history_epoch, self.majority_read_target)
        self.repl.on_local_commit()
        self.parts.on_commit(self.store.last_commit_rows)
        self._maybe_trim_oplog()

    # -- durability (the journal flusher in `replset.group_commit`) ------------------------------------

    def _flush_position(self) -> tuple[int, OpTime]:
        """Taken when a flush begins: everything committed up to here is durable once it ends."""
        return self._history_epoch, self.last_committed_optime

    def _on_durable(self, position: tuple[int, OpTime]) -> None:
        epoch, optime = position
        if epoch != self._history_epoch:
            return  # the flush began before a rollback or a resync replaced that history
        if optime > self.last_durable_optime:
            self.last_durable_optime = min(optime, self.last_committed_optime)
            self.hops.mark("durable", self.last_durable_optime.ts_key)
            self.repl.on_local_durable()
            self._maybe_trim_oplog()  # the commit point may have moved, and trimming waits for it

    def http_of(self, host: str) -> str | None:
        """The HTTP address of the member `host` of the current config (as it says in its heartbeats),
        or None: part files are fetched from members only (replset/member_http.py)."""
        config = self.config
        return None if config is None else self.member_http.address(host, (m.host for m in config.members))

    def peer(self, host: str) -> PeerClient:
        """A connection to another member (each user of one owns its own): with the test-only latency
        and route fail points, and, with a keyfile, authenticated as __system."""
        return PeerClient(host, latency_ms=self.failpoints.latency_ms, route=self.failpoints.peer_route,
                          internal_key=self.internal_key, tls=self.peer_tls)

    def http_session(self) -> aiohttp.ClientSession:
        """For fetching from the other members' HTTP ports: their certificates checked with TLS on (with a
        keyfile each request carries its own token: `member_auth`)."""
        connector = aiohttp.TCPConnector(ssl=self.peer_tls) if self.peer_tls is not None else None
        return aiohttp.ClientSession(connector=connector)

    def member_auth(self, audience: str) -> RequestAuth | None:
        """With a keyfile, what proves this member on a request to the member whose HTTP address (as the
        config names it, before any `peerRoutes`) is `audience`: a token for that method and path, made
        when the request is sent, with a nonce from `secrets` (replset/auth/member_token.py)."""
        key = self.internal_key
        if key is None:
            return None

        def headers(method: str, path: str) -> dict[str, str]:
            return {"Authorization": make_token(key, audience=audience, method=method, path=path,
                                                now_ms=self.clock.wall_ms(), nonce=secrets.token_hex(16))}
        return headers

    @property
    def http_scheme(self) -> str:
        return "https" if self.peer_tls is not None else "http"

    def request_flush(self) -> None:
        """A write waits for durability (`j: true`, `w: "majority"`, a secondary's applied batch)."""
        self.writer.request_flush()

    def on_history_replaced(self) -> None:
        """The oplog is being cut back (rollback) or dropped (initial sync), inside that transaction:
        a flush that began earlier proves nothing about the history that replaces it."""
        self._history_epoch += 1
        self.committed_snapshots.close_all()
        self.user_grants.clear()
        self.parts.on_history_replaced()
        self.last_durable_optime = min(self.last_durable_optime, self.log.last)

    def data_state(self) -> MemberState:
        """SECONDARY, or RECOVERING while a rollback's minValid is not reached (data not yet consistent),
        or STARTUP2 when an initial sync is needed (no oplog, or an interrupted initial sync)."""
        if self.needs_initial_sync():
            return MemberState.STARTUP2
        return MemberState.RECOVERING if self.min_valid is not None else MemberState.SECONDARY

    def needs_initial_sync(self) -> bool:
        reader = self.store.reader
        return reader.oplog_newest_key() is None or reader.meta(INITIAL_SYNC_META) is not None

    def on_data_dropped(self) -> None:
        """Initial sync dropped the data and the oplog (called inside that write transaction)."""
        self.log.last = NULL_OPTIME
        self.on_history_replaced()
        self.min_valid = None
        self.cursors.kill_all("the member is resyncing")

    def _on_abort(self) -> None:
        """A batch's transaction was rolled back: the log ends at the last committed entry again."""
        self.log.last = self.last_committed_optime

    def _maybe_trim_oplog(self) -> None:
        """Capped oplog: once over the limit, trim the oldest entries down to one step below it (90% of a
        small one) in the background (a request of its own in the group commit). As in MongoDB (4.4+), never
        past the majority commit point: the oplog grows past its size rather than delete entries a
        lagging majority member still has to fetch."""
        if self.oplog_size_bytes() <= self.max_oplog_bytes or self.shutting_down:
            return
        if self._trimming:
            self._trim_again = True  # the commit point may have moved past what the running trim saw
            return
        self._trimming, self._trim_again = True, False
        # A step below the size, not 10 % of it: a trim of 10 % of a 200 MB oplog deleted ~84,000 entries in
        # one episode and cost a third of the writes/s while it ran; a step's worth each time spreads the same
        # deletes evenly over the writes. (A small oplog still goes down to 90 %.)
        target = max(int(self.max_oplog_bytes * 0.9), self.max_oplog_bytes - TRIM_STEP_BYTES)

        async def trim() -> None:
            # In steps of TRIM_STEP_BYTES, each its own group-commit request: one request deleting
            # 10% of a 1 GB oplog would hold the event loop (heartbeats included) for seconds.
            try:
                while not self.shutting_down and (excess := self.oplog_size_bytes() - target) > 0:
                    keep_after = self.last_committed_optime.ts_key
                    if self.config is not None:
                        keep_after = min(keep_after, self.majority_commit_point.ts_key)
                    step = min(excess, TRIM_STEP_BYTES)
                    removed, _bytes = await self.writer.submit(
                        lambda txn, step=step, keep_after=keep_after: txn.trim_oplog(step, keep_after),
                        durable=False)
                    if not removed:
                        break  # held back by the commit point: the next commit or flush tries again
            except MongoError:
                log.warning("oplog trim failed", exc_info=True)
            finally:
                self._trimming = False
                if self._trim_again:
                    self._maybe_trim_oplog()

        self._trim_task = asyncio.get_running_loop().create_task(trim())

    async def wait_for_oplog(self, after_ts_key: int, timeout_s: float) -> None:
        """Returns once an entry newer than `after_ts_key` is committed, or at the timeout."""
        if self.last_committed_optime.ts_key <= after_ts_key:
            await self._oplog_advanced.wait(timeout_s)

    def hello_view(self, connection_id: int) -> HelloView:
        last = self.last_committed_optime
        wall = self._optime_date(last)
        majority = self.majority_commit_point
        return HelloView(
            me=self.options.me, set_name=self.options.repl_set, config=self.config, state=self.state,
            term=self.term, primary=self.primary_host, last_write=last, last_write_date=wall,
            majority_write=majority, majority_write_date=self._optime_date(majority),
            topology_process_id=self.topology_process_id, topology_counter=self.topology_counter,
            connection_id=connection_id, now=self.now(),
        )

    @staticmethod
    def _optime_date(optime: OpTime) -> datetime.datetime:
        return datetime.datetime.fromtimestamp(optime.secs, datetime.UTC)

    @property
    def majority_commit_point(self) -> OpTime:
        return self.repl.commit_point

    def oplog_window_s(self) -> int | None:
        """Seconds between the oldest entry of the oplog and the newest this member applied."""
        oldest = self.store.reader.oplog_oldest_key()
        newest = self.last_committed_optime
        return None if oldest is None or not newest.secs else max(0, newest.secs - (oldest >> 32))

    @property
    def majority_read_target(self) -> OpTime:
        """What a majority read must see at least: the commit point, or all this member applied when
        it lags behind the commit point it knows (as mongod's committed snapshot)."""
        return min(self.repl.commit_point, self.last_committed_optime)

    @property
    def history_epoch(self) -> int:
        """Moves whenever a rollback or a resync replaces entries this member had."""
        return self._history_epoch

    def gossip_cluster_time(self, ts: Timestamp) -> None:
        """A cluster time a client or member sent (`$clusterTime`): replies carry the newest seen."""
        self._gossiped_cluster_time = max(self._gossiped_cluster_time, ts)

    @property
    def cluster_time(self) -> Timestamp:
        """The newest cluster time this member knows: its applied optime or a newer one gossiped."""
        return max(self.last_committed_optime.ts, self._gossiped_cluster_time)

    # -- writes ---------------------------------------------------------------------
    async def submit_write(self, fn: Callable[[WriteEnv], T], *, require_primary: bool = True,
                           durable: bool = True, flush: bool = False, off_loop: bool = False) -> T:
        """Runs a write through the log writer in the next group commit. Client writes pass
        `durable=False`: their write concern decides whether they wait for the journal."""
        if self.shutting_down:
            raise MongoError(91, "The server is in quiesce mode and will shut down")

        def run(txn: StoreTxn) -> T:
            if require_primary and not self.is_primary:
                raise MongoError(10107, "not primary")
            last = self.log.last
            try:
                return fn(WriteEnv(txn=txn, log=self.log, term=self.term, now=self.now()))
            except BaseException:
                self.log.last = last  # its savepoint is rolled back, so are the optimes it took
                raise

        return await self.writer.submit(run, durable=durable, flush=flush, off_loop=off_loop)

    def write_concern_error(self, wc: WriteConcern) -> MongoError | None:
        return self.repl.write_concern_error(wc)

    async def wait_for_write_concern(self, wc: WriteConcern, optime: OpTime) -> MongoError | None:
        """Waits until the write at `optime` satisfies `wc`; returns a writeConcernError or None."""
        started = self.clock.monotonic()
        try:
            return await self.repl.wait_for_write_concern(wc, optime)
        finally:
            self.metrics.write_concern_wait.labels(str(wc.w)).observe(self.clock.monotonic() - started)

    # -- replica-set configuration ----------------------------------------------------
    async def initiate(self, raw: dict[str, Any] | None) -> None:
        if self.config is not None:
            raise MongoError(23, "already initialized")
        if not raw:
            raw = {"_id": self.options.repl_set, "members": [{"_id": 0, "host": self.options.me}]}
        config = parse_config(raw, default_term=1)
        if config.name != self.options.repl_set:
            raise MongoError(93, f"Rejecting initiate with a set name that differs from command line "
                                 f"set name, initiate set name: {config.name}, command line set name: "
                                 f"{self.options.repl_set}")
        if config.member_by_host(self.options.me) is None:
            raise MongoError(93, f"No host described in new configuration with {{version: {config.version}, "
                                 f"term: {config.term}}} for replica set {config.name} maps to this node")
        await self._check_initiate_quorum(config)
        if self.config is not None:
            raise MongoError(23, "already initialized")
        doc = config.to_document()

        def write(env: WriteEnv) -> None:
            env.txn.insert(CONFIG_NS, doc)
            env.term = -1  # the set has no elected term yet, as in MongoDB
            env.emit(noop_entry("initiating set"))

        await self.submit_write(write, require_primary=False)
        self.config = config
        self.set_state(MemberState.SECONDARY)
        self.repl.start(initiator=True)

    async def _check_initiate_quorum(self, config: ReplSetConfig) -> None:
        """Every other member must answer, uninitiated and in the same set, before we commit to a config."""
        others = [m for m in config.members if m.host != self.options.me]
        req = HeartbeatRequest(config.name, -2, -1, "", -1, 0)  # no sender: they need not fetch anything yet

        async def probe(host: str) -> str | None:
            client = self.peer(host)
            try:
                reply = await client.command(heartbeat_request(req), timeout_s=5.0)
            except PeerError as exc:
                return f"{host} failed with {exc}"
            finally:
                client.close()
            if reply.get("ok") or reply.get("code") != 94:
                return f"{host} is already initialized or in another set ({reply.get('errmsg', 'ok')})"
            return None

        problems = [p for p in await asyncio.gather(*(probe(m.host) for m in others)) if p]
        if problems:
            raise MongoError(74, "replSetInitiate quorum check failed because not all proposed set members "
                                 "responded affirmatively: " + "; ".join(problems))

    async def store_config(self, config: ReplSetConfig) -> None:
        doc = config.to_document()

        def write(env: WriteEnv) -> None:
            if env.txn.get(CONFIG_NS, config.name) is None:
                env.txn.insert(CONFIG_NS, doc)
            else:
                env.txn.replace(CONFIG_NS, doc)

        await self.submit_write(write, require_primary=False)

    async def persist_election(self, current: Callable[[], tuple[int, LastVote | None]]) -> None:
        """Durably records the term and the last vote as `current()` gives them inside the transaction
        (fsynced before anyone relies on them)."""
        def write(txn: StoreTxn) -> None:
            term, last_vote = current()
            meta: dict[str, Any] = {"term": term}
            if last_vote is not None:
                meta["lastVote"] = {"term": last_vote.term, "candidateIndex": last_vote.candidate_id}
            txn.set_meta(ELECTION_META, meta)

        await self.writer.submit(write)

    async def write_new_primary_noop(self, term: int, may_write: Callable[[int], bool]) -> None:
        """Writes the "new primary" no-op in `term`, if `may_write(term)` still holds in its transaction."""
        def write(env: WriteEnv) -> None:
            if not may_write(term):
                raise MongoError(189, f"term changed to {self.term} before becoming primary in {term}")
            env.term = term
            env.emit(noop_entry("new primary"))

        await self.submit_write(write, require_primary=False)

    def status_view(self) -> StatusView:
        assert self.config is not None
        last = self.last_committed_optime
        voters = self.config.voters
        repl = self.repl
        source = repl.sync_source_host
        source_member = self.config.member_by_host(source) if source else None
        return StatusView(
            set_name=self.config.name, now=self.now(), state=self.state, term=self.term,
            sync_source_host=source, sync_source_id=source_member.id if source_member else -1,
            heartbeat_interval_ms=self.config.settings.heartbeat_interval_ms,
            majority_vote_count=self.config.majority_vote_count,
            write_majority_count=self.config.write_majority_count, voting_members=len(voters),
            writable_voting_members=sum(1 for m in voters if m.data_bearing),
            commit_point=self.majority_commit_point, applied=last, durable=self.last_durable_optime,
            members=repl.member_views(), extra=repl.status_extra(),
        )

    def uptime_s(self) -> float:
        return self.clock.monotonic() - self.started_at

    def pid(self) -> int:
        return os.getpid()
