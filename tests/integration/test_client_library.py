"""The asyncio client library against a real broker on an ephemeral port (no mocks)."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
from waits import wait_for

from vibemq_server.client import (
    Client,
    ConnectionFailed,
    ConnectionLost,
    ReceivedMessage,
    Subscription,
    VibeMQError,
)

BrokerFactory = Callable[..., Awaitable[Any]]


async def connect_fast(port: int) -> Client:
    """A client that retries quickly, so reconnect tests stay short."""
    return await Client.connect(
        "127.0.0.1", port, reconnect_initial_delay=0.05, reconnect_max_delay=0.2, request_timeout=10
    )


@pytest.fixture
async def broker(broker_factory: BrokerFactory) -> Any:
    return await broker_factory()


@pytest.fixture
async def client(broker: Any) -> AsyncIterator[Client]:
    async with await connect_fast(broker.port) as c:
        yield c


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


async def next_message(sub: Subscription, timeout: float = 5.0) -> ReceivedMessage:
    return await sub.get(timeout=timeout)


# -- connect / auth -------------------------------------------------------------------------------


async def test_connect_exposes_connect_ack_headers(client: Client) -> None:
    assert client.connected
    assert client.connection_id
    assert client.server_version
    assert "connected" in repr(client)


async def test_client_as_context_manager_without_connect(broker: Any) -> None:
    client = Client("127.0.0.1", broker.port)
    async with client:
        assert client.connected
    assert client.closed and not client.connected
    await client.close()  # idempotent


async def test_auth_with_valid_token(broker_factory: BrokerFactory) -> None:
    b = await broker_factory(auth_tokens=["s3cret"])
    async with await Client.connect("127.0.0.1", b.port, token="s3cret") as c:
        assert await c.ping() > 0


async def test_auth_with_wrong_token_fails(broker_factory: BrokerFactory) -> None:
    b = await broker_factory(auth_tokens=["s3cret"])
    with pytest.raises(VibeMQError) as info:
        await Client.connect("127.0.0.1", b.port, token="wrong")
    assert info.value.code == "AUTH_FAILED"


async def test_auth_without_token_fails(broker_factory: BrokerFactory) -> None:
    b = await broker_factory(auth_tokens=["s3cret"])
    with pytest.raises(VibeMQError) as info:
        await Client.connect("127.0.0.1", b.port)
    assert info.value.code in {"AUTH_REQUIRED", "AUTH_FAILED"}


async def test_connect_refused_raises_connection_failed() -> None:
    with pytest.raises(ConnectionFailed) as info:
        await Client.connect("127.0.0.1", free_port(), connect_timeout=2.0)
    assert info.value.code == "CONNECTION_FAILED"


# -- publish / subscribe --------------------------------------------------------------------------


async def test_publish_returns_acked_message_id(client: Client) -> None:
    msg_id = await client.publish("orders", {"n": 1})
    assert msg_id
    assert await client.publish("orders", [1, 2], message_id="my-id-1") == "my-id-1"


async def test_subscribe_iterates_and_acks(client: Client) -> None:
    sub = await client.subscribe("jobs")
    assert sub.id and sub.active
    sent_id = await client.publish(
        "jobs", {"task": "resize", "size": [3, 4]}, headers={"correlationId": "c-1"}
    )
    received = []
    async for msg in sub:
        received.append(msg)
        await msg.ack()
        await msg.ack()  # idempotent
        break
    (msg,) = received
    assert msg.id == sent_id
    assert msg.queue == "jobs"
    assert msg.payload == {"task": "resize", "size": [3, 4]}
    assert msg.raw == b'{"task":"resize","size":[3,4]}'
    assert msg.headers["correlationId"] == "c-1"
    assert msg.delivery_attempts == 1
    assert msg.acked
    assert msg.to_dict()["payload"] == msg.payload


async def test_payload_types_round_trip(client: Client) -> None:
    sub = await client.subscribe("types")
    values: list[Any] = ["text é ✓", 42, 1.5, True, None, [], {"nested": {"a": [None]}}]
    for value in values:
        await client.publish("types", value)
    got = [(await next_message(sub)).payload for _ in values]
    assert got == values


async def test_ack_releases_prefetch_window(client: Client) -> None:
    sub = await client.subscribe("window", prefetch=1)
    await client.publish("window", 1)
    await client.publish("window", 2)
    first = await next_message(sub)
    assert first.payload == 1
    # With one unacknowledged delivery the server must hold the second back...
    with pytest.raises(TimeoutError):
        await sub.get(timeout=0.3)
    # ...and the Ack (carrying header messageId) frees the slot.
    await first.ack()
    second = await next_message(sub)
    assert second.payload == 2


async def test_many_concurrent_publishes(client: Client) -> None:
    sub = await client.subscribe("bulk")
    ids = await asyncio.gather(*(client.publish("bulk", {"i": i}) for i in range(300)))
    assert len(set(ids)) == 300
    seen = []
    for _ in range(300):
        msg = await next_message(sub)
        seen.append(msg.payload["i"])
        await msg.ack()
    assert sorted(seen) == list(range(300))


async def test_publish_error_raises_vibemq_error(client: Client) -> None:
    with pytest.raises(VibeMQError) as info:
        await client.publish("bad queue name!", {"x": 1})
    assert info.value.code == "INVALID_QUEUE"
    # The connection stays usable after an Error reply.
    assert await client.publish("fine", 1)


async def test_duplicate_subscription_on_one_client_is_refused(client: Client) -> None:
    await client.subscribe("dup")
    with pytest.raises(ValueError):
        await client.subscribe("dup")


async def test_unsubscribe_ends_iterator(client: Client) -> None:
    sub = await client.subscribe("leaving")
    await sub.unsubscribe()
    assert not sub.active and sub.end_reason == "unsubscribed"
    assert [m async for m in sub] == []
    await sub.unsubscribe()  # idempotent
    # The queue can be subscribed again afterwards.
    again = await client.subscribe("leaving")
    await client.publish("leaving", "back")
    assert (await next_message(again)).payload == "back"


async def test_subscription_context_manager_unsubscribes(client: Client) -> None:
    async with await client.subscribe("scoped") as sub:
        assert sub.active
    assert sub.end_reason == "unsubscribed"
    info = await client.queue_info("scoped")
    assert info["subscriberCount"] == 0


async def test_unacked_message_goes_to_other_subscriber(broker: Any, client: Client) -> None:
    sub = await client.subscribe("handover")
    await client.publish("handover", "work")
    first = await next_message(sub)
    assert first.delivery_attempts == 1
    async with await Client.connect("127.0.0.1", broker.port) as other:
        other_sub = await other.subscribe("handover")
        await client.close()  # unacked: the broker requeues it
        again = await next_message(other_sub)
        assert again.id == first.id
        assert again.delivery_attempts == 2
        await again.ack()


# -- queue management -----------------------------------------------------------------------------


async def test_queue_management_round_trip(client: Client) -> None:
    await client.create_queue(
        "managed",
        "FanOutWithAck",
        max_queue_size=500,
        message_ttl_ms=60_000,
        enable_dead_letter_queue=True,
        dead_letter_queue_name="managed.dlq",
        overflow_strategy="DropNewest",
        max_retry_attempts=5,
        ack_timeout_ms=2_000,
    )
    with pytest.raises(VibeMQError) as info:
        await client.create_queue("managed")
    assert info.value.code == "QUEUE_EXISTS"

    assert "managed" in await client.list_queues()
    await client.publish("managed", {"k": "v"})
    details = await client.queue_info("managed")
    assert details["name"] == "managed"
    assert details["deliveryMode"] == "FanOutWithAck"
    assert details["maxSize"] == 500
    assert details["messageCount"] == 1
    assert details["subscriberCount"] == 0
    assert "createdAt" in details

    await client.delete_queue("managed")
    assert "managed" not in await client.list_queues()
    with pytest.raises(VibeMQError) as info:
        await client.queue_info("managed")
    assert info.value.code == "QUEUE_NOT_FOUND"
    with pytest.raises(VibeMQError) as info:
        await client.delete_queue("managed")
    assert info.value.code == "QUEUE_NOT_FOUND"


async def test_create_queue_with_defaults(client: Client) -> None:
    await client.create_queue("plain")
    info = await client.queue_info("plain")
    assert info["deliveryMode"] == "RoundRobin"


async def test_list_queues_empty_and_sorted(client: Client) -> None:
    assert await client.list_queues() == []
    for name in ("b", "a", "c"):
        await client.create_queue(name)
    assert await client.list_queues() == ["a", "b", "c"]


async def test_ping_measures_round_trip(client: Client) -> None:
    rtts = [await client.ping() for _ in range(3)]
    assert all(0 < rtt < 5 for rtt in rtts)


async def test_queue_deleted_ends_iterator(broker: Any, client: Client) -> None:
    sub = await client.subscribe("doomed")
    consumed: list[Any] = []

    async def consume() -> None:
        async for msg in sub:
            consumed.append(msg.payload)
            await msg.ack()

    task = asyncio.create_task(consume())
    await client.publish("doomed", "last words")
    await wait_for(lambda: consumed == ["last words"])
    async with await Client.connect("127.0.0.1", broker.port) as admin:
        await admin.delete_queue("doomed")
    async with asyncio.timeout(5):
        await task  # the iterator ended on its own
    assert sub.end_reason == "queue_deleted"
    assert not sub.active
    # The client itself is still fine.
    assert await client.ping() > 0


# -- connection loss and reconnect ----------------------------------------------------------------


async def test_reconnect_after_broker_restart(broker_factory: BrokerFactory) -> None:
    port = free_port()
    first = await broker_factory(port=port)
    async with await connect_fast(port) as client:
        sub = await client.subscribe("durable-sub", prefetch=10)
        old_connection = client.connection_id
        await client.publish("durable-sub", "before")
        before = await next_message(sub)
        await before.ack()

        await first.stop()
        await wait_for(lambda: not client.connected)
        assert client.disconnect_reason == "server_shutdown"

        # A publish issued during the outage waits for the new connection.
        during = asyncio.create_task(client.publish("durable-sub", "during"))
        await asyncio.sleep(0.2)
        assert not during.done()

        await broker_factory(port=port)
        await client.wait_connected(timeout=5)
        assert client.reconnect_count == 1
        assert client.connection_id  # a fresh ConnectAck was processed
        assert client.disconnect_reason is None
        await asyncio.wait_for(during, 5)
        _ = old_connection

        # The same iterator goes on: the subscription was re-established.
        await client.publish("durable-sub", "after")
        payloads = {(await next_message(sub)).payload for _ in range(2)}
        assert payloads == {"during", "after"}
        assert sub.active


async def test_ack_of_message_from_lost_connection_is_ignored(
    broker_factory: BrokerFactory,
) -> None:
    port = free_port()
    first = await broker_factory(port=port)
    async with await connect_fast(port) as client:
        sub = await client.subscribe("stale")
        await client.publish("stale", 1)
        msg = await next_message(sub)
        await first.stop()
        await wait_for(lambda: not client.connected)
        await broker_factory(port=port)
        await client.wait_connected(timeout=5)
        await msg.ack()  # belongs to the old connection: silently skipped
        assert await client.ping() > 0


async def test_in_flight_publish_fails_with_connection_lost(
    broker_factory: BrokerFactory,
) -> None:
    port = free_port()
    first = await broker_factory(port=port)
    async with await connect_fast(port) as client:
        # BlockPublisher with room for one: the second publish is held unacknowledged.
        await client.create_queue("held", max_queue_size=1, overflow_strategy="BlockPublisher")
        await client.publish("held", 1)
        pending = asyncio.create_task(client.publish("held", 2))
        await asyncio.sleep(0.2)
        assert not pending.done()
        await first.stop()
        with pytest.raises(ConnectionLost):
            await asyncio.wait_for(pending, 5)
        # Not resent after the reconnect: a new broker has no queue "held" until used.
        await broker_factory(port=port)
        await client.wait_connected(timeout=5)
        assert "held" not in await client.list_queues()


async def test_no_reconnect_ends_iterators_and_fails_requests(
    broker_factory: BrokerFactory,
) -> None:
    b = await broker_factory()
    client = await Client.connect("127.0.0.1", b.port, reconnect=False)
    sub = await client.subscribe("gone")
    await b.stop()
    with pytest.raises(ConnectionLost):
        async with asyncio.timeout(5):
            async for _ in sub:
                pass
    assert sub.end_reason == "error"
    assert client.closed
    with pytest.raises(ConnectionLost):
        await client.publish("gone", 1)
    await client.close()


async def test_reconnect_gives_up_after_max_attempts(broker_factory: BrokerFactory) -> None:
    b = await broker_factory()
    client = await Client.connect(
        "127.0.0.1",
        b.port,
        reconnect_initial_delay=0.01,
        reconnect_max_delay=0.02,
        reconnect_max_attempts=3,
    )
    sub = await client.subscribe("lonely")
    await b.stop()
    with pytest.raises(ConnectionLost, match="gave up"):
        await sub.get(timeout=5)
    with pytest.raises(ConnectionLost):
        await client.ping()
    await client.close()


async def test_close_ends_subscriptions_cleanly(client: Client) -> None:
    sub = await client.subscribe("closing")
    waiter = asyncio.create_task(sub.get(timeout=5))
    await asyncio.sleep(0.05)
    await client.close()
    with pytest.raises(StopAsyncIteration):
        await waiter
    assert sub.end_reason == "closed"
    with pytest.raises(ConnectionLost):
        await client.publish("closing", 1)


async def test_unsubscribe_while_reconnecting_is_local(broker_factory: BrokerFactory) -> None:
    port = free_port()
    first = await broker_factory(port=port)
    async with await connect_fast(port) as client:
        sub = await client.subscribe("paused")
        await first.stop()
        await wait_for(lambda: not client.connected)
        await sub.unsubscribe()  # nothing to tell a server we are not connected to
        assert sub.end_reason == "unsubscribed"
        await broker_factory(port=port)
        await client.wait_connected(timeout=5)
        # Not re-subscribed on the new connection (which would have auto-created the queue).
        await client.ping()
        assert "paused" not in await client.list_queues()


async def test_idle_keepalive_pings_keep_connection_up(broker: Any) -> None:
    async with await Client.connect("127.0.0.1", broker.port, keepalive_interval=0.05) as client:
        sub = await client.subscribe("quiet")
        await asyncio.sleep(0.5)  # several idle intervals: Pongs must count as traffic
        assert client.connected and client.reconnect_count == 0
        await client.publish("quiet", "still here")
        assert (await sub.get(timeout=5)).payload == "still here"
