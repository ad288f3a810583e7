"""MQTT side by side: Debian's Mosquitto and VibeMQ's MQTT listener, same load generator.

Each broker is started in turn on a free loopback port (or an already running one is targeted)
and measured with 64-byte payloads, MQTT 3.1.1, clean sessions:

* ``qos0-1to1``  -- QoS 0, 1 publisher -> 1 subscriber: deliveries/s and loss;
* ``qos1-1to1``  -- QoS 1, the publisher keeps ``--window`` PUBLISHes awaiting PUBACK, the
  subscriber (QoS 1 subscription) PUBACKs every delivery: deliveries/s;
* ``qos0-1to10`` -- QoS 0, 1 publisher -> 10 subscribers: total deliveries/s and loss;
* latency, QoS 0 and QoS 1: one message at a time, publish -> delivery, p50/p99;
* ``v5-...`` -- the same over MQTT 5.0 (every client CONNECTs at level 5; PUBLISHes carry an
  empty property block): ``v5-qos0-1to1``, ``v5-qos1-1to1``, ``v5-qos0-1to10``,
  ``v5-qos1-1to10``, and ``v5-shared4``: QoS 1, 1 publisher -> a shared subscription
  (``$share/bench/...``) of 4 subscribers, each message delivered once to one of them.

Load generator: raw sockets, no MQTT library. The publisher process writes pre-encoded PUBLISH
packets ``--batch`` at a time; the subscriber process (all subscribers of a scenario, one
selector loop) checks the framing of a whole read at once with strided slices (every
delivery has the same size), and builds the PUBACKs of a read the same way. Publisher and
subscribers run in separate ``spawn`` processes.

``--tls``: both brokers' TLS listeners instead (one self-signed certificate for both; the
load generator runs TLS over memory BIOs, common.TlsClient).

    .venv/bin/python -m bench.mqtt_bench --json mqtt.json
    .venv/bin/python -m bench.mqtt_bench --tls --scenarios qos0-1to1,qos1-1to1
    .venv/bin/python -m bench.mqtt_bench --only mosquitto --runs 1
    .venv/bin/python -m bench.mqtt_bench --target 127.0.0.1:1883
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing as mp
import os
import selectors
import socket
import struct
import sys
import tempfile
import time
import uuid
from dataclasses import asdict, dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, cast

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.brokers import Broker, MosquittoBroker, NotInstalled, VibeMQBroker, check_alive
from bench.common import (
    BenchError,
    BlockingConn,
    cpu_seconds,
    expect_report,
    format_num,
    install_sigterm_exit,
    leading_bytes,
    make_tls_cert,
    median_of,
    parse_target,
    percentiles_us,
    raise_nofile_limit,
    result_failed,
)
from bench.mqtt_driver import (
    CONNACK,
    PUBACK,
    PUBLISH,
    SUBACK,
    U16,
    packet,
    parse_header,
    read_packet,
)
from vibemq_server.adapters.mqtt.codec import encode_remaining_length

PAYLOAD_SIZE = 64
RECV_SIZE = 1 << 18
TS = struct.Struct(">Q")
BROKERS = ("mosquitto", "vibemq")


@dataclass(frozen=True)
class Scenario:
    name: str
    qos: int
    subscribers: int
    title: str
    #: the MQTT protocol level of every client (4 = 3.1.1, 5 = 5.0)
    version: int = 4
    #: the subscribers form one shared subscription group (each message goes to one)
    shared: bool = False


SCENARIOS = (
    Scenario("qos0-1to1", 0, 1, "QoS 0, 1 -> 1"),
    Scenario("qos1-1to1", 1, 1, "QoS 1, 1 -> 1"),
    Scenario("qos0-1to10", 0, 10, "QoS 0, 1 -> 10"),
    Scenario("v5-qos0-1to1", 0, 1, "MQTT 5, QoS 0, 1 -> 1", 5),
    Scenario("v5-qos1-1to1", 1, 1, "MQTT 5, QoS 1, 1 -> 1", 5),
    Scenario("v5-qos0-1to10", 0, 10, "MQTT 5, QoS 0, 1 -> 10", 5),
    Scenario("v5-qos1-1to10", 1, 10, "MQTT 5, QoS 1, 1 -> 10", 5),
    Scenario("v5-shared4", 1, 4, "MQTT 5, QoS 1, 1 -> shared group of 4", 5, shared=True),
)


@dataclass(frozen=True)
class Options:
    """What the worker processes need to know (picklable)."""

    host: str
    port: int
    window: int
    batch: int
    stall_s: float
    drain_s: float
    timeout_s: float
    coalesce_s: float = 0.0
    #: over TLS: the CA file that verifies the broker
    tls_ca: str | None = None
    coalesce_bytes: int = 16384


# --------------------------------------------------------------------------------------------
# wire


def _str16(value: bytes) -> bytes:
    return U16.pack(len(value)) + value


def mqtt_connect(
    host: str,
    port: int,
    role: str,
    timeout: float,
    tls_ca: str | None = None,
    version: int = 4,
) -> BlockingConn:
    """CONNECT (clean session / clean start, keep-alive 600 s) and wait for CONNACK;
    ``version`` 5: MQTT 5.0, no properties."""
    conn = BlockingConn(host, port, timeout=timeout, tls_ca=tls_ca)
    client_id = f"mb-{role}-{os.getpid()}-{uuid.uuid4().hex[:8]}".encode()
    props = b"\x00" if version == 5 else b""
    conn.send(
        packet(
            0x10,
            _str16(b"MQTT") + bytes((version, 0x02)) + U16.pack(600) + props + _str16(client_id),
        )
    )
    first, rest = read_packet(conn)
    if first != CONNACK or len(rest) < 2 or rest[1] != 0:
        conn.close()
        raise BenchError(f"MQTT CONNACK refused: {first:#x} {rest.hex()}")
    return conn


def mqtt_subscribe(conn: BlockingConn, topic: bytes, qos: int, version: int = 4) -> None:
    props = b"\x00" if version == 5 else b""
    conn.send(packet(0x82, U16.pack(1) + props + _str16(topic) + bytes((qos,))))
    first, rest = read_packet(conn)
    if first != SUBACK or len(rest) < 3 or rest[-1] != qos:
        raise BenchError(f"MQTT SUBACK for QoS {qos} refused or downgraded: {rest.hex()}")


def goodbye(conn: BlockingConn) -> None:
    with contextlib.suppress(OSError):
        conn.send(b"\xe0\x00")
    conn.close()


@dataclass(frozen=True)
class Layout:
    """The PUBLISH packets of one scenario, all the same size (broker-assigned packet ids
    included), as sent by the publisher and as delivered to the subscribers."""

    topic: bytes
    qos: int
    payload_size: int = PAYLOAD_SIZE
    #: MQTT 5.0: an empty property block after the packet id
    v5: bool = False
    #: what the subscribers subscribe to: the topic, or a shared subscription of it
    share: bytes = b""

    @property
    def version(self) -> int:
        return 5 if self.v5 else 4

    @property
    def props(self) -> bytes:
        return b"\x00" if self.v5 else b""

    @property
    def subscription(self) -> bytes:
        return self.share + self.topic

    @property
    def remaining(self) -> int:
        return 2 + len(self.topic) + (2 if self.qos else 0) + len(self.props) + self.payload_size

    @property
    def header(self) -> bytes:
        """Fixed header: type/flags byte and remaining length (the same for every packet)."""
        return bytes((PUBLISH | self.qos << 1,)) + encode_remaining_length(self.remaining)

    @property
    def size(self) -> int:
        return len(self.header) + self.remaining

    @property
    def pid_offset(self) -> int:
        return len(self.header) + 2 + len(self.topic)

    def encode(self, pid: int, payload: bytes) -> bytes:
        ident = U16.pack(pid) if self.qos else b""
        return self.header + _str16(self.topic) + ident + self.props + payload


class DeliveryScanner:
    """Counts the PUBLISH packets of a subscriber's byte stream and builds the PUBACKs for QoS
    1. Fast path: ``n`` whole packets of the scenario's size are checked at once, one strided
    slice per fixed-header byte (C speed); whatever does not fit takes the general path."""

    def __init__(self, layout: Layout) -> None:
        self.size = layout.size
        self.columns = [bytes((b,)) for b in layout.header]
        self.qos = layout.qos
        self.pid_offset = layout.pid_offset
        self.rest = b""
        self.delivered = 0
        self.others = 0

    def feed(self, data: bytes) -> bytes:
        """Scan ``data`` (after what was left over); return the PUBACK bytes to send."""
        buf = self.rest + data if self.rest else data
        end = len(buf)
        size = self.size
        pos = 0
        acks: list[bytes] = []
        while pos < end:
            n = (end - pos) // size
            if n:
                stop = pos + n * size
                k = n
                for i, col in enumerate(self.columns):
                    k = min(k, leading_bytes(buf[pos + i : stop : size], col))
                    if not k:
                        break
                if k:
                    stop = pos + k * size
                    if self.qos:
                        acks.append(self._pubacks(buf, pos, stop, k))
                    self.delivered += k
                    pos = stop
                    continue
            # general path: one packet of another shape (DUP flag, other topic, not a PUBLISH)
            hdr = parse_header(buf, pos)
            if hdr is None or end - pos < hdr[0] + hdr[1]:
                break
            first = buf[pos]
            if first & 0xF0 == PUBLISH:
                self.delivered += 1
                if first & 0x06:
                    vh = pos + hdr[0]
                    pid = vh + 2 + ((buf[vh] << 8) | buf[vh + 1])
                    acks.append(b"\x40\x02" + buf[pid : pid + 2])
            else:
                self.others += 1
            pos += hdr[0] + hdr[1]
        self.rest = buf[pos:]
        return b"".join(acks)

    def _pubacks(self, buf: bytes, pos: int, stop: int, k: int) -> bytes:
        out = bytearray(4 * k)
        out[0::4] = b"\x40" * k
        out[1::4] = b"\x02" * k
        pid = pos + self.pid_offset
        out[2::4] = buf[pid : stop : self.size]
        out[3::4] = buf[pid + 1 : stop : self.size]
        return bytes(out)


class PubackCounter:
    """Counts PUBACKs (``40 02 id id``) in the publisher's byte stream, 4 bytes at a stride."""

    def __init__(self) -> None:
        self.rest = b""
        self.acked = 0

    def feed(self, data: bytes) -> None:
        buf = self.rest + data if self.rest else data
        end = len(buf)
        pos = 0
        while pos < end:
            n = (end - pos) // 4
            if n:
                k = leading_bytes(buf[pos : pos + 4 * n : 4], b"\x40")
                if k:
                    k = leading_bytes(buf[pos + 1 : pos + 4 * k : 4], b"\x02")
                if k:
                    self.acked += k
                    pos += 4 * k
                    continue
            hdr = parse_header(buf, pos)
            if hdr is None or end - pos < hdr[0] + hdr[1]:
                break
            if buf[pos] & 0xF0 == PUBACK:
                self.acked += 1
            pos += hdr[0] + hdr[1]
        self.rest = buf[pos:]


# --------------------------------------------------------------------------------------------
# worker processes


@dataclass
class PubStats:
    sent: int = 0
    acked: int = 0
    reads: int = 0
    t_start_ns: int = 0
    t_written_ns: int = 0  # last byte handed to the kernel (QoS 1: last PUBACK read)
    t_closed_ns: int = 0  # the broker closed after our DISCONNECT: it read every PUBLISH
    cpu_s: float = 0.0
    error: str = ""


@dataclass
class SubStats:
    delivered: list[int] = field(default_factory=list)
    reads: int = 0
    t_first_ns: int = 0
    t_last_ns: int = 0
    cpu_s: float = 0.0
    error: str = ""


def encode_stream(layout: Layout, total: int, batch: int) -> bytes:
    """QoS 0: one write of ``batch`` identical packets, sent over and over; QoS 1: every
    packet, packet ids 1..65535 in turn (the window keeps fewer than 65,535 unacknowledged)."""
    payload = b"x" * layout.payload_size
    if layout.qos == 0:
        return layout.encode(0, payload) * min(batch, total)
    prefix = layout.header + _str16(layout.topic)
    ids = [U16.pack(i) for i in range(1, 65536)]
    payload = layout.props + payload
    return b"".join([prefix + ids[i % 65535] + payload for i in range(total)])


def _publish(
    conn: BlockingConn, layout: Layout, data: bytes, total: int, opts: Options, st: PubStats
) -> None:
    size = layout.size
    sock = conn.sock
    sock.settimeout(opts.stall_s)
    deadline = time.monotonic() + opts.timeout_s
    if layout.qos == 0:
        chunk = data
        st.t_start_ns = time.monotonic_ns()
        for start in range(0, total, opts.batch):
            n = min(opts.batch, total - start)
            conn.send(chunk if n == opts.batch else chunk[: n * size])
            st.sent += n
            if time.monotonic() > deadline:
                raise BenchError(f"timed out after {opts.timeout_s:.0f}s")
        st.t_written_ns = time.monotonic_ns()
        return
    # QoS 1: at most ``window`` unacknowledged; write when a batch fits
    blob = memoryview(data)
    counter = PubackCounter()
    step = max(1, min(opts.batch, opts.window // 10 or 1))
    sent = 0
    st.t_start_ns = time.monotonic_ns()
    while counter.acked < total:
        room = opts.window - (sent - counter.acked)
        while sent < total and room >= min(step, total - sent):
            n = min(step * (room // step) or room, total - sent)
            conn.send(blob[sent * size : (sent + n) * size])
            sent += n
            room -= n
        st.sent = sent
        try:
            data = conn.recv(RECV_SIZE)
        except TimeoutError:
            raise BenchError(
                f"no PUBACK for {opts.stall_s:.0f}s ({counter.acked}/{total} acked, {sent} sent)"
            ) from None
        if not data:
            raise BenchError(f"broker closed the publisher ({counter.acked}/{total} acked)")
        counter.feed(data)
        st.acked = counter.acked
        st.reads += 1
        if len(data) < 4 * step and opts.coalesce_s:
            time.sleep(opts.coalesce_s)  # let PUBACKs pile up: fewer, larger reads
        if time.monotonic() > deadline:
            raise BenchError(f"timed out after {opts.timeout_s:.0f}s")
    st.t_written_ns = time.monotonic_ns()


def _wait_closed(conn: BlockingConn, timeout: float) -> int:
    """DISCONNECT, half-close, wait for the broker's EOF: it has then read every PUBLISH."""
    sock = conn.sock
    with contextlib.suppress(OSError):
        conn.send(b"\xe0\x00")
        sock.shutdown(socket.SHUT_WR)
        sock.settimeout(timeout)
        while sock.recv(RECV_SIZE):
            pass
        return time.monotonic_ns()
    return 0


def publisher_main(opts: Options, layout: Layout, total: int, pipe: Connection) -> None:
    st = PubStats()
    cpu0 = time.process_time()
    conn: BlockingConn | None = None
    try:
        data = encode_stream(layout, total, opts.batch)
        conn = mqtt_connect(opts.host, opts.port, "pub", opts.stall_s, opts.tls_ca, layout.version)
        pipe.send(("ready", None))
        if not pipe.poll(60) or pipe.recv()[0] != "go":
            raise BenchError("no 'go'")
        cpu0 = time.process_time()
        _publish(conn, layout, data, total, opts, st)
        st.t_closed_ns = _wait_closed(conn, min(opts.stall_s, 5.0))
    except TimeoutError:
        what = "accepted no data" if st.t_start_ns else "did not answer CONNECT"
        st.error = f"publisher: the broker {what} for {opts.stall_s:.0f}s"
    except (BenchError, OSError) as exc:
        st.error = f"publisher: {exc}"
    finally:
        st.cpu_s = time.process_time() - cpu0
        if conn is not None:
            conn.close()
    pipe.send(("done", asdict(st)))


def _consume(
    conns: list[BlockingConn], layout: Layout, expected: int, opts: Options, pipe: Connection
) -> SubStats:
    st = SubStats()
    scanners = [DeliveryScanner(layout) for _ in conns]
    sel = selectors.DefaultSelector()
    for i, conn in enumerate(conns):
        conn.sock.settimeout(opts.stall_s)
        sel.register(conn.sock, selectors.EVENT_READ, i)
    sel.register(pipe, selectors.EVENT_READ, -1)
    start = time.monotonic()
    last_progress = start
    pub_done: float | None = None
    deadline = start + opts.timeout_s
    try:
        for i, conn in enumerate(conns):  # anything read along with the SUBACK
            if conn.buf:
                acks = scanners[i].feed(bytes(conn.buf))
                conn.buf.clear()
                if acks:
                    conn.send(acks)
        while True:
            events = sel.select(0.25)
            now = time.monotonic()
            progressed = 0
            for key, _ in events:
                i = key.data
                if i < 0:
                    msg = pipe.recv()
                    if msg[0] == "abort":
                        raise BenchError("stopped: the publisher failed")
                    pub_done = now
                    continue
                conn = conns[i]
                data = conn.recv(RECV_SIZE)
                if not data:
                    raise BenchError(f"the broker closed subscriber {i}")
                acks = scanners[i].feed(data)
                if acks:
                    conn.send(acks)
                progressed += len(data)
                st.reads += 1
            if progressed:
                st.t_last_ns = time.monotonic_ns()
                if not st.t_first_ns:
                    st.t_first_ns = st.t_last_ns
                last_progress = now
                if layout.share:  # a shared group: each message to one of them
                    if sum(s.delivered for s in scanners) >= expected:
                        break
                elif all(s.delivered >= expected for s in scanners):
                    break
                if progressed < opts.coalesce_bytes and opts.coalesce_s:
                    time.sleep(opts.coalesce_s)  # let deliveries pile up: fewer, larger reads
            if pub_done is not None:
                idle = now - max(last_progress, pub_done)
                if layout.qos == 0 and idle > opts.drain_s:
                    break  # QoS 0: what has not arrived by now is lost
            if now - last_progress > opts.stall_s:
                got = sum(s.delivered for s in scanners)
                raise BenchError(
                    f"no delivery for {opts.stall_s:.0f}s ({got}/{expected * len(conns)} "
                    "delivered): the broker stopped delivering"
                )
            if now > deadline:
                raise BenchError(f"timed out after {opts.timeout_s:.0f}s")
    except (BenchError, OSError) as exc:
        st.error = f"subscriber: {exc}"
    finally:
        sel.close()
    st.delivered = [s.delivered for s in scanners]
    return st


def subscriber_main(
    opts: Options, layout: Layout, count: int, expected: int, pipe: Connection
) -> None:
    conns: list[BlockingConn] = []
    try:
        for _ in range(count):
            conn = mqtt_connect(
                opts.host, opts.port, "sub", opts.stall_s, opts.tls_ca, layout.version
            )
            conns.append(conn)
            mqtt_subscribe(conn, layout.subscription, layout.qos, layout.version)
        pipe.send(("ready", None))
        if not pipe.poll(60) or pipe.recv()[0] != "go":
            raise BenchError("no 'go'")
        cpu0 = time.process_time()
        st = _consume(conns, layout, expected, opts, pipe)
        st.cpu_s = time.process_time() - cpu0
    except TimeoutError:
        st = SubStats(error=f"subscriber: no CONNACK/SUBACK within {opts.stall_s:.0f}s")
    except (BenchError, OSError) as exc:
        st = SubStats(error=f"subscriber: {exc}")
    for conn in conns:
        goodbye(conn)
    pipe.send(("done", asdict(st)))


# --------------------------------------------------------------------------------------------
# orchestration


@dataclass
class ScenarioResult:
    scenario: str
    messages: int
    subscribers: int
    expected: int = 0
    delivered: int = 0
    loss_pct: float = 0.0
    deliveries_per_s: float = 0.0
    publish_per_s: float = 0.0
    elapsed_s: float = 0.0
    publisher_cpu_s: float = 0.0
    subscriber_cpu_s: float = 0.0
    publisher_reads: int = 0
    subscriber_reads: int = 0
    broker_cpu_s: float | None = None
    errors: list[str] = field(default_factory=list)


def _expect_any(pipe: Connection, timeout: float) -> tuple[str, Any]:
    if not pipe.poll(timeout):
        raise BenchError(f"a worker did not report within {timeout:.0f}s")
    kind, value = pipe.recv()
    if kind == "done":
        return kind, value.get("error") if isinstance(value, dict) else value
    return kind, value


def run_scenario(
    scen: Scenario,
    opts: Options,
    messages: int,
    broker_pids: list[int] | None = None,
) -> ScenarioResult:
    ctx = mp.get_context("spawn")
    layout = Layout(
        f"bench/{uuid.uuid4().hex[:10]}".encode(),
        scen.qos,
        v5=scen.version == 5,
        share=b"$share/bench/" if scen.shared else b"",
    )
    res = ScenarioResult(
        scen.name,
        messages,
        scen.subscribers,
        expected=messages if scen.shared else messages * scen.subscribers,
    )
    sub_pipe, sub_child = ctx.Pipe()
    pub_pipe, pub_child = ctx.Pipe()
    sub = ctx.Process(
        target=subscriber_main,
        args=(opts, layout, scen.subscribers, messages, sub_child),
        name="mqtt-bench-sub",
        daemon=True,
    )
    pub = ctx.Process(
        target=publisher_main, args=(opts, layout, messages, pub_child), name="mqtt-bench-pub"
    )
    pub.daemon = True
    wait = opts.timeout_s + opts.stall_s + 30
    pub_st = PubStats()
    sub_st = SubStats()
    try:
        sub.start()
        pub.start()
        for pipe, who in ((sub_pipe, "subscriber"), (pub_pipe, "publisher")):
            kind, value = _expect_any(pipe, 60)
            if kind != "ready":
                raise BenchError(f"{who} did not start: {value}")
        cpu0 = cpu_seconds(broker_pids) if broker_pids else None
        sub_pipe.send(("go", None))
        pub_pipe.send(("go", None))
        pub_st = PubStats(**expect_report(pub_pipe, "done", wait))
        sub_pipe.send(("abort", None) if pub_st.error else ("pub_done", None))
        sub_st = SubStats(**expect_report(sub_pipe, "done", wait))
        if broker_pids and cpu0 is not None:
            res.broker_cpu_s = round(cpu_seconds(broker_pids) - cpu0, 2)
    except BenchError as exc:
        res.errors.append(str(exc))
    finally:
        for pipe in (pub_pipe, sub_pipe):  # no-op for a worker that is done
            with contextlib.suppress(OSError):
                pipe.send(("abort", None))
        for proc in (pub, sub):
            proc.join(timeout=10)
            if proc.is_alive():
                proc.kill()
                proc.join(timeout=5)
    for err in (pub_st.error, sub_st.error):
        if err:
            res.errors.append(err)
    res.delivered = sum(sub_st.delivered)
    res.publisher_cpu_s = round(pub_st.cpu_s, 2)
    res.subscriber_cpu_s = round(sub_st.cpu_s, 2)
    res.publisher_reads = pub_st.reads
    res.subscriber_reads = sub_st.reads
    if res.expected:
        res.loss_pct = max(0.0, 100.0 * (res.expected - res.delivered) / res.expected)
    t0 = pub_st.t_start_ns
    if t0 and sub_st.t_last_ns > t0:
        res.elapsed_s = (sub_st.t_last_ns - t0) / 1e9
        res.deliveries_per_s = res.delivered / res.elapsed_s
    if t0 and pub_st.t_written_ns > t0:
        res.publish_per_s = pub_st.sent / ((pub_st.t_written_ns - t0) / 1e9)
    if not res.errors and not res.delivered:
        res.errors.append("nothing was delivered")
    elif scen.qos and res.delivered < res.expected and not res.errors:
        res.errors.append(f"QoS 1: {res.expected - res.delivered} messages not delivered")
    return res


@dataclass
class LatencyResult:
    qos: int
    samples: int = 0
    p50_us: float = 0.0
    p95_us: float = 0.0
    p99_us: float = 0.0
    mean_us: float = 0.0
    min_us: float = 0.0
    max_us: float = 0.0
    errors: list[str] = field(default_factory=list)


def _next_publish(conn: BlockingConn) -> tuple[int, bytes]:
    """Read until a PUBLISH arrives: (its first byte, its bytes after the fixed header)."""
    while True:
        first, rest = read_packet(conn)
        if first & 0xF0 == PUBLISH:
            return first, rest


def run_latency(opts: Options, qos: int, samples: int, warmup: int) -> LatencyResult:
    """One message at a time: publish (perf_counter_ns in the payload) -> delivery at the
    subscriber (same process, same clock); for QoS 1 the subscriber's PUBACK and the
    publisher's PUBACK complete a round before the next one."""
    res = LatencyResult(qos)
    layout = Layout(f"bench/lat/{uuid.uuid4().hex[:10]}".encode(), qos)
    pad = b"x" * (layout.payload_size - TS.size)
    taken: list[int] = []
    clock = time.perf_counter_ns
    deadline = time.monotonic() + opts.timeout_s
    sub = pub = None
    try:
        sub = mqtt_connect(opts.host, opts.port, "lsub", opts.stall_s, opts.tls_ca)
        mqtt_subscribe(sub, layout.topic, qos)
        pub = mqtt_connect(opts.host, opts.port, "lpub", opts.stall_s, opts.tls_ca)
        for i in range(warmup + samples):
            if time.monotonic() > deadline:
                raise BenchError(f"timed out after {opts.timeout_s:.0f}s, {len(taken)} samples")
            pid = i % 65535 + 1
            pub.send(layout.encode(pid, TS.pack(clock()) + pad))
            first, rest = _next_publish(sub)
            t1 = clock()
            tlen = (rest[0] << 8) | rest[1]
            body = 2 + tlen + (2 if first & 0x06 else 0)
            if i >= warmup:
                taken.append(t1 - TS.unpack_from(rest, body)[0])
            if qos:
                sub.send(b"\x40\x02" + rest[2 + tlen : 4 + tlen])
                while read_packet(pub)[0] & 0xF0 != PUBACK:
                    pass
    except TimeoutError:
        res.errors.append(f"latency QoS {qos}: no answer within {opts.stall_s:.0f}s")
    except (BenchError, OSError) as exc:
        res.errors.append(f"latency QoS {qos}: {exc}")
    finally:
        for conn in (pub, sub):
            if conn is not None:
                goodbye(conn)
    res.samples = len(taken)
    for key, value in percentiles_us(taken).items():
        setattr(res, key, round(value, 1))
    return res


# --------------------------------------------------------------------------------------------
# per broker


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians over the runs of every headline number (failed runs left out)."""
    out: dict[str, Any] = {}
    for scen in SCENARIOS:
        ok = [r[scen.name] for r in runs if scen.name in r and not r[scen.name]["errors"]]
        timed = [r for r in ok if r["elapsed_s"]]
        out[scen.name] = {
            "deliveries_per_s": median_of([r["deliveries_per_s"] for r in ok]),
            "loss_pct": median_of([r["loss_pct"] for r in ok]),
            # of one core, over the timed interval: ~100% = the broker was the limit
            "broker_cpu_pct": median_of(
                [100 * r["broker_cpu_s"] / r["elapsed_s"] for r in timed if r["broker_cpu_s"]]
            ),
            "generator_cpu_pct": median_of(
                [
                    100 * (r["publisher_cpu_s"] + r["subscriber_cpu_s"]) / r["elapsed_s"]
                    for r in timed
                ]
            ),
            "ok_runs": len(ok),
        }
    for qos in (0, 1):
        key = f"latency-qos{qos}"
        ok = [r[key] for r in runs if key in r and not r[key]["errors"]]
        out[key] = {
            "p50_us": median_of([r["p50_us"] for r in ok]),
            "p99_us": median_of([r["p99_us"] for r in ok]),
            "ok_runs": len(ok),
        }
    return out


def _report(name: str, r: ScenarioResult) -> None:
    cpu = (
        f"cpu s: pub {r.publisher_cpu_s:.2f} sub {r.subscriber_cpu_s:.2f}"
        + (f" broker {r.broker_cpu_s:.2f}" if r.broker_cpu_s is not None else "")
        + f" in {r.elapsed_s:.2f}s; reads pub {r.publisher_reads:,} sub {r.subscriber_reads:,}"
    )
    print(
        f"[{name}] {r.scenario:<11} {r.deliveries_per_s:>10,.0f} deliveries/s  "
        f"{r.delivered:,}/{r.expected:,} (loss {r.loss_pct:.2f}%)  "
        f"publish {r.publish_per_s:,.0f}/s  {cpu}"
        + (f"  ERRORS: {'; '.join(r.errors)}" if r.errors else ""),
        flush=True,
    )


def bench_broker(name: str, args: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {"broker": name, "runs": []}
    broker: Broker | None = None
    target: str | None = args.target if name == "target" else getattr(args, f"{name}_port")
    try:
        if target:
            host, port = parse_target(str(target), args.host)
        else:
            broker = make_broker(name, args)
            t0 = time.monotonic()
            broker.start()
            out["startup_s"] = round(time.monotonic() - t0, 2)
            host = broker.host
            if args.tls_cert is not None:
                if isinstance(broker, VibeMQBroker):
                    port = broker.mqtt_tls_port
                else:
                    port = cast(MosquittoBroker, broker).tls_port
            else:
                port = broker.mqtt_port if isinstance(broker, VibeMQBroker) else broker.port
        over = " over TLS" if args.tls_cert is not None else ""
        print(f"[{name}] MQTT{over} on {host}:{port}", flush=True)
        opts = Options(
            host=host,
            port=port,
            window=args.window,
            batch=args.batch,
            stall_s=args.stall,
            drain_s=args.drain,
            timeout_s=args.timeout,
            coalesce_s=args.coalesce_us / 1e6,
            tls_ca=str(args.tls_cert) if args.tls_cert is not None else None,
        )
        if args.warmup:
            warm = run_scenario(SCENARIOS[0], opts, args.warmup)
            if warm.errors:
                raise BenchError(f"warm-up failed: {'; '.join(warm.errors)}")
        for run in range(args.runs):
            one: dict[str, Any] = {"run": run + 1}
            out["runs"].append(one)
            for scen in SCENARIOS:
                if scen.name not in args.scenarios:
                    continue
                messages = args.fanout_messages if scen.subscribers > 1 else args.messages
                pids = broker.pids() if broker is not None else None
                res = run_scenario(scen, opts, messages, pids)
                _report(name, res)
                one[scen.name] = asdict(res)
                check_alive(broker)
            for qos in (0, 1) if args.samples else ():
                lat = run_latency(opts, qos, args.samples, args.latency_warmup)
                print(
                    f"[{name}] latency QoS {qos}: p50 {lat.p50_us:.0f}us "
                    f"p99 {lat.p99_us:.0f}us ({lat.samples} samples)"
                    + (f"  ERRORS: {'; '.join(lat.errors)}" if lat.errors else ""),
                    flush=True,
                )
                one[f"latency-qos{qos}"] = asdict(lat)
                check_alive(broker)
        if broker is not None:
            out["broker_rss_kib"] = broker.rss_kib()
    except NotInstalled as exc:
        out["skipped"] = str(exc)
        print(f"[{name}] SKIPPED: {exc}", flush=True)
    except (BenchError, OSError) as exc:
        out["error"] = str(exc)
        print(f"[{name}] FAILED: {exc}", flush=True)
        if broker is not None and os.environ.get("BENCH_SHOW_LOG"):
            print(broker.log_tail(), flush=True)
    finally:
        if broker is not None:
            broker.stop()
    out["median"] = summarize(out["runs"])
    return out


def make_broker(name: str, args: argparse.Namespace) -> Broker:
    tls = (args.tls_cert, args.tls_key) if args.tls_cert is not None else None
    if name == "mosquitto":
        return MosquittoBroker(inflight=args.inflight, tls=tls)
    # the same queueing limits as the generated mosquitto.conf
    env = {
        "VIBEMQ_MQTT__MAX_INFLIGHT": str(args.inflight),
        "VIBEMQ_MQTT__MAX_QUEUED_MESSAGES": "10000000",
    }
    return VibeMQBroker(extra_args=args.server_arg, mqtt=True, env=env, tls=tls)


# --------------------------------------------------------------------------------------------
# table


def print_table(results: list[dict[str, Any]]) -> None:
    names = [r["broker"] for r in results]
    rows: list[tuple[str, str, str]] = []  # label, section, key
    for scen in SCENARIOS:
        rows.append((f"{scen.title} deliveries/s", scen.name, "deliveries_per_s"))
    for scen in SCENARIOS:
        if scen.qos == 0:
            rows.append((f"{scen.title} loss", scen.name, "loss_pct"))
    for scen in SCENARIOS:
        rows.append((f"{scen.title} broker CPU", scen.name, "broker_cpu_pct"))
        rows.append((f"{scen.title} load gen CPU", scen.name, "generator_cpu_pct"))
    for qos in (0, 1):
        rows.append((f"latency QoS {qos} p50 us", f"latency-qos{qos}", "p50_us"))
        rows.append((f"latency QoS {qos} p99 us", f"latency-qos{qos}", "p99_us"))
    ratio = "vibemq" in names and "mosquitto" in names
    header = f"{'':<28}" + "".join(f"{n:>14}" for n in names)
    if ratio:
        header += f"{'vibemq/mosq':>13}"
    print()
    print(header)
    print("-" * len(header))
    by_name = {r["broker"]: r for r in results}
    for label, section, key in rows:
        unit = "%" if key == "loss_pct" else "cpu" if key.endswith("cpu_pct") else ""
        values = {n: by_name[n]["median"].get(section, {}).get(key) for n in names}
        line = f"{label:<28}" + "".join(f"{format_num(values[n], unit):>14}" for n in names)
        if ratio:
            ours, theirs = values["vibemq"], values["mosquitto"]
            cell = f"{ours / theirs:.2f}x" if ours and theirs and not unit else "-"
            line += f"{cell:>13}"
        print(line)
    for r in results:
        why = r.get("skipped") or r.get("error")
        if why:
            print(f"{r['broker']}: {why}")
        for run in r["runs"]:
            for phase, value in run.items():
                if phase != "run" and value["errors"]:
                    print(f"{r['broker']} run {run['run']} {phase}: {value['errors'][0]}")
    print()
    print("medians of successful runs; deliveries/s: higher is better; latency: lower is better;")
    print("CPU: % of one core over the timed interval (broker ~100%: the broker was the limit)")


# --------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--only", choices=BROKERS, help="measure one broker only")
    p.add_argument("--messages", type=int, default=200_000, help="published per 1->1 scenario")
    p.add_argument(
        "--fanout-messages",
        type=int,
        help="published in the 1->10 scenario (default --messages/4; x10 deliveries)",
    )
    p.add_argument("--runs", type=int, default=3, help="median of this many runs")
    p.add_argument(
        "--scenarios",
        default=",".join(s.name for s in SCENARIOS),
        help="comma list (default: all)",
    )
    p.add_argument("--window", type=int, default=1000, help="QoS 1 PUBLISHes awaiting PUBACK")
    p.add_argument("--batch", type=int, default=500, help="PUBLISH packets per write")
    p.add_argument(
        "--inflight",
        type=int,
        default=1000,
        help="brokers' QoS 1 window towards a subscriber (max_inflight_messages)",
    )
    p.add_argument(
        "--coalesce-us",
        type=float,
        default=200.0,
        help="after a small read, sleep this long so that the next read is larger (0 = off)",
    )
    p.add_argument("--warmup", type=int, default=20_000, help="untimed QoS 0 messages first")
    p.add_argument("--samples", type=int, default=2000, help="latency round trips per QoS")
    p.add_argument("--latency-warmup", type=int, default=200)
    p.add_argument("--stall", type=float, default=20.0, help="fail after this long idle, s")
    p.add_argument("--drain", type=float, default=2.0, help="QoS 0: wait after the last, s")
    p.add_argument("--timeout", type=float, default=120.0, help="per scenario, s")
    p.add_argument("--host", default="127.0.0.1", help="for --vibemq-port/--mosquitto-port")
    p.add_argument("--vibemq-port", type=int, help="MQTT port of a running VibeMQ")
    p.add_argument("--mosquitto-port", type=int, help="port of a running Mosquitto")
    p.add_argument("--target", help="host:port: measure just this MQTT server")
    p.add_argument("--server-arg", action="append", default=[], help="for vibemq-server")
    p.add_argument(
        "--tls",
        action="store_true",
        help="both brokers' TLS listeners (a self-signed certificate made with openssl)",
    )
    p.add_argument("--json", type=Path, help="write the results here")
    args = p.parse_args(argv)
    if not 0 < args.window < 65535:
        p.error("--window must be in 1..65534 (MQTT packet ids)")
    if args.messages < 1 or args.runs < 1 or args.batch < 1:
        p.error("--messages, --runs and --batch must be positive")
    if args.fanout_messages is None:
        args.fanout_messages = max(1, args.messages // 4)
    args.scenarios = [s.strip() for s in args.scenarios.split(",") if s.strip()]
    for s in args.scenarios:
        if s not in {sc.name for sc in SCENARIOS}:
            p.error(f"unknown scenario {s!r}")
    install_sigterm_exit()
    raise_nofile_limit()
    args.tls_cert = args.tls_key = None
    if args.tls:
        if args.target or args.vibemq_port or args.mosquitto_port:
            p.error("--tls measures brokers the bench starts")
        cert_dir = Path(tempfile.mkdtemp(prefix="bench-tls-"))
        os.chmod(cert_dir, 0o755)
        args.tls_cert, args.tls_key = make_tls_cert(cert_dir)
    names = ["target"] if args.target else [args.only] if args.only else list(BROKERS)
    results = [bench_broker(n, args) for n in names]
    print_table(results)
    if args.json:
        doc = {
            "settings": {
                "payload_bytes": PAYLOAD_SIZE,
                "messages": args.messages,
                "fanout_messages": args.fanout_messages,
                "runs": args.runs,
                "window": args.window,
                "batch": args.batch,
                "inflight": args.inflight,
                "latency_samples": args.samples,
                "cpus": os.cpu_count(),
                "tls": args.tls,
            },
            "results": results,
        }
        args.json.write_text(json.dumps(doc, indent=2) + "\n")
        print(f"wrote {args.json}")
    return 1 if any(result_failed(r) for r in results) else 0


if __name__ == "__main__":
    raise SystemExit(main())
