"""``/api/exchanges`` and ``/api/bindings`` against a real broker: what the API declares and
binds routes a real pika client's messages, survives a restart (the journal tables), and
every refusal has RabbitMQ's status (404, 400 naming the field, 403, 409)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
import pika
from amqputil import pika_params
from httpkit import client as client_of
from httpkit import write_users

from vibemq_server.server import Broker


def _publish_then_get(port: int, exchange: str, routing_key: str, queue: str) -> bytes | None:
    """Publish one message with pika (confirmed), then basic.get the queue."""
    conn = pika.BlockingConnection(pika_params(port))
    try:
        channel = conn.channel()
        channel.confirm_delivery()
        channel.basic_publish(exchange, routing_key, b"routed by the API's binding")
        _method, _props, body = channel.basic_get(queue, auto_ack=True)
        return body
    finally:
        conn.close()


async def _amqp(broker: Broker, exchange: str, routing_key: str, queue: str) -> bytes | None:
    assert broker.amqp_port is not None
    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(
        None, _publish_then_get, broker.amqp_port, exchange, routing_key, queue
    )


async def test_exchange_declare_detail_and_refusals(api: httpx.AsyncClient) -> None:
    spec = {"type": "topic", "durable": True, "arguments": {"alternate-exchange": "ae"}}
    created = await api.put("/api/exchanges/orders-x", json=spec)
    assert created.status_code == 201, created.text
    assert created.json()["type"] == "topic"
    again = await api.put("/api/exchanges/orders-x", json=spec)
    assert again.status_code == 200, again.text
    other = await api.put("/api/exchanges/orders-x", json={"type": "direct"})
    assert other.status_code == 409, other.text
    assert "type" in other.json()["detail"]

    listed = (await api.get("/api/exchanges")).json()
    names = [x["name"] for x in listed]
    assert names[:2] == ["", "amq.direct"] and "orders-x" in names
    detail = (await api.get("/api/exchanges/orders-x")).json()
    assert detail["arguments"] == {"alternate-exchange": "ae"}
    assert detail["predeclared"] is False and detail["bindings_out"] == 0
    default = (await api.get("/api/exchanges/amq.default")).json()
    assert default["name"] == "" and default["predeclared"] is True

    missing = await api.get("/api/exchanges/nowhere")
    assert missing.status_code == 404
    bad_type = await api.put("/api/exchanges/odd", json={"type": "x-consistent-hash"})
    assert bad_type.status_code == 400
    assert bad_type.json()["errors"][0]["field"] == "type"
    no_type = await api.put("/api/exchanges/odd", json={"durable": True})
    assert no_type.status_code == 400 and "type" in no_type.json()["detail"]
    reserved = await api.put("/api/exchanges/amq.mine", json={"type": "direct"})
    assert reserved.status_code == 403, reserved.text
    # arguments are plain JSON both ways: a nested table and a list come back as given
    nested = {"x": {"n": 1, "list": [1, "two"]}, "flag": True}
    made = await api.put("/api/exchanges/h", json={"type": "headers", "arguments": nested})
    assert made.status_code == 201, made.text
    assert (await api.get("/api/exchanges/h")).json()["arguments"] == nested

    assert (await api.delete("/api/exchanges/amq.direct")).status_code == 403
    assert (await api.delete("/api/exchanges/nowhere")).status_code == 404
    assert (await api.delete("/api/exchanges/orders-x")).status_code == 204
    assert (await api.get("/api/exchanges/orders-x")).status_code == 404


async def test_bindings_made_over_the_api_route_pika_messages(
    broker: Broker, api: httpx.AsyncClient
) -> None:
    assert (await api.put("/api/exchanges/api-x", json={"type": "topic"})).status_code == 201
    assert (await api.put("/api/queues/api-q")).status_code == 201
    binding = {"source": "api-x", "destination": "api-q", "routing_key": "orders.*"}
    made = await api.post("/api/bindings", json=binding)
    assert made.status_code == 201, made.text
    assert made.json()["destination_type"] == "queue"
    assert (await api.post("/api/bindings", json=binding)).status_code == 200

    by_source = (await api.get("/api/bindings", params={"source": "api-x"})).json()
    assert [(b["destination"], b["routing_key"]) for b in by_source] == [("api-q", "orders.*")]
    by_dest = (await api.get("/api/bindings", params={"destination": "api-q"})).json()
    assert by_dest == by_source
    assert (await api.get("/api/bindings", params={"source": "amq.topic"})).json() == []
    assert (await api.get("/api/exchanges/api-x")).json()["bindings_out"] == 1

    assert await _amqp(broker, "api-x", "orders.new", "api-q") == b"routed by the API's binding"
    assert await _amqp(broker, "api-x", "invoices.new", "api-q") is None

    # exchange-to-exchange: amq.fanout -> api-x, then into api-q by api-x's binding
    e2e = {"source": "amq.fanout", "destination": "api-x", "destination_type": "exchange"}
    assert (await api.post("/api/bindings", json=e2e)).status_code == 201
    assert await _amqp(broker, "amq.fanout", "orders.x", "api-q") is not None
    assert (await api.get("/api/exchanges/api-x")).json()["bindings_in"] == 1

    in_use = await api.delete("/api/exchanges/api-x", params={"if-unused": "true"})
    assert in_use.status_code == 409, in_use.text

    params = {"source": "api-x", "destination": "api-q", "routing_key": "orders.*"}
    removed = await api.delete("/api/bindings", params=params)
    assert removed.status_code == 200, removed.text
    assert (await api.delete("/api/bindings", params=params)).status_code == 404
    assert await _amqp(broker, "api-x", "orders.new", "api-q") is None


async def test_binding_refusals(api: httpx.AsyncClient) -> None:
    assert (await api.put("/api/exchanges/hx", json={"type": "headers"})).status_code == 201
    assert (await api.put("/api/queues/hq")).status_code == 201
    no_source = await api.post("/api/bindings", json={"source": "nope", "destination": "hq"})
    assert no_source.status_code == 404, no_source.text
    no_queue = await api.post("/api/bindings", json={"source": "hx", "destination": "nope"})
    assert no_queue.status_code == 404, no_queue.text
    empty = await api.post("/api/bindings", json={"source": "", "destination": "hq"})
    assert empty.status_code == 400 and empty.json()["errors"][0]["field"] == "source"
    x_match = await api.post(
        "/api/bindings",
        json={"source": "hx", "destination": "hq", "arguments": {"x-match": "some"}},
    )
    assert x_match.status_code == 400, x_match.text
    assert x_match.json()["errors"][0]["field"] == "arguments"
    internal = await api.post(
        "/api/bindings", json={"source": "amq.topic", "destination": "$mqtt.retained"}
    )
    assert internal.status_code == 403, internal.text
    bad_json = await api.delete(
        "/api/bindings", params={"source": "hx", "destination": "hq", "arguments": "{not json"}
    )
    assert bad_json.status_code == 400 and "arguments" in bad_json.json()["detail"]
    unknown_field = await api.post(
        "/api/bindings", json={"source": "hx", "destination": "hq", "routingKey": "k"}
    )
    assert unknown_field.status_code == 400 and "routingKey" in unknown_field.text


async def test_durable_exchanges_and_bindings_survive_a_restart(
    broker_factory: Any, tmp_path: Path
) -> None:
    data = tmp_path / "kept"
    first: Broker = await broker_factory(data_dir=data)
    async with client_of(first) as api:
        assert (await api.put("/api/exchanges/kept-x", json={"type": "direct"})).status_code == 201
        spec = {"type": "fanout", "durable": False}
        assert (await api.put("/api/exchanges/gone-x", json=spec)).status_code == 201
        assert (await api.put("/api/queues/kept-q", json={"durable": True})).status_code == 201
        binding = {"source": "kept-x", "destination": "kept-q", "routing_key": "k"}
        made = await api.post("/api/bindings", json=binding)
        assert made.status_code == 201 and made.json()["durable"] is True
    await first.stop()
    second: Broker = await broker_factory(data_dir=data)
    async with client_of(second) as api:
        assert (await api.get("/api/exchanges/kept-x")).json()["type"] == "direct"
        assert (await api.get("/api/exchanges/gone-x")).status_code == 404
        kept = (await api.get("/api/bindings", params={"destination": "kept-q"})).json()
        assert [(b["source"], b["routing_key"]) for b in kept] == [("kept-x", "k")]
    assert await _amqp(second, "kept-x", "k", "kept-q") is not None


async def test_monitoring_may_read_exchanges_but_not_declare(
    broker_factory: Any, tmp_path: Path
) -> None:
    broker: Broker = await broker_factory(users_file=write_users(tmp_path / "users.json"))
    async with client_of(broker, "watcher") as watcher, client_of(broker) as anonymous:
        assert (await watcher.get("/api/exchanges")).status_code == 200
        assert (await watcher.get("/api/bindings")).status_code == 200
        refused = await watcher.put("/api/exchanges/w", json={"type": "direct"})
        assert refused.status_code == 403
        assert (await watcher.post("/api/bindings", json={})).status_code == 403
        assert (await anonymous.get("/api/exchanges")).status_code == 401


async def test_amqp_off_means_no_exchanges(broker_factory: Any) -> None:
    broker: Broker = await broker_factory(amqp={"enabled": False})
    async with client_of(broker) as api:
        off = await api.get("/api/exchanges")
        assert off.status_code == 404 and "AMQP" in off.json()["detail"]


async def test_the_new_areas_are_described_and_bad_bodies_refused(api: httpx.AsyncClient) -> None:
    paths = (await api.get("/api/openapi.json")).json()["paths"]
    for path in (
        "/api/exchanges",
        "/api/exchanges/{name}",
        "/api/bindings",
        "/api/mqtt/sessions/{client_id}",
        "/api/mqtt/retained/{topic}",
        "/api/users/{name}",
        "/api/users/{name}/permissions",
    ):
        assert path in paths, path
    assert "400" in paths["/api/users/{name}"]["put"]["responses"]
    malformed = await api.put(
        "/api/exchanges/x", content=b"{not json", headers={"content-type": "application/json"}
    )
    assert malformed.status_code == 400
    not_an_object = await api.post("/api/bindings", json=["source", "destination"])
    assert not_an_object.status_code == 400
