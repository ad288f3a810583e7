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

from vibemq_server.journal.records import RECORD_PREFIX, RecordType


class RecordSink(Protocol):
    """One write batch's records (``len()``: the bytes gathered)."""

    def publish(
        self,
        name16: bytes,
        seq: int,
        message_id: str,
        published_at: int,
        expires_at: int,
        priority: int,
        attempts: int,
        payload: bytes,
        /,
    ) -> object:
        """Append a PUBLISH record without headers, its timestamp ``published_at`` (as the
        journal writes every PUBLISH); its offset in the batch, an int (typed ``object`` so
        that the compiled journal keeps the int object the encoder made for its list of the
        batch's publishes, instead of unboxing it and boxing it again)."""
        ...

    def stamp(self, timestamp: int, /) -> None:
        """The timestamp of the DELIVER and SETTLE records appended from now on (the journal
        reads the clock once a write batch; 0 until stamped)."""
        ...

    def deliver(self, name16: bytes, seq: int, attempts: int, /) -> None: ...

    def settle(self, name16: bytes, seq: int, reason: int, detail: str, /) -> None: ...

    def settle_all(self, name16: bytes, seqs: list[int], reason: int, /) -> None:
        """A SETTLE record without detail for each of ``seqs``, in order (a read's acks in
        one call); a bad seq appends none of them."""
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


class PyRecordBuffer:
    """:class:`RecordSink` in Python: the C one's fallback, and its reference in the tests."""

    __slots__ = ("_buf", "_structs", "_ts")

    def __init__(self) -> None:
        self._buf = bytearray()
        self._ts = 0
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

    def _add(self, head: bytes, payload: bytes = b"") -> int:
        start = len(self._buf)
        crc = _crc32(payload, _crc32(head)) if payload else _crc32(head)
        self._buf += _pack_prefix(len(head) + len(payload), crc)
        self._buf += head
        self._buf += payload
        return start

    def publish(
        self,
        name16: bytes,
        seq: int,
        message_id: str,
        published_at: int,
        expires_at: int,
        priority: int,
        attempts: int,
        payload: bytes,
    ) -> int:
        mid = message_id.encode()
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
        return self._add(head, payload)

    def stamp(self, timestamp: int) -> None:
        _U64.pack(timestamp)  # (refused out of range, as the C one does)
        self._ts = timestamp

    def deliver(self, name16: bytes, seq: int, attempts: int) -> None:
        st = self._struct(_DELIVER, len(name16), 0)
        self._add(st.pack(_DELIVER, self._ts, seq, attempts, name16))

    def settle(self, name16: bytes, seq: int, reason: int, detail: str) -> None:
        raw = detail.encode()
        st = self._struct(_SETTLE, len(name16), len(raw))
        self._add(st.pack(_SETTLE, self._ts, seq, reason, name16, len(raw), raw))

    def settle_all(self, name16: bytes, seqs: list[int], reason: int) -> None:
        st = self._struct(_SETTLE, len(name16), 0)
        heads = [st.pack(_SETTLE, self._ts, seq, reason, name16, 0, b"") for seq in seqs]
        for head in heads:  # (all packed first: a bad seq appends none)
            self._add(head)

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


def record_end(chunk: bytes, start: int) -> int:
    """Where the record at ``start`` of a batch's bytes ends (its length is in its prefix)."""
    return start + RECORD_PREFIX.size + int.from_bytes(chunk[start : start + 4], "big")
