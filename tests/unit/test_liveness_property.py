"""No lost wake-up, on any protocol: a property test over the broker's real connections.

Hypothesis drives a publisher and a consumer through random interleavings of publishes, the
consumer's peer reading some of what the broker wrote (so the connection pauses and resumes
writing as a socket would), acks, and housekeeping ticks; the broker's bounds are tiny (a
4 KiB write buffer, a 16 KiB memory high watermark, a window of 50) so that every pause
happens. After every step the loop is let run until it is idle, and then:

* nothing the broker produced waits in a connection's own output buffer (it was written);
* a ready message and a consumer with room always end in a delivery: no queue holds ready
  messages while a subscription of it is under its prefetch and its socket is not paused.

At the end the consumer reads and acks everything and every message must have arrived.

The connections are the broker's own, made by the protocol factories its listeners were
started with (captured from ``create_server``); only the socket below them is a stand-in
that behaves like uvloop's transport (``pause_writing`` above the high-water mark,
``resume_writing`` once drained to the low one, reads held while reading is paused).
"""

from __future__ import annotations

import asyncio
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fakesocket import FakeSocket
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from listenerspy import start_broker

from bench.amqp_driver import U16 as AMQP_U16
from bench.amqp_driver import U32 as AMQP_U32
from bench.amqp_driver import (
    AmqpDeliveryScanner,
    encode_ack,
    encode_publish,
    method,
    shortstr,
)
from bench.mqtt_driver import MqttDeliveryScanner, MqttDriver, packet
from bench.vibemq_driver import (
    CONNECT,
    CREATE_QUEUE,
    SUBSCRIBE,
    VibeDeliveryScanner,
    VibeDriver,
    frame,
)
from vibemq_server.config import Config

WINDOW = 50
HIGH = 4096
QUEUE = "live"
QUEUE2 = "live2"  # amqp-global's second queue


# -- the three protocols' clients (the bench's raw load generators' frames) -----------------------


class Client:
    """One protocol's publisher and consumer frames, and how to read deliveries."""

    listener: str
    scanner: Any

    def handshake_publisher(self) -> bytes:
        raise NotImplementedError

    def handshake_consumer(self) -> bytes:
        raise NotImplementedError

    def publish(self, start: int, count: int) -> bytes:
        raise NotImplementedError

    def acks(self, per_delivery: list[bytes]) -> bytes:
        return b"".join(per_delivery)


class NativeClient(Client):
    listener = "vibemq"

    def __init__(self) -> None:
        self.driver = VibeDriver("127.0.0.1", 0, QUEUE, prefetch=WINDOW)
        self.scanner = VibeDeliveryScanner()

    def handshake_publisher(self) -> bytes:
        return frame(CONNECT, "c-pub")

    def handshake_consumer(self) -> bytes:
        sub = frame(SUBSCRIBE, "s-1", QUEUE, headers={"prefetch": str(WINDOW)})
        return frame(CONNECT, "c-sub") + sub

    def publish(self, start: int, count: int) -> bytes:
        return self.driver.publish_batch(start, count)


class NativeFanOutClient(NativeClient):
    """The subscriber of a FanOutWithoutAck queue: the broker hands a read's publishes over
    in runs once the read is done (QueueManager.hold); nothing is acked."""

    def handshake_consumer(self) -> bytes:
        options = b'{"mode": "FanOutWithoutAck", "durable": false}'
        create = frame(CREATE_QUEUE, "cq-1", QUEUE, options)
        sub = frame(SUBSCRIBE, "s-1", QUEUE, headers={"prefetch": str(WINDOW)})
        return frame(CONNECT, "c-sub") + create + sub

    def acks(self, per_delivery: list[bytes]) -> bytes:
        return b""


def _mqtt_connect(client_id: bytes, clean: bool = True) -> bytes:
    flags = b"\x02" if clean else b"\x00"
    variable = b"\x00\x04MQTT\x04" + flags + b"\x02\x58"  # level 4, keep-alive 600 s
    return packet(0x10, variable + AMQP_U16.pack(len(client_id)) + client_id)


class MqttClient(Client):
    """QoS 1 both ways; the subscriber has a clean session (its messages wait in memory)
    or a persistent one (they wait in its core queue)."""

    listener = "mqtt"

    def __init__(self, clean: bool = True) -> None:
        self.driver = MqttDriver("127.0.0.1", 0, QUEUE)
        self.scanner = MqttDeliveryScanner()
        self.clean = clean

    def handshake_publisher(self) -> bytes:
        return _mqtt_connect(b"pub")

    def handshake_consumer(self) -> bytes:
        topic = AMQP_U16.pack(len(QUEUE)) + QUEUE.encode()
        subscribe = packet(0x82, AMQP_U16.pack(1) + topic + b"\x01")
        return _mqtt_connect(b"sub", self.clean) + subscribe

    def publish(self, start: int, count: int) -> bytes:
        return self.driver.publish_batch(start, count)


def _amqp_open() -> bytes:
    response = b"\x00guest\x00guest"
    start_ok = AMQP_U32.pack(0) + shortstr(b"PLAIN") + AMQP_U32.pack(len(response)) + response
    tune_ok = method(0, 10, 31, b"\x07\xff\x00\x02\x00\x00\x00\x00")
    return (
        b"AMQP\x00\x00\x09\x01"
        + method(0, 10, 11, start_ok + shortstr(b"en_US"))
        + tune_ok
        + method(0, 10, 40, shortstr(b"/") + shortstr(b"") + b"\x00")
        + method(1, 20, 10, shortstr(b""))
        + method(1, 50, 10, AMQP_U16.pack(0) + shortstr(QUEUE.encode()) + b"\x00\x00\x00\x00\x00")
    )


class AmqpClient(Client):
    listener = "amqp"

    def __init__(self) -> None:
        self.scanner = AmqpDeliveryScanner()

    def handshake_publisher(self) -> bytes:
        return _amqp_open()

    def handshake_consumer(self) -> bytes:
        qos = method(1, 60, 10, b"\x00\x00\x00\x00" + AMQP_U16.pack(WINDOW) + b"\x00")
        consume = method(
            1,
            60,
            20,
            AMQP_U16.pack(0) + shortstr(QUEUE.encode()) + shortstr(b"ct") + b"\x00" + b"\0" * 4,
        )
        return _amqp_open() + qos + consume

    def publish(self, start: int, count: int) -> bytes:
        return b"".join(
            encode_publish(QUEUE.encode(), b"%064d" % i) for i in range(start, start + count)
        )

    def acks(self, per_delivery: list[bytes]) -> bytes:
        # one basic.ack(multiple) for the batch, as consumers that ack every N do
        tag = int.from_bytes(per_delivery[-1][11:19], "big")
        return encode_ack(tag, multiple=True)


class AmqpGlobalClient(AmqpClient):
    """Two queues consumed on one channel under a global (channel-wide) prefetch: a batch
    goes to one queue or the other (by where it starts), so an ack may settle a queue that
    is empty now while the other one has messages ready and the channel has room again."""

    def handshake_consumer(self) -> bytes:
        declare = AMQP_U16.pack(0) + shortstr(QUEUE2.encode()) + b"\x00\x00\x00\x00\x00"
        qos = method(1, 60, 10, b"\x00\x00\x00\x00" + AMQP_U16.pack(WINDOW) + b"\x01")
        consumes = b"".join(
            method(
                1,
                60,
                20,
                AMQP_U16.pack(0) + shortstr(queue.encode()) + shortstr(tag) + b"\x00" + b"\0" * 4,
            )
            for queue, tag in ((QUEUE, b"ct"), (QUEUE2, b"ct2"))
        )
        return _amqp_open() + method(1, 50, 10, declare) + qos + consumes

    def publish(self, start: int, count: int) -> bytes:
        queue = (QUEUE if start % 2 == 0 else QUEUE2).encode()
        return b"".join(encode_publish(queue, b"%064d" % i) for i in range(start, start + count))


CLIENTS: dict[str, Callable[[], Client]] = {
    "native": NativeClient,
    "native-fanout": NativeFanOutClient,
    "mqtt": MqttClient,
    "mqtt-persistent": lambda: MqttClient(clean=False),
    "amqp": AmqpClient,
    "amqp-global": AmqpGlobalClient,
}


# -- the scenario ---------------------------------------------------------------------------------


async def _settle() -> None:
    for _ in range(4):
        await asyncio.sleep(0)


def _stuck_output(protocol: Any) -> int:
    """Bytes a connection holds in its own output buffer (they should have been written)."""
    out = getattr(protocol, "_out", None)
    return sum(len(b) for b in out) if out else 0


class Scenario:
    def __init__(
        self, broker: Any, factories: dict[str, Callable[[], asyncio.Protocol]], client: Client
    ) -> None:
        self.broker = broker
        self.client = client
        factory = factories[client.listener]
        self.pub_proto = factory()
        self.sub_proto = factory()
        self.pub = FakeSocket(self.pub_proto, 40001, flow=True)
        self.sub = FakeSocket(self.sub_proto, 40002, flow=True)
        self.pub_proto.connection_made(self.pub)
        self.sub_proto.connection_made(self.sub)
        self.published = 0
        self.delivered = 0
        self.unacked: list[bytes] = []
        self.received = bytearray()

    async def start(self) -> None:
        self.sub.peer_sends(self.client.handshake_consumer())
        self.pub.peer_sends(self.client.handshake_publisher())
        await _settle()
        self.read(1 << 20)
        self.pub.peer_reads(1 << 30)

    def publish(self, count: int) -> None:
        self.pub.peer_sends(self.client.publish(self.published, count))
        self.published += count

    def read(self, n: int) -> None:
        self.received += self.sub.peer_reads(n)
        used, delivered, acks = self.client.scanner.feed(self.received)
        del self.received[:used]
        if delivered:
            size = len(acks) // delivered
            self.unacked.extend(acks[i * size : (i + 1) * size] for i in range(delivered))
            self.delivered += delivered

    def ack(self, n: int) -> None:
        batch, self.unacked = self.unacked[:n], self.unacked[n:]
        acks = self.client.acks(batch) if batch else b""
        if acks:
            self.sub.peer_sends(acks)

    def tick(self) -> None:
        self.broker.manager.tick()

    def _violation(self) -> str:
        """What is stuck now, or ''."""
        for proto in (self.pub_proto, self.sub_proto):
            if _stuck_output(proto):
                return "output left unwritten in a connection's own buffer"
        paused = self.sub.write_paused
        for queue in self.broker.manager.queues.values():
            if not queue.count:
                continue
            for sub in queue.subscriptions:
                # has_capacity: under the prefetch, and the consumer writable (its socket
                # and output not over their bounds, its AMQP channel's global window open)
                if sub.has_capacity() and not paused:
                    return (
                        f"{queue.count} ready in {queue.name!r}, "
                        f"{len(sub.inflight)}/{sub.prefetch} in flight, socket not paused"
                    )
        mqtt = self.broker.adapters.get("mqtt")
        for session in mqtt.sessions.values() if mqtt is not None else ():
            # A clean session's messages wait in memory, outside the core (session.py).
            waiting = len(session._pending) + len(session._backlog)
            window = len(session.outbound) + len(session.direct) + len(session.pubrel)
            if waiting and window < session.max_inflight and not paused:
                return (
                    f"{waiting} waiting for MQTT client {session.client_id!r}, "
                    f"{window}/{session.max_inflight} in flight, socket not paused"
                )
        return ""

    async def check(self, what: str) -> None:
        """Let the loop run until nothing is stuck; a lost wake-up stays stuck (the
        housekeeping timer, which would paper over one, is off: only ``tick`` ops tick).
        Journal flushes complete on their own thread, so give them a moment."""
        problem = ""
        for _ in range(200):
            await _settle()
            self.pub.peer_reads(1 << 30)  # the publisher reads its acknowledgements at once
            problem = self._violation()
            if not problem:
                return
            await asyncio.sleep(0.001)
        raise AssertionError(f"after {what}: {problem}")

    async def finish(self) -> None:
        """The consumer reads and acks everything; publishers are woken by the ticks."""
        for _ in range(400):
            if self.delivered >= self.published:
                break
            self.read(1 << 30)
            self.ack(len(self.unacked))
            self.tick()
            await asyncio.sleep(0.005)
        assert self.delivered == self.published, f"{self.delivered} of {self.published} arrived"


OPS = st.lists(
    st.one_of(
        st.tuples(st.just("publish"), st.integers(1, 120)),
        st.tuples(st.just("read"), st.integers(0, 12_000)),
        st.tuples(st.just("ack"), st.integers(0, 120)),
        st.tuples(st.just("tick"), st.just(0)),
    ),
    max_size=30,
)


async def _run(protocol: str, ops: list[tuple[str, int]], data_dir: Path) -> None:
    config = Config(
        host="127.0.0.1",
        port=0,
        data_dir=data_dir,
        write_buffer_high_bytes=HIGH,
        memory_high_watermark_bytes=16 * 1024,
        housekeeping_interval_ms=10_000,  # the test ticks
        drain_timeout_s=0.05,
        queue_defaults={"max_queue_size": 1_000_000, "durable": False},
        mqtt={
            "port": 0,
            "max_inflight": WINDOW,
            "max_queued_messages": 1_000_000,
            "max_publisher_pause_s": 0.02,
        },
        amqp={"port": 0, "heartbeat_s": 0},
        http={"enabled": False},
    )
    broker, factories = await start_broker(config)
    try:
        scenario = Scenario(broker, factories, CLIENTS[protocol]())
        await scenario.start()
        for op, n in ops:
            if op == "publish":
                scenario.publish(n)
            elif op == "read":
                scenario.read(n)
            elif op == "ack":
                scenario.ack(n)
            else:
                scenario.tick()
            await scenario.check(f"{op}({n})")
        await scenario.finish()
    finally:
        await broker.stop()


def _property(protocol: str, *examples: list[tuple[str, int]]) -> Callable[..., None]:
    """The property for one protocol; ``examples``: op lists always tried (known cases)."""

    @settings(
        max_examples=int(os.environ.get("LIVENESS_EXAMPLES", "40")),
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
    )
    @given(ops=OPS)
    def test(ops: list[tuple[str, int]]) -> None:
        with tempfile.TemporaryDirectory() as tmp:
            asyncio.run(_run(protocol, ops, Path(tmp)))

    for ops in examples:
        test = example(ops=ops)(test)
    return test


test_native_no_lost_wakeup = _property("native")
test_native_fan_out_no_lost_wakeup = _property("native-fanout")
test_mqtt_no_lost_wakeup = _property("mqtt")
test_mqtt_persistent_no_lost_wakeup = _property("mqtt-persistent")
test_amqp_no_lost_wakeup = _property("amqp")
# The channel's window filled from both queues; the ack settles the first queue's only
# message: the second queue's consumer must be refilled too.
test_amqp_global_prefetch_no_lost_wakeup = _property(
    "amqp-global", [("publish", 1), ("publish", 60), ("read", 12_000), ("ack", 1)]
)
