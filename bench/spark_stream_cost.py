"""What a stream adds to a batch read: ours against Spark's own Parquet stream (issue 17).

The same journal read by ``format("vibemq")`` as a batch and as an ``availableNow`` stream
(``maxRecordsPerTrigger``), and the same records written as Parquet files read as a batch and
as a stream of one file per trigger (as many triggers as ours), one session, alternating rounds,
medians of all but the first (a warm-up). What each stream takes beyond its batch read, per
trigger, is the micro-batch machinery's cost (offsets, commit log, planning), which Spark's own
reader pays too.

    PYTHONPATH=$PWD .venv/bin/python -m bench.spark_stream_cost --messages 2000000 --rounds 4
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.spark_bench import session
from vibemq_server.spark.generate import generate


def _timed(run: Callable[[], Any]) -> float:
    start = time.perf_counter()
    run()
    return time.perf_counter() - start


def _stream(reader: Any, checkpoint: Path) -> int:
    query = (
        reader.writeStream.format("noop")
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    return len(query.recentProgress)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=2_000_000)
    parser.add_argument("--per-trigger", type=int, default=500_000, help="maxRecordsPerTrigger")
    parser.add_argument("--rounds", type=int, default=4)
    args = parser.parse_args()
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    work = Path(tempfile.mkdtemp(prefix="vibemq-stream-cost-"))
    try:
        journal = work / "journal"
        records = generate(journal, args.messages).records
        triggers = -(-records // args.per_trigger)
        spark = session()
        parquet = str(work / "parquet")
        spark.read.format("vibemq").load(str(journal)).repartition(triggers).write.parquet(parquet)
        schema = spark.read.parquet(parquet).schema
        times: dict[str, list[float]] = {}
        for r in range(args.rounds):
            runs = {
                "vibemq batch": lambda: (
                    spark.read.format("vibemq")
                    .load(str(journal))
                    .write.format("noop")
                    .mode("overwrite")
                    .save()
                ),
                "vibemq stream": lambda: _stream(
                    spark.readStream.format("vibemq")
                    .option("maxRecordsPerTrigger", args.per_trigger)
                    .load(str(journal)),
                    work / f"chk-vibemq-{r}",  # noqa: B023 (called in this round)
                ),
                "parquet batch": lambda: (
                    spark.read.schema(schema)
                    .parquet(parquet)
                    .write.format("noop")
                    .mode("overwrite")
                    .save()
                ),
                "parquet stream": lambda: _stream(
                    spark.readStream.schema(schema)
                    .option("maxFilesPerTrigger", 1)
                    .parquet(parquet),
                    work / f"chk-parquet-{r}",  # noqa: B023 (called in this round)
                ),
            }
            took = {name: _timed(run) for name, run in runs.items()}
            print(f"round {r}: " + ", ".join(f"{n} {t:.2f} s" for n, t in took.items()), flush=True)
            if r:
                for name, t in took.items():
                    times.setdefault(name, []).append(t)
        med = {name: statistics.median(t) for name, t in times.items()}
        print(f"{records:,} records, {triggers} triggers")
        for source in ("vibemq", "parquet"):
            batch, stream = med[f"{source} batch"], med[f"{source} stream"]
            print(
                f"{source}: batch {batch:.2f} s ({1e6 * batch / records:.2f} us a record), stream "
                f"{stream:.2f} s, stream/batch time {stream / batch:.2f}x, "
                f"{(stream - batch) / triggers * 1000:.0f} ms a trigger beyond the batch read"
            )
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
