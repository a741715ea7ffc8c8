"""Command line: `replset node`, `replset up`, `replset status`."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any, TypeVar

from replset.node import NodeOptions

T = TypeVar("T")


def _node_parser(sub: Any) -> None:
    p = sub.add_parser("node", help="run one member process")
    p.add_argument("--port", type=int, default=27017)
    p.add_argument("--replSet", dest="repl_set", default="rs0")
    p.add_argument("--dbpath", default="./data/db")
    p.add_argument("--bind_ip", default="127.0.0.1")
    p.add_argument("--oplogSizeMB", dest="oplog_size_mb", type=int, default=1024)
    p.add_argument("--httpPort", dest="http_port", type=int, default=None,
                   help="HTTP status port (default: port + 1000)")
    p.add_argument("--enableTestCommands", dest="enable_test_commands", action="store_true")
    p.add_argument("--logLevel", dest="log_level", default="INFO")


def _up_parser(sub: Any) -> None:
    p = sub.add_parser("up", help="start (or restart) a local replica set and supervise it")
    p.add_argument("--nodes", type=int, default=1)
    p.add_argument("--port", type=int, default=27017)
    p.add_argument("--dir", default="./data")
    p.add_argument("--replSet", dest="repl_set", default="rs0")
    p.add_argument("--enableTestCommands", dest="enable_test_commands", action="store_true")


def _status_parser(sub: Any) -> None:
    p = sub.add_parser("status", help="print replSetGetStatus as a table")
    p.add_argument("--host", default="127.0.0.1:27017")


def cmd_node(args: argparse.Namespace) -> int:
    logging.basicConfig(level=args.log_level.upper(),
                        format=f"%(asctime)s [{args.port}] %(levelname)s %(name)s: %(message)s")
    from replset.server_main import run_node

    run_node(NodeOptions(port=args.port, repl_set=args.repl_set, dbpath=args.dbpath, bind_ip=args.bind_ip,
                         oplog_size_mb=args.oplog_size_mb, enable_test_commands=args.enable_test_commands,
                         http_port=args.http_port))
    return 0


def _spawn(args: argparse.Namespace, port: int) -> subprocess.Popen[bytes]:
    dbpath = os.path.join(args.dir, str(port))
    os.makedirs(dbpath, exist_ok=True)
    cmd = [sys.executable, "-m", "replset", "node", "--port", str(port), "--replSet", args.repl_set,
           "--dbpath", dbpath]
    if args.enable_test_commands:
        cmd.append("--enableTestCommands")
    log_file = open(os.path.join(args.dir, f"{port}.log"), "ab")
    return subprocess.Popen(cmd, stdout=log_file, stderr=subprocess.STDOUT)


def wait_until(predicate: Callable[[], T], timeout_s: float = 20.0, what: str = "condition",
               interval_s: float = 0.02) -> T:
    """Polls `predicate` (errors count as "not yet") until it is truthy or the deadline passes."""
    deadline = time.monotonic() + timeout_s
    last_error: Exception | None = None
    while time.monotonic() < deadline:
        try:
            result = predicate()
            if result:
                return result
        except Exception as exc:  # the member may still be starting
            last_error = exc
        time.sleep(interval_s)
    raise TimeoutError(f"timed out waiting for {what} (last error: {last_error!r})")


def _client(host: str) -> Any:
    from pymongo import MongoClient

    return MongoClient(f"mongodb://{host}/?directConnection=true", serverSelectionTimeoutMS=2000)


def _initiate_if_needed(hosts: list[str], repl_set: str) -> None:
    from pymongo.errors import OperationFailure

    with _client(hosts[0]) as client:
        wait_until(lambda: client.admin.command("ping"), 30, f"{hosts[0]} to accept connections")
        try:
            client.admin.command("replSetGetConfig")
            return
        except OperationFailure as exc:
            if exc.code != 94:
                raise
        config = {"_id": repl_set, "members": [{"_id": i, "host": h} for i, h in enumerate(hosts)]}
        client.admin.command("replSetInitiate", config)


def cmd_up(args: argparse.Namespace) -> int:
    os.makedirs(args.dir, exist_ok=True)
    ports = [args.port + i for i in range(args.nodes)]
    hosts = [f"127.0.0.1:{p}" for p in ports]
    children = [_spawn(args, p) for p in ports]
    stopping = False

    def stop(_signum: int, _frame: Any) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
    try:
        _initiate_if_needed(hosts, args.repl_set)
        with _client(hosts[0]) as client:
            wait_until(lambda: any(m["stateStr"] == "PRIMARY" for m in
                                    client.admin.command("replSetGetStatus")["members"]), 60, "a primary")
        print(f"replica set {args.repl_set} is up")
        print(f"  connection string: mongodb://{','.join(hosts)}/?replicaSet={args.repl_set}")
        for p in ports:
            print(f"  status: http://127.0.0.1:{p + 1000}/replSetGetStatus")
        print("press Ctrl-C to stop", flush=True)
        while not stopping:
            for port, child in zip(ports, children):
                if child.poll() is not None and not stopping:
                    print(f"member on port {port} exited with code {child.returncode}", flush=True)
                    stopping = True
            time.sleep(0.2)
    except TimeoutError as exc:
        print(f"replset up: {exc}", file=sys.stderr)
        return 1
    finally:
        _stop_children(children)
    return 0


def _stop_children(children: list[subprocess.Popen[bytes]]) -> None:
    for child in children:
        if child.poll() is None:
            child.terminate()
    for child in children:
        try:
            child.wait(timeout=10)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()


def cmd_status(args: argparse.Namespace) -> int:
    with _client(args.host) as client:
        status = client.admin.command("replSetGetStatus")
    print(f"set {status['set']}  term {status['term']}  my state {status['myState']}")
    header = f"{'name':<22} {'state':<24} {'health':<6} {'optime':<22} {'ping':>5}  sync source"
    print(header)
    for m in status["members"]:
        optime = m.get("optime", {}).get("ts")
        ts = f"{optime.time}.{optime.inc}" if optime is not None else "-"
        name = m["name"] + (" *" if m.get("self") else "")
        print(f"{name:<22} {m['stateStr']:<24} {int(m['health']):<6} {ts:<22} "
              f"{int(m.get('pingMs', 0)):>5}  {m.get('syncSourceHost', '')}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="replset")
    sub = parser.add_subparsers(dest="command", required=True)
    _node_parser(sub)
    _up_parser(sub)
    _status_parser(sub)
    args = parser.parse_args(argv)
    handlers = {"node": cmd_node, "up": cmd_up, "status": cmd_status}
    return handlers[args.command](args)


if __name__ == "__main__":
    raise SystemExit(main())
