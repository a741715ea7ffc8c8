"""Helpers for tests of parts tables on real members: what a member's disk holds, and reading rows."""

from __future__ import annotations

import os
from typing import Any

from tests.support.members import Member
from tests.support.replica_set import ReplicaSet


def part_dirs(member: Member, ns: str) -> list[str]:
    """The published part directories of table `ns` on the member's disk (temporary ones left out)."""
    directory = os.path.join(member.dbpath, "parts", ns)
    return sorted(d for d in os.listdir(directory) if not d.startswith("tmp")) if os.path.isdir(directory) else []


def select(rs: ReplicaSet, member: Member, db: str, table: str = "events", **args: Any) -> list[dict[str, Any]]:
    """`selectParts` on that member, every batch."""
    return list(rs.direct(member)[db].cursor_command("selectParts", table, **args))
