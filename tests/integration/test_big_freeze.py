"""Issue 16: a big message never freezes the others. While a 64 MiB message flows through a
protocol (publisher -> subscriber, real clients), a small-message ping-pong on other connections
of the same protocol keeps being delivered: every ping arrives, and pings complete while a big
message is on its way (a broker that froze for the whole transfer would complete none).

Delivery is asserted, not time: the round-trip figures are bench/bigmsg_pingpong.py's.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from bigkit import BIG_WAIT, MIB, AmqpEnd, MqttEnd, NativeEnd, json_blob, sha
from serverproc import ServerProcess

from vibemq_server.client import Client

BIG = 64 * MIB
BIG_COUNT = 1  # one is enough to see pings complete during it (CI time)
#: Bounds of the ping-pong loop (it ends when the big flow does).
MAX_PINGS = 100_000


class BigFlow(threading.Thread):
    """Sends BIG_COUNT big messages one at a time and receives each; notes whether each
    arrived whole and when the first send started."""

    def __init__(self, send: Callable[[bytes], None], receive: Callable[[], bytes]) -> None:
        super().__init__(daemon=True)
        self.send, self.receive = send, receive
        self.started_sending = threading.Event()
        self.whole = 0
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            for i in range(BIG_COUNT):
                payload = json_blob(BIG, i)  # JSON: the native protocol carries it as is
                self.started_sending.set()
                self.send(payload)
                if sha(self.receive()) == sha(payload):
                    self.whole += 1
        except BaseException as exc:
            self.error = exc


def _run(flow: BigFlow, ping: Callable[[int], bool]) -> tuple[int, int]:
    """Ping-pong until the flow ends: (pings completed while it ran, pings lost)."""
    assert flow.started_sending.wait(BIG_WAIT)
    during = lost = 0
    deadline = time.monotonic() + BIG_WAIT * (BIG_COUNT + 1)
    n = 0
    while flow.is_alive() and n < MAX_PINGS and time.monotonic() < deadline:
        if ping(n):
            during += flow.is_alive()
        else:
            lost += 1
        n += 1
    flow.join(BIG_WAIT)
    assert not flow.is_alive(), "the big flow did not finish"
    assert flow.error is None, repr(flow.error)
    assert flow.whole == BIG_COUNT
    return during, lost


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ServerProcess]:
    s = ServerProcess(tmp_path, tmp_path / "data")
    try:
        yield s.start(VIBEMQ_QUEUE_DEFAULTS__DURABLE="false")
    finally:
        s.kill()


def test_mqtt_ping_pong_goes_on_while_64_mib_messages_flow(server: ServerProcess) -> None:
    port = server.ports["mqtt"]
    sub, pub = MqttEnd(port), MqttEnd(port)
    sub.subscribe("big.flow")
    pinger = MqttEnd(port)
    pinger.subscribe("ping.pong")
    try:
        flow = BigFlow(lambda p: pub.send("big.flow", p), sub.receive)
        flow.start()

        def ping(n: int) -> bool:
            body = b"%d" % n
            pinger.send("ping.pong", body)
            return pinger.receive() == body

        during, lost = _run(flow, ping)
    finally:
        for end in (sub, pub, pinger):
            end.close()
    assert lost == 0
    assert during > 0


def test_amqp_ping_pong_goes_on_while_64_mib_messages_flow(server: ServerProcess) -> None:
    port = server.amqp_port
    big_pub, big_sub, pinger = AmqpEnd(port), AmqpEnd(port), AmqpEnd(port)
    big_sub.declare("big.flow", durable=False)
    pinger.declare("ping.pong", durable=False)
    try:
        flow = BigFlow(
            lambda p: big_pub.send("big.flow", p, durable=False),
            lambda: big_sub.receive("big.flow"),
        )
        flow.start()

        def ping(n: int) -> bool:
            body = b"%d" % n
            pinger.send("ping.pong", body, durable=False)
            return pinger.receive("ping.pong") == body

        during, lost = _run(flow, ping)
    finally:
        for end in (big_pub, big_sub, pinger):
            end.close()
    assert lost == 0
    assert during > 0


def test_native_ping_pong_goes_on_while_64_mib_messages_flow(server: ServerProcess) -> None:
    port = server.ports["vibemq"]
    native = NativeEnd(port)
    native.declare("big.flow")
    flow = BigFlow(lambda p: native.send("big.flow", p), lambda: native.receive("big.flow"))

    async def pings() -> tuple[int, int]:
        c = await Client.connect("127.0.0.1", port, reconnect=False, request_timeout=BIG_WAIT)
        try:
            await c.create_queue("ping.pong")
            sub = await c.subscribe("ping.pong", prefetch=1)
            loop = asyncio.get_running_loop()

            def ping(n: int) -> bool:
                async def once() -> bool:
                    await c.publish("ping.pong", n)
                    msg = await asyncio.wait_for(sub.__anext__(), BIG_WAIT)
                    await msg.ack()
                    return bool(msg.payload == n)

                return asyncio.run_coroutine_threadsafe(once(), loop).result(BIG_WAIT)

            flow.start()
            return await asyncio.to_thread(_run, flow, ping)
        finally:
            await c.close()

    during, lost = asyncio.run(pings())
    assert lost == 0
    assert during > 0
