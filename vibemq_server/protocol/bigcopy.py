"""A large payload's one copy, made where it does not hold up the event loop.

A 64 MiB payload joined from its reads costs ~50 ms here (the copy and the page faults of the
fresh allocation): on the loop, every other connection waits that long. With
:mod:`vibemq_server.protocol._bigcopy` (C, built with the package, optional) the copy runs with
the GIL released, so a session hands a payload of :data:`OFFLOAD_FROM` bytes or more to a
worker thread (``Link.offload``) and the loop goes on meanwhile (docs/performance.md, issue 16).
Without it the join is :func:`~vibemq_server.protocol.held.join_range` and runs on the loop,
as before (in a thread it would hold the GIL all the same).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Final, Protocol

from vibemq_server.protocol.held import Buffer
from vibemq_server.protocol.held import join_range as join_range_pure

_compiled: Callable[[Sequence[Buffer], int, int], bytes] | None
try:
    from vibemq_server.protocol._bigcopy import join_range as _compiled
except ImportError:  # not built: the pure join, on the loop
    _compiled = None

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
