"""The compiled columnar scanner against the per-record reader (the reference), row for row.

Both read the same journals: generated ones, hand-made records (repeated header keys, invalid
UTF-8, every record type and settle reason), cut at any byte (tails), damaged at any byte,
through small windows and batches, with queue and time filters and streaming ranges. The
outcome must be the same table, or the same error at the same offset. No Spark, no Java.
"""

from __future__ import annotations

import itertools
import struct
import zlib
from pathlib import Path

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from vibemq_server.core.persistence import SettleReason
from vibemq_server.journal.records import (
    JournalError,
    QueueCreate,
    QueueDelete,
    RecordType,
    encode_deliver,
    encode_publish,
    encode_record,
    encode_segment_header,
    encode_settle,
)
from vibemq_server.spark import columnar
from vibemq_server.spark import journal_reader as jr
from vibemq_server.spark.generate import START_MS, generate

SMALL = 64 * 1024
SCHEMA = columnar.ARROW_SCHEMA
SETTINGS = settings(
    max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


def test_the_scanner_is_built() -> None:
    # The comparison below is only worth something against the compiled scanner: it is built
    # by `pip install -e .` or scripts/build_ext.sh, and CI must have it.
    assert columnar.available(), "build it: pip install -e . or scripts/build_ext.sh"


def _s16(text: bytes) -> bytes:
    return struct.pack(">H", len(text)) + text


def _framed(inner: bytes) -> bytes:
    return struct.pack(">II", len(inner), zlib.crc32(inner)) + inner


def _raw_publish(
    ts: int, seq: int, queue: bytes, headers: list[tuple[bytes, bytes]], payload: bytes
) -> bytes:
    """A PUBLISH written byte by byte: it may repeat header keys, which the encoder cannot."""
    body = struct.pack(">BQQQQBH", RecordType.PUBLISH, ts, seq, ts, 0, 2, 1) + _s16(queue)
    body += _s16(b"m%d" % seq) + struct.pack(">H", len(headers))
    for key, value in headers:
        body += _s16(key) + _s16(value)
    return _framed(body + struct.pack(">I", len(payload)) + payload)


def _odd_records() -> list[bytes]:
    ts = START_MS
    out = [
        encode_record(QueueCreate("q", ts, b'{"durable": true}'), ts),
        encode_record(QueueCreate("odd", ts, b'{"x": "\xff\xfe"}'), ts),  # replaced, not refused
        encode_publish(ts, 1, "q", "m1", ts, ts + 5000, 3, 0, {"a": "1", "é": "ü"}, b'{"n": 1}'),
        encode_publish(ts + 1, 2, "q", "", ts + 1, 0, 0, 7, {}, b""),
        encode_publish(ts + 1, 3, "q", "m3", ts + 1, 0, 1, 0, {}, b'"\xc3\x28 bad \xed\xa0\x80"'),
        _raw_publish(ts + 2, 4, b"q", [(b"k", b"1"), (b"j", b"2"), (b"k", b"3")], b"[]"),
        _raw_publish(
            ts + 2,
            5,
            b"q.dlq",
            [(b"deadLetterReason", b"Old"), (b"deadLetterReason", b"MaxRetriesExceeded")],
            b"{}",
        ),
        encode_deliver(ts + 3, 1, "q", 1),
    ]
    out += [encode_settle(ts + 4, 1, "q", int(r), f"d{int(r)}") for r in SettleReason]
    out.append(encode_record(QueueDelete("q"), ts + 5))
    big = b'"' + b"x" * (3 * 4096) + b'"'  # bigger than the small windows below
    out.append(encode_publish(ts + 6, 6, "big", "mb", ts + 6, 0, 1, 0, {}, big))
    out.append(encode_deliver(ts + 7, 6, "big", 1))
    return out


@pytest.fixture(scope="module")
def journal(tmp_path_factory: pytest.TempPathFactory) -> Path:
    data = tmp_path_factory.mktemp("journal")
    generate(data, 1500, segment_size=SMALL)
    return data


@pytest.fixture(scope="module")
def odd(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("odd") / "00000000000000000001.seg"
    path.write_bytes(encode_segment_header(1) + b"".join(_odd_records()))
    return path


def _outcome(read: object) -> tuple[str, object]:
    try:
        batches = list(read())  # type: ignore[operator]
    except JournalError as exc:
        return "error", (exc.offset, str(exc).split(" (")[0].split(" in ")[0])
    return "rows", pa.Table.from_batches(batches, schema=SCHEMA)


def _both(
    path: str,
    segment: int,
    start: int = jr.HEADER,
    end: int | None = None,
    row_filter: jr.RowFilter = jr.NO_FILTER,
    window: int = columnar.WINDOW,
    batch_rows: int = columnar.BATCH_ROWS,
) -> tuple[tuple[str, object], tuple[str, object]]:
    new = _outcome(
        lambda: columnar.read_batches(
            path, segment, SCHEMA, start, end, row_filter, window=window, batch_rows=batch_rows
        )
    )
    ref = _outcome(
        lambda: columnar.rows_to_batches(
            jr.read_rows(path, segment, start, end, row_filter), SCHEMA
        )
    )
    return new, ref


def _same(new: tuple[str, object], ref: tuple[str, object]) -> None:
    assert new[0] == ref[0], (new, ref)
    if new[0] == "error":
        # Same offset, same kind of error (the text of a malformed body's detail may differ).
        (off_n, msg_n), (off_r, msg_r) = new[1], ref[1]  # type: ignore[misc]
        assert off_n == off_r
        assert msg_n.split(" ")[0] == msg_r.split(" ")[0] or "malformed" in msg_r + msg_n
    else:
        assert isinstance(new[1], pa.Table) and isinstance(ref[1], pa.Table)
        assert new[1].num_rows == ref[1].num_rows
        assert new[1].equals(ref[1]), (new[1].to_pylist()[:3], ref[1].to_pylist()[:3])


def test_generated_journal_row_for_row(journal: Path) -> None:
    for seg in jr.list_segment_files(journal):
        new, ref = _both(seg.path, seg.number)
        assert ref[0] == "rows" and ref[1].num_rows > 100  # type: ignore[union-attr]
        _same(new, ref)
        _same(*_both(seg.path, seg.number, window=4096, batch_rows=7))


def test_odd_records_row_for_row(odd: Path) -> None:
    new, ref = _both(str(odd), 1, window=4096, batch_rows=3)
    _same(new, ref)
    table = new[1]
    assert isinstance(table, pa.Table)
    rows = table.to_pylist()
    assert rows[5]["headers"] == [("k", "3"), ("j", "2")]  # first position, last value
    assert rows[6]["dead_letter_reason"] == "MaxRetriesExceeded"
    assert "\ufffd" in rows[4]["payload"] and rows[1]["queue_options"].endswith('\ufffd\ufffd"}')
    assert {r["settle_reason"] for r in rows if r["record_type"] == "SETTLE"} == {
        r.name for r in SettleReason
    }


def test_filters_row_for_row(journal: Path) -> None:
    many = frozenset({"q1", *(f"other{i}" for i in range(70))})  # more than the scanner takes
    filters = [
        jr.RowFilter(queues=frozenset({"q1"})),
        jr.RowFilter(queues=frozenset({"q0.dlq", "q2"})),
        jr.RowFilter(queues=many),
        jr.RowFilter(start_ms=START_MS + 300, end_ms=START_MS + 700),
        jr.RowFilter(queues=frozenset({"q3"}), start_ms=START_MS + 100),
        jr.RowFilter(queues=frozenset({"nowhere"})),
    ]
    for seg in jr.list_segment_files(journal)[:3]:
        for row_filter in filters:
            _same(*_both(seg.path, seg.number, row_filter=row_filter, batch_rows=50))


@SETTINGS
@given(
    cut=st.integers(min_value=0, max_value=SMALL + 4096),
    window=st.sampled_from([64, 1000, 4096, columnar.WINDOW]),
)
def test_any_cut_row_for_row(journal: Path, tmp_path: Path, cut: int, window: int) -> None:
    seg = jr.list_segment_files(journal)[0]
    path = tmp_path / "00000000000000000001.seg"
    path.write_bytes(Path(seg.path).read_bytes()[:cut])
    _same(*_both(str(path), 1, window=window, batch_rows=100))
    assert jr.scan(str(path), jr.HEADER, window=window) == jr.scan_python(str(path), jr.HEADER)


@SETTINGS
@given(
    where=st.integers(min_value=0, max_value=20_000),
    flip=st.integers(min_value=1, max_value=255),
    zeros=st.integers(min_value=0, max_value=300),
    window=st.sampled_from([100, 4096, columnar.WINDOW]),
)
def test_any_damage_row_for_row(
    odd: Path, tmp_path: Path, where: int, flip: int, zeros: int, window: int
) -> None:
    data = bytearray(odd.read_bytes())
    where = jr.HEADER + where % (len(data) - jr.HEADER)
    data[where] ^= flip
    path = tmp_path / "00000000000000000001.seg"
    path.write_bytes(bytes(data) + bytes(zeros))
    _same(*_both(str(path), 1, window=window, batch_rows=4))


@SETTINGS
@given(
    first=st.integers(min_value=0, max_value=400),
    count=st.integers(min_value=1, max_value=900),
    window=st.sampled_from([200, 4096, columnar.WINDOW]),
)
def test_stream_ranges_row_for_row(journal: Path, first: int, count: int, window: int) -> None:
    seg = jr.list_segment_files(journal)[1]
    start, _ = jr.scan(seg.path, jr.HEADER, first)
    end, n = jr.scan(seg.path, start, count, window=window)
    assert (end, n) == jr.scan_python(seg.path, start, count)
    assert jr.scan(seg.path, start, None, end, window) == jr.scan_python(seg.path, start, None, end)
    _same(*_both(seg.path, seg.number, start, end, window=window, batch_rows=64))
    # A planned end past the file, or inside a record, is an error for both.
    _same(*_both(seg.path, seg.number, start, seg.size + 10, window=window))
    _same(*_both(seg.path, seg.number, start, end - 3, window=window))


def test_pushed_filters_narrow_the_row_filter() -> None:
    from datetime import UTC, datetime

    from pyspark.sql.datasource import EqualTo, GreaterThan, In, LessThanOrEqual, StringContains

    from vibemq_server.spark import pushdown

    t = datetime(2026, 1, 1, 0, 0, 1, 500, tzinfo=UTC)  # 1 ms after START_MS + 999.5 ms
    other = StringContains(("queue",), "q")
    filters = [
        In(("queue",), ("q1", "q2")),
        EqualTo(("queue",), "q2"),
        GreaterThan(("timestamp",), t),
        LessThanOrEqual(("timestamp",), t.replace(second=2, microsecond=0)),
        other,
        EqualTo(("seq",), 3),
    ]
    got, rest = pushdown.push(jr.RowFilter(start_ms=START_MS), filters)
    assert got == jr.RowFilter(frozenset({"q2"}), START_MS + 1001, START_MS + 2001)
    assert rest == [other, filters[-1]]
    nothing, _ = pushdown.push(jr.RowFilter(queues=frozenset({"a"})), [EqualTo(("queue",), "b")])
    assert nothing.start_ms is not None and nothing.end_ms is not None
    assert nothing.start_ms >= nothing.end_ms  # reads no segment at all


def test_ranges_at_record_cuts_read_the_whole_segment(journal: Path) -> None:
    seg = jr.list_segment_files(journal)[0]
    cuts = jr.record_cuts(seg.path, 4096)
    assert len(cuts) > 5 and cuts == sorted(cuts)
    bounds = [jr.HEADER, *cuts, None]
    parts = [
        b
        for start, end in itertools.pairwise(bounds)
        for b in columnar.read_batches(seg.path, seg.number, SCHEMA, start or jr.HEADER, end)
    ]
    _same(("rows", pa.Table.from_batches(parts, schema=SCHEMA)), _both(seg.path, seg.number)[1])
    # Within a streaming chunk [start, end): every range has an end, the same rows again.
    first, last = cuts[1], cuts[-1]
    inner = jr.record_cuts(seg.path, 4096, first, last)
    assert inner and first < inner[0] and inner[-1] < last
    parts = [
        b
        for start, end in itertools.pairwise([first, *inner, last])
        for b in columnar.read_batches(seg.path, seg.number, SCHEMA, start, end)
    ]
    _same(
        ("rows", pa.Table.from_batches(parts, schema=SCHEMA)),
        _both(seg.path, seg.number, first, last)[1],
    )
