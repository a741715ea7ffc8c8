"""The objects of zero-copy parts in shared storage (docs/zero-copy.md): written, verified, published,
read and deleted. A shell: file and network I/O (the names and keys: `oplog.parts.storage_url`).

A part is the files of a local part under its key (`storage_url.part_key`):

    <root>/<table uuid>/<partition>_<content checksum>/data.parquet, columns.txt, checksums.txt

Written `tmp` -> verified -> published: every file but `checksums.txt` is written, then read back and
checked against the part's checksums, and `checksums.txt` is written last. A part is published exactly
when its `checksums.txt` is there; a reader checks every byte it uses against it (and against what the part
log recorded). Writing a part that is already published with the same checksums does nothing (two members
moving the same part write the same bytes under the same key); a published part with other checksums under
that key is refused, never overwritten. Deleting takes `checksums.txt` away first (the part stops being
published), then the rest.

`file://`: plain files; each written under a temporary name, fsynced and renamed (a crash leaves no
half-written file under a part's name), the directory fsynced. `s3://`: pyarrow's S3 filesystem, so an
object appears whole or not at all; credentials come from the AWS environment variables.

Whether a part's objects may be deleted is not decided here: only the primary deletes, once no member
holds a mark on the part and the entry that removed the last mark is majority-committed (see
docs/zero-copy.md).
"""

from __future__ import annotations

import hashlib
import os
import threading
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.fs as pafs

from base.errors import MongoError
from oplog.durable_files import fsync_path
from oplog.parts import part_files
from oplog.parts.storage_url import StorageLocation, parse_storage_url

CHUNK = 4 << 20
PROBE_PREFIX = ".probe-"
STORAGE_ERROR = 6   # HostUnreachable: the storage did not answer, or refused


def _not_found(exc: OSError) -> bool:
    """pyarrow's S3 filesystem says "no such object" in an OSError's message."""
    text = str(exc)
    return "NoSuchKey" in text or "does not exist" in text or "Path does not exist" in text


class StorageUnavailable(MongoError):
    def __init__(self, location: StorageLocation, what: str, exc: BaseException) -> None:
        super().__init__(STORAGE_ERROR, f"parts storage {location.url}: {what} failed: {location.hide(str(exc))}")


@dataclass(frozen=True, slots=True)
class StoredPart:
    key: str
    checksums: dict[str, tuple[int, str]]


_OPENED: dict[str, SharedStorage] = {}
_OPENED_LOCK = threading.Lock()


def for_url(url: str) -> SharedStorage:
    """The storage at `url`, opened once per process (a zero-copy part's directory names it by URL)."""
    with _OPENED_LOCK:
        storage = _OPENED.get(url)
        if storage is None:
            storage = _OPENED[url] = SharedStorage.open(url)
        return storage


class SharedStorage:
    def __init__(self, location: StorageLocation) -> None:
        self.location = location
        if location.scheme == "file":
            self._fs: pafs.FileSystem = pafs.LocalFileSystem()
            self._root = location.root
        else:
            options: dict[str, object] = {}
            if location.endpoint is not None:
                options.update(endpoint_override=location.endpoint, scheme=location.endpoint_scheme)
            if location.region is not None:
                options["region"] = location.region
            self._fs = pafs.S3FileSystem(**options)
            self._root = location.root

    @classmethod
    def open(cls, url: str) -> SharedStorage:
        return cls(parse_storage_url(url))

    @property
    def local(self) -> bool:
        return self.location.scheme == "file"

    def _path(self, key: str, file: str | None = None) -> str:
        path = f"{self._root}/{key}"
        return path if file is None else f"{path}/{part_files.check_file_name(file)}"

    # -- writing ----------------------------------------------------------------------------------

    def put_part(self, key: str, part_dir: str) -> StoredPart:
        """Copies the local part in `part_dir` to `key`, verifies the copy and publishes it. Refused
        (BadValue) if `key` holds a published part with other checksums.

        A key already published with these checksums is written again only in its `checksums.txt`: that
        makes it young again (the primary deletes only objects older than the grace, and this write is
        about to be marked), and every file is then checked to be there - a deletion that ran meanwhile
        means the whole part is written again."""
        with open(os.path.join(part_dir, part_files.CHECKSUMS_FILE), encoding="utf-8") as f:
            text = f.read()
        checksums = part_files.parse_checksums(text)
        existing = self.published(key)
        if existing is not None and existing.checksums != checksums:
            raise MongoError(2, f"parts storage {self.location.url}: {key} holds another part's bytes")
        try:
            if existing is not None:
                self._write_bytes(self._path(key, part_files.CHECKSUMS_FILE), text.encode())
                if self._whole(key, checksums):
                    return existing
            for file in checksums:
                self._write_from(self._path(key, file), os.path.join(part_dir, file))
            for file, sums in checksums.items():
                if self._digest(self._path(key, file)) != sums:
                    raise MongoError(2, f"parts storage {self.location.url}: {key}/{file} does not read back "
                                        "as written")
            self._write_bytes(self._path(key, part_files.CHECKSUMS_FILE), text.encode())
            if not self._whole(key, checksums):
                raise MongoError(2, f"parts storage {self.location.url}: {key} was deleted while it was written")
        except OSError as exc:
            raise StorageUnavailable(self.location, f"writing {key}", exc) from None
        return StoredPart(key, checksums)

    def _whole(self, key: str, checksums: Mapping[str, tuple[int, str]]) -> bool:
        """Every file of the part is there with its size, and so is its `checksums.txt`."""
        for file in (*checksums, part_files.CHECKSUMS_FILE):
            info = self._fs.get_file_info(self._path(key, file))
            if info.type != pafs.FileType.File or (file in checksums and info.size != checksums[file][0]):
                return False
        return True

    def written_ms(self, key: str) -> int | None:
        """When the newest of the key's objects was written (Unix ms); None when it has none."""
        selector = pafs.FileSelector(self._path(key), allow_not_found=True, recursive=True)
        times = [int(info.mtime_ns // 1_000_000) for info in self._fs.get_file_info(selector)
                 if info.type == pafs.FileType.File and info.mtime_ns is not None]
        return max(times) if times else None

    def _write_from(self, path: str, source: str) -> None:
        with open(source, "rb") as f:
            self._write_chunks(path, iter(lambda: f.read(CHUNK), b""))

    def _write_bytes(self, path: str, data: bytes) -> None:
        self._write_chunks(path, iter((data,)))

    def _write_chunks(self, path: str, chunks: Iterator[bytes]) -> None:
        if self.local:
            directory = os.path.dirname(path)
            if not os.path.isdir(directory):   # the key's directory, and the table's: durable before a file
                os.makedirs(directory, exist_ok=True)   # names them (a member's storage.txt may point here)
                fsync_path(os.path.dirname(directory))
                fsync_path(os.path.dirname(os.path.dirname(directory)))
            tmp = os.path.join(directory, f".tmp-{uuid.uuid4().hex}")
            try:
                with open(tmp, "wb") as out:
                    for chunk in chunks:
                        out.write(chunk)
                    out.flush()
                    os.fsync(out.fileno())
                os.replace(tmp, path)
            finally:
                if os.path.exists(tmp):
                    os.unlink(tmp)
            fsync_path(directory)
            return
        with self._fs.open_output_stream(path) as out:   # one object, visible whole when closed
            for chunk in chunks:
                out.write(chunk)

    # -- reading ----------------------------------------------------------------------------------

    def published(self, key: str) -> StoredPart | None:
        """The part published under `key` (its checksums), None when there is none."""
        try:
            with self._fs.open_input_stream(self._path(key, part_files.CHECKSUMS_FILE)) as f:
                text = f.read().decode("utf-8", "replace")
        except OSError as exc:
            if isinstance(exc, FileNotFoundError) or _not_found(exc):
                return None
            raise StorageUnavailable(self.location, f"reading {key}", exc) from None
        return StoredPart(key, part_files.parse_checksums(text))

    def _digest(self, path: str) -> tuple[int, str]:
        digest, size = hashlib.sha256(), 0
        with self._fs.open_input_stream(path) as f:
            while chunk := f.read(CHUNK):
                digest.update(chunk)
                size += len(chunk)
        return size, digest.hexdigest()

    def file_size(self, key: str, file: str) -> int:
        """The size of one of the part's objects (FileNotFoundError when there is none, StorageUnavailable
        when the storage did not answer)."""
        try:
            info = self._fs.get_file_info(self._path(key, file))
        except OSError as exc:
            raise StorageUnavailable(self.location, f"looking at {key}/{file}", exc) from None
        if info.type != pafs.FileType.File:
            raise FileNotFoundError(f"{key}/{file}")
        return int(info.size)

    def verify_file(self, key: str, file: str, sums: tuple[int, str]) -> str | None:
        """Why one of the part's objects is not the bytes `sums` names (None: it is)."""
        try:
            if self._digest(self._path(key, file)) != sums:
                return f"{key}/{file} does not match its checksum"
        except FileNotFoundError:
            return f"{key}/{file} is missing"
        except OSError as exc:
            if _not_found(exc):
                return f"{key}/{file} is missing"
            # The storage did not answer: nothing is known of the bytes, so no damage is claimed.
            raise StorageUnavailable(self.location, f"reading {key}/{file}", exc) from None
        return None

    def verify(self, key: str, recorded: Mapping[str, tuple[int, str]] | None = None) -> str | None:
        """Why the objects under `key` are not a whole, intact part (None: they are), checked against their
        `checksums.txt` and, given `recorded` (what the part log recorded), against that too.
        StorageUnavailable when the storage did not answer."""
        try:
            stored = self.published(key)
            if stored is None:
                return f"{key} is not published"
            for file, sums in (recorded or {}).items():
                if file != part_files.CHECKSUMS_FILE and stored.checksums.get(file) != sums:
                    return f"{key}: {part_files.CHECKSUMS_FILE} records other bytes for {file} than the part log"
            for file, sums in stored.checksums.items():
                why = self.verify_file(key, file, sums)
                if why is not None:
                    return why
        except StorageUnavailable:
            raise   # nothing is known of the bytes: not damage (as `verify_file`)
        except (OSError, ValueError, MongoError) as exc:
            return f"{key}: {exc}"
        return None

    def open_file(self, key: str, file: str) -> pa.NativeFile:
        """A random-access reader of one of the part's files (pyarrow reads Parquet from it)."""
        try:
            return self._fs.open_input_file(self._path(key, file))
        except OSError as exc:
            raise StorageUnavailable(self.location, f"opening {key}/{file}", exc) from None

    def download(self, key: str, target_dir: str, *, skip: tuple[str, ...] = ()) -> dict[str, tuple[int, str]]:
        """Copies a published part's files (but `skip`) into the new directory `target_dir`, each checked
        against its checksum as it is written (every file fsynced), and its `checksums.txt`; returns the
        checksums. BadValue if a file does not match (the objects are damaged), StorageUnavailable if the
        storage did not answer."""
        stored = self.published(key)
        if stored is None:
            raise MongoError(2, f"parts storage {self.location.url}: {key} is not published")
        os.makedirs(target_dir)
        try:
            for file, (size, digest) in stored.checksums.items():
                if file in skip:
                    continue
                sha, written = hashlib.sha256(), 0
                with self._fs.open_input_stream(self._path(key, file)) as src, \
                        open(os.path.join(target_dir, file), "wb") as out:
                    while chunk := src.read(CHUNK):
                        sha.update(chunk)
                        written += len(chunk)
                        out.write(chunk)
                    out.flush()
                    os.fsync(out.fileno())
                if (written, sha.hexdigest()) != (size, digest):
                    raise MongoError(2, f"parts storage {self.location.url}: {key}/{file} does not match its "
                                        "checksum")
            with open(os.path.join(target_dir, part_files.CHECKSUMS_FILE), "wb") as out:
                out.write(part_files.checksums_text(stored.checksums).encode())
                out.flush()
                os.fsync(out.fileno())
        except OSError as exc:
            raise StorageUnavailable(self.location, f"reading {key}", exc) from None
        fsync_path(target_dir)
        return stored.checksums

    def stored_keys(self, table_uuid: str) -> dict[str, int]:
        """Every key held for a table (published or not: a write that stopped half way too) -> when its newest
        object was written (Unix ms)."""
        base = f"{self._root}/{table_uuid}"
        selector = pafs.FileSelector(base, allow_not_found=True, recursive=True)
        try:
            infos = self._fs.get_file_info(selector)
        except OSError as exc:
            raise StorageUnavailable(self.location, f"listing {table_uuid}", exc) from None
        keys: dict[str, int] = {}
        for info in infos:
            if info.type != pafs.FileType.File:
                continue
            relative = info.path[len(base):].lstrip("/")
            name = relative.split("/", 1)[0]
            if "/" not in relative or name.startswith("."):
                continue
            key = f"{table_uuid}/{name}"
            written = int(info.mtime_ns // 1_000_000) if info.mtime_ns is not None else 0
            keys[key] = max(keys.get(key, 0), written)
        return keys

    # -- deleting ---------------------------------------------------------------------------------

    def delete(self, key: str) -> None:
        """Removes a part's objects: `checksums.txt` first (it stops being published), then the rest."""
        path = self._path(key)
        try:
            try:
                self._fs.delete_file(self._path(key, part_files.CHECKSUMS_FILE))
            except FileNotFoundError:
                pass
            self._fs.delete_dir(path)
        except OSError as exc:
            if isinstance(exc, FileNotFoundError) or _not_found(exc):
                return
            raise StorageUnavailable(self.location, f"deleting {key}", exc) from None
        if self.local:
            fsync_path(os.path.dirname(path))

    # -- reachability -----------------------------------------------------------------------------

    def probe(self) -> str | None:
        """Why the storage cannot be used now (None: an object was written, read back and deleted)."""
        name = f"{PROBE_PREFIX}{uuid.uuid4().hex}"
        path = f"{self._root}/{name}"
        data = name.encode()
        try:
            self._write_bytes(path, data)
            with self._fs.open_input_stream(path) as f:
                back = f.read()
            self._fs.delete_file(path)
        except OSError as exc:
            return f"parts storage {self.location.url} is not usable: {self.location.hide(str(exc))}"
        if back != data:
            return f"parts storage {self.location.url} did not read back what was written"
        return None
