"""Sync source selection for a secondary (MongoDB's `TopologyCoordinator::chooseNewSyncSource`
and `shouldChangeSyncSource`), as pure functions of a topology snapshot.

Theory of operation
-------------------
The node builds a `SyncSourceInputs` from its heartbeat view (one `MemberSnapshot` per
other member: state, health, last applied optime, smoothed ping) and asks:

* `choose_sync_source(inputs)` -> a host, or None meaning "nobody qualifies, retry in 1 s".

  1. `replSetSyncFrom`: a forced host that is a member (not ourselves) wins outright.
  2. We are the primary: no source.
  3. Chaining disallowed: the primary, if it is up (healthy and PRIMARY/SECONDARY), else None.
  4. Otherwise the closest *candidate*. A member is a candidate when it is healthy and
     PRIMARY/SECONDARY, not us, not an arbiter, builds indexes if we do, has applied past our
     last fetched optime (the primary, and a secondary of a lower member id syncing from the
     primary, may be level with it: an idle set still follows the ping), is not more than
     `max_sync_source_lag_secs` behind the primary (only when a healthy primary is known), is not on the
     deny list, and does not sync from us, directly or through others (as heartbeats report each
     member's source): no cycle. The first pass also
     requires a voter if we vote, not hidden, and not more delayed than us; when the first
     pass is empty a second pass drops those three. The closest candidate has the lowest
     ping (unknown ping counts as infinitely far); ties go to the primary, then the lowest
     member id, so the answer never depends on the order of `members`.

* `should_change_sync_source(inputs, current_host)` -> `ChangeDecision(change, reason)`, checked
  in this order: current gone from the config or ourselves; a different forced host (the forced host itself
  is always kept); we became primary; current unhealthy or not PRIMARY/SECONDARY; chaining off
  and current is not the primary (the primary itself is then kept); current deny-listed; current
  syncs from us through others (a cycle that members chose from heartbeats a turn old);
  current more than `max_sync_source_lag_secs` behind the primary while another candidate is
  not; another candidate closer by more than `change_threshold_ms` (only when the current
  ping is known). The two functions agree: if `choose_sync_source` returns the current host
  no change is asked for, and a change is asked for only when `choose_sync_source` would
  return something else.

Deny list and time: `denylist` holds the hosts refused *now*. Expiry is the caller's job;
it keeps `{host: until_ms}` and passes `active_denylist(until_by_host, now_ms)`. `now_ms`
travels with the inputs only so the caller and its logs share one clock reading; the rules
themselves never read it. Rate-limiting switches (`maxNumSyncSourceChangesPerHour`) and probing
a chosen source (oldest oplog entry, rbid, minValid) are likewise left to the caller.

Host names are compared case-insensitively (the config stores them lower-case). Pure: no
I/O, clocks or randomness.
"""

from __future__ import annotations

__layer__ = "core"  # pure: no I/O, clock or randomness (tests/unit/test_layering.py)

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from base.config import MemberConfig
from base.member import MemberState
from base.optime import OpTime

DEFAULT_MAX_SYNC_SOURCE_LAG_SECS = 30
DEFAULT_CHANGE_THRESHOLD_MS = 5.0


@dataclass(frozen=True, slots=True)
class MemberSnapshot:
    """What the topology knows about one other member."""

    id: int
    host: str
    state: MemberState
    healthy: bool
    last_applied: OpTime
    ping_ms: float | None
    hidden: bool = False
    arbiter: bool = False
    votes: int = 1
    build_indexes: bool = True
    secondary_delay_secs: int = 0
    sync_source: str = ""            # the member's own sync source, as its heartbeats say ("" unknown or none)

    @classmethod
    def from_config(cls, member: MemberConfig, *, state: MemberState, healthy: bool,
                    last_applied: OpTime, ping_ms: float | None, sync_source: str = "") -> MemberSnapshot:
        """Combine a member's config with what heartbeats say about it."""
        return cls(
            id=member.id, host=member.host, state=state, healthy=healthy, last_applied=last_applied,
            ping_ms=ping_ms, hidden=member.hidden, arbiter=member.arbiter_only, votes=member.votes,
            build_indexes=member.build_indexes, secondary_delay_secs=member.secondary_delay_secs,
            sync_source=sync_source,
        )


@dataclass(frozen=True, slots=True)
class SyncSourceInputs:
    self_id: int
    self_last_fetched: OpTime
    self_votes: int
    self_build_indexes: bool
    self_secondary_delay_secs: int
    members: tuple[MemberSnapshot, ...]
    primary_id: int | None
    chaining_allowed: bool
    forced_host: str | None          # replSetSyncFrom target, None when not set
    denylist: frozenset[str]         # hosts refused right now; see active_denylist for expiry
    max_sync_source_lag_secs: int = DEFAULT_MAX_SYNC_SOURCE_LAG_SECS
    now_ms: int = 0
    self_host: str = ""              # our own host, to recognise ourselves upstream of a member
    fetched_nothing_for_ms: int = 0  # how long our fetcher's current source has given us no new entry
    stall_limit_ms: int = 0          # past it, a source not ahead of us is left for one that is (0: never)


@dataclass(frozen=True, slots=True)
class SyncSourceChoice:
    host: str | None
    reason: str


@dataclass(frozen=True, slots=True)
class ChangeDecision:
    change: bool
    reason: str
    deny_ms: int = 0   # deny-list the source left for that long (a stalled one: not chosen again at once)


def active_denylist(until_by_host: Mapping[str, int], now_ms: int) -> frozenset[str]:
    """The hosts whose deny-list entry has not expired at `now_ms` (entries end at `until_ms`)."""
    return frozenset(host.lower() for host, until_ms in until_by_host.items() if now_ms < until_ms)


# --- lookups -----------------------------------------------------------------------------------


def _same_host(a: str, b: str) -> bool:
    return a.lower() == b.lower()


def _member_by_host(inputs: SyncSourceInputs, host: str) -> MemberSnapshot | None:
    return next((m for m in inputs.members if _same_host(m.host, host)), None)


def _is_up(member: MemberSnapshot) -> bool:
    return member.healthy and member.state in (MemberState.PRIMARY, MemberState.SECONDARY)


def _primary(inputs: SyncSourceInputs) -> MemberSnapshot | None:
    if inputs.primary_id is None:
        return None
    return next((m for m in inputs.members if m.id == inputs.primary_id), None)


def _forced_member(inputs: SyncSourceInputs) -> MemberSnapshot | None:
    if inputs.forced_host is None:
        return None
    member = _member_by_host(inputs, inputs.forced_host)
    return member if member is not None and member.id != inputs.self_id else None


def _denied(inputs: SyncSourceInputs, member: MemberSnapshot) -> bool:
    return any(_same_host(member.host, host) for host in inputs.denylist)


def _ping_key(member: MemberSnapshot) -> float:
    return math.inf if member.ping_ms is None else member.ping_ms


def _format_ping(member: MemberSnapshot) -> str:
    return "unknown" if member.ping_ms is None else f"{member.ping_ms:.1f} ms"


# --- eligibility -------------------------------------------------------------------------------


def oldest_acceptable_optime(inputs: SyncSourceInputs) -> OpTime | None:
    """Members applied before this are too stale to sync from (None: no healthy primary known)."""
    primary = _primary(inputs)
    if primary is None or not primary.healthy:
        return None
    secs = max(primary.last_applied.secs - inputs.max_sync_source_lag_secs, 0)
    return OpTime(secs, 0, -1)


def _is_too_stale(inputs: SyncSourceInputs, member: MemberSnapshot) -> bool:
    oldest = oldest_acceptable_optime(inputs)
    return oldest is not None and member.last_applied.secs < oldest.secs


def _level_ok(inputs: SyncSourceInputs, member: MemberSnapshot) -> bool:
    """A member level with us still qualifies when it is the primary (a caught-up member tails it for
    the next write), or a secondary with a lower member id than ours that syncs from the primary: on a
    set with no writes nobody is ever ahead, and a sync source must still follow the ping. No other
    level member does. A cycle of members syncing from each other never advances; every link of one
    would have to be level (a source is never behind), and level links only go to lower ids, so
    there is none - even when two members decide at once from heartbeats that are a turn old."""
    if member.last_applied != inputs.self_last_fetched:
        return False
    if member.id == inputs.primary_id:
        return True
    primary = _primary(inputs)
    return (primary is not None and member.id < inputs.self_id and member.sync_source != ""
            and _same_host(member.sync_source, primary.host))


def syncs_from_us(inputs: SyncSourceInputs, member: MemberSnapshot) -> bool:
    """Whether `member` syncs from us, directly or through others, as heartbeats report their sources:
    syncing from it would close a cycle of members that only ever fetch from each other."""
    seen, hop = {member.id}, member
    for _ in range(len(inputs.members) + 1):
        if not hop.sync_source:
            return False
        if inputs.self_host and _same_host(hop.sync_source, inputs.self_host):
            return True
        upstream = _member_by_host(inputs, hop.sync_source)
        if upstream is None or upstream.id in seen:
            return upstream is not None and upstream.id == inputs.self_id
        if upstream.id == inputs.self_id:
            return True
        seen.add(upstream.id)
        hop = upstream
    return False


def ineligibility(inputs: SyncSourceInputs, member: MemberSnapshot) -> str | None:
    """Why `member` can never be a candidate (both passes), or None if it can."""
    checks: tuple[tuple[bool, str], ...] = (
        (member.id == inputs.self_id, "is ourselves"),
        (not member.healthy, "is not healthy"),
        (member.state not in (MemberState.PRIMARY, MemberState.SECONDARY), f"is {member.state.name}"),
        (member.arbiter, "is an arbiter"),
        (inputs.self_build_indexes and not member.build_indexes, "does not build indexes"),
        (member.last_applied <= inputs.self_last_fetched and not _level_ok(inputs, member),
         "is not ahead of our last fetched optime"),
        (_is_too_stale(inputs, member),
         f"is more than {inputs.max_sync_source_lag_secs} s behind the primary"),
        (_denied(inputs, member), "is deny-listed"),
        (syncs_from_us(inputs, member), "syncs from us, directly or through other members"),
    )
    return next((f"{member.host} {why}" for failed, why in checks if failed), None)


def _first_pass_ok(inputs: SyncSourceInputs, member: MemberSnapshot) -> bool:
    if inputs.self_votes > 0 and member.votes <= 0:
        return False
    if member.hidden:
        return False
    return member.secondary_delay_secs <= inputs.self_secondary_delay_secs


def candidates(inputs: SyncSourceInputs) -> tuple[MemberSnapshot, ...]:
    """The members `choose_sync_source` picks from: the first pass, or the second if that is empty."""
    second = tuple(m for m in inputs.members if ineligibility(inputs, m) is None)
    first = tuple(m for m in second if _first_pass_ok(inputs, m))
    return first or second


def closest(inputs: SyncSourceInputs, members: Iterable[MemberSnapshot]) -> MemberSnapshot | None:
    """Lowest ping; ties go to the primary, then to the lowest member id."""
    return min(members, key=lambda m: (_ping_key(m), m.id != inputs.primary_id, m.id), default=None)


# --- choosing ----------------------------------------------------------------------------------


def explain_sync_source(inputs: SyncSourceInputs) -> SyncSourceChoice:
    """`choose_sync_source` with the reason, for logs and replSetGetStatus."""
    forced = _forced_member(inputs)
    if forced is not None:
        return SyncSourceChoice(forced.host, f"{forced.host} was requested by replSetSyncFrom")
    if inputs.primary_id == inputs.self_id:
        return SyncSourceChoice(None, "we are the primary")
    if not inputs.chaining_allowed:
        return _choose_primary_only(inputs)
    best = closest(inputs, candidates(inputs))
    if best is None:
        return SyncSourceChoice(None, "no member is eligible as a sync source; retry in 1 s")
    return SyncSourceChoice(best.host, f"{best.host} is the closest eligible member (ping {_format_ping(best)})")


def _choose_primary_only(inputs: SyncSourceInputs) -> SyncSourceChoice:
    primary = _primary(inputs)
    if primary is None:
        return SyncSourceChoice(None, "chaining is disallowed and no primary is known; retry in 1 s")
    if not _is_up(primary):
        return SyncSourceChoice(None, f"chaining is disallowed and the primary {primary.host} is not up")
    return SyncSourceChoice(primary.host, f"chaining is disallowed: syncing from the primary {primary.host}")


def choose_sync_source(inputs: SyncSourceInputs) -> str | None:
    """The host to sync from, or None ("retry in 1 s")."""
    return explain_sync_source(inputs).host


# --- re-evaluation -----------------------------------------------------------------------------


def should_change_sync_source(inputs: SyncSourceInputs, current_host: str, *,
                              change_threshold_ms: float = DEFAULT_CHANGE_THRESHOLD_MS) -> ChangeDecision:
    """Whether to drop `current_host` and choose again, with the reason."""
    current = _member_by_host(inputs, current_host)
    if current is None:
        return ChangeDecision(True, f"sync source {current_host} is no longer in the config")
    if current.id == inputs.self_id:
        return ChangeDecision(True, f"sync source {current.host} is ourselves")
    decision = _structural_change(inputs, current)
    if decision is not None:
        return decision
    if _denied(inputs, current):
        return ChangeDecision(True, f"sync source {current.host} is deny-listed")
    if syncs_from_us(inputs, current):
        return ChangeDecision(True, f"sync source {current.host} syncs from us, directly or through other "
                                    "members: nobody in that cycle would ever fetch a new entry")
    others = tuple(m for m in candidates(inputs) if m.id != current.id)
    decision = (_stall_change(inputs, current, others) or _lag_change(inputs, current, others)
                or _ping_change(current, others, change_threshold_ms))
    if decision is not None:
        return decision
    if _is_too_stale(inputs, current):
        return ChangeDecision(False, f"sync source {current.host} lags the primary by more than "
                                     f"{inputs.max_sync_source_lag_secs} s, but no other member is eligible")
    return ChangeDecision(False, f"sync source {current.host} is still a good choice")


def _structural_change(inputs: SyncSourceInputs, current: MemberSnapshot) -> ChangeDecision | None:
    """Forced host, our own primacy, the source's health and the chaining setting."""
    forced = _forced_member(inputs)
    if forced is not None:
        if forced.id == current.id:
            return ChangeDecision(False, f"sync source {current.host} was requested by replSetSyncFrom")
        return ChangeDecision(True, f"replSetSyncFrom asks for {forced.host} instead of {current.host}")
    if inputs.primary_id == inputs.self_id:
        return ChangeDecision(True, "we are the primary and need no sync source")
    if not current.healthy:
        return ChangeDecision(True, f"sync source {current.host} is not healthy")
    if not _is_up(current):
        return ChangeDecision(True, f"sync source {current.host} is {current.state.name}, "
                                    "not PRIMARY or SECONDARY")
    if inputs.chaining_allowed:
        return None
    if current.id != inputs.primary_id:
        return ChangeDecision(True, f"chaining is disallowed and sync source {current.host} is not the primary")
    return ChangeDecision(False, f"chaining is disallowed and {current.host} is the primary")


def _stall_change(inputs: SyncSourceInputs, current: MemberSnapshot,
                  others: tuple[MemberSnapshot, ...]) -> ChangeDecision | None:
    """Leave a source that has given us nothing new for `stall_limit_ms` while another candidate is ahead of
    us. A member level with us may be a source (the idle-set rule of `_level_ok`), and one whose own
    fetching stalls stays level while the primary moves on: its followers would wait behind it for good,
    and with them a w:"majority" write (the lag rule counts wall-clock seconds between entries, and a
    write that waits makes no more entries). It is deny-listed as long, so the choice does not take it
    again at once."""
    if not inputs.stall_limit_ms or current.id == inputs.primary_id \
            or inputs.fetched_nothing_for_ms < inputs.stall_limit_ms:
        return None
    ahead = [m for m in others if m.last_applied > inputs.self_last_fetched]
    if not ahead or current.last_applied > inputs.self_last_fetched:
        return None
    best = min(ahead, key=lambda m: (m.ping_ms if m.ping_ms is not None else float("inf"), m.id))
    return ChangeDecision(True, f"sync source {current.host} gave us nothing new for "
                                f"{inputs.fetched_nothing_for_ms} ms while {best.host} is ahead of us",
                          deny_ms=inputs.stall_limit_ms)


def _lag_change(inputs: SyncSourceInputs, current: MemberSnapshot,
                others: tuple[MemberSnapshot, ...]) -> ChangeDecision | None:
    """Change when the source is too far behind the primary and some other candidate is not."""
    primary = _primary(inputs)
    best_other = closest(inputs, others)
    if primary is None or best_other is None or not _is_too_stale(inputs, current):
        return None
    lag = primary.last_applied.secs - current.last_applied.secs
    return ChangeDecision(True, f"sync source {current.host} is {lag} s behind the primary "
                                f"(more than {inputs.max_sync_source_lag_secs} s) and {best_other.host} is not")


def _ping_change(current: MemberSnapshot, others: tuple[MemberSnapshot, ...],
                 threshold_ms: float) -> ChangeDecision | None:
    if current.ping_ms is None:
        return None
    better = [m for m in others if m.ping_ms is not None and m.ping_ms < current.ping_ms - threshold_ms]
    if not better:
        return None
    best = min(better, key=lambda m: (_ping_key(m), m.id))
    return ChangeDecision(True, f"{best.host} (ping {_format_ping(best)}) is closer than sync source "
                                f"{current.host} (ping {_format_ping(current)}) by more than "
                                f"{threshold_ms:g} ms")
