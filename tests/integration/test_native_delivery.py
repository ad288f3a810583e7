"""Delivery modes, prefetch, redelivery, TTL, dead letters and overflow over raw sockets."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
from rawclient import RawClient, assert_error, assert_ok

from vibemq_server.protocol import CommandType, Message

BrokerFactory = Callable[..., Awaitable[Any]]
T = CommandType


def is_deliver(m: Message) -> bool:
    return m.type is T.DELIVER


@pytest.fixture
async def fast_broker(broker_factory: BrokerFactory) -> Any:
    """A broker whose timers (TTL, ack timeouts) run every 20 ms."""
    return await broker_factory(housekeeping_interval_ms=20)


@pytest.fixture
async def clients(fast_broker: Any) -> AsyncIterator[list[RawClient]]:
    made = [await RawClient.connected(fast_broker.port) for _ in range(4)]
    yield made
    for c in made:
        await c.close()


async def info(client: RawClient, queue: str) -> dict[str, Any]:
    value = assert_ok(await client.queue_info(queue), T.QUEUE_INFO).json()
    assert isinstance(value, dict)
    return value


async def wait_info(
    client: RawClient, queue: str, pred: Callable[[dict[str, Any]], bool], timeout: float = 5.0
) -> dict[str, Any]:
    async with asyncio.timeout(timeout):
        while True:
            value = await info(client, queue)
            if pred(value):
                return value
            await asyncio.sleep(0.02)


# -- delivery modes -------------------------------------------------------------------------------


async def test_round_robin_rotates_among_subscribers(clients: list[RawClient]) -> None:
    pub, *subs = clients
    assert_ok(await pub.create_queue("rr", {"deliveryMode": "RoundRobin"}), T.CREATE_QUEUE)
    for s in subs:
        assert_ok(await s.subscribe("rr"), T.SUBSCRIBE_ACK)
    ids = [f"rr_{i}" for i in range(9)]
    for mid in ids:
        assert_ok(await pub.publish("rr", mid, msg_id=mid), T.PUBLISH_ACK)
    got = [[d.id for d in await s.deliveries(3, "rr")] for s in subs]
    # In subscription order: each subscriber takes every third message.
    assert got == [ids[0::3], ids[1::3], ids[2::3]]
    for s, mids in zip(subs, got, strict=True):
        await s.expect_nothing(is_deliver, 0.1)
        for mid in mids:
            s.ack(mid)
    await wait_info(pub, "rr", lambda i: i["unackedCount"] == 0 and i["messageCount"] == 0)


async def test_round_robin_alternates_between_two_subscribers(clients: list[RawClient]) -> None:
    pub, a, b, _ = clients
    for s in (a, b):
        assert_ok(await s.subscribe("alt"), T.SUBSCRIBE_ACK)
    ids = [f"alt_{i}" for i in range(6)]
    for mid in ids:  # one at a time: the queue is empty between publishes
        assert_ok(await pub.publish("alt", mid, msg_id=mid), T.PUBLISH_ACK)
    got_a = [d.id for d in await a.deliveries(3, "alt", timeout=2)]
    got_b = [d.id for d in await b.deliveries(3, "alt", timeout=2)]
    assert (got_a, got_b) == (ids[0::2], ids[1::2])


async def test_round_robin_two_subscribers_with_unacked_prefetch(clients: list[RawClient]) -> None:
    pub, a, b, _ = clients
    for s in (a, b):
        assert_ok(await s.subscribe("rr2", prefetch=1), T.SUBSCRIBE_ACK)
    for i in range(3):
        assert_ok(await pub.publish("rr2", i, msg_id=f"r{i}"), T.PUBLISH_ACK)
    da, db = await a.delivery("rr2"), await b.delivery("rr2")
    assert (da.id, db.id) == ("r0", "r1")
    # Both are full: r2 waits until one of them acks.
    await a.expect_nothing(is_deliver, 0.2)
    await b.expect_nothing(is_deliver, 0.05)
    b.ack(db.id)
    assert (await b.delivery("rr2")).id == "r2"


async def test_fan_out_with_ack_every_subscriber_gets_each_and_must_ack(
    clients: list[RawClient],
) -> None:
    pub, a, b, _ = clients
    assert_ok(await pub.create_queue("fa", options={"mode": "FanOutWithAck"}), T.CREATE_QUEUE)
    for s in (a, b):
        assert_ok(await s.subscribe("fa", prefetch=1), T.SUBSCRIBE_ACK)
    for i in range(2):
        assert_ok(await pub.publish("fa", {"n": i}, msg_id=f"fa_{i}"), T.PUBLISH_ACK)
    for s in (a, b):
        d = await s.delivery("fa")
        assert (d.id, d.json(), d.headers["deliveryAttempts"]) == ("fa_0", {"n": 0}, "1")
    # Nobody has acked: the second message waits.
    await a.expect_nothing(is_deliver, 0.2)
    a.ack("fa_0")
    # The slowest subscriber paces the queue: still waiting for b's ack.
    await a.expect_nothing(is_deliver, 0.2)
    await b.expect_nothing(is_deliver, 0.01)
    b.ack("fa_0", by_header=False)
    for s in (a, b):
        assert (await s.delivery("fa")).id == "fa_1"
        s.ack("fa_1")
    await wait_info(pub, "fa", lambda i: i["unackedCount"] == 0 and i["messageCount"] == 0)


async def test_fan_out_without_ack_every_subscriber_gets_copies(clients: list[RawClient]) -> None:
    pub, *subs = clients
    reply = await pub.create_queue("fw", options={"mode": 2})
    assert_ok(reply, T.CREATE_QUEUE)
    for s in subs:
        # prefetch 1 would hold back a second delivery if acks were expected.
        assert_ok(await s.subscribe("fw", prefetch=1), T.SUBSCRIBE_ACK)
    ids = [f"fw_{i}" for i in range(5)]
    for mid in ids:
        assert_ok(await pub.publish("fw", mid, msg_id=mid), T.PUBLISH_ACK)
    for s in subs:
        got = await s.deliveries(5, "fw")
        assert [d.id for d in got] == ids
        assert [d.json() for d in got] == ids
        await s.expect_nothing(is_deliver, 0.05)
    value = await info(pub, "fw")
    assert value["unackedCount"] == 0
    assert value["messageCount"] == 0


async def test_priority_based_order(clients: list[RawClient]) -> None:
    pub, sub, _, _ = clients
    assert_ok(await pub.create_queue("pri", {"deliveryMode": "PriorityBased"}), T.CREATE_QUEUE)
    published = [
        ("low1", "Low"),
        ("norm1", "Normal"),
        ("high1", "High"),
        ("crit1", "Critical"),
        ("low2", "low"),
        ("crit2", "CRITICAL"),
        ("norm2", None),
        ("high2", "high"),
    ]
    for mid, prio in published:
        headers = {"priority": prio} if prio else {}
        assert_ok(await pub.publish("pri", mid, headers, msg_id=mid), T.PUBLISH_ACK)
    assert_ok(await sub.subscribe("pri", prefetch=10), T.SUBSCRIBE_ACK)
    got = [d.id for d in await sub.deliveries(len(published), "pri")]
    assert got == ["crit1", "crit2", "high1", "high2", "norm1", "norm2", "low1", "low2"]


async def test_prefetch_limits_unacked_deliveries(clients: list[RawClient]) -> None:
    pub, sub, _, _ = clients
    assert_ok(await sub.subscribe("pf", prefetch=2), T.SUBSCRIBE_ACK)
    for i in range(5):
        assert_ok(await pub.publish("pf", i, msg_id=f"pf_{i}"), T.PUBLISH_ACK)
    first = await sub.deliveries(2, "pf")
    assert [d.id for d in first] == ["pf_0", "pf_1"]
    await sub.expect_nothing(is_deliver, 0.3)
    assert (await info(pub, "pf"))["unackedCount"] == 2
    sub.ack("pf_0")
    assert (await sub.delivery("pf")).id == "pf_2"
    await sub.expect_nothing(is_deliver, 0.2)
    sub.ack("pf_1")
    sub.ack("pf_2")
    assert [d.id for d in await sub.deliveries(2, "pf")] == ["pf_3", "pf_4"]


async def test_acks_of_a_client_subscribed_to_several_queues_reach_each(
    clients: list[RawClient],
) -> None:
    # The session finds an Ack's subscription by the delivery it made (not by asking each
    # subscription in turn); the same id in several queues is settled once per Ack.
    pub, sub, _, _ = clients
    queues = ("sq_a", "sq_b", "sq_c")
    for q in queues:
        assert_ok(await sub.subscribe(q, prefetch=1), T.SUBSCRIBE_ACK)
    for i in range(3):
        for q in queues:
            assert_ok(await pub.publish(q, i, msg_id=f"same_{i}"), T.PUBLISH_ACK)
    for i in range(3):
        got = await sub.deliveries(3)
        assert sorted((d.queue, d.id) for d in got) == [(q, f"same_{i}") for q in queues]
        await sub.expect_nothing(is_deliver, 0.05)  # prefetch 1: each waits for its ack
        for _ in queues:
            sub.ack(f"same_{i}")
    for q in queues:
        value = await wait_info(pub, q, lambda v: v["unackedCount"] == 0)
        assert value["messageCount"] == 0 and value["stats"]["acked"] == 3


# -- redelivery ------------------------------------------------------------------------------------


async def test_redelivery_on_subscriber_disconnect(fast_broker: Any) -> None:
    pub = await RawClient.connected(fast_broker.port)
    first = await RawClient.connected(fast_broker.port)
    assert_ok(await first.subscribe("rd", prefetch=1), T.SUBSCRIBE_ACK)
    assert_ok(await pub.publish("rd", {"k": "v"}, {"correlationId": "c1"}, "rd_1"), T.PUBLISH_ACK)
    d1 = await first.delivery("rd")
    assert d1.headers["deliveryAttempts"] == "1"
    await first.close()  # without acking
    second = await RawClient.connected(fast_broker.port)
    assert_ok(await second.subscribe("rd"), T.SUBSCRIBE_ACK)
    d2 = await second.delivery("rd")
    assert d2.id == "rd_1"
    assert d2.headers["deliveryAttempts"] == "2"
    assert d2.headers["correlationId"] == "c1"
    assert d2.json() == {"k": "v"}
    second.ack(d2.id)
    await wait_info(pub, "rd", lambda i: i["unackedCount"] == 0 and i["messageCount"] == 0)
    await second.close()
    await pub.close()


async def test_ack_timeout_redelivers_then_dead_letters(clients: list[RawClient]) -> None:
    pub, sub, dlq_sub, _ = clients
    options = {"ackTimeout": 200, "maxRetryAttempts": 2, "enableDeadLetterQueue": True}
    assert_ok(await pub.create_queue("at", options=options), T.CREATE_QUEUE)
    assert_ok(await sub.subscribe("at"), T.SUBSCRIBE_ACK)
    loop = asyncio.get_running_loop()
    t0 = loop.time()  # (before the publish: its first delivery may come before the ack)
    assert_ok(await pub.publish("at", "x", {"correlationId": "c9"}, "at_1"), T.PUBLISH_ACK)
    d1 = await sub.delivery("at")
    assert d1.headers["deliveryAttempts"] == "1"
    d2 = await sub.delivery("at")  # never acked: redelivered after the ack timeout
    assert d2.id == "at_1"
    assert d2.headers["deliveryAttempts"] == "2"
    assert loop.time() - t0 >= 0.15
    # maxRetryAttempts reached: the next timeout moves it to the dead-letter queue.
    assert_ok(await dlq_sub.subscribe("at.dlq"), T.SUBSCRIBE_ACK)
    dead = await dlq_sub.delivery("at.dlq")
    assert dead.id == "at_1"
    assert dead.json() == "x"
    assert dead.headers["deadLetterReason"] == "MaxRetriesExceeded"
    assert dead.headers["correlationId"] == "c9"
    await sub.expect_nothing(is_deliver, 0.3)
    value = await info(pub, "at")
    assert (value["messageCount"], value["unackedCount"]) == (0, 0)
    names = (await pub.list_queues()).json()
    assert "at.dlq" in names  # type: ignore[operator]


async def test_acked_in_time_is_not_redelivered(clients: list[RawClient]) -> None:
    pub, sub, _, _ = clients
    assert_ok(await pub.create_queue("ok", options={"ackTimeout": 200}), T.CREATE_QUEUE)
    assert_ok(await sub.subscribe("ok"), T.SUBSCRIBE_ACK)
    assert_ok(await pub.publish("ok", 1, msg_id="ok_1"), T.PUBLISH_ACK)
    sub.ack((await sub.delivery("ok")).id)
    await sub.expect_nothing(is_deliver, 0.4)


# -- TTL -------------------------------------------------------------------------------------------


async def test_message_ttl_expiry_goes_to_dlq(clients: list[RawClient]) -> None:
    pub, dlq_sub, _, _ = clients
    opts = {"messageTtl": "150", "enableDeadLetterQueue": "true"}
    assert_ok(await pub.create_queue("ttl", opts), T.CREATE_QUEUE)
    assert_ok(await pub.publish("ttl", {"old": True}, msg_id="ttl_1"), T.PUBLISH_ACK)
    await wait_info(pub, "ttl", lambda i: i["messageCount"] == 0)
    assert_ok(await dlq_sub.subscribe("ttl.dlq"), T.SUBSCRIBE_ACK)
    dead = await dlq_sub.delivery("ttl.dlq")
    assert dead.id == "ttl_1"
    assert dead.json() == {"old": True}
    assert dead.headers["deadLetterReason"] == "MessageExpired"


async def test_message_ttl_expiry_without_dlq_drops(clients: list[RawClient]) -> None:
    pub, sub, _, _ = clients
    assert_ok(await pub.create_queue("ttl2", options={"messageTtl": 150}), T.CREATE_QUEUE)
    assert_ok(await pub.publish("ttl2", 1, msg_id="ttl2_1"), T.PUBLISH_ACK)
    await wait_info(pub, "ttl2", lambda i: i["messageCount"] == 0)
    assert_ok(await sub.subscribe("ttl2"), T.SUBSCRIBE_ACK)
    await sub.expect_nothing(is_deliver, 0.2)
    assert "ttl2.dlq" not in (await pub.list_queues()).json()  # type: ignore[operator]
    # Fresh messages still flow.
    assert_ok(await pub.publish("ttl2", 2, msg_id="ttl2_2"), T.PUBLISH_ACK)
    assert (await sub.delivery("ttl2")).id == "ttl2_2"


# -- overflow --------------------------------------------------------------------------------------


async def test_overflow_drop_oldest(clients: list[RawClient]) -> None:
    pub, sub, _, _ = clients
    opts = {"maxQueueSize": 3, "overflowStrategy": "DropOldest"}
    assert_ok(await pub.create_queue("dold", options=opts), T.CREATE_QUEUE)
    for i in range(5):
        assert_ok(await pub.publish("dold", i, msg_id=f"do_{i}"), T.PUBLISH_ACK)
    assert (await info(pub, "dold"))["messageCount"] == 3
    assert_ok(await sub.subscribe("dold"), T.SUBSCRIBE_ACK)
    assert [d.id for d in await sub.deliveries(3, "dold")] == ["do_2", "do_3", "do_4"]
    await sub.expect_nothing(is_deliver, 0.1)


async def test_overflow_drop_newest_is_queue_full(clients: list[RawClient]) -> None:
    pub, sub, _, _ = clients
    opts = {"maxQueueSize": 2, "overflowStrategy": "DropNewest"}
    assert_ok(await pub.create_queue("dnew", options=opts), T.CREATE_QUEUE)
    for i in range(2):
        assert_ok(await pub.publish("dnew", i, msg_id=f"dn_{i}"), T.PUBLISH_ACK)
    assert_error(await pub.publish("dnew", 2, msg_id="dn_2"), "QUEUE_FULL", "dn_2")
    assert_ok(await sub.subscribe("dnew"), T.SUBSCRIBE_ACK)
    assert [d.id for d in await sub.deliveries(2, "dnew")] == ["dn_0", "dn_1"]
    await sub.expect_nothing(is_deliver, 0.1)


async def test_overflow_block_publisher_holds_acks_until_drained(clients: list[RawClient]) -> None:
    pub, consumer, observer, _ = clients
    opts = {"maxQueueSize": 2, "overflowStrategy": "BlockPublisher"}
    assert_ok(await observer.create_queue("blk", options=opts), T.CREATE_QUEUE)
    ids = [f"blk_{i}" for i in range(5)]
    for mid in ids:
        pub.send(pub.publish_msg("blk", mid, msg_id=mid))
    for mid in ids[:2]:
        assert_ok(await pub.reply_to(mid), T.PUBLISH_ACK)
    # The third does not fit: no ack, no error, and the publisher's reads are paused.
    await pub.expect_nothing(duration=0.3)
    pub.send(Message(T.PING, "blk_ping"))
    await pub.expect_nothing(duration=0.3)
    value = await info(observer, "blk")
    assert value["messageCount"] == 2
    # Other clients are not blocked.
    assert_ok(await observer.ping(), T.PONG)
    # A consumer drains the queue: the held publishes are taken, acked in order, then the Ping.
    assert_ok(await consumer.subscribe("blk", prefetch=1), T.SUBSCRIBE_ACK)
    got = []
    for _ in ids:
        d = await consumer.delivery("blk")
        got.append(d.id)
        consumer.ack(d.id)
    assert got == ids
    replies = [(r.type, r.id) for r in [await pub.recv() for _ in range(4)]]
    # PublishAcks of a durable queue wait for the journal's fsync, so the Pong (which
    # needs none) may overtake them; among themselves they stay in order.
    assert [r for r in replies if r[0] == T.PUBLISH_ACK] == [
        (T.PUBLISH_ACK, "blk_2"),
        (T.PUBLISH_ACK, "blk_3"),
        (T.PUBLISH_ACK, "blk_4"),
    ]
    assert (T.PONG, "blk_ping") in replies


async def test_overflow_redirect_to_dlq(clients: list[RawClient]) -> None:
    pub, sub, dlq_sub, _ = clients
    opts = {"maxQueueSize": 2, "overflowStrategy": "RedirectToDlq", "enableDeadLetterQueue": True}
    assert_ok(await pub.create_queue("rdq", options=opts), T.CREATE_QUEUE)
    for i in range(3):
        assert_ok(await pub.publish("rdq", {"i": i}, msg_id=f"rq_{i}"), T.PUBLISH_ACK)
    assert (await info(pub, "rdq"))["messageCount"] == 2
    assert_ok(await dlq_sub.subscribe("rdq.dlq"), T.SUBSCRIBE_ACK)
    dead = await dlq_sub.delivery("rdq.dlq")
    assert dead.id == "rq_2"
    assert dead.json() == {"i": 2}
    assert dead.headers["deadLetterReason"] == "QueueOverflow"
    assert_ok(await sub.subscribe("rdq"), T.SUBSCRIBE_ACK)
    assert [d.id for d in await sub.deliveries(2, "rdq")] == ["rq_0", "rq_1"]


# -- memory high watermark ----------------------------------------------------------------------


async def assert_memory_pauses_publisher(pub: RawClient, consumer: RawClient, queue: str) -> None:
    """About 5 KB queued (over a 4 KB watermark) pauses the publisher until drained."""
    for i in range(5):
        assert_ok(await pub.publish(queue, "x" * 1000, msg_id=f"{queue}_{i}"), T.PUBLISH_ACK)
    pub.send(pub.publish_msg(queue, "x" * 1000, msg_id=f"{queue}_held"))
    await pub.expect_nothing(duration=0.3)
    assert_ok(await consumer.subscribe(queue), T.SUBSCRIBE_ACK)
    for _ in range(6):
        consumer.ack((await consumer.delivery(queue)).id)
    assert_ok(await pub.reply_to(f"{queue}_held"), T.PUBLISH_ACK)


async def test_memory_watermark_pauses_publisher(broker_factory: BrokerFactory) -> None:
    broker = await broker_factory(memory_high_watermark_bytes=4096, housekeeping_interval_ms=20)
    pub, consumer = [await RawClient.connected(broker.port) for _ in range(2)]
    await assert_memory_pauses_publisher(pub, consumer, "mem")


async def test_memory_watermark_still_works_after_fan_out_traffic(
    broker_factory: BrokerFactory,
) -> None:
    """Fan-out copies must not be subtracted from the memory figure more than once each."""
    broker = await broker_factory(memory_high_watermark_bytes=4096, housekeeping_interval_ms=20)
    pub, a, b, consumer = [await RawClient.connected(broker.port) for _ in range(4)]
    for mode in ("FanOutWithoutAck", "FanOutWithAck"):
        queue = f"fan-{mode}"
        assert_ok(await pub.create_queue(queue, options={"mode": mode}), T.CREATE_QUEUE)
        for s in (a, b):
            assert_ok(await s.subscribe(queue), T.SUBSCRIBE_ACK)
        for i in range(10):
            assert_ok(await pub.publish(queue, "y" * 1000, msg_id=f"{queue}_{i}"), T.PUBLISH_ACK)
        for s in (a, b):
            for d in await s.deliveries(10, queue):
                s.ack(d.id)
    await assert_memory_pauses_publisher(pub, consumer, "after-fan")


async def test_unsubscribe_returns_unacked_to_other_subscribers(clients: list[RawClient]) -> None:
    pub, a, b, _ = clients
    assert_ok(await a.subscribe("ret", prefetch=2), T.SUBSCRIBE_ACK)
    for i in range(2):
        assert_ok(await pub.publish("ret", i, msg_id=f"ret_{i}"), T.PUBLISH_ACK)
    assert [d.id for d in await a.deliveries(2, "ret")] == ["ret_0", "ret_1"]
    assert_ok(await b.subscribe("ret"), T.SUBSCRIBE_ACK)
    assert_ok(await a.unsubscribe("ret"), T.UNSUBSCRIBE_ACK)
    got = await b.deliveries(2, "ret")
    assert [(d.id, d.headers["deliveryAttempts"]) for d in got] == [("ret_0", "2"), ("ret_1", "2")]
    # An ack for the old delivery from the unsubscribed client changes nothing.
    a.ack("ret_0")
    await a.expect_nothing(is_deliver, 0.1)
    value = await info(pub, "ret")
    assert value["unackedCount"] == 2


async def test_publisher_cannot_forge_delivery_attempts(clients: list[RawClient]) -> None:
    pub, sub, _, _ = clients
    assert_ok(await sub.subscribe("forge"), T.SUBSCRIBE_ACK)
    headers = {"deliveryAttempts": "99"}
    assert_ok(await pub.publish("forge", 1, headers, msg_id="forge_1"), T.PUBLISH_ACK)
    d = await sub.delivery("forge")
    assert d.headers["deliveryAttempts"] == "1"


async def test_fan_out_with_ack_timeout_redelivers_to_the_subscriber_that_did_not_ack(
    clients: list[RawClient],
) -> None:
    pub, a, b, _ = clients
    options = {"mode": "FanOutWithAck", "ackTimeout": 200, "maxRetryAttempts": 3}
    assert_ok(await pub.create_queue("fat", options=options), T.CREATE_QUEUE)
    for s in (a, b):
        assert_ok(await s.subscribe("fat"), T.SUBSCRIBE_ACK)
    assert_ok(await pub.publish("fat", 1, msg_id="fat_1"), T.PUBLISH_ACK)
    a.ack((await a.delivery("fat")).id)
    first = await b.delivery("fat")  # b never acks this one
    assert first.headers["deliveryAttempts"] == "1"
    again = await b.delivery("fat")
    assert (again.id, again.headers["deliveryAttempts"]) == ("fat_1", "2")
    b.ack(again.id)
    # a acked its copy: it must not get the message a second time.
    await a.expect_nothing(is_deliver, 0.3)
