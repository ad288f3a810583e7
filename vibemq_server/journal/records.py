"""Sans-IO codec of journal records: the stable on-disk contract (see docs/journal.md).

A segment file is a 16-byte header (magic ``VMQJ``, u16 format version, u16 reserved, u64
segment number) followed by records. A record is

    u32 length | u32 crc32 | u8 type | u64 timestamp_ms | body

all big-endian, ``length`` counting from ``type`` to the end of the body and ``crc32`` (zlib's
CRC-32, IEEE polynomial) computed over those same bytes.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from enum import IntEnum
from struct import Struct
from struct import error as StructError
from typing import Any, Final

from vibemq_server.core.persistence import SettleReason

MAGIC = b"VMQJ"
FORMAT_VERSION = 1
SEGMENT_HEADER = Struct(">4sHHQ")
SEGMENT_HEADER_SIZE = SEGMENT_HEADER.size  # 16
RECORD_PREFIX: Final = Struct(">II")  # length, crc32
RECORD_HEAD = Struct(">BQ")  # type, timestamp_ms
#: A sanity bound on a record's length (a larger one is corruption). A 64 MiB binary message
#: is stored as base64 (4/3 of it) and the protocols' size limits go up to 256 MiB, hence room
#: for the base64 of 256 MiB and its headers. The Spark scanner (_colscan.c) has the same bound.
MAX_RECORD = 384 * 1024 * 1024

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


# Encoders, one per record type. The three that every message writes (publish, deliver,
# settle) take plain values, so the journal never builds a record object on its hot path.
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


# Bound once: in the compiled build, a global looked up by name and a module attribute per
# call cost more than the call itself on the per-message path.
_pack_prefix: Final = RECORD_PREFIX.pack
_crc32: Final = zlib.crc32


class QueueRecords:
    """The PUBLISH, DELIVER and SETTLE records of one queue, from pieces made once.

    What ``encode_publish``/``encode_deliver``/``encode_settle`` write, byte for byte, in
    fewer Python steps: the queue's name (and the rest of a record's fixed layout) is baked
    into one ``Struct`` per record type (per message-id length for PUBLISH), so a record is
    one ``pack``, one or two ``crc32`` and one join, with the payload copied once."""

    __slots__ = ("_deliver", "_publish", "_settle", "name", "name16")

    def __init__(self, name: str) -> None:
        self.name = name
        self.name16 = _s16(name)
        n = len(self.name16)
        self._deliver = Struct(f">BQQH{n}s")
        self._settle = Struct(f">BQQB{n}sH")  # (detail empty: its u16 length 0)
        # message-id length -> the PUBLISH layout up to the payload, for messages without
        # headers (bounded: a u16 length)
        self._publish: dict[int, Struct] = {}

    def publish(
        self,
        timestamp: int,
        seq: int,
        message_id: str,
        published_at: int,
        expires_at: int,
        priority: int,
        attempts: int,
        headers: Mapping[str, str],
        payload: bytes,
    ) -> bytes:
        mid = message_id.encode()
        if headers:
            return encode_publish(
                timestamp,
                seq,
                self.name16,
                message_id,
                published_at,
                expires_at,
                priority,
                attempts,
                headers,
                payload,
            )
        st = self._publish.get(len(mid))
        if st is None:
            st = self._publish[len(mid)] = Struct(f">BQQQQBH{len(self.name16)}sH{len(mid)}sHI")
        plen = len(payload)
        head = st.pack(
            _PUBLISH,
            timestamp,
            seq,
            published_at,
            expires_at,
            priority,
            attempts,
            self.name16,
            len(mid),
            mid,
            0,
            plen,
        )
        crc = _crc32(payload, _crc32(head))
        return b"".join((_pack_prefix(len(head) + plen, crc), head, payload))

    def deliver(self, timestamp: int, seq: int, attempts: int) -> bytes:
        inner = self._deliver.pack(_DELIVER, timestamp, seq, attempts, self.name16)
        return _pack_prefix(len(inner), _crc32(inner)) + inner

    def settle(self, timestamp: int, seq: int, reason: int, detail: str) -> bytes:
        if detail:
            return encode_settle(timestamp, seq, self.name, reason, detail)
        inner = self._settle.pack(_SETTLE, timestamp, seq, reason, self.name16, 0)
        return _pack_prefix(len(inner), _crc32(inner)) + inner


_PUBLISH: Final = int(RecordType.PUBLISH)
_DELIVER: Final = int(RecordType.DELIVER)
_SETTLE: Final = int(RecordType.SETTLE)


def _encode_queue_create(r: QueueCreate, timestamp: int) -> bytes:
    head = RECORD_HEAD.pack(RecordType.QUEUE_CREATE, timestamp) + _s16(r.name)
    return _framed(head + _U64.pack(r.created_at) + _U32.pack(len(r.options_json)) + r.options_json)


def _encode_queue_delete(r: QueueDelete, timestamp: int) -> bytes:
    return _framed(RECORD_HEAD.pack(RecordType.QUEUE_DELETE, timestamp) + _s16(r.name))


_ENCODERS: dict[type, Callable[[Any, int], bytes]] = {
    Publish: lambda r, ts: encode_publish(
        ts,
        r.seq,
        r.queue,
        r.message_id,
        r.published_at,
        r.expires_at,
        r.priority,
        r.attempts,
        r.headers,
        r.payload,
    ),
    Deliver: lambda r, ts: encode_deliver(ts, r.seq, r.queue, r.attempts),
    Settle: lambda r, ts: encode_settle(ts, r.seq, r.queue, r.reason, r.detail),
    QueueCreate: _encode_queue_create,
    QueueDelete: _encode_queue_delete,
}


def encode_record(record: Record, timestamp: int) -> bytes:
    return _ENCODERS[type(record)](record, timestamp)


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


def _decode_publish(c: _Cursor) -> Record:
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


def _decode_settle(c: _Cursor) -> Record:
    seq, reason = c.take(_SEQ_REASON)
    return Settle(seq, c.s16(), SettleReason(reason), c.s16())


def _decode_deliver(c: _Cursor) -> Record:
    seq, attempts = c.take(_SEQ_ATTEMPTS)
    return Deliver(seq, c.s16(), attempts)


def _decode_queue_create(c: _Cursor) -> Record:
    name = c.s16()
    (created_at,) = c.take(_U64)
    return QueueCreate(name, created_at, c.raw32())


def _decode_queue_delete(c: _Cursor) -> Record:
    return QueueDelete(c.s16())


_DECODERS: dict[int, Callable[[_Cursor], Record]] = {
    RecordType.PUBLISH: _decode_publish,
    RecordType.SETTLE: _decode_settle,
    RecordType.DELIVER: _decode_deliver,
    RecordType.QUEUE_CREATE: _decode_queue_create,
    RecordType.QUEUE_DELETE: _decode_queue_delete,
}


def _decode_inner(kind: int, c: _Cursor) -> Record:
    decoder = _DECODERS.get(kind)
    if decoder is None:
        raise ValueError(f"unknown record type {kind}")
    return decoder(c)


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
