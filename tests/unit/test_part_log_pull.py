"""The part-log runner reads the oplog entries committed since its last look (`PartsManager._pull`); when
the capped oplog was trimmed past what it saw, it rebuilds from the state instead (it missed entries)."""

from __future__ import annotations

import typing

import bson

from replset.node import Node, NodeOptions


def _append(node: Node, keys: range) -> None:
    txn = node.store.begin()
    txn.append_oplog([(key, bson.encode({"op": "n", "ns": "", "o": {}})) for key in keys])
    node.store.commit()


def _trim_through(node: Node, key: int) -> None:
    txn = node.store.begin()
    txn.trim_oplog(1 << 40, key + 1)   # everything older than key + 1
    node.store.commit()


def test_a_trim_past_the_last_entry_seen_makes_the_runner_rebuild_and_one_up_to_it_does_not(
        tmp_path: typing.Any) -> None:
    node = Node(NodeOptions(port=1, dbpath=str(tmp_path)))
    try:
        parts = node.parts
        _append(node, range(1, 4))
        parts._pull()
        assert parts._seen_key == 3
        parts._rescan = False
        _trim_through(node, 3)        # only what the runner saw: nothing missed
        _append(node, range(4, 7))
        parts._pull()
        assert not parts._rescan and parts._seen_key == 6
        _append(node, range(7, 10))
        _trim_through(node, 8)        # 7 and 8 went before the runner read them
        parts._pull()
        assert parts._rescan
    finally:
        node.store.close()


def test_a_commit_of_ordinary_writes_moves_the_runner_without_waking_it(tmp_path: typing.Any) -> None:
    node = Node(NodeOptions(port=1, dbpath=str(tmp_path)))
    try:
        parts = node.parts
        _append(node, range(1, 3))      # the first commit after open: its rows are not known
        assert node.store.last_commit_rows is None
        parts.on_commit(node.store.last_commit_rows)
        assert parts._dirty
        parts._pull()
        parts._dirty = parts._rescan = False
        _append(node, range(3, 6))
        assert node.store.last_commit_rows is not None
        parts.on_commit(node.store.last_commit_rows)
        assert not parts._dirty and parts._seen_key == 5
        txn = node.store.begin()        # a part-log entry (a table's state collection) wakes it
        txn.append_oplog([(6, bson.encode({"op": "i", "ns": "db.system.parts.t.log", "o": {}}))])
        node.store.commit()
        parts.on_commit(node.store.last_commit_rows)
        assert parts._dirty
        parts._pull()
        parts._dirty = False
        txn = node.store.begin()        # a rollback's cut: the rows are not known, it looks
        txn.truncate_oplog_after(5)
        node.store.commit()
        parts.on_commit(node.store.last_commit_rows)
        assert parts._dirty
    finally:
        node.store.close()
