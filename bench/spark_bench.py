"""Spark data source throughput: batch read of the journal, and the writer into a broker.

    .venv/bin/python -m bench.spark_bench [--messages 1000000] [--writer-rows 100000]

1. Generates a journal of ``--messages`` messages with ``vibemq_server.spark.generate`` (the
   journal's own record encoders, written straight to segment files: a PUBLISH, one or more
   DELIVERs and a SETTLE per message, about 3.2 records per message, 64 MiB segments).
2. For ``local[1]`` and ``local[2]``: a fresh SparkSession, one warm-up read, then the best of
   ``--repeat`` full reads that pull every column through Spark
   (``count(*)`` and ``sum(length(payload_binary))``). Reports rows/s (rows = records) and MB/s
   of segment bytes.
3. Starts a real broker (``fsync = always``, the default) and writes ``--writer-rows`` rows
   with ``df.write.format("vibemq")`` from 2 partitions (2 connections), timed to the end of
   the job (every PublishAck awaited).

Needs Java 17 and the spark extra. Nothing is asserted; the numbers go to docs/performance.md.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from vibemq_server.spark.generate import generate


def session(master: str) -> Any:
    from pyspark.sql import SparkSession

    from vibemq_server.spark import register

    spark = (
        SparkSession.builder.master(master)
        .appName("vibemq-spark-bench")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.memory", "2g")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    return spark


def timed_read(spark: Any, data_dir: str) -> tuple[float, int]:
    start = time.perf_counter()
    row = (
        spark.read.format("vibemq")
        .load(data_dir)
        .selectExpr("count(*) AS n", "sum(length(payload_binary)) AS b")
        .first()
    )
    return time.perf_counter() - start, int(row["n"])


def read_bench(data_dir: str, cores: int, repeat: int, size: int) -> dict[str, Any]:
    spark = session(f"local[{cores}]")
    try:
        timed_read(spark, data_dir)  # warm-up: Python workers, JIT
        best, rows = min(timed_read(spark, data_dir) for _ in range(repeat))
    finally:
        spark.stop()
    return {
        "cores": cores,
        "seconds": round(best, 2),
        "rows": rows,
        "rows_per_s": round(rows / best),
        "mb_per_s": round(size / best / 1e6, 1),
    }


def writer_bench(rows: int, work: Path) -> dict[str, Any]:
    data = work / "broker"
    ready = work / "ready.json"
    cmd = [sys.executable, "-m", "vibemq_server", "--host", "127.0.0.1", "--port", "0"]
    cmd += [
        "--no-mqtt",
        "--no-amqp",
        "--no-http",
        "--data-dir",
        str(data),
        "--ready-file",
        str(ready),
    ]
    cmd += ["--log-level", "warning"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("VIBEMQ_")}
    proc = subprocess.Popen(cmd, env=env)
    try:
        deadline = time.monotonic() + 30
        while not ready.exists() or not ready.read_text().strip():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("broker did not start")
            time.sleep(0.05)
        port = json.loads(ready.read_text())["vibemq"]
        spark = session("local[2]")
        try:
            df = spark.range(0, rows, numPartitions=2).selectExpr(
                "to_json(named_struct('n', id, 'body', repeat('x', 64))) AS payload"
            )
            df.cache().count()
            start = time.perf_counter()
            df.write.format("vibemq").option("port", str(port)).option("queue", "bench").mode(
                "append"
            ).save()
            took = time.perf_counter() - start
        finally:
            spark.stop()
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    return {"rows": rows, "seconds": round(took, 2), "rows_per_s": round(rows / took)}


def main() -> int:
    parser = argparse.ArgumentParser(description="Spark data source benchmark")
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--writer-rows", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--dir", default=None, help="work directory (default: a temp dir)")
    parser.add_argument("--json", default=None, help="also write the results here")
    args = parser.parse_args()
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    work = Path(args.dir or tempfile.mkdtemp(prefix="vibemq-spark-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        journal = work / "journal-data"
        start = time.perf_counter()
        stats = generate(journal, args.messages)
        gen = time.perf_counter() - start
        print(
            f"generated {stats.messages:,} messages = {stats.records:,} records, "
            f"{stats.bytes / 1e6:,.0f} MB in {stats.segments} segments in {gen:.1f} s"
        )
        results: dict[str, Any] = {"messages": stats.messages, "records": stats.records}
        results["bytes"] = stats.bytes
        results["segments"] = stats.segments
        for cores in (1, 2):
            r = read_bench(str(journal), cores, args.repeat, stats.bytes)
            results[f"read_local{cores}"] = r
            print(
                f"read local[{cores}]: {r['rows']:,} rows in {r['seconds']} s = "
                f"{r['rows_per_s']:,} rows/s, {r['mb_per_s']} MB/s"
            )
        w = writer_bench(args.writer_rows, work)
        results["writer"] = w
        rate = f"{w['rows_per_s']:,} rows/s"
        print(f"writer local[2], 2 connections: {w['rows']:,} rows in {w['seconds']} s = {rate}")
        if args.json:
            Path(args.json).write_text(json.dumps(results, indent=2))
    finally:
        if args.dir is None:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
