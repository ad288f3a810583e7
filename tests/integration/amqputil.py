"""The AMQP 0-9-1 integration tests' helpers: a broker on its own thread, pika clients with
bounded waits, and the one raw socket client of the test suite, speaking frames built with
pamqp.

* :class:`AmqpBroker` is :class:`mqttutil.ThreadBroker` (a real :class:`Broker` on a uvloop
  thread of its own) with the AMQP port and a few safe looks at its state. Because the broker
  has its own loop, tests may be plain synchronous code driving pika's ``BlockingConnection``
  and raw sockets, or async code driving aio-pika and the VibeMQ client: neither can starve it.
* :class:`PikaClients` opens ``BlockingConnection`` s with short socket/stack timeouts and
  closes every one of them at teardown; :class:`Collector` keeps what a pika consumer is
  given, and the functions around them get, consume and count messages with bounded waits.
* :class:`RawAmqp` is a blocking socket that sends hand-built frames (pamqp's ``marshal`` or
  raw bytes, for deliberately broken ones) and reads the broker's frames with pamqp's
  ``unmarshal``, for what pika will not do (broken input, a server-generated consumer tag, a
  consumer that stops reading). Heartbeat frames are counted and skipped by
  :meth:`RawAmqp.recv`.

The fixtures built on them are in ``conftest.py``. Every wait is bounded by ``WAIT`` and fails
the test with a message instead of hanging.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import aio_pika.abc
import pika
import pika.adapters.blocking_connection as blocking
from mqttutil import ThreadBroker
from pamqp import commands, encode
from pamqp import frame as pamqp_frame
from pamqp.base import Frame as PamqpFrame
from pamqp.body import ContentBody
from pamqp.header import ContentHeader
from pamqp.heartbeat import Heartbeat
from waits import TIMEOUT as WAIT
from waits import read_until_closed, recv_by

from vibemq_server.server import Broker

HOST = "127.0.0.1"
PROTOCOL_HEADER = b"AMQP\x00\x00\x09\x01"
FRAME_END = b"\xce"

F = TypeVar("F")

AnyFrame = PamqpFrame | ContentHeader | ContentBody | Heartbeat


# --------------------------------------------------------------------------------------------
# The broker


class AmqpBroker(ThreadBroker):
    """A real broker on its own thread, with AMQP on port 0."""

    @property
    def amqp_port(self) -> int:
        assert self.broker is not None
        port = self.broker.amqp_port
        assert port
        return port

    @property
    def port(self) -> int:
        """The VibeMQ (native protocol) port."""
        assert self.broker is not None
        return self.broker.port

    # Looks at AMQP connections. They are told apart by the port they were accepted on, not
    # by their class, so that these helpers do not import the AMQP adapter's internals.
    # Only to be used inside :meth:`call` (connections live on the broker's loop).

    @staticmethod
    def _amqp_links(b: Broker) -> list[Any]:
        port = b.amqp_port
        out: list[Any] = []
        for link in list(b.connections):
            transport = getattr(link, "transport", None)
            sockname = transport.get_extra_info("sockname") if transport is not None else None
            if sockname is not None and sockname[1] == port:
                out.append(link)
        return out

    def amqp_connections(self) -> int:
        """How many AMQP connections the broker has."""
        return self.call(lambda b: len(self._amqp_links(b)))

    def negotiated(self) -> list[tuple[int, int, int]]:
        """(frame_max, channel_max, heartbeat) of every open AMQP connection."""
        return self.call(
            lambda b: [
                (c.session.frame_max, c.session.channel_max, c.session.heartbeat)
                for c in self._amqp_links(b)
            ]
        )

    def buffered_output(self) -> dict[str, int]:
        """Bytes each AMQP connection holds in memory for its peer: our own pending output
        plus the transport's write buffer."""

        def look(b: Broker) -> dict[str, int]:
            out: dict[str, int] = {}
            for conn in self._amqp_links(b):
                transport = conn.transport
                size = conn.link_state.size
                if transport is not None and not transport.is_closing():
                    size += transport.get_write_buffer_size()
                out[conn.conn_id] = size
            return out

        return self.call(look)

    # Looks at the core and the AMQP adapter's public state.

    def has_queue(self, name: str) -> bool:
        return self.call(lambda b: name in b.manager.queues)

    def queue_durable(self, name: str) -> bool:
        return self.call(lambda b: b.manager.queues[name].options.durable)

    def unacked(self, queue: str) -> int:
        return self.call(lambda b: b.manager.queues[queue].unacked_count)

    def memory(self) -> tuple[int, bool]:
        """(bytes of queued payloads the broker holds, memory blocked)."""
        return self.call(lambda b: (b.manager.memory_bytes, b.manager.memory_blocked))

    def has_exchange(self, name: str) -> bool:
        def check(b: Broker) -> bool:
            assert b.adapters["amqp"] is not None and b.adapters["amqp"].exchanges is not None
            return b.adapters["amqp"].exchanges.get(name) is not None

        return self.call(check)


@contextlib.contextmanager
def amqp_brokers(tmp_path: Path) -> Iterator[Callable[..., AmqpBroker]]:
    """A factory of started :class:`AmqpBroker` s (``Config`` overrides as keywords), all
    stopped on exit."""
    started: list[AmqpBroker] = []

    def make(**overrides: Any) -> AmqpBroker:
        overrides["amqp"] = {"port": 0, **overrides.get("amqp", {})}
        broker = AmqpBroker(tmp_path / f"data{len(started)}", **overrides)
        started.append(broker)
        broker.start()
        return broker

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
        "blocked_connection_timeout": WAIT,
    }
    settings.update(kw)
    return pika.ConnectionParameters(**settings)


#: What the basic-class tests connect with: no heartbeats, and room for a publisher to stay
#: blocked by the memory alarm while a test drains the queue.
QUIET: dict[str, Any] = {"heartbeat": 0, "blocked_connection_timeout": 30}


class PikaClients:
    """Opens pika BlockingConnections for one test; closes all of them at teardown.

    ``port`` and ``defaults`` (``pika_params`` keywords) apply to every connection that does
    not give its own."""

    def __init__(self, port: int | None = None, **defaults: Any) -> None:
        self.port = port
        self.defaults = defaults
        self._conns: list[pika.BlockingConnection] = []

    def connect(self, port: int | None = None, **kw: Any) -> pika.BlockingConnection:
        if port is None:
            assert self.port is not None, "no port given and no default port"
            port = self.port
        conn = pika.BlockingConnection(pika_params(port, **{**self.defaults, **kw}))
        self._conns.append(conn)
        return conn

    def channel(self, port: int | None = None, **kw: Any) -> blocking.BlockingChannel:
        """A channel on a connection of its own."""
        return self.connect(port, **kw).channel()

    def close_all(self) -> None:
        for conn in self._conns:
            with contextlib.suppress(Exception):
                if conn.is_open:
                    conn.close()


def pump_until(
    conn: pika.BlockingConnection, pred: Callable[[], bool], what: str, timeout: float = WAIT
) -> None:
    """Let a pika BlockingConnection read and run its callbacks until ``pred()`` (bounded).
    (``waits.wait_until`` would sleep instead of letting pika read.)"""
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for: {what}")
        conn.process_data_events(time_limit=0.02)


#: (method, properties, body) as pika's basic_get and consume give them.
Received = tuple[Any, pika.BasicProperties, bytes]


def get_message(
    channel: blocking.BlockingChannel, queue: str, *, auto_ack: bool = True, timeout: float = WAIT
) -> Received:
    """basic.get until a message is there (bounded)."""
    deadline = time.monotonic() + timeout
    while True:
        method, props, body = channel.basic_get(queue, auto_ack=auto_ack)
        if method is not None:
            assert props is not None and body is not None
            return method, props, body
        if time.monotonic() > deadline:
            raise AssertionError(f"no message in {queue!r} within {timeout}s")
        channel.connection.sleep(0.01)


def assert_empty(channel: blocking.BlockingChannel, queue: str) -> None:
    """The queue holds no ready message. basic.get is synchronous: every publish made before
    it on any channel of this connection has been routed when get-empty comes back."""
    method, _props, body = channel.basic_get(queue, auto_ack=True)
    assert method is None, f"unexpected message in {queue!r}: {body!r}"


def consume(
    channel: blocking.BlockingChannel, queue: str, count: int, *, timeout: float = WAIT
) -> list[Received]:
    """``count`` deliveries from a no-ack consumer on ``queue`` (bounded), then cancel."""
    out: list[Received] = []
    deadline = time.monotonic() + timeout
    for method, props, body in channel.consume(queue, auto_ack=True, inactivity_timeout=0.05):
        if method is not None:
            out.append((method, props, body))
            if len(out) == count:
                break
        if time.monotonic() > deadline:
            channel.cancel()
            raise AssertionError(f"{len(out)} of {count} messages from {queue!r} in {timeout}s")
    channel.cancel()
    return out


def queue_counts(channel: blocking.BlockingChannel, queue: str) -> tuple[int, int]:
    """(ready messages, consumers) of a queue, by a passive declare."""
    ok = channel.queue_declare(queue, passive=True).method
    return ok.message_count, ok.consumer_count


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


async def get_async(
    queue: aio_pika.abc.AbstractQueue, timeout: float = WAIT
) -> aio_pika.abc.AbstractIncomingMessage:
    """The next message of an aio-pika queue by basic.get (bounded)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        msg = await queue.get(no_ack=True, fail=False, timeout=timeout)
        if msg is not None:
            return msg
        assert loop.time() < deadline, f"no message in {queue.name} within {timeout}s"
        await asyncio.sleep(0.01)


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


# --------------------------------------------------------------------------------------------
# A raw AMQP socket


class Closed(Exception):
    """The broker closed the connection."""


def frame(frame_type: int, channel: int, payload: bytes, end: bytes = FRAME_END) -> bytes:
    """A frame from its parts; ``end`` may be a wrong frame-end byte."""
    return struct.pack(">BHI", frame_type, channel, len(payload)) + payload + end


def method_payload(class_id: int, method_id: int, args: bytes = b"") -> bytes:
    return struct.pack(">HH", class_id, method_id) + args


def amqplain_response(login: str, password: str) -> bytes:
    """AMQPLAIN's start-ok response: a field table without its length prefix."""
    return encode.field_table({"LOGIN": login, "PASSWORD": password})[4:]


class RawAmqp:
    """A blocking AMQP connection built from pamqp frames; every read is bounded."""

    def __init__(self, port: int, rcvbuf: int = 0) -> None:
        """``rcvbuf``: a small kernel receive buffer (set before connecting) for a consumer
        that stops reading."""
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        if rcvbuf:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        self.sock.settimeout(WAIT)
        self.sock.connect((HOST, port))
        self.buf = bytearray()
        self.pending: deque[tuple[int, AnyFrame]] = deque()
        self.heartbeats = 0
        self.eof = False
        #: sizes (header + payload + frame-end) of every frame read, in order
        self.frame_sizes: list[int] = []

    # sending

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def send_tolerant(self, data: bytes) -> None:
        """Send, ignoring a broker that already closed."""
        with contextlib.suppress(OSError):
            self.send(data)

    def send_frame(self, channel: int, value: AnyFrame) -> None:
        self.send(pamqp_frame.marshal(value, channel))

    def method(self, channel: int, method: PamqpFrame) -> None:
        self.send_frame(channel, method)

    def publish(
        self,
        channel: int,
        body: bytes,
        *,
        exchange: str = "",
        routing_key: str = "",
        properties: commands.Basic.Properties | None = None,
        chunk: int = 4096,
        mandatory: bool = False,
    ) -> None:
        """basic.publish, its content header and the body in frames of ``chunk`` bytes."""
        data = pamqp_frame.marshal(
            commands.Basic.Publish(exchange=exchange, routing_key=routing_key, mandatory=mandatory),
            channel,
        )
        data += pamqp_frame.marshal(
            ContentHeader(0, len(body), properties or commands.Basic.Properties()), channel
        )
        for start in range(0, len(body), chunk):
            data += pamqp_frame.marshal(ContentBody(body[start : start + chunk]), channel)
        self.send(data)

    # reading

    def _read(self, deadline: float) -> None:
        if self.eof:
            raise Closed
        chunk = recv_by(self.sock, deadline, 262144)
        if not chunk:
            self.eof = True
            raise Closed
        self.buf += chunk
        while len(self.buf) >= 7:
            size = int.from_bytes(self.buf[3:7], "big")
            if len(self.buf) < size + 8:
                break
            consumed, channel, value = pamqp_frame.unmarshal(bytes(self.buf[: size + 8]))
            assert consumed == size + 8
            del self.buf[:consumed]
            self.frame_sizes.append(consumed)
            if isinstance(value, Heartbeat):
                self.heartbeats += 1
                continue
            self.pending.append((channel, value))

    def read_exact(self, n: int, timeout: float = WAIT) -> bytes:
        """``n`` raw bytes (for the protocol header the broker answers a wrong one with)."""
        deadline = time.monotonic() + timeout
        out = b""
        while len(out) < n:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise AssertionError(f"timed out reading {n} raw bytes (got {out!r})")
            self.sock.settimeout(remaining)
            chunk = self.sock.recv(n - len(out))
            if not chunk:
                raise Closed(out)
            out += chunk
        return out

    def recv(self, timeout: float = WAIT) -> tuple[int, AnyFrame]:
        """The next (channel, frame) that is not a heartbeat."""
        deadline = time.monotonic() + timeout
        while not self.pending:
            self._read(deadline)
        return self.pending.popleft()

    def expect(self, cls: type[F], channel: int | None = None, timeout: float = WAIT) -> F:
        got_channel, value = self.recv(timeout)
        assert isinstance(value, cls), f"expected {cls.__name__}, got {value!r}"
        if channel is not None:
            assert got_channel == channel, f"{value!r} on channel {got_channel}, not {channel}"
        return value

    def message(self, channel: int, timeout: float = WAIT) -> tuple[Any, ContentHeader, bytes]:
        """The next deliver / get-ok / return with its content, reassembled."""
        got_channel, method = self.recv(timeout)
        assert got_channel == channel, f"{method!r} on channel {got_channel}, not {channel}"
        assert isinstance(
            method, commands.Basic.Deliver | commands.Basic.GetOk | commands.Basic.Return
        ), f"expected a message, got {method!r}"
        header = self.expect(ContentHeader, channel, timeout)
        body = b""
        while len(body) < header.body_size:
            body += self.expect(ContentBody, channel, timeout).value
        assert len(body) == header.body_size
        return method, header, body

    def wait_closed(self, timeout: float = WAIT) -> list[tuple[int, AnyFrame]]:
        """Read until the broker closes the socket; the frames that came first."""
        return read_until_closed(self._read, self.pending, Closed, timeout)

    def expect_connection_close(
        self, code: int, timeout: float = WAIT
    ) -> commands.Connection.Close:
        """connection.close with ``code`` (skipping anything before it); answer close-ok and
        wait until the broker closes the socket."""
        deadline = time.monotonic() + timeout
        while True:
            channel, value = self.recv(max(deadline - time.monotonic(), 0.01))
            if isinstance(value, commands.Connection.Close):
                break
        assert channel == 0
        assert value.reply_code == code, f"expected {code}, got {value!r}"
        self.send_tolerant(pamqp_frame.marshal(commands.Connection.CloseOk(), 0))
        self.wait_closed(timeout)
        return value

    # the handshake

    def start(self) -> commands.Connection.Start:
        self.send(PROTOCOL_HEADER)
        return self.expect(commands.Connection.Start, 0)

    def login(
        self,
        username: str = "guest",
        password: str = "guest",
        mechanism: str = "PLAIN",
        client_properties: dict[str, Any] | None = None,
    ) -> commands.Connection.Tune:
        """Send the protocol header and start-ok; the broker's tune."""
        self.start()
        if mechanism == "AMQPLAIN":
            response = amqplain_response(username, password)
        else:
            response = b"\x00" + username.encode() + b"\x00" + password.encode()
        self.method(
            0,
            commands.Connection.StartOk(
                client_properties=client_properties or {"product": "raw-test"},
                mechanism=mechanism,
                response=response.decode("ascii"),  # pamqp takes str; ASCII is byte-exact
                locale="en_US",
            ),
        )
        return self.expect(commands.Connection.Tune, 0)

    def handshake(
        self,
        *,
        username: str = "guest",
        password: str = "guest",
        mechanism: str = "PLAIN",
        frame_max: int | None = None,
        heartbeat: int = 0,
        channel_max: int | None = None,
        vhost: str = "/",
        client_properties: dict[str, Any] | None = None,
    ) -> commands.Connection.Tune:
        """The whole handshake up to open-ok; the broker's tune (what it proposed)."""
        tune = self.login(username, password, mechanism, client_properties)
        self.method(
            0,
            commands.Connection.TuneOk(
                channel_max=tune.channel_max if channel_max is None else channel_max,
                frame_max=tune.frame_max if frame_max is None else frame_max,
                heartbeat=heartbeat,
            ),
        )
        self.method(0, commands.Connection.Open(virtual_host=vhost))
        self.expect(commands.Connection.OpenOk, 0)
        return tune

    def open_channel(self, channel: int) -> None:
        self.method(channel, commands.Channel.Open())
        self.expect(commands.Channel.OpenOk, channel)

    def open(self) -> None:
        """The handshake (as a client that takes the broker's basic.cancel) and channel 1."""
        self.handshake(client_properties={"capabilities": {"consumer_cancel_notify": True}})
        self.open_channel(1)

    def rpc(self, channel: int, method: PamqpFrame, reply: type[F]) -> F:
        self.method(channel, method)
        return self.expect(reply, channel)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()


class RawClients:
    """Creates raw clients for one test and closes every one of them at teardown."""

    def __init__(self) -> None:
        self._raw: list[RawAmqp] = []

    def __call__(self, port: int, rcvbuf: int = 0) -> RawAmqp:
        client = RawAmqp(port, rcvbuf)
        self._raw.append(client)
        return client

    def close_all(self) -> None:
        for client in self._raw:
            client.close()


def roundtrip_ok(conn: pika.BlockingConnection, queue: str, body: bytes = b"ping") -> None:
    """The connection works: a fresh channel publishes to ``queue`` and gets it back."""
    channel = conn.channel()
    channel.queue_declare(queue)
    channel.basic_publish("", queue, body)
    _method, _props, got = get_message(channel, queue)
    assert got == body
    channel.close()


class Bystander:
    """Another client of the same broker, with a stored message, checked after every error
    test: its connection stays open, it can still publish and get, its message is still
    there."""

    QUEUE = "bystander-stored"

    def __init__(self, conn: pika.BlockingConnection) -> None:
        self.conn = conn
        self.channel = conn.channel()
        self.channel.queue_declare(self.QUEUE)
        self.channel.basic_publish("", self.QUEUE, b"kept")

    def assert_unaffected(self) -> None:
        assert self.conn.is_open and self.channel.is_open
        roundtrip_ok(self.conn, "bystander-roundtrip")
        assert queue_counts(self.channel, self.QUEUE) == (1, 0)
