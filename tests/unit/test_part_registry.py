"""The registry's transactions and quorum rules, on an in-memory store: a quorum measured against
the quorum asked for now, and a pending quorum whose holders are all registered (a failover kept the
registrations but not the entry that marked it reached) settled by the new primary's look."""

from __future__ import annotations

import datetime
from collections.abc import Callable
from typing import Any

import pytest

from base.optime import NULL_OPTIME
from oplog.entry import insert_entry
from oplog.log_writer import LogWriter
from oplog.sqlite_store import SQLiteStore
from oplog.writes import WriteEnv
from replset.parts.names import state_ns
from replset.parts.registry import (
    FAILED,
    PENDING,
    REACHED,
    Registration,
    holder_doc,
    quorum_status,
    register_holders,
    settle_quorum,
)

HOSTS = ["h1:1", "h2:2", "h3:3"]
SUMS = {"data.parquet": (10, "ab"), "columns.txt": (3, "cd")}
PART = "all_1_1_0"


@pytest.mark.parametrize(("record", "holders", "required", "expected"), [
    (None, 2, 2, REACHED), (None, 1, 2, PENDING),
    ({"status": REACHED, "required": 2}, 2, 2, REACHED),
    ({"status": REACHED, "required": 2}, 2, 3, PENDING),   # a retry asking more than the first insert got
    ({"status": REACHED, "required": 2}, 3, 3, REACHED),
    ({"status": PENDING, "required": 3}, 3, 3, REACHED),   # the holders are there; the record lags
    ({"status": FAILED, "required": 2}, 3, 2, FAILED),
])
def test_quorum_status(record: dict[str, Any] | None, holders: int, required: int, expected: str) -> None:
    assert quorum_status(record, holders, required) == expected


def _write(store: SQLiteStore, writer: LogWriter, fn: Callable[[WriteEnv], Any]) -> Any:
    env = WriteEnv(store.begin(), writer, 1, datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC))
    out = fn(env)
    store.commit()
    return out


def test_a_pending_quorum_whose_holders_are_registered_is_settled() -> None:
    store, writer = SQLiteStore(None), LogWriter(NULL_OPTIME)
    quorum_ns, replicas_ns = state_ns("db", "t", "quorum"), state_ns("db", "t", "replicas")

    def prefix(env: WriteEnv) -> None:   # what a failover kept: the record and all three registrations
        env.emit(insert_entry(quorum_ns, {"_id": "b1", "part": PART, "required": 3, "status": PENDING}))
        for host in HOSTS:
            env.emit(insert_entry(replicas_ns, holder_doc(PART, host, "x", SUMS)))

    _write(store, writer, prefix)
    assert _write(store, writer, lambda env: settle_quorum(env, "db", "t", PART, "b1", HOSTS[:2])) is False
    assert store.reader.get(quorum_ns, "b1")["status"] == PENDING   # two of the members: not three
    assert _write(store, writer, lambda env: settle_quorum(env, "db", "t", PART, "b1", HOSTS)) is True
    assert store.reader.get(quorum_ns, "b1")["status"] == REACHED
    assert _write(store, writer, lambda env: settle_quorum(env, "db", "t", PART, "b1", HOSTS)) is False
    store.close()


def test_registering_the_last_holder_marks_the_quorum_reached() -> None:
    store, writer = SQLiteStore(None), LogWriter(NULL_OPTIME)
    quorum_ns = state_ns("db", "t", "quorum")
    _write(store, writer, lambda env: env.emit(insert_entry(quorum_ns, {"_id": "b1", "part": PART, "required": 2,
                                                                        "status": PENDING})))
    regs = [Registration("db", "t", PART, host, "x", SUMS, "b1") for host in HOSTS[:2]]
    assert _write(store, writer, lambda env: register_holders(env, regs[:1], HOSTS)) == 1
    assert store.reader.get(quorum_ns, "b1")["status"] == PENDING
    assert _write(store, writer, lambda env: register_holders(env, regs, HOSTS)) == 1   # the first is listed
    assert store.reader.get(quorum_ns, "b1")["status"] == REACHED
    store.close()
