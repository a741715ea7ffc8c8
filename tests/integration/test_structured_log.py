"""`--logFormat json`: MongoDB-style structured log lines on the member's output, and `getLog` (what
mongosh's `show log` reads) returning the recent ones."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pymongo.errors import OperationFailure

from tests.support.members import Member, wait_for
from tests.support.node_tools import mongosh
from tests.support.replica_set import ReplicaSet

FIELDS = {"t", "s", "c", "id", "ctx", "msg", "attr"}


def test_json_log_lines_and_get_log(tmp_path: Path) -> None:
    member = Member(dbpath=str(tmp_path / "m"), extra_args=["--logFormat", "json"])
    rs = ReplicaSet([member])
    rs.start()
    try:
        rs.initiate()
        wait_for(lambda: "became primary" in member.read_log(), 30, "the election to be logged")
        lines = [json.loads(line) for line in member.read_log().splitlines() if line.strip()]
        assert all(set(line) == FIELDS for line in lines), lines[:3]
        elected = next(line for line in lines if line["msg"].startswith("became primary"))
        assert elected["s"] == "I" and elected["c"] == "REPL" and elected["attr"] == {"args": [1]}
        assert elected["t"]["$date"].endswith("+00:00") and isinstance(elected["id"], int)
        with rs.direct(member) as client:
            assert client.admin.command("getLog", "*")["names"] == ["global", "startupWarnings"]
            recent = client.admin.command("getLog", "global")
            assert recent["totalLinesWritten"] >= len(recent["log"]) > 0
            assert any(json.loads(line)["msg"].startswith("became primary") for line in recent["log"])
            with pytest.raises(OperationFailure) as unknown:
                client.admin.command("getLog", "nothing")
            assert unknown.value.code == 2
        shown = mongosh(f"mongodb://{member.host}/?directConnection=true", "show log global")
        assert shown.returncode == 0, shown.stderr
        assert "became primary" in shown.stdout
    finally:
        rs.stop()
