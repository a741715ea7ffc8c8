"""Jobs: a write of many blocks made visible at once, exactly once (Spark's writer protocol).

Theory of operation
-------------------
ClickHouse commits each block on its own; a job of many blocks that fails half
way leaves half its blocks, and a retry is exactly-once only while its blocks
are in the dedup window. A job here is committed as one part-log transaction,
as Delta and Iceberg commit a Spark job:

* **Stage** (`stagePartsBlock`, from each task attempt, on any member): the
  block is conformed, split by partition and written as temporary parts
  `tmp_staged_<stage id>` on that member, and recorded through the primary in
  `<db>.system.parts.<table>.staged` (`_id` = the stage id, with the write id,
  the partition, its rows, bytes and checksums, the member holding it). The
  stage id is the block id of `<write id>:<stage key>`: the task attempt is
  part of the stage key, so two attempts of one task never share a stage. A
  staged block is not a part: never read, merged or fetched.
* **Commit** (`commitPartsJob`, from the driver, with the stage ids of the
  attempts Spark let commit): one primary transaction
  (`commit_job_body`). A write id whose switch is in the log was committed:
  the same rows (their count and their order-free digest) are a no-op, other
  rows are refused (a reused write id). Otherwise every listed stage must be
  recorded for this write in the table's current schema (or nothing is
  written); each takes the partition's next block number now and gets a
  GET_PART log document tagged with the job; then the switch (`COMMIT_JOB`,
  `oplog.parts.jobs`) names every part; then quorum records; then every stage
  record of the write goes (the losers' temporary parts are removed by the
  members holding them). Numbers taken at the commit, not when staging, keep
  a job clear of merges, drops and mutations made while it ran.
* **Abort** (`abortPartsJob`, Spark's `abort()`), and the primary's timeout
  (`stagedPartsTimeoutSecs` after the write's newest stage, its leader): the
  write's stage records go, with any inert documents of a commit a failover cut
  short. An abort of a committed write changes nothing.

The member that staged a block publishes it when the GET_PART reaches it, by
hard links (`runtime.link_if_intact`): the staged copy stays until the removal
of its stage record is majority-committed, so a commit a rollback undoes can be
retried under other block numbers; the others fetch it from there. Members show a
job's parts only once all of them are here (`TableReplica.visible_parts`).
"""

from __future__ import annotations

import asyncio
import datetime
import os
import shutil
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from base.errors import MongoError
from base.member import MemberState
from oplog.entry import delete_entry, insert_entry, update_entry
from oplog.parts import part_files
from oplog.parts.jobs import COMMIT_JOB, STAGED_PREFIX, Stage, job_id_of
from oplog.parts.part_info import PartInfo, drop_range, inserted_part
from oplog.writes import WriteEnv, ensure_collection
from replset.parts.alter import in_range
from replset.parts.commit import NOT_PRIMARY_OR_SECONDARY, commit_here
from replset.parts.insert import SCHEMA_CHANGED, Block, load_table, next_counter, prepare_blocks
from replset.parts.names import state_ns, table_dir
from replset.parts.registry import PENDING, checksum_docs
from replset.write_concern import WriteConcern

if TYPE_CHECKING:
    from replset.node import Node

BAD_VALUE = 2
NO_SUCH_KEY = 4
WRITE_CONCERN_FAILED = 64
WRITE_ID_REUSED = 11000   # DuplicateKey: a write id committed with other rows
# A stage is acknowledged by a majority: a change of primary while a job runs does not lose it (a stage
# lost anyway fails the commit with NoSuchKey, never a silent gap).
STAGE_WRITE_CONCERN = WriteConcern(w="majority")


def staged_dir(stage_id: str) -> str:
    return f"{STAGED_PREFIX}{stage_id}"


def stage_of(doc: dict[str, Any]) -> Stage:
    """A stage record as the core keeps it."""
    created = doc.get("createTime")
    created_ms = int(created.timestamp() * 1000) if isinstance(created, datetime.datetime) else 0
    return Stage(str(doc.get("writeId", "")), str(doc.get("source", "")), created_ms)


def _committed(txn: Any, log_ns: str, write_id: str) -> dict[str, Any] | None:
    return txn.get(log_ns, job_id_of(write_id)) if txn.collection(log_ns) is not None else None


def _stages_of(txn: Any, staged_ns: str, write_id: str) -> list[dict[str, Any]]:
    if txn.collection(staged_ns) is None:
        return []
    return [d for d in txn.scan(staged_ns) if d.get("writeId") == write_id]


# -- the primary's transactions -------------------------------------------------------------------


def stage_body(db: str, name: str, blocks: list[Block], *, write_id: str, source: str,
               http: str) -> Callable[[WriteEnv], dict[str, Any]]:
    def body(env: WriteEnv) -> dict[str, Any]:
        table = load_table(env.txn, db, name)
        if _committed(env.txn, state_ns(db, name, "log"), write_id) is not None:
            return {"committed": True, "stages": [], "ok": 1.0}
        for block in blocks:
            if block.metadata_version != table.metadata_version:
                raise MongoError(SCHEMA_CHANGED, f"{table.ns} changed (metadata version {block.metadata_version} "
                                                 f"-> {table.metadata_version}) while this block was staged")
        staged_ns = state_ns(db, name, "staged")
        ensure_collection(env, staged_ns)
        for block in blocks:
            doc = {"writeId": write_id, "partition": block.partition_id, "rows": block.files.rows,
                   "bytes": block.files.bytes, "checksums": checksum_docs(block.files.checksums),
                   "metadataVersion": block.metadata_version, "source": source, "http": http,
                   "createTime": env.now}
            if env.txn.get(staged_ns, block.block_id) is not None:   # the same stage sent again
                env.emit(update_entry(staged_ns, block.block_id, {"$set": doc}))
            else:
                env.emit(insert_entry(staged_ns, {"_id": block.block_id, **doc}))
        return {"stages": [b.block_id for b in blocks], "ok": 1.0}
    return body


def _remove_stages(env: WriteEnv, db: str, name: str, stages: list[dict[str, Any]]) -> None:
    staged_ns = state_ns(db, name, "staged")
    for stage in stages:
        env.emit(delete_entry(staged_ns, stage["_id"]))


def _remove_remnants(env: WriteEnv, log_ns: str, write_id: str) -> None:
    """The inert log documents of a commit of this write that a failover cut before its switch."""
    if env.txn.collection(log_ns) is None:
        return
    job = job_id_of(write_id)
    for doc_id in [d["_id"] for d in env.txn.scan(log_ns) if d.get("job") == job]:
        env.emit(delete_entry(log_ns, doc_id))


def _drop_everything(env: WriteEnv, db: str, name: str, job: str, attempt: str) -> list[PartInfo]:
    """An overwrite: a DROP_RANGE over every partition's blocks so far, tagged with the job (inert until
    its switch; carried out on each member once the job's parts are there)."""
    counters_ns, log_ns = state_ns(db, name, "counters"), state_ns(db, name, "log")
    pids = sorted(str(d["_id"])[len("block."):] for d in env.txn.scan(counters_ns)
                  if str(d["_id"]).startswith("block."))
    drops = []
    for pid in pids:
        fake = drop_range(pid, next_counter(env, counters_ns, f"block.{pid}"))
        assert fake is not None
        env.emit(insert_entry(log_ns, {"_id": f"drop_{fake.name}", "seq": next_counter(env, counters_ns, "seq"),
                                       "type": "DROP_RANGE", "part": fake.name, "partition": pid,
                                       "createTime": env.now, "attempt": attempt, "job": job}))
        drops.append(fake)
    return drops


def _forget_dropped(env: WriteEnv, db: str, name: str, drops: list[PartInfo]) -> None:
    """After the switch, as `dropPartition` does: the dropped blocks' log documents, dedup keys, registry
    documents and quorum records (not the drops' own documents)."""
    own = {f"drop_{d.name}" for d in drops}
    for what in ("log", "blocks", "replicas", "quorum"):
        ns = state_ns(db, name, what)
        if env.txn.collection(ns) is None:
            continue
        for doc_id in [d["_id"] for d in env.txn.scan(ns) if d["_id"] not in own and any(in_range(d, f) for f in drops)]:
            env.emit(delete_entry(ns, doc_id))


def commit_job_body(db: str, name: str, *, write_id: str, stage_ids: list[str], rows: int, digest: str,
                    quorum: int, attempt: str, replace: bool = False) -> Callable[[WriteEnv], dict[str, Any]]:
    """The job's one transaction (see the module doc)."""
    def body(env: WriteEnv) -> dict[str, Any]:
        table = load_table(env.txn, db, name)
        log_ns, counters_ns, staged_ns = (state_ns(db, name, w) for w in ("log", "counters", "staged"))
        done = _committed(env.txn, log_ns, write_id)
        if done is not None:
            if done.get("attempt") != attempt and (int(done.get("rows", -1)), str(done.get("digest"))) != (rows, digest):
                raise MongoError(WRITE_ID_REUSED, f"write {write_id!r} was committed into {table.ns} with other rows "
                                                  f"({done.get('rows')} rows): nothing was written; use a new writeId")
            # (what a failover kept past the switch: the commit's own clean-up, finished here)
            _forget_dropped(env, db, name, [PartInfo.parse(str(p)) for p in done.get("drops", ())])
            _remove_stages(env, db, name, _stages_of(env.txn, staged_ns, write_id))
            return {"alreadyCommitted": done.get("attempt") != attempt, "parts": list(done.get("parts", ())),
                    "blocks": list(done.get("blocks", ())), "rows": int(done.get("rows", 0)), "ok": 1.0}
        every = {str(d["_id"]): d for d in _stages_of(env.txn, staged_ns, write_id)}
        missing = [s for s in stage_ids if s not in every]
        if missing:
            raise MongoError(NO_SUCH_KEY, f"stage {missing[0]} of write {write_id!r} is not recorded (aborted, timed "
                                          "out, or never staged): nothing was committed")
        winners = sorted((every[s] for s in set(stage_ids)), key=lambda d: (str(d["partition"]), str(d["_id"])))
        for stage in winners:
            if int(stage.get("metadataVersion", 0)) != table.metadata_version:
                raise MongoError(SCHEMA_CHANGED, f"{table.ns} changed (metadata version {stage.get('metadataVersion')}"
                                                 f" -> {table.metadata_version}) while this job ran: nothing was "
                                                 "committed; run it again")
        if sum(int(s.get("rows", 0)) for s in winners) != rows:
            raise MongoError(BAD_VALUE, f"the stages of write {write_id!r} hold {sum(int(s['rows']) for s in winners)}"
                                        f" rows, the job says {rows}: nothing was committed")
        for ns in (counters_ns, log_ns):
            ensure_collection(env, ns)
        _remove_remnants(env, log_ns, write_id)   # an earlier try cut short by a failover
        drops = _drop_everything(env, db, name, job_id_of(write_id), attempt) if replace else []
        parts, log_ids, blocks = [], [f"drop_{d.name}" for d in drops], []
        for stage in winners:
            stage_id, pid = str(stage["_id"]), str(stage["partition"])
            seq = next_counter(env, counters_ns, "seq")
            number = next_counter(env, counters_ns, f"block.{pid}")
            part, log_id = inserted_part(pid, number).name, f"{stage_id}.{number}"
            env.emit(insert_entry(log_ns, {
                "_id": log_id, "seq": seq, "type": "GET_PART", "part": part, "partition": pid, "blockId": stage_id,
                "source": stage["source"], "http": stage["http"], "attempt": attempt, "quorum": quorum,
                "dedupToken": write_id, "job": job_id_of(write_id), "createTime": env.now,
                "rows": stage["rows"], "bytes": stage["bytes"], "checksums": stage["checksums"]}))
            parts.append(part)
            log_ids.append(log_id)
            blocks.append({"blockId": stage_id, "part": part, "log": log_id})
        env.emit(insert_entry(log_ns, {
            "_id": job_id_of(write_id), "seq": next_counter(env, counters_ns, "seq"), "type": COMMIT_JOB,
            "writeId": write_id, "parts": parts, "logIds": log_ids, "blocks": blocks, "rows": rows, "digest": digest,
            "drops": [d.name for d in drops], "attempt": attempt, "quorum": quorum, "createTime": env.now}))
        if quorum > 1:   # after the switch: a prefix without it has no quorum to settle
            quorum_ns = state_ns(db, name, "quorum")
            ensure_collection(env, quorum_ns)
            for block in blocks:
                record = {"part": block["part"], "log": block["log"], "required": quorum, "status": PENDING,
                          "dedupToken": write_id, "createTime": env.now}
                if env.txn.get(quorum_ns, block["blockId"]) is not None:
                    env.emit(update_entry(quorum_ns, block["blockId"], {"$set": record}))
                else:
                    env.emit(insert_entry(quorum_ns, {"_id": block["blockId"], **record}))
        _forget_dropped(env, db, name, drops)
        _remove_stages(env, db, name, list(every.values()))
        return {"alreadyCommitted": False, "parts": parts, "blocks": blocks, "rows": rows,
                "dropped": [d.partition_id for d in drops], "ok": 1.0}
    return body


def abort_job_body(db: str, name: str, write_id: str) -> Callable[[WriteEnv], dict[str, Any]]:
    def body(env: WriteEnv) -> dict[str, Any]:
        load_table(env.txn, db, name)
        committed = _committed(env.txn, state_ns(db, name, "log"), write_id) is not None
        stages = _stages_of(env.txn, state_ns(db, name, "staged"), write_id)
        # (A committed write's records left by a failover that cut its commit after the switch go too;
        # its log documents are its parts.)
        if not committed:
            _remove_remnants(env, state_ns(db, name, "log"), write_id)
        _remove_stages(env, db, name, stages)
        return {"committed": committed, "removed": len(stages), "ok": 1.0}
    return body


def job_status(reader: Any, db: str, name: str, write_id: str) -> dict[str, Any]:
    """`partsJobStatus`: committed (its parts, rows and digest) or not (how many stages are recorded)."""
    load_table(reader, db, name)
    done = _committed(reader, state_ns(db, name, "log"), write_id)
    if done is not None:
        return {"committed": True, "parts": list(done.get("parts", ())), "rows": int(done.get("rows", 0)),
                "digest": str(done.get("digest", "")), "commitTime": done.get("createTime"), "ok": 1.0}
    return {"committed": False, "stages": len(_stages_of(reader, state_ns(db, name, "staged"), write_id)), "ok": 1.0}


# -- a member's side of staging -------------------------------------------------------------------


def _move_to_staged(directory: str, blocks: list[Block]) -> None:
    for block in blocks:
        target = os.path.join(directory, staged_dir(block.block_id))
        shutil.rmtree(target, ignore_errors=True)   # the same stage sent again
        os.rename(os.path.join(directory, block.tmp_name), target)
        block.tmp_name = staged_dir(block.block_id)


def remove_staged(directory: str, stage_ids: list[str]) -> None:
    for stage_id in stage_ids:
        shutil.rmtree(os.path.join(directory, part_files.check_part_dir_name(staged_dir(stage_id))), ignore_errors=True)


async def stage_rows(node: Node, db: str, name: str, data: pa.Table, *, write_id: str, stage_key: str) -> dict[str, Any]:
    """`stagePartsBlock` on any member: the blocks written here as staged parts, recorded through the primary."""
    if node.state not in (MemberState.PRIMARY, MemberState.SECONDARY):
        raise MongoError(NOT_PRIMARY_OR_SECONDARY, f"this member is {node.state.name}: staging needs a primary or "
                                                   "a secondary")
    table = load_table(node.store.reader, db, name)
    directory = table_dir(node.options.dbpath, table.ns)
    blocks = await asyncio.to_thread(prepare_blocks, directory, table, data, f"{write_id}:{stage_key}",
                                     node.options.parts_storage)
    me = node.options.me
    http = node.options.http_address
    cmd = {"_partsStage": name, "writeId": write_id, "source": me, "blocks": [b.to_wire() for b in blocks]}
    try:
        await asyncio.to_thread(_move_to_staged, directory, blocks)

        async def here() -> dict[str, Any]:
            return await commit_here(node, STAGE_WRITE_CONCERN,
                                     stage_body(db, name, blocks, write_id=write_id, source=me, http=http))

        reply = await node.parts.link.on_primary(db, cmd, here)
    except BaseException:
        # A stage that failed fails its task attempt: the job never commits it, so its files can go.
        await asyncio.to_thread(part_files.remove_named, directory, [b.tmp_name for b in blocks])
        raise
    if "writeConcernError" in reply:   # recorded on the primary, not confirmed: the attempt fails, Spark retries
        await asyncio.to_thread(part_files.remove_named, directory, [b.tmp_name for b in blocks])
        raise MongoError(WRITE_CONCERN_FAILED, f"the stage of {table.ns} was not confirmed: {reply['writeConcernError']}")
    if reply.get("committed"):
        await asyncio.to_thread(part_files.remove_named, directory, [b.tmp_name for b in blocks])
        return {"committed": True, "stages": [], "rows": 0, "ok": 1.0}
    return {"committed": False, "rows": sum(b.files.rows for b in blocks), "ok": 1.0,
            "stages": [{"stage": b.block_id, "partition": b.partition_id, "rows": b.files.rows} for b in blocks]}
