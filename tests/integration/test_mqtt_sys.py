"""$SYS topics as Mosquitto publishes them (docs/monitoring.md), with paho-mqtt clients: a
``$SYS/#`` subscriber gets every value, retained, and then the changes; ``#`` and ``+/...``
get none of them (MQTT 3.1.1 section 4.7.2); clients cannot publish into ``$SYS``."""

from __future__ import annotations

import paho.mqtt.client as mqtt
from mqttutil import Clients, MakeBroker, Paho
from waits import wait_until

from vibemq_server import __version__

SYS_TOPICS = {
    "$SYS/broker/version",
    "$SYS/broker/uptime",
    "$SYS/broker/clients/connected",
    "$SYS/broker/clients/disconnected",
    "$SYS/broker/clients/total",
    "$SYS/broker/messages/received",
    "$SYS/broker/messages/sent",
    "$SYS/broker/publish/messages/dropped",
    "$SYS/broker/bytes/received",
    "$SYS/broker/bytes/sent",
    "$SYS/broker/subscriptions/count",
    "$SYS/broker/retained messages/count",
} | {
    f"$SYS/broker/load/{kind}/{direction}/{window}"
    for kind in ("messages", "bytes")
    for direction in ("received", "sent")
    for window in ("1min", "5min", "15min")
}


def take(client: Paho, count: int) -> list[mqtt.MQTTMessage]:
    return [client.get() for _ in range(count)]


def latest(client: Paho, values: dict[str, bytes]) -> None:
    """Everything the client has been given so far, by topic (the last value wins)."""
    while not client.messages.empty():
        msg = client.messages.get_nowait()
        values[msg.topic] = bytes(msg.payload)


def test_sys_values_retained_for_sys_subscribers_never_for_wildcards(
    make_mqtt_broker: MakeBroker, mqtt_clients: Clients
) -> None:
    broker = make_mqtt_broker(mqtt={"port": 0, "sys_interval_s": 0.05})
    port = broker.mqtt_port
    everything = mqtt_clients.paho(port).connected()
    assert everything.subscribe(("#", 0)) == [0]
    plus = mqtt_clients.paho(port).connected()
    assert plus.subscribe(("+/broker/#", 0), ("fence/#", 0)) == [0, 0]
    sys = mqtt_clients.paho(port).connected()
    assert sys.subscribe(("$SYS/#", 1)) == [1]

    first = take(sys, len(SYS_TOPICS))
    assert {m.topic for m in first} == SYS_TOPICS
    assert all(m.retain and m.qos == 0 for m in first), [(m.topic, m.retain) for m in first]
    values = {m.topic: bytes(m.payload) for m in first}
    assert values["$SYS/broker/version"] == f"VibeMQ version {__version__}".encode()
    assert values["$SYS/broker/uptime"].endswith(b" seconds")
    assert int(values["$SYS/broker/retained messages/count"]) == len(SYS_TOPICS)
    assert float(values["$SYS/broker/load/messages/received/1min"]) >= 0

    # A publish moves the counters; the change reaches the $SYS subscriber (not retained).
    talker = mqtt_clients.paho(port).connected()
    talker.publish("fence/one", b"x", qos=1)

    def counted() -> bool:
        latest(sys, values)
        return (
            int(values["$SYS/broker/messages/received"]) >= 1
            and values["$SYS/broker/clients/connected"] == b"4"
            and int(values["$SYS/broker/subscriptions/count"]) == 4
        )

    wait_until(counted, "the $SYS values follow the traffic")
    assert int(values["$SYS/broker/bytes/received"]) > 0
    assert int(values["$SYS/broker/messages/sent"]) >= 1

    # Neither '#' nor '+/broker/#' was given anything of $SYS, before or after those changes.
    talker.publish("fence/two", b"y", qos=1)
    assert [m.topic for m in everything.until("fence/two")] == ["fence/one"]
    assert [m.topic for m in plus.until("fence/two")] == ["fence/one"]


def test_clients_cannot_publish_into_sys(
    make_mqtt_broker: MakeBroker, mqtt_clients: Clients
) -> None:
    broker = make_mqtt_broker(mqtt={"port": 0, "sys_interval_s": 0.05})
    port = broker.mqtt_port
    forger = mqtt_clients.paho(port).connected()
    forger.publish("$SYS/broker/version", b"forged", qos=1, retain=True)
    forger.publish("$SYS/broker/fake", b"forged", qos=1, retain=True)
    reader = mqtt_clients.paho(port).connected()
    assert reader.subscribe(("$SYS/broker/version", 0), ("$SYS/broker/fake", 0)) == [0, 0]
    got = reader.get()
    assert (got.topic, got.payload, got.retain) == (
        "$SYS/broker/version",
        f"VibeMQ version {__version__}".encode(),
        True,
    )
    # a fence on the same connection: nothing else was retained or published there
    assert reader.subscribe(("fence/#", 0)) == [0]
    forger.publish("fence/x", b"z", qos=1)
    assert reader.until("fence/x") == []


def test_sys_off_with_interval_zero(make_mqtt_broker: MakeBroker, mqtt_clients: Clients) -> None:
    broker = make_mqtt_broker(mqtt={"port": 0, "sys_interval_s": 0})
    port = broker.mqtt_port
    reader = mqtt_clients.paho(port).connected()
    assert reader.subscribe(("$SYS/#", 0), ("fence/#", 0)) == [0, 0]
    writer = mqtt_clients.paho(port).connected()
    writer.publish("fence/x", b"z", qos=1)
    assert reader.until("fence/x") == []
