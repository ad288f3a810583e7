"""The HTTP listener itself: its settings (flags, environment, ready file), HTTPS with the
broker's [tls] certificate, and a real ``vibemq-server`` process: ready, then 503 while it
drains on SIGTERM, every change logged with its user and never a password."""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import socket
import ssl
from pathlib import Path
from typing import Any

import httpx
import pika
import pika.exceptions
import pytest
from certs import make_pki, tls_settings
from httpkit import HOST, TAGGED_USERS, base_url, client, raw_request, write_users
from serverproc import launch

from vibemq_server.app import create_broker
from vibemq_server.cli import build_parser, config_from_args
from vibemq_server.config import Config
from vibemq_server.server import Broker


def close_quietly(connection: pika.BlockingConnection) -> None:
    with contextlib.suppress(pika.exceptions.AMQPError):
        connection.close()


def cfg(argv: list[str], env: dict[str, str] | None = None) -> Config:
    return config_from_args(build_parser().parse_args(argv), env or {})


def test_settings_from_flags_environment_and_defaults() -> None:
    default = Config().http
    assert default.enabled and default.port == 2927 and default.tls_port == 2928
    assert default.host is None and default.open_health and default.open_metrics is None
    assert cfg([], {"VIBEMQ_HTTP__PORT": "8099"}).http.port == 8099
    assert cfg(["--http-port", "0"], {"VIBEMQ_HTTP__PORT": "8099"}).http.port == 0
    assert cfg(["--http-tls-port", "0"]).http.tls_port == 0
    assert cfg(["--no-http"]).http.enabled is False
    assert cfg([], {"VIBEMQ_HTTP__MAX_BODY_BYTES": "2048"}).http.max_body_bytes == 2048
    with pytest.raises(ValueError, match=r"http\.plain"):
        Config(http={"plain": False})


async def test_https_with_the_brokers_certificate(broker_factory: Any, tmp_path: Path) -> None:
    pki = make_pki(tmp_path)
    broker: Broker = await broker_factory(
        tls=tls_settings(pki),
        http={"port": 0, "tls_port": 0, "plain": False},
    )
    assert broker.ready()["http"] is None and isinstance(broker.ready()["http_tls"], int)
    trust = ssl.create_default_context(cafile=str(pki.ca))
    async with httpx.AsyncClient(base_url=base_url(broker, "http_tls"), verify=trust) as api:
        assert (await api.get("/health/ready")).json()["status"] == "ok"
        assert (await api.put("/api/queues/secure")).status_code == 201


async def test_no_http(broker_factory: Any) -> None:
    broker: Broker = await broker_factory(http={"enabled": False})
    assert "http" not in broker.ready()
    assert broker.services == []


async def test_a_real_process_drains_with_503_and_logs_changes(tmp_path: Path) -> None:
    users = write_users(tmp_path / "users.json")
    proc, ready, stderr = await launch(
        tmp_path, tmp_path / "data", "--users-file", str(users), "--drain-timeout", "30"
    )
    assert isinstance(ready["http"], int) and ready["http_tls"] is None
    url = f"http://{HOST}:{ready['http']}"
    admin_pw = TAGGED_USERS["admin"][0]
    amqp: pika.BlockingConnection | None = None
    try:
        async with httpx.AsyncClient(base_url=url, auth=("admin", admin_pw), timeout=10) as api:
            assert (await api.get("/health/ready")).status_code == 200
            assert (
                await api.put("/api/queues/logged", json={"maxQueueSize": 5})
            ).status_code == 201
            assert (await api.post("/api/queues/logged/messages", json={"payload": 1})).is_success
            assert (await api.delete("/api/queues/logged/contents")).status_code == 200
            assert (await api.delete("/api/queues/logged")).status_code == 204
            # uvicorn's own warnings come out in the broker's format (JSON lines here)
            garbage = await raw_request(ready["http"], b"NOT HTTP AT ALL\r\n\r\n")
            assert garbage.startswith(b"HTTP/1.1 400")
            # an AMQP client that will not answer connection.close holds the drain open
            params = pika.ConnectionParameters(
                HOST, ready["amqp"], credentials=pika.PlainCredentials("admin", admin_pw)
            )
            amqp = await asyncio.to_thread(pika.BlockingConnection, params)
            proc.send_signal(signal.SIGTERM)
            async with asyncio.timeout(15):
                while True:
                    r = await api.get("/health/ready")
                    if r.status_code == 503:
                        break
                    await asyncio.sleep(0.01)
            assert r.json()["phase"] == "draining"
            assert (await api.get("/health/live")).status_code == 200
        # the last client goes (pika reads the broker's close first): the drain is over
        await asyncio.to_thread(close_quietly, amqp)
        amqp = None
        assert await asyncio.wait_for(proc.wait(), 30) == 0
    finally:
        if amqp is not None:
            close_quietly(amqp)
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    lines = [json.loads(line) for line in (await stderr).decode().splitlines() if line.strip()]
    changes = [e for e in lines if e.get("event") == "management change"]
    assert [(e["action"], e["target"], e["user"]) for e in changes] == [
        ("create queue", "logged", "admin"),
        ("publish", "logged", "admin"),
        ("purge queue", "logged", "admin"),
        ("delete queue", "logged", "admin"),
    ]
    assert all(e["level"] == "info" for e in changes)
    assert any(e.get("source") == "uvicorn.error" and e["level"] == "warning" for e in lines)
    text = json.dumps(lines)
    assert not any(password in text for password, _ in TAGGED_USERS.values())


def settings(tmp_path: Path, **extra: Any) -> Config:
    return Config(
        host=HOST,
        port=0,
        data_dir=tmp_path / "data",
        mqtt={"port": 0},
        amqp={"port": 0},
        http={"port": 0, "tls_port": 0},
        **extra,
    )


async def test_ready_is_503_while_starting(tmp_path: Path) -> None:
    """The listener opens before journal recovery: until the broker is ready it says so."""
    broker = create_broker(settings(tmp_path))
    (service,) = broker.services
    await service.start()  # what Broker.start does first
    try:
        async with client(broker) as api:
            r = await api.get("/health/ready")
            assert r.status_code == 503 and r.json() == {
                "status": "unavailable",
                "phase": "starting",
            }
            assert (await api.get("/health/live")).status_code == 200
    finally:
        await service.stop()


async def test_a_failed_start_closes_the_http_listener(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind((HOST, 0))
        taken.listen()
        broker = create_broker(
            settings(tmp_path).model_copy(update={"port": taken.getsockname()[1]})
        )
        with pytest.raises(OSError):
            await broker.start()
    port = broker.ready()["http"]
    assert isinstance(port, int)
    with pytest.raises(OSError):
        await asyncio.open_connection(HOST, port)
