"""The MQTT load generator's byte-stream scanners (bench/mqtt_driver.py): whatever the read
sizes, topic lengths, remaining-length sizes and the other packets in between, the subscriber
answers every QoS 1 PUBLISH with its PUBACK, in order, and the publisher counts every PUBACK
once."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

# bench/ is a top-level package of the repository, not installed
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchscan import run_counter, run_scanner

from bench.common import BenchError
from bench.mqtt_driver import MqttAckCounter, MqttDeliveryScanner
from vibemq_server.adapters.mqtt.codec import encode, encode_publish
from vibemq_server.adapters.mqtt.packets import Pingresp, Puback, Suback, Unsuback

topics = st.sampled_from([b"b", b"b/0123abcd", b"a/much/longer/topic/name/for/the/bench"])
#: 1, 2 and 3 bytes of remaining length
payload_sizes = st.sampled_from([0, 1, 64, 120, 200, 4000, 16_400])
packet_ids = st.integers(1, 65535)
#: packets a subscriber or publisher may see between the ones it counts
others = st.sampled_from(
    [
        encode(Pingresp()),
        encode(Suback(7, (1,))),
        encode(Unsuback(9)),
        encode_publish(b"b/qos0", b"{}"),  # QoS 0: a delivery that takes no PUBACK
    ]
)

#: a QoS 1 PUBLISH: topic, payload size, packet id, retain, dup
Pub = tuple[bytes, int, int, bool, bool]


@st.composite
def deliveries(draw: st.DrawFn) -> list[Pub | bytes]:
    """QoS 1 PUBLISHes, runs of them of one shape, and other packets between."""
    out: list[Pub | bytes] = []
    for _ in range(draw(st.integers(0, 6))):
        if draw(st.booleans()):
            out.append(draw(others))
            continue
        topic, size, flags = draw(topics), draw(payload_sizes), draw(st.booleans())
        out.extend((topic, size, pid, flags, False) for pid in draw(st.lists(packet_ids)))
        pubs = st.tuples(topics, payload_sizes, packet_ids, st.booleans(), st.booleans())
        out.extend(draw(st.lists(pubs, max_size=3)))
    return out


def wire(item: Pub | bytes) -> bytes:
    if isinstance(item, bytes):
        return item
    topic, size, pid, retain, dup = item
    return encode_publish(topic, b"x" * size, 1, pid, retain=retain, dup=dup)


@settings(max_examples=200, deadline=None)
@given(deliveries(), st.lists(st.integers(0, 200_000), max_size=30))
def test_every_publish_gets_its_puback(items: list[Pub | bytes], cuts: list[int]) -> None:
    sent = [x for x in items if isinstance(x, tuple)]
    qos0 = sum(isinstance(x, bytes) and x[0] & 0xF0 == 0x30 for x in items)
    want = b"".join(encode(Puback(x[2])) for x in sent)
    data = b"".join(wire(x) for x in items)
    # one read, and the reads the cuts make: the same PUBACKs, nothing left over
    assert run_scanner(MqttDeliveryScanner(), data, []) == (len(sent) + qos0, want, 0)
    assert run_scanner(MqttDeliveryScanner(), data, cuts) == (len(sent) + qos0, want, 0)


def puback5(packet_id: int) -> bytes:
    """An MQTT 5 style PUBACK with a reason code: a PUBACK of another length."""
    return b"\x40\x03" + packet_id.to_bytes(2, "big") + b"\x00"


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.one_of(packet_ids, st.tuples(packet_ids), others), max_size=60),
    st.lists(st.integers(0, 2_000), max_size=30),
)
def test_every_puback_counted_once(items: list[int | tuple[int] | bytes], cuts: list[int]) -> None:
    """Plain PUBACKs, longer ones (``(id,)``) and other packets of a PUBACK's size (UNSUBACK)
    between them: each PUBACK counted once, nothing else."""
    data = b"".join(
        x if isinstance(x, bytes) else encode(Puback(x)) if isinstance(x, int) else puback5(*x)
        for x in items
    )
    want = sum(not isinstance(x, bytes) for x in items)
    assert run_counter(MqttAckCounter(), data, cuts) == (want, 0)


def test_a_run_of_pubacks_checks_every_head() -> None:
    """A packet of a PUBACK's size but another type, or a PUBACK of another length, inside a
    run of PUBACKs: every ack's type and length byte are checked, not only the first's."""
    pubacks = encode(Puback(1)) + encode(Puback(2))
    for other, counted in ((encode(Unsuback(3)), 0), (puback5(3), 1)):
        data = pubacks + other + pubacks
        assert MqttAckCounter().feed(bytearray(data)) == (len(data), 4 + counted)


def test_a_malformed_publish_stops_the_scanner() -> None:
    """A QoS 1 PUBLISH whose topic runs past its end is an error, not a PUBACK of junk."""
    with pytest.raises(BenchError, match="malformed"):
        MqttDeliveryScanner().feed(bytearray(b"\x32\x04\x00\x05ab" + encode(Pingresp())))
