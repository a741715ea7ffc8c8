"""Where a set keeps the part files of its zero-copy tables (a storage URL, docs/zero-copy.md), and the key
of a part there.

    file:///shared/dir                                  a directory every member reaches (one host, NFS)
    s3://bucket/prefix?endpoint=http://host:port&region=r  any S3-compatible store; credentials from the
                                                        usual AWS environment variables

A URL is shown (a reply, a log line, an error) only through `redact_url`: a password or key in it
(userinfo anywhere, a secret-like query parameter) becomes `***`. The URL itself is handed only to the
storage client (`oplog.parts.shared_storage`) and kept in a zero-copy part's directory.

A part's objects live under a key that is its identity: the table's uuid, its partition and a checksum of
its content (of its files' names, sizes and SHA-256s). Two members that write the same part write the same
bytes under the same key; other bytes get another key, so no object is ever overwritten with other content.

Pure: parsing and naming only (the objects themselves: `oplog.parts.shared_storage`).
"""

from __future__ import annotations

__layer__ = "core"  # pure: no I/O, clock or randomness (tests/unit/test_layering.py)

import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import parse_qs, parse_qsl, quote, urlsplit, urlunsplit

from base.errors import MongoError

BAD_VALUE = 2
_PART_NAME = re.compile(r"^[A-Za-z0-9_.-]+$")
_UUID = re.compile(r"^[0-9a-f-]{32,36}$")
_S3_OPTIONS = frozenset({"endpoint", "region"})
REDACTED = "***"
_SECRET_NAME = re.compile(r"secret|key|token|passw|pwd|credential|signature|auth|session", re.IGNORECASE)
_SHOWN_SAFE = ":/@*,+"   # kept as they are in a rebuilt query: an endpoint reads as a URL


def redact_url(url: str) -> str:
    """`url` as it may be shown: userinfo (`user:password@`) in it or in a URL among its query's values,
    and the value of every query parameter named like a secret (key, token, password...), become `***`.
    A URL with nothing to hide is returned as it is; one that does not parse is not shown at all."""
    try:
        parts = urlsplit(url)
        pairs = parse_qsl(parts.query, keep_blank_values=True)
    except ValueError:
        return REDACTED
    netloc = f"{REDACTED}@{parts.netloc.rpartition('@')[2]}" if "@" in parts.netloc else parts.netloc
    shown = [(name, REDACTED if _SECRET_NAME.search(name) else _redact_value(value)) for name, value in pairs]
    if netloc == parts.netloc and shown == pairs:
        return url
    query = "&".join(f"{quote(name, safe=_SHOWN_SAFE)}={quote(value, safe=_SHOWN_SAFE)}" for name, value in shown)
    return urlunsplit(parts._replace(netloc=netloc, query=query))


def _redact_value(value: str) -> str:
    if "://" in value:
        return redact_url(value)
    return f"{REDACTED}@{value.rpartition('@')[2]}" if "@" in value else value


def _bad(url: str, why: str) -> MongoError:
    return MongoError(BAD_VALUE, f"partsStorage {redact_url(url)!r}: {why}")


@dataclass(frozen=True, slots=True)
class StorageLocation:
    scheme: str              # "file" or "s3"
    root: str                # file: an absolute directory; s3: "bucket" or "bucket/prefix"
    endpoint: str | None = None   # s3: "host:port" of an S3-compatible server (None: AWS)
    endpoint_scheme: str = "https"
    region: str | None = None

    @property
    def url(self) -> str:
        """The location as it is shown (`redact_url`: an endpoint's userinfo is not shown)."""
        if self.scheme == "file":
            return f"file://{self.root}"
        query = []
        if self.endpoint is not None:
            query.append(f"endpoint={self.endpoint_scheme}://{self.endpoint}")
        if self.region is not None:
            query.append(f"region={self.region}")
        return redact_url(f"s3://{self.root}" + ("?" + "&".join(query) if query else ""))

    def hide(self, text: str) -> str:
        """`text` (a storage client's error message) without the endpoint's userinfo, should it quote it."""
        if self.endpoint is None or "@" not in self.endpoint:
            return text
        userinfo = self.endpoint.rpartition("@")[0]
        for secret in (userinfo, userinfo.partition(":")[2]):
            text = text.replace(secret, REDACTED) if secret else text
        return text


def parse_storage_url(url: str) -> StorageLocation:
    """A storage URL (as above); BadValue (2) for anything else, saying why (the URL shown redacted)."""
    try:
        parts = urlsplit(url)
    except ValueError as exc:   # an unclosed IPv6 bracket, a bad port
        raise _bad(url, f"not a URL ({exc})") from None
    if parts.scheme == "file":
        if parts.netloc not in ("", "localhost") or not parts.path.startswith("/") or parts.query:
            raise _bad(url, "a file URL names an absolute directory (file:///path)")
        root = parts.path.rstrip("/") or "/"
        if any(segment == ".." for segment in root.split("/")):
            raise _bad(url, "'..' is not allowed in the path")
        return StorageLocation("file", root)
    if parts.scheme == "s3":
        return _parse_s3(url, parts.netloc, parts.path, parts.query)
    raise _bad(url, "the scheme is file:// or s3://")


def _parse_s3(url: str, bucket: str, path: str, raw_query: str) -> StorageLocation:
    if not bucket or "@" in bucket or ":" in bucket:
        raise _bad(url, "an S3 URL names a bucket (s3://bucket/prefix); credentials come from the AWS "
                        "environment variables, never the URL")
    query = parse_qs(raw_query, keep_blank_values=True, strict_parsing=False)
    unknown = set(query) - _S3_OPTIONS
    if unknown:
        raise _bad(url, f"unknown option(s) {', '.join(sorted(unknown))} (known: {', '.join(sorted(_S3_OPTIONS))})")
    endpoint, endpoint_scheme = None, "https"
    if "endpoint" in query:
        try:
            target = urlsplit(query["endpoint"][-1])
        except ValueError:
            target = urlsplit("")
        if target.scheme not in ("http", "https") or not target.netloc or target.path not in ("", "/"):
            raise _bad(url, "endpoint is http(s)://host:port")
        endpoint, endpoint_scheme = target.netloc, target.scheme
    region = query["region"][-1] if "region" in query and query["region"][-1] else None
    prefix = path.strip("/")
    if any(segment in ("", ".", "..") for segment in prefix.split("/")) and prefix:
        raise _bad(url, "the prefix has an empty, '.' or '..' segment")
    return StorageLocation("s3", f"{bucket}/{prefix}" if prefix else bucket, endpoint, endpoint_scheme, region)


def content_checksum(checksums: Mapping[str, tuple[int, str]]) -> str:
    """A part's content in 32 hex digits: the SHA-256 of its files' names, sizes and SHA-256s."""
    text = "".join(f"{name}\t{size}\t{digest}\n" for name, (size, digest) in sorted(checksums.items()))
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def part_key(table_uuid: str, partition_id: str, checksums: Mapping[str, tuple[int, str]]) -> str:
    """Where a part's objects are, relative to the storage's root: `<table uuid>/<partition>_<content>`. A
    part's name is not in it: an insert's part is named at its commit, and its bytes must be stored before
    that; parts of a partition with the same bytes share their objects."""
    if not _UUID.match(table_uuid):
        raise MongoError(BAD_VALUE, f"not a table uuid: {table_uuid!r}")
    if not _PART_NAME.match(partition_id) or partition_id.startswith("."):
        raise MongoError(BAD_VALUE, f"not a partition id: {partition_id!r}")
    if not checksums:
        raise MongoError(BAD_VALUE, "a part without files has no key")
    return f"{table_uuid}/{partition_id}_{content_checksum(checksums)}"
