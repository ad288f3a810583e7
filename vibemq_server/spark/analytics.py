"""``vibemq-analytics``: journal → Parquet tables + a self-contained HTML report, on Spark.

    vibemq-analytics DATA_DIR OUT_DIR [--master local[*]] [--queue q1,q2] [--since T] [--until T]
    spark-submit --master spark://host:7077 -m ... (see docs/spark.md)

Tables written under ``OUT_DIR`` (Parquet, one directory each):

* ``per_minute``: queue, minute, published, delivered, acked, dead_lettered, expired, dropped
* ``latency``: queue, messages, p50_ms, p95_ms, p99_ms, mean_ms, max_ms (publish → ack; the
  queue ``*`` row is all queues together)
* ``redeliveries``: queue, deliveries, messages (how many messages were delivered n times)
* ``dead_letters``: queue, reason, messages
* ``payload_sizes``: queue, size_bucket (upper bound in bytes, powers of two), messages

and ``report.html``. All aggregation is Spark DataFrame work; only the aggregated results are
collected for the report.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from vibemq_server.spark.report import KINDS, ReportData, render

TABLES = ("per_minute", "latency", "redeliveries", "dead_letters", "payload_sizes")


def spark_session(master: str | None, app_name: str) -> Any:
    """A SparkSession with the vibemq data source registered. ``master`` None means
    ``local[*]``, unless the job runs under ``spark-submit``, whose ``--master`` then rules."""
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.appName(app_name)
    under_submit = "PYSPARK_GATEWAY_PORT" in os.environ
    if master is not None or not under_submit:
        builder = builder.master(master or "local[*]")
    if (master or "local").startswith("local") and not under_submit:
        # Local Python workers must import this package: without PYSPARK_PYTHON Spark starts
        # whatever `python3` is on PATH, which need not be the environment this job runs in
        # (a console script from a virtualenv that is not activated). On a cluster the
        # executors' Python is the deployment's to set.
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    session = builder.getOrCreate()
    from vibemq_server.spark import register

    register(session)
    return session


def load_journal(
    spark: Any,
    data_dir: str,
    queues: str | None = None,
    since: str | None = None,
    until: str | None = None,
) -> Any:
    # the JVM source when its jar loads, else the Python one (the same rows: docs/spark.md)
    reader = spark.read.format("vibemq")
    if queues:
        reader = reader.option("queue", queues)
    if since:
        reader = reader.option("startTime", since)
    if until:
        reader = reader.option("endTime", until)
    return reader.load(data_dir)


def build_tables(journal: Any) -> dict[str, Any]:
    """The analytics tables as DataFrames (lazy)."""
    from pyspark.sql import functions as F

    publishes = journal.filter(F.col("record_type") == "PUBLISH").dropDuplicates(["seq"])
    delivers = journal.filter(F.col("record_type") == "DELIVER")
    settles = journal.filter(F.col("record_type") == "SETTLE")

    minute = F.date_trunc("minute", F.col("time")).alias("minute")
    events = (
        publishes.select(
            "queue", F.col("published_at").alias("time"), F.lit("published").alias("kind")
        )
        .unionByName(
            delivers.select(
                "queue", F.col("timestamp").alias("time"), F.lit("delivered").alias("kind")
            )
        )
        .unionByName(
            settles.select(
                "queue",
                F.col("timestamp").alias("time"),
                F.lower(F.col("settle_reason")).alias("kind"),
            )
        )
    )
    per_minute = (
        events.groupBy("queue", minute)
        .agg(*[F.count(F.when(F.col("kind") == k, 1)).alias(k) for k in KINDS])
        .orderBy("queue", "minute")
    )

    acks = settles.filter(F.col("settle_reason") == "ACKED").select("seq", F.col("settled_at"))
    latencies = (
        publishes.select("seq", "queue", "published_at")
        .join(acks, "seq")
        .select(
            "queue",
            (F.unix_millis(F.col("settled_at")) - F.unix_millis(F.col("published_at"))).alias("ms"),
        )
    )

    def latency_stats() -> list[Any]:
        pct = F.percentile_approx("ms", [0.5, 0.95, 0.99], 10000)
        return [
            F.count("*").alias("messages"),
            pct[0].cast("double").alias("p50_ms"),
            pct[1].cast("double").alias("p95_ms"),
            pct[2].cast("double").alias("p99_ms"),
            F.avg("ms").alias("mean_ms"),
            F.max("ms").cast("double").alias("max_ms"),
        ]

    latency = (
        latencies.groupBy("queue")
        .agg(*latency_stats())
        .unionByName(latencies.agg(*latency_stats()).select(F.lit("*").alias("queue"), "*"))
        .orderBy("queue")
    )

    redeliveries = (
        delivers.groupBy("queue", "seq")
        .agg(F.max("delivery_attempts").alias("deliveries"))
        .groupBy("queue", "deliveries")
        .agg(F.count("*").alias("messages"))
        .orderBy("queue", "deliveries")
    )

    dead_letters = (
        settles.filter(F.col("settle_reason") == "DEAD_LETTERED")
        .groupBy("queue", F.col("dead_letter_reason").alias("reason"))
        .agg(F.count("*").alias("messages"))
        .orderBy("queue", "reason")
    )

    bucket = F.pow(F.lit(2), F.ceil(F.log2(F.greatest(F.col("payload_size"), F.lit(1))))).cast(
        "long"
    )
    payload_sizes = (
        publishes.groupBy("queue", bucket.alias("size_bucket"))
        .agg(F.count("*").alias("messages"))
        .orderBy("queue", "size_bucket")
    )
    return {
        "per_minute": per_minute,
        "latency": latency,
        "redeliveries": redeliveries,
        "dead_letters": dead_letters,
        "payload_sizes": payload_sizes,
    }


def _rows(df: Any) -> list[dict[str, Any]]:
    return [row.asDict() for row in df.collect()]


def run(spark: Any, data_dir: str, out_dir: str, **filters: str | None) -> ReportData:
    """Write the Parquet tables and report.html; returns what the report shows."""
    from pyspark import StorageLevel
    from pyspark.sql import functions as F

    journal = load_journal(
        spark, data_dir, filters.get("queues"), filters.get("since"), filters.get("until")
    )
    # Read the journal once for the five tables: keep the columns they need, not the payloads.
    keep = journal.drop("payload", "payload_binary", "headers", "detail", "queue_options")
    slim = keep.persist(StorageLevel.MEMORY_AND_DISK)
    out = Path(out_dir)
    try:
        for name, df in build_tables(slim).items():
            df.write.mode("overwrite").parquet(str(out / name))
    finally:
        slim.unpersist()
    # The report reads the small tables back from Parquet.
    saved = {name: spark.read.parquet(str(out / name)) for name in TABLES}
    pm = saved["per_minute"]
    data = ReportData(
        source=data_dir,
        per_minute=_rows(
            pm.groupBy("minute").agg(*[F.sum(k).alias(k) for k in KINDS]).orderBy("minute")
        ),
        queue_totals=_rows(
            pm.groupBy("queue").agg(*[F.sum(k).alias(k) for k in KINDS]).orderBy("queue")
        ),
        latency=_rows(saved["latency"].orderBy("queue")),
        redeliveries=_rows(
            saved["redeliveries"]
            .groupBy("deliveries")
            .agg(F.sum("messages").alias("messages"))
            .orderBy("deliveries")
        ),
        dead_letters=_rows(saved["dead_letters"].orderBy(F.desc("messages")).limit(50)),
        payload_sizes=_rows(
            saved["payload_sizes"]
            .groupBy("size_bucket")
            .agg(F.sum("messages").alias("messages"))
            .orderBy("size_bucket")
        ),
    )
    (out / "report.html").write_text(render(data), encoding="utf-8")
    return data


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="vibemq-analytics", description="Journal analytics on Spark."
    )
    parser.add_argument("data_dir", help="the broker's data directory (or its journal/ directory)")
    parser.add_argument("out_dir", help="where the Parquet tables and report.html go")
    parser.add_argument(
        "--master", default=None, help="Spark master (default local[*]; spark-submit's own)"
    )
    parser.add_argument("--queue", default=None, help="only these queues (comma-separated)")
    parser.add_argument(
        "--since", default=None, help="records written at or after (ISO-8601 or ms)"
    )
    parser.add_argument("--until", default=None, help="records written before (ISO-8601 or ms)")
    args = parser.parse_args(argv)
    spark = spark_session(args.master, "vibemq-analytics")
    try:
        data = run(
            spark,
            args.data_dir,
            args.out_dir,
            queues=args.queue,
            since=args.since,
            until=args.until,
        )
    finally:
        spark.stop()
    total = sum(int(r.get("published") or 0) for r in data.queue_totals)
    page = Path(args.out_dir) / "report.html"
    print(f"{total} messages in {len(data.queue_totals)} queues; report: {page}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
