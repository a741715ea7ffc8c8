"""The "replset" Spark data source (replset/spark.py) on a real set and a real local Spark: a task that
fails after staging some blocks and is retried leaves every row once, as does one SIGKILLed and retried
with its rows in another order in a job past the dedup window; the same job again with the same write
id adds nothing, and other rows under it fail; reads return exactly the rows written, one Spark partition per part, and
a filter on the partition key reads fewer parts; overwrite replaces the table's rows; a speculative copy
of a task adds nothing."""

from __future__ import annotations

import datetime
import os
import sys
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pytest

pyspark = pytest.importorskip("pyspark")

from pyspark.sql import SparkSession  # noqa: E402

import replset.spark  # noqa: E402
from tests.support.members import wait_for  # noqa: E402
from tests.support.replica_set import ReplicaSet  # noqa: E402

TABLE = {"columns": [{"name": "ts", "type": "timestamp[ms]"}, {"name": "user", "type": "string"},
                     {"name": "n", "type": "int64"}],
         "partitionBy": "toYYYYMM(ts)", "orderBy": ["user", "ts"]}


@pytest.fixture(scope="module")
def spark(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkSession]:
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ["PYSPARK_PYTHON"] = sys.executable
    session = (SparkSession.builder.master("local[2,4]").appName("replset-tests")   # 4 tries per task
               .config("spark.driver.bindAddress", "127.0.0.1").config("spark.driver.host", "127.0.0.1")
               .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
               .config("spark.sql.shuffle.partitions", "2")
               .config("spark.sql.warehouse.dir", str(tmp_path_factory.mktemp("warehouse")))
               .getOrCreate())
    replset.spark.register(session)
    try:
        yield session
    finally:
        session.stop()


def _events(spark: SparkSession, n: int, partitions: int, months: int = 3) -> Any:
    rows = [(datetime.datetime(2024, 1 + i % months, 1 + i % 28, i % 24), f"u{i % 17}", i) for i in range(n)]
    return spark.createDataFrame(rows, "ts timestamp_ntz, user string, n long").repartition(partitions)


def _first_attempt_dies(after_rows: int, marker: str) -> Any:
    """A `mapInArrow` function that passes rows on, but whose first attempt of Spark partition 0 dies once
    `after_rows` rows went through (the writer after it has sent them), leaving the file `marker`:
    Spark runs the task again."""
    def pass_on(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from pyspark import TaskContext

        context = TaskContext.get()
        sent = 0
        for batch in batches:
            yield batch
            sent += batch.num_rows
            if context.attemptNumber() == 0 and context.partitionId() == 0 and sent >= after_rows:
                open(marker, "w").close()
                raise RuntimeError("injected: the first attempt dies after its rows were sent")
    return pass_on


def _writer(df: Any, rs: ReplicaSet, table: str, **options: Any) -> Any:
    writer = df.write.format("replset").option("uri", rs.uri).option("table", table)
    for key, value in options.items():
        writer = writer.option(key, value)
    return writer


def _read(spark: SparkSession, rs: ReplicaSet, table: str) -> Any:
    return spark.read.format("replset").option("uri", rs.uri).option("table", table).load()


def test_a_task_retried_after_committing_some_blocks_leaves_every_row_once(spark: SparkSession, rs: ReplicaSet,
                                                                           tmp_path: Any) -> None:
    rs.client().sp.command({"createPartsTable": "retried", **TABLE})
    df = _events(spark, 10_000, 4)

    marker = str(tmp_path / "died")
    flaky = df.mapInArrow(_first_attempt_dies(1_500, marker), df.schema)
    _writer(flaky, rs, "sp.retried", blockRows=500, insertQuorum=2).mode("append").save()
    assert os.path.exists(marker)   # the first attempt did die after sending blocks
    assert _read(spark, rs, "sp.retried").count() == 10_000
    assert sorted(r["n"] for r in rs.direct(rs.wait_primary()).sp.cursor_command(
        "selectParts", "retried", columns=["n"])) == list(range(10_000))


def test_the_same_job_again_with_the_same_write_id_adds_nothing(spark: SparkSession, rs: ReplicaSet) -> None:
    rs.client().sp.command({"createPartsTable": "twice", **TABLE})
    df = _events(spark, 3_000, 3)
    for _ in range(2):
        _writer(df, rs, "sp.twice", writeId="job-7", blockRows=400).mode("append").save()
    assert _read(spark, rs, "sp.twice").count() == 3_000
    # A new write id is a new job: the rows again.
    _writer(df, rs, "sp.twice", blockRows=400).mode("append").save()
    assert _read(spark, rs, "sp.twice").count() == 6_000


def test_a_speculative_copy_of_a_task_adds_nothing(spark: SparkSession, rs: ReplicaSet) -> None:
    """Two attempts of one task at once, as speculative execution runs them: the writer Spark ships to
    every attempt (pickled as Spark pickles it), one attempt staging through the primary and the other
    straight on a secondary. Spark itself will not place a speculative copy on the host that runs the
    original, and every executor of one machine is on one host, so the two attempts are started here;
    the driver's commit gets the message of the one Spark let commit."""
    import concurrent.futures

    from pyspark import cloudpickle

    rs.client().sp.command({"createPartsTable": "speculated", **TABLE})
    rows = _events(spark, 4_000, 1).toArrow()
    source = replset.spark.ReplsetDataSource({"uri": rs.uri, "table": "sp.speculated", "blockrows": "250",
                                               "insertquorum": "2"})
    writer = source.writer(rows.schema, False)
    shipped = cloudpickle.dumps(writer)
    primary = rs.wait_primary()
    secondary = next(m for m in rs.members if m is not primary)
    direct_uri = f"mongodb://{secondary.host}/?directConnection=true"

    def attempt(uri: str) -> Any:
        copy = cloudpickle.loads(shipped)
        copy.options = {**copy.options, "uri": uri}
        return copy.write(iter(rows.to_batches(max_chunksize=1_000)))

    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        sent = list(pool.map(attempt, [rs.uri, direct_uri]))
    assert sent[0].rows == sent[1].rows == 4_000 and sent[0].digest == sent[1].digest
    assert len(sent[0].stages) >= 16 and not set(sent[0].stages) & set(sent[1].stages)
    writer.commit([sent[1]])   # the secondary's attempt won
    assert _read(spark, rs, "sp.speculated").count() == 4_000
    assert sorted(r["n"] for r in rs.direct(primary).sp.cursor_command(
        "selectParts", "speculated", columns=["n"])) == list(range(4_000))
    staged = rs.client().sp.get_collection("system.parts.speculated.staged")
    assert staged.count_documents({}) == 0   # the losing attempt's stages went with the commit


def _killed_then_reordered(marker: str, after_rows: int) -> Any:
    """A `mapInArrow` function whose first attempt of Spark partition 0 SIGKILLs its own Python worker once
    `after_rows` rows went through (the writer has staged blocks of them), and whose retry sees its rows in
    reverse order (as after a shuffle)."""
    def pass_on(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        import signal

        from pyspark import TaskContext

        context = TaskContext.get()
        first = context.attemptNumber() == 0 and context.partitionId() == 0
        if not first and context.partitionId() == 0:
            everything = pa.Table.from_batches(list(batches))
            yield from everything.take(pa.array(range(everything.num_rows - 1, -1, -1))).to_batches(1_000)
            return
        sent = 0
        for batch in batches:
            yield batch
            sent += batch.num_rows
            if first and sent >= after_rows:
                open(marker, "w").close()
                os.kill(os.getpid(), signal.SIGKILL)
    return pass_on


def test_a_job_of_many_blocks_with_a_killed_task_retried_in_another_order_loads_exactly_its_rows(
        spark: SparkSession, rs: ReplicaSet, tmp_path: Any) -> None:
    """24 blocks of twelve months each: 288 block-partitions, past the table's dedup window of 100 (1,000
    by default: a smaller window keeps the test short, the point is the same), so only the job's commit
    can make it exactly-once."""
    rs.client().sp.command({"createPartsTable": "many", **TABLE,
                            "settings": {"replicatedDeduplicationWindow": 100}})
    df = _events(spark, 2_400, 2, months=12)
    marker = str(tmp_path / "killed")
    flaky = df.mapInArrow(_killed_then_reordered(marker, 700), df.schema)
    _writer(flaky, rs, "sp.many", blockRows=100, writeId="many-1").mode("append").save()
    assert os.path.exists(marker)   # the first attempt was killed after staging blocks
    assert sorted(r["n"] for r in rs.direct(rs.wait_primary()).sp.cursor_command(
        "selectParts", "many", columns=["n"])) == list(range(2_400))
    assert rs.client().sp.get_collection("system.parts.many.staged").count_documents({}) == 0
    # The same job again, its rows in another order and cut otherwise: nothing new.
    _writer(df.repartition(3), rs, "sp.many", blockRows=300, writeId="many-1").mode("append").save()
    assert _read(spark, rs, "sp.many").count() == 2_400


def test_blocks_over_more_partitions_than_a_block_may_write_are_cut(spark: SparkSession, rs: ReplicaSet) -> None:
    """A member refuses a block whose rows fall into more than `maxPartitionsPerInsertBlock` partitions
    (100): the writer stages such a block as pieces of at most 100, and the job loads every row."""
    rs.client().sp.command({"createPartsTable": "days", "columns": [{"name": "day", "type": "int32"},
                            {"name": "n", "type": "int64"}], "partitionBy": "day", "orderBy": ["n"]})
    df = spark.createDataFrame([(i % 250, i) for i in range(1_000)], "day int, n long").repartition(1)
    _writer(df, rs, "sp.days").mode("append").save()
    rows = rs.direct(rs.wait_primary()).sp.cursor_command("selectParts", "days", columns=["day", "n"])
    assert sorted((r["n"], r["day"]) for r in rows) == [(i, i % 250) for i in range(1_000)]


def test_a_committed_write_id_with_other_rows_fails_the_job(spark: SparkSession, rs: ReplicaSet) -> None:
    rs.client().sp.command({"createPartsTable": "reused", **TABLE})
    _writer(_events(spark, 1_000, 2), rs, "sp.reused", writeId="reused-1").mode("append").save()
    with pytest.raises(Exception, match=r"committed .* with other rows"):
        _writer(_events(spark, 1_001, 2), rs, "sp.reused", writeId="reused-1").mode("append").save()
    assert _read(spark, rs, "sp.reused").count() == 1_000


def test_reads_return_the_rows_written(spark: SparkSession,
                                                                                      rs: ReplicaSet) -> None:
    rs.client().sp.command({"createPartsTable": "reads", **TABLE})
    df = _events(spark, 6_000, 2, months=6)
    _writer(df, rs, "sp.reads").mode("append").save()
    table = _read(spark, rs, "sp.reads")
    assert sorted(tuple(r) for r in table.collect()) == sorted(tuple(r) for r in df.collect())
    march = table.filter(table.ts >= datetime.datetime(2024, 3, 1)).filter(table.ts < datetime.datetime(2024, 4, 1))
    assert march.count() == 1_000
    columns = (spark.read.format("replset").option("uri", rs.uri).option("table", "sp.reads")
               .option("columns", "user,n").load())
    assert columns.columns == ["user", "n"] and columns.count() == 6_000
    # From a secondary's parts (it may still be fetching the last ones).
    on_secondary = (spark.read.format("replset").option("uri", rs.uri).option("table", "sp.reads")
                    .option("readPreference", "secondary"))
    wait_for(lambda: on_secondary.load().count() == 6_000, 60, "a secondary's parts to hold every row")


def test_each_action_on_a_dataframe_reads_the_table_as_it_is_then(spark: SparkSession, rs: ReplicaSet) -> None:
    """Spark plans a loaded DataFrame once and replays that plan for every action: the parts each action
    reads are decided when it runs (a snapshot per action), so a DataFrame loaded before an append
    counts the appended rows too, and a merge meanwhile changes nothing."""
    rs.client().sp.command({"createPartsTable": "stale", **TABLE, "settings": {"mergeSelectingSleepMS": 100}})
    _writer(_events(spark, 4_000, 2), rs, "sp.stale").mode("append").save()
    table = _read(spark, rs, "sp.stale")
    assert table.count() == 4_000
    _writer(_events(spark, 4_000, 2), rs, "sp.stale").mode("append").save()
    assert table.count() == 8_000
    assert table.filter("n < 10").count() == 20
    assert table.count() == 8_000


def test_a_load_filter_on_the_partition_key_reads_fewer_parts(spark: SparkSession, rs: ReplicaSet) -> None:
    rs.client().sp.command({"createPartsTable": "buckets", "columns": [
        {"name": "bucket", "type": "int64"}, {"name": "n", "type": "int64"}], "partitionBy": "bucket",
        "orderBy": ["n"]})
    df = spark.createDataFrame([(i % 5, i) for i in range(1_000)], "bucket long, n long").repartition(1)
    _writer(df, rs, "sp.buckets").mode("append").save()
    # One Spark partition per part (small parts grouped): a grouping limit of one byte shows the parts.
    per_part = (spark.read.format("replset").option("uri", rs.uri).option("table", "sp.buckets")
                .option("partitionBytes", 1).load())
    assert per_part.rdd.getNumPartitions() == 5
    pruned = (spark.read.format("replset").option("uri", rs.uri).option("table", "sp.buckets")
              .option("partitionBytes", 1).option("filter", '{"bucket": {"$in": [1, 3]}, "n": {"$lt": 900}}').load())
    assert pruned.rdd.getNumPartitions() == 2
    assert sorted(r["n"] for r in pruned.collect()) == [i for i in range(900) if i % 5 in (1, 3)]


def test_a_filtered_query_never_changes_the_next_query_on_the_same_dataframe(spark: SparkSession,
                                                                              rs: ReplicaSet) -> None:
    """Spark 4.3 caches the read plan of a load and replaces it with the plan of a query whose filters were
    pushed: a pruning source answered the filtered count to the next plain count. With pushdown on, as a
    session may have it, each query counts its own rows, in either order."""
    rs.client().sp.command({"createPartsTable": "countries", "columns": [
        {"name": "country", "type": "string"}, {"name": "n", "type": "int64"}], "partitionBy": "country",
        "orderBy": ["n"]})
    countries = ["fr", "de", "it", "es"]
    df = spark.createDataFrame([(countries[i % 4], i) for i in range(2_400)], "country string, n long")
    _writer(df, rs, "sp.countries").mode("append").save()
    spark.conf.set("spark.sql.python.filterPushdown.enabled", "true")
    try:
        table = _read(spark, rs, "sp.countries")
        assert table.count() == 2_400
        assert table.filter("country = 'fr'").count() == 600
        assert table.count() == 2_400
        assert table.filter("country = 'de'").count() == 600
        first_filtered = _read(spark, rs, "sp.countries")
        assert first_filtered.filter("country = 'it'").count() == 600
        assert first_filtered.count() == 2_400
    finally:
        spark.conf.unset("spark.sql.python.filterPushdown.enabled")


def test_overwrite_replaces_the_rows(spark: SparkSession, rs: ReplicaSet) -> None:
    rs.client().sp.command({"createPartsTable": "over", **TABLE})
    _writer(_events(spark, 2_000, 2), rs, "sp.over").mode("append").save()
    _writer(_events(spark, 500, 2), rs, "sp.over").mode("overwrite").save()
    assert _read(spark, rs, "sp.over").count() == 500


def _partition_1_always_fails(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    from pyspark import TaskContext

    for batch in batches:
        yield batch
        if TaskContext.get().partitionId() == 1:
            raise RuntimeError("injected: this task fails in every attempt")


def test_an_overwrite_that_fails_leaves_the_table_as_it_was(spark: SparkSession, rs: ReplicaSet) -> None:
    rs.client().sp.command({"createPartsTable": "kept", **TABLE})
    _writer(_events(spark, 2_000, 2), rs, "sp.kept").mode("append").save()
    df = _events(spark, 500, 2)
    with pytest.raises(Exception, match="injected"):
        _writer(df.mapInArrow(_partition_1_always_fails, df.schema), rs, "sp.kept").mode("overwrite").save()
    assert _read(spark, rs, "sp.kept").count() == 2_000   # the job's abort removed its stages; nothing dropped
    assert rs.client().sp.get_collection("system.parts.kept.staged").count_documents({}) == 0


def test_a_collection_written_by_a_retried_task_holds_every_document_once(spark: SparkSession, rs: ReplicaSet,
                                                                          tmp_path: Any) -> None:
    df = spark.createDataFrame([(i, f"user{i}", datetime.date(2024, 1, 1 + i % 28)) for i in range(2_000)],
                               "n long, name string, day date").repartition(2)

    marker = str(tmp_path / "died")
    flaky = df.mapInArrow(_first_attempt_dies(300, marker), df.schema)
    (flaky.write.format("replset").option("uri", rs.uri).option("collection", "sp.users")
     .option("writeId", "users-1").option("batchSize", 100).mode("append").save())
    assert os.path.exists(marker)
    docs = list(rs.client().sp.users.find({}, {"_id": 1, "n": 1, "day": 1}))
    assert sorted(d["n"] for d in docs) == list(range(2_000))   # once each: the retry replaced, not added
    assert all(d["_id"].startswith("users-1-") for d in docs)
    assert {d["day"] for d in docs if d["n"] == 3} == {datetime.datetime(2024, 1, 4)}
    # Rows that carry an _id keep it; overwrite drops what was there.
    with_ids = spark.createDataFrame([(f"k{i}", i) for i in range(50)], "_id string, n long")
    (with_ids.write.format("replset").option("uri", rs.uri).option("collection", "sp.users")
     .mode("overwrite").save())
    assert sorted(d["_id"] for d in rs.client().sp.users.find()) == sorted(f"k{i}" for i in range(50))


def test_a_collection_is_read_in_id_ranges_every_document_once(spark: SparkSession, rs: ReplicaSet) -> None:
    from bson import ObjectId

    docs = [{"_id": ObjectId(), "n": i, "name": f"u{i}", "when": datetime.datetime(2024, 1, 1 + i % 28),
             **({"extra": i} if i % 2 else {})} for i in range(1_000)]
    rs.client().sp.people.insert_many(docs)
    people = (spark.read.format("replset").option("uri", rs.uri).option("collection", "sp.people")
              .option("partitionDocuments", 300).load())
    assert people.columns[0] == "_id" and set(people.columns) == {"_id", "n", "name", "when", "extra"}
    assert people.rdd.getNumPartitions() == 4   # splitVector: cuts after 300, 600 and 900 documents
    rows = people.collect()
    assert sorted(r["n"] for r in rows) == list(range(1_000))
    assert sorted(r["_id"] for r in rows) == sorted(str(d["_id"]) for d in docs)
    assert {r["n"]: r["extra"] for r in rows}[7] == 7 and {r["n"]: r["extra"] for r in rows}[8] is None
    # A round trip through Spark keeps every document once.
    people.write.format("replset").option("uri", rs.uri).option("collection", "sp.people_copy").mode(
        "append").save()
    assert rs.client().sp.people_copy.count_documents({}) == 1_000


def test_a_collection_whose_ids_are_of_several_types_is_read_whole(spark: SparkSession, rs: ReplicaSet) -> None:
    """Ranges whose ends are of two BSON types (the issue's {_id: 1}, {_id: "a"}, an ObjectId: 1 of 3 read)."""
    from bson import ObjectId

    ids: list[Any] = [*range(30), *(f"s{i:02d}" for i in range(30)), *(ObjectId() for _ in range(30)),
                      None, datetime.datetime(2024, 1, 1), True, 2.5]
    rs.client().sp.mixed.insert_many([{"_id": _id, "n": i} for i, _id in enumerate(ids)])
    mixed = (spark.read.format("replset").option("uri", rs.uri).option("collection", "sp.mixed")
             .option("partitionDocuments", 7).load())
    assert mixed.rdd.getNumPartitions() > 5
    assert sorted(r["n"] for r in mixed.select("n").collect()) == list(range(len(ids)))


def _mongodb(reader_or_writer: Any, rs: ReplicaSet, db: str, coll: str) -> Any:
    return (reader_or_writer.format("mongodb").option("connection.uri", rs.uri).option("database", db)
            .option("collection", coll))


def test_the_connectors_option_names_read_through_a_pipeline_and_update_by_id_fields(spark: SparkSession,
                                                                                     rs: ReplicaSet) -> None:
    client = rs.client()
    client.shop.orders.insert_many([{"_id": i, "paid": i % 2 == 0, "amount": i, "shop": f"s{i % 3}"}
                                    for i in range(300)])
    paid = (_mongodb(spark.read, rs, "shop", "orders").option("partitionDocuments", 50)
            .option("aggregation.pipeline", '[{"$match": {"paid": true}}, {"$project": {"amount": 1, "shop": 1}}]')
            .load())
    assert set(paid.columns) == {"_id", "amount", "shop"} and paid.count() == 150
    totals = paid.groupBy("shop").sum("amount").withColumnRenamed("sum(amount)", "total")
    client.shop.totals.insert_many([{"_id": "a", "shop": "s0", "note": "kept"}, {"_id": "b", "shop": "s1"}])
    (_mongodb(totals.write, rs, "shop", "totals").option("operationType", "update").option("idFieldList", "shop")
     .option("upsertDocument", "false").option("writeConcern.w", "majority").option("ordered", "false")
     .mode("append").save())
    docs = {d["shop"]: d for d in client.shop.totals.find()}
    assert set(docs) == {"s0", "s1"}, "no upsert: s2 has no document"
    assert docs["s0"]["note"] == "kept" and docs["s0"]["_id"] == "a"
    assert docs["s0"]["total"] == sum(i for i in range(0, 300, 2) if i % 3 == 0)
    assert docs["s1"]["total"] == sum(i for i in range(0, 300, 2) if i % 3 == 1)


def test_an_insert_retried_in_another_order_writes_each_row_once(spark: SparkSession, rs: ReplicaSet,
                                                                 tmp_path: Any) -> None:
    """Rows without _id, many of them equal: the retry of a killed task sees them reversed and writes none
    twice (their made _ids do not depend on the order), and the insert takes its own earlier documents as
    written."""
    df = spark.createDataFrame([(i % 50, f"u{i % 100}") for i in range(3_000)], "n long, name string").repartition(2)
    marker = str(tmp_path / "killed")
    flaky = df.mapInArrow(_killed_then_reordered(marker, 600), df.schema)
    (_mongodb(flaky.write, rs, "sp", "inserted").option("operationType", "insert").option("maxBatchSize", 100)
     .mode("append").save())
    assert os.path.exists(marker)
    assert rs.client().sp.inserted.count_documents({}) == 3_000
    assert rs.client().sp.inserted.count_documents({"name": "u7"}) == 30


def test_a_value_that_does_not_fit_its_column_is_null_or_fails_the_read(spark: SparkSession, rs: ReplicaSet) -> None:
    rs.client().sp.typed.insert_many([*({"_id": i, "n": i} for i in range(10)), {"_id": 10, "n": "ten"}])
    permissive = _mongodb(spark.read.schema("_id long, n long"), rs, "sp", "typed").load()
    assert {r["_id"]: r["n"] for r in permissive.collect()} == {**{i: i for i in range(10)}, 10: None}
    with pytest.raises(Exception, match="does not fit"):
        _mongodb(spark.read.schema("_id long, n long"), rs, "sp", "typed").option("mode", "FAILFAST").load().collect()


def test_a_change_stream_is_a_structured_stream_resumed_from_its_checkpoint(spark: SparkSession, rs: ReplicaSet,
                                                                            tmp_path: Any) -> None:
    """readStream over a collection's change stream: the events after the query started, each once; a
    query restarted from its checkpoint goes on after the last resume token it committed."""
    coll = rs.client().sp.streamed
    coll.insert_one({"_id": -1, "n": -1})   # before the stream started: not an event of it
    checkpoint = str(tmp_path / "checkpoint")
    seen: list[tuple[Any, ...]] = []

    def start() -> Any:
        stream = _mongodb(spark.readStream.schema("_id long, n long, operationType string"), rs, "sp",
                          "streamed").option("change.stream.lookup.full.document", "updateLookup").load()
        return (stream.writeStream.option("checkpointLocation", checkpoint).trigger(processingTime="200 milliseconds")
                .foreachBatch(lambda batch, _id: seen.extend(tuple(r) for r in batch.collect())).start())

    query = start()
    try:
        wait_for(lambda: query.lastProgress is not None, 60, "the query's first trigger (its initial offset)")
        coll.insert_many([{"_id": i, "n": i} for i in range(10)])
        coll.update_one({"_id": 3}, {"$set": {"n": 30}})
        wait_for(lambda: len(seen) >= 11, 60, "the first eleven events")
        # Spark logs a batch's commit after foreachBatch returns: a query stopped in between runs that
        # batch again when it restarts (at-least-once, by design). Stop once everything is committed.
        query.processAllAvailable()
    finally:
        query.stop()
    assert sorted(seen) == sorted([*((i, i, "insert") for i in range(10)), (3, 30, "update")])
    coll.insert_many([{"_id": i, "n": i} for i in range(10, 15)])   # while no query runs
    query = start()
    try:
        wait_for(lambda: len(seen) >= 16, 60, "the events after the checkpoint")
    finally:
        query.stop()
    assert sorted(seen[11:]) == [(i, i, "insert") for i in range(10, 15)]


def test_a_zero_copy_part_is_read_from_the_shared_storage_with_no_member_in_the_path(tmp_path: Any) -> None:
    """A task reads a zero-copy table's part from the storage the snapshot names: its only listed copy is
    on a member that does not answer, and the rows still come, checked against the copy's checksums."""
    import dataclasses

    from oplog.parts import part_files as pf
    from oplog.parts.storage_url import part_key
    from oplog.parts.table import parse_table_def

    table = dataclasses.replace(parse_table_def("sp", "zc", {**TABLE, "settings": {"zeroCopy": True}}),
                                uuid="0f8fad5b-d9cb-469f-a165-70867728950e")
    rows = pa.table({"ts": pa.array([datetime.datetime(2024, 1, 1 + i % 28) for i in range(100)], pa.timestamp("ms")),
                     "user": [f"u{i % 3}" for i in range(100)], "n": pa.array(range(100), pa.int64())})
    written = tmp_path / "written"
    files = pf.write_part(str(written), "202401_1_1_0", pf.conform(table, rows), table)
    url = f"file://{tmp_path / 'shared'}"
    key = part_key(table.uuid, "202401", files.checksums)
    pf.externalize(str(written / "202401_1_1_0"), url, key)
    sums = [{"file": f, "size": size, "sha256": digest} for f, (size, digest) in files.checksums.items()]
    part = {"name": "202401_1_1_0", "partition": "202401",
            "holders": [{"member": "127.0.0.1:1", "http": "127.0.0.1:1", "checksums": sums}]}
    reader = replset.spark.PartsReader({"uri": "mongodb://127.0.0.1:1/", "table": "sp.zc"}, table.to_document(), ["n"])
    directory = tmp_path / "task"
    directory.mkdir()
    reader._fetch("sp.zc", part, str(directory), table, url)
    assert pf.shared_location(str(directory / "202401_1_1_0")) == (url, key)
    assert sorted(pf.read_part(str(directory / "202401_1_1_0"), table).column("n").to_pylist()) == list(range(100))
