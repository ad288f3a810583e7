"""Helpers of the big-message tests (issue 16): payloads with their sha256, and one synchronous
end per protocol over real clients -- paho-mqtt, pika, ``vibemq_server.client`` -- that sends
and receives one message, every wait bounded by ``BIG_WAIT``.

Addresses are one-level names (``big.x``): the MQTT topic ``big/x`` is the address ``big.x``
(docs/mqtt.md), the VibeMQ queue ``big.x`` and, over AMQP, a queue bound to ``amq.topic``
with the key ``big.x`` or published to through the default exchange.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import queue
import random
import time
from typing import Any

import paho.mqtt.client as mqtt
import pika
import pika.adapters.blocking_connection as blocking
from amqputil import pika_params
from mqttutil import Paho

from vibemq_server.client import Client

MIB = 1024 * 1024
#: The longest any one big message may take to go through (loaded CI machines, MQTT's decoder
#: copying its buffer per read: see docs/performance.md, "Issue 16").
BIG_WAIT = 300.0
HOST = "127.0.0.1"


def blob(size: int, seed: int) -> bytes:
    """``size`` random bytes (not JSON: they cross into VibeMQ as base64)."""
    return random.Random(seed).randbytes(size)


def json_blob(size: int, seed: int) -> bytes:
    """``size`` bytes of JSON (what a VibeMQ publisher sends): a string of hex digits."""
    text = random.Random(seed).randbytes((size - 2) // 2 + 1).hex()[: size - 2]
    return b'"' + text.encode() + b'"'


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def address_to_topic(address: str) -> str:
    return address.replace(".", "/")


class MqttEnd:
    """A paho client; ``durable``: a persistent session (a durable queue behind it)."""

    def __init__(self, port: int, *, durable: bool = False, client_id: str | None = None) -> None:
        self.paho = Paho(port, client_id, clean_session=not durable, keepalive=600)
        self.paho.connected()

    def subscribe(self, address: str) -> None:
        assert self.paho.subscribe((address_to_topic(address), 1)) == [1]

    def send(self, address: str, payload: bytes) -> None:
        """QoS 1; returns once the PUBACK arrived. Raises ConnectionError if the connection
        is lost first (paho would wait on)."""
        info = self.paho.client.publish(address_to_topic(address), payload, 1)
        assert info.rc == mqtt.MQTT_ERR_SUCCESS
        deadline = time.monotonic() + BIG_WAIT
        while not info.is_published() and time.monotonic() < deadline:
            if not self.paho.disconnects.empty():
                raise ConnectionError("MQTT connection lost before the PUBACK")
            info.wait_for_publish(0.2)
        assert info.is_published(), "no PUBACK for the big message"

    def receive(self) -> bytes:
        try:
            return bytes(self.paho.messages.get(timeout=BIG_WAIT).payload)
        except queue.Empty:
            raise AssertionError(f"no MQTT message within {BIG_WAIT}s") from None

    def close(self) -> None:
        self.paho.disconnect()


class AmqpEnd:
    """A pika connection and channel with publisher confirms."""

    def __init__(self, port: int) -> None:
        self.conn = pika.BlockingConnection(
            pika_params(port, heartbeat=0, blocked_connection_timeout=BIG_WAIT)
        )
        self.ch: blocking.BlockingChannel = self.conn.channel()
        self.ch.confirm_delivery()

    def declare(self, address: str, *, durable: bool, bind: bool = False) -> None:
        """The queue ``address``; ``bind``: bound to amq.topic with the key ``address`` (what
        MQTT and VibeMQ publishers reach)."""
        self.ch.queue_declare(address, durable=durable)
        if bind:
            self.ch.queue_bind(address, "amq.topic", address)

    def send(self, address: str, payload: bytes, *, exchange: str = "", durable: bool) -> None:
        """Publish and wait for the confirm (pika raises on a nack)."""
        props = pika.BasicProperties(delivery_mode=2 if durable else 1)
        self.ch.basic_publish(exchange, address, payload, props, mandatory=False)

    def receive(self, address: str) -> bytes:
        for method, _props, body in self.ch.consume(address, inactivity_timeout=BIG_WAIT):
            assert method is not None, f"no AMQP message on {address} within {BIG_WAIT}s"
            self.ch.basic_ack(method.delivery_tag)
            self.ch.cancel()
            return bytes(body)
        raise AssertionError("consume ended")

    def close(self) -> None:
        self.conn.close()


class NativeEnd:
    """The client library, one short connection per call (these tests are synchronous)."""

    def __init__(self, port: int) -> None:
        self.port = port

    async def _client(self) -> Client:
        return await Client.connect(HOST, self.port, reconnect=False, request_timeout=BIG_WAIT)

    def declare(self, address: str) -> None:
        async def run() -> None:
            c = await self._client()
            try:
                await c.create_queue(address, max_queue_size=100)
            finally:
                await c.close()

        asyncio.run(run())

    def send(self, address: str, payload: bytes, *, binary: bool = False) -> None:
        """``binary``: ``payload`` is arbitrary bytes, sent as a base64 JSON string with
        ``payloadEncoding: base64`` (docs/mqtt.md); else it is JSON already."""
        headers = None
        if binary:
            payload = b'"' + base64.b64encode(payload) + b'"'
            headers = {"payloadEncoding": "base64"}

        async def run() -> None:
            c = await self._client()
            try:
                await c.publish(address, payload, headers=headers)
            finally:
                await c.close()

        asyncio.run(run())

    def receive(self, address: str) -> bytes:
        """The original bytes (``payload_bytes``: base64 undone)."""

        async def run() -> bytes:
            c = await self._client()
            try:
                sub = await c.subscribe(address, prefetch=1)
                msg = await asyncio.wait_for(sub.__anext__(), BIG_WAIT)
                await msg.ack()
                return msg.payload_bytes
            finally:
                await c.close()

        return asyncio.run(run())


def close_all(ends: list[Any]) -> None:
    for end in ends:
        close = getattr(end, "close", None)
        if close is not None:
            close()
