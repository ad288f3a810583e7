"""One stand-in for a client's socket as the broker's protocol object sees it (an
``asyncio.Transport``), shared by the AMQP session fuzz and the liveness property tests.

Everything the broker writes goes to ``out``; the peer's bytes wait in ``inbox`` while reading
is paused. Two ways to model the peer's reading: ``flow=False`` (the fuzz) keeps ``out`` whole
and the test says when the peer stops and starts reading (``peer_stops_reading`` /
``peer_reads_again``); ``flow=True`` (liveness) is a socket buffer: writes past ``high`` pause
writing, ``peer_reads`` takes bytes off ``out`` and resumes it below ``low``. Writes after
``close()``/``abort()`` are counted in ``late`` (the fuzz checks there are none that matter).
"""

from __future__ import annotations

import asyncio
from typing import Any

_HIGH = 64 * 1024


class FakeSocket(asyncio.Transport):
    def __init__(self, protocol: asyncio.Protocol, peer: int, *, flow: bool = False) -> None:
        super().__init__()
        self.protocol = protocol
        self.peer = peer
        self.flow = flow
        self.out = bytearray()
        self.high = _HIGH
        self.low = _HIGH // 4
        self.late = 0  # bytes written after close()/abort()
        self.closed = False  # by the broker (or the peer went)
        self.lost = False  # connection_lost delivered
        self.write_paused = False
        self.reading_paused = False
        self.inbox: list[bytes] = []  # sent by the peer while reading was paused

    # -- what the broker calls -------------------------------------------------------------------

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return ("127.0.0.1", self.peer) if name == "peername" else default

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        self.high = high if high is not None else _HIGH
        self.low = low if low is not None else self.high // 4

    def get_write_buffer_size(self) -> int:
        return len(self.out) if self.flow else 0

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if self.closed or self.lost:
            self.late += len(data)
            return
        self.out += data
        if self.flow and not self.write_paused and len(self.out) > self.high:
            self.write_paused = True
            self.protocol.pause_writing()

    def writelines(self, list_of_data: Any) -> None:
        for data in list_of_data:
            self.write(data)

    def pause_reading(self) -> None:
        self.reading_paused = True

    def resume_reading(self) -> None:
        if self.reading_paused:
            self.reading_paused = False
            asyncio.get_running_loop().call_soon(self.deliver_inbox)

    def is_reading(self) -> bool:
        return not self.reading_paused

    def is_closing(self) -> bool:
        return self.closed or self.lost

    def close(self) -> None:
        self._lose(None)

    def abort(self) -> None:
        self._lose(None)

    def _lose(self, exc: Exception | None) -> None:
        if not self.closed:
            self.closed = True
            asyncio.get_running_loop().call_soon(self._connection_lost, exc)

    def _connection_lost(self, exc: Exception | None) -> None:
        if not self.lost:
            self.lost = True
            self.protocol.connection_lost(exc)

    # -- what the peer does ----------------------------------------------------------------------

    def peer_sends(self, data: bytes) -> None:
        if self.closed or self.lost or not data:
            return
        if self.reading_paused or self.inbox:
            self.inbox.append(data)
        else:
            self.protocol.data_received(data)

    def deliver_inbox(self) -> None:
        while self.inbox and not self.reading_paused and not (self.closed or self.lost):
            self.protocol.data_received(self.inbox.pop(0))

    def peer_reads(self, n: int) -> bytes:
        """(``flow``) The peer reads up to ``n`` bytes of what was written."""
        data = bytes(self.out[:n])
        del self.out[:n]
        if self.write_paused and len(self.out) <= self.low:
            self.write_paused = False
            self.protocol.resume_writing()
        return data

    def peer_stops_reading(self) -> None:
        if not self.write_paused and not self.is_closing():
            self.write_paused = True
            self.protocol.pause_writing()

    def peer_reads_again(self) -> None:
        if self.write_paused and not self.is_closing():
            self.write_paused = False
            self.protocol.resume_writing()

    def peer_goes(self, exc: Exception | None) -> None:
        self.closed = True
        self._connection_lost(exc)
