"""The ``vibemq`` CLI's operator commands (connections, close, purge, browse, dlq-requeue,
export, import, stats), run as subprocesses against a real broker's management HTTP API:
tables by default, JSON with ``--json``; credentials from ``--user`` and ``VIBEMQ_PASSWORD``
or a bearer ``--token``; HTTPS with ``--cafile``; refusals (401, 403, 404, unreachable) as
one clear line and exit code 1.

The broker runs in the test's event loop, so the CLI is driven with asyncio subprocesses.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import stat
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from certs import make_pki, tls_settings
from httpkit import TAGGED_USERS, base_url, write_users
from httpkit import client as client_of
from rawclient import RawClient

from vibemq_server.protocol import CommandType
from vibemq_server.server import Broker

CLI = [sys.executable, "-m", "vibemq_server.client.cli"]
TOKEN = "tok-ops-0123456789"


@dataclass
class Result:
    code: int
    out: str
    err: str

    def json(self) -> Any:
        return json.loads(self.out)


async def vibemq(
    url: str, *args: str, user: str | None = "admin", typed: str | None = None, **env: str
) -> Result:
    """Run ``vibemq ARGS`` against the API at ``url`` as ``user`` (TAGGED_USERS), its
    password in VIBEMQ_PASSWORD -- or, with ``typed``, answered to the prompt (the CLI runs
    without a controlling terminal, so getpass reads it from stdin)."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith("VIBEMQ_")}
    environ["VIBEMQ_HTTP_URL"] = url
    if user is not None:
        environ["VIBEMQ_USER"] = user
        if typed is None:
            environ["VIBEMQ_PASSWORD"] = TAGGED_USERS[user][0]
    environ.update(env)
    proc = await asyncio.create_subprocess_exec(
        *CLI,
        *args,
        env=environ,
        stdin=asyncio.subprocess.PIPE if typed is not None else asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        start_new_session=True,  # no controlling terminal: a prompt never waits on ours
    )
    stdin = typed.encode() + b"\n" if typed is not None else None
    try:
        out, err = await asyncio.wait_for(proc.communicate(stdin), 30)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise
    assert proc.returncode is not None
    return Result(proc.returncode, out.decode(), err.decode())


@pytest.fixture
async def secured(broker_factory: Any, tmp_path: Path) -> Broker:
    broker: Broker = await broker_factory(
        users_file=write_users(tmp_path / "users.json"),
        auth_tokens=[f"{TOKEN}:admin"],
        auth_failure_delay_s=0.0,
    )
    return broker


async def test_stats(secured: Broker) -> None:
    url = base_url(secured)
    human = await vibemq(url, "stats")
    assert human.code == 0, human.err
    labels = [line.split()[0] for line in human.out.splitlines()]
    assert labels == [
        "version",
        "phase",
        "uptime",
        "connections",
        "queues",
        "rates",
        "memory",
        "journal",
    ]
    assert "ready" in human.out
    machine = await vibemq(url, "stats", "--json")
    assert machine.code == 0 and machine.json()["phase"] == "ready"
    # a bearer token instead of a user and password
    token = await vibemq(url, "--token", TOKEN, "stats", "--json", user=None)
    assert token.code == 0, token.err


async def test_browse_purge_and_dlq_requeue(secured: Broker) -> None:
    url = base_url(secured)
    async with client_of(secured, "admin") as api:
        for name in ("orders", "orders.dlq", "side.dlq"):
            assert (await api.put(f"/api/queues/{name}")).status_code == 201
        for n in range(3):
            body = {"payload": {"order": n}, "headers": {"originalQueue": "orders"}}
            assert (await api.post("/api/queues/orders.dlq/messages", json=body)).is_success
        for n in range(2):
            body = {"payload": f"side {n}", "payloadEncoding": "text"}
            assert (await api.post("/api/queues/side.dlq/messages", json=body)).is_success

        browsed = await vibemq(url, "browse", "orders.dlq", "--count", "2")
        assert browsed.code == 0, browsed.err
        assert browsed.out.startswith("orders.dlq: 2 of 3 ready messages")
        assert '"order": 0' in browsed.out and "originalQueue: orders" in browsed.out
        as_json = await vibemq(url, "browse", "orders.dlq", "--json", "--offset", "2")
        assert [m["payload"] for m in as_json.json()["messages"]] == [{"order": 2}]

        back = await vibemq(url, "dlq-requeue", "orders.dlq")
        assert back.code == 0, back.err
        assert back.out.strip() == "moved 3 messages from orders.dlq (3 to orders); kept 0"
        targeted = await vibemq(
            url, "dlq-requeue", "side.dlq", "--target", "orders", "--limit", "1", "--json"
        )
        assert targeted.json() == {"moved": {"orders": 1}, "total": 1, "kept": 0}
        assert (await api.get("/api/queues/orders")).json()["messageCount"] == 4

        purged = await vibemq(url, "purge", "orders")
        assert purged.code == 0, purged.err
        assert purged.out.strip() == "purged 4 messages from orders"
        again = await vibemq(url, "purge", "orders", "--json")
        assert again.json() == {"purged": 0}


async def test_connections_and_close(secured: Broker) -> None:
    url = base_url(secured)
    native = await RawClient.connected(secured.port, token=TOKEN)
    try:
        listed = await vibemq(url, "connections", "--json")
        assert listed.code == 0, listed.err
        (conn,) = listed.json()
        assert (conn["protocol"], conn["user"]) == ("vibemq", "admin")
        table = await vibemq(url, "connections")
        header, row = table.out.splitlines()
        assert header.split()[:4] == ["ID", "PROTOCOL", "USER", "CLIENT"]
        assert row.split()[:3] == [conn["id"], "vibemq", "admin"]
        none = await vibemq(url, "connections", "--protocol", "mqtt", "--json")
        assert none.json() == []

        closed = await vibemq(url, "close", conn["id"], "--reason", "maintenance window")
        assert closed.code == 0, closed.err
        assert closed.out.strip() == f"closed {conn['id']} (vibemq, admin)"
        goodbye = await native.recv_type(CommandType.DISCONNECT)
        assert "maintenance window" in goodbye.headers.get("reason", "")
    finally:
        await native.close()


async def test_export_then_import_into_another_broker(
    secured: Broker, broker_factory: Any, tmp_path: Path
) -> None:
    url = base_url(secured)
    async with client_of(secured, "admin") as api:
        assert (await api.put("/api/queues/exported", json={"maxQueueSize": 7})).is_success
        assert (await api.put("/api/exchanges/exported-x", json={"type": "topic"})).is_success
    path = tmp_path / "defs.json"
    exported = await vibemq(url, "export", str(path))
    assert exported.code == 0, exported.err
    assert stat.S_IMODE(path.stat().st_mode) == 0o600  # it holds password hashes
    doc = json.loads(path.read_text())
    assert [q["name"] for q in doc["queues"]] == ["exported"]
    to_stdout = await vibemq(url, "export")
    assert to_stdout.json() == doc

    # a new broker without users: anonymous from loopback until the import brings them
    other: Broker = await broker_factory()
    other_url = base_url(other)
    imported = await vibemq(other_url, "import", str(path), user=None)
    assert imported.code == 0, imported.err
    assert "users: 4 created, 0 unchanged" in imported.out
    assert "queues: 1 created, 0 unchanged" in imported.out
    assert "exchanges: 1 created" in imported.out
    # the imported admin logs in with its password (its hash came along)
    again = await vibemq(other_url, "import", str(path), "--json")
    assert again.code == 0 and again.json()["unchanged"]["queues"] == ["exported"]

    doc["queues"][0]["options"]["max_queue_size"] = 8
    path.write_text(json.dumps(doc))
    conflicting = await vibemq(other_url, "import", str(path))
    assert conflicting.code == 1
    assert "conflict: queue exported" in conflicting.out


async def test_refusals_are_one_line_and_exit_1(secured: Broker, tmp_path: Path) -> None:
    url = base_url(secured)
    wrong = await vibemq(url, "stats", VIBEMQ_PASSWORD="not-it")
    assert wrong.code == 1 and wrong.out == ""
    assert wrong.err.startswith("vibemq: error: 401") and "VIBEMQ_PASSWORD" in wrong.err
    assert len(wrong.err.splitlines()) == 1

    missing = await vibemq(url, "purge", "no-such-queue")
    assert missing.code == 1
    assert missing.err.strip() == "vibemq: error: 404 Not Found: queue 'no-such-queue' not found"
    gone = await vibemq(url, "close", "no-such-connection")
    assert gone.code == 1 and "404" in gone.err

    watcher = await vibemq(url, "purge", "anything", user="watcher")
    assert watcher.code == 1 and "403" in watcher.err and "may not change" in watcher.err

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        closed_port = s.getsockname()[1]
    unreachable = await vibemq(f"http://127.0.0.1:{closed_port}", "stats")
    assert unreachable.code == 1 and "cannot reach" in unreachable.err

    not_json = tmp_path / "bad.json"
    not_json.write_text("{nope")
    bad = await vibemq(url, "import", str(not_json))
    assert bad.code == 1 and "not JSON" in bad.err
    usage = await vibemq(url, "browse", "q", "--count", "0")
    assert usage.code == 2


async def test_https_with_cafile(broker_factory: Any, tmp_path: Path) -> None:
    pki = make_pki(tmp_path)
    broker: Broker = await broker_factory(
        tls=tls_settings(pki),
        http={"port": 0, "tls_port": 0, "plain": False},
    )
    url = base_url(broker, "http_tls")
    verified = await vibemq(url, "--cafile", str(pki.ca), "stats", "--json", user=None)
    assert verified.code == 0, verified.err
    assert verified.json()["phase"] == "ready"
    untrusted = await vibemq(url, "stats", user=None)
    assert untrusted.code == 1 and "CERTIFICATE_VERIFY_FAILED" in untrusted.err


async def test_the_password_is_prompted_for_when_not_in_the_environment(secured: Broker) -> None:
    url = base_url(secured)
    prompted = await vibemq(url, "stats", "--json", typed=TAGGED_USERS["admin"][0])
    assert prompted.code == 0, prompted.err
    assert "Password for admin" in prompted.err
    wrong = await vibemq(url, "stats", typed="typo")
    assert wrong.code == 1 and "401" in wrong.err


async def test_the_api_client_sends_no_password_on_argv() -> None:
    """There is no flag for a password: it comes from the environment or a prompt."""
    usage = await vibemq("http://127.0.0.1:1", "stats", "--password", "x", user=None)
    assert usage.code == 2 and "--password" in usage.err
