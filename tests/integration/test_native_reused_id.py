"""A publisher reusing a message id: only that message waits, over a socket.

The native protocol's Ack names a message by the id its publisher gave it, and publishers
may reuse ids, so a subscriber never holds two deliveries of one id: the second waits (on
that subscriber, or goes to another one). Before, it stopped its whole queue until the first
was acked, and a consumer that acks in batches (here: once it holds 4) waited forever with
room in its window. The consumers here are the client library's (``vibemq_server.client``);
each wait for a delivery is bounded (a stall fails it), nothing asserts on time."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from vibemq_server.client import Client, ReceivedMessage, Subscription

BrokerFactory = Callable[..., Awaitable[Any]]
WAIT_S = 10.0  # a bound on each wait: a stall fails the test, it is never a figure
BATCH = 4


async def receive(sub: Subscription, n: int) -> list[ReceivedMessage]:
    return [await sub.get(timeout=WAIT_S) for _ in range(n)]


async def all_settled(client: Client, queue: str) -> None:
    """QueueInfo until nothing is ready or unacked in ``queue`` (bounded)."""
    async with asyncio.timeout(WAIT_S):
        while True:
            info = await client.queue_info(queue)
            if info["unackedCount"] == 0 and info["messageCount"] == 0:
                return
            await asyncio.sleep(0.01)


async def release_the_parked_x(
    pub: Client, sub: Subscription, held: list[ReceivedMessage], queue: str
) -> None:
    """Ack ``held``: the "x" parked behind the one among them comes, a first delivery (it
    was never sent); once that is acked too, nothing is left in ``queue``."""
    await sub.ack_many(held)
    (last,) = await receive(sub, 1)
    assert last.id == "x" and last.delivery_attempts == 1
    await last.ack()
    await all_settled(pub, queue)


async def test_a_batch_acking_consumer_is_not_stalled_by_a_reused_id(
    broker_factory: BrokerFactory,
) -> None:
    broker = await broker_factory()
    async with (
        await Client.connect("127.0.0.1", broker.port) as pub,
        await Client.connect("127.0.0.1", broker.port) as con,
    ):
        sub = await con.subscribe("batch", prefetch=10)
        for msg_id in ("x", "x", "a", "b", "c"):
            await pub.publish("batch", {"id": msg_id}, message_id=msg_id)
        held = await receive(sub, BATCH)  # before: only "x" came, and the consumer waited
        assert [m.id for m in held] == ["x", "a", "b", "c"]
        await release_the_parked_x(pub, sub, held, "batch")


async def test_rounds_of_reused_ids_all_arrive_to_a_batch_acking_consumer(
    broker_factory: BrokerFactory,
) -> None:
    """Each round: a publish sent twice under one id (a publisher's retry), then ``BATCH``
    new ids, all published before the consumer reads; the consumer acks whenever it holds
    ``BATCH``. Every message arrives. (One id twice in a row at a time: a consumer holds one
    delivery of an id at a time, so with the same id parked many times over, a consumer
    that waits for ``BATCH`` before acking would in the end hold fewer than that, waiting
    for messages only its own Ack can release.)"""
    broker = await broker_factory()
    rounds = 30
    async with (
        await Client.connect("127.0.0.1", broker.port) as pub,
        await Client.connect("127.0.0.1", broker.port) as con,
    ):
        sub = await con.subscribe("rounds", prefetch=50)
        sent: list[str] = []
        for r in range(rounds):
            for msg_id in [f"d{r}", f"d{r}", *(f"u{r}-{j}" for j in range(BATCH))]:
                await pub.publish("rounds", {"r": r}, message_id=msg_id)
                sent.append(msg_id)
        got: list[str] = []
        held: list[ReceivedMessage] = []
        while len(got) < len(sent):
            msg = await sub.get(timeout=WAIT_S)
            got.append(msg.id)
            held.append(msg)
            if len(held) >= BATCH:
                await sub.ack_many(held)
                held = []
        assert sorted(got) == sorted(sent)
        await sub.ack_many(held)
        await all_settled(pub, "rounds")


async def test_another_subscriber_takes_the_reused_id(broker_factory: BrokerFactory) -> None:
    broker = await broker_factory()
    async with (
        await Client.connect("127.0.0.1", broker.port) as pub,
        await Client.connect("127.0.0.1", broker.port) as ca,
        await Client.connect("127.0.0.1", broker.port) as cb,
    ):
        sa = await ca.subscribe("rr", prefetch=10)
        await pub.publish("rr", {}, message_id="x")
        assert (await sa.get(timeout=WAIT_S)).id == "x"
        sb = await cb.subscribe("rr", prefetch=10)
        await pub.publish("rr", {}, message_id="x")  # a holds "x": b takes it, whose turn
        assert (await sb.get(timeout=WAIT_S)).id == "x"  # it was (before: a's, and stuck)


async def test_a_consumer_that_leaves_gives_its_parked_message_to_another(
    broker_factory: BrokerFactory,
) -> None:
    broker = await broker_factory()
    async with (
        await Client.connect("127.0.0.1", broker.port) as pub,
        await Client.connect("127.0.0.1", broker.port) as cb,
    ):
        ca = await Client.connect("127.0.0.1", broker.port)
        sa = await ca.subscribe("leave", prefetch=10)
        for msg_id in ("x", "x", "a"):
            await pub.publish("leave", {"id": msg_id}, message_id=msg_id)
        assert [m.id for m in await receive(sa, 2)] == ["x", "a"]  # the second "x" waits
        await ca.close()  # unacked: x and a go back, the parked "x" with them
        sb = await cb.subscribe("leave", prefetch=10)
        first = await receive(sb, 2)
        assert [m.id for m in first] == ["x", "a"] and first[0].delivery_attempts == 2
        await release_the_parked_x(pub, sb, first, "leave")


async def test_fan_out_goes_on_past_a_subscriber_holding_the_id(
    broker_factory: BrokerFactory,
) -> None:
    broker = await broker_factory()
    async with (
        await Client.connect("127.0.0.1", broker.port) as pub,
        await Client.connect("127.0.0.1", broker.port) as ca,
        await Client.connect("127.0.0.1", broker.port) as cb,
    ):
        await pub.create_queue("fan", "FanOutWithAck")
        sa = await ca.subscribe("fan", prefetch=10)
        sb = await cb.subscribe("fan", prefetch=10)
        await pub.publish("fan", {}, message_id="x")
        (first_a,) = await receive(sa, 1)
        (first_b,) = await receive(sb, 1)
        await first_b.ack()
        await pub.publish("fan", {}, message_id="x")
        await pub.publish("fan", {}, message_id="y")
        assert [m.id for m in await receive(sb, 2)] == ["x", "y"]
        assert [m.id for m in await receive(sa, 1)] == ["y"]  # a's "x" waits, "y" does not
        await first_a.ack()
        (second_a,) = await receive(sa, 1)
        assert second_a.id == "x" and second_a.delivery_attempts == 1
