"""One protocol's listening sockets: the plain one, and the TLS one next to it.

Both carry the shared ``StreamTransport``; a TLS listener's transports get the broker's one
``ssl.SSLContext`` and run the handshake themselves (transport.py).
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Callable

import structlog

log = structlog.get_logger("vibemq.broker")

#: builds the transport of one accepted socket; given the TLS context on a TLS listener
Accept = Callable[[ssl.SSLContext | None], asyncio.BaseProtocol]


class Listeners:
    """A protocol's listeners by their ready-file key (``mqtt``, ``mqtt_tls``...)."""

    def __init__(self, tls: ssl.SSLContext | None) -> None:
        self.tls = tls
        self.ports: dict[str, int | None] = {}
        self._servers: list[asyncio.Server] = []

    async def open(
        self, key: str, accept: Accept, host: str, port: int | None, *, tls: bool = False
    ) -> None:
        """Listen at ``port`` (0 = any free port); None, or TLS without a certificate: not
        at all (the ready file lists the key as null)."""
        ctx = self.tls if tls else None
        if port is None or (tls and ctx is None):
            self.ports[key] = None
            return
        server = await asyncio.get_running_loop().create_server(
            lambda: accept(ctx), host, port, backlog=4096, reuse_address=True
        )
        self._servers.append(server)
        bound = server.sockets[0].getsockname()[1]
        self.ports[key] = bound
        log.info("listening", protocol=key, host=host, port=bound)

    def port(self, key: str) -> int:
        return self.ports.get(key) or 0

    def close(self) -> None:
        for server in self._servers:
            server.close()

    async def wait_closed(self) -> None:
        for server in self._servers:
            await server.wait_closed()
