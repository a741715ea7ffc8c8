"""The aggregation pipeline: MongoDB's ``aggregate`` stages over an iterable of documents.

Theory of operation
-------------------
A pipeline is compiled before any document is read: `_compile` checks its shape (a list
of one-key documents), looks every stage name up in the `_STAGES` dispatch table and calls
that stage's *builder*. A builder validates its specification (raising the MongoError a
real server raises at parse time, so a bad pipeline fails even on an empty collection)
and returns a *transform*: a function from an iterator of documents to an iterator of
documents. Running the pipeline is then just chaining the transforms over the input.

Streaming stages ($match, $project, $addFields, $unset, $unwind, $replaceRoot, $skip,
$limit) are generators, so ``[$match, $limit]`` stops reading input once it has enough.
Blocking stages ($sort, $group, $count, $sortByCount, $bucket, $facet) consume their whole
input before yielding.

Limits, as mongod's (`oplog.doc_limits`): `$push` / `$addToSet` hold 100 MiB per group, `$group`
with allowDiskUse false 100 MiB in all (292), `$facet` builds at most 100 MiB (4031700), `$lookup`
gathers at most 100 MiB per document (4568), and a command's results are checked to fit a reply
(`check_output`, 10334) without being encoded, as a stage may share one value many times over.

Expressions are evaluated by `oplog.expressions`; filters come from `oplog.query` and sorting
from `oplog.sort`. Output documents may share nested values with the input documents (no stage
mutates its input), so callers must not mutate results in place if the inputs are live.

Pure: no I/O, no clock (``$$NOW`` is the ``now`` argument), no randomness.
"""

from __future__ import annotations

__layer__ = "core"  # pure: no I/O, clock or randomness (tests/unit/test_layering.py)

import datetime
import itertools
import math
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from bson.decimal128 import Decimal128

from base.errors import MongoError
from oplog.collation import Collation, collated_matcher, collated_sort
from oplog.doc_limits import (
    MEMORY_LIMIT,
    VALUE_SIZE,
    check_document,
    check_field_path_length,
    exceeded_memory,
    measure,
    memory_size,
)
from oplog.expressions import (
    MISSING,
    Context,
    NumericSum,
    evaluate_in,
    is_nullish,
    is_truthy,
    merge_object_into,
    type_name,
    validate_expression,
)
from oplog.timeseries import UNPACK_STAGE, unpack_bucket, unpack_spec
from oplog.values import SortKey, canonical_key, compare_values, is_number

__all__ = ["UNSUPPORTED_STAGES", "check_output", "iter_pipeline", "may_grow", "run_pipeline", "validate_pipeline"]

Doc = dict[str, Any]
Stream = Iterator[Doc]
Transform = Callable[[Stream], Stream]

#: Real MongoDB stages this engine does not implement (they need other collections,
#: randomness, I/O or server state). They fail with 115 CommandNotSupported.
UNSUPPORTED_STAGES = frozenset({
    "$changeStream", "$collStats", "$currentOp", "$densify", "$documents",
    "$fill", "$geoNear", "$graphLookup", "$indexStats", "$listLocalSessions", "$listSessions",
    "$listSearchIndexes", "$planCacheStats", "$redact",
    "$search", "$searchMeta", "$setWindowFields", "$vectorSearch",
})

_NOT_IN_FACET = frozenset({"$facet", "$out", "$merge", "$geoNear", "$collStats", "$indexStats"})
_EPOCH = datetime.datetime(1970, 1, 1)


Collections = Callable[[str], Iterable[Doc]]  # another collection of the database, by name


class Sampler:
    """What `$sample` draws with (the runtime passes a random source; the engine keeps none)."""

    def sample(self, population: list[Doc], k: int) -> list[Doc]:
        raise NotImplementedError


@dataclass(frozen=True)
class _Env:
    now: datetime.datetime
    collections: Collections | None = None  # for $lookup and $unionWith
    sampler: Sampler | None = None  # for $sample
    collation: Collation | None = None  # for $match and $sort
    allow_disk_use: bool = True  # the command's allowDiskUse (only an explicit false limits $group)

    def context(self, doc: Doc) -> Context:
        return Context(doc, self.now, doc)

    def collection(self, stage: str, name: Any) -> list[Doc]:
        if not isinstance(name, str) or not name:
            raise MongoError(40321 if stage == "$lookup" else 40414, f"{stage} needs a collection name")
        if self.collections is None:
            raise MongoError(115, f"{stage} is not supported here")
        return list(self.collections(name))


_STAGES: dict[str, Callable[[Any, _Env], Transform]] = {}


def _stage(*names: str) -> Callable[[Any], Any]:
    def register(builder: Callable[[Any, _Env], Transform]) -> Any:
        for name in names:
            _STAGES[name] = builder
        return builder

    return register


# ---------------------------------------------------------------------------
# Public API


def validate_pipeline(pipeline: list[Any]) -> None:
    """Raise the MongoError a server would raise when parsing `pipeline`."""
    _compile(pipeline, _Env(_EPOCH))


def iter_pipeline(docs: Iterable[Doc], pipeline: list[Any], *, now: datetime.datetime,
                  collections: Collections | None = None, sampler: Sampler | None = None,
                  collation: Collation | None = None, allow_disk_use: bool = True) -> Stream:
    """Run `pipeline` lazily; the pipeline is validated before the iterator is returned.
    `collections` reads the database's other collections ($lookup, $unionWith)."""
    stream: Stream = iter(docs)
    for transform in _compile(pipeline, _Env(now, collections, sampler, collation, allow_disk_use)):
        stream = transform(stream)
    return stream


def run_pipeline(docs: Iterable[Doc], pipeline: list[Any], *, now: datetime.datetime,
                 collections: Collections | None = None, sampler: Sampler | None = None,
                 collation: Collation | None = None, allow_disk_use: bool = True,
                 output_limit: int | None = None) -> list[Doc]:
    """Run `pipeline` over `docs` and return every output document. `output_limit`: the BSON size
    each output document must fit (a command's results: see `check_output`)."""
    out = iter_pipeline(docs, pipeline, now=now, collections=collections, sampler=sampler,
                        collation=collation, allow_disk_use=allow_disk_use)
    if output_limit is None or not may_grow(pipeline):
        return list(out)
    return [check_output(doc, output_limit) for doc in out]


# Stages whose output documents are never larger than their input documents (which are stored
# documents or results of earlier stages).
_NOT_GROWING = frozenset({"$match", "$sort", "$limit", "$skip", "$unwind", "$sample", "$count", "$unset"})


def may_grow(pipeline: list[Any]) -> bool:
    """Whether a stage of `pipeline` may build documents larger than the ones it reads."""
    return any(not isinstance(stage, dict) or not set(stage) <= _NOT_GROWING for stage in pipeline)


def check_output(doc: Doc, limit: int) -> Doc:
    """`doc` if it can be returned as BSON of at most `limit` bytes, else mongod's BSONObjectTooLarge
    (10334) or, nested past 200 levels, Overflow (15). Measured without encoding: a computed document
    may repeat a shared value many times over."""
    check_document(doc, limit=limit)
    return doc


def _compile(pipeline: Any, env: _Env, *, in_facet: bool = False) -> list[Transform]:
    if not isinstance(pipeline, list):
        raise MongoError(
            14, f"BSON field 'pipeline' is the wrong type '{type_name(pipeline)}', expected type 'array'"
        )
    return [_compile_stage(stage, env, in_facet) for stage in pipeline]


def _compile_stage(stage: Any, env: _Env, in_facet: bool) -> Transform:
    if not isinstance(stage, dict):
        raise MongoError(14, "Each element of the 'pipeline' array must be an object")
    if len(stage) != 1:
        raise MongoError(40323, "A pipeline stage specification object must contain exactly one field.")
    name, spec = next(iter(stage.items()))
    if in_facet and name in _NOT_IN_FACET:
        raise MongoError(40600, f"{name} is not allowed to be used within a $facet stage")
    if name in UNSUPPORTED_STAGES:
        raise MongoError(115, f"{name} is not supported by this server")
    builder = _STAGES.get(name)
    if builder is None:
        raise MongoError(40324, f"Unrecognized pipeline stage name: '{name}'")
    return builder(spec, env)


# ---------------------------------------------------------------------------
# Field-path helpers (plain document paths: no array traversal)


def _split_field_path(path: Any, what: str = "field path") -> list[str]:
    if not isinstance(path, str) or not path:
        raise MongoError(40352, "FieldPath cannot be constructed with empty string")
    if path.endswith("."):
        raise MongoError(40353, "FieldPath must not end with a '.'.")
    parts = path.split(".")
    check_field_path_length(len(parts))
    if any(part == "" for part in parts):
        raise MongoError(15998, f"FieldPath field names may not be empty strings: {path}")
    if any(part.startswith("$") for part in parts):
        raise MongoError(16410, f"FieldPath field names may not start with '$'. Given {what}: {path}")
    return parts


def _get_nested(doc: Any, parts: list[str]) -> Any:
    for part in parts:
        if not isinstance(doc, dict):
            return MISSING
        doc = doc.get(part, MISSING)
    return doc


def _set_nested(doc: Doc, parts: list[str], value: Any) -> Doc:
    """A copy of `doc` with `value` at `parts` (copy-on-write along the path)."""
    out = dict(doc)
    head = parts[0]
    if len(parts) == 1:
        out[head] = value
    else:
        child = doc.get(head)
        out[head] = _set_nested(child if isinstance(child, dict) else {}, parts[1:], value)
    return out


def _remove_nested(doc: Doc, parts: list[str]) -> Doc:
    head = parts[0]
    if head not in doc:
        return doc
    out = dict(doc)
    if len(parts) == 1:
        del out[head]
    elif isinstance(doc[head], dict):
        out[head] = _remove_nested(doc[head], parts[1:])
    return out


# ---------------------------------------------------------------------------
# $match, $sort, $skip, $limit, $count


@_stage("$match")
def _build_match(spec: Any, env: _Env) -> Transform:
    if not isinstance(spec, dict):
        raise MongoError(15959, "the match filter must be an expression in an object")
    matcher = collated_matcher(spec, env.collation, now=env.now)

    def run(stream: Stream) -> Stream:
        return (doc for doc in stream if matcher.matches(doc))

    return run


def _validate_sort(spec: Any) -> None:
    if not isinstance(spec, dict):
        raise MongoError(15973, "the $sort key specification must be an object")
    if not spec:
        raise MongoError(15976, "$sort stage must have at least one sort key")
    for key, direction in spec.items():
        _split_field_path(key)
        if not (is_number(direction) and direction in (1, -1)):
            raise MongoError(15975, "$sort key ordering must be 1 (for ascending) or -1 (for descending)")


@_stage("$sort")
def _build_sort(spec: Any, env: _Env) -> Transform:
    _validate_sort(spec)

    def run(stream: Stream) -> Stream:
        return iter(collated_sort(list(stream), spec, env.collation))

    return run


def _count_argument(stage: str, spec: Any) -> int:
    if isinstance(spec, float) and not (math.isfinite(spec) and spec.is_integer()):
        raise MongoError(2, f"invalid argument to {stage} stage: Cannot represent as a 64-bit integer: {stage}: {spec}")
    return int(spec.to_decimal()) if hasattr(spec, "to_decimal") else int(spec)


@_stage("$limit")
def _build_limit(spec: Any, env: _Env) -> Transform:
    if not is_number(spec):
        raise MongoError(15957, "the limit must be specified as a number")
    limit = _count_argument("$limit", spec)
    if limit <= 0:
        raise MongoError(15958, "the limit must be positive")
    return lambda stream: itertools.islice(stream, limit)


@_stage("$skip")
def _build_skip(spec: Any, env: _Env) -> Transform:
    if not is_number(spec):
        raise MongoError(15972, f"Argument to $skip must be a number not a {type_name(spec)}")
    skip = _count_argument("$skip", spec)
    if skip < 0:
        raise MongoError(15956, "Argument to $skip cannot be negative")
    return lambda stream: itertools.islice(stream, skip, None)


@_stage(UNPACK_STAGE)
def _build_unpack_bucket(spec: Any, env: _Env) -> Transform:
    """A time-series view's stage: each bucket's measurements (see `oplog.timeseries`)."""
    time_field, meta_field = unpack_spec(spec)
    return lambda stream: (doc for bucket in stream for doc in unpack_bucket(bucket, time_field, meta_field))


@_stage("$count")
def _build_count(spec: Any, env: _Env) -> Transform:
    if not isinstance(spec, str):
        raise MongoError(40156, "the count field must be a non-empty string")
    if not spec:
        raise MongoError(40157, "the count field must be a non-empty string")
    if spec.startswith("$"):
        raise MongoError(40158, "the count field cannot be a $-prefixed path")
    if "." in spec:
        raise MongoError(40160, "the count field cannot contain '.'")
    if spec == "_id":
        raise MongoError(15948, "a group's _id may only be specified once")

    def run(stream: Stream) -> Stream:
        total = sum(1 for _ in stream)
        if total:
            yield {spec: total}

    return run


# ---------------------------------------------------------------------------
# $group and its accumulators


class _Accumulator:
    """Folds the per-document values of one $group output field; `used`: the memory it holds beyond
    a fixed size (an accumulator that collects values counts them)."""

    used = 0

    def add(self, value: Any) -> None:
        raise NotImplementedError

    def result(self) -> Any:
        raise NotImplementedError


class _Sum(_Accumulator):
    def __init__(self) -> None:
        self.total = NumericSum()

    def add(self, value: Any) -> None:
        if is_number(value):
            self.total.add(value)

    def result(self) -> Any:
        return self.total.result()


class _Avg(_Sum):
    def result(self) -> Any:
        return self.total.average()


class _Min(_Accumulator):
    sign = -1

    def __init__(self) -> None:
        self.best: Any = MISSING

    def add(self, value: Any) -> None:
        if is_nullish(value):
            return
        if self.best is MISSING or compare_values(value, self.best) * self.sign > 0:
            self.best = value

    def result(self) -> Any:
        return self.best


class _Max(_Min):
    sign = 1


class _First(_Accumulator):
    def __init__(self) -> None:
        self.seen = False
        self.value: Any = MISSING

    def add(self, value: Any) -> None:
        if not self.seen:
            self.seen, self.value = True, value

    def result(self) -> Any:
        return self.value


class _Last(_First):
    def add(self, value: Any) -> None:
        self.value = value


class _Push(_Accumulator):
    """$push: the values, up to mongod's internalQueryMaxPushBytes (100 MiB, then 146)."""

    name = "$push"

    def __init__(self) -> None:
        self.values: list[Any] = []
        self.used = 0

    def add(self, value: Any) -> None:
        if value is not MISSING:
            self._count(value)
            self.values.append(value)

    def _count(self, value: Any) -> None:
        self.used += memory_size(value, MEMORY_LIMIT - self.used)
        if self.used >= MEMORY_LIMIT:
            raise exceeded_memory(self.name)

    def result(self) -> Any:
        return self.values


class _AddToSet(_Push):
    """$addToSet: the distinct values, up to internalQueryMaxAddToSetBytes (100 MiB, then 146)."""

    name = "$addToSet"

    def __init__(self) -> None:
        super().__init__()
        self.keys: set[bytes] = set()

    def add(self, value: Any) -> None:
        if value is MISSING:
            return
        key = canonical_key(value)
        if key not in self.keys:
            self._count(value)
            self.keys.add(key)
            self.values.append(value)


class _Count(_Accumulator):
    def __init__(self) -> None:
        self.count = 0

    def add(self, value: Any) -> None:
        self.count += 1

    def result(self) -> Any:
        return self.count


class _MergeObjects(_Accumulator):
    def __init__(self) -> None:
        self.merged: Doc = {}

    def add(self, value: Any) -> None:
        merge_object_into(self.merged, value)

    def result(self) -> Any:
        return self.merged


class _StdDevPop(_Accumulator):
    sample = False

    def __init__(self) -> None:
        self.values: list[float] = []

    def add(self, value: Any) -> None:
        if is_number(value):
            self.values.append(float(value.to_decimal()) if isinstance(value, Decimal128) else float(value))

    def result(self) -> Any:
        n = len(self.values) - (1 if self.sample else 0)
        if n <= 0:
            return None
        mean = _float_sum(self.values) / len(self.values)
        return math.sqrt(_float_sum([(x - mean) * (x - mean) for x in self.values]) / n)


def _float_sum(values: list[float]) -> float:
    """`math.fsum`, or infinity (as a double sum gives) where fsum raises on an overflowing total."""
    try:
        return math.fsum(values)
    except OverflowError:
        return sum(values)


class _StdDevSamp(_StdDevPop):
    sample = True


_ACCUMULATORS: dict[str, type[_Accumulator]] = {
    "$sum": _Sum, "$avg": _Avg, "$min": _Min, "$max": _Max, "$first": _First, "$last": _Last,
    "$push": _Push, "$addToSet": _AddToSet, "$count": _Count, "$mergeObjects": _MergeObjects,
    "$stdDevPop": _StdDevPop, "$stdDevSamp": _StdDevSamp,
}


@dataclass(frozen=True)
class _GroupField:
    name: str
    accumulator: type[_Accumulator]
    expr: Any


def _parse_group_field(name: str, spec: Any) -> _GroupField:
    if name.startswith("$"):
        raise MongoError(40236, f"The field name '{name}' cannot be an operator name")
    if "." in name:
        raise MongoError(40235, f"The field name '{name}' cannot contain '.'")
    if not isinstance(spec, dict):
        raise MongoError(40234, f"The field '{name}' must be an accumulator object")
    if len(spec) != 1:
        raise MongoError(40238, f"The field '{name}' must specify one accumulator")
    op, expr = next(iter(spec.items()))
    accumulator = _ACCUMULATORS.get(op)
    if accumulator is None:
        raise MongoError(15952, f"unknown group operator '{op}'")
    if isinstance(expr, list):
        raise MongoError(40237, f"The {op} accumulator is a unary operator")
    if op == "$count" and expr != {}:
        raise MongoError(40237, "$count takes no arguments, i.e. $count:{}")
    if op != "$count":
        validate_expression(expr)
    return _GroupField(name, accumulator, expr)


def _parse_group(spec: Any) -> tuple[Any, list[_GroupField]]:
    if not isinstance(spec, dict):
        raise MongoError(15947, "a group's fields must be specified in an object")
    if "_id" not in spec:
        raise MongoError(15955, "a group specification must include an _id")
    validate_expression(spec["_id"])
    fields = [_parse_group_field(name, sub) for name, sub in spec.items() if name != "_id"]
    return spec["_id"], fields


def _group(stream: Stream, env: _Env, key: Callable[[Context], Any], fields: list[_GroupField]) -> list[Doc]:
    """Fold `stream` into one output document per distinct group key, in first-seen order. With
    allowDiskUse false, the groups may hold 100 MiB (internalDocumentSourceGroupMaxMemoryBytes),
    then 292 as mongod answers (it would spill to disk with allowDiskUse; this engine does not)."""
    groups: dict[bytes, tuple[Any, list[_Accumulator]]] = {}
    used = 0
    for doc in stream:
        ctx = env.context(doc)
        group_id = key(ctx)
        group_id = None if group_id is MISSING else group_id
        group_key = canonical_key(group_id)
        entry = groups.get(group_key)
        if entry is None:
            entry = groups[group_key] = (group_id, [f.accumulator() for f in fields])
            if not env.allow_disk_use:
                used += len(group_key) + memory_size(group_id) + VALUE_SIZE * (len(fields) + 1)
        for f, acc in zip(fields, entry[1], strict=True):
            before = acc.used
            acc.add(None if f.accumulator is _Count else evaluate_in(f.expr, ctx))
            used += acc.used - before
        if not env.allow_disk_use and used > MEMORY_LIMIT:
            raise MongoError(292, "Exceeded memory limit for $group, but didn't allow external sort. "
                                  "Pass allowDiskUse:true to opt in.")
    out = []
    for group_id, accs in groups.values():
        result: Doc = {"_id": group_id}
        for f, acc in zip(fields, accs, strict=True):
            value = acc.result()
            result[f.name] = None if value is MISSING else value
        out.append(result)
    return out


def _evaluator(expr: Any) -> Callable[[Context], Any]:
    return lambda ctx: evaluate_in(expr, ctx)


@_stage("$group")
def _build_group(spec: Any, env: _Env) -> Transform:
    id_expr, fields = _parse_group(spec)
    return lambda stream: iter(_group(stream, env, _evaluator(id_expr), fields))


@_stage("$sortByCount")
def _build_sort_by_count(spec: Any, env: _Env) -> Transform:
    is_path = isinstance(spec, str) and spec.startswith("$")
    is_operator = isinstance(spec, dict) and len(spec) == 1 and next(iter(spec)).startswith("$")
    if not (is_path or is_operator):
        raise MongoError(40147, "the sortByCount field must be defined as a $-prefixed path or an expression")
    validate_expression(spec)
    fields = [_GroupField("count", _Count, {})]

    def run(stream: Stream) -> Stream:
        groups = _group(stream, env, _evaluator(spec), fields)
        return iter(sorted(groups, key=lambda doc: -doc["count"]))

    return run


# ---------------------------------------------------------------------------
# $bucket


@dataclass(frozen=True)
class _BucketSpec:
    group_by: Any
    boundaries: list[Any]
    default: Any
    fields: list[_GroupField]


def _parse_bucket(spec: Any) -> _BucketSpec:
    if not isinstance(spec, dict):
        raise MongoError(40201, f"Argument to $bucket stage must be an object, but found type: {type_name(spec)}.")
    for key in spec:
        if key not in ("groupBy", "boundaries", "default", "output"):
            raise MongoError(40197, f"Unrecognized option to $bucket: {key}.")
    if "groupBy" not in spec or "boundaries" not in spec:
        raise MongoError(40198, "$bucket requires 'groupBy' and 'boundaries' to be specified.")
    group_by, boundaries = spec["groupBy"], spec["boundaries"]
    if not (isinstance(group_by, str) and group_by.startswith("$")) and not isinstance(group_by, dict):
        raise MongoError(40202, "The $bucket 'groupBy' field must be defined as a $-prefixed path or an expression")
    validate_expression(group_by)
    _check_boundaries(boundaries)
    default = spec.get("default", MISSING)
    if default is not MISSING and not (
        compare_values(default, boundaries[0]) < 0 or compare_values(default, boundaries[-1]) >= 0
    ):
        raise MongoError(40199, "The $bucket 'default' field must be less than the lowest boundary or greater than or equal to the highest boundary.")
    output = spec.get("output", {"count": {"$sum": 1}})
    if not isinstance(output, dict):
        raise MongoError(40196, f"The $bucket 'output' field must be an object, but found type: {type_name(output)}.")
    fields = [_parse_group_field(name, sub) for name, sub in output.items()]
    return _BucketSpec(group_by, boundaries, default, fields)


def _check_boundaries(boundaries: Any) -> None:
    if not isinstance(boundaries, list) or len(boundaries) < 2:
        raise MongoError(40192, "The $bucket 'boundaries' field must be an array with at least 2 values")
    for low, high in itertools.pairwise(boundaries):
        if compare_values(low, high) >= 0:
            raise MongoError(40194, "The 'boundaries' option to $bucket must be sorted in ascending order")


def _bucket_of(value: Any, spec: _BucketSpec) -> Any:
    for low, high in itertools.pairwise(spec.boundaries):
        if value is not MISSING and compare_values(low, value) <= 0 and compare_values(value, high) < 0:
            return low
    if spec.default is MISSING:
        raise MongoError(40066, "$switch could not find a matching branch for an input, and no default was specified.")
    return spec.default


@_stage("$bucket")
def _build_bucket(spec: Any, env: _Env) -> Transform:
    bucket = _parse_bucket(spec)

    def key(ctx: Context) -> Any:
        return _bucket_of(evaluate_in(bucket.group_by, ctx), bucket)

    def run(stream: Stream) -> Stream:
        groups = _group(stream, env, key, bucket.fields)
        return iter(sorted(groups, key=lambda doc: SortKey(doc["_id"])))

    return run


# ---------------------------------------------------------------------------
# $project, $addFields/$set, $unset


@dataclass
class _Projection:
    """One level of a parsed $project/$addFields/$unset spec."""

    leaves: dict[str, bool] = field(default_factory=dict)  # field -> included?
    computed: dict[str, Any] = field(default_factory=dict)  # field -> expression
    children: dict[str, _Projection] = field(default_factory=dict)
    order: list[str] = field(default_factory=list)  # computed fields and children, in spec order

    @cached_property
    def has_computed(self) -> bool:
        return bool(self.computed) or any(child.has_computed for child in self.children.values())

    def slot(self, parts: list[str], full: str) -> tuple[_Projection, str]:
        """The node and field name for a new leaf at `parts` (creating parents)."""
        node = self
        for i, part in enumerate(parts[:-1]):
            if part in node.leaves or part in node.computed:
                rest = ".".join(parts[i + 1 :])
                raise MongoError(31249, f"Path collision at {full} remaining portion {rest}")
            if part not in node.children:
                node.children[part] = _Projection()
                node.order.append(part)
            node = node.children[part]
        last = parts[-1]
        if last in node.leaves or last in node.computed or last in node.children:
            raise MongoError(31250, f"Path collision at {full}")
        return node, last


@dataclass
class _ProjectionParse:
    add_fields: bool
    root: _Projection = field(default_factory=_Projection)
    mode: str | None = None  # "inclusion" | "exclusion" ($project only)

    def parse(self, spec: Doc, prefix: list[str]) -> None:
        for key, value in spec.items():
            parts = prefix + _split_field_path(key)
            if isinstance(value, dict) and value and not next(iter(value)).startswith("$"):
                self.parse(value, parts)
            elif isinstance(value, dict) and not value and not self.add_fields:
                raise MongoError(51270, f"An empty sub-projection is not a valid value. Found empty object at path {'.'.join(parts)}")
            elif not self.add_fields and (isinstance(value, bool) or is_number(value)):
                self.flag(parts, is_truthy(value))
            else:
                self.expression(parts, value)

    def flag(self, parts: list[str], include: bool) -> None:
        path = ".".join(parts)
        if include:
            if self.mode == "exclusion":
                raise MongoError(31253, f"Cannot do inclusion on field {path} in exclusion projection")
            self.mode = "inclusion"
        elif path != "_id":
            if self.mode == "inclusion":
                raise MongoError(31254, f"Cannot do exclusion on field {path} in inclusion projection")
            self.mode = "exclusion"
        node, name = self.root.slot(parts, path)
        node.leaves[name] = include

    def expression(self, parts: list[str], value: Any) -> None:
        path = ".".join(parts)
        if not self.add_fields:
            if self.mode == "exclusion":
                raise MongoError(31252, "Cannot use expression other than $meta in exclusion projection")
            self.mode = "inclusion"
        validate_expression(value)
        node, name = self.root.slot(parts, path)
        node.computed[name] = value
        node.order.append(name)


def _project_fields(node: _Projection, doc: Doc) -> Doc:
    """Inclusion: keep the included fields, in the input document's order."""
    out: Doc = {}
    for key, value in doc.items():
        if node.leaves.get(key):
            out[key] = value
        elif key in node.children:
            sub = _project_value(node.children[key], value)
            if sub is not MISSING:
                out[key] = sub
    return out


def _project_value(node: _Projection, value: Any) -> Any:
    if isinstance(value, dict):
        return _project_fields(node, value)
    if isinstance(value, list):
        # Scalars in the array are dropped, unless computed fields will replace them
        # with new documents (MongoDB's {"a.b": <expr>} over {a: [1]} gives {a: [{b: ...}]}).
        items = (_project_value(node, item) for item in value)
        return [item for item in items if item is not MISSING or node.has_computed]
    return MISSING


def _apply_computed(node: _Projection, out: Doc, ctx: Context) -> None:
    """Set computed fields (in spec order) on `out`; missing results remove the field."""
    for key in node.order:
        if key in node.computed:
            value = evaluate_in(node.computed[key], ctx)
            if value is MISSING:
                out.pop(key, None)
            else:
                out[key] = value
        elif node.children[key].has_computed:
            out[key] = _computed_value(node.children[key], out.get(key, MISSING), ctx)


def _computed_value(node: _Projection, value: Any, ctx: Context) -> Any:
    if isinstance(value, list):
        return [_computed_value(node, item, ctx) for item in value]
    out = dict(value) if isinstance(value, dict) else {}
    _apply_computed(node, out, ctx)
    return out


def _exclude_fields(node: _Projection, doc: Doc) -> Doc:
    out: Doc = {}
    for key, value in doc.items():
        if node.leaves.get(key) is False:
            continue
        out[key] = _exclude_value(node.children[key], value) if key in node.children else value
    return out


def _exclude_value(node: _Projection, value: Any) -> Any:
    if isinstance(value, dict):
        return _exclude_fields(node, value)
    if isinstance(value, list):
        return [_exclude_value(node, item) for item in value]
    return value


def _projection_transform(root: _Projection, env: _Env, mode: str) -> Transform:
    def apply(doc: Doc) -> Doc:
        if mode == "exclusion":
            return _exclude_fields(root, doc)
        out = _project_fields(root, doc) if mode == "inclusion" else dict(doc)
        if root.has_computed:
            _apply_computed(root, out, env.context(doc))
        return out

    return lambda stream: (apply(doc) for doc in stream)


@_stage("$project")
def _build_project(spec: Any, env: _Env) -> Transform:
    if not isinstance(spec, dict):
        raise MongoError(15969, "$project specification must be an object")
    if not spec:
        raise MongoError(51272, "Invalid $project :: caused by :: projection specification must have at least one field")
    parse = _ProjectionParse(add_fields=False)
    try:
        parse.parse(spec, [])
    except MongoError as exc:
        raise MongoError(exc.code, f"Invalid $project :: caused by :: {exc.errmsg}") from None
    mode = parse.mode or "exclusion"
    root = parse.root
    if mode == "inclusion" and "_id" not in root.leaves and "_id" not in root.computed and "_id" not in root.children:
        root.leaves["_id"] = True
    return _projection_transform(root, env, mode)


@_stage("$addFields", "$set")
def _build_add_fields(spec: Any, env: _Env) -> Transform:
    if not isinstance(spec, dict):
        raise MongoError(40272, f"$addFields specification stage must be an object, got {type_name(spec)}")
    parse = _ProjectionParse(add_fields=True)
    parse.parse(spec, [])
    return _projection_transform(parse.root, env, "add")


@_stage("$unset")
def _build_unset(spec: Any, env: _Env) -> Transform:
    paths = [spec] if isinstance(spec, str) else spec
    if not isinstance(paths, list):
        raise MongoError(31002, "$unset specification must be a string or an array")
    if not paths:
        raise MongoError(31119, "$unset specification must be a string or an array with at least one field")
    if not all(isinstance(path, str) for path in paths):
        raise MongoError(31120, "$unset specification must be a string or an array containing only string values")
    parse = _ProjectionParse(add_fields=False)
    for path in paths:
        parse.flag(_split_field_path(path), False)
    return _projection_transform(parse.root, env, "exclusion")


# ---------------------------------------------------------------------------
# $unwind


@dataclass(frozen=True)
class _UnwindSpec:
    path: list[str]
    index: list[str] | None
    preserve: bool


def _parse_unwind(spec: Any) -> _UnwindSpec:
    if isinstance(spec, str):
        spec = {"path": spec}
    if not isinstance(spec, dict):
        raise MongoError(15981, f"expected either a string or an object as specification for $unwind stage, got {type_name(spec)}")
    for key in spec:
        if key not in ("path", "includeArrayIndex", "preserveNullAndEmptyArrays"):
            raise MongoError(28811, f"unrecognized option to $unwind stage: {key}")
    path = spec.get("path", MISSING)
    if path is MISSING:
        raise MongoError(28812, "no path specified to $unwind stage")
    if not isinstance(path, str):
        raise MongoError(28808, f"expected a string as the path for $unwind stage, got {type_name(path)}")
    if not path.startswith("$"):
        raise MongoError(28818, f"path option to $unwind stage should be prefixed with a '$': {path}")
    preserve = spec.get("preserveNullAndEmptyArrays", False)
    if not isinstance(preserve, bool):
        raise MongoError(28809, f"expected a boolean for the preserveNullAndEmptyArrays option to $unwind stage, got {type_name(preserve)}")
    index = spec.get("includeArrayIndex")
    if index is not None:
        if not isinstance(index, str) or not index:
            raise MongoError(28810, f"expected a non-empty string for the includeArrayIndex option to $unwind stage, got {type_name(index)}")
        if index.startswith("$"):
            raise MongoError(28822, f"includeArrayIndex option to $unwind stage should not be prefixed with a '$': {index}")
    return _UnwindSpec(_split_field_path(path[1:]), _split_field_path(index) if index else None, preserve)


def _with_index(doc: Doc, spec: _UnwindSpec, index: Any) -> Doc:
    return doc if spec.index is None else _set_nested(doc, spec.index, index)


def _unwind_one(doc: Doc, spec: _UnwindSpec) -> Stream:
    value = _get_nested(doc, spec.path)
    if isinstance(value, list):
        if value:
            for i, item in enumerate(value):
                yield _with_index(_set_nested(doc, spec.path, item), spec, i)
        elif spec.preserve:
            yield _with_index(_remove_nested(doc, spec.path), spec, None)
    elif not is_nullish(value) or spec.preserve:
        yield _with_index(doc, spec, None)


@_stage("$unwind")
def _build_unwind(spec: Any, env: _Env) -> Transform:
    unwind = _parse_unwind(spec)
    return lambda stream: (out for doc in stream for out in _unwind_one(doc, unwind))


# ---------------------------------------------------------------------------
# $replaceRoot / $replaceWith, $facet


def _replace_transform(expr: Any, env: _Env) -> Transform:
    validate_expression(expr)

    def apply(doc: Doc) -> Doc:
        value = evaluate_in(expr, env.context(doc))
        if not isinstance(value, dict):
            shown = "MISSING" if value is MISSING else repr(value)
            raise MongoError(
                40228,
                f"'replacement document' must evaluate to an object, but resulting value was: {shown}. "
                f"Type of resulting value: '{type_name(value)}'. Input document: {doc!r}",
            )
        return value

    return lambda stream: (apply(doc) for doc in stream)


@_stage("$replaceRoot")
def _build_replace_root(spec: Any, env: _Env) -> Transform:
    if not isinstance(spec, dict):
        raise MongoError(40229, f"expected an object as specification for $replaceRoot stage, got {type_name(spec)}")
    for key in spec:
        if key != "newRoot":
            raise MongoError(40415, f"BSON field '$replaceRoot.{key}' is an unknown field.")
    if "newRoot" not in spec:
        raise MongoError(40414, "BSON field '$replaceRoot.newRoot' is missing but a required field")
    return _replace_transform(spec["newRoot"], env)


@_stage("$replaceWith")
def _build_replace_with(spec: Any, env: _Env) -> Transform:
    return _replace_transform(spec, env)


FACET_MAX_OUTPUT_BYTES = 100 * 1024 * 1024  # internalQueryFacetMaxOutputDocSizeBytes


@_stage("$facet")
def _build_facet(spec: Any, env: _Env) -> Transform:
    if not isinstance(spec, dict) or not spec:
        raise MongoError(40169, "the $facet specification must be a non-empty object")
    facets: dict[str, list[Transform]] = {}
    for name, pipeline in spec.items():
        _split_field_path(name, "facet name")
        if not isinstance(pipeline, list):
            raise MongoError(40170, f"arguments to $facet must be arrays, {name} is type {type_name(pipeline)}")
        facets[name] = _compile(pipeline, env, in_facet=True)

    def run(stream: Stream) -> Stream:
        docs = list(stream)
        out: Doc = {}
        for name, transforms in facets.items():
            sub: Stream = iter(docs)
            for transform in transforms:
                sub = transform(sub)
            out[name] = list(sub)
            size = measure(out, limit=FACET_MAX_OUTPUT_BYTES).size
            if size > FACET_MAX_OUTPUT_BYTES:
                raise MongoError(4031700, f"document constructed by $facet is {size} bytes, which exceeds "
                                          f"the limit of {FACET_MAX_OUTPUT_BYTES} bytes")
        yield out

    return run


from oplog import aggregate_joins  # noqa: E402, F401  ($lookup, $unionWith, $sample, $bucketAuto register themselves)
