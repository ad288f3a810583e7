"""Fixtures of the integration tests (the broker fixtures every test may use are in
tests/conftest.py).

MQTT, synchronous tests (broker on a thread of its own): ``make_mqtt_broker``, ``mqtt_broker``,
``mqtt_clients``, ``broker_log``, ``will_watcher``. MQTT, async tests (broker in the test's
event loop): ``mqtt_env``; real server processes (any protocol): ``servers``; paho clients
for those: ``paho_factory``.

AMQP (helpers in amqputil.py), a broker on a thread of its own: ``brokers`` (a factory),
``amqp`` (one broker), pika ``clients`` (any port) and ``pikas`` (bound to ``amqp``, no
heartbeats), a connection ``conn`` and a channel ``ch`` on ``amqp``, ``raw`` clients
(``RawAmqp``), a ``bystander`` that must stay unaffected, an aio-pika connection ``aio``, and
clients of the other protocols on the same broker: ``paho`` (MQTT), ``vibemq`` (native). An
aio-pika ``channel`` to the in-process ``broker``; a ``vibemq-server`` process: ``server``.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path

import aio_pika
import aio_pika.abc
import httpkit
import httpx
import pika
import pika.adapters.blocking_connection as blocking
import pytest
from amqputil import (
    HOST,
    QUIET,
    WAIT,
    AmqpBroker,
    Bystander,
    PikaClients,
    RawClients,
    amqp_brokers,
    queue_counts,
)
from mqttkit import MqttEnv, PahoFactory
from mqttutil import Clients, LogEntries, MakeBroker, Paho, ThreadBroker
from mqttutil import brokers as mqtt_brokers
from serverproc import ServerProcess, Servers
from structlog.testing import capture_logs
from waits import wait_until

from vibemq_server.client import Client
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
    with mqtt_brokers(tmp_path) as make:
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
async def servers(tmp_path: Path) -> AsyncIterator[Servers]:
    """Server processes of the test's own (``python -m vibemq_server``), killed at the end."""
    s = Servers(tmp_path)
    try:
        yield s
    finally:
        await s.cleanup()


@pytest.fixture
async def paho_factory() -> AsyncIterator[PahoFactory]:
    factory = PahoFactory()
    try:
        yield factory
    finally:
        await factory.close_all()


# -- AMQP, a broker on its own thread ----------------------------------------------------------


@pytest.fixture
def brokers(tmp_path: Path) -> Iterator[Callable[..., AmqpBroker]]:
    """Starts AmqpBrokers (Config overrides as keywords); all stopped at teardown."""
    with amqp_brokers(tmp_path) as make:
        yield make


@pytest.fixture
def amqp(brokers: Callable[..., AmqpBroker]) -> AmqpBroker:
    return brokers()


@pytest.fixture
def clients(brokers: Callable[..., AmqpBroker]) -> Iterator[PikaClients]:
    """pika connections to any port. Depends on brokers so that they close before the brokers
    stop."""
    made = PikaClients()
    yield made
    made.close_all()


@pytest.fixture
def pikas(amqp: AmqpBroker) -> Iterator[PikaClients]:
    """pika connections to ``amqp`` without heartbeats (``QUIET``)."""
    made = PikaClients(amqp.amqp_port, **QUIET)
    yield made
    made.close_all()


@pytest.fixture
def conn(amqp: AmqpBroker, clients: PikaClients) -> pika.BlockingConnection:
    return clients.connect(amqp.amqp_port)


@pytest.fixture
def ch(conn: pika.BlockingConnection) -> blocking.BlockingChannel:
    return conn.channel()


@pytest.fixture
def raw(brokers: Callable[..., AmqpBroker]) -> Iterator[RawClients]:
    made = RawClients()
    yield made
    made.close_all()


@pytest.fixture
def bystander(amqp: AmqpBroker, clients: PikaClients) -> Iterator[Bystander]:
    b = Bystander(clients.connect(amqp.amqp_port))
    wait_until(lambda: queue_counts(b.channel, b.QUEUE)[0] == 1, "the bystander's message")
    yield b
    b.assert_unaffected()


@pytest.fixture
async def aio(amqp: AmqpBroker) -> AsyncIterator[aio_pika.abc.AbstractConnection]:
    conn = await aio_pika.connect(f"amqp://guest:guest@{HOST}:{amqp.amqp_port}/", timeout=WAIT)
    yield conn
    await conn.close()


@pytest.fixture
def paho(amqp: AmqpBroker) -> Iterator[Callable[[], Paho]]:
    """Connected MQTT clients of ``amqp``."""
    made: list[Paho] = []

    def make() -> Paho:
        client = Paho(amqp.mqtt_port)
        made.append(client)
        return client.connected()

    yield make
    for client in made:
        with contextlib.suppress(Exception):
            client.disconnect()


@pytest.fixture
async def vibemq(amqp: AmqpBroker) -> AsyncIterator[Callable[[], Awaitable[Client]]]:
    """VibeMQ protocol clients of ``amqp``."""
    made: list[Client] = []

    async def make() -> Client:
        client = await Client.connect(HOST, amqp.port, reconnect=False, request_timeout=WAIT)
        made.append(client)
        return client

    yield make
    for client in made:
        await client.close()


# -- AMQP, other brokers -----------------------------------------------------------------------


@pytest.fixture
async def channel(broker: Broker) -> AsyncIterator[aio_pika.abc.AbstractChannel]:
    """An aio-pika channel to the in-process ``broker``."""
    conn = await asyncio.wait_for(
        aio_pika.connect(f"amqp://guest:guest@{HOST}:{broker.amqp_port}"), WAIT
    )
    try:
        yield await conn.channel()
    finally:
        await asyncio.wait_for(conn.close(), WAIT)


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ServerProcess]:
    """A ``vibemq-server`` process (started by the test), killed at teardown."""
    s = ServerProcess(tmp_path, tmp_path / "data")
    try:
        yield s
    finally:
        s.kill()


# -- the HTTP listener (helpers in httpkit.py) --------------------------------------------------


@pytest.fixture
async def api(broker: Broker) -> AsyncIterator[httpx.AsyncClient]:
    """An httpx client of ``broker``'s HTTP listener (anonymous: a loopback peer of a broker
    without users, so allowed everything)."""
    async with httpkit.client(broker) as client:
        yield client
