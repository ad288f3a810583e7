"""MQTT clients for integration tests: paho driven from async tests, and a raw packet client.

* :class:`PahoClient` wraps a real paho-mqtt 2.x client. paho is blocking and threaded (its
  network loop runs in a thread of its own), so every wait here runs in a worker thread
  (``asyncio.to_thread``) and the broker, running in the test's event loop, keeps going.
* :class:`RawMqtt` speaks MQTT over asyncio streams with the project's own codec
  (``vibemq_server.adapters.mqtt.codec.encode`` / ``MqttParser``): exact control over packet
  ids, DUP, acknowledgements withheld and connections dropped at a chosen point.

Every wait is bounded (``TIMEOUT``): a missing packet fails the test, it never hangs.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
from collections import deque
from collections.abc import Callable
from typing import Any, TypeVar

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion, MQTTProtocolVersion

from vibemq_server.adapters.mqtt.codec import MqttParser, encode
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

TIMEOUT = 5.0
#: How long a test waits before concluding that something did *not* arrive. Only used
#: together with a ping / marker barrier, never as a performance assertion.
QUIET = 0.3

P = TypeVar("P")


async def wait_for(cond: Callable[[], bool], timeout: float = TIMEOUT, what: str = "") -> None:
    """Poll ``cond`` (in the event loop) until it holds; fail after ``timeout``."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not cond():
        assert loop.time() < deadline, f"condition not met in time: {what or cond}"
        await asyncio.sleep(0.005)


# -- paho ------------------------------------------------------------------------------------


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
        host: str = "127.0.0.1",
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


# -- raw packets -----------------------------------------------------------------------------


class RawMqtt:
    """An MQTT connection with packets built and parsed by the project's codec. Every packet
    the broker sends is kept in ``pending`` until asked for, in order."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.parser = MqttParser()
        self.pending: deque[Packet] = deque()
        self.eof = False

    @classmethod
    async def open(cls, port: int, host: str = "127.0.0.1") -> RawMqtt:
        reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), TIMEOUT)
        return cls(reader, writer)

    @classmethod
    async def connect(
        cls, port: int, client_id: str, *, clean_session: bool = True, keep_alive: int = 0
    ) -> tuple[RawMqtt, Connack]:
        """Open, send CONNECT and return the CONNACK (which must accept)."""
        raw = await cls.open(port)
        raw.send(Connect(client_id, clean_session=clean_session, keep_alive=keep_alive))
        connack = await raw.expect(Connack)
        assert connack.return_code == 0, connack
        return raw, connack

    def send(self, *packets: Packet) -> None:
        self.writer.write(b"".join(encode(p) for p in packets))

    async def _read_more(self, timeout: float) -> None:
        data = await asyncio.wait_for(self.reader.read(65536), timeout)
        if not data:
            self.eof = True
            raise ConnectionError("broker closed the connection")
        self.pending.extend(self.parser.feed(data))

    async def recv(self, timeout: float = TIMEOUT) -> Packet:
        """The next packet from the broker."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while not self.pending:
            left = deadline - loop.time()
            if left <= 0:
                raise AssertionError("no packet from the broker in time")
            try:
                await self._read_more(left)
            except TimeoutError:
                raise AssertionError("no packet from the broker in time") from None
        return self.pending.popleft()

    async def expect(self, cls: type[P], timeout: float = TIMEOUT) -> P:
        packet = await self.recv(timeout)
        assert isinstance(packet, cls), f"expected {cls.__name__}, got {packet!r}"
        return packet

    async def subscribe(self, topic_filter: str, qos: int, packet_id: int = 1) -> int:
        self.send(Subscribe(packet_id, ((topic_filter, qos),)))
        suback = await self.expect(Suback)
        assert suback.packet_id == packet_id
        return suback.return_codes[0]

    async def barrier(self, wait: float = QUIET) -> list[Packet]:
        """Wait a little, then PINGREQ -> PINGRESP: returns whatever came before the PINGRESP
        (the broker handles a connection's packets in order, so anything it had to send by
        then is there)."""
        await asyncio.sleep(wait)
        self.send(Pingreq())
        before: list[Packet] = []
        while True:
            packet = await self.recv()
            if isinstance(packet, Pingresp):
                return before
            before.append(packet)

    def drop(self) -> None:
        """Close the socket abruptly (no DISCONNECT): the broker sees a lost connection."""
        self.writer.transport.abort()

    async def disconnect_and_wait(self) -> None:
        """DISCONNECT, then wait until the broker closes the connection: by then it has
        handled the DISCONNECT (left the session)."""
        self.send(Disconnect())
        async with asyncio.timeout(TIMEOUT):
            while await self.reader.read(65536):
                pass
        await self.close()

    async def disconnect(self) -> None:
        with contextlib.suppress(Exception):
            self.send(Disconnect())
            await self.writer.drain()
        await self.close()

    async def close(self) -> None:
        self.writer.close()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.writer.wait_closed(), TIMEOUT)
