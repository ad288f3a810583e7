"""Write batching and flow control shared by the connections of every protocol.

Output is gathered and written once: at the end of the read being handled (``ReadBatch``),
or else at the end of the loop turn. While the socket is paused, or our own pending output
is over its bound, ``writable`` is False so deliveries wait in their queues instead of in
memory here; when it drains, ``_writable_again`` lets the protocol resume them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Protocol, cast

import structlog


class ReadBatch:
    """While one connection handles a read, the output it gives any connection (acks to the
    publisher, deliveries to subscribers, of any protocol) is written when the read is done:
    one write per connection per read, and without waiting for the next loop turn."""

    __slots__ = ("_depth", "dirty", "reading")

    def __init__(self) -> None:
        self.reading = False
        self._depth = 0
        self.dirty: list[StreamTransport] = []

    def begin(self) -> None:
        self._depth += 1
        self.reading = True

    def end(self) -> None:
        self._depth -= 1
        if self._depth > 0:
            return
        self.reading = False
        # A connection whose flush fails must not leave the others' output unwritten (their
        # flush flag would stay set and nothing they send would ever be written again).
        while self.dirty:
            dirty, self.dirty = self.dirty, []
            for conn in dirty:
                try:
                    conn._flush()
                except Exception:
                    conn.log.exception("write failed")
                    conn.abort()


class Session(Protocol):
    """What the transport drives: one protocol's sans-IO session of one connection."""

    def data_received(self, data: bytes) -> None:
        """Parse every complete frame in ``data`` (and what was buffered) and handle them."""

    def writable_again(self) -> None:
        """The connection can take output again: resume deliveries."""

    def connection_lost(self, exc: Exception | None) -> None:
        """The socket is gone: release subscriptions, return unacknowledged deliveries."""

    def check_timers(self, now: float, keepalive: float, frame_timeout: float) -> None:
        """Keep-alive and stalled-frame checks, about once a second (``now``: loop time)."""

    def shutdown(self, reason: str) -> None:
        """Broker shutdown: say goodbye in the protocol's own words, then close."""


class Link(Protocol):
    """What a session may do with its connection (``StreamTransport`` implements it)."""

    conn_id: str
    log: structlog.typing.FilteringBoundLogger
    #: the client's address (for authentication: loopback or not, failed logins per address)
    peer_host: str

    @property
    def writable(self) -> bool: ...

    @property
    def reading_paused(self) -> bool: ...

    def send(self, data: bytes) -> None: ...

    def close(self) -> None: ...

    def abort(self) -> None: ...

    def pause_reading(self) -> None: ...

    def resume_reading(self) -> None: ...

    def call_soon(self, callback: Callable[[], None]) -> None: ...

    def call_later(self, delay: float, callback: Callable[[], None]) -> None: ...

    def time(self) -> float: ...


class StreamTransport(asyncio.Protocol):
    """The one asyncio protocol of every stream listener, whatever it speaks: it owns the
    socket, the output buffer, flow control and the per-read batch, and hands bytes to the
    protocol's sans-IO ``Session`` (made by ``make_session`` once the socket is accepted)."""

    def __init__(
        self,
        make_session: Callable[[StreamTransport], Session],
        *,
        conn_id: str,
        log: structlog.typing.FilteringBoundLogger,
        out_limit: int,
        batch: ReadBatch,
        register: Callable[[StreamTransport], bool],
        unregister: Callable[[StreamTransport], None],
        refusal: bytes = b"",
    ) -> None:
        self.loop = asyncio.get_running_loop()
        self._make_session = make_session
        self.conn_id = conn_id
        self.log = log
        self._batch = batch
        self._register = register
        self._unregister = unregister
        self._refusal = refusal
        self.session: Session | None = None
        self.transport: asyncio.Transport | None = None
        self._out: list[bytes] = []
        self._out_size = 0
        self._out_limit = out_limit
        self._flush_scheduled = False
        self._write_paused = False
        self._reading_paused = False
        self._closing = False
        self.peer_host = ""

    # -- asyncio.Protocol --------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        """Take the socket: a logger bound to the peer, a bounded write buffer, and a place
        under the broker's connection limit (over it: the refusal is written, the socket
        closed)."""
        self.transport = cast(asyncio.Transport, transport)
        peer = transport.get_extra_info("peername")
        self.peer_host = str(peer[0]) if peer else ""
        self.log = self.log.bind(conn_id=self.conn_id, peer=f"{peer[0]}:{peer[1]}" if peer else "")
        self.transport.set_write_buffer_limits(high=self._out_limit)
        if not self._register(self):
            self.log.warning("connection refused: limit reached")
            if self._refusal:
                self.transport.write(self._refusal)
            self._closing = True
            self.transport.close()
            return
        self.log.debug("connection opened")
        self.session = self._make_session(self)

    def data_received(self, data: bytes) -> None:
        session = self.session
        if session is None or self._closing:
            return
        batch = self._batch
        batch.begin()
        try:
            session.data_received(data)
        except Exception:  # a bug must cost this connection only, never the broker
            self.log.exception("internal error handling input")
            self.abort()
        finally:
            batch.end()

    def eof_received(self) -> bool | None:
        return None  # close our side too

    def connection_lost(self, exc: Exception | None) -> None:
        self._closing = True
        self._unregister(self)
        if self.session is not None:
            self.session.connection_lost(exc)
        self.log.debug("connection closed", error=str(exc) if exc else None)

    def pause_writing(self) -> None:
        self._write_paused = True

    def resume_writing(self) -> None:
        self._write_paused = False
        self._writable_again()

    # -- what the broker drives (its Link) ---------------------------------------------------------

    def check_timers(self, now: float, keepalive: float, frame_timeout: float) -> None:
        if self.session is not None and not self._closing:
            self.session.check_timers(now, keepalive, frame_timeout)

    def shutdown(self, reason: str) -> None:
        if self.session is not None and not self._closing:
            self.session.shutdown(reason)
        else:
            self.close()

    # -- what the session uses (Link) --------------------------------------------------------------

    @property
    def writable(self) -> bool:
        return not (self._write_paused or self._closing) and self._out_size < self._out_limit

    @property
    def reading_paused(self) -> bool:
        return self._reading_paused

    def time(self) -> float:
        return self.loop.time()

    def call_soon(self, callback: Callable[[], None]) -> None:
        self.loop.call_soon(callback)

    def call_later(self, delay: float, callback: Callable[[], None]) -> None:
        self.loop.call_later(delay, callback)

    def send(self, data: bytes) -> None:
        if self._closing:
            return
        self._out.append(data)
        self._out_size += len(data)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            batch = self._batch
            if batch.reading:
                batch.dirty.append(self)
            else:
                self.loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        if not self._out or self.transport is None or self._closing:
            return  # (closing: close() flushed already; a lost connection's output is void)
        was_full = self._out_size >= self._out_limit
        out, self._out, self._out_size = self._out, [], 0
        self.transport.write(b"".join(out) if len(out) > 1 else out[0])
        if was_full and self.writable:
            self._writable_again()

    def _writable_again(self) -> None:
        if self.session is not None and not self._closing:
            self.session.writable_again()

    def pause_reading(self) -> None:
        if not self._reading_paused and self.transport is not None and not self._closing:
            self._reading_paused = True
            self.transport.pause_reading()

    def resume_reading(self) -> None:
        if self._reading_paused and self.transport is not None and not self._closing:
            self._reading_paused = False
            self.transport.resume_reading()

    def close(self) -> None:
        """Close after what is queued has been written."""
        if self._closing or self.transport is None:
            return
        self._flush()
        self._closing = True
        self.transport.close()

    def abort(self) -> None:
        self._closing = True
        if self.transport is not None:
            self.transport.abort()
