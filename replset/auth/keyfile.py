"""The keyfile members prove themselves with (`--keyFile`), read as mongod reads it: whitespace is
stripped; what is left must be 6 to 1024 characters of the base64 alphabet; a file that group or
others may read is refused. Its contents are the password of the internal user `__system@local`."""

from __future__ import annotations

import base64
import os
import re
import secrets
import stat

_BASE64 = re.compile(r"[A-Za-z0-9+/=]*")


class KeyFileError(Exception):
    pass


def read_keyfile(path: str) -> str:
    try:
        mode = os.stat(path).st_mode
        with open(path, encoding="ascii", errors="replace") as f:
            raw = f.read()
    except OSError as err:
        raise KeyFileError(f"error getting file {path}: {err.strerror}") from None
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise KeyFileError(f"permissions on {path} are too open")
    key = "".join(raw.split())
    if not 6 <= len(key) <= 1024:
        raise KeyFileError(f"security key in {path} must be between 6 and 1024 characters, not {len(key)}")
    if not _BASE64.fullmatch(key):
        raise KeyFileError(f"invalid char in key file {path}: only base64 characters are allowed")
    return key


def write_keyfile(path: str) -> None:
    """A new random key (756 base64 characters, as `openssl rand -base64 756` gives), mode 0600."""
    key = base64.b64encode(secrets.token_bytes(567)).decode()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(key + "\n")
