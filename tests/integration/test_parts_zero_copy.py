"""Zero-copy parts tables on a real set whose members share a directory as their parts storage
(`--partsStorage file://...`): each part's data file is there once, the members keep metadata only, every
member answers every row, and a damaged object is never served (docs/zero-copy.md)."""

from __future__ import annotations

import datetime
import os
import pathlib
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from pymongo.errors import OperationFailure

from oplog.parts import part_files as pf
from oplog.parts.shared_storage import SharedStorage
from tests.support.members import Member, wait_for
from tests.support.parts import part_dirs, select
from tests.support.replica_set import ReplicaSet, running_set
from tests.support.s3_server import create_bucket, s3_server

EVENTS = {"columns": [{"name": "ts", "type": "timestamp[ms]"}, {"name": "user", "type": "string"},
                      {"name": "n", "type": "int64", "default": 0}],
          "partitionBy": "toYYYYMM(ts)", "orderBy": ["user", "ts"],
          "settings": {"zeroCopy": True, "mergeSelectingSleepMS": 200}}


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    return tmp_path_factory.mktemp("shared")


@pytest.fixture(scope="module")
def zrs(tmp_path_factory: pytest.TempPathFactory, shared: pathlib.Path) -> Iterator[ReplicaSet]:
    yield from running_set(str(tmp_path_factory.mktemp("zrs")), ("--partsStorage", f"file://{shared}"))


def _rows(block: int, n: int = 50) -> list[dict[str, Any]]:
    return [{"ts": datetime.datetime(2024, 1 + block % 3, 1 + i % 28), "user": f"u{i % 5}", "n": block * 1000 + i}
            for i in range(n)]


def _files_named(root: str, name: str) -> list[str]:
    return [os.path.join(d, name) for d, _dirs, files in os.walk(root) if name in files]


def _pointers(member: Member, ns: str) -> dict[str, str]:
    """part -> the key its directory names in the storage."""
    table_dir = os.path.join(member.dbpath, "parts", ns)
    out = {}
    for part in part_dirs(member, ns):
        location = pf.shared_location(os.path.join(table_dir, part))
        assert location is not None, f"{part} on {member.host} is not a zero-copy part"
        out[part] = location[1]
    return out


def test_every_part_is_once_in_the_storage_and_every_member_answers_every_row(zrs: ReplicaSet,
                                                                              shared: pathlib.Path) -> None:
    db = zrs.client().zc
    db.command({"createPartsTable": "events", **{**EVENTS, "settings": {
        **EVENTS["settings"], "zeroCopyGraceSecs": 1, "cleanupDelayPeriodSecs": 1, "oldPartsLifetimeSecs": 1}}})
    uuid = db["system.parts"].find_one({"_id": "events"})["uuid"]
    primary = zrs.wait_primary()
    for block in range(20):   # on every member in turn: the inserting member publishes the objects
        member = zrs.members[block % 3]
        zrs.direct(member).zc.command({"insertBlock": "events", "rows": _rows(block)})
    expected = sorted(block * 1000 + i for block in range(20) for i in range(50))
    for member in zrs.members:
        wait_for(lambda m=member: sorted(r["n"] for r in select(zrs, m, "zc", columns=["n"])) == expected, 60,
                 f"every row on {member.host}")
    wait_for(lambda: len({tuple(sorted(part_dirs(m, "zc.events"))) for m in zrs.members}) == 1, 60,
             "the same active parts on every member")
    for member in zrs.members:   # the members keep metadata only
        assert _files_named(member.dbpath, pf.DATA_FILE) == []
    pointers = [_pointers(m, "zc.events") for m in zrs.members]
    assert pointers[0] == pointers[1] == pointers[2]   # one object set per part, shared
    for key in set(pointers[0].values()):
        assert os.path.isfile(shared / key / pf.DATA_FILE) and os.path.isfile(shared / key / pf.CHECKSUMS_FILE)
    # Once the parts merged away have aged out: one data file in the storage per active part, no other.
    wait_for(lambda: len(_files_named(str(shared / uuid), pf.DATA_FILE)) == len(part_dirs(primary, "zc.events"))
             and _keys(shared, uuid) == {k.split("/", 1)[1] for k in _pointers(primary, "zc.events").values()}, 60,
             "one data file a part in the storage")


def test_a_damaged_object_fails_the_read_and_is_never_served(zrs: ReplicaSet, shared: pathlib.Path) -> None:
    db = zrs.client().zd
    db.command({"createPartsTable": "events", **{**EVENTS, "settings": {"zeroCopy": True}}})
    db.command({"insertBlock": "events", "rows": [{"ts": datetime.datetime(2024, 1, 1 + i % 28), "user": "u",
                                                    "n": i} for i in range(5_000)]})
    member = zrs.members[0]
    wait_for(lambda: len(select(zrs, member, "zd", columns=["n"])) == 5_000, 30, "the rows")
    [key] = set(_pointers(member, "zd.events").values())
    data = shared / key / pf.DATA_FILE
    damaged = bytearray(data.read_bytes())
    damaged[len(damaged) // 3] ^= 0xFF
    data.write_bytes(bytes(damaged))
    with pytest.raises(OperationFailure) as err:
        select(zrs, member, "zd", columns=["n"])
    assert err.value.code == 96 and "could not be read" in str(err.value)   # the page's CRC, not a crash


def _keys(shared: pathlib.Path, uuid: str) -> set[str]:
    table = shared / uuid
    return {name for name in os.listdir(table) if not name.startswith(".")} if table.is_dir() else set()


def _what_marks(rs: ReplicaSet, db: str, shared: pathlib.Path, uuid: str) -> str:
    """The shared keys, and on each member its parts, its part directories, its queue and the registry it
    sees: what a collector that deletes nothing was looking at."""
    lines = [f"stored keys: {sorted(_keys(shared, uuid))}"]
    for member in rs.members:
        try:
            direct = rs.direct(member)[db]
            registry = list(direct.get_collection("system.parts.events.replicas").find({}, {"_id": 1, "member": 1}))
            parts = [p["name"] for p in direct.command({"partsStatus": "events"})["parts"]]
            queue = direct.command({"partsReplicationQueue": "events"})["queue"]
            lines.append(f"{member.host}: parts {parts}; directories {part_dirs(member, db + '.events')}; "
                         f"queue {[(q.get('type'), q.get('new_part_name'), q.get('postpone_reason')) for q in queue]}; "
                         f"registry {registry}")
        except Exception as exc:   # a member that does not answer is part of the picture
            lines.append(f"{member.host}: {exc!r}")
    return "\n".join(lines)


def test_objects_nothing_marks_go_merged_away_and_dropped_ones_alike(zrs: ReplicaSet, shared: pathlib.Path) -> None:
    db = zrs.client().zg
    db.command({"createPartsTable": "events", **{**EVENTS, "settings": {
        "zeroCopy": True, "zeroCopyGraceSecs": 1, "cleanupDelayPeriodSecs": 1, "oldPartsLifetimeSecs": 1,
        "mergeSelectingSleepMS": 100}}})
    uuid = db["system.parts"].find_one({"_id": "events"})["uuid"]
    for block in range(6):   # two partitions, six blocks each: merges leave fewer parts
        db.command({"insertBlock": "events", "rows": _rows(block * 3, 20)})
        db.command({"insertBlock": "events", "rows": _rows(block * 3 + 1, 20)})

    def settled() -> bool:
        parts = [part_dirs(m, "zg.events") for m in zrs.members]
        keys = {key.split("/", 1)[1] for key in _pointers(zrs.members[0], "zg.events").values()}
        return parts[0] == parts[1] == parts[2] and len(parts[0]) < 12 and _keys(shared, uuid) == keys

    wait_for(settled, 60, "merged, and only the active parts' objects in the storage")
    assert len(select(zrs, zrs.members[1], "zg", columns=["n"])) == 12 * 20
    db.command({"dropPartition": "events", "partition": "202401"})
    wait_for(lambda: not any(k.startswith("202401_") for k in _keys(shared, uuid)), 60,
             "the dropped partition's objects gone from the storage")
    assert any(k.startswith("202402_") for k in _keys(shared, uuid))
    assert sorted(r["n"] for r in select(zrs, zrs.members[2], "zg", columns=["n"])) == sorted(
        block * 1000 + i for block in (1, 4, 7, 10, 13, 16) for i in range(20))


def test_the_same_on_an_s3_storage(tmp_path: pathlib.Path) -> None:
    """A set whose storage is a bucket of an S3-compatible server on loopback: the objects are there, the
    members keep metadata, every member answers, a dropped partition's objects go."""
    with s3_server() as server:
        create_bucket(server, "parts")
        url = server.url("parts", "set1")
        sets = running_set(str(tmp_path / "set"), ("--partsStorage", url))
        rs = next(sets)
        try:
            _s3_story(rs, SharedStorage.open(url))
        finally:
            sets.close()   # the set stops before the server does


def _s3_story(rs: ReplicaSet, storage: SharedStorage) -> None:
    db = rs.client().zs
    db.command({"createPartsTable": "events", **{**EVENTS, "settings": {
        "zeroCopy": True, "zeroCopyGraceSecs": 1, "cleanupDelayPeriodSecs": 1, "oldPartsLifetimeSecs": 1}}})
    uuid = db["system.parts"].find_one({"_id": "events"})["uuid"]
    for block in range(4):   # partitions 202401 (blocks 0 and 3), 202402, 202403
        rs.direct(rs.members[block % 3]).zs.command({"insertBlock": "events", "rows": _rows(block, 30)})
    for member in rs.members:
        wait_for(lambda m=member: len(select(rs, m, "zs", columns=["n"])) == 4 * 30, 60, f"every row on {member.host}")
        assert _files_named(member.dbpath, pf.DATA_FILE) == []
    pointed = set(_pointers(rs.members[0], "zs.events").values())
    wait_for(lambda: set(storage.stored_keys(uuid)) == pointed, 60, "one object set a part in the bucket, no other")
    db.command({"dropPartition": "events", "partition": "202401"})
    wait_for(lambda: not any(k.split("/")[1].startswith("202401_") for k in storage.stored_keys(uuid)), 60,
             "the dropped partition's objects gone from the bucket")
    assert sorted(r["n"] for r in select(rs, rs.members[1], "zs", columns=["n"])) == sorted(
        block * 1000 + i for block in (1, 2) for i in range(30))


def test_a_member_that_cannot_use_the_storage_fetches_the_part_whole_from_one_that_can(tmp_path: pathlib.Path) -> None:
    """Seed 003: falling back to an ordinary fetch may not work. Here the third member's storage is another
    (empty) directory: the part is not there, so it fetches the part whole from a member that streams it
    from the shared storage, checks every byte, and answers every row from its own copy."""
    shared, elsewhere = tmp_path / "shared", tmp_path / "elsewhere"
    rs = ReplicaSet([Member(dbpath=str(tmp_path / f"m{i}"), extra_args=[
        "--enableTestCommands", "--partsStorage", f"file://{shared if i < 2 else elsewhere}"]) for i in range(3)])
    rs.start()
    try:
        rs.initiate()
        db = rs.client().zf
        db.command({"createPartsTable": "events", **EVENTS})
        for block in range(3):
            db.command({"insertBlock": "events", "rows": _rows(block, 40)})
        odd = rs.members[2]
        wait_for(lambda: len(select(rs, odd, "zf", columns=["n"])) == 3 * 40, 60, "every row on the odd member")
        assert _files_named(odd.dbpath, pf.DATA_FILE)   # its own copies, fetched whole
        for member in rs.members[:2]:
            assert _files_named(member.dbpath, pf.DATA_FILE) == []
    finally:
        rs.stop()


def test_a_member_restored_from_an_old_backup_deletes_nothing_shared(tmp_path: pathlib.Path) -> None:
    """Seed 003: no way back, since an old replica may delete data others use. Here a member restored from
    an old copy of its data directory (parts merged away since, registrations of another time) deletes no
    object: members never delete shared objects, and the primary marks by the registry it writes."""
    import shutil

    shared = tmp_path / "shared"
    sets = running_set(str(tmp_path / "set"), ("--partsStorage", f"file://{shared}"))
    rs = next(sets)
    try:
        db = rs.client().zb
        db.command({"createPartsTable": "events", **{**EVENTS, "settings": {
            "zeroCopy": True, "zeroCopyGraceSecs": 1, "cleanupDelayPeriodSecs": 1, "oldPartsLifetimeSecs": 1,
            "mergeSelectingSleepMS": 100}}})
        for block in range(3):   # partition 202401: merged later with newer parts
            db.command({"insertBlock": "events", "rows": _rows(block * 3, 30)})
        db.command({"insertBlock": "events", "rows": _rows(1, 30)})   # partition 202402: active to the end
        old = next(m for m in rs.members if m is not rs.wait_primary())
        wait_for(lambda: len(select(rs, old, "zb", columns=["n"])) == 4 * 30, 60, "the first rows on the member")
        old.stop()
        backup = tmp_path / "backup"
        shutil.copytree(old.dbpath, backup)
        old.start()
        old.wait_listening()
        for block in range(3, 6):   # more parts, merged with the first: the backup's parts are outdated
            db.command({"insertBlock": "events", "rows": _rows(block * 3, 30)})
        wait_for(lambda: len(select(rs, old, "zb", columns=["n"])) == 7 * 30, 60, "every row on the member")
        old.stop()
        shutil.rmtree(old.dbpath)
        shutil.copytree(backup, old.dbpath)   # the old copy comes back
        old.start()
        old.wait_listening()
        expected = sorted(block * 1000 + i for block in (0, 1, 3, 6, 9, 12, 15) for i in range(30))
        for member in rs.members:
            wait_for(lambda m=member: sorted(r["n"] for r in select(rs, m, "zb", columns=["n"])) == expected, 60,
                     f"every row on {member.host}")
        for member in rs.members:   # every part any member holds still has its objects, whole
            for part, key in _pointers(member, "zb.events").items():
                assert pf.verify_part(os.path.join(member.dbpath, "parts", "zb.events", part)) is None, (part, key)
    finally:
        sets.close()


def test_a_staged_blocks_objects_outlive_the_grace_until_the_job_commits(zrs: ReplicaSet, shared: pathlib.Path) -> None:
    """A job may stage blocks longer than the grace for unmarked objects: the stage records mark them."""
    import io

    import pyarrow as pa

    db = zrs.client().zj
    db.command({"createPartsTable": "events", **{**EVENTS, "settings": {
        "zeroCopy": True, "zeroCopyGraceSecs": 1, "cleanupDelayPeriodSecs": 1, "oldPartsLifetimeSecs": 1}}})
    uuid = db["system.parts"].find_one({"_id": "events"})["uuid"]
    staging = next(m for m in zrs.members if m is not zrs.wait_primary())
    sink = io.BytesIO()
    data = pa.Table.from_pylist(_rows(0, 40))   # partition 202401
    with pa.ipc.new_stream(sink, data.schema) as stream:
        stream.write_table(data)
    reply = zrs.direct(staging).zj.command({"stagePartsBlock": "events", "arrow": sink.getvalue(), "writeId": "w1",
                                            "stageKey": "0:1:0"})
    stages = [s["stage"] for s in reply["stages"]]
    staged_keys = {k for k in _keys(shared, uuid) if k.startswith("202401_")}
    assert len(staged_keys) == 1
    # Garbage to show the collector has looked twice since the stage was older than the grace.
    db.command({"insertBlock": "events", "rows": _rows(2, 10)})   # partition 202403
    db.command({"dropPartition": "events", "partition": "202403"})
    try:
        wait_for(lambda: not any(k.startswith("202403_") for k in _keys(shared, uuid)), 60,
                 "the dropped part's objects gone")
    except TimeoutError as exc:   # what still marks them, for whoever reads the failure
        raise TimeoutError(f"{exc}\n{_what_marks(zrs, 'zj', shared, uuid)}") from None
    assert {k for k in _keys(shared, uuid) if k.startswith("202401_")} == staged_keys
    db.command({"commitPartsJob": "events", "writeId": "w1", "stages": stages, "rows": 40, "digest": "d1"})
    for member in zrs.members:
        wait_for(lambda m=member: len(select(zrs, m, "zj", columns=["n"])) == 40, 60, f"the job's rows on {member.host}")


def _looks(member: Member) -> float:
    """How many looks the member took at zero-copy tables' objects (its /metrics)."""
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(f"http://127.0.0.1:{member.http_port}/metrics", timeout=10) as response:
        text = response.read().decode()
    return sum(sample.value for family in text_string_to_metric_families(text) for sample in family.samples
               if sample.name == "replset_shared_object_looks_total")


def test_an_unmarking_a_majority_never_had_deletes_nothing_and_is_rolled_back(tmp_path: pathlib.Path) -> None:
    """Seed 003's rollback of a mark. The primary drops a partition that no secondary replicates: the
    part's mark goes on the primary alone. Its collector looks again and again but never deletes the
    objects (the commit point never reaches what made them unmarked). The primary is killed, a secondary
    takes over with the mark, the old primary rolls its drop back, and every member answers the rows from
    whole objects."""
    from pymongo.write_concern import WriteConcern

    shared = tmp_path / "shared"
    sets = running_set(str(tmp_path / "set"), ("--partsStorage", f"file://{shared}"))
    rs = next(sets)
    try:
        primary = rs.wait_primary()
        db = rs.direct(primary).zr
        db.command({"createPartsTable": "events", **{**EVENTS, "settings": {
            "zeroCopy": True, "zeroCopyGraceSecs": 1, "cleanupDelayPeriodSecs": 1, "oldPartsLifetimeSecs": 1}}})
        uuid = db["system.parts"].find_one({"_id": "events"})["uuid"]
        db.command({"insertBlock": "events", "rows": _rows(0, 40)})   # partition 202401, majority-acknowledged
        for member in rs.members:
            wait_for(lambda m=member: len(select(rs, m, "zr", columns=["n"])) == 40, 60, f"the rows on {member.host}")
        keys = _keys(shared, uuid)
        assert len(keys) == 1
        secondaries = [m for m in rs.members if m is not primary]
        for m in secondaries:
            rs.fail_point(m, "stopReplProducer", "alwaysOn")
        db.with_options(write_concern=WriteConcern(w=1)).command(
            {"dropPartition": "events", "partition": "202401", "writeConcern": {"w": 1}})
        wait_for(lambda: part_dirs(primary, "zr.events") == [], 30, "the dropped part gone from the primary's disk")
        looks = _looks(primary)
        wait_for(lambda: _looks(primary) >= looks + 3, 60, "the primary's collector to look three more times")
        assert _keys(shared, uuid) == keys   # unmarked on the primary only: nothing deleted
        primary.kill()
        # A secondary takes over before either applies anything more from the old primary.
        wait_for(lambda: rs.primary() in secondaries, 60, "a new primary")
        for m in secondaries:
            rs.fail_point(m, "stopReplProducer", "off")
        primary.start()
        primary.wait_listening()
        for member in rs.members:   # the drop was never majority-committed: rolled back, rows everywhere
            wait_for(lambda m=member: len(select(rs, m, "zr", columns=["n"])) == 40, 90, f"the rows on {member.host}")
            for part in part_dirs(member, "zr.events"):
                assert pf.verify_part(os.path.join(member.dbpath, "parts", "zr.events", part)) is None
        assert _keys(shared, uuid) == keys
    finally:
        sets.close()


def test_a_part_deleted_before_a_lagging_member_fetched_it_is_taken_from_the_part_covering_it(
        tmp_path: pathlib.Path) -> None:
    """Seed 003's delete-during-fetch, as it can happen here: a member that was down reads the log's
    GET_PARTs of parts that were merged away and whose objects the primary deleted meanwhile (no member
    marked them any more). Its adoption finds nothing published; it does not take a half or a stale part:
    it fetches the merged part covering them, and answers every row."""
    shared = tmp_path / "shared"
    sets = running_set(str(tmp_path / "set"), ("--partsStorage", f"file://{shared}"))
    rs = next(sets)
    try:
        primary = rs.wait_primary()
        lagging = next(m for m in rs.members if m is not primary)
        db = rs.direct(primary).zl
        db.command({"createPartsTable": "events", **{**EVENTS, "settings": {
            "zeroCopy": True, "zeroCopyGraceSecs": 1, "cleanupDelayPeriodSecs": 1, "oldPartsLifetimeSecs": 1,
            "mergeSelectingSleepMS": 100}}})
        uuid = db["system.parts"].find_one({"_id": "events"})["uuid"]
        lagging.stop()   # down while the parts come, merge and go (merges wait for no member that is down)
        for block in range(6):   # partition 202401, merged into one part
            db.command({"insertBlock": "events", "rows": _rows(block * 3, 30)})
        wait_for(lambda: len(part_dirs(primary, "zl.events")) == 1 and len(_keys(shared, uuid)) == 1, 60,
                 "the merged part alone, and its objects alone in the storage")
        lagging.start()
        lagging.wait_listening()
        expected = sorted(block * 3 * 1000 + i for block in range(6) for i in range(30))
        wait_for(lambda: sorted(r["n"] for r in select(rs, lagging, "zl", columns=["n"])) == expected, 90,
                 "every row on the member that lagged")
        wait_for(lambda: part_dirs(lagging, "zl.events") == part_dirs(primary, "zl.events"), 60,
                 "the merged part on the member that lagged")
        for part in part_dirs(lagging, "zl.events"):
            assert pf.verify_part(os.path.join(lagging.dbpath, "parts", "zl.events", part)) is None
    finally:
        sets.close()
