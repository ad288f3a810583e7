"""MQTT 3.1 / 3.1.1 against a real broker, with real clients.

Clients: paho-mqtt 2.x (in both protocol versions), aiomqtt, Debian's ``mosquitto_pub`` /
``mosquitto_sub``, and a raw socket (``RawMqtt``) for hand-built and broken packets. The broker
runs on a thread of its own (``mqttutil.ThreadBroker``), so the tests are synchronous and every
wait is bounded. Fixtures (``mqtt_broker``, ``make_mqtt_broker``, ``mqtt_clients``,
``broker_log``, ``will_watcher``) are in conftest.py.

Negative checks ("X is not delivered") use a fence: after X, the same publisher sends a
message on a fence topic; once that arrives, X would have arrived before it.
"""

from __future__ import annotations

import asyncio
import random
import shutil
import subprocess
from dataclasses import dataclass
from typing import Any

import aiomqtt
import paho.mqtt.client as mqtt
import pytest
from mqttkit import HOST, unique_id
from mqttkit import TIMEOUT as WAIT
from mqttutil import Clients, LogEntries, MakeBroker, Paho, ThreadBroker
from waits import wait_until

from vibemq_server.adapters.mqtt.codec import encode, encode_remaining_length
from vibemq_server.adapters.mqtt.packets import (
    Connack,
    Connect,
    Disconnect,
    Pingreq,
    Pingresp,
    Publish,
    Suback,
    Subscribe,
)

pytestmark = pytest.mark.timeout(60)

V31 = mqtt.MQTTv31
V311 = mqtt.MQTTv311
PROTOCOLS = [pytest.param(V31, id="mqtt31"), pytest.param(V311, id="mqtt311")]


def raw_publish(
    first: int, topic: bytes, payload: bytes = b"", packet_id: int | None = None
) -> bytes:
    """A PUBLISH built by hand (so that it can break the rules ``encode`` enforces)."""
    body = len(topic).to_bytes(2, "big") + topic
    if packet_id is not None:
        body += packet_id.to_bytes(2, "big")
    body += payload
    return bytes((first,)) + encode_remaining_length(len(body)) + body


# ============================================================================================
# 1. paho-mqtt in MQTT 3.1 and 3.1.1


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_paho_connects(mqtt_broker: ThreadBroker, mqtt_clients: Clients, protocol: int) -> None:
    client = mqtt_clients.paho(mqtt_broker.mqtt_port, protocol=protocol)
    rc = client.connect()
    assert rc.getName() == "Success"
    assert mqtt_broker.has_session(client.client_id)


def test_paho_v31_is_really_mqtt_31(mqtt_broker: ThreadBroker, mqtt_clients: Clients) -> None:
    """The same 24-character client id: refused from paho in 3.1 mode (3.1 allows at most
    23), accepted in 3.1.1 mode; so the 3.1 tests really speak MQIsdp level 3."""
    long_id = "x" * 24
    rc = mqtt_clients.paho(mqtt_broker.mqtt_port, long_id, protocol=V31).connect()
    assert rc.getName() == "Client identifier not valid"
    rc = mqtt_clients.paho(mqtt_broker.mqtt_port, long_id, protocol=V311).connect()
    assert rc.getName() == "Success"


@pytest.mark.parametrize("pub_protocol", PROTOCOLS)
@pytest.mark.parametrize("sub_protocol", PROTOCOLS)
def test_qos_matrix(
    mqtt_broker: ThreadBroker, mqtt_clients: Clients, pub_protocol: int, sub_protocol: int
) -> None:
    """Publisher at QoS 0/1/2 x subscription at QoS 0/1/2: delivered once at the minimum."""
    port = mqtt_broker.mqtt_port
    subscribers = {}
    for sub_qos in (0, 1, 2):
        sub = mqtt_clients.paho(port, protocol=sub_protocol).connected()
        assert sub.subscribe(("m/#", sub_qos), ("fence", 2)) == [sub_qos, 2]
        subscribers[sub_qos] = sub
    pub = mqtt_clients.paho(port, protocol=pub_protocol).connected()
    for pub_qos in (0, 1, 2):
        pub.publish(f"m/{pub_qos}", f"at {pub_qos}".encode(), pub_qos)
    pub.publish("fence", b"", 2)
    for sub_qos, sub in subscribers.items():
        got = sub.until("fence")
        assert sorted(m.topic for m in got) == ["m/0", "m/1", "m/2"], "once each"
        for msg in got:
            pub_qos = int(msg.topic[2:])
            assert msg.qos == min(pub_qos, sub_qos), (msg.topic, sub_qos)
            assert msg.payload == f"at {pub_qos}".encode()
            assert not msg.retain


@pytest.mark.parametrize("qos", [0, 1, 2])
@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_payload_bytes_unchanged(
    mqtt_broker: ThreadBroker, mqtt_clients: Clients, protocol: int, qos: int
) -> None:
    rng = random.Random(qos)
    payloads = [
        bytes(range(256)) * 4,  # every byte value, NUL and invalid UTF-8 included
        b"",
        rng.randbytes(200_000),
        b'{"json": "stays as it is"}',
    ]
    port = mqtt_broker.mqtt_port
    sub = mqtt_clients.paho(port, protocol=protocol).connected()
    assert sub.subscribe(("p/x", qos)) == [qos]
    pub = mqtt_clients.paho(port, protocol=protocol).connected()
    for payload in payloads:
        pub.publish("p/x", payload, qos)
    for payload in payloads:
        msg = sub.get()
        assert msg.topic == "p/x"
        assert msg.qos == qos
        assert len(msg.payload) == len(payload)
        assert msg.payload == payload


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_paho_keepalive_pings(
    mqtt_broker: ThreadBroker, mqtt_clients: Clients, protocol: int
) -> None:
    """paho sends PINGREQ when idle for its keep-alive; the broker answers PINGRESP and keeps
    the connection (1.5 x keep-alive would otherwise close it)."""
    client = mqtt_clients.paho(mqtt_broker.mqtt_port, protocol=protocol, keepalive=1).connected()
    assert client.subscribe(("k/x", 1)) == [1]
    wait_until(
        lambda: sum("Received PINGRESP" in line for line in client.log_lines) >= 2,
        "two PINGREQ/PINGRESP exchanges",
        timeout=10,
    )
    assert any("Sending PINGREQ" in line for line in client.log_lines)
    assert client.disconnects.empty(), "the connection was dropped"
    client.publish("k/x", b"alive", 1)
    assert client.get().payload == b"alive"


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_unsubscribe_stops_delivery(
    mqtt_broker: ThreadBroker, mqtt_clients: Clients, protocol: int
) -> None:
    port = mqtt_broker.mqtt_port
    sub = mqtt_clients.paho(port, protocol=protocol).connected()
    assert sub.subscribe(("u/x", 1), ("u/+", 0), ("fence", 1)) == [1, 0, 1]
    pub = mqtt_clients.paho(port, protocol=protocol).connected()
    pub.publish("u/x", b"before", 1)
    msg = sub.get()
    assert (msg.topic, msg.payload, msg.qos) == ("u/x", b"before", 1)
    sub.unsubscribe("u/x", "u/+")
    pub.publish("u/x", b"after", 1)
    pub.publish("fence", b"", 1)
    assert sub.until("fence") == []
    # Unsubscribing a filter that was never subscribed is acknowledged too.
    sub.unsubscribe("never/subscribed")


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_paho_disconnect(mqtt_broker: ThreadBroker, mqtt_clients: Clients, protocol: int) -> None:
    client = mqtt_clients.paho(mqtt_broker.mqtt_port, protocol=protocol).connected()
    assert mqtt_broker.has_session(client.client_id)
    client.disconnect()
    rc = client.disconnects.get(timeout=WAIT)
    assert not rc.is_failure, rc
    # A clean session ends with its connection.
    wait_until(lambda: not mqtt_broker.has_session(client.client_id), "the session to end")


def test_raw_pingreq(mqtt_broker: ThreadBroker, mqtt_clients: Clients) -> None:
    raw = mqtt_clients.raw(mqtt_broker.mqtt_port)
    assert raw.connect().return_code == 0
    for _ in range(3):
        raw.send(Pingreq())
        raw.expect(Pingresp)
    raw.send(Disconnect())
    assert raw.wait_closed() == []


# ============================================================================================
# 2. CONNACK return codes (raw socket)


@pytest.mark.parametrize(
    ("name", "level"),
    [("MQTT", 6), ("MQTT", 3), ("MQTT", 0), ("MQIsdp", 4), ("MQIsdp", 5)],
)
def test_connack_unacceptable_protocol_level(
    mqtt_broker: ThreadBroker, mqtt_clients: Clients, name: str, level: int
) -> None:
    raw = mqtt_clients.raw(mqtt_broker.mqtt_port)
    ack = raw.connect(protocol_name=name, protocol_level=level)
    assert ack == Connack(return_code=1)
    assert raw.wait_closed() == []


def test_unknown_protocol_name_closes_without_connack(
    mqtt_broker: ThreadBroker, mqtt_clients: Clients
) -> None:
    raw = mqtt_clients.raw(mqtt_broker.mqtt_port)
    raw.send(Connect("c1", protocol_name="AMQP", protocol_level=4))
    assert raw.wait_closed() == []


def test_v31_client_id_length(mqtt_broker: ThreadBroker, mqtt_clients: Clients) -> None:
    port = mqtt_broker.mqtt_port
    v31: dict[str, Any] = {"protocol_name": "MQIsdp", "protocol_level": 3}
    raw = mqtt_clients.raw(port)
    assert raw.connect("a" * 24, **v31) == Connack(return_code=2)
    assert raw.wait_closed() == []
    raw = mqtt_clients.raw(port)
    assert raw.connect("", **v31) == Connack(return_code=2)
    assert raw.wait_closed() == []
    raw = mqtt_clients.raw(port)
    assert raw.connect("a" * 23, **v31) == Connack(return_code=0)
    raw.send(Pingreq())
    raw.expect(Pingresp)


def test_v311_client_id_limits(mqtt_broker: ThreadBroker, mqtt_clients: Clients) -> None:
    """3.1.1 allows long ids (up to mqtt.max_client_id_length, 1024 by default)."""
    port = mqtt_broker.mqtt_port
    raw = mqtt_clients.raw(port)
    assert raw.connect("a" * 1024) == Connack(return_code=0)
    raw = mqtt_clients.raw(port)
    assert raw.connect("b" * 1025) == Connack(return_code=2)
    assert raw.wait_closed() == []


def test_empty_client_id_needs_clean_session(
    mqtt_broker: ThreadBroker, mqtt_clients: Clients
) -> None:
    port = mqtt_broker.mqtt_port
    raw = mqtt_clients.raw(port)
    assert raw.connect("", clean_session=False) == Connack(return_code=2)
    assert raw.wait_closed() == []
    # With clean session the broker assigns an id, and the connection works.
    raw = mqtt_clients.raw(port)
    assert raw.connect("", clean_session=True) == Connack(return_code=0)
    raw.send(Subscribe(1, (("e/x", 1),)))
    assert raw.expect(Suback) == Suback(1, (1,))
    raw.send(Publish("e/x", b"to myself", qos=1, packet_id=7))
    packets = [raw.recv(), raw.recv()]
    kinds = {type(p).__name__ for p in packets}
    assert kinds == {"Puback", "Publish"}, packets
    (delivery,) = [p for p in packets if isinstance(p, Publish)]
    assert (delivery.topic, delivery.payload, delivery.qos) == ("e/x", b"to myself", 1)


def test_two_empty_client_ids_get_distinct_sessions(
    mqtt_broker: ThreadBroker, mqtt_clients: Clients
) -> None:
    port = mqtt_broker.mqtt_port
    a, b = mqtt_clients.raw(port), mqtt_clients.raw(port)
    assert a.connect("") == Connack(return_code=0)
    assert b.connect("") == Connack(return_code=0)
    # Neither took the other over.
    for raw in (a, b):
        raw.send(Pingreq())
        raw.expect(Pingresp)


AUTH_CASES = [
    pytest.param({}, 5, id="no-credentials"),
    pytest.param({"username": "alice"}, 4, id="username-only"),
    pytest.param({"username": "alice", "password": b"wrong"}, 4, id="wrong-password"),
    pytest.param({"username": "bob", "password": b"pw"}, 4, id="unknown-user"),
    pytest.param({"username": "alice", "password": b"pw"}, 0, id="user-password"),
    pytest.param({"username": "anyone", "password": b"tok"}, 0, id="token-as-password"),
]


@pytest.mark.parametrize(("credentials", "code"), AUTH_CASES)
def test_connack_auth(
    make_mqtt_broker: MakeBroker, mqtt_clients: Clients, credentials: dict[str, Any], code: int
) -> None:
    mqtt_broker = make_mqtt_broker(auth_tokens=["tok"], mqtt={"port": 0, "users": {"alice": "pw"}})
    raw = mqtt_clients.raw(mqtt_broker.mqtt_port)
    assert raw.connect(**credentials) == Connack(return_code=code)
    if code:
        assert raw.wait_closed() == []
    else:
        raw.send(Pingreq())
        raw.expect(Pingresp)


@pytest.mark.parametrize(
    ("settings", "ok", "bad"),
    [
        pytest.param({"auth_tokens": ["tok"]}, ("u", "tok"), ("u", "nope"), id="tokens"),
        pytest.param(
            {"mqtt": {"port": 0, "users": {"alice": "pw"}}},
            ("alice", "pw"),
            ("alice", "pw2"),
            id="users",
        ),
    ],
)
def test_connack_auth_only_tokens_or_only_users(
    make_mqtt_broker: MakeBroker,
    mqtt_clients: Clients,
    settings: dict[str, Any],
    ok: tuple[str, str],
    bad: tuple[str, str],
) -> None:
    port = make_mqtt_broker(**settings).mqtt_port
    raw = mqtt_clients.raw(port)
    assert raw.connect() == Connack(return_code=5)
    raw = mqtt_clients.raw(port)
    assert raw.connect(username=bad[0], password=bad[1].encode()) == Connack(return_code=4)
    raw = mqtt_clients.raw(port)
    assert raw.connect(username=ok[0], password=ok[1].encode()) == Connack(return_code=0)


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_paho_auth(make_mqtt_broker: MakeBroker, mqtt_clients: Clients, protocol: int) -> None:
    port = make_mqtt_broker(
        auth_tokens=["tok"], mqtt={"port": 0, "users": {"alice": "pw"}}
    ).mqtt_port
    assert mqtt_clients.paho(port, protocol=protocol).connect().getName() == "Not authorized"
    client = mqtt_clients.paho(port, protocol=protocol)
    client.username_pw_set("alice", "bad")
    assert client.connect().getName() == "Bad user name or password"
    client = mqtt_clients.paho(port, protocol=protocol)
    client.username_pw_set("alice", "pw")
    assert client.connect().getName() == "Success"
    client = mqtt_clients.paho(port, protocol=protocol)
    client.username_pw_set("svc", "tok")
    assert client.connect().getName() == "Success"
    assert client.subscribe(("auth/x", 1)) == [1]
    client.publish("auth/x", b"ok", 1)
    assert client.get().payload == b"ok"


# ============================================================================================
# 3. Topic filters, $ topics, overlapping subscriptions, deny rules
# ($ops stands for any $ topic: $SYS/... is the broker's own, test_mqtt_sys.py)

TOPICS = [
    "w",
    "w/",
    "w/b",
    "w/b/c",
    "w/x/c",
    "w//c",
    "w/b/d",
    "w/b/c/d",
    "wx/b",
    "a/x",
    "/x",
    "$ops/x",
    "$ops/a/b",
    "$ops",
    "$app/x",
]
NOT_DOLLAR = {t for t in TOPICS if not t.startswith("$")}
EXPECTED_MATCHES: dict[str, set[str]] = {
    "w/+/c": {"w/b/c", "w/x/c", "w//c"},
    "w/#": {"w", "w/", "w/b", "w/b/c", "w/x/c", "w//c", "w/b/d", "w/b/c/d"},
    "w/+": {"w/", "w/b"},
    "+": {"w"},
    "+/+": {"w/", "w/b", "wx/b", "a/x", "/x"},
    "+/b/#": {"w/b", "w/b/c", "w/b/d", "w/b/c/d", "wx/b"},
    "#": NOT_DOLLAR,
    "+/x": {"a/x", "/x"},
    "/#": {"/x"},
    "$ops/#": {"$ops/x", "$ops/a/b", "$ops"},
    "$ops/+": {"$ops/x"},
    "$app/x": {"$app/x"},
    "w/b/c": {"w/b/c"},
}


def test_wildcards_and_dollar_topics(mqtt_broker: ThreadBroker, mqtt_clients: Clients) -> None:
    port = mqtt_broker.mqtt_port
    subscribers = {}
    for topic_filter in EXPECTED_MATCHES:
        sub = mqtt_clients.paho(port).connected()
        # "fence" overlaps "#" and "+": delivered once all the same.
        assert sub.subscribe((topic_filter, 1), ("fence", 1)) == [1, 1]
        subscribers[topic_filter] = sub
    pub = mqtt_clients.paho(port).connected()
    for topic in TOPICS:
        pub.publish(topic, topic.encode(), 1)
    pub.publish("fence", b"", 1)
    for topic_filter, sub in subscribers.items():
        got = [m.topic for m in sub.until("fence")]
        assert sorted(got) == sorted(EXPECTED_MATCHES[topic_filter]), topic_filter
    for sub in subscribers.values():
        sub.assert_no_more()


def test_dots_and_other_characters_in_topics(
    mqtt_broker: ThreadBroker, mqtt_clients: Clients
) -> None:
    """MQTT's "/" and "." swap in broker addresses: "a.b" and "a/b" stay distinct topics and
    every topic reaches subscribers exactly as it was published."""
    port = mqtt_broker.mqtt_port
    topics = ["a.b", "a/b", "a.b/c", "a/b.c", "a..b", ".", "ä/ß 1", "a b/c d", "a/$x"]
    expected: dict[str, set[str]] = {
        "a.b": {"a.b"},
        "a/b": {"a/b"},
        "a/+": {"a/b", "a/b.c", "a/$x"},
        "+": {"a.b", "a..b", "."},
        "a.b/#": {"a.b", "a.b/c"},
        "ä/+": {"ä/ß 1"},
        "#": set(topics),
    }
    subscribers = {}
    for topic_filter in expected:
        sub = mqtt_clients.paho(port).connected()
        assert sub.subscribe((topic_filter, 1), ("fence", 1)) == [1, 1]
        subscribers[topic_filter] = sub
    pub = mqtt_clients.paho(port).connected()
    for topic in topics:
        pub.publish(topic, topic.encode(), 1)
    pub.publish("fence", b"", 1)
    for topic_filter, sub in subscribers.items():
        got = sub.until("fence")
        assert sorted(m.topic for m in got) == sorted(expected[topic_filter]), topic_filter
        assert all(m.payload == m.topic.encode() for m in got)


def test_retained_messages_follow_the_filter_rules(
    mqtt_broker: ThreadBroker, mqtt_clients: Clients
) -> None:
    """Retained messages reach a new subscription under the same rules as live ones."""
    port = mqtt_broker.mqtt_port
    pub = mqtt_clients.paho(port).connected()
    for topic in ("r", "r/a", "r/a/b", "$ops/r", "rr"):
        pub.publish(topic, f"kept {topic}".encode(), 1, retain=True)
    expected = {
        "r/#": {"r", "r/a", "r/a/b"},
        "r/+": {"r/a"},
        "#": {"r", "r/a", "r/a/b", "rr"},
        "+": {"r", "rr"},
        "$ops/#": {"$ops/r"},
    }
    for topic_filter, topics in expected.items():
        sub = mqtt_clients.paho(port).connected()
        assert sub.subscribe((topic_filter, 1)) == [1]
        got = [sub.get() for _ in topics]
        assert sorted(m.topic for m in got) == sorted(topics), topic_filter
        assert all(m.retain and m.payload == f"kept {m.topic}".encode() for m in got)
        assert sub.subscribe(("fence", 1)) == [1]
        pub.publish("fence", b"", 1)
        assert sub.until("fence") == [], topic_filter
    # An empty retained message deletes the retained one.
    pub.publish("r/a", b"", 1, retain=True)
    sub = mqtt_clients.paho(port).connected()
    assert sub.subscribe(("r/a", 1), ("fence", 1)) == [1, 1]
    pub.publish("fence", b"", 1)
    assert sub.until("fence") == []


def test_overlapping_subscriptions_deliver_once_at_highest_qos(
    mqtt_broker: ThreadBroker, mqtt_clients: Clients
) -> None:
    port = mqtt_broker.mqtt_port
    sub = mqtt_clients.paho(port).connected()
    granted = sub.subscribe(("o/#", 0), ("o/+", 2), ("o/x", 1), ("+/x", 1), ("fence", 2))
    assert granted == [0, 2, 1, 1, 2]
    pub = mqtt_clients.paho(port).connected()
    pub.publish("o/x", b"1", 2)  # o/# 0, o/+ 2, o/x 1, +/x 1 -> once at 2
    pub.publish("o/y", b"2", 1)  # o/# 0, o/+ 2 -> once at min(1, 2)
    pub.publish("o", b"3", 2)  # o/# 0 only
    pub.publish("o/y/z", b"4", 2)  # o/# 0 only
    pub.publish("fence", b"", 2)
    got = sorted((m.topic, m.payload, m.qos) for m in sub.until("fence"))
    assert got == [("o", b"3", 0), ("o/x", b"1", 2), ("o/y", b"2", 1), ("o/y/z", b"4", 0)]
    # Re-subscribing replaces the QoS of that filter (no second entry).
    assert sub.subscribe(("o/+", 0)) == [0]
    pub.publish("o/y", b"5", 2)
    pub.publish("fence", b"", 2)
    assert [(m.topic, m.qos) for m in sub.until("fence")] == [("o/y", 0)]


def test_deny_subscribe(make_mqtt_broker: MakeBroker, mqtt_clients: Clients) -> None:
    mqtt_broker = make_mqtt_broker(mqtt={"port": 0, "deny_subscribe": ["secret/#"]})
    port = mqtt_broker.mqtt_port
    raw = mqtt_clients.raw(port)
    assert raw.connect().return_code == 0
    raw.send(Subscribe(5, (("secret/x", 1), ("public/x", 1), ("#", 0), ("pub/+", 2))))
    assert raw.expect(Suback) == Suback(5, (0x80, 1, 0x80, 2))
    # paho sees the same; "secret" itself, "+/x" and "+/#" overlap the rule as well.
    sub = mqtt_clients.paho(port).connected()
    granted = sub.subscribe(
        ("secret", 1), ("+/x", 1), ("+/#", 1), ("secret/x/y", 0), ("public/#", 2), ("fence", 1)
    )
    assert granted == [0x80, 0x80, 0x80, 0x80, 2, 1]
    pub = mqtt_clients.paho(port).connected()
    pub.publish("secret/x", b"hidden", 1)
    pub.publish("public/x", b"visible", 1)
    pub.publish("fence", b"", 1)
    assert [(m.topic, m.qos) for m in sub.until("fence")] == [("public/x", 1)]
    # The raw client's granted filter works too, and the refusals left the connection up.
    delivery = raw.expect(Publish)
    assert (delivery.topic, delivery.payload, delivery.qos) == ("public/x", b"visible", 1)


def test_deny_publish_drops_silently(make_mqtt_broker: MakeBroker, mqtt_clients: Clients) -> None:
    mqtt_broker = make_mqtt_broker(mqtt={"port": 0, "deny_publish": ["secret/#"]})
    port = mqtt_broker.mqtt_port
    sub = mqtt_clients.paho(port).connected()
    assert sub.subscribe(("#", 2)) == [2]
    pub = mqtt_clients.paho(port).connected()
    # Every QoS flow completes (PUBACK / PUBREC+PUBCOMP): nothing tells the publisher.
    pub.publish("secret/x", b"a", 0)
    pub.publish("secret/x", b"b", 1)
    pub.publish("secret", b"c", 2)
    pub.publish("secret/x", b"d", 1, retain=True)
    pub.publish("public/x", b"e", 1)
    pub.publish("fence", b"", 2)
    assert [(m.topic, m.payload) for m in sub.until("fence")] == [("public/x", b"e")]
    # Nothing was retained either.
    late = mqtt_clients.paho(port).connected()
    assert late.subscribe(("secret/#", 1), ("fence", 1)) == [1, 1]
    pub.publish("fence", b"", 1)
    assert late.until("fence") == []


# ============================================================================================
# 4. Wills


def test_will_on_abnormal_close(
    mqtt_broker: ThreadBroker, mqtt_clients: Clients, will_watcher: Paho
) -> None:
    raw = mqtt_clients.raw(mqtt_broker.mqtt_port)
    ack = raw.connect(will_topic="will/raw", will_payload=b"\x00gone\xff", will_qos=1)
    assert ack.return_code == 0
    raw.close()
    msg = will_watcher.get()
    assert (msg.topic, msg.payload, msg.qos, msg.retain) == ("will/raw", b"\x00gone\xff", 1, False)


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_will_on_paho_socket_shutdown(
    mqtt_broker: ThreadBroker, mqtt_clients: Clients, will_watcher: Paho, protocol: int
) -> None:
    client = mqtt_clients.paho(mqtt_broker.mqtt_port, protocol=protocol)
    client.will_set("will/paho", b"bye", 2)
    client.connected()
    client.kill()
    msg = will_watcher.get()
    assert (msg.topic, msg.payload, msg.qos) == ("will/paho", b"bye", 2)


def test_will_on_keepalive_timeout(
    mqtt_broker: ThreadBroker, mqtt_clients: Clients, will_watcher: Paho
) -> None:
    """keep_alive=1 and then silence: the broker gives up after 1.5 s (checked about once a
    second), publishes the will and closes."""
    raw = mqtt_clients.raw(mqtt_broker.mqtt_port)
    ack = raw.connect(keep_alive=1, will_topic="will/idle", will_payload=b"timeout", will_qos=1)
    assert ack.return_code == 0
    msg = will_watcher.get(timeout=5.0)
    assert (msg.topic, msg.payload) == ("will/idle", b"timeout")
    assert raw.wait_closed() == []


def test_will_on_protocol_violation(
    mqtt_broker: ThreadBroker, mqtt_clients: Clients, will_watcher: Paho
) -> None:
    raw = mqtt_clients.raw(mqtt_broker.mqtt_port)
    assert raw.connect(will_topic="will/bad", will_payload=b"violated").return_code == 0
    raw.send(b"\xf0\x00")  # reserved packet type 15
    assert raw.wait_closed() == []
    msg = will_watcher.get()
    assert (msg.topic, msg.payload, msg.qos) == ("will/bad", b"violated", 0)


def test_no_will_on_disconnect(
    mqtt_broker: ThreadBroker, mqtt_clients: Clients, will_watcher: Paho
) -> None:
    port = mqtt_broker.mqtt_port
    raw = mqtt_clients.raw(port)
    assert raw.connect(will_topic="will/raw", will_payload=b"no").return_code == 0
    raw.send(Disconnect())
    assert raw.wait_closed() == []
    client = mqtt_clients.paho(port)
    client.will_set("will/paho", b"no", 1)
    client.connected()
    client.disconnect()
    wait_until(lambda: not mqtt_broker.has_session(client.client_id), "paho's session to end")
    fence = mqtt_clients.paho(port).connected()
    fence.publish("fence", b"", 2)
    assert will_watcher.until("fence") == []


def test_no_will_from_a_refused_connect(
    make_mqtt_broker: MakeBroker, mqtt_clients: Clients
) -> None:
    port = make_mqtt_broker(mqtt={"port": 0, "users": {"alice": "pw"}}).mqtt_port
    watcher = mqtt_clients.paho(port)
    watcher.username_pw_set("alice", "pw")
    watcher.connected()
    assert watcher.subscribe(("will/#", 1), ("fence", 1)) == [1, 1]
    raw = mqtt_clients.raw(port)
    refused = raw.connect(
        username="alice", password=b"bad", will_topic="will/refused", will_payload=b"x"
    )
    assert refused == Connack(return_code=4)
    assert raw.wait_closed() == []
    watcher.publish("fence", b"", 1)
    assert watcher.until("fence") == []


def test_will_on_a_denied_topic_is_dropped(
    make_mqtt_broker: MakeBroker, mqtt_clients: Clients
) -> None:
    """deny_publish applies to wills too: a will must not be a way around the rule."""
    mqtt_broker = make_mqtt_broker(mqtt={"port": 0, "deny_publish": ["secret/#"]})
    port = mqtt_broker.mqtt_port
    watcher = mqtt_clients.paho(port).connected()
    assert watcher.subscribe(("#", 1)) == [1]
    raw = mqtt_clients.raw(port)
    ack = raw.connect("leaker", will_topic="secret/will", will_payload=b"leak", will_retain=True)
    assert ack.return_code == 0
    raw.close()
    # The session ends in the same step as the will is published (or not).
    wait_until(lambda: not mqtt_broker.has_session("leaker"), "the will's connection to end")
    allowed = mqtt_clients.raw(port)
    assert allowed.connect(will_topic="public/will", will_payload=b"ok").return_code == 0
    allowed.close()
    msg = watcher.get()
    assert (msg.topic, msg.payload) == ("public/will", b"ok")
    late = mqtt_clients.paho(port).connected()
    assert late.subscribe(("secret/#", 1), ("fence", 1)) == [1, 1]
    late.publish("fence", b"", 1)
    assert late.until("fence") == [], "the denied will was retained"


def test_takeover_of_a_persistent_session(mqtt_broker: ThreadBroker, mqtt_clients: Clients) -> None:
    """clean session 0 on both sides: the new connection resumes the session (session
    present) with its subscription, and gets what was published for it."""
    port = mqtt_broker.mqtt_port
    first = mqtt_clients.raw(port)
    assert first.connect("keeper", clean_session=False) == Connack(0, session_present=False)
    first.send(Subscribe(1, (("keep/x", 1),)))
    assert first.expect(Suback) == Suback(1, (1,))
    second = mqtt_clients.raw(port)
    assert second.connect("keeper", clean_session=False) == Connack(0, session_present=True)
    assert first.wait_closed() == []
    pub = mqtt_clients.paho(port).connected()
    pub.publish("keep/x", b"for the session", 1)
    delivery = second.expect(Publish)
    assert (delivery.topic, delivery.payload, delivery.qos) == ("keep/x", b"for the session", 1)


def test_refused_connect_does_not_take_over(
    make_mqtt_broker: MakeBroker, mqtt_clients: Clients
) -> None:
    port = make_mqtt_broker(mqtt={"port": 0, "users": {"alice": "pw"}}).mqtt_port
    first = mqtt_clients.raw(port)
    assert first.connect("owner", username="alice", password=b"pw").return_code == 0
    intruder = mqtt_clients.raw(port)
    assert intruder.connect("owner", username="alice", password=b"no").return_code == 4
    assert intruder.wait_closed() == []
    first.send(Pingreq())
    first.expect(Pingresp)


def test_will_retain(mqtt_broker: ThreadBroker, mqtt_clients: Clients, will_watcher: Paho) -> None:
    port = mqtt_broker.mqtt_port
    raw = mqtt_clients.raw(port)
    ack = raw.connect(
        will_topic="will/status", will_payload=b"offline", will_qos=1, will_retain=True
    )
    assert ack.return_code == 0
    raw.close()
    live = will_watcher.get()
    # To an existing subscription, RETAIN is 0 (3.1.1 section 3.3.1.3).
    assert (live.topic, live.payload, live.retain) == ("will/status", b"offline", False)
    late = mqtt_clients.paho(port).connected()
    assert late.subscribe(("will/+", 1)) == [1]
    stored = late.get()
    assert (stored.topic, stored.payload, stored.qos, stored.retain) == (
        "will/status",
        b"offline",
        1,
        True,
    )


def test_client_id_takeover(
    mqtt_broker: ThreadBroker, mqtt_clients: Clients, will_watcher: Paho
) -> None:
    port = mqtt_broker.mqtt_port
    first = mqtt_clients.raw(port)
    assert first.connect("same-id", will_topic="will/first", will_payload=b"taken").return_code == 0
    second = mqtt_clients.raw(port)
    assert second.connect("same-id").return_code == 0
    assert first.wait_closed() == []
    msg = will_watcher.get()
    assert (msg.topic, msg.payload) == ("will/first", b"taken")
    # The new connection owns the session and works.
    second.send(Subscribe(1, (("t/o", 1),)))
    assert second.expect(Suback) == Suback(1, (1,))
    second.send(Pingreq())
    second.expect(Pingresp)
    # paho clients taking over one another
    a = mqtt_clients.paho(port, "paho-same", protocol=V311).connected()
    b = mqtt_clients.paho(port, "paho-same", protocol=V31).connected()
    rc = a.disconnects.get(timeout=WAIT)
    assert rc.is_failure
    assert b.subscribe(("b/x", 1)) == [1]


# ============================================================================================
# 5. Malformed input closes only that connection


@dataclass(frozen=True)
class BadInput:
    name: str
    data: bytes
    connect_first: bool
    event: str  # the broker's warning line
    detail: str  # in its "code" (malformed) or "reason" (violation)


MAX_PACKET = 4096

BAD_INPUTS = [
    BadInput("pingreq-before-connect", encode(Pingreq()), False, "protocol violation", "PINGREQ"),
    BadInput(
        "publish-before-connect", encode(Publish("a", b"x")), False, "protocol violation", "PUBLISH"
    ),
    BadInput("second-connect", encode(Connect("again")), True, "protocol violation", "CONNECT"),
    BadInput("client-sends-connack", encode(Connack()), True, "protocol violation", "CONNACK"),
    BadInput("reserved-type-0", b"\x00\x00", True, "malformed packet", "reserved_packet_type"),
    BadInput("reserved-type-15", b"\xf0\x00", True, "malformed packet", "reserved_packet_type"),
    BadInput(
        "reserved-type-0-before-connect",
        b"\x00\x00",
        False,
        "malformed packet",
        "reserved_packet_type",
    ),
    BadInput(
        "publish-qos-3",
        raw_publish(0x36, b"a/b", b"x", packet_id=1),
        True,
        "malformed packet",
        "invalid_qos",
    ),
    BadInput(
        "subscribe-flags-0x80",
        b"\x80" + encode(Subscribe(1, (("a", 0),)))[1:],
        True,
        "malformed packet",
        "invalid_flags",
    ),
    BadInput(
        "unsubscribe-flags-0xa0",
        b"\xa0\x05\x00\x01\x00\x01a",
        True,
        "malformed packet",
        "invalid_flags",
    ),
    BadInput(
        "five-length-bytes",
        b"\x30\xff\xff\xff\xff\x01",
        True,
        "malformed packet",
        "invalid_remaining_length",
    ),
    BadInput(
        "wildcard-plus-in-publish",
        raw_publish(0x30, b"a/+", b"x"),
        True,
        "malformed packet",
        "invalid_topic_name",
    ),
    BadInput(
        "wildcard-hash-in-publish",
        raw_publish(0x32, b"a/#", b"x", packet_id=3),
        True,
        "malformed packet",
        "invalid_topic_name",
    ),
    BadInput(
        "invalid-utf8-topic",
        raw_publish(0x30, b"a/\xff\xfe", b"x"),
        True,
        "malformed packet",
        "invalid_utf8",
    ),
    BadInput(
        "too-large",
        raw_publish(0x32, b"big", bytes(MAX_PACKET), packet_id=1),
        True,
        "malformed packet",
        "packet_too_large",
    ),
    BadInput(
        "invalid-subscribe-filter",
        b"\x82\x08\x00\x01\x00\x03a#b\x00",
        True,
        "malformed packet",
        "invalid_topic_filter",
    ),
    BadInput(
        "subscribe-qos-3", b"\x82\x06\x00\x01\x00\x01a\x03", True, "malformed packet", "invalid_qos"
    ),
    BadInput(
        "huge-announced-length-header-only",
        b"\x30\xff\xff\xff\x7f",
        True,
        "malformed packet",
        "packet_too_large",
    ),
    BadInput(
        "publish-qos0-with-dup",
        raw_publish(0x38, b"a", b"x"),
        True,
        "malformed packet",
        "invalid_flags",
    ),
    BadInput(
        "publish-packet-id-0",
        raw_publish(0x32, b"a", b"x", packet_id=0),
        True,
        "malformed packet",
        "invalid_packet_id",
    ),
    BadInput("publish-empty-topic", raw_publish(0x30, b""), True, "malformed", "invalid_topic"),
    BadInput("publish-nul-in-topic", raw_publish(0x30, b"a\x00b"), True, "malformed", "utf8"),
    BadInput("pubrel-flags-0x60", b"\x60\x02\x00\x01", True, "malformed", "invalid_flags"),
    BadInput("pingreq-with-body", b"\xc0\x01\x00", True, "malformed packet", "malformed"),
    BadInput(
        "subscribe-without-filters", b"\x82\x02\x00\x01", True, "malformed", "no_topic_filters"
    ),
    BadInput(
        "connect-reserved-flag",
        b"\x10\x0d\x00\x04MQTT\x04\x03\x00\x3c\x00\x01c",
        False,
        "malformed packet",
        "invalid_connect_flags",
    ),
    BadInput(
        "connect-will-qos-3",
        b"\x10\x13\x00\x04MQTT\x04\x1e\x00\x3c\x00\x01c\x00\x01w\x00\x01m",
        False,
        "malformed packet",
        "invalid_qos",
    ),
    BadInput(
        "connect-will-retain-without-will",
        b"\x10\x0d\x00\x04MQTT\x04\x22\x00\x3c\x00\x01c",
        False,
        "malformed packet",
        "invalid_connect_flags",
    ),
    BadInput(
        "connect-will-topic-wildcard",
        b"\x10\x13\x00\x04MQTT\x04\x06\x00\x3c\x00\x01c\x00\x01#\x00\x01m",
        False,
        "malformed packet",
        "invalid_topic_name",
    ),
    BadInput(
        "unknown-protocol-name",
        encode(Connect("x", protocol_name="HTTP/1.1", protocol_level=4)),
        False,
        "malformed packet",
        "unsupported_protocol_name",
    ),
]


@pytest.mark.parametrize("bad", BAD_INPUTS, ids=[b.name for b in BAD_INPUTS])
def test_malformed_input_closes_only_that_connection(
    make_mqtt_broker: MakeBroker, mqtt_clients: Clients, broker_log: LogEntries, bad: BadInput
) -> None:
    mqtt_broker = make_mqtt_broker(mqtt={"port": 0, "max_packet_size": MAX_PACKET})
    port = mqtt_broker.mqtt_port
    watcher = mqtt_clients.paho(port).connected()
    assert watcher.subscribe(("watch/#", 1)) == [1]
    other = mqtt_clients.raw(port)
    assert other.connect().return_code == 0
    publisher = mqtt_clients.paho(port).connected()

    offender = mqtt_clients.raw(port)
    if bad.connect_first:
        assert offender.connect().return_code == 0
    offender.send_tolerant(bad.data)
    assert offender.wait_closed() == []

    warnings = [e for e in broker_log if e.get("log_level") == "warning"]
    assert any(
        bad.event in e["event"] and bad.detail in str(e.get("code", e.get("reason")))
        for e in warnings
    ), warnings
    # Everyone else carries on.
    publisher.publish("watch/x", b"still here", 1)
    msg = watcher.get()
    assert (msg.topic, msg.payload) == ("watch/x", b"still here")
    other.send(Pingreq())
    other.expect(Pingresp)
    assert publisher.disconnects.empty()
    assert watcher.disconnects.empty()


def test_packet_just_under_the_size_limit_passes(
    make_mqtt_broker: MakeBroker, mqtt_clients: Clients
) -> None:
    port = make_mqtt_broker(mqtt={"port": 0, "max_packet_size": MAX_PACKET}).mqtt_port
    client = mqtt_clients.paho(port).connected()
    assert client.subscribe(("s/x", 1)) == [1]
    # 1 type byte + 2 length bytes + 2 + 3 topic bytes + 2 packet id bytes + payload
    payload = bytes(MAX_PACKET - 10)
    client.publish("s/x", payload, 1)
    assert client.get().payload == payload


def test_violation_in_the_same_read_as_valid_packets(
    mqtt_broker: ThreadBroker, mqtt_clients: Clients
) -> None:
    """Packets before the bad one in the same segment are handled; nothing after it."""
    port = mqtt_broker.mqtt_port
    watcher = mqtt_clients.paho(port).connected()
    assert watcher.subscribe(("seg/#", 1)) == [1]
    raw = mqtt_clients.raw(port)
    assert raw.connect().return_code == 0
    raw.send(
        encode(Publish("seg/1", b"first", qos=1, packet_id=1))
        + b"\xf0\x00"
        + encode(Publish("seg/2", b"never", qos=1, packet_id=2))
    )
    raw.wait_closed()
    msg = watcher.get()
    assert (msg.topic, msg.payload) == ("seg/1", b"first")
    fence = mqtt_clients.paho(port).connected()
    fence.publish("seg/fence", b"", 1)
    assert [m.topic for m in watcher.until("seg/fence")] == []


def test_stalled_packet_and_missing_connect_time_out(
    make_mqtt_broker: MakeBroker, mqtt_clients: Clients, broker_log: LogEntries
) -> None:
    """A packet that never completes (frame_timeout_s) and a connection that never sends
    CONNECT (mqtt.connect_timeout_s) are closed; the stalled client's will goes out."""
    mqtt_broker = make_mqtt_broker(frame_timeout_s=1.0, mqtt={"port": 0, "connect_timeout_s": 1.0})
    port = mqtt_broker.mqtt_port
    watcher = mqtt_clients.paho(port).connected()
    assert watcher.subscribe(("will/#", 1)) == [1]
    silent = mqtt_clients.raw(port)
    stalled = mqtt_clients.raw(port)
    assert stalled.connect(will_topic="will/stalled", will_payload=b"stuck").return_code == 0
    stalled.send(b"\x30\x10\x00\x03a/b")  # 16 bytes announced, 5 sent
    assert silent.wait_closed() == []
    assert stalled.wait_closed() == []
    msg = watcher.get()
    assert (msg.topic, msg.payload) == ("will/stalled", b"stuck")
    assert any(e["event"] == "incomplete packet timed out" for e in broker_log), broker_log


def test_connection_limit(
    make_mqtt_broker: MakeBroker, mqtt_clients: Clients, broker_log: LogEntries
) -> None:
    """Over the broker's max_connections an MQTT socket is closed at once, without a CONNACK
    (3.1.1 has no way to refuse before CONNECT); a place that comes free is taken again."""
    mqtt_broker = make_mqtt_broker(max_connections=2)
    port = mqtt_broker.mqtt_port
    first, second = mqtt_clients.raw(port), mqtt_clients.raw(port)
    assert first.connect().return_code == 0
    assert second.connect().return_code == 0
    over = mqtt_clients.raw(port)
    over.send_tolerant(Connect(unique_id("over")))
    assert over.wait_closed() == []
    assert any(e["event"] == "connection refused: limit reached" for e in broker_log), broker_log

    first.send(Disconnect())
    assert first.wait_closed() == []
    wait_until(
        lambda: mqtt_broker.call(lambda b: len(b.connections)) < 2, "a place under the limit"
    )
    again = mqtt_clients.raw(port)
    assert again.connect().return_code == 0
    again.send(Pingreq())
    again.expect(Pingresp)


# ============================================================================================
# 6. aiomqtt


async def test_aiomqtt_round_trip(mqtt_broker: ThreadBroker) -> None:
    port = mqtt_broker.mqtt_port
    async with asyncio.timeout(15):
        async with (
            aiomqtt.Client(HOST, port, identifier=unique_id("aio")) as sub,
            aiomqtt.Client(HOST, port, identifier=unique_id("aio")) as pub,
        ):
            await sub.subscribe("aio/t", qos=1)
            payload = b"\x00\x01binary\xff"
            await pub.publish("aio/t", payload, qos=1)
            msg = await anext(sub.messages)
            assert msg.topic.value == "aio/t"
            assert msg.qos == 1
            assert msg.payload == payload


async def test_aiomqtt_wildcards(mqtt_broker: ThreadBroker) -> None:
    port = mqtt_broker.mqtt_port
    async with asyncio.timeout(15):
        async with (
            aiomqtt.Client(HOST, port, identifier=unique_id("aio")) as sub,
            aiomqtt.Client(HOST, port, identifier=unique_id("aio")) as pub,
        ):
            await sub.subscribe([("aio/+/temp", 1), ("aio/log/#", 1)])
            await pub.publish("aio/room1/temp", b"21.5", qos=1)
            await pub.publish("aio/room1/humidity", b"40", qos=1)  # matches neither
            await pub.publish("aio/room2/temp", b"19", qos=1)
            await pub.publish("aio/log", b"parent", qos=1)  # aio/log/# matches aio/log
            await pub.publish("aio/log/a/b", b"deep", qos=1)
            got = []
            for _ in range(4):
                msg = await anext(sub.messages)
                assert msg.qos == 1
                assert isinstance(msg.payload, bytes)
                got.append((msg.topic.value, msg.payload))
            assert got == [
                ("aio/room1/temp", b"21.5"),
                ("aio/room2/temp", b"19"),
                ("aio/log", b"parent"),
                ("aio/log/a/b", b"deep"),
            ]
            assert msg.topic.matches("aio/log/#")


# ============================================================================================
# 7. mosquitto_pub / mosquitto_sub (Debian's mosquitto-clients)


def mosquitto_tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.fail(
            f"{name} is not installed: these tests need Debian's mosquitto-clients "
            "(apt-get install mosquitto-clients; scripts/test.sh installs it)"
        )
    return path


@pytest.mark.parametrize("version", [None, "mqttv31", "mqttv311"])
def test_mosquitto_pub_sub(mqtt_broker: ThreadBroker, version: str | None) -> None:
    mosquitto_sub = mosquitto_tool("mosquitto_sub")
    mosquitto_pub = mosquitto_tool("mosquitto_pub")
    port = str(mqtt_broker.mqtt_port)
    extra = ["-V", version] if version else []
    sub_args = [mosquitto_sub, "-h", HOST, "-p", port, "-t", "t/#", "-C", "1", "-q", "1", "-v"]
    sub_args += ["-i", unique_id("msub"), "-W", "20", *extra]
    pub_args = [mosquitto_pub, "-h", HOST, "-p", port, "-t", "t/x", "-m", "hello", "-q", "1"]
    pub_args += ["-i", unique_id("mpub"), *extra]
    sub = subprocess.Popen(sub_args, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        wait_until(
            lambda: sub.poll() is not None or mqtt_broker.has_filter("t/#"),
            "mosquitto_sub to subscribe",
        )
        assert sub.poll() is None, sub.communicate()
        pub = subprocess.run(pub_args, capture_output=True, timeout=20)
        assert pub.returncode == 0, pub
        out, err = sub.communicate(timeout=20)
        assert sub.returncode == 0, err
        assert out == b"t/x hello\n"
    finally:
        if sub.poll() is None:
            sub.kill()
            sub.wait(10)


def test_mosquitto_sub_gets_retained_and_pub_reads_stdin(mqtt_broker: ThreadBroker) -> None:
    """``mosquitto_pub -r -s`` (message from stdin, retained), then a later
    ``mosquitto_sub -C 1`` receives it."""
    mosquitto_sub = mosquitto_tool("mosquitto_sub")
    mosquitto_pub = mosquitto_tool("mosquitto_pub")
    port = str(mqtt_broker.mqtt_port)
    pub = subprocess.run(
        [mosquitto_pub, "-h", HOST, "-p", port, "-t", "r/x", "-r", "-q", "2", "-s"],
        input=b"line one\nline two",
        capture_output=True,
        timeout=20,
    )
    assert pub.returncode == 0, pub
    sub = subprocess.run(
        [mosquitto_sub, "-h", HOST, "-p", port, "-t", "r/#", "-C", "1", "-W", "20", "-N"],
        capture_output=True,
        timeout=30,
    )
    assert sub.returncode == 0, sub
    assert sub.stdout == b"line one\nline two"
