"""The composition root: the only module that knows which protocol adapters and services exist.

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
from vibemq_server.server.service import Service

#: How the composition root builds a service the broker hosts (given the broker).
ServiceFactory = Callable[[Broker], Service]

#: adapter name -> (is it enabled in this config, "module:factory")
ADAPTERS: dict[str, tuple[Callable[[Config], bool], str]] = {
    "mqtt": (lambda c: c.mqtt.enabled, "vibemq_server.adapters.mqtt.server:MqttServer"),
    "amqp": (lambda c: c.amqp.enabled, "vibemq_server.adapters.amqp.server:AmqpServer"),
    "zmq": (lambda c: c.zmq.enabled, "vibemq_server.adapters.zmq.bridge:ZmqBridge"),
}


#: service name -> (is it enabled in this config, "module:factory"); the HTTP listener's
#: libraries (FastAPI, uvicorn) are only imported when it is on
SERVICES: dict[str, tuple[Callable[[Config], bool], str]] = {
    "http": (lambda c: c.http.enabled, "vibemq_server.http.listener:HttpListener"),
}


def _load(target: str) -> object:
    module, _, attr = target.partition(":")
    return getattr(importlib.import_module(module), attr)


def load_factory(target: str) -> AdapterFactory:
    return cast(AdapterFactory, _load(target))


def enabled_adapters(config: Config) -> dict[str, AdapterFactory]:
    return {
        name: load_factory(target)
        for name, (enabled, target) in ADAPTERS.items()
        if enabled(config)
    }


def create_broker(config: Config | None = None, clock: Clock = wall_clock_ms) -> Broker:
    """A broker with every adapter its config enables."""
    config = config or Config()
    broker = Broker(config, clock, adapters=enabled_adapters(config))
    for enabled, target in SERVICES.values():
        if enabled(config):
            broker.services.append(cast(ServiceFactory, _load(target))(broker))
    return broker
