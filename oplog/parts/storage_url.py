"""Where a set keeps the part files of its zero-copy tables (a storage URL, docs/zero-copy.md), and the key
of a part there.

    file:///shared/dir                                  a directory every member reaches (one host, NFS)
    s3://bucket/prefix?endpoint=http://host:port&region=r  any S3-compatible store; credentials from the
                                                        usual AWS environment variables

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
from urllib.parse import parse_qs, urlsplit

from base.errors import MongoError

BAD_VALUE = 2
_PART_NAME = re.compile(r"^[A-Za-z0-9_.-]+$")
_UUID = re.compile(r"^[0-9a-f-]{32,36}$")
_S3_OPTIONS = frozenset({"endpoint", "region"})


@dataclass(frozen=True, slots=True)
class StorageLocation:
    scheme: str              # "file" or "s3"
    root: str                # file: an absolute directory; s3: "bucket" or "bucket/prefix"
    endpoint: str | None = None   # s3: "host:port" of an S3-compatible server (None: AWS)
    endpoint_scheme: str = "https"
    region: str | None = None

    @property
    def url(self) -> str:
        """The location as it is shown (no credentials are ever part of it)."""
        if self.scheme == "file":
            return f"file://{self.root}"
        query = []
        if self.endpoint is not None:
            query.append(f"endpoint={self.endpoint_scheme}://{self.endpoint}")
        if self.region is not None:
            query.append(f"region={self.region}")
        return f"s3://{self.root}" + ("?" + "&".join(query) if query else "")


def parse_storage_url(url: str) -> StorageLocation:
    """A storage URL (as above); BadValue (2) for anything else, saying why."""
    parts = urlsplit(url)
    if parts.scheme == "file":
        if parts.netloc not in ("", "localhost") or not parts.path.startswith("/") or parts.query:
            raise MongoError(BAD_VALUE, f"partsStorage {url!r}: a file URL names an absolute directory "
                                        "(file:///path)")
        root = parts.path.rstrip("/") or "/"
        if any(segment == ".." for segment in root.split("/")):
            raise MongoError(BAD_VALUE, f"partsStorage {url!r}: '..' is not allowed in the path")
        return StorageLocation("file", root)
    if parts.scheme == "s3":
        bucket = parts.netloc
        if not bucket or "@" in bucket or ":" in bucket:
            raise MongoError(BAD_VALUE, f"partsStorage {url!r}: an S3 URL names a bucket (s3://bucket/prefix); "
                                        "credentials come from the AWS environment variables, never the URL")
        query = parse_qs(parts.query, keep_blank_values=True, strict_parsing=False)
        unknown = set(query) - _S3_OPTIONS
        if unknown:
            raise MongoError(BAD_VALUE, f"partsStorage {url!r}: unknown option(s) {', '.join(sorted(unknown))} "
                                        f"(known: {', '.join(sorted(_S3_OPTIONS))})")
        endpoint, endpoint_scheme = None, "https"
        if "endpoint" in query:
            target = urlsplit(query["endpoint"][-1])
            if target.scheme not in ("http", "https") or not target.netloc or target.path not in ("", "/"):
                raise MongoError(BAD_VALUE, f"partsStorage {url!r}: endpoint is http(s)://host:port")
            endpoint, endpoint_scheme = target.netloc, target.scheme
        region = query["region"][-1] if "region" in query and query["region"][-1] else None
        prefix = parts.path.strip("/")
        if any(segment in ("", ".", "..") for segment in prefix.split("/")) and prefix:
            raise MongoError(BAD_VALUE, f"partsStorage {url!r}: the prefix has an empty, '.' or '..' segment")
        return StorageLocation("s3", f"{bucket}/{prefix}" if prefix else bucket, endpoint, endpoint_scheme, region)
    raise MongoError(BAD_VALUE, f"partsStorage {url!r}: the scheme is file:// or s3://")


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
