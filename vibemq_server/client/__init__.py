"""asyncio client library for the VibeMQ v1 protocol, and the ``vibemq`` command-line tool.

Quick start::

    from vibemq_server.client import Client

    async with await Client.connect("127.0.0.1", 2925) as client:
        await client.publish("jobs", {"task": "resize"})
        sub = await client.subscribe("jobs")
        async for msg in sub:
            print(msg.payload)
            await msg.ack()

See ``docs/client.md`` for the full guide.
"""

from vibemq_server.client.connection import DEFAULT_PORT, Client, tls_context
from vibemq_server.client.errors import (
    ConnectionFailed,
    ConnectionLost,
    PublishBatchError,
    RequestTimeout,
    VibeMQError,
)
from vibemq_server.client.subscription import ReceivedMessage, Subscription, decode_multipart
from vibemq_server.protocol.mme import MmeError

__all__ = [
    "DEFAULT_PORT",
    "Client",
    "ConnectionFailed",
    "ConnectionLost",
    "MmeError",
    "PublishBatchError",
    "ReceivedMessage",
    "RequestTimeout",
    "Subscription",
    "VibeMQError",
    "decode_multipart",
    "tls_context",
]
