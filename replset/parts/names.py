"""Where a parts table lives: its definition, its replicated state collections, its parts on disk."""

from __future__ import annotations

import os

PART_LOG = "system.parts"   # <db>.system.parts: the definitions; <db>.system.parts.<table>.*: the state


def tables_ns(db: str) -> str:
    return f"{db}.{PART_LOG}"


def state_ns(db: str, table: str, what: str) -> str:
    """One of a table's replicated state collections (`log`, `counters`, ...)."""
    return f"{db}.{PART_LOG}.{table}.{what}"


def table_dir(dbpath: str, ns: str) -> str:
    """`<dbpath>/parts/<db>.<table>`: the table's part directories."""
    return os.path.join(dbpath, "parts", ns)
