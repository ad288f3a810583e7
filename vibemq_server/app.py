"""The composition root: the only module that knows which protocol adapters exist.

As uvicorn maps protocol names to import strings, ``ADAPTERS`` maps each adapter to the
factory that builds it; ``create_broker`` imports the enabled ones (so a broker without the
ZeroMQ bridge never loads pyzmq) and hands them to the broker, which imports none of them.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import cast

from vibemq_server.config import Config
from vibemq_server.core import Clock, wall_clock_ms
from vibemq_server.server.adapter import AdapterFactory
from vibemq_server.server.broker import Broker

#: adapter name -> (is it enabled in this config, "module:factory")
ADAPTERS: dict[str, tuple[Callable[[Config], bool], str]] = {
    "mqtt": (lambda c: c.mqtt.enabled, "vibemq_server.adapters.mqtt.server:MqttServer"),
    "amqp": (lambda c: c.amqp.enabled, "vibemq_server.adapters.amqp.server:AmqpServer"),
    "zmq": (lambda c: c.zmq.enabled, "vibemq_server.adapters.zmq.bridge:ZmqBridge"),
}


def load_factory(target: str) -> AdapterFactory:
    module, _, attr = target.partition(":")
    return cast(AdapterFactory, getattr(importlib.import_module(module), attr))


def enabled_adapters(config: Config) -> dict[str, AdapterFactory]:
    return {
        name: load_factory(target)
        for name, (enabled, target) in ADAPTERS.items()
        if enabled(config)
    }


def create_broker(config: Config | None = None, clock: Clock = wall_clock_ms) -> Broker:
    """A broker with every adapter its config enables."""
    config = config or Config()
    return Broker(config, clock, adapters=enabled_adapters(config))
