"""Plain counters of the broker's traffic by protocol, read by the metrics exposition.

Each listener hands its transports and sessions one ``ProtocolStats``; the hot paths only add
to its ints (one add per read, per write, per message), and a scrape reads them. Nothing here
knows Prometheus: ``vibemq_server.metrics`` turns these into metric families.
"""

from __future__ import annotations

import time

from vibemq_server import __version__


class ProtocolStats:
    """The traffic of one protocol's connections, since the broker started."""

    __slots__ = (
        "bytes_received",
        "bytes_sent",
        "connections",
        "connections_total",
        "errors",
        "messages_dropped",
        "messages_received",
        "messages_sent",
        "name",
    )

    def __init__(self, name: str) -> None:
        self.name = name
        #: open connections now, and every connection accepted so far
        self.connections = 0
        self.connections_total = 0
        #: the protocol's bytes read and written (over TLS: the decrypted stream)
        self.bytes_received = 0
        self.bytes_sent = 0
        #: messages published by clients, and messages delivered to clients
        self.messages_received = 0
        self.messages_sent = 0
        #: messages a protocol dropped where no core queue counts them (an MQTT clean
        #: session's in-memory backlog or QoS 0 backlog, a ZeroMQ PULL message refused)
        self.messages_dropped = 0
        #: error replies by the protocol's own code name (a native ErrorCode, an MQTT
        #: violation kind, an AMQP reply code name)
        self.errors: dict[str, int] = {}

    def error(self, code: str) -> None:
        self.errors[code] = self.errors.get(code, 0) + 1


class BrokerStats:
    """The broker's start time and its protocols' counters, by protocol name."""

    __slots__ = ("protocols", "started_monotonic", "started_wall", "version")

    def __init__(self) -> None:
        self.version = __version__
        self.started_monotonic = time.monotonic()
        self.started_wall = time.time()
        self.protocols: dict[str, ProtocolStats] = {}

    def protocol(self, name: str) -> ProtocolStats:
        """The one counters object of a protocol (made on first use)."""
        stats = self.protocols.get(name)
        if stats is None:
            stats = self.protocols[name] = ProtocolStats(name)
        return stats

    @property
    def uptime_s(self) -> float:
        return time.monotonic() - self.started_monotonic
