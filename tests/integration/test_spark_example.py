"""examples/spark_pipeline.py at a small size: it starts its own set, loads, aggregates, writes the totals
into a collection and reads them back with motor, and says ok only when every count matches."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytest.importorskip("pyspark")

EXAMPLE = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "spark_pipeline.py")


def test_the_spark_pipeline_example_runs_end_to_end() -> None:
    done = subprocess.run([sys.executable, EXAMPLE, "--events", "20000"], capture_output=True, text=True,
                          timeout=600, env={**os.environ, "SPARK_LOCAL_IP": "127.0.0.1"})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    last = done.stdout.strip().splitlines()[-1]
    assert last.startswith("ok: 20,000 rows loaded, 20,000 counted in 1,000 totals"), last
