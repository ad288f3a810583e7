"""Sans-IO codec of journal records: the stable on-disk contract (see docs/journal.md).

A segment file is a 16-byte header (magic ``VMQJ``, u16 format version, u16 reserved, u64
segment number) followed by records. A record is

    u32 length | u32 crc32 | u8 type | u64 timestamp_ms | body

all big-endian, ``length`` counting from ``type`` to the end of the body and ``crc32`` (zlib's
CRC-32, IEEE polynomial) computed over those same bytes.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from enum import IntEnum
from struct import Struct
from struct import error as StructError

from vibemq_server.core.persistence import SettleReason

MAGIC = b"VMQJ"
FORMAT_VERSION = 1
SEGMENT_HEADER = Struct(">4sHHQ")
SEGMENT_HEADER_SIZE = SEGMENT_HEADER.size  # 16
RECORD_PREFIX = Struct(">II")  # length, crc32
RECORD_HEAD = Struct(">BQ")  # type, timestamp_ms
MAX_RECORD = 64 * 1024 * 1024

_U8 = Struct(">B")
_U16 = Struct(">H")
_U32 = Struct(">I")
_U64 = Struct(">Q")
_PUBLISH_FIXED = Struct(">QQQBH")  # seq, published_at, expires_at, priority, attempts
_SEQ_ATTEMPTS = Struct(">QH")
_SEQ_REASON = Struct(">QB")


class RecordType(IntEnum):
    QUEUE_CREATE = 1
    QUEUE_DELETE = 2
    PUBLISH = 3
    DELIVER = 4
    SETTLE = 5


class JournalError(Exception):
    """A record that cannot be read, with the file and offset where it is."""

    def __init__(self, message: str, path: str = "", offset: int = 0) -> None:
        super().__init__(f"{message} in {path or '<buffer>'} at offset {offset}")
        self.path = path
        self.offset = offset


@dataclass(frozen=True, slots=True)
class QueueCreate:
    name: str
    created_at: int
    options_json: bytes  # the queue options as a JSON object (camelCase, as CreateQueue takes)


@dataclass(frozen=True, slots=True)
class QueueDelete:
    name: str


@dataclass(frozen=True, slots=True)
class Publish:
    seq: int
    queue: str
    message_id: str
    published_at: int
    expires_at: int
    priority: int
    attempts: int
    headers: Mapping[str, str]
    payload: bytes


@dataclass(frozen=True, slots=True)
class Deliver:
    seq: int
    queue: str
    attempts: int


@dataclass(frozen=True, slots=True)
class Settle:
    seq: int
    queue: str
    reason: SettleReason
    detail: str = ""  # the dead-letter reason for DEAD_LETTERED


Record = QueueCreate | QueueDelete | Publish | Deliver | Settle


@dataclass(slots=True)
class Entry:
    """A decoded record with where it was and when it was written."""

    record: Record
    timestamp: int
    offset: int
    size: int = field(default=0)


def _s16(value: str) -> bytes:
    raw = value.encode()
    return _U16.pack(len(raw)) + raw


def _body(record: Record) -> tuple[RecordType, bytes]:
    if isinstance(record, Publish):
        parts = [
            _PUBLISH_FIXED.pack(
                record.seq,
                record.published_at,
                record.expires_at,
                record.priority,
                record.attempts,
            ),
            _s16(record.queue),
            _s16(record.message_id),
            _U16.pack(len(record.headers)),
        ]
        for key, value in record.headers.items():
            parts.append(_s16(key))
            parts.append(_s16(value))
        parts.append(_U32.pack(len(record.payload)))
        parts.append(record.payload)
        return RecordType.PUBLISH, b"".join(parts)
    if isinstance(record, Settle):
        body = _SEQ_REASON.pack(record.seq, record.reason) + _s16(record.queue)
        return RecordType.SETTLE, body + _s16(record.detail)
    if isinstance(record, Deliver):
        return RecordType.DELIVER, _SEQ_ATTEMPTS.pack(record.seq, record.attempts) + _s16(
            record.queue
        )
    if isinstance(record, QueueCreate):
        body = _s16(record.name) + _U64.pack(record.created_at)
        return RecordType.QUEUE_CREATE, body + _U32.pack(len(record.options_json)) + (
            record.options_json
        )
    return RecordType.QUEUE_DELETE, _s16(record.name)


def encode_record(record: Record, timestamp: int) -> bytes:
    kind, body = _body(record)
    inner = RECORD_HEAD.pack(kind, timestamp) + body
    return RECORD_PREFIX.pack(len(inner), zlib.crc32(inner)) + inner


# Direct encoders of the three records every message writes (publish, deliver, settle):
# byte-for-byte what encode_record writes, without building a record object first.
_PUBLISH_HEAD = Struct(">BQQQQBH")  # type, timestamp, seq, published_at, expires_at, prio, attempts
_DELIVER_HEAD = Struct(">BQQH")  # type, timestamp, seq, attempts
_SETTLE_HEAD = Struct(">BQQB")  # type, timestamp, seq, reason


def _framed(inner: bytes) -> bytes:
    return RECORD_PREFIX.pack(len(inner), zlib.crc32(inner)) + inner


def encode_publish(
    timestamp: int,
    seq: int,
    queue: str | bytes,
    message_id: str,
    published_at: int,
    expires_at: int,
    priority: int,
    attempts: int,
    headers: Mapping[str, str],
    payload: bytes,
) -> bytes:
    """``queue`` may be given already encoded as str16 (the journal caches them)."""
    parts = [
        _PUBLISH_HEAD.pack(
            RecordType.PUBLISH, timestamp, seq, published_at, expires_at, priority, attempts
        ),
        queue if isinstance(queue, bytes) else _s16(queue),
        _s16(message_id),
        _U16.pack(len(headers)),
    ]
    for key, value in headers.items():
        parts.append(_s16(key))
        parts.append(_s16(value))
    parts.append(_U32.pack(len(payload)))
    parts.append(payload)
    return _framed(b"".join(parts))


def encode_deliver(timestamp: int, seq: int, queue: str, attempts: int) -> bytes:
    return _framed(_DELIVER_HEAD.pack(RecordType.DELIVER, timestamp, seq, attempts) + _s16(queue))


def encode_settle(timestamp: int, seq: int, queue: str, reason: int, detail: str) -> bytes:
    head = _SETTLE_HEAD.pack(RecordType.SETTLE, timestamp, seq, reason)
    return _framed(head + _s16(queue) + _s16(detail))


def encode_segment_header(segment: int) -> bytes:
    return SEGMENT_HEADER.pack(MAGIC, FORMAT_VERSION, 0, segment)


class _Cursor:
    __slots__ = ("buf", "pos")

    def __init__(self, buf: bytes | memoryview, pos: int) -> None:
        self.buf = buf
        self.pos = pos

    def take(self, st: Struct) -> tuple[int, ...]:
        values = st.unpack_from(self.buf, self.pos)
        self.pos += st.size
        return values

    def s16(self) -> str:
        (n,) = _U16.unpack_from(self.buf, self.pos)
        start = self.pos + 2
        self.pos = start + n
        return bytes(self.buf[start : self.pos]).decode()

    def raw32(self) -> bytes:
        (n,) = _U32.unpack_from(self.buf, self.pos)
        start = self.pos + 4
        self.pos = start + n
        return bytes(self.buf[start : self.pos])


def _decode_inner(kind: int, c: _Cursor) -> Record:
    if kind == RecordType.PUBLISH:
        seq, published_at, expires_at, priority, attempts = c.take(_PUBLISH_FIXED)
        queue = c.s16()
        message_id = c.s16()
        (count,) = c.take(_U16)
        headers = {}
        for _ in range(count):
            key = c.s16()
            headers[key] = c.s16()
        payload = c.raw32()
        return Publish(
            seq, queue, message_id, published_at, expires_at, priority, attempts, headers, payload
        )
    if kind == RecordType.SETTLE:
        seq, reason = c.take(_SEQ_REASON)
        return Settle(seq, c.s16(), SettleReason(reason), c.s16())
    if kind == RecordType.DELIVER:
        seq, attempts = c.take(_SEQ_ATTEMPTS)
        return Deliver(seq, c.s16(), attempts)
    if kind == RecordType.QUEUE_CREATE:
        name = c.s16()
        (created_at,) = c.take(_U64)
        return QueueCreate(name, created_at, c.raw32())
    if kind == RecordType.QUEUE_DELETE:
        return QueueDelete(c.s16())
    raise ValueError(f"unknown record type {kind}")


def decode_record(data: bytes | memoryview, offset: int = 0, path: str = "") -> Entry:
    """Decode the one record at ``offset``; JournalError if it is incomplete or damaged."""
    end = len(data)
    if end - offset < RECORD_PREFIX.size:
        raise JournalError("incomplete record prefix", path, offset)
    length, crc = RECORD_PREFIX.unpack_from(data, offset)
    start = offset + RECORD_PREFIX.size
    if length < RECORD_HEAD.size or length > MAX_RECORD:
        raise JournalError(f"invalid record length {length}", path, offset)
    if start + length > end:
        raise JournalError("incomplete record", path, offset)
    inner = data[start : start + length]
    if zlib.crc32(inner) != crc:
        raise JournalError("checksum mismatch", path, offset)
    kind, timestamp = RECORD_HEAD.unpack_from(inner, 0)
    cursor = _Cursor(inner, RECORD_HEAD.size)
    try:
        record = _decode_inner(kind, cursor)
    except (StructError, UnicodeDecodeError, ValueError) as exc:
        raise JournalError(f"malformed record body ({exc})", path, offset) from None
    if cursor.pos != length:
        raise JournalError("record body length mismatch", path, offset)
    return Entry(record, timestamp, offset, RECORD_PREFIX.size + length)


def iter_records(
    data: bytes | memoryview, offset: int = SEGMENT_HEADER_SIZE, path: str = ""
) -> Iterator[Entry]:
    """Every record from ``offset`` to the end; stops with JournalError at the first bad one."""
    end = len(data)
    while offset < end:
        entry = decode_record(data, offset, path)
        yield entry
        offset += entry.size


def check_segment_header(data: bytes | memoryview, path: str = "") -> int:
    """The segment number in a segment file's header."""
    if len(data) < SEGMENT_HEADER_SIZE:
        raise JournalError("incomplete segment header", path, 0)
    magic, version, _reserved, segment = SEGMENT_HEADER.unpack_from(data, 0)
    if magic != MAGIC:
        raise JournalError("not a VibeMQ journal segment (bad magic)", path, 0)
    if version != FORMAT_VERSION:
        raise JournalError(f"unsupported journal format version {version}", path, 0)
    return int(segment)
