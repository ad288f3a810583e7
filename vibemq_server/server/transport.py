"""Write batching and flow control shared by the connections of every protocol.

Output is gathered and written once: at the end of the read being handled (``ReadBatch``),
or else at the end of the loop turn. While the socket is paused, or our own pending output
is over its bound, ``writable`` is False so deliveries wait in their queues instead of in
memory here; when it drains, ``_writable_again`` lets the protocol resume them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import cast

import structlog


class ReadBatch:
    """While one connection handles a read, the output it gives any connection (acks to the
    publisher, deliveries to subscribers, of any protocol) is written when the read is done:
    one write per connection per read, and without waiting for the next loop turn."""

    __slots__ = ("dirty", "reading")

    def __init__(self) -> None:
        self.reading = False
        self.dirty: list[BufferedConnection] = []

    def begin(self) -> None:
        self.reading = True

    def end(self) -> None:
        self.reading = False
        if self.dirty:
            dirty, self.dirty = self.dirty, []
            for conn in dirty:
                conn._flush()


class BufferedConnection(asyncio.Protocol):
    transport: asyncio.Transport | None
    conn_id: str
    log: structlog.typing.FilteringBoundLogger

    def _init_buffers(
        self, loop: asyncio.AbstractEventLoop, out_limit: int, batch: ReadBatch | None = None
    ) -> None:
        self.loop = loop
        self._batch = batch
        self.transport = None
        self._out: list[bytes] = []
        self._out_size = 0
        self._out_limit = out_limit
        self._flush_scheduled = False
        self._write_paused = False
        self._reading_paused = False
        self._closing = False

    def _accept(
        self,
        transport: asyncio.BaseTransport,
        register: Callable[[], bool],
        refusal: bytes = b"",
    ) -> bool:
        """Take the socket: a logger bound to the peer, a bounded write buffer, and a place
        under the broker's connection limit. Over the limit: ``refusal`` is written, the
        socket closed, and False returned."""
        self.transport = cast(asyncio.Transport, transport)
        peer = transport.get_extra_info("peername")
        self.log = self.log.bind(conn_id=self.conn_id, peer=f"{peer[0]}:{peer[1]}" if peer else "")
        self.transport.set_write_buffer_limits(high=self._out_limit)
        if register():
            self.log.debug("connection opened")
            return True
        self.log.warning("connection refused: limit reached")
        if refusal:
            self.transport.write(refusal)
        self._closing = True
        self.transport.close()
        return False

    # -- hooks for the protocol ------------------------------------------------------------------

    def _writable_again(self) -> None:
        """The socket drained: resume deliveries."""

    def _schedule_flush(self) -> None:
        batch = self._batch
        if batch is not None and batch.reading:
            batch.dirty.append(self)
        else:
            self.loop.call_soon(self._flush)

    # -- asyncio.Protocol flow control -------------------------------------------------------------

    def pause_writing(self) -> None:
        self._write_paused = True

    def resume_writing(self) -> None:
        self._write_paused = False
        self._writable_again()

    # -- output ------------------------------------------------------------------------------------

    @property
    def writable(self) -> bool:
        return not (self._write_paused or self._closing) and self._out_size < self._out_limit

    def send(self, data: bytes) -> None:
        if self._closing:
            return
        self._out.append(data)
        self._out_size += len(data)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self._schedule_flush()

    def _flush(self) -> None:
        self._flush_scheduled = False
        if not self._out or self.transport is None or self._closing:
            return  # (closing: close() flushed already; a lost connection's output is void)
        was_full = self._out_size >= self._out_limit
        out, self._out, self._out_size = self._out, [], 0
        self.transport.write(b"".join(out))
        if was_full and self.writable:
            self._writable_again()

    # -- input -------------------------------------------------------------------------------------

    def pause_reading(self) -> None:
        if not self._reading_paused and self.transport is not None and not self._closing:
            self._reading_paused = True
            self.transport.pause_reading()

    def resume_reading(self) -> None:
        if self._reading_paused and self.transport is not None and not self._closing:
            self._reading_paused = False
            self.transport.resume_reading()

    # -- closing -----------------------------------------------------------------------------------

    def close(self) -> None:
        """Close after what is queued has been written."""
        if self._closing or self.transport is None:
            return
        self._flush()
        self._closing = True
        self.transport.close()

    def abort(self) -> None:
        if self.transport is not None:
            self.transport.abort()
