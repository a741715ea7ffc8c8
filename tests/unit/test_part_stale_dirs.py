"""A merge's result meets a directory of the same name left outside the active set (a rollback set aside
the part that covered it): the same bytes are replaced, other bytes are set aside, never published over."""

from __future__ import annotations

import datetime
import os
import pathlib
from types import SimpleNamespace

import pyarrow as pa

from oplog.parts import part_files as pf
from oplog.parts.table import parse_table_def
from replset.parts.manager import PartsManager

TABLE = parse_table_def("db", "t", {"columns": [{"name": "ts", "type": "timestamp[ms]"},
                                                {"name": "n", "type": "int64"}], "orderBy": ["n"]})


def _part(directory: pathlib.Path, name: str, values: list[int]) -> pf.PartFiles:
    data = pa.table({"ts": pa.array([datetime.datetime(2024, 1, 1)] * len(values), pa.timestamp("ms")),
                     "n": pa.array(values, pa.int64())})
    return pf.write_part(str(directory), name, pf.conform(TABLE, data), TABLE)


def test_a_stale_directory_with_the_same_bytes_is_replaced_and_other_bytes_set_aside(tmp_path: pathlib.Path) -> None:
    rt = SimpleNamespace(directory=str(tmp_path), table=TABLE)
    same = _part(tmp_path, "all_1_2_1", [1, 2])
    PartsManager._replace_stale(rt, "all_1_2_1", same.checksums)   # type: ignore[arg-type]
    assert os.listdir(tmp_path) == []
    _part(tmp_path, "all_1_2_1", [1, 2, 3])
    PartsManager._replace_stale(rt, "all_1_2_1", same.checksums)   # type: ignore[arg-type]
    (aside,) = os.listdir(tmp_path)
    assert aside.startswith("unexpected_all_1_2_1_")
    PartsManager._replace_stale(rt, "all_5_5_0", same.checksums)   # type: ignore[arg-type]   # nothing there
