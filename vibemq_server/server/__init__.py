"""The network side of the broker: the asyncio server, connections and the native protocol."""

from vibemq_server.server.broker import Broker
from vibemq_server.server.service import Phase, Service

__all__ = ["Broker", "Phase", "Service"]
