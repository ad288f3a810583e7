"""The management REST API over real HTTP (httpx) against a real broker on port 0: health,
overview and every queue endpoint, with its errors (404, 400 naming the field, 409), and
native clients on the same broker to see that the API's changes are the broker's."""

from __future__ import annotations

import asyncio
import base64
from typing import Any

import httpx
import pytest
from httpkit import client as client_of
from rawclient import RawClient
from waits import wait_for

from vibemq_server.protocol import CommandType
from vibemq_server.server import Broker


async def queue(api: httpx.AsyncClient, name: str) -> dict[str, Any]:
    r = await api.get(f"/api/queues/{name}")
    assert r.status_code == 200, r.text
    body: dict[str, Any] = r.json()
    return body


def field_named(r: httpx.Response, field: str) -> None:
    assert r.status_code == 400, r.text
    body = r.json()
    assert field in body["detail"]
    assert any(e["field"] == field for e in body["errors"]), body


# -- health and overview ------------------------------------------------------------------------


async def test_health_live_and_ready(api: httpx.AsyncClient) -> None:
    live = await api.get("/health/live")
    assert live.status_code == 200 and live.json()["status"] == "ok"
    ready = await api.get("/health/ready")
    assert ready.status_code == 200 and ready.json() == {"status": "ok", "phase": "ready"}
    for path in ("/health/live", "/health/ready"):
        head = await api.head(path)
        assert head.status_code == 200 and head.content == b""


async def test_ready_is_503_while_draining(broker_factory: Any) -> None:
    """Stop the broker while a client holds on: /health/ready turns 503 before it closes.

    The client holds on by not reading: deliveries back up in the broker's output buffer, so
    its Disconnect cannot be written and the broker waits (drain_timeout_s) for it."""
    broker: Broker = await broker_factory(drain_timeout_s=60.0)
    manager = broker.manager
    manager.create_queue("flood", manager.options_from({"durable": False}))
    for i in range(40):
        manager.publish("flood", f"f{i}", b'"' + b"x" * 900_000 + b'"', {}, route=False)
    client = await RawClient.connected(broker.port)
    await client.subscribe("flood", prefetch=1000)
    # some messages stay in the queue: the client's connection is backed up
    await wait_for(lambda: 0 < manager.queues["flood"].message_count < 40, what="backed up")
    async with client_of(broker) as api:
        assert (await api.get("/health/ready")).status_code == 200
        stopping = asyncio.ensure_future(broker.stop())
        await wait_for(lambda: str(broker.phase) == "draining", what="draining")
        r = await api.get("/health/ready")
        assert r.status_code == 503 and r.json()["phase"] == "draining"
        assert (await api.get("/health/live")).status_code == 200  # the loop still answers
        assert broker.connections  # still draining: the client holds on
        client.writer.close()  # the last client goes: the broker finishes stopping
        await stopping
    assert str(broker.phase) == "stopped"


async def test_overview(broker: Broker, api: httpx.AsyncClient) -> None:
    client = await RawClient.connected(broker.port)
    await client.create_queue("ov")
    for _ in range(3):
        await client.publish("ov", {"n": 1})
    r = await api.get("/api/overview")
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["version"] and body["phase"] == "ready" and body["uptimeSeconds"] >= 0
    assert body["listeners"]["http"] == broker.ready()["http"]
    assert body["connections"]["byProtocol"] == {"vibemq": 1}
    assert body["queues"]["count"] >= 1 and body["queues"]["ready"] >= 3
    assert set(body["rates"]["current"]) >= {"published", "delivered", "acked", "dropped"}
    assert body["rates"]["intervalSeconds"] > 0 and isinstance(body["rates"]["series"], list)
    memory = body["memory"]
    assert memory["rssBytes"] > 0 and memory["readyBytes"] > 0
    assert memory["publishersBlocked"] is False
    assert body["journal"]["available"] is True and body["journal"]["segments"] >= 1
    await client.close()


# -- queues: create, detail, delete, purge --------------------------------------------------


async def test_create_with_every_option_and_read_it_back(api: httpx.AsyncClient) -> None:
    options = {
        "deliveryMode": "PriorityBased",
        "maxQueueSize": 77,
        "messageTtl": 60000,
        "enableDeadLetterQueue": True,
        "deadLetterQueueName": "graveyard",
        "maxRetryAttempts": 5,
        "ackTimeout": 1234,
        "overflowStrategy": "DropNewest",
        "durable": False,
    }
    r = await api.put("/api/queues/full", json=options)
    assert r.status_code == 201 and r.json() == {"name": "full", "created": True}
    q = await queue(api, "full")
    assert q["deliveryMode"] == "PriorityBased" and q["maxSize"] == 77
    assert q["messageTtl"] == 60000 and q["enableDeadLetterQueue"] is True
    assert q["deadLetterQueueName"] == "graveyard" and q["maxRetryAttempts"] == 5
    assert q["ackTimeout"] == 1234 and q["overflowStrategy"] == "DropNewest"
    assert q["durable"] is False and q["subscribers"] == [] and q["internal"] is False
    # the same again: fine (200); other options: 409
    again = await api.put("/api/queues/full", json=options)
    assert again.status_code == 200 and again.json()["created"] is False
    other = await api.put("/api/queues/full", json={"maxQueueSize": 78})
    assert other.status_code == 409
    # POST with the name in the body; defaults for what is left out
    posted = await api.post("/api/queues", json={"name": "plain"})
    assert posted.status_code == 201
    assert (await queue(api, "plain"))["deliveryMode"] == "RoundRobin"


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"maxQueueSize": 0}, "maxQueueSize"),
        ({"maxQueueSize": "many"}, "maxQueueSize"),
        ({"messageTtl": -1}, "messageTtl"),
        ({"deliveryMode": "Sideways"}, "deliveryMode"),
        ({"overflowStrategy": "Explode"}, "overflowStrategy"),
        ({"ackTimeout": 0}, "ackTimeout"),
        ({"durable": "perhaps"}, "durable"),
        ({"maxQueueSiz": 5}, "maxQueueSiz"),
    ],
)
async def test_invalid_options_are_400_naming_the_field(
    api: httpx.AsyncClient, body: dict[str, Any], field: str
) -> None:
    field_named(await api.put("/api/queues/bad", json=body), field)
    assert (await api.get("/api/queues/bad")).status_code == 404  # nothing created


async def test_invalid_names(api: httpx.AsyncClient) -> None:
    assert (await api.put("/api/queues/has space")).status_code == 400
    field_named(await api.post("/api/queues", json={"name": "a/b"}), "name")
    assert (await api.put("/api/queues/$mqtt.mine")).status_code == 403  # adapters' names


async def test_missing_queue_is_404_everywhere(api: httpx.AsyncClient) -> None:
    for method, path, body in [
        ("GET", "/api/queues/nope", None),
        ("DELETE", "/api/queues/nope", None),
        ("DELETE", "/api/queues/nope/contents", None),
        ("GET", "/api/queues/nope/messages", None),
        ("POST", "/api/queues/nope/messages", {"payload": 1}),
        ("POST", "/api/queues/nope/move", {}),
    ]:
        r = await api.request(method, path, json=body)
        assert r.status_code == 404, (method, path, r.text)
        assert "nope" in r.json()["detail"]


async def test_delete_and_purge(broker: Broker, api: httpx.AsyncClient) -> None:
    client = await RawClient.connected(broker.port)
    await client.create_queue("gone")
    await client.create_queue("full")
    for i in range(4):
        await client.publish("full", {"i": i})
    purged = await api.delete("/api/queues/full/contents")
    assert purged.status_code == 200 and purged.json() == {"purged": 4}
    assert (await queue(api, "full"))["messageCount"] == 0
    assert (await api.delete("/api/queues/gone")).status_code == 204
    info = await client.queue_info("gone")
    assert info.type is CommandType.ERROR  # the native protocol agrees: gone
    await client.close()


# -- browse and publish -------------------------------------------------------------------------


async def test_browse_does_not_consume(broker: Broker, api: httpx.AsyncClient) -> None:
    client = await RawClient.connected(broker.port)
    await client.create_queue("b")
    await client.publish("b", {"order": 1}, headers={"kind": "json"})
    await client.publish("b", "just text")
    r = await api.get("/api/queues/b/messages")
    assert r.status_code == 200, r.text
    page = r.json()
    assert page["count"] == 2 and page["messageCount"] == 2
    first, second = page["messages"]
    assert first["payload"] == {"order": 1} and first["payloadEncoding"] == "json"
    assert first["headers"]["kind"] == "json" and first["redelivered"] is False
    assert second["payload"] == "just text" and first["publishedAt"].endswith("Z")
    one = (await api.get("/api/queues/b/messages", params={"offset": 1, "limit": 1})).json()
    assert [m["id"] for m in one["messages"]] == [second["id"]]
    # still all there: a subscriber gets both
    await client.subscribe("b")
    got = [await client.delivery("b"), await client.delivery("b")]
    assert [m.id for m in got] == [first["id"], second["id"]]
    await client.close()


async def test_browse_shows_redelivered(broker: Broker, api: httpx.AsyncClient) -> None:
    first = await RawClient.connected(broker.port)
    await first.create_queue("rd")
    await first.publish("rd", {"x": 1})
    await first.subscribe("rd")
    await first.delivery("rd")
    await first.close()  # unacked: back in the queue
    await wait_for(lambda: broker.manager.queues["rd"].message_count == 1)
    (msg,) = (await api.get("/api/queues/rd/messages")).json()["messages"]
    assert msg["redelivered"] is True and msg["deliveryAttempts"] == 1


async def test_publish_a_test_message(broker: Broker, api: httpx.AsyncClient) -> None:
    client = await RawClient.connected(broker.port)
    await client.create_queue("p")
    await client.subscribe("p")
    r = await api.post(
        "/api/queues/p/messages",
        json={"payload": {"hello": "world"}, "headers": {"source": "api"}, "id": "t-1"},
    )
    assert r.status_code == 201 and r.json()["id"] == "t-1"
    got = await client.delivery("p")
    assert got.id == "t-1" and got.headers["source"] == "api"
    assert got.payload == b'{"hello":"world"}'
    # bytes as base64 come back as base64 when browsed; text as text
    client.ack("t-1")
    raw = bytes(range(256))
    await client.unsubscribe("p")
    b64 = base64.b64encode(raw).decode()
    r = await api.post("/api/queues/p/messages", json={"payload": b64, "payloadEncoding": "base64"})
    assert r.status_code == 201
    r = await api.post(
        "/api/queues/p/messages", json={"payload": "plain words", "payloadEncoding": "text"}
    )
    assert r.status_code == 201
    browsed = (await api.get("/api/queues/p/messages")).json()["messages"]
    assert [(m["payload"], m["payloadEncoding"]) for m in browsed] == [
        (b64, "base64"),
        ("plain words", "text"),
    ]
    bad = await api.post(
        "/api/queues/p/messages", json={"payload": "@@", "payloadEncoding": "base64"}
    )
    assert bad.status_code == 400
    field_named(await api.post("/api/queues/p/messages", json={"priority": "urgent"}), "priority")
    await client.close()


async def test_publish_into_a_full_queue_is_409(api: httpx.AsyncClient) -> None:
    await api.put("/api/queues/tiny", json={"maxQueueSize": 1, "overflowStrategy": "DropNewest"})
    assert (await api.post("/api/queues/tiny/messages", json={"payload": 1})).status_code == 201
    r = await api.post("/api/queues/tiny/messages", json={"payload": 2})
    assert r.status_code == 409 and "full" in r.json()["detail"]


# -- dead letters back to their queue -----------------------------------------------------------


async def test_move_dead_letters_back(broker: Broker, api: httpx.AsyncClient) -> None:
    r = await api.put(
        "/api/queues/orders",
        json={"enableDeadLetterQueue": True, "maxRetryAttempts": 1, "ackTimeout": 50},
    )
    assert r.status_code == 201
    for n in range(3):
        await api.post("/api/queues/orders/messages", json={"payload": {"n": n}, "id": f"o{n}"})
    consumer = await RawClient.connected(broker.port)
    await consumer.subscribe("orders")
    for _ in range(3):
        await consumer.delivery("orders")  # never acked: the ack timeout dead-letters them
    dlq = broker.manager.queues
    await wait_for(lambda: "orders.dlq" in dlq and dlq["orders.dlq"].message_count == 3)
    await consumer.close()
    dead = (await api.get("/api/queues/orders.dlq/messages")).json()["messages"]
    assert {m["headers"]["originalQueue"] for m in dead} == {"orders"}
    assert {m["headers"]["deadLetterReason"] for m in dead} == {"MaxRetriesExceeded"}
    r = await api.post("/api/queues/orders.dlq/move", json={})
    assert r.status_code == 200, r.text
    assert r.json() == {"moved": {"orders": 3}, "total": 3, "kept": 0}
    back = (await api.get("/api/queues/orders/messages")).json()["messages"]
    assert [m["id"] for m in back] == ["o0", "o1", "o2"]
    assert all("originalQueue" not in m["headers"] for m in back)
    assert (await queue(api, "orders.dlq"))["messageCount"] == 0
    # to a named target, with a limit
    await api.put("/api/queues/elsewhere")
    r = await api.post("/api/queues/orders/move", json={"target": "elsewhere", "limit": 2})
    assert r.json()["moved"] == {"elsewhere": 2}
    missing = await api.post("/api/queues/orders/move", json={"target": "nowhere"})
    assert missing.status_code == 404
