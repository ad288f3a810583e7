"""Journal recovery: replay segment files into a QueueManager, fast.

Two passes, because most journaled messages were settled long ago: the first walks every
record checking its CRC but reads only the few fixed fields the replay rules need (seq,
attempts, queue); the second fully decodes just the publishes that survived, straight into
StoredMessage objects. A torn tail is cut off; damage anywhere else is refused.
"""

from __future__ import annotations

import json
import os
import zlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from struct import Struct
from struct import error as StructError
from typing import TYPE_CHECKING

import structlog

from vibemq_server.core.message import EMPTY_HEADERS, Priority, StoredMessage
from vibemq_server.journal.records import (
    MAX_RECORD,
    RECORD_PREFIX,
    SEGMENT_HEADER_SIZE,
    JournalError,
    QueueCreate,
    QueueDelete,
    RecordType,
    check_segment_header,
    decode_record,
)

if TYPE_CHECKING:
    from vibemq_server.core.manager import QueueManager
    from vibemq_server.core.queue import Queue

log = structlog.get_logger("vibemq.journal")

#: (payload, headers) -> (payload, headers): the form a message takes in its publish record
#: (``Journal.payload_form``) or its inverse (``Journal.payload_restore``)
PayloadForm = Callable[[bytes, Mapping[str, str]], tuple[bytes, Mapping[str, str]]]

_U16 = Struct(">H")
_U32 = Struct(">I")
_U64 = Struct(">Q")
_SEQ_ATTEMPTS = Struct(">QH")
# Offsets inside a record, counted from the start of its type byte.
_BODY = 9  # after type u8 and timestamp u64
_PUBLISH_FIXED = Struct(">QQQBH")  # seq, published_at, expires_at, priority, attempts
_PUBLISH_QUEUE = _BODY + _PUBLISH_FIXED.size
_PRIORITIES = tuple(Priority)
_PUBLISH, _DELIVER, _SETTLE = RecordType.PUBLISH, RecordType.DELIVER, RecordType.SETTLE


class JournalCorrupt(Exception):
    """Damage in the middle of the journal: refuse to start rather than drop data."""


@dataclass(slots=True)
class Recovered:
    """What recovery found, per segment: publishes written and publishes still live."""

    segments: list[tuple[int, Path]] = field(default_factory=list)
    published: dict[int, int] = field(default_factory=dict)
    live: dict[int, int] = field(default_factory=dict)
    queues: int = 0
    messages: int = 0
    max_seq: int = 0  # highest seq ever journaled: seqs are never reused, settled or not


SUFFIX = ".seg"
# A torn tail is what one interrupted write leaves; a bad record followed by a valid one
# further than this is damage in the middle, never a torn tail.
_TORN_SCAN_LIMIT = 8 * 1024 * 1024


def segment_path(directory: Path, number: int) -> Path:
    return directory / f"{number:020d}{SUFFIX}"


def list_segments(directory: Path) -> list[tuple[int, Path]]:
    """Segment files in order (number from the file name)."""
    out = []
    for path in directory.glob(f"*{SUFFIX}"):
        stem = path.name[: -len(SUFFIX)]
        if stem.isdigit():
            out.append((int(stem), path))
    return sorted(out)


def _valid_record_at(data: bytes, offset: int) -> bool:
    try:
        decode_record(data, offset)
    except JournalError:
        return False
    return True


def _is_torn_tail(data: bytes, offset: int) -> bool:
    """Whether the bad bytes from ``offset`` to the end are what a cut-off write leaves:
    no valid record starts anywhere after them (or they are all zero)."""
    rest = len(data) - offset
    if rest > _TORN_SCAN_LIMIT:
        # (too long to scan a byte at a time: a large message's record cut off, or damage)
        return _is_cut_publish(data, offset)
    if not any(data[offset:]):
        return True
    unpack = RECORD_PREFIX.unpack_from
    end = len(data)
    for pos in range(offset + 1, end - RECORD_PREFIX.size):
        (length, _crc) = unpack(data, pos)
        if 9 <= length <= end - pos - RECORD_PREFIX.size and _valid_record_at(data, pos):
            return False
    return True


def recover(
    directory: Path, manager: QueueManager, restore: PayloadForm | None = None
) -> Recovered:
    """Rebuild ``manager``'s durable queues and messages from the segments in ``directory``.
    ``restore``: the inverse of the form records hold (``Journal.payload_restore``)."""
    out = Recovered()
    queues: dict[str, tuple[bytes, int]] = {}
    # seq -> where its PUBLISH record is: segment number << 40 | offset
    pending: dict[int, int] = {}
    attempts: dict[int, int] = {}  # seq -> deliveries so far, from DELIVER records
    data_of: dict[int, bytes] = {}
    files = list_segments(directory)
    for index, (number, path) in enumerate(files):
        last = index == len(files) - 1
        data = path.read_bytes()
        if last and len(data) < SEGMENT_HEADER_SIZE:
            log.warning("removing torn segment header", file=str(path), size=len(data))
            path.unlink()
            continue
        try:
            check_segment_header(data, str(path))
        except JournalError as exc:
            raise JournalCorrupt(str(exc)) from None
        out.segments.append((number, path))
        data_of[number] = data
        try:
            out.published[number] = _scan(
                data, number, str(path), queues, pending, attempts, data_of, out
            )
        except JournalError as exc:
            if not (last and _is_torn_tail(data, exc.offset)):
                raise JournalCorrupt(
                    f"journal damaged: {exc}; refusing to start (move the file away to "
                    "start without it, losing its messages)"
                ) from None
            log.warning(
                "truncating torn journal tail",
                file=str(path),
                offset=exc.offset,
                dropped_bytes=len(data) - exc.offset,
            )
            with path.open("r+b") as fh:
                fh.truncate(exc.offset)
                os.fsync(fh.fileno())
            data_of[number] = data[: exc.offset]
            out.published[number] = _count_publishes(data_of[number])
    for name, (options_json, created_at) in queues.items():
        manager.restore_queue(name, manager.options_from(json.loads(options_json)), created_at)
    out.queues = len(queues)
    paths = {number: str(path) for number, path in out.segments}
    live = out.live
    # queue-name bytes -> (name, queue or None)
    targets: dict[bytes, tuple[str, Queue | None]] = {}
    by_queue: dict[str, list[StoredMessage]] = {}
    load = _load
    mask = (1 << _OFFSET_BITS) - 1
    # Messages published in the same millisecond share one int (32 bytes each otherwise),
    # as they did before the restart.
    last_published = -1
    for seq in sorted(pending):
        where = pending[seq]
        number = where >> _OFFSET_BITS
        offset = where & mask
        data = data_of[number]
        raw = _queue_at(data, offset)
        target = targets.get(raw)
        if target is None:
            decoded = raw.decode()
            target = targets[raw] = (decoded, manager.queues.get(decoded))
        name, queue = target
        if queue is None:
            continue
        msg = load(data, offset, name, attempts.get(seq), paths, number)
        if restore is not None:
            msg.payload, msg.headers = restore(msg.payload, msg.headers)
        if msg.published_at == last_published:
            msg.published_at = last_published
        else:
            last_published = msg.published_at
        by_queue.setdefault(name, []).append(msg)
        live[number] = live.get(number, 0) + 1
    for name, msgs in by_queue.items():
        manager.restore_messages(manager.queues[name], msgs)
        out.messages += len(msgs)
    return out


_OFFSET_BITS = 40
# Smallest PUBLISH record: type, timestamp, fixed fields, then empty queue, id, headers, payload.
_PUBLISH_MIN = _PUBLISH_QUEUE + 2 + 2 + 2 + 4


def _is_cut_publish(data: bytes, offset: int) -> bool:
    """Whether the record at ``offset`` is a PUBLISH whose write was cut off in its payload:
    its prefix and head are whole and agree (its payload's length ends the record exactly
    where its prefix says: ``_load`` checks that), and only the payload runs past the end
    of the file. A kill during a large message's write leaves that, with more than the scan
    limit written; a damaged length or head does not pass (the broker then refuses to start,
    as before)."""
    length, _crc = RECORD_PREFIX.unpack_from(data, offset)
    start = offset + RECORD_PREFIX.size
    if length > MAX_RECORD or start + length <= len(data) or data[start] != _PUBLISH:
        return False
    try:
        _load(data, offset, "", None, {0: "(a cut record)"}, 0)
    except JournalCorrupt:
        return False
    return True


def _queue_at(data: bytes, offset: int) -> bytes:
    """The queue name bytes of the PUBLISH record at ``offset``."""
    q = offset + RECORD_PREFIX.size + _PUBLISH_QUEUE
    (n,) = _U16.unpack_from(data, q)
    return data[q + 2 : q + 2 + n]


def _scan(
    data: bytes,
    number: int,
    path: str,
    queues: dict[str, tuple[bytes, int]],
    pending: dict[int, int],
    attempts: dict[int, int],
    data_of: dict[int, bytes],
    out: Recovered,
) -> int:
    """Replay one segment's records into ``queues``/``pending`` (and the highest seq into
    ``out.max_seq``); returns how many publishes it holds. JournalError at the first bad
    record, whose offset says where the good part ends."""
    view = memoryview(data)
    crc32 = zlib.crc32
    prefix = RECORD_PREFIX.unpack_from
    u64 = _U64.unpack_from
    pos = SEGMENT_HEADER_SIZE
    end = len(data)
    base = number << _OFFSET_BITS
    publishes = 0
    while pos < end:
        if end - pos < RECORD_PREFIX.size:
            raise JournalError("incomplete record prefix", path, pos)
        length, crc = prefix(data, pos)
        start = pos + RECORD_PREFIX.size
        stop = start + length
        if length < _BODY or length > MAX_RECORD:
            raise JournalError(f"invalid record length {length}", path, pos)
        if stop > end:
            raise JournalError("incomplete record", path, pos)
        if crc32(view[start:stop]) != crc:
            raise JournalError("checksum mismatch", path, pos)
        kind = data[start]
        if kind == _PUBLISH and length >= _PUBLISH_MIN:
            (seq,) = u64(data, start + _BODY)
            pending[seq] = base | pos
            publishes += 1
            if seq > out.max_seq:
                out.max_seq = seq
        elif kind == _SETTLE and length >= _BODY + 8:
            pending.pop(u64(data, start + _BODY)[0], None)
        elif kind == _DELIVER and length >= _BODY + 10:
            seq, count = _SEQ_ATTEMPTS.unpack_from(data, start + _BODY)
            if seq in pending:
                attempts[seq] = count
        else:
            record = decode_record(data, pos, path).record
            if isinstance(record, QueueCreate):
                queues[record.name] = (record.options_json, record.created_at)
            elif isinstance(record, QueueDelete):
                queues.pop(record.name, None)
                _drop_queue(record.name.encode(), pending, data_of)
            else:
                raise JournalError(f"malformed record of type {kind}", path, pos)
        pos = stop
    return publishes


def _drop_queue(raw: bytes, pending: dict[int, int], data_of: dict[int, bytes]) -> None:
    mask = (1 << _OFFSET_BITS) - 1
    doomed = [
        seq
        for seq, where in pending.items()
        if _queue_at(data_of[where >> _OFFSET_BITS], where & mask) == raw
    ]
    for seq in doomed:
        del pending[seq]


def _count_publishes(data: bytes) -> int:
    count = 0
    pos = SEGMENT_HEADER_SIZE
    while pos < len(data):
        length, _crc = RECORD_PREFIX.unpack_from(data, pos)
        count += data[pos + RECORD_PREFIX.size] == _PUBLISH
        pos += RECORD_PREFIX.size + length
    return count


def _load(
    data: bytes,
    offset: int,
    queue: str,
    attempts: int | None,
    paths: dict[int, str],
    number: int,
) -> StoredMessage:
    """Decode the PUBLISH record at ``offset`` into the message it stored."""
    try:
        start = offset + RECORD_PREFIX.size
        (length,) = _U32.unpack_from(data, offset)
        stop = start + length
        seq, published_at, expires_at, priority, written = _PUBLISH_FIXED.unpack_from(
            data, start + _BODY
        )
        (qlen,) = _U16.unpack_from(data, start + _PUBLISH_QUEUE)
        p = start + _PUBLISH_QUEUE + 2 + qlen
        (n,) = _U16.unpack_from(data, p)
        msg_id = data[p + 2 : p + 2 + n].decode()
        p += 2 + n
        (count,) = _U16.unpack_from(data, p)
        p += 2
        headers: dict[str, str] | None = None
        for _ in range(count):
            (n,) = _U16.unpack_from(data, p)
            key = data[p + 2 : p + 2 + n].decode()
            p += 2 + n
            (n,) = _U16.unpack_from(data, p)
            if headers is None:
                headers = {}
            headers[key] = data[p + 2 : p + 2 + n].decode()
            p += 2 + n
        (n,) = _U32.unpack_from(data, p)
        payload = data[p + 4 : p + 4 + n]
        if p + 4 + n != stop:
            raise ValueError("record body length mismatch")
        msg = StoredMessage(
            msg_id,
            queue,
            payload,
            headers if headers is not None else EMPTY_HEADERS,
            published_at,
            expires_at,
            _PRIORITIES[priority],
            written if attempts is None else attempts,
        )
    except (StructError, UnicodeDecodeError, ValueError, IndexError) as exc:
        raise JournalCorrupt(
            f"journal damaged: malformed publish record in {paths[number]} at offset {offset} "
            f"({exc}); refusing to start"
        ) from None
    msg.seq = seq
    msg.seg = number
    return msg
