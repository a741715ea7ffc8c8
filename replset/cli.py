"""Command line: `replset node`, `replset up`, `replset status`, `replset resync`."""

from __future__ import annotations

import argparse
import io
import os
import signal
import ssl
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from base.clock import SYSTEM_CLOCK
from base.errors import MongoError
from base.member import MemberState
from oplog.parts.block_size import DEFAULT_MAX_DECODED_BYTES
from oplog.parts.storage_url import parse_storage_url
from replset.dbpath_lock import EXIT_DBPATH_IN_USE
from replset.node import NodeOptions
from replset.tls import DISABLED, MODES, TlsConfigError, TlsSettings
from replset.wire.admission import (
    DEFAULT_MAX_IDLE,
    DEFAULT_MAX_NEW_PER_SOURCE,
    DEFAULT_MAX_PARTIAL,
    DEFAULT_MAX_PARTIAL_BYTES,
    STALLED_MS,
    Budgets,
)
from replset.wire.server import WRITE_STALL_TIMEOUT_S, WireLimits
from sync.initial_sync_progress import copy_totals

T = TypeVar("T")


def _node_parser(sub: Any) -> None:
    p = sub.add_parser("node", help="run one member process")
    p.add_argument("--port", type=int, default=27017)
    p.add_argument("--replSet", dest="repl_set", default="rs0")
    p.add_argument("--dbpath", default="./data/db")
    p.add_argument("--bind_ip", default="127.0.0.1",
                   help="comma-separated addresses both ports listen on (default: 127.0.0.1 only)")
    p.add_argument("--bind_ip_all", action="store_true", help="listen on every IPv4 and IPv6 interface")
    p.add_argument("--oplogSizeMB", dest="oplog_size_mb", type=int, default=1024)
    p.add_argument("--httpPort", dest="http_port", type=int, default=None,
                   help="HTTP status port (default: port + 1000)")
    p.add_argument("--enableTestCommands", dest="enable_test_commands", action="store_true")
    p.add_argument("--auth", action="store_true",
                   help="clients must authenticate (SCRAM users in admin.system.users); needs --keyFile")
    p.add_argument("--keyFile", dest="key_file", default=None, metavar="PATH",
                   help="members authenticate to each other with this key (implies --auth)")
    p.add_argument("--tlsMode", dest="tls_mode", default=DISABLED, choices=MODES,
                   help="requireTLS: the wire and HTTP ports take TLS connections only, and members use "
                        "TLS to each other")
    p.add_argument("--tlsCertificateKeyFile", dest="tls_cert_key_file", default=None, metavar="PEM",
                   help="this member's certificate and private key")
    p.add_argument("--tlsCAFile", dest="tls_ca_file", default=None, metavar="PEM",
                   help="the CA that signs the members' (and clients') certificates")
    p.add_argument("--partsStorage", dest="parts_storage", default=None, metavar="URL",
                   help="shared storage for the part files of zeroCopy tables (docs/zero-copy.md): file:///dir (a "
                        "directory every member reaches at that path) or s3://bucket/prefix?endpoint=http://host:"
                        "port&region=r (credentials from the AWS environment variables); the same on every member")
    p.add_argument("--maxDecodedBlockBytes", dest="max_decoded_block_bytes", type=int,
                   default=DEFAULT_MAX_DECODED_BYTES, metavar="N",
                   help="the most an insert block (insertBlock, stagePartsBlock, the HTTP insert) may take "
                        "decoded - its Arrow stream decompressed, its rows in the table's schema - measured "
                        "before it is decoded; past it the insert is refused (BSONObjectTooLarge, 10334). "
                        "0: no limit. Default %(default)s (256 MiB)")
    p.add_argument("--logLevel", dest="log_level", default="INFO")
    p.add_argument("--logFormat", dest="log_format", default="text", choices=("text", "json"),
                   help="json: MongoDB-style structured lines (t, s, c, id, ctx, msg, attr)")
    p.add_argument("--traceSQL", dest="trace_sql", default=None, metavar="FILE",
                   help="append every SQL statement the member runs to FILE (one JSON string a line), "
                        "to check query plans")
    p.add_argument("--maxConns", dest="max_conns", type=int, default=None, metavar="N",
                   help="most client connections open at once; past it a new connection takes the place of "
                        "the client connection idle longest (idle 5 s or more), or is closed without a reply "
                        "unless it logs in as a member with the keyfile (members' connections never count). "
                        "Default (as mongod): 80%% of the "
                        "open-file limit (ulimit -n), at most 1,000,000, leaving descriptors for the "
                        "database files, peer connections and the HTTP port; a larger N is capped to it")
    p.add_argument("--maxIdleConns", dest="max_idle_conns", type=int, default=DEFAULT_MAX_IDLE, metavar="N",
                   help="most client connections left idle at once; past it the ones idle longest are closed "
                        "(drivers open a new one when they need it), so that members and new clients are "
                        "always served. Default %(default)s")
    p.add_argument("--maxPartialConns", dest="max_partial_conns", type=int, default=DEFAULT_MAX_PARTIAL,
                   metavar="N", help="most unauthenticated client connections that have not finished a "
                                     "message (a first one, or the one they are sending); past it the one "
                                     "waiting longest is closed. Default %(default)s")
    p.add_argument("--maxNewConnsPerSource", dest="max_new_per_source", type=int,
                   default=DEFAULT_MAX_NEW_PER_SOURCE, metavar="N",
                   help="most connections from one address that have not finished a first message; past it "
                        "the oldest from that address is closed. Default %(default)s")
    p.add_argument("--maxPartialBytes", dest="max_partial_bytes", type=int, default=DEFAULT_MAX_PARTIAL_BYTES,
                   metavar="BYTES", help="most bytes of unfinished messages buffered, on all connections "
                                         "together (at least 48,000,000); past it the connection whose message "
                                         "began first is closed, members' never. Default %(default)s")
    # Hidden: tests shorten the wire server's deadlines (see replset/wire/server.py).
    p.add_argument("--stalledMessageTimeoutSecs", dest="stalled_message_timeout_s", type=float,
                   default=STALLED_MS / 1000, help=argparse.SUPPRESS)
    p.add_argument("--writeStallTimeoutSecs", dest="write_stall_timeout_s", type=float,
                   default=WRITE_STALL_TIMEOUT_S, help=argparse.SUPPRESS)


def _up_parser(sub: Any) -> None:
    p = sub.add_parser("up", help="start (or restart) a local replica set and supervise it")
    p.add_argument("--nodes", type=int, default=3)
    p.add_argument("--port", type=int, default=27017)
    p.add_argument("--dir", default="./data")
    p.add_argument("--replSet", dest="repl_set", default="rs0")
    p.add_argument("--enableTestCommands", dest="enable_test_commands", action="store_true")
    p.add_argument("--auth", action="store_true",
                   help="access control: a keyfile (mode 0600) under --dir for the members, and a first "
                        "user with the root role from --user/--password (asked for when not given)")
    p.add_argument("--user", default=None)
    p.add_argument("--password", default=None)
    p.add_argument("--tlsCertificateKeyFile", dest="tls_cert_key_file", default=None, metavar="PEM",
                   help="TLS (requireTLS) on every member with this certificate and key (give --tlsCAFile too)")
    p.add_argument("--tlsCAFile", dest="tls_ca_file", default=None, metavar="PEM")
    p.add_argument("--partsStorage", dest="parts_storage", default=None, metavar="URL",
                   help="every member's --partsStorage (the shared storage of zeroCopy tables' part files)")


def _status_parser(sub: Any) -> None:
    p = sub.add_parser("status", help="print replSetGetStatus as a table")
    p.add_argument("--host", default="127.0.0.1:27017")
    p.add_argument("--json", action="store_true", help="print the raw document as relaxed extended JSON")
    _login_args(p)


def _login_args(p: Any) -> None:
    p.add_argument("--user", default=None, help="log in as this user (a set with access control)")
    p.add_argument("--password", default=None)
    p.add_argument("--tlsCAFile", dest="tls_ca_file", default=None, metavar="PEM",
                   help="connect with TLS, checking the member's certificate against this CA")


def _credentials(args: argparse.Namespace) -> tuple[str, str] | None:
    return None if args.user is None else (args.user, args.password or "")


def _resync_parser(sub: Any) -> None:
    p = sub.add_parser("resync", help="make a member drop its data and initial-sync from the set")
    p.add_argument("--host", required=True, help="the member (host:port) to resync; never the primary")
    p.add_argument("--no-wait", dest="wait", action="store_false",
                   help="return once the resync has started instead of showing its progress")
    _login_args(p)


def cmd_node(args: argparse.Namespace) -> int:
    from replset.structured_log import configure

    configure(args.log_level, args.log_format, args.port)
    from replset.auth.keyfile import KeyFileError, read_keyfile
    from replset.server_main import run_node

    if args.auth and not args.key_file:
        print("--auth needs --keyFile: the members of a set must prove themselves to each other",
              file=sys.stderr)
        return 2
    if args.key_file:
        try:
            read_keyfile(args.key_file)
        except KeyFileError as err:
            print(f"--keyFile: {err}", file=sys.stderr)
            return 2
    tls = TlsSettings(args.tls_mode, args.tls_cert_key_file, args.tls_ca_file)
    try:
        tls.check()
        tls.server_context()
        tls.client_context()
    except (TlsConfigError, OSError, ssl.SSLError) as err:
        print(f"TLS: {err}", file=sys.stderr)
        return 2
    if args.bind_ip_all and args.bind_ip != "127.0.0.1":
        print("--bind_ip and --bind_ip_all are exclusive", file=sys.stderr)
        return 2
    if not _storage_url_ok(args.parts_storage):
        return 2
    if args.max_decoded_block_bytes < 0:
        print("--maxDecodedBlockBytes must be 0 (no limit) or a number of bytes", file=sys.stderr)
        return 2
    budgets = _connection_budgets(args)
    if budgets is None:
        return 2
    run_node(NodeOptions(port=args.port, repl_set=args.repl_set, dbpath=args.dbpath,
                         bind_ip="*" if args.bind_ip_all else args.bind_ip,
                         oplog_size_mb=args.oplog_size_mb, enable_test_commands=args.enable_test_commands,
                         http_port=args.http_port, trace_sql=args.trace_sql,
                         auth=bool(args.auth or args.key_file), key_file=args.key_file, tls=tls,
                         parts_storage=args.parts_storage, max_decoded_block_bytes=args.max_decoded_block_bytes),
             WireLimits(max_conns=args.max_conns, budgets=budgets, write_stall_timeout_s=args.write_stall_timeout_s))
    return 0


def _connection_budgets(args: argparse.Namespace) -> Budgets | None:
    """The wire server's budgets from the command line; None (and why, on stderr) when one is out of range."""
    try:
        return Budgets(max_idle=args.max_idle_conns, max_partial=args.max_partial_conns,
                       max_new_per_source=args.max_new_per_source, max_partial_bytes=args.max_partial_bytes,
                       stalled_ms=int(args.stalled_message_timeout_s * 1000))
    except ValueError as err:
        print(f"connection budgets: {err}", file=sys.stderr)
        return None


def _storage_url_ok(url: str | None) -> bool:
    """`--partsStorage` names a storage (or is not given); otherwise says why on stderr."""
    if url is None:
        return True
    try:
        parse_storage_url(url)
    except MongoError as err:
        print(err.errmsg, file=sys.stderr)
        return False
    return True


MIN_RESTART_DELAY_S = 1.0
MAX_RESTART_DELAY_S = 30.0
STABLE_UPTIME_S = 60.0  # a member that stayed up this long restarts after MIN_RESTART_DELAY_S again
SUPERVISE_POLL_S = 0.2
STOP_TIMEOUT_S = 10.0


READY_TIMEOUT_S = 120.0   # `up` waits this long for every member to be PRIMARY or SECONDARY


def wait_until(predicate: Callable[[], T], timeout_s: float = 20.0, what: str = "condition",
               interval_s: float = 0.02) -> T:
    """Polls `predicate` (errors count as "not yet") until it is truthy or the deadline passes."""
    deadline = SYSTEM_CLOCK.monotonic() + timeout_s
    last_error: Exception | None = None
    while SYSTEM_CLOCK.monotonic() < deadline:
        try:
            result = predicate()
            if result:
                return result
        except Exception as exc:  # the member may still be starting
            last_error = exc
        time.sleep(interval_s)
    raise TimeoutError(f"timed out waiting for {what} (last error: {last_error!r})")


def restart_delay(previous_delay_s: float | None, uptime_s: float) -> float:
    """How long to wait before restarting a member that exited after `uptime_s` seconds.

    The first restart, and any restart after the member stayed up STABLE_UPTIME_S, waits
    MIN_RESTART_DELAY_S; a member that keeps dying quickly waits twice as long each time, up to
    MAX_RESTART_DELAY_S.
    """
    if previous_delay_s is None or uptime_s >= STABLE_UPTIME_S:
        return MIN_RESTART_DELAY_S
    return min(previous_delay_s * 2, MAX_RESTART_DELAY_S)


@dataclass
class _Child:
    """One supervised member process and its restart state."""

    port: int
    cmd: list[str]
    log_path: str
    process: subprocess.Popen[bytes] | None = None
    started_at: float = 0.0
    last_delay_s: float | None = None
    restart_at: float | None = None  # set while the member is down and waiting for its restart
    given_up: bool = False  # it exited in a way a restart cannot mend

    def start(self) -> None:
        with open(self.log_path, "ab") as log_file:  # the child keeps its own descriptor
            self.process = subprocess.Popen(self.cmd, stdout=log_file, stderr=subprocess.STDOUT)
        self.started_at = SYSTEM_CLOCK.monotonic()
        self.restart_at = None


class _Supervisor:
    """Keeps the member processes of `up` running: restarts any that exit, with backoff."""

    def __init__(self, args: argparse.Namespace, ports: list[int]) -> None:
        self.children: list[_Child] = []
        for port in ports:
            dbpath = os.path.join(args.dir, str(port))
            os.makedirs(dbpath, exist_ok=True)
            cmd = [sys.executable, "-m", "replset", "node", "--port", str(port), "--replSet", args.repl_set,
                   "--dbpath", dbpath]
            if args.enable_test_commands:
                cmd.append("--enableTestCommands")
            if args.auth:
                cmd += ["--keyFile", keyfile_path(args.dir)]
            if args.tls_cert_key_file:
                cmd += ["--tlsMode", "requireTLS", "--tlsCertificateKeyFile", os.path.abspath(args.tls_cert_key_file)]
                if args.tls_ca_file:
                    cmd += ["--tlsCAFile", os.path.abspath(args.tls_ca_file)]
            if args.parts_storage:
                cmd += ["--partsStorage", args.parts_storage]
            self.children.append(_Child(port, cmd, os.path.join(args.dir, f"{port}.log")))

    def start_all(self) -> None:
        for child in self.children:
            child.start()

    def check(self) -> None:
        """One supervision step: notices exits and performs restarts that are due. Never blocks."""
        now = SYSTEM_CLOCK.monotonic()
        for child in self.children:
            if child.restart_at is not None:
                if now >= child.restart_at:
                    child.start()
                    assert child.process is not None
                    print(f"member on port {child.port} restarted (pid {child.process.pid})", flush=True)
                continue
            assert child.process is not None
            code = child.process.poll()
            if code is None or child.given_up:
                continue
            if code == EXIT_DBPATH_IN_USE:  # another process holds its data directory: restarting cannot help
                child.given_up = True
                print(f"member on port {child.port} exited: its data directory is in use by another process "
                      f"(DBPathInUse); not restarting it (log: {child.log_path})", flush=True)
                continue
            delay = restart_delay(child.last_delay_s, now - child.started_at)
            child.last_delay_s = delay
            child.restart_at = now + delay
            print(f"member on port {child.port} exited with code {code}; restarting in {delay:g} s "
                  f"(log: {child.log_path})", flush=True)

    def all_given_up(self) -> bool:
        return all(child.given_up for child in self.children)

    def stop_all(self, timeout_s: float = STOP_TIMEOUT_S) -> None:
        """Terminates every running member, waits up to `timeout_s` in all, then kills what is left."""
        running = [c for c in self.children if c.process is not None and c.process.poll() is None]
        for child in self.children:
            child.restart_at = None
        for child in running:
            assert child.process is not None
            child.process.terminate()
        deadline = SYSTEM_CLOCK.monotonic() + timeout_s
        for child in running:
            assert child.process is not None
            try:
                child.process.wait(timeout=max(deadline - SYSTEM_CLOCK.monotonic(), 0.0))
            except subprocess.TimeoutExpired:
                print(f"member on port {child.port} did not stop within {timeout_s:g} s; killing it",
                      file=sys.stderr, flush=True)
                child.process.kill()
                child.process.wait()


class _NoMembers(BaseException):
    """Raised out of the start-up waits when no member can run (not an Exception, as `_Stopped`)."""


class _Stopped(BaseException):
    """Raised out of the start-up waits when SIGINT/SIGTERM arrives (not an Exception: wait_until
    must not swallow it)."""


def _client(host: str, credentials: tuple[str, str] | None = None, tls: dict[str, Any] | None = None) -> Any:
    from pymongo import MongoClient

    login = {} if credentials is None else {"username": credentials[0], "password": credentials[1]}
    return MongoClient(f"mongodb://{host}/?directConnection=true", serverSelectionTimeoutMS=2000, **login,
                       **(tls or {}))


def _tls_client(args: argparse.Namespace) -> dict[str, Any]:
    """The driver's TLS options for `--tlsCAFile` (status, resync) or a set `up` runs with TLS."""
    ca = getattr(args, "tls_ca_file", None)
    if ca:
        return {"tls": True, "tlsCAFile": ca}
    return {"tls": True} if getattr(args, "tls_cert_key_file", None) else {}


def _initiate_if_needed(hosts: list[str], repl_set: str, wait: Callable[..., Any],
                        credentials: tuple[str, str] | None = None,
                        tls: dict[str, Any] | None = None) -> tuple[str, str] | None:
    """Initiates a new set; returns the credentials the set needs from now on (None while it has no
    user: the localhost exception serves)."""
    from pymongo.errors import OperationFailure

    needed = None
    with _client(hosts[0], tls=tls) as client:
        wait(lambda: client.admin.command("ping"), 30, f"{hosts[0]} to accept connections")
        try:
            existing = client.admin.command("replSetGetConfig")["config"]
        except OperationFailure as exc:
            if exc.code == 13 and credentials is not None:  # users exist: log in
                with _client(hosts[0], credentials, tls) as logged_in:
                    existing = logged_in.admin.command("replSetGetConfig")["config"]
                needed = credentials
            elif exc.code == 94:  # not initiated yet
                existing = None
            else:
                raise
        if existing is not None:
            configured = sorted(m["host"] for m in existing.get("members", []))
            if configured != sorted(hosts):
                print(f"replset up: warning: the set on disk has members {', '.join(configured)}; "
                      f"`up` does not reconfigure an existing set (remove its --dir to start afresh)",
                      file=sys.stderr, flush=True)
            return needed
        for host in hosts[1:]:  # replSetInitiate checks that every proposed member answers
            with _client(host, tls=tls) as other:
                wait(lambda other=other: other.admin.command("ping"), 30, f"{host} to accept connections")
        config = {"_id": repl_set, "members": [{"_id": i, "host": h} for i, h in enumerate(hosts)]}
        client.admin.command("replSetInitiate", config)
    return None


KEYFILE_NAME = "keyfile"


def keyfile_path(directory: str) -> str:
    return os.path.abspath(os.path.join(directory, KEYFILE_NAME))


def _first_user(args: argparse.Namespace, hosts: list[str]) -> None:
    """With --auth: creates the first user (root, on the primary) through the localhost exception, if
    none exists."""
    from pymongo import MongoClient
    from pymongo.errors import OperationFailure

    user, password = args.user, args.password
    with MongoClient(f"mongodb://{','.join(hosts)}/?replicaSet={args.repl_set}",
                     serverSelectionTimeoutMS=30000, **_tls_client(args)) as client:
        try:
            client.admin.command("usersInfo", 1)
            return  # an authenticated-only command answered: users exist (it is refused while none do)
        except OperationFailure as err:
            if err.code != 13:
                raise
        if user is None or password is None:
            if not sys.stdin.isatty():
                print("no user yet: give --user and --password to create the first one", flush=True)
                return
            import getpass

            user = user or input("first user's name: ")
            password = password or getpass.getpass(f"password for {user}: ")
        try:
            client.admin.command("createUser", user, pwd=password, roles=["root"])
        except OperationFailure as err:
            if err.code == 13:
                return  # users exist already (the localhost exception is over)
            raise
    print(f"created user {user} (root on admin)", flush=True)


def _not_ready(client: Any) -> list[str]:
    """The members not PRIMARY or SECONDARY yet, with their states, as the member asked sees them."""
    members = client.admin.command("replSetGetStatus")["members"]
    return [f"{m['name']} ({m['stateStr']})" for m in members if m["stateStr"] not in ("PRIMARY", "SECONDARY")]


def _wait_ready(client: Any, wait: Callable[[Callable[[], Any], float, str], Any]) -> None:
    """"is up" means every member answers reads and counts for w:N: until they do (an initial sync takes a
    moment), a line says which are still syncing; past `READY_TIMEOUT_S` a warning names them instead."""
    pending = _not_ready(client)
    if not pending:
        return
    print(f"a primary is elected; waiting for {', '.join(pending)} to finish syncing", flush=True)
    try:
        wait(lambda: not _not_ready(client), READY_TIMEOUT_S, "every member PRIMARY or SECONDARY")
    except TimeoutError:
        print(f"warning: {', '.join(_not_ready(client))} not PRIMARY or SECONDARY after {READY_TIMEOUT_S:g} s",
              flush=True)


def cmd_up(args: argparse.Namespace) -> int:
    from pymongo.errors import OperationFailure

    if not _storage_url_ok(args.parts_storage):
        return 2
    os.makedirs(args.dir, exist_ok=True)
    if args.auth and not os.path.exists(keyfile_path(args.dir)):
        from replset.auth.keyfile import write_keyfile

        write_keyfile(keyfile_path(args.dir))
    ports = [args.port + i for i in range(args.nodes)]
    hosts = [f"127.0.0.1:{p}" for p in ports]
    supervisor = _Supervisor(args, ports)
    stopping = False

    def stop(_signum: int, _frame: Any) -> None:
        nonlocal stopping
        stopping = True

    def wait(predicate: Callable[[], T], timeout_s: float, what: str) -> T:
        """wait_until that keeps supervising the members and gives up on SIGINT/SIGTERM."""
        def step() -> T:
            if stopping:
                raise _Stopped
            supervise()
            return predicate()

        return wait_until(step, timeout_s, what, interval_s=0.1)

    def supervise() -> None:
        supervisor.check()
        if supervisor.all_given_up():
            raise _NoMembers(f"every member's data directory under {args.dir} is in use by another process "
                             "(is another `replset up` running there?)")

    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        supervisor.start_all()
        given = (args.user, args.password) if args.user is not None and args.password is not None else None
        credentials = _initiate_if_needed(hosts, args.repl_set, wait, given, _tls_client(args))
        with _client(hosts[0], credentials, _tls_client(args)) as client:
            wait(lambda: any(m["stateStr"] == "PRIMARY" for m in
                             client.admin.command("replSetGetStatus")["members"]), 60, "a primary")
            _wait_ready(client, wait)
        if args.auth:
            _first_user(args, hosts)
        print(f"replica set {args.repl_set} is up")
        tls_options = f"&tls=true&tlsCAFile={os.path.abspath(args.tls_ca_file)}" if args.tls_ca_file else \
            ("&tls=true" if args.tls_cert_key_file else "")
        print(f"  connection string: mongodb://{','.join(hosts)}/?replicaSet={args.repl_set}{tls_options}")
        scheme = "https" if args.tls_cert_key_file else "http"
        print(f"  live page: {scheme}://127.0.0.1:{ports[0] + 1000}/ (on every member's HTTP port)")
        for p in ports:
            print(f"  status: {scheme}://127.0.0.1:{p + 1000}/replSetGetStatus")
        print("members that exit are restarted; press Ctrl-C to stop", flush=True)
        while not stopping:
            supervise()
            time.sleep(SUPERVISE_POLL_S)
    except _Stopped:
        pass
    except (TimeoutError, OperationFailure, _NoMembers) as exc:
        print(f"replset up: {exc}", file=sys.stderr, flush=True)
        return 1
    finally:
        print("stopping members", flush=True)
        supervisor.stop_all()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    print("stopped", flush=True)
    return 0


def _optime_parts(optime: Any) -> tuple[int, int] | None:
    """(secs, inc) of an optime document, or None when absent or null (never written)."""
    ts = optime.get("ts") if isinstance(optime, Mapping) else None
    if ts is None or (ts.time == 0 and ts.inc == 0):
        return None
    return int(ts.time), int(ts.inc)


def _fmt_optime(optime: Any) -> str:
    parts = _optime_parts(optime)
    return "-" if parts is None else f"{parts[0]}.{parts[1]}"


def _optime_order(optime: Any) -> tuple[int, int, int]:
    parts = _optime_parts(optime) or (0, 0)
    return (int(optime.get("t", -1)) if isinstance(optime, Mapping) else -1, *parts)


def progress_bar(fraction: float, width: int = 20) -> str:
    """A plain-text bar, for output that is not a terminal."""
    filled = round(min(max(fraction, 0.0), 1.0) * width)
    return "[" + "#" * filled + "." * (width - filled) + "]"


def rich_bar(fraction: float, width: int = 20) -> str:
    """`rich`'s progress bar, rendered for a colour terminal."""
    from rich.console import Console
    from rich.progress_bar import ProgressBar

    console = Console(file=io.StringIO(), force_terminal=True, color_system="256", width=width)
    console.print(ProgressBar(total=1.0, completed=min(max(fraction, 0.0), 1.0), width=width), end="")
    out = console.file.getvalue()
    assert isinstance(out, str)
    return out


def initial_sync_progress(status: Mapping[str, Any]) -> tuple[float, str]:
    """(fraction done, phase) of a member's `initialSyncStatus`. Pure."""
    totals = copy_totals(status)
    if totals.bytes_to_copy:
        fraction = totals.bytes_copied / totals.bytes_to_copy
    elif totals.documents_to_copy:
        fraction = totals.documents_copied / totals.documents_to_copy
    else:
        fraction = 1.0 if "initialSyncOplogEnd" in status else 0.0
    if "initialSyncEnd" in status:
        return 1.0, "done"
    if "initialSyncOplogEnd" in status:
        return fraction, f"applying the oplog ({int(status.get('appliedOps', 0)):,} entries)"
    if not status.get("databases", {}).get("databasesToClone"):
        return fraction, "starting"
    return fraction, "cloning"


def format_initial_sync(name: str, status: Mapping[str, Any],
                        bar: Callable[[float], str] = progress_bar) -> str:
    """One line for a member's `initialSyncStatus`: a bar of bytes copied, documents, time left. Pure
    (the bar as `bar` draws it)."""
    totals = copy_totals(status)
    fraction, phase = initial_sync_progress(status)
    parts = [f"initial sync {name}", bar(fraction), f"{min(fraction, 1.0):4.0%}",
             f"{totals.documents_copied:,}/{totals.documents_to_copy:,} documents",
             f"{totals.bytes_copied / 1e6:.1f}/{totals.bytes_to_copy / 1e6:.1f} MB", phase]
    if totals.remaining_ms is not None and phase == "cloning":
        parts.append(f"~{totals.remaining_ms / 1000:.0f} s left")
    failed = int(status.get("failedInitialSyncAttempts", 0))
    if failed:
        parts.append(f"({failed} failed attempt{'s' if failed > 1 else ''})")
    return "  ".join(parts)


def format_status(status: Mapping[str, Any], initial_sync: Mapping[str, Mapping[str, Any]] | None = None,
                  bar: Callable[[float], str] = progress_bar) -> str:
    """Renders a replSetGetStatus document as a human-readable table. Pure.

    Lag is the primary's optime seconds minus the member's (from this member's point of
    view; the primary's optime comes from its last heartbeat, so a lag that would come out
    negative is shown as 0), and '-' when this member knows no primary or the member's
    optime is unknown. Below the table: a progress line for each member in initial sync
    (its `initialSyncStatus`, from `initial_sync` by member name or, for the answering
    member, from `status` itself), and each member's `infoMessage` (too stale, ...).
    """
    members = list(status.get("members", []))
    me = next((m for m in members if m.get("self")), None)
    if me is not None:
        my_state = str(me.get("stateStr", ""))
    else:
        try:
            my_state = MemberState(int(status["myState"])).state_str
        except (KeyError, ValueError):
            my_state = str(status.get("myState", "?"))
    commit = status.get("optimes", {}).get("lastCommittedOpTime")
    commit_str = _fmt_optime(commit)
    if commit is not None and commit_str != "-":
        commit_str += f" (term {int(commit.get('t', -1))})"
    lines = [
        f"set:          {status.get('set', '?')}",
        f"term:         {int(status.get('term', -1))}",
        f"my state:     {my_state}" + (f" ({me['name']})" if me is not None else ""),
        f"commit point: {commit_str}",
        "",
    ]
    primaries = [m for m in members if m.get("stateStr") == "PRIMARY"]
    primary = max(primaries, key=lambda m: _optime_order(m.get("optime")), default=None)
    primary_secs = _optime_parts(primary.get("optime")) if primary is not None else None
    show_message = any(m.get("lastHeartbeatMessage") for m in members)
    headers = ["name", "state", "health", "optime", "lag s", "ping ms", "sync source"]
    if show_message:
        headers.append("last heartbeat message")
    rows: list[list[str]] = []
    for m in members:
        member_secs = _optime_parts(m.get("optime"))
        if primary_secs is None or member_secs is None:
            lag = "-"
        else:
            lag = str(max(primary_secs[0] - member_secs[0], 0))
        ping = "" if m.get("self") or m.get("pingMs") is None else str(int(m["pingMs"]))
        row = [str(m.get("name", "?")) + (" *" if m.get("self") else ""), str(m.get("stateStr", "?")),
               str(int(m.get("health", 0))), _fmt_optime(m.get("optime")), lag, ping,
               str(m.get("syncSourceHost", ""))]
        if show_message:
            row.append(str(m.get("lastHeartbeatMessage", "")))
        rows.append(row)
    right = {"health", "lag s", "ping ms"}
    widths = [max(len(r[i]) for r in [headers, *rows]) for i in range(len(headers))]
    for r in [headers, *rows]:
        cells = [c.rjust(w) if h in right else c.ljust(w) for c, w, h in zip(r, widths, headers)]
        lines.append("  ".join(cells).rstrip())
    syncing = dict(initial_sync or {})
    if me is not None and isinstance(status.get("initialSyncStatus"), Mapping) \
            and me.get("stateStr") == "STARTUP2":
        syncing[str(me["name"])] = status["initialSyncStatus"]
    notes = [format_initial_sync(str(m.get("name")), syncing[str(m.get("name"))], bar) for m in members
             if str(m.get("name")) in syncing]
    notes += [f"{m.get('name')}: {m['infoMessage']}" for m in members if m.get("infoMessage")]
    if notes:
        lines += ["", *notes]
    return "\n".join(lines)


def _initial_sync_statuses(status: Mapping[str, Any], credentials: tuple[str, str] | None = None,
                           tls: dict[str, Any] | None = None) -> dict[str, Mapping[str, Any]]:
    """Asks each other member in STARTUP2 for its own initialSyncStatus (best effort)."""
    from pymongo.errors import PyMongoError

    found: dict[str, Mapping[str, Any]] = {}
    for m in status.get("members", []):
        if m.get("self") or m.get("stateStr") != "STARTUP2":
            continue
        try:
            with _client(str(m["name"]), credentials, tls) as client:
                theirs = client.admin.command("replSetGetStatus")
        except PyMongoError:
            continue
        if isinstance(theirs.get("initialSyncStatus"), Mapping):
            found[str(m["name"])] = theirs["initialSyncStatus"]
    return found


def cmd_status(args: argparse.Namespace) -> int:
    from pymongo.errors import ConnectionFailure, OperationFailure

    try:
        with _client(args.host, _credentials(args), _tls_client(args)) as client:
            status = client.admin.command("replSetGetStatus")
    except ConnectionFailure:
        print(f"replset status: cannot reach {args.host}", file=sys.stderr)
        return 1
    except OperationFailure as exc:
        print(f"replset status: {args.host}: {exc.details.get('errmsg', exc)} (code {exc.code})",
              file=sys.stderr)
        return 1
    if args.json:
        from bson import json_util

        print(json_util.dumps(status, json_options=json_util.RELAXED_JSON_OPTIONS, indent=2))
    else:
        # A colour terminal gets rich's bar; a pipe or a file the plain one.
        bar = rich_bar if sys.stdout.isatty() else progress_bar
        print(format_status(status, _initial_sync_statuses(status, _credentials(args), _tls_client(args)), bar))
    return 0


RESYNC_POLL_S = 0.5


class _ResyncDisplay:
    """An initial sync's progress while `resync` waits: a live `rich` progress bar on a terminal, a
    line per change otherwise (a log file, a pipe)."""

    def __init__(self, host: str, *, live: bool) -> None:
        self._host = host
        self._progress: Any = None
        self._task: Any = None
        self._last = ""
        if live:
            from rich.progress import BarColumn, Progress, TaskProgressColumn, TextColumn, TimeElapsedColumn

            self._progress = Progress(TextColumn("initial sync {task.description}"), BarColumn(),
                                      TaskProgressColumn(), TextColumn("{task.fields[detail]}"),
                                      TimeElapsedColumn())
            self._task = self._progress.add_task(host, total=1.0, detail="starting")

    def __enter__(self) -> _ResyncDisplay:
        if self._progress is not None:
            self._progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._progress is not None:
            self._progress.stop()

    def show(self, status: Mapping[str, Any]) -> None:
        if self._progress is not None:
            fraction, phase = initial_sync_progress(status)
            totals = copy_totals(status)
            self._progress.update(self._task, completed=min(fraction, 1.0),
                                  detail=f"{totals.documents_copied:,}/{totals.documents_to_copy:,} documents  {phase}")
            return
        line = format_initial_sync(self._host, status)
        if line != self._last:
            print(line, flush=True)
            self._last = line


def cmd_resync(args: argparse.Namespace) -> int:
    from pymongo.errors import ConnectionFailure, OperationFailure

    try:
        with _client(args.host, _credentials(args), _tls_client(args)) as client:
            reply = client.admin.command({"resync": 1, "wait": False})
            where = reply.get("previousDataCopiedTo")
            print(f"{args.host}: resync started" + (f"; its previous data is kept in {where}" if where else ""),
                  flush=True)
            if not args.wait:
                return 0
            started = SYSTEM_CLOCK.monotonic()
            with _ResyncDisplay(args.host, live=sys.stdout.isatty()) as display:
                while True:
                    status = client.admin.command("replSetGetStatus")
                    if status.get("myState") == MemberState.SECONDARY:
                        break
                    progress = status.get("initialSyncStatus")
                    if isinstance(progress, Mapping):
                        display.show(progress)
                    time.sleep(RESYNC_POLL_S)  # an operator's progress display: poll the member's status
            print(f"{args.host}: SECONDARY again after {SYSTEM_CLOCK.monotonic() - started:.1f} s", flush=True)
            return 0
    except ConnectionFailure:
        print(f"replset resync: cannot reach {args.host}", file=sys.stderr)
    except OperationFailure as exc:
        print(f"replset resync: {args.host}: {exc.details.get('errmsg', exc) if exc.details else exc} "
              f"(code {exc.code})", file=sys.stderr)
    except KeyboardInterrupt:
        print(f"replset resync: stopped waiting; {args.host} goes on syncing", file=sys.stderr)
    return 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="replset")
    sub = parser.add_subparsers(dest="command", required=True)
    _node_parser(sub)
    _up_parser(sub)
    _status_parser(sub)
    _resync_parser(sub)
    args = parser.parse_args(argv)
    handlers = {"node": cmd_node, "up": cmd_up, "status": cmd_status, "resync": cmd_resync}
    return handlers[args.command](args)


if __name__ == "__main__":
    raise SystemExit(main())
