"""Command dispatch: find the handler, check the member's role, shape errors.

Handlers are registered with a *kind*: `read` (needs PRIMARY, or SECONDARY with a
non-primary read preference), `write` (needs PRIMARY), or `any`. Every error
becomes MongoDB's `{ok: 0, errmsg, code, codeName}`; a retryable write that fails
with a retryable code gets the `RetryableWriteError` label, because drivers with
wire version >= 9 retry only on the server's label.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from bson.binary import Binary
from bson.int64 import Int64
from bson.timestamp import Timestamp

from base.codec import (
    FLAG_EXHAUST_ALLOWED,
    FLAG_MORE_TO_COME,
    OpMsgRequest,
    OpQueryRequest,
    Request,
    encode_op_msg,
    encode_op_reply,
)
from base.errors import RETRYABLE_CODES, MongoError
from base.member import MemberState
from base.read_concern import parse_read_concern, refusal
from oplog.collation import check_collations
from oplog.entry import SESSIONS_NS
from oplog.let_vars import bind_command
from replset.auth.access import check_access
from replset.txn_rules import ENDS_TRANSACTION, error_labels, txn_call
from replset.wire.command_args import check_command
from replset.wire.ownership import claim_session, quota_owner
from replset.write_concern import parse_write_concern, write_concern_error_field

if TYPE_CHECKING:
    from oplog.sqlite_store import SnapshotReader
    from replset.committed_snapshots import MajorityView
    from replset.node import Node
    from replset.transactions import Transaction
    from replset.wire.server import Connection

log = logging.getLogger(__name__)

OP_QUERY_COMMANDS = frozenset({"hello", "isMaster", "ismaster"})
_SECONDARY_OK_FLAG = 4
LET_COMMANDS = frozenset({"find", "aggregate", "update", "delete", "findAndModify", "findandmodify"})
_RETRYABLE_WRITE_COMMANDS = frozenset({"insert", "update", "delete", "findAndModify", "findandmodify"})


@dataclass(slots=True)
class CommandContext:
    node: Node
    conn: Connection
    db: str
    cmd: dict[str, Any]
    legacy: bool = False
    secondary_ok: bool = False
    txn: Transaction | None = None  # the multi-document transaction the command runs in
    snapshot: SnapshotReader | None = None  # a snapshot read's point in time (replset/snapshot_reads.py)
    snapshot_time: Timestamp | None = None
    # A majority read's committed snapshot, bound for this command (replset/committed_snapshots.py);
    # let go when the command ends.
    majority_view: MajorityView | None = None
    depth_checked: bool = False  # its nesting was checked when it was decoded (a large message, off the loop)

    @property
    def name(self) -> str:
        return next(iter(self.cmd))


Handler = Callable[[CommandContext], Awaitable[dict[str, Any]]]


@dataclass(frozen=True, slots=True)
class CommandSpec:
    handler: Handler
    kind: str  # "read" | "write" | "any"


COMMANDS: dict[str, CommandSpec] = {}


def command(*names: str, kind: str = "any") -> Callable[[Handler], Handler]:
    def register(handler: Handler) -> Handler:
        for name in names:
            COMMANDS[name] = CommandSpec(handler, kind)
        return handler

    return register


def load_commands() -> dict[str, CommandSpec]:
    """Every command, registered by importing the modules that define them."""
    from replset.wire import (  # noqa: F401
        admin,
        auth_commands,
        crud,
        explain_cmd,
        parts_commands,
        parts_jobs,
        parts_reads,
        repl_commands,
        split_vector,
        txn_commands,
    )

    return COMMANDS


def valid_database_name(db: str) -> bool:
    """mongod's rule for a `$db`: 1 to 63 characters, none of `/\\. "$` or NUL (`$external`, where
    external users log in, aside). A dot would let `admin.system` + `users` name `admin.system.users`."""
    return db == "$external" or (0 < len(db) < 64 and not any(c in db for c in '/\\. "$\x00'))


def _secondary_ok(cmd: dict[str, Any]) -> bool:
    pref = cmd.get("$readPreference")
    return isinstance(pref, dict) and pref.get("mode", "primary") != "primary"


def check_role(node: Node, kind: str, secondary_ok: bool) -> None:
    if kind == "write" and not node.is_primary:
        raise MongoError(10107, "not primary")
    if kind == "read" and not node.is_primary:
        if node.state is MemberState.SECONDARY:
            if not secondary_ok:
                raise MongoError(13435, "not primary and secondaryOk=false")
        else:
            raise MongoError(13436, "node is not in primary or recovering state")


_ZERO_SIGNATURE = {"hash": Binary(bytes(20)), "keyId": Int64(0)}


def _gossip_in(ctx: CommandContext) -> None:
    """A `$clusterTime` a driver or member sends moves this member's cluster time on."""
    gossiped = ctx.cmd.get("$clusterTime")
    if isinstance(gossiped, dict) and isinstance(gossiped.get("clusterTime"), Timestamp):
        ctx.node.gossip_cluster_time(gossiped["clusterTime"])


def _stamp_times(node: Node, reply: dict[str, Any]) -> None:
    """Every reply of a member of a set carries `$clusterTime` (signed with a zero key: there is no key
    to sign with while auth is off, as on mongod) and `operationTime` (the time the operation saw, if
    its handler named none: this member's applied optime). Drivers gossip the first and causally
    consistent sessions read after the second."""
    if node.config is None:
        return
    reply.setdefault("operationTime", node.last_committed_optime.ts)
    reply["$clusterTime"] = {"clusterTime": node.cluster_time, "signature": _ZERO_SIGNATURE}


def _check_snapshot_read(ctx: CommandContext) -> None:
    """A `snapshot` read concern outside a transaction, on a command that reads at no point in time
    (a write, a catalog listing): InvalidOptions, as mongod."""
    raw = ctx.cmd.get("readConcern")
    if ctx.name == "getMore":
        return  # (a getMore reads under the concern of the command that opened its cursor, as mongod's)
    if isinstance(raw, dict) and raw.get("level") == "snapshot" and "autocommit" not in ctx.cmd:
        error = refusal(parse_read_concern(raw), command=ctx.name)
        if error is not None:
            raise error


class CloseConnection(ConnectionError):
    """The connection closes without a reply (the `failCommand` fail point's `closeConnection`)."""


def _app_name(conn: Connection) -> str | None:
    application = conn.client_metadata.get("application")
    name = application.get("name") if isinstance(application, dict) else None
    return name if isinstance(name, str) else None


def _streams(reply: dict[str, Any], cmd: dict[str, Any]) -> bool:
    """Whether a reply to an exhaustAllowed request goes on as an exhaust stream: a getMore that
    succeeded and left its cursor open."""
    if next(iter(cmd), None) != "getMore" or reply.get("ok") != 1:
        return False
    cursor = reply.get("cursor")
    # (an empty batch ends the stream: a tailable cursor with nothing new would otherwise stream empty
    # replies without pause; the client asks again when it wants more)
    return isinstance(cursor, dict) and bool(cursor.get("id")) and bool(cursor.get("nextBatch"))


def _statement_count(name: str, cmd: dict[str, Any]) -> int:
    """How many statements a write command carries (1 for findAndModify)."""
    field = {"insert": "documents", "update": "updates", "delete": "deletes"}.get(name)
    statements = cmd.get(field) if field else None
    return max(len(statements), 1) if isinstance(statements, list) else 1


class Dispatcher:
    def __init__(self, node: Node) -> None:
        self.node = node
        self._internal_errors: dict[tuple[str, str, str, int], int] = {}
        load_commands()

    async def handle(self, conn: Connection, request: Request) -> bytes | None:
        if isinstance(request, OpQueryRequest):
            return await self._handle_op_query(conn, request)
        assert isinstance(request, OpMsgRequest)
        cmd: dict[str, Any] = {}
        try:
            cmd = request.command()
        except Exception as exc:
            reply = MongoError(9, str(exc)).to_document()
        else:
            db = cmd.get("$db")
            if not isinstance(db, str):
                reply = MongoError(40571, "OP_MSG requests require a $db argument").to_document()
            elif not valid_database_name(db):   # before anything builds "<db>.<collection>" from it
                reply = MongoError(73, f"Invalid database name: '{db}'").to_document()
            else:
                reply = await self.run(CommandContext(self.node, conn, db, cmd, secondary_ok=_secondary_ok(cmd),
                                                      depth_checked=request.depth_checked))
        if request.more_to_come:
            return None
        reply_id = conn.next_request_id()
        if request.flags & FLAG_EXHAUST_ALLOWED and _streams(reply, cmd):
            conn.exhaust = (cmd, reply_id)
            return encode_op_msg(reply, reply_id, request.request_id, FLAG_MORE_TO_COME)
        return encode_op_msg(reply, reply_id, request.request_id)

    async def next_exhaust_reply(self, conn: Connection) -> bytes:
        """The next reply of an exhaust getMore (see `Connection.exhaust`): moreToCome while its cursor
        stays open, without it on the last one (the cursor done, or an error)."""
        assert conn.exhaust is not None
        cmd, answers = conn.exhaust
        db = cmd["$db"]
        assert isinstance(db, str)
        reply = await self.run(CommandContext(self.node, conn, db, cmd, secondary_ok=_secondary_ok(cmd)))
        reply_id = conn.next_request_id()
        if _streams(reply, cmd):
            conn.exhaust = (cmd, reply_id)
            return encode_op_msg(reply, reply_id, answers, FLAG_MORE_TO_COME)
        conn.exhaust = None
        return encode_op_msg(reply, reply_id, answers)

    def abandon_exhaust(self, conn: Connection) -> None:
        """The client went away in the middle of an exhaust stream: its cursor goes too."""
        if conn.exhaust is not None:
            cursor_id = conn.exhaust[0].get("getMore")
            conn.exhaust = None
            if isinstance(cursor_id, int):
                self.node.cursors.kill(cursor_id)

    async def _handle_op_query(self, conn: Connection, request: OpQueryRequest) -> bytes:
        query = request.query
        if "$query" in query and isinstance(query["$query"], dict):
            query = query["$query"]
        name = next(iter(query), "")
        if not request.collection.endswith(".$cmd") or name not in OP_QUERY_COMMANDS:
            reply = MongoError(352, "Unsupported OP_QUERY command: " + (name or "<none>")).to_document()
        else:
            ctx = CommandContext(self.node, conn, request.collection.split(".", 1)[0], query, legacy=True,
                                 secondary_ok=bool(request.flags & _SECONDARY_OK_FLAG))
            reply = await self.run(ctx)
        return encode_op_reply(reply, conn.next_request_id(), request.request_id)

    async def run(self, ctx: CommandContext) -> dict[str, Any]:
        if not ctx.cmd:
            return MongoError(9, "empty command").to_document()
        spec = COMMANDS.get(ctx.name)
        if spec is None:
            return MongoError(59, f"no such command: '{ctx.name}'").to_document()
        _gossip_in(ctx)
        failure = self._fail_command(ctx)
        try:
            if ctx.node.options.auth:
                check_access(ctx.node.store.reader, ctx.conn.auth, ctx.conn.peer, ctx.name, ctx.db, ctx.cmd,
                             test_commands=ctx.node.options.enable_test_commands, cache=ctx.node.user_grants)
            claim_session(ctx)  # (another user's session: 13, before anything runs under it)
            if failure is not None:
                await self._inject_failure(failure)
            check_role(ctx.node, spec.kind, ctx.secondary_ok)
            check_command(ctx.name, ctx.cmd, depth_checked=ctx.depth_checked)
            if ctx.cmd.get("maxTimeMS") and ctx.node.failpoints.check("maxTimeAlwaysTimeOut") is not None:
                raise MongoError(50, "operation exceeded time limit (maxTimeAlwaysTimeOut fail point)")
            self._enter_transaction(ctx)
            check_collations(ctx.name, ctx.cmd)
            _check_snapshot_read(ctx)
            if "let" in ctx.cmd and ctx.name in LET_COMMANDS:
                ctx.cmd = bind_command(ctx.name, ctx.cmd, now=ctx.node.now())
            transactional = self._transactional_write_failure(ctx)
            if transactional is not None and "failBeforeCommitExceptionCode" in transactional:
                if transactional.get("closeConnection", True):
                    raise CloseConnection("closed by the onPrimaryTransactionalWrite fail point")
                raise MongoError(int(transactional["failBeforeCommitExceptionCode"]),
                                 "onPrimaryTransactionalWrite fail point")
            reply = await spec.handler(ctx)
            if transactional is not None and transactional.get("closeConnection", True):
                raise CloseConnection("closed after the write by the onPrimaryTransactionalWrite fail point")
        except MongoError as err:
            reply = err.to_document()
            if ctx.txn is not None and ctx.name not in ENDS_TRANSACTION:
                ctx.node.transactions.abort_on_error(ctx.txn, err)
            elif spec.kind == "write" and "writeConcern" in ctx.cmd and ctx.node.is_primary:
                await self._write_concern_after_failure(ctx, reply)
        except CloseConnection:
            raise
        except Exception as exc:
            self._log_internal_error(ctx.name, exc)
            reply = MongoError(1, f"internal error in {ctx.name}: {exc!r}").to_document()
        else:
            if failure is not None and "writeConcernError" in failure and reply.get("ok"):
                reply["writeConcernError"] = dict(failure["writeConcernError"])
        finally:
            if ctx.majority_view is not None:
                ctx.majority_view.release()
        self._label(ctx, reply)
        if failure is not None and "errorLabels" in failure and (not reply.get("ok") or "writeConcernError" in reply):
            reply["errorLabels"] = list(failure["errorLabels"])
        _stamp_times(ctx.node, reply)
        return reply

    def _fail_command(self, ctx: CommandContext) -> dict[str, Any] | None:
        if not ctx.node.options.enable_test_commands:
            return None
        target = ctx.cmd.get(ctx.name)
        namespace = f"{ctx.db}.{target}" if isinstance(target, str) else ctx.db
        return ctx.node.failpoints.command_failure(ctx.name, namespace, _app_name(ctx.conn),
                                                   internal=ctx.conn.claims_member)

    @staticmethod
    def _transactional_write_failure(ctx: CommandContext) -> dict[str, Any] | None:
        """The `onPrimaryTransactionalWrite` fail point's data if it fires for this command: a
        retryable write (a `txnNumber`, no transaction) from a client on the primary."""
        node = ctx.node
        if (not node.options.enable_test_commands or ctx.name not in _RETRYABLE_WRITE_COMMANDS
                or "txnNumber" not in ctx.cmd or "autocommit" in ctx.cmd or ctx.conn.claims_member
                or not node.failpoints.is_on("onPrimaryTransactionalWrite")):
            return None
        lsid = ctx.cmd.get("lsid")
        record = node.store.reader.get(SESSIONS_NS, {"id": lsid["id"]}) if isinstance(lsid, dict) else None
        if record is not None and record.get("txnNum") == ctx.cmd["txnNumber"] and "done" not in record:
            return None  # a retry of a write that ran: answered from its record, nothing is written
        # The fail point counts statements, as mongod's does (its `skip` is a number of documents): the
        # command fails if it fires for any of them.
        for _ in range(_statement_count(ctx.name, ctx.cmd)):
            point = node.failpoints.check("onPrimaryTransactionalWrite")
            if point is not None:
                return point.data
        return None

    @staticmethod
    async def _inject_failure(failure: dict[str, Any]) -> None:
        if failure.get("blockConnection"):
            await asyncio.sleep(float(failure.get("blockTimeMS", 0)) / 1000)
        if failure.get("closeConnection"):
            raise CloseConnection("closed by the failCommand fail point")
        if failure.get("errorCode") is not None:
            raise MongoError(int(failure["errorCode"]), "Failing command via 'failCommand' failpoint")

    def _log_internal_error(self, name: str, exc: Exception) -> None:
        """An unexpected exception is a bug: its traceback is logged the first time it happens in a
        command, and later ones as one line with a count (a client repeating it cannot flood the log)."""
        where = exc.__traceback__
        while where is not None and where.tb_next is not None:
            where = where.tb_next
        key = (name, type(exc).__name__, where.tb_frame.f_code.co_filename if where else "",
               where.tb_lineno if where else 0)
        seen = self._internal_errors.get(key, 0) + 1
        self._internal_errors[key] = seen
        if seen == 1:
            log.error("internal error in command %s", name, exc_info=exc)
        else:
            log.error("internal error in command %s again (%d times): %r", name, seen, exc)

    @staticmethod
    async def _write_concern_after_failure(ctx: CommandContext, reply: dict[str, Any]) -> None:
        """A write command that failed still honours its write concern, as in mongod: what it saw
        (the state that made it fail) is then as durable as asked, and a write concern that cannot
        be met is reported (`writeConcernError` beside the error)."""
        try:
            wc = parse_write_concern(ctx.cmd["writeConcern"])
        except MongoError:
            return
        wce = await ctx.node.wait_for_write_concern(wc, ctx.node.last_committed_optime)
        if wce is not None:
            reply["writeConcernError"] = write_concern_error_field(wce)

    @staticmethod
    def _enter_transaction(ctx: CommandContext) -> None:
        call = txn_call(ctx.cmd, ctx.name)
        if call is None:
            return
        if not ctx.node.is_primary:
            raise MongoError(10107, "not primary")
        if ctx.db in ("admin", "config", "local") and ctx.name not in ENDS_TRANSACTION:
            raise MongoError(263, f"Cannot run command against the '{ctx.db}' database in a transaction.")
        if "writeConcern" in ctx.cmd and ctx.name not in ENDS_TRANSACTION:
            raise MongoError(72, "Cannot set write concern after starting a transaction.")
        if "readConcern" in ctx.cmd and not call.start:
            raise MongoError(72, "Only the first command in a transaction may specify a readConcern")
        ctx.txn = ctx.node.transactions.enter(call, ctx.cmd, quota_owner(ctx))

    @staticmethod
    def _label(ctx: CommandContext, reply: dict[str, Any]) -> None:
        """Adds the error labels drivers act on, from the reply's error and write concern error."""
        code = None if reply.get("ok") else reply.get("code")
        wce = reply.get("writeConcernError")
        wce_code = wce.get("code") if isinstance(wce, dict) else None
        if "autocommit" in ctx.cmd:
            labels = error_labels(ctx.name, code, wce_code)
        else:
            retryable_write = ctx.name in _RETRYABLE_WRITE_COMMANDS and "txnNumber" in ctx.cmd
            labels = ["RetryableWriteError"] if retryable_write and (
                code in RETRYABLE_CODES or wce_code in RETRYABLE_CODES) else []
        if labels:
            reply["errorLabels"] = [*reply.get("errorLabels", []), *labels]
