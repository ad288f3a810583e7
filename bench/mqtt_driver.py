"""MQTT 3.1.1 for the load generator, raw packets: CONNECT, SUBSCRIBE (QoS 1), PUBLISH QoS 1
with packet ids, PUBACK in both directions. Nothing is decoded beyond the fixed header and,
for an incoming PUBLISH, the packet id that the PUBACK must echo."""

from __future__ import annotations

import contextlib
import os
import struct
import uuid
from dataclasses import dataclass

from bench.common import BenchError, BlockingConn, BodySkip, Buffer, make_payload, same_heads
from vibemq_server.adapters.mqtt.codec import encode_remaining_length

U16 = struct.Struct(">H")

CONNACK = 0x20
PUBLISH = 0x30
PUBACK = 0x40
SUBACK = 0x90

#: a PUBACK's type and remaining length, before the packet id it echoes
PUBACK_HEAD = b"\x40\x02"
#: before any PUBLISH is seen (never used: the shape's size is out of reach)
HEAD_AND_ID = struct.Struct("0s2s")


def _s(value: bytes) -> bytes:
    return U16.pack(len(value)) + value


def packet(first: int, rest: bytes) -> bytes:
    return bytes((first,)) + encode_remaining_length(len(rest)) + rest


def parse_header(buf: Buffer, pos: int, end: int = -1) -> tuple[int, int] | None:
    """(header length, remaining length) of the packet at ``pos`` in ``buf`` up to ``end``
    (-1: all of it), None if incomplete."""
    end = len(buf) if end < 0 else end
    mult = 1
    value = 0
    i = pos + 1
    while True:
        if i >= end:
            return None
        byte = buf[i]
        value += (byte & 0x7F) * mult
        i += 1
        if not byte & 0x80:
            return i - pos, value
        mult *= 128
        if mult > 128**3:
            raise BenchError("malformed MQTT remaining length")


def read_packet(conn: BlockingConn) -> tuple[int, bytes]:
    while True:
        hdr = parse_header(conn.buf, 0)
        if hdr is not None and len(conn.buf) >= hdr[0] + hdr[1]:
            first = conn.buf[0]
            data = conn.read_exact(hdr[0] + hdr[1])
            return first, data[hdr[0] :]
        conn.fill()


class MqttAckCounter:
    """Counts PUBACKs. A run of 4-byte PUBACKs (``40 02 id id``) is counted with
    ``same_heads`` over their type and length bytes (each ack's checked), as native's
    PublishAck counter does; anything else goes packet by packet."""

    def feed(self, buf: bytearray) -> tuple[int, int]:
        pos = 0
        end = len(buf)
        acked = 0
        while pos < end:
            if buf[pos] == PUBACK and end - pos >= 4 and buf[pos + 1] == 2:
                k = same_heads(buf, pos, 4, (end - pos) // 4, 2)
                acked += k
                pos += 4 * k
                continue
            hdr = parse_header(buf, pos)
            if hdr is None or end - pos < hdr[0] + hdr[1]:
                break
            if buf[pos] & 0xF0 == PUBACK:
                acked += 1
            pos += hdr[0] + hdr[1]
        return pos, acked


class MqttDeliveryScanner:
    """Parses every PUBLISH and answers each QoS > 0 one with its PUBACK; all PUBACKs of a
    read go out in one write. As native's scanner does with a Deliver, a PUBLISH of the
    shape of the last one (its first byte, remaining length and topic length: ``_head``)
    is read with one precompiled ``struct`` unpack (that head and the packet id), its
    PUBACK appended from a pre-encoded piece and the id; another shape retunes the
    struct, and what is not a QoS > 0 PUBLISH goes packet by packet. A PUBLISH whose head
    (and packet id) has come but not all its payload is consumed as far as it came, its
    PUBACK made, and its rest skipped by its length (``BodySkip``)."""

    def __init__(self) -> None:
        # no shape yet: the fast loop waits for the first QoS > 0 PUBLISH to tune it
        self._head, self._size, self._unpack = b"", 1 << 62, HEAD_AND_ID.unpack_from
        self._skip = BodySkip()

    def _tune(self, head: bytes, size: int) -> None:
        """Read PUBLISHes that start with ``head`` (fixed header and topic length), all of
        ``size`` bytes, from here on: the head and the packet id after the topic at once."""
        tlen = int.from_bytes(head[-2:], "big")
        if len(head) + tlen + 2 > size:
            raise BenchError(f"malformed MQTT PUBLISH: {head.hex()}")
        compiled = struct.Struct(f"{len(head)}s{tlen}x2s")
        self._head, self._size, self._unpack = head, size, compiled.unpack_from

    def _skip_publish(self, buf: Buffer, pos: int, end: int, fixed: int, size: int) -> None:
        """Skip the rest of the PUBLISH of ``size`` bytes at ``pos`` (its fixed header
        ``fixed`` bytes) if its topic and packet id have come by ``end``: its PUBACK is
        made now."""
        at = pos + fixed
        if end - at < 2:
            return
        after = at + 2 + int.from_bytes(buf[at : at + 2], "big")  # the packet id, if QoS > 0
        if after + 2 > pos + size:
            return  # (its topic runs past its end: read whole, _tune says it is malformed)
        if buf[pos] & 0x06 == 0:
            self._skip.begin(size - (end - pos), b"")
        elif end - after >= 2:
            self._skip.begin(size - (end - pos), PUBACK_HEAD + buf[after : after + 2])

    def feed(self, buf: Buffer, end: int = -1) -> tuple[int, int, bytes]:
        end = len(buf) if end < 0 else end
        acks = bytearray()
        skip = self._skip
        pos, delivered = skip.resume(end, acks) if skip.left else (0, 0)
        while True:
            head, size, unpack = self._head, self._size, self._unpack
            while end - pos >= size:
                got, pid = unpack(buf, pos)
                if got != head:
                    break
                acks += PUBACK_HEAD
                acks += pid
                delivered += 1
                pos += size
            # the next packet: incomplete, or of another shape
            hdr = parse_header(buf, pos, end)
            if hdr is None:
                return pos, delivered, bytes(acks)
            first = buf[pos]
            if end - pos < hdr[0] + hdr[1]:
                if first & 0xF0 == PUBLISH:
                    self._skip_publish(buf, pos, end, hdr[0], hdr[0] + hdr[1])
                    if skip.left:
                        return end, delivered, bytes(acks)
                return pos, delivered, bytes(acks)
            if first & 0xF0 == PUBLISH and first & 0x06:  # QoS > 0: read it tuned
                self._tune(bytes(buf[pos : pos + hdr[0] + 2]), hdr[0] + hdr[1])
                continue
            if first & 0xF0 == PUBLISH:
                delivered += 1
            pos += hdr[0] + hdr[1]


@dataclass
class MqttDriver:
    host: str
    port: int
    topic: str
    payload_size: int = 64
    name: str = "mosquitto"
    #: False: a persistent session (on VibeMQ a durable queue behind it), a fresh client id
    clean: bool = True

    def _connect(self, role: str) -> BlockingConn:
        conn = BlockingConn(self.host, self.port)
        client_id = f"bench-{role}-{os.getpid()}"
        if not self.clean:  # never resume an earlier run's session
            client_id += f"-{uuid.uuid4().hex[:8]}"
        # protocol name, level 4, clean session flag, keep-alive 600 s
        flags = 0x02 if self.clean else 0x00
        vh = _s(b"MQTT") + bytes((4, flags)) + U16.pack(600) + _s(client_id.encode())
        conn.send(packet(0x10, vh))
        first, rest = read_packet(conn)
        if first != CONNACK or len(rest) < 2 or rest[1] != 0:
            raise BenchError(f"MQTT CONNACK refused: {first:#x} {rest.hex()}")
        return conn

    def connect_publisher(self) -> BlockingConn:
        return self._connect("pub")

    def connect_subscriber(self) -> BlockingConn:
        conn = self._connect("sub")
        self.subscribe(conn)
        return conn

    def subscribe(self, conn: BlockingConn) -> None:
        """Subscribe ``conn`` to this driver's topic (QoS 1), waiting for the SUBACK."""
        conn.send(packet(0x82, U16.pack(1) + _s(self.topic.encode()) + b"\x01"))
        first, rest = read_packet(conn)
        if first != SUBACK or rest[-1] not in (0, 1):
            raise BenchError(f"MQTT SUBACK refused: {first:#x} {rest.hex()}")

    def publish_batch(self, start: int, count: int) -> bytes:
        topic = _s(self.topic.encode())
        out: list[bytes] = []
        for i in range(start, start + count):
            pid = i % 65535 + 1
            out.append(packet(0x32, topic + U16.pack(pid) + make_payload(i, self.payload_size)))
        return b"".join(out)

    def ack_counter(self) -> MqttAckCounter:
        return MqttAckCounter()

    def delivery_scanner(self) -> MqttDeliveryScanner:
        return MqttDeliveryScanner()

    def goodbye(self, conn: BlockingConn) -> None:
        with contextlib.suppress(OSError):
            conn.send(b"\xe0\x00")
        conn.close()
