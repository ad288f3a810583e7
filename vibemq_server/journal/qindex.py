"""The queue index of a sealed segment: a sidecar file ``<number>.qidx`` beside ``<number>.seg``.

For each queue, the byte ranges of the segment that hold its records (adjacent records of one
queue coalesced into one range) and the first and last record time, so that a reader filtered
on a queue or a time range reads only those ranges instead of every record. Written once a
segment is sealed, by the journal's index thread (never on the event loop nor the publish
path), atomically (a temporary file renamed), and never trusted over the segment: a reader
takes it only when its header matches the segment as it is (number, file size and the CRC-32
of the first and the last record), and its own CRC-32 holds; else it is stale or damaged, the
segment is read in full and the sidecar may be built again from it. A segment that is damaged
in the middle gets no sidecar (readers then read it whole and report the damage as before).

Layout (big-endian): a head -- magic ``VMQI``, u16 version, u16 reserved, u64 segment number,
u64 segment file size, u64 indexed end (after the last whole record; a cut tail is left out, as
readers leave it), u32 CRC of the first record, u64 offset and u32 CRC of the last record, u32
queue count, u32 directory length -- then the directory, one entry per queue: str16 name, u64
min and max record time (ms), u32 range count, u64 offset of its block in this file, u32 CRC-32
of the block; a u32 CRC-32 of the head and directory; then the blocks, each a queue's ranges as
u64 pairs ``[start, end)``. A reader of one queue reads the head, the directory and that
queue's block only.

    python -m vibemq_server.journal.qindex JOURNAL_DIR [--all]

builds the sidecars a journal lacks (all but the last segment, which a running broker may
still be writing; ``--all`` for a journal no broker is writing).
"""

from __future__ import annotations

import argparse
import contextlib
import mmap
import os
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from struct import Struct
from struct import error as StructError
from typing import IO

from vibemq_server.journal.records import (
    MAX_RECORD,
    RECORD_HEAD,
    RECORD_PREFIX,
    SEGMENT_HEADER_SIZE,
    JournalError,
    check_segment_header,
)
from vibemq_server.journal.recovery import SUFFIX, list_segments

MAGIC = b"VMQI"
VERSION = 1
INDEX_SUFFIX = ".qidx"
_HEAD = Struct(">4sHHQQQIQIII")  # magic, version, reserved, segment, size, end, first crc,
#                                   last offset, last crc, queue count, directory length
_ENTRY = Struct(">QQIQI")  # min ts, max ts, range count, block offset, block crc
_RANGE = Struct(">QQ")
_U16 = Struct(">H")
_U32 = Struct(">I")
_RECORD_START = Struct(">IIBQ")  # length, crc32, type, timestamp
_MIN_LENGTH = RECORD_HEAD.size
# where the queue name's str16 is from a record's start (its prefix, type and time, then the
# fields before the name), by record type
_QUEUE_AT = {1: 17, 2: 17, 3: 17 + 27, 4: 17 + 10, 5: 17 + 9}


#: one queue's part of the compiled walk's answer: name, min and max time, range count, ranges
_Found = tuple[bytes, int, int, int, bytes]
#: _QUEUE_AT as the compiled walk takes it: one byte per record type (0: no such type)
_QUEUE_AT_TABLE = bytes(_QUEUE_AT.get(kind, 0) for kind in range(256))

#: the walk in C, with the GIL released (journal/_recbuf.c); None: not built (the loop below)
index_scan: (
    Callable[[bytes | mmap.mmap, int, bytes], tuple[bool, int, int, int, int, list[_Found]]] | None
)
try:
    from vibemq_server.journal._recbuf import index_scan
except ImportError:  # pragma: no cover - the extension is not built
    index_scan = None


@dataclass(slots=True)
class QueueSpans:
    """Where one queue's records are in a segment, and their time span (ms). An index built
    by the compiled walk keeps the ranges as they go to disk (``block``: big-endian u64 pairs)
    and ``ranges`` empty: the broker only writes them (see :func:`ranges_of`)."""

    min_ts: int
    max_ts: int
    ranges: list[tuple[int, int]] = field(default_factory=list)
    block: bytes | None = None


def ranges_of(spans: QueueSpans) -> list[tuple[int, int]]:
    """A queue's ranges, whichever walk built them."""
    if spans.block is None:
        return spans.ranges
    return [_RANGE.unpack_from(spans.block, i) for i in range(0, len(spans.block), _RANGE.size)]


@dataclass(slots=True)
class SegmentIndex:
    segment: int
    size: int  # the segment file's size when indexed
    end: int  # just after the last whole record
    first_crc: int
    last_offset: int  # 0: no record
    last_crc: int
    queues: dict[str, QueueSpans] = field(default_factory=dict)


def index_path(segment_path: Path) -> Path:
    """``00000000000000000007.seg`` -> ``00000000000000000007.qidx``."""
    return segment_path.with_suffix(INDEX_SUFFIX)


def _is_tail(data: bytes, pos: int) -> bool:
    """The readers' tail rule: the bad record at ``pos`` is cut off or zero-filled."""
    if len(data) - pos < RECORD_PREFIX.size:
        return True
    (length, _crc) = RECORD_PREFIX.unpack_from(data, pos)
    if length > MAX_RECORD or pos + RECORD_PREFIX.size + length >= len(data):
        return True
    return not any(data[pos:])


def build(segment_path: Path) -> SegmentIndex | None:
    """The index of a segment file; None when it is damaged in the middle (a bad record with
    records after it: no index is trusted, readers read it whole and report the damage).

    Each record's length, CRC-32, type and queue name (strict UTF-8) are checked, not the rest
    of its body: a record with a valid CRC and a malformed body was written so, and a reader
    of its queue still finds it (readers check every record they read in full). One loop with
    everything bound locally: it runs once per sealed segment, in the broker's process."""
    with open(segment_path, "rb") as f:
        if index_scan is not None and os.fstat(f.fileno()).st_size > SEGMENT_HEADER_SIZE:
            # mapped, not read: a 64 MiB segment does not pass through the broker's heap
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
                number = check_segment_header(mapped[:SEGMENT_HEADER_SIZE], str(segment_path))
                built = build_compiled(mapped, number)
            if built is not _UNDECIDED:
                return built
            f.seek(0)  # a name that is not UTF-8: the loop below says where and what it is
        data = f.read()
    return build_pure(data, check_segment_header(data, str(segment_path)))


#: build_compiled's answer when only the Python walk can tell (a queue name not UTF-8)
_UNDECIDED = SegmentIndex(0, 0, 0, 0, 0, 0)


def build_compiled(data: bytes | mmap.mmap, number: int) -> SegmentIndex | None:
    """:func:`build`'s walk in C (``index_scan`` must be built); ``_UNDECIDED`` when a queue
    name is not UTF-8, which the Python walk treats as a bad record."""
    assert index_scan is not None
    damaged, end, first_crc, last_offset, last_crc, found = index_scan(
        data, SEGMENT_HEADER_SIZE, _QUEUE_AT_TABLE
    )
    if damaged:
        return None
    index = SegmentIndex(number, len(data), end, first_crc, last_offset, last_crc)
    try:
        for raw, min_ts, max_ts, _count, block in found:
            index.queues[raw.decode()] = QueueSpans(min_ts, max_ts, block=block)
    except UnicodeDecodeError:
        return _UNDECIDED
    return index


def build_pure(data: bytes, number: int) -> SegmentIndex | None:
    """:func:`build`'s walk in Python (without the extension, and the reference it is tested
    against)."""
    index = SegmentIndex(number, len(data), SEGMENT_HEADER_SIZE, 0, 0, 0)
    view = memoryview(data)
    size = len(data)
    unpack = _RECORD_START.unpack_from
    u16 = _U16.unpack_from
    crc32 = zlib.crc32
    queue_at = _QUEUE_AT
    names: dict[bytes, str] = {}
    spans_of: dict[str, QueueSpans] = {}
    first_crc = last_crc = last_offset = 0
    pos = SEGMENT_HEADER_SIZE
    while pos < size:
        name = None
        if size - pos >= _RECORD_START.size:
            length, crc, kind, ts = unpack(data, pos)
            end = pos + 8 + length
            at = pos + queue_at.get(kind, size)
            if (
                _MIN_LENGTH <= length <= MAX_RECORD
                and end <= size
                and at + 2 <= end
                and crc32(view[pos + 8 : end]) == crc
            ):
                raw = data[at + 2 : at + 2 + u16(data, at)[0]]
                if at + 2 + len(raw) <= end:
                    name = names.get(raw)
                    if name is None:
                        try:
                            name = names[raw] = raw.decode()
                        except UnicodeDecodeError:
                            name = None
        if name is None:
            if _is_tail(data, pos):
                break
            return None
        spans = spans_of.get(name)
        if spans is None:
            spans_of[name] = QueueSpans(ts, ts, [(pos, end)])
        else:
            if ts < spans.min_ts:
                spans.min_ts = ts
            elif ts > spans.max_ts:
                spans.max_ts = ts
            ranges = spans.ranges
            if ranges[-1][1] == pos:  # right after this queue's previous record
                ranges[-1] = (ranges[-1][0], end)
            else:
                ranges.append((pos, end))
        if last_offset == 0:
            first_crc = crc
        last_offset, last_crc = pos, crc
        pos = end
    index.queues = spans_of
    index.first_crc, index.last_offset, index.last_crc = first_crc, last_offset, last_crc
    index.end = pos
    return index


def encode(index: SegmentIndex) -> bytes:
    blocks = [
        b"".join(_RANGE.pack(a, b) for a, b in spans.ranges) if spans.block is None else spans.block
        for spans in index.queues.values()
    ]
    entries = []
    for name in index.queues:
        raw = name.encode()
        entries.append(_U16.pack(len(raw)) + raw)
        entries.append(b"")  # the entry itself, once the blocks' place is known
    directory_len = sum(len(e) for e in entries) + _ENTRY.size * len(blocks)
    at = _HEAD.size + directory_len + _U32.size
    for i, (spans, block) in enumerate(zip(index.queues.values(), blocks, strict=True)):
        entries[2 * i + 1] = _ENTRY.pack(
            spans.min_ts, spans.max_ts, len(block) // _RANGE.size, at, zlib.crc32(block)
        )
        at += len(block)
    top = _HEAD.pack(
        MAGIC,
        VERSION,
        0,
        index.segment,
        index.size,
        index.end,
        index.first_crc,
        index.last_offset,
        index.last_crc,
        len(index.queues),
        directory_len,
    ) + b"".join(entries)
    return b"".join([top, _U32.pack(zlib.crc32(top)), *blocks])


def decode(data: bytes, wanted: frozenset[str] | None = None) -> SegmentIndex:
    """A sidecar's contents (the ranges of the ``wanted`` queues only, when given: the others
    get none); ValueError when it is not a whole, undamaged one."""
    if len(data) < _HEAD.size + _U32.size:
        raise ValueError("sidecar too short")
    head = _HEAD.unpack_from(data, 0)
    magic, version, _r, segment, size, end, first_crc, last_offset, last_crc, count, dlen = head
    if magic != MAGIC or version != VERSION:
        raise ValueError("not a queue index of this version")
    top = _HEAD.size + dlen
    if len(data) < top + _U32.size or zlib.crc32(data[:top]) != _U32.unpack_from(data, top)[0]:
        raise ValueError("sidecar directory damaged")
    index = SegmentIndex(segment, size, end, first_crc, last_offset, last_crc)
    pos = _HEAD.size
    for _ in range(count):
        (n,) = _U16.unpack_from(data, pos)
        name = data[pos + 2 : pos + 2 + n].decode()
        pos += 2 + n
        min_ts, max_ts, ranges, at, crc = _ENTRY.unpack_from(data, pos)
        pos += _ENTRY.size
        spans = index.queues[name] = QueueSpans(min_ts, max_ts)
        if wanted is not None and name not in wanted:
            continue
        block = data[at : at + ranges * _RANGE.size]
        if len(block) != ranges * _RANGE.size or zlib.crc32(block) != crc:
            raise ValueError("sidecar block damaged")
        spans.ranges = [_RANGE.unpack_from(block, i * _RANGE.size) for i in range(ranges)]
    if pos != top:
        raise ValueError("sidecar directory length mismatch")
    return index


def _crc_at(f: IO[bytes], offset: int) -> int | None:
    f.seek(offset + 4)
    raw = f.read(4)
    return None if len(raw) < 4 else int(_U32.unpack(raw)[0])


def load(segment_path: Path, wanted: frozenset[str] | None = None) -> SegmentIndex | None:
    """The segment's sidecar when it is whole and matches the segment as it is now; None when
    it is missing, damaged or stale (the segment then has to be read in full). ``wanted``: as
    :func:`decode`."""
    try:
        index = decode(index_path(segment_path).read_bytes(), wanted)
        with open(segment_path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            number = check_segment_header(f.read(SEGMENT_HEADER_SIZE), str(segment_path))
            if number != index.segment or size != index.size:
                return None
            if index.last_offset and (
                _crc_at(f, SEGMENT_HEADER_SIZE) != index.first_crc
                or _crc_at(f, index.last_offset) != index.last_crc
            ):
                return None
    except (OSError, ValueError, StructError, JournalError):
        return None
    return index


def write(segment_path: Path, index: SegmentIndex) -> Path:
    """Write the sidecar atomically: a temporary file renamed over it. No fsync: a sidecar
    that a crash left torn or empty fails its checksum and is rebuilt, never trusted."""
    target = index_path(segment_path)
    temp = target.with_name(f"{target.name}.{os.getpid()}.tmp")
    try:
        temp.write_bytes(encode(index))
        os.replace(temp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            temp.unlink()
        raise
    if not segment_path.exists():  # reclaimed meanwhile: no orphan sidecar
        with contextlib.suppress(OSError):
            target.unlink()
    return target


def ensure(segment_path: Path) -> SegmentIndex | None:
    """The segment's valid sidecar, built and written when missing, stale or damaged; None
    when the segment is damaged in the middle or gone."""
    index = load(segment_path)
    if index is not None:
        return index
    try:
        index = build(segment_path)
        if index is not None:
            write(segment_path, index)
    except (OSError, JournalError):
        return None
    return index


def clean(directory: Path) -> None:
    """Remove what a crash may leave: temporary sidecars, sidecars of deleted segments."""
    for path in directory.glob(f"*{INDEX_SUFFIX}*"):
        if path.name.endswith(".tmp") or not path.with_suffix(SUFFIX).exists():
            with contextlib.suppress(OSError):
                path.unlink()


def index_directory(directory: Path, *, include_last: bool = False) -> int:
    """Build the sidecars the sealed segments of a journal directory lack; how many are valid."""
    clean(directory)
    segments = list_segments(directory)
    if not include_last:
        segments = segments[:-1]
    return sum(ensure(path) is not None for _number, path in segments)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="build the queue index sidecars of a journal")
    parser.add_argument("directory", help="the journal directory (DATA_DIR/journal)")
    parser.add_argument("--all", action="store_true", help="the last segment too (no broker)")
    args = parser.parse_args(argv)
    directory = Path(args.directory)
    if (directory / "journal").is_dir():
        directory = directory / "journal"
    print(index_directory(directory, include_last=args.all))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
