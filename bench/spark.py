"""Spark against a real three-member set: load and read rates of the "replset" data source.

    python -m bench.spark [--rows N]

Printed next to baselines measured in the same run, as ratios:

* **load rows/s**: 1,000,000 rows (`--rows`) written through Spark into a parts table with
  `insertQuorum: 2`, next to the native path (the same rows as Arrow, sent with `insertBlock` in
  blocks of 100,000 with quorum 2 from one client) and to plain `df.write.parquet` of the same
  DataFrame;
* **read rows/s**: the table read back through Spark (every column, to Arrow on the driver), next to
  `pyarrow.dataset` reading the Parquet files of the baseline write.

Each path runs once untimed first, on a tenth of the rows (Spark's Python workers started, modules
imported). Timings are printed, never asserted.
"""

from __future__ import annotations

import argparse
import io
import os
import sys
import tempfile
import time

import pyarrow as pa
import pyarrow.dataset as ds

from tests.support.replica_set import make_replica_set

TABLE = {"columns": [{"name": "ts", "type": "timestamp[ms]"}, {"name": "user", "type": "string"},
                     {"name": "amount", "type": "int64"}],
         "partitionBy": "toYYYYMM(ts)", "orderBy": ["user", "ts"]}
BLOCK_ROWS = 100_000


def _events(spark: object, rows: int) -> object:
    from pyspark.sql import functions as F

    return (spark.range(rows, numPartitions=4)  # type: ignore[attr-defined]
            .select(F.timestamp_seconds(F.lit(1_704_067_200) + F.col("id") * 37 % 15_552_000)
                    .cast("timestamp_ntz").alias("ts"),
                    F.concat(F.lit("u"), (F.col("id") * 7919 % 1000).cast("string")).alias("user"),
                    (F.col("id") % 100 + 1).alias("amount")))


def _timed(fn: object) -> float:
    started = time.perf_counter()
    fn()  # type: ignore[operator]
    return time.perf_counter() - started


def main() -> None:
    from pyspark.sql import SparkSession

    import replset.spark

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    rows = parser.parse_args().rows
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ["PYSPARK_PYTHON"] = sys.executable
    with tempfile.TemporaryDirectory() as directory:
        rs = make_replica_set(directory, 3)
        rs.start()
        spark = (SparkSession.builder.master("local[2]").config("spark.driver.bindAddress", "127.0.0.1")
                 .config("spark.driver.host", "127.0.0.1").config("spark.ui.enabled", "false")
                 .config("spark.ui.showConsoleProgress", "false").getOrCreate())
        spark.sparkContext.setLogLevel("ERROR")
        replset.spark.register(spark)
        try:
            rs.initiate()
            db = rs.client().bench
            for name in ("spark", "native", "warm"):
                db.command({"createPartsTable": name, **TABLE})
            # Warm-up, untimed: Spark's Python workers started, the data source's modules imported, the
            # members' paths taken once, on a tenth of the rows into a table of their own.
            warm = _events(spark, max(1, rows // 10))
            warm.write.format("replset").option("uri", rs.uri).option("table", "bench.warm").mode("append").save()
            spark.read.format("replset").option("uri", rs.uri).option("table", "bench.warm").load().toArrow()
            warm.write.parquet(os.path.join(directory, "warm.parquet"))
            df = _events(spark, rows).cache()  # type: ignore[attr-defined]
            df.count()
            arrow = df.toArrow()
            parquet_dir = os.path.join(directory, "baseline.parquet")

            through_spark = _timed(lambda: df.write.format("replset").option("uri", rs.uri)
                                   .option("table", "bench.spark").option("insertQuorum", 2).mode("append").save())

            def native() -> None:
                for start in range(0, arrow.num_rows, BLOCK_ROWS):
                    sink = io.BytesIO()
                    block = arrow.slice(start, BLOCK_ROWS)
                    with pa.ipc.new_stream(sink, block.schema) as stream:
                        stream.write_table(block)
                    db.command({"insertBlock": "native", "arrow": sink.getvalue(), "insertQuorum": 2})

            natively = _timed(native)
            plain = _timed(lambda: df.write.parquet(parquet_dir))
            print(f"load {rows:,} rows, quorum 2: through Spark {rows / through_spark:,.0f} rows/s; native "
                  f"insertBlock {rows / natively:,.0f} rows/s (ratio {natively / through_spark:.2f}); "
                  f"df.write.parquet {rows / plain:,.0f} rows/s (ratio {plain / through_spark:.2f})")

            table = spark.read.format("replset").option("uri", rs.uri).option("table", "bench.spark").load()
            read_back: list[int] = []
            through_spark_read = _timed(lambda: read_back.append(table.toArrow().num_rows))
            assert read_back == [rows], read_back
            dataset = _timed(lambda: ds.dataset(parquet_dir, format="parquet").to_table())
            print(f"read {rows:,} rows: through Spark {rows / through_spark_read:,.0f} rows/s; pyarrow.dataset "
                  f"over the same rows as Parquet files {rows / dataset:,.0f} rows/s; "
                  f"ratio {dataset / through_spark_read:.2f}")
        finally:
            spark.stop()
            rs.stop()


if __name__ == "__main__":
    main()
