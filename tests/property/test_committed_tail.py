"""The store's reader answers `oplog_after` from the committed tail (`oplog.committed_tail`) when it can;
whatever the commits did to the oplog, the answer must be SQLite's, row for row.

Random transactions append entries (some in a savepoint rolled back, some transactions rolled back whole),
truncate the oplog after a key (a rollback), trim its oldest entries, drop it (initial sync) or replay an
entry over one it holds; a tiny tail bound makes it let go of its older half often. After each
transaction, reads after every interesting key are compared with the same statement run on SQLite.
"""

from __future__ import annotations

import itertools

import bson
from hypothesis import given, settings
from hypothesis import strategies as st

from oplog.committed_tail import CommittedTail
from oplog.sqlite_store import SQLiteStore, StoreTxn, _Reader

OPS = st.lists(st.one_of(
    st.tuples(st.just("append"), st.integers(1, 5)),
    st.tuples(st.just("append_undone"), st.integers(1, 3)),   # inside a savepoint rolled back
    st.tuples(st.just("append_aborted"), st.integers(1, 3)),  # the whole transaction rolled back
    st.tuples(st.just("truncate"), st.integers(0, 6)),        # after the key this many entries back
    st.tuples(st.just("trim"), st.integers(1, 4)),
    st.tuples(st.just("replay"), st.integers(0, 6)),          # an entry written again over one held
    st.tuples(st.just("drop"), st.just(0)),
), min_size=1, max_size=40)


def _sql(store: SQLiteStore, key: int, limit: int) -> list[tuple[int, bytes]]:
    return [(int(k), bytes(b)) for k, b in _Reader.oplog_after(store.reader, key, limit)]


def _rows(keys: list[int]) -> list[tuple[int, bytes]]:
    return [(k, bson.encode({"k": k, "pad": "x" * (k % 7)})) for k in keys]


def _keys(txn: StoreTxn) -> list[int]:
    return [int(k) for (k,) in txn._conn.execute("SELECT ts FROM oplog ORDER BY ts").fetchall()]


@settings(max_examples=150, deadline=None)
@given(OPS)
def test_reads_from_the_tail_are_sqlites_rows(ops: list[tuple[str, int]]) -> None:
    store = SQLiteStore(None)
    store.reader.tail = CommittedTail(None, max_rows=6, max_bytes=400)
    next_key = itertools.count(10, 3)   # fresh keys, newer than any before
    try:
        for op, n in ops:
            txn = store.begin()
            keys = _keys(txn)
            if op == "append":
                for _ in range(n):  # one statement each, or several entries in one
                    txn.append_oplog(_rows([next(next_key) for _ in range(1 + n % 2)]))
            elif op == "append_undone":
                txn.append_oplog(_rows([next(next_key)]))
                sp = txn.savepoint()
                txn.append_oplog(_rows([next(next_key) for _ in range(n)]))
                txn.rollback_to(sp)
            elif op == "append_aborted":
                txn.append_oplog(_rows([next(next_key) for _ in range(n)]))
                store.rollback()
                continue
            elif op == "truncate" and keys:
                txn.truncate_oplog_after(keys[max(0, len(keys) - 1 - n)])
            elif op == "trim" and keys:
                txn.trim_oplog(1, keys[min(n, len(keys) - 1)])
            elif op == "replay" and keys:
                key = keys[max(0, len(keys) - 1 - n)]
                txn.append_oplog([(key, bson.encode({"k": key, "again": True}))])
            elif op == "drop":
                txn.drop_replicated_data()
            store.commit()
            held = _sql(store, 0, 1000)
            probes = {0, store.reader.oplog_trimmed_through} | {k for k, _b in held} | {k - 1 for k, _b in held}
            for key in sorted(probes):
                for limit in (1, 3, 1000):
                    assert [(k, bytes(b)) for k, b in store.reader.oplog_after(key, limit)] == _sql(store, key, limit)
    finally:
        store.close()


def test_a_commit_after_a_cut_starts_from_the_newest_key() -> None:
    tail = CommittedTail(None)
    assert tail.after(0, 10) is None
    tail.committed([], 42)
    assert tail.after(41, 10) is None      # before the floor: SQLite's
    assert tail.after(42, 10) == []
    tail.committed([(43, b"a"), (44, b"b")], None)
    assert tail.after(42, 10) == [(43, b"a"), (44, b"b")]
    assert tail.after(43, 1) == [(44, b"b")]
    tail.cut()
    assert tail.after(44, 10) is None


def test_the_tail_lets_its_older_half_go_past_its_bounds() -> None:
    tail = CommittedTail(0, max_rows=4, max_bytes=1000)
    tail.committed([(k, b"x") for k in range(1, 6)], None)
    assert tail.after(0, 10) is None       # 1 and 2 let go: the floor is 2
    assert tail.after(2, 10) == [(3, b"x"), (4, b"x"), (5, b"x")]
    big = CommittedTail(0, max_rows=100, max_bytes=10)
    big.committed([(7, b"y" * 50)], None)
    assert big.after(6, 10) is None and big.after(7, 10) == []
