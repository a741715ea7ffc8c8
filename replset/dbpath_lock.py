"""One process per data directory: an exclusive lock on `<dbpath>/mongod.lock`, as mongod's.

The lock is an OS lock (`flock`), taken before the store is opened and held for the life of the
process: the kernel lets it go when the process ends however it ends (a `kill -9` leaves no stale
lock behind), so a second process on the same directory fails at once while the first lives, and a
restart after a crash starts. The file holds the holder's pid, for the message the second one
prints; a clean shutdown empties it, as mongod does.
"""

from __future__ import annotations

import fcntl
import os

LOCK_FILE = "mongod.lock"
EXIT_DBPATH_IN_USE = 100  # the process's exit code when another one holds the directory


class DBPathInUse(Exception):
    """Another process holds the data directory (mongod's DBPathInUse, code 98)."""

    code = 98


def lock_dbpath(dbpath: str) -> int:
    """Locks `dbpath` for this process; returns the lock file's descriptor (keep it open)."""
    os.makedirs(dbpath, exist_ok=True)
    path = os.path.join(dbpath, LOCK_FILE)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
        os.close(fd)
        raise DBPathInUse(f"Unable to lock the lock file: {path} (Resource temporarily unavailable). "
                          f"Another replset process (pid {holder}) is already running in the {dbpath} "
                          "directory") from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    os.fsync(fd)
    return fd


def unlock_dbpath(fd: int) -> None:
    """At a clean shutdown: empties the lock file and lets the lock go."""
    os.ftruncate(fd, 0)
    os.close(fd)
