"""Spark data source throughput: our journal reader side by side with Spark's own readers.

    .venv/bin/python -m bench.spark_bench [--messages 100000,500000]
        [--payloads 64,1024,16384,65536] [--rounds 3] [--pushdown-messages 200000]
        [--stream-messages 200000] [--writer-rows 0]

One SparkSession on ``local[2]`` for everything. For each journal (written by
``vibemq_server.spark.generate``: a PUBLISH, one or more DELIVERs and a SETTLE per message,
about 3.2 records per message, 64 MiB segments):

1. the session reads it once with ``format("vibemq")`` and writes the very same records out as
   Parquet and as JSON lines;
2. ``--rounds`` alternating rounds (the order rotates every round) of four readers -- ours
   (``format("vibemq")``: the JVM source when its jar loads, and the Python source
   ``vibemq.python`` unless ``--no-python``), ``spark.read.parquet``, ``spark.read.json``
   with the schema given -- and two queries: the
   issue's ``count(*), sum(length(payload))`` (Parquet reads only the payload column for it),
   and ``all``: the same plus an ``xxhash64`` of every column, so every reader materialises
   every column (the hash must agree: a check that all of them hold the same records). Medians.

Curves: ``--messages`` (payloads about 100 B), ``--payloads`` (message sizes; the number of
messages is chosen to keep about ``--payload-mb`` of journal). ``--pushdown-messages``: ten
queues, one of them read with the ``queue`` option, and with a pushed-down ``queue = ...``
filter, before (no queue index) and after (the segments' queue index sidecars), against the
full read: time and bytes read. ``--stream-messages``: ``readStream`` with
``trigger(availableNow=True)`` and ``maxRecordsPerTrigger`` into the ``noop`` sink against a
batch read of the same journal (both sources). ``--writer-rows``: the writers into a real
broker (0 = skip).

Needs Java 17 and the spark extra (and the compiled scanner: ``pip install -e .`` or
``scripts/build_ext.sh``). Nothing is asserted; the numbers go to docs/performance.md.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from vibemq_server.journal import qindex
from vibemq_server.spark import columnar, jvm
from vibemq_server.spark.generate import generate

ALL_COLUMNS = (
    "segment, offset, record_type, timestamp, queue, seq, message_id, published_at, expires_at, "
    "priority, map_keys(headers), map_values(headers), payload, payload_binary, payload_size, "
    "delivery_attempts, settle_reason, settled_at, dead_letter_reason, detail, queue_options"
)
PYTHON_TOO = True  # the Python source measured beside the JVM one (--no-python: not)
QUERIES = {
    "issue": ["count(*) AS n", "sum(length(payload)) AS b"],
    "all": ["count(*) AS n", "sum(length(payload)) AS b", f"bit_xor(xxhash64({ALL_COLUMNS})) AS h"],
}


def session(master: str = "local[2]") -> Any:
    from pyspark.sql import SparkSession

    from vibemq_server.spark import register

    builder = jvm.configure(SparkSession.builder)
    spark = (
        builder.master(master)
        .appName("vibemq-spark-bench")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.memory", "3g")
        .config("spark.sql.session.timeZone", "UTC")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    return spark


def _timed(df: Any, query: str) -> tuple[float, dict[str, Any]]:
    start = time.perf_counter()
    row = df.selectExpr(*QUERIES[query]).first()
    return time.perf_counter() - start, row.asDict()


def side_by_side(spark: Any, journal: Path, work: Path, rounds: int) -> dict[str, Any]:
    """Ours, Parquet and JSON lines of the same records, alternating rounds; medians."""
    from vibemq_server.spark.datasource import journal_schema

    ours = spark.read.format("vibemq").load(str(journal))
    pq, js = work / "parquet", work / "json"
    shutil.rmtree(pq, ignore_errors=True)
    shutil.rmtree(js, ignore_errors=True)
    ours.write.parquet(str(pq))
    ours.write.json(str(js))
    schema = journal_schema()
    readers = {
        "vibemq": lambda: spark.read.format("vibemq").load(str(journal)),
        "parquet": lambda: spark.read.parquet(str(pq)),
        "json": lambda: spark.read.schema(schema).json(str(js)),
    }
    if PYTHON_TOO:
        readers["python"] = lambda: spark.read.format(jvm.PYTHON_NAME).load(str(journal))
    names = list(readers)
    times: dict[str, dict[str, list[float]]] = {q: {n: [] for n in names} for q in QUERIES}
    answers: dict[str, dict[str, Any]] = {q: {} for q in QUERIES}
    for name in names:  # warm-up: Python workers, JIT, file cache
        _timed(readers[name](), "issue")
    for r in range(rounds):
        order = names[r % len(names) :] + names[: r % len(names)]
        for query in QUERIES:
            for name in order:
                took, answer = _timed(readers[name](), query)
                times[query][name].append(took)
                answers[query][name] = answer
    rows = int(answers["issue"]["vibemq"]["n"])
    out: dict[str, Any] = {"rows": rows}
    for query in QUERIES:
        agree = len({json.dumps(a, sort_keys=True) for a in answers[query].values()}) == 1
        med = {n: statistics.median(times[query][n]) for n in names}
        out[query] = {
            "agree": agree,
            **{n: {"seconds": round(med[n], 2), "rows_per_s": round(rows / med[n])} for n in names},
            "vs_json": round(med["json"] / med["vibemq"], 2),
            "vs_parquet": round(med["parquet"] / med["vibemq"], 2),
        }
        if "python" in med:
            out[query]["python_vs_json"] = round(med["json"] / med["python"], 2)
            out[query]["python_vs_parquet"] = round(med["parquet"] / med["python"], 2)
    return out


def _read_bytes(spark: Any) -> int:
    """Bytes read so far (``rchar``) by the driver JVM (local mode: the executors too) and
    every process under it (the Python workers that run the Python source)."""
    root = int(spark._jvm.java.lang.ProcessHandle.current().pid())
    parent: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parent[int(stat.parent.name)] = int(fields[1])
    total = 0
    for pid in parent:
        p = pid
        while p not in (0, 1, root):
            p = parent.get(p, 0)
        if p != root and pid != root:
            continue
        try:
            for line in Path(f"/proc/{pid}/io").read_text().splitlines():
                if line.startswith("rchar:"):
                    total += int(line.split()[1])
        except OSError:
            continue
    return total


def pushdown(spark: Any, journal: Path, rounds: int) -> dict[str, Any]:
    """One queue of ten, before (no queue index: every record read) and after (the segments'
    queue index sidecars), against the full read: time and the bytes read (``rchar`` of the
    JVM and its Python workers), alternating rounds, medians. The journal is generated, no
    broker writes it: every segment is indexed, the last one too (``include_last``)."""
    from pyspark.sql.functions import col

    jdir = journal / "journal"
    started = time.perf_counter()
    qindex.index_directory(jdir, include_last=True)
    index_s = time.perf_counter() - started
    sidecars = sorted(jdir.glob(f"*{qindex.INDEX_SUFFIX}"))
    index_bytes = sum(p.stat().st_size for p in sidecars)
    journal_bytes = sum(p.stat().st_size for p in jdir.glob("*.seg"))

    def sidecars_on(on: bool) -> None:
        for p in sidecars:
            off = p.with_name(p.name + ".off")
            if on and off.exists():
                off.rename(p)
            elif not on and p.exists():
                p.rename(off)

    first = qindex.load(sorted(jdir.glob("*.seg"))[0])
    assert first is not None
    t0 = min(s.min_ts for s in first.queues.values())
    tenth = max(s.max_ts for s in first.queues.values()) - t0
    cases: dict[str, tuple[bool, Any]] = {
        "full": (True, lambda: spark.read.format("vibemq").load(str(journal))),
        "filter_no_index": (
            False,
            lambda: spark.read.format("vibemq").load(str(journal)).where(col("queue") == "q3"),
        ),
        "filter": (
            True,
            lambda: spark.read.format("vibemq").load(str(journal)).where(col("queue") == "q3"),
        ),
        "option": (
            True,
            lambda: spark.read.format("vibemq").option("queue", "q3").load(str(journal)),
        ),
        # q3 in a time window about a tenth of the first segment's span
        "filter_time": (
            True,
            lambda: (
                spark.read.format("vibemq")
                .option("startTime", str(t0))
                .option("endTime", str(t0 + tenth // 10))
                .load(str(journal))
                .where(col("queue") == "q3")
            ),
        ),
    }
    if PYTHON_TOO:
        cases["python_full"] = (
            True,
            lambda: spark.read.format(jvm.PYTHON_NAME).load(str(journal)),
        )
        cases["python_filter_no_index"] = (
            False,
            lambda: (
                spark.read.format(jvm.PYTHON_NAME).load(str(journal)).where(col("queue") == "q3")
            ),
        )
        cases["python_filter"] = (
            True,
            lambda: (
                spark.read.format(jvm.PYTHON_NAME).load(str(journal)).where(col("queue") == "q3")
            ),
        )
    times: dict[str, list[float]] = {n: [] for n in cases}
    reads: dict[str, list[int]] = {n: [] for n in cases}
    rows: dict[str, int] = {}
    try:
        for on, make in cases.values():
            sidecars_on(on)
            _timed(make(), "all")
        for r in range(rounds):
            names = list(cases)
            names = names[r % len(names) :] + names[: r % len(names)]  # the order rotates
            for name in names:
                on, make = cases[name]
                sidecars_on(on)
                before = _read_bytes(spark)
                took, answer = _timed(make(), "all")
                reads[name].append(_read_bytes(spark) - before)
                times[name].append(took)
                rows[name] = int(answer["n"])
    finally:
        sidecars_on(True)
    med = {n: statistics.median(t) for n, t in times.items()}
    read = {n: statistics.median(b) for n, b in reads.items()}

    def full(n: str) -> str:  # the full read of the same source
        return "python_full" if n.startswith("python_") else "full"

    out: dict[str, Any] = {
        n: {
            "seconds": round(med[n], 3),
            "rows": rows[n],
            "of_full": round(med[n] / med[full(n)], 3),
            "read_mb": round(read[n] / 1e6, 1),
            "read_of_full": round(read[n] / max(1, read[full(n)]), 3),
        }
        for n in cases
    }
    out["index"] = {
        "segments": len(sidecars),
        "build_s": round(index_s, 2),
        "sidecar_bytes_of_journal": round(index_bytes / journal_bytes, 4),
    }
    return out


def stream(spark: Any, journal: Path, work: Path, rounds: int) -> dict[str, Any]:
    """availableNow with maxRecordsPerTrigger into the noop sink, against a batch read; the
    JVM source (``vibemq``) and the Python one, alternating."""
    formats = {"": "vibemq", "python_": jvm.PYTHON_NAME} if PYTHON_TOO else {"": "vibemq"}
    times: dict[str, list[float]] = {}
    rows = 0
    for r in range(rounds + 1):
        for prefix, fmt in formats.items():
            start = time.perf_counter()
            spark.read.format(fmt).load(str(journal)).write.format("noop").mode("overwrite").save()
            batch = time.perf_counter() - start
            chk = work / f"chk{prefix}{r}"
            shutil.rmtree(chk, ignore_errors=True)  # a reused --dir: not a finished query's
            start = time.perf_counter()
            query = (
                spark.readStream.format(fmt)
                .option("maxRecordsPerTrigger", 500_000)
                .load(str(journal))
                .writeStream.format("noop")
                .option("checkpointLocation", str(chk))
                .trigger(availableNow=True)
                .start()
            )
            query.awaitTermination()
            took = time.perf_counter() - start
            rows = sum(p["numInputRows"] for p in query.recentProgress)
            if r:  # the first is the warm-up
                times.setdefault(f"{prefix}batch", []).append(batch)
                times.setdefault(f"{prefix}stream", []).append(took)
    med = {n: statistics.median(t) for n, t in times.items()}
    out: dict[str, Any] = {"rows": rows}
    for prefix in formats:
        out[f"{prefix}batch_rows_per_s"] = round(rows / med[f"{prefix}batch"])
        out[f"{prefix}stream_rows_per_s"] = round(rows / med[f"{prefix}stream"])
        out[f"{prefix}stream_us_per_record"] = round(1e6 * med[f"{prefix}stream"] / rows, 2)
        out[f"{prefix}stream_vs_batch"] = round(med[f"{prefix}batch"] / med[f"{prefix}stream"], 2)
    return out


def writer_bench(rows: int, work: Path) -> dict[str, Any]:
    data = work / "broker"
    ready = work / "ready.json"
    cmd = [sys.executable, "-m", "vibemq_server", "--host", "127.0.0.1", "--port", "0"]
    cmd += ["--no-mqtt", "--no-amqp", "--no-http", "--data-dir", str(data)]
    cmd += ["--ready-file", str(ready), "--log-level", "warning"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("VIBEMQ_")}
    proc = subprocess.Popen(cmd, env=env)
    try:
        deadline = time.monotonic() + 30
        while not ready.exists() or not ready.read_text().strip():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("broker did not start")
            time.sleep(0.05)
        port = json.loads(ready.read_text())["vibemq"]
        spark = session()
        df = spark.range(0, rows, numPartitions=2).selectExpr(
            "to_json(named_struct('n', id, 'body', repeat('x', 64))) AS payload"
        )
        df.cache().count()
        out: dict[str, Any] = {"rows": rows}
        for fmt in ("vibemq", jvm.PYTHON_NAME):
            start = time.perf_counter()
            df.write.format(fmt).option("port", str(port)).option("queue", "bench").mode(
                "append"
            ).save()
            took = time.perf_counter() - start
            out[fmt] = {"seconds": round(took, 2), "rows_per_s": round(rows / took)}
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    return out


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def _print_side(label: str, r: dict[str, Any]) -> None:
    for query in QUERIES:
        q = r[query]
        names = [n for n in ("vibemq", "python", "parquet", "json") if n in q]
        cells = ", ".join(f"{n} {q[n]['rows_per_s']:,}/s" for n in names)
        py_ratio = (
            f"; python {q['python_vs_json']}x JSON, {q['python_vs_parquet']}x Parquet"
            if "python" in q
            else ""
        )
        print(
            f"{label} [{query}] {r['rows']:,} rows: {cells}; ours {q['vs_json']}x JSON, "
            f"{q['vs_parquet']}x Parquet{py_ratio}{'' if q['agree'] else ' (ANSWERS DIFFER)'}",
            flush=True,
        )


def main() -> int:
    parser = argparse.ArgumentParser(description="Spark data source benchmark")
    parser.add_argument("--messages", default="100000,500000", help="the size curve")
    parser.add_argument("--payloads", default="64,1024,16384,65536", help="the payload curve")
    parser.add_argument("--payload-mb", type=int, default=160, help="journal size per payload")
    parser.add_argument("--pushdown-messages", type=int, default=200_000)
    parser.add_argument("--stream-messages", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--writer-rows", type=int, default=0)
    parser.add_argument(
        "--no-python", action="store_true", help="leave the Python source out (big journals)"
    )
    parser.add_argument("--dir", default=None, help="work directory (default: a temp dir)")
    parser.add_argument("--json", default=None, help="also write the results here")
    args = parser.parse_args()
    global PYTHON_TOO
    PYTHON_TOO = not args.no_python
    if not columnar.available():
        print("warning: the compiled scanner is not built: measuring the per-record path")
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    work = Path(args.dir or tempfile.mkdtemp(prefix="vibemq-spark-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    results: dict[str, Any] = {"sizes": {}, "payloads": {}}

    def journal(name: str, messages: int, **kw: Any) -> Path:
        path = work / name
        shutil.rmtree(path, ignore_errors=True)
        stats = generate(path, messages, **kw)
        print(
            f"{name}: {stats.messages:,} messages = {stats.records:,} records, "
            f"{stats.bytes / 1e6:,.0f} MB in {stats.segments} segments",
            flush=True,
        )
        return path

    try:
        spark = session()
        for n in _ints(args.messages):
            path = journal(f"size-{n}", n)
            r = side_by_side(spark, path, work, args.rounds)
            results["sizes"][n] = r
            _print_side(f"{n:,} messages", r)
            shutil.rmtree(path, ignore_errors=True)
        for size in _ints(args.payloads):
            n = max(1000, min(200_000, args.payload_mb * 1_000_000 // (size * 5 // 4 + 60)))
            path = journal(f"payload-{size}", n, payload_size=size)
            r = side_by_side(spark, path, work, args.rounds)
            results["payloads"][size] = r
            _print_side(f"payload {size} B, {n:,} messages", r)
            shutil.rmtree(path, ignore_errors=True)
        if args.pushdown_messages:
            path = journal("pushdown", args.pushdown_messages, queues=10)
            r = pushdown(spark, path, args.rounds)
            results["pushdown"] = r
            print(f"one queue of ten: {json.dumps(r)}", flush=True)
            shutil.rmtree(path, ignore_errors=True)
        if args.stream_messages:
            path = journal("stream", args.stream_messages)
            r = stream(spark, path, work, args.rounds)
            results["stream"] = r
            print(f"stream availableNow: {json.dumps(r)}", flush=True)
        spark.stop()
        if args.writer_rows:
            w = writer_bench(args.writer_rows, work)
            results["writer"] = w
            print(f"writer local[2], 2 connections: {json.dumps(w)}", flush=True)
        if args.json:
            Path(args.json).write_text(json.dumps(results, indent=2))
    finally:
        if args.dir is None:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
