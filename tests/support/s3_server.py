"""An S3-compatible server on loopback for the tests: moto's standalone server (`moto.server`), one process,
its objects in memory. Started by a fixture, stopped by it."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from tests.support.members import free_port, wait_for

# moto accepts any credentials; pyarrow's S3 client reads these from the environment, as it would AWS's.
CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}


@dataclass(frozen=True)
class S3Server:
    port: int

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def url(self, bucket: str, prefix: str = "") -> str:
        return f"s3://{bucket}/{prefix}?endpoint={self.endpoint}&region=us-east-1"


def _listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


@contextmanager
def s3_server() -> Iterator[S3Server]:
    """A running server, with `CREDENTIALS` set in this process's environment while it runs."""
    port = free_port()
    saved = {name: os.environ.get(name) for name in CREDENTIALS}
    os.environ.update(CREDENTIALS)
    proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: proc.poll() is not None or _listening(port), 30.0, "the S3 server to listen")
        if proc.poll() is not None:
            raise RuntimeError(f"the S3 server exited with {proc.returncode}")
        yield S3Server(port)
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def create_bucket(server: S3Server, bucket: str) -> None:
    import pyarrow.fs as pafs

    pafs.S3FileSystem(endpoint_override=f"127.0.0.1:{server.port}", scheme="http",
                      region="us-east-1", allow_bucket_creation=True).create_dir(bucket)
