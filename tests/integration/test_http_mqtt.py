"""``/api/mqtt``: sessions and retained messages of real paho clients -- a persistent session
appears with its filters and queued messages and goes when ended (its connected client is
disconnected, its journal records with it), retained messages are listed by filter, paged
and cleared; refusals are 404, 400 naming the field, 403."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
from httpkit import client as client_of
from httpkit import write_users
from mqttkit import PahoFactory
from waits import wait_for

from vibemq_server.server import Broker


def _port(broker: Broker) -> int:
    assert broker.mqtt_port is not None
    return broker.mqtt_port


async def test_a_persistent_session_appears_and_is_ended(
    broker: Broker, api: httpx.AsyncClient, paho_factory: PahoFactory
) -> None:
    port = _port(broker)
    keeper = await paho_factory("api-keeper", port=port, clean_session=False)
    assert await keeper.subscribe("plant/+/temp", 1) == 1
    await keeper.disconnect()
    publisher = await paho_factory("api-publisher", port=port)
    await publisher.publish("plant/a/temp", b"21.5", qos=1)

    page = (await api.get("/api/mqtt/sessions")).json()
    by_id = {s["clientId"]: s for s in page["items"]}
    assert set(by_id) == {"api-keeper", "api-publisher"} and page["total"] == 2
    kept = by_id["api-keeper"]
    assert kept["clean"] is False and kept["connected"] is False
    assert kept["filters"] == [{"filter": "plant/+/temp", "qos": 1}]
    assert kept["queuedMessages"] == 1 and kept["queue"] == "$mqtt.s.api-keeper"
    assert kept["user"] == "anonymous" and kept["connection"] is None
    live = by_id["api-publisher"]
    assert live["clean"] is True and live["connected"] is True
    connections = (await api.get("/api/connections", params={"protocol": "mqtt"})).json()
    assert live["connection"] in {c["id"] for c in connections}

    only_offline = (await api.get("/api/mqtt/sessions", params={"connected": "false"})).json()
    assert [s["clientId"] for s in only_offline["items"]] == ["api-keeper"]
    by_name = (await api.get("/api/mqtt/sessions", params={"clientId": "keep"})).json()
    assert by_name["total"] == 1
    assert (await api.get("/api/mqtt/sessions/api-keeper")).json() == kept

    ended = await api.delete("/api/mqtt/sessions/api-keeper")
    assert ended.status_code == 200, ended.text
    assert ended.json()["queuedMessages"] == 1
    assert (await api.get("/api/mqtt/sessions/api-keeper")).status_code == 404
    assert (await api.delete("/api/mqtt/sessions/api-keeper")).status_code == 404
    assert "$mqtt.s.api-keeper" not in broker.manager.queues
    back = await paho_factory("api-keeper", port=port, clean_session=False, connect=False)
    assert await back.connect() is False  # no session present: it was ended
    await back.assert_nothing()


async def test_ending_a_connected_session_disconnects_its_client(
    broker: Broker, api: httpx.AsyncClient, paho_factory: PahoFactory
) -> None:
    port = _port(broker)
    client = await paho_factory("api-live", port=port, clean_session=False)
    assert await client.subscribe("live/#", 1) == 1
    session = (await api.get("/api/mqtt/sessions/api-live")).json()
    assert session["connected"] is True and session["connection"]
    ended = await api.delete("/api/mqtt/sessions/api-live", params={"reason": "maintenance"})
    assert ended.status_code == 200, ended.text
    await wait_for(client._disconnected.is_set, what="paho sees its connection closed")
    assert (await api.get("/api/mqtt/sessions/api-live")).status_code == 404
    connections = (await api.get("/api/connections", params={"protocol": "mqtt"})).json()
    assert session["connection"] not in {c["id"] for c in connections}


async def test_ended_sessions_stay_ended_after_a_restart(
    broker_factory: Any, tmp_path: Path, paho_factory: PahoFactory
) -> None:
    data = tmp_path / "kept"
    first: Broker = await broker_factory(data_dir=data)
    for name in ("stays", "goes"):
        c = await paho_factory(name, port=_port(first), clean_session=False)
        assert await c.subscribe(f"{name}/#", 1) == 1
        await c.disconnect()
    async with client_of(first) as api:
        assert (await api.delete("/api/mqtt/sessions/goes")).status_code == 200
    await first.stop()
    second: Broker = await broker_factory(data_dir=data)
    async with client_of(second) as api:
        page = (await api.get("/api/mqtt/sessions")).json()
        assert [(s["clientId"], s["user"]) for s in page["items"]] == [("stays", None)]


async def test_retained_messages_are_listed_paged_and_cleared(
    broker: Broker, api: httpx.AsyncClient, paho_factory: PahoFactory
) -> None:
    port = _port(broker)
    publisher = await paho_factory("api-retainer", port=port)
    await publisher.publish("sensors/1/t", b'{"c": 21}', qos=1, retain=True)
    await publisher.publish("sensors/2/t", b"warm", qos=0, retain=True)
    await publisher.publish("other/x", b"\xff\x00", qos=1, retain=True)
    await wait_for(lambda: len(broker.adapters["mqtt"].retained or ()) == 3)  # type: ignore[attr-defined]

    everything = (await api.get("/api/mqtt/retained")).json()
    assert [m["topic"] for m in everything["items"]] == ["other/x", "sensors/1/t", "sensors/2/t"]
    binary, as_json, as_text = everything["items"]
    assert (binary["payloadEncoding"], binary["payload"], binary["size"]) == ("base64", "/wA=", 2)
    assert (as_json["payloadEncoding"], as_json["qos"]) == ("json", 1)
    assert as_json["payload"] == {"c": 21}
    assert (as_text["payloadEncoding"], as_text["payload"], as_text["qos"]) == ("text", "warm", 0)

    filtered = (await api.get("/api/mqtt/retained", params={"filter": "sensors/+/t"})).json()
    assert [m["topic"] for m in filtered["items"]] == ["sensors/1/t", "sensors/2/t"]
    second_page = (
        await api.get(
            "/api/mqtt/retained", params={"filter": "sensors/#", "pageSize": 1, "page": 2}
        )
    ).json()
    assert [m["topic"] for m in second_page["items"]] == ["sensors/2/t"]
    assert (second_page["total"], second_page["pages"]) == (2, 2)
    bad = await api.get("/api/mqtt/retained", params={"filter": "sensors/#/t"})
    assert bad.status_code == 400 and bad.json()["errors"][0]["field"] == "filter"
    assert (await api.get("/api/mqtt/retained", params={"pageSize": 0})).status_code == 400

    assert (await api.delete("/api/mqtt/retained/sensors/1/t")).status_code == 204
    assert (await api.delete("/api/mqtt/retained/sensors/1/t")).status_code == 404
    subscriber = await paho_factory("api-late", port=port)
    assert await subscriber.subscribe("sensors/#", 1) == 1
    got = await subscriber.get()
    assert (got.topic, got.payload, got.retain) == ("sensors/2/t", b"warm", True)
    await subscriber.assert_nothing()


async def test_mqtt_refusals(broker_factory: Any, tmp_path: Path) -> None:
    broker: Broker = await broker_factory(users_file=write_users(tmp_path / "users.json"))
    async with client_of(broker, "watcher") as watcher:
        assert (await watcher.get("/api/mqtt/sessions")).status_code == 200
        assert (await watcher.get("/api/mqtt/retained")).status_code == 200
        assert (await watcher.delete("/api/mqtt/sessions/x")).status_code == 403
        assert (await watcher.delete("/api/mqtt/retained/a/b")).status_code == 403
    async with client_of(broker, "admin") as admin:
        assert (await admin.get("/api/mqtt/sessions/nobody")).status_code == 404
    off: Broker = await broker_factory(mqtt={"enabled": False})
    async with client_of(off) as api:
        answer = await api.get("/api/mqtt/sessions")
        assert answer.status_code == 404 and "MQTT" in answer.json()["detail"]
