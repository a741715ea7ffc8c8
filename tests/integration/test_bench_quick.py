"""`python -m bench.replset --quick` runs end to end: the steady-state benchmark does not rot.

No timing is asserted (speed is printed by `make bench`, not judged by `make test`); the test
checks that every figure was measured at "empty" and at "full" with no failed write, that the
prefill reached the collection and the capped oplog, that the Python peer (pysyncobj) was measured
beside it, and that the targets block is printed.
"""

from __future__ import annotations

import re
import subprocess
import sys

from tests.support.members import REPO_ROOT

FIGURES = ("pymongo w:1 c1", "pymongo majority c1", "raw w:1 c64", "raw majority c64")


def test_quick_benchmark_measures_empty_and_full_and_prints_targets() -> None:
    run = subprocess.run([sys.executable, "-m", "bench.replset", "--quick"], cwd=REPO_ROOT,
                         capture_output=True, text=True, timeout=300)
    out = run.stdout
    assert run.returncode == 0, out[-3000:] + run.stderr[-3000:]
    assert "errors" not in out, out
    empty, full = out.split("-- empty:", 1)[1].split("-- full:", 1)
    for figure in FIGURES:
        assert figure in empty and figure in full, (figure, out)
        assert re.search(rf"^{re.escape(figure)} rate/s\s+[\d.]+\s+[\d.]+\s+[\d.]+$", out, re.M), out
    # The full phase runs on the prefilled collection through a capped oplog that is full.
    docs = int(re.search(r"-- full: collection ([\d,]+) documents", out).group(1).replace(",", ""))
    assert docs >= 20_000
    used, cap = map(float, re.search(r"-- full: .*oplog [\d,]+ entries, ([\d.]+) of ([\d.]+) MB", out).groups())
    assert used >= 0.8 * cap
    assert re.search(r"pysyncobj \(3 nodes\): sync commit \d+/s p50 [\d.]+ ms; 1000 outstanding \d+/s", out), out
    targets = out.split("targets (full data):", 1)[1]
    assert len(re.findall(r"\b(met|NOT met)$", targets, re.M)) == 5, targets
