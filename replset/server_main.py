"""Run one member process: the node, its wire server and its HTTP server."""

from __future__ import annotations

import asyncio
import gc
import logging
import signal
import sys

from replset.dbpath_lock import EXIT_DBPATH_IN_USE, DBPathInUse, lock_dbpath, unlock_dbpath
from replset.http import HttpServer
from replset.node import Node, NodeOptions
from replset.wire.commands import Dispatcher
from replset.wire.server import WireLimits, WireServer, raise_fd_limit

log = logging.getLogger("replset")
SWITCH_INTERVAL_S = 0.0002


async def serve(options: NodeOptions, limits: WireLimits | None = None) -> None:
    raise_fd_limit()
    node = Node(options)
    await node.start()
    wire = WireServer(node, Dispatcher(node), limits)
    http = HttpServer(node, wire.admission.snapshot)
    await wire.start(options.listen_hosts, options.port)
    http_port = options.effective_http_port
    await http.start(options.listen_hosts, http_port)
    log.info("member %s listening (wire %d, http %d, maxConns %d), state %s", options.me, options.port,
             http_port, wire.admission.max_conns, node.state.name)
    # What start-up allocated lives as long as the process: out of the collector's reach, a full
    # collection (which holds the interpreter, the event loop included) has that much less to scan.
    gc.freeze()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        log.info("shutting down")
        await wire.stop()
        await http.stop()
        await node.stop()


def run_node(options: NodeOptions, limits: WireLimits | None = None) -> None:
    """Runs a member until SIGINT/SIGTERM. Exits with EXIT_DBPATH_IN_USE, having opened nothing, if
    another process holds the data directory (replset/dbpath_lock.py)."""
    lock = None
    if options.dbpath is not None:
        try:
            lock = lock_dbpath(options.dbpath)
        except DBPathInUse as err:
            log.error("DBPathInUse (%d): %s; exiting", err.code, err)
            sys.exit(EXIT_DBPATH_IN_USE)
    # The journal flusher's fsync runs in a thread; when it ends it must get the GIL back from a busy
    # event loop before the writes waiting on it can be acknowledged. The default 5 ms switch
    # interval would add up to 5 ms to every j:true and w:"majority" write under load.
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency on Linux
        asyncio.run(serve(options, limits))
    else:
        uvloop.run(serve(options, limits))
    if lock is not None:
        unlock_dbpath(lock)
