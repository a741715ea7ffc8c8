"""Retryable writes: the per-session record of the last statement and its reply.

A write sent with `lsid` + `txnNumber` runs at most once: its reply is stored in
`config.transactions` in the same transaction as the write, through the oplog
(so the record replicates with the data). A retry with the same pair returns the
stored reply without executing again; an older `txnNumber` is TransactionTooOld.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from bson.int64 import Int64

from base.errors import MongoError
from oplog.entry import SESSIONS_NS, update_entry
from oplog.writes import WriteEnv


@dataclass(frozen=True, slots=True)
class RetryableWrite:
    lsid: dict[str, Any]
    txn_number: int


def retryable_write(cmd: dict[str, Any]) -> RetryableWrite | None:
    lsid, txn = cmd.get("lsid"), cmd.get("txnNumber")
    if txn is None:
        return None
    if not isinstance(lsid, dict) or "id" not in lsid:
        raise MongoError(20, "Transaction numbers are only allowed on a replica set member or mongos "
                             "with a session")
    if "autocommit" in cmd:
        return None  # a statement of a multi-document transaction (replset/transactions.py)
    if isinstance(txn, bool) or not isinstance(txn, int) or txn < 0:
        raise MongoError(14, "txnNumber must be a non-negative 64-bit integer")
    return RetryableWrite({"id": lsid["id"]}, int(txn))


@dataclass(frozen=True, slots=True)
class Recorded:
    """What the session's record says of this write: its whole reply when it ran (`stored`), or for a
    batch that runs in slices and stopped part way, the statements done and their reply so far."""

    stored: dict[str, Any] | None = None
    progress: tuple[int, dict[str, Any]] | None = None


NOTHING_RECORDED = Recorded()


def recorded(env: WriteEnv, rw: RetryableWrite) -> Recorded:
    """One read of the session's record (a retryable write reads it once, in its own transaction)."""
    record = env.txn.get(SESSIONS_NS, rw.lsid)
    if record is None:
        return NOTHING_RECORDED
    stored_txn = int(record.get("txnNum", -1))
    if stored_txn > rw.txn_number:
        raise MongoError(225, f"Retryable write with txnNumber {rw.txn_number} is prohibited on session "
                              f"because a newer retryable write with txnNumber {stored_txn} has already "
                              f"started on this session.")
    if stored_txn != rw.txn_number:
        return NOTHING_RECORDED
    reply = record.get("reply")
    if "done" not in record:
        return Recorded(stored=dict(reply) if isinstance(reply, dict) else {"ok": 1.0})
    return Recorded(progress=(int(record["done"]), dict(reply) if isinstance(reply, dict) else {}))


def begin(env: WriteEnv, rw: RetryableWrite) -> None:
    env.session_fields = {"lsid": rw.lsid, "txnNumber": Int64(rw.txn_number), "stmtId": 0}


def record(env: WriteEnv, rw: RetryableWrite, reply: dict[str, Any], *, done: int | None = None) -> None:
    """Stores the write's reply; with `done`, the reply so far of a batch whose first `done`
    statements ran (the rest run in later slices)."""
    last = env.last_entry
    doc: dict[str, Any] = {
        "_id": rw.lsid,
        "txnNum": Int64(rw.txn_number),
        "lastWriteOpTime": {"ts": last["ts"], "t": last["t"]} if last and "ts" in last else {},
        "lastWriteDate": env.now,
        "reply": reply,
    }
    if done is not None:
        doc["done"] = done
    env.session_fields = {}
    env.emit(update_entry(SESSIONS_NS, rw.lsid, doc, upsert=True))
