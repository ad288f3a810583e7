"""uvicorn's httptools protocol, with what a broker's listener needs besides.

* A request (its headers and body) must arrive within ``request_timeout_s``: a client that
  sends half a request and stalls is answered 408 and closed (uvicorn only times out idle
  keep-alive connections, so a stalled request would hold its connection forever).
* At most ``_MAX_HEAD_BYTES`` of request line and headers: beyond, 431 and closed (httptools
  itself sets no bound).
* The ``date`` header, refreshed when a request starts in a new second: uvicorn refreshes it
  from ``Server.main_loop``, a 100 ms timer we do not run (an idle listener costs nothing).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from email.utils import formatdate

from uvicorn.config import Config
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.server import ServerState

_MAX_HEAD_BYTES = 64 * 1024

_date_second = 0


def _refresh_date(state: ServerState) -> None:
    global _date_second
    now = int(time.time())
    if now != _date_second:
        _date_second = now
        state.default_headers = [(b"date", formatdate(now, usegmt=True).encode())]


def _close_with(transport: asyncio.Transport, status: bytes) -> None:
    if not transport.is_closing():
        transport.write(
            b"HTTP/1.1 " + status + b"\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
        )
        transport.close()


class BrokerHttpProtocol(HttpToolsProtocol):
    """One HTTP connection of the management listener."""

    def __init__(
        self,
        config: Config,
        server_state: ServerState,
        request_timeout: float,
        loop: asyncio.AbstractEventLoop,
    ) -> None:
        super().__init__(config, server_state, {}, loop)
        self._request_timeout = request_timeout
        self._request_timer: asyncio.TimerHandle | None = None
        #: bytes of the current request's line and headers so far; None once they are complete
        self._head_bytes: int | None = 0

    # -- the request deadline ---------------------------------------------------------------

    def _arm(self) -> None:
        if self._request_timer is None:
            self._request_timer = self.loop.call_later(self._request_timeout, self._timed_out)

    def _disarm(self) -> None:
        if self._request_timer is not None:
            self._request_timer.cancel()
            self._request_timer = None

    def _timed_out(self) -> None:
        self._request_timer = None
        cycle = self.cycle
        if cycle is not None and cycle.response_started and not cycle.response_complete:
            self.transport.close()  # mid-response: no room for a status line
        else:
            _close_with(self.transport, b"408 Request Timeout")

    # -- asyncio.Protocol -------------------------------------------------------------------

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm()  # the first request too: a connection that never sends is closed

    def data_received(self, data: bytes) -> None:
        in_head = self._head_bytes is not None
        super().data_received(data)
        # Counted only while the head is still incomplete after this read (a read that
        # completes it may carry a body of any size).
        if in_head and self._head_bytes is not None:
            self._head_bytes += len(data)
            if self._head_bytes > _MAX_HEAD_BYTES:
                _close_with(self.transport, b"431 Request Header Fields Too Large")

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    # -- httptools callbacks ----------------------------------------------------------------

    def on_message_begin(self) -> None:
        _refresh_date(self.server_state)
        self._head_bytes = 0
        self._arm()
        super().on_message_begin()

    def on_headers_complete(self) -> None:
        self._head_bytes = None
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        self._disarm()
        super().on_message_complete()

    def __repr__(self) -> str:
        return f"<BrokerHttpProtocol client={self.client!r}>"


def protocol_factory(
    config: Config, state: ServerState, request_timeout: float
) -> Callable[[], BrokerHttpProtocol]:
    """What ``loop.create_server`` calls for each accepted connection."""
    loop = asyncio.get_running_loop()
    return lambda: BrokerHttpProtocol(config, state, request_timeout, loop)
