"""The pure-Python segment reader and offset logic (no Spark, no Java)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from vibemq_server.journal.records import JournalError, iter_records
from vibemq_server.spark import journal_reader as jr
from vibemq_server.spark.generate import START_MS, generate
from vibemq_server.spark.publisher import PublishConfig, check_columns, to_outgoing

SMALL = 64 * 1024


@pytest.fixture(scope="module")
def journal(tmp_path_factory: pytest.TempPathFactory) -> Path:
    data = tmp_path_factory.mktemp("journal")
    generate(data, 2000, segment_size=SMALL)
    return data


def _all_rows(data: Path) -> list[jr.Row]:
    return [
        row for seg in jr.list_segment_files(data) for row in jr.read_rows(seg.path, seg.number)
    ]


def test_reads_every_record_the_codec_reads(journal: Path) -> None:
    segments = jr.list_segment_files(journal)
    assert len(segments) > 3
    assert [s.number for s in segments] == list(range(1, len(segments) + 1))
    for seg in segments:
        data = Path(seg.path).read_bytes()
        expected = [(e.offset, e.record) for e in iter_records(data)]
        got = [(off, e.record) for off, e in jr.read_entries(seg.path)]
        assert got == expected


def test_rows_follow_the_schema(journal: Path) -> None:
    rows = _all_rows(journal)
    assert all(len(row) == len(jr.COLUMNS) for row in rows)
    col = {name: i for i, name in enumerate(jr.COLUMNS)}
    publishes = [r for r in rows if r[col["record_type"]] == "PUBLISH"]
    dead = [r for r in publishes if r[col["queue"]].endswith(".dlq")]
    assert dead and all(r[col["dead_letter_reason"]] == "MaxRetriesExceeded" for r in dead)
    first = publishes[0]
    assert first[col["published_at"]] == START_MS * 1000
    assert first[col["payload_binary"]].decode() == first[col["payload"]]
    assert first[col["payload_size"]] == len(first[col["payload_binary"]])
    settles = [r for r in rows if r[col["record_type"]] == "SETTLE"]
    assert {r[col["settle_reason"]] for r in settles} == {"ACKED", "DEAD_LETTERED", "EXPIRED"}
    assert all(r[col["settled_at"]] == r[col["timestamp"]] for r in settles)


def test_queue_and_time_filters(journal: Path) -> None:
    rows = _all_rows(journal)
    qi, ti = jr.COLUMNS.index("queue"), jr.COLUMNS.index("timestamp")
    only = jr.RowFilter(queues=frozenset({"q1"}))
    got = [
        r
        for s in jr.list_segment_files(journal)
        for r in jr.read_rows(s.path, s.number, row_filter=only)
    ]
    assert got == [r for r in rows if r[qi] == "q1"]
    lo, hi = START_MS + 500, START_MS + 900
    window = jr.RowFilter(start_ms=lo, end_ms=hi)
    segs = jr.segments_for(str(journal), window)
    assert 0 < len(segs) < len(jr.list_segment_files(journal))  # segments skipped
    got = [r for s in segs for r in jr.read_rows(s.path, s.number, row_filter=window)]
    assert got == [r for r in rows if lo * 1000 <= r[ti] < hi * 1000]


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(cut=st.integers(min_value=0, max_value=SMALL + 4096))
def test_any_cut_yields_a_prefix_never_half_a_record(
    journal: Path, tmp_path: Path, cut: int
) -> None:
    seg = jr.list_segment_files(journal)[0]
    full = [(off, e.record) for off, e in jr.read_entries(seg.path)]
    data = Path(seg.path).read_bytes()
    path = tmp_path / "00000000000000000001.seg"
    path.write_bytes(data[:cut])
    got = [(off, e.record) for off, e in jr.read_entries(str(path))]
    assert got == full[: len(got)]
    # every whole record before the cut is returned
    whole = [
        item
        for item, nxt in zip(full, [*(o for o, _ in full[1:]), len(data)], strict=True)
        if nxt <= cut
    ]
    assert len(got) == len(whole)
    assert jr.scan(str(path), jr.HEADER)[1] == len(whole)


def test_zero_filled_tail_stops_and_damage_in_the_middle_raises(
    journal: Path, tmp_path: Path
) -> None:
    seg = jr.list_segment_files(journal)[0]
    data = Path(seg.path).read_bytes()
    n = len(list(jr.read_entries(seg.path)))
    zeros = tmp_path / "zeros.seg"
    zeros.write_bytes(data + bytes(300))
    assert len(list(jr.read_entries(str(zeros)))) == n
    offsets = [off for off, _ in jr.read_entries(seg.path)]
    damaged = bytearray(data)
    damaged[offsets[5] + 12] ^= 0xFF  # a body byte of the sixth record: CRC mismatch
    bad = tmp_path / "bad.seg"
    bad.write_bytes(bytes(damaged))
    with pytest.raises(JournalError, match=f"checksum mismatch in {bad} at offset {offsets[5]}"):
        list(jr.read_entries(str(bad)))
    torn_last = bytearray(data)
    torn_last[offsets[-1] + 12] ^= 0xFF  # the last record damaged: a tail
    last = tmp_path / "last.seg"
    last.write_bytes(bytes(torn_last))
    assert len(list(jr.read_entries(str(last)))) == n - 1


def test_offsets_walk_segments_and_respect_limits(journal: Path) -> None:
    d = str(journal)
    rows = _all_rows(journal)
    start = jr.Offset(**jr.BEFORE_START)
    end, count = jr.latest_offset(d, start)
    assert count == len(rows)
    last = jr.list_segment_files(journal)[-1]
    assert end == jr.Offset(last.number, last.size)
    # Walk in steps of 777 records: the chunks between the offsets give every row once.
    got: list[jr.Row] = []
    cur = start
    for _ in range(100):
        nxt, n = jr.latest_offset(d, cur, 777)
        if nxt == cur:
            break
        assert 0 < n <= 777
        chunk_rows = [r for c in jr.plan_chunks(d, cur, nxt) for r in jr.read_chunk(d, c)]
        assert len(chunk_rows) == n
        got.extend(chunk_rows)
        cur = nxt
    assert got == rows
    # The end of a closed segment is the start of the next one.
    first = jr.list_segment_files(journal)[0]
    per_first = len(list(jr.read_entries(first.path)))
    assert jr.latest_offset(d, start, per_first)[0] == jr.Offset(2, jr.HEADER)
    # A cap (availableNow's target) is never passed.
    cap = jr.Offset(2, jr.latest_offset(d, jr.Offset(2, jr.HEADER), 10)[0].position)
    assert jr.latest_offset(d, start, None, cap=cap) == (cap, per_first + 10)


def test_reclaimed_segments_are_data_loss(journal: Path, tmp_path: Path) -> None:
    data = tmp_path / "data"
    shutil.copytree(journal, data)
    d = str(data)
    segs = jr.list_segment_files(data)
    mid = jr.Offset(1, jr.latest_offset(d, jr.Offset(1, jr.HEADER), 5)[0].position)
    Path(segs[0].path).unlink()  # reclaimed, as the broker does, oldest first
    with pytest.raises(jr.DataLossError, match="segment 1 is gone"):
        jr.latest_offset(d, mid)
    with pytest.raises(jr.DataLossError):
        jr.plan_chunks(d, mid, jr.Offset(3, jr.HEADER))
    end, count = jr.latest_offset(d, mid, fail_on_data_loss=False)
    assert end.segment == segs[-1].number
    assert count == len(_all_rows(data))
    # A gap in the middle is loss too.
    Path(segs[2].path).unlink()
    with pytest.raises(jr.DataLossError, match="segment 3 is gone"):
        jr.latest_offset(d, jr.Offset(2, jr.HEADER))
    # Starting before the first segment never is.
    assert jr.latest_offset(d, jr.Offset(**jr.BEFORE_START), 1)[1] == 1


def test_offset_json_and_times() -> None:
    assert jr.Offset.from_json('{"segment": 3, "position": 99}') == jr.Offset(3, 99)
    assert jr.Offset(3, 99).to_json() == {"segment": 3, "position": 99}
    with pytest.raises(ValueError):
        jr.Offset.from_json('{"segment": 3}')
    assert jr.parse_time_ms("1767225600000") == START_MS
    assert jr.parse_time_ms("2026-01-01T00:00:00Z") == START_MS
    assert jr.parse_time_ms("2026-01-01T01:00:00+01:00") == START_MS
    assert jr.parse_queues(" a, b,,") == frozenset({"a", "b"})


def test_publisher_rows() -> None:
    cfg = PublishConfig.from_options({"HOST": "127.0.0.1", "port": "1", "queue": "jobs"})
    assert (cfg.host, cfg.port, cfg.queue) == ("127.0.0.1", 1, "jobs")
    out = to_outgoing({"payload": '{"a": 1}', "headers": {"k": "v"}, "priority": 2}, cfg)
    assert (out.queue, out.payload, out.headers, out.priority) == (
        "jobs",
        b'{"a": 1}',
        {"k": "v"},
        "High",
    )
    cfg2 = PublishConfig.from_options({})
    out = to_outgoing({"queue": "q", "payload": None, "payload_binary": b"[1]"}, cfg2)
    assert (out.queue, out.payload, out.priority) == ("q", b"[1]", None)
    with pytest.raises(ValueError, match="payload"):
        check_columns(["queue"], cfg2)
    with pytest.raises(ValueError, match="queue"):
        check_columns(["payload"], cfg2)
