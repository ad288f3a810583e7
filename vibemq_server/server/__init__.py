"""The network side of the broker: the asyncio server, connections and the native protocol."""

from vibemq_server.server.broker import Broker

__all__ = ["Broker"]
