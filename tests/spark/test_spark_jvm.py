"""The JVM source (``format("vibemq")``) against the Python one (``format("vibemq.python")``),
row for row, in Spark.

Both read the same journals: generated ones (several segments, and one big segment read as
ranges), hand-made records (repeated header keys, invalid UTF-8, every record type and settle
reason), cut and zero-filled tails, damage at many bytes; with options, pushed filters and
pruned columns. The outcome must be the same rows in the same order, or a failure at the same
offset.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from test_spark_columnar import _odd_records

from vibemq_server.journal.records import encode_segment_header
from vibemq_server.spark import journal_reader as jr
from vibemq_server.spark import jvm
from vibemq_server.spark.generate import START_MS, generate

pytestmark = pytest.mark.spark

READERS = (jvm.PYTHON_NAME, jvm.NAME)  # the Python source, the JVM one


def _outcome(spark: Any, fmt: str, data: Path, where: Any, columns: list[str] | None,
             options: dict[str, str]) -> tuple[str, Any]:  # fmt: skip
    reader = spark.read.format(fmt)
    for key, value in options.items():
        reader = reader.option(key, value)
    df = reader.load(str(data))
    if where is not None:
        df = df.where(where)
    if columns is not None:
        df = df.select(*columns)
    return collected(df)


def collected(df: Any) -> tuple[str, Any]:
    """("rows", the rows as tuples), or ("error", the offset the failure names)."""
    try:
        return "rows", [tuple(r) for r in df.collect()]
    except Exception as exc:  # a Python worker's or the JVM's failure
        # (str() of PySpark's captured exception may itself fail: its description is kept)
        try:
            text = str(exc)
        except Exception:
            text = str(getattr(exc, "_desc", ""))
        found = re.search(r"at offset (\d+)", text)
        assert found, text[:2000]
        return "error", int(found.group(1))


def _same(
    spark: Any,
    data: Path,
    where: Any = None,
    columns: list[str] | None = None,
    **options: str,
) -> tuple[str, Any]:
    python, jvm_ = (_outcome(spark, fmt, data, where, columns, options) for fmt in READERS)
    assert python == jvm_
    return python


def _write_segment(data: Path, body: bytes) -> Path:
    journal = data / "journal"
    journal.mkdir(parents=True, exist_ok=True)
    path = journal / "00000000000000000001.seg"
    path.write_bytes(body)
    return path


def test_the_jar_is_built_and_loaded(spark: Any) -> None:
    # Built by scripts/build_jar.sh (scripts/test.sh runs it); register() adds it.
    assert jvm.jar_path(), "build it: scripts/build_jar.sh (needs a JDK 17: javac)"
    assert jvm.loaded(spark)


def test_same_rows_filters_and_columns(spark: Any, tmp_path: Path) -> None:
    from pyspark.sql.functions import col, lit

    data = tmp_path / "data"
    generate(data, 3000, segment_size=64 * 1024, payload_size=300)
    kind, rows = _same(spark, data)
    everything = len(rows)
    assert kind == "rows" and len(rows) == sum(
        1 for s in jr.list_segment_files(data) for _ in jr.read_rows(s.path, s.number)
    )
    lo = datetime.fromtimestamp((START_MS + 700) / 1000, UTC)
    hi = datetime.fromtimestamp((START_MS + 1900) / 1000, UTC)
    pushed = col("queue").isin("q1", "q2") & (col("timestamp") >= lit(lo))
    kind, rows = _same(spark, data, pushed & (col("timestamp") <= lit(hi)))
    assert kind == "rows" and 0 < len(rows) < 3000
    assert {r[4] for r in rows} == {"q1", "q2"}
    _same(spark, data, col("queue") == "nowhere")
    _same(spark, data, queue="q1,q3", startTime=str(START_MS + 300), endTime="2026-01-01T00:00:01Z")
    # Only some columns (the JVM reader fills only those), a count, and a filter left to Spark.
    _same(spark, data, col("record_type") == "PUBLISH", ["payload_size", "headers", "offset"])
    _same(spark, data, None, ["seq"], queue="q0")
    assert spark.read.format(jvm.NAME).load(str(data)).count() == len(
        spark.read.format(jvm.PYTHON_NAME).load(str(data)).collect()
    )
    assert spark.read.format(jvm.ALIAS).load(str(data)).count() == everything
    plan = spark.read.format(jvm.NAME).load(str(data)).where(col("queue") == "q1")
    assert "queues=[q1]" in plan._jdf.queryExecution().executedPlan().toString()


def test_odd_records_tails_and_damage(spark: Any, tmp_path: Path) -> None:
    records = _odd_records()
    whole = encode_segment_header(1) + b"".join(records)
    data = tmp_path / "odd"
    path = _write_segment(data, whole)
    kind, rows = _same(spark, data)
    assert kind == "rows" and len(rows) == len(records)
    starts = [jr.HEADER]
    for r in records:
        starts.append(starts[-1] + len(r))
    # Tails: cut inside a prefix, inside a body, at a boundary; zero-filled; a bad last record.
    cuts = [starts[3] + 3, starts[5] + 11, starts[-2] + 20, starts[4], len(whole) - 1]
    for cut in cuts:
        path.write_bytes(whole[:cut])
        assert _same(spark, data)[0] == "rows"
    path.write_bytes(whole + bytes(300))
    assert _same(spark, data) == ("rows", rows)
    last = bytearray(whole)
    last[-5] ^= 0x40
    path.write_bytes(bytes(last))
    assert _same(spark, data) == ("rows", rows[:-1])
    # Damage with records after it: both fail at the same offset (or agree it is a tail).
    failed = 0
    for where in range(jr.HEADER + 5, len(whole) - 100, len(whole) // 12):
        damaged = bytearray(whole)
        damaged[where] ^= 0x5A
        path.write_bytes(bytes(damaged))
        failed += _same(spark, data)[0] == "error"
    assert failed > 5


def test_big_segment_is_read_as_ranges(spark: Any, tmp_path: Path) -> None:
    data = tmp_path / "big"
    generate(data, 6500, payload_size=4096)  # one segment of about 30 MB: two ranges
    assert len(jr.list_segment_files(data)) == 1
    df = spark.read.format(jvm.NAME).load(str(data))
    assert df.rdd.getNumPartitions() == 2
    _same(spark, data, None, ["segment", "offset", "record_type", "seq", "payload_binary"])


def test_checkpoint_carried_between_the_python_and_jvm_streams(spark: Any, tmp_path: Path) -> None:
    """A stream checkpoint written by the Python reader is continued by the JVM one and back:
    the offsets are the same JSON. The journal grows between runs as a broker writes it,
    each time ending in a record cut mid-way (never read half). Together the runs deliver
    every record once, the same rows as a batch read of the whole journal."""
    full = tmp_path / "full"
    generate(full, 900, segment_size=32 * 1024, payload_size=120)
    segs = jr.list_segment_files(full)
    assert len(segs) >= 4
    data = tmp_path / "data"
    journal = data / "journal"
    journal.mkdir(parents=True)

    def grow(upto: int) -> None:
        # segments before ``upto`` whole, segment ``upto`` cut in the middle of a record
        for seg in segs[:upto]:
            (journal / Path(seg.path).name).write_bytes(Path(seg.path).read_bytes())
        offsets = [off for off, _ in jr.read_entries(segs[upto].path)]
        cut = offsets[len(offsets) // 2] + 13
        (journal / Path(segs[upto].path).name).write_bytes(Path(segs[upto].path).read_bytes()[:cut])

    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
    runs = []
    for fmt, upto in ((jvm.PYTHON_NAME, 1), (jvm.NAME, 2), (jvm.PYTHON_NAME, 3), (jvm.NAME, -1)):
        if upto < 0:
            for seg in segs:
                (journal / Path(seg.path).name).write_bytes(Path(seg.path).read_bytes())
        else:
            grow(upto)
        query = (
            spark.readStream.format(fmt)
            .option("maxRecordsPerTrigger", "170")
            .load(str(data))
            .writeStream.format("parquet")
            .option("path", str(out))
            .option("checkpointLocation", str(checkpoint))
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination(180)
        assert not query.isActive and query.exception() is None
        runs.append(sum(p["numInputRows"] for p in query.recentProgress))
    assert all(n > 0 for n in runs)
    got = sorted((tuple(r) for r in spark.read.parquet(str(out)).collect()), key=lambda r: r[:2])
    want = [tuple(r) for r in spark.read.format(jvm.PYTHON_NAME).load(str(full)).collect()]
    assert len(got) == len(want) == sum(runs)
    assert got == sorted(want, key=lambda r: r[:2])


def test_vibemq_is_the_jvm_source(spark: Any, tmp_path: Path) -> None:
    # register() (conftest) found the jar: format("vibemq") reads, streams and writes in the
    # JVM; the Python source answers to "vibemq.python".
    generate(tmp_path / "data", 10)
    for fmt, scan in ((jvm.NAME, "vibemq journal"), (jvm.PYTHON_NAME, "(Python)")):
        df = spark.read.format(fmt).load(str(tmp_path / "data"))
        assert scan in df._jdf.queryExecution().executedPlan().toString()
    stream = spark.readStream.format(jvm.NAME).load(str(tmp_path / "data"))
    assert stream._jdf.queryExecution().analyzed().table().name() == "vibemq journal"


def test_jar_built_into_the_cache_when_not_built_in_place(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A pip-installed package has no jars/ directory: jar_path() builds the jar once into the
    # cache (javac against pyspark's jars), then finds it there.
    monkeypatch.setattr(jvm, "JAR", tmp_path / "absent" / "vibemq-spark.jar")
    monkeypatch.setenv("VIBEMQ_CACHE_DIR", str(tmp_path / "cache"))
    built = jvm.jar_path()
    assert built is not None and built.startswith(str(tmp_path / "cache"))
    import zipfile

    with zipfile.ZipFile(built) as jar:
        names = set(jar.namelist())
        services = jar.read("META-INF/services/org.apache.spark.sql.sources.DataSourceRegister")
    assert "io/vibemq/spark/JournalStream.class" in names
    assert b"io.vibemq.spark.JournalSource" in services
    assert jvm.jar_path() == built
    # Without a JDK there is no jar, and register() falls back to the Python source.
    monkeypatch.setenv("VIBEMQ_CACHE_DIR", str(tmp_path / "cache2"))
    monkeypatch.setattr(jvm, "_javac", lambda: None)
    assert jvm.jar_path() is None
