"""A data pipeline on Spark against a real 3-member set: generate events, load them into a parts table
exactly once with quorum 2, aggregate them in Spark, write the totals into a collection, read them back
with motor.

    .venv/bin/python examples/spark_pipeline.py                      # starts its own set (replset up)
    .venv/bin/python examples/spark_pipeline.py --uri "mongodb://127.0.0.1:27017,...?replicaSet=rs0"
    .venv/bin/python examples/spark_pipeline.py --events 20000       # small (what make test runs)

Each step prints what it did and how long it took; Spark's console progress bar shows its tasks.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from motor.motor_asyncio import AsyncIOMotorClient
from pymongo import MongoClient
from pymongo.errors import OperationFailure

TABLE = {"columns": [{"name": "ts", "type": "timestamp[ms]"}, {"name": "user", "type": "string"},
                     {"name": "amount", "type": "int64"}],
         "partitionBy": "toYYYYMM(ts)", "orderBy": ["user", "ts"]}
USERS = 1_000


def _free_base_port() -> int:
    """A port P with P..P+2 and their HTTP ports P+1000..P+1002 free (what `replset up` uses)."""
    for _ in range(200):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            base = probe.getsockname()[1]
        if base + 1002 > 65535:
            continue
        ports = [base + i for i in range(3)] + [base + 1000 + i for i in range(3)]
        try:
            sockets = []
            for port in ports:
                s = socket.socket()
                sockets.append(s)
                s.bind(("127.0.0.1", port))
        except OSError:
            continue
        finally:
            for s in sockets:
                s.close()
        return base
    raise RuntimeError("no free ports for a local set")


@contextmanager
def local_set() -> Iterator[str]:
    """`replset up` with 3 members in a temporary directory; its connection string."""
    with tempfile.TemporaryDirectory(prefix="replset-pipeline-") as directory:
        base = _free_base_port()
        up = subprocess.Popen([sys.executable, "-m", "replset", "up", "--nodes", "3", "--port", str(base),
                               "--dir", directory], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            assert up.stdout is not None
            uri = ""
            for line in up.stdout:
                if "connection string:" in line:
                    uri = line.split("connection string:", 1)[1].strip()
                if "Ctrl-C" in line:
                    break
            if not uri:
                raise RuntimeError(f"replset up exited with {up.wait()}")
            print(f"started a local set: {uri}", flush=True)
            yield uri
        finally:
            up.terminate()
            up.wait(timeout=60)


@contextmanager
def step(what: str) -> Iterator[None]:
    print(f"- {what} ...", flush=True)
    started = time.perf_counter()
    yield
    print(f"  done in {time.perf_counter() - started:.1f} s", flush=True)


def spark_session() -> Any:
    from pyspark.sql import SparkSession

    import replset.spark

    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ["PYSPARK_PYTHON"] = sys.executable
    spark = (SparkSession.builder.master("local[2,4]").appName("replset-pipeline")
             .config("spark.driver.bindAddress", "127.0.0.1").config("spark.driver.host", "127.0.0.1")
             .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "true")
             .config("spark.sql.shuffle.partitions", "4").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    replset.spark.register(spark)
    return spark


def run(uri: str, events: int) -> dict[str, int]:
    from pyspark.sql import functions as F

    with MongoClient(uri) as client:
        try:
            client.analytics.command({"createPartsTable": "events", **TABLE})
        except OperationFailure as exc:
            if exc.code != 48:   # NamespaceExists: a run before this one made it
                raise
    spark = spark_session()
    try:
        with step(f"generating {events:,} events and loading them into analytics.events (insertQuorum 2)"):
            df = (spark.range(events, numPartitions=4)
                  .select(F.timestamp_seconds(F.lit(1_704_067_200) + F.col("id") * 37 % 15_552_000)
                          .cast("timestamp_ntz").alias("ts"),
                          F.concat(F.lit("u"), (F.col("id") * 7919 % USERS).cast("string")).alias("user"),
                          (F.col("id") % 100 + 1).alias("amount")))
            (df.write.format("replset").option("uri", uri).option("table", "analytics.events")
             .option("insertQuorum", 2).mode("overwrite").save())
        with step("aggregating the events per user in Spark"):
            loaded = spark.read.format("replset").option("uri", uri).option("table", "analytics.events").load()
            totals = loaded.groupBy("user").agg(F.count("*").alias("events"), F.sum("amount").alias("amount"))
            rows = loaded.count()
            print(f"  {rows:,} rows read back from {loaded.rdd.getNumPartitions()} Spark partitions", flush=True)
        with step("writing the totals into the collection analytics.user_totals"):
            (totals.withColumnRenamed("user", "_id").write.format("replset").option("uri", uri)
             .option("collection", "analytics.user_totals").mode("overwrite").save())
    finally:
        spark.stop()
    with step("reading the totals back with motor"):
        summary = asyncio.run(read_back(uri))
    summary["rows"] = rows
    return summary


async def read_back(uri: str) -> dict[str, int]:
    client: AsyncIOMotorClient[dict[str, Any]] = AsyncIOMotorClient(uri)
    try:
        totals = client.analytics.user_totals
        users = await totals.count_documents({})
        cursor = totals.aggregate([{"$group": {"_id": None, "events": {"$sum": "$events"}}}])
        events = (await cursor.to_list(1))[0]["events"]
        top = await totals.find().sort("amount", -1).limit(3).to_list(3)
        print(f"  {users:,} users, {events:,} events; top spenders: "
              + ", ".join(f"{d['_id']} ({d['amount']:,})" for d in top), flush=True)
        return {"users": users, "events": events}
    finally:
        client.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--uri", help="a running set (default: start one with replset up)")
    parser.add_argument("--events", type=int, default=1_000_000)
    args = parser.parse_args()
    started = time.perf_counter()
    if args.uri:
        summary = run(args.uri, args.events)
    else:
        with local_set() as uri:
            summary = run(uri, args.events)
    ok = summary["rows"] == args.events and summary["events"] == args.events
    print(f"{'ok' if ok else 'MISMATCH'}: {summary['rows']:,} rows loaded, {summary['events']:,} counted in "
          f"{summary['users']:,} totals; {time.perf_counter() - started:.1f} s in all", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
