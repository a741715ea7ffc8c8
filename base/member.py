"""Member states (MongoDB's numbering) and the legal transitions between them.

    STARTUP --initiate/load config--> PRIMARY | SECONDARY | STARTUP2
    STARTUP2 --initial sync done--> SECONDARY
    SECONDARY <--election / stepdown--> PRIMARY
    SECONDARY | PRIMARY --divergence--> ROLLBACK --> SECONDARY
"""

from __future__ import annotations

__layer__ = "core"  # pure: no I/O, clock or randomness (tests/unit/test_layering.py)

import enum


class MemberState(enum.IntEnum):
    STARTUP = 0
    PRIMARY = 1
    SECONDARY = 2
    RECOVERING = 3
    STARTUP2 = 5
    UNKNOWN = 6
    ARBITER = 7
    DOWN = 8
    ROLLBACK = 9
    REMOVED = 10

    @property
    def state_str(self) -> str:
        if self is MemberState.DOWN:
            return "(not reachable/healthy)"
        return self.name

    @property
    def readable(self) -> bool:
        return self in (MemberState.PRIMARY, MemberState.SECONDARY)


_LEGAL: dict[MemberState, frozenset[MemberState]] = {
    MemberState.STARTUP: frozenset(
        {MemberState.PRIMARY, MemberState.SECONDARY, MemberState.STARTUP2, MemberState.REMOVED,
         MemberState.RECOVERING, MemberState.ARBITER}
    ),
    MemberState.STARTUP2: frozenset({MemberState.SECONDARY, MemberState.RECOVERING, MemberState.REMOVED}),
    MemberState.SECONDARY: frozenset(
        {MemberState.PRIMARY, MemberState.ROLLBACK, MemberState.RECOVERING, MemberState.REMOVED,
         MemberState.STARTUP2}
    ),
    MemberState.PRIMARY: frozenset({MemberState.SECONDARY, MemberState.ROLLBACK, MemberState.REMOVED}),
    MemberState.RECOVERING: frozenset(
        {MemberState.SECONDARY, MemberState.ROLLBACK, MemberState.STARTUP2, MemberState.REMOVED}
    ),
    MemberState.ROLLBACK: frozenset({MemberState.SECONDARY, MemberState.RECOVERING, MemberState.REMOVED}),
    MemberState.REMOVED: frozenset({MemberState.SECONDARY, MemberState.STARTUP2, MemberState.PRIMARY,
                                   MemberState.ARBITER}),
    MemberState.ARBITER: frozenset({MemberState.REMOVED}),
}


class IllegalTransition(RuntimeError):
    pass


def check_transition(old: MemberState, new: MemberState) -> None:
    if old == new:
        return
    if new not in _LEGAL.get(old, frozenset()):
        raise IllegalTransition(f"illegal member state transition {old.name} -> {new.name}")
