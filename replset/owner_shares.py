"""Fair shares of what clients hold on a member: open cursors, open transactions, sessions, read-snapshot
pins. Pure: no I/O, no clock.

Theory of operation
-------------------
Each kind of holding is bounded twice: per owner (a user with access control on, a connection without
it) and in all (memory). Asking for one more than the owner's share, or one more than the total, is
refused - the asker's error, with the setting that bounds it named; nothing another owner holds is taken
away to make room (DESIGN.md: limits refuse the one who hits them, never evict another). What an owner
gives back (a cursor exhausted, killed or expired; a transaction ended) frees its place at once.

`Remembered` keeps what is kept only as a courtesy (an ended transaction, to answer a late statement of
it): past an owner's share its own oldest go, past the total the oldest of whoever keeps most. One
owner's churn so never pushes out what another keeps within its share.
"""

from __future__ import annotations

__layer__ = "core"  # pure: no I/O, clock or randomness (tests/unit/test_layering.py)

from collections import OrderedDict
from collections.abc import Hashable
from typing import Generic, TypeVar

from base.errors import MongoError

OPERATION_FAILED = 96
K = TypeVar("K", bound=Hashable)


class Shares:
    """How many of one kind each owner holds, bounded per owner (`per_owner`, which an operator may
    change at run time) and in all (`total`)."""

    def __init__(self, what: str, parameter: str, *, per_owner: int, total: int,
                 code: int = OPERATION_FAILED) -> None:
        self.what = what  # "open cursors"
        self.parameter = parameter  # the setting that sets `per_owner`: "maxOpenCursorsPerUser"
        self.per_owner = per_owner
        self.total = total
        self.code = code
        self._held: dict[str, int] = {}
        self._sum = 0

    def __len__(self) -> int:
        return self._sum

    def held(self, owner: str) -> int:
        return self._held.get(owner, 0)

    def refusal(self, owner: str) -> MongoError | None:
        """Why `owner` may not take one more (None: it may)."""
        held = self.held(owner)
        if held >= self.per_owner:
            return MongoError(self.code, f"{_label(owner)} holds {held} {self.what}, its share "
                                         f"({self.parameter}: {self.per_owner}): end some before starting another")
        if self._sum >= self.total:
            return MongoError(self.code, f"this member holds {self._sum} {self.what}, its bound for all users "
                                         f"together ({self.total}): try again once some have ended")
        return None

    def take(self, owner: str) -> None:
        """One more for `owner`, or the refusal raised."""
        error = self.refusal(owner)
        if error is not None:
            raise error
        self.add(owner)

    def add(self, owner: str) -> None:
        """One more for `owner`, unchecked: what exists already (replicated, reloaded) is counted, not refused."""
        self._held[owner] = self.held(owner) + 1
        self._sum += 1

    def give_back(self, owner: str) -> None:
        held = self.held(owner)
        if held <= 0:
            raise ValueError(f"{_label(owner)} gives back one of its {self.what} but holds none")
        if held == 1:
            del self._held[owner]
        else:
            self._held[owner] = held - 1
        self._sum -= 1

    def clear(self) -> None:
        self._held.clear()
        self._sum = 0


def _label(owner: str) -> str:
    return owner or "the user (access control is off)"


class Remembered(Generic[K]):
    """Keys kept per owner, oldest first; `add` answers the keys to forget to stay within the bounds."""

    def __init__(self, *, per_owner: int, total: int) -> None:
        self.per_owner = per_owner
        self.total = total
        self._by_owner: dict[str, OrderedDict[K, None]] = {}
        self._count = 0

    def __len__(self) -> int:
        return self._count

    def add(self, owner: str, key: K) -> list[K]:
        keys = self._by_owner.setdefault(owner, OrderedDict())
        if key in keys:
            keys.move_to_end(key)
            return []
        keys[key] = None
        self._count += 1
        forgotten = []
        while len(keys) > self.per_owner:
            forgotten.append(self._forget_oldest(owner))
        while self._count > self.total:
            forgotten.append(self._forget_oldest(max(self._by_owner, key=lambda o: len(self._by_owner[o]))))
        return forgotten

    def discard(self, owner: str, key: K) -> None:
        keys = self._by_owner.get(owner)
        if keys is None or key not in keys:
            return
        del keys[key]
        self._count -= 1
        if not keys:
            del self._by_owner[owner]

    def _forget_oldest(self, owner: str) -> K:
        key = next(iter(self._by_owner[owner]))
        self.discard(owner, key)
        return key
