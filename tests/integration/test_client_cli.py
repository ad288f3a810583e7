"""The ``vibemq`` command-line client, run as a subprocess against a real broker.

The broker runs in the test's event loop, so the CLI is driven with asyncio subprocesses: a
blocking ``subprocess.run`` would stall the very broker it talks to.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import pytest

from vibemq_server.client import Client

BrokerFactory = Callable[..., Awaitable[Any]]
CLI = [sys.executable, "-m", "vibemq_server.client.cli"]


@dataclass
class Result:
    code: int
    out: str
    err: str

    def lines(self) -> list[str]:
        return self.out.splitlines()


def cli_env(port: int, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("VIBEMQ_")}
    env["VIBEMQ_PORT"] = str(port)
    env.update(extra)
    return env


async def run_cli(port: int, *args: str, timeout: float = 20.0, **env: str) -> Result:
    proc = await asyncio.create_subprocess_exec(
        *CLI,
        *args,
        env=cli_env(port, **env),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise
    assert proc.returncode is not None
    return Result(proc.returncode, out.decode(), err.decode())


@pytest.fixture
async def broker(broker_factory: BrokerFactory) -> Any:
    return await broker_factory()


@pytest.fixture
async def client(broker: Any) -> AsyncIterator[Client]:
    async with await Client.connect("127.0.0.1", broker.port) as c:
        yield c


async def test_publish_then_subscribe(broker: Any) -> None:
    pub = await run_cli(broker.port, "publish", "cli-q", '{"order": 7}', "--header", "k=v")
    assert pub.code == 0, pub.err
    (msg_id,) = pub.lines()

    sub = await run_cli(broker.port, "subscribe", "cli-q", "--count", "1")
    assert sub.code == 0, sub.err
    (line,) = sub.lines()
    record = json.loads(line)
    assert record["id"] == msg_id
    assert record["queue"] == "cli-q"
    assert record["payload"] == {"order": 7}
    assert record["headers"]["k"] == "v"
    assert record["headers"]["deliveryAttempts"] == "1"


async def test_publish_non_json_is_sent_as_string(broker: Any, client: Client) -> None:
    sub = await client.subscribe("strings")
    assert (await run_cli(broker.port, "publish", "strings", "hello world")).code == 0
    assert (await run_cli(broker.port, "publish", "strings", "42")).code == 0
    first = await sub.get(timeout=5)
    second = await sub.get(timeout=5)
    assert first.payload == "hello world"
    assert first.raw == b'"hello world"'
    assert second.payload == 42


async def test_publish_count_and_priority(broker: Any, client: Client) -> None:
    sub = await client.subscribe("many")
    res = await run_cli(
        broker.port, "publish", "many", "[1]", "--count", "25", "--priority", "High"
    )
    assert res.code == 0, res.err
    assert len(set(res.lines())) == 25
    for _ in range(25):
        msg = await sub.get(timeout=5)
        assert msg.payload == [1]
        assert msg.headers["priority"] == "High"
        await msg.ack()


async def test_subscribe_streams_lines_as_messages_arrive(broker: Any, client: Client) -> None:
    await client.create_queue("stream")
    proc = await asyncio.create_subprocess_exec(
        *CLI,
        "subscribe",
        "stream",
        "--count",
        "3",
        env=cli_env(broker.port),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    assert proc.stdout is not None
    try:
        # Wait until the CLI's subscription is registered before publishing.
        async with asyncio.timeout(10):
            while (await client.queue_info("stream"))["subscriberCount"] < 1:
                await asyncio.sleep(0.05)
        for i in range(3):
            await client.publish("stream", {"i": i})
            line = await asyncio.wait_for(proc.stdout.readline(), 5)
            assert json.loads(line)["payload"] == {"i": i}
        assert await asyncio.wait_for(proc.wait(), 10) == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    # Every message was acknowledged, so nothing is left to redeliver.
    info = await client.queue_info("stream")
    assert info["messageCount"] == 0


async def test_subscribe_no_ack_leaves_message_for_redelivery(broker: Any) -> None:
    assert (await run_cli(broker.port, "publish", "unacked", '"job"')).code == 0
    first = await run_cli(broker.port, "subscribe", "unacked", "--count", "1", "--no-ack")
    assert first.code == 0, first.err
    second = await run_cli(broker.port, "subscribe", "unacked", "--count", "1")
    assert second.code == 0, second.err
    a, b = json.loads(first.out), json.loads(second.out)
    assert a["id"] == b["id"]
    assert b["headers"]["deliveryAttempts"] == "2"


async def test_subscribe_ends_when_queue_is_deleted(broker: Any, client: Client) -> None:
    await client.create_queue("short-lived")
    proc = await asyncio.create_subprocess_exec(
        *CLI,
        "subscribe",
        "short-lived",
        env=cli_env(broker.port),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        async with asyncio.timeout(10):
            while (await client.queue_info("short-lived"))["subscriberCount"] < 1:
                await asyncio.sleep(0.05)
        await client.delete_queue("short-lived")
        _, err = await asyncio.wait_for(proc.communicate(), 10)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert proc.returncode == 0
    assert "deleted" in err.decode()


async def test_queue_management_commands(broker: Any) -> None:
    port = broker.port
    created = await run_cli(
        port,
        "create-queue",
        "admin-q",
        "--mode",
        "PriorityBased",
        "--max-size",
        "100",
        "--ttl-ms",
        "60000",
        "--dlq",
        "--overflow",
        "DropNewest",
        "--max-retries",
        "4",
    )
    assert created.code == 0, created.err

    dup = await run_cli(port, "create-queue", "admin-q")
    assert dup.code == 1
    assert "QUEUE_EXISTS" in dup.err

    listed = await run_cli(port, "list-queues")
    assert listed.code == 0 and "admin-q" in listed.lines()
    as_json = await run_cli(port, "list-queues", "--json")
    assert "admin-q" in json.loads(as_json.out)

    info = await run_cli(port, "queue-info", "admin-q")
    assert info.code == 0, info.err
    details = json.loads(info.out)
    assert details["name"] == "admin-q"
    assert details["deliveryMode"] == "PriorityBased"
    assert details["maxSize"] == 100

    deleted = await run_cli(port, "delete-queue", "admin-q")
    assert deleted.code == 0, deleted.err
    assert "admin-q" not in (await run_cli(port, "list-queues")).lines()

    missing = await run_cli(port, "queue-info", "admin-q")
    assert missing.code == 1
    assert "QUEUE_NOT_FOUND" in missing.err
    assert missing.out == ""


async def test_ping_command(broker: Any) -> None:
    res = await run_cli(broker.port, "ping")
    assert res.code == 0, res.err
    assert res.out.startswith("pong from")


async def test_flags_override_environment(broker: Any) -> None:
    # VIBEMQ_PORT points nowhere useful; --port wins.
    res = await run_cli(broker.port, "--port", str(broker.port), "ping", VIBEMQ_PORT="1")
    assert res.code == 0, res.err
    host = await run_cli(broker.port, "ping", VIBEMQ_HOST="127.0.0.1")
    assert host.code == 0, host.err


async def test_token_from_env_and_flag(broker_factory: BrokerFactory) -> None:
    b = await broker_factory(auth_tokens=["tok"])
    assert (await run_cli(b.port, "ping", VIBEMQ_TOKEN="tok")).code == 0
    assert (await run_cli(b.port, "--token", "tok", "list-queues")).code == 0
    bad = await run_cli(b.port, "--token", "nope", "ping")
    assert bad.code == 1
    assert "AUTH_FAILED" in bad.err
    none = await run_cli(b.port, "ping")
    assert none.code == 1
    assert "AUTH_" in none.err


async def test_error_exit_codes() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed_port = s.getsockname()[1]
    refused = await run_cli(closed_port, "ping")
    assert refused.code == 1
    assert "cannot connect" in refused.err
    assert "Traceback" not in refused.err

    usage = await run_cli(closed_port, "publish", "only-queue")
    assert usage.code == 2
    bad_header = await run_cli(closed_port, "publish", "q", "1", "--header", "novalue")
    assert bad_header.code == 2
    assert "KEY=VALUE" in bad_header.err


async def test_invalid_queue_name_is_reported(broker: Any) -> None:
    res = await run_cli(broker.port, "publish", "no spaces allowed", "1")
    assert res.code == 1
    assert "INVALID_QUEUE" in res.err


async def test_console_script_is_installed() -> None:
    script = os.path.join(os.path.dirname(sys.executable), "vibemq")
    proc = await asyncio.create_subprocess_exec(
        script, "--help", stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    out, _ = await proc.communicate()
    assert proc.returncode == 0
    for command in ("publish", "subscribe", "list-queues", "queue-info", "create-queue"):
        assert command in out.decode()
