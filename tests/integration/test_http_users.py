"""``/api/users``: users made over the API log in with real clients (pika, paho) at once, a
permission change reaches an already-open native connection's next publish, deleting a user
ends its logins; no answer and no log line ever holds a password or a hash; refusals are 404,
400 naming the field, 401 and 403."""

from __future__ import annotations

import asyncio
import json
import signal
from pathlib import Path
from typing import Any

import httpx
import pika
import pika.exceptions
import pytest
from amqputil import pika_params
from httpkit import HOST, TAGGED_USERS, base_url, write_users
from httpkit import client as client_of
from mqttkit import PahoFactory, RawMqtt
from rawclient import RawClient
from serverproc import launch

from vibemq_server.auth import UserStore
from vibemq_server.protocol import CommandType, Message
from vibemq_server.server import Broker

PASSWORD = "carol-secret-pw"


@pytest.fixture
async def secured(broker_factory: Any, tmp_path: Path) -> Broker:
    broker: Broker = await broker_factory(
        users_file=write_users(tmp_path / "users.json"), auth_failure_delay_s=0.0
    )
    return broker


def _amqp_login(port: int, user: str, password: str) -> None:
    """Log in with pika and publish one message (raises when refused)."""
    credentials = pika.PlainCredentials(user, password)
    conn = pika.BlockingConnection(pika_params(port, credentials=credentials))
    try:
        channel = conn.channel()
        channel.queue_declare("users-q")
        channel.basic_publish("", "users-q", b"hello")
    finally:
        conn.close()


def _mqtt_refused(port: int, user: str, password: str) -> int:
    raw = RawMqtt(port)
    try:
        return raw.connect("refused-client", username=user, password=password.encode()).return_code
    finally:
        raw.close()


async def _native_login(broker: Broker, user: str, password: str) -> RawClient:
    client = await RawClient.open(broker.port)
    reply = await client.request(
        Message(CommandType.CONNECT, "login", headers={"username": user, "password": password})
    )
    assert reply.type is CommandType.CONNECT_ACK, reply
    return client


async def test_users_are_listed_without_hashes(secured: Broker) -> None:
    async with client_of(secured, "watcher") as watcher:
        listed = await watcher.get("/api/users")
        assert listed.status_code == 200
        assert [u["name"] for u in listed.json()] == ["admin", "manager", "nobody", "watcher"]
        assert "scrypt" not in listed.text and "hash" not in listed.text
        admin = (await watcher.get("/api/users/admin")).json()
        assert admin == {
            "name": "admin",
            "tags": ["administrator"],
            "permissions": {"configure": ".*", "write": ".*", "read": ".*"},
        }
        assert (await watcher.get("/api/users/ghost")).status_code == 404
        refused = await watcher.put("/api/users/x", json={"password": "pw"})
        assert refused.status_code == 403
        assert (await watcher.delete("/api/users/nobody")).status_code == 403
    async with httpx.AsyncClient(base_url=base_url(secured)) as anonymous:
        assert (await anonymous.get("/api/users")).status_code == 401


async def test_a_user_made_over_the_api_logs_in_at_once(
    secured: Broker, paho_factory: PahoFactory
) -> None:
    loop = asyncio.get_running_loop()
    amqp_port, mqtt_port = secured.amqp_port, secured.mqtt_port
    assert amqp_port is not None and mqtt_port is not None
    async with client_of(secured, "admin") as admin:
        made = await admin.put("/api/users/carol", json={"password": PASSWORD, "tags": []})
        assert made.status_code == 201, made.text
        assert made.json()["tags"] == [] and PASSWORD not in made.text
        assert "scrypt" not in made.text
        stored = UserStore(secured.config.users_path).load()["carol"]
        assert stored.password_hash.startswith("$scrypt$")

        await loop.run_in_executor(None, _amqp_login, amqp_port, "carol", PASSWORD)
        paho = await paho_factory("carol-mqtt", port=mqtt_port, connect=False)
        paho.client.username_pw_set("carol", PASSWORD)
        await paho.connect()
        await paho.disconnect()

        # tags: monitoring from now on may read the API and change nothing
        tagged = await admin.put("/api/users/carol", json={"tags": ["monitoring"]})
        assert tagged.status_code == 200 and tagged.json()["tags"] == ["monitoring"]
        async with httpx.AsyncClient(base_url=base_url(secured), auth=("carol", PASSWORD)) as carol:
            assert (await carol.get("/api/users")).status_code == 200
            assert (await carol.put("/api/queues/carols")).status_code == 403

        # a new password: the old one no longer logs in
        changed = await admin.put("/api/users/carol", json={"password": "second-pw"})
        assert changed.status_code == 200
        with pytest.raises(pika.exceptions.ProbableAuthenticationError):
            await loop.run_in_executor(None, _amqp_login, amqp_port, "carol", PASSWORD)
        await loop.run_in_executor(None, _amqp_login, amqp_port, "carol", "second-pw")


async def test_a_permission_change_reaches_an_open_connection(secured: Broker) -> None:
    loop = asyncio.get_running_loop()
    async with client_of(secured, "admin") as admin:
        made = await admin.put("/api/users/dave", json={"password": "dave-pw"})
        assert made.status_code == 201, made.text
        client = await _native_login(secured, "dave", "dave-pw")
        try:
            assert (await client.publish("live.a", b"1")).type is CommandType.PUBLISH_ACK
            narrowed = await admin.put("/api/users/dave/permissions", json={"write": r"^other\."})
            assert narrowed.status_code == 200, narrowed.text
            assert narrowed.json()["permissions"] == {
                "configure": ".*",
                "write": r"^other\.",
                "read": ".*",
            }
            refused = await client.publish("live.a", b"2")
            assert refused.error_code == "NOT_AUTHORIZED", refused
            assert (await client.publish("other.a", b"3")).type is CommandType.PUBLISH_ACK

            assert (await admin.delete("/api/users/dave")).status_code == 204
            assert (await admin.delete("/api/users/dave")).status_code == 404
            assert (await client.publish("other.a", b"4")).error_code == "NOT_AUTHORIZED"
        finally:
            await client.close()
        assert secured.mqtt_port is not None
        code = await loop.run_in_executor(None, _mqtt_refused, secured.mqtt_port, "dave", "dave-pw")
        assert code in (4, 5)


async def test_user_refusals_name_the_field(secured: Broker) -> None:
    async with client_of(secured, "manager") as api:
        no_password = await api.put("/api/users/erin", json={"tags": ["monitoring"]})
        assert no_password.status_code == 400
        assert no_password.json()["errors"][0]["field"] == "password"
        bad_tag = await api.put("/api/users/erin", json={"password": "pw", "tags": [""]})
        assert bad_tag.status_code == 400 and bad_tag.json()["errors"][0]["field"] == "tags"
        bad_name = await api.put("/api/users/a:b", json={"password": "pw"})
        assert bad_name.status_code == 400 and bad_name.json()["errors"][0]["field"] == "name"
        unknown = await api.put("/api/users/erin", json={"password": "pw", "admin": True})
        assert unknown.status_code == 400 and "admin" in unknown.text
        bad_regex = await api.put("/api/users/admin/permissions", json={"write": "(unclosed"})
        assert bad_regex.status_code == 400, bad_regex.text
        assert bad_regex.json()["errors"][0]["field"] == "write"
        assert "erin" not in [u["name"] for u in (await api.get("/api/users")).json()]
        missing = await api.put("/api/users/ghost/permissions", json={"read": ".*"})
        assert missing.status_code == 404
        assert (await api.get("/api/users/admin")).json()["permissions"]["write"] == ".*"


async def test_a_real_process_logs_user_changes_without_secrets(tmp_path: Path) -> None:
    users = write_users(tmp_path / "users.json")
    proc, ready, stderr = await launch(tmp_path, tmp_path / "data", "--users-file", str(users))
    try:
        url = f"http://{HOST}:{ready['http']}"
        auth = ("admin", TAGGED_USERS["admin"][0])
        async with httpx.AsyncClient(base_url=url, auth=auth, timeout=10) as api:
            made = await api.put("/api/users/frank", json={"password": PASSWORD, "tags": []})
            assert made.status_code == 201, made.text
            changed = await api.put("/api/users/frank", json={"password": "another-pw"})
            assert changed.status_code == 200
            permitted = await api.put("/api/users/frank/permissions", json={"read": "^a"})
            assert permitted.status_code == 200
            assert (await api.delete("/api/users/frank")).status_code == 204
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), 30) == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    text = (await stderr).decode()
    lines = [json.loads(line) for line in text.splitlines() if line.strip()]
    changes = [(e["action"], e["target"]) for e in lines if e.get("event") == "management change"]
    assert changes == [
        ("create user", "frank"),
        ("update user", "frank"),
        ("set permissions", "frank"),
        ("delete user", "frank"),
    ]
    for secret in (PASSWORD, "another-pw", "$scrypt$"):
        assert secret not in text
