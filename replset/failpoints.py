"""Test-only fault hooks, set with `configureFailPoint` when the member runs with
`--enableTestCommands` (as mongod does).

Supported fail points:

* `peerLatency` — `data: {host: "h:p", delayMs: N}` (or `hosts: [...]`): every
  request this member sends to that peer (heartbeats, oplog fetches, position
  reports, votes) waits N ms first. Tests build sync chains by ping with it.
* `stopReplProducer` — the oplog fetcher stops fetching (MongoDB's name), so this
  member stops advancing until the fail point is turned off.
* `peerRoutes` — `data: {routes: {"h:p": "h2:p2", ...}}`: requests this member
  sends to peer `h:p` are dialled to `h2:p2` instead (a fault-injecting proxy in
  tests); the peer keeps its name everywhere else. Open connections follow a
  changed route on their next request. A member's HTTP address (`h:httpPort`)
  may be routed too: part fetches follow it.
* `initialSyncHangBeforeCopyingDatabases` — an initial sync waits, once it has
  dropped the data and recorded where applying will begin, until the fail point
  is turned off (MongoDB's name).
* `initialSyncHangDuringCollectionClone` — `data: {namespace: "db.coll",
  numDocsToClone: N}`: the clone of that collection fetches N documents per
  batch and waits once N are committed, until the fail point is turned off.

* `partsHangAfterCommit` — a part-log commit on the primary (an insert's blocks, made here or sent
  by another member) waits, once committed and its write concern met, before it answers, until the
  fail point is turned off: a test kills the primary "mid-commit" there.

* `partsCommitReplyLost` — on a member that sends part-log commits to the primary: every reply
  is dropped as if the connection broke after the primary committed (the outcome is unknown to
  this member). `data.deadlineMS` shortens this member's retries of one commit (default 60 s).

* `partsStopMerges` — the primary plans no merges while it is on (ClickHouse's `SYSTEM STOP MERGES`,
  for tests): parts accumulate, and a test decides when they merge.

* `failBatchWriteSlice` — a write command big enough to run in slices fails before its second
  and later slices with `data.errorCode` (default 91, ShutdownInProgress: retryable), as if the
  member had stopped part way; a retryable write retried then resumes where it stopped.

* `failCommand` — the drivers' test hook, with MongoDB's data: `failCommands` (the command names it
  applies to), then, in this order, `blockConnection` + `blockTimeMS` (the command waits first),
  `closeConnection` (the connection closes without a reply), `errorCode` (the command fails with that
  code and does not run), `writeConcernError` (the command runs and its reply carries this
  document); `errorLabels` replaces the labels the member would add; `appName` limits it to the
  connections whose handshake named that application, `namespace` to one collection. Connections of
  other members are spared unless `failInternalCommands` is true.

* `failGetMoreAfterCursorCheckout` — the next getMore fails with `data.errorCode` once its cursor is
  found (MongoDB's name; drivers test change-stream resumption with it).

* `onPrimaryTransactionalWrite` — a retryable write from a client on the primary: with
  `data.failBeforeCommitExceptionCode` it does not run (and fails with that code, or, with
  `closeConnection` true, the default, its connection closes); without, it runs and commits, and then
  (`closeConnection`) its connection closes before the reply (MongoDB's name and data).

* `maxTimeAlwaysTimeOut` — a command that sets `maxTimeMS` fails with MaxTimeMSExpired (50) at once
  (MongoDB's name; drivers test their time-out errors with it).

Modes: `"alwaysOn"`, `"off"`, `{times: N}` (on for the next N checks), `{skip: N}` (off for the
next N checks, then on). `failCommand` counts only the commands it applies to. Pure state; `changed`
is a counter the runtime may watch.
"""

from __future__ import annotations

__layer__ = "core"  # pure: no I/O, clock or randomness (tests/unit/test_layering.py)

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from base.errors import MongoError

KNOWN = frozenset({"peerLatency", "peerRoutes", "stopReplProducer", "initialSyncHangBeforeCopyingDatabases",
                   "initialSyncHangDuringCollectionClone", "failBatchWriteSlice", "partsHangAfterCommit",
                   "partsCommitReplyLost", "partsStopMerges", "failCommand", "failGetMoreAfterCursorCheckout",
                   "onPrimaryTransactionalWrite", "maxTimeAlwaysTimeOut"})


@dataclass(slots=True)
class FailPoint:
    times: int | None  # None: always on
    data: dict[str, Any] = field(default_factory=dict)
    skip: int = 0  # checks to let pass before it fires


class FailPoints:
    def __init__(self) -> None:
        self._active: dict[str, FailPoint] = {}
        self.changed = 0

    def configure(self, name: str, mode: Any, data: Any) -> int:
        """Sets a fail point; returns how many times it was entered before (always 0 here)."""
        if name not in KNOWN:
            raise MongoError(2, f"unknown fail point: {name}")
        if data is not None and not isinstance(data, Mapping):
            raise MongoError(2, "fail point data must be an object")
        if name == "peerLatency" and mode != "off":
            _check_latency_data(data or {})
        if name == "peerRoutes" and mode != "off":
            _check_routes_data(data or {})
        if name == "failCommand" and mode != "off":
            _check_fail_command_data(data or {})
        if mode == "off":
            self._active.pop(name, None)
        elif mode == "alwaysOn":
            self._active[name] = FailPoint(None, dict(data or {}))
        elif isinstance(mode, Mapping) and isinstance(mode.get("times"), int) and mode["times"] > 0:
            self._active[name] = FailPoint(int(mode["times"]), dict(data or {}))
        elif isinstance(mode, Mapping) and isinstance(mode.get("skip"), int) and mode["skip"] >= 0:
            self._active[name] = FailPoint(None, dict(data or {}), skip=int(mode["skip"]))
        else:
            raise MongoError(2, f"bad fail point mode {mode!r}")
        self.changed += 1
        return 0

    def check(self, name: str) -> FailPoint | None:
        """The fail point if it fires now (a `times` fail point counts down)."""
        point = self._active.get(name)
        if point is None:
            return None
        if point.skip > 0:
            point.skip -= 1
            return None
        if point.times is not None:
            point.times -= 1
            if point.times <= 0:
                del self._active[name]
        return point

    def command_failure(self, command: str, namespace: str, app_name: str | None,
                        internal: bool) -> dict[str, Any] | None:
        """The `failCommand` data if it fires for this command (see the module docstring)."""
        point = self._active.get("failCommand")
        if point is None:
            return None
        data = point.data
        if command not in data["failCommands"] or (internal and not data.get("failInternalCommands")):
            return None
        if "appName" in data and data["appName"] != app_name:
            return None
        if "namespace" in data and data["namespace"] != namespace:
            return None
        return data if self.check("failCommand") is not None else None

    def peek(self, name: str) -> FailPoint | None:
        """The fail point's settings, without counting a `times` fail point down."""
        return self._active.get(name)

    def is_on(self, name: str) -> bool:
        return name in self._active

    def latency_ms(self, host: str) -> float:
        point = self._active.get("peerLatency")
        if point is None:
            return 0.0
        hosts = point.data.get("hosts") or [point.data.get("host")]
        if host.lower() not in {str(h).lower() for h in hosts}:
            return 0.0
        return float(point.data.get("delayMs", 0))

    def peer_route(self, host: str) -> str:
        """The address to dial for peer `host`: its `peerRoutes` entry, else `host` itself."""
        point = self._active.get("peerRoutes")
        if point is None:
            return host
        wanted = host.lower()
        return next((to for name, to in point.data["routes"].items() if name.lower() == wanted), host)


def _check_routes_data(data: Mapping[str, Any]) -> None:
    routes = data.get("routes")
    if not isinstance(routes, Mapping) or not all(
            isinstance(k, str) and isinstance(v, str) and _is_host_port(k) and _is_host_port(v)
            for k, v in routes.items()):
        raise MongoError(2, 'peerRoutes needs data.routes: {"host:port": "host:port", ...}')


def _is_host_port(address: str) -> bool:
    host, _, port = address.rpartition(":")
    return bool(host) and port.isdigit() and 0 < int(port) < 65536


def _check_fail_command_data(data: Mapping[str, Any]) -> None:
    commands = data.get("failCommands")
    if not isinstance(commands, list) or not all(isinstance(c, str) for c in commands):
        raise MongoError(2, "failCommand needs data.failCommands: a list of command names")
    code = data.get("errorCode")
    if code is not None and (isinstance(code, bool) or not isinstance(code, int)):
        raise MongoError(2, "failCommand's data.errorCode must be an integer")
    labels = data.get("errorLabels")
    if labels is not None and (not isinstance(labels, list) or not all(isinstance(x, str) for x in labels)):
        raise MongoError(2, "failCommand's data.errorLabels must be a list of strings")
    block = data.get("blockTimeMS", 0)
    if data.get("blockConnection") and (isinstance(block, bool) or not isinstance(block, (int, float))
                                        or not 0 <= block <= 600_000):
        raise MongoError(2, "failCommand's data.blockTimeMS must be between 0 and 600000")
    wce = data.get("writeConcernError")
    if wce is not None and not (isinstance(wce, Mapping) and isinstance(wce.get("code"), int)):
        raise MongoError(2, "failCommand's data.writeConcernError must be a document with a code")


def _check_latency_data(data: Mapping[str, Any]) -> None:
    hosts = data.get("hosts", [data.get("host")])
    if not isinstance(hosts, list) or not hosts or not all(isinstance(h, str) for h in hosts):
        raise MongoError(2, "peerLatency needs data.host (a string) or data.hosts (a list of strings)")
    delay = data.get("delayMs", 0)
    if isinstance(delay, bool) or not isinstance(delay, (int, float)) or not 0 <= delay <= 60_000:
        raise MongoError(2, "peerLatency needs data.delayMs between 0 and 60000")
