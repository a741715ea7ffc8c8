"""A part to fetch or make meets a directory of its name left outside the active set (fetched for another
task, or left by a rolled-back history): the same bytes are kept, other bytes are set aside, never used."""

from __future__ import annotations

import datetime
import os
import pathlib
from types import SimpleNamespace

import pyarrow as pa

from base.clock import ManualClock
from oplog.parts import part_files as pf
from oplog.parts.part_info import PartInfo
from oplog.parts.table import parse_table_def
from replset.parts.manager import PartsManager

TABLE = parse_table_def("db", "t", {"columns": [{"name": "ts", "type": "timestamp[ms]"},
                                                {"name": "n", "type": "int64"}], "orderBy": ["n"]})
PART = PartInfo.parse("all_1_2_1")
CLOCK = ManualClock()


def _part(directory: pathlib.Path, name: str, values: list[int]) -> pf.PartFiles:
    data = pa.table({"ts": pa.array([datetime.datetime(2024, 1, 1)] * len(values), pa.timestamp("ms")),
                     "n": pa.array(values, pa.int64())})
    return pf.write_part(str(directory), name, pf.conform(TABLE, data), TABLE)


def test_a_directory_with_the_bytes_wanted_is_kept_and_other_bytes_set_aside(tmp_path: pathlib.Path) -> None:
    rt = SimpleNamespace(directory=str(tmp_path), table=TABLE, queue=SimpleNamespace(current=set()))
    same = _part(tmp_path, PART.name, [1, 2])
    assert PartsManager._claim_name(rt, PART, same.checksums, clock=CLOCK) == same.checksums   # type: ignore[arg-type]
    assert os.listdir(tmp_path) == [PART.name]
    os.rename(tmp_path / PART.name, tmp_path / "tmp_keep")
    _part(tmp_path, PART.name, [1, 2, 3])
    assert PartsManager._claim_name(rt, PART, same.checksums, clock=CLOCK) is None   # type: ignore[arg-type]
    assert sorted(n.split("_1_2_1_")[0] for n in os.listdir(tmp_path)) == ["tmp_keep", "unexpected_all"]
    assert PartsManager._claim_name(rt, PartInfo.parse("all_5_5_0"), same.checksums, clock=CLOCK) is None  # type: ignore[arg-type]
