"""The permission matrix (issue 13, item 3): for each protocol and each operation it has, one
allowed and one refused case with the protocol's own refusal (VibeMQ Error NOT_AUTHORIZED,
MQTT SUBACK 0x80 or a dropped PUBLISH, AMQP channel.close 403 in RabbitMQ's words), and no
publish of any protocol reaches a subscriber whose user may not read its address.

The user ``mia`` may configure, write and read ``mia.*`` (and write the default exchange, read
amq.direct);
``admin`` may do everything. Addresses: ``mia.x``/``other.x`` exist beforehand (made by
admin), ``mia.new``/``other.new`` do not.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pika
import pytest
from mqttkit import RawMqtt
from pika.adapters.blocking_connection import BlockingChannel
from rawclient import RawClient
from userskit import add_user, users

from vibemq_server.adapters.mqtt.packets import Puback, Publish
from vibemq_server.protocol import CommandType, Message
from vibemq_server.server import Broker

MIA = {"configure": r"^mia\.", "write": r"^(mia\.|amq\.default$)", "read": r"^(mia\.|amq\.direct$)"}


@pytest.fixture(scope="module")
def users_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("perm") / "users.json"
    add_user(path, "mia", "mia-pw")
    add_user(path, "admin", "admin-pw")
    done = users(path, "permit", "mia", *(f"--{k}={v}" for k, v in MIA.items()))
    assert done.returncode == 0, done.stderr
    return path


@pytest.fixture
async def matrix_broker(broker_factory: Any, users_file: Path) -> Broker:
    broker: Broker = await broker_factory(users_file=users_file, auth_tokens=["adm:admin"])
    admin = await RawClient.connected(broker.port, token="adm")
    for name in ("mia.x", "other.x"):
        assert (await admin.create_queue(name)).type is not CommandType.ERROR
    await admin.close()
    return broker


async def native_login(port: int, user: str) -> RawClient:
    client = await RawClient.open(port)
    reply = await client.request(
        Message(CommandType.CONNECT, "c", headers={"username": user, "password": f"{user}-pw"})
    )
    assert reply.type is CommandType.CONNECT_ACK
    return client


def mqtt_login(port: int, user: str) -> RawMqtt:
    raw = RawMqtt(port)
    assert raw.connect(username=user, password=f"{user}-pw".encode()).return_code == 0
    return raw


# -- VibeMQ ------------------------------------------------------------------------------

NATIVE: dict[str, tuple[str, Callable[[RawClient, str], Any]]] = {
    # operation -> (permission, action on an address)
    "publish": ("write", lambda c, a: c.publish(a, {"n": 1})),
    "subscribe": ("read", lambda c, a: c.subscribe(a)),
    "queue info": ("read", lambda c, a: c.queue_info(a)),
    "create queue": ("configure", lambda c, a: c.create_queue(a.replace(".x", ".new"))),
    "delete queue": ("configure", lambda c, a: c.delete_queue(a)),
    # publish and subscribe create a missing queue: configure is checked too (after
    # write/read, so a user with neither is refused for write/read)
    "publish creating": ("write", lambda c, a: c.publish(a.replace(".x", ".new"), 1)),
    "subscribe creating": ("read", lambda c, a: c.subscribe(a.replace(".x", ".new"))),
}


@pytest.mark.parametrize("allowed", [True, False], ids=["allowed", "refused"])
@pytest.mark.parametrize("operation", list(NATIVE))
async def test_native_matrix(matrix_broker: Broker, operation: str, allowed: bool) -> None:
    permission, action = NATIVE[operation]
    client = await native_login(matrix_broker.port, "mia")
    reply = await action(client, "mia.x" if allowed else "other.x")
    if allowed:
        assert reply.type is not CommandType.ERROR, reply
    else:
        assert (reply.type, reply.error_code) == (CommandType.ERROR, "NOT_AUTHORIZED")
        assert f"{permission} access to queue 'other." in (reply.error_message or "")
        assert "refused for user 'mia'" in (reply.error_message or "")
    assert (await client.ping()).type is CommandType.PONG  # still open
    await client.close()


async def test_permitted_user_without_configure_cannot_auto_create(
    broker_factory: Any, tmp_path: Path
) -> None:
    """write and read alone reach existing queues; creating one by publishing or subscribing
    takes configure on the missing queue too."""
    path = tmp_path / "users.json"
    add_user(path, "noc", "noc-pw")
    done = users(path, "permit", "noc", "--configure=", "--write=^n\\.", "--read=^n\\.")
    assert done.returncode == 0, done.stderr
    broker: Broker = await broker_factory(users_file=path, auth_tokens=["adm:admin"])
    admin = await RawClient.connected(broker.port, token="adm")
    assert (await admin.create_queue("n.have")).type is not CommandType.ERROR
    client = await native_login(broker.port, "noc")
    assert (await client.publish("n.have", 1)).type is CommandType.PUBLISH_ACK
    assert (await client.subscribe("n.have")).type is CommandType.SUBSCRIBE_ACK
    for reply in (await client.publish("n.missing", 1), await client.subscribe("n.missing")):
        assert reply.error_code == "NOT_AUTHORIZED", reply
        assert "configure access to queue 'n.missing'" in (reply.error_message or "")
    assert (await admin.queue_info("n.missing")).error_code == "QUEUE_NOT_FOUND"
    await client.close()
    await admin.close()


# -- MQTT --------------------------------------------------------------------------------


@pytest.mark.parametrize("allowed", [True, False], ids=["allowed", "refused"])
@pytest.mark.parametrize("operation", ["publish", "subscribe"])
async def test_mqtt_matrix(matrix_broker: Broker, operation: str, allowed: bool) -> None:
    port = matrix_broker.mqtt_port
    assert port is not None
    topic = "mia/t" if allowed else "other/t"

    def scenario() -> None:
        mia = mqtt_login(port, "mia")
        admin = mqtt_login(port, "admin")
        try:
            if operation == "subscribe":
                assert mia.subscribe(topic, 1) == (1 if allowed else 0x80)
                return
            assert admin.subscribe("#", 0) == 0
            mia.send(Publish(topic, b"p", qos=1, packet_id=3))
            assert mia.expect(Puback).packet_id == 3  # acknowledged either way (3.1.1)
            got = [p.topic for p in admin.barrier(0.3) if isinstance(p, Publish)]
            assert got == ([topic] if allowed else [])
        finally:
            mia.disconnect()
            admin.disconnect()

    await asyncio.get_running_loop().run_in_executor(None, scenario)


# -- AMQP --------------------------------------------------------------------------------


def _publish(ch: BlockingChannel, queue: str) -> None:
    ch.confirm_delivery()
    ch.basic_publish("", queue, b"p")


AMQP: dict[str, tuple[Callable[[BlockingChannel, str], Any], str]] = {
    # operation -> (action on a queue, what the 403 names)
    "publish": (_publish, "queue '{}'"),
    "get": (lambda c, q: c.basic_get(q), "queue '{}'"),
    "consume": (lambda c, q: c.basic_consume(q, lambda *a: None), "queue '{}'"),
    "purge": (lambda c, q: c.queue_purge(q), "queue '{}'"),
    "declare": (lambda c, q: c.queue_declare(q.replace(".x", ".new")), "queue '{}'"),
    "delete": (lambda c, q: c.queue_delete(q), "queue '{}'"),
    # write on the queue, read on the exchange (mia may read amq.direct)
    "bind": (lambda c, q: c.queue_bind(q, "amq.direct", "k"), "queue '{}'"),
    "exchange declare": (
        lambda c, q: c.exchange_declare(q.replace(".x", ".ex"), "fanout"),
        "exchange '{}'",
    ),
}


@pytest.mark.parametrize("allowed", [True, False], ids=["allowed", "refused"])
@pytest.mark.parametrize("operation", list(AMQP))
async def test_amqp_matrix(matrix_broker: Broker, operation: str, allowed: bool) -> None:
    port = matrix_broker.amqp_port
    assert port is not None
    action, words = AMQP[operation]

    def scenario() -> None:
        conn = pika.BlockingConnection(
            pika.ConnectionParameters(
                "127.0.0.1", port, credentials=pika.PlainCredentials("mia", "mia-pw")
            )
        )
        try:
            if allowed:
                action(conn.channel(), "mia.x")
            else:
                with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
                    action(conn.channel(), "other.x")
                name = {
                    "declare": "other.new",
                    "exchange declare": "other.ex",
                }.get(operation, "other.x")
                assert (info.value.reply_code, info.value.reply_text) == (
                    403,
                    f"ACCESS_REFUSED - access to {words.format(name)} in vhost '/' "
                    "refused for user 'mia'",
                )
            assert conn.channel().is_open  # the connection goes on
        finally:
            conn.close()

    await asyncio.get_running_loop().run_in_executor(None, scenario)


async def test_amqp_server_named_queue_needs_configure(broker_factory: Any, tmp_path: Path) -> None:
    """queue.declare with an empty name: configure is checked on the amq.gen-* name the broker
    makes, as RabbitMQ does."""
    path = tmp_path / "users.json"
    for name in ("gen", "nogen"):
        add_user(path, name, f"{name}-pw")
    for name, pattern in (("gen", r"^amq\.gen-"), ("nogen", r"^nogen\.")):
        done = users(path, "permit", name, f"--configure={pattern}", "--read=.*", "--write=.*")
        assert done.returncode == 0, done.stderr
    broker: Broker = await broker_factory(users_file=path)
    port = broker.amqp_port
    assert port is not None

    def scenario() -> None:
        for user, allowed in (("gen", True), ("nogen", False)):
            conn = pika.BlockingConnection(
                pika.ConnectionParameters(
                    "127.0.0.1", port, credentials=pika.PlainCredentials(user, f"{user}-pw")
                )
            )
            try:
                if allowed:
                    declared = conn.channel().queue_declare("", exclusive=True)
                    assert declared.method.queue.startswith("amq.gen-")
                    continue
                with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
                    conn.channel().queue_declare("", exclusive=True)
                assert info.value.reply_code == 403
                assert info.value.reply_text.startswith(
                    "ACCESS_REFUSED - access to queue 'amq.gen-"
                )
                assert info.value.reply_text.endswith("in vhost '/' refused for user 'nogen'")
            finally:
                conn.close()

    await asyncio.get_running_loop().run_in_executor(None, scenario)


# -- across protocols --------------------------------------------------------------------


@pytest.mark.parametrize("publisher", ["native", "mqtt", "amqp"])
async def test_no_protocol_reaches_a_subscriber_who_may_not_read(
    matrix_broker: Broker, publisher: str
) -> None:
    """admin publishes at other.t and mia.t from each protocol; mia's MQTT subscription to
    other/# was refused, so only mia.t reaches her, and her VibeMQ subscription to other.x
    was refused, so nothing comes there."""
    port = matrix_broker.mqtt_port
    amqp_port = matrix_broker.amqp_port
    assert port is not None and amqp_port is not None
    loop = asyncio.get_running_loop()
    mia = await loop.run_in_executor(None, mqtt_login, port, "mia")
    native_mia = await native_login(matrix_broker.port, "mia")
    assert (await native_mia.subscribe("other.x")).error_code == "NOT_AUTHORIZED"
    try:
        assert await loop.run_in_executor(None, mia.subscribe, "other/#", 0) == 0x80
        assert await loop.run_in_executor(None, mia.subscribe, "mia/#", 0) == 0
        addresses = ("other.t", "other.x", "mia.t")
        if publisher == "native":
            admin = await RawClient.connected(matrix_broker.port, token="adm")
            for address in addresses:
                assert (await admin.publish(address, 1)).type is CommandType.PUBLISH_ACK
            await admin.close()
        elif publisher == "mqtt":

            def via_mqtt() -> None:
                admin = mqtt_login(port, "admin")
                for n, address in enumerate(addresses, 1):
                    admin.send(Publish(address.replace(".", "/"), b"1", qos=1, packet_id=n))
                    assert admin.expect(Puback).packet_id == n
                admin.disconnect()

            await loop.run_in_executor(None, via_mqtt)
        else:

            def via_amqp() -> None:
                conn = pika.BlockingConnection(
                    pika.ConnectionParameters(
                        "127.0.0.1",
                        amqp_port,
                        credentials=pika.PlainCredentials("admin", "admin-pw"),
                    )
                )
                ch = conn.channel()
                ch.confirm_delivery()
                for address in addresses:
                    ch.basic_publish("amq.topic", address, b"1")
                conn.close()

            await loop.run_in_executor(None, via_amqp)
        got = await loop.run_in_executor(None, mia.barrier, 0.3)
        assert [p.topic for p in got if isinstance(p, Publish)] == ["mia/t"]
        await native_mia.expect_nothing()  # (its subscription was refused: no delivery)
    finally:
        mia.disconnect()
        await native_mia.close()
