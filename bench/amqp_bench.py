"""AMQP 0-9-1 side by side: Debian's RabbitMQ and VibeMQ's AMQP listener, same load generator.

Each broker is started in turn on a free loopback port (or an already running one is targeted)
and measured with 64-byte bodies, one publisher connection -> one consumer connection through
the default exchange into a fresh queue per phase:

* ``transient`` -- non-durable queue, transient messages, no publisher confirms: the publisher
  writes ``--messages`` publishes as fast as the broker reads them (TCP back-pressure only,
  bounded by the count); the consumer (``--prefetch``, manual acks) acknowledges with
  ``multiple`` set: one Basic.Ack for everything read so far, once ``--ack-every`` deliveries are
  unacknowledged at the end of a read (1 = every read). deliveries/s and loss;
* ``confirmed`` -- durable queue, persistent messages (delivery-mode 2), publisher confirms with
  at most ``--window`` publishes unconfirmed; consumer as above. deliveries/s, confirms/s;
* ``latency`` / ``latency-confirm`` -- one message at a time (transient / durable + persistent +
  confirms): the publisher puts ``time.perf_counter_ns()`` in the body, the consumer (same
  process, same clock) subtracts it on arrival and acks; with confirms the round also waits for
  the publisher's confirm (its latency is reported too). p50/p99.

Load generator: raw sockets and pre-encoded frames (no client library: pika manages ~13k
msg/s), publisher and consumer in separate ``spawn`` processes. Every delivery of a phase has
the same size, so the consumer checks the framing of a whole read at once with one strided
slice per framing byte (type, size and end of the three frames, the method id)
and reads only the last delivery tag, for the one multiple ack; anything else (heartbeats,
other frames, a delivery of another shape) takes a general per-frame path.

    .venv/bin/python -m bench.amqp_bench --json amqp.json
    .venv/bin/python -m bench.amqp_bench --only rabbitmq --runs 1
    .venv/bin/python -m bench.amqp_bench --target 127.0.0.1:5672
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing as mp
import os
import selectors
import struct
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.amqp_driver import (
    BASIC_ACK,
    BASIC_DELIVER,
    BASIC_NACK,
    CHANNEL_CLOSE,
    CONNECTION_CLOSE,
    FRAME_BODY,
    FRAME_END,
    FRAME_HEADER,
    FRAME_METHOD,
    HDR,
    MID,
    U64,
    _close_reason,
    basic_consume,
    basic_qos,
    close_connection,
    close_reason,
    confirm_select,
    connect,
    encode_ack,
    encode_publish,
    frame,
    queue_declare,
    queue_delete_frame,
)
from bench.brokers import Broker, NotInstalled, RabbitMQBroker, VibeMQBroker, check_alive
from bench.common import (
    BenchError,
    BlockingConn,
    cpu_seconds,
    expect_report,
    format_num,
    install_sigterm_exit,
    leading_bytes,
    median_of,
    parse_target,
    percentiles_us,
    raise_nofile_limit,
    result_failed,
)

PAYLOAD_SIZE = 64
RECV_SIZE = 1 << 18
TS = struct.Struct(">Q")
CONSUMER_TAG = b"ab"
BROKERS = ("rabbitmq", "vibemq")
END = FRAME_END[0]


@dataclass(frozen=True)
class Scenario:
    name: str
    confirms: bool  # publisher confirms; also a durable queue and persistent messages
    title: str
    latency: bool = False
    #: the queue durable and messages persistent; None: as ``confirms``
    durable: bool | None = None
    #: the consumer polls with Basic.Get instead of Basic.Consume
    get: bool = False

    @property
    def is_durable(self) -> bool:
        return self.confirms if self.durable is None else self.durable


SCENARIOS = (
    Scenario("transient", False, "transient"),
    Scenario("confirmed", True, "durable+confirms"),
    Scenario("latency", False, "latency transient", latency=True),
    Scenario("latency-confirm", True, "latency durable+conf", latency=True),
    # not in the default list (bench.paths_bench runs them): confirms on a transient queue,
    # and a consumer polling with Basic.Get
    Scenario("transient-confirm", True, "transient+confirms", durable=False),
    Scenario("get", False, "basic.get polling", get=True),
)
DEFAULT_SCENARIOS = ("transient", "confirmed", "latency", "latency-confirm")
THROUGHPUT = tuple(s for s in SCENARIOS if not s.latency)
LATENCY = tuple(s for s in SCENARIOS if s.latency)


@dataclass(frozen=True)
class Options:
    """What the worker processes need to know (picklable)."""

    host: str
    port: int
    user: str
    password: str
    vhost: str
    prefetch: int
    window: int
    batch: int
    ack_every: int
    stall_s: float
    drain_s: float
    timeout_s: float
    coalesce_s: float = 0.0
    coalesce_bytes: int = 16384

    def open(self) -> BlockingConn:
        return connect(
            self.host,
            self.port,
            timeout=self.stall_s,
            user=self.user,
            password=self.password,
            vhost=self.vhost,
        )


@dataclass(frozen=True)
class Layout:
    """The queue of one phase and how its messages are published."""

    queue: bytes
    confirms: bool  # publisher confirms
    payload_size: int = PAYLOAD_SIZE
    #: a durable queue and persistent messages; None: as ``confirms``
    durable_queue: bool | None = None
    get: bool = False  # the consumer polls with Basic.Get

    @property
    def durable(self) -> bool:
        return self.confirms if self.durable_queue is None else self.durable_queue

    def publish(self, body: bytes) -> bytes:
        return encode_publish(self.queue, body, persistent=self.durable)


# --------------------------------------------------------------------------------------------
# scanners


def _check_frame_end(buf: bytes, pos: int, size: int) -> None:
    if buf[pos + 7 + size] != END:
        raise BenchError(f"AMQP frame end marker missing (frame type {buf[pos]}, size {size})")


def _raise_if_close(buf: bytes, pos: int, size: int) -> None:
    if MID.unpack_from(buf, pos + 7) in (CONNECTION_CLOSE, CHANNEL_CLOSE):
        raise BenchError(f"the broker closed: {_close_reason(buf[pos + 7 : pos + 7 + size])}")


# A Basic.Ack from the broker on channel 1: 7-byte header, class/method, tag, bits, frame end.
ACK_SIZE = 21
_ACK_COLUMNS = [
    (i, bytes((b,))) for i, b in enumerate(HDR.pack(FRAME_METHOD, 1, 13) + MID.pack(*BASIC_ACK))
] + [(20, FRAME_END)]


class ConfirmCounter:
    """Publisher confirms in the publisher's byte stream. Fast path: ``n`` whole Basic.Ack
    frames are checked at once with strided slices; with ``multiple`` set on all of them (or
    consecutive single acks) only the last tag is read."""

    def __init__(self) -> None:
        self.rest = b""
        self.upto = 0  # every tag <= upto is confirmed
        self.singles: set[int] = set()  # tags > upto confirmed one by one
        self.nacks = 0
        self.frames = 0

    @property
    def confirmed(self) -> int:
        return self.upto + len(self.singles)

    def _advance(self, tag: int) -> None:
        if tag > self.upto:
            self.upto = tag
            if self.singles:
                self.singles = {t for t in self.singles if t > tag}
        while self.upto + 1 in self.singles:
            self.upto += 1
            self.singles.discard(self.upto)

    def _one(self, tag: int, multiple: bool) -> None:
        if multiple:
            self._advance(tag)
        elif tag > self.upto:
            self.singles.add(tag)
            self._advance(self.upto)

    def feed(self, data: bytes) -> None:
        buf = self.rest + data if self.rest else data
        end = len(buf)
        pos = 0
        while pos < end:
            n = (end - pos) // ACK_SIZE
            if n:
                stop = pos + n * ACK_SIZE
                k = n
                for off, col in _ACK_COLUMNS:
                    k = min(k, leading_bytes(buf[pos + off : stop : ACK_SIZE], col))
                    if not k:
                        break
                if k:
                    stop = pos + k * ACK_SIZE
                    flags = buf[pos + 19 : stop : ACK_SIZE]
                    last = U64.unpack_from(buf, stop - ACK_SIZE + 11)[0]
                    first = U64.unpack_from(buf, pos + 11)[0]
                    if not flags.strip(b"\x01") or (
                        not flags.strip(b"\x00")
                        and first == self.upto + 1
                        and last == first + k - 1
                    ):
                        self._advance(last)  # all multiple, or consecutive singles
                    else:
                        for at in range(pos, stop, ACK_SIZE):
                            self._one(U64.unpack_from(buf, at + 11)[0], bool(buf[at + 19] & 1))
                    self.frames += k
                    pos = stop
                    continue
            if end - pos < 7:
                break
            kind, _ch, size = HDR.unpack_from(buf, pos)
            if end - pos < size + 8:
                break
            _check_frame_end(buf, pos, size)
            if kind == FRAME_METHOD:
                mid = MID.unpack_from(buf, pos + 7)
                if mid in (BASIC_ACK, BASIC_NACK):
                    self.nacks += mid == BASIC_NACK
                    self._one(U64.unpack_from(buf, pos + 11)[0], bool(buf[pos + 19] & 1))
                    self.frames += 1
                else:
                    _raise_if_close(buf, pos, size)
            pos += size + 8
        self.rest = buf[pos:]


IDLE, GOT_METHOD, GOT_HEADER = 0, 1, 2


class DeliveryScanner:
    """Counts the deliveries (Basic.Deliver + content header + body frames) in the consumer's
    byte stream and remembers the tag of the last complete one. The first delivery that comes
    as exactly three frames in one read is the template: from then on ``n`` whole deliveries of
    its size are checked at once, one strided slice per framing byte, and only the last tag is
    read (it must be above the previous one). Anything else takes the per-frame path."""

    def __init__(self) -> None:
        self.rest = b""
        self.delivered = 0
        self.slow = 0  # deliveries that took the per-frame path
        self.others = 0  # frames that are not part of a delivery (heartbeats, ...)
        self.last_tag = 0
        self.size = 0  # bytes of one delivery, once learned
        self.tag_at = 0
        self.columns: list[tuple[int, bytes]] = []
        self._state = IDLE
        self._tag = 0
        self._left = 0
        self._begin = -1
        self._frames = 0

    def _learn(self, tmpl: bytes) -> None:
        """The bytes that fix the framing of a delivery: the type, size and end of its three
        frames and the method id (Basic.Deliver). A torn or shifted stream fails these."""
        m_end = 7 + HDR.unpack_from(tmpl, 0)[2]
        h_end = m_end + 8 + HDR.unpack_from(tmpl, m_end + 1)[2]
        size = len(tmpl)
        offsets = [m_end, h_end, size - 1]  # frame ends first: they fail fastest
        for start in (0, m_end + 1, h_end + 1):
            offsets += [start, start + 3, start + 4, start + 5, start + 6]  # type, size
        offsets += range(7, 11)  # class and method id
        self.columns = [(i, tmpl[i : i + 1]) for i in offsets]
        self.tag_at = 12 + tmpl[11]
        self.size = len(tmpl)

    def _complete(self, buf: bytes, end_pos: int) -> None:
        self.delivered += 1
        self.slow += 1
        self.last_tag = max(self.last_tag, self._tag)
        if not self.size and self._begin >= 0 and self._frames == 3:
            self._learn(bytes(buf[self._begin : end_pos]))
        self._state = IDLE

    def feed(self, data: bytes) -> None:
        buf = self.rest + data if self.rest else data
        end = len(buf)
        pos = 0
        while pos < end:
            size = self.size  # learned by the first delivery, maybe in this very read
            if size and self._state == IDLE:
                n = (end - pos) // size
                if n:
                    stop = pos + n * size
                    k = n
                    for off, col in self.columns:
                        k = min(k, leading_bytes(buf[pos + off : stop : size], col))
                        if not k:
                            break
                    if k:
                        stop = pos + k * size
                        tag = U64.unpack_from(buf, stop - size + self.tag_at)[0]
                        if tag > self.last_tag:
                            self.delivered += k
                            self.last_tag = tag
                            pos = stop
                            continue
            if end - pos < 7:
                break
            kind, _ch, fsize = HDR.unpack_from(buf, pos)
            if end - pos < fsize + 8:
                break
            _check_frame_end(buf, pos, fsize)
            nxt = pos + fsize + 8
            if kind == FRAME_METHOD:
                if MID.unpack_from(buf, pos + 7) == BASIC_DELIVER:
                    self._tag = U64.unpack_from(buf, pos + 12 + buf[pos + 11])[0]
                    self._state, self._begin, self._frames = GOT_METHOD, pos, 1
                else:
                    _raise_if_close(buf, pos, fsize)
                    self.others += 1
            elif kind == FRAME_HEADER and self._state == GOT_METHOD:
                self._left = U64.unpack_from(buf, pos + 11)[0]  # after class id and weight
                self._state = GOT_HEADER
                self._frames += 1
                if not self._left:
                    self._complete(buf, nxt)
            elif kind == FRAME_BODY and self._state == GOT_HEADER:
                self._left -= fsize
                self._frames += 1
                if self._left <= 0:
                    self._complete(buf, nxt)
            else:
                self.others += 1  # heartbeat, or content outside a delivery
            pos = nxt
        self._begin = -1  # offsets refer to this buffer only
        self.rest = buf[pos:]


# --------------------------------------------------------------------------------------------
# worker processes


@dataclass
class PubStats:
    sent: int = 0
    confirmed: int = 0
    reads: int = 0
    t_start_ns: int = 0
    t_written_ns: int = 0  # last publish handed to the kernel
    t_accepted_ns: int = 0  # confirms: the last confirm; else Close-Ok (every publish processed)
    cpu_s: float = 0.0
    error: str = ""


@dataclass
class SubStats:
    delivered: int = 0
    slow: int = 0
    acks: int = 0
    reads: int = 0
    t_first_ns: int = 0
    t_last_ns: int = 0
    cpu_s: float = 0.0
    error: str = ""


def _deadline_check(deadline: float, opts: Options) -> None:
    if time.monotonic() > deadline:
        raise BenchError(f"timed out after {opts.timeout_s:.0f}s")


def _publish_unconfirmed(
    conn: BlockingConn, unit: bytes, total: int, opts: Options, st: PubStats
) -> None:
    """Every publish is the same bytes: one chunk of ``batch`` of them, written over and over;
    only TCP back-pressure (the broker not reading) slows the publisher down."""
    sock = conn.sock
    sock.settimeout(opts.stall_s)
    chunk = unit * min(opts.batch, total)
    deadline = time.monotonic() + opts.timeout_s
    st.t_start_ns = time.monotonic_ns()
    for start in range(0, total, opts.batch):
        n = min(opts.batch, total - start)
        sock.sendall(chunk if n == opts.batch else chunk[: n * len(unit)])
        st.sent += n
        _deadline_check(deadline, opts)
    st.t_written_ns = time.monotonic_ns()


def _publish_confirmed(
    conn: BlockingConn, unit: bytes, total: int, opts: Options, st: PubStats
) -> None:
    """At most ``window`` publishes unconfirmed, written in steps of ``window``/10 (at most
    ``batch``) as confirms free the window."""
    sock = conn.sock
    sock.settimeout(opts.stall_s)
    size = len(unit)
    blob = memoryview(unit * opts.window)
    counter = ConfirmCounter()
    if conn.buf:
        counter.feed(bytes(conn.buf))
        conn.buf.clear()
    step = max(1, min(opts.batch, opts.window // 10 or 1))
    deadline = time.monotonic() + opts.timeout_s
    sent = 0
    st.t_start_ns = time.monotonic_ns()
    while counter.confirmed < total:
        room = opts.window - (sent - counter.confirmed)
        while sent < total and room >= min(step, total - sent):
            n = min(step * (room // step) or room, total - sent)
            sock.sendall(blob[: n * size])
            sent += n
            room -= n
        st.sent = sent
        if sent == total and not st.t_written_ns:
            st.t_written_ns = time.monotonic_ns()
        try:
            data = sock.recv(RECV_SIZE)
        except TimeoutError:
            raise BenchError(
                f"no confirm for {opts.stall_s:.0f}s ({counter.confirmed}/{total} confirmed, "
                f"{sent} sent)"
            ) from None
        if not data:
            raise BenchError(f"the broker closed the publisher ({counter.confirmed}/{total})")
        counter.feed(data)
        if counter.nacks:
            raise BenchError(f"the broker nacked publishes ({counter.nacks} Basic.Nack)")
        st.confirmed = counter.confirmed
        st.reads += 1
        if len(data) < ACK_SIZE * step and opts.coalesce_s:
            time.sleep(opts.coalesce_s)  # let confirms pile up: fewer, larger reads
        _deadline_check(deadline, opts)
    st.t_accepted_ns = time.monotonic_ns()


def _wait_go(pipe: Connection) -> None:
    if not pipe.poll(60) or pipe.recv()[0] != "go":
        raise BenchError("no 'go'")


def publisher_main(opts: Options, layout: Layout, total: int, pipe: Connection) -> None:
    st = PubStats()
    cpu0 = time.process_time()
    conn: BlockingConn | None = None
    try:
        unit = layout.publish(b"x" * layout.payload_size)
        conn = opts.open()
        queue_declare(conn, layout.queue, durable=layout.durable)
        if layout.confirms:
            confirm_select(conn)
        pipe.send(("ready", None))
        _wait_go(pipe)
        cpu0 = time.process_time()
        if layout.confirms:
            _publish_confirmed(conn, unit, total, opts, st)
        else:
            _publish_unconfirmed(conn, unit, total, opts, st)
        # Close-Ok comes once the broker has processed every frame sent before the Close
        ok = close_connection(conn, opts.stall_s)
        conn = None
        if not ok:
            raise BenchError(f"no Connection.Close-Ok within {opts.stall_s:.0f}s after publishing")
        if not st.t_accepted_ns:
            st.t_accepted_ns = time.monotonic_ns()
    except TimeoutError:
        what = "accepted no data" if st.t_start_ns else "did not answer the handshake"
        st.error = f"publisher: the broker {what} for {opts.stall_s:.0f}s ({st.sent} sent)"
    except (BenchError, OSError) as exc:
        reason = close_reason(conn) if conn is not None and isinstance(exc, OSError) else ""
        st.error = f"publisher: {exc}" + (f" (the broker said: {reason})" if reason else "")
    finally:
        st.cpu_s = time.process_time() - cpu0
        if conn is not None:
            conn.close()
    pipe.send(("done", asdict(st)))


def _consume(
    conn: BlockingConn, expected: int, opts: Options, pipe: Connection, _queue: bytes = b""
) -> SubStats:
    st = SubStats()
    scanner = DeliveryScanner()
    sock = conn.sock
    sock.settimeout(opts.stall_s)
    sel = selectors.DefaultSelector()
    sel.register(sock, selectors.EVENT_READ, 0)
    sel.register(pipe, selectors.EVENT_READ, 1)
    acked_count = 0
    acked_tag = 0
    start = time.monotonic()
    last_progress = start
    pub_done: float | None = None
    deadline = start + opts.timeout_s
    pending = [bytes(conn.buf)] if conn.buf else []  # read along with Consume-Ok
    conn.buf.clear()
    try:
        while True:
            events = [] if pending else sel.select(0.25)
            now = time.monotonic()
            before = scanner.delivered
            for key, _ in events:
                if key.data == 1:
                    if pipe.recv()[0] == "abort":
                        raise BenchError("stopped: the publisher failed")
                    pub_done = now
                    continue
                data = sock.recv(RECV_SIZE)
                if not data:
                    raise BenchError(
                        f"the broker closed the consumer ({scanner.delivered}/{expected} delivered)"
                    )
                pending.append(data)
            got = 0
            for data in pending:
                scanner.feed(data)
                st.reads += 1
                got += len(data)
            pending.clear()
            if scanner.delivered - acked_count >= opts.ack_every and scanner.last_tag > acked_tag:
                sock.sendall(encode_ack(scanner.last_tag, multiple=True))
                acked_count, acked_tag = scanner.delivered, scanner.last_tag
                st.acks += 1
            if scanner.delivered > before:
                st.t_last_ns = time.monotonic_ns()
                if not st.t_first_ns:
                    st.t_first_ns = st.t_last_ns
                last_progress = now
                if scanner.delivered >= expected:
                    break
                if got < opts.coalesce_bytes and opts.coalesce_s:
                    time.sleep(opts.coalesce_s)  # let deliveries pile up: fewer, larger reads
            if pub_done is not None and now - max(last_progress, pub_done) > opts.drain_s:
                break  # the broker has processed every publish; what has not come is lost
            if now - last_progress > opts.stall_s:
                raise BenchError(
                    f"no delivery for {opts.stall_s:.0f}s ({scanner.delivered}/{expected} "
                    "delivered): the broker stopped delivering"
                )
            _deadline_check(deadline, opts)
        if scanner.last_tag > acked_tag:  # not needed for the count; leave the queue clean
            sock.sendall(encode_ack(scanner.last_tag, multiple=True))
    except (BenchError, OSError) as exc:
        st.error = f"consumer: {exc}"
    finally:
        sel.close()
    st.delivered = scanner.delivered
    st.slow = scanner.slow
    return st


BASIC_GET_OK = (60, 71)
BASIC_GET_EMPTY = (60, 72)


def _poll_get(
    conn: BlockingConn, expected: int, opts: Options, pipe: Connection, queue: bytes
) -> SubStats:
    """Basic.Get polling: ``--prefetch`` Basic.Get requests pipelined (a new one for every
    answer), manual acks, one ``multiple`` Basic.Ack once ``--ack-every`` messages are
    unacknowledged. Get-Empty answers are counted (polling an empty queue costs the broker
    too). Per-frame parsing: the generator may be the limit here, its CPU is reported."""
    st = SubStats()
    sock = conn.sock
    sock.settimeout(0.25)
    get = frame(
        FRAME_METHOD, 1, MID.pack(60, 70) + b"\x00\x00" + bytes((len(queue),)) + queue + b"\x00"
    )
    depth = max(1, min(opts.prefetch, 1000))
    sock.sendall(get * depth)
    buf = bytearray(conn.buf)
    conn.buf.clear()
    acked_count = last_tag = acked_tag = 0
    empties = 0
    start = time.monotonic()
    last_progress = start
    pub_done: float | None = None
    deadline = start + opts.timeout_s
    try:
        while st.delivered < expected:
            try:
                data = sock.recv(RECV_SIZE)
                if not data:
                    raise BenchError(f"the broker closed the consumer ({st.delivered} delivered)")
                buf += data
                st.reads += 1
            except TimeoutError:
                pass
            now = time.monotonic()
            if pipe.poll():
                if pipe.recv()[0] == "abort":
                    raise BenchError("stopped: the publisher failed")
                pub_done = now
            pos, end, answers, before = 0, len(buf), 0, st.delivered
            while end - pos >= 8:
                kind, _ch, size = HDR.unpack_from(buf, pos)
                if end - pos < size + 8:
                    break
                _check_frame_end(buf, pos, size)
                if kind == FRAME_METHOD:
                    mid = MID.unpack_from(buf, pos + 7)
                    if mid == BASIC_GET_OK:
                        (last_tag,) = U64.unpack_from(buf, pos + 11)
                        answers += 1
                    elif mid == BASIC_GET_EMPTY:
                        answers += 1
                        empties += 1
                    else:
                        _raise_if_close(bytes(buf), pos, size)
                elif kind == FRAME_BODY:
                    st.delivered += 1  # one body frame per 64-byte message
                pos += size + 8
            del buf[:pos]
            if st.delivered > before:
                st.t_last_ns = time.monotonic_ns()
                st.t_first_ns = st.t_first_ns or st.t_last_ns
                last_progress = now
            out = []
            if st.delivered - acked_count >= opts.ack_every and last_tag > acked_tag:
                out.append(encode_ack(last_tag, multiple=True))
                acked_count, acked_tag = st.delivered, last_tag
                st.acks += 1
            if answers and st.delivered < expected:
                out.append(get * answers)
            if out:
                sock.sendall(b"".join(out))
            if pub_done is not None and now - max(last_progress, pub_done) > opts.drain_s:
                break
            if now - last_progress > opts.stall_s:
                raise BenchError(f"no message for {opts.stall_s:.0f}s ({st.delivered}/{expected})")
            _deadline_check(deadline, opts)
        if last_tag > acked_tag:
            sock.sendall(encode_ack(last_tag, multiple=True))
    except (BenchError, OSError) as exc:
        st.error = f"basic.get consumer: {exc}"
    st.slow = empties  # reported as the "slow path" count: the Get-Empty answers
    return st


def consumer_main(opts: Options, layout: Layout, expected: int, pipe: Connection) -> None:
    conn: BlockingConn | None = None
    try:
        conn = opts.open()
        queue_declare(conn, layout.queue, durable=layout.durable)
        if not layout.get:
            basic_qos(conn, opts.prefetch)
            basic_consume(conn, layout.queue, CONSUMER_TAG)
        pipe.send(("ready", None))
        _wait_go(pipe)
        cpu0 = time.process_time()
        poll = _poll_get if layout.get else _consume
        st = poll(conn, expected, opts, pipe, layout.queue)
        st.cpu_s = time.process_time() - cpu0
    except TimeoutError:
        st = SubStats(error=f"consumer: no answer to the handshake within {opts.stall_s:.0f}s")
    except (BenchError, OSError) as exc:
        st = SubStats(error=f"consumer: {exc}")
    if conn is not None:
        close_connection(conn, min(opts.stall_s, 5.0), before=queue_delete_frame(layout.queue))
    pipe.send(("done", asdict(st)))


# --------------------------------------------------------------------------------------------
# orchestration


@dataclass
class ScenarioResult:
    scenario: str
    messages: int
    delivered: int = 0
    loss_pct: float = 0.0
    deliveries_per_s: float = 0.0
    publish_per_s: float = 0.0
    elapsed_s: float = 0.0
    publisher_cpu_s: float = 0.0
    consumer_cpu_s: float = 0.0
    publisher_reads: int = 0
    consumer_reads: int = 0
    consumer_acks: int = 0
    slow_path_deliveries: int = 0
    broker_cpu_s: float | None = None
    errors: list[str] = field(default_factory=list)


def run_scenario(
    scen: Scenario, opts: Options, messages: int, broker_pids: list[int] | None = None
) -> ScenarioResult:
    ctx = mp.get_context("spawn")
    queue = f"ab-{scen.name}-{uuid.uuid4().hex[:10]}".encode()
    layout = Layout(queue, scen.confirms, durable_queue=scen.is_durable, get=scen.get)
    res = ScenarioResult(scen.name, messages)
    sub_pipe, sub_child = ctx.Pipe()
    pub_pipe, pub_child = ctx.Pipe()
    sub = ctx.Process(
        target=consumer_main, args=(opts, layout, messages, sub_child), name="amqp-bench-sub"
    )
    pub = ctx.Process(
        target=publisher_main, args=(opts, layout, messages, pub_child), name="amqp-bench-pub"
    )
    sub.daemon = pub.daemon = True
    wait = opts.timeout_s + 2 * opts.stall_s + 30
    pub_st = PubStats()
    sub_st = SubStats()
    try:
        # the consumer declares the queue before the publisher starts
        sub.start()
        _expect_ready(sub_pipe, "consumer")
        pub.start()
        _expect_ready(pub_pipe, "publisher")
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
            if proc.pid is None:
                continue
            proc.join(timeout=10)
            if proc.is_alive():
                proc.kill()
                proc.join(timeout=5)
    for err in (pub_st.error, sub_st.error):
        if err:
            res.errors.append(err)
    res.delivered = sub_st.delivered
    res.publisher_cpu_s = round(pub_st.cpu_s, 2)
    res.consumer_cpu_s = round(sub_st.cpu_s, 2)
    res.publisher_reads = pub_st.reads
    res.consumer_reads = sub_st.reads
    res.consumer_acks = sub_st.acks
    res.slow_path_deliveries = sub_st.slow
    res.loss_pct = max(0.0, 100.0 * (messages - res.delivered) / messages)
    t0 = pub_st.t_start_ns
    if t0 and sub_st.t_last_ns > t0:
        res.elapsed_s = (sub_st.t_last_ns - t0) / 1e9
        res.deliveries_per_s = res.delivered / res.elapsed_s
    if t0 and pub_st.t_accepted_ns > t0:
        res.publish_per_s = pub_st.sent / ((pub_st.t_accepted_ns - t0) / 1e9)
    if not res.errors and not res.delivered:
        res.errors.append("nothing was delivered")
    elif scen.confirms and res.delivered < messages and not res.errors:
        res.errors.append(f"{messages - res.delivered} confirmed messages were not delivered")
    return res


def _expect_ready(pipe: Connection, who: str) -> None:
    if not pipe.poll(60):
        raise BenchError(f"the {who} did not report within 60s")
    kind, value = pipe.recv()
    if kind != "ready":
        why = value.get("error") if isinstance(value, dict) else value
        raise BenchError(f"the {who} did not start: {why}")


@dataclass
class LatencyResult:
    scenario: str
    samples: int = 0
    p50_us: float = 0.0
    p95_us: float = 0.0
    p99_us: float = 0.0
    mean_us: float = 0.0
    min_us: float = 0.0
    max_us: float = 0.0
    confirm_p50_us: float | None = None
    confirm_p99_us: float | None = None
    errors: list[str] = field(default_factory=list)


def _frames(conn: BlockingConn) -> list[tuple[int, bytes]]:
    """Take the complete frames out of ``conn.buf``: (type, payload)."""
    out: list[tuple[int, bytes]] = []
    buf = conn.buf
    pos = 0
    while len(buf) - pos >= 7:
        kind, _ch, size = HDR.unpack_from(buf, pos)
        if len(buf) - pos < size + 8:
            break
        raw = bytes(buf[pos : pos + size + 8])
        _check_frame_end(raw, 0, size)
        if kind == FRAME_METHOD:
            _raise_if_close(raw, 0, size)
        out.append((kind, raw[7:-1]))
        pos += size + 8
    del buf[:pos]
    return out


class _LatencyRound:
    """One round: the delivery seen by the consumer, the confirm seen by the publisher."""

    def __init__(self) -> None:
        self.tag = 0
        self.body = b""
        self.left = -1  # body bytes still expected; -1 = no content header yet
        self.t_delivered = 0
        self.t_confirmed = 0

    def on_consumer(self, frames: list[tuple[int, bytes]], now: int) -> None:
        for kind, payload in frames:
            if kind == FRAME_METHOD and MID.unpack_from(payload) == BASIC_DELIVER:
                self.tag = U64.unpack_from(payload, 5 + payload[4])[0]
            elif kind == FRAME_HEADER and self.tag:
                self.left = U64.unpack_from(payload, 4)[0]
            elif kind == FRAME_BODY and self.left > 0:
                self.body += payload
                self.left -= len(payload)
                if self.left <= 0:
                    self.t_delivered = now

    def on_publisher(self, frames: list[tuple[int, bytes]], now: int, seq: int) -> None:
        for kind, payload in frames:
            if kind != FRAME_METHOD:
                continue
            mid = MID.unpack_from(payload)
            if mid == BASIC_NACK:
                raise BenchError(f"the broker nacked publish {seq}")
            if mid == BASIC_ACK and U64.unpack_from(payload, 4)[0] >= seq:
                self.t_confirmed = now


def run_latency(opts: Options, scen: Scenario, samples: int, warmup: int) -> LatencyResult:
    """One message at a time: publish (perf_counter_ns in the body) -> delivery at the consumer
    (same process, same clock) -> Basic.Ack; with confirms the round also waits for the
    publisher's confirm, whose latency (publish -> confirm read) is reported too."""
    res = LatencyResult(scen.name)
    layout = Layout(f"ab-lat-{uuid.uuid4().hex[:10]}".encode(), scen.confirms)
    pad = b"x" * (layout.payload_size - TS.size)
    head = layout.publish(pad + TS.pack(0))
    head = head[: len(head) - len(frame(FRAME_BODY, 1, pad + TS.pack(0)))]
    taken: list[int] = []
    confirmed: list[int] = []
    clock = time.perf_counter_ns
    deadline = time.monotonic() + opts.timeout_s
    sub = pub = None
    sel = selectors.DefaultSelector()
    try:
        sub = opts.open()
        queue_declare(sub, layout.queue, durable=layout.confirms)
        basic_qos(sub, opts.prefetch)
        basic_consume(sub, layout.queue, CONSUMER_TAG)
        pub = opts.open()
        queue_declare(pub, layout.queue, durable=layout.confirms)
        if layout.confirms:
            confirm_select(pub)
        sel.register(sub.sock, selectors.EVENT_READ, sub)
        sel.register(pub.sock, selectors.EVENT_READ, pub)
        for i in range(warmup + samples):
            _deadline_check(deadline, opts)
            rnd = _LatencyRound()
            t0 = clock()
            pub.send(head + frame(FRAME_BODY, 1, pad + TS.pack(t0)))
            while True:
                now = clock()  # just after the read that completed a frame
                rnd.on_consumer(_frames(sub), now)
                rnd.on_publisher(_frames(pub), now, i + 1)
                if rnd.t_delivered and (rnd.t_confirmed or not layout.confirms):
                    break
                events = sel.select(opts.stall_s)
                if not events:
                    what = "delivery" if not rnd.t_delivered else "confirm"
                    raise BenchError(f"no {what} within {opts.stall_s:.0f}s (round {i + 1})")
                for key, _ in events:
                    key.data.fill()
            if len(rnd.body) != layout.payload_size or not rnd.body.startswith(pad):
                raise BenchError(f"round {i + 1}: an unexpected body {rnd.body[:16]!r}...")
            sub.send(encode_ack(rnd.tag))
            if i >= warmup:
                taken.append(rnd.t_delivered - TS.unpack_from(rnd.body, len(pad))[0])
                if layout.confirms:
                    confirmed.append(rnd.t_confirmed - t0)
    except TimeoutError:
        res.errors.append(f"{scen.name}: no answer within {opts.stall_s:.0f}s")
    except (BenchError, OSError) as exc:
        res.errors.append(f"{scen.name}: {exc}")
    finally:
        sel.close()
        if pub is not None:
            close_connection(pub, min(opts.stall_s, 5.0))
        if sub is not None:
            close_connection(sub, min(opts.stall_s, 5.0), before=queue_delete_frame(layout.queue))
    res.samples = len(taken)
    for name, value in percentiles_us(taken).items():
        setattr(res, name, round(value, 1))
    if confirmed:
        conf = percentiles_us(confirmed)
        res.confirm_p50_us = round(conf["p50_us"], 1)
        res.confirm_p99_us = round(conf["p99_us"], 1)
    return res


# --------------------------------------------------------------------------------------------
# per broker


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians over the runs of every headline number (failed runs left out)."""
    out: dict[str, Any] = {}
    for scen in THROUGHPUT:
        ok = [r[scen.name] for r in runs if scen.name in r and not r[scen.name]["errors"]]
        timed = [r for r in ok if r["elapsed_s"]]
        out[scen.name] = {
            "deliveries_per_s": median_of([r["deliveries_per_s"] for r in ok]),
            "publish_per_s": median_of([r["publish_per_s"] for r in ok]),
            "loss_pct": median_of([r["loss_pct"] for r in ok]),
            # of one core, over the timed interval: ~100% = a one-core broker was the limit
            "broker_cpu_pct": median_of(
                [100 * r["broker_cpu_s"] / r["elapsed_s"] for r in timed if r["broker_cpu_s"]]
            ),
            "generator_cpu_pct": median_of(
                [100 * (r["publisher_cpu_s"] + r["consumer_cpu_s"]) / r["elapsed_s"] for r in timed]
            ),
            "ok_runs": len(ok),
        }
    for scen in LATENCY:
        ok = [r[scen.name] for r in runs if scen.name in r and not r[scen.name]["errors"]]
        out[scen.name] = {
            key: median_of([r[key] for r in ok if r[key] is not None])
            for key in ("p50_us", "p99_us", "confirm_p50_us", "confirm_p99_us")
        }
        out[scen.name]["ok_runs"] = len(ok)
    return out


def _report(name: str, r: ScenarioResult) -> None:
    cpu = (
        f"cpu s: pub {r.publisher_cpu_s:.2f} sub {r.consumer_cpu_s:.2f}"
        + (f" broker {r.broker_cpu_s:.2f}" if r.broker_cpu_s is not None else "")
        + f" in {r.elapsed_s:.2f}s; reads pub {r.publisher_reads:,} sub {r.consumer_reads:,},"
        f" acks {r.consumer_acks:,}"
        # the fast path should take nearly every delivery (the slow one: a read's torn tail)
        + (
            f", slow path {r.slow_path_deliveries:,}"
            if r.slow_path_deliveries > r.consumer_reads + 1
            else ""
        )
    )
    print(
        f"[{name}] {r.scenario:<10} {r.deliveries_per_s:>9,.0f} deliveries/s  "
        f"{r.delivered:,}/{r.messages:,} (loss {r.loss_pct:.2f}%)  "
        f"publish {r.publish_per_s:,.0f}/s  {cpu}"
        + (f"  ERRORS: {'; '.join(r.errors)}" if r.errors else ""),
        flush=True,
    )


def _report_latency(name: str, lat: LatencyResult) -> None:
    conf = (
        f", confirm p50 {lat.confirm_p50_us:.0f}us p99 {lat.confirm_p99_us:.0f}us"
        if lat.confirm_p50_us is not None and lat.confirm_p99_us is not None
        else ""
    )
    print(
        f"[{name}] {lat.scenario}: p50 {lat.p50_us:.0f}us p99 {lat.p99_us:.0f}us{conf} "
        f"({lat.samples} samples)" + (f"  ERRORS: {'; '.join(lat.errors)}" if lat.errors else ""),
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
            port = broker.amqp_port if isinstance(broker, VibeMQBroker) else broker.port
        print(f"[{name}] AMQP on {host}:{port}", flush=True)
        opts = Options(
            host=host,
            port=port,
            user=args.user,
            password=args.password,
            vhost=args.vhost,
            prefetch=args.prefetch,
            window=args.window,
            batch=args.batch,
            ack_every=args.ack_every,
            stall_s=args.stall,
            drain_s=args.drain,
            timeout_s=args.timeout,
            coalesce_s=args.coalesce_us / 1e6,
        )
        if args.warmup:
            warm = run_scenario(THROUGHPUT[0], opts, args.warmup)
            if warm.errors:
                raise BenchError(f"warm-up failed: {'; '.join(warm.errors)}")
        for run in range(args.runs):
            one: dict[str, Any] = {"run": run + 1}
            out["runs"].append(one)
            for scen in SCENARIOS:
                if scen.name not in args.scenarios:
                    continue
                if scen.latency:
                    if not args.samples:
                        continue
                    lat = run_latency(opts, scen, args.samples, args.latency_warmup)
                    _report_latency(name, lat)
                    one[scen.name] = asdict(lat)
                else:
                    pids = broker.pids() if broker is not None else None
                    res = run_scenario(scen, opts, args.messages, pids)
                    _report(name, res)
                    one[scen.name] = asdict(res)
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
    if name == "rabbitmq":
        return RabbitMQBroker()
    # AMQP-declared queues are unbounded on both brokers unless x-max-length says otherwise
    return VibeMQBroker(extra_args=args.server_arg, amqp=True)


# --------------------------------------------------------------------------------------------
# table


_ROWS: list[tuple[str, str, str]] = [  # label, section, key
    *((f"{s.title} deliveries/s", s.name, "deliveries_per_s") for s in THROUGHPUT),
    ("transient publishes/s", "transient", "publish_per_s"),
    ("durable+confirms confirms/s", "confirmed", "publish_per_s"),
    *((f"{s.title} loss", s.name, "loss_pct") for s in THROUGHPUT),
    *(
        row
        for s in THROUGHPUT
        for row in (
            (f"{s.title} broker CPU", s.name, "broker_cpu_pct"),
            (f"{s.title} load gen CPU", s.name, "generator_cpu_pct"),
        )
    ),
    ("latency transient p50 us", "latency", "p50_us"),
    ("latency transient p99 us", "latency", "p99_us"),
    ("latency durable p50 us", "latency-confirm", "p50_us"),
    ("latency durable p99 us", "latency-confirm", "p99_us"),
    ("confirm latency p50 us", "latency-confirm", "confirm_p50_us"),
    ("confirm latency p99 us", "latency-confirm", "confirm_p99_us"),
]


def _unit(key: str) -> str:
    return "%" if key == "loss_pct" else "cpu" if key.endswith("cpu_pct") else ""


def print_table(results: list[dict[str, Any]]) -> None:
    names = [r["broker"] for r in results]
    ratio = "vibemq" in names and "rabbitmq" in names
    header = f"{'':<32}" + "".join(f"{n:>14}" for n in names)
    if ratio:
        header += f"{'vibemq/rabbit':>15}"
    print()
    print(header)
    print("-" * len(header))
    by_name = {r["broker"]: r for r in results}
    for label, section, key in _ROWS:
        unit = _unit(key)
        values = {n: by_name[n]["median"].get(section, {}).get(key) for n in names}
        if all(v is None for v in values.values()):
            continue
        line = f"{label:<32}" + "".join(f"{format_num(values[n], unit):>14}" for n in names)
        if ratio:
            ours, theirs = values["vibemq"], values["rabbitmq"]
            cell = f"{ours / theirs:.2f}x" if ours and theirs and not unit else "-"
            line += f"{cell:>15}"
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
    print("CPU: % of one core over the timed interval (RabbitMQ may use every core)")


# --------------------------------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    add: Callable[..., Any] = p.add_argument
    add("--only", choices=BROKERS, help="measure one broker only")
    add("--messages", type=int, default=200_000, help="published per throughput phase")
    add("--runs", type=int, default=3, help="median of this many runs")
    add(
        "--scenarios",
        default=",".join(DEFAULT_SCENARIOS),
        help="comma list (default: %(default)s; also transient-confirm, get)",
    )
    add("--prefetch", type=int, default=1000, help="consumer Basic.Qos prefetch-count")
    add("--window", type=int, default=1000, help="publishes awaiting a confirm (confirmed)")
    add("--batch", type=int, default=500, help="publishes per write")
    add(
        "--ack-every",
        type=int,
        default=1,
        help="one multiple Basic.Ack at the end of a read once this many deliveries are\n"
        "unacknowledged (1 = every read; at most --prefetch)",
    )
    add(
        "--coalesce-us",
        type=float,
        default=200.0,
        help="after a small read, sleep this long so that the next read is larger (0 = off)",
    )
    add("--warmup", type=int, default=20_000, help="untimed transient messages first")
    add("--samples", type=int, default=2000, help="latency round trips per latency phase")
    add("--latency-warmup", type=int, default=200)
    add("--stall", type=float, default=20.0, help="fail after this long without progress, s")
    add("--drain", type=float, default=2.0, help="after the publisher, wait for the rest, s")
    add("--timeout", type=float, default=120.0, help="per phase, s")
    add("--host", default="127.0.0.1", help="for --vibemq-port/--rabbitmq-port")
    add("--vibemq-port", type=int, help="AMQP port of a running VibeMQ")
    add("--rabbitmq-port", type=int, help="port of a running RabbitMQ")
    add("--target", help="host:port: measure just this AMQP server")
    add("--user", default="guest")
    add("--password", default="guest")
    add("--vhost", default="/")
    add("--server-arg", action="append", default=[], help="for vibemq-server (repeatable)")
    add("--json", type=Path, help="write the results here")
    return p


def main(argv: list[str] | None = None) -> int:
    p = _parser()
    args = p.parse_args(argv)
    if min(args.messages, args.runs, args.batch, args.window, args.prefetch, args.ack_every) < 1:
        p.error("--messages, --runs, --batch, --window, --prefetch, --ack-every must be positive")
    if args.prefetch > 65535:
        p.error("--prefetch is a 16-bit field (at most 65535)")
    if args.ack_every > args.prefetch:
        p.error("--ack-every above --prefetch would stall the consumer")
    args.scenarios = [s.strip() for s in args.scenarios.split(",") if s.strip()]
    for s in args.scenarios:
        if s not in {sc.name for sc in SCENARIOS}:
            p.error(f"unknown scenario {s!r}")
    install_sigterm_exit()
    raise_nofile_limit()
    names = ["target"] if args.target else [args.only] if args.only else list(BROKERS)
    results = [bench_broker(n, args) for n in names]
    print_table(results)
    if args.json:
        doc = {
            "settings": {
                "payload_bytes": PAYLOAD_SIZE,
                "messages": args.messages,
                "runs": args.runs,
                "prefetch": args.prefetch,
                "window": args.window,
                "batch": args.batch,
                "ack_every": args.ack_every,
                "latency_samples": args.samples,
                "cpus": os.cpu_count(),
            },
            "results": results,
        }
        args.json.write_text(json.dumps(doc, indent=2) + "\n")
        print(f"wrote {args.json}")
    return 1 if any(result_failed(r) for r in results) else 0


if __name__ == "__main__":
    raise SystemExit(main())
