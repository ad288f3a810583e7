"""Issue 16: ``kill -9`` while large durable messages are being written loses nothing that was
acknowledged (an AMQP publisher confirm, an MQTT PUBACK, a VibeMQ PublishAck).

Three publishers (pika, paho-mqtt, the client library) each send 8-16 MiB durable messages one
at a time into durable queues and note the sha256 of every acknowledged one; once a few are
acknowledged the server is killed with SIGKILL mid-write, restarted on the same data directory
and every queue drained: each acknowledged message is there whole, and nothing is there that was
not sent. (The kill -9 loop with small messages is in test_durability.py.)
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from bigkit import BIG_WAIT, MIB, AmqpEnd, MqttEnd, blob, sha
from serverproc import ServerProcess
from waits import wait_until

from vibemq_server.client import Client

#: Messages per publisher at most (they are killed before, usually).
PER_PUBLISHER = 8
#: Acknowledged messages (all publishers together) before the kill.
ACKED_BEFORE_KILL = 4
QUEUES = {"amqp": "kill.amqp", "mqtt": "kill.mqtt", "native": "kill.native"}


def _size(i: int) -> int:
    return (8 + 4 * (i % 3)) * MIB  # 8, 12, 16 MiB


class Ledger:
    """What each publisher sent and had acknowledged, by sha256 (thread-safe)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.sent: set[str] = set()
        self.acked: dict[str, set[str]] = {name: set() for name in QUEUES}
        self.errors: list[str] = []

    def will_send(self, digest: str) -> None:
        with self.lock:
            self.sent.add(digest)

    def ack(self, protocol: str, digest: str) -> None:
        with self.lock:
            self.acked[protocol].add(digest)

    def acked_count(self) -> int:
        with self.lock:
            return sum(len(v) for v in self.acked.values())


def _publish_loop(protocol: str, send: Callable[[bytes], None], ledger: Ledger, seed: int) -> None:
    """Send until the broker dies (any error ends the loop: the kill is expected)."""
    for i in range(PER_PUBLISHER):
        payload = blob(_size(i), seed + i)
        digest = sha(payload)
        ledger.will_send(digest)
        try:
            send(payload)
        except Exception:
            return
        ledger.ack(protocol, digest)


def _amqp_publisher(port: int, ledger: Ledger) -> None:
    try:
        end = AmqpEnd(port)
    except Exception as exc:
        ledger.errors.append(f"amqp connect: {exc!r}")
        return
    _publish_loop("amqp", lambda p: end.send(QUEUES["amqp"], p, durable=True), ledger, seed=1000)
    with contextlib.suppress(Exception):
        end.close()


def _mqtt_publisher(port: int, ledger: Ledger) -> None:
    try:
        end = MqttEnd(port)
    except Exception as exc:
        ledger.errors.append(f"mqtt connect: {exc!r}")
        return
    _publish_loop("mqtt", lambda p: end.send(QUEUES["mqtt"], p), ledger, seed=2000)
    with contextlib.suppress(Exception):
        end.paho.stop_loop()


def _native_publisher(port: int, ledger: Ledger) -> None:
    async def run() -> None:
        c = await Client.connect("127.0.0.1", port, reconnect=False, request_timeout=BIG_WAIT)
        try:
            for i in range(PER_PUBLISHER):
                raw = blob(_size(i), 3000 + i)
                digest = sha(raw)
                ledger.will_send(digest)
                # binary bytes as a base64 JSON string (docs/mqtt.md, "Payloads")
                payload = b'"' + base64.b64encode(raw) + b'"'
                try:
                    await c.publish(
                        QUEUES["native"], payload, headers={"payloadEncoding": "base64"}
                    )
                except Exception:
                    return
                ledger.ack("native", digest)
        finally:
            with contextlib.suppress(Exception):
                await c.close()

    try:
        asyncio.run(run())
    except Exception as exc:
        ledger.errors.append(f"native: {exc!r}")


async def _setup(port: int) -> None:
    c = await Client.connect("127.0.0.1", port, reconnect=False, request_timeout=BIG_WAIT)
    try:
        for name in (QUEUES["mqtt"], QUEUES["native"]):
            await c.create_queue(name, max_queue_size=1000)
    finally:
        await c.close()


async def _drain(port: int, name: str) -> list[str]:
    """The sha256 of every message in the queue, each received and acked."""
    c = await Client.connect("127.0.0.1", port, reconnect=False, request_timeout=BIG_WAIT)
    try:
        count = int((await c.queue_info(name))["messageCount"])
        sub = await c.subscribe(name, prefetch=1)
        digests = []
        for _ in range(count):
            msg = await asyncio.wait_for(sub.__anext__(), BIG_WAIT)
            digests.append(sha(msg.payload_bytes))
            await msg.ack()
        return digests
    finally:
        await c.close()


@pytest.fixture
def proc(tmp_path: Path) -> Iterator[ServerProcess]:
    s = ServerProcess(tmp_path, tmp_path / "data")
    try:
        yield s
    finally:
        s.kill()


def test_kill_9_during_large_durable_writes_loses_nothing_acknowledged(
    proc: ServerProcess,
) -> None:
    server = proc.start()  # fsync always (the default): an ack means on disk
    port = server.ports["vibemq"]
    asyncio.run(_setup(port))
    declarer = AmqpEnd(server.amqp_port)
    declarer.declare(QUEUES["amqp"], durable=True)
    declarer.close()

    ledger = Ledger()
    threads = [
        threading.Thread(target=_amqp_publisher, args=(server.amqp_port, ledger), daemon=True),
        threading.Thread(target=_mqtt_publisher, args=(server.ports["mqtt"], ledger), daemon=True),
        threading.Thread(target=_native_publisher, args=(port, ledger), daemon=True),
    ]
    for t in threads:
        t.start()
    wait_until(
        lambda: ledger.acked_count() >= ACKED_BEFORE_KILL or not any(t.is_alive() for t in threads),
        "acknowledged big messages",
        BIG_WAIT,
    )
    server.kill()  # SIGKILL, mid-write: the publishers have more in flight
    for t in threads:
        t.join(BIG_WAIT)
        assert not t.is_alive(), "a publisher did not notice the kill"
    assert not ledger.errors, ledger.errors
    acked_total = ledger.acked_count()
    assert acked_total >= ACKED_BEFORE_KILL

    server.start()
    port = server.ports["vibemq"]
    for protocol, name in QUEUES.items():
        found = asyncio.run(_drain(port, name))
        assert set(found) <= ledger.sent, f"{name}: a message that was never sent (corrupt?)"
        missing = ledger.acked[protocol] - set(found)
        assert not missing, f"{name}: {len(missing)} acknowledged message(s) lost"
        assert len(found) == len(set(found)), f"{name}: a message recovered twice"
