"""Helpers for tests/integration/test_amqp_basic.py: a broker on its own thread, pika
BlockingConnections with bounded timeouts, a consumer that collects deliveries, and a tiny raw
AMQP client (pamqp frames) for what pika cannot do (a server-generated consumer tag).

Every wait is bounded by ``WAIT`` and fails the test with a message instead of hanging.
"""

from __future__ import annotations

import contextlib
import socket
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pika
import pika.adapters.blocking_connection as blocking
from mqttutil import ThreadBroker
from pamqp import commands
from pamqp import frame as pamqp_frame
from pamqp.base import Frame as PamqpFrame
from pamqp.body import ContentBody
from pamqp.header import ContentHeader
from pamqp.heartbeat import Heartbeat

from vibemq_server.adapters.amqp.connection import AmqpConnection
from vibemq_server.server import Broker
from vibemq_server.server.transport import StreamTransport

WAIT = 5.0
"""Bound of every wait for something that should happen (it normally takes milliseconds)."""

HOST = "127.0.0.1"
F = TypeVar("F")


def wait_until(pred: Callable[[], bool], what: str, timeout: float = WAIT) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for: {what}")
        time.sleep(0.01)


def pump_until(
    conn: pika.BlockingConnection, pred: Callable[[], bool], what: str, timeout: float = WAIT
) -> None:
    """Let a pika BlockingConnection read and run its callbacks until ``pred()`` (bounded)."""
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for: {what}")
        conn.process_data_events(time_limit=0.02)


# --------------------------------------------------------------------------------------------
# The broker


class BasicBroker(ThreadBroker):
    """A real broker (uvloop) on its own thread, AMQP on port 0."""

    @property
    def amqp_port(self) -> int:
        assert self.broker is not None
        port = self.broker.amqp_port
        assert port
        return port

    def amqp_connections(self) -> list[StreamTransport]:
        """The transports carrying an AMQP connection. Only to be used inside :meth:`call`
        (they live on the broker's loop)."""
        assert self.broker is not None
        return [
            c
            for c in list(self.broker.connections)
            if isinstance(c, StreamTransport) and isinstance(c.session, AmqpConnection)
        ]

    def buffered_output(self) -> dict[str, int]:
        """Bytes each AMQP connection holds in memory for its peer: our own pending output
        plus the transport's write buffer."""

        def look(b: Broker) -> dict[str, int]:
            out: dict[str, int] = {}
            for conn in self.amqp_connections():
                transport = conn.transport
                size = conn._out_size
                if transport is not None and not transport.is_closing():
                    size += transport.get_write_buffer_size()
                out[conn.conn_id] = size
            return out

        return self.call(look)

    def unacked(self, queue: str) -> int:
        return self.call(lambda b: b.manager.queues[queue].unacked_count)

    def memory(self) -> tuple[int, bool]:
        """(bytes of queued payloads the broker holds, memory blocked)."""
        return self.call(lambda b: (b.manager.memory_bytes, b.manager.memory_blocked))


@contextlib.contextmanager
def basic_brokers(tmp_path: Path) -> Iterator[Callable[..., BasicBroker]]:
    """A factory of started brokers (``Config`` overrides as keywords), all stopped on exit."""
    started: list[BasicBroker] = []

    def make(**overrides: Any) -> BasicBroker:
        overrides["amqp"] = {"port": 0, **overrides.get("amqp", {})}
        broker = BasicBroker(tmp_path / f"data{len(started)}", **overrides)
        started.append(broker)
        return broker.start()  # type: ignore[return-value]

    try:
        yield make
    finally:
        for broker in started:
            with contextlib.suppress(Exception):
                broker.stop()


# --------------------------------------------------------------------------------------------
# pika


def pika_params(port: int, **kw: Any) -> pika.ConnectionParameters:
    """Connection parameters with every pika timeout bounded; one connection attempt."""
    settings: dict[str, Any] = {
        "host": HOST,
        "port": port,
        "connection_attempts": 1,
        "socket_timeout": WAIT,
        "stack_timeout": WAIT,
        "blocked_connection_timeout": 30,
        "heartbeat": 0,
    }
    settings.update(kw)
    return pika.ConnectionParameters(**settings)


class Pikas:
    """Opens pika BlockingConnections for one test; closes every one of them at teardown."""

    def __init__(self, port: int) -> None:
        self.port = port
        self._conns: list[pika.BlockingConnection] = []

    def connect(self, **kw: Any) -> pika.BlockingConnection:
        conn = pika.BlockingConnection(pika_params(self.port, **kw))
        self._conns.append(conn)
        return conn

    def channel(self, **kw: Any) -> blocking.BlockingChannel:
        """A channel on a connection of its own."""
        return self.connect(**kw).channel()

    def close_all(self) -> None:
        for conn in self._conns:
            with contextlib.suppress(Exception):
                if conn.is_open:
                    conn.close()


@dataclass
class Delivery:
    method: Any  # pika.spec.Basic.Deliver or GetOk
    properties: pika.BasicProperties
    body: bytes

    @property
    def tag(self) -> int:
        return int(self.method.delivery_tag)

    @property
    def redelivered(self) -> bool:
        return bool(self.method.redelivered)


class Collector:
    """A pika consumer callback that keeps what it is given."""

    def __init__(self, channel: blocking.BlockingChannel) -> None:
        self.channel = channel
        self.got: list[Delivery] = []

    def __call__(
        self,
        channel: blocking.BlockingChannel,
        method: Any,
        properties: pika.BasicProperties,
        body: bytes,
    ) -> None:
        self.got.append(Delivery(method, properties, body))

    @property
    def bodies(self) -> list[bytes]:
        return [d.body for d in self.got]

    def wait_for(self, count: int, timeout: float = WAIT) -> list[Delivery]:
        """Pump the connection until ``count`` deliveries are in (bounded)."""
        conn = self.channel.connection
        deadline = time.monotonic() + timeout
        while len(self.got) < count:
            if time.monotonic() > deadline:
                raise AssertionError(f"{len(self.got)} of {count} deliveries in {timeout}s")
            conn.process_data_events(time_limit=0.05)
        return self.got

    def settle(self) -> list[Delivery]:
        """Every delivery the broker sent before a synchronous round trip made now: the reply
        to a passive queue.declare comes after them on the same connection."""
        self.channel.connection.process_data_events(time_limit=0)
        sync = self.channel.connection.channel()
        sync.close()
        self.channel.connection.process_data_events(time_limit=0)
        return self.got


def consumer(
    channel: blocking.BlockingChannel, queue: str, *, auto_ack: bool = False, **kw: Any
) -> Collector:
    collector = Collector(channel)
    channel.basic_consume(queue, collector, auto_ack=auto_ack, **kw)
    return collector


def queue_counts(channel: blocking.BlockingChannel, queue: str) -> tuple[int, int]:
    """(ready messages, consumers) of a queue, by a passive declare."""
    ok = channel.queue_declare(queue, passive=True).method
    return ok.message_count, ok.consumer_count


def get(channel: blocking.BlockingChannel, queue: str, *, auto_ack: bool = True) -> Delivery:
    """basic.get that must find a message."""
    method, props, body = channel.basic_get(queue, auto_ack=auto_ack)
    assert method is not None, f"get-empty from {queue!r}"
    assert props is not None and body is not None
    return Delivery(method, props, body)


def get_all(channel: blocking.BlockingChannel, queue: str) -> list[bytes]:
    """Every ready message of ``queue`` by basic.get (acked), until get-empty."""
    out: list[bytes] = []
    for _ in range(100_000):
        method, _props, body = channel.basic_get(queue, auto_ack=True)
        if method is None:
            return out
        assert body is not None
        out.append(body)
    raise AssertionError("queue never ran empty")


# --------------------------------------------------------------------------------------------
# A raw AMQP socket (pamqp frames), for what pika does not let a test do


class RawAmqp:
    """A blocking AMQP connection; every read is bounded. Just enough for consume/deliver."""

    def __init__(self, port: int, rcvbuf: int = 0) -> None:
        """``rcvbuf``: a small kernel receive buffer (set before connecting) for a consumer
        that stops reading."""
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        if rcvbuf:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        self.sock.settimeout(WAIT)
        self.sock.connect((HOST, port))
        self.buf = bytearray()
        self.frames: list[tuple[int, Any]] = []

    def send(self, channel: int, value: Any) -> None:
        self.sock.sendall(pamqp_frame.marshal(value, channel))

    def _read(self, deadline: float) -> None:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise AssertionError("timed out waiting for the broker")
        self.sock.settimeout(remaining)
        chunk = self.sock.recv(65536)
        if not chunk:
            raise AssertionError("the broker closed the connection")
        self.buf += chunk
        while len(self.buf) >= 7:
            size = int.from_bytes(self.buf[3:7], "big")
            if len(self.buf) < size + 8:
                break
            consumed, channel, value = pamqp_frame.unmarshal(bytes(self.buf[: size + 8]))
            del self.buf[:consumed]
            if not isinstance(value, Heartbeat):
                self.frames.append((channel, value))

    def expect(self, cls: type[F], channel: int, timeout: float = WAIT) -> F:
        deadline = time.monotonic() + timeout
        while not self.frames:
            self._read(deadline)
        got_channel, value = self.frames.pop(0)
        assert isinstance(value, cls), f"expected {cls.__name__}, got {value!r}"
        assert got_channel == channel, f"{value!r} on channel {got_channel}, not {channel}"
        return value

    def message(self, channel: int, timeout: float = WAIT) -> tuple[Any, Any, bytes]:
        """The next basic.deliver with its content header and body, reassembled."""
        method = self.expect(commands.Basic.Deliver, channel, timeout)
        header = self.expect(ContentHeader, channel, timeout)
        body = b""
        while len(body) < header.body_size:
            body += self.expect(ContentBody, channel, timeout).value
        return method, header, body

    def rpc(self, channel: int, method: PamqpFrame, reply: type[F]) -> F:
        self.send(channel, method)
        return self.expect(reply, channel)

    def open(self) -> None:
        """Handshake and channel 1."""
        self.sock.sendall(b"AMQP\x00\x00\x09\x01")
        self.expect(commands.Connection.Start, 0)
        self.send(
            0,
            commands.Connection.StartOk(
                client_properties={"capabilities": {"consumer_cancel_notify": True}},
                mechanism="PLAIN",
                response="\x00guest\x00guest",
                locale="en_US",
            ),
        )
        tune = self.expect(commands.Connection.Tune, 0)
        self.send(
            0,
            commands.Connection.TuneOk(
                channel_max=tune.channel_max, frame_max=tune.frame_max, heartbeat=0
            ),
        )
        self.rpc(0, commands.Connection.Open(virtual_host="/"), commands.Connection.OpenOk)
        self.rpc(1, commands.Channel.Open(), commands.Channel.OpenOk)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()


def all_basic_properties(headers: dict[str, Any]) -> pika.BasicProperties:
    """Every basic property but ``expiration`` set (``cluster_id`` included)."""
    return pika.BasicProperties(
        content_type="application/x-test",
        content_encoding="gzip",
        headers=headers,
        delivery_mode=pika.DeliveryMode.Persistent,
        priority=7,
        correlation_id="corr-42",
        reply_to="amq.gen-reply",
        message_id="msg-1",
        timestamp=1_700_000_123,
        type="order.created",
        user_id="guest",
        app_id="vibemq-tests",
        cluster_id="cluster-9",
    )


PROPERTY_NAMES = (
    "content_type",
    "content_encoding",
    "headers",
    "delivery_mode",
    "priority",
    "correlation_id",
    "reply_to",
    "expiration",
    "message_id",
    "timestamp",
    "type",
    "user_id",
    "app_id",
    "cluster_id",
)
"""The 14 basic properties of AMQP 0-9-1, by pika's names."""


def properties_dict(props: pika.BasicProperties) -> dict[str, Any]:
    return {name: getattr(props, name) for name in PROPERTY_NAMES}
