"""Input held over between reads, shared by the incremental decoders of every protocol.

A frame that arrives in many reads (a 1 MB publish comes in 4 to 16 reads of up to 256 KB)
is kept as the reads' own objects and joined once, when the frame's announced length is in:
one copy per frame, whatever the number of reads. Appending every read to a ``bytearray``
and copying that out again per read (``bytes(buffer)``) was quadratic in the number of
reads: a 64 MB frame copied some 8 GB.

The decoder says how many bytes it needs before parsing can make progress (the whole frame
once its header is read; one more byte while the header itself is cut), and gets the joined
bytes back only then (``add``/``take``), or, for a large payload, the reads themselves
(``cut``) to copy just the payload out of them (``join_range``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final, Protocol

Buffer = bytes | bytearray | memoryview

#: what an input with nothing held points to (never appended to: ``add_part`` makes the
#: input its own list), so that an idle connection's decoder holds no empty list of its own
#: (Final: the compiled build keeps it in a C static, not the module's dict)
_NOTHING: Final[list[Buffer]] = []
#: a read's share of a frame joined by ``take_frame`` is viewed from this size, copied (then
#: joined) below it: a view costs more than copying a few KiB
_VIEW_FROM: Final = 4096


class HasPayload(Protocol):
    payload: bytes


class Fill(Protocol):
    """A payload's bytes being filled (:func:`payload_fill`): ``write`` copies bytes in,
    a reader fills the buffer it exports (the unfilled rest, ``len`` of it) and says how
    much with ``advance``; ``take`` gives the payload once ``full``."""

    def write(self, data: Buffer, /) -> int: ...

    def advance(self, n: int, /) -> bool: ...

    def take(self) -> bytes: ...

    @property
    def filled(self) -> int: ...

    @property
    def full(self) -> bool: ...

    def __len__(self) -> int: ...


class Filling:
    """A large packet whose header is decoded and whose payload is being filled in place
    (``protocol/bigcopy.py: payload_fill``): the packet gets the payload once it is full."""

    __slots__ = ("fill", "packet")

    def __init__(self, fill: Fill, packet: HasPayload) -> None:
        self.fill = fill
        self.packet = packet


class HeldInput:
    """The tail of earlier reads that does not yet make a frame, as a list of chunks; or,
    ``filling``, a large packet whose payload is being filled in place (nothing else held)."""

    __slots__ = ("_need", "_parts", "filling", "size")

    def __init__(self) -> None:
        self._parts: list[Buffer] = _NOTHING
        #: bytes held
        self.size = 0
        self._need = 0
        self.filling: Filling | None = None

    def hold(self, data: bytes, start: int, need: int) -> None:
        """Keep ``data[start:]`` (a view: no copy) until ``need`` bytes are held in all.

        ``data`` must be immutable (bytes): the view outlives the call."""
        tail = memoryview(data)[start:] if start else data
        self._parts = [tail]
        self.size = len(tail)
        self._need = need

    def add(self, data: Buffer) -> bytes | None:
        """Append a read; the held bytes joined (one copy) once ``need`` of them are in, and
        then nothing is held any more; None while more are needed."""
        return self.take() if self.add_part(data) else None

    def take(self) -> bytes:
        """Every byte held, joined (one copy); nothing is held any more."""
        joined = b"".join(self._parts)
        self.clear()
        return joined

    def add_part(self, data: Buffer) -> bool:
        """Append a read; True once ``need`` bytes are held (then :meth:`add` would join
        them, or :meth:`cut` hands them over unjoined)."""
        if type(data) is not bytes:
            data = bytes(data)  # a caller's mutable buffer may change after the call
        parts = self._parts
        if parts is _NOTHING:
            self._parts = [data]
        else:
            parts.append(data)
        self.size += len(data)
        return self.size >= self._need

    @property
    def need(self) -> int:
        return self._need

    @property
    def parts(self) -> list[Buffer]:
        """The chunks held (not to be changed)."""
        return self._parts

    def cut(self) -> tuple[list[Buffer], bytes, int]:
        """The first ``need`` bytes held, as views of the reads (no copy), the last read and
        where in it the bytes after them start (its length when there are none); nothing is
        held any more. For a decoder that copies a large payload straight out of the reads
        and goes on parsing the last read from that offset.

        The rest is not copied out (``bytes(last[keep:])``): with 64 KiB frames in 256 KiB
        reads that copy took most of every read once more (a third copy of each payload)."""
        return self._split(0)

    def take_frame(self) -> tuple[bytes, bytes, int]:
        """The first ``need`` bytes held, joined (a small frame: only its bytes are copied,
        not the rest of the read it ends in), then as :meth:`cut`."""
        parts, last, keep = self._split(_VIEW_FROM)
        return b"".join(parts), last, keep

    def _split(self, view_from: int) -> tuple[list[Buffer], bytes, int]:
        """:meth:`cut`, the last read's share a view when at least ``view_from`` bytes."""
        parts, over = self._parts, self.size - self._need
        self.clear()
        last = parts[-1]
        if over <= 0:
            return parts, b"", 0
        keep = len(last) - over
        parts[-1] = memoryview(last)[:keep] if keep >= view_from else last[:keep]
        # (a read appended by ``add_part`` is bytes; the first part, a view, is never last)
        return parts, bytes(last) if type(last) is not bytes else last, keep

    def first_byte(self) -> int:
        """The first byte held (some are)."""
        return self._parts[0][0]

    def clear(self) -> None:
        self._parts = _NOTHING
        self.size = 0
        self._need = 0
        self.filling = None


def prefix(parts: list[Buffer], n: int) -> bytes:
    """The first ``n`` bytes of ``parts`` (all, when fewer): a small copy, to read a header.

    The head of a held frame: the first part (the tail of the read the frame began in)
    nearly always holds all ``n``, and is sliced (one small copy); the parts are gathered
    only when the head itself was cut over reads."""
    if parts:
        first = parts[0]
        if len(first) >= n:
            return bytes(first[:n])
    out = bytearray()
    for part in parts:
        out += part[: n - len(out)]
        if len(out) >= n:
            break
    return bytes(out)


def join_range(parts: Sequence[Buffer], start: int, stop: int) -> bytes:
    """Bytes ``start:stop`` of ``parts`` joined: the one copy made of a large payload."""
    pieces: list[Buffer] = []
    at = 0
    for part in parts:
        end = at + len(part)
        if end > start and at < stop:
            lo, hi = max(start - at, 0), min(stop, end) - at
            pieces.append(part if lo == 0 and hi == len(part) else memoryview(part)[lo:hi])
        at = end
        if at >= stop:
            break
    return b"".join(pieces)
