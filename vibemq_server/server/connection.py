"""The asyncio transport of one VibeMQ client: framing, write batching and flow control.

Every complete frame in a ``data_received`` chunk is parsed in one pass; replies and
deliveries are gathered and written once per loop tick. While the transport is paused (or our
own pending output is over its bound) the session reports itself unwritable, so deliveries
wait in their queues instead of in memory here.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable
from typing import TYPE_CHECKING

import structlog

from vibemq_server.protocol import CommandType, ErrorCode, FrameDecoder, Message, encode
from vibemq_server.server.session import Session, State
from vibemq_server.server.transport import BufferedConnection

if TYPE_CHECKING:
    from vibemq_server.server.broker import Broker

_ids = itertools.count(1)


class Connection(BufferedConnection):
    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self._init_buffers(asyncio.get_running_loop(), broker.config.write_buffer_high_bytes)
        self.conn_id = f"srv_{next(_ids)}"
        self.decoder = FrameDecoder(broker.config.max_message_size)
        self.session: Session | None = None
        self.last_rx = self.loop.time()
        self.partial_since: float | None = None
        self.log: structlog.typing.FilteringBoundLogger = structlog.get_logger("vibemq.conn")

    # -- asyncio.Protocol --------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        refusal = Message(
            CommandType.ERROR,
            self.conn_id,
            error_code=ErrorCode.CONNECTION_LIMIT,
            error_message=f"at most {self.broker.config.max_connections} connections",
        )
        if self._accept(transport, lambda: self.broker.register(self), encode(refusal)):
            self.session = Session(
                self, self.broker.manager, self.broker.config, self.conn_id, self.log
            )

    def data_received(self, data: bytes) -> None:
        session = self.session
        if session is None or self._closing:
            return
        self.last_rx = self.loop.time()
        try:
            bodies = self.decoder.feed(data)
        except Exception as exc:  # only ProtocolError can come out of the decoder
            bodies = []
            self.log.debug("framing error", error=str(exc))
        session.handle_bodies(bodies)
        if self._closing:
            return
        if self.decoder.error is not None:
            session.reply_error(self.decoder.error)
            return
        if self.decoder.buffered:
            # A stall is no progress at all: a frame completing restarts the clock.
            if bodies or self.partial_since is None:
                self.partial_since = self.last_rx
        else:
            self.partial_since = None

    def eof_received(self) -> bool | None:
        return None  # close our side too

    def connection_lost(self, exc: Exception | None) -> None:
        self._closing = True
        self.broker.unregister(self)
        if self.session is not None:
            self.session.connection_lost()
        self.log.debug("connection closed", error=str(exc) if exc else None)

    def _writable_again(self) -> None:
        if self.session is not None:
            self.session.on_writable()

    def call_soon(self, callback: Callable[[], None]) -> None:
        self.loop.call_soon(callback)

    # -- housekeeping ------------------------------------------------------------------------

    def check_timers(self, now: float, keepalive: float, frame_timeout: float) -> None:
        """Close a client that went silent, or that stalled halfway through a frame."""
        session = self.session
        if session is None or self._closing:
            return
        if self._reading_paused:
            self.last_rx = now  # we stopped reading, so its silence is ours
            return
        if self.partial_since is not None and now - self.partial_since > frame_timeout:
            self.log.warning("incomplete frame timed out", buffered=self.decoder.buffered)
            session.send_error("", ErrorCode.INVALID_MESSAGE, "incomplete frame timed out")
            session.close()
        elif now - self.last_rx > keepalive:
            self.log.info("keep-alive timeout", idle_s=round(now - self.last_rx, 1))
            session.shutdown("keepalive_timeout")

    def shutdown(self, reason: str) -> None:
        if self.session is not None and self.session.state is not State.CLOSED:
            self.session.shutdown(reason)
        else:
            self.close()
