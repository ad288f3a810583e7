"""A write batch's per-message records, encoded into one buffer as they come.

The journal appends each message's PUBLISH (without headers, payload under 16 KiB), DELIVER
and SETTLE record to one :class:`RecordSink` per write batch and takes the batch's bytes once,
at the flush. :mod:`vibemq_server.journal._recbuf` (C, built with the package, optional) writes
a record in place with one call: its head, its CRC-32 and the payload copied once, where the
Python encoders made a ``Struct.pack``, two ``crc32`` calls and a join (docs/performance.md,
issue 15). Without it :class:`PyRecordBuffer` does the same in Python. Both write exactly
:mod:`vibemq_server.journal.records`' bytes (a Hypothesis test compares all three); the
on-disk format is unchanged.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable
from struct import Struct
from typing import Final, Protocol

from vibemq_server.journal.records import RECORD_PREFIX, Publish, RecordType, iter_records


class RecordSink(Protocol):
    """One write batch's records (``len()``: the bytes gathered)."""

    def fields(self, published_at: int, expires_at: int, priority: int, attempts: int, /) -> None:
        """The fixed fields of the PUBLISH records appended from now on (their timestamp is
        ``published_at``, as the journal writes every PUBLISH). The messages of one clock tick
        share them: the journal passes them when they change, not four ints a publish."""
        ...

    def seq(self, seq: int, /) -> None:
        """The seq of the next PUBLISH record (0 until set), one more after each: a client's
        publishes get consecutive seqs, so the journal passes one only when it does not
        follow on, not a boxed seq a publish."""
        ...

    def publish(self, name16: bytes, message_id: str, payload: bytes, /) -> None:
        """Append a PUBLISH record without headers, with the next seq and the last
        ``fields``; a refused one appends nothing and leaves the next seq."""
        ...

    def stamp(self, timestamp: int, /) -> None:
        """The timestamp of the DELIVER and SETTLE records appended from now on (the journal
        reads the clock once a write batch; 0 until stamped)."""
        ...

    def deliver_run(self, name16: bytes, first: int, count: int, attempts: int, /) -> None:
        """A DELIVER record for each of the seqs ``first`` .. ``first + count - 1``, in order,
        with the same ``attempts`` (a loop turn's consecutive deliveries of a queue in one
        call, not one a message with its seq boxed); a bad field appends none."""
        ...

    def settle(self, name16: bytes, seq: int, reason: int, detail: str, /) -> None: ...

    def settle_all(self, name16: bytes, seqs: list[int], reason: int, /) -> None:
        """A SETTLE record without detail for each of ``seqs``, in order (a read's acks in
        one call); a bad seq appends none of them."""
        ...

    def settle_run(self, name16: bytes, first: int, count: int, reason: int, /) -> None:
        """``settle_all`` of the seqs ``first`` .. ``first + count - 1`` (consecutive
        deliveries acked: no list of seqs)."""
        ...

    def take(self) -> bytes:
        """The records appended since the last take; the batch starts over."""
        ...

    def __len__(self) -> int: ...


_PUBLISH: Final = int(RecordType.PUBLISH)
_DELIVER: Final = int(RecordType.DELIVER)
_SETTLE: Final = int(RecordType.SETTLE)
_pack_prefix: Final = RECORD_PREFIX.pack
_crc32: Final = zlib.crc32
_U64: Final = Struct(">Q")
_U64_MAX: Final = 2**64 - 1
_FIELDS: Final = Struct(">QQBH")  # published_at, expires_at, priority, attempts
_RUN: Final = Struct(">IQQ")  # a run's count, its first and last seq


def _run(first: int, count: int) -> None:
    """Refuse a run the C encoder refuses: a count over a u32, a last seq over a u64."""
    _RUN.pack(count, first, first + max(count - 1, 0))


class PyRecordBuffer:
    """:class:`RecordSink` in Python: the C one's fallback, and its reference in the tests."""

    __slots__ = ("_buf", "_fields", "_seq", "_structs", "_ts")

    def __init__(self) -> None:
        self._buf = bytearray()
        self._ts = 0
        self._seq = 0
        self._fields = (0, 0, 0, 0)  # published_at, expires_at, priority, attempts
        # the layout up to the payload (or the end) per record type and field lengths
        self._structs: dict[tuple[int, int, int], Struct] = {}

    def _struct(self, kind: int, name: int, text: int) -> Struct:
        st = self._structs.get((kind, name, text))
        if st is None:
            if len(self._structs) > 1024:
                self._structs.clear()  # bounded: every id length and queue name seen
            layout = {
                _PUBLISH: f">BQQQQBH{name}sH{text}sHI",
                _DELIVER: f">BQQH{name}s",
                _SETTLE: f">BQQB{name}sH{text}s",
            }[kind]
            st = self._structs[(kind, name, text)] = Struct(layout)
        return st

    def _add(self, head: bytes, payload: bytes = b"") -> None:
        crc = _crc32(payload, _crc32(head)) if payload else _crc32(head)
        self._buf += _pack_prefix(len(head) + len(payload), crc)
        self._buf += head
        self._buf += payload

    def fields(self, published_at: int, expires_at: int, priority: int, attempts: int) -> None:
        _FIELDS.pack(published_at, expires_at, priority, attempts)  # (refused out of range)
        self._fields = (published_at, expires_at, priority, attempts)

    def seq(self, seq: int) -> None:
        _U64.pack(seq)  # (refused out of range, as the C one does)
        self._seq = seq

    def publish(self, name16: bytes, message_id: str, payload: bytes) -> None:
        seq = self._seq
        mid = message_id.encode()
        published_at, expires_at, priority, attempts = self._fields
        head = self._struct(_PUBLISH, len(name16), len(mid)).pack(
            _PUBLISH,
            published_at,
            seq,
            published_at,
            expires_at,
            priority,
            attempts,
            name16,
            len(mid),
            mid,
            0,
            len(payload),
        )
        self._add(head, payload)
        self._seq = (seq + 1) & _U64_MAX  # (wraps as the C one's does)

    def stamp(self, timestamp: int) -> None:
        _U64.pack(timestamp)  # (refused out of range, as the C one does)
        self._ts = timestamp

    def deliver_run(self, name16: bytes, first: int, count: int, attempts: int) -> None:
        st = self._struct(_DELIVER, len(name16), 0)
        _run(first, count)
        heads = [
            st.pack(_DELIVER, self._ts, seq, attempts, name16)
            for seq in range(first, first + count)
        ]
        for head in heads:  # (all packed first: a bad field appends none)
            self._add(head)

    def settle(self, name16: bytes, seq: int, reason: int, detail: str) -> None:
        raw = detail.encode()
        st = self._struct(_SETTLE, len(name16), len(raw))
        self._add(st.pack(_SETTLE, self._ts, seq, reason, name16, len(raw), raw))

    def settle_all(self, name16: bytes, seqs: list[int], reason: int) -> None:
        st = self._struct(_SETTLE, len(name16), 0)
        heads = [st.pack(_SETTLE, self._ts, seq, reason, name16, 0, b"") for seq in seqs]
        for head in heads:  # (all packed first: a bad seq appends none)
            self._add(head)

    def settle_run(self, name16: bytes, first: int, count: int, reason: int) -> None:
        _run(first, count)
        self.settle_all(name16, list(range(first, first + count)), reason)

    def take(self) -> bytes:
        out = bytes(self._buf)
        self._buf.clear()
        return out

    def __len__(self) -> int:
        return len(self._buf)


new_record_buffer: Callable[[], RecordSink]
try:
    from vibemq_server.journal._recbuf import RecordBuffer as _Compiled
except ImportError:  # not built: the same records from Python
    new_record_buffer = PyRecordBuffer
else:
    new_record_buffer = _Compiled

#: Whether the C encoder is built.
COMPILED: Final = new_record_buffer is not PyRecordBuffer


def without_publishes(chunk: bytes, drop: set[tuple[int, str]]) -> bytes:
    """The records of a batch's bytes without the PUBLISH records of ``drop``, (seq, queue)
    pairs: the publishes withdrawn after their write failed (a client publish's seq is new,
    so it has one record in a batch). Only a failed write calls this: the per-message path
    keeps no offsets for it."""
    kept: list[bytes] = []
    start = 0
    for entry in iter_records(chunk, 0):
        record = entry.record
        if isinstance(record, Publish) and (record.seq, record.queue) in drop:
            kept.append(chunk[start : entry.offset])
            start = entry.offset + entry.size
    if not kept:
        return chunk
    kept.append(chunk[start:])
    return b"".join(kept)
