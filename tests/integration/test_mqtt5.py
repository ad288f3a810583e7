"""MQTT 5.0 on the MQTT listener, with real clients: paho-mqtt (``protocol=MQTTv5``), the raw
v5 client (``RawMqtt(v5=True)``) for what paho will not send, and Debian's ``mosquitto_pub`` /
``mosquitto_sub -V mqttv5``.

Covered: CONNACK properties, properties carried end to end, message expiry, topic aliases
both ways, subscription options (No Local, Retain As Published, Retain Handling,
subscription identifiers), session expiry, will delay, 3.1.1 and v5 clients on one topic,
takeover, and bad input answered with the standard's reason code and a DISCONNECT.
"""

from __future__ import annotations

import asyncio
import subprocess
import time
from typing import Any

import aiomqtt
import pytest
from mqttkit import HOST, RawMqtt, unique_id
from mqttutil import V5, Clients, MakeBroker, ThreadBroker, props, v5
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.subscribeoptions import SubscribeOptions

from vibemq_server.adapters.mqtt.packets5 import (
    Connack5,
    Disconnect5,
    Properties,
    Puback5,
    Publish5,
    Pubrec5,
    Suback5,
    SubOptions,
    Subscribe5,
)

pytestmark = pytest.mark.timeout(60)

# -- CONNECT / CONNACK ---------------------------------------------------------------------------


def test_connack_tells_what_the_broker_supports(
    mqtt_broker: ThreadBroker, mqtt_clients: Clients
) -> None:
    client = mqtt_clients.paho(mqtt_broker.mqtt_port, "", protocol=V5)
    rc = client.connect()
    assert rc == 0
    got = client.connack_props
    assert got.ReceiveMaximum == 1000
    assert got.TopicAliasMaximum == 1024
    assert got.RetainAvailable == 1
    assert got.WildcardSubscriptionAvailable == 1
    assert got.SubscriptionIdentifierAvailable == 1
    assert got.SharedSubscriptionAvailable == 1
    assert got.MaximumPacketSize > 1_000_000
    assert got.AssignedClientIdentifier.startswith("auto-")


def test_raw_connack_and_enhanced_auth_refused(
    mqtt_broker: ThreadBroker, mqtt_clients: Clients
) -> None:
    raw = mqtt_clients.raw(mqtt_broker.mqtt_port, v5=True)
    ack = raw.connect5(properties=Properties(authentication_method="SCRAM-SHA-1"))
    assert ack.reason_code == 0x8C
    assert raw.wait_closed() == []


# -- publish / subscribe with properties ---------------------------------------------------------


def test_properties_travel_end_to_end(mqtt_broker: ThreadBroker, mqtt_clients: Clients) -> None:
    sub = v5(mqtt_clients, mqtt_broker)
    assert sub.subscribe(("p5/#", 1)) == [1]
    pub = v5(mqtt_clients, mqtt_broker)
    sent = props(
        UserProperty=[("k", "v"), ("a", "b")],
        ContentType="text/plain",
        ResponseTopic="p5/reply",
        CorrelationData=b"\x01\x02",
        PayloadFormatIndicator=1,
        MessageExpiryInterval=120,
    )
    pub.publish("p5/x", b"hello", 1, properties=sent)
    msg = sub.get()
    assert msg.payload == b"hello"
    got = msg.properties
    assert sorted(got.UserProperty) == [("a", "b"), ("k", "v")]
    assert got.ContentType == "text/plain"
    assert got.ResponseTopic == "p5/reply"
    assert got.CorrelationData == b"\x01\x02"
    assert got.PayloadFormatIndicator == 1
    assert 0 < got.MessageExpiryInterval <= 120


def test_v311_and_v5_subscribers_on_one_topic(
    mqtt_broker: ThreadBroker, mqtt_clients: Clients
) -> None:
    old = mqtt_clients.paho(mqtt_broker.mqtt_port).connected()
    new = v5(mqtt_clients, mqtt_broker)
    assert old.subscribe(("mix/t", 1)) == [1]
    assert new.subscribe(("mix/t", 1)) == [1]
    # a 3.1.1 publisher and a v5 one
    old.publish("mix/t", b"from-311", 1)
    new.publish("mix/t", b"from-5", 1, properties=props(UserProperty=[("x", "1")]))
    for client in (old, new):
        got = sorted(client.get().payload for _ in range(2))
        assert got == [b"from-311", b"from-5"]


def test_no_local_and_retain_as_published_and_retain_handling(
    mqtt_broker: ThreadBroker, mqtt_clients: Clients
) -> None:
    me = v5(mqtt_clients, mqtt_broker)
    other = v5(mqtt_clients, mqtt_broker)
    me.publish("opt/r", b"kept", 1, retain=True)
    # Retain Handling 2: no retained message on subscribe; No Local: not my own publishes
    assert me.subscribe(("opt/#", SubscribeOptions(1, noLocal=True, retainHandling=2))) == [1]
    # Retain As Published: the retain flag stays on a live message
    assert other.subscribe(("opt/#", SubscribeOptions(1, retainAsPublished=True))) == [1]
    first = other.get()
    assert (first.payload, first.retain) == (b"kept", True)  # retained, on subscribe
    me.publish("opt/live", b"mine", 1, retain=True)
    other.publish("opt/fence", b"f", 1)
    msgs = me.until("opt/fence")
    assert msgs == []  # neither the retained message nor my own publish
    live = other.get()
    assert (live.payload, live.retain) == (b"mine", True)


def test_retained_message_keeps_its_properties(
    mqtt_broker: ThreadBroker, mqtt_clients: Clients
) -> None:
    pub = v5(mqtt_clients, mqtt_broker)
    pub.publish("ret5/t", b"r", 1, retain=True, properties=props(UserProperty=[("src", "sensor")]))
    sub = v5(mqtt_clients, mqtt_broker)
    assert sub.subscribe(("ret5/#", 1)) == [1]
    msg = sub.get()
    assert (msg.payload, msg.retain) == (b"r", True)
    assert msg.properties.UserProperty == [("src", "sensor")]


def test_subscription_identifiers(mqtt_broker: ThreadBroker, mqtt_clients: Clients) -> None:
    sub = v5(mqtt_clients, mqtt_broker)
    assert sub.subscribe(
        ("sid/a", 1), properties=props(PacketTypes.SUBSCRIBE, SubscriptionIdentifier=7)
    ) == [1]
    assert sub.subscribe(
        ("sid/+", 0), properties=props(PacketTypes.SUBSCRIBE, SubscriptionIdentifier=9)
    ) == [0]
    pub = v5(mqtt_clients, mqtt_broker)
    pub.publish("sid/a", b"both", 1)
    msg = sub.get()
    assert msg.qos == 1  # the highest granted QoS of the matching filters
    assert sorted(msg.properties.SubscriptionIdentifier) == [7, 9]


def test_topic_aliases_from_the_client(mqtt_broker: ThreadBroker, mqtt_clients: Clients) -> None:
    # (paho 2.2 does not resolve aliases the server sends: this subscriber allows none, and
    # the broker's own aliases are checked on the wire below)
    sub = v5(mqtt_clients, mqtt_broker)
    assert sub.subscribe(("alias/#", 0)) == [0]
    raw = mqtt_clients.raw(mqtt_broker.mqtt_port, v5=True)
    assert raw.connect5().reason_code == 0
    raw.send(
        Publish5("alias/one", b"1", properties=Properties(topic_alias=3)),
        Publish5("", b"2", properties=Properties(topic_alias=3)),
    )
    got = [sub.get(), sub.get()]
    assert [(m.topic, m.payload) for m in got] == [("alias/one", b"1"), ("alias/one", b"2")]


def test_outbound_alias_on_the_wire(mqtt_broker: ThreadBroker, mqtt_clients: Clients) -> None:
    raw = mqtt_clients.raw(mqtt_broker.mqtt_port, v5=True)
    assert raw.connect5(properties=Properties(topic_alias_maximum=2)).reason_code == 0
    raw.send(Subscribe5(1, (("oa/t", SubOptions(0)),)))
    raw.expect(Suback5)
    pub = v5(mqtt_clients, mqtt_broker)
    pub.publish("oa/t", b"a")
    pub.publish("oa/t", b"b")
    first = raw.expect(Publish5)
    second = raw.expect(Publish5)
    assert (first.topic, first.properties.topic_alias) == ("oa/t", 1)
    assert (second.topic, second.properties.topic_alias, second.payload) == ("", 1, b"b")


def test_maximum_packet_size_of_the_client_is_respected(
    mqtt_broker: ThreadBroker, mqtt_clients: Clients
) -> None:
    raw = mqtt_clients.raw(mqtt_broker.mqtt_port, v5=True)
    assert raw.connect5(properties=Properties(maximum_packet_size=100)).reason_code == 0
    raw.send(Subscribe5(1, (("mps/#", SubOptions(0)),)))
    raw.expect(Suback5)
    pub = v5(mqtt_clients, mqtt_broker)
    pub.publish("mps/big", b"x" * 500)
    pub.publish("mps/small", b"ok")
    got = raw.expect(Publish5)
    assert (got.topic, got.payload) == ("mps/small", b"ok")


def test_sys_updates_reach_a_v5_subscriber(
    make_mqtt_broker: MakeBroker, mqtt_clients: Clients
) -> None:
    broker = make_mqtt_broker(mqtt={"sys_interval_s": 0.05})
    sub = v5(mqtt_clients, broker)
    assert sub.subscribe(("$SYS/broker/messages/received", 0)) == [0]
    first = sub.get()
    assert first.retain
    v5(mqtt_clients, broker).publish("sys5/x", b"x", 1)
    later = sub.get()  # a live update, as 3.1.1 subscribers get it
    assert not later.retain
    assert int(later.payload) >= 1


def test_v5_over_websockets(make_mqtt_broker: MakeBroker, mqtt_clients: Clients) -> None:
    """paho with MQTT 5.0 over the WebSocket listener (the same session as over TCP)."""
    broker = make_mqtt_broker(mqtt={"ws_port": 0})
    port = broker.call(lambda b: b.ready())["mqtt_ws"]
    assert isinstance(port, int)
    sub = mqtt_clients.paho(port, protocol=V5, transport="websockets").connected()
    assert sub.subscribe(("ws5/#", 1)) == [1]
    pub = v5(mqtt_clients, broker)  # over TCP
    pub.publish("ws5/t", b"over ws", 1, properties=props(UserProperty=[("via", "tcp")]))
    msg = sub.get()
    assert (msg.payload, msg.properties.UserProperty) == (b"over ws", [("via", "tcp")])


# -- sessions ------------------------------------------------------------------------------------


def test_session_expiry_keeps_the_session_and_its_messages(
    mqtt_broker: ThreadBroker, mqtt_clients: Clients
) -> None:
    cid = unique_id("exp")
    keep = props(PacketTypes.CONNECT, SessionExpiryInterval=300)
    first = v5(mqtt_clients, mqtt_broker, cid, clean_start=True, properties=keep)
    assert first.subscribe(("se/t", 1)) == [1]
    first.disconnect()
    pub = v5(mqtt_clients, mqtt_broker)
    pub.publish("se/t", b"while-away", 1)
    again = mqtt_clients.paho(mqtt_broker.mqtt_port, cid, protocol=V5)
    assert again.connect(clean_start=False, properties=keep) == 0
    assert again.get().payload == b"while-away"


def test_session_expiry_zero_forgets_the_session(
    mqtt_broker: ThreadBroker, mqtt_clients: Clients
) -> None:
    cid = unique_id("noexp")
    first = mqtt_clients.raw(mqtt_broker.mqtt_port, v5=True)
    assert first.connect5(cid, clean_start=False).reason_code == 0
    first.send(Subscribe5(1, (("se0/t", SubOptions(1)),)))
    first.expect(Suback5)
    first.disconnect_and_wait()
    assert not mqtt_broker.has_session(cid)
    raw = mqtt_clients.raw(mqtt_broker.mqtt_port, v5=True)
    ack = raw.connect5(cid, clean_start=False)
    assert ack.session_present is False


def test_takeover_sends_disconnect_0x8e(mqtt_broker: ThreadBroker, mqtt_clients: Clients) -> None:
    cid = unique_id("take")
    old = mqtt_clients.raw(mqtt_broker.mqtt_port, v5=True)
    assert old.connect5(cid).reason_code == 0
    new = mqtt_clients.raw(mqtt_broker.mqtt_port, v5=True)
    assert new.connect5(cid).reason_code == 0
    assert old.wait_closed() == [Disconnect5(0x8E, Properties(reason_string="session_taken_over"))]


def test_will_delay_waits_and_a_return_cancels_it(
    mqtt_broker: ThreadBroker, mqtt_clients: Clients
) -> None:
    watcher = v5(mqtt_clients, mqtt_broker)
    assert watcher.subscribe(("wd/#", 1)) == [1]
    cid = unique_id("will")
    raw = mqtt_clients.raw(mqtt_broker.mqtt_port, v5=True)
    ack = raw.connect5(
        cid,
        properties=Properties(session_expiry_interval=60),
        will_topic="wd/gone",
        will_payload=b"bye",
        will_qos=1,
        will_properties=Properties(will_delay_interval=1, user_properties=(("why", "test"),)),
    )
    assert ack.reason_code == 0
    raw.close()  # abnormal: the will is due after 1 s
    msg = watcher.get(timeout=5)
    assert (msg.topic, msg.payload) == ("wd/gone", b"bye")
    assert msg.properties.UserProperty == [("why", "test")]


# -- bad input -----------------------------------------------------------------------------------


def _connected_raw(broker: ThreadBroker, clients: Clients, **fields: Any) -> RawMqtt:
    raw = clients.raw(broker.mqtt_port, v5=True)
    ack = raw.connect5(**fields)
    assert ack.reason_code == 0, ack
    return raw


def _disconnect_reason(raw: RawMqtt) -> int:
    packets = raw.wait_closed()
    assert packets and isinstance(packets[-1], Disconnect5), packets
    return int(packets[-1].reason_code)


def _publish(body: bytes) -> bytes:
    """A QoS 0 PUBLISH around a hand-made body (topic, properties, payload)."""
    return bytes((0x30, len(body))) + body


@pytest.mark.parametrize(
    ("wire", "reason"),
    [
        # topic alias 0
        (_publish(b"\x00\x01t\x03\x23\x00\x00"), 0x94),
        # topic alias above the maximum (1024)
        (_publish(b"\x00\x01t\x03\x23\x04\x01"), 0x94),
        # an alias never set, with an empty topic
        (_publish(b"\x00\x00\x03\x23\x00\x09"), 0x82),
        # duplicate property (Content Type twice)
        (_publish(b"\x00\x01t\x08\x03\x00\x01a\x03\x00\x01b"), 0x82),
        # unknown property id 0x7f
        (_publish(b"\x00\x01t\x02\x7f\x00"), 0x81),
        # wrong value: Payload Format Indicator 2
        (_publish(b"\x00\x01t\x02\x01\x02"), 0x82),
        # AUTH after CONNECT without an authentication method
        (b"\xf0\x00", 0x82),
    ],
    ids=[
        "alias-0",
        "alias-over-max",
        "alias-unset",
        "dup-prop",
        "unknown-prop",
        "bad-value",
        "auth",
    ],
)
def test_bad_input_gets_reason_code_and_disconnect(
    mqtt_broker: ThreadBroker, mqtt_clients: Clients, wire: bytes, reason: int
) -> None:
    bystander = v5(mqtt_clients, mqtt_broker)
    assert bystander.subscribe(("bad/#", 0)) == [0]
    raw = _connected_raw(mqtt_broker, mqtt_clients)
    raw.send(wire)
    assert _disconnect_reason(raw) == reason
    # nothing else disturbed
    bystander.publish("bad/ok", b"still", 0)
    assert bystander.get().payload == b"still"


def test_packet_over_the_maximum_gets_0x95(
    make_mqtt_broker: MakeBroker,
    mqtt_clients: Clients,
) -> None:
    broker = make_mqtt_broker(mqtt={"max_packet_size": 1024})
    bystander = v5(mqtt_clients, broker)
    assert bystander.subscribe(("big", 1)) == [1]
    raw = _connected_raw(broker, mqtt_clients)
    raw.send(Publish5("big", b"x" * 2000))
    assert _disconnect_reason(raw) == 0x95
    # nothing else disturbed, and a packet at the limit still goes through
    bystander.publish("big", b"y" * 900, 1)
    assert bystander.get().payload == b"y" * 900


def test_receive_maximum_exceeded_gets_0x93(
    make_mqtt_broker: MakeBroker,
    mqtt_clients: Clients,
) -> None:
    broker = make_mqtt_broker(mqtt={"receive_maximum": 2})
    raw = _connected_raw(broker, mqtt_clients)
    raw.send(*(Publish5("rm", b"x", 2, packet_id=i) for i in (1, 2, 3)))
    packets = raw.wait_closed()
    assert [type(p) for p in packets] == [Pubrec5, Pubrec5, Disconnect5]
    assert packets[-1].reason_code == 0x93


def test_negative_puback_when_not_authorized(
    make_mqtt_broker: MakeBroker,
    mqtt_clients: Clients,
) -> None:
    broker = make_mqtt_broker(mqtt={"deny_publish": ["secret/#"]})
    raw = _connected_raw(broker, mqtt_clients)
    raw.send(Publish5("secret/x", b"x", 1, packet_id=5))
    assert raw.expect(Puback5) == Puback5(5, 0x87)


def test_server_shutdown_sends_0x8b(
    make_mqtt_broker: MakeBroker,
    mqtt_clients: Clients,
) -> None:
    broker = make_mqtt_broker()
    raw = _connected_raw(broker, mqtt_clients)
    broker.stop()
    assert _disconnect_reason(raw) == 0x8B


def test_connack_reason_for_bad_credentials(
    make_mqtt_broker: MakeBroker,
    mqtt_clients: Clients,
) -> None:
    broker = make_mqtt_broker(mqtt={"users": {"alice": "pw"}})
    raw = mqtt_clients.raw(broker.mqtt_port, v5=True)
    ack = raw.connect5(username="alice", password=b"wrong")
    assert isinstance(ack, Connack5)
    assert ack.reason_code == 0x86


# -- mosquitto's command-line clients --------------------------------------------------------


def test_mosquitto_clients_v5_with_properties(mqtt_broker: ThreadBroker) -> None:
    port = str(mqtt_broker.mqtt_port)
    sub = subprocess.Popen(
        [
            "mosquitto_sub",
            "-V",
            "mqttv5",
            "-p",
            port,
            "-h",
            "127.0.0.1",
            "-t",
            "mq5/#",
            "-C",
            "1",
            "-W",
            "10",
            "-F",
            "%t %p %P",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 10
        while not mqtt_broker.has_filter("mq5/#"):
            assert time.monotonic() < deadline, "mosquitto_sub never subscribed"
            time.sleep(0.02)
        subprocess.run(
            [
                "mosquitto_pub",
                "-V",
                "mqttv5",
                "-p",
                port,
                "-h",
                "127.0.0.1",
                "-t",
                "mq5/x",
                "-m",
                "hi",
                "-q",
                "1",
                "-D",
                "publish",
                "user-property",
                "color",
                "blue",
                "-D",
                "publish",
                "message-expiry-interval",
                "60",
            ],
            check=True,
            timeout=10,
        )
        out, _ = sub.communicate(timeout=10)
    finally:
        sub.kill()
    assert out.strip() == "mq5/x hi color:blue"


# -- aiomqtt (MQTT 5.0) ----------------------------------------------------------------------


async def test_aiomqtt_v5_properties_options_and_shared_group(mqtt_broker: ThreadBroker) -> None:
    port = mqtt_broker.mqtt_port
    v5 = aiomqtt.ProtocolVersion.V5
    async with asyncio.timeout(20):
        async with (
            aiomqtt.Client(HOST, port, identifier=unique_id("aio5"), protocol=v5) as sub,
            aiomqtt.Client(HOST, port, identifier=unique_id("aio5"), protocol=v5) as member,
            aiomqtt.Client(HOST, port, identifier=unique_id("aio5"), protocol=v5) as pub,
        ):
            sid = props(PacketTypes.SUBSCRIBE, SubscriptionIdentifier=42)
            await sub.subscribe("aio5/t", qos=1, properties=sid)
            # Retain Handling 2 through aiomqtt's options
            await pub.subscribe("aio5/#", options=SubscribeOptions(qos=1, retainHandling=2))
            await member.subscribe("$share/aiog/aio5/t", qos=1)
            await pub.publish(
                "aio5/t",
                b"v5",
                qos=1,
                properties=props(UserProperty=[("k", "v")], ContentType="text/plain"),
            )
            msg = await anext(sub.messages)
            assert (msg.topic.value, msg.payload, msg.qos) == ("aio5/t", b"v5", 1)
            assert msg.properties is not None
            assert msg.properties.UserProperty == [("k", "v")]
            assert msg.properties.ContentType == "text/plain"
            assert msg.properties.SubscriptionIdentifier == [42]
            shared = await anext(member.messages)
            assert shared.payload == b"v5"
            own = await anext(pub.messages)  # (no No Local: its own publish comes back)
            assert own.payload == b"v5"
