"""Pure-Python reader of journal segments for the Spark data source (no pyspark import).

It decodes records with the journal's own codec (:mod:`vibemq_server.journal.records`) and
adds where each record is: ``(segment, offset)``. A journal that a running broker is still
writing may end in an incomplete record; the reader stops before it and never returns half a
record (the next read picks it up once it is whole). The same tail rules as the broker's
recovery apply: a bad record that reaches the end of the file, or a zero-filled tail, is a tail;
a bad record with more bytes after it is damage and raises :class:`JournalError`.

Streaming offsets are JSON dicts ``{"segment": n, "position": p}``: the next record to read is
at byte ``p`` of segment ``n``. ``{"segment": 0, "position": 0}`` means "before the first
segment" (segment numbers start at 1). An offset at the end of a closed segment (a newer
segment exists) is normalised to the start of the next one, so reclaiming a fully read segment
is not reported as data loss.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vibemq_server.core.persistence import SettleReason
from vibemq_server.journal import qindex
from vibemq_server.journal.records import (
    MAX_RECORD,
    RECORD_PREFIX,
    SEGMENT_HEADER_SIZE,
    Deliver,
    Entry,
    JournalError,
    Publish,
    QueueCreate,
    QueueDelete,
    Settle,
    check_segment_header,
    decode_record,
)
from vibemq_server.journal.recovery import list_segments, segment_path

try:
    import vibemq_server.spark._colscan as _colscan
except ImportError:  # not built: the pure-Python walk
    _colscan = None  # type: ignore[assignment]

HEADER = SEGMENT_HEADER_SIZE
BEFORE_START: dict[str, int] = {"segment": 0, "position": 0}

# The DataFrame schema, in column order (docs/spark.md has the meaning of every column).
SCHEMA_DDL = (
    "segment BIGINT, offset BIGINT, record_type STRING, timestamp TIMESTAMP, queue STRING, "
    "seq BIGINT, message_id STRING, published_at TIMESTAMP, expires_at TIMESTAMP, "
    "priority INT, headers MAP<STRING,STRING>, payload STRING, payload_binary BINARY, "
    "payload_size INT, delivery_attempts INT, settle_reason STRING, settled_at TIMESTAMP, "
    "dead_letter_reason STRING, detail STRING, queue_options STRING"
)
COLUMNS: tuple[str, ...] = tuple(part.strip().split(" ")[0] for part in SCHEMA_DDL.split(", "))
# Columns holding timestamps: rows carry them as integer microseconds since the epoch (UTC).
TIMESTAMP_COLUMNS = frozenset({"timestamp", "published_at", "expires_at", "settled_at"})
DEAD_LETTER_HEADER = "deadLetterReason"

Row = tuple[Any, ...]


class DataLossError(Exception):
    """Journal segments that a streaming query still had to read are gone (reclaimed)."""


@dataclass(frozen=True, slots=True)
class SegmentFile:
    number: int
    path: str
    size: int


def journal_dir(data_dir: str | os.PathLike[str]) -> Path:
    """The directory holding the segments: ``<data_dir>/journal``, or ``data_dir`` itself."""
    path = Path(data_dir)
    sub = path / "journal"
    return sub if sub.is_dir() else path


def list_segment_files(data_dir: str | os.PathLike[str]) -> list[SegmentFile]:
    """Segment files in number order, with their sizes. A file that vanishes while listing
    (reclaimed by a running broker) is left out."""
    out = []
    for number, path in list_segments(journal_dir(data_dir)):
        try:
            size = path.stat().st_size
        except FileNotFoundError:
            continue
        out.append(SegmentFile(number, str(path), size))
    return out


def segment_file(data_dir: str | os.PathLike[str], number: int) -> str:
    return str(segment_path(journal_dir(data_dir), number))


# -- reading records ---------------------------------------------------------------------------


WINDOW = 8 * 1024 * 1024  # bytes of a segment read at a time by the compiled readers


def _is_tail(buf: bytes, pos: int) -> bool:
    """Whether the bad record at ``pos`` is a tail (cut off, in flight or zero-filled) rather
    than damage with more records after it."""
    rest = len(buf) - pos
    if rest < RECORD_PREFIX.size:
        return True
    (length, _crc) = RECORD_PREFIX.unpack_from(buf, pos)
    if length > MAX_RECORD or pos + RECORD_PREFIX.size + length >= len(buf):
        return True  # incomplete, or the bad record is the last thing in the file
    return not any(buf[pos:])


def _read_file(path: str, start: int, end: int | None) -> tuple[bytes, int]:
    """Bytes ``[start, end)`` of the file (to its current end if ``end`` is None), after
    checking its header; returns the bytes and the header's segment number."""
    with open(path, "rb") as f:
        head = f.read(HEADER)
        if len(head) < HEADER:
            return b"", -1  # a segment being created: no records yet
        number = check_segment_header(head, path)
        f.seek(start)
        data = f.read() if end is None else f.read(max(0, end - start))
    return data, number


def read_entries(
    path: str, start: int = HEADER, end: int | None = None
) -> Iterator[tuple[int, Entry]]:
    """``(absolute offset, entry)`` for every whole record of the segment file from ``start``.

    With ``end`` None, reading stops before an incomplete tail; with ``end`` given (a bound
    that a planner found complete) every record up to exactly ``end`` must decode.
    """
    start = max(start, HEADER)
    data, number = _read_file(path, start, end)
    if number < 0:
        return
    if end is not None and len(data) < end - start:
        raise JournalError(f"segment ends before the planned offset {end}", path, start + len(data))
    pos = 0
    size = len(data)
    while pos < size:
        try:
            entry = decode_record(data, pos, path)
        except JournalError as exc:
            if end is None and _is_tail(data, pos):
                return
            raise JournalError(str(exc).split(" in ")[0], path, start + pos) from None
        yield start + pos, entry
        pos += entry.size


def scan(
    path: str,
    start: int,
    max_records: int | None = None,
    stop: int | None = None,
    window: int = WINDOW,
) -> tuple[int, int]:
    """Walk record prefixes (no decoding) from ``start``: ``(end, count)`` where ``end`` is
    just after the last whole record reached, stopping early after ``max_records``; ``stop``
    (a record boundary) bounds the walk too. The compiled walk when it is built, else
    :func:`scan_python`."""
    if _colscan is None:
        return scan_python(path, start, max_records, stop)
    return _walk(path, start, max_records, stop, window)


def _walk(
    path: str, start: int, max_records: int | None, stop: int | None, window: int
) -> tuple[int, int]:
    """:func:`scan` by the compiled walk, reading ``window`` bytes at a time."""
    assert _colscan is not None
    pos, count = max(start, HEADER), 0
    with open(path, "rb") as f:
        head = f.read(HEADER)
        if len(head) < HEADER:
            return HEADER, 0
        check_segment_header(head, path)
        want = window
        while max_records is None or count < max_records:
            if stop is not None:
                want = min(want, stop - pos)
                if want < RECORD_PREFIX.size + 9:
                    break  # no whole record fits before ``stop``
            f.seek(pos)
            data = f.read(want)
            limit = -1 if max_records is None else max_records - count
            rel, n = _colscan.walk(data, 0, limit)
            pos, count = pos + rel, count + n
            rest = len(data) - rel
            if len(data) < want:
                break  # the end of the file is reached
            if rest < RECORD_PREFIX.size or n == limit:
                want = window
                continue
            (length, _crc) = RECORD_PREFIX.unpack_from(data, rel)
            need = RECORD_PREFIX.size + length
            if length < 9 or length > MAX_RECORD or (stop is not None and pos + need > stop):
                break  # a bad length, or a record that crosses the range's end
            want = max(window, need)
    return pos, count


def record_cuts(path: str, every: int, start: int = HEADER, stop: int | None = None) -> list[int]:
    """Record boundaries about ``every`` bytes apart between ``start`` and ``stop`` (the
    file's end if None), for splitting a segment into ranges. None is past the last whole
    record, and the last range is at least ``every`` long (with ``stop`` None it keeps the
    tail rules)."""
    cuts: list[int] = []
    pos = max(start, HEADER)
    if stop is None:
        try:
            stop = os.stat(path).st_size
        except FileNotFoundError:
            return cuts
    while stop - pos > every + every // 2:
        end, _count = scan(path, pos, None, pos + every)
        if end <= pos:
            break  # a record bigger than a range, or a bad length: the rest is one range
        cuts.append(end)
        pos = end
    return cuts


def scan_python(
    path: str, start: int, max_records: int | None = None, stop: int | None = None
) -> tuple[int, int]:
    """Walk record prefixes (no decoding) from ``start``: ``(end, count)`` where ``end`` is
    just after the last whole record reached, stopping early after ``max_records``. Bytes up to
    a file's size are written (appends grow the size after copying), so a record whose length
    fits in the file is whole; the executors check every CRC when they read it. ``stop`` (a
    record boundary) bounds the walk too."""
    start = max(start, HEADER)
    data, number = _read_file(path, start, None)
    if number < 0:
        return HEADER, 0
    pos, count, size = 0, 0, len(data)
    if stop is not None:
        size = min(size, max(0, stop - start))
    unpack = RECORD_PREFIX.unpack_from
    limit = max_records if max_records is not None else -1
    while count != limit and pos + RECORD_PREFIX.size <= size:
        (length, _crc) = unpack(data, pos)
        nxt = pos + RECORD_PREFIX.size + length
        if length < 9 or length > MAX_RECORD or nxt > size:
            break
        pos = nxt
        count += 1
    return start + pos, count


# -- rows ------------------------------------------------------------------------------------


def _us(ms: int) -> int:
    return ms * 1000


def entry_row(segment: int, offset: int, entry: Entry) -> Row:
    """One row in :data:`COLUMNS` order (timestamps as integer microseconds, UTC)."""
    r = entry.record
    ts = _us(entry.timestamp)
    if isinstance(r, Publish):
        headers = dict(r.headers)
        payload = r.payload
        return (
            segment, offset, "PUBLISH", ts, r.queue, r.seq, r.message_id,
            _us(r.published_at), _us(r.expires_at) if r.expires_at else None, r.priority,
            headers, payload.decode("utf-8", "replace"), payload, len(payload), r.attempts,
            None, None, headers.get(DEAD_LETTER_HEADER), None, None,
        )  # fmt: skip
    if isinstance(r, Deliver):
        return (
            segment, offset, "DELIVER", ts, r.queue, r.seq, None, None, None, None, None,
            None, None, None, r.attempts, None, None, None, None, None,
        )  # fmt: skip
    if isinstance(r, Settle):
        dead = r.detail if r.reason is SettleReason.DEAD_LETTERED else None
        return (
            segment, offset, "SETTLE", ts, r.queue, r.seq, None, None, None, None, None,
            None, None, None, None, r.reason.name, ts, dead, r.detail, None,
        )  # fmt: skip
    if isinstance(r, QueueCreate):
        options = r.options_json.decode("utf-8", "replace")
        return (
            segment, offset, "QUEUE_CREATE", ts, r.name, None, None, None, None, None, None,
            None, None, None, None, None, None, None, None, options,
        )  # fmt: skip
    assert isinstance(r, QueueDelete)
    return (
        segment, offset, "QUEUE_DELETE", ts, r.name, None, None, None, None, None, None,
        None, None, None, None, None, None, None, None, None,
    )  # fmt: skip


@dataclass(frozen=True, slots=True)
class RowFilter:
    """Filters applied while reading: queues (empty = all) and a record-time range in ms."""

    queues: frozenset[str] = frozenset()
    start_ms: int | None = None  # inclusive
    end_ms: int | None = None  # exclusive

    def keeps(self, entry: Entry) -> bool:
        if self.start_ms is not None and entry.timestamp < self.start_ms:
            return False
        if self.end_ms is not None and entry.timestamp >= self.end_ms:
            return False
        if self.queues:
            r = entry.record
            name = r.name if isinstance(r, QueueCreate | QueueDelete) else r.queue
            return name in self.queues
        return True

    def may_hold(self, first_ms: int | None, last_ms: int | None) -> bool:
        """Whether a segment whose records were written from ``first_ms`` (its first record)
        to ``last_ms`` (its file's modification time) may hold records in the range."""
        if self.end_ms is not None and first_ms is not None and first_ms >= self.end_ms:
            return False
        return not (self.start_ms is not None and last_ms is not None and last_ms < self.start_ms)


NO_FILTER = RowFilter()


def read_rows(
    path: str,
    segment: int,
    start: int = HEADER,
    end: int | None = None,
    row_filter: RowFilter = NO_FILTER,
) -> Iterator[Row]:
    keeps = row_filter.keeps
    for offset, entry in read_entries(path, start, end):
        if keeps(entry):
            yield entry_row(segment, offset, entry)


def read_range_rows(
    path: str,
    segment: int,
    ranges: Sequence[tuple[int, int]],
    row_filter: RowFilter = NO_FILTER,
) -> Iterator[Row]:
    """:func:`read_rows` of ranges of whole records (a queue index's). A bad record is a tail
    by the rule of a whole read and ends the rows; else it fails the read."""
    for start, end in ranges:
        try:
            yield from read_rows(path, segment, start, end, row_filter)
        except JournalError as exc:
            with open(path, "rb") as f:
                if _is_tail(f.read(), exc.offset):
                    return
            raise


def first_record_ms(path: str) -> int | None:
    """The timestamp of the segment's first record (None if it has none yet)."""
    with open(path, "rb") as f:
        data = f.read(HEADER + RECORD_PREFIX.size + 9)
    if len(data) < HEADER + RECORD_PREFIX.size + 9:
        return None
    return int.from_bytes(data[HEADER + RECORD_PREFIX.size + 1 :], "big")


def segments_for(data_dir: str, row_filter: RowFilter) -> list[SegmentFile]:
    """The segments a batch read must open: all of them, less those the time range excludes."""
    out = []
    for seg in list_segment_files(data_dir):
        if row_filter.start_ms is not None or row_filter.end_ms is not None:
            try:
                first = first_record_ms(seg.path)
                last = int(os.stat(seg.path).st_mtime * 1000) + 1
            except FileNotFoundError:
                continue
            if not row_filter.may_hold(first, last):
                continue
        out.append(seg)
    return out


def index_ranges(seg: SegmentFile, row_filter: RowFilter) -> list[tuple[int, int]] | None:
    """The byte ranges of ``seg`` that hold the rows of a queue or time filter, by its queue
    index sidecar (:mod:`vibemq_server.journal.qindex`), in file order with adjacent ones
    merged; None when there is no such filter or no valid sidecar (read the segment whole)."""
    if not row_filter.queues and row_filter.start_ms is None and row_filter.end_ms is None:
        return None
    index = qindex.load(Path(seg.path), row_filter.queues or None)
    if index is None:
        return None
    found: list[tuple[int, int]] = []
    for name, spans in index.queues.items():
        if row_filter.queues and name not in row_filter.queues:
            continue
        if row_filter.may_hold(spans.min_ts, spans.max_ts):
            found.extend(spans.ranges)
    found.sort()
    merged: list[tuple[int, int]] = []
    for start, end in found:
        if merged and merged[-1][1] == start:
            merged[-1] = (merged[-1][0], end)
        else:
            merged.append((start, end))
    return merged


def range_groups(ranges: list[tuple[int, int]], every: int) -> list[tuple[tuple[int, int], ...]]:
    """``ranges`` in groups of about ``every`` bytes (one partition each)."""
    out: list[tuple[tuple[int, int], ...]] = []
    group: list[tuple[int, int]] = []
    size = 0
    for r in ranges:
        group.append(r)
        size += r[1] - r[0]
        if size >= every:
            out.append(tuple(group))
            group, size = [], 0
    if group:
        out.append(tuple(group))
    return out


# -- streaming offsets -----------------------------------------------------------------------


@dataclass(frozen=True, slots=True, order=True)
class Offset:
    segment: int
    position: int

    def to_json(self) -> dict[str, int]:
        return {"segment": self.segment, "position": self.position}

    @classmethod
    def from_json(cls, value: Any) -> Offset:
        if isinstance(value, str):
            value = json.loads(value)
        if not isinstance(value, dict):
            raise ValueError(f"offset must be a JSON object, got {value!r}")
        try:
            return cls(int(value["segment"]), int(value["position"]))
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f'offset must be {{"segment": n, "position": p}}: {value!r}') from exc


@dataclass(frozen=True, slots=True)
class Chunk:
    """One streaming partition: records of ``segment`` in ``[start, end)``."""

    segment: int
    start: int
    end: int


def _resolve_start(
    segments: Sequence[SegmentFile], start: Offset, fail_on_data_loss: bool
) -> tuple[int, Offset]:
    """Index into ``segments`` where ``start`` is, moving past reclaimed segments."""
    for i, seg in enumerate(segments):
        if seg.number == start.segment:
            return i, start
        if seg.number > start.segment:
            if start.segment != 0:
                data_loss(start.segment, seg.number, fail_on_data_loss)
            return i, Offset(seg.number, HEADER)
    return len(segments), start


def data_loss(missing: int, next_existing: int, fail: bool) -> None:
    if fail:
        raise DataLossError(
            f"journal segment {missing} is gone (reclaimed) before the stream read all of it; "
            f"the next segment is {next_existing}. Some records may have been lost. Set the "
            'option failOnDataLoss to "false" to continue from the next segment.'
        )


def latest_offset(
    data_dir: str,
    start: Offset,
    max_records: int | None = None,
    fail_on_data_loss: bool = True,
    cap: Offset | None = None,
) -> tuple[Offset, int]:
    """The offset after at most ``max_records`` whole records from ``start`` (and not past
    ``cap``), with how many records that is. Never moves backwards."""
    segments = list_segment_files(data_dir)
    if cap is not None:
        segments = [s for s in segments if s.number <= cap.segment]
    i, cur = _resolve_start(segments, start, fail_on_data_loss)
    if i == len(segments):
        return start, 0
    total = 0
    while True:
        seg = segments[i]
        remaining = None if max_records is None else max_records - total
        stop = cap.position if cap is not None and seg.number == cap.segment else None
        end, count = scan(seg.path, cur.position, remaining, stop)
        total += count
        pos = max(end, cur.position)
        if i + 1 == len(segments):
            return Offset(seg.number, pos), total
        # A closed segment: go on to the next one once this one is read to its end.
        if remaining is not None and count >= remaining and scan(seg.path, pos, 1)[1]:
            return Offset(seg.number, pos), total
        nxt = segments[i + 1]
        if nxt.number != seg.number + 1:
            data_loss(seg.number + 1, nxt.number, fail_on_data_loss)
        i, cur = i + 1, Offset(nxt.number, HEADER)
        if max_records is not None and total >= max_records:
            return cur, total


def plan_chunks(
    data_dir: str, start: Offset, end: Offset, fail_on_data_loss: bool = True
) -> list[Chunk]:
    """The segment ranges between two offsets, one chunk per segment."""
    if end <= start:
        return []
    segments = [s for s in list_segment_files(data_dir) if s.number <= end.segment]
    i, cur = _resolve_start(segments, start, fail_on_data_loss)
    chunks = []
    prev = None
    for seg in segments[i:]:
        if prev is not None and seg.number != prev + 1:
            data_loss(prev + 1, seg.number, fail_on_data_loss)
        prev = seg.number
        begin = cur.position if seg.number == cur.segment else HEADER
        stop = end.position if seg.number == end.segment else scan(seg.path, begin)[0]
        if stop > begin:
            chunks.append(Chunk(seg.number, begin, stop))
    return chunks


def read_chunk(
    data_dir: str, chunk: Chunk, row_filter: RowFilter = NO_FILTER, fail_on_data_loss: bool = True
) -> Iterator[Row]:
    path = segment_file(data_dir, chunk.segment)
    if not os.path.exists(path):
        data_loss(chunk.segment, chunk.segment + 1, fail_on_data_loss)
        return
    yield from read_rows(path, chunk.segment, chunk.start, chunk.end, row_filter)


def parse_time_ms(value: str) -> int:
    """Milliseconds since the epoch from an integer string (ms) or an ISO-8601 time (UTC
    unless it names a zone)."""
    from datetime import UTC, datetime

    text = value.strip()
    if text.lstrip("-").isdigit():
        return int(text)
    moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return int(moment.timestamp() * 1000)


def parse_queues(value: str | None) -> frozenset[str]:
    if not value:
        return frozenset()
    return frozenset(q.strip() for q in value.split(",") if q.strip())


def transpose(rows: Sequence[Row]) -> list[list[Any]]:
    """Rows to columns (for building Arrow batches)."""
    if not rows:
        return [[] for _ in COLUMNS]
    return [list(col) for col in zip(*rows, strict=True)]
