"""MongoDB update semantics as a pure function, plus the idempotent oplog form of the result.

Theory of operation
-------------------
*Parse.* An operator update (``{$set: {...}, $inc: {...}}``) becomes a tree, as in
MongoDB's ``UpdateObjectNode``: every modifier path ("a.b.$[i].c") is split into parts
and inserted below the root; an internal node is an *object node* (children by field
name, plus one positional ``$`` child) or an *array node* (children by array-filter
identifier, ``""`` for ``$[]``). Two modifiers on the same path, or on paths where one
is a prefix of the other, collide while inserting -> 40 ConflictingUpdateOperators.
``$rename`` puts a placeholder at its source (for conflicts) and its real node at the
destination. Parse-time errors (bad arguments, unknown modifiers, empty paths,
positional misuse) come out with MongoDB's codes and messages.

*Apply.* The tree is walked depth-first over a deep copy of the document. An object
node visits its children in MongoDB's order (lexicographic, array indexes
numerically), so fields an update creates are appended in that order whatever order
the operators were written in. A leaf resolves its concrete path against the
*current* document: an existing value is modified in place (so it keeps its
position); a missing one is created (padding arrays with nulls) or, for $unset,
$pop, $pull and $pullAll, the leaf is a no-op. An array node applies its children to
every element matched by ``$[]`` / its array filter, merging children that hit the
same element (a leaf on both sides is a conflict). The positional ``$`` becomes the
array index the query matched (``match_index``).

*Log.* Every leaf that really changes something records its concrete path (an array
node that changed several elements records the whole array instead). At the end each
recorded path that is not below another recorded path becomes ``$set: {path: final
value}`` if it exists in the new document, else ``$unset: {path: true}``. Applying
that to the original document reproduces the new one (existing fields are replaced
in place, created ones are appended in the same sorted order), and applying it again
changes nothing: the oplog entry describes the result, never the operation.

Two more keys describe the result for change streams, as MongoDB's diff entries do:
``$truncate: {path: new size}`` (a pipeline update that shortened an array logs the elements
it changed and the new size, applied after the sets: still idempotent) and
``$disambiguated: {path: [parts]}`` for a logged path with a numeric part, the parts that
index arrays as integers (a change event's ``disambiguatedPaths``). Replication ignores the latter.

Replacements (`apply_replacement`) keep the original ``_id`` first and log the whole new
document. Upserts start from `upsert_seed` (the query's equality fields) and run with
``is_upsert_insert=True`` ($setOnInsert applies, ``_id`` ends up first). Pipeline-style
updates (an array of stages) are only shape-checked (`validate_update`), not applied.
Path walking, the tree classes, numbers and $push live in `oplog.update_paths`.

*Limits.* A path has at most 200 parts (15, "FieldPath is too long"), and the document an update
leaves is checked before anything encodes it (`check_stored_document`): fields nested at most 180
levels (15), at most 16 MiB of BSON (17419; 17420 for an upsert), as mongod checks it.

Pure: no I/O and no clock; the current time is a parameter.
"""

from __future__ import annotations

__layer__ = "core"  # pure: no I/O, clock or randomness (tests/unit/test_layering.py)

import datetime
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import bson
from bson.regex import Regex

from base.errors import MongoError
from oplog.doc_limits import MAX_STORED_DEPTH, MAX_USER_BSON_SIZE, check_document
from oplog.update_paths import (
    ArrayNode,
    Leaf,
    ObjectNode,
    Placeholder,
    arithmetic,
    array_index,
    bit_op,
    check_path,
    check_viable,
    compile_array_filters,
    compile_filter,
    create_path,
    current_date_value,
    debug_number,
    deep_copy,
    dotted,
    field_name_key,
    format_element,
    format_value,
    get_path,
    id_string,
    identical,
    insert_leaf,
    is_identifier,
    is_integral,
    merge_nodes,
    parse_long,
    parse_push,
    push_values,
    resolve,
    type_name,
    validate_pipeline,
    validate_replacement_fields,
)
from oplog.values import compare_values, is_number, values_equal

__all__ = [
    "UpdateOutcome",
    "apply_oplog_update",
    "apply_pipeline_update",
    "apply_replacement",
    "apply_update",
    "check_stored_document",
    "is_operator_update",
    "upsert_seed",
    "validate_update",
]

_MISSING = object()


@dataclass(frozen=True, slots=True)
class UpdateOutcome:
    """The result of one update of one document."""

    document: dict[str, Any]  # the new document (a new object; the input is not mutated)
    modified: bool
    oplog_update: dict[str, Any] | None  # idempotent {$set/$unset} (or full replacement) form


# -- public API ---------------------------------------------------------------------
def is_operator_update(update: Mapping[str, Any]) -> bool:
    """True for ``{$op: ...}`` updates, False for replacements (decided by the first key)."""
    keys = list(update)
    if not keys or not str(keys[0]).startswith("$"):
        validate_replacement_fields(update)
        return False
    for key in keys:
        if not str(key).startswith("$"):
            raise MongoError(9, f"Unknown modifier: {key}. Expected a valid update modifier or "
                                "pipeline-style update specified as an array")
    return True


def validate_update(update: Mapping[str, Any] | list[Any], *,
                    array_filters: list[Mapping[str, Any]] | None = None) -> None:
    """Parse-time checks of an update (operator, replacement or pipeline form).

    Array-filter identifiers are checked against `array_filters` only when it is given.
    """
    if isinstance(update, list):
        validate_pipeline(update)
    elif is_operator_update(update):
        filters = None if array_filters is None else compile_array_filters(array_filters)
        parse_update(update, filters)


def apply_update(doc: dict[str, Any], update: Mapping[str, Any], *, now: datetime.datetime,
                 match_index: int | None = None, array_filters: list[dict[str, Any]] | None = None,
                 is_upsert_insert: bool = False) -> UpdateOutcome:
    """Apply an operator update to `doc` (not mutated) and return the outcome."""
    if isinstance(update, list):
        raise MongoError(2, "pipeline-style updates are not supported")
    filters = compile_array_filters(array_filters or [])
    root = parse_update(update, filters)
    ctx = _Ctx(doc=deep_copy(doc), now=now, filters=filters, is_insert=is_upsert_insert,
               matched=None if match_index is None else str(match_index),
               original_id=doc.get("_id", _MISSING))
    _apply_node(ctx, root, [])
    new_doc = ctx.doc
    if is_upsert_insert:
        new_doc = _finish_upsert(ctx.doc)
        if list(new_doc) != list(ctx.doc):  # _id moved first: only a full replacement replays that
            return _outcome(doc, new_doc, lambda: deep_copy(new_doc), upsert=True)
    return _outcome(doc, new_doc, lambda: _oplog_from_paths(ctx.log, new_doc), upsert=is_upsert_insert)


def apply_pipeline_update(doc: dict[str, Any], pipeline: list[Any], *, now: datetime.datetime,
                          is_upsert_insert: bool = False) -> UpdateOutcome:
    """A pipeline-style update (`$set`/`$addFields`, `$unset`, `$project`, `$replaceRoot`/
    `$replaceWith` stages) of `doc`, logged as its result: top-level `$set`/`$unset` when the
    pipeline kept the fields in order and named none with a dot or a `$`, else the whole document."""
    from oplog.aggregate import run_pipeline

    validate_pipeline(pipeline)
    results = run_pipeline([deep_copy(doc)], pipeline, now=now)
    if len(results) != 1:
        raise MongoError(2, "an update pipeline must give one document")
    new_doc = results[0]
    if "_id" in doc:
        if "_id" not in new_doc:  # (a pipeline that drops `_id` keeps the document's own, as in mongod)
            new_doc = {"_id": deep_copy(doc["_id"]), **new_doc}
        if not values_equal(new_doc["_id"], doc["_id"]):
            raise MongoError(66, "After applying the update, the (immutable) field '_id' was found to have "
                                 f"been altered to {format_element('_id', new_doc['_id'])}")
    if "_id" in new_doc and next(iter(new_doc)) != "_id":
        new_doc = {"_id": new_doc["_id"], **{k: v for k, v in new_doc.items() if k != "_id"}}
    return _outcome(doc, new_doc, lambda: _pipeline_oplog(doc, new_doc), upsert=is_upsert_insert)


def _pipeline_oplog(old: Mapping[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    kept = [k for k in old if k in new]
    plain = all("." not in k and not k.startswith("$") for k in new)
    if not plain or list(new) != kept + [k for k in new if k not in old]:
        return deep_copy(new)
    out: dict[str, Any] = {}
    sets: dict[str, Any] = {}
    truncated: dict[str, int] = {}
    for k, v in new.items():
        if k in old and _same(old[k], v):
            continue
        if k in old and isinstance(old[k], list) and isinstance(v, list):
            _array_changes(k, old[k], v, sets, truncated)
        else:
            sets[k] = deep_copy(v)
    unsets = {k: True for k in old if k not in new}
    if sets:
        out["$set"] = sets
    if unsets:
        out["$unset"] = unsets
    if truncated:
        out[TRUNCATE] = truncated
    return _disambiguated(out, new)


TRUNCATE = "$truncate"
DISAMBIGUATED = "$disambiguated"


def _same(a: Any, b: Any) -> bool:
    return bson.encode({"v": a}) == bson.encode({"v": b})


def _array_changes(name: str, old: list[Any], new: list[Any], sets: dict[str, Any],
                   truncated: dict[str, int]) -> None:
    """An array a pipeline changed, as MongoDB's diff logs it: the elements that differ (or were
    added) by index, and the new size when it shrank."""
    for i, value in enumerate(new):
        if i >= len(old) or not _same(old[i], value):
            sets[f"{name}.{i}"] = deep_copy(value)
    if len(new) < len(old):
        truncated[name] = len(new)


def _disambiguated(out: dict[str, Any], new_doc: dict[str, Any]) -> dict[str, Any]:
    """Adds `$disambiguated` for the logged paths with a numeric part: each part, an integer where it
    indexes an array of the new document."""
    paths: dict[str, list[Any]] = {}
    for op in ("$set", "$unset", TRUNCATE):
        for path in out.get(op) or {}:
            parts = path.split(".")
            if len(parts) < 2 or all(array_index(p) is None for p in parts):
                continue
            described: list[Any] = []
            for i, part in enumerate(parts):
                _found, container = get_path(new_doc, parts[:i])
                described.append(int(part) if isinstance(container, list) and array_index(part) is not None
                                 else part)
            paths[path] = described
    if paths:
        out[DISAMBIGUATED] = paths
    return out


def apply_replacement(doc: dict[str, Any], replacement: Mapping[str, Any], *,
                      is_upsert_insert: bool = False) -> UpdateOutcome:
    """Replace `doc` by `replacement`, keeping the original ``_id`` (first)."""
    validate_replacement_fields(replacement)
    new_doc: dict[str, Any] = {}
    if "_id" in doc:
        if "_id" in replacement and not values_equal(replacement["_id"], doc["_id"]):
            raise MongoError(66, "After applying the update, the (immutable) field '_id' was found "
                                 f"to have been altered to {format_element('_id', replacement['_id'])}")
        new_doc["_id"] = deep_copy(doc["_id"])
    elif "_id" in replacement:
        _check_id_value(replacement["_id"])
        new_doc["_id"] = deep_copy(replacement["_id"])
    for key, value in replacement.items():
        if key != "_id":
            new_doc[key] = deep_copy(value)
    return _outcome(doc, new_doc, lambda: deep_copy(new_doc), upsert=is_upsert_insert)


def upsert_seed(query: Mapping[str, Any]) -> dict[str, Any]:
    """The document an upsert starts from: the query's equality predicates, by path.

    Paths are added in sorted order, ``_id`` first (where MongoDB's upsert ends up moving it).
    """
    equalities: dict[str, Any] = {}
    _collect_equalities(query, equalities)
    seed: dict[str, Any] = {}
    for path in sorted(equalities, key=lambda p: (p != "_id" and not p.startswith("_id."), p.encode())):
        parts = path.split(".")
        loc = resolve(seed, parts)
        create_path(loc.value, parts[loc.found - 1] if loc.found else "", parts[loc.found:],
                    deep_copy(equalities[path]))
    return seed


def apply_oplog_update(doc: dict[str, Any], o: Mapping[str, Any]) -> dict[str, Any]:
    """Apply an oplog update entry `o` ({$set/$unset} or a full replacement) to `doc`.

    Pure, idempotent and tolerant: paths that cannot be created or removed are skipped.
    """
    if not str(next(iter(o), "$")).startswith("$"):  # a replacement (its `_id` first; other fields may
        new_doc = deep_copy(dict(o))                    # start with `$`, set by a pipeline)
        if "_id" not in new_doc and "_id" in doc:
            new_doc = {"_id": deep_copy(doc["_id"]), **new_doc}
        return new_doc
    ops = [(op, path, value) for op in ("$set", "$unset")
           if isinstance(o.get(op), Mapping) for path, value in o[op].items()]
    try:
        current = _apply_oplog_ops(deep_copy(doc), ops)
    except MongoError:
        # Colliding or otherwise unusable paths (never produced by apply_update): one at a time.
        current = deep_copy(doc)
        for op_path_value in ops:
            try:
                _apply_oplog_ops(current, [op_path_value])
            except MongoError:
                continue
    truncated = o.get(TRUNCATE)
    for path, size in (truncated.items() if isinstance(truncated, Mapping) else ()):
        found, array = get_path(current, str(path).split("."))
        if found and isinstance(array, list) and isinstance(size, int) and 0 <= size < len(array):
            del array[size:]
    return current


# -- parsing ------------------------------------------------------------------------
def parse_update(update: Mapping[str, Any], filters: Mapping[str, Any] | None) -> ObjectNode:
    """Build the update tree; `filters` (identifier -> matcher) or None to skip those checks."""
    root = ObjectNode()
    found_ids: set[str] = set()
    for op, spec in update.items():
        if op not in _ARG_PARSERS:
            raise MongoError(9, f"Unknown modifier: {op}. Expected a valid update modifier or "
                                "pipeline-style update specified as an array")
        if not isinstance(spec, Mapping):
            raise MongoError(9, f"Modifiers operate on fields but we found type {type_name(spec)} instead. "
                                f"For example: {{$mod: {{<field>: ...}}}} not {{{format_element(op, spec)}}}")
        if not spec:
            raise MongoError(9, f"'{op}' is empty. You must specify a field like so: {{{op}: {{<field>: ...}}}}")
        for path, value in spec.items():
            if op == "$rename":
                _parse_rename(root, path, value, filters, found_ids)
            else:
                parts = check_path(path)
                insert_leaf(root, Leaf(op, path, _ARG_PARSERS[op](path, value)), parts, filters, found_ids)
    for identifier in filters or ():
        if identifier not in found_ids:
            raise MongoError(9, f"The array filter for identifier '{identifier}' was not used in the update "
                                f"{format_value(update)}")
    return root


def _parse_rename(root: ObjectNode, source: str, dest: Any, filters: Mapping[str, Any] | None,
                  found_ids: set[str]) -> None:
    source_parts = check_path(source)
    insert_leaf(root, Placeholder(), source_parts, filters, found_ids)
    if not isinstance(dest, str):
        raise MongoError(2, f"The 'to' field for $rename must be a string: {format_element(source, dest)}")
    dest_parts = check_path(dest)
    if "\0" in dest:
        raise MongoError(2, "The 'to' field for $rename cannot contain an embedded null byte")
    if source_parts == dest_parts:
        raise MongoError(2, "The source and target field for $rename must differ: "
                            f"{format_element(source, dest)}")
    shorter = min(len(source_parts), len(dest_parts))
    if source_parts[:shorter] == dest_parts[:shorter]:
        raise MongoError(2, "The source and target field for $rename must not be on the same path: "
                            f"{format_element(source, dest)}")
    for role, path, parts in (("source", source, source_parts), ("destination", dest, dest_parts)):
        if any(part == "$" or is_identifier(part) for part in parts):
            raise MongoError(2, f"The {role} field for $rename may not be dynamic: {path}")
    insert_leaf(root, Leaf("$rename", dest, None, tuple(source_parts)), dest_parts, filters, found_ids)


def _parse_number_arg(verb: str) -> Callable[[str, Any], Any]:
    def parse(name: str, value: Any) -> Any:
        if not is_number(value):
            raise MongoError(14, f"Cannot {verb} with non-numeric argument: {{{format_element(name, value)}}}")
        return value
    return parse


def _parse_current_date(name: str, value: Any) -> str:
    if isinstance(value, bool):
        return "date"
    if not isinstance(value, Mapping):
        raise MongoError(2, f"{type_name(value)} is not valid type for $currentDate. Please use a boolean "
                            "('true') or a $type expression ({$type: 'timestamp/date'}).")
    kind = None
    for key, option in value.items():
        if key != "$type":
            raise MongoError(2, f"Unrecognized $currentDate option: {key}")
        if option in ("date", "timestamp"):
            kind = option
    if kind is None:
        raise MongoError(2, "The '$type' string field is required to be 'date' or 'timestamp': "
                            "{$currentDate: {field : {$type: 'date'}}}")
    return kind


def _parse_add_to_set(name: str, value: Any) -> list[Any]:
    elements = [value]
    if isinstance(value, Mapping) and value and next(iter(value)) == "$each":
        each = value["$each"]
        if not isinstance(each, list):
            raise MongoError(14, "The argument to $each in $addToSet must be an array but it was of type "
                                 f"{type_name(each)}")
        if len(value) > 1:
            raise MongoError(2, f"Found unexpected fields after $each in $addToSet: {format_value(value)}")
        elements = each
    unique: list[Any] = []
    for element in elements:
        if not any(values_equal(element, seen) for seen in unique):
            unique.append(element)
    return unique


def _parse_pop(name: str, value: Any) -> bool:
    number = parse_long(name, value)
    if number not in (1, -1):
        raise MongoError(9, f"$pop expects 1 or -1, found: {number}")
    return number == -1  # pop from the front


# Operators that take a field path ($gt, $in, ...) rather than a whole-document query.
_PATH_KEYWORDS = frozenset({
    "$eq", "$ne", "$gt", "$gte", "$lt", "$lte", "$in", "$nin", "$all", "$elemMatch", "$exists", "$type",
    "$size", "$regex", "$options", "$mod", "$not", "$bitsAllSet", "$bitsAllClear", "$bitsAnySet",
    "$bitsAnyClear", "$geoWithin", "$geoIntersects", "$near", "$nearSphere", "$within", "$maxDistance",
    "$minDistance", "$jsonSchema",
})


def _parse_pull(name: str, value: Any) -> Callable[[Any], bool]:
    if isinstance(value, Mapping) and not (value and next(iter(value)) in _PATH_KEYWORDS):
        if not value:
            return lambda element: isinstance(element, dict)
        matcher = compile_filter(value)
        return lambda element: isinstance(element, dict) and bool(matcher.matches(element))
    if isinstance(value, (Mapping, Regex, re.Pattern)):
        wrapped = compile_filter({"x": value})
        return lambda element: bool(wrapped.matches({"x": element}))
    return lambda element: values_equal(element, value)


def _parse_pull_all(name: str, value: Any) -> Callable[[Any], bool]:
    if not isinstance(value, list):
        raise MongoError(2, f"$pullAll requires an array argument but was given a {type_name(value)}")
    return lambda element: any(values_equal(element, candidate) for candidate in value)


def _parse_bit(name: str, value: Any) -> list[tuple[str, Any]]:
    usage = "{$bit: {field: {and/or/xor: #}}"
    if not isinstance(value, Mapping):
        raise MongoError(2, f"The $bit modifier is not compatible with a {type_name(value)}. You must pass in "
                            f"an embedded document: {usage}")
    ops = []
    for op, operand in value.items():
        if op not in ("and", "or", "xor"):
            raise MongoError(2, f"The $bit modifier only supports 'and', 'or', and 'xor', not '{op}' which is "
                                f"an unknown operator: {{{format_element(op, operand)}}}")
        if not is_integral(operand):
            raise MongoError(2, f"The $bit modifier field must be an Integer(32/64 bit); a '{type_name(operand)}' "
                                f"is not supported here: {{{format_element(op, operand)}}}")
        ops.append((op, operand))
    if not ops:
        raise MongoError(2, f"You must pass in at least one bitwise operation. The format is: {usage}")
    return ops


_ARG_PARSERS: dict[str, Callable[[str, Any], Any]] = {
    "$set": lambda name, value: value,
    "$setOnInsert": lambda name, value: value,
    "$unset": lambda name, value: None,
    "$inc": _parse_number_arg("increment"),
    "$mul": _parse_number_arg("multiply"),
    "$min": lambda name, value: value,
    "$max": lambda name, value: value,
    "$currentDate": _parse_current_date,
    "$rename": lambda name, value: value,
    "$push": parse_push,
    "$addToSet": _parse_add_to_set,
    "$pop": _parse_pop,
    "$pull": _parse_pull,
    "$pullAll": _parse_pull_all,
    "$bit": _parse_bit,
}


# -- outcome and oplog form ---------------------------------------------------------
def _outcome(old: Mapping[str, Any], new: dict[str, Any],
             make_oplog: Callable[[], dict[str, Any]], *, upsert: bool = False) -> UpdateOutcome:
    check_stored_document(new, upsert=upsert)  # (before encoding it: it may share values many times)
    if bson.encode(old) == bson.encode(new):
        return UpdateOutcome(new, False, None)
    return UpdateOutcome(new, True, make_oplog())


def check_stored_document(doc: Mapping[str, Any], *, upsert: bool = False) -> None:
    """What mongod checks of the document an update leaves, before it stores it: fields nested at
    most 180 levels (15 Overflow), then at most 16 MiB of BSON (17419, or 17420 for an upsert)."""
    what = "Document to upsert is" if upsert else "Resulting document after update is"
    check_document(doc, limit=MAX_USER_BSON_SIZE, max_depth=MAX_STORED_DEPTH,
                   too_large=MongoError(17420 if upsert else 17419, f"{what} larger than {MAX_USER_BSON_SIZE}"),
                   too_deep=MongoError(15, f"Document exceeds maximum nesting depth of {MAX_STORED_DEPTH}"))


def _oplog_from_paths(log: list[tuple[str, ...]], new_doc: dict[str, Any]) -> dict[str, Any]:
    unique = list(dict.fromkeys(log))
    kept = set(unique)
    sets: dict[str, Any] = {}
    unsets: dict[str, Any] = {}
    for path in unique:
        if any(path[:i] in kept for i in range(1, len(path))):
            continue  # covered by a shorter recorded path
        found, value = get_path(new_doc, path)
        if found:
            sets[dotted(path)] = deep_copy(value)
        else:
            unsets[dotted(path)] = True
    out: dict[str, Any] = {}
    if sets:
        out["$set"] = sets
    if unsets:
        out["$unset"] = unsets
    return _disambiguated(out, new_doc)


def _apply_oplog_ops(doc: dict[str, Any], ops: list[tuple[str, str, Any]]) -> dict[str, Any]:
    """Apply $set / $unset leaves to `doc` in place, as replication does (non-viable paths skipped)."""
    root = ObjectNode()
    for op, path, value in ops:
        insert_leaf(root, Leaf(op, path, value), path.split("."), None, set())
    _apply_node(_Ctx(doc=doc, now=None, from_oplog=True), root, [])
    return doc


def _finish_upsert(doc: dict[str, Any]) -> dict[str, Any]:
    if "_id" not in doc:
        return doc
    _check_id_value(doc["_id"])
    return {"_id": doc["_id"], **{k: v for k, v in doc.items() if k != "_id"}}


def _check_id_value(value: Any) -> None:
    kind = type_name(value)
    if kind in ("array", "regex", "undefined"):
        raise MongoError(53, f"The '_id' value cannot be of type {kind}")


# -- upsert seed --------------------------------------------------------------------
def _collect_equalities(query: Mapping[str, Any], out: dict[str, Any]) -> None:
    for key, value in query.items():
        if key == "$and" and isinstance(value, list):
            for clause in value:
                if isinstance(clause, Mapping):
                    _collect_equalities(clause, out)
        elif key == "$or" and isinstance(value, list) and len(value) == 1 and isinstance(value[0], Mapping):
            _collect_equalities(value[0], out)
        elif not key.startswith("$"):
            _collect_path_equalities(key, value, out)


def _collect_path_equalities(path: str, value: Any, out: dict[str, Any]) -> None:
    if isinstance(value, Mapping) and value and next(iter(value)).startswith("$") and not _is_dbref(value):
        if "$eq" in value:
            _add_equality(path, value["$eq"], out)
        return
    if type_name(value) == "regex":
        return
    _add_equality(path, value, out)


def _is_dbref(value: Mapping[str, Any]) -> bool:
    return "$ref" in value and "$id" in value


def _add_equality(path: str, value: Any, out: dict[str, Any]) -> None:
    for other in out:
        if other == path:
            raise MongoError(54, f"cannot infer query fields to set, path '{path}' is matched twice")
        if other.startswith(path + ".") or path.startswith(other + "."):
            longer, shorter = (other, path) if len(other) > len(path) else (path, other)
            raise MongoError(54, f"cannot infer query fields to set, both paths '{longer}' and "
                                 f"'{shorter}' are matched")
    out[path] = value


# -- applying the tree --------------------------------------------------------------
@dataclass(slots=True)
class _Ctx:
    doc: dict[str, Any]
    now: datetime.datetime | None
    filters: dict[str, Any] = field(default_factory=dict)
    is_insert: bool = False
    matched: str | None = None
    from_oplog: bool = False
    original_id: Any = _MISSING
    log: list[tuple[str, ...]] = field(default_factory=list)


def _apply_node(ctx: _Ctx, node: Any, path: list[str]) -> None:
    if isinstance(node, ObjectNode):
        _apply_object_node(ctx, node, path)
    elif isinstance(node, ArrayNode):
        _apply_array_node(ctx, node, path)
    elif isinstance(node, Leaf):
        _apply_leaf(ctx, node, path)
    # A Placeholder ($rename's source) does nothing by itself.


def _apply_object_node(ctx: _Ctx, node: ObjectNode, path: list[str]) -> None:
    positional = node.positional
    matched = ctx.matched
    if positional is not None and matched is None:
        raise MongoError(2, "The positional operator did not find the match needed from the query.")
    for name in sorted(node.children, key=field_name_key):
        child = node.children[name]
        if positional is not None and matched is not None:
            if name == matched:
                child = merge_nodes(positional, child, [*path, matched])
                positional = None
            elif matched < name:
                _apply_node(ctx, positional, [*path, matched])
                positional = None
        _apply_node(ctx, child, [*path, name])
    if positional is not None and matched is not None:
        _apply_node(ctx, positional, [*path, matched])


def _apply_array_node(ctx: _Ctx, node: ArrayNode, path: list[str]) -> None:
    loc = resolve(ctx.doc, path)
    if loc.found < len(path):
        raise MongoError(2, f"The path '{dotted(path)}' must exist in the document in order to apply "
                            "array updates.")
    array = loc.value
    if not isinstance(array, list):
        raise MongoError(2, f"Cannot apply array updates to non-array element {format_element(path[-1], array)}")
    names = sorted(node.children, key=field_name_key)
    plan = [[name for name in names if name == "" or _filter_matches(ctx, name, element)] for element in array]
    start, n_modified = len(ctx.log), 0
    for index, matching in enumerate(plan):
        if not matching:
            continue
        element_path = [*path, str(index)]
        child = node.children[matching[0]]
        for name in matching[1:]:
            child = merge_nodes(child, node.children[name], element_path)
        before = len(ctx.log)
        _apply_node(ctx, child, element_path)
        n_modified += len(ctx.log) > before
    if n_modified > 1:
        del ctx.log[start:]
        ctx.log.append(tuple(path))


def _filter_matches(ctx: _Ctx, identifier: str, element: Any) -> bool:
    matcher = ctx.filters.get(identifier)
    return matcher is not None and bool(matcher.matches({identifier: element}))


def _apply_leaf(ctx: _Ctx, leaf: Leaf, path: list[str]) -> None:
    if leaf.op == "$setOnInsert" and not ctx.is_insert:
        return
    if leaf.op == "$rename":
        _apply_rename(ctx, leaf, path)
        return
    loc = resolve(ctx.doc, path)
    if leaf.op == "$unset":
        if loc.found == len(path):
            _unset_existing(ctx, loc.parent, loc.key, path)
        return
    if loc.found == len(path):
        _check_dollar_field(ctx, path, loc.found)
        new_value = _UPDATERS[leaf.op](ctx, leaf, loc.value, path)
        if not identical(new_value, loc.value):
            loc.parent[loc.key] = new_value
            _record(ctx, path)
    elif leaf.op in _CREATORS:
        _check_dollar_field(ctx, path, loc.found)
        _create(ctx, loc.value, path, loc.found, _CREATORS[leaf.op](ctx, leaf))
    else:
        check_viable(loc.value, path[:loc.found], path[loc.found:])


def _create(ctx: _Ctx, element: Any, path: list[str], found: int, value: Any) -> None:
    try:
        create_path(element, path[found - 1] if found else "", path[found:], value)
    except MongoError as exc:
        if ctx.from_oplog and exc.code == 28:
            return  # replication skips non-viable $set paths (MongoDB does the same)
        raise
    _record(ctx, path)


def _unset_existing(ctx: _Ctx, parent: Any, key: Any, path: list[str]) -> None:
    if isinstance(parent, list):
        if parent[key] is None:
            return
        parent[key] = None  # $unset of an array element leaves a null in its place
    else:
        del parent[key]
    _record(ctx, path)


def _record(ctx: _Ctx, path: list[str]) -> None:
    ctx.log.append(tuple(path))
    if path[0] == "_id" and not ctx.from_oplog and ctx.original_id is not _MISSING:
        current = ctx.doc.get("_id", _MISSING)
        if current is _MISSING or not identical(current, ctx.original_id):
            raise MongoError(66, f"Performing an update on the path '{dotted(path)}' would modify the "
                                 "immutable field '_id'")


def _check_dollar_field(ctx: _Ctx, path: list[str], found: int) -> None:
    if not ctx.from_oplog and path[0].startswith("$") and (len(path) == 1 or found == 0):
        raise MongoError(52, f"The dollar ($) prefixed field '{path[0]}' in '{path[0]}' is not allowed in "
                             "the context of an update's replacement document. Consider using an "
                             "aggregation pipeline with $replaceWith.")


# -- $rename ------------------------------------------------------------------------
def _apply_rename(ctx: _Ctx, leaf: Leaf, dest: list[str]) -> None:
    source = list(leaf.source)
    located = _find_rename_source(ctx.doc, source)
    if located is None:
        return
    value, ancestors = located
    _reject_arrays(ctx, "source", source, ancestors)
    loc = resolve(ctx.doc, dest)
    depth = loc.found - 1 if loc.found == len(dest) else loc.found
    _reject_arrays(ctx, "destination", dest, [(dest[k - 1], get_path(ctx.doc, dest[:k])[1])
                                              for k in range(depth, 0, -1)])
    _check_dollar_field(ctx, dest, loc.found)
    if loc.found == len(dest):
        loc.parent[loc.key] = deep_copy(value)
        _record(ctx, dest)
    else:
        _create(ctx, loc.value, dest, loc.found, deep_copy(value))
    parent = get_path(ctx.doc, source[:-1])[1]
    del parent[source[-1]]
    _record(ctx, source)


def _find_rename_source(doc: dict[str, Any], source: list[str]) -> tuple[Any, list[tuple[str, Any]]] | None:
    """The value at `source` and its ancestors (nearest first), None when it does not exist."""
    current: Any = doc
    chain: list[tuple[str, Any]] = []
    for i, part in enumerate(source):
        if isinstance(current, dict):
            if part not in current:
                return None
            nxt = current[part]
        elif isinstance(current, list) and part.isdigit():
            if int(part) >= len(current):
                return None
            nxt = current[int(part)]
        else:
            raise MongoError(28, f"cannot use the part ({part} of {dotted(source)}) to traverse the element "
                                 f"({{{format_element(source[i - 1], current)}}})")
        chain.append((part, nxt))
        current = nxt
    return current, list(reversed(chain[:-1]))


def _reject_arrays(ctx: _Ctx, role: str, path: list[str], ancestors: list[tuple[str, Any]]) -> None:
    for name, value in ancestors:
        if isinstance(value, list):
            raise MongoError(2, f"The {role} field cannot be an array element, '{dotted(path)}' in doc with "
                                f"{id_string(ctx.doc)} has an array field called '{name}'")


# -- modifiers on existing values ---------------------------------------------------
def _update_arithmetic(ctx: _Ctx, leaf: Leaf, current: Any, path: list[str]) -> Any:
    if type_name(current) not in ("int", "long", "double", "decimal"):
        raise MongoError(14, f"Cannot apply {leaf.op} to a value of non-numeric type. {{{id_string(ctx.doc)}}} "
                             f"has the field '{path[-1]}' of non-numeric type {type_name(current)}")
    result = arithmetic("add" if leaf.op == "$inc" else "mul", current, leaf.arg)
    if result is None:
        raise MongoError(2, f"Failed to apply {leaf.op} operations to current value ({debug_number(current)}) "
                            f"for document {{{id_string(ctx.doc)}}}")
    return result


def _update_compare(ctx: _Ctx, leaf: Leaf, current: Any, path: list[str]) -> Any:
    cmp = compare_values(current, leaf.arg)
    replace = cmp < 0 if leaf.op == "$max" else cmp > 0
    return deep_copy(leaf.arg) if replace else current


def _require_array(ctx: _Ctx, leaf: Leaf, current: Any, path: list[str]) -> None:
    if isinstance(current, list):
        return
    kind = type_name(current)
    if leaf.op == "$push":
        raise MongoError(2, f"The field '{dotted(path)}' must be an array but is of type {kind} in document "
                            f"{{{id_string(ctx.doc)}}}")
    if leaf.op == "$addToSet":
        raise MongoError(2, f"Cannot apply $addToSet to non-array field. Field named '{path[-1]}' has "
                            f"non-array type {kind}")
    if leaf.op == "$pop":
        raise MongoError(14, f"Path '{dotted(path)}' contains an element of non-array type '{kind}'")
    raise MongoError(2, "Cannot apply $pull to a non-array value")


def _update_push(ctx: _Ctx, leaf: Leaf, current: Any, path: list[str]) -> Any:
    _require_array(ctx, leaf, current, path)
    return push_values(list(current), leaf.arg)


def _update_add_to_set(ctx: _Ctx, leaf: Leaf, current: Any, path: list[str]) -> Any:
    _require_array(ctx, leaf, current, path)
    result = list(current)
    for value in leaf.arg:
        if not any(values_equal(existing, value) for existing in result):
            result.append(deep_copy(value))
    return result


def _update_pop(ctx: _Ctx, leaf: Leaf, current: Any, path: list[str]) -> Any:
    _require_array(ctx, leaf, current, path)
    if not current:
        return current
    return current[1:] if leaf.arg else current[:-1]


def _update_pull(ctx: _Ctx, leaf: Leaf, current: Any, path: list[str]) -> Any:
    _require_array(ctx, leaf, current, path)
    kept = [value for value in current if not leaf.arg(value)]
    return current if len(kept) == len(current) else kept


def _update_bit(ctx: _Ctx, leaf: Leaf, current: Any, path: list[str]) -> Any:
    if not is_integral(current):
        raise MongoError(2, f"Cannot apply $bit to a value of non-integral type.{id_string(ctx.doc)} has the "
                            f"field {path[-1]} of non-integer type {type_name(current)}")
    return _bits(leaf.arg, current)


def _bits(ops: list[tuple[str, Any]], value: Any) -> Any:
    for name, operand in ops:
        value = bit_op(name, value, operand)
    return value


def _current_date(ctx: _Ctx, leaf: Leaf) -> Any:
    assert ctx.now is not None
    return current_date_value(leaf.arg, ctx.now)


_UPDATERS: dict[str, Callable[[_Ctx, Leaf, Any, list[str]], Any]] = {
    "$set": lambda ctx, leaf, current, path: deep_copy(leaf.arg),
    "$setOnInsert": lambda ctx, leaf, current, path: deep_copy(leaf.arg),
    "$inc": _update_arithmetic,
    "$mul": _update_arithmetic,
    "$min": _update_compare,
    "$max": _update_compare,
    "$currentDate": lambda ctx, leaf, current, path: _current_date(ctx, leaf),
    "$push": _update_push,
    "$addToSet": _update_add_to_set,
    "$pop": _update_pop,
    "$pull": _update_pull,
    "$pullAll": _update_pull,
    "$bit": _update_bit,
}

# Values for modifiers that create a missing field; the others ($pop, $pull, $pullAll)
# are no-ops on a missing (but viable) path.
_CREATORS: dict[str, Callable[[_Ctx, Leaf], Any]] = {
    "$set": lambda ctx, leaf: deep_copy(leaf.arg),
    "$setOnInsert": lambda ctx, leaf: deep_copy(leaf.arg),
    "$inc": lambda ctx, leaf: leaf.arg,
    "$mul": lambda ctx, leaf: arithmetic("mul", leaf.arg, 0),
    "$min": lambda ctx, leaf: deep_copy(leaf.arg),
    "$max": lambda ctx, leaf: deep_copy(leaf.arg),
    "$currentDate": _current_date,
    "$push": lambda ctx, leaf: push_values([], leaf.arg),
    "$addToSet": lambda ctx, leaf: deep_copy(list(leaf.arg)),
    "$bit": lambda ctx, leaf: _bits(leaf.arg, 0),
}
