"""A fault-injecting TCP proxy between replica-set members, for real-process fault tests.

Theory of operation
-------------------
Members send every member-to-member request (heartbeats, votes, oplog `find` /
`getMore`, `replSetUpdatePosition`) through `PeerClient`, and the `peerRoutes`
fail point tells a member to dial a different address for a peer. The proxy owns
one listener per *ordered* pair of members: link A→B is where A dials B, and it
forwards to B's real port. Requests always travel from the member that opened the
connection, so link A→B carries A's requests to B and B's replies to them; B's own
requests to A go through link B→A.

Each link is in one of these conditions, changed at any time from the test thread:

* passing — bytes flow both ways, optionally after `delay_ms` per chunk;
* blackholed — connections are accepted but nothing is forwarded, on new and on
  already-open connections (a held chunk waits for the heal; data in flight stays
  in the kernel's buffers, as TCP keeps retransmitting through a partition). The
  sender sees a timeout, never a refusal. Healing lets the held bytes through.
* reset — `reset(...)` aborts the link's open connections once.

A partition {A} | {B, C} blackholes A→B, B→A, A→C and C→A; an asymmetric one cuts
one direction only (A→B cut: A cannot reach B, B still reaches A).

When the destination member is down (its port refuses), a passing link stops
listening so the sender's next connect is refused too, exactly as if it dialled
the member, and a probe reopens the listener on the same port once the member
accepts connections again. (A blackholed link keeps listening: a partition hides
whether the other side is up.)

The proxy runs its own event loop on its own thread; the public methods are
synchronous and thread-safe. `stop()` closes every listener and connection and
joins the thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable, Coroutine, Iterable
from dataclasses import dataclass, field
from typing import Any, TypeVar

T = TypeVar("T")

CHUNK = 64 * 1024
CONNECT_TIMEOUT_S = 2.0
PROBE_INTERVAL_S = 0.05
REOPEN_DEADLINE_S = 10.0
CALL_TIMEOUT_S = 10.0


@dataclass(eq=False)
class _Link:
    src: str
    dst: str  # the destination member's real "host:port"
    port: int = 0
    blackholed: bool = False
    delay_ms: float = 0.0
    upstream_down: bool = False
    server: asyncio.Server | None = None
    flowing: asyncio.Event = field(default_factory=asyncio.Event)
    connections: set[asyncio.Task[None]] = field(default_factory=set)
    probe: asyncio.Task[None] | None = None
    accepted: int = 0

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"


@dataclass(frozen=True, slots=True)
class LinkStats:
    src: str
    dst: str
    address: str
    blackholed: bool
    delay_ms: float
    upstream_down: bool
    listening: bool
    open_connections: int
    accepted: int


class FaultProxy:
    """Listeners for ordered member pairs, each able to pass, blackhole, delay or reset traffic."""

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._links: dict[tuple[str, str], _Link] = {}
        self._background: set[asyncio.Task[None]] = set()
        self.errors: list[str] = []

    # -- lifecycle (test thread) ----------------------------------------------------------------

    def start(self) -> None:
        loop = asyncio.new_event_loop()
        ready = threading.Event()

        def run() -> None:
            asyncio.set_event_loop(loop)
            loop.call_soon(ready.set)
            loop.run_forever()
            loop.close()

        self._loop = loop
        self._thread = threading.Thread(target=run, name="fault-proxy", daemon=True)
        self._thread.start()
        if not ready.wait(CALL_TIMEOUT_S):
            raise RuntimeError("the proxy's event loop did not start")

    def stop(self) -> None:
        """Closes every listener and connection and joins the proxy thread (idempotent)."""
        loop, thread = self._loop, self._thread
        if loop is None or thread is None:
            return
        try:
            self._call(self._shutdown)
        finally:
            loop.call_soon_threadsafe(loop.stop)
            thread.join(CALL_TIMEOUT_S)
            self._loop = self._thread = None
        if thread.is_alive():
            raise RuntimeError("the proxy thread did not stop")

    def __enter__(self) -> FaultProxy:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- topology ---------------------------------------------------------------------------------

    def add_link(self, src: str, dst: str) -> str:
        """Opens the listener for src→dst; returns the address `src` should dial for `dst`."""
        return self._call(lambda: self._add_link(src, dst))

    def connect_all(self, hosts: Iterable[str]) -> dict[str, dict[str, str]]:
        """A link for every ordered pair; returns each member's routes (peer host -> proxy address)."""
        hosts = list(hosts)
        return {src: {dst: self.add_link(src, dst) for dst in hosts if dst != src} for src in hosts}

    def routes_for(self, src: str) -> dict[str, str]:
        return {dst: link.address for (s, dst), link in self._links.items() if s == src}

    # -- faults -------------------------------------------------------------------------------------

    def set_links(self, pairs: Iterable[tuple[str, str]], *, blackholed: bool | None = None,
                  delay_ms: float | None = None) -> None:
        """Changes the condition of the given src→dst links (new and open connections alike)."""
        pairs = list(pairs)
        self._configure({p: blackholed for p in pairs} if blackholed is not None else {},
                        {p: delay_ms for p in pairs} if delay_ms is not None else {})

    def partition(self, groups: Iterable[Iterable[str]]) -> list[tuple[str, str]]:
        """Members in different groups cannot reach each other (both directions); every other link
        passes, in one step. A member in no group is cut off from everyone. Returns the cut links."""
        group_of: dict[str, object] = {host: i for i, group in enumerate(groups) for host in group}
        cut = {pair: group_of.get(pair[0], pair[0]) != group_of.get(pair[1], pair[1]) for pair in self._links}
        self._configure(cut, dict.fromkeys(self._links, 0.0))
        return [pair for pair, is_cut in cut.items() if is_cut]

    def cut(self, sources: Iterable[str], destinations: Iterable[str]) -> list[tuple[str, str]]:
        """One direction only: every source loses its links to every destination (others unchanged)."""
        srcs, dsts = set(sources), set(destinations)
        pairs = [pair for pair in self._links if pair[0] in srcs and pair[1] in dsts]
        self.set_links(pairs, blackholed=True)
        return pairs

    def slow(self, host: str, delay_ms: float) -> None:
        """Delays everything to and from `host`."""
        self.set_links(self.links_of(host), delay_ms=delay_ms)

    def heal(self) -> None:
        """Every link passes, without delay (held bytes are delivered)."""
        self._configure(dict.fromkeys(self._links, False), dict.fromkeys(self._links, 0.0))

    def reset(self, pairs: Iterable[tuple[str, str]]) -> int:
        """Aborts the open connections of the given links; returns how many."""
        pairs = list(pairs)

        async def abort() -> int:
            tasks = [t for pair in pairs for t in self._links[pair].connections]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            return len(tasks)

        return self._call(abort)

    def links_of(self, host: str) -> list[tuple[str, str]]:
        return [pair for pair in self._links if host in pair]

    def stats(self) -> list[LinkStats]:
        async def collect() -> list[LinkStats]:
            return [LinkStats(link.src, link.dst, link.address, link.blackholed, link.delay_ms,
                              link.upstream_down, link.server is not None, len(link.connections),
                              link.accepted) for link in self._links.values()]

        return self._call(collect)

    # -- the proxy's own loop ---------------------------------------------------------------------------

    def _call(self, fn: Callable[[], Coroutine[Any, Any, T]]) -> T:
        """Runs `fn()` on the proxy's loop and waits for its result."""
        loop = self._loop
        if loop is None:
            raise RuntimeError("the proxy is not running")
        return asyncio.run_coroutine_threadsafe(fn(), loop).result(CALL_TIMEOUT_S)

    def _configure(self, blackholed: dict[tuple[str, str], bool], delay_ms: dict[tuple[str, str], float]) -> None:
        async def change() -> None:
            for pair, value in delay_ms.items():
                self._links[pair].delay_ms = value
            for pair, value in blackholed.items():
                link = self._links[pair]
                link.blackholed = value
                if value:
                    link.flowing.clear()
                else:
                    link.flowing.set()
            for pair in {*blackholed, *delay_ms}:
                await self._reconcile(self._links[pair])

        self._call(change)

    async def _add_link(self, src: str, dst: str) -> str:
        if (src, dst) in self._links:
            return self._links[(src, dst)].address
        link = _Link(src, dst)
        link.flowing.set()
        await self._listen(link)
        self._links[(src, dst)] = link
        return link.address

    async def _listen(self, link: _Link) -> None:
        server = await asyncio.start_server(lambda r, w: self._accept(link, r, w), "127.0.0.1", link.port,
                                            reuse_address=True)
        link.port = int(server.sockets[0].getsockname()[1])
        link.server = server

    async def _reconcile(self, link: _Link) -> None:
        """Listens unless the destination is down and the link passes (then connects are refused).
        Safe to run concurrently for one link: every step re-reads the link's condition."""
        def should_listen() -> bool:
            return link.blackholed or not link.upstream_down

        deadline = asyncio.get_running_loop().time() + REOPEN_DEADLINE_S
        while link.server is None and should_listen():
            try:
                await self._listen(link)
            except OSError as exc:  # the port is briefly someone's ephemeral port: retry
                if asyncio.get_running_loop().time() > deadline:
                    self.errors.append(f"cannot listen again on {link.address} for {link.src}->{link.dst}: {exc}")
                    return
                await asyncio.sleep(PROBE_INTERVAL_S)
        if link.server is not None and not should_listen():
            link.server.close()
            link.server = None
            for task in list(link.connections):
                task.cancel()

    def _accept(self, link: _Link, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        link.accepted += 1
        task = asyncio.get_running_loop().create_task(self._serve(link, reader, writer))
        link.connections.add(task)
        task.add_done_callback(link.connections.discard)

    async def _serve(self, link: _Link, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writers = [writer]
        try:
            await link.flowing.wait()  # blackholed: accepted, and nothing more happens
            host, port = link.dst.rsplit(":", 1)
            try:
                up_reader, up_writer = await asyncio.wait_for(asyncio.open_connection(host, int(port)),
                                                              CONNECT_TIMEOUT_S)
            except ConnectionRefusedError:
                self._on_upstream_refused(link)
                return
            except (OSError, TimeoutError):
                return
            writers.append(up_writer)
            loop = asyncio.get_running_loop()
            pipes = {loop.create_task(self._pipe(link, reader, up_writer)),
                     loop.create_task(self._pipe(link, up_reader, writer))}
            try:
                await asyncio.wait(pipes, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for pipe in pipes:
                    pipe.cancel()
                await asyncio.gather(*pipes, return_exceptions=True)
        finally:
            for w in writers:
                w.transport.abort()

    async def _pipe(self, link: _Link, src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
        with contextlib.suppress(OSError):
            while data := await src.read(CHUNK):
                if link.delay_ms > 0:
                    await asyncio.sleep(link.delay_ms / 1000)
                await link.flowing.wait()  # a chunk read before a blackhole waits for the heal
                dst.write(data)
                await dst.drain()

    def _on_upstream_refused(self, link: _Link) -> None:
        if link.upstream_down:
            return
        link.upstream_down = True
        self._spawn(self._reconcile(link))
        link.probe = self._spawn(self._probe(link))

    async def _probe(self, link: _Link) -> None:
        host, port = link.dst.rsplit(":", 1)
        while True:
            try:
                _, writer = await asyncio.wait_for(asyncio.open_connection(host, int(port)), CONNECT_TIMEOUT_S)
            except (OSError, TimeoutError):
                await asyncio.sleep(PROBE_INTERVAL_S)
                continue
            writer.transport.abort()
            link.upstream_down = False
            link.probe = None
            await self._reconcile(link)
            return

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        task = asyncio.get_running_loop().create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        return task

    async def _shutdown(self) -> None:
        tasks = [*self._background]
        for link in self._links.values():
            if link.server is not None:
                link.server.close()
                link.server = None
            tasks.extend(link.connections)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
