"""The cluster view: what this member knows about every member of the set.

Theory of operation
-------------------
One `Topology` per member owns the view (STYLE.md: one owner of the cluster
view). It is fed three kinds of events, each with the monotonic clock reading
`now_ms`, and never does I/O:

* `on_heartbeat_reply(id, reply, rtt_ms, now_ms)`: state, term, optimes, sync
  source and config version as the member reports them; the round trip feeds
  the smoothed `ping_ms`.
* `on_heartbeat_failure(id, now_ms, refused)`: no answer. A member stays
  healthy until `heartbeat_timeout_ms` passes without a reply (a slow network
  is not a dead member), except when the connection was *refused*: nothing
  listens on that port, so the member is DOWN at once.
* `on_position(id, applied, durable, now_ms)`: a `replSetUpdatePosition` entry,
  possibly relayed by a chained member; positions never move backwards.

From these it answers the runtime's questions: who is primary, do we still see
a majority of voters (a primary that does not steps down), the sync-source
inputs, the positions for write-concern counting and upstream reports, and the
rows of `replSetGetStatus`. The member's own state and positions are the
runtime's and are passed in where needed.
"""

from __future__ import annotations

__layer__ = "core"  # pure: no I/O, clock or randomness (tests/unit/test_layering.py)

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from base.config import ReplSetConfig
from base.member import MemberState
from base.messages import HeartbeatReply, MemberPosition
from base.optime import NULL_OPTIME, OpTime
from replset.election import config_is_older
from sync.ping_stats import PingStats
from sync.sync_source import MemberSnapshot, SyncSourceInputs

if TYPE_CHECKING:
    import datetime

UP_STATES = (MemberState.PRIMARY, MemberState.SECONDARY)


@dataclass(slots=True)
class MemberData:
    """Heartbeat and position data for one other member (mutable, owned by Topology)."""

    id: int
    host: str
    state: MemberState = MemberState.UNKNOWN
    healthy: bool = True
    term: int = -1
    applied: OpTime = NULL_OPTIME
    durable: OpTime = NULL_OPTIME
    sync_source: str = ""
    config_version: int = -2
    config_term: int = -1
    ping: PingStats = field(default_factory=PingStats)
    last_contact_ms: int | None = None       # last heartbeat reply or position report
    last_heartbeat_ms: int | None = None     # last heartbeat reply
    last_heartbeat_recv_ms: int | None = None
    message: str = ""
    election_date: datetime.datetime | None = None
    reported_position: bool = False          # learned from replSetUpdatePosition (relay it upstream)


@dataclass(frozen=True, slots=True)
class HeartbeatOutcome:
    """What a heartbeat reply means for the runtime."""

    newer_term: int | None        # the member reports a term above ours: adopt it
    primary_seen: bool            # the member is a primary of our term or newer (reset the election timer)
    newer_config: bool            # the reply carries a config newer than ours


class Topology:
    def __init__(self, config: ReplSetConfig, self_id: int, now_ms: int) -> None:
        self.config = config
        self.self_id = self_id
        self.members: dict[int, MemberData] = {}
        self.started_ms = now_ms
        self.reconfigure(config, self_id)

    def reconfigure(self, config: ReplSetConfig, self_id: int) -> None:
        """Adopt a new config, keeping what we know about members that stay (matched by host)."""
        by_host = {m.host: m for m in self.members.values()}
        self.config, self.self_id = config, self_id
        self.members = {}
        for m in config.members:
            if m.id == self_id:
                continue
            old = by_host.get(m.host)
            if old is not None:
                old.id = m.id
                self.members[m.id] = old
            else:
                self.members[m.id] = MemberData(id=m.id, host=m.host)

    # -- events -----------------------------------------------------------------------------------

    def on_heartbeat_reply(self, member_id: int, reply: HeartbeatReply, rtt_ms: float, now_ms: int,
                           my_term: int) -> HeartbeatOutcome:
        data = self.members.get(member_id)
        if data is None:
            return HeartbeatOutcome(None, False, False)
        data.state, data.healthy, data.term = reply.state, True, reply.term
        data.applied = max(data.applied, reply.applied) if data.state in UP_STATES else reply.applied
        data.durable = max(data.durable, reply.durable) if data.state in UP_STATES else reply.durable
        data.sync_source, data.config_version, data.config_term = (
            reply.sync_source, reply.config_version, reply.config_term)
        data.ping = data.ping.record(max(rtt_ms, 0.0))
        data.last_contact_ms = data.last_heartbeat_ms = now_ms
        data.message = ""
        data.election_date = reply.election_date
        newer_config = reply.config is not None and config_is_older(
            self.config.version, self.config.term, reply.config_version, reply.config_term)
        return HeartbeatOutcome(
            newer_term=reply.term if reply.term > my_term else None,
            primary_seen=reply.state is MemberState.PRIMARY and reply.term >= my_term,
            newer_config=newer_config,
        )

    def on_heartbeat_failure(self, member_id: int, now_ms: int, *, refused: bool, message: str) -> bool:
        """Records a failed heartbeat; returns True when the member just became DOWN."""
        data = self.members.get(member_id)
        if data is None:
            return False
        data.ping = data.ping.record_failure()
        data.message = message
        timeout_ms = self.config.settings.heartbeat_timeout_secs * 1000
        since = data.last_heartbeat_ms if data.last_heartbeat_ms is not None else self.started_ms
        if data.healthy and (refused or now_ms - since >= timeout_ms):
            data.healthy = False
            data.state = MemberState.DOWN
            return True
        return False

    def on_heartbeat_request(self, member_id: int, now_ms: int, config_version: int, config_term: int) -> None:
        """A heartbeat *from* the member: it is alive and has this config."""
        data = self.members.get(member_id)
        if data is not None:
            data.last_heartbeat_recv_ms = now_ms
            data.config_version, data.config_term = config_version, config_term

    def on_position(self, pos: MemberPosition, now_ms: int) -> bool:
        """Merges one reported position; returns True when it moved forward."""
        data = self.members.get(pos.member_id)
        if data is None:
            return False
        moved = pos.applied > data.applied or pos.durable > data.durable
        data.applied = max(data.applied, pos.applied)
        data.durable = max(data.durable, pos.durable)
        data.last_contact_ms = now_ms
        data.reported_position = True
        return moved

    def touch(self, member_id: int, now_ms: int) -> None:
        """Any answer from the member (a vote reply, say) counts as contact."""
        data = self.members.get(member_id)
        if data is not None:
            data.last_contact_ms = now_ms

    # -- questions --------------------------------------------------------------------------------

    def primary_id(self, my_state: MemberState, my_term: int) -> int | None:
        """Ourselves if PRIMARY, else the healthy member reporting PRIMARY with the highest term."""
        if my_state is MemberState.PRIMARY:
            return self.self_id
        primaries = [d for d in self.members.values()
                     if d.healthy and d.state is MemberState.PRIMARY and d.term >= my_term]
        return max(primaries, key=lambda d: d.term).id if primaries else None

    def sees_majority(self, now_ms: int, window_ms: int) -> bool:
        """Whether a majority of voters (ourselves included) was heard from within `window_ms`."""
        seen = 0
        for m in self.config.voters:
            if m.id == self.self_id:
                seen += 1
                continue
            data = self.members.get(m.id)
            if (data is not None and data.healthy and data.last_contact_ms is not None
                    and now_ms - data.last_contact_ms < window_ms):
                seen += 1
        return seen >= self.config.majority_vote_count

    def positions(self, self_applied: OpTime, self_durable: OpTime) -> tuple[dict[int, OpTime], dict[int, OpTime]]:
        """Applied and durable optimes by member id, ourselves included."""
        applied = {i: d.applied for i, d in self.members.items()}
        durable = {i: d.durable for i, d in self.members.items()}
        applied[self.self_id], durable[self.self_id] = self_applied, self_durable
        return applied, durable

    def positions_to_report(self, self_applied: OpTime, self_durable: OpTime) -> list[MemberPosition]:
        """Our own position and every position reported to us (chained members downstream)."""
        version = self.config.version
        out = [MemberPosition(self.self_id, self_applied, self_durable, version)]
        out += [MemberPosition(d.id, d.applied, d.durable, version)
                for d in self.members.values() if d.reported_position and d.applied != NULL_OPTIME]
        return out

    def sync_source_inputs(self, *, last_fetched: OpTime, my_state: MemberState, my_term: int,
                           forced_host: str | None, denylist: frozenset[str], now_ms: int) -> SyncSourceInputs:
        me = self.config.member_by_id(self.self_id)
        assert me is not None
        snapshots = tuple(
            MemberSnapshot.from_config(m, state=d.state, healthy=d.healthy, last_applied=d.applied,
                                       ping_ms=d.ping.value_ms, sync_source=d.sync_source)
            for m in self.config.members if (d := self.members.get(m.id)) is not None
        )
        return SyncSourceInputs(
            self_id=self.self_id, self_last_fetched=last_fetched, self_votes=me.votes,
            self_build_indexes=me.build_indexes, self_secondary_delay_secs=me.secondary_delay_secs,
            members=snapshots, primary_id=self.primary_id(my_state, my_term),
            chaining_allowed=self.config.settings.chaining_allowed, forced_host=forced_host,
            denylist=denylist, now_ms=now_ms, self_host=me.host,
        )

    def majority_has_config(self) -> bool:
        """Whether a majority of voters (ourselves included) reported our exact config version and term."""
        config = self.config
        have = sum(1 for m in config.voters if m.id == self.self_id or (
            (d := self.members.get(m.id)) is not None and d.healthy
            and (d.config_term, d.config_version) == (config.term, config.version)))
        return have >= config.majority_vote_count

    def caught_up_electable(self, last_applied: OpTime) -> str | None:
        """A healthy electable SECONDARY that has applied `last_applied` (the stepdown handoff target)."""
        for member in self.config.members:
            data = self.members.get(member.id)
            if (data is not None and member.electable and data.healthy and data.state is MemberState.SECONDARY
                    and data.applied >= last_applied):
                return member.host
        return None

    def newest_applied(self) -> OpTime:
        """The newest optime any healthy member reports (the catch-up target of a new primary)."""
        return max((d.applied for d in self.members.values() if d.healthy), default=NULL_OPTIME)
