"""Liveness under a flood: a consumer that reads in large, delayed batches gets every message.

Issue 12's stall: a publisher floods; one consumer with a window of 1,000 acks in batches of
100 and reads its socket in big delayed batches (SO_RCVLOWAT of 64 KiB and a pause before each
read), so the broker's writes back up. A lost wake-up there leaves messages ready in the queue
while the consumer has room, forever. The same shape runs here on each protocol (native,
MQTT QoS 1, AMQP) against a real ``vibemq-server`` process (uvloop, as in production), with
the load generators of ``bench/`` (raw pre-encoded frames, no client library), and with the
broker's bounds made tiny so that every pause happens many times and has to be woken:

* ``write``: a 4 KiB write buffer, so the consumer's connection pauses writing (transport
  ``pause_writing``/``resume_writing`` and our own output bound) all the time;
* ``memory``: a 16 KiB memory high watermark, so publishers are paused by the memory alarm
  and resumed when the consumer's acks bring memory down.

The assertion is on delivery, never on time: every published message arrives, and nothing
is left ready in the queue. Each wait is bounded (no progress for ``STALL_S`` fails the test).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from serverproc import clean_env, launch

from bench.amqp_driver import AmqpDriver, encode_ack
from bench.amqp_driver import connect as amqp_connect
from bench.common import BlockingConn
from bench.mqtt_driver import MqttDriver, packet, read_packet
from bench.vibemq_driver import VibeDriver

TOTAL = 20_000
BATCH = 500  # publishes per write of the publisher
WINDOW = 1_000  # prefetch / receive window of the consumer
ACK_EVERY = 100
RCVLOWAT = 64 * 1024
READ_DELAY_S = 0.002
STALL_S = 10.0

BOUNDS: dict[str, dict[str, str]] = {
    "write": {"VIBEMQ_WRITE_BUFFER_HIGH_BYTES": "4096"},
    "memory": {"VIBEMQ_MEMORY_HIGH_WATERMARK_BYTES": str(16 * 1024)},
}


@dataclass
class Flood:
    """One protocol's load generator: how to connect, publish and acknowledge."""

    driver: Any
    #: the publisher connection (AMQP's without confirms, as in the issue)
    connect_publisher: Callable[[], BlockingConn]
    #: the acks of ``n`` deliveries, given the scanner's per-delivery acks (AMQP: one
    #: basic.ack with ``multiple`` for the whole batch)
    batch_acks: Callable[[list[bytes]], bytes]


def _per_delivery(acks: list[bytes]) -> bytes:
    return b"".join(acks)


def _amqp_multiple(acks: list[bytes]) -> bytes:
    # Each scanner ack is basic.ack(tag) on channel 1: the last one's tag, with multiple.
    last = acks[-1]
    tag = int.from_bytes(last[11:19], "big")
    return encode_ack(tag, multiple=True)


@dataclass
class PersistentMqttDriver(MqttDriver):
    """The subscriber keeps a persistent session (clean session 0): its messages wait in a
    durable core queue of its own, and count against the memory watermark."""

    def _connect(self, role: str) -> BlockingConn:
        conn = BlockingConn(self.host, self.port)
        client_id = f"live-{role}-{self.topic}".encode()
        flags = 0x00 if role == "sub" else 0x02
        variable = b"\x00\x04MQTT" + bytes((4, flags)) + (600).to_bytes(2, "big")
        body = variable + len(client_id).to_bytes(2, "big") + client_id
        conn.send(packet(0x10, body))
        first, rest = read_packet(conn)
        assert first == 0x20 and rest[1] == 0, f"CONNACK refused: {rest.hex()}"
        return conn


def _flood(protocol: str, ports: dict[str, Any], queue: str) -> Flood:
    host = "127.0.0.1"
    if protocol == "native":
        native = VibeDriver(host, ports["vibemq"], queue, prefetch=WINDOW)
        return Flood(native, native.connect_publisher, _per_delivery)
    if protocol == "mqtt":
        mqtt = MqttDriver(host, ports["mqtt"], queue, name="vibemq")
        return Flood(mqtt, mqtt.connect_publisher, _per_delivery)
    if protocol == "mqtt-persistent":
        kept = PersistentMqttDriver(host, ports["mqtt"], queue, name="vibemq")
        return Flood(kept, kept.connect_publisher, _per_delivery)
    amqp = AmqpDriver(host, ports["amqp"], queue, prefetch=WINDOW, name="vibemq")

    def publisher() -> BlockingConn:
        return amqp_connect(host, ports["amqp"])  # no confirm.select: nothing comes back

    return Flood(amqp, publisher, _amqp_multiple)


def _drain(conn: BlockingConn, feed: Callable[[bytearray], tuple[int, int]], done: Any) -> None:
    """Read the publisher's acknowledgements so that its socket never backs up."""
    conn.sock.settimeout(0.2)
    while not done.is_set():
        try:
            chunk = conn.sock.recv(262_144)
        except TimeoutError:
            continue
        except OSError:
            return
        if not chunk:
            return
        conn.buf += chunk
        used, _acked = feed(conn.buf)
        del conn.buf[:used]


def _consume_in_delayed_batches(flood: Flood, sub: BlockingConn) -> int:
    """Read with SO_RCVLOWAT and a pause before each read; ack every ``ACK_EVERY``
    deliveries. Returns how many arrived; fails when nothing arrives for ``STALL_S``."""
    scanner = flood.driver.delivery_scanner()
    sock = sub.sock
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, RCVLOWAT)
    sock.settimeout(0.5)
    got = 0
    pending: list[bytes] = []
    last_progress = time.monotonic()
    while got < TOTAL:
        time.sleep(READ_DELAY_S)
        try:
            chunk = sock.recv(1 << 20)
        except TimeoutError:
            # Fewer than RCVLOWAT bytes are waiting (the tail of the run, or a stall): look
            # at whatever is there without the low-water mark.
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, 1)
            try:
                chunk = sock.recv(1 << 20)
            except TimeoutError:
                chunk = b""
                if time.monotonic() - last_progress > STALL_S:
                    pytest.fail(f"no delivery for {STALL_S} s after {got} of {TOTAL}")
            finally:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, RCVLOWAT)
            if not chunk:
                if pending:  # the window may be waiting for these
                    sock.sendall(flood.batch_acks(pending))
                    pending = []
                continue
        if not chunk:
            pytest.fail(f"the broker closed the consumer after {got} deliveries")
        sub.buf += chunk
        used, delivered, acks = scanner.feed(sub.buf)
        del sub.buf[:used]
        if not delivered:
            continue
        last_progress = time.monotonic()
        got += delivered
        pending.extend(_split_acks(acks, delivered))
        while len(pending) >= ACK_EVERY:
            sock.sendall(flood.batch_acks(pending[:ACK_EVERY]))
            del pending[:ACK_EVERY]
    if pending:
        sock.sendall(flood.batch_acks(pending))
    return got


def _split_acks(acks: bytes, n: int) -> list[bytes]:
    """The scanner's acks, one per delivery (they are all the same length per protocol)."""
    size = len(acks) // n
    return [acks[i * size : (i + 1) * size] for i in range(n)]


def _run(flood: Flood) -> int:
    sub = flood.driver.connect_subscriber()
    pub = flood.connect_publisher()
    done = threading.Event()
    drainer = threading.Thread(
        target=_drain, args=(pub, flood.driver.ack_counter().feed, done), daemon=True
    )
    drainer.start()

    def publish() -> None:
        with contextlib.suppress(OSError):
            for start in range(0, TOTAL, BATCH):
                pub.send(flood.driver.publish_batch(start, BATCH))

    publisher = threading.Thread(target=publish, daemon=True)
    publisher.start()
    try:
        return _consume_in_delayed_batches(flood, sub)
    finally:
        done.set()
        publisher.join(STALL_S)
        drainer.join(STALL_S)
        flood.driver.goodbye(sub)
        flood.driver.goodbye(pub)


@pytest.mark.parametrize("bound", sorted(BOUNDS))
@pytest.mark.parametrize("protocol", ["native", "mqtt", "mqtt-persistent", "amqp"])
async def test_a_consumer_reading_in_delayed_batches_gets_every_message(
    tmp_path: Path, protocol: str, bound: str
) -> None:
    proc, ports, stderr = await launch(
        tmp_path, tmp_path / "data", "--log-level", "warning", env=clean_env(**BOUNDS[bound])
    )
    try:
        # Transient queues where the protocol has them: the flood is about flow, not disk.
        flood = _flood(protocol, ports, f"live.{protocol}.{bound}")
        got = await asyncio.to_thread(_run, flood)
        assert got == TOTAL
    finally:
        proc.terminate()
        await proc.wait()
        stderr.cancel()
