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
        #: reading a request's line and headers (before the first request too)
        self._in_head = True
        #: their size as parsed so far, and the bytes read while they were incomplete
        self._head_size = 0
        self._partial = 0
        #: refused (431): what the parser still reports of this request is ignored
        self._refused = False

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
        if cycle is None or not cycle.response_started:
            _close_with(self.transport, b"408 Request Timeout")
        else:  # answered already (a 413 before the body), or mid-response: just close
            self.transport.close()

    # -- asyncio.Protocol -------------------------------------------------------------------

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm()  # the first request too: a connection that never sends is closed

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return
        in_head = self._in_head
        super().data_received(data)
        # A head still incomplete after this read: bound what it has taken so far (httptools
        # reports a header only once it is complete, so an endless one is caught here).
        if in_head and self._in_head:
            self._partial += len(data)
            if self._partial > _MAX_HEAD_BYTES:
                self._refuse()

    def _refuse(self) -> None:
        self._refused = True
        _close_with(self.transport, b"431 Request Header Fields Too Large")

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    # -- httptools callbacks ----------------------------------------------------------------

    def on_message_begin(self) -> None:
        _refresh_date(self.server_state)
        self._in_head = True
        self._head_size = self._partial = 0
        self._arm()
        super().on_message_begin()

    def on_url(self, url: bytes) -> None:
        self._head_size += len(url)
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._head_size += len(name) + len(value) + 4
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self._in_head = False
        if self._head_size > _MAX_HEAD_BYTES:
            self._refuse()
            return
        super().on_headers_complete()

    def on_body(self, body: bytes) -> None:
        if not self._refused:
            super().on_body(body)

    def on_message_complete(self) -> None:
        self._disarm()
        if not self._refused:
            super().on_message_complete()

    def __repr__(self) -> str:
        return f"<BrokerHttpProtocol client={self.client!r}>"


def protocol_factory(
    config: Config, state: ServerState, request_timeout: float
) -> Callable[[], BrokerHttpProtocol]:
    """What ``loop.create_server`` calls for each accepted connection."""
    loop = asyncio.get_running_loop()
    return lambda: BrokerHttpProtocol(config, state, request_timeout, loop)
