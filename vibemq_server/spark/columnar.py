"""Journal segments as Arrow record batches, decoded in bulk by the compiled scanner.

:mod:`vibemq_server.spark._colscan` (C, built with the package) walks a window of a segment,
checks every record like :func:`vibemq_server.journal.records.decode_record` and writes the rows
that pass the queue and time filters straight into Arrow buffers; this module reads the file in
bounded windows, wraps those buffers as arrays and applies the reader's tail and damage rules
(:mod:`vibemq_server.spark.journal_reader`, which stays the reference and the fallback when the
extension is not built). Memory of a worker is bounded by :data:`WINDOW` plus one batch (a
record bigger than the window is read whole: at most ``MAX_RECORD``).
"""

from __future__ import annotations

import array
import bisect
import os
from collections.abc import Generator, Iterator, Sequence
from typing import IO, Any

import pyarrow as pa

from vibemq_server.core.persistence import SettleReason
from vibemq_server.journal.records import (
    MAX_RECORD,
    RECORD_PREFIX,
    JournalError,
    RecordType,
    check_segment_header,
)
from vibemq_server.spark import journal_reader as jr

try:
    import vibemq_server.spark._colscan as _colscan
except ImportError:  # not built (no C compiler at install time): the per-record reader
    _colscan = None  # type: ignore[assignment]

WINDOW = jr.WINDOW
BATCH_ROWS = 65536
BATCH_BYTES = 16 * 1024 * 1024  # about this many bytes of strings and payloads per batch
_MAX_FILTER = 64  # queue names the scanner filters by itself (more: filtered here)

_KINDS = tuple(
    b"" if code == 0 else RecordType(code).name.encode() for code in range(len(RecordType) + 1)
)
_REASONS = tuple(SettleReason(code).name.encode() for code in range(len(SettleReason)))

_ST_FULL, _ST_END, _ST_INCOMPLETE, _ST_BAD = 0, 1, 2, 3
_PAYLOAD, _BINARY, _OPTIONS = (
    jr.COLUMNS.index(c) for c in ("payload", "payload_binary", "queue_options")
)
_HEADERS = jr.COLUMNS.index("headers")
_OFFSET = jr.COLUMNS.index("offset")

_ARROW_TYPES = {
    "BIGINT": pa.int64(),
    "INT": pa.int32(),
    "STRING": pa.string(),
    "BINARY": pa.binary(),
    "TIMESTAMP": pa.timestamp("us", tz="UTC"),
    "MAP<STRING,STRING>": pa.map_(
        pa.field("key", pa.string(), nullable=False), pa.field("value", pa.string())
    ),
}
# The Arrow form of journal_reader.SCHEMA_DDL, as Spark's to_arrow_schema makes it (UTC).
ARROW_SCHEMA = pa.schema(
    [
        pa.field(name, _ARROW_TYPES[kind])
        for name, kind in (part.strip().split(" ") for part in jr.SCHEMA_DDL.split(", "))
    ]
)


def available() -> bool:
    """Whether the compiled scanner is built (else readers use the per-record decoder)."""
    return _colscan is not None


def _array(kind: pa.DataType, rows: int, col: tuple[Any, ...]) -> pa.Array:
    valid, values, data, nulls = col
    bufs = [None if valid is None else pa.py_buffer(valid), pa.py_buffer(values)]
    if data is not None:
        bufs.append(pa.py_buffer(data))
    return pa.Array.from_buffers(kind, rows, bufs, null_count=nulls)


def _replace_invalid(binary: pa.Array) -> pa.Array:
    """Text of bytes with invalid UTF-8 replaced, as ``bytes.decode(errors="replace")``."""
    return pa.array(
        [None if b is None else b.decode("utf-8", "replace") for b in binary.to_pylist()],
        type=pa.string(),
    )


def _batch(schema: pa.Schema, result: tuple[Any, ...]) -> pa.RecordBatch:
    _status, _pos, _err, rows, payload_utf8, options_utf8, cols, keys, vals = result
    arrays: list[pa.Array] = []
    for i, field in enumerate(schema):
        if i == _HEADERS:
            valid, offsets, _none, nulls = cols[i]
            entries = pa.StructArray.from_arrays(
                [
                    _array(pa.string(), len(keys[1]) // 4 - 1, keys),
                    _array(pa.string(), len(vals[1]) // 4 - 1, vals),
                ],
                fields=[field.type.key_field, field.type.item_field],
            )
            bufs = [None if valid is None else pa.py_buffer(valid), pa.py_buffer(offsets)]
            arrays.append(
                pa.Array.from_buffers(field.type, rows, bufs, null_count=nulls, children=[entries])
            )
        elif i == _BINARY:
            arrays.append(_array(field.type, rows, cols[_PAYLOAD]))
        else:
            arrays.append(_array(field.type, rows, cols[i]))
    if not payload_utf8:
        arrays[_PAYLOAD] = _replace_invalid(arrays[_BINARY])
    if not options_utf8:
        arrays[_OPTIONS] = _replace_invalid(arrays[_OPTIONS].cast(pa.binary()))
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


def _is_tail(f: IO[bytes], pos: int) -> bool:
    """:func:`journal_reader._is_tail` on the file: whether the bad record at ``pos`` is a
    tail (cut off or zero-filled) rather than damage with records after it."""
    size = os.fstat(f.fileno()).st_size
    f.seek(pos)
    prefix = f.read(RECORD_PREFIX.size)
    if len(prefix) < RECORD_PREFIX.size:
        return True
    (length, _crc) = RECORD_PREFIX.unpack(prefix)
    if length > MAX_RECORD or pos + RECORD_PREFIX.size + length >= size:
        return True
    f.seek(pos)
    while chunk := f.read(WINDOW):
        if any(chunk):
            return False
    return True


def _scanned(
    schema: pa.Schema,
    buf: bytes,
    base: int,
    segment: int,
    row_filter: jr.RowFilter,
    batch_rows: int,
    joined: tuple[list[int], list[int]] | None,
) -> Generator[pa.RecordBatch, None, tuple[int, int, str | None]]:
    """The batches of the records of ``buf`` (file offset ``base``, or ranges ``joined``: see
    :func:`read_ranges`) until the scanner stops short of a full batch; returns its status,
    where it stopped in ``buf`` and its error."""
    assert _colscan is not None
    queues = sorted(q.encode() for q in row_filter.queues)
    post_filter = len(queues) > _MAX_FILTER
    rel = 0
    while True:
        result = _colscan.scan(
            buf, rel, base, segment, _KINDS, _REASONS, [] if post_filter else queues,
            row_filter.start_ms, row_filter.end_ms, batch_rows, BATCH_BYTES,
        )  # fmt: skip
        status, rel, err, rows = result[0], result[1], result[2], result[3]
        if rows:
            if joined is not None:
                result = _remap_offsets(result, *joined)
            batch = _batch(schema, result)
            if post_filter:
                batch = _keep_queues(batch, row_filter.queues)
            if batch.num_rows:
                yield batch
        if status != _ST_FULL:
            return status, rel, err


def read_batches(
    path: str,
    segment: int,
    schema: pa.Schema,
    start: int = jr.HEADER,
    end: int | None = None,
    row_filter: jr.RowFilter = jr.NO_FILTER,
    window: int = WINDOW,
    batch_rows: int = BATCH_ROWS,
) -> Iterator[pa.RecordBatch]:
    """The rows of :func:`journal_reader.read_rows` for the same arguments, as record batches
    of ``schema`` (:data:`ARROW_SCHEMA`, or Spark's form of it) of at most ``batch_rows`` rows,
    reading ``window`` bytes of the file at a time."""
    if _colscan is None:
        raise RuntimeError("vibemq_server.spark._colscan is not built")
    with open(path, "rb") as f:
        head = f.read(jr.HEADER)
        if len(head) < jr.HEADER:
            return  # a segment being created: no records yet
        check_segment_header(head, path)
        pos = max(start, jr.HEADER)
        if end is not None:
            size = os.fstat(f.fileno()).st_size
            if size < end:
                raise JournalError(
                    f"segment ends before the planned offset {end}", path, max(size, pos)
                )
        want = window
        while end is None or pos < end:
            if end is not None:
                want = min(want, end - pos)
            f.seek(pos)
            data = f.read(want)
            at_end = len(data) < want or (end is not None and pos + len(data) >= end)
            status, rel, err = yield from _scanned(
                schema, data, pos, segment, row_filter, batch_rows, None
            )
            if status == _ST_END:
                if at_end or not data:
                    return
                pos, want = pos + rel, window
                continue
            if status == _ST_INCOMPLETE and not at_end:
                # the next record goes past the window: read on from it (whole if it is big)
                need = RECORD_PREFIX.size
                if len(data) - rel >= RECORD_PREFIX.size:
                    need += RECORD_PREFIX.unpack_from(data, rel)[0]
                pos, want = pos + rel, max(window, need)
                continue
            bad = pos + rel
            if end is None and (status == _ST_INCOMPLETE or _is_tail(f, bad)):
                return
            raise JournalError(err or "bad record", path, bad)


def _at_file(rel: int, starts: list[int], file_starts: list[int]) -> int:
    """The file offset of position ``rel`` of a buffer of ranges joined (:func:`read_ranges`)."""
    k = bisect.bisect_right(starts, rel) - 1
    return file_starts[k] + rel - starts[k]


def _remap_offsets(
    result: tuple[Any, ...], starts: list[int], file_starts: list[int]
) -> tuple[Any, ...]:
    """``result`` of a scan of joined ranges with its ``offset`` column made file offsets."""
    cols = list(result[6])
    valid, values, data, nulls = cols[_OFFSET]
    rels = array.array("q", bytes(values))
    out = array.array("q", bytes(len(rels) * 8))
    k, n = 0, len(starts)
    for i, rel in enumerate(rels):  # rows are in buffer order: one pass over the ranges
        while k + 1 < n and starts[k + 1] <= rel:
            k += 1
        out[i] = file_starts[k] + rel - starts[k]
    cols[_OFFSET] = (valid, out.tobytes(), data, nulls)
    return (*result[:6], tuple(cols), *result[7:])


def read_ranges(
    path: str,
    segment: int,
    schema: pa.Schema,
    ranges: Sequence[tuple[int, int]],
    row_filter: jr.RowFilter = jr.NO_FILTER,
    window: int = WINDOW,
    batch_rows: int = BATCH_ROWS,
) -> Iterator[pa.RecordBatch]:
    """The rows of ``ranges`` of a segment (whole records: its queue index's), as
    :func:`read_batches` makes them. Ranges of up to ``window`` bytes in all are read, joined
    into one buffer and scanned in one pass (the ``offset`` column mapped back to the file).
    A bad record is a tail by the rule of a whole read (it reaches the file's end, or zeros
    follow it) and ends the rows; else it fails the read with its file offset."""
    if _colscan is None:
        raise RuntimeError("vibemq_server.spark._colscan is not built")
    with open(path, "rb") as f:
        check_segment_header(f.read(jr.HEADER), path)
        i = 0
        while i < len(ranges):
            parts: list[bytes] = []
            starts: list[int] = []
            file_starts: list[int] = []
            total = 0
            while i < len(ranges) and (not parts or total + ranges[i][1] - ranges[i][0] <= window):
                start, end = ranges[i]
                f.seek(start)
                data = f.read(end - start)
                starts.append(total)
                file_starts.append(start)
                parts.append(data)
                total += len(data)
                i += 1
                if len(data) < end - start:
                    i = len(ranges)  # the file ends early: what is left is a tail or damage
            status, rel, err = yield from _scanned(
                schema, b"".join(parts), 0, segment, row_filter, batch_rows, (starts, file_starts)
            )
            if status == _ST_END:
                continue
            bad = _at_file(rel, starts, file_starts)
            if _is_tail(f, bad):
                return
            raise JournalError(err or "bad record", path, bad)


def _keep_queues(batch: pa.RecordBatch, queues: frozenset[str]) -> pa.RecordBatch:
    import pyarrow.compute as pc

    mask = pc.is_in(batch.column(jr.COLUMNS.index("queue")), value_set=pa.array(sorted(queues)))
    return batch.filter(mask)


ROW_BATCH = 8192  # rows per batch on the per-record path


def rows_to_batches(rows: Iterator[jr.Row], schema: pa.Schema) -> Iterator[pa.RecordBatch]:
    """Rows in :data:`journal_reader.COLUMNS` order as Arrow record batches of ``schema`` (the
    per-record path: the reference for the compiled scanner, and its fallback)."""
    types = [field.type for field in schema]
    map_index = jr.COLUMNS.index("headers")
    while True:
        chunk: list[jr.Row] = []
        for row in rows:
            chunk.append(row)
            if len(chunk) >= ROW_BATCH:
                break
        if not chunk:
            return
        cols = jr.transpose(chunk)
        cols[map_index] = [None if h is None else list(h.items()) for h in cols[map_index]]
        arrays = [pa.array(col, type=t) for col, t in zip(cols, types, strict=True)]
        yield pa.RecordBatch.from_arrays(arrays, schema=schema)
        if len(chunk) < ROW_BATCH:
            return
