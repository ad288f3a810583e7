"""The management functions for connections (vibemq_server/management/connections.py),
against a real broker (its own thread) with real clients of every protocol: pika (AMQP),
paho (MQTT) and the native client library.

Listing shows each connection's protocol, user, client id, peer and consumers; closing one
tells the client in its protocol's words: AMQP connection.close 320 CONNECTION_FORCED with the
reason, a native Disconnect with the reason, an MQTT socket closed without publishing the will
(as Mosquitto's administrative kick).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import pika
import pika.exceptions
import pytest
from amqputil import HOST, WAIT, AmqpBroker, PikaClients, pika_params
from certs import make_pki, tls_settings
from mqttutil import Clients, MakeBroker, Paho
from waits import wait_for, wait_until

from vibemq_server.client import Client
from vibemq_server.client.connection import CLIENT_VERSION
from vibemq_server.management.connections import (
    DEFAULT_CLOSE_REASON,
    ConnectionNotFound,
    close_connection,
    connection_detail,
    list_connections,
    list_consumers,
)

NativeClients = Callable[[], Awaitable[Client]]


def _by_protocol(amqp: AmqpBroker) -> dict[str, list[str]]:
    conns = amqp.call(list_connections)
    out: dict[str, list[str]] = {}
    for conn in conns:
        out.setdefault(conn.protocol, []).append(conn.id)
    return out


async def test_lists_connections_of_every_protocol_with_their_consumers(
    amqp: AmqpBroker,
    pikas: PikaClients,
    paho: Callable[[], Paho],
    vibemq: NativeClients,
) -> None:
    amqp_conn = pikas.connect(client_properties={"connection_name": "orders-worker"})
    ch = amqp_conn.channel()
    ch.queue_declare("orders")
    ch.basic_qos(prefetch_count=7)
    tag = ch.basic_consume("orders", lambda *a: None)
    mqtt = paho()
    mqtt.subscribe(("sensors/#", 1), ("alerts/+", 0))
    native = await vibemq()
    await native.subscribe("jobs", prefetch=5)

    conns = amqp.call(list_connections)
    by_protocol = {c.protocol: c for c in conns}
    assert sorted(by_protocol) == ["amqp", "mqtt", "vibemq"]
    for conn in conns:
        assert conn.peer_host == HOST
        assert conn.peer_port > 0
        assert conn.tls is False
        assert conn.bytes_in > 0 and conn.bytes_out > 0
        assert conn.messages_in is None
        assert abs(conn.connected_at.timestamp() - time.time()) < 3600

    a = by_protocol["amqp"]
    assert a.user == "anonymous"  # guest/guest on loopback: the anonymous login
    assert a.client_id == "Pika Python Client Library / orders-worker"
    assert (a.channels, a.consumers, a.state) == (1, 1, "open")
    m = by_protocol["mqtt"]
    assert m.client_id == mqtt.client_id
    assert (m.subscriptions, m.state) == (2, "connected")
    n = by_protocol["vibemq"]
    assert n.client_id == CLIENT_VERSION
    assert n.user == "anonymous"
    assert (n.consumers, n.state) == (1, "open")

    detail = amqp.call(lambda b: connection_detail(b, a.id))
    assert detail.details["connection_name"] == "orders-worker"
    [consumer] = detail.consumer_list
    assert (consumer.queue, consumer.tag, consumer.prefetch, consumer.channel) == (
        "orders",
        tag,
        7,
        1,
    )
    mqtt_detail = amqp.call(lambda b: connection_detail(b, m.id))
    assert mqtt_detail.subscription_list == {"sensors/#": 1, "alerts/+": 0}
    assert mqtt_detail.details["clean_session"] is True

    [jobs] = amqp.call(lambda b: list_consumers(b, "jobs"))
    assert (jobs.connection, jobs.protocol, jobs.prefetch, jobs.unacked) == (n.id, "vibemq", 5, 0)
    assert [c.protocol for c in amqp.call(lambda b: list_connections(b, "mqtt"))] == ["mqtt"]
    # a clean MQTT session is no consumer of the core (its deliveries go straight out); a
    # persistent one consumes its session queue
    assert {c.protocol for c in amqp.call(list_consumers)} == {"amqp", "vibemq"}
    durable = Paho(amqp.mqtt_port, clean_session=False)
    try:
        durable.connected()
        durable.subscribe(("sensors/#", 1))
        [session] = amqp.call(lambda b: list_consumers(b, f"$mqtt.s.{durable.client_id}"))
        assert (session.protocol, session.tag) == ("mqtt", durable.client_id)
    finally:
        durable.disconnect()
    # the model is JSON as it is (what the HTTP API will send)
    assert '"protocol":"amqp"' in a.model_dump_json()


def test_close_amqp_connection_is_320_connection_forced_with_the_reason(
    amqp: AmqpBroker, pikas: PikaClients
) -> None:
    conn = pikas.connect()
    conn.channel()
    [conn_id] = _by_protocol(amqp)["amqp"]
    closed = amqp.call(lambda b: close_connection(b, conn_id, "maintenance window"))
    assert closed.id == conn_id
    with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as raised:
        for _ in range(int(WAIT / 0.05)):
            conn.process_data_events(time_limit=0.05)
    assert raised.value.reply_code == 320
    assert raised.value.reply_text == "CONNECTION_FORCED - maintenance window"
    wait_until(lambda: "amqp" not in _by_protocol(amqp), "connection gone")


def test_close_amqp_default_reason(amqp: AmqpBroker) -> None:
    conn = pika.BlockingConnection(pika_params(amqp.amqp_port))
    try:
        [conn_id] = _by_protocol(amqp)["amqp"]
        amqp.call(lambda b: close_connection(b, conn_id))
        with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as raised:
            for _ in range(int(WAIT / 0.05)):
                conn.process_data_events(time_limit=0.05)
        assert raised.value.reply_text == f"CONNECTION_FORCED - {DEFAULT_CLOSE_REASON}"
    finally:
        if conn.is_open:
            conn.close()


async def test_close_native_connection_says_the_reason(
    amqp: AmqpBroker, vibemq: NativeClients
) -> None:
    client = await vibemq()
    [conn_id] = _by_protocol(amqp)["vibemq"]
    amqp.call(lambda b: close_connection(b, conn_id, "maintenance window"))
    await wait_for(lambda: client.closed, WAIT, "the client saw the close")
    assert client.disconnect_reason == "closed_by_operator: maintenance window"


def test_close_mqtt_connection_closes_the_socket_without_the_will(
    amqp: AmqpBroker, paho: Callable[[], Paho]
) -> None:
    watcher = paho()
    watcher.subscribe(("wills/#", 1))
    kicked = Paho(amqp.mqtt_port)
    kicked.will_set("wills/kicked", b"gone", qos=1)
    kicked.connected()
    try:
        conn_id = next(c.id for c in amqp.call(list_connections) if c.client_id == kicked.client_id)
        amqp.call(lambda b: close_connection(b, conn_id, "maintenance window"))
        kicked.disconnects.get(timeout=WAIT)  # paho saw the socket close
        # Anything the broker would publish for the kick is out before a publish that
        # follows it: the watcher's next message is the marker, not the will.
        marker = paho()
        marker.publish("wills/marker", b"after", qos=1)
        msg = watcher.get()
        assert (msg.topic, msg.payload) == ("wills/marker", b"after")
    finally:
        kicked.kill()


def test_unknown_connection(amqp: AmqpBroker) -> None:
    with pytest.raises(ConnectionNotFound):
        amqp.call(lambda b: connection_detail(b, "amqp_999999"))
    with pytest.raises(ConnectionNotFound):
        amqp.call(lambda b: close_connection(b, "nope"))


def test_tls_connection_shows_its_certificate_identity(
    tmp_path: Path, make_mqtt_broker: MakeBroker, mqtt_clients: Clients
) -> None:
    pki = make_pki(tmp_path)
    tls = tls_settings(pki, require_client_cert=True, use_identity_as_username=True)
    broker = make_mqtt_broker(users={"carol": "secret"}, tls=tls)
    port = broker.call(lambda b: b.ready())["mqtt_tls"]
    client = mqtt_clients.paho(port)
    client.client.tls_set(
        ca_certs=str(pki.ca), certfile=str(pki.alice.cert), keyfile=str(pki.alice.key)
    )
    client.connected()
    [conn] = broker.call(list_connections)
    assert (conn.protocol, conn.tls, conn.tls_identity, conn.user) == (
        "mqtt",
        True,
        "alice",
        "alice",
    )
    assert conn.bytes_in > 0 and conn.bytes_out > 0
