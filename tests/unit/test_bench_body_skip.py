"""The load generators' subscribers scan their reads in place and skip a delivery's body by
its length (``ReadArea``, ``BodySkip`` in bench/common.py): whatever the read cuts and
payload sizes, after every read exactly the deliveries whose last byte has come are counted
and acked, in order, and what is held between reads is never more than a frame's head (no
payload is copied)."""

from __future__ import annotations

import sys
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

# bench/ is a top-level package of the repository, not installed
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchscan import chunked

from bench.common import DeliveryScanner, ReadArea
from bench.mqtt_driver import MqttDeliveryScanner
from bench.vibemq_driver import VibeDeliveryScanner, VibeNoAckScanner
from vibemq_server.adapters.mqtt.codec import encode as mqtt_encode
from vibemq_server.adapters.mqtt.codec import encode_publish
from vibemq_server.adapters.mqtt.packets import Puback
from vibemq_server.protocol import CommandType, Message, encode
from vibemq_server.protocol.codec import encode_deliver

#: small, a read's size and beyond it (the subscriber reads 256,000 bytes at most)
sizes = st.sampled_from([0, 5, 900, 70_000, 300_000])
cuts = st.lists(st.integers(0, 2_000_000), max_size=40)
#: more than any head here (a Deliver's: 4 + 2 + 2 + id + 2 + queue + 4; a PUBLISH's:
#: 1 + 4 + 2 + topic + 2) and less than any payload that could be held instead
HEAD_BOUND = 64


def check(scanner: DeliveryScanner, frames: list[tuple[bytes, bytes]], cut: list[int]) -> None:
    """Feed the frames (wire bytes, expected ack) read by read and check every read."""
    data = b"".join(f for f, _ in frames)
    ends = []
    at = 0
    for f, _ in frames:
        at += len(f)
        ends.append(at)
    reads = ReadArea()
    seen = delivered = 0
    acks = b""
    for part in chunked(data, cut):
        n, reply = reads.feed(part, scanner)
        seen += len(part)
        delivered += n
        acks += reply
        done = sum(end <= seen for end in ends)
        assert delivered == done
        assert acks == b"".join(a for _, a in frames[:done])
        assert reads.held < HEAD_BOUND
    assert delivered == len(frames)
    assert not reads.held


def native_ack(msg_id: str, queue: str) -> bytes:
    return encode(Message(CommandType.ACK, f"a{msg_id}", queue, headers={"messageId": msg_id}))


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 10**6), sizes), max_size=8), cuts, st.booleans())
def test_native_deliveries_counted_when_complete(
    items: list[tuple[int, int]], cut: list[int], ack_queue: bool
) -> None:
    queue = "bench-large"
    frames = []
    for n, size in items:
        msg_id = f"m{n:08d}"
        wire = encode_deliver(msg_id, queue, b"x" * size, {"messageId": msg_id}, 1)
        frames.append((wire, native_ack(msg_id, queue if ack_queue else "")))
    check(VibeDeliveryScanner(ack_queue), frames, cut)
    check(VibeNoAckScanner(), [(f, b"") for f, _ in frames], cut)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2), st.integers(1, 65535), sizes), max_size=8), cuts)
def test_mqtt_publishes_counted_when_complete(
    items: list[tuple[int, int, int]], cut: list[int]
) -> None:
    frames = []
    for qos, pid, size in items:
        qos = min(qos, 1)
        wire = encode_publish(b"bench/large", b"x" * size, qos, pid if qos else 0)
        frames.append((wire, mqtt_encode(Puback(pid)) if qos else b""))
    check(MqttDeliveryScanner(), frames, cut)


def test_a_head_cut_short_is_not_read_past_the_read() -> None:
    """A read that ends inside a PUBLISH's remaining length or a Deliver's head: the bytes
    after it in the area (an earlier read's) are not taken for the rest of the head."""
    for size in (300, 70_000, 300_000):  # remaining lengths of 2, 3 and 3 bytes
        pubs = [encode_publish(b"bench/large", b"x" * size, 1, pid) for pid in (1, 2, 3)]
        want = [(p, mqtt_encode(Puback(pid))) for pid, p in zip((1, 2, 3), pubs, strict=True)]
        for into in range(1, 8):
            check(MqttDeliveryScanner(), want, [len(pubs[0]) + into])
            check(MqttDeliveryScanner(), want, [len(pubs[0]) // 2, len(pubs[0]) + into])
        delivers = [
            (encode_deliver(m, "q", b"x" * size, {}, 1), native_ack(m, "q"))
            for m in ("m1", "m2", "m3")
        ]
        for into in range(1, 16):
            check(VibeDeliveryScanner(True), delivers, [len(delivers[0][0]) + into])
