"""The vibemq data source in a real local SparkSession: batch, stream and writer."""

from __future__ import annotations

import asyncio
import json
import shutil
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from brokerwork import consume, publish_more

from vibemq_server.spark import journal_reader as jr

pytestmark = pytest.mark.spark


def _pure_rows(data: Path) -> list[jr.Row]:
    return [r for s in jr.list_segment_files(data) for r in jr.read_rows(s.path, s.number)]


def test_batch_read_of_a_real_broker_journal(spark: Any, broker_journal: tuple[Path, Any]) -> None:
    data, work = broker_journal
    df = spark.read.format("vibemq").load(str(data))
    assert df.rdd.getNumPartitions() == len(jr.list_segment_files(data))
    rows = df.collect()
    assert len(rows) == len(_pure_rows(data))
    pubs = [r for r in rows if r.record_type == "PUBLISH" and r.queue == "orders"]
    assert len(pubs) == work.published
    assert sorted(json.loads(r.payload)["order"] for r in pubs) == list(range(work.published))
    assert all(r.payload_binary == r.payload.encode() for r in pubs)
    assert all(r.headers["shop"] == f"s{json.loads(r.payload)['order'] % 3}" for r in pubs)
    assert all(r.published_at is not None and r.segment >= 1 for r in pubs)
    acks = [r for r in rows if r.record_type == "SETTLE" and r.settle_reason == "ACKED"]
    assert len(acks) == work.acked and all(
        r.settled_at >= min(p.published_at for p in pubs) for r in acks
    )
    redelivered = [r for r in rows if r.record_type == "DELIVER" and r.delivery_attempts == 2]
    assert len(redelivered) == work.redelivered
    dead = [r for r in rows if r.dead_letter_reason == "MessageExpired"]
    assert {r.record_type for r in dead} == {"SETTLE", "PUBLISH"}
    assert len([r for r in dead if r.queue == "ephemeral.dlq"]) == work.expired_to_dlq
    # Options: a queue filter and a time range.
    only = spark.read.format("vibemq").option("queue", "ephemeral.dlq").load(str(data))
    assert only.count() == work.expired_to_dlq + 1  # the publishes and the QUEUE_CREATE
    future = spark.read.format("vibemq").option("startTime", "2999-01-01T00:00:00Z").load(str(data))
    assert future.count() == 0
    # SQL over it.
    df.createOrReplaceTempView("journal")
    (n,) = spark.sql(
        "SELECT count(*) FROM journal WHERE record_type = 'PUBLISH' AND queue = 'orders'"
    ).first()
    assert n == work.published


def test_batch_read_equals_the_per_record_reader_and_pushes_filters(
    spark: Any, tmp_path: Path
) -> None:
    from datetime import UTC, datetime

    from pyspark.sql.functions import col, lit

    from vibemq_server.spark.generate import START_MS, generate

    data = tmp_path / "data"
    generate(data, 3000, segment_size=64 * 1024, payload_size=300)
    expected = _pure_rows(data)
    got = spark.read.format("vibemq").load(str(data)).collect()
    assert [tuple(r) for r in got] == [_as_spark(r) for r in expected]
    # queue = ... AND timestamp in a range: pushed down, same rows as Spark filtering them.
    lo = datetime.fromtimestamp((START_MS + 700) / 1000, UTC)
    hi = datetime.fromtimestamp((START_MS + 1900) / 1000, UTC)
    where = (col("queue") == "q1") & (col("timestamp") >= lit(lo)) & (col("timestamp") < lit(hi))
    pushed = spark.read.format("vibemq").load(str(data)).where(where)
    # The same rows as the options, and as the reference reader with the same segment skip
    # (the generator's records are not in time order, a broker's are).
    window = jr.RowFilter(frozenset({"q1"}), START_MS + 700, START_MS + 1900)
    want = [
        (seg.number, row[1])
        for seg in jr.segments_for(str(data), window)
        for row in jr.read_rows(seg.path, seg.number, row_filter=window)
    ]
    assert want and sorted(tuple(r) for r in pushed.select("segment", "offset").collect()) == want
    options = spark.read.format("vibemq").option("queue", "q1")
    options = options.option("startTime", str(START_MS + 700)).option(
        "endTime", str(START_MS + 1900)
    )
    assert options.load(str(data)).count() == len(want)


def _as_spark(row: jr.Row) -> tuple[Any, ...]:
    """A reference row as Spark returns it (timestamps as naive local datetimes, maps as
    dicts)."""
    from datetime import datetime

    out = list(row)
    for name in jr.TIMESTAMP_COLUMNS:
        i = jr.COLUMNS.index(name)
        if out[i] is not None:
            out[i] = datetime.fromtimestamp(out[i] // 1_000_000).replace(
                microsecond=out[i] % 1_000_000
            )
    return tuple(out)


def test_batch_read_stops_before_a_torn_tail(
    spark: Any, broker_journal: tuple[Path, Any], tmp_path: Path
) -> None:
    src, _ = broker_journal
    data = tmp_path / "data"
    shutil.copytree(src, data)
    last = jr.list_segment_files(data)[-1]
    offsets = [off for off, _ in jr.read_entries(last.path)]
    full = len(_pure_rows(data))
    with open(last.path, "r+b") as f:
        f.truncate(offsets[-1] + 11)  # the last record cut mid-way, as a crash leaves it
    df = spark.read.format("vibemq").load(str(data))
    assert df.count() == full - 1
    assert df.filter(f"segment = {last.number} AND offset = {offsets[-1]}").count() == 0


def _run_available_now(
    spark: Any, source: Path, out: Path, checkpoint: Path, **options: str
) -> Any:
    reader = spark.readStream.format("vibemq")
    for key, value in options.items():
        reader = reader.option(key, value)
    query = (
        reader.load(str(source))
        .select("segment", "offset", "record_type", "queue", "payload")
        .writeStream.format("parquet")
        .option("path", str(out))
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(120)
    assert not query.isActive
    return query


def test_stream_available_now_and_restart_from_checkpoint(
    spark: Any, broker_journal: tuple[Path, Any], broker_proc: Any, tmp_path: Path
) -> None:
    src, _ = broker_journal
    data = tmp_path / "data"
    shutil.copytree(src, data)
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
    first = len(_pure_rows(data))
    query = _run_available_now(spark, data, out, checkpoint, maxRecordsPerTrigger="50")
    batches = [p for p in query.recentProgress if p["numInputRows"] > 0]
    assert len(batches) == -(-first // 50)  # ceil: maxRecordsPerTrigger was honoured
    assert max(p["numInputRows"] for p in batches) == 50
    assert spark.read.parquet(str(out)).count() == first
    # The broker runs again on the same data (a new segment) and more is published. Its
    # housekeeping (which reclaims settled segments) is held off for the run: a reclaimed
    # segment 1 would make the record count depend on how long the run took.
    config = tmp_path / "no-housekeeping.toml"
    config.write_text("housekeeping_interval_ms = 3600000\n")
    proc = broker_proc(data, "--config", str(config))
    asyncio.run(publish_more(proc.port, "orders", 25))
    proc.stop()
    total = len(_pure_rows(data))
    assert total > first + 25
    _run_available_now(spark, data, out, checkpoint, maxRecordsPerTrigger="50")
    result = spark.read.parquet(str(out))
    assert result.count() == total
    assert result.select("segment", "offset").distinct().count() == total  # nothing twice
    assert result.filter("record_type = 'PUBLISH' AND payload LIKE '%more%'").count() == 25


def test_stream_starting_offsets(
    spark: Any, broker_journal: tuple[Path, Any], tmp_path: Path
) -> None:
    data, _ = broker_journal
    rows = _pure_rows(data)
    _run_available_now(spark, data, tmp_path / "latest", tmp_path / "c1", startingOffsets="latest")
    assert (
        not (tmp_path / "latest").exists()
        or spark.read.parquet(str(tmp_path / "latest")).count() == 0
    )
    seg, off = rows[10][0], rows[10][1]
    start = json.dumps({"segment": seg, "position": off})
    _run_available_now(spark, data, tmp_path / "json", tmp_path / "c2", startingOffsets=start)
    assert spark.read.parquet(str(tmp_path / "json")).count() == len(rows) - 10


def test_fail_on_data_loss_both_ways(spark: Any, tmp_path: Path) -> None:
    from vibemq_server.spark.generate import generate

    full = tmp_path / "full"
    generate(full, 600, segment_size=32 * 1024)
    segs = jr.list_segment_files(full)
    assert len(segs) >= 3
    data = tmp_path / "data"
    (data / "journal").mkdir(parents=True)
    shutil.copy(segs[0].path, data / "journal")  # the broker has written segment 1 so far
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
    _run_available_now(spark, data, out, checkpoint)
    first = len(_pure_rows(data))
    assert spark.read.parquet(str(out)).count() == first
    # The broker went on to segments 2..n and reclaimed segment 1 before the next run.
    for seg in segs[1:]:
        shutil.copy(seg.path, data / "journal")
    (data / "journal" / Path(segs[0].path).name).unlink()
    rest = len(_pure_rows(data))
    shutil.copytree(checkpoint, tmp_path / "checkpoint2")
    with pytest.raises(Exception, match="segment 1 is gone"):
        _run_available_now(spark, data, out, checkpoint, failOnDataLoss="true")
    out2 = tmp_path / "out2"
    _run_available_now(spark, data, out2, tmp_path / "checkpoint2", failOnDataLoss="false")
    # It went on from segment 2: everything there is, nothing of segment 1 again.
    result = spark.read.parquet(str(out2 / "*.parquet"))  # batch 1 of a query whose 0 is elsewhere
    assert result.count() == rest
    assert result.filter("segment = 1").count() == 0


def test_writer_publishes_into_a_real_broker(spark: Any, broker_proc: Any) -> None:
    proc = broker_proc()
    df = spark.range(0, 300, numPartitions=3).selectExpr(
        "to_json(named_struct('n', id)) AS payload",
        "map('source', 'spark', 'part', cast(id % 3 AS STRING)) AS headers",
    )
    (
        df.write.format("vibemq")
        .option("host", "127.0.0.1")
        .option("port", str(proc.port))
        .option("queue", "from-spark")
        .mode("append")
        .save()
    )
    got = asyncio.run(consume(proc.port, "from-spark", 300))
    assert sorted(json.loads(raw)["n"] for raw in got) == list(range(300))


def test_stream_writer_publishes(spark: Any, broker_proc: Any, tmp_path: Path) -> None:
    from vibemq_server.spark.generate import generate

    source = tmp_path / "journal"
    generate(source, 40, queues=2, segment_size=8 * 1024)
    proc = broker_proc()
    query = (
        spark.readStream.format("vibemq")
        .option("queue", "q0")
        .load(str(source))
        .filter("record_type = 'PUBLISH'")
        .select("queue", "payload", "headers")
        .writeStream.format("vibemq")
        .option("host", "127.0.0.1")
        .option("port", str(proc.port))
        .option("queue", "copied")
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(120)
    got = asyncio.run(consume(proc.port, "copied", 20))
    assert sorted(json.loads(raw)["n"] for raw in got) == list(range(0, 40, 2))


def test_writer_fails_when_the_broker_goes_away(spark: Any, broker_proc: Any) -> None:
    proc = broker_proc()
    journal = proc.data_dir / "journal"

    def kill_when_publishing() -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if sum(s.size for s in jr.list_segment_files(journal)) > 200_000:
                break
            time.sleep(0.05)
        proc.kill()

    killer = threading.Thread(target=kill_when_publishing, daemon=True)
    killer.start()
    df = spark.range(0, 2_000_000, numPartitions=2).selectExpr(
        "to_json(named_struct('n', id)) AS payload"
    )
    with pytest.raises(Exception) as info:
        df.write.format("vibemq").option("port", str(proc.port)).option("queue", "doomed").mode(
            "append"
        ).save()
    killer.join(70)
    text = str(info.value)
    assert "ConnectionLost" in text or "ConnectionFailed" in text or "connection" in text.lower()
    assert proc.proc.returncode is not None


def test_writer_fails_when_the_broker_refuses(spark: Any, broker_proc: Any) -> None:
    """A refused publish (a full DropNewest queue answers QUEUE_FULL) fails the task, and so
    the job, rather than being counted as written."""
    from vibemq_server.client import Client

    proc = broker_proc()

    async def make_small_queue() -> None:
        async with await Client.connect("127.0.0.1", proc.port) as client:
            await client.create_queue("small", max_queue_size=10, overflow_strategy="DropNewest")

    asyncio.run(make_small_queue())
    df = spark.range(0, 50, numPartitions=1).selectExpr("to_json(named_struct('n', id)) AS payload")
    with pytest.raises(Exception) as info:
        (
            df.write.format("vibemq")
            .option("port", str(proc.port))
            .option("queue", "small")
            .mode("append")
            .save()
        )
    assert "QUEUE_FULL" in str(info.value)
    # Exactly what the queue took is there: the first 10 rows.
    got = asyncio.run(consume(proc.port, "small", 10))
    assert sorted(json.loads(raw)["n"] for raw in got) == list(range(10))
