"""Decision cores stay pure, and dependencies point one way.

A module joins the pure set by saying so: a top-level `__layer__ = "core"`
(there is no list to keep here). For every such module, everything it imports
from the project, directly or through other modules, must be a core too - so a
core can never reach a shell (`replset.replication`, `replset.node`, the wire
server, storage) however long the import chain - and nothing it reaches may
import I/O, clocks, threads or randomness. The simulator drives these modules
with virtual time; a core that read a socket or the wall clock would make its
runs non-deterministic.

Layers, and every module's imports (type-checking ones included) point down only:

    base  <-  oplog  <-  sync  <-  replset (the member)  <-  front ends

`base` is the set's vocabulary (optimes, errors, member states, config, the wire
codec, replication messages); `oplog` the data; `sync` replication (its shells
see the member through the protocols of `sync.host`); `replset` the member; the
front ends (`replset.wire`, `replset.http`, `replset.cli`, `replset.server_main`)
sit on top. The layer of a module is derived from its name.
"""

from __future__ import annotations

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
PACKAGES = ("base", "oplog", "sync", "replset")
FORBIDDEN = {"asyncio", "socket", "time", "random", "os", "aiohttp", "sqlite3", "threading", "subprocess",
             "multiprocessing", "concurrent", "selectors", "signal", "datetime.datetime.now"}
LAYERS = ("base", "oplog", "sync", "member", "front end")
FRONT_ENDS = ("replset.wire", "replset.http", "replset.cli", "replset.server_main", "replset.__main__")


def _module_name(path: pathlib.Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _all_modules() -> dict[str, ast.Module]:
    found = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            found[_module_name(path)] = ast.parse(path.read_text())
    return found


MODULES = _all_modules()


def _is_core(tree: ast.Module) -> bool:
    for node in tree.body:
        if (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)
                and node.targets[0].id == "__layer__" and isinstance(node.value, ast.Constant)
                and node.value.value == "core"):
            return True
    return False


CORES = sorted(name for name, tree in MODULES.items() if _is_core(tree))


def layer(module: str) -> int:
    """The rank of a module's layer in `LAYERS` (a module may import its own layer and those below)."""
    if module in FRONT_ENDS or module.startswith(tuple(f"{name}." for name in FRONT_ENDS)):
        return LAYERS.index("front end")
    top = module.split(".")[0]
    return LAYERS.index("member" if top == "replset" else top)


def _imports(tree: ast.Module, *, type_checking: bool = False) -> set[str]:
    """Every module named by an import; type-checking-only imports (they never run) only if asked."""
    names: set[str] = set()
    skip: set[int] = set()
    for node in ast.walk(tree):
        if (not type_checking and isinstance(node, ast.If) and isinstance(node.test, ast.Name)
                and node.test.id == "TYPE_CHECKING"):
            skip.update(id(child) for stmt in node.body for child in ast.walk(stmt))
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def _project_module(name: str) -> str | None:
    """The project module `name` refers to (a module, or a package's `__init__`), if any."""
    while name:
        if name in MODULES:
            return name
        name = name.rpartition(".")[0]
    return None


def test_the_pure_set_is_not_empty() -> None:
    assert {"replset.replica", "replset.candidacy", "replset.quorum", "sync.sync_source"} <= set(CORES)


@pytest.mark.parametrize("core", CORES)
def test_a_core_reaches_only_cores_and_no_io(core: str) -> None:
    seen: set[str] = set()
    stack = [core]
    while stack:
        name = stack.pop()
        if name in seen:
            continue
        seen.add(name)
        for imported in _imports(MODULES[name]):
            top = imported.split(".")[0]
            assert top not in FORBIDDEN and imported not in FORBIDDEN, f"{name} (reached from {core}) imports {imported}"
            target = _project_module(imported)
            if target is None or target in PACKAGES:
                continue  # not the project's, or a package's empty __init__
            assert target in CORES, f"{core} reaches {target} (through {name}), which is not a core"
            assert layer(target) <= layer(core), f"{core} reaches {target}: a lower layer reaches a higher"
            stack.append(target)


@pytest.mark.parametrize("module", sorted(MODULES))
def test_imports_point_down(module: str) -> None:
    for imported in _imports(MODULES[module], type_checking=True):
        target = _project_module(imported)
        if target is None or target in PACKAGES:
            continue
        assert layer(target) <= layer(module), (
            f"{module} ({LAYERS[layer(module)]}) imports {target} ({LAYERS[layer(target)]}): "
            "dependencies must point down")


def test_the_base_layer_is_the_set_vocabulary() -> None:
    assert {"base.optime", "base.errors", "base.member", "base.config", "base.messages", "base.codec"} <= {
        name for name in MODULES if layer(name) == 0}
