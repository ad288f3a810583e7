"""The client library's batch paths against a real broker: ``publish_many`` (with refusals in
the middle of a batch), ``Subscription.ack_many``, acks coalesced per loop turn, and every
awaiting publisher released when the connection goes."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from userskit import add_user, users
from waits import wait_for

from vibemq_server.client import (
    Client,
    ConnectionLost,
    PublishBatchError,
    ReceivedMessage,
    RequestTimeout,
    Subscription,
    VibeMQError,
)

BrokerFactory = Callable[..., Awaitable[Any]]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@pytest.fixture
async def broker(broker_factory: BrokerFactory) -> Any:
    return await broker_factory()


@pytest.fixture
async def client(broker: Any) -> AsyncIterator[Client]:
    async with await Client.connect("127.0.0.1", broker.port, request_timeout=10) as c:
        yield c


async def take(sub: Subscription, count: int) -> list[ReceivedMessage]:
    return [await sub.get(timeout=5) for _ in range(count)]


def unacked(broker: Any, queue: str) -> int:
    count: int = broker.manager.queues[queue].unacked_count
    return count


async def test_publish_many_returns_ids_in_order_and_delivers_in_order(client: Client) -> None:
    payloads: list[Any] = [{"i": i} for i in range(50)] + [b'"pre-encoded"', None, [1, 2]]
    ids = await client.publish_many("batch", payloads, headers={"k": "v"}, priority="High")
    assert len(ids) == len(set(ids)) == len(payloads)
    async with await client.subscribe("batch") as sub:
        got = await take(sub, len(payloads))
    assert [m.id for m in got] == ids
    assert [m.payload for m in got] == [*payloads[:50], "pre-encoded", None, [1, 2]]
    assert all(m.headers["k"] == "v" and m.headers["priority"] == "High" for m in got)


async def test_publish_many_of_nothing(client: Client) -> None:
    assert await client.publish_many("batch", []) == []


async def test_queue_full_in_the_middle_of_a_batch(client: Client) -> None:
    await client.create_queue("tight", max_queue_size=2, overflow_strategy="DropNewest")
    with pytest.raises(PublishBatchError) as info:
        await client.publish_many("tight", range(5))
    err = info.value
    assert err.code == "QUEUE_FULL"
    assert [isinstance(r, str) for r in err.results] == [True, True, False, False, False]
    assert sorted(err.errors) == [2, 3, 4]
    assert all(e.code == "QUEUE_FULL" for e in err.errors.values())
    assert (await client.queue_info("tight"))["messageCount"] == 2
    # The connection carries on: single publishes and batches still work.
    await client.delete_queue("tight")
    assert len(await client.publish_many("tight", [1, 2])) == 2


async def test_bad_payload_in_the_middle_of_a_batch(client: Client) -> None:
    with pytest.raises(PublishBatchError) as info:
        await client.publish_many("mixed", [1, b"not json", 3])
    assert info.value.code == "INVALID_PAYLOAD"
    assert list(info.value.errors) == [1]
    stored = [r for r in info.value.results if isinstance(r, str)]
    async with await client.subscribe("mixed") as sub:
        assert [m.id for m in await take(sub, 2)] == stored


async def test_not_authorized_batch_beside_an_allowed_one(
    broker_factory: BrokerFactory, tmp_path: Path
) -> None:
    users_file = tmp_path / "users.json"
    add_user(users_file, "mia", "mia-pw")
    done = users(users_file, "permit", "mia", "--configure=^mia\\.", "--write=^mia\\.")
    assert done.returncode == 0, done.stderr
    broker = await broker_factory(users_file=users_file, auth_tokens=["tok:mia"])
    async with await Client.connect("127.0.0.1", broker.port, token="tok") as mia:
        allowed, refused = await asyncio.gather(
            mia.publish_many("mia.jobs", range(20)),
            mia.publish_many("other.jobs", range(20)),
            return_exceptions=True,
        )
        assert isinstance(allowed, list) and len(allowed) == 20
        assert isinstance(refused, PublishBatchError)
        assert refused.code == "NOT_AUTHORIZED"
        assert len(refused.errors) == 20
        with pytest.raises(VibeMQError) as info:
            await mia.publish("other.jobs", 1)
        assert info.value.code == "NOT_AUTHORIZED"
        assert await mia.publish("mia.jobs", "still open")


async def test_ack_many_settles_every_message(broker: Any, client: Client) -> None:
    await client.publish_many("acks", range(30))
    sub = await client.subscribe("acks", prefetch=100)
    got = await take(sub, 30)
    assert unacked(broker, "acks") == 30
    await got[0].ack()
    await sub.ack_many(got)  # the first is skipped: already acked
    assert all(m.acked for m in got)
    await wait_for(lambda: unacked(broker, "acks") == 0)
    await sub.unsubscribe()


async def test_acks_of_one_loop_turn_go_out_together(broker: Any, client: Client) -> None:
    await client.publish_many("turn", range(40))
    sub = await client.subscribe("turn", prefetch=10)
    seen: list[ReceivedMessage] = []
    async with asyncio.timeout(10):
        async for msg in sub:
            seen.append(msg)
            await msg.ack()
            if len(seen) == 40:
                break
    # With prefetch 10, 40 deliveries need the acks to have reached the broker.
    assert len({m.id for m in seen}) == 40
    await wait_for(lambda: unacked(broker, "turn") == 0)


async def test_connection_lost_fails_every_awaiting_publisher(
    broker_factory: BrokerFactory,
) -> None:
    port = free_port()
    broker = await broker_factory(port=port)
    client = await Client.connect("127.0.0.1", port, reconnect=False, request_timeout=30)
    # BlockPublisher with room for one: everything after the first publish is held.
    await client.create_queue("held", max_queue_size=1, overflow_strategy="BlockPublisher")
    await client.publish("held", 0)
    singles = [asyncio.create_task(client.publish("held", i)) for i in range(1, 50)]
    batch = asyncio.create_task(client.publish_many("held", range(50, 100)))
    await asyncio.sleep(0.2)
    assert not any(t.done() for t in [*singles, batch])
    await broker.stop()
    async with asyncio.timeout(10):
        results = await asyncio.gather(*singles, batch, return_exceptions=True)
    assert all(isinstance(r, ConnectionLost) for r in results), results
    with pytest.raises(ConnectionLost):
        await client.publish_many("held", [1])
    await client.close()


async def test_publish_times_out_when_held(broker_factory: BrokerFactory) -> None:
    broker = await broker_factory()
    async with await Client.connect("127.0.0.1", broker.port, request_timeout=0.3) as client:
        await client.create_queue("held", max_queue_size=1, overflow_strategy="BlockPublisher")
        await client.publish("held", 0)
        results = await asyncio.gather(
            client.publish("held", 1),
            client.publish("held", 2),
            client.publish_many("held", [3, 4]),
            return_exceptions=True,
        )
        assert all(isinstance(r, RequestTimeout) for r in results), results


async def test_publishes_without_a_request_timeout(broker: Any) -> None:
    async with await Client.connect("127.0.0.1", broker.port, request_timeout=None) as client:
        ids = await asyncio.gather(*(client.publish("untimed", i) for i in range(100)))
        assert len(set(ids)) == 100
        assert len(await client.publish_many("untimed", range(100))) == 100
        assert broker.manager.queues["untimed"].message_count == 200
