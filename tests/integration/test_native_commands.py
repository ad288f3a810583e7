"""Every native VibeMQ command over a raw socket against a real broker (no client library)."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
from rawclient import Closed, RawClient, assert_error, assert_ok, new_id

from vibemq_server import __version__
from vibemq_server.protocol import CommandType, Message, encode_body
from vibemq_server.protocol.codec import frame

BrokerFactory = Callable[..., Awaitable[Any]]
T = CommandType


@pytest.fixture
async def client(broker: Any) -> AsyncIterator[RawClient]:
    c = await RawClient.connected(broker.port)
    yield c
    await c.close()


# -- Connect / auth ------------------------------------------------------------------------------


async def test_connect_ack_carries_server_version_and_connection_id(broker: Any) -> None:
    c = await RawClient.open(broker.port)
    reply = await c.connect(msg_id="conn_001")
    assert_ok(reply, T.CONNECT_ACK)
    assert reply.id == "conn_001"
    assert reply.headers["serverVersion"] == __version__
    assert reply.headers["connectionId"]
    other = await RawClient.connected(broker.port)
    second = await other.connect()  # a second Connect on an open session is refused
    assert_error(second, "INVALID_MESSAGE", second.id)
    c2 = await RawClient.open(broker.port)
    reply2 = await c2.connect()
    assert reply2.headers["connectionId"] != reply.headers["connectionId"]
    for x in (c, other, c2):
        await x.close()


async def test_auth_without_token_is_auth_required_then_closed(
    broker_factory: BrokerFactory,
) -> None:
    broker = await broker_factory(auth_tokens=["secret"])
    c = await RawClient.open(broker.port)
    reply = await c.connect(msg_id="conn_noauth")
    assert_error(reply, "AUTH_REQUIRED", "conn_noauth")
    assert await c.wait_closed() == []


async def test_auth_with_bad_token_is_auth_failed_then_closed(
    broker_factory: BrokerFactory,
) -> None:
    broker = await broker_factory(auth_tokens=["secret"])
    c = await RawClient.open(broker.port)
    reply = await c.connect("wrong", msg_id="conn_bad")
    assert_error(reply, "AUTH_FAILED", "conn_bad")
    assert await c.wait_closed() == []


async def test_auth_with_good_token_connects(broker_factory: BrokerFactory) -> None:
    broker = await broker_factory(auth_tokens=["other", "secret"])
    c = await RawClient.open(broker.port)
    assert_ok(await c.connect("secret"), T.CONNECT_ACK)
    assert_ok(await c.ping(), T.PONG)
    await c.close()


async def test_command_before_connect_is_not_authenticated_and_connection_stays_open(
    broker: Any,
) -> None:
    c = await RawClient.open(broker.port)
    reply = await c.publish("q", {"a": 1}, msg_id="early_pub")
    assert_error(reply, "NOT_AUTHENTICATED", "early_pub")
    reply = await c.request(Message(T.PING, "early_ping"))
    assert_error(reply, "NOT_AUTHENTICATED", "early_ping")
    assert_ok(await c.connect(), T.CONNECT_ACK)
    assert_ok(await c.ping(), T.PONG)
    # The refused publish was not stored.
    info = await c.queue_info("q")
    assert info.type is T.ERROR or info.json()["messageCount"] == 0  # type: ignore[index]
    await c.close()


async def test_command_before_connect_with_auth_on(broker_factory: BrokerFactory) -> None:
    broker = await broker_factory(auth_tokens=["secret"])
    c = await RawClient.open(broker.port)
    assert_error(await c.subscribe("q"), "NOT_AUTHENTICATED")
    assert_ok(await c.connect("secret"), T.CONNECT_ACK)
    assert_ok(await c.subscribe("q"), T.SUBSCRIBE_ACK)
    await c.close()


# -- Ping / Publish / Subscribe / Unsubscribe / Deliver / Ack ------------------------------------


async def test_ping_pong_echoes_id(client: RawClient) -> None:
    reply = await client.request(Message(T.PING, "ping_123"))
    assert_ok(reply, T.PONG)
    assert reply.id == "ping_123"


async def test_publish_ack(client: RawClient) -> None:
    reply = await client.publish("notifications", {"title": "Hello"}, msg_id="msg_123")
    assert_ok(reply, T.PUBLISH_ACK)
    assert reply.id == "msg_123"
    assert reply.queue == "notifications"
    assert reply.headers["messageId"] == "msg_123"
    assert reply.headers["queueName"] == "notifications"


async def test_subscribe_ack(client: RawClient) -> None:
    sub = Message(T.SUBSCRIBE, "sub_123", "notifications")
    reply = await client.request(sub)
    assert_ok(reply, T.SUBSCRIBE_ACK)
    assert reply.id == "sub_123"
    assert reply.headers["queueName"] == "notifications"
    assert reply.headers["subscriptionId"] == "sub_123"


async def test_unsubscribe_ack_stops_deliveries(client: RawClient, broker: Any) -> None:
    assert_ok(await client.subscribe("uq"), T.SUBSCRIBE_ACK)
    reply = await client.request(Message(T.UNSUBSCRIBE, "unsub_1", "uq"))
    assert_ok(reply, T.UNSUBSCRIBE_ACK)
    assert reply.id == "unsub_1"
    assert reply.headers["queueName"] == "uq"
    publisher = await RawClient.connected(broker.port)
    assert_ok(await publisher.publish("uq", 1), T.PUBLISH_ACK)
    await client.expect_nothing(lambda m: m.type is T.DELIVER)
    info = (await client.queue_info("uq")).json()
    assert info["messageCount"] == 1  # type: ignore[index]
    assert info["subscriberCount"] == 0  # type: ignore[index]
    # Unsubscribing from a queue one is not subscribed to is acknowledged as well.
    assert_ok(await client.unsubscribe("uq"), T.UNSUBSCRIBE_ACK)
    await publisher.close()


async def test_deliver_keeps_publisher_headers_and_counts_attempts(
    client: RawClient, broker: Any
) -> None:
    assert_ok(await client.subscribe("dq"), T.SUBSCRIBE_ACK)
    publisher = await RawClient.connected(broker.port)
    headers = {"priority": "high", "correlationId": "corr_456", "x-custom": "v"}
    payload = {"title": "Hello", "body": "World"}
    assert_ok(await publisher.publish("dq", payload, headers, msg_id="msg_d1"), T.PUBLISH_ACK)
    d = await client.delivery("dq")
    assert d.id == "msg_d1"
    assert d.queue == "dq"
    assert d.json() == payload
    assert d.headers["deliveryAttempts"] == "1"
    for key, value in headers.items():
        assert d.headers[key] == value
    await publisher.close()


@pytest.mark.parametrize("by_header", [True, False], ids=["header-messageId", "ack-own-id"])
async def test_ack_releases_prefetch_slot(client: RawClient, by_header: bool) -> None:
    assert_ok(await client.subscribe("aq", prefetch=1), T.SUBSCRIBE_ACK)
    for i in range(3):
        assert_ok(await client.publish("aq", i, msg_id=f"aq_{i}"), T.PUBLISH_ACK)
    first = await client.delivery("aq")
    assert first.id == "aq_0"
    await client.expect_nothing(lambda m: m.type is T.DELIVER)
    client.ack(first.id, by_header=by_header)
    second = await client.delivery("aq")
    assert second.id == "aq_1"
    client.ack(second.id, by_header=by_header)
    third = await client.delivery("aq")
    assert third.id == "aq_2"
    client.ack(third.id, by_header=by_header)
    # The Ack itself has no reply; acked messages are gone for good.
    info = (await client.queue_info("aq")).json()
    assert info["messageCount"] == 0  # type: ignore[index]
    assert info["unackedCount"] == 0  # type: ignore[index]
    await client.expect_nothing()


async def test_ack_header_takes_precedence_over_own_id(client: RawClient) -> None:
    assert_ok(await client.subscribe("pq", prefetch=1), T.SUBSCRIBE_ACK)
    assert_ok(await client.publish("pq", 1, msg_id="pq_1"), T.PUBLISH_ACK)
    assert_ok(await client.publish("pq", 2, msg_id="pq_2"), T.PUBLISH_ACK)
    d = await client.delivery("pq")
    # The Ack's own id names nothing; the header names the delivery.
    client.send(Message(T.ACK, "unrelated_ack_id", headers={"messageId": d.id}))
    assert (await client.delivery("pq")).id == "pq_2"


# -- CreateQueue / DeleteQueue / QueueInfo / ListQueues -------------------------------------------


async def _info(client: RawClient, queue: str) -> dict[str, Any]:
    reply = assert_ok(await client.queue_info(queue), T.QUEUE_INFO)
    info = reply.json()
    assert isinstance(info, dict)
    return info


async def test_create_queue_with_header_options(client: RawClient) -> None:
    headers = {
        "deliveryMode": "FanOutWithoutAck",
        "maxQueueSize": "500",
        "messageTtl": "3600000",
        "enableDeadLetterQueue": "true",
        "maxRetryAttempts": "5",
    }
    msg = Message(T.CREATE_QUEUE, "create_123", "my-queue", headers=headers)
    reply = await client.request(msg)
    assert_ok(reply, T.CREATE_QUEUE)
    assert (reply.id, reply.queue) == ("create_123", "my-queue")
    info = await _info(client, "my-queue")
    assert info["deliveryMode"] == "FanOutWithoutAck"
    assert info["maxSize"] == 500
    assert info["messageTtl"] == 3600000
    assert info["enableDeadLetterQueue"] is True
    assert info["maxRetryAttempts"] == 5
    # The same options again are fine; different ones are QUEUE_EXISTS.
    assert_ok(await client.create_queue("my-queue", headers), T.CREATE_QUEUE)
    again = Message(T.CREATE_QUEUE, "create_456", "my-queue", headers={"maxQueueSize": "501"})
    assert_error(await client.request(again), "QUEUE_EXISTS", "create_456")


@pytest.mark.parametrize(
    ("options", "mode", "overflow"),
    [
        (
            {"mode": "PriorityBased", "overflowStrategy": "DropNewest"},
            "PriorityBased",
            "DropNewest",
        ),
        ({"mode": 1, "overflowStrategy": 2}, "FanOutWithAck", "BlockPublisher"),
        ({"mode": "2", "overflowStrategy": "redirecttodlq"}, "FanOutWithoutAck", "RedirectToDlq"),
        ({"deliveryMode": 3}, "PriorityBased", "DropOldest"),
    ],
    ids=["by-name", "by-number", "number-string-and-lowercase-name", "deliveryMode-key"],
)
async def test_create_queue_with_json_payload_options(
    client: RawClient, options: dict[str, Any], mode: str, overflow: str
) -> None:
    full = {
        **options,
        "maxQueueSize": 42,
        "messageTtl": 1000,
        "enableDeadLetterQueue": True,
        "maxRetryAttempts": 7,
    }
    reply = await client.create_queue("jq", options=full)
    assert_ok(reply, T.CREATE_QUEUE)
    assert reply.queue == "jq"
    info = await _info(client, "jq")
    assert info["deliveryMode"] == mode
    assert info["overflowStrategy"] == overflow
    assert info["maxSize"] == 42
    assert info["messageTtl"] == 1000
    assert info["enableDeadLetterQueue"] is True
    assert info["maxRetryAttempts"] == 7
    assert_ok(await client.create_queue("jq", options=full), T.CREATE_QUEUE)
    reply = await client.create_queue("jq", options={**full, "maxRetryAttempts": 8})
    assert_error(reply, "QUEUE_EXISTS", reply.id)


async def test_create_queue_without_options_matches_an_auto_created_queue(
    client: RawClient,
) -> None:
    assert_ok(await client.publish("auto", 1), T.PUBLISH_ACK)
    assert_ok(await client.create_queue("auto"), T.CREATE_QUEUE)
    info = await _info(client, "auto")
    assert info["deliveryMode"] == "RoundRobin"
    assert info["maxSize"] == 10_000
    assert info["messageCount"] == 1


async def test_delete_queue_cancels_subscribers(client: RawClient, broker: Any) -> None:
    subscriber = await RawClient.connected(broker.port)
    sub_reply = await subscriber.subscribe("doomed")
    assert_ok(sub_reply, T.SUBSCRIBE_ACK)
    assert_ok(await client.publish("doomed", 1), T.PUBLISH_ACK)
    await subscriber.delivery("doomed")
    reply = await client.request(Message(T.DELETE_QUEUE, "delete_123", "doomed"))
    assert_ok(reply, T.DELETE_QUEUE)
    assert (reply.id, reply.queue) == ("delete_123", "doomed")
    cancel = await subscriber.recv_type(T.UNSUBSCRIBE_ACK)
    assert cancel.headers["reason"] == "queue_deleted"
    assert cancel.headers["queueName"] == "doomed"
    assert cancel.queue == "doomed"
    assert cancel.id == sub_reply.headers["subscriptionId"]
    names = (await client.list_queues()).json()
    assert "doomed" not in names  # type: ignore[operator]
    assert_error(await client.queue_info("doomed"), "QUEUE_NOT_FOUND")
    # The subscriber's connection is still usable.
    assert_ok(await subscriber.ping(), T.PONG)
    await subscriber.close()


async def test_delete_unknown_queue_is_queue_not_found(client: RawClient) -> None:
    reply = await client.request(Message(T.DELETE_QUEUE, "del_x", "nope"))
    assert_error(reply, "QUEUE_NOT_FOUND", "del_x")


async def test_queue_info_live_figures(client: RawClient, broker: Any) -> None:
    before = dt.datetime.now(dt.UTC) - dt.timedelta(seconds=1)
    assert_ok(await client.create_queue("iq"), T.CREATE_QUEUE)
    reply = await client.request(Message(T.QUEUE_INFO, "info_123", "iq"))
    assert_ok(reply, T.QUEUE_INFO)
    assert (reply.id, reply.queue) == ("info_123", "iq")
    info = reply.json()
    assert isinstance(info, dict)
    assert info["name"] == "iq"
    assert info["messageCount"] == 0
    assert info["subscriberCount"] == 0
    assert info["deliveryMode"] == "RoundRobin"
    assert info["maxSize"] == 10_000
    created = dt.datetime.fromisoformat(info["createdAt"].replace("Z", "+00:00"))
    assert before <= created <= dt.datetime.now(dt.UTC) + dt.timedelta(seconds=1)

    for i in range(3):
        assert_ok(await client.publish("iq", i), T.PUBLISH_ACK)
    assert (await _info(client, "iq"))["messageCount"] == 3
    subscriber = await RawClient.connected(broker.port)
    assert_ok(await subscriber.subscribe("iq", prefetch=1), T.SUBSCRIBE_ACK)
    d = await subscriber.delivery("iq")
    info = await _info(client, "iq")
    assert info["subscriberCount"] == 1
    assert info["messageCount"] == 2
    assert info["createdAt"] == reply.json()["createdAt"]  # type: ignore[index]
    subscriber.ack(d.id)
    await subscriber.delivery("iq")
    await subscriber.close()
    # Disconnected: its unacked delivery goes back to the queue, the subscriber count drops.
    for _ in range(100):
        info = await _info(client, "iq")
        if info["subscriberCount"] == 0:
            break
    assert info["subscriberCount"] == 0
    assert info["messageCount"] == 2


async def test_queue_info_unknown_queue_is_queue_not_found(client: RawClient) -> None:
    reply = await client.request(Message(T.QUEUE_INFO, "info_x", "missing"))
    assert_error(reply, "QUEUE_NOT_FOUND", "info_x")


async def test_list_queues_json_array(client: RawClient) -> None:
    reply = await client.request(Message(T.LIST_QUEUES, "list_123"))
    assert_ok(reply, T.LIST_QUEUES)
    assert reply.id == "list_123"
    assert reply.json() == []
    for name in ("queue1", "queue2", "queue3"):
        assert_ok(await client.create_queue(name), T.CREATE_QUEUE)
    assert_ok(await client.publish("queue4", 1), T.PUBLISH_ACK)
    names = (await client.list_queues()).json()
    assert isinstance(names, list)
    assert sorted(names) == ["queue1", "queue2", "queue3", "queue4"]


# -- Disconnect / auto-create off / decoder forms -------------------------------------------------


async def test_client_disconnect_closes_connection(broker: Any) -> None:
    c = await RawClient.connected(broker.port)
    assert_ok(await c.subscribe("dc", prefetch=1), T.SUBSCRIBE_ACK)
    c.send(Message(T.DISCONNECT, "disc_123"))
    await c.wait_closed()
    with pytest.raises(Closed):
        await c.recv()
    other = await RawClient.connected(broker.port)
    for _ in range(100):
        if (await _info(other, "dc"))["subscriberCount"] == 0:
            break
    assert (await _info(other, "dc"))["subscriberCount"] == 0
    await other.close()


async def test_auto_create_off_publish_and_subscribe_need_existing_queue(
    broker_factory: BrokerFactory,
) -> None:
    broker = await broker_factory(auto_create_queues=False)
    c = await RawClient.connected(broker.port)
    assert_error(await c.publish("absent", 1, msg_id="p_absent"), "QUEUE_NOT_FOUND", "p_absent")
    reply = await c.request(Message(T.SUBSCRIBE, "s_absent", "absent"))
    assert_error(reply, "QUEUE_NOT_FOUND", "s_absent")
    assert (await c.list_queues()).json() == []
    assert_ok(await c.create_queue("absent"), T.CREATE_QUEUE)
    assert_ok(await c.subscribe("absent"), T.SUBSCRIBE_ACK)
    assert_ok(await c.publish("absent", 1, msg_id="p_ok"), T.PUBLISH_ACK)
    assert (await c.delivery("absent")).id == "p_ok"
    await c.close()


@pytest.mark.parametrize("kind", [T.PUBLISH, T.PING, T.CONNECT])
async def test_trailing_empty_error_fields_are_accepted(broker: Any, kind: CommandType) -> None:
    c = await RawClient.open(broker.port)
    if kind is not T.CONNECT:
        assert_ok(await c.connect(), T.CONNECT_ACK)
    msg = Message(kind, new_id("trail"), "tq" if kind is T.PUBLISH else "", b"")
    if kind is T.PUBLISH:
        msg.payload = json.dumps({"x": 1}).encode()
    body = encode_body(msg) + b"\x00\x00\x00\x00"  # empty errorCode and errorMessage
    c.send_raw(frame(body))
    reply = await c.reply_to(msg.id)
    expected = {T.PUBLISH: T.PUBLISH_ACK, T.PING: T.PONG, T.CONNECT: T.CONNECT_ACK}[kind]
    assert_ok(reply, expected)
    # And the short form (what the original sends) on the same connection.
    assert_ok(await c.ping(), T.PONG)
    await c.close()
