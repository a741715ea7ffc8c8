"""The member provides everything the replication shells ask of it (`sync.host`).

`sync` never imports `replset`: its shells are typed against the protocols of
`sync.host`, which the member satisfies structurally. Nothing checks that at
import time, so this does: every member of each protocol exists on a real
(in-memory) member.
"""

from __future__ import annotations

import typing

import pytest

from replset.node import Node, NodeOptions
from sync import host


def _protocol_members(protocol: type) -> set[str]:
    names = set(typing.get_type_hints(protocol)) | {
        name for name, value in vars(protocol).items()
        if not name.startswith("_") and (callable(value) or isinstance(value, property))}
    return names


@pytest.fixture
def member(tmp_path: typing.Any) -> typing.Iterator[Node]:
    node = Node(NodeOptions(port=1, dbpath=str(tmp_path)))
    try:
        yield node
    finally:
        node.store.close()


@pytest.mark.parametrize(("protocol", "path"), [
    (host.SyncHost, ""), (host.Replication, "repl"), (host.Failpoints, "failpoints"), (host.Writer, "writer"),
    (host.Options, "options"), (host.Signal, "repl.topology_changed"), (host.TooStaleHandler, "repl.resync"),
    (host.HopMarks, "hops")])
def test_the_member_provides_what_sync_asks(member: Node, protocol: type, path: str) -> None:
    target: typing.Any = member
    for part in filter(None, path.split(".")):
        target = getattr(target, part)
    missing = sorted(name for name in _protocol_members(protocol) if not hasattr(target, name))
    assert not missing, f"{type(target).__name__} lacks {missing}, which {protocol.__name__} promises"
