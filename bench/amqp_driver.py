"""AMQP 0-9-1 for the load generator, raw frames (no client library).

Handshake: protocol header, Start/Start-Ok (PLAIN guest/guest), Tune/Tune-Ok (heartbeats
off), Open/Open-Ok, Channel.Open. The publisher turns on publisher confirms (Confirm.Select)
and counts Basic.Ack from the broker (honouring ``multiple``); the subscriber sets Basic.Qos
prefetch, consumes with manual acks and answers every delivery with its own Basic.Ack
(``multiple`` off, one ack per message like the other protocols). Queue: transient, classic,
non-durable, messages transient (VibeMQ keeps messages in memory too).

The module-level helpers (``connect``, ``queue_declare``, ``basic_qos``, ``basic_consume``,
``confirm_select``, ``encode_publish``, ``encode_ack``, ``close_connection``) are the same
steps one at a time, for ``bench.amqp_bench``."""

from __future__ import annotations

import contextlib
import struct
import time
from dataclasses import dataclass

from bench.common import BenchError, BlockingConn, Buffer, make_payload

FRAME_METHOD = 1
FRAME_HEADER = 2
FRAME_BODY = 3
FRAME_HEARTBEAT = 8
FRAME_END = b"\xce"

HDR = struct.Struct(">BHI")
U16 = struct.Struct(">H")
U32 = struct.Struct(">I")
U64 = struct.Struct(">Q")
MID = struct.Struct(">HH")

CONNECTION_CLOSE = (10, 50)
CHANNEL_CLOSE = (20, 40)
BASIC_ACK = (60, 80)
BASIC_NACK = (60, 120)
BASIC_DELIVER = (60, 60)


def shortstr(value: bytes) -> bytes:
    return bytes((len(value),)) + value


def longstr(value: bytes) -> bytes:
    return U32.pack(len(value)) + value


EMPTY_TABLE = b"\x00\x00\x00\x00"


def frame(kind: int, channel: int, payload: bytes) -> bytes:
    return HDR.pack(kind, channel, len(payload)) + payload + FRAME_END


def method(channel: int, cls: int, meth: int, args: bytes = b"") -> bytes:
    return frame(FRAME_METHOD, channel, MID.pack(cls, meth) + args)


def read_frame(conn: BlockingConn) -> tuple[int, int, bytes]:
    kind, channel, size = HDR.unpack(conn.read_exact(7))
    payload = conn.read_exact(size + 1)
    if payload[-1:] != FRAME_END:
        raise BenchError("AMQP frame end marker missing")
    return kind, channel, payload[:-1]


def _close_reason(payload: bytes) -> str:
    code = U16.unpack_from(payload, 4)[0]
    text = payload[7 : 7 + payload[6]].decode(errors="replace")
    return f"{code} {text}"


def expect_method(conn: BlockingConn, cls: int, meth: int) -> bytes:
    """Read frames until the method ``cls.meth`` arrives; return its arguments."""
    for _ in range(100):
        kind, _channel, payload = read_frame(conn)
        if kind == FRAME_HEARTBEAT:
            continue
        if kind != FRAME_METHOD:
            continue
        got = MID.unpack_from(payload, 0)
        if got == (cls, meth):
            return payload[4:]
        if got in (CONNECTION_CLOSE, CHANNEL_CLOSE):
            raise BenchError(f"AMQP close {got}: {_close_reason(payload)}")
    raise BenchError(f"AMQP method {cls}.{meth} did not arrive")


def _check_close(buf: Buffer, pos: int) -> None:
    got = MID.unpack_from(buf, pos + 7)
    if got in (CONNECTION_CLOSE, CHANNEL_CLOSE):
        raise BenchError(f"AMQP close {got}: {_close_reason(bytes(buf[pos + 7 :]))}")


class AmqpAckCounter:
    """Counts publisher confirms; ``multiple`` acks confirm every tag up to theirs."""

    def __init__(self) -> None:
        self.confirmed_upto = 0
        self.nacked = 0

    def feed(self, buf: bytearray) -> tuple[int, int]:
        pos = 0
        end = len(buf)
        acked = 0
        while end - pos >= 7:
            kind, _ch, size = HDR.unpack_from(buf, pos)
            if end - pos < size + 8:
                break
            if kind == FRAME_METHOD:
                got = MID.unpack_from(buf, pos + 7)
                if got in (BASIC_ACK, BASIC_NACK):
                    (tag,) = U64.unpack_from(buf, pos + 11)
                    multiple = buf[pos + 19] & 1
                    if got == BASIC_NACK:
                        self.nacked += 1
                    if multiple:
                        if tag > self.confirmed_upto:
                            acked += tag - self.confirmed_upto
                            self.confirmed_upto = tag
                    else:
                        acked += 1
                        self.confirmed_upto = max(self.confirmed_upto, tag)
                else:
                    _check_close(buf, pos)
            pos += size + 8
        return pos, acked


# Basic.Ack on channel 1: method frame of 13 bytes of payload.
_ACK_PREFIX = HDR.pack(FRAME_METHOD, 1, 13) + MID.pack(*BASIC_ACK)
_ACK_SUFFIX = b"\x00" + FRAME_END


class AmqpDeliveryScanner:
    """A delivery is Basic.Deliver + content header + one body frame (64-byte bodies); it is
    counted, and acked, when its body frame arrives."""

    def __init__(self) -> None:
        self.tag = b""

    def feed(self, buf: Buffer, end: int = -1) -> tuple[int, int, bytes]:
        pos = 0
        end = len(buf) if end < 0 else end
        delivered = 0
        acks: list[bytes] = []
        while end - pos >= 7:
            kind, _ch, size = HDR.unpack_from(buf, pos)
            if end - pos < size + 8:
                break
            if kind == FRAME_METHOD:
                if MID.unpack_from(buf, pos + 7) == BASIC_DELIVER:
                    tag_at = pos + 12 + buf[pos + 11]  # after consumer-tag shortstr
                    self.tag = bytes(buf[tag_at : tag_at + 8])
                else:
                    _check_close(buf, pos)
            elif kind == FRAME_BODY:
                delivered += 1
                acks.append(_ACK_PREFIX + self.tag + _ACK_SUFFIX)
            pos += size + 8
        return pos, delivered, b"".join(acks)


# --------------------------------------------------------------------------------------------
# connection set-up and cold methods, shared by the drivers and bench.amqp_bench

CONNECTION_CLOSE_OK = (10, 51)
CONFIRM_SELECT = (85, 10)
QUEUE_DELETE = (50, 40)
CONTENT_CLASS_BASIC = 60
# content header property flag for delivery-mode (the 4th property, bit 12)
PROP_DELIVERY_MODE = 0x1000


def connect(
    host: str,
    port: int,
    *,
    timeout: float = 10.0,
    user: str = "guest",
    password: str = "guest",
    vhost: str = "/",
) -> BlockingConn:
    """Protocol header, Start/Start-Ok (PLAIN), Tune/Tune-Ok (the broker's frame-max,
    heartbeats off), Open/Open-Ok, then Channel.Open of channel 1. Raises BenchError with the
    broker's reason when it refuses."""
    conn = BlockingConn(host, port, timeout=timeout)
    try:
        conn.send(b"AMQP\x00\x00\x09\x01")
        conn.fill()
        if conn.buf[:4] == b"AMQP":  # the broker answers a header it does not support this way
            raise BenchError(f"the broker wants protocol {bytes(conn.buf[:8])!r}, not 0-9-1")
        expect_method(conn, 10, 10)  # Start
        response = b"\x00" + user.encode() + b"\x00" + password.encode()
        props = b"\x07productS" + longstr(b"vibemq-bench")
        start_ok = U32.pack(len(props)) + props + shortstr(b"PLAIN") + longstr(response)
        conn.send(method(0, 10, 11, start_ok + shortstr(b"en_US")))
        tune = expect_method(conn, 10, 30)
        channel_max, frame_max, _heartbeat = struct.unpack_from(">HIH", tune, 0)
        conn.send(method(0, 10, 31, struct.pack(">HIH", channel_max or 2047, frame_max, 0)))
        conn.send(method(0, 10, 40, shortstr(vhost.encode()) + shortstr(b"") + b"\x00"))
        expect_method(conn, 10, 41)
        conn.send(method(1, 20, 10, shortstr(b"")))
        expect_method(conn, 20, 11)
    except BaseException:
        conn.close()
        raise
    return conn


def queue_declare(
    conn: BlockingConn, queue: bytes, *, durable: bool = False, arguments: bytes = EMPTY_TABLE
) -> None:
    """Queue.Declare on channel 1: durable or not; not exclusive, not auto-delete."""
    # bits: passive=1 durable=2 exclusive=4 auto-delete=8 no-wait=16
    flags = b"\x02" if durable else b"\x00"
    conn.send(method(1, 50, 10, U16.pack(0) + shortstr(queue) + flags + arguments))
    expect_method(conn, 50, 11)


def basic_qos(conn: BlockingConn, prefetch: int) -> None:
    conn.send(method(1, 60, 10, struct.pack(">IHB", 0, prefetch, 0)))
    expect_method(conn, 60, 11)


def basic_consume(conn: BlockingConn, queue: bytes, tag: bytes) -> None:
    """Basic.Consume with manual acks (no-ack off), waiting for Consume-Ok."""
    args = U16.pack(0) + shortstr(queue) + shortstr(tag) + b"\x00" + EMPTY_TABLE
    conn.send(method(1, 60, 20, args))
    expect_method(conn, 60, 21)


def confirm_select(conn: BlockingConn) -> None:
    conn.send(method(1, *CONFIRM_SELECT, b"\x00"))
    expect_method(conn, 85, 11)


def encode_publish(queue: bytes, body: bytes, *, persistent: bool = False) -> bytes:
    """Basic.Publish to the default exchange (routing key = queue) + content header (no
    properties, or just delivery-mode 2) + one body frame (``body`` fits in a frame)."""
    pub = method(1, 60, 40, U16.pack(0) + shortstr(b"") + shortstr(queue) + b"\x00")
    props = struct.pack(">HB", PROP_DELIVERY_MODE, 2) if persistent else U16.pack(0)
    header = struct.pack(">HHQ", CONTENT_CLASS_BASIC, 0, len(body)) + props
    return pub + frame(FRAME_HEADER, 1, header) + frame(FRAME_BODY, 1, body)


def encode_ack(tag: int, *, multiple: bool = False) -> bytes:
    """Basic.Ack on channel 1."""
    return _ACK_PREFIX + U64.pack(tag) + (b"\x01" if multiple else b"\x00") + FRAME_END


def queue_delete_frame(queue: bytes) -> bytes:
    """Queue.Delete on channel 1, unconditionally (not if-unused, not if-empty)."""
    return method(1, *QUEUE_DELETE, U16.pack(0) + shortstr(queue) + b"\x00")


def close_connection(conn: BlockingConn, timeout: float, before: bytes = b"") -> bool:
    """Send ``before`` then Connection.Close, and discard whatever arrives until Close-Ok or
    EOF, for at most ``timeout`` seconds. True when Close-Ok came: the broker had then
    processed every frame sent before. Never raises; the socket is closed."""
    close = U16.pack(200) + shortstr(b"bye") + MID.pack(0, 0)
    ok = False
    deadline = time.monotonic() + timeout
    with contextlib.suppress(OSError, BenchError):
        conn.send(before + method(0, 10, 50, close))
        while not ok:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            conn.sock.settimeout(left)
            while len(conn.buf) >= 7:
                kind, _channel, size = HDR.unpack_from(conn.buf, 0)
                if len(conn.buf) < size + 8:
                    break
                if kind == FRAME_METHOD and MID.unpack_from(conn.buf, 7) == CONNECTION_CLOSE_OK:
                    ok = True
                    break
                del conn.buf[: size + 8]
            if not ok:
                conn.fill()
    conn.close()
    return ok


def close_reason(conn: BlockingConn, wait: float = 0.5) -> str:
    """After a failed write: the Connection.Close/Channel.Close the broker sent, if any."""
    with contextlib.suppress(OSError, BenchError):
        conn.sock.settimeout(wait)
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            pos = 0
            while len(conn.buf) - pos >= 7:
                kind, _ch, size = HDR.unpack_from(conn.buf, pos)
                if len(conn.buf) - pos < size + 8:
                    break
                if kind == FRAME_METHOD and MID.unpack_from(conn.buf, pos + 7) in (
                    CONNECTION_CLOSE,
                    CHANNEL_CLOSE,
                ):
                    return _close_reason(bytes(conn.buf[pos + 7 : pos + 7 + size]))
                pos += size + 8
            conn.fill()
    return ""


@dataclass
class AmqpDriver:
    host: str
    port: int
    queue: str
    prefetch: int = 1000
    payload_size: int = 64
    user: str = "guest"
    password: str = "guest"
    name: str = "rabbitmq"

    def _open(self) -> BlockingConn:
        conn = connect(self.host, self.port, user=self.user, password=self.password)
        flags, arguments = self.declare_options()
        declare = U16.pack(0) + shortstr(self.queue.encode()) + flags + arguments
        conn.send(method(1, 50, 10, declare))
        expect_method(conn, 50, 11)
        return conn

    def declare_options(self) -> tuple[bytes, bytes]:
        """Queue.Declare flag bits and arguments table: non-durable, non-exclusive, not
        auto-delete, no arguments."""
        return b"\x00", EMPTY_TABLE

    def connect_publisher(self) -> BlockingConn:
        conn = self._open()
        confirm_select(conn)
        return conn

    def connect_subscriber(self) -> BlockingConn:
        conn = self._open()
        basic_qos(conn, self.prefetch)
        basic_consume(conn, self.queue.encode(), b"bench")
        return conn

    def publish_batch(self, start: int, count: int) -> bytes:
        pub = method(1, 60, 40, U16.pack(0) + shortstr(b"") + shortstr(self.queue.encode()) + b"\0")
        out: list[bytes] = []
        for i in range(start, start + count):
            body = make_payload(i, self.payload_size)
            # content header: class 60, weight 0, body size, no properties
            header = frame(FRAME_HEADER, 1, struct.pack(">HHQH", 60, 0, len(body), 0))
            out.append(pub + header + frame(FRAME_BODY, 1, body))
        return b"".join(out)

    def ack_counter(self) -> AmqpAckCounter:
        return AmqpAckCounter()

    def delivery_scanner(self) -> AmqpDeliveryScanner:
        return AmqpDeliveryScanner()

    def goodbye(self, conn: BlockingConn) -> None:
        close = U16.pack(200) + shortstr(b"bye") + MID.pack(0, 0)
        with contextlib.suppress(OSError):
            conn.send(method(0, 10, 50, close))
        conn.close()
