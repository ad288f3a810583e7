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
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Final, Protocol

from vibemq_server.protocol.held import Buffer

if TYPE_CHECKING:
    from vibemq_server.protocol._bigcopy import ReadBuffer

    ReadTarget = bytearray | ReadBuffer
from vibemq_server.protocol.held import join_range as join_range_pure

_compiled: Callable[[Sequence[Buffer], int, int], bytes] | None
_read_buffer: Callable[[int], ReadInto] | None
try:
    from vibemq_server.protocol._bigcopy import join_range as _compiled
except ImportError:  # not built: the pure join, on the loop
    _compiled = None
try:
    from vibemq_server.protocol._bigcopy import ReadBuffer as _read_buffer
except ImportError:  # not built (or built before it): reads copied out of a bytearray
    _read_buffer = None

#: Whether the compiled join is built (it releases the GIL: worth a worker thread).
COMPILED: Final = _compiled is not None
#: From this size a payload is joined off the loop (when ``COMPILED``): 4 MiB take a few ms
#: here, longer than a ping should wait; the thread hop costs ~50 us (as the JSON check's).
OFFLOAD_FROM: Final = 4 * 1024 * 1024
#: what a decoder leaves unjoined for its session to join off the loop: payloads from
#: OFFLOAD_FROM when the join is compiled; none otherwise (in a thread it would hold the GIL)
BIG_FROM: Final = OFFLOAD_FROM if COMPILED else 0

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


class HasPayload(Protocol):
    payload: bytes


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
