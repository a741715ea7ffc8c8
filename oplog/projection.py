"""find() projections: inclusion and exclusion trees, ``$slice``, ``$elemMatch``,
positional ``field.$`` and computed fields.

A projection is parsed and validated once (`compile_projection`) into a tree of
levels (`_PNode`) whose leaves say what becomes of each field, following the
server's projection parser: its rules for telling an inclusion projection from an
exclusion one, and its error codes. `Projection.apply` then projects one document;
output values are shared with the input, not copied. Computed fields are aggregation
expressions (`oplog.expressions`) evaluated with ``$$NOW`` the ``now`` given to
`compile_projection` (the Unix epoch when none is given). The positional ``$`` and
``$elemMatch`` take the matching array element a `Matcher` reports.

Pure: no I/O, no clocks, no randomness.
"""

from __future__ import annotations

__layer__ = "core"  # pure: no I/O, clock or randomness (tests/unit/test_layering.py)

import datetime
from collections.abc import Mapping
from typing import Any

from base.errors import MongoError
from oplog.doc_limits import check_field_path_length
from oplog.expr_values import MISSING, is_truthy, type_name
from oplog.expressions import evaluate, is_operator, validate_expression
from oplog.query import Matcher
from oplog.query_common import (
    _ARRAY,
    _DOC,
    _EPOCH,
    _bad,
    _check_field_path,
    _is_nan,
    _shell_repr,
    _truncate_to_long,
)
from oplog.values import is_number

__all__ = [
    "Projection",
    "apply_projection",
    "compile_projection",
    "validate_projection",
]


_INCLUSION, _EXCLUSION = "inclusion", "exclusion"


class _PNode:
    """A level of the projection tree: field name -> spec or sub-level."""

    __slots__ = ("children", "computed")

    def __init__(self) -> None:
        self.children: dict[str, Any] = {}
        self.computed = False  # whether any computed field lies below; set by `finalize`

    def finalize(self) -> bool:
        flags = [c.finalize() if isinstance(c, _PNode) else isinstance(c, _Computed) for c in self.children.values()]
        self.computed = any(flags)
        return self.computed


class _Slice:
    __slots__ = ("limit", "skip")

    def __init__(self, skip: int | None, limit: int) -> None:
        self.skip = skip
        self.limit = limit

    def apply(self, arr: list[Any]) -> list[Any]:
        n = len(arr)
        if self.skip is None:
            if self.limit < 0:
                return list(arr[max(0, n + self.limit) :])
            return list(arr[: self.limit])
        start = max(0, n + self.skip) if self.skip < 0 else min(n, self.skip)
        return list(arr[start : start + self.limit])


class _Positional:
    __slots__ = ()


class _ElemProj:
    __slots__ = ("matcher",)

    def __init__(self, matcher: Matcher) -> None:
        self.matcher = matcher


class _Computed:
    """A computed field: a validated aggregation expression, evaluated per document."""

    __slots__ = ("expr", "now")

    def __init__(self, expr: Any, now: datetime.datetime) -> None:
        validate_expression(expr)
        self.expr = expr
        self.now = now

    def value(self, root_doc: Any) -> Any:
        return evaluate(self.expr, root_doc, now=self.now)


class _Meta:
    __slots__ = ("name",)

    def __init__(self, name: Any) -> None:
        self.name = name


class _PCtx:
    """Parse state, as in the server's projection parser."""

    def __init__(self, matcher: Matcher | None, now: datetime.datetime) -> None:
        self.matcher = matcher
        self.now = now
        self.type: str | None = None
        self.id_specified = self.id_included = self.id_excluded = False
        self.has_positional = self.has_elem_match = self.has_slice = self.has_meta = False
        self.positional_path: tuple[str, ...] | None = None
        self.elem_fields: list[str] = []


def _add_at_path(root: _PNode, parts: tuple[str, ...], child: Any, *, merge: bool = False) -> Any:
    node = root
    for i, part in enumerate(parts):
        existing = node.children.get(part)
        if i == len(parts) - 1:
            if existing is not None:
                if merge and isinstance(existing, _PNode) and isinstance(child, _PNode):
                    return existing
                raise MongoError(31250, f"Path collision at {'.'.join(parts)}")
            node.children[part] = child
            return child
        if existing is None:
            existing = node.children[part] = _PNode()
        elif not isinstance(existing, _PNode):
            raise MongoError(
                31249, f"Path collision at {'.'.join(parts)} remaining portion {'.'.join(parts[1:])}"
            )
        node = existing
    return child


def _find_positional(path: str) -> tuple[int, int] | None:
    first = path.find(".$.")
    if first >= 0:
        return (first, first + 3)
    if path.endswith(".$"):
        return (len(path) - 2, len(path))
    if path == "$":
        return (0, 1)
    return None


def _parse_pelem(ctx: _PCtx, key: str, value: Any, parent: _PNode, prefix: tuple[str, ...]) -> None:
    pos = _find_positional(key)
    if isinstance(value, _DOC):
        if pos is not None:
            raise MongoError(31271, "positional projection cannot be used with an expression or sub object")
        _parse_psub(ctx, key, value, parent, prefix)
    elif isinstance(value, bool) or is_number(value):
        if is_truthy(value):
            _parse_inclusion(ctx, key, parent, prefix, pos)
        else:
            _parse_exclusion(ctx, key, parent, prefix)
    else:
        if pos is not None:
            raise MongoError(31308, "positional projection cannot be used with a literal")
        if ctx.type == _EXCLUSION:
            raise MongoError(31310, f"Cannot use an expression {key}: {_shell_repr(value)} in an exclusion projection")
        parts = _check_field_path(key)
        _add_at_path(parent, parts, _Computed(value, ctx.now))
        ctx.type = _INCLUSION


def _parse_psub(ctx: _PCtx, key: str, obj: Mapping[str, Any], parent: _PNode, prefix: tuple[str, ...]) -> None:
    parts = _check_field_path(key)
    if len(obj) == 1 and str(next(iter(obj))).startswith("$"):
        if _parse_pexpr(ctx, parts, obj, parent, prefix):
            return
        raise MongoError(31325, f"Unknown expression {next(iter(obj))}")
    node = _add_at_path(parent, parts, _PNode(), merge=True)
    for sub_key, sub_value in obj.items():
        _parse_pelem(ctx, sub_key, sub_value, node, prefix + parts)


def _parse_pexpr(
    ctx: _PCtx, parts: tuple[str, ...], obj: Mapping[str, Any], parent: _PNode, prefix: tuple[str, ...]
) -> bool:
    name, arg = next(iter(obj.items()))
    if name == "$slice":
        _add_at_path(parent, parts, _parse_slice(arg))
        ctx.has_slice = True
        return True
    if name == "$elemMatch":
        if not isinstance(arg, _DOC):
            raise MongoError(31274, f"elemMatch: Invalid argument, object required, but got {type_name(arg)}")
        if ctx.has_positional:
            raise MongoError(31255, "Cannot specify positional operator and $elemMatch.")
        if len(parts) != 1 or prefix:
            raise MongoError(31275, "Cannot use $elemMatch projection on a nested field.")
        _add_at_path(parent, parts, _ElemProj(Matcher({parts[0]: {"$elemMatch": arg}})))
        ctx.has_elem_match = True
        return True
    is_meta = name == "$meta"
    if not is_meta and not is_operator(name):
        return False  # the caller raises 31325 (the server's projection code, not 168)
    if ctx.type == _EXCLUSION and not is_meta:
        raise MongoError(31252, "Cannot use expression other than $meta in exclusion projection")
    if is_meta:
        _add_at_path(parent, parts, _Meta(arg))
        ctx.has_meta = True
    else:
        _add_at_path(parent, parts, _Computed(obj, ctx.now))
        ctx.type = _INCLUSION
    return True


def _parse_slice(arg: Any) -> _Slice:
    if is_number(arg) and arg.__class__ is not bool:
        return _Slice(None, _clamp_int(arg))
    if isinstance(arg, _ARRAY):
        if len(arg) != 2:
            raise MongoError(31272, "$slice array argument should be of form [skip, limit]")
        skip, limit = arg
        if not is_number(skip) or skip.__class__ is bool:
            raise MongoError(31257, f"$slice expects the skip argument to be a number, got {type_name(skip)}")
        if not is_number(limit) or limit.__class__ is bool:
            raise MongoError(31258, f"$slice expects the limit argument to be a number, got {type_name(limit)}")
        if _clamp_int(limit) <= 0:
            raise MongoError(31259, f"$slice limit must be positive, got {_clamp_int(limit)}")
        return _Slice(_clamp_int(skip), _clamp_int(limit))
    raise MongoError(31273, "$slice only supports numbers and [skip, limit] arrays")


def _clamp_int(value: Any) -> int:
    """A number as a 32-bit int, the way the server reads $slice arguments."""
    number = _truncate_to_long(value)
    if number is None:
        return 0 if _is_nan(value) else (2**31 - 1 if float(str(value)) > 0 else -(2**31))
    return max(-(2**31), min(2**31 - 1, number))


def _parse_inclusion(
    ctx: _PCtx, key: str, parent: _PNode, prefix: tuple[str, ...], pos: tuple[int, int] | None
) -> None:
    is_top_id = key == "_id" and not prefix
    if pos is None:
        _add_at_path(parent, _check_field_path(key), True)
        ctx.id_included = ctx.id_included or is_top_id
    else:
        _parse_positional(ctx, key, parent, prefix, pos)
    if not is_top_id:
        if ctx.type == _EXCLUSION:
            raise MongoError(31253, f"Cannot do inclusion on field {key} in exclusion projection")
        ctx.type = _INCLUSION


def _parse_positional(ctx: _PCtx, key: str, parent: _PNode, prefix: tuple[str, ...], pos: tuple[int, int]) -> None:
    if ctx.has_positional:
        raise MongoError(31276, "Cannot specify more than one positional projection per query.")
    if ctx.has_elem_match:
        raise MongoError(31256, "Cannot specify positional operator and $elemMatch.")
    match_field = prefix[0] if prefix else key.split(".", 1)[0]
    if ctx.matcher is not None and not ctx.matcher.tests_field(match_field):
        raise MongoError(31277, f"Positional projection '{key}' does not match the query document.")
    if key.endswith(".$."):
        raise MongoError(31270, "Path cannot end with '.$.'")
    rest = key[pos[1] :]
    if _find_positional(rest) is not None or rest == "$":
        raise MongoError(31287, f"Cannot use positional operator twice: {key}")
    parts = _check_field_path(key[: pos[0]])
    _add_at_path(parent, parts, _Positional())
    ctx.has_positional = True
    ctx.positional_path = prefix + parts


def _parse_exclusion(ctx: _PCtx, key: str, parent: _PNode, prefix: tuple[str, ...]) -> None:
    _add_at_path(parent, _check_field_path(key), False)
    if key == "_id" and not prefix:
        ctx.id_excluded = True
        return
    if ctx.type == _INCLUSION:
        raise MongoError(31254, f"Cannot do exclusion on field {key} in inclusion projection")
    ctx.type = _EXCLUSION


def _projection_type(ctx: _PCtx) -> str:
    """The server's rules for projections with no plain inclusion/exclusion field."""
    if ctx.type is not None:
        return ctx.type
    if ctx.has_slice:
        return _INCLUSION if ctx.id_included else _EXCLUSION
    if ctx.has_elem_match:
        return _INCLUSION
    if ctx.has_meta:
        return _INCLUSION if ctx.id_included and not ctx.id_excluded else _EXCLUSION
    return _INCLUSION if ctx.id_included else _EXCLUSION


class Projection:
    """A parsed, validated find() projection; `apply` projects one document."""

    __slots__ = ("elem_fields", "kind", "matcher", "positional_path", "root")

    def __init__(
        self, spec: Mapping[str, Any], matcher: Matcher | None = None, *, now: datetime.datetime | None = None
    ) -> None:
        if not isinstance(spec, _DOC):
            raise _bad("projection must be an object")
        ctx = _PCtx(matcher, _EPOCH if now is None else now)
        root = _PNode()
        for key, value in spec.items():
            if isinstance(key, str):
                check_field_path_length(key.count(".") + 1)  # (mongod's FieldPath: Overflow past 200 parts)
            ctx.id_specified |= key == "_id" or key.startswith("_id.")
            _parse_pelem(ctx, key, value, root, ())
        self.kind = _projection_type(ctx)
        if not ctx.id_specified and self.kind == _INCLUSION:
            root.children["_id"] = True
        if self.kind == _EXCLUSION and ctx.id_included:
            root.children.pop("_id", None)
        root.finalize()
        self.root = root
        self.matcher = matcher
        self.positional_path = ctx.positional_path
        self.elem_fields = [k for k, v in root.children.items() if isinstance(v, _ElemProj)]

    def apply(self, doc: Mapping[str, Any], *, matcher: Matcher | None = None) -> dict[str, Any]:
        """Project `doc`. Values are shared with `doc`, not copied."""
        if self.kind == _INCLUSION:
            out = _include(doc, self.root, doc)
        else:
            out = _exclude(doc, self.root)
        if self.positional_path is not None:
            _apply_positional(doc, out, self.positional_path, matcher or self.matcher)
        for field in self.elem_fields:
            _apply_elem_match(doc, out, field, self.root.children[field], self.kind)
        return out


def _include(doc: Mapping[str, Any], node: _PNode, root_doc: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    children = node.children
    for key, value in doc.items():
        spec = children.get(key)
        if spec is None or spec is False or isinstance(spec, (_ElemProj, _Meta, _Computed)):
            continue
        if spec is True or isinstance(spec, _Positional):
            out[key] = value
        elif isinstance(spec, _Slice):
            out[key] = spec.apply(value) if isinstance(value, _ARRAY) else value
        elif isinstance(value, _DOC):
            out[key] = _include(value, spec, root_doc)
        elif isinstance(value, _ARRAY):
            out[key] = _include_array(value, spec, root_doc)
        elif spec.computed:
            out[key] = _include({}, spec, root_doc)
    for key, spec in children.items():
        if isinstance(spec, _Computed):
            result = spec.value(root_doc)
            if result is not MISSING:
                out[key] = result
        elif isinstance(spec, _PNode) and key not in out and spec.computed:
            out[key] = _include({}, spec, root_doc)
    return out


def _include_array(arr: Any, node: _PNode, root_doc: Any) -> list[Any]:
    out = []
    computed = node.computed
    for elem in arr:
        if isinstance(elem, _DOC):
            out.append(_include(elem, node, root_doc))
        elif isinstance(elem, _ARRAY):
            out.append(_include_array(elem, node, root_doc))
        elif computed:
            out.append(_include({}, node, root_doc))
    return out


def _exclude(doc: Mapping[str, Any], node: _PNode) -> dict[str, Any]:
    out: dict[str, Any] = {}
    children = node.children
    for key, value in doc.items():
        spec = children.get(key)
        if spec is None or spec is True or isinstance(spec, _ElemProj):
            out[key] = value
        elif spec is False or isinstance(spec, _Meta):
            continue
        elif isinstance(spec, _Slice):
            out[key] = spec.apply(value) if isinstance(value, _ARRAY) else value
        elif isinstance(spec, _PNode) and isinstance(value, _DOC):
            out[key] = _exclude(value, spec)
        elif isinstance(spec, _PNode) and isinstance(value, _ARRAY):
            out[key] = _exclude_array(value, spec)
        else:
            out[key] = value
    return out


def _exclude_array(arr: Any, node: _PNode) -> list[Any]:
    out = []
    for elem in arr:
        if isinstance(elem, _DOC):
            out.append(_exclude(elem, node))
        elif isinstance(elem, _ARRAY):
            out.append(_exclude_array(elem, node))
        else:
            out.append(elem)
    return out


def _apply_positional(pre: Any, out: dict[str, Any], parts: tuple[str, ...], matcher: Matcher | None) -> None:
    """Replace the first array along `parts` in `out` by ``[element at the matched index]``."""
    if matcher is None:
        raise MongoError(51050, "Projections with a positional operator require a matcher")
    index = matcher.match_result(pre).array_index
    sub: Any = out
    for depth, part in enumerate(parts):
        value = sub.get(part, MISSING)
        if isinstance(value, _ARRAY):
            if index is None:
                raise MongoError(51246, "positional operator '.$' couldn't find a matching element in the array")
            if not 0 <= index < len(value):
                raise MongoError(51247, "positional operator '.$' element mismatch")
            _set_nested(out, parts[: depth + 1], [value[index]])
            return
        if not isinstance(value, _DOC):
            return
        sub = value


def _set_nested(out: dict[str, Any], parts: tuple[str, ...], value: Any) -> None:
    cur = out
    for part in parts[:-1]:
        nxt = cur[part]
        if not isinstance(nxt, dict):
            nxt = cur[part] = dict(nxt)
        cur = nxt
    cur[parts[-1]] = value


def _apply_elem_match(pre: Any, out: dict[str, Any], field: str, spec: _ElemProj, kind: str) -> None:
    result = spec.matcher.match_result(pre)
    if not result.matched or result.array_index is None:
        out.pop(field, None)
        return
    value = [pre[field][result.array_index]]
    if kind == _INCLUSION:
        out.pop(field, None)
    out[field] = value


def compile_projection(
    projection: Mapping[str, Any], *, matcher: Matcher | None = None, now: datetime.datetime | None = None
) -> Projection:
    """Parse and validate a find() projection once, for projecting many documents.

    `now` is ``$$NOW`` in computed fields (the Unix epoch when None)."""
    return Projection(projection, matcher, now=now)


def validate_projection(projection: Mapping[str, Any] | None, *, matcher: Matcher | None = None) -> None:
    """Raise MongoError if `projection` is invalid (checked against `matcher` when given)."""
    if projection:
        Projection(projection, matcher)


def apply_projection(
    doc: dict[str, Any], projection: Mapping[str, Any] | None, *, matcher: Matcher | None = None
) -> dict[str, Any]:
    """Project `doc` with a find() projection; None or ``{}`` returns a shallow copy."""
    if not projection:
        return dict(doc)
    return Projection(projection, matcher).apply(doc)
