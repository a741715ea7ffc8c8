"""Making files and directories durable: fsync a path (a file, or a directory after a rename or a
new entry in it, so the entry itself survives a crash)."""

from __future__ import annotations

import os


def fsync_path(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
