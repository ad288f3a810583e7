"""What the broker knows of a protocol adapter, and what an adapter is given to work with.

The broker never imports an adapter: the composition root (``vibemq_server.app``) builds the
enabled ones from their import strings and hands them to the broker, which only drives them
through ``Adapter``.
"""

from __future__ import annotations

import ssl
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from structlog.typing import FilteringBoundLogger

from vibemq_server.auth import Authenticator
from vibemq_server.config import Config
from vibemq_server.core import QueueManager
from vibemq_server.server.stats import BrokerStats, ProtocolStats
from vibemq_server.server.transport import ListenerContexts, ReadBatch


class Link(Protocol):
    """What the broker needs of a client connection, whatever its protocol."""

    def check_timers(self, now: float, keepalive: float, frame_timeout: float) -> None: ...

    def shutdown(self, reason: str) -> None: ...

    def abort(self) -> None: ...


@dataclass(frozen=True, slots=True)
class AdapterContext:
    """Everything an adapter may use of the broker."""

    config: Config
    manager: QueueManager
    #: the broker's connection registry (connection limit, keep-alive timers)
    register: Callable[[Link], bool]
    unregister: Callable[[Link], None]
    #: output given while one connection handles a read is written when the read is done
    read_batch: ReadBatch
    #: who may connect (every protocol asks it)
    auth: Authenticator
    #: the TLS listeners' context (server/tls.py); None = no certificate configured
    tls: ssl.SSLContext | None = None
    #: the broker's traffic counters: an adapter counts into ``stats.protocol(its name)``
    stats: BrokerStats = field(default_factory=BrokerStats)

    def listener_contexts(
        self,
        log: FilteringBoundLogger,
        stats: ProtocolStats,
        refusal: bytes | Callable[[str], bytes] = b"",
    ) -> ListenerContexts:
        """What a protocol's connections share, from the broker's settings and hooks."""
        return ListenerContexts(
            log=log,
            out_limit=self.config.write_buffer_high_bytes,
            batch=self.read_batch,
            register=self.register,
            unregister=self.unregister,
            handshake_timeout=self.config.tls.handshake_timeout_s,
            stats=stats,
            refusal=refusal,
        )


class Adapter(Protocol):
    """One protocol adapter: its listeners, its durable state, its timers."""

    def restore(self) -> None:
        """After journal recovery, before any listener opens: rebuild durable state."""

    async def start(self) -> None:
        """Open the listeners."""

    def close(self) -> None:
        """Stop accepting (connections are shut down by the broker)."""

    def tick(self) -> None:
        """Housekeeping, on the broker's timer."""

    def ready(self) -> dict[str, int | str | None]:
        """What the ready file lists for this adapter (name -> bound port or endpoint)."""
        ...


#: How the composition root builds an adapter.
AdapterFactory = Callable[[AdapterContext], Adapter]
