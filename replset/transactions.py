"""Multi-document transactions on the primary.

Theory of operation.

- **Snapshot.** A transaction reads from a SQLite read transaction opened when it starts, on a
  connection of its own (`SQLiteStore.snapshot`): the data as committed then, whatever commits
  later. Its own writes lie over that snapshot (`overlay`, the documents as the transaction left
  them), so it reads its own writes and nobody else's.
- **Writes.** A statement runs in the writer's group commit, inside a savepoint: the transaction's
  earlier entries are applied again over the latest data, then the statement runs through the
  ordinary write code with a log that only collects its entries (the result, as every oplog entry
  is); the savepoint is rolled back. Nothing is visible to anyone else until the commit.
- **Conflicts (first committer wins).** A document the transaction writes must be, in the latest
  data, as it was in the snapshot; otherwise someone else changed it meanwhile and the statement
  fails with 112 `WriteConflict` (label `TransientTransactionError`: drivers' `with_transaction`
  runs the transaction again). The commit checks every written document again.
- **Commit.** One group commit checks, then writes **one** oplog entry, `{applyOps: [...]}` with
  every entry of the transaction and, last, the session's record in `config.transactions` (so a
  commit retried on a new primary after a failover finds its outcome). `apply_entry` applies an
  `applyOps` entry in one piece on every member, in rollback and in initial sync.
- **Ends.** A transaction is aborted by `abortTransaction`, by an error in any of its statements
  (as in mongod), by a newer transaction on its session, by `transactionLifetimeLimitSeconds`
  (60 s) and by the member leaving PRIMARY; its snapshot is closed then.
- **Shares.** Each owner (a user with access control on, a connection without it) may hold
  `maxOpenTransactionsPerUser` open transactions, all together `MAX_OPEN`: the one past either is refused
  (96) and everyone else's go on. Ended transactions are remembered (to answer their sessions' late
  statements) up to `MAX_REMEMBERED_PER_USER` each and `MAX_REMEMBERED` in all; past that, the owner's
  own oldest are forgotten, or the oldest of whoever keeps most (`replset.owner_shares`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import bson
from bson.int64 import Int64

from base.errors import MongoError
from base.optime import OpTime
from oplog.apply import apply_entry
from oplog.entry import SESSIONS_NS, command_entry, update_entry
from oplog.sqlite_store import SnapshotReader, StoreTxn
from oplog.values import canonical_key
from oplog.writes import WriteEnv
from replset.owner_shares import Remembered, Shares
from replset.txn_rules import NO_SUCH_TRANSACTION, WRITE_CONFLICT, TxnCall, TxnState, judge

if TYPE_CHECKING:
    from replset.node import Node

log = logging.getLogger(__name__)

LIFETIME_LIMIT_S = 60.0
MAX_OPEN = 1000  # open transactions (each holds a snapshot: a SQLite connection and its read lock)
MAX_OPEN_PER_USER = 100  # the default share of each owner (`maxOpenTransactionsPerUser`)
MAX_REMEMBERED = 10_000  # ended transactions kept to answer their sessions' late statements
MAX_REMEMBERED_PER_USER = 1_000
DocKey = tuple[str, bytes]  # (namespace, canonical _id)


class _CollectingLog:
    """A log writer that applies a statement's entries and keeps them, unstamped."""

    def __init__(self) -> None:
        self.entries: list[dict[str, Any]] = []

    def mark(self) -> int:
        return len(self.entries)

    def undo_to(self, mark: int) -> None:
        del self.entries[mark:]

    def write(self, txn: StoreTxn, entry: dict[str, Any], *, term: int, now: Any) -> dict[str, Any]:
        apply_entry(txn, entry, replay=False)
        self.entries.append(dict(entry))
        return dict(entry)


class _StatementStore:
    """The store as a statement of a transaction sees it: documents are read from the transaction's
    snapshot with its writes over it (so an update computes from the version the transaction saw, as
    in mongod), and written to the writer's transaction (the latest data, the transaction's earlier
    writes applied again), where unique indexes check them. Everything else is the writer's."""

    def __init__(self, writer: StoreTxn, txn: Transaction) -> None:
        self._writer = writer
        self._txn = txn
        self.written: dict[DocKey, dict[str, Any] | None] = {}
        self.ids: dict[DocKey, Any] = {}

    def __getattr__(self, name: str) -> Any:
        return getattr(self._writer, name)

    def get(self, ns: str, id_value: Any) -> dict[str, Any] | None:
        key = (ns, canonical_key(id_value))
        if key in self.written:
            doc = self.written[key]
            return None if doc is None else dict(doc)
        return self._txn.get(ns, id_value)

    def scan(self, ns: str) -> list[dict[str, Any]]:
        return _merged(self._txn.scan(ns), {key[1]: doc for key, doc in self.written.items() if key[0] == ns})

    def _wrote(self, ns: str, id_value: Any, doc: dict[str, Any] | None) -> None:
        key = (ns, canonical_key(id_value))
        self.written[key] = None if doc is None else dict(doc)
        self.ids[key] = id_value

    def insert(self, ns: str, doc: dict[str, Any], *, upsert: bool = False) -> None:
        self._writer.insert(ns, doc, upsert=upsert)
        self._wrote(ns, doc["_id"], doc)

    def replace(self, ns: str, doc: dict[str, Any]) -> bool:
        found = self._writer.replace(ns, doc)
        self._wrote(ns, doc["_id"], doc)
        return found

    def delete(self, ns: str, id_value: Any) -> bool:
        found = self._writer.delete(ns, id_value)
        self._wrote(ns, id_value, None)
        return found


def _merged(docs: Any, changed: dict[bytes, dict[str, Any] | None]) -> list[dict[str, Any]]:
    """`docs` in their order with `changed` (canonical `_id` -> the document now, None if deleted)
    over them; documents `changed` adds come last."""
    out: list[dict[str, Any]] = []
    for doc in docs:
        key = canonical_key(doc["_id"])
        if key in changed:
            now = changed.pop(key)
            if now is not None:
                out.append(dict(now))
        else:
            out.append(doc)
    out.extend(dict(doc) for doc in changed.values() if doc is not None)
    return out


def _same(a: dict[str, Any] | None, b: dict[str, Any] | None) -> bool:
    if a is None or b is None:
        return a is b
    return bson.encode(a) == bson.encode(b)


@dataclass(eq=False)  # compared and hashed by identity
class Transaction:
    lsid: dict[str, Any]
    number: int
    term: int
    snapshot: SnapshotReader | None
    state: TxnState = TxnState.IN_PROGRESS
    entries: list[dict[str, Any]] = field(default_factory=list)
    overlay: dict[DocKey, dict[str, Any] | None] = field(default_factory=dict)
    ids: dict[DocKey, Any] = field(default_factory=dict)
    commit_optime: OpTime | None = None
    expiry: asyncio.TimerHandle | None = None
    owner: str = ""  # whose share it takes: a user's full name, or a connection's (without access control)

    # -- reads: the snapshot with this transaction's writes over it --------------------------------
    def _snapshot(self) -> SnapshotReader:
        if self.snapshot is None:
            raise MongoError(NO_SUCH_TRANSACTION, f"Transaction {self.number} has been aborted.")
        return self.snapshot

    def get(self, ns: str, id_value: Any) -> dict[str, Any] | None:
        key = (ns, canonical_key(id_value))
        if key in self.overlay:
            doc = self.overlay[key]
            return None if doc is None else dict(doc)
        return self._snapshot().get(ns, id_value)

    def scan(self, ns: str) -> list[dict[str, Any]]:
        return _merged(self._snapshot().scan(ns), {key[1]: doc for key, doc in self.overlay.items() if key[0] == ns})

    def close(self) -> None:
        if self.expiry is not None:
            self.expiry.cancel()
            self.expiry = None
        if self.snapshot is not None:
            try:
                self.snapshot.close()
            except Exception:
                log.exception("closing a transaction's snapshot")
            self.snapshot = None

    # -- writes ----------------------------------------------------------------------------------
    def replay(self, txn: StoreTxn) -> None:
        """Applies this transaction's entries so far over the latest data (inside a savepoint)."""
        try:
            for entry in self.entries:
                apply_entry(txn, entry, replay=False)
        except MongoError as err:
            raise write_conflict(f"the transaction's earlier writes no longer apply: {err.errmsg}") from None

    def check_unchanged(self, txn: StoreTxn, keys: list[DocKey]) -> None:
        """Each document, in the latest data, is as this transaction's snapshot shows it."""
        snapshot = self._snapshot()
        for key in keys:
            ns, _ = key
            id_value = self.ids[key]
            if not _same(txn.get(ns, id_value), snapshot.get(ns, id_value)):
                raise write_conflict(f"a document of {ns} the transaction writes was changed by another "
                                     "operation after the transaction began")


def write_conflict(detail: str) -> MongoError:
    return MongoError(WRITE_CONFLICT, f"Write conflict during plan execution and yielding is disabled. "
                                      f"({detail})")


class Transactions:
    """The open (and recently ended) transaction of every session on this member."""

    def __init__(self, node: Node, *, lifetime_limit_s: float = LIFETIME_LIMIT_S) -> None:
        self._node = node
        self._by_session: dict[bytes, Transaction] = {}
        # The documents open transactions have written: a second transaction writing one of them
        # conflicts at once (as in mongod, where the first holds the document's write intent).
        self._holders: dict[DocKey, Transaction] = {}
        self._open: set[Transaction] = set()  # the transactions in progress
        self.shares = Shares("open transactions", "maxOpenTransactionsPerUser", per_owner=MAX_OPEN_PER_USER,
                             total=MAX_OPEN)
        self._remembered: Remembered[bytes] = Remembered(per_owner=MAX_REMEMBERED_PER_USER, total=MAX_REMEMBERED)
        self.lifetime_limit_s = lifetime_limit_s

    def _key(self, lsid: dict[str, Any]) -> bytes:
        return canonical_key(lsid["id"])

    def open_count(self) -> int:
        return len(self._open)

    def enter(self, call: TxnCall, cmd: dict[str, Any], owner: str = "") -> Transaction | None:
        """The transaction `cmd` runs in (starting it if asked, in `owner`'s share), or None when the command
        is a commit retried after its transaction committed and ended (the caller answers from the stored
        record)."""
        node = self._node
        key = self._key(cmd["lsid"])
        current = self._by_session.get(key)
        if current is not None and current.state is TxnState.IN_PROGRESS and (
                current.term != node.term or not node.is_primary):
            self._abort(current, "the member left PRIMARY")
        stored = None if current is not None and current.number >= call.number else self._stored(cmd["lsid"])
        number, state = (current.number, current.state) if current is not None else (None, None)
        if stored is not None and (number is None or stored[0] > number):
            number, state = stored
        verdict = judge(call, number, state)
        if verdict.action == "start":
            if current is not None and current.state is TxnState.IN_PROGRESS:
                self._abort(current, f"transaction {call.number} started on its session")
            return self._start(key, cmd["lsid"], call.number, owner)
        if verdict.action == "answer_committed":
            return current if current is not None and current.number == call.number else None
        assert current is not None
        return current

    def _start(self, key: bytes, lsid: dict[str, Any], number: int, owner: str) -> Transaction:
        self.shares.take(owner)  # (refused past the owner's share: nobody else's transaction ends for it)
        node = self._node
        try:
            txn = Transaction({"id": lsid["id"]}, number, node.term, node.store.snapshot(), owner=owner)
        except BaseException:
            self.shares.give_back(owner)
            raise
        txn.expiry = asyncio.get_running_loop().call_later(
            self.lifetime_limit_s, self._abort, txn, "it ran longer than transactionLifetimeLimitSeconds")
        self._forget(key)
        self._by_session[key] = txn
        self._open.add(txn)
        return txn

    def _forget(self, key: bytes) -> None:
        """The session's transaction is no longer kept (replaced by a newer one, or its session ended)."""
        txn = self._by_session.pop(key, None)
        if txn is not None:
            self._remembered.discard(txn.owner, key)

    def _remember(self, txn: Transaction) -> None:
        """An ended transaction is kept for its session's late statements, within its owner's share."""
        for key in self._remembered.add(txn.owner, self._key(txn.lsid)):
            kept = self._by_session.get(key)
            if kept is not None and kept.state is not TxnState.IN_PROGRESS:
                del self._by_session[key]

    def _stored(self, lsid: dict[str, Any]) -> tuple[int, TxnState] | None:
        """The session's last committed transaction, from its replicated record (a retryable write's
        record has no `state`)."""
        record = self._node.store.reader.get(SESSIONS_NS, {"id": lsid["id"]})
        if record is None or record.get("state") != "committed":
            return None
        return int(record.get("txnNum", -1)), TxnState.COMMITTED

    def abort_on_error(self, txn: Transaction, err: MongoError) -> None:
        if txn.state is TxnState.IN_PROGRESS:
            self._abort(txn, f"a statement failed: {err.errmsg}")

    def _abort(self, txn: Transaction, reason: str) -> None:
        if txn.state is not TxnState.IN_PROGRESS:
            return
        self._end(txn, TxnState.ABORTED)
        log.info("transaction %d aborted: %s", txn.number, reason)

    def _end(self, txn: Transaction, state: TxnState) -> None:
        """Ends an open transaction: its documents are free for others, its snapshot closed."""
        txn.state = state
        if txn in self._open:  # (once: a commit may end a transaction its lifetime limit ended meanwhile)
            self._open.discard(txn)
            self.shares.give_back(txn.owner)
        for key in txn.overlay:
            if self._holders.get(key) is txn:
                del self._holders[key]
        txn.entries.clear()
        txn.overlay.clear()
        txn.close()
        if self._by_session.get(self._key(txn.lsid)) is txn:
            self._remember(txn)

    def abort(self, txn: Transaction) -> None:
        self._abort(txn, "abortTransaction")

    def abort_all(self, reason: str) -> None:
        for txn in list(self._by_session.values()):
            self._abort(txn, reason)

    def end_sessions(self, session_ids: list[Any], reason: str) -> None:
        for session_id in session_ids:
            key = canonical_key(session_id)
            txn = self._by_session.get(key)
            if txn is not None:
                self._abort(txn, reason)
                self._forget(key)

    async def run_statement(self, txn: Transaction, body: Callable[[WriteEnv], dict[str, Any]], *,
                            off_loop: bool = False) -> dict[str, Any]:
        """Runs a write statement of `txn` (see the module docstring); returns its reply. `off_loop`: a
        statement that evaluates expressions runs on the writer's worker thread (`submit_write`)."""

        def job(env: WriteEnv) -> tuple[dict[str, Any], list[dict[str, Any]], dict[DocKey, Any]]:
            writer = env.txn
            savepoint = writer.savepoint()
            try:
                txn.replay(writer)
                store = _StatementStore(writer, txn)
                collecting = _CollectingLog()
                reply = body(WriteEnv(txn=store, log=collecting, term=env.term, now=env.now,  # type: ignore[arg-type]
                                     in_transaction=True))
            finally:
                writer.rollback_to(savepoint)
            txn.ids.update(store.ids)
            # Someone else changed a document this statement writes since the snapshot: a conflict.
            txn.check_unchanged(writer, [key for key in store.written if key not in txn.overlay])
            return reply, collecting.entries, store.written

        reply, entries, after = await self._node.submit_write(job, durable=False, off_loop=off_loop)
        for key in after:
            holder = self._holders.get(key)
            if holder is not None and holder is not txn and holder.state is TxnState.IN_PROGRESS:
                raise write_conflict(f"another transaction has written a document of {key[0]} this one writes")
        if reply.get("writeErrors"):
            first = reply["writeErrors"][0]
            self._abort(txn, f"a statement failed: {first.get('errmsg')}")
            return reply
        txn.entries.extend(entries)
        txn.overlay.update(after)
        for key in after:
            self._holders[key] = txn
        return reply

    async def commit(self, txn: Transaction) -> OpTime | None:
        """Commits `txn` in one oplog entry; returns its optime (None for a transaction that wrote
        nothing). Raises WriteConflict (and aborts) if another write got there first."""
        if txn.state is TxnState.COMMITTED:
            return txn.commit_optime
        entries = list(txn.entries)
        keys = list(txn.overlay)

        def job(env: WriteEnv) -> OpTime:
            txn.check_unchanged(env.txn, keys)
            record = {"_id": txn.lsid, "txnNum": Int64(txn.number), "state": "committed",
                      "lastWriteDate": env.now}
            ops = [*entries, update_entry(SESSIONS_NS, txn.lsid, record, upsert=True)]
            stamped = env.emit(command_entry("admin", {"applyOps": ops})
                               | {"lsid": txn.lsid, "txnNumber": Int64(txn.number)})
            return OpTime.from_document(stamped)

        optime = None
        if entries:
            try:
                optime = await self._node.submit_write(job, durable=False)
            except MongoError as err:
                self._abort(txn, f"the commit failed: {err.errmsg}")
                raise
        txn.commit_optime = optime
        self._end(txn, TxnState.COMMITTED)
        return optime
