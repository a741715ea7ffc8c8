"""Where to cut a collection into ranges of `_id` of about the same number of documents: the
`splitVector` command's choice (the ranges a Spark job reads in parallel).

Pure: values in, values out."""

from __future__ import annotations

__layer__ = "core"  # pure: no I/O, clock or randomness (tests/unit/test_layering.py)

import functools
from collections.abc import Iterable
from typing import Any

from oplog.values import compare_values


def split_points(ids: Iterable[Any], per_chunk: int) -> list[Any]:
    """The `_id`s that start each range after the first, every `per_chunk` documents in `_id` order
    (MongoDB's order of values); none when the collection fits in one range."""
    if per_chunk <= 0:
        raise ValueError("per_chunk must be positive")
    ordered = sorted(ids, key=functools.cmp_to_key(compare_values))
    return ordered[per_chunk::per_chunk]
