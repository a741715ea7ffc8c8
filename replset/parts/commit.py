"""Committing an insert's blocks from any member: on the primary itself, or sent to it.

Theory of operation
-------------------
ClickHouse accepts an insert on every replica: the data stays where it was
written, and only the part-log commit goes to Keeper. Here the primary is the
Keeper. A member that is not primary writes the blocks as temporary parts on
its own disk, sends `_partsCommit` (the blocks' ids, sizes and checksums, never
their rows) to the primary over a member connection, and publishes its
temporary parts under the names the primary's reply gives them. The log
documents say this member is the part's source, so every other member fetches
from it.

The primary may change, or a reply may be lost, while a commit is under way:
the commit is retried (tenacity, backing off, until `COMMIT_DEADLINE_S`)
against whichever member is primary then. Each insert carries one `attempt`
id for all its tries; a block whose log document has the same attempt was
committed by an earlier try, so the reply still says "inserted" for it, never
"deduplicated" by itself.

A commit whose outcome is unknown (the primary committed, but its reply was
lost and every retry failed) keeps its temporary parts: the log may name this
member as the source of parts that nobody else has. When the log arrives here,
the part-log runner publishes the temporary part whose checksums are the ones
the log recorded (`replset.parts.runtime.adopt_temporary`); parts that no log
names after `IN_DOUBT_KEEP_S` are removed. The client gets a retryable error
labelled `RetryableWriteError` (`in_doubt_error`: HostUnreachable, 6, or
PrimarySteppedDown, 189, when this member was the primary and stepped down;
503 over HTTP): sending the insert again with the same dedup token is safe. It
never gets a bare NotWritablePrimary for a commit that may have happened. A
crash of this member between the primary's commit and the publish leaves a
temporary part too: start-up publishes it the same way.

Quorum inserts (`insertQuorum` above 1) are bounded, as ClickHouse's are:

* refused at once, before a block is written, when the quorum is larger than
  the data-bearing members this one sees alive through heartbeats (this member
  and `Node.answering_members`: up, in any state): UnsatisfiableWriteConcern
  (100), "too few live replicas" - ClickHouse's TOO_FEW_LIVE_REPLICAS;
* the commit (every try, and the primary's wait for the write concern) and the
  quorum wait share one deadline, `quorumTimeoutMS` from the start of the
  commit, in place of `COMMIT_DEADLINE_S`. The write concern sent with a
  commit carries a wtimeout within what is left, so the primary answers in
  time. A commit the write concern did not confirm by then (wtimeout) was made
  on the primary but may still be rolled back: the client gets the retryable
  error, not `quorumStatus: "pending"`, which only a confirmed commit gets.
"""

from __future__ import annotations

import asyncio
import dataclasses
import uuid
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import pyarrow as pa
from tenacity import AsyncRetrying, retry_if_exception, stop_after_delay, wait_exponential_jitter

from base.clock import Clock
from base.errors import RETRYABLE_CODES, MongoError
from base.member import MemberState
from base.optime import OpTime
from oplog.writes import WriteEnv
from replset.parts.insert import (
    Block,
    commit_blocks,
    discard_temporary,
    load_table,
    prepare_blocks,
    publish_blocks,
)
from replset.parts.names import table_dir
from replset.parts.registry import PENDING, REACHED
from replset.write_concern import MAJORITY, WriteConcern, write_concern_error_field
from sync.peer import PeerClient, PeerError

if TYPE_CHECKING:
    from base.config import ReplSetConfig
    from replset.node import Node

QUORUM_TIMEOUT_MS = 600_000   # ClickHouse's insert_quorum_timeout
BAD_VALUE = 2
UNSATISFIABLE = 100
NETWORK_TIMEOUT = 89
COMMIT_DEADLINE_S = 60.0   # every try of one commit, the primary's wait for its write concern included
MIN_TRY_S = 5.0
IN_DOUBT_KEEP_S = 600.0   # an unsettled commit's temporary parts wait this long for the log to name them
HOST_UNREACHABLE = 6
MAX_TIME_EXPIRED = 50
VISIBLE_HERE_S = 60.0   # an acknowledged insert's parts become active here within this, or it is an error
WRITE_CONCERN_FAILED = 64
PRIMARY_STEPPED_DOWN = 189
NO_PRIMARY = 10107
NOT_PRIMARY_OR_SECONDARY = 13436
NOT_PRIMARY_CODES = frozenset({NO_PRIMARY, 13435, NOT_PRIMARY_OR_SECONDARY})
RETRYABLE_WRITE_ERROR = "RetryableWriteError"
QUORUM_TRY_MIN_S = 0.1    # a quorum commit's try starts only with this much of its deadline left
FORWARD_MARGIN_S = 0.25   # a sent commit's wtimeout ends this long before the sender stops waiting
HANG_AFTER_COMMIT = "partsHangAfterCommit"
REPLY_LOST = "partsCommitReplyLost"
FAIL_POINT_POLL_S = 0.05


def parse_quorum(raw: Any, config: ReplSetConfig | None) -> int:
    """`insertQuorum`: 0 or 1 (no wait), N members, or "majority" of the data-bearing voters."""
    data_bearing = sum(1 for m in config.members if m.data_bearing) if config is not None else 1
    if raw == MAJORITY:
        return config.write_majority_count if config is not None else 1
    if isinstance(raw, (str, bool)) or not isinstance(raw, (int, float)) or int(raw) != raw or raw < 0:
        raise MongoError(BAD_VALUE, f'insertQuorum must be a non-negative integer or "majority", not {raw!r}')
    if int(raw) > data_bearing:
        raise MongoError(UNSATISFIABLE, f"insertQuorum {int(raw)} asks for more replicas than the set has "
                                        f"({data_bearing} hold data): the insert was not made")
    return int(raw)


def live_replicas(config: ReplSetConfig | None, me: str, live: set[str]) -> list[str]:
    """This member and the data-bearing members it sees alive (`Node.answering_members`: their heartbeats
    answer, whatever their state - ClickHouse's active replicas: up, not necessarily caught up)."""
    if config is None:
        return [me]
    return sorted({m.host for m in config.members if m.data_bearing and m.host in live} | {me})


def check_live_quorum(node: Node, quorum: int) -> None:
    """ClickHouse's TOO_FEW_LIVE_REPLICAS: a quorum this member cannot see enough live replicas for is
    refused before anything is written (UnsatisfiableWriteConcern, 100, as mongod answers a `w` above
    the number of members; not labelled retryable: the same insert fails again until members return)."""
    if quorum <= 1:
        return
    live = live_replicas(node.config, node.options.me, node.answering_members())
    if quorum > len(live):
        raise MongoError(UNSATISFIABLE, f"too few live replicas: insertQuorum {quorum}, and this member sees "
                                        f"{len(live)} live data-bearing member(s) ({', '.join(live)}): nothing "
                                        "was written now (an earlier try of this insert with the same "
                                        "dedupToken, if any, may have been committed: send it again once "
                                        "enough replicas are live)",
                         extra={"errInfo": {"insertQuorum": quorum, "liveReplicas": live}})


def new_attempt() -> str:
    return uuid.uuid4().hex


class CommitNotConfirmed(MongoError):
    """A quorum insert's commit was made on the primary but its write concern was not met within the
    insert's deadline: it may still be rolled back. Not tried again (the deadline is spent, and a
    retry that finds its own blocks cannot confirm them)."""


def _retryable(exc: BaseException) -> bool:
    if isinstance(exc, CommitNotConfirmed):
        return False
    return isinstance(exc, PeerError) or (isinstance(exc, MongoError) and exc.code in RETRYABLE_CODES)


def _left_s(deadline: float, clock: Clock) -> float:
    return deadline - clock.monotonic()


def bounded_write_concern(wc: WriteConcern, deadline: float | None, margin_s: float = 0.0, *,
                          clock: Clock) -> WriteConcern:
    """`wc` with a wtimeout no longer than what is left before `deadline` (on `clock`'s monotonic
    seconds), less `margin_s` (never 0: that is "wait forever")."""
    if deadline is None:
        return wc
    left_ms = max(1, int((_left_s(deadline, clock) - margin_s) * 1000))
    wtimeout_ms = left_ms if wc.wtimeout_ms <= 0 else min(wc.wtimeout_ms, left_ms)
    return dataclasses.replace(wc, wtimeout_ms=wtimeout_ms)


async def commit_here(node: Node, wc: WriteConcern, body: Callable[[WriteEnv], dict[str, Any]], *,
                      off_loop: bool = False) -> dict[str, Any]:
    """Runs `body` as one write on this member (the primary) and waits for `wc`; a write concern
    failure is the reply's `writeConcernError`, as MongoDB's write commands answer. `off_loop`: the
    body scans a state collection (its cost grows with the table)."""
    def fn(env: WriteEnv) -> tuple[dict[str, Any], OpTime | None]:
        reply = body(env)
        last = env.last_entry
        return reply, OpTime.from_document(last) if last and "ts" in last else None

    reply, optime = await node.submit_write(fn, durable=False, off_loop=off_loop)
    wce = await node.wait_for_write_concern(wc, optime or node.last_committed_optime)
    if wce is not None:
        reply["writeConcernError"] = write_concern_error_field(wce)
    while node.failpoints.is_on(HANG_AFTER_COMMIT):
        await asyncio.sleep(FAIL_POINT_POLL_S)   # test-only: nothing to wait on but the operator
    return reply


def primary_body(db: str, name: str, blocks: list[Block], *, source: str, http: str, attempt: str,
                 quorum: int, dedup_token: str | None, directory: str | None, clock: Clock,
                 publishing: Callable[[list[str]], None] | None = None,
                 published: Callable[[list[str]], None] | None = None) -> Callable[[WriteEnv], dict[str, Any]]:
    """The primary's transaction; `directory` is set when the blocks' temporary parts are on this member
    (published inside the transaction, before it commits, `publishing` told their names first and
    `published` after)."""
    def body(env: WriteEnv) -> dict[str, Any]:
        fresh = commit_blocks(env, db=db, table=load_table(env.txn, db, name), blocks=blocks, source=source,
                              http=http, attempt=attempt, quorum=quorum, dedup_token=dedup_token)
        if directory is not None:
            mine = [b for b in fresh if b.tmp_name]
            if publishing is not None:
                publishing([b.part for b in mine])
            publish_blocks(directory, mine, clock=clock)
            if published is not None:
                published([b.part for b in mine])
        return {"blocks": [{"blockId": b.block_id, "part": b.part, "deduplicated": b.deduplicated}
                           for b in blocks], "ok": 1.0}
    return body


class PrimaryLink:
    """The member connection an insert on a secondary sends its commit over (one per primary host)."""

    def __init__(self, node: Node, *, clock: Clock | None = None) -> None:
        self.node = node
        self.clock = node.clock if clock is None else clock
        self._clients: dict[str, PeerClient] = {}
        self._lock = asyncio.Lock()

    def close(self) -> None:
        for client in self._clients.values():
            client.close()
        self._clients.clear()

    def _client(self, host: str) -> PeerClient:
        client = self._clients.get(host)
        if client is None:
            client = self._clients[host] = self.node.peer(host)
        return client

    def _deadline_s(self) -> float:
        lost = self.node.failpoints.peek(REPLY_LOST)
        return float(lost.data.get("deadlineMS", COMMIT_DEADLINE_S * 1000)) / 1000 if lost else COMMIT_DEADLINE_S

    def _retrying(self, deadline: float | None = None) -> AsyncRetrying:
        """Tries until the deadline (`COMMIT_DEADLINE_S`, or the monotonic `deadline` a quorum insert
        gives), backing off, while the failure is one a change of primary explains."""
        node = self.node
        retry = retry_if_exception(lambda exc: _retryable(exc) and not node.shutting_down)
        backoff = wait_exponential_jitter(initial=0.05, max=1.0)
        if deadline is None:
            return AsyncRetrying(retry=retry, stop=stop_after_delay(self._deadline_s()), wait=backoff,
                                 reraise=True)
        last_start = deadline - QUORUM_TRY_MIN_S   # no try starts later, no backoff sleeps past it
        clock = self.clock
        return AsyncRetrying(retry=retry, stop=lambda _state: clock.monotonic() >= last_start,
                             wait=lambda state: min(backoff(state), max(0.0, last_start - clock.monotonic())),
                             reraise=True)

    def _try_timeout(self, started: float, deadline: float | None = None) -> float:
        """One try's share: what is left of the commit's deadline (never less than `MIN_TRY_S`, or than
        `QUORUM_TRY_MIN_S` before a quorum insert's own deadline), so that all tries together stay near
        the deadline."""
        if deadline is not None:
            return max(QUORUM_TRY_MIN_S, _left_s(deadline, self.clock))
        return max(MIN_TRY_S, self._deadline_s() - (self.clock.monotonic() - started))

    async def on_primary(self, db: str, cmd: dict[str, Any],
                         here: Callable[[], Awaitable[dict[str, Any]]]) -> dict[str, Any]:
        """Runs a part-log command where the primary is: `here()` when this member is primary, else `cmd`
        sent to the primary over a member connection - retried across a change of primary, so `cmd`
        must be safe to repeat (it carries an attempt id)."""
        reply: dict[str, Any] = {}
        started = self.clock.monotonic()
        try:
            async for attempt_state in self._retrying():
                with attempt_state:
                    reply = (await here() if self.node.is_primary
                             else await self._send(db, cmd, self._try_timeout(started)))
        except PeerError as exc:   # the primary never answered: whether it ran the command is unknown
            raise MongoError(NETWORK_TIMEOUT, f"the primary did not answer {next(iter(cmd))} in time; it may or "
                                              f"may not have run it ({exc})") from exc
        return reply

    async def ask(self, host: str, db: str, cmd: dict[str, Any], timeout_s: float) -> dict[str, Any]:
        """`cmd` run on member `host` (a read: `partsMutations`, say); PeerError or MongoError if it fails."""
        reply = await self._client(host).command({**cmd, "$db": db}, timeout_s=timeout_s)
        if not reply.get("ok"):
            raise MongoError(int(reply.get("code", 8)), str(reply.get("errmsg", f"failed on {host}")))
        return dict(reply)

    async def _send(self, db: str, cmd: dict[str, Any], timeout_s: float) -> dict[str, Any]:
        host = self.node.primary_host
        if host is None or host == self.node.options.me:
            raise MongoError(NO_PRIMARY, "no primary is known to run the command")
        return await self.ask(host, db, cmd, timeout_s)

    async def commit(self, db: str, name: str, blocks: list[Block], directory: str, *, wc: WriteConcern,
                     attempt: str, quorum: int, dedup_token: str | None,
                     deadline: float | None = None) -> dict[str, Any]:
        """Commits `blocks` through whichever member is primary, retrying across a change of primary;
        publishes the temporary parts written here under their committed names. `deadline` (monotonic
        seconds; a quorum insert's) bounds every try and the primary's wait for `wc`."""
        reply: dict[str, Any] = {}
        started = self.clock.monotonic()
        async for attempt_state in self._retrying(deadline):
            with attempt_state:
                reply = await self._commit_once(db, name, blocks, directory, wc=wc, attempt=attempt,
                                                quorum=quorum, dedup_token=dedup_token, deadline=deadline,
                                                timeout_s=self._try_timeout(started, deadline))
        return reply

    async def _commit_once(self, db: str, name: str, blocks: list[Block], directory: str, *, wc: WriteConcern,
                           attempt: str, quorum: int, dedup_token: str | None, deadline: float | None,
                           timeout_s: float) -> dict[str, Any]:
        node = self.node
        me, http = node.options.me, node.options.http_address
        ns = f"{db}.{name}"
        if node.is_primary:
            # Off the loop: a commit of many blocks checks, numbers and renames each one.
            bounded = bounded_write_concern(wc, deadline, clock=self.clock)
            reply = await commit_here(node, bounded, primary_body(
                db, name, blocks, source=me, http=http, attempt=attempt, quorum=quorum,
                dedup_token=dedup_token, directory=directory, clock=self.clock,
                publishing=lambda parts: node.parts.inserting(ns, parts),
                published=lambda parts: node.parts.published(ns, parts)), off_loop=True)
            _raise_if_may_roll_back(reply.get("writeConcernError"))
            if deadline is not None:
                _raise_if_unconfirmed(reply.get("writeConcernError"))
            return reply
        # The primary's wait for the write concern ends a little before this member stops waiting for
        # its reply, so that a commit it made is reported as such, not as a lost reply.
        margin_s = min(FORWARD_MARGIN_S, timeout_s / 4)
        body: dict[str, Any] = {
            "_partsCommit": name, "blocks": [b.to_wire() for b in blocks], "source": me,
            "attempt": attempt, "quorum": quorum,
            "writeConcern": bounded_write_concern(wc, deadline, margin_s, clock=self.clock).to_document()}
        if dedup_token is not None:
            body["dedupToken"] = dedup_token
        reply = await self._send(db, body, timeout_s)
        if self.node.failpoints.check(REPLY_LOST):
            raise PeerError(f"the reply of {node.primary_host} to _partsCommit was lost (fail point)")
        wce = reply.get("writeConcernError")
        _raise_if_may_roll_back(wce)
        if deadline is not None:
            _raise_if_unconfirmed(wce)   # before publishing: the log, if it keeps the commit, names them
        committed = {str(b["blockId"]): b for b in reply.get("blocks", [])}
        for block in blocks:
            done = committed.get(block.block_id)
            if done is None:
                raise MongoError(8, f"_partsCommit answered without block {block.block_id}")
            block.part, block.deduplicated = str(done["part"]), bool(done["deduplicated"])
        fresh = [b for b in blocks if not b.deduplicated]
        node.parts.inserting(ns, [b.part for b in fresh])
        await asyncio.to_thread(publish_blocks, directory, fresh, clock=self.clock)
        await asyncio.to_thread(node.parts.published, ns, [b.part for b in fresh])
        return {"ok": 1.0} | ({"writeConcernError": wce} if isinstance(wce, dict) else {})


def _raise_if_may_roll_back(wce: Any) -> None:
    """Committed on a primary that lost its role before the write concern was met: the commit may be
    rolled back. A retry (same attempt) finds it on the new primary or commits it again."""
    if isinstance(wce, dict) and wce.get("code") in RETRYABLE_CODES:
        raise MongoError(int(wce["code"]), str(wce.get("errmsg", "")))


def _raise_if_unconfirmed(wce: Any) -> None:
    """A quorum insert's commit whose write concern timed out: made on the primary, not confirmed."""
    if isinstance(wce, dict) and wce.get("code") == WRITE_CONCERN_FAILED:
        raise CommitNotConfirmed(HOST_UNREACHABLE, "the primary committed it, but its write concern was not met "
                                                   "within quorumTimeoutMS, so it may yet be rolled back: "
                                                   f"{wce.get('errmsg')}")


def outcome_unknown(exc: BaseException) -> bool:
    """The commit may have happened: a reply lost, a try cut short, a primary gone mid-commit. Only a
    primary's own refusal (a non-retryable code) proves that nothing was committed."""
    return not isinstance(exc, MongoError) or exc.code in RETRYABLE_CODES


def check_takes_inserts(node: Node) -> None:
    """A member syncing from scratch, rolling back or recovering would be the parts' only source while its
    own table directory may be replaced: it takes no inserts (as a mongod takes no reads then), and says
    so before it looks at the table or the rows (its catalog may be anything meanwhile)."""
    if node.state not in (MemberState.PRIMARY, MemberState.SECONDARY):
        raise MongoError(NOT_PRIMARY_OR_SECONDARY, f"this member is {node.state.name}: an insert needs a "
                                                   "primary or a secondary")


async def insert_rows(node: Node, db: str, name: str, data: pa.Table, *, wc: WriteConcern, dedup_token: str | None,
                      quorum: int, quorum_timeout_ms: int) -> dict[str, Any]:
    """The `insertBlock` command's work, on any member: write the blocks here, commit them through the
    primary, then (`quorum` > 1) wait until that many members hold each new part. A quorum insert
    is refused at once when too few replicas are alive, and its commit and quorum wait end within
    `quorum_timeout_ms` (see the module doc)."""
    check_takes_inserts(node)
    table = load_table(node.store.reader, db, name)
    check_live_quorum(node, quorum)   # before a block is written
    directory = table_dir(node.options.dbpath, table.ns)
    blocks = await asyncio.to_thread(prepare_blocks, directory, table, data, dedup_token, node.options.parts_storage)
    was_primary = node.is_primary
    deadline: float | None = None
    try:
        delay = node.parts.insert_delay(table.ns, [b.partition_id for b in blocks])
        if delay > 0:
            await asyncio.sleep(delay)   # backpressure: merges are behind (ClickHouse's parts_to_delay_insert)
        if quorum > 1:
            deadline = node.clock.monotonic() + quorum_timeout_ms / 1000
        committed = await node.parts.link.commit(db, name, blocks, directory, wc=wc, attempt=new_attempt(),
                                                 quorum=quorum, dedup_token=dedup_token, deadline=deadline)
    except BaseException as exc:
        if not outcome_unknown(exc):
            await asyncio.to_thread(discard_temporary, directory, blocks)
            raise
        node.parts.keep_in_doubt(directory, [b.tmp_name for b in blocks], IN_DOUBT_KEEP_S)
        if isinstance(exc, (PeerError, MongoError)):
            raise in_doubt_error(exc, stepped_down=was_primary and not node.is_primary) from exc
        raise
    await asyncio.to_thread(discard_temporary, directory, blocks)
    await visible_here(node, table.ns, [b.part for b in blocks if b.part and not b.deduplicated])
    reply: dict[str, Any] = {"blocks": [b.reply() for b in blocks],
                             "inserted": sum(not b.deduplicated for b in blocks),
                             "deduplicated": sum(b.deduplicated for b in blocks), "ok": 1.0}
    if quorum > 1:
        left_s = max(0.0, _left_s(deadline, node.clock)) if deadline is not None else quorum_timeout_ms / 1000
        statuses = await node.parts.wait_quorum(table.ns, [(b.block_id, b.part) for b in blocks], quorum, left_s)
        for block, status in zip(reply["blocks"], statuses, strict=True):
            block["quorumStatus"] = status
        # One answer for the insert: reached only if every block's part reached it.
        reply["quorumStatus"] = (REACHED if all(s == REACHED for s in statuses)
                                 else PENDING if PENDING in statuses else next(s for s in statuses if s != REACHED))
    if "writeConcernError" in committed:
        reply["writeConcernError"] = committed["writeConcernError"]
    return reply


async def visible_here(node: Node, ns: str, parts: list[str]) -> None:
    """An acknowledged insert is readable where it was acknowledged: waits until the member's part log
    made the parts it wrote active (on a secondary, once the commit's log entries reached it). Past
    `VISIBLE_HERE_S` the client hears a retryable error that says the commit happened (sent again, the
    insert is deduplicated). A deduplicated block's part is not waited for: an earlier insert wrote it,
    perhaps through another member that may be down now; a read after the reply's operationTime
    (`afterClusterTime`) waits for it where it is read."""
    try:
        await node.parts.wait_parts_active(ns, parts, VISIBLE_HERE_S)
    except MongoError as exc:
        if exc.code != MAX_TIME_EXPIRED:
            raise
        raise MongoError(HOST_UNREACHABLE, f"the insert is committed, but its parts are not readable on this "
                                           f"member within {VISIBLE_HERE_S:.0f} s ({exc.errmsg}); it stands, and "
                                           "sent again it is deduplicated",
                         extra={"errorLabels": [RETRYABLE_WRITE_ERROR]}) from exc


def in_doubt_error(exc: PeerError | MongoError, *, stepped_down: bool) -> MongoError:
    """What the client hears when its insert's commit may or may not have happened: a retryable error
    with the `RetryableWriteError` label (insertBlock is no retryable write to the dispatcher, so it is
    set here). A "not primary" code from the tries (no primary known, say) would tell a driver that
    this member cannot take writes: it becomes PrimarySteppedDown (189) when this member was the
    primary and is no longer, else HostUnreachable (6), as does a peer that did not answer."""
    code = exc.code if isinstance(exc, MongoError) else HOST_UNREACHABLE
    if code in NOT_PRIMARY_CODES:
        code = PRIMARY_STEPPED_DOWN if stepped_down else HOST_UNREACHABLE
    reason = exc.errmsg if isinstance(exc, MongoError) else str(exc)
    return MongoError(code, f"the outcome of this insert's commit is not known ({reason}); send the same "
                            "insert again with the same dedupToken: the block dedup makes the retry safe",
                      extra={"errorLabels": [RETRYABLE_WRITE_ERROR]})
