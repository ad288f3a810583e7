"""The AMQP benchmark's byte-stream scanners (bench/amqp_bench.py): whatever the read sizes and
whatever odd frames come in between, they count every delivery and confirm exactly once."""

from __future__ import annotations

import struct
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

# bench/ is a top-level package of the repository, not installed
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchscan import chunked

from bench import amqp_driver as d
from bench.amqp_bench import ConfirmCounter, DeliveryScanner
from bench.common import BenchError

HEARTBEAT = d.frame(d.FRAME_HEARTBEAT, 0, b"")


def delivery(tag: int, body: bytes = b"x" * 64, rkey: bytes = b"q", props: bytes = b"") -> bytes:
    args = d.shortstr(b"ab") + struct.pack(">Q", tag) + b"\x00" + d.shortstr(b"") + d.shortstr(rkey)
    flags = 0x1000 if props else 0
    header = struct.pack(">HHQH", 60, 0, len(body), flags) + props
    out = d.method(1, 60, 60, args) + d.frame(d.FRAME_HEADER, 1, header)
    # a body larger than 100 bytes comes in two frames
    for i in range(0, len(body), 100):
        out += d.frame(d.FRAME_BODY, 1, body[i : i + 100])
    return out


# one delivery in the stream: (kind, heartbeat before it)
shapes = st.tuples(
    st.sampled_from(["plain", "plain", "plain", "long-key", "props", "two-body"]), st.booleans()
)


def build(items: list[tuple[str, bool]]) -> bytes:
    out = b""
    for tag, (kind, beat) in enumerate(items, start=1):
        if beat:
            out += HEARTBEAT
        if kind == "plain":
            out += delivery(tag)
        elif kind == "long-key":
            out += delivery(tag, rkey=b"another-queue")
        elif kind == "props":
            out += delivery(tag, props=b"\x02")
        else:
            out += delivery(tag, body=b"y" * 150)
    return out


@settings(max_examples=200, deadline=None)
@given(st.lists(shapes, min_size=1, max_size=80), st.lists(st.integers(0, 20_000), max_size=30))
def test_delivery_scanner_counts_every_delivery(
    items: list[tuple[str, bool]], cuts: list[int]
) -> None:
    data = build(items)
    scanner = DeliveryScanner()
    for part in chunked(data, cuts):
        scanner.feed(part)
    assert scanner.delivered == len(items)
    assert scanner.last_tag == len(items)
    assert scanner.others == sum(beat for _kind, beat in items)
    assert scanner.rest == b""


def test_delivery_scanner_fast_path_takes_uniform_deliveries() -> None:
    data = b"".join(delivery(t) for t in range(1, 1001))
    scanner = DeliveryScanner()
    scanner.feed(data[:1000])
    scanner.feed(data[1000:])
    assert scanner.delivered == 1000
    assert scanner.slow <= 2  # the template and the one torn by the read boundary


def test_delivery_scanner_raises_on_close() -> None:
    close = d.method(1, 20, 40, struct.pack(">H", 406) + d.shortstr(b"PRECONDITION") + b"\0" * 4)
    scanner = DeliveryScanner()
    with pytest.raises(BenchError, match="406 PRECONDITION"):
        scanner.feed(delivery(1) + close)


def acks(events: list[tuple[int, bool]]) -> bytes:
    return b"".join(
        d.method(1, 60, 80, struct.pack(">QB", tag, multiple)) for tag, multiple in events
    )


@st.composite
def confirm_streams(draw: st.DrawFn) -> tuple[int, list[tuple[int, bool]]]:
    """A broker's confirms for publishes 1..n: in order, each tag either acked alone or
    covered by a later multiple ack (which may also repeat an already confirmed tag)."""
    n = draw(st.integers(1, 300))
    events: list[tuple[int, bool]] = []
    tag = 0
    while tag < n:
        step = draw(st.integers(1, min(50, n - tag)))
        if step == 1 or draw(st.booleans()):
            events += [(t, False) for t in range(tag + 1, tag + step + 1)]
        else:
            events.append((tag + step, True))
        tag += step
        if draw(st.integers(0, 9)) == 0:
            events.append((tag, True))  # a repeated multiple ack confirms nothing new
    return n, events


@settings(max_examples=200, deadline=None)
@given(confirm_streams(), st.lists(st.integers(0, 10_000), max_size=20))
def test_confirm_counter(stream: tuple[int, list[tuple[int, bool]]], cuts: list[int]) -> None:
    n, events = stream
    counter = ConfirmCounter()
    for part in chunked(acks(events), cuts):
        counter.feed(part)
    assert counter.confirmed == n
    assert counter.nacks == 0


def test_confirm_counter_out_of_order_singles_and_nack() -> None:
    counter = ConfirmCounter()
    counter.feed(acks([(2, False), (3, False)]))
    assert counter.confirmed == 2 and counter.upto == 0
    counter.feed(acks([(1, False)]))
    assert counter.confirmed == 3 and counter.upto == 3
    counter.feed(d.method(1, 60, 120, struct.pack(">QB", 4, 0)))
    assert counter.nacks == 1 and counter.confirmed == 4


@pytest.mark.parametrize("ack_queue", [False, True])
def test_the_native_scanner_acks_each_delivery(ack_queue: bool) -> None:
    """(bench.vibemq_driver, used by bench.many_queues) an Ack per Deliver naming its id,
    with the Deliver's queue in its queue field when asked to, as the client library."""
    from bench.vibemq_driver import VibeDeliveryScanner
    from vibemq_server.protocol import CommandType, FrameDecoder, Message, encode
    from vibemq_server.protocol.codec import encode_deliver

    frames = b"".join(
        encode_deliver(i, q, b"{}", {}, 1) for i, q in [("m1", "q"), ("m22", "queue-2")]
    )
    used, delivered, acks = VibeDeliveryScanner(ack_queue).feed(bytearray(frames + b"\x00"))
    assert (used, delivered) == (len(frames), 2)
    want = [
        encode(Message(CommandType.ACK, f"a{i}", q if ack_queue else "", headers={"messageId": i}))
        for i, q in [("m1", "q"), ("m22", "queue-2")]
    ]
    assert acks == b"".join(want)
    assert len(FrameDecoder().feed(acks)) == 2
