"""Jobs: many blocks committed as one (a Spark job's), as a member's part-log core sees them.

Theory of operation
-------------------
A job's tasks stage their blocks first: each block is written as a temporary
part on the member that took it (`tmp_staged_<stage id>`) and recorded in
`<db>.system.parts.<table>.staged` (`_id` = the stage id). A staged block is
never read, merged or fetched. The job's commit is one primary transaction
(`replset.parts.jobs`): for each winning stage it takes a block number and logs
a GET_PART document tagged `job: <job id>`, then logs the job's switch, one
`COMMIT_JOB` document (`_id` = the job id, the hash of its write id) naming
every part, then removes the write's stage records.

A new primary may hold any prefix of that transaction. So a GET_PART document
of a job is inert until its job's switch is here: it is kept aside
(`JobBook.hold`), neither queued nor known as a part of the log. The switch
releases them all at once (`JobBook.commit`), and from then on they are
ordinary GET_PART tasks. A prefix without its switch publishes nothing; the
commit's retry, an abort or the primary's timeout removes it.

An overwrite's job also logs, before its switch, a DROP_RANGE over every
partition's blocks so far (inert like its parts). It is carried out here only
once the job's parts are all here, and the parts it drops are hidden from then
on until the drop is done: a read sees the old rows or the new ones.

Once released, a job's parts arrive here one by one (adopted by the member
that staged them, fetched by the others). Reads see none of them until every
one is here (`JobBook.hidden`): the parts holding a job's rows are hidden while
another part of that job is still missing. The `COMMIT_JOB` document stays in
the log: it is the replicated record that the write id was committed, so the
job run again is a no-op whatever the dedup window and whatever the row order.
"""

from __future__ import annotations

__layer__ = "core"  # pure: no I/O, clock or randomness (tests/unit/test_layering.py)

import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from oplog.parts.part_info import PartInfo

COMMIT_JOB = "COMMIT_JOB"
STAGED_PREFIX = "tmp_staged_"   # a staged block's temporary part: `tmp_staged_<stage id>`


def job_id_of(write_id: str) -> str:
    """The `_id` of a write's switch document (and the `job` tag of its parts)."""
    return "job_" + hashlib.sha1(write_id.encode()).hexdigest()[:24]


@dataclass(frozen=True, slots=True)
class Stage:
    """A staged block as its record says: which write, which member holds it, since when (ms)."""

    write_id: str
    source: str
    created_ms: int


@dataclass(slots=True)
class JobBook:
    committed: set[str] = field(default_factory=set)                     # job ids whose switch is here
    pending: dict[str, dict[str, dict[str, Any]]] = field(default_factory=dict)   # job -> log id -> inert doc
    incomplete: dict[str, tuple[PartInfo, ...]] = field(default_factory=dict)     # committed, not all here
    missing: dict[str, set[PartInfo]] = field(default_factory=dict)     # ... and those of its parts not seen here
    unsure: set[str] = field(default_factory=set)                        # jobs whose `missing` is looked at again
    staged: dict[str, Stage] = field(default_factory=dict)               # stage id -> its record
    drops: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # job -> its DROP_RANGEs, not carried out yet
    dropping: set[str] = field(default_factory=set)                      # released drop ranges not finished here

    def hold(self, doc: dict[str, Any]) -> bool:
        """True when `doc` is a job's GET_PART whose switch is not here: kept aside, inert."""
        job = doc.get("job")
        if job is None or str(job) in self.committed:
            return False
        self.pending.setdefault(str(job), {})[str(doc["_id"])] = doc
        return True

    def commit(self, doc: dict[str, Any]) -> list[dict[str, Any]]:
        """A job's switch: its parts become the log's. Returns the documents it releases, in log order."""
        job = str(doc["_id"])
        if job in self.committed:
            return []
        self.committed.add(job)
        parts = tuple(PartInfo.parse(str(p)) for p in doc.get("parts", ()))
        if parts:
            self.incomplete[job] = parts
            self.missing[job] = set(parts)
            self.unsure.add(job)   # (parts of it may be here already: a rebuild)
        pending = self.pending.pop(job, {})
        named = {str(i) for i in doc.get("logIds", ())}
        released = sorted((d for i, d in pending.items() if not named or i in named), key=lambda d: int(d.get("seq", 0)))
        drops = [d for d in released if d.get("type") == "DROP_RANGE"]
        if drops:   # an overwrite's: the old rows go when the new ones are all here (`drops_ready`)
            self.drops[job] = drops
        return [d for d in released if d.get("type") != "DROP_RANGE"]

    def drops_ready(self, containing: Callable[[PartInfo], PartInfo | None],
                    settled: Callable[[PartInfo], bool]) -> list[dict[str, Any]]:
        """The DROP_RANGEs of the jobs whose parts are now all here: carried out in the same step that makes
        the new parts visible, so a read sees the old rows or the new ones, never both or neither."""
        ready = []
        for job in list(self.drops):
            if self.complete(job, containing, settled):
                for doc in self.drops.pop(job):
                    self.dropping.add(str(doc["part"]))
                    ready.append(doc)
        return ready

    def removed(self, log_id: str) -> None:
        """A log document removed: an inert one (a prefix's remnant) is forgotten."""
        for job, docs in list(self.pending.items()):
            if docs.pop(log_id, None) is not None and not docs:
                del self.pending[job]

    def hidden(self, containing: Callable[[PartInfo], PartInfo | None],
               settled: Callable[[PartInfo], bool]) -> set[str]:
        """The parts here a read must not see: those holding rows of a committed job another part of which
        is missing here. A part is not missing once a part here contains it, or once it is `settled`
        otherwise (lost, or dropped). A job found complete is forgotten: it never hides anything again."""
        hidden: set[str] = set()
        for job, parts in list(self.incomplete.items()):
            if self.complete(job, containing, settled):
                continue
            hidden.update(h.name for p in parts if (h := containing(p)) is not None)
        return hidden

    def arrived(self, part: PartInfo) -> None:
        """`part` is here now: the jobs' parts it contains are no longer missing (one look per arrival, so a
        job of thousands of parts costs each arrival little)."""
        for missing in self.missing.values():
            if part in missing:
                missing.discard(part)
            elif part.level or part.min_block != part.max_block:   # a merged or covering part
                missing.difference_update([p for p in missing if part.contains(p)])

    def look_again(self) -> None:
        """A part was lost, dropped or set aside, or a log entry went: every job's missing parts are looked
        at again (`complete`)."""
        self.unsure.update(self.incomplete)

    def complete(self, job: str, containing: Callable[[PartInfo], PartInfo | None],
                 settled: Callable[[PartInfo], bool]) -> bool:
        """Whether every part of the job has been here. A complete job is forgotten."""
        if job not in self.incomplete:
            return True
        missing = self.missing.get(job, set())
        if job in self.unsure:
            self.unsure.discard(job)
            missing.difference_update([p for p in missing if containing(p) is not None or settled(p)])
        if missing:
            return False
        del self.incomplete[job]
        self.missing.pop(job, None)
        return True

    def stage_recorded(self, stage_id: str, stage: Stage) -> None:
        self.staged[stage_id] = stage

    def stage_removed(self, stage_id: str) -> Stage | None:
        return self.staged.pop(stage_id, None)

    def stale_writes(self, now_ms: int, timeout_ms: int) -> list[str]:
        """The write ids whose staging stopped `timeout_ms` ago (their newest stage is that old): a driver
        that died, or never called commit or abort (or a commit a failover cut after its switch)."""
        newest: dict[str, int] = {}
        for stage in self.staged.values():
            newest[stage.write_id] = max(newest.get(stage.write_id, 0), stage.created_ms)
        return sorted(w for w, t in newest.items() if now_ms - t >= timeout_ms)
