"""A short run of the wire fuzzer (`make fuzz` sends 100,000 messages; this sends 4,000).

The member must not crash, hang, send a malformed reply, close a connection after a
framed message or log a traceback outside a command handler. Tracebacks that the
dispatcher logged for a failing command handler (the client saw an "internal error"
reply) are reported as a warning with their reproducers rather than failing the run.
"""

from __future__ import annotations

import re
import subprocess
import sys
import warnings

from tests.support.members import REPO_ROOT


def test_quick_wire_fuzz_finds_no_crash_hang_or_wire_traceback() -> None:
    run = subprocess.run([sys.executable, "-m", "tests.fuzz", "--count", "4000", "--seed", "7",
                          "--chunk", "1000", "--allow-handler-errors"],
                         cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    out = run.stdout + run.stderr
    assert run.returncode == 0, out[-6000:]
    sent = int(re.search(r"^messages sent\s+([\d,]+)", out, re.M).group(1).replace(",", ""))
    assert sent == 4000, out
    for counter in ("unexpected closes", "bad replies", "hangs", "crashes", "health failures"):
        assert re.search(rf"^{counter}\s+0$", out, re.M), (counter, out)
    handler = int(re.search(r"^tracebacks\s+\d+ \((\d+) from command handlers", out, re.M).group(1))
    if handler:
        section = out.split("handler internal errors", 1)[-1]
        warnings.warn(f"{handler} command-handler tracebacks during the quick fuzz run:{section[:4000]}",
                      stacklevel=1)
