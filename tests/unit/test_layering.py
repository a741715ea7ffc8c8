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

Time is one input: nothing in these packages reads the operating system's
clocks but `base.clock.SystemClock` (`time.monotonic()`, `time.time()`,
`time.perf_counter()`, `datetime.datetime.now()`, the event loop's `time()`...,
called or handed on as a callable). The member holds one `Clock` and every shell
takes its time from it, so a test can hand in a `ManualClock`.
"""

from __future__ import annotations

import ast
import pathlib
import textwrap

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


# -- time is one input -----------------------------------------------------------------------------------

CLOCK_MODULE = "base.clock"   # `SystemClock`: the one place that reads the OS clocks
TIME_READS = frozenset({"monotonic", "monotonic_ns", "time", "time_ns", "perf_counter", "perf_counter_ns",
                        "process_time", "process_time_ns", "thread_time", "thread_time_ns", "clock_gettime",
                        "clock_gettime_ns"})
DATETIME_READS = frozenset({"now", "utcnow", "today"})
LOOP_GETTERS = frozenset({"get_running_loop", "get_event_loop"})


def _dotted(node: ast.AST) -> str | None:
    """`a.b.c` for a chain of attributes on a name; a call in the chain reads as `f()` (`x.f().g`)."""
    parts: list[str] = []
    while True:
        if isinstance(node, ast.Attribute):
            parts.append(node.attr)
            node = node.value
        elif isinstance(node, ast.Call):
            parts.append("()")
            node = node.func
        elif isinstance(node, ast.Name):
            parts.append(node.id)
            return ".".join(reversed(parts)).replace(".()", "()")
        else:
            return None


def clock_reads(tree: ast.Module) -> list[tuple[int, str]]:
    """(line, what) for every direct read of an OS clock in `tree`: a call of, or a reference to (a
    callable handed on reads later), `time.monotonic` and its kin (through any name `time` is imported
    as, or imported from `time`), `datetime.now` / `utcnow` / `today`, and an event loop's `time()`.
    Comments and strings are no code, so never count; f-strings' expressions do."""
    time_names = {"time"} | {alias.asname for node in ast.walk(tree) if isinstance(node, ast.Import)
                             for alias in node.names if alias.name == "time" and alias.asname}
    found = []
    for node in ast.walk(tree):
        line = getattr(node, "lineno", 0)
        if isinstance(node, ast.ImportFrom) and node.module == "time" and node.level == 0:
            found += [(line, f"from time import {a.name}") for a in node.names if a.name in TIME_READS]
        elif isinstance(node, ast.Attribute):
            owner = _dotted(node.value)
            if owner in time_names and node.attr in TIME_READS:
                found.append((line, f"{owner}.{node.attr}"))
            elif (owner is not None and node.attr in DATETIME_READS
                  and owner.split(".")[-1] in ("datetime", "date")):
                found.append((line, f"{owner}.{node.attr}"))
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "time"
              and not node.args and not node.keywords):
            owner = _dotted(node.func.value) or ""
            if owner.split(".")[-1] == "loop" or owner.endswith("_loop") or any(
                    owner.endswith(f"{getter}()") for getter in LOOP_GETTERS):
                found.append((line, f"{owner}.time()"))
    return sorted(found)


@pytest.mark.parametrize("code", [
    "time.monotonic()", "time.time()", "time.perf_counter()", "time.time_ns()", "time.monotonic_ns()",
    "import time as t\nt.monotonic()", "from time import monotonic", "Snapshots(store, time.monotonic)",
    "f'{time.monotonic() - started:.1f}'", "datetime.datetime.now(datetime.UTC)", "datetime.now()",
    "datetime.datetime.utcnow()", "datetime.date.today()", "loop.time()", "self._loop.time()",
    "asyncio.get_running_loop().time()", "asyncio.get_event_loop().time()",
])
def test_the_clock_read_check_sees_each_kind(code: str) -> None:
    assert clock_reads(ast.parse(code)), f"{code!r} reads a clock, unseen"


@pytest.mark.parametrize("code", [
    '"""Like `time.monotonic()`."""', "# time.time()", "time.sleep(0.1)", "asyncio.sleep(1)", "value.time()",
    "datetime.datetime.fromtimestamp(0, datetime.UTC)", "clock.monotonic()", "node.now()", "self.clock.wall()",
])
def test_the_clock_read_check_passes_what_reads_no_clock(code: str) -> None:
    assert not clock_reads(ast.parse(textwrap.dedent(code)))


def test_only_the_clock_module_reads_the_os_clocks() -> None:
    assert clock_reads(MODULES[CLOCK_MODULE]), "base.clock no longer reads the OS clocks: is the check blind?"
    offenders = [f"{path.relative_to(ROOT)}:{line}: {what}"
                 for package in PACKAGES for path in sorted((ROOT / package).rglob("*.py"))
                 if _module_name(path) != CLOCK_MODULE
                 for line, what in clock_reads(MODULES[_module_name(path)])]
    assert not offenders, ("these read an OS clock directly; take the time from a `base.clock.Clock` passed "
                           "in (the member's `node.clock`):\n" + "\n".join(offenders))
