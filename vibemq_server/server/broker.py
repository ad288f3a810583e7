"""The broker process: listeners, connection registry, housekeeping timer, graceful shutdown."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import ssl
from collections.abc import Mapping

import structlog

from vibemq_server.auth import Authenticator, check_exposure
from vibemq_server.config import Config
from vibemq_server.core import Clock, QueueManager, wall_clock_ms
from vibemq_server.journal import FsyncPolicy, Journal
from vibemq_server.protocol import CommandType, ErrorCode, Message, encode
from vibemq_server.protocol.names import valid_queue_name
from vibemq_server.protocol.payload import from_journal, to_journal
from vibemq_server.server.adapter import Adapter, AdapterContext, AdapterFactory, Link
from vibemq_server.server.listeners import Listeners
from vibemq_server.server.service import Phase, Service
from vibemq_server.server.session import Session
from vibemq_server.server.stats import BrokerStats
from vibemq_server.server.tls import reload as reload_tls
from vibemq_server.server.tls import server_context
from vibemq_server.server.transport import ReadBatch, StreamTransport

log = structlog.get_logger("vibemq.broker")
conn_log = structlog.get_logger("vibemq.conn")

# Connection ids are unique in the process, across brokers.
_conn_ids = itertools.count(1)


def with_payload_forms(journal: Journal) -> Journal:
    """``journal`` with the broker's payload forms: its records keep the VibeMQ form (a byte
    protocol's raw payload converted as written, marked so that recovery gives it back raw)."""
    journal.payload_form = to_journal
    journal.payload_restore = from_journal
    return journal


class Broker:
    """One broker: ``await start()``, then ``port`` is the bound VibeMQ port; ``await stop()``."""

    def __init__(
        self,
        config: Config | None = None,
        clock: Clock = wall_clock_ms,
        adapters: Mapping[str, AdapterFactory] | None = None,
    ) -> None:
        self.config = config or Config()
        self.manager = QueueManager(
            self.config.queue_defaults,
            clock,
            auto_create=self.config.auto_create_queues,
            memory_high_watermark=self.config.memory_high_watermark_bytes,
            name_validator=valid_queue_name,
        )
        self.journal = Journal(
            self.config.data_dir / "journal",
            fsync=FsyncPolicy(self.config.fsync),
            fsync_interval_ms=self.config.fsync_interval_ms,
            segment_size=self.config.segment_size_bytes,
            clock=clock,
        )
        with_payload_forms(self.journal)
        self.connections: set[Link] = set()
        # Every connection writes what a read produced when that read is done; the core
        # hands over what fan-out queues got during the read just before (manager.hold).
        self.read_batch = ReadBatch(self.manager.hold, self.manager.release)
        #: who may connect, for every protocol (raises UsersFileError on a corrupt users file)
        self.auth = Authenticator(self.config)
        #: the TLS listeners' one context (None: no certificate); SIGHUP reloads it
        self.tls = server_context(self.config.tls)
        #: traffic counters by protocol, and the start time (read by the metrics)
        self.stats = BrokerStats()
        self.native_stats = self.stats.protocol("vibemq")
        context = AdapterContext(
            self.config,
            self.manager,
            self.register,
            self.unregister,
            self.read_batch,
            self.auth,
            self.tls,
            self.stats,
        )
        # what the native connections of a listener share (one per TLS context)
        self._contexts = context.listener_contexts(
            conn_log, self.native_stats, self._native_refusal
        )
        #: the protocol adapters, by name, built by the composition root's factories
        self.adapters: dict[str, Adapter] = {
            name: factory(context) for name, factory in (adapters or {}).items()
        }
        self.port = 0
        self.tls_port = 0
        #: the native protocol's listeners (plain and TLS)
        self.listeners = Listeners(self.tls)
        self._server: Listeners | None = None
        #: starting -> ready -> draining -> stopped (health endpoints, sd_notify)
        self.phase = Phase.STARTING
        #: when ``start`` began (wall clock, ms): the uptime's origin
        self.started_at_ms = 0
        #: hosted next to the listeners (the HTTP listener), by the composition root
        self.services: list[Service] = []
        self._housekeeping: asyncio.Task[None] | None = None
        self._stopped = asyncio.Event()

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        cfg = self.config
        # Secure by default: no anonymous listener on the network unless asked for.
        check_exposure(cfg, self.auth.credentials_configured)
        self.auth.warn_plain_text()
        self.started_at_ms = wall_clock_ms()
        self.phase = Phase.STARTING
        started: list[Service] = []
        try:
            for service in self.services:
                await service.start()
                started.append(service)
            await self._start_listeners(loop)
        except BaseException:
            for service in reversed(started):
                await service.stop()
            raise
        self.phase = Phase.READY

    async def _start_listeners(self, loop: asyncio.AbstractEventLoop) -> None:
        cfg = self.config
        # Recovery comes first: no client may see a queue before its messages are back. It
        # runs in a worker thread so that the loop answers health probes meanwhile (503 while
        # starting); nothing else touches the manager until it is done (no listener is open,
        # the HTTP listener answers 503 to all but /health: http/health.py).
        await asyncio.to_thread(self.journal.recover, self.manager)
        self.journal.start(self.manager)
        self.manager.persistence = self.journal
        for adapter in self.adapters.values():
            adapter.restore()
        self._server = self.listeners
        try:
            await self._server.open(
                "vibemq",
                self._native_connection,
                cfg.host,
                cfg.port if cfg.tls.plain_vibemq else None,
            )
            await self._server.open(
                "vibemq_tls", self._native_connection, cfg.host, cfg.tls.port, tls=True
            )
            self.port = self._server.port("vibemq")
            self.tls_port = self._server.port("vibemq_tls")
            for adapter in self.adapters.values():
                await adapter.start()
        except OSError:
            self._server.close()
            for adapter in self.adapters.values():
                adapter.close()
            raise
        self._housekeeping = loop.create_task(self._housekeep())

    def ready(self) -> dict[str, int | str | None]:
        """Every listener's bound port (or endpoint), by the ready file's keys."""
        out: dict[str, int | str | None] = dict(self.listeners.ports)
        for adapter in self.adapters.values():
            out.update(adapter.ready())
        for service in self.services:
            out.update(service.ready())
        return out

    @property
    def mqtt_port(self) -> int | None:
        port = self.ready().get("mqtt")
        return port if isinstance(port, int) else None

    @property
    def amqp_port(self) -> int | None:
        port = self.ready().get("amqp")
        return port if isinstance(port, int) else None

    def reload_tls(self) -> None:
        """SIGHUP: new handshakes use the certificate files as they are now."""
        if self.tls is not None:
            reload_tls(self.tls, self.config.tls)

    def _native_connection(self, tls: ssl.SSLContext | None) -> StreamTransport:
        """The transport of one accepted native connection, driving a native ``Session``."""
        conn_id = f"srv_{next(_conn_ids)}"
        manager, config, auth, stats = self.manager, self.config, self.auth, self.native_stats
        return StreamTransport(
            lambda link: Session(link, manager, config, auth, stats),
            conn_id=conn_id,
            context=self._contexts.get(tls),
        )

    def _native_refusal(self, conn_id: str) -> bytes:
        """The Error frame a native connection over the limit gets (built only then)."""
        return encode(
            Message(
                CommandType.ERROR,
                conn_id,
                error_code=ErrorCode.CONNECTION_LIMIT,
                error_message=f"at most {self.config.max_connections} connections",
            )
        )

    def register(self, conn: Link) -> bool:
        if len(self.connections) >= self.config.max_connections:
            return False
        peer = getattr(conn, "peer_host", "")
        if peer and not self.auth.allow_connection(peer):
            log.warning("per-address connection rate exceeded", peer=peer)
            return False
        self.connections.add(conn)
        return True

    def unregister(self, conn: Link) -> None:
        self.connections.discard(conn)

    async def _housekeep(self) -> None:
        cfg = self.config
        loop = asyncio.get_running_loop()
        interval = cfg.housekeeping_interval_ms / 1000
        next_conn_check = loop.time()
        while True:
            await asyncio.sleep(interval)
            try:
                self.manager.tick()
                for adapter in self.adapters.values():
                    adapter.tick()
                self.journal.maintain()
                now = loop.time()
                if now >= next_conn_check:
                    next_conn_check = now + 1.0
                    self.auth.check_reload()  # the users file changed: no restart needed
                    for conn in list(self.connections):
                        conn.check_timers(now, cfg.keepalive_timeout_s, cfg.frame_timeout_s)
            except Exception:  # a bug here must not stop TTL and timeouts for good
                log.exception("housekeeping failed")

    def reload(self) -> None:
        """SIGHUP: re-read the users file now; new TLS handshakes use the certificate files
        as they are now."""
        self.auth.reload()
        self.reload_tls()

    async def stop(self, reason: str = "server_shutdown") -> None:
        """Stop accepting, send Disconnect to every client, wait for them to drain, close."""
        if self._server is None:
            return
        server, self._server = self._server, None
        self.phase = Phase.DRAINING
        server.close()
        for adapter in self.adapters.values():
            adapter.close()
        log.info("shutting down", connections=len(self.connections), reason=reason)
        for conn in list(self.connections):
            conn.shutdown(reason)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.config.drain_timeout_s
        while self.connections and loop.time() < deadline:
            await asyncio.sleep(0.01)
        for conn in list(self.connections):
            conn.abort()
        if self._housekeeping is not None:
            self._housekeeping.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._housekeeping
        with contextlib.suppress(Exception):
            await asyncio.wait_for(server.wait_closed(), 1.0)
        for service in reversed(self.services):
            await service.stop()
        await self.journal.close()
        self.phase = Phase.STOPPED
        self._stopped.set()
        log.info("stopped")

    async def wait_stopped(self) -> None:
        await self._stopped.wait()
