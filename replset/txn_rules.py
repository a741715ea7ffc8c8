"""Multi-document transactions: which transaction a command belongs to, and the error labels drivers
act on. Pure decisions; the runtime is `replset/transactions.py`.

A session (`lsid`) runs one transaction at a time, numbered by the driver's `txnNumber`. A command
with `autocommit: false` belongs to a transaction; the first one also carries `startTransaction:
true`. The rules, as mongod's transaction participant applies them:

- `startTransaction` with a number above the session's current one starts a new transaction (one
  still open on the session is aborted); with a lower number: 225 `TransactionTooOld`; with the same
  number: 251 `NoSuchTransaction` if that one was aborted, 256 `TransactionCommitted` if committed,
  else 263 (`ConflictingOperationInProgress`: it has started already).
- A later statement must name the open transaction: a lower number is 225, any other number or an
  aborted transaction is 251.
- `commitTransaction` of a committed transaction answers its outcome again (drivers retry commits
  whose reply they lost); of an aborted one, 251. `abortTransaction` of a committed one is 256.
"""

from __future__ import annotations

__layer__ = "core"  # pure: no I/O, clock or randomness (tests/unit/test_layering.py)

import enum
from dataclasses import dataclass
from typing import Any

from base.errors import RETRYABLE_CODES, MongoError

NO_SUCH_TRANSACTION = 251
TRANSACTION_COMMITTED = 256
TRANSACTION_TOO_OLD = 225
WRITE_CONFLICT = 112
OPERATION_NOT_SUPPORTED_IN_TRANSACTION = 263
CONFLICTING_OPERATION_IN_PROGRESS = 117
MAX_TIME_MS_EXPIRED = 50

# Commands a transaction may run (mongod's list, less what this member has no use for).
ALLOWED_IN_TRANSACTION = frozenset({
    "find", "aggregate", "distinct", "getMore", "killCursors", "insert", "update", "delete",
    "findAndModify", "findandmodify", "commitTransaction", "abortTransaction", "create", "createIndexes",
    "bulkWrite",
})
ENDS_TRANSACTION = frozenset({"commitTransaction", "abortTransaction"})


class TxnState(enum.Enum):
    IN_PROGRESS = "inProgress"
    COMMITTED = "committed"
    ABORTED = "aborted"


@dataclass(frozen=True, slots=True)
class TxnCall:
    """What a command says about transactions."""

    number: int
    start: bool
    command: str


def txn_call(cmd: dict[str, Any], command: str) -> TxnCall | None:
    """The transaction `cmd` belongs to, or None for a command outside any transaction."""
    if "autocommit" not in cmd:
        if "startTransaction" in cmd:
            raise MongoError(72, "'startTransaction' requires 'autocommit: false'")
        return None
    if cmd["autocommit"] is not False:
        raise MongoError(72, "Specifying autocommit=true is not allowed.")
    lsid, number = cmd.get("lsid"), cmd.get("txnNumber")
    if not isinstance(lsid, dict) or "id" not in lsid:
        raise MongoError(20, "Transaction numbers are only allowed on a replica set member or mongos with "
                             "a session")
    if isinstance(number, bool) or not isinstance(number, int) or number < 0:
        raise MongoError(72, "'autocommit' requires a non-negative 'txnNumber'")
    start = cmd.get("startTransaction", False)
    if start is not True and start is not False:
        raise MongoError(14, "'startTransaction' must be a boolean")
    if start is False and "startTransaction" in cmd:
        raise MongoError(72, "'startTransaction' may only be true")
    if command not in ALLOWED_IN_TRANSACTION:
        raise MongoError(OPERATION_NOT_SUPPORTED_IN_TRANSACTION,
                         f"Cannot run '{command}' in a multi-document transaction.")
    if start and command in ENDS_TRANSACTION:
        raise MongoError(NO_SUCH_TRANSACTION, f"Transaction {number} has not been started")
    return TxnCall(int(number), bool(start), command)


@dataclass(frozen=True, slots=True)
class Verdict:
    """What to do with a transaction call: `start` a new transaction, `continue` the open one,
    `answer_committed` (a commit retried after its commit)."""

    action: str


def judge(call: TxnCall, current: int | None, state: TxnState | None) -> Verdict:
    """The session's transaction is `current` (None: it has had none) in `state`."""
    if current is not None and call.number < current:
        raise MongoError(TRANSACTION_TOO_OLD, f"Cannot start transaction {call.number} on session because a "
                                              f"newer transaction {current} has already started.")
    if call.start:
        if current is None or call.number > current:
            return Verdict("start")
        if state is TxnState.ABORTED:
            raise MongoError(NO_SUCH_TRANSACTION, f"Transaction {call.number} has been aborted.")
        if state is TxnState.COMMITTED:
            raise MongoError(TRANSACTION_COMMITTED, f"Transaction {call.number} has been committed.")
        raise MongoError(CONFLICTING_OPERATION_IN_PROGRESS,
                         f"Transaction {call.number} has already started on this session.")
    if current is None or call.number != current or state is None:
        raise MongoError(NO_SUCH_TRANSACTION, f"Given transaction number {call.number} does not match any "
                                              "in-progress transactions.")
    if state is TxnState.ABORTED:
        raise MongoError(NO_SUCH_TRANSACTION, f"Transaction {call.number} has been aborted.")
    if state is TxnState.COMMITTED:
        if call.command == "commitTransaction":
            return Verdict("answer_committed")
        raise MongoError(TRANSACTION_COMMITTED, f"Transaction {call.number} has been committed.")
    return Verdict("continue")


TRANSIENT_CODES = frozenset({WRITE_CONFLICT, 24, 239, 246, 267})  # + LockTimeout, snapshot errors, prepared
NOT_UNKNOWN_COMMIT = frozenset({79, 100})  # UnknownReplWriteConcern, UnsatisfiableWriteConcern
EXCEEDED_TIME_LIMIT = frozenset({MAX_TIME_MS_EXPIRED, 262})


def error_labels(command: str, code: int | None, wce_code: int | None) -> list[str]:
    """The labels of a reply in a transaction (mongod's error_labels.cpp), from its top-level error
    `code` and its write concern error's `wce_code`: `TransientTransactionError` when running the
    whole transaction again may succeed, `RetryableWriteError` on a commit or abort a driver may
    retry, `UnknownTransactionCommitResult` when a commit's outcome is unknown (retrying the commit
    is safe)."""
    labels: list[str] = []
    ending = command in ENDS_TRANSACTION
    if code is not None:
        if code in TRANSIENT_CODES or (code == NO_SUCH_TRANSACTION and wce_code is None) or (
                not ending and code in RETRYABLE_CODES):
            labels.append("TransientTransactionError")
    retryable = ending and ((code is not None and code in RETRYABLE_CODES)
                            or (wce_code is not None and wce_code in RETRYABLE_CODES))
    if retryable:
        labels.append("RetryableWriteError")
    if command == "commitTransaction" and "TransientTransactionError" not in labels and (
            retryable or (code is not None and code in EXCEEDED_TIME_LIMIT)
            or (wce_code is not None and wce_code not in NOT_UNKNOWN_COMMIT and code is None)):
        labels.append("UnknownTransactionCommitResult")
    return labels
