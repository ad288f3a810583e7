"""MQTT 3.1.1 for the load generator, raw packets: CONNECT, SUBSCRIBE (QoS 1), PUBLISH QoS 1
with packet ids, PUBACK in both directions. Nothing is decoded beyond the fixed header and,
for an incoming PUBLISH, the packet id that the PUBACK must echo."""

from __future__ import annotations

import contextlib
import os
import struct
import uuid
from dataclasses import dataclass

from bench.common import BenchError, BlockingConn, make_payload
from vibemq_server.adapters.mqtt.codec import encode_remaining_length

U16 = struct.Struct(">H")

CONNACK = 0x20
PUBLISH = 0x30
PUBACK = 0x40
SUBACK = 0x90


def _s(value: bytes) -> bytes:
    return U16.pack(len(value)) + value


def packet(first: int, rest: bytes) -> bytes:
    return bytes((first,)) + encode_remaining_length(len(rest)) + rest


def parse_header(buf: bytes | bytearray, pos: int) -> tuple[int, int] | None:
    """(header length, remaining length) of the packet at ``pos``, None if incomplete."""
    end = len(buf)
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
    def feed(self, buf: bytearray) -> tuple[int, int]:
        pos = 0
        end = len(buf)
        acked = 0
        while pos < end:
            if buf[pos] == PUBACK and end - pos >= 4:  # fast path: 40 02 pid pid
                acked += 1
                pos += 4
                continue
            hdr = parse_header(buf, pos)
            if hdr is None or end - pos < hdr[0] + hdr[1]:
                break
            if buf[pos] & 0xF0 == PUBACK:
                acked += 1
            pos += hdr[0] + hdr[1]
        return pos, acked


class MqttDeliveryScanner:
    def feed(self, buf: bytearray) -> tuple[int, int, bytes]:
        pos = 0
        end = len(buf)
        delivered = 0
        acks = bytearray()
        while pos < end:
            if buf[pos] == 0x32 and end - pos >= 2 and buf[pos + 1] < 128:
                # fast path: QoS 1 PUBLISH with a one-byte remaining length
                size = 2 + buf[pos + 1]
                if end - pos < size:
                    break
                pid = pos + 4 + ((buf[pos + 2] << 8) | buf[pos + 3])
                acks += b"\x40\x02"
                acks += buf[pid : pid + 2]
                delivered += 1
                pos += size
                continue
            hdr = parse_header(buf, pos)
            if hdr is None or end - pos < hdr[0] + hdr[1]:
                break
            first = buf[pos]
            if first & 0xF0 == PUBLISH:
                delivered += 1
                if first & 0x06:  # QoS > 0: answer with the packet id after the topic
                    vh = pos + hdr[0]
                    tlen = (buf[vh] << 8) | buf[vh + 1]
                    pid = vh + 2 + tlen
                    acks += b"\x40\x02"
                    acks += buf[pid : pid + 2]
            pos += hdr[0] + hdr[1]
        return pos, delivered, bytes(acks)


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
