"""Queue and time filters read through the segments' queue index sidecars.

Every case compares the filtered reads (the JVM source and the Python one) over a journal with
sidecars against the full read of the same journal filtered in Python, row for row: clean
journals, time ranges, stale, damaged and missing sidecars, cut and zero-filled tails, a bad
last record, damage before and after indexing. Damage in a record of another queue after its
segment was indexed is the one case that differs, by design: the filtered read does not read
that record (docs/spark.md).
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql.functions import col
from test_spark_jvm import collected

from vibemq_server.journal import qindex
from vibemq_server.journal.records import iter_records
from vibemq_server.spark import jvm
from vibemq_server.spark.generate import START_MS, generate

pytestmark = pytest.mark.spark

QUEUE = "q3"


def _journal(tmp_path: Path, name: str = "j", seed: int = 7) -> Path:
    data = tmp_path / name
    generate(data, 3000, queues=10, segment_size=64 * 1024, seed=seed)
    assert qindex.index_directory(data / "journal") >= 5  # every segment but the last
    return data


def _segments(data: Path) -> list[Path]:
    return sorted((data / "journal").glob("*.seg"))


def _filtered(spark: Any, data: Path, fmt: str = jvm.NAME, **times: int) -> tuple[str, Any]:
    df = spark.read.format(fmt).load(str(data)).where(col("queue") == QUEUE)
    if "lo" in times:
        df = df.where(col("timestamp") >= _ts(spark, times["lo"]))
    if "hi" in times:
        df = df.where(col("timestamp") < _ts(spark, times["hi"]))
    return collected(df)


def _ts(spark: Any, ms: int) -> Any:
    return spark.sql(f"SELECT timestamp_millis({ms}) AS t").collect()[0].t


def _full(spark: Any, data: Path, **times: int) -> tuple[str, Any]:
    """The whole journal read, its rows of QUEUE (and the time range) kept here."""
    kind, rows = collected(spark.read.format(jvm.NAME).load(str(data)))
    if kind == "error":
        return kind, rows
    names = spark.read.format(jvm.NAME).load(str(data)).columns
    q = names.index("queue")
    out = [r for r in rows if r[q] == QUEUE]
    if times:
        lo, hi = times.get("lo", -(2**62)), times.get("hi", 2**62)
        t = names.index("timestamp")
        out = [r for r in out if lo <= int(r[t].timestamp() * 1000 + 0.5) < hi]
    return "rows", out


def _same(spark: Any, data: Path, **times: int) -> tuple[str, Any]:
    """The filtered reads of both sources (JVM, Python) equal the full read filtered here."""
    filtered = _filtered(spark, data, **times)
    assert filtered == _full(spark, data, **times)
    assert _filtered(spark, data, jvm.PYTHON_NAME, **times) == filtered
    return filtered


def _queue_offsets(path: Path, queue: str) -> list[tuple[int, int]]:
    out = []
    for e in iter_records(path.read_bytes()):
        if getattr(e.record, "queue", getattr(e.record, "name", "")) == queue:
            out.append((e.offset, e.size))
    return out


def test_filtered_reads_equal_full_reads(spark: Any, tmp_path: Path) -> None:
    data = _journal(tmp_path)
    kind, rows = _same(spark, data)
    assert kind == "rows" and len(rows) > 900
    _same(spark, data, lo=START_MS + 700, hi=START_MS + 2100)
    _same(spark, data, lo=START_MS + 2990)
    # a queue no segment holds, several queues, the option
    no = spark.read.format(jvm.NAME).load(str(data)).where(col("queue") == "nope")
    assert no.count() == 0
    both = spark.read.format(jvm.NAME).load(str(data)).where(col("queue").isin("q1", "q3.dlq"))
    everything = spark.read.format(jvm.NAME).load(str(data)).collect()
    assert [tuple(r) for r in both.collect()] == [
        tuple(r) for r in everything if r.queue in ("q1", "q3.dlq")
    ]
    by_option = spark.read.format(jvm.NAME).option("queue", QUEUE).load(str(data))
    assert [tuple(r) for r in by_option.collect()] == rows


def test_stale_damaged_and_missing_sidecars_are_not_trusted(spark: Any, tmp_path: Path) -> None:
    data = _journal(tmp_path)
    want = _same(spark, data)
    segs = _segments(data)
    # damaged: a flipped byte in a sidecar's head, directory or a block; a cut one
    for where, seg in zip((5, 70, -9), segs[:3], strict=True):
        side = qindex.index_path(seg)
        raw = bytearray(side.read_bytes())
        raw[where] ^= 0x10
        side.write_bytes(bytes(raw))
    qindex.index_path(segs[3]).write_bytes(qindex.index_path(segs[4]).read_bytes()[:40])
    qindex.index_path(segs[4]).unlink()  # missing
    assert _same(spark, data) == want
    qindex.index_directory(data / "journal")  # the next pass rebuilds them
    assert all(qindex.load(seg) is not None for seg in segs[:-1])
    # stale: other segments (another seed) under the same names, the old sidecars kept
    other = _journal(tmp_path, "other", seed=11)
    for seg in segs:
        seg.unlink()
    for seg in _segments(other):
        shutil.copy(seg, data / "journal" / seg.name)
    assert all(qindex.load(seg) is None for seg in _segments(data))
    assert _same(spark, data) == _same(spark, other)


def test_tails_and_damage(spark: Any, tmp_path: Path) -> None:
    data = _journal(tmp_path)
    segs = _segments(data)
    sealed = segs[2]
    whole = sealed.read_bytes()
    ours = _queue_offsets(sealed, QUEUE)
    # cut and zero-filled tails of an indexed segment (its sidecar is stale then)
    for tail in (whole[: ours[-1][0] + 7], whole + bytes(500)):
        sealed.write_bytes(tail)
        assert _same(spark, data)[0] == "rows"
    sealed.write_bytes(whole)
    assert qindex.load(sealed) is not None
    # a bad last record, found after indexing: a tail for both reads
    last = bytearray(whole)
    last[-3] ^= 0x40
    sealed.write_bytes(bytes(last))
    assert qindex.load(sealed) is not None  # same size, same CRC fields
    assert _same(spark, data)[0] == "rows"
    # damage in a record of QUEUE after indexing: both fail at that offset
    bad = bytearray(whole)
    at, _size = ours[len(ours) // 2]
    bad[at + 20] ^= 0x5A
    sealed.write_bytes(bytes(bad))
    assert _same(spark, data) == ("error", at)
    # damage before indexing: no sidecar is built; both fail at the same offset
    sealed.write_bytes(bytes(bad))
    qindex.index_path(sealed).unlink()
    assert qindex.ensure(sealed) is None
    assert _same(spark, data) == ("error", at)
    # the last (unindexed) segment cut inside a record
    sealed.write_bytes(whole)
    qindex.ensure(sealed)
    tail = segs[-1].read_bytes()
    segs[-1].write_bytes(tail[: len(tail) - 13])
    assert _same(spark, data)[0] == "rows"


def test_damage_in_another_queue_after_indexing_is_not_read(spark: Any, tmp_path: Path) -> None:
    """The filtered read reads only its queue's ranges: a record of another queue damaged
    after indexing is not read (the full read, and recovery, report it)."""
    data = _journal(tmp_path)
    sealed = _segments(data)[1]
    want = _same(spark, data)
    at, _size = _queue_offsets(sealed, "q5")[10]
    bad = bytearray(sealed.read_bytes())
    bad[at + 20] ^= 0x5A
    sealed.write_bytes(bytes(bad))
    assert _filtered(spark, data) == want
    assert _filtered(spark, data, jvm.PYTHON_NAME) == want
    assert collected(spark.read.format(jvm.NAME).load(str(data))) == ("error", at)
