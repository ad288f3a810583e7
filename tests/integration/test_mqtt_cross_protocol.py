"""MQTT and the VibeMQ protocol on one broker: routing both ways, payload mapping, the
``/`` <-> ``.`` address mapping, and the adapters' internal ``$mqtt...`` queues kept out of
VibeMQ clients' reach.

Clients are real: the VibeMQ client library (``vibemq_server.client.Client``) and paho-mqtt
(:class:`mqttkit.PahoClient`), against an in-process broker with MQTT on port 0 (the
``mqtt_env`` fixture, conftest.py).
"""

from __future__ import annotations

import base64
import json

import pytest
from mqttkit import MqttEnv
from waits import wait_for

from vibemq_server.adapters.mqtt.packets import Puback, Publish
from vibemq_server.client import VibeMQError

pytestmark = pytest.mark.timeout(60)

TIMEOUT = 5.0


# -- 1. MQTT -> VibeMQ queue and MQTT subscribers --------------------------------------------


async def test_mqtt_publish_reaches_vibemq_queue_and_mqtt_wildcard_subscriber(
    mqtt_env: MqttEnv,
) -> None:
    await mqtt_env.start()
    client = await mqtt_env.vibemq()
    sub = await client.subscribe("sensors.room1.temp")  # creates the queue
    assert "sensors.room1.temp" in await client.list_queues()
    watcher = await mqtt_env.paho("temp-watcher")
    assert await watcher.subscribe("sensors/+/temp", 1) == 1

    pub = await mqtt_env.paho("temp-pub")
    await pub.publish("sensors/room1/temp", b'{"celsius":21.5}', qos=1)

    msg = await sub.get(timeout=TIMEOUT)
    assert msg.queue == "sensors.room1.temp"
    assert msg.payload == {"celsius": 21.5}
    assert msg.headers["mqttTopic"] == "sensors/room1/temp"
    assert msg.headers["mqttQos"] == "1"
    assert "payloadEncoding" not in msg.headers
    await msg.ack()

    got = await watcher.get()
    assert (got.topic, got.payload, got.qos, got.retain) == (
        "sensors/room1/temp",
        b'{"celsius":21.5}',
        1,
        False,
    )
    # Another room matches the MQTT filter but has no queue.
    await pub.publish("sensors/room2/temp", b"19", qos=0)
    other = await watcher.get()
    assert (other.topic, other.payload) == ("sensors/room2/temp", b"19")
    with pytest.raises(TimeoutError):
        await sub.get(timeout=0.3)


async def test_mqtt_qos0_publish_reaches_vibemq_queue(mqtt_env: MqttEnv) -> None:
    await mqtt_env.start()
    client = await mqtt_env.vibemq()
    sub = await client.subscribe("plain.q0")
    pub = await mqtt_env.paho("q0-pub")
    await pub.publish("plain/q0", b"[1,2,3]", qos=0)
    msg = await sub.get(timeout=TIMEOUT)
    assert msg.payload == [1, 2, 3]
    assert msg.headers["mqttQos"] == "0"
    await msg.ack()


# -- 2. VibeMQ -> MQTT -----------------------------------------------------------------------


async def test_vibemq_publish_reaches_mqtt_subscribers_as_qos1_at_most(mqtt_env: MqttEnv) -> None:
    await mqtt_env.start()
    exact2 = await mqtt_env.paho("alerts-q2")
    assert await exact2.subscribe("alerts", 2) == 2
    everything = await mqtt_env.paho("alerts-all")
    assert await everything.subscribe("#", 2) == 2
    exact0 = await mqtt_env.paho("alerts-q0")
    assert await exact0.subscribe("alerts", 0) == 0

    client = await mqtt_env.vibemq()
    await client.publish("alerts", {"level": "high"})

    for sub, qos in ((exact2, 1), (everything, 1), (exact0, 0)):
        msg = await sub.get()
        assert (msg.topic, msg.qos, msg.retain) == ("alerts", qos, False)
        assert json.loads(msg.payload) == {"level": "high"}
        await sub.assert_nothing()


async def test_vibemq_publish_with_dots_arrives_on_slash_topic(mqtt_env: MqttEnv) -> None:
    await mqtt_env.start()
    sub = await mqtt_env.paho("dots")
    await sub.subscribe("plant/+/status", 1)
    client = await mqtt_env.vibemq()
    await client.publish("plant.line4.status", {"ok": True})
    msg = await sub.get()
    assert msg.topic == "plant/line4/status"
    assert json.loads(msg.payload) == {"ok": True}


async def test_vibemq_publish_waits_in_an_offline_persistent_mqtt_session(
    mqtt_env: MqttEnv,
) -> None:
    broker = await mqtt_env.start()
    away = await mqtt_env.paho("away", clean_session=False)
    await away.subscribe("alerts/#", 2)
    await away.disconnect()
    assert broker.adapters["mqtt"] is not None
    mqtt_server = broker.adapters["mqtt"]
    await wait_for(lambda: mqtt_server.sessions["away"].link is None, what="away offline")

    client = await mqtt_env.vibemq()
    await client.publish("alerts.disk", {"free": "1%"})
    back = await mqtt_env.paho("away", clean_session=False)
    assert back.session_present is True
    msg = await back.get()
    assert (msg.topic, msg.qos) == ("alerts/disk", 1)
    assert json.loads(msg.payload) == {"free": "1%"}


# -- 3. payload mapping ----------------------------------------------------------------------


async def test_json_from_mqtt_arrives_as_the_same_json(mqtt_env: MqttEnv) -> None:
    await mqtt_env.start()
    client = await mqtt_env.vibemq()
    sub = await client.subscribe("map.json")
    pub = await mqtt_env.paho("map-json")
    body = b'{ "nested": {"list": [1, 2.5, "x", null]}, "flag": true }'
    await pub.publish("map/json", body, qos=1)
    msg = await sub.get(timeout=TIMEOUT)
    assert msg.payload == json.loads(body)
    assert msg.raw == body  # a JSON payload travels as is
    assert msg.payload_bytes == body
    assert "payloadEncoding" not in msg.headers
    await msg.ack()


@pytest.mark.parametrize(
    "body", [b"\x00\xffbinary", b"plain text, not JSON", b"{broken", bytes(range(256))]
)
async def test_non_json_from_mqtt_arrives_base64_encoded(mqtt_env: MqttEnv, body: bytes) -> None:
    await mqtt_env.start()
    client = await mqtt_env.vibemq()
    sub = await client.subscribe("map.bin")
    pub = await mqtt_env.paho("map-bin")
    await pub.publish("map/bin", body, qos=1)
    msg = await sub.get(timeout=TIMEOUT)
    assert msg.headers["payloadEncoding"] == "base64"
    assert msg.payload == base64.b64encode(body).decode()
    assert msg.payload_bytes == body
    await msg.ack()


async def test_empty_mqtt_payload_arrives_empty(mqtt_env: MqttEnv) -> None:
    await mqtt_env.start()
    client = await mqtt_env.vibemq()
    sub = await client.subscribe("map.empty")
    pub = await mqtt_env.paho("map-empty")
    await pub.publish("map/empty", b"", qos=1)
    msg = await sub.get(timeout=TIMEOUT)
    assert msg.payload_bytes == b""
    assert msg.payload is None
    await msg.ack()


async def test_vibemq_json_arrives_at_mqtt_as_json_bytes(mqtt_env: MqttEnv) -> None:
    await mqtt_env.start()
    sub = await mqtt_env.paho("to-mqtt-json")
    await sub.subscribe("map/out", 1)
    client = await mqtt_env.vibemq()
    value = {"id": 42, "tags": ["a", "b"], "price": 9.99}
    await client.publish("map.out", value)
    msg = await sub.get()
    # The client sends compact JSON; MQTT gets exactly those bytes.
    assert msg.payload == json.dumps(value, separators=(",", ":")).encode()


async def test_vibemq_base64_payload_arrives_at_mqtt_as_original_bytes(mqtt_env: MqttEnv) -> None:
    await mqtt_env.start()
    sub = await mqtt_env.paho("to-mqtt-bin")
    await sub.subscribe("map/outbin", 1)
    client = await mqtt_env.vibemq()
    original = b"\x00\xff\x10binary"
    encoded = json.dumps(base64.b64encode(original).decode()).encode()
    await client.publish("map.outbin", encoded, headers={"payloadEncoding": "base64"})
    msg = await sub.get()
    assert msg.payload == original


async def test_mqtt_to_mqtt_bytes_unchanged(mqtt_env: MqttEnv) -> None:
    await mqtt_env.start()
    client = await mqtt_env.vibemq()
    queue_sub = await client.subscribe("raw.path")  # a queue on the way changes nothing
    sub = await mqtt_env.paho("raw-sub")
    await sub.subscribe("raw/path", 2)
    pub = await mqtt_env.paho("raw-pub")
    bodies = [b"\x00\xffbinary", b'{ "spaced" :  1 }', b"", b"text", bytes(range(256)) * 8]
    for qos, body in enumerate(bodies):
        await pub.publish("raw/path", body, qos=qos % 3)
    got = await sub.get_many(len(bodies))
    # Order across QoS levels is not promised (paho hands a QoS 2 message over only after
    # PUBREL): compare the set of payloads.
    assert sorted(m.payload for m in got) == sorted(bodies)
    await sub.assert_nothing()
    for body in bodies:
        msg = await queue_sub.get(timeout=TIMEOUT)
        assert msg.payload_bytes == body
        await msg.ack()


# -- 4. '.' inside a topic level -------------------------------------------------------------


async def test_dot_in_topic_level_works_mqtt_to_mqtt(mqtt_env: MqttEnv) -> None:
    broker = await mqtt_env.start()
    exact = await mqtt_env.paho("dot-exact")
    await exact.subscribe("v1.0/x", 1)
    wild = await mqtt_env.paho("dot-wild")
    await wild.subscribe("+/x", 1)
    other = await mqtt_env.paho("dot-other")
    await other.subscribe("v1/#", 1)  # 'v1.0' is one level, not 'v1' then '0'

    pub = await mqtt_env.paho("dot-pub")
    await pub.publish("v1.0/x", b"versioned", qos=1)
    for sub in (exact, wild):
        msg = await sub.get()
        assert (msg.topic, msg.payload) == ("v1.0/x", b"versioned")
    await other.assert_nothing()

    # The address 'v1/0.x' is no valid queue name: no queue, and VibeMQ cannot name it.
    client = await mqtt_env.vibemq()
    assert not [q for q in await client.list_queues() if "v1" in q]
    assert not [q for q in broker.manager.queues if q.startswith("v1")]
    with pytest.raises(VibeMQError) as err:
        await client.subscribe("v1/0.x")
    assert err.value.code == "INVALID_QUEUE"


# -- 5. an MQTT publish does not create queues -----------------------------------------------


async def test_mqtt_publish_does_not_create_a_queue(mqtt_env: MqttEnv) -> None:
    broker = await mqtt_env.start()
    client = await mqtt_env.vibemq()
    before = await client.list_queues()
    pub = await mqtt_env.paho("no-create")
    await pub.publish("nobody/listens/here", b'{"lost":true}', qos=1)
    await pub.publish("nobody/listens/here", b"qos2", qos=2)
    await pub.publish("nobody/listens/here", b"qos0", qos=0)
    await pub.publish("nobody/retained", b"r", qos=1, retain=True)
    # The QoS 0 publish has no ack: a QoS 1 one after it proves it was handled.
    await pub.publish("nobody/barrier", b"b", qos=1)
    after = await client.list_queues()
    assert after == before
    assert "nobody.listens.here" not in broker.manager.queues
    assert "nobody.retained" not in broker.manager.queues


async def test_mqtt_publish_reaches_a_queue_created_later(mqtt_env: MqttEnv) -> None:
    await mqtt_env.start()
    client = await mqtt_env.vibemq()
    pub = await mqtt_env.paho("later")
    await pub.publish("later/q", b'"before"', qos=1)
    await client.create_queue("later.q")
    await pub.publish("later/q", b'"after"', qos=1)
    sub = await client.subscribe("later.q")
    msg = await sub.get(timeout=TIMEOUT)
    assert msg.payload == "after"  # the one published before the queue existed is gone
    await msg.ack()
    with pytest.raises(TimeoutError):
        await sub.get(timeout=0.3)


# -- 6. internal queues ----------------------------------------------------------------------


async def test_internal_queues_hidden_and_out_of_reach(mqtt_env: MqttEnv) -> None:
    broker = await mqtt_env.start()
    # Make every kind of internal queue exist: retained, sessions and a session queue.
    persistent = await mqtt_env.paho("internal-sess", clean_session=False)
    await persistent.subscribe("internal/t", 1)
    pub = await mqtt_env.paho("internal-pub")
    await pub.publish("internal/t", b"retained", qos=1, retain=True)
    assert (await persistent.get()).payload == b"retained"
    internal = {"$mqtt.retained", "$mqtt.sessions", "$mqtt.s.internal-sess"}
    await wait_for(lambda: internal <= set(broker.manager.queues), what="internal queues")

    client = await mqtt_env.vibemq()
    await client.create_queue("visible")
    names = await client.list_queues()
    assert "visible" in names
    assert not [n for n in names if n.startswith("$")]

    for name in sorted(internal):
        with pytest.raises(VibeMQError) as err:
            await client.publish(name, {"evil": True})
        assert err.value.code == "INVALID_QUEUE"
        with pytest.raises(VibeMQError) as err:
            await client.subscribe(name)
        assert err.value.code == "INVALID_QUEUE"
        with pytest.raises(VibeMQError) as err:
            await client.queue_info(name)
        assert err.value.code == "INVALID_QUEUE"
        with pytest.raises(VibeMQError) as err:
            await client.delete_queue(name)
        assert err.value.code == "INVALID_QUEUE"
        with pytest.raises(VibeMQError) as err:
            await client.create_queue(name)
        assert err.value.code == "INVALID_QUEUE"

    # Nothing was touched: the retained message and the session are intact.
    assert internal <= set(broker.manager.queues)
    late = await mqtt_env.paho("internal-late")
    await late.subscribe("internal/#", 1)
    msg = await late.get()
    assert (msg.payload, msg.retain) == (b"retained", True)
    await pub.publish("internal/t", b"live", qos=1)
    assert (await persistent.get()).payload == b"live"


async def test_mqtt_cannot_reach_internal_queues(mqtt_env: MqttEnv) -> None:
    broker = await mqtt_env.start()
    victim = await mqtt_env.paho("victim", clean_session=False)
    await victim.subscribe("victim/t", 1)
    spy = await mqtt_env.paho("spy")
    assert await spy.subscribe("$mqtt/#", 2) == 2  # a valid filter, but sees nothing internal
    pub = await mqtt_env.paho("intruder")
    await pub.publish("victim/t", b"retained", qos=1, retain=True)
    assert (await victim.get()).payload == b"retained"
    queues = broker.manager.queues
    before = {n: (q.message_count, len(q.parked)) for n, q in queues.items() if n[0] == "$"}
    assert set(before) >= {"$mqtt.retained", "$mqtt.sessions", "$mqtt.s.victim"}

    # Topics whose address is an internal queue's name: no queue is reached ('$' is not a
    # queue name character), only MQTT subscribers of those topics (the spy).
    for topic in ("$mqtt/retained", "$mqtt/sessions", "$mqtt/s/victim"):
        await pub.publish(topic, b'{"filters":{"#":2}}', qos=1, retain=False)
    spied = await spy.get_many(3)
    assert sorted(m.topic for m in spied) == ["$mqtt/retained", "$mqtt/s/victim", "$mqtt/sessions"]
    await spy.assert_nothing()  # retained and session bookkeeping is not routed anywhere
    after = {n: (q.message_count, len(q.parked)) for n, q in queues.items() if n[0] == "$"}
    assert after == before
    await victim.assert_nothing()


async def test_vibemq_publishes_to_a_slow_mqtt_subscriber_stall_no_mqtt_connection(
    mqtt_env: MqttEnv,
) -> None:
    """A VibeMQ publisher is not paused for slow MQTT subscribers, and neither is any MQTT
    connection on its behalf: the subscriber's own acknowledgements and an unrelated
    client's packets are handled at once. (The pause bound is set far above the test's
    timeout, so a wrongly paused connection fails the test instead of slowing it.)"""
    broker = await mqtt_env.start(max_inflight=1, max_queued_messages=4, max_publisher_pause_s=60)
    slow, _ = await mqtt_env.raw("slow")
    assert await slow.subscribe("alerts", 1) == 1
    other, _ = await mqtt_env.raw("bystander")
    client = await mqtt_env.vibemq()

    # 1 in flight, 4 queued: the subscriber is behind. It catches up by acknowledging.
    for i in range(5):
        await client.publish("alerts", {"i": i})
    for i in range(5):
        got = await slow.expect(Publish)
        assert json.loads(got.payload) == {"i": i}
        assert got.packet_id is not None
        await slow.send(Puback(got.packet_id))
    assert await slow.barrier() == []

    # Behind again; an unrelated client is not held up by it.
    for i in range(5):
        await client.publish("alerts", {"i": i})
    assert await other.barrier(0) == []
    assert await other.barrier(0) == []
    await other.send(Publish("elsewhere", b"x", qos=1, packet_id=1))
    assert (await other.expect(Puback)).packet_id == 1
    assert broker.adapters["mqtt"] is not None and broker.adapters["mqtt"].congested == []
