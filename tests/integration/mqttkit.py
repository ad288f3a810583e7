"""MQTT clients for the integration tests: THE raw MQTT client, paho for async tests, and the
async tests' environment.

* :class:`RawMqtt` is the one raw MQTT client of the test suite: a blocking socket speaking
  MQTT through the project's codec (``encode`` to send, or bytes for deliberately broken
  packets; :class:`MqttParser` to read). Every packet the broker sends is kept in ``pending``
  until asked for, in order. Synchronous tests (broker on a thread of its own,
  ``mqttutil.ThreadBroker``) use it as it is.
* :class:`AsyncRawMqtt` is the same client for tests whose broker runs in their own event
  loop: each blocking call is made in a worker thread (``asyncio.to_thread``), so the loop,
  and with it the broker, keeps going.
* :class:`PahoClient` wraps a real paho-mqtt 2.x client the same way (paho's network loop runs
  in a thread of its own; every wait runs in a worker thread).
* :class:`MqttEnv` is one async test's in-process broker and the clients it made (closed at
  teardown); real ``python -m vibemq_server`` processes are serverproc's ``Servers``. The
  fixtures are in conftest.py.

Every wait is bounded (``TIMEOUT``): a missing packet fails the test, it never hangs.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import queue
import socket
import threading
import time
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion, MQTTProtocolVersion
from waits import read_until_closed, recv_by, wait_for

from vibemq_server.adapters.mqtt.codec import MqttParser, encode
from vibemq_server.adapters.mqtt.codec5 import Mqtt5Parser, encode5
from vibemq_server.adapters.mqtt.packets import (
    Connack,
    Connect,
    Disconnect,
    Packet,
    Pingreq,
    Pingresp,
    Suback,
    Subscribe,
)
from vibemq_server.adapters.mqtt.packets5 import Connack5, Connect5, Disconnect5
from vibemq_server.client import Client
from vibemq_server.server import Broker

TIMEOUT = 5.0
"""Bound of every wait for something that should happen (it normally takes milliseconds)."""
#: How long a test waits before concluding that something did *not* arrive. Only used
#: together with a ping / marker barrier, never as a performance assertion.
QUIET = 0.3
HOST = "127.0.0.1"

P = TypeVar("P", bound=Packet)
T = TypeVar("T")
_ids = itertools.count(1)


def unique_id(prefix: str = "c") -> str:
    """A client id unique within the test run (short enough for MQTT 3.1's 23 characters)."""
    return f"{prefix}{next(_ids)}"


# -- the raw client ----------------------------------------------------------------------------


class Closed(ConnectionError):
    """The broker closed the connection."""


class RawMqtt:
    """A blocking MQTT connection built from the project codec; every read is bounded.
    ``v5``: it speaks MQTT 5.0 (``codec5``; ``connect`` sends a ``Connect5``)."""

    def __init__(self, port: int, host: str = HOST, *, v5: bool = False) -> None:
        self.sock = socket.create_connection((host, port), timeout=TIMEOUT)
        self.v5 = v5
        self.parser: MqttParser | Mqtt5Parser = Mqtt5Parser() if v5 else MqttParser()
        self.pending: deque[Any] = deque()
        self.eof = False

    def _encode(self, item: Any) -> bytes:
        if isinstance(item, bytes):
            return item
        return encode5(item) if self.v5 else encode(item)

    def send(self, *items: Any) -> None:
        """Packets (encoded here) or raw bytes, in one write."""
        self.sock.sendall(b"".join(self._encode(i) for i in items))

    def send_tolerant(self, *items: Any) -> None:
        """Send, ignoring a broker that already closed (it may refuse before reading it all)."""
        with contextlib.suppress(OSError):
            self.send(*items)

    def _read(self, deadline: float) -> None:
        """One read into ``pending``; Closed at EOF or reset, AssertionError at the deadline."""
        if self.eof:
            raise Closed("the broker closed the connection")
        chunk = recv_by(self.sock, deadline, 65536)
        if not chunk:
            self.eof = True
            raise Closed("the broker closed the connection")
        self.pending.extend(self.parser.feed(chunk))

    def recv(self, timeout: float = TIMEOUT) -> Any:
        """The next packet from the broker."""
        deadline = time.monotonic() + timeout
        while not self.pending:
            self._read(deadline)
        return self.pending.popleft()

    def expect(self, cls: type[T], timeout: float = TIMEOUT) -> T:
        packet = self.recv(timeout)
        assert isinstance(packet, cls), f"expected {cls.__name__}, got {packet!r}"
        return packet

    def connect(self, client_id: str | None = None, **fields: Any) -> Connack:
        """Send a CONNECT (any fields of :class:`Connect`) and return the CONNACK."""
        self.send(Connect(client_id=unique_id("raw") if client_id is None else client_id, **fields))
        return self.expect(Connack)

    def connect5(self, client_id: str | None = None, **fields: Any) -> Connack5:
        """Send a v5 CONNECT (any fields of :class:`Connect5`); the CONNACK."""
        cid = unique_id("raw5") if client_id is None else client_id
        self.send(Connect5(client_id=cid, **fields))
        return self.expect(Connack5)

    def subscribe(self, topic_filter: str, qos: int, packet_id: int = 1) -> int:
        """SUBSCRIBE to one filter; the granted QoS (or 0x80)."""
        self.send(Subscribe(packet_id, ((topic_filter, qos),)))
        suback = self.expect(Suback)
        assert suback.packet_id == packet_id
        return suback.return_codes[0]

    def barrier(self, wait: float = QUIET) -> list[Any]:
        """Wait a little, then PINGREQ -> PINGRESP: returns whatever came before the PINGRESP
        (the broker handles a connection's packets in order, so anything it had to send by
        then is there)."""
        time.sleep(wait)
        self.send(Pingreq())
        before: list[Packet] = []
        while True:
            packet = self.recv()
            if isinstance(packet, Pingresp):
                return before
            before.append(packet)

    def wait_closed(self, timeout: float = TIMEOUT) -> list[Any]:
        """Read until the broker closes; the packets that came first. Fails on timeout."""
        return read_until_closed(self._read, self.pending, Closed, timeout)

    def disconnect_and_wait(self) -> None:
        """DISCONNECT, then wait until the broker closes the connection: by then it has
        handled the DISCONNECT (left the session)."""
        self.send(Disconnect5() if self.v5 else Disconnect())
        self.wait_closed()
        self.close()

    def disconnect(self) -> None:
        """DISCONNECT (if the connection still takes it) and close."""
        self.send_tolerant(Disconnect5() if self.v5 else Disconnect())
        self.close()

    def close(self) -> None:
        """Close the socket without DISCONNECT: an abnormal close for the broker."""
        with contextlib.suppress(OSError):
            self.sock.close()

    drop = close


class AsyncRawMqtt:
    """:class:`RawMqtt` for a test whose broker runs in the test's own event loop: every call
    that may block runs in a worker thread."""

    def __init__(self, raw: RawMqtt) -> None:
        self.raw = raw

    @classmethod
    async def open(cls, port: int, host: str = HOST) -> AsyncRawMqtt:
        return cls(await asyncio.to_thread(RawMqtt, port, host))

    @classmethod
    async def connected(
        cls, port: int, client_id: str, *, clean_session: bool = True, keep_alive: int = 0
    ) -> tuple[AsyncRawMqtt, Connack]:
        """Open, send CONNECT and return the CONNACK (which must accept)."""
        raw = await cls.open(port)
        connack = await raw.connect(client_id, clean_session=clean_session, keep_alive=keep_alive)
        assert connack.return_code == 0, connack
        return raw, connack

    @property
    def pending(self) -> deque[Packet]:
        return self.raw.pending

    def _call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Awaitable[Any]:
        return asyncio.to_thread(fn, *args, **kwargs)

    async def send(self, *items: bytes | Packet) -> None:
        await self._call(self.raw.send, *items)

    async def recv(self, timeout: float = TIMEOUT) -> Packet:
        packet: Packet = await self._call(self.raw.recv, timeout)
        return packet

    async def expect(self, cls: type[P], timeout: float = TIMEOUT) -> P:
        packet: P = await self._call(self.raw.expect, cls, timeout)
        return packet

    async def connect(self, client_id: str | None = None, **fields: Any) -> Connack:
        connack: Connack = await self._call(self.raw.connect, client_id, **fields)
        return connack

    async def subscribe(self, topic_filter: str, qos: int, packet_id: int = 1) -> int:
        granted: int = await self._call(self.raw.subscribe, topic_filter, qos, packet_id)
        return granted

    async def barrier(self, wait: float = QUIET) -> list[Packet]:
        before: list[Packet] = await self._call(self.raw.barrier, wait)
        return before

    async def wait_closed(self, timeout: float = TIMEOUT) -> list[Packet]:
        received: list[Packet] = await self._call(self.raw.wait_closed, timeout)
        return received

    async def disconnect_and_wait(self) -> None:
        await self._call(self.raw.disconnect_and_wait)

    async def disconnect(self) -> None:
        await self._call(self.raw.disconnect)

    def drop(self) -> None:
        """Close the socket abruptly (no DISCONNECT): the broker sees a lost connection."""
        self.raw.close()

    async def close(self) -> None:
        self.raw.close()


# -- paho --------------------------------------------------------------------------------------


class PahoClient:
    """A paho-mqtt client for async tests: ``await connect()``, ``subscribe``, ``publish``,
    ``get`` (the next message) and ``disconnect``; ``close`` tears everything down."""

    def __init__(
        self,
        port: int,
        client_id: str,
        *,
        clean_session: bool = True,
        protocol: MQTTProtocolVersion = MQTTProtocolVersion.MQTTv311,
        host: str = HOST,
    ) -> None:
        self.host = host
        self.port = port
        self.client_id = client_id
        self.client = mqtt.Client(
            CallbackAPIVersion.VERSION2,
            client_id=client_id,
            clean_session=clean_session,
            protocol=protocol,
            reconnect_on_failure=False,
        )
        self.messages: queue.Queue[mqtt.MQTTMessage] = queue.Queue()
        self.session_present: bool | None = None
        self.connack_rc: int | None = None
        self._connected = threading.Event()
        self._disconnected = threading.Event()
        self._subacks: dict[int, list[int]] = {}
        self._cond = threading.Condition()
        self._loop_running = False
        self.client.on_connect = self._on_connect
        self.client.on_disconnect = self._on_disconnect
        self.client.on_message = self._on_message
        self.client.on_subscribe = self._on_subscribe

    # paho callbacks (its network thread)

    def _on_connect(self, client: Any, userdata: Any, flags: Any, rc: Any, props: Any) -> None:
        self.session_present = bool(flags.session_present)
        self.connack_rc = int(rc.value) if hasattr(rc, "value") else int(rc)
        self._connected.set()

    def _on_disconnect(self, client: Any, userdata: Any, flags: Any, rc: Any, props: Any) -> None:
        self._disconnected.set()

    def _on_message(self, client: Any, userdata: Any, msg: mqtt.MQTTMessage) -> None:
        self.messages.put(msg)

    def _on_subscribe(self, client: Any, userdata: Any, mid: int, codes: Any, props: Any) -> None:
        with self._cond:
            self._subacks[mid] = [int(c.value) if hasattr(c, "value") else int(c) for c in codes]
            self._cond.notify_all()

    # blocking parts (run in threads)

    def _connect_blocking(self, keepalive: int) -> bool:
        self._connected.clear()
        self._disconnected.clear()
        self.client.connect(self.host, self.port, keepalive=keepalive)
        self.client.loop_start()
        self._loop_running = True
        assert self._connected.wait(TIMEOUT), f"{self.client_id}: no CONNACK"
        assert self.connack_rc == 0, f"{self.client_id}: CONNACK {self.connack_rc}"
        return bool(self.session_present)

    def _wait_suback(self, mid: int) -> list[int]:
        with self._cond:
            ok = self._cond.wait_for(lambda: mid in self._subacks, TIMEOUT)
            assert ok, f"{self.client_id}: no SUBACK for mid {mid}"
            return self._subacks.pop(mid)

    def _stop_blocking(self, send_disconnect: bool) -> None:
        if send_disconnect and self.client.is_connected():
            self.client.disconnect()
            self._disconnected.wait(TIMEOUT)
        if self._loop_running:
            self._loop_running = False
            self.client.loop_stop()

    # async API

    async def connect(self, keepalive: int = 60) -> bool:
        """Connect and wait for CONNACK; returns its session-present flag."""
        return await asyncio.to_thread(self._connect_blocking, keepalive)

    async def subscribe(self, topic: str, qos: int = 0) -> int:
        """Subscribe and wait for the SUBACK; returns the granted QoS (or 0x80)."""
        rc, mid = self.client.subscribe(topic, qos)
        assert rc == mqtt.MQTT_ERR_SUCCESS and mid is not None, f"subscribe failed: {rc}"
        codes = await asyncio.to_thread(self._wait_suback, mid)
        assert len(codes) == 1
        return codes[0]

    async def publish(
        self, topic: str, payload: bytes | str, qos: int = 0, retain: bool = False
    ) -> None:
        """Publish and, for QoS 1/2, wait until the broker completed the flow."""
        info = self.client.publish(topic, payload, qos=qos, retain=retain)
        assert info.rc == mqtt.MQTT_ERR_SUCCESS, f"publish failed: {info.rc}"
        await asyncio.to_thread(info.wait_for_publish, TIMEOUT)
        assert info.is_published(), f"{self.client_id}: publish to {topic} not completed"

    async def get(self, timeout: float = TIMEOUT) -> mqtt.MQTTMessage:
        """The next message received; fails the test after ``timeout``."""
        try:
            return await asyncio.to_thread(self.messages.get, True, timeout)
        except queue.Empty:
            raise AssertionError(f"{self.client_id}: no message within {timeout}s") from None

    async def get_many(self, count: int, timeout: float = TIMEOUT) -> list[mqtt.MQTTMessage]:
        return [await self.get(timeout) for _ in range(count)]

    async def assert_nothing(self, wait: float = QUIET) -> None:
        """Nothing (more) arrives within ``wait`` seconds."""
        await asyncio.sleep(wait)
        assert self.messages.empty(), f"unexpected: {self.messages.get_nowait().payload!r}"

    async def disconnect(self) -> None:
        """Send DISCONNECT and stop the network thread."""
        await asyncio.to_thread(self._stop_blocking, True)

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            await asyncio.to_thread(self._stop_blocking, True)


class PahoFactory:
    """Makes paho clients and closes every one of them at teardown."""

    def __init__(self, port: int = 0) -> None:
        self.port = port
        self.made: list[PahoClient] = []

    async def __call__(
        self,
        client_id: str,
        *,
        port: int | None = None,
        clean_session: bool = True,
        protocol: MQTTProtocolVersion = MQTTProtocolVersion.MQTTv311,
        connect: bool = True,
    ) -> PahoClient:
        client = PahoClient(
            port if port is not None else self.port,
            client_id,
            clean_session=clean_session,
            protocol=protocol,
        )
        self.made.append(client)
        if connect:
            await client.connect()
        return client

    async def close_all(self) -> None:
        for client in self.made:
            await client.close()


# -- one async test's broker and clients -------------------------------------------------------


class MqttEnv:
    """An in-process broker (in the test's event loop) plus the clients of one test, all
    closed at teardown."""

    def __init__(self, broker_factory: Callable[..., Awaitable[Broker]]) -> None:
        self.broker_factory = broker_factory
        self.broker: Broker | None = None
        self.paho = PahoFactory()
        self.raws: list[AsyncRawMqtt] = []
        self.clients: list[Client] = []

    async def start(self, **mqtt_options: Any) -> Broker:
        return self.use(await self.broker_factory(mqtt={"port": 0, **mqtt_options}))

    def use(self, broker: Broker) -> Broker:
        """Make ``broker`` (started by the test itself) the one new clients connect to."""
        self.broker = broker
        self.paho.port = self.port
        return broker

    @property
    def port(self) -> int:
        assert self.broker is not None and self.broker.mqtt_port
        return self.broker.mqtt_port

    async def raw(self, client_id: str, clean_session: bool = True) -> tuple[AsyncRawMqtt, bool]:
        """A raw connection that CONNECTed; returns it and the CONNACK session-present flag."""
        raw, connack = await AsyncRawMqtt.connected(
            self.port, client_id, clean_session=clean_session
        )
        self.raws.append(raw)
        return raw, connack.session_present

    async def open_raw(self) -> AsyncRawMqtt:
        """A raw connection that has sent nothing yet."""
        raw = await AsyncRawMqtt.open(self.port)
        self.raws.append(raw)
        return raw

    async def vibemq(self) -> Client:
        """A VibeMQ client library connection to the same broker."""
        assert self.broker is not None
        client = await Client.connect(
            HOST, self.broker.port, reconnect=False, request_timeout=TIMEOUT
        )
        self.clients.append(client)
        return client

    def offline(self, client_id: str) -> bool:
        """The broker holds a session for ``client_id`` and no connection is attached."""
        assert self.broker is not None and self.broker.adapters["mqtt"] is not None
        session = self.broker.adapters["mqtt"].sessions.get(client_id)
        return session is not None and session.link is None

    def gone(self, client_id: str) -> bool:
        assert self.broker is not None and self.broker.adapters["mqtt"] is not None
        mqtt = self.broker.adapters["mqtt"]
        # (a clean client that needed no session yet holds its client id all the same)
        return client_id not in mqtt.sessions and client_id not in mqtt.sessionless

    async def wait_offline(self, client_id: str) -> None:
        await wait_for(lambda: self.offline(client_id), what=f"{client_id} offline")

    async def close(self) -> None:
        await self.paho.close_all()
        for raw in self.raws:
            await raw.close()
        for client in self.clients:
            await client.close()
