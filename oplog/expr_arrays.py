"""Array and object expression operators: ``$size``, ``$arrayElemAt``, ``$first``,
``$last``, ``$in``, ``$concatArrays``, ``$isArray``, ``$reverseArray``, ``$slice``,
``$range``, ``$indexOfArray``, ``$map``, ``$filter``, ``$reduce``, ``$mergeObjects``,
``$objectToArray`` and ``$arrayToObject``.

``$map``, ``$filter`` and ``$reduce`` are lazy: their ``in`` or ``cond`` expression is
evaluated once per element, with the element bound to a variable (``$$this`` unless
``as`` names another; ``$reduce`` also binds ``$$value``).

What they build is bounded as in mongod (`oplog.doc_limits`): ``$range``, ``$concatArrays``,
``$map`` and a ``$reduce``'s accumulator hold at most 100 MiB (ExceededMemoryLimit, 146), and
large arrays are built `C_STEP` elements at a time, with an interrupt point between steps
(`oplog.expr_eval.interrupt_point`: the operation's time limit).

Pure: no I/O and no clock.
"""

from __future__ import annotations

__layer__ = "core"  # pure: no I/O, clock or randomness (tests/unit/test_layering.py)

from typing import Any

from base.errors import MongoError
from oplog.doc_limits import (
    C_STEP,
    MAX_DEPTH,
    MEMORY_LIMIT,
    VALUE_SIZE,
    GrowingValue,
    exceeded_memory,
    measure,
    memory_size,
    nesting_error,
)
from oplog.expr_eval import (
    INTERRUPT_EVERY,
    Context,
    _Args,
    _eager,
    _eval,
    _lazy,
    _object_args,
    interrupt_point,
)
from oplog.expr_values import (
    INT32_MAX,
    INT32_MIN,
    MISSING,
    _is_integral,
    _null_if_missing,
    _to_int,
    compare,
    is_nullish,
    is_truthy,
    type_name,
)
from oplog.values import is_number

__all__ = [
    "merge_object_into",
]


@_eager("$size", nmin=1, nmax=1)
def _op_size(name: str, vals: list[Any], ctx: Context) -> Any:
    if not isinstance(vals[0], list):
        raise MongoError(17124, f"The argument to $size must be an array. Type of argument is: {type_name(vals[0])}")
    return len(vals[0])


@_eager("$arrayElemAt", nmin=2, nmax=2)
def _op_array_elem_at(name: str, vals: list[Any], ctx: Context) -> Any:
    array, index = vals
    if is_nullish(array) or is_nullish(index):
        return None
    if not isinstance(array, list):
        raise MongoError(28689, f"$arrayElemAt's first argument must be an array, but is {type_name(array)}")
    if not is_number(index):
        raise MongoError(28690, f"$arrayElemAt's second argument must be a numeric value, but is {type_name(index)}")
    if not _is_integral(index, INT32_MIN, INT32_MAX):
        raise MongoError(28691, f"$arrayElemAt's second argument must be representable as a 32-bit integer: {index}")
    i = _to_int(index)
    i = i + len(array) if i < 0 else i
    return array[i] if 0 <= i < len(array) else MISSING


@_eager("$first", "$last", nmin=1, nmax=1)
def _op_first_last(name: str, vals: list[Any], ctx: Context) -> Any:
    array = vals[0]
    if is_nullish(array):
        return None
    if not isinstance(array, list):
        raise MongoError(28689, f"{name}'s argument must be an array, but is {type_name(array)}")
    if not array:
        return MISSING
    return array[0] if name == "$first" else array[-1]


@_eager("$in", nmin=2, nmax=2)
def _op_in(name: str, vals: list[Any], ctx: Context) -> Any:
    needle, haystack = vals
    if not isinstance(haystack, list):
        raise MongoError(40081, f"$in requires an array as a second argument, found: {type_name(haystack)}")
    return any(compare(needle, item) == 0 for item in haystack)


@_eager("$concatArrays")
def _op_concat_arrays(name: str, vals: list[Any], ctx: Context) -> Any:
    for value in vals:
        if is_nullish(value):
            return None
        if not isinstance(value, list):
            raise MongoError(28664, f"$concatArrays only supports arrays, not {type_name(value)}")
    needed = VALUE_SIZE + VALUE_SIZE * sum(len(value) for value in vals)
    if needed >= MEMORY_LIMIT:
        raise exceeded_memory("$concatArrays", needed)
    out: list[Any] = []
    for value in vals:
        extend_in_steps(out, value)
    return out


def extend_in_steps(out: list[Any], items: Any) -> None:
    """`out.extend(items)`, `C_STEP` elements at a time (see `oplog.doc_limits.C_STEP`)."""
    for start in range(0, len(items), C_STEP):
        out.extend(items[start:start + C_STEP])
        interrupt_point()


@_eager("$isArray", nmin=1, nmax=1)
def _op_is_array(name: str, vals: list[Any], ctx: Context) -> Any:
    return isinstance(vals[0], list)


@_eager("$reverseArray", nmin=1, nmax=1)
def _op_reverse_array(name: str, vals: list[Any], ctx: Context) -> Any:
    if is_nullish(vals[0]):
        return None
    if not isinstance(vals[0], list):
        raise MongoError(34435, f"The argument to $reverseArray must be an array, but was of type: {type_name(vals[0])}")
    return vals[0][::-1]


def _int_arg(name: str, what: str, value: Any, code: int) -> int:
    if not _is_integral(value, INT32_MIN, INT32_MAX):
        raise MongoError(code, f"{name} requires {what} that can be represented as a 32-bit integer, found: {value!r}")
    return _to_int(value)


@_eager("$slice", nmin=2, nmax=3)
def _op_slice(name: str, vals: list[Any], ctx: Context) -> Any:
    if any(is_nullish(v) for v in vals):
        return None
    array = vals[0]
    if not isinstance(array, list):
        raise MongoError(28724, f"First argument to $slice must be an array, but is of type: {type_name(array)}")
    if len(vals) == 2:
        n = _int_arg(name, "a second argument", vals[1], 28725)
        return array[:n] if n >= 0 else array[max(0, len(array) + n) :]
    pos = _int_arg(name, "a second argument", vals[1], 28727)
    n = _int_arg(name, "a third argument", vals[2], 28728)
    if n <= 0:
        raise MongoError(28729, f"Third argument to $slice must be positive: {n}")
    start = pos if pos >= 0 else max(0, len(array) + pos)
    return array[start : start + n]


@_eager("$range", nmin=2, nmax=3)
def _op_range(name: str, vals: list[Any], ctx: Context) -> Any:
    start = _int_arg(name, "a starting value", vals[0], 34444)
    end = _int_arg(name, "an ending value", vals[1], 34446)
    step = _int_arg(name, "a step value", vals[2], 34448) if len(vals) > 2 else 1
    if step == 0:
        raise MongoError(34449, "$range requires a non-zero step value")
    # mongod's estimate (ExpressionRange): the vector, and one Value per step it may take.
    steps = abs(end - start) // abs(step) * (1 if (end - start) * step >= 0 else -1)
    needed = 24 + (steps + 1 if steps >= 0 else 0) * VALUE_SIZE
    if needed >= MEMORY_LIMIT:
        raise exceeded_memory("$range", needed)
    out: list[int] = []
    extend_in_steps(out, range(start, end, step))
    return out


@_eager("$indexOfArray", nmin=2, nmax=4)
def _op_index_of_array(name: str, vals: list[Any], ctx: Context) -> Any:
    array, needle = vals[0], vals[1]
    if is_nullish(array):
        return None
    if not isinstance(array, list):
        raise MongoError(40090, f"$indexOfArray requires an array as a first argument, found: {type_name(array)}")
    lo = _int_arg(name, "a starting index", vals[2], 40096) if len(vals) > 2 else 0
    hi = _int_arg(name, "an ending index", vals[3], 40096) if len(vals) > 3 else len(array)
    for i in range(max(lo, 0), min(hi, len(array))):
        if compare(array[i], needle) == 0:
            return i
    return -1


def _array_input(name: str, value: Any, code: int) -> list[Any] | None:
    if is_nullish(value):
        return None
    if not isinstance(value, list):
        raise MongoError(code, f"input to {name} must be an array not {type_name(value)}")
    return value


def _as_variable(name: str, spec: dict[str, Any]) -> str:
    var = spec.get("as", "this")
    if not isinstance(var, str) or not var:
        raise MongoError(16866, f"{name}: 'as' must be a non-empty variable name, found: {var!r}")
    return var


@_lazy("$map", args=_Args(("input", "as", "in"), ("input", "in"), (16879, 16880)))
def _op_map(name: str, raw: Any, ctx: Context) -> Any:
    spec = _object_args(name, raw)
    array = _array_input(name, _eval(spec["input"], ctx), 16883)
    if array is None:
        return None
    var = _as_variable(name, spec)
    out: list[Any] = []
    used = VALUE_SIZE
    for i, item in enumerate(array):
        value = _null_if_missing(_eval(spec["in"], ctx.bind(**{var: item})))
        used += _element_memory(name, value, MEMORY_LIMIT - used)
        out.append(value)
        if i % INTERRUPT_EVERY == 0:
            interrupt_point()
    return out


def _element_memory(name: str, value: Any, left: int) -> int:
    """The memory one more element takes, or ExceededMemoryLimit when `left` (of the operator's limit)
    does not hold it."""
    if isinstance(value, (dict, list)):
        found = measure(value, limit=left, memory=True)
        if found.depth > MAX_DEPTH:
            raise nesting_error()
        size = found.size
    else:
        size = memory_size(value)
    if size >= left:
        raise exceeded_memory(name)
    return size


@_lazy("$filter", args=_Args(("input", "as", "cond", "limit"), ("input", "cond"), (28647, 28648)))
def _op_filter(name: str, raw: Any, ctx: Context) -> Any:
    spec = _object_args(name, raw)
    array = _array_input(name, _eval(spec["input"], ctx), 28651)
    if array is None:
        return None
    limit = _eval(spec["limit"], ctx) if "limit" in spec else None
    if limit is not None and (not _is_integral(limit, 1, INT32_MAX)):
        raise MongoError(2, f"$filter: limit must be a positive integer, found: {limit!r}")
    var = _as_variable(name, spec)
    out = []
    for i, item in enumerate(array):
        if is_truthy(_eval(spec["cond"], ctx.bind(**{var: item}))):
            out.append(item)
        if i % INTERRUPT_EVERY == 0:
            interrupt_point()
    return out if limit is None else out[: _to_int(limit)]


@_lazy("$reduce", args=_Args(("input", "initialValue", "in"), ("input", "initialValue", "in"), (40076, 40077)))
def _op_reduce(name: str, raw: Any, ctx: Context) -> Any:
    spec = _object_args(name, raw)
    array = _eval(spec["input"], ctx)
    if is_nullish(array):
        return None
    if not isinstance(array, list):
        raise MongoError(40080, f"$reduce requires that 'input' be an array, found: {type_name(array)}")
    acc = _eval(spec["initialValue"], ctx)
    memory = GrowingValue(name)
    for i, item in enumerate(array):
        acc = _eval(spec["in"], ctx.bind(this=item, value=acc))
        memory.check(acc)
        if i % INTERRUPT_EVERY == 0:
            interrupt_point()
    return acc


@_eager("$mergeObjects")
def _op_merge_objects(name: str, vals: list[Any], ctx: Context) -> Any:
    out: dict[str, Any] = {}
    for value in vals:
        merge_object_into(out, value)
    return out


def merge_object_into(out: dict[str, Any], value: Any) -> None:
    """One $mergeObjects step (also the accumulator's): nullish inputs are skipped."""
    if is_nullish(value):
        return
    if not isinstance(value, dict):
        raise MongoError(40400, f"$mergeObjects requires object inputs, but input {value!r} is of type {type_name(value)}")
    out.update(value)


@_eager("$objectToArray", nmin=1, nmax=1)
def _op_object_to_array(name: str, vals: list[Any], ctx: Context) -> Any:
    value = vals[0]
    if is_nullish(value):
        return None
    if not isinstance(value, dict):
        raise MongoError(40390, f"$objectToArray requires a document input, found: {type_name(value)}")
    return [{"k": k, "v": v} for k, v in value.items()]


@_eager("$arrayToObject", nmin=1, nmax=1)
def _op_array_to_object(name: str, vals: list[Any], ctx: Context) -> Any:
    array = vals[0]
    if is_nullish(array):
        return None
    if not isinstance(array, list):
        raise MongoError(40386, f"$arrayToObject requires an array input, found: {type_name(array)}")
    out: dict[str, Any] = {}
    for item in array:
        key, value = _key_value_pair(item)
        out[key] = value
    return out


def _key_value_pair(item: Any) -> tuple[str, Any]:
    if isinstance(item, list):
        if len(item) != 2:
            raise MongoError(40397, f"$arrayToObject requires an array of size 2 arrays,found array of size: {len(item)}")
        key, value = item
    elif isinstance(item, dict):
        if set(item) != {"k", "v"}:
            raise MongoError(40392, f"$arrayToObject requires an object keys of 'k' and 'v'. Found incorrect number of keys:{len(item)}")
        key, value = item["k"], item["v"]
    else:
        raise MongoError(40398, f"Unrecognised input type format for $arrayToObject: {type_name(item)}")
    if not isinstance(key, str):
        raise MongoError(40395, f"$arrayToObject requires an array of key-value pairs, where the key must be of type string. Found key type: {type_name(key)}")
    return key, value
