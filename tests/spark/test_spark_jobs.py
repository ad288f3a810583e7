"""The bundled jobs end to end: analytics on a generated journal, replay into a real broker."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from brokerwork import consume

from vibemq_server.spark.analytics import TABLES, run
from vibemq_server.spark.generate import generate
from vibemq_server.spark.replay import replay

pytestmark = pytest.mark.spark


def test_analytics_job_end_to_end(spark: Any, tmp_path: Path) -> None:
    data = tmp_path / "data"
    stats = generate(data, 3000, queues=3, segment_size=64 * 1024, rate_per_ms=0.02)  # 2.5 minutes
    out = tmp_path / "out"
    report = run(spark, str(data), str(out))
    for name in TABLES:
        assert (out / name / "_SUCCESS").exists()
    pm = spark.read.parquet(str(out / "per_minute"))
    totals = {r["queue"]: r for r in pm.groupBy("queue").sum().collect()}
    for queue, published in stats.per_queue.items():
        assert totals[queue]["sum(published)"] == published
    assert sum(r["sum(acked)"] for r in totals.values()) == stats.acked
    assert sum(r["sum(dead_lettered)"] for r in totals.values()) == stats.dead_lettered
    assert sum(r["sum(expired)"] for r in totals.values()) == stats.expired
    assert pm.select("minute").distinct().count() == 3  # 3000 messages at 20 per second
    latency = {r["queue"]: r for r in spark.read.parquet(str(out / "latency")).collect()}
    assert latency["*"]["messages"] == stats.acked
    assert (
        0
        < latency["*"]["p50_ms"]
        <= latency["*"]["p95_ms"]
        <= latency["*"]["p99_ms"]
        <= latency["*"]["max_ms"]
    )
    redeliveries = spark.read.parquet(str(out / "redeliveries")).collect()
    assert sum(r["messages"] for r in redeliveries) == stats.messages
    assert sum(r["messages"] for r in redeliveries if r["deliveries"] > 1) == stats.redelivered
    dead = spark.read.parquet(str(out / "dead_letters")).collect()
    assert {r["reason"] for r in dead} == {"MaxRetriesExceeded"}
    assert sum(r["messages"] for r in dead) == stats.dead_lettered
    sizes = spark.read.parquet(str(out / "payload_sizes")).collect()
    assert sum(r["messages"] for r in sizes) == stats.messages + stats.dead_lettered
    assert all(r["size_bucket"] & (r["size_bucket"] - 1) == 0 for r in sizes)  # powers of two
    html = (out / "report.html").read_text()
    assert (
        html.count("<svg") == 5
        and "<script" not in html
        and "http://" not in html.replace('xmlns="http://www.w3.org/2000/svg"', "")
    )
    assert len(report.per_minute) == 3


def test_replay_dead_letters_into_a_broker(
    spark: Any, broker_journal: tuple[Path, Any], broker_proc: Any
) -> None:
    data, work = broker_journal
    proc = broker_proc()
    count = replay(
        spark,
        str(data),
        host="127.0.0.1",
        port=proc.port,
        queues="ephemeral.dlq",
        dead_letter_reason="MessageExpired",
        target_queue="redriven",
    )
    assert count == work.expired_to_dlq
    got = asyncio.run(consume(proc.port, "redriven", count))
    assert sorted(json.loads(raw)["tick"] for raw in got) == list(range(count))
    # Nothing matches another reason.
    assert (
        replay(
            spark,
            str(data),
            host="127.0.0.1",
            port=proc.port,
            dead_letter_reason="QueueOverflow",
            dry_run=True,
        )
        == 0
    )


def test_analytics_console_script_from_another_directory(tmp_path: Path) -> None:
    """`vibemq-analytics` as a user runs it: its own process and JVM, started from a
    directory that is not the project, with no PYSPARK_PYTHON. Its Python workers must be
    this environment's interpreter (once they were `python3` from PATH, which had no
    vibemq_server, and the job failed)."""
    import os
    import subprocess
    import sys

    data = tmp_path / "data"
    generate(data, 500, queues=2, segment_size=32 * 1024)
    script = Path(sys.executable).parent / "vibemq-analytics"
    env = {k: v for k, v in os.environ.items() if k != "PYSPARK_PYTHON"}
    env["SPARK_LOCAL_IP"] = "127.0.0.1"
    done = subprocess.run(
        [str(script), "--master", "local[1]", str(data), str(tmp_path / "out")],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert (tmp_path / "out" / "report.html").exists()
    assert (tmp_path / "out" / "per_minute" / "_SUCCESS").exists()
