"""`$out` and `$merge`: an aggregation's results written to a collection, as oplog entries.

Both run in one write transaction (one group commit), so the target changes all at once:
- `$out` replaces the target's documents with the results (the target keeps its indexes and
  options, as in mongod); a result without `_id` gets one; two results with one `_id` fail the
  whole stage (11000) and leave the target as it was.
- `$merge` looks each result up in the target by its `on` fields (default `_id`), then
  `whenMatched`: `merge` (default: the result's fields over the document's), `replace`,
  `keepExisting`, `fail` (11000); `whenNotMatched`: `insert` (default), `discard`, `fail` (13113).
  `whenMatched` as a pipeline is refused.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from base.errors import MongoError
from oplog.capped import capped_limits
from oplog.entry import delete_entry, insert_entry, update_entry
from oplog.query import compile_filter
from oplog.update import check_stored_document
from oplog.writes import WriteEnv, emit_insert, ensure_collection, matching_documents, prepare_insert_document

WHEN_MATCHED = frozenset({"merge", "replace", "keepExisting", "fail"})
WHEN_NOT_MATCHED = frozenset({"insert", "discard", "fail"})


@dataclass(frozen=True, slots=True)
class OutputStage:
    """A pipeline's last stage when it writes: where, and how."""

    kind: str  # "$out" | "$merge"
    db: str
    coll: str
    on: tuple[str, ...] = ("_id",)
    when_matched: str = "merge"
    when_not_matched: str = "insert"

    @property
    def ns(self) -> str:
        return f"{self.db}.{self.coll}"


def _target(spec: Any, db: str, stage: str) -> tuple[str, str]:
    if isinstance(spec, str):
        return db, spec
    if isinstance(spec, Mapping) and isinstance(spec.get("coll"), str):
        target_db = spec.get("db", db)
        if not isinstance(target_db, str):
            raise MongoError(13111, f"{stage} 'db' must be a string")
        return target_db, spec["coll"]
    raise MongoError(16990 if stage == "$out" else 51178,
                     f"{stage} only supports a string or object argument naming the target collection")


def output_stage(pipeline: list[Any], db: str) -> OutputStage | None:
    """The pipeline's `$out` / `$merge` stage (it must be the last), or None."""
    for i, stage in enumerate(pipeline):
        if not isinstance(stage, Mapping) or not stage:
            continue
        name = next(iter(stage))
        if name not in ("$out", "$merge"):
            continue
        if i != len(pipeline) - 1:
            raise MongoError(40601, f"{name} can only be the final stage in the pipeline")
        spec = stage[name]
        if name == "$out":
            target_db, coll = _target(spec, db, name)
            return OutputStage("$out", target_db, coll)
        if isinstance(spec, str):
            spec = {"into": spec}
        if not isinstance(spec, Mapping) or "into" not in spec:
            raise MongoError(40414, "BSON field '$merge.into' is missing but a required field")
        target_db, coll = _target(spec["into"], db, name)
        on = spec.get("on", "_id")
        fields = (on,) if isinstance(on, str) else tuple(on) if isinstance(on, list) else None
        if not fields or not all(isinstance(f, str) for f in fields):
            raise MongoError(51186, "$merge 'on' must be a string or an array of strings")
        matched, not_matched = spec.get("whenMatched", "merge"), spec.get("whenNotMatched", "insert")
        if isinstance(matched, list):
            raise MongoError(115, "$merge with a pipeline for 'whenMatched' is not supported by this server")
        if matched not in WHEN_MATCHED:
            raise MongoError(2, f"Enumeration value '{matched}' for field 'whenMatched' is not a valid value.")
        if not_matched not in WHEN_NOT_MATCHED:
            raise MongoError(2, f"Enumeration value '{not_matched}' for field 'whenNotMatched' is not a "
                                "valid value.")
        return OutputStage("$merge", target_db, coll, fields, matched, not_matched)
    return None


def write_out(env: WriteEnv, stage: OutputStage, results: list[dict[str, Any]]) -> None:
    """Replaces the target's documents with `results`."""
    ns = stage.ns
    ensure_collection(env, ns)
    info = env.txn.collection(ns)
    assert info is not None
    if capped_limits(info.options) is not None:
        raise MongoError(17152, f"namespace '{ns}' is capped so it can't be used for $out")
    ui = info.uuid
    for doc in list(env.txn.scan(ns)):
        env.emit(delete_entry(ns, doc["_id"], ui))
    for doc in results:
        env.emit(insert_entry(ns, prepare_insert_document(doc), ui))


def write_merge(env: WriteEnv, stage: OutputStage, results: list[dict[str, Any]]) -> None:
    """Merges `results` into the target (see the module docstring)."""
    ns = stage.ns
    ensure_collection(env, ns)
    ui = env.txn.collection(ns).uuid  # type: ignore[union-attr]
    for doc in results:
        key = {field: doc.get(field) for field in stage.on}
        current = next(matching_documents(env.txn, ns, key, compile_filter(key)), None)
        if current is None:
            if stage.when_not_matched == "fail":
                raise MongoError(13113, "$merge could not find a matching document in the target collection "
                                        "for at least one document in the source collection")
            if stage.when_not_matched == "insert":
                emit_insert(env, ns, prepare_insert_document(doc))
            continue
        if stage.when_matched == "fail":
            raise MongoError(11000, f"E11000 duplicate key error collection: {ns}", extra={
                "keyPattern": dict.fromkeys(stage.on, 1), "keyValue": key})
        if stage.when_matched == "keepExisting":
            continue
        new = {**current, **doc} if stage.when_matched == "merge" else {"_id": current["_id"], **doc}
        new["_id"] = current["_id"]
        check_stored_document(new)
        if new != current:
            env.emit(update_entry(ns, current["_id"], {"_id": current["_id"], **{
                k: v for k, v in new.items() if k != "_id"}}, ui))
