"""MongoDB-style structured log lines, and the recent ones `getLog` returns.

A line is one JSON document, as mongod's since 4.4: `{"t": {"$date": ...}, "s": "I", "c": "REPL",
"id": 4615611, "ctx": "...", "msg": "...", "attr": {...}}`. `s` is the severity (F, E, W, I, D1),
`c` the component (from the logger's module: REPL, NETWORK, STORAGE, COMMAND, ACCESS, ...), `id` a
stable number for the message's template (a CRC-32 of it: the same statement always logs the same
id, so alerts can key on it), `ctx` the thread or asyncio task, `msg` the message and `attr` its
arguments (and the exception, when there is one).

`--logFormat json` writes these lines to the process's output; whatever the format, the last
`RECENT_LINES` are kept in memory for `getLog: "global"` (so mongosh's `show log` works).
"""

from __future__ import annotations

import asyncio
import collections
import datetime
import json
import logging
import threading
import zlib
from typing import Any

RECENT_LINES = 1024
_COMPONENTS = (  # logger name prefix -> component, most specific first
    ("replset.wire.auth", "ACCESS"), ("replset.auth", "ACCESS"), ("replset.wire", "NETWORK"),
    ("replset.http", "NETWORK"), ("aiohttp", "NETWORK"), ("replset.group_commit", "STORAGE"),
    ("oplog", "STORAGE"), ("replset.parts", "STORAGE"), ("replset.transactions", "TXN"),
    ("replset.ttl_monitor", "INDEX"), ("sync", "REPL"), ("replset", "REPL"),
)


def _severity(level: int) -> str:
    if level >= logging.CRITICAL:
        return "F"
    if level >= logging.ERROR:
        return "E"
    if level >= logging.WARNING:
        return "W"
    return "I" if level >= logging.INFO else "D1"


def _component(name: str) -> str:
    return next((c for prefix, c in _COMPONENTS if name == prefix or name.startswith(prefix + ".")), "CONTROL")


def _context() -> str:
    try:
        task = asyncio.current_task()
    except RuntimeError:
        task = None
    return task.get_name() if task is not None else threading.current_thread().name


def _plain(value: Any) -> Any:
    return value if isinstance(value, (str, int, float, bool)) or value is None else str(value)


class MongoJsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        when = datetime.datetime.fromtimestamp(record.created, datetime.UTC)
        attr: dict[str, Any] = {}
        if isinstance(record.args, tuple) and record.args:
            attr["args"] = [_plain(a) for a in record.args]
        if record.exc_info:
            attr["error"] = self.formatException(record.exc_info)
        line = {"t": {"$date": when.isoformat(timespec="milliseconds")}, "s": _severity(record.levelno),
                "c": _component(record.name), "id": zlib.crc32(str(record.msg).encode()),
                "ctx": getattr(record, "ctx", None) or _context(), "msg": record.getMessage(), "attr": attr}
        return json.dumps(line, default=str)


class RecentLines(logging.Handler):
    """The last `RECENT_LINES` lines, as `getLog: "global"` returns them."""

    def __init__(self) -> None:
        super().__init__()
        self.setFormatter(MongoJsonFormatter())
        self.lines: collections.deque[str] = collections.deque(maxlen=RECENT_LINES)
        self.total = 0

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.lines.append(self.format(record))
            self.total += 1
        except Exception:  # a log line must never take the member down
            self.handleError(record)


RECENT = RecentLines()


def configure(level: str, log_format: str, port: int) -> None:
    """The process's logging: text (the default) or `json` lines on stderr, and the recent lines kept."""
    handler = logging.StreamHandler()
    if log_format == "json":
        handler.setFormatter(MongoJsonFormatter())
    else:
        handler.setFormatter(logging.Formatter(f"%(asctime)s [{port}] %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler, RECENT]
    root.setLevel(level.upper())
