"""Idle connections: broker memory per connection and connect rate, per protocol, side by side.

For each protocol (MQTT 3.1.1, native VibeMQ, AMQP 0-9-1) and each count (default 1,000 /
5,000 / 15,000) a fresh broker is started, its RSS read, and ``count`` connections opened by
several client processes (raw asyncio protocols, each connection only does its handshake:
MQTT CONNECT/CONNACK; native Connect/ConnectAck; AMQP header .. Open-Ok and Channel.Open-Ok),
then held idle. Reported: the broker's RSS growth per connection (flat across counts?), the
connect rate (connections/s over the whole batch, all client processes at once), and whether a
fresh client still gets service at that count (a publish -> consume round trip on a new
connection). Mosquitto (MQTT) and RabbitMQ (AMQP) are measured the same way in the same run.

    .venv/bin/python -m bench.idle_conns                       # everything
    .venv/bin/python -m bench.idle_conns --counts 1000 --protocols mqtt --brokers vibemq
    .venv/bin/python -m bench.idle_conns --protocols mqtt --brokers vibemq,mosquitto \\
        --counts 1000,5000 --rounds 5     # connect rate: medians of alternating rounds

Every wait is bounded; loopback only. The bench raises its own RLIMIT_NOFILE to the hard limit
(the client processes and the brokers inherit it) and spreads the connections over
``--procs`` client processes so that none runs out of descriptors.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import multiprocessing as mp
import os
import socket
import statistics
import struct
import sys
import time
from collections.abc import Callable, Generator
from dataclasses import asdict, dataclass, field
from multiprocessing.connection import Connection

from bench import amqp_driver as amqp
from bench import mqtt_driver as mqtt
from bench import vibemq_driver as native
from bench.brokers import (
    Broker,
    MosquittoBroker,
    NotInstalled,
    RabbitMQBroker,
    VibeMQBroker,
)
from bench.common import (
    BenchError,
    BlockingConn,
    cpu_seconds,
    install_sigterm_exit,
    raise_nofile_limit,
)

#: a handshake: a generator that yields the bytes to send and is sent each complete reply
Script = Generator[bytes, bytes, None]
#: the length of the first complete frame in a buffer (0: not complete yet)
Splitter = Callable[[bytes | bytearray], int]


# --------------------------------------------------------------------------------------------
# handshakes, per protocol


def mqtt_script(i: int) -> Script:
    """CONNECT (clean session, keep-alive 600 s), CONNACK accepted."""
    cid = f"idle-{os.getpid()}-{i}".encode()
    reply = yield mqtt.packet(0x10, mqtt._s(b"MQTT") + b"\x04\x02" + b"\x02\x58" + mqtt._s(cid))
    if reply[:1] != b"\x20" or reply[-1:] != b"\x00":
        raise BenchError(f"CONNACK refused: {reply.hex()}")


def mqtt_split(buf: bytes | bytearray) -> int:
    hdr = mqtt.parse_header(buf, 0)
    if hdr is None or len(buf) < hdr[0] + hdr[1]:
        return 0
    return hdr[0] + hdr[1]


def native_script(i: int) -> Script:
    """Connect, ConnectAck."""
    reply = yield native.frame(native.CONNECT, f"idle-{os.getpid()}-{i}", headers={})
    if reply[5] != native.CONNECT_ACK:
        raise BenchError(f"Connect refused: {reply[5]}")


def native_split(buf: bytes | bytearray) -> int:
    if len(buf) < 4:
        return 0
    n = 4 + int.from_bytes(buf[:4], "big")
    return n if len(buf) >= n else 0


def _amqp_method(reply: bytes, cls: int, meth: int) -> bytes:
    if reply[0] != amqp.FRAME_METHOD or amqp.MID.unpack_from(reply, 7) != (cls, meth):
        raise BenchError(f"AMQP: expected {cls}.{meth}, got {reply[:16].hex()}")
    return reply[11:-1]


def amqp_script(_i: int) -> Script:
    """Header, Start/Start-Ok (PLAIN guest/guest), Tune/Tune-Ok (heartbeats off), Open/
    Open-Ok, Channel.Open/Open-Ok on channel 1: what a client library does before its first
    declare."""
    reply = yield b"AMQP\x00\x00\x09\x01"
    _amqp_method(reply, 10, 10)
    props = b"\x07productS" + amqp.longstr(b"vibemq-idle")
    start_ok = (
        amqp.U32.pack(len(props))
        + props
        + amqp.shortstr(b"PLAIN")
        + amqp.longstr(b"\x00guest\x00guest")
        + amqp.shortstr(b"en_US")
    )
    reply = yield amqp.method(0, 10, 11, start_ok)
    channel_max, frame_max, _hb = struct.unpack_from(">HIH", _amqp_method(reply, 10, 30), 0)
    tune_ok = amqp.method(0, 10, 31, struct.pack(">HIH", channel_max or 2047, frame_max, 0))
    opened = amqp.method(0, 10, 40, amqp.shortstr(b"/") + amqp.shortstr(b"") + b"\x00")
    reply = yield tune_ok + opened
    _amqp_method(reply, 10, 41)
    reply = yield amqp.method(1, 20, 10, amqp.shortstr(b""))
    _amqp_method(reply, 20, 11)


def amqp_split(buf: bytes | bytearray) -> int:
    if len(buf) < 7:
        return 0
    n = 8 + int.from_bytes(buf[3:7], "big")
    return n if len(buf) >= n else 0


PROTOCOLS: dict[str, tuple[Callable[[int], Script], Splitter]] = {
    "mqtt": (mqtt_script, mqtt_split),
    "native": (native_script, native_split),
    "amqp": (amqp_script, amqp_split),
}


# --------------------------------------------------------------------------------------------
# client processes: open connections, hold them, close on request


class IdleClient(asyncio.Protocol):
    """One connection: runs its handshake script, then stays idle (what arrives is dropped)."""

    __slots__ = ("buf", "done", "script", "split", "transport")

    def __init__(self, script: Script, split: Splitter, done: asyncio.Future[None]) -> None:
        self.script = script
        self.split = split
        self.done = done
        self.buf = bytearray()
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.transport.write(next(self.script))  # type: ignore[union-attr]

    def data_received(self, data: bytes) -> None:
        if self.done.done():
            return
        self.buf += data
        while (n := self.split(self.buf)) > 0:
            reply = bytes(self.buf[:n])
            del self.buf[:n]
            try:
                out = self.script.send(reply)
            except StopIteration:
                self.buf = bytearray()
                self.done.set_result(None)
                return
            except BenchError as exc:
                self.done.set_exception(exc)
                return
            assert self.transport is not None
            self.transport.write(out)

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.done.done():
            self.done.set_exception(BenchError(f"closed during the handshake: {exc!r}"))


async def _open_many(
    protocol: str, host: str, port: int, first: int, count: int, inflight: int, timeout: float
) -> tuple[list[asyncio.Transport], int, list[str]]:
    script, split = PROTOCOLS[protocol]
    loop = asyncio.get_running_loop()
    sem = asyncio.Semaphore(inflight)
    held: list[asyncio.Transport] = []
    errors: list[str] = []
    failed = 0

    async def one(i: int) -> None:
        nonlocal failed
        async with sem:
            done: asyncio.Future[None] = loop.create_future()
            try:
                transport, _ = await loop.create_connection(
                    lambda: IdleClient(script(i), split, done), host, port
                )
            except OSError as exc:
                failed += 1
                if len(errors) < 3:
                    errors.append(repr(exc))
                return
            try:
                await done
            except BenchError as exc:
                failed += 1
                transport.close()
                if len(errors) < 3:
                    errors.append(str(exc))
                return
            held.append(transport)

    tasks = [asyncio.ensure_future(one(first + i)) for i in range(count)]
    _done, pending = await asyncio.wait(tasks, timeout=timeout)
    for task in pending:
        task.cancel()
    failed += len(pending)
    return held, failed, errors


def client_main(
    conn: Connection, protocol: str, host: str, port: int, first: int, count: int, timeout: float
) -> None:
    """A client process: wait for "go", open ``count`` connections, report, hold them until
    told to close (or for at most ``timeout`` more seconds)."""
    raise_nofile_limit()
    import uvloop

    async def main() -> None:
        loop = asyncio.get_running_loop()
        conn.send("ready")
        if not await loop.run_in_executor(None, conn.poll, 60):
            return
        conn.recv()
        t0 = time.monotonic()
        held, failed, errors = await _open_many(protocol, host, port, first, count, 64, timeout)
        conn.send(
            {
                "opened": len(held),
                "failed": failed,
                "errors": errors,
                "t0": t0,
                "t1": time.monotonic(),
            }
        )
        await loop.run_in_executor(None, conn.poll, timeout)
        for transport in held:
            transport.abort()  # RST: no TIME_WAIT left behind on the client's ports
        await asyncio.sleep(0.2)

    uvloop.run(main())


# --------------------------------------------------------------------------------------------
# a fresh client's round trip while the idle ones are held


def _roundtrip_mqtt(host: str, port: int) -> None:
    sub = mqtt.MqttDriver(host, port, "idle/check")
    conn = sub.connect_subscriber()
    try:
        conn.send(mqtt.packet(0x32, mqtt._s(b"idle/check") + b"\x00\x07" + b"ping"))
        seen = set()
        for _ in range(10):
            first, _rest = mqtt.read_packet(conn)
            seen.add(first & 0xF0)
            if mqtt.PUBLISH in seen and mqtt.PUBACK in seen:
                return
        raise BenchError(f"MQTT round trip: got {seen}")
    finally:
        sub.goodbye(conn)


def _roundtrip_native(host: str, port: int) -> None:
    conn = BlockingConn(host, port)
    try:
        native.handshake(conn, "check")
        native.request(
            conn, native.frame(native.SUBSCRIBE, "s1", "idle.check"), native.SUBSCRIBE_ACK
        )
        conn.send(native.frame(native.PUBLISH, "m1", "idle.check", b'"ping"'))
        for _ in range(10):
            msg = native.read_message(conn)
            if msg.type == native.DELIVER:
                return
        raise BenchError("native round trip: no Deliver")
    finally:
        conn.close()


def _roundtrip_amqp(host: str, port: int) -> None:
    conn = amqp.connect(host, port)
    try:
        amqp.queue_declare(conn, b"idle.check")
        amqp.basic_consume(conn, b"idle.check", b"c1")
        conn.send(amqp.encode_publish(b"idle.check", b"ping"))
        for _ in range(10):
            kind, _ch, payload = amqp.read_frame(conn)
            if kind == amqp.FRAME_METHOD and amqp.MID.unpack_from(payload, 0) == (60, 60):
                return
        raise BenchError("AMQP round trip: no Basic.Deliver")
    finally:
        amqp.close_connection(conn, 2.0)


ROUNDTRIPS: dict[str, Callable[[str, int], None]] = {
    "mqtt": _roundtrip_mqtt,
    "native": _roundtrip_native,
    "amqp": _roundtrip_amqp,
}


# --------------------------------------------------------------------------------------------
# one measurement


@dataclass
class Point:
    broker: str
    protocol: str
    count: int
    opened: int = 0
    failed: int = 0
    connect_s: float = 0.0
    connects_per_s: float = 0.0
    #: the broker's CPU (user + system) per connection opened, from "go" to the last
    #: client's report: steadier than the rate on a busy machine (it does not count the
    #: time the broker waited for the clients or for a core)
    broker_cpu_us_per_conn: float | None = None
    rss_before_kib: int = 0
    rss_after_kib: int = 0
    bytes_per_conn: float = 0.0
    roundtrip_ms: float | None = None
    #: the kernel's slab memory growth per connection, machine-wide, both ends of each
    #: loopback connection (and whatever else ran meanwhile): a rough figure, not RSS
    kernel_slab_per_conn: float = 0.0
    errors: list[str] = field(default_factory=list)


def _slab_kib() -> int:
    """The kernel's slab memory (/proc/meminfo ``Slab``), KiB: where socket structures live."""
    with open("/proc/meminfo") as fh:
        for line in fh:
            if line.startswith("Slab:"):
                return int(line.split()[1])
    return 0


def _settle_rss(broker: Broker, wait: float = 1.0) -> int:
    """The broker's RSS once it has stopped moving (at most ``wait`` x 5 seconds)."""
    last = broker.rss_kib() or 0
    for _ in range(5):
        time.sleep(wait)
        now = broker.rss_kib() or 0
        if abs(now - last) < 64:
            return now
        last = now
    return last


def measure(
    broker: Broker, name: str, protocol: str, port: int, count: int, procs: int, timeout: float
) -> Point:
    point = Point(name, protocol, count)
    point.rss_before_kib = _settle_rss(broker, 0.5)
    slab_before = _slab_kib()
    ctx = mp.get_context("spawn")
    pipes: list[Connection] = []
    children = []
    per = [count // procs + (1 if i < count % procs else 0) for i in range(procs)]
    first = 0
    for n in per:
        parent, child = ctx.Pipe()
        proc = ctx.Process(
            target=client_main,
            args=(child, protocol, broker.host, port, first, n, timeout),
            daemon=True,
        )
        proc.start()
        pipes.append(parent)
        children.append(proc)
        first += n
    try:
        for pipe in pipes:
            if not pipe.poll(60) or pipe.recv() != "ready":
                raise BenchError("a client process did not start")
        pids = broker.pids()
        cpu_before = cpu_seconds(pids)
        for pipe in pipes:
            pipe.send("go")
        reports = []
        for pipe in pipes:
            if not pipe.poll(timeout + 30):
                raise BenchError("a client process did not report")
            reports.append(pipe.recv())
        point.opened = sum(r["opened"] for r in reports)
        point.failed = sum(r["failed"] for r in reports)
        point.errors = [e for r in reports for e in r["errors"]][:5]
        point.connect_s = max(r["t1"] for r in reports) - min(r["t0"] for r in reports)
        point.connects_per_s = point.opened / point.connect_s if point.connect_s else 0.0
        if point.opened:
            cpu = cpu_seconds(pids) - cpu_before
            point.broker_cpu_us_per_conn = cpu * 1e6 / point.opened
        point.rss_after_kib = _settle_rss(broker)
        point.kernel_slab_per_conn = (_slab_kib() - slab_before) * 1024 / max(1, point.opened)
        if point.opened:
            point.bytes_per_conn = (
                (point.rss_after_kib - point.rss_before_kib) * 1024 / point.opened
            )
        t = time.monotonic()
        try:
            ROUNDTRIPS[protocol](broker.host, port)
            point.roundtrip_ms = (time.monotonic() - t) * 1000
        except (BenchError, OSError) as exc:
            point.errors.append(f"round trip: {exc!r}")
    finally:
        for pipe in pipes:
            with contextlib.suppress(OSError):
                pipe.send("close")
        for proc in children:
            proc.join(30)
            if proc.is_alive():
                proc.kill()
    return point


def _start(name: str, protocol: str) -> tuple[Broker, int]:
    if name == "vibemq":
        broker = VibeMQBroker(
            extra_args=["--max-connections", "100000", "--keepalive-timeout", "3600"],
            mqtt=protocol == "mqtt",
            amqp=protocol == "amqp",
        )
        broker.start()
        port = {"mqtt": broker.mqtt_port, "amqp": broker.amqp_port}.get(protocol, broker.port)
        return broker, port
    other: Broker = MosquittoBroker() if name == "mosquitto" else RabbitMQBroker()
    other.start()
    return other, other.port


PEERS = {"mqtt": "mosquitto", "amqp": "rabbitmq"}


def _one(name: str, protocol: str, count: int, args: argparse.Namespace) -> Point | None:
    """One measurement on a fresh broker (None: the broker is not installed)."""
    try:
        broker, port = _start(name, protocol)
    except NotInstalled as exc:
        print(f"skip {name}: {exc}", flush=True)
        return None
    try:
        point = measure(broker, name, protocol, port, count, args.procs, args.timeout)
    finally:
        broker.stop()
    rt = f"{point.roundtrip_ms:.1f} ms" if point.roundtrip_ms is not None else "FAILED"
    cpu = point.broker_cpu_us_per_conn
    cpu_us = "?" if cpu is None else f"{cpu:,.0f}"
    print(
        f"{protocol:6} {name:9} {count:6,}: {point.opened:,} open "
        f"({point.failed} failed) in {point.connect_s:.2f}s = "
        f"{point.connects_per_s:,.0f} conn/s; broker CPU {cpu_us} µs/conn; RSS +"
        f"{(point.rss_after_kib - point.rss_before_kib) / 1024:.1f} MiB = "
        f"{point.bytes_per_conn:,.0f} B/conn; fresh round trip {rt}; kernel slab "
        f"{point.kernel_slab_per_conn:,.0f} B/conn (both ends)"
        + (f"; errors {point.errors}" if point.errors else ""),
        flush=True,
    )
    return point


def _print_rates(
    protocol: str,
    count: int,
    names: list[str],
    rounds: list[dict[str, float]],
    cpus: dict[str, list[float]],
) -> None:
    """The median connect rate of the rounds per broker, and ours against the peer's: the
    median of the rounds' own ratios (a round's brokers met about the same load); and the
    median broker CPU per connection."""
    line = ", ".join(
        f"{n} {statistics.median(r):,.0f}"
        for n in names
        if (r := [rates[n] for rates in rounds if n in rates])
    )
    if len(names) > 1:
        peer = names[1]
        ratios = [r["vibemq"] / r[peer] for r in rounds if "vibemq" in r and r.get(peer)]
        if ratios:
            line += (
                f"; vibemq/{peer} median {statistics.median(ratios):.2f}x"
                f" (rounds {', '.join(f'{x:.2f}' for x in ratios)})"
            )
    line += "; broker CPU µs/conn " + ", ".join(
        f"{n} {statistics.median(c):,.0f}" for n, c in cpus.items() if c
    )
    print(f"{protocol:6} {count:6,} connect rate, {len(rounds)} rounds: {line}", flush=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--counts", default="1000,5000,15000")
    p.add_argument("--protocols", default="mqtt,native,amqp")
    p.add_argument("--brokers", default="vibemq,mosquitto,rabbitmq")
    p.add_argument("--procs", type=int, default=4, help="client processes per measurement")
    p.add_argument("--timeout", type=float, default=120.0, help="per batch of connections")
    p.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="measure each count this many times, brokers alternating first; median rates",
    )
    p.add_argument("--json", help="write the points here")
    args = p.parse_args(argv)
    install_sigterm_exit()
    limit = raise_nofile_limit()
    counts = [int(c) for c in args.counts.split(",") if c]
    brokers = set(args.brokers.split(","))
    print(f"RLIMIT_NOFILE {limit}; counts {counts}", flush=True)
    points: list[Point] = []
    for protocol in args.protocols.split(","):
        names = ["vibemq"] + ([PEERS[protocol]] if PEERS.get(protocol) in brokers else [])
        names = [n for n in names if n in brokers]
        for count in counts:
            rounds: list[dict[str, float]] = []
            cpus: dict[str, list[float]] = {n: [] for n in names}
            for rnd in range(args.rounds):
                rates = {}
                # alternate who goes first: on a busy machine the load drifts within a round
                for name in names if rnd % 2 == 0 else names[::-1]:
                    point = _one(name, protocol, count, args)
                    if point is None:
                        continue
                    points.append(point)
                    if point.opened and not point.failed:
                        rates[name] = point.connects_per_s
                        if point.broker_cpu_us_per_conn is not None:
                            cpus[name].append(point.broker_cpu_us_per_conn)
                rounds.append(rates)
            if args.rounds > 1:
                _print_rates(protocol, count, names, rounds, cpus)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump([asdict(pt) for pt in points], fh, indent=2)
    return 0


if __name__ == "__main__":
    socket.setdefaulttimeout(30)
    sys.exit(main())
