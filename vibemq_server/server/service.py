"""What the broker knows of a service it hosts beside the protocol listeners (the management
HTTP listener), and the phase the broker is in.

Like the adapters, a service is built by the composition root (``vibemq_server.app``) from an
import string, so the broker never imports one (nor its libraries when it is off). The broker
starts its services first, before journal recovery (a health probe then answers "not ready"
rather than "connection refused"), and stops them last, once the connections have drained
(it still answers "draining" meanwhile).
"""

from __future__ import annotations

from enum import StrEnum
from typing import Protocol


class Phase(StrEnum):
    """Where the broker is in its life (``Broker.phase``)."""

    #: services up, journal recovery and listeners not yet done
    STARTING = "starting"
    #: journal recovered, every listener up: it would serve clients
    READY = "ready"
    #: stopping (SIGTERM): listeners closed, clients told to go, waiting for them to drain
    DRAINING = "draining"
    STOPPED = "stopped"


class Service(Protocol):
    async def start(self) -> None:
        """Open (before journal recovery); raise ``OSError`` when it cannot listen."""

    async def stop(self) -> None:
        """Close, bounded in time (after the connections drained)."""

    def ready(self) -> dict[str, int | str | None]:
        """What the ready file lists for this service (name -> bound port)."""
        ...
