"""``vibemq-replay``: publish messages from the journal back into a broker, on Spark.

    vibemq-replay DATA_DIR --queue orders.dlq --dead-letter-reason MaxRetriesExceeded \\
        --host 127.0.0.1 --port 2925 [--target-queue orders] [--since T] [--until T]

The everyday "re-drive the dead letters after the fix": it selects PUBLISH records (one per
message: compaction copies are dropped by ``seq``) by queue, record time range and dead-letter
reason, and publishes them with the ``vibemq`` DataFrame writer. The target queue is
``--target-queue``, else the ``originalQueue`` header (dead letters go back where they came
from), else the queue they were in. The dead-letter headers are dropped and ``replayedFrom``
(the source queue) and ``replayedSeq`` are added. Within each Spark task messages go out in
``seq`` order. Every selected message is published, whether or not it was settled since.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from vibemq_server.spark.analytics import load_journal, spark_session

DEAD_LETTER_HEADERS = (
    "deadLetterReason",
    "originalQueue",
    "deadLetteredAt",
    "originalDeliveryAttempts",
)


def select_messages(
    journal: Any, dead_letter_reason: str | None = None, target_queue: str | None = None
) -> Any:
    """The rows to publish: queue, payload, headers, priority (a DataFrame)."""
    from pyspark.sql import functions as F

    pubs = journal.filter(F.col("record_type") == "PUBLISH").dropDuplicates(["seq"])
    if dead_letter_reason:
        pubs = pubs.filter(F.col("dead_letter_reason") == dead_letter_reason)
    if target_queue:
        target = F.lit(target_queue)
    else:
        target = F.coalesce(F.col("headers").getItem("originalQueue"), F.col("queue"))
    dropped = ", ".join(f"'{h}'" for h in DEAD_LETTER_HEADERS)
    kept = F.expr(f"map_filter(headers, (k, v) -> NOT array_contains(array({dropped}), k))")
    headers = F.map_concat(
        kept,
        F.create_map(
            F.lit("replayedFrom"), F.col("queue"), F.lit("replayedSeq"), F.col("seq").cast("string")
        ),
    )
    return pubs.sortWithinPartitions("seq").select(
        target.alias("queue"), "payload", headers.alias("headers"), "priority"
    )


def replay(
    spark: Any,
    data_dir: str,
    *,
    host: str,
    port: int,
    token: str | None = None,
    queues: str | None = None,
    since: str | None = None,
    until: str | None = None,
    dead_letter_reason: str | None = None,
    target_queue: str | None = None,
    dry_run: bool = False,
) -> int:
    """Publish the selected messages; returns how many."""
    journal = load_journal(spark, data_dir, queues, since, until)
    rows = select_messages(journal, dead_letter_reason, target_queue).cache()
    try:
        count = int(rows.count())
        if dry_run or count == 0:
            return count
        writer = rows.write.format("vibemq").option("host", host).option("port", str(port))
        if token:
            writer = writer.option("token", token)
        writer.mode("append").save()
        return count
    finally:
        rows.unpersist()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="vibemq-replay", description=__doc__.splitlines()[0] if __doc__ else None
    )
    parser.add_argument("data_dir", help="the broker's data directory (or its journal/ directory)")
    parser.add_argument(
        "--queue", default=None, help="source queues (comma-separated; default all)"
    )
    parser.add_argument(
        "--since", default=None, help="records written at or after (ISO-8601 or ms)"
    )
    parser.add_argument("--until", default=None, help="records written before (ISO-8601 or ms)")
    parser.add_argument(
        "--dead-letter-reason", default=None, help="e.g. MaxRetriesExceeded, MessageExpired"
    )
    parser.add_argument(
        "--target-queue", default=None, help="default: originalQueue header, else the same"
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=2925)
    parser.add_argument("--token", default=None)
    parser.add_argument(
        "--master", default=None, help="Spark master (default local[*]; spark-submit's own)"
    )
    parser.add_argument("--dry-run", action="store_true", help="only count what would be published")
    args = parser.parse_args(argv)
    spark = spark_session(args.master, "vibemq-replay")
    try:
        count = replay(
            spark,
            args.data_dir,
            host=args.host,
            port=args.port,
            token=args.token,
            queues=args.queue,
            since=args.since,
            until=args.until,
            dead_letter_reason=args.dead_letter_reason,
            target_queue=args.target_queue,
            dry_run=args.dry_run,
        )
    finally:
        spark.stop()
    print(f"{'would publish' if args.dry_run else 'published'} {count} messages")
    return 0


if __name__ == "__main__":
    sys.exit(main())
