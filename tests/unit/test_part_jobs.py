"""Jobs in the part-log core (`oplog.parts.jobs` through `TableReplica`): a job's GET_PART is inert until
its switch, a prefix's remnant is forgotten when removed, the switch releases every part at once, and a
read sees a job's parts only once all of them are here."""

from __future__ import annotations

from typing import Any

import pytest

from base.errors import MongoError
from oplog.parts.jobs import COMMIT_JOB, JobBook, Stage, job_id_of
from oplog.parts.part_info import PartInfo
from oplog.parts.queue import ReplicationQueue
from oplog.parts.table import parse_table_def
from oplog.parts.table_replica import LoggedPart, Run, TableReplica, checksum_docs

TABLE = parse_table_def("db", "t", {"columns": [{"name": "n", "type": "int64"}], "orderBy": ["n"]})
GOOD = {"data.parquet": (10, "a"), "columns.txt": (1, "c")}
ME = "m0"
JOB = job_id_of("w1")


def replica(*parts: str) -> TableReplica:
    return TableReplica(TABLE, "/nowhere", ReplicationQueue([PartInfo.parse(p) for p in parts]))


def job_part(part: str, seq: int, job: str = JOB) -> dict[str, Any]:
    return {"_id": f"s{seq}.{seq}", "seq": seq, "type": "GET_PART", "part": part, "source": "m1", "blockId": f"s{seq}",
            "job": job, "checksums": checksum_docs(GOOD)}


def switch(parts: list[str], seq: int = 99, job: str = JOB) -> dict[str, Any]:
    return {"_id": job, "seq": seq, "type": COMMIT_JOB, "parts": parts,
            "logIds": [f"s{i}.{i}" for i in range(1, len(parts) + 1)]}


def runs(r: TableReplica, now: int = 0) -> list[Run]:
    r.schedule(now)
    return [a for a in r.take_actions() if isinstance(a, Run)]


def test_a_jobs_part_is_inert_until_its_switch_and_then_an_ordinary_task() -> None:
    r = replica()
    r.log_doc(job_part("a_1_1_0", 1))
    r.log_doc(job_part("b_1_1_0", 2))
    assert runs(r) == [] and r.logged == {} and len(r.queue) == 0   # a prefix without the switch: nothing
    r.log_doc(switch(["a_1_1_0", "b_1_1_0"]))
    assert sorted(run.entry.new_part.name for run in runs(r) if run.entry.new_part) == ["a_1_1_0", "b_1_1_0"]
    assert set(r.logged) == {"a_1_1_0", "b_1_1_0"}
    r.log_doc(job_part("c_1_1_0", 3))   # after its switch (a rebuild reading out of order): at once
    assert "c_1_1_0" in r.logged


def test_a_remnant_removed_is_never_released_by_a_later_switch() -> None:
    """A failover kept a prefix of a commit; the retry removed its documents and logged others."""
    r = replica()
    r.log_doc(job_part("a_1_1_0", 1))
    r.log_entry_removed("s1.1")
    assert r.jobs.pending == {}
    r.log_doc({**job_part("a_2_2_0", 2), "_id": "s1.2"})
    r.log_doc({**switch(["a_2_2_0"]), "logIds": ["s1.2"]})
    assert set(r.logged) == {"a_2_2_0"}


def test_a_read_sees_a_jobs_parts_only_once_every_one_is_here() -> None:
    r = replica("a_0_0_0")   # an older part: always visible
    r.log_doc(job_part("a_1_1_0", 1))
    r.log_doc(job_part("b_1_1_0", 2))
    r.log_doc(switch(["a_1_1_0", "b_1_1_0"]))
    first, second = runs(r)
    r.task_finished(first.entry, 1, produced=first.entry.new_part, checksums=GOOD, me=ME)
    assert [p.name for p in r.visible_parts()] == ["a_0_0_0"]
    r.task_finished(second.entry, 2, produced=second.entry.new_part, checksums=GOOD, me=ME)
    assert sorted(p.name for p in r.visible_parts()) == ["a_0_0_0", "a_1_1_0", "b_1_1_0"]
    assert r.jobs.incomplete == {}   # complete: never looked at again


def test_a_merged_part_holding_a_jobs_part_is_hidden_while_the_job_is_incomplete() -> None:
    r = replica("a_0_0_0", "a_0_1_1", "b_1_1_0")   # a merge took in the job's a-part; b is not here
    r.jobs.commit(switch(["a_1_1_0", "b_2_2_0"]))
    for seq, part in ((1, "a_1_1_0"), (2, "b_2_2_0")):   # the log produces both
        r.log_produces(part, LoggedPart.of(job_part(part, seq)))
    assert sorted(p.name for p in r.visible_parts()) == ["b_1_1_0"]
    r.part_lost("b_2_2_0", "no member has it")   # a lost part settles the job: the rest is read
    assert sorted(p.name for p in r.visible_parts()) == ["a_0_1_1", "b_1_1_0"]


def test_stale_writes_are_those_whose_newest_stage_is_old() -> None:
    book = JobBook()
    book.stage_recorded("s1", Stage("w1", "m1", 1_000))
    book.stage_recorded("s2", Stage("w1", "m2", 9_000))
    book.stage_recorded("s3", Stage("w2", "m1", 2_000))
    assert book.stale_writes(10_000, 5_000) == ["w2"]
    assert book.stale_writes(20_000, 5_000) == ["w1", "w2"]
    assert book.stage_removed("s3") == Stage("w2", "m1", 2_000) and book.stale_writes(10_000, 5_000) == []


def test_an_overwrite_shows_the_old_rows_until_its_last_part_arrives_then_only_the_new_ones() -> None:
    from oplog.parts.part_info import drop_range

    r = replica("a_1_1_0")   # the old rows
    r.log_produces("a_1_1_0", LoggedPart.of({"_id": "old.1", "type": "GET_PART", "part": "a_1_1_0"}))
    fake = drop_range("a", 2)
    assert fake is not None
    r.log_doc({"_id": f"drop_{fake.name}", "seq": 1, "type": "DROP_RANGE", "part": fake.name, "partition": "a",
               "job": JOB})
    r.log_doc(job_part("a_3_3_0", 2))
    r.log_doc(job_part("b_1_1_0", 3))
    r.log_doc({**switch(["a_3_3_0", "b_1_1_0"]), "logIds": [f"drop_{fake.name}", "s2.2", "s3.3"]})
    r.log_entry_removed("old.1")   # the commit forgets the dropped blocks' documents at once
    first, second = runs(r)
    assert [p.name for p in r.visible_parts()] == ["a_1_1_0"]
    r.task_finished(first.entry, 1, produced=first.entry.new_part, checksums=GOOD, me=ME)
    assert [p.name for p in r.visible_parts()] == ["a_1_1_0"]   # still the table as before the overwrite
    r.unlogged_here(2, kept_until=lambda _name: 0)   # a rebuild meanwhile keeps the old part: its drop is held
    assert [p.name for p in r.visible_parts()] == ["a_1_1_0"]
    r.task_finished(second.entry, 3, produced=second.entry.new_part, checksums=GOOD, me=ME)
    assert sorted(p.name for p in r.visible_parts()) == ["a_3_3_0", "b_1_1_0"]   # in the same step: only the new


def test_a_bad_document_of_a_job_does_not_stop_the_others() -> None:
    r = replica()
    r.log_doc(job_part("a_1_1_0", 1))
    r.log_doc({**job_part("not a part", 2)})
    r.log_doc(job_part("b_1_1_0", 3))
    with pytest.raises(MongoError):   # the shell logs it
        r.log_doc({**switch(["a_1_1_0", "b_1_1_0"]), "logIds": ["s1.1", "s2.2", "s3.3"]})
    assert set(r.logged) == {"a_1_1_0", "b_1_1_0"}
