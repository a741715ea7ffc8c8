"""An insert's rows are bounded by their decoded size before the member decodes them, on a real member.

- An Arrow stream of a few KB that decodes to 800 MB (zstd makes zeros ~30,000 times smaller), and 15.7 MB
  of such batches (280 GB decoded): BSONObjectTooLarge (10334), while another client's pings
  answer within 250 ms and the member's memory stays where it was.
- The same streams into a table that does not exist: NamespaceNotFound (26), nothing decoded (a
  malformed stream is not even looked at).
- A block whose rows fall into 101 partitions: TooManyParts (ClickHouse's TOO_MANY_PARTS, answered as
  OperationFailed 96), nothing written; 100 partitions insert.
- A block just under `--maxDecodedBlockBytes` inserts (decoded off the event loop) and reads back; one
  row more is refused.
"""

from __future__ import annotations

import io
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pyarrow as pa
import pytest
from pymongo.errors import OperationFailure

from oplog.parts.block_size import table_bytes
from oplog.parts.table import parse_table_def
from tests.support.members import Member, rss_kb, wait_for

TABLE = {"columns": [{"name": "n", "type": "int64"}, {"name": "day", "type": "int32", "default": 0}],
         "partitionBy": "day", "orderBy": ["n"]}
PING_LIMIT_MS = 250.0
RSS_GROWTH_LIMIT_KB = 400 * 1024
BSON_OBJECT_TOO_LARGE, NAMESPACE_NOT_FOUND, TOO_MANY_PARTS = 10334, 26, 96
HUGE_BATCHES = 35_000    # ~15.7 MB of batches of 8 MB decoded each
SMALL_LIMIT = 8 << 20    # the member of the last test decodes a block of 8 MiB at most


def _ipc(batches: list[pa.RecordBatch], schema: pa.Schema, compression: str | None = "zstd") -> bytes:
    sink = io.BytesIO()
    with pa.ipc.new_stream(sink, schema, options=pa.ipc.IpcWriteOptions(compression=compression)) as writer:
        for batch in batches:
            writer.write_batch(batch)
    return sink.getvalue()


def zeros_stream(batches: int, rows: int = 1_000_000) -> bytes:
    """`batches` batches of `rows` int64 zeros, zstd-compressed: one batch compressed, its message sent
    `batches` times (a valid stream; 8 MB decoded a batch, a few hundred bytes sent)."""
    batch = pa.record_batch({"n": pa.array([0] * rows, pa.int64())})
    schema_only, one = _ipc([], batch.schema), _ipc([batch], batch.schema)
    end_of_stream = schema_only[-8:]
    message = one[len(schema_only) - 8:len(one) - 8]
    return schema_only[:-8] + message * batches + end_of_stream


class Pinger(threading.Thread):
    """Another client pinging the member while the test runs, each round trip measured (and failed past a
    socket timeout, never waited for without end), and the member's memory read between pings."""

    def __init__(self, member: Member) -> None:
        super().__init__(daemon=True)
        assert member.process is not None
        self.pid = member.process.pid
        self.client = member.direct_client(socketTimeoutMS=5000)
        self.done = threading.Event()
        self.round_trips_ms: list[float] = []
        self.rss_max_kb = 0
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            while not self.done.wait(0.005):
                started = time.perf_counter()
                self.client.admin.command("ping")
                self.round_trips_ms.append((time.perf_counter() - started) * 1000)
                self.rss_max_kb = max(self.rss_max_kb, rss_kb(self.pid))
        except BaseException as exc:   # the test thread reports it
            self.error = exc

    def finish(self) -> None:
        self.done.set()
        self.join(30)
        self.client.close()
        if self.error is not None:
            raise self.error


@contextmanager
def pinging(member: Member) -> Iterator[Pinger]:
    pinger = Pinger(member)
    pinger.start()
    try:
        yield pinger
    finally:
        pinger.finish()
    assert len(pinger.round_trips_ms) >= 5, pinger.round_trips_ms
    assert max(pinger.round_trips_ms) < PING_LIMIT_MS, sorted(pinger.round_trips_ms)[-5:]


def _refused(db: Any, cmd: dict[str, Any]) -> OperationFailure:
    with pytest.raises(OperationFailure) as failure:
        db.command(cmd)
    return failure.value


@pytest.fixture(scope="module")
def db(member: Member) -> Iterator[Any]:
    with member.direct_client(socketTimeoutMS=120_000) as client:
        database = client.bounded
        database.command({"createPartsTable": "events", **TABLE})
        yield database


@pytest.mark.alone
def test_a_stream_that_decodes_to_800_mb_is_refused_before_it_is_decoded(member: Member, db: Any) -> None:
    assert member.process is not None
    big, huge = zeros_stream(100), zeros_stream(HUGE_BATCHES)   # 800 MB and 280 GB decoded
    assert len(big) < 100_000 and len(huge) < 16_000_000   # within a BSON document
    rss_before = rss_kb(member.process.pid)
    with pinging(member) as pinger:
        for stream in (big, huge, big, big):
            started = time.perf_counter()
            failure = _refused(db, {"insertBlock": "events", "arrow": stream})
            assert failure.code == BSON_OBJECT_TOO_LARGE, failure.details
            assert "--maxDecodedBlockBytes" in str(failure.details["errmsg"])
            assert time.perf_counter() - started < 5.0
        failure = _refused(db, {"stagePartsBlock": "events", "arrow": big, "writeId": "w", "stageKey": "0"})
        assert failure.code == BSON_OBJECT_TOO_LARGE
    print(f"800 MB stream: ping max {max(pinger.round_trips_ms):.1f} ms over {len(pinger.round_trips_ms)} "
          f"pings; RSS {rss_before // 1024} MB before, {pinger.rss_max_kb // 1024} MB at most")
    assert pinger.rss_max_kb - rss_before < RSS_GROWTH_LIMIT_KB
    assert db.command({"partsStatus": "events"})["parts"] == []


@pytest.mark.alone
def test_rows_for_a_table_that_does_not_exist_are_never_decoded(member: Member, db: Any) -> None:
    assert member.process is not None
    rss_before = rss_kb(member.process.pid)
    with pinging(member) as pinger:
        for stream in (zeros_stream(100), zeros_stream(HUGE_BATCHES), b"not an arrow stream"):
            failure = _refused(db, {"insertBlock": "nope", "arrow": stream})
            assert failure.code == NAMESPACE_NOT_FOUND, failure.details   # not 10334, not BadValue: not looked at
            failure = _refused(db, {"stagePartsBlock": "nope", "arrow": stream, "writeId": "w", "stageKey": "0"})
            assert failure.code == NAMESPACE_NOT_FOUND, failure.details
        assert _refused(db, {"insertBlock": "nope", "rows": [{"n": 1}] * 1000}).code == NAMESPACE_NOT_FOUND
    print(f"missing table: ping max {max(pinger.round_trips_ms):.1f} ms; RSS {rss_before // 1024} MB before, "
          f"{pinger.rss_max_kb // 1024} MB at most")
    assert pinger.rss_max_kb - rss_before < RSS_GROWTH_LIMIT_KB


def _days(n: int, start: int = 0) -> list[dict[str, Any]]:
    return [{"n": start + day, "day": day} for day in range(n)]


def test_a_block_over_101_partitions_is_refused_and_100_pass(db: Any) -> None:
    db.command({"createPartsTable": "days", **TABLE})
    failure = _refused(db, {"insertBlock": "days", "rows": _days(101)})
    assert failure.code == TOO_MANY_PARTS and failure.details["codeName"] == "OperationFailed"
    assert "maxPartitionsPerInsertBlock" in failure.details["errmsg"] and "more than 100" in failure.details["errmsg"]
    assert db.command({"partsStatus": "days"})["parts"] == []   # nothing written
    arrow = _ipc([pa.RecordBatch.from_pylist(_days(101))], pa.RecordBatch.from_pylist(_days(1)).schema)
    assert _refused(db, {"stagePartsBlock": "days", "arrow": arrow, "writeId": "w", "stageKey": "0"}).code \
        == TOO_MANY_PARTS
    reply = db.command({"insertBlock": "days", "rows": _days(100, start=1000)})
    assert reply["inserted"] == 100
    assert sorted(b["partition"] for b in reply["blocks"]) == sorted(str(d) for d in range(100))
    rows = list(db.cursor_command("selectParts", "days", columns=["n", "day"]))   # read here: acknowledged
    assert sorted((r["n"], r["day"]) for r in rows) == [(1000 + d, d) for d in range(100)]


def test_a_table_may_let_a_block_write_more_partitions(db: Any) -> None:
    db.command({"createPartsTable": "wide", **TABLE, "settings": {"maxPartitionsPerInsertBlock": 0}})
    db.command({"createPartsTable": "narrow", **TABLE, "settings": {"maxPartitionsPerInsertBlock": 2}})
    assert db.command({"insertBlock": "wide", "rows": _days(150)})["inserted"] == 150
    assert _refused(db, {"insertBlock": "narrow", "rows": _days(3)}).code == TOO_MANY_PARTS
    assert db.command({"insertBlock": "narrow", "rows": _days(2)})["inserted"] == 2


@pytest.mark.alone
def test_a_block_just_under_the_limit_inserts_and_reads_back(start_member: Callable[..., Member]) -> None:
    member = start_member("--maxDecodedBlockBytes", str(SMALL_LIMIT))
    table = parse_table_def("small", "events", TABLE)
    rows = SMALL_LIMIT * 8 // table_bytes(table, 8)   # bytes of 8 rows: bits of one
    while table_bytes(table, rows + 1) <= SMALL_LIMIT:
        rows += 1
    batch = pa.record_batch({"n": pa.array(range(rows), pa.int64()), "day": pa.array([7] * rows, pa.int32())})
    with member.direct_client(socketTimeoutMS=120_000) as client:
        db = client.small
        db.command({"createPartsTable": "events", **TABLE})
        assert client.admin.command({"getParameter": 1, "maxDecodedBlockBytes": 1})["maxDecodedBlockBytes"] \
            == SMALL_LIMIT
        over = pa.record_batch({"n": pa.array(range(rows + 1), pa.int64()),
                                "day": pa.array([7] * (rows + 1), pa.int32())})
        assert _refused(db, {"insertBlock": "events", "arrow": _ipc([over], over.schema)}).code \
            == BSON_OBJECT_TOO_LARGE
        with pinging(member) as pinger:
            reply = db.command({"insertBlock": "events", "arrow": _ipc([batch], batch.schema)})
        print(f"block of {rows:,} rows just under {SMALL_LIMIT:,} bytes: ping max "
              f"{max(pinger.round_trips_ms):.1f} ms over {len(pinger.round_trips_ms)} pings")
        assert reply["inserted"] == 1 and reply["blocks"][0]["rows"] == rows
        wait_for(lambda: sum(p["rows"] or 0 for p in db.command({"partsStatus": "events"})["parts"]
                             if p["active"]) == rows, 30, "the part in partsStatus")
        tail = list(db.cursor_command("selectParts", "events", filter={"n": {"$gte": rows - 3}}))
        assert sorted((r["n"], r["day"]) for r in tail) == [(n, 7) for n in range(rows - 3, rows)]


@pytest.mark.alone
def test_a_large_bson_insert_is_decoded_off_the_event_loop(member: Member, db: Any) -> None:
    """Hundreds of thousands of BSON rows in one command (near the 16 MB a driver sends): the message is
    decoded a slice at a time on a worker thread, its nesting checked there, and its rows made a table
    there too, so another client's pings keep answering (a whole decode on the loop stalled them 1.5 s)."""
    db.command({"createPartsTable": "bulk", **TABLE})
    rows = [{"n": i, "day": i % 7} for i in range(400_000)]
    with pinging(member) as pinger:
        assert db.command({"insertBlock": "bulk", "rows": rows})["inserted"] == 7
    print(f"400,000 BSON rows: ping max {max(pinger.round_trips_ms):.1f} ms over {len(pinger.round_trips_ms)} pings")
    assert sum(p["rows"] for p in db.command({"partsStatus": "bulk"})["parts"]) == 400_000
