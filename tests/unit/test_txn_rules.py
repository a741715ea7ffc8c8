"""The transaction rules: which transaction a command belongs to, and the labels of its errors."""

from __future__ import annotations

from typing import Any

import pytest
from bson.binary import Binary

from base.errors import MongoError
from oplog.entry import flattened
from replset.txn_rules import TxnCall, TxnState, error_labels, judge, txn_call
from sync.rollback import plan_rollback

LSID = {"id": Binary(b"\x01" * 16, 4)}


def code(fn: Any, *args: Any) -> int:
    with pytest.raises(MongoError) as err:
        fn(*args)
    return err.value.code


def test_commands_outside_transactions_and_bad_transaction_fields() -> None:
    assert txn_call({"find": "c"}, "find") is None
    assert txn_call({"find": "c", "lsid": LSID, "txnNumber": 3}, "find") is None  # a retryable write
    assert code(txn_call, {"find": "c", "lsid": LSID, "txnNumber": 1, "autocommit": True}, "find") == 72
    assert code(txn_call, {"find": "c", "txnNumber": 1, "autocommit": False}, "find") == 20
    assert code(txn_call, {"count": "c", "lsid": LSID, "txnNumber": 1, "autocommit": False}, "count") == 263
    assert code(txn_call, {"find": "c", "startTransaction": True}, "find") == 72
    call = txn_call({"insert": "c", "lsid": LSID, "txnNumber": 4, "autocommit": False,
                     "startTransaction": True}, "insert")
    assert call == TxnCall(4, True, "insert")


def test_the_transaction_number_rules() -> None:
    start, go, commit = TxnCall(5, True, "insert"), TxnCall(5, False, "insert"), TxnCall(5, False,
                                                                                         "commitTransaction")
    assert judge(start, None, None).action == "start"
    assert judge(start, 4, TxnState.IN_PROGRESS).action == "start"
    assert code(judge, start, 6, TxnState.COMMITTED) == 225
    assert code(judge, start, 5, TxnState.IN_PROGRESS) == 117
    assert judge(go, 5, TxnState.IN_PROGRESS).action == "continue"
    assert code(judge, go, 5, TxnState.ABORTED) == 251
    assert code(judge, go, 4, TxnState.IN_PROGRESS) == 251
    assert code(judge, go, 5, TxnState.COMMITTED) == 256
    assert judge(commit, 5, TxnState.COMMITTED).action == "answer_committed"
    assert code(judge, commit, 5, TxnState.ABORTED) == 251


@pytest.mark.parametrize(("command", "code_", "wce", "labels"), [
    ("insert", 112, None, ["TransientTransactionError"]),
    ("insert", 10107, None, ["TransientTransactionError"]),
    ("insert", None, 91, []),  # a write concern error inside a transaction: no label
    ("insert", 11000, None, []),
    ("commitTransaction", 112, None, ["TransientTransactionError"]),
    ("commitTransaction", 251, None, ["TransientTransactionError"]),
    ("commitTransaction", 91, None, ["RetryableWriteError", "UnknownTransactionCommitResult"]),
    ("commitTransaction", None, 91, ["RetryableWriteError", "UnknownTransactionCommitResult"]),
    ("commitTransaction", None, 64, ["UnknownTransactionCommitResult"]),
    ("commitTransaction", None, 100, []),
    ("commitTransaction", 50, None, ["UnknownTransactionCommitResult"]),
    ("abortTransaction", 91, None, ["RetryableWriteError"]),
])
def test_error_labels(command: str, code_: int | None, wce: int | None, labels: list[str]) -> None:
    assert error_labels(command, code_, wce) == labels


def test_a_transaction_entry_is_its_writes_for_rollback_and_readers() -> None:
    ops = [{"op": "i", "ns": "d.a", "o": {"_id": 1}}, {"op": "u", "ns": "d.b", "o": {"$set": {"x": 1}},
                                                        "o2": {"_id": 2}}]
    entry = {"op": "c", "ns": "admin.$cmd", "o": {"applyOps": ops}, "ts": 7, "t": 1, "lsid": LSID}
    inner = flattened(entry)
    assert [(e["op"], e["ts"], e["lsid"]) for e in inner] == [("i", 7, LSID), ("u", 7, LSID)]
    plan = plan_rollback([entry])
    assert not plan.databases and not plan.collections
    assert set(plan.documents) == {"d.a", "d.b"}
