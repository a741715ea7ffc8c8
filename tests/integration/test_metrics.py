"""`/metrics` on a real 3-member set: the exposition parses with prometheus-client's own parser, the
replica-set series under Percona mongodb_exporter's names agree with `replSetGetStatus`, and the event
series count what happened (majority waits, group commits, fsyncs, a secondary's applied batches)."""

from __future__ import annotations

import datetime
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families
from pymongo.write_concern import WriteConcern

from tests.support.members import Member, wait_for
from tests.support.replica_set import ReplicaSet, make_replica_set

WRITES = 25


@pytest.fixture(scope="module")
def rs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ReplicaSet]:
    replica_set = make_replica_set(str(tmp_path_factory.mktemp("metrics")), 3)
    replica_set.start()
    try:
        replica_set.initiate()
        yield replica_set
    finally:
        replica_set.stop()


def scrape(member: Member) -> dict[str, list[Any]]:
    """Every sample of the member's /metrics, by sample name."""
    with urllib.request.urlopen(f"http://127.0.0.1:{member.http_port}/metrics", timeout=10) as response:
        assert response.headers["Content-Type"].startswith("text/plain")
        text = response.read().decode()
    samples: dict[str, list[Any]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples.setdefault(sample.name, []).append(sample)
    return samples


def value(samples: dict[str, list[Any]], name: str, **labels: str) -> float:
    matching = [s.value for s in samples.get(name, []) if all(s.labels.get(k) == v for k, v in labels.items())]
    assert len(matching) == 1, (name, labels, samples.get(name))
    return float(matching[0])


def test_the_replica_set_series_agree_with_repl_set_get_status(rs: ReplicaSet) -> None:
    primary = rs.wait_primary()
    with rs.client() as client:
        coll = client.app.get_collection("m", write_concern=WriteConcern(w="majority", wtimeout=20_000))
        for i in range(WRITES):
            coll.insert_one({"_id": i})
    for member in rs.members:
        def settled(member: Member = member) -> bool:  # every member seen healthy, as the test reads it
            return all(m["health"] == 1 for m in rs.status(member)["members"])
        wait_for(settled, 30, f"{member.host} to see every member healthy")
        status = rs.status(member)
        samples = scrape(member)
        assert value(samples, "mongodb_rs_myState") == status["myState"]
        assert value(samples, "mongodb_rs_term") == status["term"]
        for row in status["members"]:
            labels = {"member_idx": row["name"], "member_state": row["stateStr"], "rs_nm": status["set"],
                      "rs_state": str(status["myState"])}
            assert value(samples, "mongodb_rs_members_state", **labels) == row["state"]
            assert value(samples, "mongodb_rs_members_health", **labels) == row["health"]
            assert value(samples, "mongodb_rs_members_configVersion", **labels) == row["configVersion"]
            seen_ms = row["optimeDate"].replace(tzinfo=datetime.UTC).timestamp() * 1000
            assert abs(value(samples, "mongodb_rs_members_optimeDate", **labels) - seen_ms) <= 5_000
        with member.direct_client() as client:
            entries = client.local["oplog.rs"].count_documents({})
        assert abs(value(samples, "replset_oplog_entries") - entries) <= 2  # (a no-op may land between)
    on_primary = scrape(primary)
    assert value(on_primary, "replset_write_concern_wait_seconds_count", w="majority") >= WRITES
    assert value(on_primary, "replset_group_commit_batch_size_count") >= WRITES
    assert value(on_primary, "replset_fsync_seconds_count") >= 1
    assert value(on_primary, "replset_elections_won_total") == 1
    secondary = next(m for m in rs.members if m is not primary)
    on_secondary = scrape(secondary)
    assert value(on_secondary, "replset_apply_batch_size_sum") >= WRITES
    assert value(on_secondary, "replset_fetch_batch_size_sum") >= WRITES


def test_parts_tables_have_their_queue_and_fetch_series(rs: ReplicaSet) -> None:
    primary = rs.wait_primary()
    with rs.client() as client:
        client.app.command({"createPartsTable": "blocks", "columns": [{"name": "k", "type": "string"}],
                            "orderBy": ["k"]})
        client.app.command({"insertBlock": "blocks", "rows": [{"k": str(i)} for i in range(100)]})
    secondary = next(m for m in rs.members if m is not primary)
    # The secondary fetches the part from the primary's HTTP port.
    wait_for(lambda: value(scrape(secondary), "replset_part_fetch_bytes_total") > 0, 30,
             "the secondary to count the bytes of the part it fetched")
    on_primary = scrape(primary)
    assert value(on_primary, "replset_part_queue_length", table="app.blocks") >= 0
    assert value(on_primary, "replset_part_queue_postponed", table="app.blocks") >= 0
