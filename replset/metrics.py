"""`/metrics` on the HTTP port: Prometheus exposition through `prometheus-client`.

Two kinds of series:
- The set's state, read at scrape time from the very document `replSetGetStatus` answers (a custom
  collector: nothing is kept in step by hand), under the names Percona's `mongodb_exporter` gives
  them, so existing dashboards and alert rules work: `mongodb_rs_myState`, `mongodb_rs_term`,
  `mongodb_rs_ok`, and per member (labels `member_idx` = its host:port, `member_state` = its state
  name, `rs_nm` = the set, `rs_state` = this member's state number) `mongodb_rs_members_state`,
  `..._health`, `..._optimeDate` (milliseconds since the epoch, as the exporter gives dates),
  `..._pingMs`, `..._configVersion`, `..._uptime`, `..._electionDate`. This product's own, `replset_*`:
  each member's lag behind the primary, the commit point and this member's applied and durable
  optimes, the oplog's entries, bytes and window, rollbacks, elections won, client and member
  connections, and (once a table exists) the part log's queue and its postponed entries.
- Events, counted where they happen (one observation per batch, never per document): write-concern
  waits by `w`, group-commit batch sizes, journal fsync times, fetched and applied batch sizes, bytes
  of parts fetched.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from replset.status import replset_status

if TYPE_CHECKING:
    from replset.node import Node

SIZE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096)
TIME_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
MEMBER_LABELS = ("member_idx", "member_state", "rs_nm", "rs_state")
MEMBER_SERIES = (  # replSetGetStatus member field -> series (Percona's names)
    ("state", "mongodb_rs_members_state", "member state number"),
    ("health", "mongodb_rs_members_health", "1 if the member is reachable"),
    ("optimeDate", "mongodb_rs_members_optimeDate", "last applied optime's date, ms since the epoch"),
    ("pingMs", "mongodb_rs_members_pingMs", "heartbeat round trip, ms"),
    ("configVersion", "mongodb_rs_members_configVersion", "config version the member has"),
    ("uptime", "mongodb_rs_members_uptime", "seconds the member has been up"),
    ("electionDate", "mongodb_rs_members_electionDate", "when the primary was elected, ms since the epoch"),
)


def _number(value: Any) -> float | None:
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, datetime.datetime):
        when = value if value.tzinfo else value.replace(tzinfo=datetime.UTC)
        return when.timestamp() * 1000
    return None


def _seconds(optime: Any) -> float | None:
    ts = optime.get("ts") if isinstance(optime, dict) else None
    return None if ts is None else float(ts.time) + ts.inc / 2**32


class StateCollector(Collector):
    """The set's state at scrape time, from `replSetGetStatus`'s own document."""

    def __init__(self, node: Node, connections: Callable[[], dict[str, int]] | None) -> None:
        self._node = node
        self._connections = connections

    def collect(self) -> Iterator[GaugeMetricFamily]:
        node = self._node
        yield GaugeMetricFamily("mongodb_rs_myState", "this member's state number", value=int(node.state))
        yield GaugeMetricFamily("mongodb_rs_term", "the election term", value=node.term)
        if node.config is not None:
            yield from self._status_series(replset_status(node.status_view()))
        yield from self._oplog_series()
        yield GaugeMetricFamily("replset_rollbacks", "rollbacks this member has done (its rollback id)",
                                value=node.rbid)
        if self._connections is not None:
            family = GaugeMetricFamily("replset_connections", "open connections by kind", labels=["kind"])
            for kind, count in self._connections().items():
                family.add_metric([kind], count)
            yield family
        if node.parts.tables:
            queued = GaugeMetricFamily("replset_part_queue_length", "part-log entries waiting to be carried "
                                       "out, by table", labels=["table"])
            postponed = GaugeMetricFamily("replset_part_queue_postponed", "of those, the ones postponed (a "
                                          "reason to wait), by table", labels=["table"])
            for ns, rt in node.parts.tables.items():
                queued.add_metric([ns], len(rt.queue.entries))
                postponed.add_metric([ns], rt.queue.postponed())
            yield queued
            yield postponed

    def _status_series(self, status: dict[str, Any]) -> Iterator[GaugeMetricFamily]:
        yield GaugeMetricFamily("mongodb_rs_ok", "1 when replSetGetStatus answers", value=1)
        families = {field: GaugeMetricFamily(name, text, labels=list(MEMBER_LABELS))
                    for field, name, text in MEMBER_SERIES}
        lag = GaugeMetricFamily("replset_member_lag_seconds", "how far the member's applied optime is behind "
                                "the primary's", labels=list(MEMBER_LABELS))
        members = status.get("members", [])
        primary = next((m for m in members if m.get("stateStr") == "PRIMARY"), None)
        primary_at = _seconds(primary.get("optime")) if primary else None
        for member in members:
            labels = [str(member["name"]), str(member.get("stateStr", "")), str(status["set"]),
                      str(status["myState"])]
            for field, family in families.items():
                value = _number(member.get(field))
                if value is not None:
                    family.add_metric(labels, value)
            at = _seconds(member.get("optime"))
            if primary_at is not None and at is not None and member.get("health"):
                lag.add_metric(labels, max(0.0, primary_at - at))
        yield from families.values()
        yield lag
        optimes = GaugeMetricFamily("replset_optime_seconds", "this member's optimes (seconds since the epoch)",
                                    labels=["kind"])
        for kind, key in (("commit_point", "lastCommittedOpTime"), ("applied", "appliedOpTime"),
                          ("durable", "durableOpTime")):
            at = _seconds(status.get("optimes", {}).get(key))
            if at is not None:
                optimes.add_metric([kind], at)
        yield optimes

    def _oplog_series(self) -> Iterator[GaugeMetricFamily]:
        entries, size = self._node.store.oplog_totals
        yield GaugeMetricFamily("replset_oplog_entries", "entries in local.oplog.rs", value=entries)
        yield GaugeMetricFamily("replset_oplog_bytes", "bytes of entries in local.oplog.rs", value=size)
        window = self._node.oplog_window_s()
        if window is not None:
            yield GaugeMetricFamily("replset_oplog_window_seconds", "time between the oldest and the newest "
                                    "entry of the oplog", value=window)


class Metrics:
    """The member's registry: the state collector and the event series the member's parts observe."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.write_concern_wait = Histogram(
            "replset_write_concern_wait_seconds", "time a write waited for its write concern, by w",
            ["w"], buckets=TIME_BUCKETS, registry=self.registry)
        self.group_commit_batch = Histogram(
            "replset_group_commit_batch_size", "requests committed in one storage transaction",
            buckets=SIZE_BUCKETS, registry=self.registry)
        self.fsync = Histogram("replset_fsync_seconds", "time of one fsync of the journal (the WAL)",
                               buckets=TIME_BUCKETS, registry=self.registry)
        self.apply_batch = Histogram("replset_apply_batch_size", "oplog entries a secondary applied in one batch",
                                     buckets=SIZE_BUCKETS, registry=self.registry)
        self.fetch_batch = Histogram("replset_fetch_batch_size", "oplog entries a secondary fetched in one batch",
                                     buckets=SIZE_BUCKETS, registry=self.registry)
        self.elections = Counter("replset_elections_won", "elections this member won", registry=self.registry)
        self.part_fetch_bytes = Counter("replset_part_fetch_bytes", "bytes of parts fetched from other members",
                                        registry=self.registry)
        self.shared_looks = Counter("replset_shared_object_looks", "looks the primary took at a zero-copy table's "
                                    "objects in the shared storage for ones nothing marks", registry=self.registry)
        self.shared_deleted = Counter("replset_shared_objects_deleted", "zero-copy parts' object sets this member "
                                      "deleted from the shared storage (as primary)", registry=self.registry)
        self.parts_broken = Counter("replset_parts_broken", "parts found damaged here (set aside as broken_, "
                                    "fetched again)", registry=self.registry)

    def watch(self, node: Node, connections: Callable[[], dict[str, int]] | None) -> None:
        self.registry.register(StateCollector(node, connections))
