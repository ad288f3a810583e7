"""The management HTTP listener the broker hosts: plain and HTTPS sockets, on its own loop.

Why not ``uvicorn.run`` or ``Server.serve``: they install SIGINT/SIGTERM handlers (the broker's
own drain-on-SIGTERM in cli.py would be bypassed) and run a 100 ms ``main_loop`` timer.
``Server.startup``/``shutdown`` without ``serve`` rely on attributes ``serve`` sets
(``lifespan``), call ``sys.exit`` when a port is taken, and still leave the date header to
that timer. So the broker opens its listening sockets itself with ``loop.create_server``
(a taken port is an ``OSError``, as for every other listener), each connection driven by
uvicorn's httptools protocol (``protocol.py``) built from a loaded ``uvicorn.Config``: the
protocol class, its constructor and ``ServerState`` are all this depends on. HTTPS is
asyncio's TLS with the broker's one ``SSLContext`` (server/tls.py), so SIGHUP's certificate
reload applies here too.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
from collections.abc import Callable

import structlog
import uvicorn
from uvicorn.server import ServerState

from vibemq_server.auth.exposure import is_loopback_host
from vibemq_server.http.app import create_app
from vibemq_server.http.context import ApiContext
from vibemq_server.http.protocol import protocol_factory
from vibemq_server.http.rates import RateSampler
from vibemq_server.server import Broker, Phase

log = structlog.get_logger("vibemq.http")

#: how long stop() lets requests in progress finish
_STOP_GRACE_S = 2.0


class _ToStructlog(logging.Handler):
    """uvicorn logs through the standard library ("invalid HTTP request", an exception in a
    route, the concurrency limit): its lines go to the broker's structlog output, so that
    every line stays in the configured format (JSON lines stay JSON)."""

    def emit(self, record: logging.LogRecord) -> None:
        level = record.levelname.lower()
        method = getattr(log, level, None) if level in _LEVELS else None
        (method or log.warning)(record.getMessage(), source=record.name, exc_info=record.exc_info)


_LEVELS = frozenset({"debug", "info", "warning", "error", "critical"})


def _route_uvicorn_logs() -> None:
    for name in ("uvicorn.error", "uvicorn.asgi"):
        logger = logging.getLogger(name)
        if not any(isinstance(h, _ToStructlog) for h in logger.handlers):
            logger.addHandler(_ToStructlog())
        logger.setLevel(logging.WARNING)  # not its start-up chatter
        logger.propagate = False


class HttpListener:
    """The broker's ``Service`` for HTTP: ``http`` (plain) and ``http_tls`` (HTTPS) sockets."""

    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        cfg = broker.config.http
        self.host = cfg.host or broker.config.host
        self.rates = RateSampler(
            broker.manager, active=lambda: broker.phase in (Phase.READY, Phase.DRAINING)
        )
        self.context = ApiContext(broker, self.rates)
        self.app = create_app(self.context)
        self.ports: dict[str, int | None] = {"http": None, "http_tls": None}
        self._state = ServerState()
        self._servers: list[asyncio.Server] = []
        self._uvicorn = uvicorn.Config(
            self.app,
            log_config=None,  # the broker's structlog set-up stays as it is
            access_log=False,
            # X-Forwarded-For must not make a remote peer look like loopback (anonymous
            # access and open /metrics depend on the peer's address)
            proxy_headers=False,
            server_header=False,
            date_header=False,  # protocol.py sets it
            lifespan="off",
            ws="none",
            timeout_keep_alive=cfg.keepalive_timeout_s,
            limit_concurrency=cfg.max_connections,
        )
        self._uvicorn.load()
        _route_uvicorn_logs()

    async def start(self) -> None:
        cfg = self.broker.config.http
        if not is_loopback_host(self.host) and not self.broker.auth.credentials_configured:
            log.warning(
                "HTTP listener on a non-loopback address without users or tokens: the API "
                "answers 401 to every peer but loopback ones",
                host=self.host,
            )
        make = protocol_factory(self._uvicorn, self._state, cfg.request_timeout_s)
        try:
            if cfg.plain:
                self.ports["http"] = await self._listen("http", make, cfg.port, None)
            tls = self.broker.tls
            if tls is not None and cfg.tls_port is not None:
                self.ports["http_tls"] = await self._listen("http_tls", make, cfg.tls_port, tls)
        except OSError:
            await self.stop()
            raise
        self.rates.start()

    async def _listen(
        self,
        key: str,
        make: Callable[[], asyncio.Protocol],
        port: int,
        tls: ssl.SSLContext | None,
    ) -> int:
        loop = asyncio.get_running_loop()
        server = await loop.create_server(
            make, self.host, port, ssl=tls, backlog=1024, reuse_address=True
        )
        self._servers.append(server)
        bound = int(server.sockets[0].getsockname()[1])
        log.info("listening", protocol=key, host=self.host, port=bound)
        return bound

    def ready(self) -> dict[str, int | str | None]:
        return dict(self.ports)

    async def stop(self) -> None:
        """Stop accepting; let requests in progress finish (bounded); close the rest."""
        self.rates.stop()
        servers, self._servers = self._servers, []
        for server in servers:
            server.close()
        for connection in list(self._state.connections):
            connection.shutdown()  # idle ones close now, busy ones after their response
        loop = asyncio.get_running_loop()
        deadline = loop.time() + _STOP_GRACE_S
        while (self._state.connections or self._state.tasks) and loop.time() < deadline:
            await asyncio.sleep(0.01)
        for task in list(self._state.tasks):
            task.cancel()
        for connection in list(self._state.connections):
            connection.transport.close()
        for server in servers:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(server.wait_closed(), 1.0)
