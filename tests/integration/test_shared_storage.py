"""Zero-copy parts' objects in shared storage, on a directory and on an S3-compatible server on loopback:
written, verified, published, read, checked for damage and deleted (`oplog.parts.shared_storage`)."""

from __future__ import annotations

import datetime
import os
import pathlib
from collections.abc import Iterator

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from base.errors import MongoError
from oplog.parts import part_files as pf
from oplog.parts.shared_storage import SharedStorage, StorageUnavailable
from oplog.parts.storage_url import part_key
from oplog.parts.table import parse_table_def
from tests.support.s3_server import create_bucket, s3_server

TABLE = parse_table_def("db", "t", {"columns": [{"name": "ts", "type": "timestamp[ms]"},
                                                {"name": "n", "type": "int64"}], "orderBy": ["n"]})
UUID = "0f8fad5b-d9cb-469f-a165-70867728950e"


def _part(directory: pathlib.Path, name: str, values: list[int]) -> tuple[str, str]:
    data = pa.table({"ts": pa.array([datetime.datetime(2024, 1, 1)] * len(values), pa.timestamp("ms")),
                     "n": pa.array(values, pa.int64())})
    files = pf.write_part(str(directory), name, pf.conform(TABLE, data), TABLE)
    return str(directory / name), part_key(UUID, "all", files.checksums)


@pytest.fixture(params=["file", "s3"])
def storage(request: pytest.FixtureRequest, tmp_path: pathlib.Path) -> Iterator[SharedStorage]:
    if request.param == "file":
        yield SharedStorage.open(f"file://{tmp_path / 'shared'}")
        return
    with s3_server() as server:
        create_bucket(server, "parts")
        yield SharedStorage.open(server.url("parts", "set0"))


def test_a_part_is_written_verified_published_read_and_deleted(storage: SharedStorage, tmp_path: pathlib.Path) -> None:
    local = tmp_path / "local"
    local.mkdir()
    part_dir, key = _part(local, "all_1_1_0", list(range(100)))
    assert storage.probe() is None
    assert storage.published(key) is None

    stored = storage.put_part(key, part_dir)

    assert stored.checksums == pf.read_checksums(part_dir)
    assert storage.verify(key, stored.checksums) is None
    assert sorted(storage.stored_keys(UUID)) == [key]
    with storage.open_file(key, pf.DATA_FILE) as f:
        assert pq.read_table(f).column("n").to_pylist() == list(range(100))
    again = tmp_path / "again"
    assert storage.download(key, str(again)) == stored.checksums
    assert pf.verify_part(str(again), stored.checksums) is None

    assert storage.put_part(key, part_dir) == stored   # the same part again: nothing to do
    storage.delete(key)
    assert storage.published(key) is None and sorted(storage.stored_keys(UUID)) == []
    storage.delete(key)   # already gone: nothing to do


def test_other_bytes_under_a_published_key_are_refused_never_written(storage: SharedStorage,
                                                                    tmp_path: pathlib.Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    part_dir, key = _part(tmp_path / "a", "all_1_1_0", [1, 2, 3])
    other_dir, _other_key = _part(tmp_path / "b", "all_1_1_0", [4, 5, 6])
    storage.put_part(key, part_dir)
    with pytest.raises(MongoError) as err:
        storage.put_part(key, other_dir)
    assert "another part's bytes" in err.value.errmsg
    assert storage.verify(key, pf.read_checksums(part_dir)) is None


def test_damaged_objects_are_reported_never_served(storage: SharedStorage, tmp_path: pathlib.Path) -> None:
    part_dir, key = _part(tmp_path, "all_1_1_0", list(range(1000)))
    stored = storage.put_part(key, part_dir)
    # Another writer (or a disk) changes the data object's bytes behind the set's back.
    data = bytearray(pathlib.Path(part_dir, pf.DATA_FILE).read_bytes())
    data[len(data) // 2] ^= 0xFF
    storage._write_bytes(storage._path(key, pf.DATA_FILE), bytes(data))

    assert storage.verify(key, stored.checksums) == f"{key}/{pf.DATA_FILE} does not match its checksum"
    with pytest.raises(MongoError) as err:
        storage.download(key, str(tmp_path / "copy"))
    assert "does not match its checksum" in err.value.errmsg
    # What the part log recorded is checked too: checksums.txt itself cannot vouch for other bytes.
    recorded = dict(stored.checksums)
    recorded[pf.DATA_FILE] = (recorded[pf.DATA_FILE][0], "0" * 64)
    assert "records other bytes" in str(storage.verify(key, recorded))


def test_an_unreachable_storage_says_so() -> None:
    with s3_server() as server:
        url = server.url("no-such-bucket", "p")
    storage = SharedStorage.open(url)   # the server is gone
    assert "is not usable" in str(storage.probe())


def _storage_url(storage: SharedStorage) -> str:
    return storage.location.url


def test_a_zero_copy_part_keeps_its_metadata_here_and_reads_like_a_local_one(storage: SharedStorage,
                                                                           tmp_path: pathlib.Path) -> None:
    part_dir, key = _part(tmp_path, "all_1_1_0", list(range(2_000)))
    local_rows = pf.read_part(part_dir, TABLE).column("n").to_pylist()
    recorded = pf.read_checksums(part_dir)

    pf.externalize(part_dir, _storage_url(storage), key)

    assert sorted(os.listdir(part_dir)) == sorted([pf.COLUMNS_FILE, pf.CHECKSUMS_FILE, pf.STORAGE_FILE])
    assert pf.shared_location(part_dir) == (_storage_url(storage), key)
    assert pf.read_part(part_dir, TABLE).column("n").to_pylist() == local_rows
    assert [n for batch in pf.iter_part(part_dir, TABLE, 300) for n in batch.column("n").to_pylist()] == local_rows
    assert pf.verify_part(part_dir, recorded) is None and pf.check_sizes(part_dir) is None
    signature = pf.part_signature(part_dir)
    assert signature and pf.part_signature(part_dir) == signature
    pf.externalize(part_dir, _storage_url(storage), key)   # again (a crash before the end): nothing changes
    assert pf.verify_part(part_dir, recorded) is None


def test_a_damaged_object_fails_the_check_and_the_read_never_answers(storage: SharedStorage,
                                                                    tmp_path: pathlib.Path) -> None:
    part_dir, key = _part(tmp_path, "all_1_1_0", list(range(5_000)))
    recorded = pf.read_checksums(part_dir)
    original = pathlib.Path(part_dir, pf.DATA_FILE).read_bytes()
    pf.externalize(part_dir, _storage_url(storage), key)
    damaged = bytearray(original)
    damaged[len(damaged) // 3] ^= 0xFF   # inside a data page
    storage._write_bytes(storage._path(key, pf.DATA_FILE), bytes(damaged))

    assert pf.verify_part(part_dir, recorded) == f"{key}/{pf.DATA_FILE} does not match its checksum"
    with pytest.raises((OSError, pa.lib.ArrowException)):
        pf.read_part(part_dir, TABLE)
    storage._write_bytes(storage._path(key, pf.DATA_FILE), original[:100])   # cut short
    assert pf.check_sizes(part_dir) == f"{pf.DATA_FILE} is not of its recorded size"


def test_the_keys_of_a_table_are_listed_with_when_they_were_written(storage: SharedStorage,
                                                                    tmp_path: pathlib.Path) -> None:
    assert storage.stored_keys(UUID) == {}
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    dir_a, key_a = _part(tmp_path / "a", "all_1_1_0", [1])
    dir_b, key_b = _part(tmp_path / "b", "all_2_2_0", [2])
    storage.put_part(key_a, dir_a)
    storage.put_part(key_b, dir_b)
    listed = storage.stored_keys(UUID)
    assert set(listed) == {key_a, key_b}
    assert all(ms > 1_600_000_000_000 for ms in listed.values())
    storage.delete(key_a)
    assert set(storage.stored_keys(UUID)) == {key_b}


# The races ClickHouse's zero-copy design lists (docs/zero-copy.md), at the storage layer.

def test_two_movers_of_one_part_write_one_object(storage: SharedStorage, tmp_path: pathlib.Path) -> None:
    """Seed 003: two replicas moving the same part at once both find it absent and both move it. Here the
    key is the content: every mover writes the same bytes under the one key, and each finds it whole."""
    import concurrent.futures

    part_dir, key = _part(tmp_path, "all_1_1_0", list(range(3_000)))
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        stored = list(pool.map(lambda _i: storage.put_part(key, part_dir), range(4)))
    assert {s.key for s in stored} == {key} and all(s.checksums == stored[0].checksums for s in stored)
    assert sorted(storage.stored_keys(UUID)) == [key] and storage.verify(key, stored[0].checksums) is None


def test_a_range_merged_twice_is_one_object(storage: SharedStorage, tmp_path: pathlib.Path) -> None:
    """Seed 003: a replica merges and crashes, another merges the same range, the first comes back: two
    copies of the merged part. Here every merge of a range makes the same bytes, so the same key: the
    second merge's result is the object the first stored, never a second live copy."""
    for name, values in (("all_1_1_0", [5, 1, 9]), ("all_2_2_0", [4, 8, 2])):
        _part(tmp_path, name, values)
    keys = []
    for attempt in ("a", "b"):   # the first merger, then the one that merged the range again
        tmp = f"{pf.TMP_MERGE}all_1_2_1_{attempt}"
        files = pf.merge_to_temp(str(tmp_path), ["all_1_1_0", "all_2_2_0"], tmp, TABLE)
        key = part_key(UUID, "all", files.checksums)
        pf.externalize(str(tmp_path / tmp), storage.location.url, key)
        keys.append(key)
    assert keys[0] == keys[1] and sorted(storage.stored_keys(UUID)) == [keys[0]]
    assert pf.read_part(str(tmp_path / f"{pf.TMP_MERGE}all_1_2_1_b"), TABLE).column("n").to_pylist() == [1, 2, 4, 5, 8, 9]


def test_an_insert_keeps_its_data_until_published_and_puts_deleted_objects_again(storage: SharedStorage,
                                                                                   tmp_path: pathlib.Path) -> None:
    """An insert's objects are stored before its commit can mark them; if the primary deleted them as
    unmarked meanwhile (a commit slower than the grace), settling the published part puts them again from
    the data file it kept, then lets that go."""
    part_dir, key = _part(tmp_path, "all_1_1_0", list(range(500)))
    recorded = pf.read_checksums(part_dir)
    pf.externalize(part_dir, storage.location.url, key, keep_data=True)
    assert os.path.exists(os.path.join(part_dir, pf.DATA_FILE)) and storage.published(key) is not None
    storage.delete(key)   # the primary's collection, before the commit marked the part

    pf.settle_shared(part_dir)

    assert not os.path.exists(os.path.join(part_dir, pf.DATA_FILE))
    assert storage.verify(key, recorded) is None and pf.verify_part(part_dir, recorded) is None
    pf.settle_shared(part_dir)   # settled: nothing to do


def test_putting_a_part_again_refreshes_its_age_and_writes_back_what_a_deletion_took(storage: SharedStorage,
                                                                                      tmp_path: pathlib.Path) -> None:
    """The same bytes stored anew (a partition dropped, then loaded again with the same rows) make the key
    young again - the primary deletes only old unmarked keys - and a deletion that ran meanwhile, having
    taken some objects, is undone by writing the part whole."""
    part_dir, key = _part(tmp_path, "all_1_1_0", list(range(300)))
    stored = storage.put_part(key, part_dir)
    if storage.local:   # age it (an S3 object's time cannot be set back)
        for name in os.listdir(storage._path(key)):
            os.utime(os.path.join(storage._path(key), name), (1_000_000_000, 1_000_000_000))
        assert storage.written_ms(key) == 1_000_000_000_000
    storage.put_part(key, part_dir)
    assert storage.written_ms(key) > 1_600_000_000_000
    storage._fs.delete_file(storage._path(key, pf.DATA_FILE))   # a deletion half done
    storage.put_part(key, part_dir)
    assert storage.verify(key, stored.checksums) is None


def test_a_kept_data_file_is_what_a_zero_copy_part_is_checked_by(storage: SharedStorage, tmp_path: pathlib.Path) -> None:
    """An insert's or a staged block's part keeps its data file until its commit is published: its check
    (before the publish) reads that file, so objects deleted meanwhile do not refuse the publish."""
    part_dir, key = _part(tmp_path, "all_1_1_0", list(range(300)))
    recorded = pf.read_checksums(part_dir)
    pf.externalize(part_dir, storage.location.url, key, keep_data=True)
    storage.delete(key)
    assert pf.verify_part(part_dir, recorded) is None and pf.check_sizes(part_dir) is None


def test_a_storage_that_does_not_answer_is_not_damage(tmp_path: pathlib.Path) -> None:
    """A zero-copy part whose storage is down: its check raises StorageUnavailable (nothing is known of
    its bytes) instead of calling it damaged, which would set it aside and unregister it."""
    part_dir, key = _part(tmp_path, "all_1_1_0", list(range(300)))
    recorded = pf.read_checksums(part_dir)
    with s3_server() as server:
        create_bucket(server, "parts")
        url = server.url("parts", "down")
        pf.externalize(part_dir, url, key)
        assert pf.verify_part(part_dir, recorded) is None
    with s3_server():   # another server, for the credentials: the part's own is gone
        with pytest.raises(StorageUnavailable):
            pf.verify_part(part_dir, recorded)
        with pytest.raises(StorageUnavailable):
            pf.check_sizes(part_dir)
