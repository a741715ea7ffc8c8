"""Secrets on a real `--auth` set (`replset up`): a members' HTTP token seen on the wire cannot be used
again while members still fetch parts with fresh ones (replset/auth/member_token.py), wrong HTTP Basic
passwords from one address are answered 429 without a password check while the member stays responsive
(replset/auth/login_limit.py), and a storage URL's credentials appear in no reply and no log line
(oplog/parts/storage_url.py `redact_url`)."""

from __future__ import annotations

import base64
import contextlib
import os
import re
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from pymongo import MongoClient

from replset.auth.keyfile import read_keyfile
from replset.auth.login_limit import MAX_FAILURES
from replset.auth.member_token import make_token
from tests.support.members import wait_for
from tests.support.up_process import running_up

ADMIN = ("admin", "a long pass")
SECRET = "HUNTER2-never-shown"
# Credentials in the endpoint's userinfo and in the environment (moto-style test keys): the S3 client gets
# its keys from the environment; the endpoint answers nothing (port 9), which the member logs at start.
STORAGE = f"s3://replset-parts/set?endpoint=http://keeper:{SECRET}@127.0.0.1:9&region=us-east-1"
AWS_ENV = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}
TABLE = {"columns": [{"name": "k", "type": "int64"}, {"name": "v", "type": "string"}], "orderBy": ["k"]}
_BEARER = re.compile(rb"(GET|POST) (\S+) HTTP/1\.1\r\n(?:[^\r\n]+\r\n)*?Authorization: (Bearer [^\r\n]+)\r\n",
                     re.IGNORECASE)


class RecordingForwarder:
    """A TCP forwarder to one member's HTTP port that notes every member token passing through, as a
    proxy's log or a packet capture would."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.seen: list[tuple[str, str, str]] = []   # (method, path, Authorization header)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._sockets: list[socket.socket] = [self._listener]
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self._listener.getsockname()[1]}"

    def _accept(self) -> None:
        with contextlib.suppress(OSError):
            while True:
                client, _ = self._listener.accept()
                upstream = socket.create_connection(("127.0.0.1", self.target_port))
                self._sockets += [client, upstream]
                threading.Thread(target=self._pump, args=(client, upstream, True), daemon=True).start()
                threading.Thread(target=self._pump, args=(upstream, client, False), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket, requests: bool) -> None:
        heads = b""
        with contextlib.suppress(OSError):
            while chunk := source.recv(65536):
                if requests:
                    heads = (heads + chunk)[-65536:]
                    for match in _BEARER.finditer(heads):
                        self.seen.append((match[1].decode(), match[2].decode(), match[3].decode()))
                    heads = heads[heads.rfind(b"\r\n\r\n") + 4:] if b"\r\n\r\n" in heads else heads
                sink.sendall(chunk)
        with contextlib.suppress(OSError):
            sink.shutdown(socket.SHUT_WR)

    def close(self) -> None:
        for sock in self._sockets:
            with contextlib.suppress(OSError):
                sock.close()


@pytest.fixture(scope="module")
def secret_set(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    directory = str(tmp_path_factory.mktemp("secretset"))
    saved = {name: os.environ.get(name) for name in AWS_ENV}
    os.environ.update(AWS_ENV)
    try:
        with running_up(directory, extra_args=("--auth", "--user", ADMIN[0], "--password", ADMIN[1],
                                               "--enableTestCommands", "--partsStorage", STORAGE)) as (ports, out):
            hosts = ",".join(f"127.0.0.1:{p}" for p in ports)
            with MongoClient(f"mongodb://{hosts}/?replicaSet=rs0", username=ADMIN[0], password=ADMIN[1],
                             serverSelectionTimeoutMS=20_000) as client:
                yield {"ports": ports, "out": out, "dir": directory, "client": client}
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _direct(port: int) -> MongoClient[dict[str, Any]]:
    return MongoClient(f"mongodb://127.0.0.1:{port}/?directConnection=true", username=ADMIN[0],
                       password=ADMIN[1], serverSelectionTimeoutMS=10_000)


def _get(port: int, path: str, authorization: str) -> tuple[int, str, dict[str, str]]:
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", headers={"Authorization": authorization})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, response.read(200).decode(errors="replace"), dict(response.headers)
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode(errors="replace"), dict(err.headers)


def _roles(secret_set: dict[str, Any]) -> tuple[int, list[int]]:
    primary = int(wait_for(lambda: secret_set["client"].primary, 30, "a primary")[1])
    return primary, [p for p in secret_set["ports"] if p != primary]


def _has_part(secret_set: dict[str, Any], port: int, ns: str, part: str) -> bool:
    return os.path.isfile(os.path.join(secret_set["dir"], str(port), "parts", ns, part, "data.parquet"))


def test_a_captured_member_token_is_refused_while_members_fetch_parts(secret_set: dict[str, Any]) -> None:
    client, ns = secret_set["client"], "app.events"
    client.app.command({"createPartsTable": "events", **TABLE})
    primary, (first, second) = _roles(secret_set)
    # The first secondary reaches the others' HTTP ports only through forwarders that note what passes.
    forwarders = {port: RecordingForwarder(port + 1000) for port in (primary, second)}
    routes = {f"127.0.0.1:{port + 1000}": fw.address for port, fw in forwarders.items()}
    try:
        with _direct(first) as member:
            member.admin.command({"configureFailPoint": "peerRoutes", "mode": "alwaysOn", "data": {"routes": routes}})
        part = client.app.command({"insertBlock": "events", "rows": [{"k": i, "v": "x"} for i in range(10)]})
        name = part["blocks"][0]["part"]
        for port in (first, second):   # each secondary fetches it with its own fresh tokens
            wait_for(lambda p=port: _has_part(secret_set, p, ns, name), 60, f"{port} to fetch {name}")
        seen = [(port, *token) for port, fw in forwarders.items() for token in fw.seen]
        assert seen, "the first secondary's fetches went through the forwarders"
        for port, method, path, header in seen:
            assert method == "GET" and path.startswith(f"/parts/{ns}/{name}/")
            status, body, _ = _get(port + 1000, path, header)   # the very request, sent again
            assert status == 401 and "used before" in body, (status, body)
            other = next(p for p in secret_set["ports"] if p not in (port, first))
            status, body, _ = _get(other + 1000, path, header)   # to another member
            assert status == 401, (status, body)
        # A fresh token made with the keyfile is good once, for its own request only.
        key = read_keyfile(os.path.join(secret_set["dir"], "keyfile"))
        path = f"/parts/{ns}/{name}/data.parquet"
        fresh = make_token(key, audience=f"127.0.0.1:{primary + 1000}", method="GET", path=path,
                           now_ms=int(time.time() * 1000), nonce=os.urandom(16).hex())
        assert _get(primary + 1000, path.replace("data.parquet", "columns.txt"), fresh)[0] == 401
        assert _get(primary + 1000, path, fresh)[0] == 200
        assert _get(primary + 1000, path, fresh)[0] == 401
        wrong = make_token("d3Jvbmcga2V5", audience=f"127.0.0.1:{primary + 1000}", method="GET", path=path,
                           now_ms=int(time.time() * 1000), nonce=os.urandom(16).hex())
        assert _get(primary + 1000, path, wrong)[0] == 401
    finally:
        with _direct(first) as member:
            member.admin.command({"configureFailPoint": "peerRoutes", "mode": "off"})
        for fw in forwarders.values():
            fw.close()
    later = client.app.command({"insertBlock": "events", "rows": [{"k": 100, "v": "y"}]})["blocks"][0]["part"]
    for port in (first, second):   # members keep fetching from each other directly
        wait_for(lambda p=port: _has_part(secret_set, p, ns, later), 60, f"{port} to fetch {later}")


def test_a_storage_url_with_credentials_is_never_shown(secret_set: dict[str, Any]) -> None:
    client = secret_set["client"]
    client.app.command({"createPartsTable": "shown", **TABLE})
    client.app.command({"insertBlock": "shown", "rows": [{"k": 1, "v": "a"}]})
    reply = client.app.command({"openPartsSnapshot": "shown", "key": "q1", "ttlSecs": 60})
    assert reply["partsStorage"] == STORAGE.replace(f"keeper:{SECRET}@", "***@")
    assert SECRET not in repr(reply)
    options = client.admin.command("getCmdLineOpts")
    assert SECRET not in repr(options) and "***@" in options["parsed"]["storage"]["partsStorage"]
    for port in secret_set["ports"]:
        with open(os.path.join(secret_set["dir"], f"{port}.log"), encoding="utf-8", errors="replace") as f:
            log = f.read()
        assert "parts storage s3://replset-parts/set?endpoint=http://***@127.0.0.1:9" in log, port
        assert SECRET not in log, port
    assert SECRET not in str(secret_set["out"])


@pytest.mark.alone   # (how fast pings stay is judged)
def test_wrong_basic_passwords_get_429_quickly_and_pings_stay_fast(secret_set: dict[str, Any]) -> None:
    """Last in this module: it leaves 127.0.0.1 locked out of one member's HTTP Basic for a minute."""
    _primary, (_first, target) = _roles(secret_set)
    wrong = "Basic " + base64.b64encode(f"{ADMIN[0]}:not the password".encode()).decode()
    right = "Basic " + base64.b64encode(f"{ADMIN[0]}:{ADMIN[1]}".encode()).decode()
    assert _get(target + 1000, "/replSetGetStatus", right)[0] == 200
    pings: list[float] = []
    stop = threading.Event()

    def ping() -> None:
        with _direct(target) as member:
            while not stop.is_set():
                started = time.monotonic()
                member.admin.command("ping")
                pings.append(time.monotonic() - started)
                time.sleep(0.02)

    pinger = threading.Thread(target=ping, daemon=True)
    pinger.start()
    try:
        started = time.monotonic()
        with ThreadPoolExecutor(8) as pool:   # sent at once: checks under way count against the address
            answers = list(pool.map(lambda _: _get(target + 1000, "/replSetGetStatus", wrong), range(60)))
        elapsed = time.monotonic() - started
    finally:
        stop.set()
        pinger.join(30)
    statuses = [status for status, _body, _headers in answers]
    assert statuses.count(401) <= MAX_FAILURES and statuses.count(429) >= 60 - MAX_FAILURES, statuses
    assert all(int(h["Retry-After"]) >= 1 for status, _b, h in answers if status == 429)
    assert elapsed < 10, elapsed
    assert pings and max(pings) < 1.0, sorted(pings)[-5:]
    # Locked out: even the right password is not looked at (it would tell a guesser when a guess was right).
    assert _get(target + 1000, "/replSetGetStatus", right)[0] == 429
