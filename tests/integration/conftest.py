"""Fixtures of the integration tests (the broker fixtures every test may use are in
tests/conftest.py).

MQTT, synchronous tests (broker on a thread of its own): ``make_mqtt_broker``, ``mqtt_broker``,
``mqtt_clients``, ``broker_log``, ``will_watcher``. MQTT, async tests (broker in the test's
event loop): ``mqtt_env``; real server processes: ``mqtt_procs``; paho clients for those:
``paho_factory``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path

import pytest
from mqttkit import MqttEnv, PahoFactory, Procs
from mqttutil import Clients, LogEntries, MakeBroker, Paho, ThreadBroker, brokers
from structlog.testing import capture_logs

from vibemq_server.server import Broker

# -- MQTT, synchronous -------------------------------------------------------------------------


@pytest.fixture
def broker_log() -> Iterator[LogEntries]:
    """The broker's structured log lines (set up before any broker starts, and so left
    after every broker has stopped)."""
    with capture_logs() as entries:
        yield entries


@pytest.fixture
def make_mqtt_broker(tmp_path: Path, broker_log: LogEntries) -> Iterator[MakeBroker]:
    """Starts ThreadBrokers (Config overrides as keywords); all stopped at teardown."""
    with brokers(tmp_path) as make:
        yield make


@pytest.fixture
def mqtt_broker(make_mqtt_broker: MakeBroker) -> ThreadBroker:
    return make_mqtt_broker()


@pytest.fixture
def mqtt_clients(make_mqtt_broker: MakeBroker) -> Iterator[Clients]:
    """Depends on make_mqtt_broker so that clients close before the brokers stop."""
    c = Clients()
    try:
        yield c
    finally:
        c.close_all()


@pytest.fixture
def will_watcher(mqtt_broker: ThreadBroker, mqtt_clients: Clients) -> Paho:
    """A paho client subscribed to ``will/#`` and ``fence`` at QoS 2."""
    watcher = mqtt_clients.paho(mqtt_broker.mqtt_port).connected()
    assert watcher.subscribe(("will/#", 2), ("fence", 2)) == [2, 2]
    return watcher


# -- MQTT, async -------------------------------------------------------------------------------


@pytest.fixture
async def mqtt_env(broker_factory: Callable[..., Awaitable[Broker]]) -> AsyncIterator[MqttEnv]:
    env = MqttEnv(broker_factory)
    try:
        yield env
    finally:
        await env.close()


@pytest.fixture
async def mqtt_procs(tmp_path: Path) -> AsyncIterator[Procs]:
    procs = Procs(tmp_path)
    try:
        yield procs
    finally:
        await procs.cleanup()


@pytest.fixture
async def paho_factory() -> AsyncIterator[PahoFactory]:
    factory = PahoFactory()
    try:
        yield factory
    finally:
        await factory.close_all()
