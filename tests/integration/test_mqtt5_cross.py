"""MQTT 5.0 across protocols, and shared subscriptions.

* v5 properties through the core and back: user properties, content type, message expiry to
  an AMQP queue bound to ``amq.topic`` and to a VibeMQ queue, and AMQP / VibeMQ headers to a v5
  subscriber as user properties.
* ``$share/{group}/{filter}`` for v5 and 3.1.1 clients: round robin across the group, a
  member that leaves gives its unacknowledged messages to another, and the group is the
  RoundRobin queue ``group`` that VibeMQ consumers share with the MQTT members.

Real clients: paho-mqtt (v5 and 3.1.1), pika, the VibeMQ client, the raw MQTT client; one
broker on a thread of its own (``amqp``, with MQTT and VibeMQ listeners too).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import paho.mqtt.client as mqtt
import pika
import pytest
from amqputil import AmqpBroker, get_message
from mqttkit import RawMqtt
from mqttutil import Paho
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties as PahoProperties
from pika.adapters import blocking_connection as blocking
from waits import wait_until

from vibemq_server.adapters.mqtt.packets import (
    Puback,
    Publish,
    Subscribe,
    Unsuback,
    Unsubscribe,
)
from vibemq_server.adapters.mqtt.packets5 import (
    Properties,
    Puback5,
    Publish5,
    Suback5,
    SubOptions,
    Subscribe5,
)
from vibemq_server.client import Client

pytestmark = pytest.mark.timeout(60)


def publish_props(**values: object) -> PahoProperties:
    p = PahoProperties(PacketTypes.PUBLISH)
    for name, value in values.items():
        setattr(p, name, value)
    return p


@pytest.fixture
def paho5(amqp: AmqpBroker) -> Iterator[Callable[..., Paho]]:
    """Connected MQTT clients of ``amqp``: v5 unless ``protocol`` says otherwise."""
    made: list[Paho] = []

    def make(protocol: int = mqtt.MQTTv5) -> Paho:
        client = Paho(amqp.mqtt_port, protocol=protocol)
        made.append(client)
        return client.connected()

    yield make
    for client in made:
        with contextlib.suppress(Exception):
            client.disconnect()


@pytest.fixture
def raws(amqp: AmqpBroker) -> Iterator[Callable[[], RawMqtt]]:
    made: list[RawMqtt] = []

    def make() -> RawMqtt:
        raw = RawMqtt(amqp.mqtt_port)
        made.append(raw)
        return raw

    yield make
    for raw in made:
        raw.close()


# -- properties across protocols -------------------------------------------------------------


def test_v5_properties_reach_an_amqp_consumer(
    ch: blocking.BlockingChannel, paho5: Callable[..., Paho]
) -> None:
    ch.queue_declare("v5-events")
    ch.queue_bind("v5-events", "amq.topic", "v5.#")
    pub = paho5()
    pub.publish(
        "v5/x",
        b"payload",
        1,
        properties=publish_props(
            UserProperty=[("tenant", "acme")], ContentType="text/plain", MessageExpiryInterval=60
        ),
    )
    _, props, body = get_message(ch, "v5-events")
    assert body == b"payload"
    assert props.headers is not None and props.headers["tenant"] == "acme"
    assert props.content_type == "text/plain"
    # the Message Expiry Interval as the AMQP expiration: what is left of it, ms
    assert props.expiration is not None and 0 < int(props.expiration) <= 60_000


def _expiry_left_ms(amqp: AmqpBroker, queue: str) -> list[int]:
    """What is left of the TTL of each message waiting in ``queue`` (0: none)."""

    def look(b: Any) -> list[int]:
        now = b.manager.clock()
        return [m.expires_at - now if m.expires_at else 0 for m in b.manager.queues[queue].ready()]

    return list(amqp.call(look))


def test_message_expiry_goes_into_amqp_and_vibemq_queues(
    amqp: AmqpBroker, ch: blocking.BlockingChannel, paho5: Callable[..., Paho]
) -> None:
    ch.queue_declare("exp.amqp")
    ch.queue_bind("exp.amqp", "amq.topic", "exp.#")
    ch.queue_declare("exp.vibemq")  # the queue named by the topic's address
    pub = paho5()
    pub.publish("exp/vibemq", b"x", 1, properties=publish_props(MessageExpiryInterval=60))
    for queue in ("exp.amqp", "exp.vibemq"):

        def arrived(name: str = queue) -> bool:
            return len(_expiry_left_ms(amqp, name)) == 1

        wait_until(arrived, f"the message in {queue}")
        (left,) = _expiry_left_ms(amqp, queue)
        assert 0 < left <= 60_000, (queue, left)


def test_amqp_expiration_reaches_a_v5_subscriber(
    ch: blocking.BlockingChannel, paho5: Callable[..., Paho]
) -> None:
    sub = paho5()
    assert sub.subscribe(("amqp-exp/#", 1)) == [1]
    ch.basic_publish("amq.topic", "amqp-exp.x", b"soon", pika.BasicProperties(expiration="30000"))
    msg = sub.get()
    assert msg.payload == b"soon"
    assert 0 < msg.properties.MessageExpiryInterval <= 30


def test_amqp_headers_reach_a_v5_subscriber_as_user_properties(
    ch: blocking.BlockingChannel, paho5: Callable[..., Paho]
) -> None:
    sub = paho5()
    assert sub.subscribe(("from-amqp/#", 1)) == [1]
    ch.basic_publish(
        "amq.topic",
        "from-amqp.x",
        b"hi",
        pika.BasicProperties(headers={"tenant": "acme"}, content_type="text/plain"),
    )
    msg = sub.get()
    assert msg.payload == b"hi"
    assert ("tenant", "acme") in msg.properties.UserProperty
    assert msg.properties.ContentType == "text/plain"


async def test_v5_properties_and_expiry_into_a_vibemq_queue_and_back(
    paho5: Callable[..., Paho], vibemq: Callable[[], Awaitable[Client]]
) -> None:
    client = await vibemq()
    queue = await client.subscribe("orders.v5")  # creates the queue
    watcher = paho5()
    assert watcher.subscribe(("orders/v5", 1)) == [1]
    pub = paho5()
    pub.publish(
        "orders/v5",
        b'{"n":1}',
        1,
        properties=publish_props(
            UserProperty=[("k", "v")], ResponseTopic="replies/1", MessageExpiryInterval=30
        ),
    )
    msg = await queue.get(timeout=5)
    assert msg.payload == {"n": 1}
    assert msg.headers["k"] == "v"
    assert msg.headers["responseTopic"] == "replies/1"
    await msg.ack()
    got = watcher.get()
    assert 0 < got.properties.MessageExpiryInterval <= 30
    # and back: a VibeMQ publish with headers reaches the v5 subscriber as user properties
    await client.publish("orders.v5", {"n": 2}, headers={"origin": "vibemq"})
    back = watcher.get()
    assert back.payload == b'{"n":2}'
    assert ("origin", "vibemq") in back.properties.UserProperty


def test_expired_message_is_not_delivered_from_a_persistent_session(
    amqp: AmqpBroker, paho5: Callable[..., Paho]
) -> None:
    """A QoS 1 message waits in an offline v5 session's queue with the core's TTL."""
    sub = Paho(amqp.mqtt_port, "exp-sub", protocol=mqtt.MQTTv5)
    keep = PahoProperties(PacketTypes.CONNECT)
    keep.SessionExpiryInterval = 300
    sub.connected(clean_start=True, properties=keep)
    assert sub.subscribe(("ttl/#", 1)) == [1]
    sub.disconnect()
    pub = paho5()
    pub.publish("ttl/short", b"gone", 1, properties=publish_props(MessageExpiryInterval=1))
    pub.publish("ttl/long", b"kept", 1, properties=publish_props(MessageExpiryInterval=600))

    def expired() -> bool:
        # The long one is queued, and the short one has expired: still in the store past its
        # expiry, or already taken out of it by the housekeeping tick (which may come first).
        def look(b: Any) -> bool:
            session = b.adapters["mqtt"].sessions["exp-sub"]
            now = b.manager.clock()
            ttls = [m.expires_at - now for m in session.queue.ready() if m.expires_at]
            return any(t > 60_000 for t in ttls) and all(t <= 0 or t > 60_000 for t in ttls)

        return bool(amqp.call(look))

    wait_until(expired, "the short message's expiry", timeout=5)
    again = Paho(amqp.mqtt_port, "exp-sub", protocol=mqtt.MQTTv5)
    try:
        again.connected(clean_start=False, properties=keep)
        msg = again.get()
        assert msg.payload == b"kept"
        assert 0 < msg.properties.MessageExpiryInterval <= 600
    finally:
        again.disconnect()


def test_v5_fan_out_follows_subscriptions_that_come_and_go(paho5: Callable[..., Paho]) -> None:
    """The server keeps a topic's deliveries per session while its subscribers stay the
    same: a subscriber that joins gets the next message, one that leaves gets none, and a
    second filter of the same session still makes one delivery."""
    first, second, late = paho5(), paho5(), paho5()
    for client in (first, second):
        assert client.subscribe(("fan/+", 1), ("fence", 0)) == [1, 0]
    assert late.subscribe(("fence", 0)) == [0]
    pub = paho5()
    pub.publish("fan/a", b"1", 1)
    pub.publish("fence", b"", 0)
    assert late.subscribe(("fan/#", 1), ("fan/a", 1)) == [1, 1]  # two filters, one delivery
    second.unsubscribe("fan/+")
    pub.publish("fan/a", b"2", 1)
    pub.publish("fence", b"", 0)
    pub.publish("fence", b"", 0)
    assert [m.payload for m in first.until("fence")] == [b"1"]
    assert [m.payload for m in first.until("fence")] == [b"2"]
    assert [m.payload for m in second.until("fence")] == [b"1"]
    assert [m.payload for m in second.until("fence")] == []
    assert [m.payload for m in late.until("fence")] == []
    assert [m.payload for m in late.until("fence")] == [b"2"]


# -- shared subscriptions --------------------------------------------------------------------


def test_shared_group_round_robin_across_v5_and_v311_members(
    paho5: Callable[..., Paho],
) -> None:
    members = [paho5(), paho5(), paho5(mqtt.MQTTv311)]
    for member in members:
        assert member.subscribe(("$share/workers/jobs/#", 1)) == [1]
        assert member.subscribe(("fence", 0)) == [0]
    pub = paho5()
    for i in range(9):
        pub.publish(f"jobs/{i}", str(i).encode(), 1)
    pub.publish("fence", b"", 0)
    got = [[m.payload for m in member.until("fence")] for member in members]
    assert sorted(p for share in got for p in share) == [str(i).encode() for i in range(9)]
    assert all(len(share) == 3 for share in got), got  # round robin


def test_who_gets_a_topic_follows_every_subscription_change_after_its_first_publish(
    paho5: Callable[..., Paho],
) -> None:
    """The server keeps, per topic, where its publishes go (shared groups, v5 and 3.1.1
    subscribers) from the first publish there: each later SUBSCRIBE and UNSUBSCRIBE changes
    who gets the next one."""
    fence = "fence/plan"
    pub = paho5()
    v5, v3, member = paho5(), paho5(mqtt.MQTTv311), paho5()
    for client in (v5, v3, member):
        assert client.subscribe((fence, 0)) == [0]

    def publish(payload: bytes) -> list[list[bytes]]:
        pub.publish("plan/t", payload, 1)
        pub.publish(fence, b"", 0)
        return [[m.payload for m in client.until(fence)] for client in (v5, v3, member)]

    assert publish(b"0") == [[], [], []]  # nobody subscribed yet
    assert v5.subscribe(("plan/t", 1)) == [1]
    assert publish(b"1") == [[b"1"], [], []]
    assert v3.subscribe(("plan/+", 1)) == [1]
    assert member.subscribe(("$share/plan/plan/#", 1)) == [1]
    assert publish(b"2") == [[b"2"], [b"2"], [b"2"]]
    v5.unsubscribe("plan/t")
    member.unsubscribe("$share/plan/plan/#")
    assert publish(b"3") == [[], [b"3"], []]
    v3.unsubscribe("plan/+")
    assert publish(b"4") == [[], [], []]


def test_a_leaving_member_gives_its_unacked_messages_to_another(
    paho5: Callable[..., Paho], raws: Callable[[], RawMqtt]
) -> None:
    lazy = raws()
    lazy.connect("lazy")
    lazy.send(Subscribe(1, (("$share/g2/work", 1),)))
    lazy.recv()  # SUBACK
    pub = paho5()
    pub.publish("work", b"task-1", 1)
    first = lazy.expect(Publish)  # not acknowledged
    assert first.payload == b"task-1"
    other = paho5()
    assert other.subscribe(("$share/g2/work", 1)) == [1]
    lazy.close()  # goes away without PUBACK
    msg = other.get()
    assert msg.payload == b"task-1"


def test_a_member_that_unsubscribes_gives_its_unacked_messages_to_another(
    paho5: Callable[..., Paho], raws: Callable[[], RawMqtt]
) -> None:
    """The messages a member had from the direct round robin (only MQTT members, nothing
    waiting in the group's queue) and did not acknowledge go to another member when it
    unsubscribes, and the member's later PUBACK of one of them changes nothing."""
    lazy = raws()
    lazy.connect("lazy-unsub")
    lazy.send(Subscribe(1, (("$share/g4/work", 1),)))
    lazy.recv()  # SUBACK
    pub = paho5()
    for i in range(3):
        pub.publish("work", f"task-{i}".encode(), 1)
    held = [lazy.expect(Publish) for _ in range(3)]  # none acknowledged
    assert [p.payload for p in held] == [b"task-0", b"task-1", b"task-2"]
    other = paho5()
    assert other.subscribe(("$share/g4/work", 1)) == [1]
    lazy.send(Unsubscribe(2, ("$share/g4/work",)))
    lazy.expect(Unsuback)
    assert held[0].packet_id is not None
    lazy.send(Puback(held[0].packet_id))  # too late: given to the other member already
    got = sorted(other.get().payload for _ in range(3))
    assert got == [b"task-0", b"task-1", b"task-2"]
    pub.publish("work", b"after", 1)  # the group goes on with the one member left
    assert other.get().payload == b"after"


def test_a_member_with_a_full_window_gets_the_rest_from_the_queue_in_order(
    amqp: AmqpBroker, paho5: Callable[..., Paho]
) -> None:
    """A member whose window (Receive Maximum 2) is full sends the group's next messages to
    its queue; its PUBACKs let the queue hand them over, in publish order, never more than two
    unacknowledged, until every message has come."""
    raw = RawMqtt(amqp.mqtt_port, v5=True)
    try:
        assert raw.connect5(properties=Properties(receive_maximum=2)).reason_code == 0
        raw.send(Subscribe5(1, (("$share/g5/jobs", SubOptions(1)),)))
        raw.expect(Suback5)
        pub = paho5()
        for i in range(6):
            pub.publish("jobs", f"job-{i}".encode(), 1)
        got: list[bytes] = []
        while len(got) < 6:
            first, second = raw.expect(Publish5), raw.expect(Publish5)
            assert raw.barrier() == []  # a third waits for a PUBACK
            for msg in (first, second):
                got.append(msg.payload)
                assert msg.packet_id is not None
                raw.send(Puback5(msg.packet_id))
        assert got == [f"job-{i}".encode() for i in range(6)]
    finally:
        raw.close()


async def test_a_shared_group_is_a_vibemq_round_robin_queue(
    paho5: Callable[..., Paho], vibemq: Callable[[], Awaitable[Client]]
) -> None:
    member = paho5()
    assert member.subscribe(("$share/billing/invoices/+", 1)) == [1]
    client = await vibemq()
    queue = await client.subscribe("billing", prefetch=1)
    pub = paho5()
    for i in range(4):
        pub.publish(f"invoices/{i}", b"{}", 1)
    got_vibemq: list[str] = []
    got_mqtt: list[str] = []
    deadline = time.monotonic() + 10
    while len(got_vibemq) + len(got_mqtt) < 4:
        assert time.monotonic() < deadline, (got_vibemq, got_mqtt)
        with contextlib.suppress(Exception):
            msg = await queue.get(timeout=0.1)
            got_vibemq.append(msg.headers["mqttTopic"])
            await msg.ack()
        while not member.messages.empty():
            got_mqtt.append(member.messages.get_nowait().topic)
    # both sides took part, and together they had every message once
    assert got_vibemq and got_mqtt, (got_vibemq, got_mqtt)
    assert sorted(got_vibemq + got_mqtt) == [f"invoices/{i}" for i in range(4)]


def test_raw_v311_member_acks_through_the_group(raws: Callable[[], RawMqtt], paho5: Any) -> None:
    raw = raws()
    raw.connect("acker")
    raw.send(Subscribe(1, (("$share/g3/t", 1),)))
    raw.recv()
    pub = paho5()
    pub.publish("t", b"a", 1)
    msg = raw.expect(Publish)
    assert msg.packet_id is not None
    raw.send(Puback(msg.packet_id))
    pub.publish("t", b"b", 1)
    assert raw.expect(Publish).payload == b"b"
