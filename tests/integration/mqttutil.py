"""Helpers for synchronous tests: a broker on a thread of its own and blocking MQTT clients.

* :class:`ThreadBroker` runs a real :class:`Broker` (uvloop, as in production) on its own
  thread and event loop, so tests can be plain synchronous code driving blocking clients
  (paho-mqtt's threaded loop, raw sockets, the mosquitto command-line tools) while the broker
  keeps running. :meth:`ThreadBroker.call` runs a function on the broker's loop to look at
  its state safely. The AMQP tests use it too.
* :class:`Paho` wraps a paho-mqtt 2.x client with queues, so every wait is bounded.
* :class:`Clients` makes paho clients and raw ones (``mqttkit.RawMqtt``, the one raw MQTT
  client of the test suite) and closes them all at teardown.

Every wait has a timeout and fails the test with a message instead of hanging; every client
and broker is registered with the :class:`Clients` / broker fixtures and torn down whatever
happened.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import queue
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Literal, TypeVar

import paho.mqtt.client as mqtt
import uvloop
from brokersettings import broker_settings
from mqttkit import HOST, RawMqtt, unique_id
from mqttkit import TIMEOUT as WAIT
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties as PahoProperties
from paho.mqtt.reasoncodes import ReasonCode

from vibemq_server.app import create_broker
from vibemq_server.config import Config
from vibemq_server.server import Broker

T = TypeVar("T")
#: the broker's structured log lines (structlog's capture_logs)
LogEntries = list[dict[str, Any]]


# --------------------------------------------------------------------------------------------
# The broker


class ThreadBroker:
    """A real broker on a thread with its own (uvloop) event loop."""

    def __init__(self, data_dir: Path, **overrides: Any) -> None:
        settings = broker_settings(data_dir, overrides)
        self.config = Config(**settings)
        self.loop = uvloop.new_event_loop()
        self.thread = threading.Thread(target=self._run, name="broker", daemon=True)
        self.broker: Broker | None = None

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def start(self) -> ThreadBroker:
        self.thread.start()

        async def make() -> Broker:
            broker = create_broker(self.config)
            await broker.start()
            return broker

        self.broker = asyncio.run_coroutine_threadsafe(make(), self.loop).result(15.0)
        return self

    @property
    def mqtt_port(self) -> int:
        assert self.broker is not None
        port = self.broker.mqtt_port
        assert port
        return port

    def call(self, fn: Callable[[Broker], T]) -> T:
        """``fn(broker)`` on the broker's loop: the safe way to read its state."""
        assert self.broker is not None
        broker = self.broker
        future: concurrent.futures.Future[T] = concurrent.futures.Future()

        def run() -> None:
            try:
                future.set_result(fn(broker))
            except BaseException as exc:
                future.set_exception(exc)

        self.loop.call_soon_threadsafe(run)
        return future.result(WAIT)

    def has_filter(self, topic_filter: str) -> bool:
        """Whether some connected MQTT session is subscribed to ``topic_filter``."""

        def check(broker: Broker) -> bool:
            assert broker.adapters["mqtt"] is not None
            return any(
                topic_filter in s.filters and s.connected
                for s in broker.adapters["mqtt"].sessions.values()
            )

        return self.call(check)

    def has_session(self, client_id: str) -> bool:
        def check(broker: Broker) -> bool:
            assert broker.adapters["mqtt"] is not None
            mqtt = broker.adapters["mqtt"]
            # (a clean client that needed no session yet holds its client id all the same)
            return client_id in mqtt.sessions or client_id in mqtt.sessionless

        return self.call(check)

    def stop(self) -> None:
        try:
            broker, self.broker = self.broker, None  # (a test may stop it before teardown)
            if broker is not None:
                asyncio.run_coroutine_threadsafe(broker.stop(), self.loop).result(15.0)
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(15.0)
            if not self.thread.is_alive():
                self.loop.close()


# --------------------------------------------------------------------------------------------
# paho-mqtt


class Paho:
    """A paho-mqtt 2.x client on its network thread, with every event queued for the test."""

    def __init__(
        self,
        port: int,
        client_id: str | None = None,
        *,
        protocol: int = mqtt.MQTTv311,
        clean_session: bool = True,
        keepalive: int = 60,
        transport: Literal["tcp", "websockets"] = "tcp",
    ) -> None:
        """``transport="websockets"``: MQTT over WebSockets (paho's path ``/mqtt``)."""
        self.port = port
        self.client_id = unique_id("paho") if client_id is None else client_id
        self.keepalive = keepalive
        self.client = mqtt.Client(
            mqtt.CallbackAPIVersion.VERSION2,
            client_id=self.client_id,
            protocol=protocol,
            # (MQTT 5 has clean start instead, given to connect())
            clean_session=None if protocol == mqtt.MQTTv5 else clean_session,
            transport=transport,
        )
        # One connection attempt per test: a refused or dropped connection stays dropped.
        self.client.reconnect_delay_set(60, 120)
        self.messages: queue.Queue[mqtt.MQTTMessage] = queue.Queue()
        self.connacks: queue.Queue[ReasonCode] = queue.Queue()
        self.disconnects: queue.Queue[ReasonCode] = queue.Queue()
        self._acks: dict[int, list[ReasonCode]] = {}
        self._acked = threading.Condition()
        self.log_lines: list[str] = []
        self.client.on_connect = self._on_connect
        self.client.on_disconnect = self._on_disconnect
        self.client.on_message = self._on_message
        self.client.on_subscribe = self._on_ack
        self.client.on_unsubscribe = self._on_ack
        self.client.on_log = self._on_log
        self._looping = False
        self.connack_props: Any = None
        self.disconnect_props: Any = None

    # callbacks (paho's thread)

    def _on_connect(
        self, client: Any, userdata: Any, flags: Any, rc: ReasonCode, props: Any
    ) -> None:
        self.connack_props = props
        self.connacks.put(rc)

    def _on_disconnect(
        self, client: Any, userdata: Any, flags: Any, rc: ReasonCode, props: Any
    ) -> None:
        self.disconnect_props = props
        self.disconnects.put(rc)

    def _on_message(self, client: Any, userdata: Any, msg: mqtt.MQTTMessage) -> None:
        self.messages.put(msg)

    def _on_ack(self, client: Any, userdata: Any, mid: int, codes: Any, props: Any) -> None:
        with self._acked:
            self._acks[mid] = list(codes)
            self._acked.notify_all()

    def _on_log(self, client: Any, userdata: Any, level: int, text: str) -> None:
        self.log_lines.append(text)

    def _wait_ack(self, mid: int, what: str) -> list[ReasonCode]:
        with self._acked:
            if not self._acked.wait_for(lambda: mid in self._acks, WAIT):
                raise AssertionError(f"no {what} for message id {mid}")
            return self._acks.pop(mid)

    # test API

    def will_set(self, topic: str, payload: bytes, qos: int = 0, retain: bool = False) -> None:
        self.client.will_set(topic, payload, qos, retain)

    def username_pw_set(self, username: str, password: str | None) -> None:
        self.client.username_pw_set(username, password)

    def connect(self, **kw: Any) -> ReasonCode:
        """Connect and return paho's reason code for the CONNACK (compare by name);
        ``kw``: more of paho's connect() arguments (``clean_start``, ``properties``)."""
        self.client.connect(HOST, self.port, self.keepalive, **kw)
        self.client.loop_start()
        self._looping = True
        try:
            return self.connacks.get(timeout=WAIT)
        except queue.Empty:
            raise AssertionError(f"{self.client_id}: no CONNACK") from None

    def connected(self, **kw: Any) -> Paho:
        rc = self.connect(**kw)
        assert not rc.is_failure, f"{self.client_id}: CONNACK {rc}"
        return self

    def subscribe(self, *subscriptions: tuple[str, Any], properties: Any = None) -> list[int]:
        """SUBSCRIBE and wait for the SUBACK; its return codes (granted QoS or 0x80).
        (v5: a subscription's second item may be paho's ``SubscribeOptions``.)"""
        result, mid = self.client.subscribe(list(subscriptions), properties=properties)
        assert result == mqtt.MQTT_ERR_SUCCESS, f"subscribe failed: {result}"
        assert mid is not None
        return [code.value for code in self._wait_ack(mid, "SUBACK")]

    def unsubscribe(self, *topic_filters: str) -> None:
        result, mid = self.client.unsubscribe(list(topic_filters))
        assert result == mqtt.MQTT_ERR_SUCCESS, f"unsubscribe failed: {result}"
        assert mid is not None
        self._wait_ack(mid, "UNSUBACK")

    def publish(
        self, topic: str, payload: bytes, qos: int = 0, retain: bool = False, properties: Any = None
    ) -> None:
        """Publish and wait until the QoS flow is complete (QoS 0: written to the socket)."""
        info = self.client.publish(topic, payload, qos, retain, properties)
        assert info.rc == mqtt.MQTT_ERR_SUCCESS, f"publish failed: {info.rc}"
        info.wait_for_publish(WAIT)
        assert info.is_published(), f"{self.client_id}: publish to {topic} not completed"

    def get(self, timeout: float = WAIT) -> mqtt.MQTTMessage:
        try:
            return self.messages.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"{self.client_id}: no message within {timeout}s") from None

    def until(self, topic: str, timeout: float = WAIT) -> list[mqtt.MQTTMessage]:
        """Messages up to (not including) the first on ``topic``: a fence that proves what
        was published before it has been delivered, so what is missing never will be."""
        before: list[mqtt.MQTTMessage] = []
        deadline = time.monotonic() + timeout
        while True:
            msg = self.get(max(deadline - time.monotonic(), 0.01))
            if msg.topic == topic:
                return before
            before.append(msg)

    def assert_no_more(self) -> None:
        assert self.messages.empty(), f"unexpected message {self.messages.get_nowait().topic}"

    def disconnect(self) -> None:
        """A clean DISCONNECT."""
        self.client.disconnect()
        self.stop_loop()

    def kill(self) -> None:
        """Stop paho and shut its socket down without DISCONNECT (an abnormal close)."""
        self.stop_loop()
        sock = self.client.socket()
        sock = getattr(sock, "_socket", sock)  # over WebSockets: paho's wrapper's socket
        if isinstance(sock, socket.socket):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()

    def stop_loop(self) -> None:
        if self._looping:
            self._looping = False
            self.client.loop_stop()


class Clients:
    """Creates clients for one test and closes every one of them at teardown."""

    def __init__(self) -> None:
        self._paho: list[Paho] = []
        self._raw: list[RawMqtt] = []

    def paho(self, port: int, client_id: str | None = None, **kw: Any) -> Paho:
        client = Paho(port, client_id, **kw)
        self._paho.append(client)
        return client

    def raw(self, port: int, *, v5: bool = False) -> RawMqtt:
        client = RawMqtt(port, v5=v5)
        self._raw.append(client)
        return client

    def close_all(self) -> None:
        # DISCONNECT all first: it wakes every network thread at once, so that stopping
        # them does not take a select() timeout each.
        for p in self._paho:
            with contextlib.suppress(Exception):
                p.client.disconnect()
        for p in self._paho:
            with contextlib.suppress(Exception):
                p.stop_loop()
            with contextlib.suppress(Exception):
                sock = p.client.socket()
                if isinstance(sock, socket.socket):
                    sock.close()
        for r in self._raw:
            r.close()


@contextlib.contextmanager
def brokers(tmp_path: Path) -> Iterator[Callable[..., ThreadBroker]]:
    """A factory of started :class:`ThreadBroker` s, all stopped on exit."""
    started: list[ThreadBroker] = []

    def make(**overrides: Any) -> ThreadBroker:
        broker = ThreadBroker(tmp_path / f"data{len(started)}", **overrides)
        started.append(broker)
        return broker.start()

    try:
        yield make
    finally:
        for broker in started:
            with contextlib.suppress(Exception):
                broker.stop()


#: makes a started ThreadBroker from Config overrides
MakeBroker = Callable[..., ThreadBroker]


#: paho's protocol constant for MQTT 5.0
V5 = mqtt.MQTTv5


def props(kind: int = PacketTypes.PUBLISH, **values: object) -> PahoProperties:
    """paho v5 properties for a packet of ``kind``, set by their paho names."""
    p = PahoProperties(kind)
    for name, value in values.items():
        setattr(p, name, value)
    return p


def v5(clients: Clients, broker: ThreadBroker, client_id: str | None = None, **kw: Any) -> Paho:
    """A connected paho client at protocol version 5."""
    return clients.paho(broker.mqtt_port, client_id, protocol=V5).connected(**kw)
