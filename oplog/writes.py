"""Write commands (insert / update / delete / findAndModify) turned into oplog entries.

Theory of operation: a command runs inside the writer's open transaction. Each
statement runs in its own savepoint: it reads the documents it needs, computes
the *resulting* values (`oplog.update`), and emits idempotent entries through the
`LogWriter`, which applies them. A failing statement rolls back to its savepoint
and becomes a `writeErrors` element; an ordered batch stops there, an unordered
one goes on — MongoDB's semantics. No I/O of its own beyond the transaction.
"""

from __future__ import annotations

import datetime
import logging
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import bson
from bson.binary import Binary
from bson.objectid import ObjectId
from bson.regex import Regex

from base.errors import MongoError
from oplog.capped import CappedLimits, capped_limits, check_capped_insert, note_capped_insert, trim_capped
from oplog.clustered import natural_order
from oplog.collation import CollatedMatcher, collated_matcher, collated_sort, has_strings, parse_collation
from oplog.doc_limits import MAX_STORED_DEPTH, MAX_USER_BSON_SIZE, measure
from oplog.entry import command_entry, delete_entry, insert_entry, update_entry
from oplog.expressions import filter_evaluates_expressions
from oplog.log_writer import LogWriter
from oplog.query import Matcher, compile_filter
from oplog.sqlite_store import StoreTxn
from oplog.update import (
    UpdateOutcome,
    apply_pipeline_update,
    apply_replacement,
    apply_update,
    check_stored_document,
    is_operator_update,
    upsert_seed,
    validate_update,
)

log = logging.getLogger(__name__)

MAX_BSON_SIZE = MAX_USER_BSON_SIZE


@dataclass(slots=True)
class WriteEnv:
    """What a write needs: the open transaction, the log writer, term, wall time."""

    txn: StoreTxn
    log: LogWriter
    term: int
    now: datetime.datetime
    session_fields: dict[str, Any] = field(default_factory=dict)
    last_entry: dict[str, Any] | None = None
    bypass_validation: bool = False  # the command's bypassDocumentValidation
    validators: dict[str, Matcher] = field(default_factory=dict)  # compiled once per namespace and write
    in_transaction: bool = False  # a statement of a multi-document transaction
    # Capped collections' (documents, bytes), counted once per write (`oplog.capped`); forgotten when a
    # statement rolls back.
    capped_totals: dict[str, list[int]] = field(default_factory=dict)

    def emit(self, entry: dict[str, Any]) -> dict[str, Any]:
        if self.session_fields and entry["op"] in "iud":
            entry = entry | self.session_fields
        if entry["op"] in "ud" and self.capped_totals:
            # An update or a delete changes a capped collection's size: counted again at its next trim
            # (a trim's own deletes are accounted for by the trim).
            self.capped_totals.pop(entry["ns"], None)
        stamped = self.log.write(self.txn, entry, term=self.term, now=self.now)
        self.last_entry = stamped
        return stamped


@dataclass(slots=True)
class WriteResult:
    n: int = 0
    n_modified: int = 0
    upserted: list[dict[str, Any]] = field(default_factory=list)
    write_errors: list[dict[str, Any]] = field(default_factory=list)


def check_valid(env: WriteEnv, ns: str, doc: Mapping[str, Any], before: Mapping[str, Any] | None = None) -> None:
    """A collection's validator (its `validator` option, a query filter that may hold `$jsonSchema`)
    against the document a write leaves: 121 DocumentValidationFailure, unless the command bypasses
    validation, `validationLevel` is `off` (or `moderate` and the document failed before the
    update), or `validationAction` is `warn` (logged)."""
    if env.bypass_validation:
        return
    info = env.txn.collection(ns)
    options = info.options if info is not None else {}
    validator = options.get("validator")
    level = options.get("validationLevel", "strict")
    if not validator or level == "off":
        return
    matcher = env.validators.get(ns)
    if matcher is None:
        matcher = env.validators[ns] = compile_filter(validator, now=env.now)
    if matcher.matches(doc) or (level == "moderate" and before is not None and not matcher.matches(before)):
        return
    if options.get("validationAction", "error") == "warn":
        log.warning("Document would fail validation: collection %s, _id %r", ns, doc.get("_id"))
        return
    raise MongoError(121, "Document failed validation", extra={"errInfo": {
        "failingDocumentId": doc.get("_id"), "details": {"operatorName": next(iter(validator), "$and"),
                                                          "specifiedAs": dict(validator)}}})


def validate_namespace(db: str, coll: str) -> None:
    if not db or any(c in db for c in '/\\. "$\x00'):
        raise MongoError(73, f"Invalid database name: '{db}'")
    if not coll or "\x00" in coll or coll.startswith(".") or ("$" in coll and coll != "oplog.$main"):
        raise MongoError(73, f"Invalid collection name: {coll!r}")
    if len(db) + len(coll) + 1 > 255:
        raise MongoError(73, f"Fully qualified namespace is too long: {db}.{coll}")


def new_collection_uuid() -> Binary:
    """A collection's UUID, chosen when its `create` entry is written so every member shares it."""
    return Binary(uuid.uuid4().bytes, 4)


def ensure_collection(env: WriteEnv, ns: str) -> None:
    if env.txn.collection(ns) is None:
        db, coll = ns.split(".", 1)
        validate_namespace(db, coll)
        env.emit(command_entry(db, {"create": coll}, new_collection_uuid()))


def error_doc(index: int, err: MongoError) -> dict[str, Any]:
    doc: dict[str, Any] = {"index": index, "code": err.code, "errmsg": err.errmsg}
    doc.update(err.extra)
    return doc


def run_statements(env: WriteEnv, count: int, ordered: bool, result: WriteResult,
                    run_one: Callable[[int], None]) -> WriteResult:
    for i in range(count):
        sp = env.txn.savepoint()
        # A statement rolled back to its savepoint takes back what it logged too: the log's position (the
        # next optime, and the optime the write's reply and write concern wait for) stays the last kept.
        mark, last_entry = env.log.mark(), env.last_entry
        try:
            run_one(i)
        except MongoError as err:
            env.txn.rollback_to(sp)
            env.log.undo_to(mark)
            env.last_entry = last_entry
            env.capped_totals.clear()
            result.write_errors.append(error_doc(i, err))
            if ordered:
                break
        else:
            env.txn.release(sp)
    return result


# -- insert -------------------------------------------------------------------------
def prepare_insert_document(doc: Any) -> dict[str, Any]:
    if not isinstance(doc, dict):
        raise MongoError(14, "documents to insert must be objects")
    if "_id" not in doc:
        doc = {"_id": ObjectId(), **doc}
    _check_id(doc["_id"])  # (other `$`-prefixed and dotted top-level names are stored, as since MongoDB 5.0)
    # Measured, not encoded: an upsert's document may share a computed value many times over.
    found = measure(doc, limit=MAX_BSON_SIZE, max_depth=MAX_STORED_DEPTH)
    if found.depth > MAX_STORED_DEPTH:  # (fields below the 180th nested object, the document one)
        raise MongoError(15, f"cannot insert document because it exceeds {MAX_STORED_DEPTH} levels of nesting")
    if found.size > MAX_BSON_SIZE:
        raise MongoError(10334, f"object to insert too large. size in bytes: {found.size}, max size: {MAX_BSON_SIZE}")
    return doc


def _check_id(value: Any) -> None:
    if isinstance(value, list):
        raise MongoError(2, "can't use an array for _id")
    if isinstance(value, Regex):
        raise MongoError(2, "can't use a regex for _id")
    if isinstance(value, dict) and any(k.startswith("$") for k in value):
        raise MongoError(2, "_id fields may not contain '$'-prefixed fields")


def insert_documents(env: WriteEnv, ns: str, docs: list[Any], ordered: bool) -> WriteResult:
    result = WriteResult()
    ensure_collection(env, ns)
    info = env.txn.collection(ns)
    ui = None if info is None else info.uuid
    limits = None if info is None else capped_limits(info.options)

    def run_one(i: int) -> None:
        doc = prepare_insert_document(docs[i])
        check_valid(env, ns, doc)
        if limits is None:
            env.emit(insert_entry(ns, doc, ui))
        else:
            insert_capped(env, ns, doc, limits, ui)
        result.n += 1

    return run_statements(env, len(docs), ordered, result, run_one)


def emit_insert(env: WriteEnv, ns: str, doc: dict[str, Any]) -> None:
    """Logs one inserted document of an existing collection (an upsert's, a `$merge`'s), trimming a
    capped collection as an insert does."""
    info = env.txn.collection(ns)
    ui = None if info is None else info.uuid
    limits = None if info is None else capped_limits(info.options)
    if limits is None:
        env.emit(insert_entry(ns, doc, ui))
    else:
        insert_capped(env, ns, doc, limits, ui)


def insert_capped(env: WriteEnv, ns: str, doc: dict[str, Any], limits: CappedLimits, ui: Any) -> None:
    """An insert into a capped collection: the oldest documents it pushes out are deleted (and logged)."""
    size = len(bson.encode(doc))
    check_capped_insert(env, ns, limits, size)
    env.emit(insert_entry(ns, doc, ui))
    note_capped_insert(env, ns, size)
    trim_capped(env, ns, limits, ui)


def collection_ui(env: WriteEnv, ns: str) -> Any:
    """The collection's UUID for its entries' `ui` (None before it exists)."""
    info = env.txn.collection(ns)
    return None if info is None else info.uuid


# -- matching documents ------------------------------------------------------------
def id_equality(query: Mapping[str, Any]) -> tuple[bool, Any]:
    """(True, value) when the query pins `_id` to one value, so a lookup replaces a scan."""
    if "_id" not in query:
        return False, None
    value = query["_id"]
    if isinstance(value, dict):
        if len(value) == 1 and "$eq" in value:
            value = value["$eq"]
        elif any(str(k).startswith("$") for k in value):
            return False, None
    if isinstance(value, (list, Regex)):
        return False, None
    return True, value


def evaluates_expressions(filter_: Any, update: Any = None) -> bool:
    """Whether a write statement evaluates aggregation expressions: its filter holds `$expr`, or its
    update is a pipeline. (Such a statement's cost is the client's to choose: the runtime runs it off
    the event loop.)"""
    return isinstance(update, list) or filter_evaluates_expressions(filter_)


def statement_evaluates_expressions(statement: Any) -> bool:
    """`evaluates_expressions` of an update (`q`, `u`) or delete (`q`) statement."""
    return isinstance(statement, dict) and evaluates_expressions(statement.get("q"), statement.get("u"))


def matching_documents(txn: StoreTxn, ns: str, query: Mapping[str, Any], matcher: Matcher | CollatedMatcher,
                       sort: Mapping[str, Any] | None = None, candidates: Sequence[Any] | None = None
                       ) -> Iterator[dict[str, Any]]:
    """Documents of `ns` matching `query` (by `_id` lookup when the query pins `_id`). With
    `candidates` (the `_id`s a scan outside the transaction found, in sort order), only those are
    looked up and matched again: a document changed since that scan is skipped."""
    if candidates is not None:
        found = (txn.get(ns, id_value) for id_value in candidates)
        return (d for d in found if d is not None and matcher.matches(d))
    collation = matcher.collation if isinstance(matcher, CollatedMatcher) else None
    sort = sort or natural_order(txn.collection(ns))  # (a clustered collection's "first" is by _id)
    exact, id_value = id_equality(query)
    if exact and not (collation is not None and has_strings(id_value)):  # (the _id index is binary)
        doc = txn.get(ns, id_value)
        candidates: Any = [] if doc is None else [doc]
    else:
        candidates = txn.scan(ns)
    docs = (d for d in candidates if matcher.matches(d))
    if sort:
        return iter(collated_sort(list(docs), sort, collation))
    return docs


# -- update -------------------------------------------------------------------------
def _parse_update_statement(spec: Any) -> tuple[Mapping[str, Any], Any, bool, bool]:
    if not isinstance(spec, dict):
        raise MongoError(14, "update statement must be an object")
    if "q" not in spec or "u" not in spec:
        raise MongoError(9, "update statement requires 'q' and 'u'")
    q, u = spec["q"], spec["u"]
    if not isinstance(q, dict):
        raise MongoError(14, "'q' must be an object")
    if isinstance(u, list):
        validate_update(u)
    elif not isinstance(u, dict):
        raise MongoError(14, "'u' must be an object")
    multi, upsert = bool(spec.get("multi", False)), bool(spec.get("upsert", False))
    if multi and isinstance(u, dict) and not is_operator_update(u):
        raise MongoError(9, "multi update is not supported for replacement-style update")
    return q, u, multi, upsert


def compute_update(doc: dict[str, Any], u: Mapping[str, Any] | list[Any], env: WriteEnv, matcher: Matcher,
                   array_filters: list[dict[str, Any]] | None) -> UpdateOutcome:
    if isinstance(u, list):
        return apply_pipeline_update(doc, u, now=env.now)
    if is_operator_update(u):
        index = matcher.match_result(doc).array_index
        return apply_update(doc, u, now=env.now, match_index=index, array_filters=array_filters)
    return apply_replacement(doc, u)


def upsert_document(q: Mapping[str, Any], u: Mapping[str, Any] | list[Any], env: WriteEnv,
                    array_filters: list[dict[str, Any]] | None) -> dict[str, Any]:
    seed = upsert_seed(q)
    if isinstance(u, list):
        doc = apply_pipeline_update(seed, u, now=env.now, is_upsert_insert=True).document
    elif is_operator_update(u):
        doc = apply_update(seed, u, now=env.now, array_filters=array_filters, is_upsert_insert=True).document
    else:
        doc = apply_replacement(seed, u, is_upsert_insert=True).document if "_id" in seed else dict(u)
        if "_id" in seed and "_id" not in doc:
            doc = {"_id": seed["_id"], **doc}
    check_stored_document(doc, upsert=True)
    return prepare_insert_document(doc)


def update_one_statement(env: WriteEnv, ns: str, spec: Any, index: int, result: WriteResult,
                         candidates: Sequence[Any] | None = None) -> None:
    q, u, multi, upsert = _parse_update_statement(spec)
    if is_operator_update(u):
        validate_update(u)
    matcher = collated_matcher(q, parse_collation(spec.get("collation")))
    array_filters = spec.get("arrayFilters")
    matched = 0
    ui = collection_ui(env, ns)
    for doc in list(matching_documents(env.txn, ns, q, matcher, spec.get("sort"), candidates)):
        matched += 1
        outcome = compute_update(doc, u, env, matcher, array_filters)
        if outcome.modified and outcome.oplog_update is not None:
            check_valid(env, ns, outcome.document, doc)
            env.emit(update_entry(ns, doc["_id"], outcome.oplog_update, ui))
            result.n_modified += 1
        if not multi:
            break
    result.n += matched
    if matched == 0 and upsert:
        doc = upsert_document(q, u, env, array_filters)
        check_valid(env, ns, doc)
        ensure_collection(env, ns)
        emit_insert(env, ns, doc)
        result.n += 1
        result.upserted.append({"index": index, "_id": doc["_id"]})


def update_documents(env: WriteEnv, ns: str, updates: list[Any], ordered: bool,
                     candidates: Mapping[int, Sequence[Any]] | None = None) -> WriteResult:
    """Runs update statements; `candidates`: per statement index, the `_id`s to consider (see
    `matching_documents`)."""
    result = WriteResult()
    found = candidates or {}
    return run_statements(
        env, len(updates), ordered, result,
        lambda i: update_one_statement(env, ns, updates[i], i, result, found.get(i)),
    )


# -- delete -------------------------------------------------------------------------
def delete_one_statement(env: WriteEnv, ns: str, spec: Any, result: WriteResult,
                         candidates: Sequence[Any] | None = None) -> None:
    if not isinstance(spec, dict) or "q" not in spec or "limit" not in spec:
        raise MongoError(9, "delete statement requires 'q' and 'limit'")
    q, limit = spec["q"], spec["limit"]
    if not isinstance(q, dict):
        raise MongoError(14, "'q' must be an object")
    if limit not in (0, 1):
        raise MongoError(9, f"The limit field in delete objects must be 0 or 1. Got {limit}")
    matcher = collated_matcher(q, parse_collation(spec.get("collation")))
    ui = collection_ui(env, ns)
    for doc in list(matching_documents(env.txn, ns, q, matcher, spec.get("sort"), candidates)):
        env.emit(delete_entry(ns, doc["_id"], ui))
        result.n += 1
        if limit == 1:
            break


def delete_documents(env: WriteEnv, ns: str, deletes: list[Any], ordered: bool,
                     candidates: Mapping[int, Sequence[Any]] | None = None) -> WriteResult:
    """Runs delete statements; `candidates` as in `update_documents`."""
    result = WriteResult()
    found = candidates or {}
    return run_statements(
        env, len(deletes), ordered, result,
        lambda i: delete_one_statement(env, ns, deletes[i], result, found.get(i)),
    )


# -- findAndModify ------------------------------------------------------------------
def find_and_modify(env: WriteEnv, ns: str, cmd: Mapping[str, Any],
                    candidates: Sequence[Any] | None = None) -> dict[str, Any]:
    q = cmd.get("query") or {}
    remove, u = bool(cmd.get("remove", False)), cmd.get("update")
    if remove == (u is not None):
        raise MongoError(9, "Either an update or remove=true must be specified")
    if remove and (cmd.get("upsert") or cmd.get("new")):
        raise MongoError(9, "Cannot specify both an update and remove=true")
    if isinstance(u, dict) and is_operator_update(u):
        validate_update(u)
    matcher = collated_matcher(q, parse_collation(cmd.get("collation")))
    doc = next(matching_documents(env.txn, ns, q, matcher, cmd.get("sort"), candidates), None)
    if remove:
        if doc is not None:
            env.emit(delete_entry(ns, doc["_id"], collection_ui(env, ns)))
        return {"lastErrorObject": {"n": int(doc is not None)}, "value": doc}
    return _find_and_update(env, ns, cmd, q, u, matcher, doc)


def _find_and_update(env: WriteEnv, ns: str, cmd: Mapping[str, Any], q: Mapping[str, Any], u: Any,
                     matcher: Matcher, doc: dict[str, Any] | None) -> dict[str, Any]:
    if isinstance(u, list):
        validate_update(u)
    elif not isinstance(u, dict):
        raise MongoError(14, "'update' must be an object")
    array_filters = cmd.get("arrayFilters")
    if doc is None:
        if not cmd.get("upsert"):
            return {"lastErrorObject": {"n": 0, "updatedExisting": False}, "value": None}
        new_doc = upsert_document(q, u, env, array_filters)
        check_valid(env, ns, new_doc)
        ensure_collection(env, ns)
        emit_insert(env, ns, new_doc)
        value = new_doc if cmd.get("new") else None
        return {"lastErrorObject": {"n": 1, "updatedExisting": False, "upserted": new_doc["_id"]},
                "value": value}
    outcome = compute_update(doc, u, env, matcher, array_filters)
    if outcome.modified and outcome.oplog_update is not None:
        check_valid(env, ns, outcome.document, doc)
        env.emit(update_entry(ns, doc["_id"], outcome.oplog_update, collection_ui(env, ns)))
    value = outcome.document if cmd.get("new") else doc
    return {"lastErrorObject": {"n": 1, "updatedExisting": True}, "value": value}
