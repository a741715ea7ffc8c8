"""The stages that read other collections or draw at random, and `$bucketAuto`: `$lookup`
(equality and pipeline forms), `$unionWith`, `$sample`.

Another collection is read through the `collections` callable the runtime passes to the pipeline
(the same snapshot or transaction the aggregate reads), once per stage, then held in memory for the
stage; `$lookup` matches each input document against it with the ordinary matcher
(`{foreignField: {$in: [local values]}}`: an array on either side matches by element, and a missing
field matches null, as in mongod). `$sample` draws with the runtime's random source.
"""

from __future__ import annotations

__layer__ = "core"  # pure: no I/O, clock or randomness (tests/unit/test_layering.py)

from typing import Any

from base.errors import MongoError
from oplog.aggregate import Doc, Stream, Transform, _compile, _Count, _Env, _parse_group_field, _stage
from oplog.doc_limits import measure
from oplog.expressions import MISSING, evaluate_in, validate_expression
from oplog.let_vars import bind_pipeline
from oplog.query import compile_filter
from oplog.query_common import get_path
from oplog.values import SortKey, compare_values

LOOKUP_MAX_BYTES = 100 * 1024 * 1024  # internalLookupStageIntermediateDocumentMaxSizeBytes


def _local_values(doc: Doc, path: str) -> list[Any]:
    values: list[Any] = []
    for value in get_path(doc, path):
        values.extend(value if isinstance(value, list) else [value])
    return values or [None]


@_stage("$lookup")
def _build_lookup(spec: Any, env: _Env) -> Transform:
    if not isinstance(spec, dict):
        raise MongoError(9, "the $lookup stage specification must be an object")
    unknown = set(spec) - {"from", "localField", "foreignField", "as", "let", "pipeline"}
    if unknown:
        raise MongoError(9, f"unknown argument to $lookup: {sorted(unknown)[0]}")
    target = spec.get("as")
    if not isinstance(target, str) or not target:
        raise MongoError(9, "$lookup requires 'as' to be a non-empty string")
    equality = "localField" in spec or "foreignField" in spec
    if equality and not (isinstance(spec.get("localField"), str) and isinstance(spec.get("foreignField"), str)):
        raise MongoError(9, "$lookup requires both 'localField' and 'foreignField' as strings")
    if not equality and "pipeline" not in spec:
        raise MongoError(9, "$lookup requires either 'pipeline' or both 'localField' and 'foreignField'")
    pipeline = spec.get("pipeline", [])
    let = spec.get("let", {})
    if not isinstance(let, dict):
        raise MongoError(9, "$lookup's 'let' must be an object")
    _compile(bind_pipeline(pipeline, dict.fromkeys(let)), env)  # checked now, run per document

    def run(stream: Stream) -> Stream:
        foreign = env.collection("$lookup", spec.get("from"))
        for doc in stream:
            matched = foreign
            if equality:
                matcher = compile_filter({spec["foreignField"]: {"$in": _local_values(doc, spec["localField"])}})
                matched = [f for f in foreign if matcher.matches(f)]
            if "pipeline" in spec:
                ctx = env.context(doc)
                values = {name: evaluate_in(expr, ctx) for name, expr in let.items()}
                bound = bind_pipeline(pipeline, {k: None if v is MISSING else v for k, v in values.items()})
                sub: Stream = iter(matched)
                for transform in _compile(bound, env):
                    sub = transform(sub)
                matched = list(sub)
            if len(matched) and measure(matched, limit=LOOKUP_MAX_BYTES).size > LOOKUP_MAX_BYTES:
                raise MongoError(4568, f"Total size of documents in {spec.get('from')} matching pipeline's "
                                       f"$lookup stage exceeds {LOOKUP_MAX_BYTES} bytes")
            yield {**doc, target: list(matched)}

    return run


@_stage("$unionWith")
def _build_union_with(spec: Any, env: _Env) -> Transform:
    if isinstance(spec, str):
        spec = {"coll": spec}
    if not isinstance(spec, dict) or not isinstance(spec.get("coll"), str):
        raise MongoError(40414, "$unionWith requires 'coll', a collection name")
    pipeline = spec.get("pipeline", [])
    transforms = _compile(pipeline, env)

    def run(stream: Stream) -> Stream:
        yield from stream
        other: Stream = iter(env.collection("$unionWith", spec["coll"]))
        for transform in transforms:
            other = transform(other)
        yield from other

    return run


@_stage("$sample")
def _build_sample(spec: Any, env: _Env) -> Transform:
    size = spec.get("size") if isinstance(spec, dict) and set(spec) == {"size"} else None
    if isinstance(size, bool) or not isinstance(size, (int, float)) or size < 0:
        raise MongoError(28746, "size argument to $sample must be a non-negative number")

    def run(stream: Stream) -> Stream:
        if env.sampler is None:
            raise MongoError(115, "$sample is not supported here")
        docs = list(stream)
        yield from env.sampler.sample(docs, min(int(size), len(docs)))

    return run


@_stage("$bucketAuto")
def _build_bucket_auto(spec: Any, env: _Env) -> Transform:
    """`$bucketAuto`: the documents sorted by `groupBy`, cut into at most `buckets` groups of about
    equal size (a value never spans two buckets; the last bucket takes what is left), each
    `{_id: {min, max}}` (max: the next bucket's min, or the last value) with its `output`
    accumulators (default `count`). `granularity` is refused (115)."""
    if not isinstance(spec, dict) or set(spec) - {"groupBy", "buckets", "output", "granularity"}:
        raise MongoError(40240, "$bucketAuto takes groupBy, buckets, output and granularity")
    if "granularity" in spec:
        raise MongoError(115, "$bucketAuto's granularity is not supported by this server")
    group_by, count = spec.get("groupBy"), spec.get("buckets")
    if not (isinstance(group_by, str) and group_by.startswith("$")) and not (
            isinstance(group_by, dict) and len(group_by) == 1 and next(iter(group_by)).startswith("$")):
        raise MongoError(40239, "$bucketAuto's groupBy must be a $-prefixed path or an expression object")
    validate_expression(group_by)
    if isinstance(count, bool) or not isinstance(count, int) or not 0 < count <= 2**31 - 1:
        raise MongoError(40243, "$bucketAuto's buckets must be a positive 32-bit integer")
    output = spec.get("output", {"count": {"$sum": 1}})
    if not isinstance(output, dict):
        raise MongoError(40244, "$bucketAuto's output must be an object")
    fields = [_parse_group_field(name, sub) for name, sub in output.items()]

    def run(stream: Stream) -> Stream:
        pairs = []
        for doc in stream:
            value = evaluate_in(group_by, env.context(doc))
            pairs.append((None if value is MISSING else value, doc))
        pairs.sort(key=lambda pair: SortKey(pair[0]))
        size = max(1, round(len(pairs) / count))
        groups: list[list[tuple[Any, Doc]]] = []
        start = 0
        while start < len(pairs):
            if len(groups) == count - 1:
                groups.append(pairs[start:])
                break
            end = min(start + size, len(pairs))
            while end < len(pairs) and compare_values(pairs[end][0], pairs[end - 1][0]) == 0:
                end += 1
            groups.append(pairs[start:end])
            start = end
        for k, group in enumerate(groups):
            accumulators = [f.accumulator() for f in fields]
            for _value, doc in group:
                ctx = env.context(doc)
                for f, acc in zip(fields, accumulators, strict=True):
                    acc.add(None if f.accumulator is _Count else evaluate_in(f.expr, ctx))
            upper = groups[k + 1][0][0] if k + 1 < len(groups) else group[-1][0]
            out: Doc = {"_id": {"min": group[0][0], "max": upper}}
            for f, acc in zip(fields, accumulators, strict=True):
                result = acc.result()
                out[f.name] = None if result is MISSING else result
            yield out

    return run
