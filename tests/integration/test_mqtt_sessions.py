"""MQTT sessions against a real broker: persistent sessions (clean session 0), redelivery and
QoS 2 across reconnects, the in-flight window, retained messages, and durability across a
restart of a real server process.

Brokers run in the test's event loop (``mqtt_env``) except for the restart tests, which
start ``python -m vibemq_server`` processes on one data directory (``servers``). Clients
are real: paho-mqtt (:class:`mqttkit.PahoClient`) or raw sockets with the project's MQTT codec
(:class:`mqttkit.AsyncRawMqtt`) where a test needs exact control over packet ids and acks.
Fixtures are in conftest.py.
"""

from __future__ import annotations

from pathlib import Path

import paho.mqtt.client as mqtt
import pytest
from mqttkit import AsyncRawMqtt, MqttEnv, PahoFactory
from serverproc import Servers
from waits import wait_for

from vibemq_server.adapters.mqtt.packets import (
    Connack,
    Connect,
    Puback,
    Pubcomp,
    Publish,
    Pubrec,
    Pubrel,
    Unsuback,
    Unsubscribe,
)
from vibemq_server.adapters.mqtt.session import PAUSE_BYTES

pytestmark = pytest.mark.timeout(60)


# -- helpers (fixtures: conftest.py) ---------------------------------------------------------


def payloads(messages: list[mqtt.MQTTMessage]) -> list[bytes]:
    return [bytes(m.payload) for m in messages]


# -- 1. clean session = 0 keeps subscriptions and QoS 1/2 messages ---------------------------


async def test_persistent_session_keeps_subscriptions_and_qos1_qos2_not_qos0(
    mqtt_env: MqttEnv,
) -> None:
    await mqtt_env.start()
    sub = await mqtt_env.paho("keeper", clean_session=False)
    assert sub.session_present is False  # first connect: no session to resume
    assert await sub.subscribe("keep/#", 2) == 2
    await sub.disconnect()
    await mqtt_env.wait_offline("keeper")

    pub = await mqtt_env.paho("keeper-pub")
    await pub.publish("keep/a", b"q0", qos=0)
    await pub.publish("keep/a", b"q1", qos=1)
    await pub.publish("keep/b", b"q2", qos=2)
    await pub.publish("keep/a", b"q0-again", qos=0)

    back = await mqtt_env.paho("keeper", clean_session=False)
    assert back.session_present is True  # 3.1.1: the session was resumed
    got = await back.get_many(2)
    assert [(m.topic, m.payload, m.qos) for m in got] == [
        ("keep/a", b"q1", 1),
        ("keep/b", b"q2", 2),
    ]
    # The subscription itself is still there (no SUBSCRIBE on this connection), and the
    # QoS 0 messages published while away were not kept: the next thing is the marker.
    await pub.publish("keep/c", b"marker", qos=1)
    marker = await back.get()
    assert (marker.topic, marker.payload) == ("keep/c", b"marker")
    await back.assert_nothing()


async def test_session_present_is_never_set_for_mqtt31(mqtt_env: MqttEnv) -> None:
    await mqtt_env.start()
    sub = await mqtt_env.paho("old31", clean_session=False, protocol=mqtt.MQTTv31)
    assert sub.session_present is False
    await sub.subscribe("v31/t", 1)
    await sub.disconnect()
    await mqtt_env.wait_offline("old31")
    pub = await mqtt_env.paho("old31-pub")
    await pub.publish("v31/t", b"kept", qos=1)
    back = await mqtt_env.paho("old31", clean_session=False, protocol=mqtt.MQTTv31)
    # MQTT 3.1 has no session-present flag, but the session is resumed all the same.
    assert back.session_present is False
    msg = await back.get()
    assert (msg.payload, msg.qos) == (b"kept", 1)


async def test_offline_queue_bound_keeps_oldest_and_drops_newest(mqtt_env: MqttEnv) -> None:
    """mqtt.max_queued_messages = 5: of 10 QoS 1 messages for an absent client the first 5
    are kept, the newer ones dropped (the publishers still get their PUBACK)."""
    await mqtt_env.start(max_queued_messages=5)
    sub = await mqtt_env.paho("bounded", clean_session=False)
    await sub.subscribe("bound/t", 1)
    await sub.disconnect()
    await mqtt_env.wait_offline("bounded")

    pub = await mqtt_env.paho("bounded-pub")
    for i in range(10):
        await pub.publish("bound/t", f"m{i}".encode(), qos=1)

    back = await mqtt_env.paho("bounded", clean_session=False)
    assert back.session_present is True
    got = await back.get_many(5)
    assert payloads(got) == [f"m{i}".encode() for i in range(5)]
    await pub.publish("bound/t", b"marker", qos=1)
    assert (await back.get()).payload == b"marker"
    await back.assert_nothing()


# -- 2. clean session = 1 discards an old persistent session ---------------------------------


async def test_clean_session_discards_previous_persistent_session(mqtt_env: MqttEnv) -> None:
    await mqtt_env.start()
    sub = await mqtt_env.paho("switcher", clean_session=False)
    await sub.subscribe("old/topic", 1)
    await sub.disconnect()
    await mqtt_env.wait_offline("switcher")
    pub = await mqtt_env.paho("switcher-pub")
    await pub.publish("old/topic", b"queued-1", qos=1)
    await pub.publish("old/topic", b"queued-2", qos=2)
    assert mqtt_env.broker is not None and mqtt_env.broker.adapters["mqtt"] is not None
    queue_name = mqtt_env.broker.adapters["mqtt"].sessions["switcher"].queue.name
    assert queue_name in mqtt_env.broker.manager.queues

    clean = await mqtt_env.paho("switcher", clean_session=True)
    assert clean.session_present is False
    # No queued messages, and the old subscription is gone too.
    await pub.publish("old/topic", b"after-clean", qos=1)
    await clean.assert_nothing()
    await clean.disconnect()
    await wait_for(lambda: mqtt_env.gone("switcher"), what="clean session ended")
    assert queue_name not in mqtt_env.broker.manager.queues

    # The persistent session does not come back either: a clean-0 connect starts afresh.
    again = await mqtt_env.paho("switcher", clean_session=False)
    assert again.session_present is False
    await pub.publish("old/topic", b"nobody", qos=1)
    await again.assert_nothing()


async def test_discarded_session_stays_discarded_after_restart(
    mqtt_env: MqttEnv, tmp_path: Path
) -> None:
    data = tmp_path / "restart-data"
    broker = await mqtt_env.broker_factory(mqtt={"port": 0}, data_dir=data)
    mqtt_env.use(broker)
    keep = await mqtt_env.paho("kept-one", clean_session=False)
    await keep.subscribe("disc/keep", 1)
    drop = await mqtt_env.paho("dropped-one", clean_session=False)
    await drop.subscribe("disc/drop", 1)
    await drop.disconnect()
    await mqtt_env.wait_offline("dropped-one")
    clean = await mqtt_env.paho("dropped-one", clean_session=True)  # discards the session
    await clean.disconnect()
    await keep.disconnect()
    await wait_for(lambda: mqtt_env.gone("dropped-one") and mqtt_env.offline("kept-one"))
    await mqtt_env.paho.close_all()
    await broker.stop()

    broker = await mqtt_env.broker_factory(mqtt={"port": 0}, data_dir=data)
    mqtt_env.use(broker)
    assert broker.adapters["mqtt"] is not None
    assert set(broker.adapters["mqtt"].sessions) == {"kept-one"}
    assert "$mqtt.s.dropped-one" not in broker.manager.queues
    again = await mqtt_env.paho("dropped-one", clean_session=False)
    assert again.session_present is False
    back = await mqtt_env.paho("kept-one", clean_session=False)
    assert back.session_present is True
    pub = await mqtt_env.paho("disc-pub")
    await pub.publish("disc/drop", b"nobody", qos=1)
    await pub.publish("disc/keep", b"kept", qos=1)
    assert (await back.get()).payload == b"kept"
    await again.assert_nothing()


# -- 3. redelivery after a reconnect (raw) ---------------------------------------------------


async def test_unacked_qos1_redelivered_with_dup_and_same_packet_id(mqtt_env: MqttEnv) -> None:
    await mqtt_env.start()
    raw, present = await mqtt_env.raw("redeliver", clean_session=False)
    assert present is False
    assert await raw.subscribe("re/t", 1) == 1
    pub = await mqtt_env.paho("redeliver-pub")
    await pub.publish("re/t", b"once", qos=1)

    first = await raw.expect(Publish)
    assert (first.topic, first.payload, first.qos, first.dup) == ("re/t", b"once", 1, False)
    assert first.packet_id is not None
    raw.drop()  # no PUBACK
    await mqtt_env.wait_offline("redeliver")

    raw2, present = await mqtt_env.raw("redeliver", clean_session=False)
    assert present is True
    second = await raw2.expect(Publish)
    assert (second.topic, second.payload, second.qos) == ("re/t", b"once", 1)
    assert second.dup is True
    assert second.packet_id == first.packet_id
    await raw2.send(Puback(second.packet_id))
    assert await raw2.barrier() == []
    raw2.drop()
    await mqtt_env.wait_offline("redeliver")

    # Acknowledged: it does not come a third time.
    raw3, present = await mqtt_env.raw("redeliver", clean_session=False)
    assert present is True
    assert await raw3.barrier() == []


async def test_unacked_deliveries_come_back_in_order_with_same_ids_before_new_ones(
    mqtt_env: MqttEnv,
) -> None:
    await mqtt_env.start()
    raw, _ = await mqtt_env.raw("in-order", clean_session=False)
    assert await raw.subscribe("ord/#", 2) == 2
    pub = await mqtt_env.paho("in-order-pub")
    await pub.publish("ord/a", b"one", qos=1)
    await pub.publish("ord/b", b"two", qos=2)
    await pub.publish("ord/a", b"three", qos=1)
    first = [await raw.expect(Publish) for _ in range(3)]
    assert [(p.payload, p.qos, p.dup) for p in first] == [
        (b"one", 1, False),
        (b"two", 2, False),
        (b"three", 1, False),
    ]
    assert len({p.packet_id for p in first}) == 3
    assert first[0].packet_id is not None
    await raw.send(Puback(first[0].packet_id))  # only the first is acknowledged
    assert await raw.barrier() == []
    raw.drop()
    await mqtt_env.wait_offline("in-order")
    await pub.publish("ord/a", b"new", qos=1)

    raw2, present = await mqtt_env.raw("in-order", clean_session=False)
    assert present is True
    again = [await raw2.expect(Publish) for _ in range(3)]
    assert [(p.payload, p.qos, p.dup, p.packet_id) for p in again] == [
        (b"two", 2, True, first[1].packet_id),
        (b"three", 1, True, first[2].packet_id),
        (b"new", 1, False, again[2].packet_id),
    ]
    assert again[2].packet_id not in {first[1].packet_id, first[2].packet_id}


async def test_takeover_hands_unacked_messages_to_the_new_connection(mqtt_env: MqttEnv) -> None:
    await mqtt_env.start()
    old, _ = await mqtt_env.raw("taken", clean_session=False)
    assert await old.subscribe("take/t", 1) == 1
    pub = await mqtt_env.paho("taken-pub")
    await pub.publish("take/t", b"in-flight", qos=1)
    sent = await old.expect(Publish)
    assert sent.dup is False

    new, present = await mqtt_env.raw("taken", clean_session=False)  # old is still connected
    assert present is True
    again = await new.expect(Publish)
    assert (again.payload, again.dup, again.packet_id) == (b"in-flight", True, sent.packet_id)
    # The old connection was closed by the broker.
    with pytest.raises(ConnectionError):
        await old.recv()
    assert again.packet_id is not None
    await new.send(Puback(again.packet_id))
    await pub.publish("take/t", b"next", qos=1)
    assert (await new.expect(Publish)).payload == b"next"


async def test_unsubscribe_is_kept_by_a_persistent_session(mqtt_env: MqttEnv) -> None:
    await mqtt_env.start()
    sub = await mqtt_env.paho("unsub", clean_session=False)
    await sub.subscribe("stay/t", 1)
    await sub.subscribe("leave/t", 1)
    sub.client.unsubscribe("leave/t")
    await wait_for(
        lambda: (
            mqtt_env.broker is not None
            and mqtt_env.broker.adapters["mqtt"] is not None
            and "leave/t" not in mqtt_env.broker.adapters["mqtt"].sessions["unsub"].filters
        )
    )
    await sub.disconnect()
    await mqtt_env.wait_offline("unsub")
    pub = await mqtt_env.paho("unsub-pub")
    await pub.publish("leave/t", b"not-for-you", qos=1)
    await pub.publish("stay/t", b"for-you", qos=1)
    back = await mqtt_env.paho("unsub", clean_session=False)
    assert (await back.get()).payload == b"for-you"
    await back.assert_nothing()


# -- 4. QoS 2 exactly once across a reconnect (raw) ------------------------------------------


async def test_qos2_outbound_pubrel_resent_after_reconnect_not_the_publish(
    mqtt_env: MqttEnv,
) -> None:
    await mqtt_env.start()
    raw, _ = await mqtt_env.raw("q2-out", clean_session=False)
    assert await raw.subscribe("q2/out", 2) == 2
    pub = await mqtt_env.paho("q2-out-pub")
    await pub.publish("q2/out", b"exactly-once", qos=2)

    publish = await raw.expect(Publish)
    assert (publish.payload, publish.qos, publish.dup) == (b"exactly-once", 2, False)
    pid = publish.packet_id
    assert pid is not None
    await raw.send(Pubrec(pid))
    assert (await raw.expect(Pubrel)).packet_id == pid
    raw.drop()  # PUBREL never answered with PUBCOMP
    await mqtt_env.wait_offline("q2-out")

    raw2, present = await mqtt_env.raw("q2-out", clean_session=False)
    assert present is True
    rel = await raw2.expect(Pubrel)
    assert rel.packet_id == pid
    # ...and no PUBLISH again: the message is the client's since its PUBREC.
    assert await raw2.barrier() == []
    await raw2.send(Pubcomp(pid))
    assert await raw2.barrier() == []
    raw2.drop()
    await mqtt_env.wait_offline("q2-out")

    # PUBCOMP ended the flow: nothing is owed on the next connection.
    raw3, present = await mqtt_env.raw("q2-out", clean_session=False)
    assert present is True
    assert await raw3.barrier() == []


async def test_qos2_inbound_resent_publish_after_reconnect_is_routed_once(
    mqtt_env: MqttEnv,
) -> None:
    await mqtt_env.start()
    listener, _ = await mqtt_env.raw("q2-in-sub")
    assert await listener.subscribe("q2/in", 2) == 2

    raw, _ = await mqtt_env.raw("q2-in", clean_session=False)
    await raw.send(Publish("q2/in", b"only-once", qos=2, packet_id=7))
    assert (await raw.expect(Pubrec)).packet_id == 7
    raw.drop()  # before PUBREL
    await mqtt_env.wait_offline("q2-in")

    raw2, present = await mqtt_env.raw("q2-in", clean_session=False)
    assert present is True
    await raw2.send(Publish("q2/in", b"only-once", qos=2, packet_id=7, dup=True))
    assert (await raw2.expect(Pubrec)).packet_id == 7
    await raw2.send(Pubrel(7))
    assert (await raw2.expect(Pubcomp)).packet_id == 7

    got = await listener.expect(Publish)
    assert (got.topic, got.payload, got.qos) == ("q2/in", b"only-once", 2)
    assert got.packet_id is not None
    await listener.send(Pubrec(got.packet_id))
    assert (await listener.expect(Pubrel)).packet_id == got.packet_id
    await listener.send(Pubcomp(got.packet_id))
    assert await listener.barrier() == []  # exactly once

    # With the flow complete, packet id 7 is free: a new PUBLISH with it is a new message.
    await raw2.send(Publish("q2/in", b"second", qos=2, packet_id=7))
    assert (await raw2.expect(Pubrec)).packet_id == 7
    await raw2.send(Pubrel(7))
    assert (await raw2.expect(Pubcomp)).packet_id == 7
    again = await listener.expect(Publish)
    assert again.payload == b"second"


# -- 5. the in-flight window -----------------------------------------------------------------


async def test_inflight_window_bounds_unacknowledged_deliveries(mqtt_env: MqttEnv) -> None:
    await mqtt_env.start(max_inflight=3)
    raw, _ = await mqtt_env.raw("window")
    assert await raw.subscribe("win/t", 1) == 1
    pub = await mqtt_env.paho("window-pub")
    for i in range(10):
        await pub.publish("win/t", f"w{i}".encode(), qos=1)

    first = [await raw.expect(Publish) for _ in range(3)]
    assert [p.payload for p in first] == [b"w0", b"w1", b"w2"]
    assert await raw.barrier() == []  # exactly 3 while none is acknowledged

    assert first[0].packet_id is not None
    await raw.send(Puback(first[0].packet_id))
    nxt = await raw.expect(Publish)
    assert nxt.payload == b"w3"
    assert await raw.barrier() == []  # one ack, one more

    for p in [*first[1:], nxt]:
        assert p.packet_id is not None
        await raw.send(Puback(p.packet_id))
    rest = [await raw.expect(Publish) for _ in range(3)]
    assert [p.payload for p in rest] == [b"w4", b"w5", b"w6"]
    assert await raw.barrier() == []


async def test_a_client_gone_with_a_full_window_gets_its_messages_back(mqtt_env: MqttEnv) -> None:
    """The ids kept for redelivery do not fill the window: a persistent session that went
    away with every slot in flight gets those messages again, then the rest (this once
    left it with nothing ever delivered again)."""
    await mqtt_env.start(max_inflight=2)
    raw, _ = await mqtt_env.raw("full-window", clean_session=False)
    assert await raw.subscribe("fw/t", 1) == 1
    pub = await mqtt_env.paho("full-window-pub")
    for i in range(4):
        await pub.publish("fw/t", f"f{i}".encode(), qos=1)
    first = [await raw.expect(Publish) for _ in range(2)]
    assert [p.payload for p in first] == [b"f0", b"f1"]
    assert await raw.barrier() == []
    raw.drop()
    await mqtt_env.wait_offline("full-window")

    raw2, present = await mqtt_env.raw("full-window", clean_session=False)
    assert present is True
    again = [await raw2.expect(Publish) for _ in range(2)]
    assert [(p.payload, p.dup, p.packet_id) for p in again] == [
        (b"f0", True, first[0].packet_id),
        (b"f1", True, first[1].packet_id),
    ]
    for p in again:
        assert p.packet_id is not None
        await raw2.send(Puback(p.packet_id))
    rest = [await raw2.expect(Publish) for _ in range(2)]
    assert [(p.payload, p.dup) for p in rest] == [(b"f2", False), (b"f3", False)]


async def test_inflight_window_and_queue_bound_together(mqtt_env: MqttEnv) -> None:
    """max_inflight 3 + max_queued_messages 5: an online client that never acks holds 3 in
    flight and 5 waiting; the rest (the newest) are dropped."""
    await mqtt_env.start(max_inflight=3, max_queued_messages=5, max_publisher_pause_s=0.05)
    raw, _ = await mqtt_env.raw("both-bounds")
    assert await raw.subscribe("both/t", 1) == 1
    pub = await mqtt_env.paho("both-bounds-pub")
    for i in range(20):
        await pub.publish("both/t", f"b{i}".encode(), qos=1)
    first = [await raw.expect(Publish) for _ in range(3)]
    assert [p.payload for p in first] == [b"b0", b"b1", b"b2"]
    assert await raw.barrier() == []
    # Acknowledge whatever came, until nothing more comes.
    delivered: list[Publish] = list(first)
    unacked: list[Publish] = list(first)
    for _ in range(20):
        for p in unacked:
            assert p.packet_id is not None
            await raw.send(Puback(p.packet_id))
        more = await raw.barrier()
        if not more:
            break
        unacked = [p for p in more if isinstance(p, Publish)]
        assert len(unacked) == len(more), more
        delivered.extend(unacked)
    assert [p.payload for p in delivered] == [f"b{i}".encode() for i in range(8)]


async def test_a_stuck_subscriber_pauses_a_publisher_once_not_per_message(
    mqtt_env: MqttEnv,
) -> None:
    """A subscriber that never acknowledges makes a publisher wait one pause at most: it is
    marked stalled and then pauses nobody; its bounds drop the newest messages. The pause
    (3 s) times 30 publishes would be far beyond the test's timeout."""
    await mqtt_env.start(max_inflight=1, max_queued_messages=2, max_publisher_pause_s=3)
    stuck, _ = await mqtt_env.raw("stuck-sub")
    assert await stuck.subscribe("stuck/t", 1) == 1
    pub, _ = await mqtt_env.raw("stuck-pub")
    for pid in range(1, 31):
        await pub.send(Publish("stuck/t", b"s%d" % pid, qos=1, packet_id=pid))
    acked = [(await pub.expect(Puback, timeout=10)).packet_id for _ in range(30)]
    assert acked == list(range(1, 31))
    first = await stuck.expect(Publish)
    assert first.payload == b"s1"
    assert first.packet_id is not None
    await stuck.send(Puback(first.packet_id))  # it catches up a little: two queued ones follow
    got = [await stuck.expect(Publish) for _ in range(1)]
    assert [p.payload for p in got] == [b"s2"]


async def test_large_payloads_waiting_for_a_subscriber_pause_its_publisher_by_bytes(
    mqtt_env: MqttEnv,
) -> None:
    """A publisher stops being read once ``mqtt.pause_publishers_bytes`` of payloads wait for
    a subscriber whose in-flight window is full, however few messages that is, and is read
    again once they are down to half of it: a fast publisher of large messages does not pile
    them up in the broker's memory (before, only half ``max_queued_messages`` paused it: 500
    by default). The pause bound is far above the test's timeout."""
    limit = 600_000  # configured below the default (PAUSE_BYTES): the setting is the bound
    assert limit < PAUSE_BYTES
    await mqtt_env.start(max_inflight=1, max_publisher_pause_s=60, pause_publishers_bytes=limit)
    assert mqtt_env.broker is not None and mqtt_env.broker.adapters["mqtt"] is not None
    mqtt = mqtt_env.broker.adapters["mqtt"]
    size = limit // 3 + 1  # three waiting make the limit, two are over half of it
    slow, _ = await mqtt_env.raw("bytes-slow")
    assert await slow.subscribe("bytes/t", 1) == 1
    pub, _ = await mqtt_env.raw("bytes-pub")
    for pid in (1, 2, 3, 4):  # 1 in flight, 3 waiting
        await pub.send(Publish("bytes/t", bytes([pid]) * size, qos=1, packet_id=pid))
        assert (await pub.expect(Puback)).packet_id == pid
    session = mqtt.sessions["bytes-slow"]
    publisher = mqtt.sessionless.get("bytes-pub") or mqtt.sessions["bytes-pub"]
    assert session.queued == 3 and session.congested
    # (paused in the read that handled publish 4, before its PUBACK was written)
    assert publisher.link.reading_paused
    await pub.send(Publish("bytes/t", b"\x05" * size, qos=1, packet_id=5))  # held unread

    got: list[Publish] = [await slow.expect(Publish)]
    assert got[0].packet_id is not None
    await slow.send(Puback(got[0].packet_id))
    got.append(await slow.expect(Publish))  # (the ack is handled before this is sent)
    assert session.queued == 2 and publisher.link.reading_paused  # 2 x size > limit / 2
    assert got[1].packet_id is not None
    await slow.send(Puback(got[1].packet_id))  # down to one waiting: the publisher goes on
    assert (await pub.expect(Puback)).packet_id == 5
    while len(got) < 5:
        got.append(await slow.expect(Publish))
        assert got[-1].packet_id is not None
        await slow.send(Puback(got[-1].packet_id))
    assert [p.payload for p in got] == [bytes([i]) * size for i in (1, 2, 3, 4, 5)]
    assert not publisher.link.reading_paused


async def test_a_will_to_a_slow_subscriber_pauses_no_connection(mqtt_env: MqttEnv) -> None:
    """A will reaching a subscriber that is behind pauses nobody: there is no publisher to
    pause. (The pause bound is far above the test's timeout: a wrongly paused connection
    fails the test.)"""
    await mqtt_env.start(max_inflight=1, max_queued_messages=4, max_publisher_pause_s=60)
    slow, _ = await mqtt_env.raw("will-slow")
    assert await slow.subscribe("will/t", 1) == 1
    pub, _ = await mqtt_env.raw("will-pub")
    for pid in (1, 2, 3):  # 1 in flight, 2 queued: the subscriber is behind
        await pub.send(Publish("will/t", b"fill", qos=1, packet_id=pid))
        assert (await pub.expect(Puback)).packet_id == pid

    dying = await mqtt_env.open_raw()
    await dying.send(
        Connect("will-dying", will_topic="will/t", will_payload=b"last words", will_qos=1)
    )
    assert (await dying.expect(Connack)).return_code == 0
    dying.drop()  # no DISCONNECT: the will goes out
    await wait_for(lambda: mqtt_env.gone("will-dying"), what="will published")

    bystander, _ = await mqtt_env.raw("will-bystander")
    assert await bystander.barrier(0) == []
    assert await bystander.barrier(0) == []
    # The subscriber catches up by acknowledging: its own reads are not paused either.
    payloads_seen = []
    for _ in range(4):
        got = await slow.expect(Publish)
        payloads_seen.append(got.payload)
        assert got.packet_id is not None
        await slow.send(Puback(got.packet_id))
    assert payloads_seen == [b"fill", b"fill", b"fill", b"last words"]
    assert mqtt_env.broker is not None and mqtt_env.broker.adapters["mqtt"] is not None
    assert mqtt_env.broker.adapters["mqtt"].congested == []


# -- 7. retained messages (in-process) -------------------------------------------------------


async def test_retained_delivered_on_subscribe_with_retain_flag_at_min_qos(
    mqtt_env: MqttEnv,
) -> None:
    await mqtt_env.start()
    pub = await mqtt_env.paho("ret-pub")
    await pub.publish("ret/q0", b"stored-q0", qos=0, retain=True)
    await pub.publish("ret/q1", b"stored-q1", qos=1, retain=True)
    await pub.publish("ret/q2", b"stored-q2", qos=2, retain=True)
    # The QoS 0 publish has no acknowledgement: make sure the broker handled it.
    assert mqtt_env.broker is not None and mqtt_env.broker.adapters["mqtt"] is not None
    retained = mqtt_env.broker.adapters["mqtt"].retained
    assert retained is not None
    await wait_for(lambda: "ret/q0" in retained, what="retained QoS 0 stored")

    for granted in (0, 1, 2):
        sub = await mqtt_env.paho(f"ret-sub-{granted}")
        assert await sub.subscribe("ret/#", granted) == granted
        got = sorted(await sub.get_many(3), key=lambda m: m.topic)
        assert [(m.topic, m.payload, m.retain) for m in got] == [
            ("ret/q0", b"stored-q0", True),
            ("ret/q1", b"stored-q1", True),
            ("ret/q2", b"stored-q2", True),
        ]
        assert [m.qos for m in got] == [min(stored, granted) for stored in (0, 1, 2)]
        await sub.assert_nothing()


async def test_live_message_to_existing_subscriber_has_retain_clear(mqtt_env: MqttEnv) -> None:
    await mqtt_env.start()
    sub = await mqtt_env.paho("live-sub")
    await sub.subscribe("live/t", 1)
    pub = await mqtt_env.paho("live-pub")
    await pub.publish("live/t", b"retained-live", qos=1, retain=True)
    msg = await sub.get()
    assert (msg.payload, msg.qos, msg.retain) == (b"retained-live", 1, False)
    await pub.publish("live/t", b"retained-live-q0", qos=0, retain=True)
    msg = await sub.get()
    assert (msg.payload, msg.qos, msg.retain) == (b"retained-live-q0", 0, False)


async def test_retained_message_is_replaced_and_cleared(mqtt_env: MqttEnv) -> None:
    await mqtt_env.start()
    pub = await mqtt_env.paho("replace-pub")
    await pub.publish("rep/t", b"v1", qos=1, retain=True)
    await pub.publish("rep/t", b"v2", qos=1, retain=True)
    sub = await mqtt_env.paho("replace-sub")
    await sub.subscribe("rep/t", 1)
    msg = await sub.get()
    assert (msg.payload, msg.retain) == (b"v2", True)
    await sub.assert_nothing()

    # An empty retained payload clears it (and reaches existing subscribers as a message).
    await pub.publish("rep/t", b"", qos=1, retain=True)
    cleared = await sub.get()
    assert (cleared.payload, cleared.retain) == (b"", False)
    late = await mqtt_env.paho("replace-late")
    await late.subscribe("rep/#", 1)
    await late.assert_nothing()


# -- 6. durability across a restart of a real server process ---------------------------------


async def test_retained_and_persistent_session_survive_restart(
    servers: Servers, paho_factory: PahoFactory, tmp_path: Path
) -> None:
    data = tmp_path / "data"
    server = await servers.start(data)

    # A persistent session with a subscription, away while QoS 1 messages arrive for it.
    sub, connack = await AsyncRawMqtt.connected(
        server.mqtt_port, "durable-sub", clean_session=False
    )
    assert connack.session_present is False
    assert await sub.subscribe("dur/#", 1) == 1
    await sub.disconnect_and_wait()  # the broker has left the session when it closes
    pub = await paho_factory("durable-pub", port=server.mqtt_port)
    for i in range(3):
        await pub.publish("dur/q", f"queued-{i}".encode(), qos=1)
    # Retained messages: two kept, one set then cleared with an empty payload.
    await pub.publish("keep/a", b"A", qos=1, retain=True)
    await pub.publish("keep/b", b"B", qos=2, retain=True)
    await pub.publish("keep/c", b"C", qos=1, retain=True)
    await pub.publish("keep/c", b"", qos=1, retain=True)
    await pub.disconnect()

    server = await servers.restart(server, data)

    check = await paho_factory("check-1", port=server.mqtt_port)
    await check.subscribe("keep/#", 2)
    got = sorted(await check.get_many(2), key=lambda m: m.topic)
    assert [(m.topic, m.payload, m.retain, m.qos) for m in got] == [
        ("keep/a", b"A", True, 1),
        ("keep/b", b"B", True, 2),
    ]
    await check.assert_nothing()  # keep/c was cleared before the restart
    await check.disconnect()

    back = await paho_factory("durable-sub", port=server.mqtt_port, clean_session=False)
    assert back.session_present is True
    queued = await back.get_many(3)
    assert [(m.topic, m.payload, m.qos) for m in queued] == [
        ("dur/q", f"queued-{i}".encode(), 1) for i in range(3)
    ]
    # The subscription came back with the session: live messages still arrive.
    pub = await paho_factory("durable-pub-2", port=server.mqtt_port)
    await pub.publish("dur/live", b"after-restart", qos=1)
    assert (await back.get()).payload == b"after-restart"
    await back.assert_nothing()
    await back.disconnect()

    # Clearing after a restart works, and stays cleared through the next one.
    await pub.publish("keep/b", b"", qos=1, retain=True)
    await pub.disconnect()
    server = await servers.restart(server, data)
    check = await paho_factory("check-2", port=server.mqtt_port)
    await check.subscribe("keep/#", 1)
    only = await check.get()
    assert (only.topic, only.payload, only.retain) == ("keep/a", b"A", True)
    await check.assert_nothing()

    # Everything delivered and acknowledged before: the resumed session has nothing left.
    back = await paho_factory("durable-sub", port=server.mqtt_port, clean_session=False)
    assert back.session_present is True
    await back.assert_nothing()


async def test_unacked_deliveries_and_unsubscribe_survive_restart(
    servers: Servers, paho_factory: PahoFactory, tmp_path: Path
) -> None:
    data = tmp_path / "data"
    server = await servers.start(data)
    raw, connack = await AsyncRawMqtt.connected(
        server.mqtt_port, "restart-raw", clean_session=False
    )
    assert connack.session_present is False
    assert await raw.subscribe("rr/keep", 2, packet_id=1) == 2
    assert await raw.subscribe("rr/drop", 1, packet_id=2) == 1
    await raw.send(Unsubscribe(3, ("rr/drop",)))
    assert (await raw.expect(Unsuback)).packet_id == 3

    pub = await paho_factory("restart-pub", port=server.mqtt_port)
    await pub.publish("rr/keep", b"acked", qos=1)
    await pub.publish("rr/keep", b"unacked-q1", qos=1)
    await pub.publish("rr/keep", b"unacked-q2", qos=2)
    got = [await raw.expect(Publish) for _ in range(3)]
    assert [(p.payload, p.qos, p.dup) for p in got] == [
        (b"acked", 1, False),
        (b"unacked-q1", 1, False),
        (b"unacked-q2", 2, False),
    ]
    assert got[0].packet_id is not None
    await raw.send(Puback(got[0].packet_id))
    assert await raw.barrier() == []  # the PUBACK was handled
    await pub.disconnect()

    assert await server.stop() == 0, server.log  # closes the connection, session kept
    await raw.close()
    server = await servers.start(data)

    raw2, connack = await AsyncRawMqtt.connected(
        server.mqtt_port, "restart-raw", clean_session=False
    )
    assert connack.session_present is True
    again = [await raw2.expect(Publish) for _ in range(2)]
    # Resent with DUP (packet ids may be new after a restart), the acknowledged one not.
    assert [(p.topic, p.payload, p.qos, p.dup) for p in again] == [
        ("rr/keep", b"unacked-q1", 1, True),
        ("rr/keep", b"unacked-q2", 2, True),
    ]
    assert again[0].packet_id is not None and again[1].packet_id is not None
    await raw2.send(Puback(again[0].packet_id), Pubrec(again[1].packet_id))
    assert (await raw2.expect(Pubrel)).packet_id == again[1].packet_id
    await raw2.send(Pubcomp(again[1].packet_id))

    # The unsubscribe was kept: only rr/keep is still subscribed.
    pub = await paho_factory("restart-pub-2", port=server.mqtt_port)
    await pub.publish("rr/drop", b"not-subscribed", qos=1)
    await pub.publish("rr/keep", b"live", qos=1)
    live = await raw2.expect(Publish)
    assert (live.payload, live.dup) == (b"live", False)
    assert live.packet_id is not None
    await raw2.send(Puback(live.packet_id))
    assert await raw2.barrier() == []
    await raw2.close()


# -- a clean session made when first needed ---------------------------------------------------


async def test_a_clean_client_gets_its_session_at_its_first_subscribe(mqtt_env: MqttEnv) -> None:
    """An idle clean 3.1.1 client holds no session (docs/performance.md, "Idle connections"):
    it publishes without one, and its first SUBSCRIBE makes it. Meanwhile its client id is
    held all the same: the management API lists it, and a second CONNECT with it takes the
    connection over (its will goes out)."""
    await mqtt_env.start()
    assert mqtt_env.broker is not None and mqtt_env.broker.adapters["mqtt"] is not None
    server = mqtt_env.broker.adapters["mqtt"]
    watcher = await mqtt_env.paho("lazy-watcher")
    assert await watcher.subscribe("lazy/#", 1) == 1

    idle, present = await mqtt_env.raw("lazy")
    assert present is False
    assert "lazy" in server.sessionless and "lazy" not in server.sessions
    listed = server.client_sessions()["lazy"]
    assert (listed.clean, listed.connected, listed.filters) == (True, True, {})
    await idle.send(Publish("lazy/q1", b"no session needed", qos=1, packet_id=1))
    assert (await idle.expect(Puback)).packet_id == 1
    assert (await watcher.get()).payload == b"no session needed"
    assert "lazy" not in server.sessions

    # Taken over while it has no session: the old connection is closed, the new one goes on.
    taken = await AsyncRawMqtt.open(mqtt_env.port)
    mqtt_env.raws.append(taken)
    connack = await taken.connect("lazy", will_topic="lazy/will", will_payload=b"gone", will_qos=1)
    assert connack.return_code == 0
    with pytest.raises(ConnectionError):
        await idle.recv()
    new, _ = await mqtt_env.raw("lazy")
    with pytest.raises(ConnectionError):
        await taken.recv()
    assert (await watcher.get()).payload == b"gone"

    assert await new.subscribe("lazy/sub", 1) == 1
    assert "lazy" in server.sessions and "lazy" not in server.sessionless
    await watcher.publish("lazy/sub", b"to the new one", qos=1)
    assert (await new.expect(Publish)).payload == b"to the new one"
