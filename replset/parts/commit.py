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
(HostUnreachable, 6; 503 over HTTP): sending the insert again with the same
dedup token is safe. A crash of this member between the primary's commit and
the publish leaves a temporary part too: start-up publishes it the same way.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import pyarrow as pa
from tenacity import AsyncRetrying, retry_if_exception, stop_after_delay, wait_exponential_jitter

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
NO_PRIMARY = 10107
NOT_PRIMARY_OR_SECONDARY = 13436
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


def new_attempt() -> str:
    return uuid.uuid4().hex


def _retryable(exc: BaseException) -> bool:
    return isinstance(exc, PeerError) or (isinstance(exc, MongoError) and exc.code in RETRYABLE_CODES)


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
                 quorum: int, dedup_token: str | None, directory: str | None,
                 publishing: Callable[[list[str]], None] | None = None) -> Callable[[WriteEnv], dict[str, Any]]:
    """The primary's transaction; `directory` is set when the blocks' temporary parts are on this member
    (published inside the transaction, before it commits, `publishing` told their names first)."""
    def body(env: WriteEnv) -> dict[str, Any]:
        fresh = commit_blocks(env, db=db, table=load_table(env.txn, db, name), blocks=blocks, source=source,
                              http=http, attempt=attempt, quorum=quorum, dedup_token=dedup_token)
        if directory is not None:
            mine = [b for b in fresh if b.tmp_name]
            if publishing is not None:
                publishing([b.part for b in mine])
            publish_blocks(directory, mine)
        return {"blocks": [{"blockId": b.block_id, "part": b.part, "deduplicated": b.deduplicated}
                           for b in blocks], "ok": 1.0}
    return body


class PrimaryLink:
    """The member connection an insert on a secondary sends its commit over (one per primary host)."""

    def __init__(self, node: Node) -> None:
        self.node = node
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

    def _retrying(self) -> AsyncRetrying:
        """Tries until the deadline, backing off, while the failure is one a change of primary explains."""
        node = self.node
        return AsyncRetrying(retry=retry_if_exception(lambda exc: _retryable(exc) and not node.shutting_down),
                             stop=stop_after_delay(self._deadline_s()),
                             wait=wait_exponential_jitter(initial=0.05, max=1.0), reraise=True)

    def _try_timeout(self, started: float) -> float:
        """One try's share: what is left of the commit's deadline (never less than `MIN_TRY_S`), so that
        all tries together stay near the deadline."""
        return max(MIN_TRY_S, self._deadline_s() - (time.monotonic() - started))

    async def on_primary(self, db: str, cmd: dict[str, Any],
                         here: Callable[[], Awaitable[dict[str, Any]]]) -> dict[str, Any]:
        """Runs a part-log command where the primary is: `here()` when this member is primary, else `cmd`
        sent to the primary over a member connection - retried across a change of primary, so `cmd`
        must be safe to repeat (it carries an attempt id)."""
        reply: dict[str, Any] = {}
        started = time.monotonic()
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
                     attempt: str, quorum: int, dedup_token: str | None) -> dict[str, Any]:
        """Commits `blocks` through whichever member is primary, retrying across a change of primary;
        publishes the temporary parts written here under their committed names."""
        reply: dict[str, Any] = {}
        started = time.monotonic()
        async for attempt_state in self._retrying():
            with attempt_state:
                reply = await self._commit_once(db, name, blocks, directory, wc=wc, attempt=attempt,
                                                quorum=quorum, dedup_token=dedup_token,
                                                timeout_s=self._try_timeout(started))
        return reply

    async def _commit_once(self, db: str, name: str, blocks: list[Block], directory: str, *, wc: WriteConcern,
                           attempt: str, quorum: int, dedup_token: str | None, timeout_s: float) -> dict[str, Any]:
        node = self.node
        me, http = node.options.me, node.options.http_address
        ns = f"{db}.{name}"
        if node.is_primary:
            # Off the loop: a commit of many blocks checks, numbers and renames each one.
            reply = await commit_here(node, wc, primary_body(
                db, name, blocks, source=me, http=http, attempt=attempt, quorum=quorum,
                dedup_token=dedup_token, directory=directory,
                publishing=lambda parts: node.parts.inserting(ns, parts)), off_loop=True)
            _raise_if_may_roll_back(reply.get("writeConcernError"))
            return reply
        body: dict[str, Any] = {
            "_partsCommit": name, "blocks": [b.to_wire() for b in blocks], "source": me,
            "attempt": attempt, "quorum": quorum, "writeConcern": wc.to_document()}
        if dedup_token is not None:
            body["dedupToken"] = dedup_token
        reply = await self._send(db, body, timeout_s)
        if self.node.failpoints.check(REPLY_LOST):
            raise PeerError(f"the reply of {node.primary_host} to _partsCommit was lost (fail point)")
        wce = reply.get("writeConcernError")
        _raise_if_may_roll_back(wce)
        committed = {str(b["blockId"]): b for b in reply.get("blocks", [])}
        for block in blocks:
            done = committed.get(block.block_id)
            if done is None:
                raise MongoError(8, f"_partsCommit answered without block {block.block_id}")
            block.part, block.deduplicated = str(done["part"]), bool(done["deduplicated"])
        fresh = [b for b in blocks if not b.deduplicated]
        node.parts.inserting(ns, [b.part for b in fresh])
        await asyncio.to_thread(publish_blocks, directory, fresh)
        return {"ok": 1.0} | ({"writeConcernError": wce} if isinstance(wce, dict) else {})


def _raise_if_may_roll_back(wce: Any) -> None:
    """Committed on a primary that lost its role before the write concern was met: the commit may be
    rolled back. A retry (same attempt) finds it on the new primary or commits it again."""
    if isinstance(wce, dict) and wce.get("code") in RETRYABLE_CODES:
        raise MongoError(int(wce["code"]), str(wce.get("errmsg", "")))


def outcome_unknown(exc: BaseException) -> bool:
    """The commit may have happened: a reply lost, a try cut short, a primary gone mid-commit. Only a
    primary's own refusal (a non-retryable code) proves that nothing was committed."""
    return not isinstance(exc, MongoError) or exc.code in RETRYABLE_CODES


async def insert_rows(node: Node, db: str, name: str, data: pa.Table, *, wc: WriteConcern, dedup_token: str | None,
                      quorum: int, quorum_timeout_ms: int) -> dict[str, Any]:
    """The `insertBlock` command's work, on any member: write the blocks here, commit them through the
    primary, then (`quorum` > 1) wait until that many members hold each new part."""
    if node.state not in (MemberState.PRIMARY, MemberState.SECONDARY):
        # A member syncing from scratch, rolling back or recovering would be the parts' only source while
        # its own table directory may be replaced: it takes no inserts (as a mongod takes no reads then).
        raise MongoError(NOT_PRIMARY_OR_SECONDARY, f"this member is {node.state.name}: an insert needs a "
                                                   "primary or a secondary")
    table = load_table(node.store.reader, db, name)
    directory = table_dir(node.options.dbpath, table.ns)
    blocks = await asyncio.to_thread(prepare_blocks, directory, table, data, dedup_token)
    try:
        delay = node.parts.insert_delay(table.ns, [b.partition_id for b in blocks])
        if delay > 0:
            await asyncio.sleep(delay)   # backpressure: merges are behind (ClickHouse's parts_to_delay_insert)
        committed = await node.parts.link.commit(db, name, blocks, directory, wc=wc, attempt=new_attempt(),
                                                 quorum=quorum, dedup_token=dedup_token)
    except BaseException as exc:
        if not outcome_unknown(exc):
            await asyncio.to_thread(discard_temporary, directory, blocks)
            raise
        node.parts.keep_in_doubt(directory, [b.tmp_name for b in blocks], IN_DOUBT_KEEP_S)
        if isinstance(exc, PeerError):
            raise MongoError(HOST_UNREACHABLE, f"the commit of this insert through the primary has an unknown "
                                               f"outcome ({exc}); send it again with the same dedupToken") from exc
        raise
    await asyncio.to_thread(discard_temporary, directory, blocks)
    reply: dict[str, Any] = {"blocks": [b.reply() for b in blocks],
                             "inserted": sum(not b.deduplicated for b in blocks),
                             "deduplicated": sum(b.deduplicated for b in blocks), "ok": 1.0}
    if quorum > 1:
        statuses = await node.parts.wait_quorum(table.ns, [(b.block_id, b.part) for b in blocks], quorum,
                                                quorum_timeout_ms / 1000)
        for block, status in zip(reply["blocks"], statuses, strict=True):
            block["quorumStatus"] = status
        # One answer for the insert: reached only if every block's part reached it.
        reply["quorumStatus"] = (REACHED if all(s == REACHED for s in statuses)
                                 else PENDING if PENDING in statuses else next(s for s in statuses if s != REACHED))
    if "writeConcernError" in committed:
        reply["writeConcernError"] = committed["writeConcernError"]
    return reply
