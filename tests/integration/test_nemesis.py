"""Real-process fault tests: motor clients write with `w:"majority"` and retryable writes while a
nemesis kills (-9), pauses and partitions members of a 3- and a 5-member set.

Phases (TigerBeetle's VOPR shape): a safety phase under faults, a liveness phase that
must converge (everything healed: a primary, and every member at the same last
applied optime, within a deadline), then checkers over the recorded history:

* every acknowledged write is present on every member (each read directly);
* nothing ran twice: no token pushed twice, every per-document counter equals its
  token count, no `DuplicateKey` on a unique insert (a retry executed again);
* nothing appeared that was never written;
* every member's collections are byte-identical (raw BSON sorted by `_id`), so an
  indeterminate write is present everywhere or nowhere;
* a write known to have been applied (a write-concern error says a primary applied
  it) that is not in the final data is in a member's rollback file, and no
  acknowledged write is only in a rollback file.

The workload: several motor clients, each inserting documents with unique `_id`s and
pushing unique tokens (with `$inc` of a counter in the same update) onto documents of
its own; beside them, a client inserting blocks into a parts table (`insertBlock` with a
`dedupToken` per block, rows with unique keys, a failed block retried once with the same
token; every other block sent to a secondary, which commits it through the primary). Its checker: after the parts converge, every acknowledged block's rows are on every
member exactly once, no row is there twice, and none appears that was never sent. Outcomes: acknowledged, applied-but-unconfirmed (write-concern error),
unknown (timeouts, network errors: indeterminate), duplicate-key.

Short runs are part of `make test`; `make soak` runs long ones with fresh seeds.
Set NEMESIS_SEED to replay a schedule. Each run prints one summary line.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import socket
import socketserver
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import bson
import pytest
from bson.raw_bson import RawBSONDocument
from motor.motor_asyncio import AsyncIOMotorClient
from pymongo import ReadPreference
from pymongo.errors import DuplicateKeyError, PyMongoError, WriteConcernError

from tests.support.members import Member, wait_for
from tests.support.nemesis import Nemesis, nemesis_run
from tests.support.proxy import FaultProxy
from tests.support.replica_set import FAST_SETTINGS, ReplicaSet, make_replica_set
from tests.support.secure import create_first_user, secure_options

SETTINGS = dict(FAST_SETTINGS)
CLIENTS = 4
TOKENS_PER_DOC = 50  # a new list document every so often keeps the oplog entries ($set of the array) small
AFTER_HEAL_S = 3.0
CONVERGE_TIMEOUT_S = 90.0
WORKLOAD_STOP_TIMEOUT_S = 60.0
WARM_UP_ACKS = 40
WARM_UP_TIMEOUT_S = 30.0
CLIENT_OPTIONS: dict[str, Any] = {
    "retryWrites": True, "w": "majority", "wTimeoutMS": 5000, "socketTimeoutMS": 10000,
    "connectTimeoutMS": 2000, "serverSelectionTimeoutMS": 10000, "heartbeatFrequencyMS": 500,
}
DB = "app"


# --- the history -----------------------------------------------------------------------------------------


@dataclass(slots=True)
class Op:
    kind: str  # "insert" or "push"
    key: str  # the inserted _id, or the pushed token
    doc: str  # the document written
    client: int
    started: float
    ended: float = 0.0
    outcome: str = "pending"  # ok | applied | unknown | duplicate-key
    error: str = ""


@dataclass
class History:
    ops: list[Op] = field(default_factory=list)
    errors: Counter[str] = field(default_factory=Counter)

    def with_outcome(self, *outcomes: str) -> list[Op]:
        return [op for op in self.ops if op.outcome in outcomes]


async def client_loop(index: int, client: AsyncIOMotorClient[dict[str, Any]], history: History,
                      stop: asyncio.Event, rng: random.Random) -> None:
    items, lists = client[DB].items, client[DB].lists
    pushes = 0
    for seq in range(10**9):
        if stop.is_set():
            return
        if rng.random() < 0.5:
            op = Op("insert", f"c{index}-i{seq}", f"c{index}-i{seq}", index, time.monotonic())
            write: Any = items.insert_one({"_id": op.key, "client": index, "seq": seq})
        else:
            doc = f"c{index}-list{pushes // TOKENS_PER_DOC}"
            pushes += 1
            op = Op("push", f"c{index}-t{seq}", doc, index, time.monotonic())
            write = lists.update_one({"_id": doc}, {"$push": {"tokens": op.key}, "$inc": {"n": 1}}, upsert=True)
        history.ops.append(op)
        try:
            await write
            op.outcome = "ok"
        except DuplicateKeyError as exc:
            op.outcome, op.error = "duplicate-key", str(exc)
        except WriteConcernError as exc:  # a primary applied it; the write concern was not met
            op.outcome, op.error = "applied", f"{type(exc).__name__}: {exc}"
        except PyMongoError as exc:
            op.outcome, op.error = "unknown", f"{type(exc).__name__}: {exc}"
        op.ended = time.monotonic()
        if op.outcome != "ok":
            history.errors[op.error.split(":", 1)[0]] += 1


PART_ROWS = 20


@dataclass
class PartHistory:
    acknowledged: set[str] = field(default_factory=set)    # block tokens whose insert was answered ok
    sent: set[str] = field(default_factory=set)
    errors: Counter[str] = field(default_factory=Counter)


def part_rows(token: str) -> list[dict[str, Any]]:
    return [{"k": f"{token}-{i}", "n": i} for i in range(PART_ROWS)]


async def part_client_loop(client: AsyncIOMotorClient[dict[str, Any]], history: PartHistory,
                           stop: asyncio.Event) -> None:
    db = client[DB]
    for seq in range(10**9):
        if stop.is_set():
            return
        token = f"pb{seq}"
        history.sent.add(token)
        # Every other block goes to a secondary, which writes the part and sends the commit to the primary.
        where = ReadPreference.PRIMARY if seq % 2 == 0 else ReadPreference.SECONDARY_PREFERRED
        for _attempt in range(2):   # a failed block is sent once more, with the same token
            try:
                reply = await db.command({"insertBlock": "blocks", "rows": part_rows(token), "dedupToken": token},
                                         read_preference=where)
                if "writeConcernError" in reply:   # committed on a primary, not known to be on a majority
                    history.errors["writeConcernError"] += 1
                    continue
                history.acknowledged.add(token)
                break
            except PyMongoError as exc:
                history.errors[type(exc).__name__] += 1
                await asyncio.sleep(0.2)


def part_keys(member: Member) -> Counter[str]:
    with member.direct_client(serverSelectionTimeoutMS=10000) as client:
        return Counter(r["k"] for r in client[DB].cursor_command("selectParts", "blocks", columns=["k"]))


def active_parts(member: Member) -> list[str]:
    with member.direct_client(serverSelectionTimeoutMS=10000) as client:
        return sorted(p["name"] for p in client[DB].command({"partsStatus": "blocks"})["parts"] if p["active"])


def wait_parts_converged(rs: ReplicaSet, timeout_s: float) -> None:
    def same() -> bool:
        views = [active_parts(m) for m in rs.members]
        return all(v == views[0] for v in views)

    try:
        wait_for(same, timeout_s, "every member to hold the same parts", interval_s=0.5)
    except TimeoutError as exc:
        raise AssertionError(f"the parts did not converge in {timeout_s:.0f} s:\n{describe_parts(rs)}") from exc


def describe_parts(rs: ReplicaSet) -> str:
    """Each member's active parts (those not on every member) and the head of its queue, for a failure."""
    views = {m.host: set(active_parts(m)) for m in rs.members}
    everywhere = set.intersection(*views.values())
    lines = []
    for m in rs.members:
        with m.direct_client(serverSelectionTimeoutMS=10000) as client:
            queue = client[DB].command({"partsReplicationQueue": "blocks"})["queue"]
        lines.append(f"  {m.host}: {len(views[m.host])} parts, only here {sorted(views[m.host] - everywhere)[:8]}, "
                     f"queue {len(queue)}")
        lines += [f"    {e['node_name']} {e['type']} {e['new_part_name']} tries {e['num_tries']}: "
                  f"{e['postpone_reason'] or e['last_exception']}" for e in queue[:6]]
    return "\n".join(lines)


def check_parts(history: PartHistory, keys: dict[str, Counter[str]]) -> list[str]:
    problems = []
    for host, counter in keys.items():
        lost = [t for t in history.acknowledged if any(counter[f"{t}-{i}"] != 1 for i in range(PART_ROWS))]
        doubled = [k for k, n in counter.items() if n > 1]
        phantom = [k for k in counter if k.rsplit("-", 1)[0] not in history.sent]
        partial = [t for t in history.sent - history.acknowledged
                   if 0 < sum(counter[f"{t}-{i}"] for i in range(PART_ROWS)) < PART_ROWS]
        for name, items in (("acknowledged blocks lost", lost), ("rows twice", doubled),
                            ("rows never sent", phantom), ("blocks partly present", partial)):
            if items:
                problems.append(f"{host}: {name}: {sorted(items)[:10]}")
    return problems


# --- the final state ---------------------------------------------------------------------------------------


def read_member(member: Member) -> dict[str, list[RawBSONDocument]]:
    """Every replicated collection of the member (all but `local`), raw documents sorted by _id."""
    with member.direct_client(document_class=RawBSONDocument, serverSelectionTimeoutMS=10000,
                              read_preference=ReadPreference.SECONDARY_PREFERRED) as client:
        out: dict[str, list[RawBSONDocument]] = {}
        for db_name in sorted(client.list_database_names()):
            if db_name == "local":
                continue
            db = client[db_name]
            for coll in sorted(db.list_collection_names()):
                out[f"{db_name}.{coll}"] = list(db[coll].find({}).sort("_id", 1))
        return out


def read_rollback_files(dbpath: str) -> list[tuple[str, dict[str, Any]]]:
    """(file, document) for every document in `<dbpath>/rollback/<ns>/<timestamp>.bson`."""
    out: list[tuple[str, dict[str, Any]]] = []
    root = Path(dbpath) / "rollback"
    for path in sorted(root.rglob("*.bson")) if root.is_dir() else []:
        with open(path, "rb") as f:
            out.extend((str(path), doc) for doc in bson.decode_file_iter(f))
    return out


def strings_in(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for v in value.values():
            yield from strings_in(v)
    elif isinstance(value, list):
        for v in value:
            yield from strings_in(v)


def applied_optimes(rs: ReplicaSet) -> dict[str, tuple[Any, int]]:
    out = {}
    for m in rs.members:
        status = rs.status(m)
        out[m.host] = (status["optimes"]["appliedOpTime"], int(status["myState"]))
    return out


def wait_converged(rs: ReplicaSet, timeout_s: float) -> None:
    """A primary, and every member PRIMARY or SECONDARY at the same last applied optime."""
    def converged() -> bool:
        if rs.primary() is None:
            return False
        seen = applied_optimes(rs)
        states_ok = all(state in (1, 2) for _, state in seen.values())
        return states_ok and len({bson.encode({"t": o}) for o, _ in seen.values()}) == 1

    try:
        wait_for(converged, timeout_s, "every member at the same optime under one primary", interval_s=0.25)
    except TimeoutError as exc:
        raise AssertionError(f"the set did not converge in {timeout_s:.0f} s:\n{describe_members(rs)}") from exc


def read_quiet_set(rs: ReplicaSet, timeout_s: float) -> dict[str, dict[str, list[RawBSONDocument]]]:
    """Every member's data, read while no member's optime moved. A primary goes on writing after
    the clients stop (it logs merges of the parts tables), so one converged moment is not enough:
    the members are read one after another, and a write between two reads would look like a
    divergence. Read again until the optimes before and after the reads are the same."""
    deadline = time.monotonic() + timeout_s
    while True:
        wait_converged(rs, max(1.0, deadline - time.monotonic()))
        before = applied_optimes(rs)
        data = {m.host: read_member(m) for m in rs.members}
        if bson.encode({"o": list(applied_optimes(rs).items())}) == bson.encode({"o": list(before.items())}):
            return data
        if time.monotonic() > deadline:
            raise AssertionError(f"the set never stayed still while it was read:\n{describe_members(rs)}")


def describe_members(rs: ReplicaSet) -> str:
    """State, last applied optime and the last warnings of every member, for a failure report."""
    lines = []
    for m in rs.members:
        try:
            status = rs.status(m)
            state = f"{status.get('myState')} applied {status['optimes']['appliedOpTime']}"
        except Exception as exc:
            state = f"unreadable: {exc!r}"
        lines.append(f"  {m.host} ({m.dbpath}): {state}")
        warnings = [line for line in m.read_log().splitlines() if " WARNING " in line or " CRITICAL " in line
                    or " ERROR " in line]
        lines += [f"    {line[:300]}" for line in warnings[-3:]]
    return "\n".join(lines)


# --- the checks ----------------------------------------------------------------------------------------------


@dataclass
class Verdict:
    acknowledged: int = 0
    applied_unconfirmed: int = 0
    unknown: int = 0
    indeterminate_present: int = 0
    lost: list[str] = field(default_factory=list)
    duplicates: list[str] = field(default_factory=list)
    phantoms: list[str] = field(default_factory=list)
    divergent: list[str] = field(default_factory=list)
    missing_from_rollback: list[str] = field(default_factory=list)
    rollback_documents: int = 0
    rollback_files: int = 0

    @property
    def problems(self) -> list[str]:
        named = [("lost", self.lost), ("duplicates", self.duplicates), ("phantoms", self.phantoms),
                 ("divergent", self.divergent), ("applied, absent and not in a rollback file",
                                                 self.missing_from_rollback)]
        return [f"{name}: {items[:20]}{' ...' if len(items) > 20 else ''}" for name, items in named if items]


def check(history: History, data: dict[str, dict[str, list[RawBSONDocument]]],
          rollback: dict[str, list[tuple[str, dict[str, Any]]]]) -> Verdict:
    v = Verdict()
    _check_identical(data, v)
    final = next(iter(data.values()))
    items = {doc["_id"]: doc for doc in final.get(f"{DB}.items", [])}
    lists = {doc["_id"]: doc for doc in final.get(f"{DB}.lists", [])}
    tokens: dict[str, list[str]] = {i: list(d.get("tokens", [])) for i, d in lists.items()}
    present_keys = set(items) | {t for ts in tokens.values() for t in ts}
    rolled_back = {s for docs in rollback.values() for _, doc in docs for s in strings_in(doc)}
    v.rollback_documents = sum(len(docs) for docs in rollback.values())
    v.rollback_files = len({f for docs in rollback.values() for f, _ in docs})

    for op in history.ops:
        present = op.key in items if op.kind == "insert" else op.key in tokens.get(op.doc, [])
        if op.outcome == "ok":
            v.acknowledged += 1
            if not present:
                where = " (it is in a rollback file)" if op.key in rolled_back else ""
                v.lost.append(f"{op.kind} {op.key}{where}")
        elif op.outcome == "duplicate-key":
            v.duplicates.append(f"insert {op.key} hit DuplicateKey: a retry ran again ({op.error[:120]})")
        else:
            if op.outcome == "applied":
                v.applied_unconfirmed += 1
                if not present and op.key not in rolled_back:
                    v.missing_from_rollback.append(f"{op.kind} {op.key}: {op.error[:100]}")
            else:
                v.unknown += 1
            v.indeterminate_present += present

    for doc_id, ts in tokens.items():
        for token, count in Counter(ts).items():
            if count > 1:
                v.duplicates.append(f"token {token} pushed {count} times onto {doc_id}")
        n = lists[doc_id].get("n")
        if n != len(ts):
            v.duplicates.append(f"{doc_id}: counter n={n} but {len(ts)} tokens")
    issued = {op.key for op in history.ops}
    v.phantoms = sorted(present_keys - issued)
    return v


def _check_identical(data: dict[str, dict[str, list[RawBSONDocument]]], v: Verdict) -> None:
    (first_host, first), *rest = data.items()
    for host, colls in rest:
        if set(colls) != set(first):
            v.divergent.append(f"{host} has collections {sorted(colls)}, {first_host} has {sorted(first)}")
            continue
        for ns, docs in colls.items():
            theirs = first[ns]
            if [d.raw for d in docs] == [d.raw for d in theirs]:
                continue
            ids, first_ids = {d["_id"] for d in docs}, {d["_id"] for d in theirs}
            differ = sorted(str(d["_id"]) for d in docs if d["_id"] in first_ids and d.raw != next(
                t.raw for t in theirs if t["_id"] == d["_id"]))
            v.divergent.append(f"{ns}: {host} vs {first_host}: only on {host}: {sorted(map(str, ids - first_ids))[:10]}, "
                               f"only on {first_host}: {sorted(map(str, first_ids - ids))[:10]}, "
                               f"different bytes: {differ[:10]}")


# --- one run ---------------------------------------------------------------------------------------------------


@dataclass
class RunResult:
    members: int
    seed: int
    nemesis: Nemesis
    history: History
    verdict: Verdict
    parts: PartHistory = field(default_factory=PartHistory)
    part_problems: list[str] = field(default_factory=list)

    def summary_line(self) -> str:
        v, counts = self.verdict, self.nemesis.counts
        kinds = ", ".join(f"{k} {n}" for k, n in sorted(counts.items()))
        indeterminate = v.applied_unconfirmed + v.unknown
        return (f"nemesis run: {self.members} members, seed {self.seed}: faults {sum(counts.values())} "
                f"({kinds}); acknowledged writes {v.acknowledged}; indeterminate {indeterminate} "
                f"(applied {v.applied_unconfirmed}, unknown {v.unknown}; present {v.indeterminate_present}, "
                f"absent {indeterminate - v.indeterminate_present}); writes lost {len(v.lost)}; "
                f"duplicates {len(v.duplicates)}; rollback documents {v.rollback_documents} "
                f"in {v.rollback_files} files; errors {dict(self.history.errors)}; part blocks acknowledged "
                f"{len(self.parts.acknowledged)} of {len(self.parts.sent)} sent, part problems "
                f"{len(self.part_problems)}, part errors {dict(self.parts.errors)}")


TOTALS: list[RunResult] = []


async def run_nemesis(tmp_path: Path, *, members: int, seed: int, duration_s: float,
                      secure: bool = False) -> RunResult:
    """`secure`: every member with TLS and keyfile auth, every client over TLS as a root user."""
    extra: list[str] = []
    client_options: dict[str, Any] = {}
    if secure:
        extra, client_options, _ca = secure_options(tmp_path / "secrets")
    rs = make_replica_set(str(tmp_path), members, extra_args=tuple(extra))
    for m in rs.members:
        m.client_kwargs.update(client_options)
    history = History()
    parts = PartHistory()
    async with nemesis_run(rs, seed, SETTINGS, after_initiate=create_first_user if secure else None) as run:
        options = {**CLIENT_OPTIONS, **rs.members[0].client_kwargs}
        rng = random.Random(seed)
        await asyncio.to_thread(lambda: rs.client()[DB].command(
            {"createPartsTable": "blocks", "columns": [{"name": "k", "type": "string"}, {"name": "n", "type": "int64"}],
             "orderBy": ["k"]}))
        part_client: AsyncIOMotorClient[dict[str, Any]] = AsyncIOMotorClient(rs.uri, **options)
        run.clients.append(part_client)
        run.spawn(part_client_loop(part_client, parts, run.stop_workload))
        for i in range(CLIENTS):
            client: AsyncIOMotorClient[dict[str, Any]] = AsyncIOMotorClient(rs.uri, **options)
            run.clients.append(client)
            run.spawn(client_loop(i, client, history, run.stop_workload, random.Random(rng.random())))
        await _until(lambda: len(history.with_outcome("ok")) >= WARM_UP_ACKS, WARM_UP_TIMEOUT_S,
                     "writes to be acknowledged before any fault")
        await run.faults(duration_s)
        await asyncio.sleep(AFTER_HEAL_S)  # writes go on against the healed set
        run.stop_workload.set()
        await asyncio.wait_for(asyncio.gather(*run.tasks), WORKLOAD_STOP_TIMEOUT_S)
        data = await asyncio.to_thread(read_quiet_set, rs, CONVERGE_TIMEOUT_S)
        rollback = {m.host: read_rollback_files(m.dbpath) for m in rs.members}
        await asyncio.to_thread(wait_parts_converged, rs, CONVERGE_TIMEOUT_S)
        keys = {m.host: await asyncio.to_thread(part_keys, m) for m in rs.members}
        result = RunResult(members, seed, run.nemesis, history, check(history, data, rollback), parts,
                           check_parts(parts, keys))
    nemesis, proxy = run.nemesis, run.proxy
    TOTALS.append(result)
    print(result.summary_line())
    if result.verdict.problems:
        print(nemesis.describe())
        for m in rs.members:
            print(f"log of {m.host}: {m.log_path}")
    assert not result.verdict.problems, f"seed {seed}: " + "; ".join(result.verdict.problems)
    assert not result.part_problems, f"seed {seed}: " + "; ".join(result.part_problems)
    assert result.parts.acknowledged, f"seed {seed}: no part block was acknowledged"
    assert result.verdict.acknowledged > 0, f"seed {seed}: no write was acknowledged"
    assert not proxy.errors, proxy.errors
    return result


async def _until(predicate: Any, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)


@pytest.fixture(scope="module", autouse=True)
def print_totals() -> Iterator[None]:
    yield
    if TOTALS:
        faults = sum(sum(r.nemesis.counts.values()) for r in TOTALS)
        print(f"\nnemesis totals: real-process runs {len(TOTALS)}, faults injected {faults}, acknowledged "
              f"writes {sum(r.verdict.acknowledged for r in TOTALS)}, writes lost "
              f"{sum(len(r.verdict.lost) for r in TOTALS)}, duplicates "
              f"{sum(len(r.verdict.duplicates) for r in TOTALS)}")
        TOTALS.clear()


def seed_for(default: int) -> int:
    return int(os.environ.get("NEMESIS_SEED", default))


# --- the tests -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("members", "seed"), [pytest.param(3, 7103, marks=pytest.mark.soak), (5, 7105)])
async def test_nemesis_short(tmp_path: Path, members: int, seed: int) -> None:
    """`make test` runs the five-member set (chains, two voters down at once); `make soak` the three too."""
    await run_nemesis(tmp_path, members=members, seed=seed_for(seed), duration_s=20)


@pytest.mark.soak
@pytest.mark.parametrize("seed", [7203])
async def test_nemesis_with_tls_and_auth(tmp_path: Path, seed: int) -> None:
    """The same run with every member behind TLS and keyfile auth, every client logged in over TLS."""
    await run_nemesis(tmp_path, members=3, seed=seed_for(seed), duration_s=25, secure=True)


@pytest.mark.soak
@pytest.mark.parametrize("members", [3, 5, 3, 5])
async def test_nemesis_soak(tmp_path: Path, members: int) -> None:
    seed = seed_for(random.SystemRandom().randrange(1, 10**6))
    await run_nemesis(tmp_path, members=members, seed=seed,
                      duration_s=float(os.environ.get("NEMESIS_SOAK_S", "180")))


# --- the proxy itself -----------------------------------------------------------------------------------------


class _Echo(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        with contextlib.suppress(OSError):
            while data := self.request.recv(4096):
                self.request.sendall(data)


@pytest.fixture()
def echo_link() -> Iterator[tuple[FaultProxy, socketserver.ThreadingTCPServer, tuple[str, str], int]]:
    """A proxy link a→echo server; yields (proxy, server, the link's pair, the port to dial)."""
    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), _Echo)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, name="echo")
    thread.start()
    proxy = FaultProxy()
    try:
        proxy.start()
        dst = f"127.0.0.1:{server.server_address[1]}"
        port = int(proxy.add_link("a", dst).rsplit(":", 1)[1])
        yield proxy, server, ("a", dst), port
    finally:
        proxy.stop()
        server.shutdown()
        server.server_close()
        thread.join(5)


def _echo(sock: socket.socket, data: bytes) -> bytes:
    sock.sendall(data)
    return sock.recv(4096)


def test_proxy_passes_holds_while_blackholed_and_delivers_on_heal(echo_link: Any) -> None:
    proxy, _, pair, port = echo_link
    with socket.create_connection(("127.0.0.1", port), timeout=0.5) as old:
        assert _echo(old, b"one") == b"one"
        proxy.set_links([pair], blackholed=True)
        with socket.create_connection(("127.0.0.1", port), timeout=0.5) as new:  # accepted: a timeout, not a refusal
            for sock in (old, new):
                with pytest.raises(TimeoutError):
                    _echo(sock, b"held")
            proxy.heal()
            assert old.recv(4096) == b"held" and new.recv(4096) == b"held"


def test_proxy_delays_and_resets(echo_link: Any) -> None:
    proxy, _, pair, port = echo_link
    proxy.set_links([pair], delay_ms=200)
    with socket.create_connection(("127.0.0.1", port), timeout=2) as sock:
        started = time.monotonic()
        assert _echo(sock, b"slow") == b"slow" and time.monotonic() - started >= 0.35  # 200 ms each way
        proxy.heal()
        assert proxy.reset([pair]) == 1
        assert sock.recv(4096) == b""


def test_proxy_refuses_while_the_destination_refuses(echo_link: Any) -> None:
    proxy, server, _, port = echo_link
    server_port = server.server_address[1]
    server.shutdown()
    server.server_close()
    with socket.create_connection(("127.0.0.1", port), timeout=1) as sock:  # the first try finds out
        assert sock.recv(4096) == b""
    wait_for(lambda: not proxy.stats()[0].listening, 5, "the link to stop listening")
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=1)
    revived = socketserver.ThreadingTCPServer(("127.0.0.1", server_port), _Echo, bind_and_activate=False)
    revived.allow_reuse_address = True
    revived.server_bind()
    revived.server_activate()
    thread = threading.Thread(target=revived.serve_forever, name="echo-again")
    thread.start()
    try:
        wait_for(lambda: proxy.stats()[0].listening, 5, "the link to listen again")
        with socket.create_connection(("127.0.0.1", port), timeout=1) as sock:
            assert _echo(sock, b"back") == b"back"
    finally:
        revived.shutdown()
        revived.server_close()
        thread.join(5)


# --- targeted schedules -----------------------------------------------------------------------------------------
# Each found a bug with the nemesis above, then was pinned down with the proxy and fail points.


@pytest.fixture()
def routed(tmp_path: Path) -> Iterator[tuple[ReplicaSet, FaultProxy]]:
    """An initiated three-member set whose peer traffic goes through a fault proxy; m0 is primary."""
    rs = make_replica_set(str(tmp_path), 3)
    proxy = FaultProxy()
    try:
        proxy.start()
        rs.start()
        Nemesis(rs, proxy, seed=0).connect()
        assert rs.initiate(SETTINGS) is rs.members[0]
        yield rs, proxy
    finally:
        proxy.stop()
        rs.stop()


class BackgroundWrite:
    """One insert on `member` in its own thread; `outcome` is "acknowledged" or the error."""

    def __init__(self, member: Any, doc: dict[str, Any], wtimeout_ms: int, **client_options: Any) -> None:
        self.outcome = ""
        self._args = (member, doc, wtimeout_ms, client_options)
        self._thread = threading.Thread(target=self._run, name="background-write")
        self._thread.start()

    def _run(self) -> None:
        from pymongo import WriteConcern

        member, doc, wtimeout_ms, options = self._args
        try:
            with member.direct_client(**options) as client:
                client.app.items.with_options(write_concern=WriteConcern(w="majority", wtimeout=wtimeout_ms)) \
                    .insert_one(doc)
            self.outcome = "acknowledged"
        except PyMongoError as exc:
            self.outcome = f"{type(exc).__name__}: {exc}"

    def wait(self, timeout_s: float) -> str:
        self._thread.join(timeout_s)
        if self._thread.is_alive():
            raise AssertionError(f"the write did not return within {timeout_s} s")
        return self.outcome


def test_a_position_report_from_a_newer_term_does_not_commit_on_the_old_primary(
        routed: tuple[ReplicaSet, FaultProxy]) -> None:
    """P is cut off and writes W; S2 is elected in term 2 with S1's vote. Then only S1→P heals:
    S1's held getMore reply brings W, S1 applies it and reports (in term 2) to P. P must step
    down rather than count that report: W is not on the new primary, so acknowledging it
    with w:"majority" would lose it when S1 and P roll back. (Before the fix, 1 run in 8 acked W
    and P then refused to roll back, stuck in RECOVERING.)"""
    rs, proxy = routed
    p, s1, s2 = rs.members
    rs.direct(p).app.items.insert_one({"_id": "before"})
    wait_for(lambda: rs.sync_source(s1) == p.host, 10, f"{s1.host} to sync from {p.host}")
    rs.direct(s1).admin.command("replSetFreeze", 120)  # S2, not S1, wins the next election
    proxy.partition([[p.host], [s1.host, s2.host]])
    write = BackgroundWrite(p, {"_id": "W"}, 30000)
    wait_for(lambda: rs.status(s2)["myState"] == 1 and rs.status(s1)["term"] >= 2, 30,
             f"{s2.host} elected in term 2")
    proxy.set_links([(s1.host, p.host)], blackholed=False)
    outcome = write.wait(40)
    assert outcome != "acknowledged", "W was acknowledged on the strength of a term-2 report"
    proxy.heal()
    wait_converged(rs, CONVERGE_TIMEOUT_S)


def test_a_primary_ignores_positions_reported_in_a_newer_term(routed: tuple[ReplicaSet, FaultProxy]) -> None:
    """The deterministic core of the schedule above: P waits for w:"majority" on W while no
    secondary fetches; a replSetUpdatePosition in term + 1 says member 1 holds W. P must step
    down (W fails with PrimarySteppedDown), not count it and acknowledge W."""
    from base.messages import MemberPosition, update_position_command
    from base.optime import OpTime

    rs, _ = routed
    p, s1, s2 = rs.members
    for s in (s1, s2):
        rs.fail_point(s, "stopReplProducer", "alwaysOn")
    write = BackgroundWrite(p, {"_id": "W"}, 20000, retryWrites=False)
    oplog = rs.direct(p).local["oplog.rs"]
    wait_for(lambda: oplog.find_one({"o._id": "W"}), 10, "W in the primary's oplog")
    top = OpTime.from_document(next(oplog.find().sort("$natural", -1).limit(1)))
    report = update_position_command([MemberPosition(1, top, top, 1)], int(rs.status(p)["term"]) + 1)
    report.pop("$db")
    rs.direct(p).admin.command(report)
    outcome = write.wait(30)
    assert "PrimarySteppedDown" in outcome, f"a report from a newer term was counted: {outcome}"


def test_a_new_primary_commits_on_positions_its_heartbeats_bring(routed: tuple[ReplicaSet, FaultProxy]) -> None:
    """P is cut off; S2 is elected and writes W with w:"majority". S1 still waits on P, its old
    sync source, until P is DOWN (heartbeatTimeoutSecs), then fetches W from S2. Its position
    report is stuck behind one to P that times out, so S2 first learns that S1 holds W from a
    heartbeat reply; the report that follows moves nothing. The commit point must advance on
    the heartbeat (before the fix it never did: W timed out although S1 and S2 held it)."""
    rs, proxy = routed
    p, s1, s2 = rs.members
    rs.direct(p).app.items.insert_one({"_id": "before"})
    rs.direct(s1).admin.command("replSetFreeze", 120)
    proxy.partition([[p.host], [s1.host, s2.host]])
    wait_for(lambda: rs.status(s2)["myState"] == 1, 30, f"{s2.host} elected")
    started = time.monotonic()
    outcome = BackgroundWrite(s2, {"_id": "W"}, 40000).wait(45)
    print(f"W on the new primary: {outcome} after {time.monotonic() - started:.1f} s")
    assert outcome == "acknowledged", outcome


def test_rollback_of_a_collection_created_in_both_histories(routed: tuple[ReplicaSet, FaultProxy]) -> None:
    """P, cut off, creates collection `fresh` with a w:1 insert; S2, elected meanwhile, creates
    `fresh` too. After the heal P must roll back (recloning `fresh` from S2) and converge."""
    from pymongo import WriteConcern

    rs, proxy = routed
    p, s1, s2 = rs.members
    rs.direct(p).app.items.insert_one({"_id": "before"})
    rs.direct(s1).admin.command("replSetFreeze", 120)
    proxy.partition([[p.host], [s1.host, s2.host]])
    rs.direct(p).app.fresh.with_options(write_concern=WriteConcern(w=1)).insert_one({"_id": "on-old-primary"})
    wait_for(lambda: rs.status(s2)["myState"] == 1, 30, f"{s2.host} elected")
    assert BackgroundWrite(s2, {"_id": "x"}, 40000).wait(45) == "acknowledged"
    rs.direct(s2).app.fresh.with_options(write_concern=WriteConcern(w="majority", wtimeout=30000)).insert_one(
        {"_id": "on-new-primary"})
    proxy.heal()
    wait_converged(rs, 20)
