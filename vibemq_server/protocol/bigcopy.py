"""A large payload's one copy, made where it does not hold up the event loop.

A 64 MiB payload joined from its reads costs ~50 ms here (the copy and the page faults of the
fresh allocation): on the loop, every other connection waits that long. With
:mod:`vibemq_server.protocol._bigcopy` (C, built with the package, optional) the copy runs with
the GIL released, so a session hands a payload of :data:`OFFLOAD_FROM` bytes or more to a
worker thread (``Link.offload``) and the loop goes on meanwhile (docs/performance.md, issue 16).
Without it the join is :func:`~vibemq_server.protocol.held.join_range` and runs on the loop,
as before (in a thread it would hold the GIL all the same).

:func:`read_buffer` is where the transport's socket reads land: with the extension, straight
in the ``bytes`` object the session gets (no copy); without it, in one reused ``bytearray``
copied out per read (what uvloop's own read path does).

:func:`payload_fill` is a large payload's own ``bytes`` being filled: a decoder that has a
PUBLISH's header but not all of its payload copies in what it has and lets the transport read
the rest straight into it (``Link.read_into``): no join of a payload cut over reads. Without
the extension :class:`PureFill` does the same in a ``bytearray`` and copies it once at the end.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Final, Protocol, cast

from vibemq_server.protocol.held import Buffer
from vibemq_server.protocol.held import Fill as Fill  # (re-exported: the Fill protocol)
from vibemq_server.protocol.held import HasPayload as HasPayload

if TYPE_CHECKING:
    from vibemq_server.protocol._bigcopy import PayloadFill, ReadBuffer

    ReadTarget = bytearray | ReadBuffer | memoryview | PayloadFill
from vibemq_server.protocol.held import join_range as join_range_pure

_compiled: Callable[[Sequence[Buffer], int, int], bytes] | None
_read_buffer: Callable[[int], ReadInto] | None
_payload_fill: Callable[[int], Fill] | None
try:
    from vibemq_server.protocol._bigcopy import join_range as _compiled
except ImportError:  # not built: the pure join, on the loop
    _compiled = None
try:
    from vibemq_server.protocol._bigcopy import ReadBuffer as _read_buffer
except ImportError:  # not built (or built before it): reads copied out of a bytearray
    _read_buffer = None
try:
    from vibemq_server.protocol._bigcopy import PayloadFill as _payload_fill
except ImportError:  # not built (or built before it): filled in a bytearray
    _payload_fill = None

#: Whether the compiled join is built (it releases the GIL: worth a worker thread).
COMPILED: Final = _compiled is not None
#: From this size a payload is joined off the loop (when ``COMPILED``): 4 MiB take a few ms
#: here, longer than a ping should wait; the thread hop costs ~50 us (as the JSON check's).
OFFLOAD_FROM: Final = 4 * 1024 * 1024
#: what a decoder leaves unjoined for its session to join off the loop: payloads from
#: OFFLOAD_FROM when the join is compiled; none otherwise (in a thread it would hold the GIL)
BIG_FROM: Final = OFFLOAD_FROM if COMPILED else 0

#: A large packet with this much of its payload still to come once its header is in has the
#: payload filled in place (``payload_fill``, the rest read straight into it): a 1 MiB
#: payload's 3/4 that arrive after the read that brought its header are then not copied.
#: Below it (a 64 KiB payload cut by a read) the join is cheaper than the extra read and
#: write per message that reading straight into it would cost.
FILL_FROM: Final = 64 * 1024

join_range: Callable[[Sequence[Buffer], int, int], bytes] = (
    _compiled if _compiled is not None else join_range_pure
)
"""Bytes ``start:stop`` of ``parts`` joined (the GIL released for a large copy when built)."""


class ReadInto(Protocol):
    """Where a socket read lands: ``get`` a writable buffer of ``size`` bytes for the read,
    then ``take`` the ``n`` bytes read as ``bytes`` (before the next ``get``)."""

    def get(self, size: int, /) -> ReadTarget: ...

    def take(self, n: int, /) -> bytes: ...


class CopiedRead:
    """Without the extension: one reused ``bytearray``, copied out per read (one copy, as
    uvloop's own read path makes)."""

    __slots__ = ("_buf",)

    def __init__(self) -> None:
        self._buf = bytearray()

    def get(self, size: int, /) -> bytearray:
        if len(self._buf) != size:
            self._buf = bytearray(size)
        return self._buf

    def take(self, n: int, /) -> bytes:
        with memoryview(self._buf) as view:
            return bytes(view[:n])


def read_buffer(copy_below: int) -> ReadInto:
    """A new place for socket reads (one per event loop: reads are handled one at a time,
    each ``take`` before the next ``get``). Reads shorter than ``copy_below`` are copied out
    (the buffer kept for the next read); longer ones are the buffer's own bytes."""
    return _read_buffer(copy_below) if _read_buffer is not None else CopiedRead()


class PureFill:
    """Without the extension: the payload filled in a ``bytearray`` (the unfilled rest
    handed out as a view), copied once into ``bytes`` by ``take``."""

    __slots__ = ("_buf", "_pos", "_taken")

    def __init__(self, size: int) -> None:
        if size < 0:
            raise ValueError("PayloadFill: size must not be negative")
        self._buf = bytearray(size)
        self._pos = 0
        self._taken = False

    def _open(self) -> None:
        if self._taken:
            raise ValueError("PayloadFill: already taken")

    def write(self, data: Buffer, /) -> int:
        self._open()
        n = min(len(data), len(self._buf) - self._pos)
        self._buf[self._pos : self._pos + n] = memoryview(data)[:n]
        self._pos += n
        return n

    def advance(self, n: int, /) -> bool:
        self._open()
        if n < 0 or n > len(self._buf) - self._pos:
            raise ValueError("PayloadFill.advance: more than was left")
        self._pos += n
        return self._pos == len(self._buf)

    def take(self) -> bytes:
        self._open()
        if self._pos != len(self._buf):
            raise ValueError("PayloadFill.take: not full yet")
        self._taken = True
        out = bytes(self._buf)
        self._buf = bytearray()
        return out

    @property
    def filled(self) -> int:
        return self._pos

    @property
    def full(self) -> bool:
        return not self._taken and self._pos == len(self._buf)

    def view(self) -> memoryview:
        """The unfilled rest, writable (what a read fills before ``advance``)."""
        self._open()
        return memoryview(self._buf)[self._pos :]

    def __len__(self) -> int:
        return 0 if self._taken else len(self._buf) - self._pos


def payload_fill(size: int) -> Fill:
    """A payload of ``size`` bytes to fill (the C one when built: no copy at the end)."""
    return _payload_fill(size) if _payload_fill is not None else PureFill(size)


def read_target(fill: Fill) -> ReadTarget:
    """What a socket read into ``fill`` reads into: the unfilled rest."""
    if isinstance(fill, PureFill):
        return fill.view()
    return cast("PayloadFill", fill)


def read_into_fill(fill: Fill, data: Buffer) -> tuple[int, bool]:
    """One socket read of ``data`` landing in ``fill`` the way the transport's reads do
    (``Link.read_into``: into :func:`read_target`, then ``advance``; not ``Fill.write``), for
    the tests and benches that stand in for the transport: as much of ``data`` as ``fill``
    has room for. The bytes it took, and whether ``fill`` is full now."""
    with memoryview(read_target(fill)) as view:
        n = min(len(view), len(data))
        view[:n] = memoryview(data)[:n]
    return n, fill.advance(n)


def read_through(
    data: bytes, filling: Callable[[], Fill | None], received: Callable[[bytes], object]
) -> None:
    """``data``, one socket read, passed on as StreamTransport passes it (for the tests and
    benches that stand in for it): while ``filling()`` gives a fill with room (the one the
    session asked its next bytes to go to, ``Link.read_into``), as much as it holds is read
    straight into it (:func:`read_into_fill`) and ``received(b"")`` is called after each such
    read; the rest, if any, is ``received`` as it is. A full fill is read into no more."""
    while data:
        fill = filling()
        if fill is None or not len(fill):
            break
        n = read_into_fill(fill, data)[0]
        data = data[n:]
        received(b"")
    if data:
        received(data)


class Unjoined:
    """A decoded packet whose payload is still bytes ``start:stop`` of the reads it came in
    (``parts``): a decoder leaves a large one so, its connection joins it off the loop."""

    __slots__ = ("packet", "parts", "start", "stop")

    def __init__(self, packet: HasPayload, parts: list[Buffer], start: int, stop: int) -> None:
        self.packet = packet
        self.parts = parts
        self.start = start
        self.stop = stop

    def join(self) -> bytes:
        """The payload, joined (in a worker thread: the GIL released when compiled)."""
        return join_range(self.parts, self.start, self.stop)

    def fill(self) -> None:
        """Join the payload here and now, into the packet."""
        self.packet.payload = self.join()
