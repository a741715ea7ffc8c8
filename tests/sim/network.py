"""The simulated network between members (and clients): delay, loss, duplication,
reordering, and symmetric or asymmetric partitions, all drawn from the run's seed.

Model (after TigerBeetle's packet simulator):

* Every directed link `a -> b` has a base one-way delay drawn once per run;
  each packet adds random jitter and, rarely, a long spike. Packets of one
  link overtake each other whenever their jitter differs: that is the
  reordering.
* A packet is lost with probability `loss`, and delivered twice (each copy
  with its own delay) with probability `duplication`. Members talk in
  request/reply pairs, so a duplicate request is handled twice and a
  duplicate reply is dropped by the requester (it no longer waits for it).
  That models retries over new connections and replies that outlive their
  request; the runtime's handlers must be idempotent and order-insensitive.
* An *ordered* packet travels on a stream (one TCP connection: the fetcher's
  `find`/`getMore` cursor): never duplicated, never overtaking the previous
  packet of the same stream. A `getMore` is not idempotent (it advances the
  source's cursor), and TCP would never replay one. Loss on a stream means
  the connection broke; the requester times out and reconnects.
* A partition blocks directed links. A symmetric partition splits the members
  into groups; an asymmetric one blocks `a -> b` only (b still reaches a).
  A link is checked when the packet is sent and again when it would be
  delivered, so a partition also eats packets already in flight.
* Clients are never partitioned (a client in a minority with an old primary is
  already covered: a client can always reach every member).
* Bounded: at most `MAX_IN_FLIGHT_PER_LINK` packets travel on one link; more
  are dropped, like a full socket buffer.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

MAX_IN_FLIGHT_PER_LINK = 512


@dataclass(frozen=True, slots=True)
class NetworkParams:
    min_delay_ms: int = 1
    max_delay_ms: int = 20
    jitter_ms: int = 10
    loss: float = 0.0
    duplication: float = 0.0
    spike_probability: float = 0.0
    spike_ms: int = 500


class Network:
    def __init__(self, rng: random.Random, member_ids: list[int], params: NetworkParams) -> None:
        self.rng = rng
        self.member_ids = list(member_ids)
        self.params = params
        self._base: dict[tuple[int, int], int] = {}
        self.blocked: set[tuple[int, int]] = set()
        self.in_flight: dict[tuple[int, int], int] = {}
        self._stream_tail: dict[tuple[int, int], int] = {}  # link -> delivery time of its last ordered packet
        self.extra: dict[tuple[int, int], int] = {}          # link -> delay added on top of its base (drift)

    def _base_delay(self, link: tuple[int, int]) -> int:
        base = self._base.get(link)
        if base is None:
            base = self.rng.randint(self.params.min_delay_ms, self.params.max_delay_ms)
            self._base[link] = base
        return base

    def is_blocked(self, src: int, dst: int) -> bool:
        return (src, dst) in self.blocked

    def delays_for(self, src: int, dst: int, now_ms: int, *, ordered: bool = False) -> list[int]:
        """The delays of the copies of one packet `src -> dst` that will travel (0, 1 or 2 copies)."""
        link = (src, dst)
        if link in self.blocked:
            return []
        p = self.params
        rng = self.rng
        if p.loss and rng.random() < p.loss:
            return []
        copies = 2 if p.duplication and not ordered and rng.random() < p.duplication else 1
        delays = []
        for _ in range(copies):
            if self.in_flight.get(link, 0) >= MAX_IN_FLIGHT_PER_LINK:
                break
            delay = self._base_delay(link) + self.extra.get(link, 0) + rng.randint(0, p.jitter_ms)
            if p.spike_probability and rng.random() < p.spike_probability:
                delay += rng.randint(p.spike_ms // 2, p.spike_ms)
            if ordered:
                delay = max(delay, self._stream_tail.get(link, 0) - now_ms)
                self._stream_tail[link] = now_ms + delay
            self.in_flight[link] = self.in_flight.get(link, 0) + 1
            delays.append(delay)
        return delays

    def true_rtt(self, a: int, b: int) -> int | None:
        """The round trip `a -> b -> a` without jitter (None: a link no packet has used yet)."""
        there, back = self._base.get((a, b)), self._base.get((b, a))
        if there is None or back is None:
            return None
        return there + back + self.extra.get((a, b), 0) + self.extra.get((b, a), 0)

    def landed(self, src: int, dst: int) -> bool:
        """A packet reached the end of its link; False if a partition ate it on the way."""
        link = (src, dst)
        self.in_flight[link] -= 1
        return link not in self.blocked

    # -- faults -------------------------------------------------------------------------------------

    def partition(self, groups: list[list[int]]) -> None:
        """Symmetric: members of different groups cannot reach each other."""
        for i, group in enumerate(groups):
            for other in groups[i + 1:]:
                for a in group:
                    for b in other:
                        self.blocked.add((a, b))
                        self.blocked.add((b, a))

    def block(self, src: int, dst: int) -> None:
        """Asymmetric: `src` can no longer reach `dst` (the other way still works)."""
        self.blocked.add((src, dst))

    def isolate(self, member: int) -> None:
        others = [m for m in self.member_ids if m != member]
        self.partition([[member], others])

    def heal(self) -> None:
        self.blocked.clear()

    def set_faults(self, *, loss: float, duplication: float, spike_probability: float) -> None:
        p = self.params
        self.params = NetworkParams(p.min_delay_ms, p.max_delay_ms, p.jitter_ms, loss, duplication,
                                    spike_probability, p.spike_ms)
