"""The part-log core's file work: checking a part's bytes (`part_damage`, `trust_sizes`), the parts on
a table's disk, and publishing the temporary part an insert here wrote. What a member knows of a
table and decides about it is `oplog.parts.table_replica.TableReplica`; `replset.parts.manager`
rebuilds it from the state collections and the directory at start-up, after a rollback or an
initial sync, and carries out its actions.
"""

from __future__ import annotations

import logging
import os
import shutil

from base.errors import MongoError
from oplog.parts import part_files
from oplog.parts.jobs import STAGED_PREFIX
from oplog.parts.part_info import PartInfo
from oplog.parts.shared_storage import StorageUnavailable
from oplog.parts.table_replica import Checksums, TableReplica

log = logging.getLogger(__name__)


def part_damage(rt: TableReplica, part: str, me: str, *, whole: bool, now_ms: int, send: bool = False) -> str | None:
    """Why this member's copy of `part` must not be used (None: it may). `whole`: every byte is hashed
    (before a merge or a mutation reads it, and on the check schedule); otherwise a copy whose files
    have not changed since they were last verified is taken as verified (`send`: if it was hashed lately,
    see `TableReplica.needs_hashing`), and any other is hashed."""
    path = os.path.join(rt.directory, part)
    signature = part_files.part_signature(path)
    if not signature:
        return "its files are gone"
    if not whole and not rt.needs_hashing(part, signature, now_ms=now_ms if send else None):
        return None
    try:
        why = part_files.verify_part(path, rt.recorded_checksums(part, me))
    except StorageUnavailable as exc:   # a zero-copy part whose storage did not answer: not damage
        log.warning("%s of %s not checked: %s", part, rt.table.ns, exc.errmsg)
        return None
    if why is None:
        rt.verified(part, signature, now_ms, whole=True)
    return why


def trust_sizes(rt: TableReplica) -> None:
    """At start-up: a part whose files have their recorded sizes is taken as verified until its files
    change or the check schedule reaches it (ClickHouse checks sizes at start-up, bytes later): first
    in line for the schedule."""
    for part in rt.queue.current:
        path = os.path.join(rt.directory, part.name)
        try:
            intact = part_files.check_sizes(path) is None
        except StorageUnavailable:   # a zero-copy part: the check schedule will look at it
            continue
        if intact:
            rt.verified(part.name, part_files.part_signature(path), 0, whole=True)


def local_parts(directory: str, *, at_start_up: bool) -> list[PartInfo]:
    """The published parts in a table's directory. At start-up, the temporary parts a crash left are
    removed first (but an insert's: the log may name it yet, see `adopt_temporary`); a later rebuild
    must not: an insert or a fetch may be writing one right now."""
    if at_start_up:
        part_files.remove_temporary(directory, keep=(part_files.TMP_INSERT, STAGED_PREFIX))
    parts = []
    for name in sorted(os.listdir(directory)) if os.path.isdir(directory) else []:
        try:
            parts.append(PartInfo.parse(name))
        except MongoError:
            continue   # not a part (moved aside, or foreign): left alone
        if at_start_up:   # a zero-copy insert's part whose own data file a crash kept
            settle_shared(os.path.join(directory, name))
    return parts


def publish_if_intact(directory: str, tmp_name: str, part: str, expected: Checksums) -> bool:
    """Publishes the temporary part `tmp_name` as `part` if its files are whole and are the ones `expected`."""
    tmp_dir = os.path.join(directory, tmp_name)
    if os.path.exists(os.path.join(directory, part)) or part_files.verify_part(tmp_dir) is not None:
        return False
    try:
        written = part_files.read_checksums(tmp_dir)
    except (OSError, ValueError, MongoError):
        return False
    if any(written.get(file) != sums for file, sums in expected.items()):
        return False
    part_files.publish(directory, tmp_name, part)
    return True


def adopt_temporary(directory: str, block_id: str, part: str, expected: Checksums) -> Checksums | None:
    """The log names this member as the source of `part` (block `block_id`), and the part is not here
    yet: an insert's commit whose reply was lost, or a crash before the publish - or a job's block
    staged here. A temporary part `tmp_insert_<block id>_...` (or `tmp_staged_<block id>`) with the
    files the log recorded is published as `part`; returns its checksums, or None when there is none."""
    prefix, staged = f"{part_files.TMP_INSERT}{block_id}_", f"{STAGED_PREFIX}{block_id}"
    if os.path.isdir(os.path.join(directory, staged)):   # a job's block: its name is known (no listing per part)
        names = [staged]
    else:
        try:
            names = [n for n in os.listdir(directory) if n.startswith(prefix)]
        except OSError:
            return None
    for name in names:
        try:
            if name == staged:   # linked, not moved: the staged copy stays while a rollback may undo the job
                published = link_if_intact(directory, name, part, expected)
            else:
                published = publish_if_intact(directory, name, part, expected)
        except (OSError, MongoError):   # published meanwhile by the insert itself, or removed
            continue
        if published:
            settle_shared(os.path.join(directory, part))
            return part_files.read_checksums(os.path.join(directory, part))
    return None


def link_if_intact(directory: str, staged_name: str, part: str, expected: Checksums) -> bool:
    """Publishes the staged block `staged_name` as `part` by hard links (the staged directory stays, see
    `replset.parts.jobs`) if its files are whole and are the ones `expected`."""
    staged_dir = os.path.join(directory, staged_name)
    if os.path.exists(os.path.join(directory, part)) or part_files.verify_part(staged_dir) is not None:
        return False
    written = part_files.read_checksums(staged_dir)
    if any(written.get(file) != sums for file, sums in expected.items()):
        return False
    tmp = f"tmp_link_{part}_{os.getpid()}"
    tmp_dir = os.path.join(directory, tmp)
    shutil.rmtree(tmp_dir, ignore_errors=True)
    os.mkdir(tmp_dir)
    try:
        for file in os.listdir(staged_dir):
            os.link(os.path.join(staged_dir, file), os.path.join(tmp_dir, file))
        part_files.publish(directory, tmp, part)
    except BaseException:
        shutil.rmtree(tmp_dir, ignore_errors=True)
        raise
    return True


def settle_shared(part_dir: str) -> None:
    """A zero-copy insert's part, committed and published: its own data file goes once its objects are
    sure to be in the storage (`part_files.settle_shared`). A failure keeps the file (the part's copy here,
    settled again at the next start): the insert committed, so it is not one."""
    try:
        part_files.settle_shared(part_dir)
    except (MongoError, OSError) as exc:
        log.warning("%s keeps its data file until the shared storage takes it: %s", part_dir, exc)
