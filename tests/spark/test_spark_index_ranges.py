"""The Python source's read of a queue index's ranges (no Spark): the same table as the whole
read filtered, in bulk and record by record, through windows and batches of any size; damage
in a range fails at its file offset, a bad last record is a tail."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest

from vibemq_server.journal import qindex
from vibemq_server.journal.records import JournalError, iter_records
from vibemq_server.spark import columnar
from vibemq_server.spark import journal_reader as jr
from vibemq_server.spark.generate import START_MS, generate

FILTERS = [
    jr.RowFilter(queues=frozenset({"q3"})),
    jr.RowFilter(queues=frozenset({"q1", "q2.dlq"}), start_ms=START_MS + 300),
    jr.RowFilter(start_ms=START_MS + 500, end_ms=START_MS + 900),
]


@pytest.fixture
def segment(tmp_path: Path) -> jr.SegmentFile:
    generate(tmp_path, 1500, queues=10, segment_size=1 << 30)
    seg = jr.list_segment_files(tmp_path)[0]
    assert qindex.ensure(Path(seg.path)) is not None
    return seg


def _whole(seg: jr.SegmentFile, row_filter: jr.RowFilter) -> pa.Table:
    batches = columnar.read_batches(
        seg.path, seg.number, columnar.ARROW_SCHEMA, row_filter=row_filter
    )
    return pa.Table.from_batches(list(batches), schema=columnar.ARROW_SCHEMA)


@pytest.mark.parametrize("row_filter", FILTERS)
@pytest.mark.parametrize(("window", "batch_rows"), [(columnar.WINDOW, 65536), (700, 7)])
def test_ranges_read_equals_the_whole_read(
    segment: jr.SegmentFile, row_filter: jr.RowFilter, window: int, batch_rows: int
) -> None:
    ranges = jr.index_ranges(segment, row_filter)
    assert ranges
    size = Path(segment.path).stat().st_size
    if row_filter.queues:  # (a time range alone: every queue's span meets it here)
        assert sum(e - s for s, e in ranges) < size / 2
    got = columnar.read_ranges(
        segment.path, segment.number, columnar.ARROW_SCHEMA, ranges, row_filter, window, batch_rows
    )
    want = _whole(segment, row_filter)
    assert pa.Table.from_batches(list(got), schema=columnar.ARROW_SCHEMA).equals(want)
    rows = list(jr.read_range_rows(segment.path, segment.number, ranges, row_filter))
    assert rows == list(jr.read_rows(segment.path, segment.number, row_filter=row_filter))


def test_damage_in_a_range_and_a_bad_last_record(segment: jr.SegmentFile) -> None:
    row_filter = FILTERS[0]
    ranges = jr.index_ranges(segment, row_filter)
    assert ranges
    path = Path(segment.path)
    whole = path.read_bytes()
    ours = [e for e in iter_records(whole) if getattr(e.record, "queue", "") == "q3"]
    bad = bytearray(whole)
    at = ours[len(ours) // 2].offset
    bad[at + 15] ^= 0x20
    path.write_bytes(bytes(bad))
    for read in (
        lambda: list(
            columnar.read_ranges(
                segment.path, segment.number, columnar.ARROW_SCHEMA, ranges, row_filter, 900, 5
            )
        ),
        lambda: list(jr.read_range_rows(segment.path, segment.number, ranges, row_filter)),
    ):
        with pytest.raises(JournalError) as failed:
            read()
        assert failed.value.offset == at
    # the file's last record bad: a tail to a whole read, and to a read of its queue's ranges
    last_queue = list(iter_records(whole))[-1].record
    queue_filter = jr.RowFilter(queues=frozenset({getattr(last_queue, "queue", "")}))
    ranges = jr.index_ranges(segment, queue_filter)
    assert ranges and ranges[-1][1] == len(whole)
    last = bytearray(whole)
    last[-3] ^= 0x20
    path.write_bytes(bytes(last))
    got = columnar.read_ranges(
        segment.path, segment.number, columnar.ARROW_SCHEMA, ranges, queue_filter
    )
    want = _whole(segment, queue_filter)
    assert pa.Table.from_batches(list(got), schema=columnar.ARROW_SCHEMA).equals(want)
    rows = list(jr.read_range_rows(segment.path, segment.number, ranges, queue_filter))
    assert rows == list(jr.read_rows(segment.path, segment.number, row_filter=queue_filter))
    assert len(rows) == want.num_rows
