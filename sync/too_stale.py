"""Too stale to catch up: when a member gives up on steady-state replication and resyncs.

Theory of operation
-------------------
A secondary's fetcher asks a source for entries from its own last one. When the
source's oldest entry is newer than that, the source has trimmed (capped oplog)
entries we never applied: we cannot catch up from it (MongoDB's
`OplogStartMissing`, "RS102 too stale to catch up"). The fetcher records a
`StaleVerdict` per source and tries the next one; another member with a longer
oplog may still hold our entry.

`TooStaleTracker` decides, with the monotonic clock passed in:

* `stale_everywhere(reachable, now_ms)`: every member we could sync from right now
  (healthy PRIMARY/SECONDARY data-bearing members, chosen by the caller) has a
  fresh verdict (younger than `VERDICT_TTL_MS`). Only then is the member too stale:
  it goes RECOVERING (no reads, never elected, like MongoDB) and says so in its
  status (`infoMessage`).
* The resync is *delayed*: `resync_delay_ms(election timeout)` = three election
  timeouts (6 s with a 2 s timeout, 30 s with MongoDB's default 10 s). A member
  that was down or partitioned while the others trimmed may come back in that time
  holding our entry; if the fetcher applies anything meanwhile, the verdicts are
  cleared and the member is SECONDARY again. When the delay ends and the member is
  still stale everywhere, it resyncs from scratch (`replset resync` does the same at
  once) after copying its old database file to `<dbpath>/rollback/resync-<time>/`.

Pure: no I/O, no clock reads.
"""

from __future__ import annotations

__layer__ = "core"  # pure: no I/O, clock or randomness (tests/unit/test_layering.py)

from collections.abc import Iterable
from dataclasses import dataclass

from base.optime import OpTime

VERDICT_TTL_MS = 60_000
RESYNC_DELAY_ELECTION_TIMEOUTS = 3


@dataclass(frozen=True, slots=True)
class StaleVerdict:
    """`host`'s oldest entry is newer than our last one, seen at `at_ms`."""

    host: str
    our_last: OpTime
    source_oldest: OpTime
    at_ms: int


def resync_delay_ms(election_timeout_ms: int) -> int:
    return RESYNC_DELAY_ELECTION_TIMEOUTS * max(election_timeout_ms, 1)


def describe_optime(optime: OpTime) -> str:
    return f"Timestamp({optime.secs}, {optime.inc}) term {optime.term}"


class TooStaleTracker:
    def __init__(self) -> None:
        self._verdicts: dict[str, StaleVerdict] = {}
        self.resync_due_ms: int | None = None

    @property
    def stale(self) -> bool:
        """The member was found stale everywhere and a resync is scheduled."""
        return self.resync_due_ms is not None

    def record(self, verdict: StaleVerdict) -> None:
        self._verdicts[verdict.host.lower()] = verdict

    def clear(self) -> None:
        """Replication moved on (or the member resynced): forget every verdict."""
        self._verdicts.clear()
        self.resync_due_ms = None

    def fresh_verdicts(self, now_ms: int) -> list[StaleVerdict]:
        return sorted((v for v in self._verdicts.values() if now_ms - v.at_ms < VERDICT_TTL_MS),
                      key=lambda v: v.host)

    def stale_everywhere(self, reachable: Iterable[str], now_ms: int) -> bool:
        """Every reachable source has a fresh verdict (and there is at least one)."""
        fresh = {v.host for v in self.fresh_verdicts(now_ms)}
        hosts = {h.lower() for h in reachable}
        return bool(fresh) and hosts <= fresh

    def maybe_schedule(self, reachable: Iterable[str], now_ms: int, delay_ms: int) -> bool:
        """After a verdict: True when the member just became stale everywhere (resync scheduled)."""
        if self.resync_due_ms is not None or not self.stale_everywhere(reachable, now_ms):
            return False
        self.resync_due_ms = now_ms + delay_ms
        return True

    def resync_due(self, now_ms: int) -> bool:
        return self.resync_due_ms is not None and now_ms >= self.resync_due_ms

    def message(self, now_ms: int) -> str:
        """The operator's explanation (replSetGetStatus `infoMessage`), empty when not stale."""
        verdicts = self.fresh_verdicts(now_ms)
        if self.resync_due_ms is None or not verdicts:
            return ""
        ours = describe_optime(verdicts[0].our_last)
        theirs = ", ".join(f"{v.host} starts at {describe_optime(v.source_oldest)}" for v in verdicts)
        left_s = max(self.resync_due_ms - now_ms, 0) / 1000
        return (f"too stale to catch up: our last entry {ours} is gone from the oplog of every reachable "
                f"member ({theirs}); resyncing from scratch in {left_s:.0f} s (or run `replset resync`); "
                f"the current data will be kept under rollback/resync-*")
