"""The admission core's budgets hold whatever connections do, checked against a naive twin.

Random events from a few addresses (connections accepted, bytes arriving, whole messages taken,
connections waiting, logging in, closing, time passing) drive one `Admission`; the server's part is
played here: after every event the connections `over_budget` names are closed, and on every tick
those `overdue` names. The twin keeps each connection's state in a plain dict and checks, after
every step, what must hold: no budget over (the grace is 0 here, so nothing waits), the bytes the
core counts are the ones the connections buffer, and no member was ever named by a budget (a member's
message that stalls half way is closed: it reconnects).
"""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import given, settings
from hypothesis import strategies as st

from base.codec import MAX_MESSAGE_SIZE
from replset.wire.admission import Admission, Budgets, Close, Reason, Role

UNIT = 500_000  # bytes: the cap on unfinished messages (at least one largest message) is 96 units
BUDGETS = Budgets(max_idle=3, max_partial=4, max_new_per_source=2, max_partial_bytes=MAX_MESSAGE_SIZE,
                  preempt_idle_ms=50, grace_ms=0, stalled_ms=40, identify_ms=30)
SOURCES = ("a", "b", "c")

EVENTS = st.lists(st.one_of(
    st.tuples(st.just("accept"), st.sampled_from(SOURCES)),
    st.tuples(st.just("bytes"), st.integers(0, 3), st.integers(0, 120)),
    st.tuples(st.just("message"), st.integers(0, 3), st.integers(0, 30)),
    st.tuples(st.just("bytes"), st.integers(0, 3), st.integers(0, 120)),
    st.tuples(st.just("wait"), st.integers(0, 3)),
    st.tuples(st.just("login"), st.integers(0, 3), st.sampled_from((True, True, False))),
    st.tuples(st.just("close"), st.integers(0, 3)),
    st.tuples(st.just("tick"), st.integers(1, 30)),
), min_size=1, max_size=80)


@dataclass
class Twin:
    """What the server knows of one connection."""

    source: str
    role: Role
    held: int = 0
    proven: bool = False
    trusted: bool = False


class Run:
    def __init__(self) -> None:
        self.adm = Admission(max_conns=6, budgets=BUDGETS, max_pending=2)
        self.now = 0
        self.next_id = 0
        self.open: dict[int, Twin] = {}

    def pick(self, index: int) -> int | None:
        ids = sorted(self.open)
        return ids[index % len(ids)] if ids else None

    def step(self, event: tuple[object, ...]) -> None:
        match event:
            case ("accept", str(source)):
                self.next_id += 1
                admitted = self.adm.on_accept(self.next_id, source, self.now)
                if admitted is not None:
                    self.open[self.next_id] = Twin(source, admitted.role)
                    if admitted.evict is not None:
                        self.drop(admitted.evict, Reason.PREEMPTED)
            case ("tick", int(ms)):
                self.now += ms
                self.close(self.adm.overdue(self.now))
            case (kind, int(index), *rest):
                conn_id = self.pick(index)
                if conn_id is not None:
                    self.on_connection(str(kind), conn_id, rest)
        self.close(self.adm.over_budget(self.now))

    def on_connection(self, kind: str, conn_id: int, rest: list[object]) -> None:
        twin = self.open[conn_id]
        if kind == "bytes":
            twin.held += _int(rest[0]) * UNIT
            self.adm.on_receive(conn_id, twin.held, self.now)
        elif kind == "message" and twin.held:
            twin.held = min(twin.held, _int(rest[0]) * UNIT)
            twin.proven = True
            self.adm.on_message(conn_id, twin.held, self.now)
        elif kind == "wait":
            self.adm.on_wait(conn_id, twin.held, self.now)
        elif kind == "login" and twin.proven:
            twin.trusted = True
            twin.role = self.adm.on_login(conn_id, member=bool(rest[0]))
        elif kind == "close":  # (the client went away)
            self.drop(conn_id, None)

    def close(self, closes: list[Close]) -> None:
        for close in closes:
            self.drop(close.conn_id, close.reason)

    def drop(self, conn_id: int, reason: Reason | None) -> None:
        """Closes a connection: named by the core for `reason`, or gone by itself (None)."""
        twin = self.open.pop(conn_id, None)
        assert twin is not None, f"{conn_id} was named after it was closed"
        # A member's message that stalls half way is closed (the member reconnects); no budget closes one.
        assert reason in (None, Reason.STALLED) or twin.role is not Role.MEMBER, f"{reason} closed member {conn_id}"
        self.adm.on_close(conn_id)

    def check(self) -> None:
        adm, snap = self.adm, self.adm.snapshot()
        assert adm.held_total == sum(t.held for t in self.open.values())
        assert snap["current"] == len(self.open)
        assert snap["members"] == sum(t.role is Role.MEMBER for t in self.open.values())
        assert snap["idle"] <= BUDGETS.max_idle and snap["partial"] <= BUDGETS.max_partial
        for source in SOURCES:
            unproven = [t for t in self.open.values() if t.source == source and not t.proven
                        and t.role is Role.CLIENT]
            assert len(unproven) <= BUDGETS.max_new_per_source, (source, unproven)
        closable = sum(t.held for t in self.open.values() if t.role is not Role.MEMBER)
        assert adm.held_total <= BUDGETS.max_partial_bytes or closable == 0


# Every run starts with a member and a logged-in client, each with a message done (the random events
# then reach them as often as the others: indexes 0 and 1).
SETUP: list[tuple[object, ...]] = [
    ("accept", "m"), ("bytes", 0, 5), ("message", 0, 0), ("login", 0, True),
    ("accept", "u"), ("bytes", 1, 5), ("message", 1, 0), ("login", 1, False),
]


def _int(value: object) -> int:
    assert isinstance(value, int)
    return value


@settings(max_examples=500, deadline=None)
@given(EVENTS)
def test_every_budget_holds_after_every_event_and_members_are_never_closed(events: list[tuple[object, ...]]) -> None:
    run = Run()
    for event in SETUP + events:
        run.step(event)
        run.check()
