"""A started broker with the protocol factories its listeners gave ``loop.create_server``,
by ready-file key (``vibemq``, ``mqtt``, ``amqp``, ...): a test then drives a listener's
connections itself, without sockets. Matched by bound port, so the order in which the
broker opens its listeners does not matter."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from vibemq_server.app import create_broker
from vibemq_server.config import Config
from vibemq_server.server import Broker

Factory = Callable[[], asyncio.Protocol]


async def start_broker(config: Config) -> tuple[Broker, dict[str, Factory]]:
    loop = asyncio.get_running_loop()
    listeners: list[tuple[Factory, asyncio.Server]] = []
    real_create_server = loop.create_server

    async def spy(factory: Factory, *args: Any, **kw: Any) -> Any:
        server = await real_create_server(factory, *args, **kw)
        listeners.append((factory, server))
        return server

    loop.create_server = spy  # type: ignore[method-assign, assignment]
    try:
        broker = create_broker(config)
        await broker.start()
    finally:
        loop.create_server = real_create_server  # type: ignore[method-assign]
    by_port = {server.sockets[0].getsockname()[1]: factory for factory, server in listeners}
    factories = {
        key: by_port[port]
        for key, port in broker.ready().items()
        if isinstance(port, int) and port in by_port
    }
    return broker, factories
