"""Issue 16 goal 2: does a big message freeze the others?

Per protocol, one broker: a child process moves ``--count`` messages of ``--size`` bytes (64 MiB
by default) through it with a real client (paho-mqtt QoS 1, pika with publisher confirms,
``vibemq_server.client``), one at a time, publisher -> subscriber, while this process runs a
small-message ping-pong on other connections (the raw generators of bench/*_driver.py: publish
one 64-byte message, wait for its delivery, ack it, wait for the publisher ack). It reports the
ping-pong round trip p50/p99/max while the big messages flow (target: p99 under 10 ms), the
big messages' rate and the broker's peak RSS (VmHWM), side by side with Mosquitto (MQTT) and
RabbitMQ (AMQP) started by bench.brokers.

    PYTHONPATH=$PWD python -m bench.bigmsg_pingpong
    PYTHONPATH=$PWD python -m bench.bigmsg_pingpong --protocols mqtt --size 8388608 --count 10
    PYTHONPATH=$PWD python -m bench.bigmsg_pingpong --no-peers --json bigmsg.json

A bench tool, not a test: nothing here asserts on timings.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import multiprocessing as mp
import queue as queue_mod
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path

from bench.amqp_driver import AmqpDriver
from bench.brokers import Broker, MosquittoBroker, NotInstalled, RabbitMQBroker, VibeMQBroker
from bench.common import BenchError, Driver, percentiles_us
from bench.mqtt_driver import MqttDriver
from bench.vibemq_driver import VibeDriver

HOST = "127.0.0.1"
BIG_ADDRESS = "bigflow"
PING_ADDRESS = "pingpong"


# -- the big flow, in a child process (real clients) -------------------------------------------


def big_payload(size: int, seq: int) -> bytes:
    """``size`` bytes of valid JSON (the native protocol carries JSON): a string whose first
    characters number the message."""
    head = b'"%08d' % seq
    return head + b"x" * (size - len(head) - 1) + b'"'


def _mqtt_flow(port: int, size: int, count: int, timeout: float) -> int:
    import paho.mqtt.client as paho
    from paho.mqtt.enums import CallbackAPIVersion

    got: queue_mod.Queue[int] = queue_mod.Queue()
    sub = paho.Client(CallbackAPIVersion.VERSION2, client_id="big-sub")
    sub.on_message = lambda _c, _u, msg: got.put(len(msg.payload))
    sub.connect(HOST, port, keepalive=600)
    sub.loop_start()
    sub.subscribe(BIG_ADDRESS, 1)
    pub = paho.Client(CallbackAPIVersion.VERSION2, client_id="big-pub")
    pub.connect(HOST, port, keepalive=600)
    pub.loop_start()
    time.sleep(0.5)  # the subscription is in place (paho's SUBACK is asynchronous)
    done = 0
    try:
        for i in range(count):
            pub.publish(BIG_ADDRESS, big_payload(size, i), qos=1).wait_for_publish(timeout)
            if got.get(timeout=timeout) != size:
                raise BenchError("a big MQTT message arrived with the wrong size")
            done += 1
    finally:
        for c in (pub, sub):
            c.disconnect()
            c.loop_stop()
    return done


def _amqp_flow(port: int, size: int, count: int, timeout: float) -> int:
    import pika

    params = pika.ConnectionParameters(HOST, port, heartbeat=0, blocked_connection_timeout=timeout)
    pub = pika.BlockingConnection(params)
    sub = pika.BlockingConnection(params)
    pch = pub.channel()
    pch.confirm_delivery()
    pch.queue_declare(BIG_ADDRESS)
    sch = sub.channel()
    sch.basic_qos(prefetch_count=1)
    done = 0
    try:
        for i in range(count):
            pch.basic_publish("", BIG_ADDRESS, big_payload(size, i))
            for method, _props, body in sch.consume(BIG_ADDRESS, inactivity_timeout=timeout):
                if method is None:
                    raise BenchError("no big AMQP message within the timeout")
                sch.basic_ack(method.delivery_tag)
                if len(body) != size:
                    raise BenchError("a big AMQP message arrived with the wrong size")
                break
            done += 1
        sch.cancel()
    finally:
        pub.close()
        sub.close()
    return done


def _native_flow(port: int, size: int, count: int, timeout: float) -> int:
    from vibemq_server.client import Client

    async def run() -> int:
        pub = await Client.connect(HOST, port, reconnect=False, request_timeout=timeout)
        sub = await Client.connect(HOST, port, reconnect=False, request_timeout=timeout)
        done = 0
        try:
            await pub.create_queue(BIG_ADDRESS)
            subscription = await sub.subscribe(BIG_ADDRESS, prefetch=1)
            for i in range(count):
                await pub.publish(BIG_ADDRESS, big_payload(size, i))
                msg = await asyncio.wait_for(subscription.__anext__(), timeout)
                await msg.ack()
                if len(msg.raw) != size:
                    raise BenchError("a big native message arrived with the wrong size")
                done += 1
        finally:
            await pub.close()
            await sub.close()
        return done

    return asyncio.run(run())


FLOWS: dict[str, Callable[[int, int, int, float], int]] = {
    "mqtt": _mqtt_flow,
    "amqp": _amqp_flow,
    "native": _native_flow,
}


def _flow_main(
    protocol: str, port: int, size: int, count: int, timeout: float, out: Connection
) -> None:
    t0 = time.perf_counter()
    try:
        done = FLOWS[protocol](port, size, count, timeout)
        out.send((done, time.perf_counter() - t0, ""))
    except Exception as exc:  # reported by the parent
        out.send((0, time.perf_counter() - t0, repr(exc)))


# -- the ping-pong, in this process (raw generators) -------------------------------------------


@dataclass
class Result:
    broker: str
    protocol: str
    size: int
    big_messages: int = 0
    big_seconds: float = 0.0
    samples: int = 0
    idle_p50_us: float = 0.0
    idle_p99_us: float = 0.0
    p50_us: float = 0.0
    p99_us: float = 0.0
    max_us: float = 0.0
    peak_rss_mib: float = 0.0
    errors: list[str] = field(default_factory=list)


class PingPong:
    """Round trips of one small message at a time over two connections of one driver."""

    def __init__(self, driver: Driver) -> None:
        self.driver = driver
        self.sub = driver.connect_subscriber()
        self.pub = driver.connect_publisher()
        self.counter = driver.ack_counter()
        self.scanner = driver.delivery_scanner()
        self.seq = 0

    def once(self) -> int:
        frame = self.driver.publish_batch(self.seq, 1)
        self.seq += 1
        t0 = time.perf_counter_ns()
        self.pub.send(frame)
        while True:
            consumed, delivered, reply = self.scanner.feed(self.sub.buf)
            del self.sub.buf[:consumed]
            if delivered:
                break
            self.sub.fill()
        t1 = time.perf_counter_ns()
        if reply:
            self.sub.send(reply)
        acked = 0
        while not acked:
            consumed, acked = self.counter.feed(self.pub.buf)
            del self.pub.buf[:consumed]
            if not acked:
                self.pub.fill()
        return t1 - t0

    def close(self) -> None:
        self.driver.goodbye(self.pub)
        self.driver.goodbye(self.sub)


def _driver(protocol: str, broker: Broker) -> Driver:
    if protocol == "mqtt":
        port = broker.mqtt_port if isinstance(broker, VibeMQBroker) else broker.port
        return MqttDriver(HOST, port, PING_ADDRESS, name=broker.name)
    if protocol == "amqp":
        port = broker.amqp_port if isinstance(broker, VibeMQBroker) else broker.port
        return AmqpDriver(HOST, port, PING_ADDRESS, name=broker.name)
    return VibeDriver(HOST, broker.port, PING_ADDRESS, name=broker.name)


def _big_port(protocol: str, broker: Broker) -> int:
    if isinstance(broker, VibeMQBroker):
        return {"mqtt": broker.mqtt_port, "amqp": broker.amqp_port}.get(protocol, broker.port)
    return broker.port


def peak_rss_mib(broker: Broker) -> float:
    """VmHWM (peak resident set) summed over the broker's processes."""
    total = 0
    for pid in broker.pids():
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmHWM:"):
                    total += int(line.split()[1])
    return total / 1024


def measure(broker: Broker, protocol: str, args: argparse.Namespace) -> Result:
    result = Result(broker.name, protocol, args.size)
    ping = PingPong(_driver(protocol, broker))
    try:
        idle = [ping.once() for _ in range(args.idle_samples)]
        stats = percentiles_us(idle[len(idle) // 10 :])
        result.idle_p50_us, result.idle_p99_us = stats["p50_us"], stats["p99_us"]
        ctx = mp.get_context("spawn")
        mine, theirs = ctx.Pipe(duplex=False)
        child = ctx.Process(
            target=_flow_main,
            args=(
                protocol,
                _big_port(protocol, broker),
                args.size,
                args.count,
                args.timeout,
                theirs,
            ),
        )
        child.start()
        taken: list[int] = []
        deadline = time.monotonic() + args.timeout * (args.count + 1)
        # Bounded in count and time; samples until the big flow is done.
        while not mine.poll() and time.monotonic() < deadline and len(taken) < 10_000_000:
            taken.append(ping.once())
        if mine.poll(args.timeout):
            result.big_messages, result.big_seconds, error = mine.recv()
            if error:
                result.errors.append(error)
        else:
            result.errors.append("the big flow did not finish in time")
        child.join(10)
        if child.is_alive():
            child.kill()
        result.samples = len(taken)
        stats = percentiles_us(taken)
        result.p50_us, result.p99_us, result.max_us = (
            stats["p50_us"],
            stats["p99_us"],
            stats["max_us"],
        )
    except (BenchError, OSError) as exc:
        result.errors.append(repr(exc))
    finally:
        with contextlib.suppress(OSError):
            ping.close()
    result.peak_rss_mib = peak_rss_mib(broker)
    return result


@contextlib.contextmanager
def started(make: Callable[[], Broker]) -> Iterator[Broker | None]:
    try:
        broker = make()
        broker.start()
    except NotInstalled as exc:
        print(f"skipped: {exc}", file=sys.stderr)
        yield None
        return
    try:
        yield broker
    finally:
        broker.stop()


def targets(args: argparse.Namespace) -> list[tuple[str, Callable[[], Broker]]]:
    env = {"VIBEMQ_QUEUE_DEFAULTS__DURABLE": "false"}
    out: list[tuple[str, Callable[[], Broker]]] = []
    for protocol in args.protocols:
        out.append((protocol, lambda: VibeMQBroker(mqtt=True, amqp=True, env=env)))
        if args.peers and protocol == "mqtt":
            out.append((protocol, MosquittoBroker))
        if args.peers and protocol == "amqp":
            out.append((protocol, RabbitMQBroker))
    return out


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--protocols", nargs="+", default=["mqtt", "amqp", "native"], choices=FLOWS)
    p.add_argument("--size", type=int, default=64 * 1024 * 1024, help="bytes per big message")
    p.add_argument("--count", type=int, default=8, help="big messages per protocol and broker")
    p.add_argument("--idle-samples", type=int, default=500, help="round trips before the flow")
    p.add_argument("--timeout", type=float, default=60.0, help="seconds per big message")
    p.add_argument("--no-peers", dest="peers", action="store_false", help="VibeMQ only")
    p.add_argument("--json", type=Path, help="write the results here")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    results: list[Result] = []
    print(
        f"{'broker':10} {'proto':6} {'big msgs':>8} {'MB/s':>7} {'pings':>7} "
        f"{'idle p50':>9} {'p50 ms':>7} {'p99 ms':>7} {'max ms':>7} {'peak RSS MiB':>12}"
    )
    for protocol, make in targets(args):
        with started(make) as broker:
            if broker is None:
                continue
            r = measure(broker, protocol, args)
        results.append(r)
        rate = r.big_messages * r.size / 1e6 / r.big_seconds if r.big_seconds else 0.0
        print(
            f"{r.broker:10} {r.protocol:6} {r.big_messages:8} {rate:7.1f} {r.samples:7} "
            f"{r.idle_p50_us / 1000:9.2f} {r.p50_us / 1000:7.2f} {r.p99_us / 1000:7.2f} "
            f"{r.max_us / 1000:7.2f} {r.peak_rss_mib:12.0f}"
            + (f"  errors: {r.errors}" if r.errors else ""),
            flush=True,
        )
    if args.json:
        args.json.write_text(json.dumps([asdict(r) for r in results], indent=2))
    return 1 if any(r.errors for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
