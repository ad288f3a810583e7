"""The management areas mounted on the HTTP listener beside queues: ``/metrics`` (parsed and
checked by promtool), ``/api/connections`` and ``/api/consumers`` (listing real clients of
two protocols, closing them with a reason they see), ``/api/definitions`` (a round trip
between two brokers, and a bad document refused with its fields named)."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import httpx
import pika
import pika.exceptions
from amqputil import pika_params
from httpkit import client as client_of
from prometheus_client.parser import text_string_to_metric_families
from rawclient import RawClient
from test_metrics import promtool
from waits import wait_for

from vibemq_server.protocol import CommandType
from vibemq_server.server import Broker


async def test_metrics_over_http(broker: Broker, api: httpx.AsyncClient) -> None:
    client = await RawClient.connected(broker.port)
    try:
        await client.create_queue("scraped")
        await client.publish("scraped", {"n": 1})
        r = await api.get("/metrics")
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/plain; version=0.0.4")
        families = {f.name: f for f in text_string_to_metric_families(r.text)}
        depth = families["vibemq_queue_messages"]
        assert any(s.labels.get("queue") == "scraped" and s.value == 1 for s in depth.samples), (
            depth.samples
        )
        await asyncio.get_running_loop().run_in_executor(None, promtool, r.text)
    finally:
        await client.close()


async def test_connections_are_listed_and_closed_with_a_reason(
    broker: Broker, api: httpx.AsyncClient
) -> None:
    native = await RawClient.connected(broker.port)
    assert broker.amqp_port is not None
    closed: list[BaseException] = []
    opened = threading.Event()

    def amqp_client() -> None:
        conn = pika.BlockingConnection(pika_params(broker.amqp_port or 0))
        channel = conn.channel()
        channel.queue_declare("http-consumed")
        channel.basic_consume("http-consumed", lambda *a: None)
        opened.set()
        try:
            for _ in range(300):  # bounded: 30 s
                conn.process_data_events(time_limit=0.1)
        except pika.exceptions.ConnectionClosedByBroker as exc:
            closed.append(exc)

    loop = asyncio.get_running_loop()
    amqp = loop.run_in_executor(None, amqp_client)
    try:
        await wait_for(opened.is_set, what="the AMQP client consumes")
        listed = (await api.get("/api/connections")).json()
        by_protocol = {c["protocol"]: c for c in listed}
        assert {"vibemq", "amqp"} <= set(by_protocol), listed
        only_amqp = (await api.get("/api/connections", params={"protocol": "amqp"})).json()
        assert [c["protocol"] for c in only_amqp] == ["amqp"]
        amqp_id = by_protocol["amqp"]["id"]
        detail = (await api.get(f"/api/connections/{amqp_id}")).json()
        assert [c["queue"] for c in detail["consumer_list"]] == ["http-consumed"]
        consumers = (await api.get("/api/consumers", params={"queue": "http-consumed"})).json()
        assert [c["connection"] for c in consumers] == [amqp_id]

        r = await api.delete(f"/api/connections/{amqp_id}", params={"reason": "maintenance"})
        assert r.status_code == 200, r.text
        await asyncio.wait_for(amqp, 30)
        assert closed and closed[0].args[:2] == (320, "CONNECTION_FORCED - maintenance")

        native_id = by_protocol["vibemq"]["id"]
        r = await api.delete(f"/api/connections/{native_id}", headers={"X-Reason": "bye"})
        assert r.status_code == 200, r.text
        goodbye = await native.recv_type(CommandType.DISCONNECT)
        assert "bye" in goodbye.headers.get("reason", ""), goodbye
        assert (await api.get(f"/api/connections/{native_id}")).status_code in (200, 404)
        missing = await api.delete("/api/connections/no-such-connection")
        assert missing.status_code == 404
    finally:
        await native.close()
        if not amqp.done():
            await asyncio.wait_for(amqp, 30)


async def test_definitions_round_trip_between_brokers(broker_factory: Any) -> None:
    first: Broker = await broker_factory()
    second: Broker = await broker_factory()
    async with client_of(first) as a, client_of(second) as b:
        created = await a.put("/api/queues/defs-orders", json={"maxQueueSize": 500})
        assert created.status_code in (200, 201), created.text
        exported = (await a.get("/api/definitions")).json()
        assert any(q["name"] == "defs-orders" for q in exported["queues"])
        report = await b.post("/api/definitions", json=exported)
        assert report.status_code == 200, report.text
        again = (await b.get("/api/definitions")).json()
        assert again == exported
        bad = await b.post("/api/definitions", json={"queues": [{"name": 5, "bogus": 1}]})
        assert bad.status_code == 400
        assert "queues.0" in bad.text
