"""VibeMQ v1 wire protocol for the load generator: pre-encoded frames and cheap scanners.

Frame: u32 BE body length | version u8 | type u8 | id (u16 len + UTF-8) | queue (u16 len +
UTF-8) | payload (u32 len + JSON) | headers (u16 count + (u16 key, u16 value) pairs).
The hot paths never decode a whole body: the type is ``frame[5]`` and, since message ids are
fixed width, the id of a Deliver is a slice at a fixed offset.
"""

from __future__ import annotations

import contextlib
import json
import os
import struct
import uuid
from dataclasses import dataclass

from bench.common import BenchError, BlockingConn, BodySkip, Buffer, make_payload, same_heads

U16 = struct.Struct(">H")
U32 = struct.Struct(">I")

CONNECT = 0
CONNECT_ACK = 1
DISCONNECT = 2
PING = 10
PONG = 11
PUBLISH = 20
PUBLISH_ACK = 21
SUBSCRIBE = 22
SUBSCRIBE_ACK = 23
DELIVER = 26
ACK = 30
CREATE_QUEUE = 40
QUEUE_INFO = 42
ERROR = 99


def _s(value: bytes) -> bytes:
    return U16.pack(len(value)) + value


def body(
    type_: int,
    msg_id: str,
    queue: str = "",
    payload: bytes = b"",
    headers: dict[str, str] | None = None,
) -> bytes:
    parts = [bytes((1, type_)), _s(msg_id.encode()), _s(queue.encode()), U32.pack(len(payload))]
    parts.append(payload)
    items = list((headers or {}).items())
    parts.append(U16.pack(len(items)))
    for key, value in items:
        parts.append(_s(key.encode()))
        parts.append(_s(value.encode()))
    return b"".join(parts)


def frame(
    type_: int,
    msg_id: str,
    queue: str = "",
    payload: bytes = b"",
    headers: dict[str, str] | None = None,
) -> bytes:
    b = body(type_, msg_id, queue, payload, headers)
    return U32.pack(len(b)) + b


@dataclass
class Decoded:
    """Slow-path decode, for handshakes and error reports only."""

    type: int
    id: str
    queue: str
    payload: bytes
    headers: dict[str, str]
    error: str


def decode(b: bytes) -> Decoded:
    pos = 2

    def text() -> str:
        nonlocal pos
        (n,) = U16.unpack_from(b, pos)
        pos += 2 + n
        return b[pos - n : pos].decode()

    msg_id = text()
    queue = text()
    (plen,) = U32.unpack_from(b, pos)
    pos += 4
    payload = b[pos : pos + plen]
    pos += plen
    (count,) = U16.unpack_from(b, pos)
    pos += 2
    headers = {}
    for _ in range(count):
        key = text()
        headers[key] = text()
    error = ""
    if pos < len(b):
        code = text()
        error = f"{code}: {text()}"
    return Decoded(b[1], msg_id, queue, payload, headers, error)


def read_message(conn: BlockingConn) -> Decoded:
    (n,) = U32.unpack(conn.read_exact(4))
    return decode(conn.read_exact(n))


def request(conn: BlockingConn, data: bytes, expect: int) -> Decoded:
    """Send one request and read replies until one of type ``expect`` (or an Error)."""
    conn.send(data)
    for _ in range(1000):
        msg = read_message(conn)
        if msg.type == expect:
            return msg
        if msg.type == ERROR:
            raise BenchError(f"VibeMQ error for {msg.id}: {msg.error}")
    raise BenchError(f"no reply of type {expect}")


def handshake(conn: BlockingConn, client: str, login: tuple[str, str] | None = None) -> None:
    """Connect (anonymous, or with ``login``: a user name and password)."""
    cid = f"c-{client}-{os.getpid()}"
    headers = {"clientVersion": "bench"}
    if login is not None:
        headers |= {"username": login[0], "password": login[1]}
    reply = request(conn, frame(CONNECT, cid, headers=headers), CONNECT_ACK)
    if reply.id != cid:
        raise BenchError(f"ConnectAck id {reply.id!r} != {cid!r}")


#: a frame's head: body length, version, type, id length
HEAD = struct.Struct(">IBBH")


def _error(buf: Buffer, pos: int, size: int) -> str:
    return decode(bytes(buf[pos + 4 : pos + size])).error


class VibeAckCounter:
    """Counts PublishAck frames; an Error frame (a publish refused) stops the run. A run of
    PublishAcks of the first one's size is counted with ``same_heads`` over their length,
    version and type (each frame's checked); what does not fit goes frame by frame."""

    def __init__(self) -> None:
        self.errors = 0
        self.first_error = ""

    def feed(self, buf: bytearray) -> tuple[int, int]:
        pos = 0
        end = len(buf)
        acked = 0
        while end - pos >= 6:
            (n,) = U32.unpack_from(buf, pos)
            size = 4 + n
            if end - pos < size:
                break
            t = buf[pos + 5]
            if t == PUBLISH_ACK:
                k = same_heads(buf, pos, size, (end - pos) // size, 6)
                acked += k
                pos += k * size
                continue
            if t == ERROR:
                self.errors += 1
                self.first_error = _error(buf, pos, size)
                raise BenchError(f"publish rejected: {self.first_error}")
            pos += size
        return pos, acked


class VibeDeliveryScanner:
    """Parses every Deliver (its length, type, id and queue length in one precompiled
    ``struct`` unpack for the id length of the last one) and answers each with an Ack (id
    ``a<id>``, header ``messageId=<id>``) from pre-encoded pieces around the id -- all acks
    of one read go out in one write, as MQTT's scanner answers each PUBLISH with its PUBACK.
    ``ack_queue``: with the Deliver's queue in the Ack's queue field, as the client library
    sends it (it names the subscription for a broker connection subscribed to many
    queues). A Deliver whose head has come but not all its body is consumed as far as it
    came, its Ack made, and its rest skipped by its length (``BodySkip``)."""

    def __init__(self, ack_queue: bool = False) -> None:
        self.ack_queue = ack_queue
        self._parts: dict[tuple[int, int], tuple[bytes, bytes]] = {}
        self._skip = BodySkip()
        self._tune(0)

    def _ack_parts(self, idlen: int, qlen: int = -1) -> tuple[bytes, bytes]:
        """The Ack's bytes before its id and after its queue field (``qlen`` -1: the
        empty queue field included in the second)."""
        parts = self._parts.get((idlen, qlen))
        if parts is None:
            # body: 01 1e | u16 idlen+1 "a"+id | u16 qlen queue | 00000000 payload
            #       | 0001 headers | 0009 "messageId" | u16 idlen id
            blen = 2 + 2 + idlen + 1 + 2 + max(qlen, 0) + 4 + 2 + 2 + 9 + 2 + idlen
            pre = U32.pack(blen) + b"\x01\x1e" + U16.pack(idlen + 1) + b"a"
            mid = b"\x00\x00\x00\x00" + b"\x00\x01" + b"\x00\x09messageId"
            if qlen < 0:
                mid = b"\x00\x00" + mid
            parts = (pre, mid + U16.pack(idlen))
            self._parts[(idlen, qlen)] = parts
        return parts

    def _tune(self, width: int) -> None:
        """Unpack frames with ids of ``width`` bytes from here on: length, version, type, id
        length, id and queue length at once (every frame has an id and a queue field)."""
        compiled = struct.Struct(f">IBBH{width}sH")
        self._width, self._unpack, self._need = width, compiled.unpack_from, compiled.size

    def feed(self, buf: Buffer, end: int = -1) -> tuple[int, int, bytes]:
        end = len(buf) if end < 0 else end
        acks = bytearray()
        skip = self._skip
        pos, delivered = skip.resume(end, acks) if skip.left else (0, 0)
        ack_queue = self.ack_queue
        while True:
            width, unpack, need = self._width, self._unpack, self._need
            pre, mid = self._ack_parts(width)
            parts_qlen = -1
            while end - pos >= need:
                n, _, t, idlen, mid_id, qlen = unpack(buf, pos)
                size = 4 + n
                if end - pos < size:
                    if t == DELIVER and idlen == width and end - pos >= need + qlen:
                        # its head (the queue field too) is in: the rest skipped by length
                        q = pos + 8 + width
                        queue = buf[q : q + 2 + qlen] if ack_queue else b""
                        pre, mid = self._ack_parts(width, qlen if ack_queue else -1)
                        skip.begin(size - (end - pos), pre + mid_id + queue + mid + mid_id)
                        return end, delivered, bytes(acks)
                    break
                if t == DELIVER and idlen == width:
                    if ack_queue:
                        if qlen != parts_qlen:
                            pre, mid = self._ack_parts(width, qlen)
                            parts_qlen = qlen
                        q = pos + 8 + width
                        acks += pre
                        acks += mid_id
                        acks += buf[q : q + 2 + qlen]
                    else:
                        acks += pre
                        acks += mid_id
                    acks += mid
                    acks += mid_id
                    delivered += 1
                elif idlen != width:
                    break  # (tuned for its id length below)
                elif t == ERROR:
                    raise BenchError("VibeMQ error on subscriber: " + _error(buf, pos, size))
                pos += size
            # the next frame: incomplete, or one with an id of another length
            if end - pos < 8 or HEAD.unpack_from(buf, pos)[3] == self._width:
                return pos, delivered, bytes(acks)
            self._tune(HEAD.unpack_from(buf, pos)[3])


class VibeNoAckScanner(VibeDeliveryScanner):
    """Counts Deliver frames and answers nothing (a FanOutWithoutAck subscriber). As
    ``mqtt_bench.DeliveryScanner`` does for MQTT: a run of frames of the first one's size
    is checked a column at a time (``same_heads`` over length, version, type and id
    length), at C speed; what does not fit goes frame by frame."""

    def feed(self, buf: Buffer, end: int = -1) -> tuple[int, int, bytes]:
        end = len(buf) if end < 0 else end
        skip = self._skip
        pos, delivered = skip.resume(end, bytearray()) if skip.left else (0, 0)
        while end - pos >= 8:
            (n,) = U32.unpack_from(buf, pos)
            size = 4 + n
            if end - pos < size:
                if buf[pos + 5] == DELIVER:  # the rest skipped by its length
                    skip.begin(size - (end - pos), b"")
                    return end, delivered, b""
                break
            t = buf[pos + 5]
            if t == DELIVER:
                k = same_heads(buf, pos, size, (end - pos) // size, 8)
                delivered += k
                pos += k * size
                continue
            if t == ERROR:
                raise BenchError("VibeMQ error on subscriber: " + _error(buf, pos, size))
            pos += size
        return pos, delivered, b""


def path_queue(durable: bool) -> str:
    """A fresh queue name for the 1 -> 1 native path, the same in every bench that compares
    transient and durable (bench.paths_bench, bench.build_ab): the name is in every frame and
    every journal record (``native-durable-xxxxxxxx`` against ``ab-xxxxxxxx``: 36 bytes a
    durable message more, ~130 instructions)."""
    return f"{'native-durable' if durable else 'native'}-{uuid.uuid4().hex[:8]}"


@dataclass
class VibeDriver:
    host: str
    port: int
    queue: str
    prefetch: int = 1000
    payload_size: int = 64
    max_queue_size: int = 2_000_000
    id_prefix: str = "m"
    name: str = "vibemq"
    #: over TLS: the CA file that verifies the broker
    tls_ca: str | None = None
    #: a user name and password to log in with (None: anonymous)
    login: tuple[str, str] | None = None
    #: the queue's delivery mode (CreateQueue ``mode``)
    mode: str = "RoundRobin"
    #: CreateQueue ``durable``: None leaves it to the broker's queue_defaults (durable today)
    durable: bool | None = None
    #: the subscriber's Acks carry the Deliver's queue field, as the client library's do
    ack_queue: bool = False

    def msg_id(self, i: int) -> str:
        return f"{self.id_prefix}{i:08d}"

    def connect_publisher(self) -> BlockingConn:
        conn = BlockingConn(self.host, self.port, tls_ca=self.tls_ca)
        handshake(conn, "pub", self.login)
        return conn

    def create_queue(self, conn: BlockingConn, options: dict[str, object]) -> None:
        data = json.dumps(options).encode()
        try:
            request(conn, frame(CREATE_QUEUE, f"cq-{os.getpid()}", self.queue, data), CREATE_QUEUE)
        except BenchError as exc:
            if "QUEUE_EXISTS" not in str(exc):
                raise

    def connect_subscriber(self) -> BlockingConn:
        conn = BlockingConn(self.host, self.port, tls_ca=self.tls_ca)
        handshake(conn, "sub", self.login)
        self.subscribe(conn)
        return conn

    def subscribe(self, conn: BlockingConn) -> None:
        """Create the queue (if it does not exist) and subscribe to it on ``conn``."""
        options: dict[str, object] = {"mode": self.mode, "maxQueueSize": self.max_queue_size}
        if self.durable is not None:
            options["durable"] = self.durable
        self.create_queue(conn, options)
        sub = frame(
            SUBSCRIBE, f"s-{os.getpid()}", self.queue, headers={"prefetch": str(self.prefetch)}
        )
        request(conn, sub, SUBSCRIBE_ACK)

    def publish_batch(self, start: int, count: int) -> bytes:
        q = _s(self.queue.encode())
        size = self.payload_size
        out: list[bytes] = []
        for i in range(start, start + count):
            mid = self.msg_id(i).encode()
            payload = make_payload(i, size)
            b = b"\x01\x14" + _s(mid) + q + U32.pack(len(payload)) + payload + b"\x00\x00"
            out.append(U32.pack(len(b)) + b)
        return b"".join(out)

    def ack_counter(self) -> VibeAckCounter:
        return VibeAckCounter()

    def delivery_scanner(self) -> VibeDeliveryScanner:
        return VibeDeliveryScanner(self.ack_queue)

    def goodbye(self, conn: BlockingConn) -> None:
        with contextlib.suppress(OSError):
            conn.send(frame(DISCONNECT, f"d-{os.getpid()}"))
        conn.close()
