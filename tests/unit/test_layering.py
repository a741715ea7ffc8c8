"""Decision cores stay pure: they import no I/O, clocks or randomness.

The simulator drives these modules with virtual time; a core that reads a socket
or the wall clock would make its runs non-deterministic.
"""

from __future__ import annotations

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
CORE_MODULES = [
    "oplog/values.py", "oplog/query.py", "oplog/update.py", "oplog/aggregate.py", "oplog/expressions.py",
    "oplog/optime.py", "oplog/entry.py", "oplog/index_keys.py", "oplog/errors.py",
    "replset/config.py", "replset/member.py", "replset/hello.py", "replset/status.py",
    "replset/write_concern.py", "replset/wire/codec.py", "replset/quorum.py", "replset/election.py",
    "replset/topology.py", "replset/messages.py", "replset/failpoints.py",
    "sync/sync_source.py", "sync/ping_stats.py", "sync/initial_sync_progress.py", "sync/too_stale.py",
    "sync/rollback.py",
]
FORBIDDEN = {"asyncio", "socket", "time", "random", "os", "aiohttp", "sqlite3", "threading", "subprocess",
             "oplog.sqlite_store", "replset.node", "replset.wire.server", "replset.http"}


def _imports(path: pathlib.Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


@pytest.mark.parametrize("module", CORE_MODULES)
def test_core_module_imports_no_io(module: str) -> None:
    path = ROOT / module
    assert path.exists(), f"{module} is missing"
    bad = {n for n in _imports(path) if n in FORBIDDEN or n.split(".")[0] in {"asyncio", "socket", "aiohttp"}}
    assert not bad, f"{module} imports {sorted(bad)}"
