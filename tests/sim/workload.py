"""Clients: a driver-like workload of writes (`w: 1`, `w: N`, `w: "majority"`) and reads.

Each client has at most one operation outstanding, like one application thread
on a driver connection. It sends writes to the member it believes is primary;
a `NotWritablePrimary` answer carries the member's view of the primary (what
a driver learns from `hello`), and a refused connection or a timeout sends it
to a random member. Reads go to a random member, with read concern "local"
or "majority". Every write has a unique id and sets one of a few keys to that
id, so reads and the final data show which write won.

The checkers judge what *members* answered (recorded by the runner as replies
leave them); the client only keeps the load going. Bounded: a client stops
after `max_ops` operations, and stops starting new ones when the runner says
the liveness phase began.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from tests.sim import rpc

INF = 1 << 62


@dataclass(frozen=True, slots=True)
class WorkloadParams:
    clients: int = 3
    think_min_ms: int = 5
    think_max_ms: int = 200
    read_fraction: float = 0.3
    majority_read_fraction: float = 0.5
    write_concerns: tuple[int | str, ...] = (1, "majority", 2)
    wtimeout_ms: int = 5000
    client_timeout_ms: int = 15_000
    keys: int = 5
    max_ops: int = 2000


@dataclass(frozen=True, slots=True)
class ClientOp:
    kind: str            # "write" | "read"
    write_id: int = -1
    w: int | str = 1
    key: int = -1
    majority: bool = False


class Client:
    def __init__(self, client_id: int, rng: random.Random, members: list[int], params: WorkloadParams) -> None:
        self.id = client_id
        self.rng = rng
        self.members = members
        self.params = params
        self.target = rng.choice(members)
        self.call: int | None = None
        self.deadline = INF
        self.next_op_at = rng.randint(0, params.think_max_ms)
        self.ops_done = 0
        self.writes = 0
        self.stopped = False
        self.ops: dict[int, ClientOp] = {}      # rpc id -> operation (read by the runner's observer)

    def next_wakeup(self) -> int:
        if self.call is not None:
            return self.deadline
        return INF if self.stopped or self.ops_done >= self.params.max_ops else self.next_op_at

    def tick(self, now: int, new_rpc_id: int) -> tuple[int, rpc.Request] | None:
        """Times out the outstanding operation or starts the next one; returns a packet to send."""
        if self.call is not None:
            if now >= self.deadline:
                self._finished(now, switch=True)
            return None
        if self.stopped or now < self.next_op_at or self.ops_done >= self.params.max_ops:
            return None
        op = self._next_op()
        self.ops[new_rpc_id] = op
        self.call, self.deadline = new_rpc_id, now + self.params.client_timeout_ms
        if op.kind == "write":
            body: object = rpc.WriteBody(op.write_id, op.key, op.write_id, op.w, self.params.wtimeout_ms)
            return self.target, rpc.Request(new_rpc_id, self.id, rpc.WRITE, body)
        return self.rng.choice(self.members), rpc.Request(new_rpc_id, self.id, rpc.READ,
                                                          rpc.ReadBody(op.key, op.majority))

    def _next_op(self) -> ClientOp:
        p, rng = self.params, self.rng
        key = rng.randrange(p.keys)
        if rng.random() < p.read_fraction:
            return ClientOp("read", key=key, majority=rng.random() < p.majority_read_fraction)
        self.writes += 1
        return ClientOp("write", write_id=self.id * 1_000_000 + self.writes, w=rng.choice(p.write_concerns), key=key)

    def on_reply(self, now: int, reply: rpc.Reply) -> None:
        if reply.rpc_id != self.call:
            return
        result = reply.body
        switch = reply.error is not None
        hint = getattr(result, "primary_hint", -1)
        code = getattr(result, "code", 0)
        if self.ops[reply.rpc_id].kind == "write" and code == 10107:
            if hint >= 0:
                self.target = hint
            else:
                switch = True
        self._finished(now, switch=switch)

    def _finished(self, now: int, *, switch: bool) -> None:
        self.call, self.deadline = None, INF
        self.ops_done += 1
        if switch:
            self.target = self.rng.choice(self.members)
        self.next_op_at = now + self.rng.randint(self.params.think_min_ms, self.params.think_max_ms)
