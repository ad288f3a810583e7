"""The native load generator's byte-stream scanners (bench/vibemq_driver.py): whatever the
read sizes, the id and queue lengths and the other frames in between, the subscriber answers
every Deliver with its Ack, in order, and the publisher counts every PublishAck once."""

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
from bench.vibemq_driver import VibeAckCounter, VibeDeliveryScanner, VibeNoAckScanner
from vibemq_server.protocol import CommandType, Message, encode
from vibemq_server.protocol.codec import encode_deliver, encode_publish_ack

ids = st.text(alphabet="abcm0123456789-", min_size=1, max_size=12)
queues = st.sampled_from(["q", "queue-2", "ab-d1d416ce"])
#: frames a subscriber or publisher may see between the ones it counts
others = st.sampled_from(
    [
        encode(Message(CommandType.PONG, "p")),
        encode(Message(CommandType.SUBSCRIBE_ACK, "s-123456789012", "q")),
        encode(Message(CommandType.UNSUBSCRIBE_ACK, "", "queue-2")),
    ]
)


def ack(msg_id: str, queue: str) -> bytes:
    return encode(Message(CommandType.ACK, f"a{msg_id}", queue, headers={"messageId": msg_id}))


@st.composite
def deliveries(draw: st.DrawFn) -> list[tuple[str, str] | bytes]:
    """Delivers (id, queue), runs of them of one id length, and other frames between."""
    out: list[tuple[str, str] | bytes] = []
    for _ in range(draw(st.integers(0, 6))):
        if draw(st.booleans()):
            out.append(draw(others))
            continue
        width = draw(st.integers(1, 12))
        queue = draw(queues)
        for n in range(draw(st.integers(1, 20))):
            out.append((f"{n:0{width}d}"[-width:], queue))
        out.extend((i, draw(queues)) for i in draw(st.lists(ids, max_size=3)))
    return out


def stream(items: list[tuple[str, str] | bytes]) -> bytes:
    return b"".join(
        x if isinstance(x, bytes) else encode_deliver(x[0], x[1], b'{"a":1}', {}, 1) for x in items
    )


@settings(max_examples=200, deadline=None)
@given(deliveries(), st.lists(st.integers(0, 20_000), max_size=30), st.booleans())
def test_every_deliver_gets_its_ack(
    items: list[tuple[str, str] | bytes], cuts: list[int], ack_queue: bool
) -> None:
    sent = [x for x in items if isinstance(x, tuple)]
    want = b"".join(ack(i, q if ack_queue else "") for i, q in sent)
    data = stream(items)
    # one read, and the reads the cuts make: the same acks, nothing left over
    assert run_scanner(VibeDeliveryScanner(ack_queue), data, []) == (len(sent), want, 0)
    assert run_scanner(VibeDeliveryScanner(ack_queue), data, cuts) == (len(sent), want, 0)
    assert run_scanner(VibeNoAckScanner(), data, cuts) == (len(sent), b"", 0)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.one_of(st.tuples(ids, queues), others), max_size=60),
    st.lists(st.integers(0, 20_000), max_size=30),
)
def test_every_publish_ack_counted_once(
    items: list[tuple[str, str] | bytes], cuts: list[int]
) -> None:
    data = b"".join(x if isinstance(x, bytes) else encode_publish_ack(*x) for x in items)
    want = sum(isinstance(x, tuple) for x in items)
    assert run_counter(VibeAckCounter(), data, cuts) == (want, 0)


def test_an_error_frame_stops_both() -> None:
    error = encode(
        Message(CommandType.ERROR, "m1", "q", error_code="QUEUE_FULL", error_message="full")
    )
    with pytest.raises(BenchError, match="QUEUE_FULL"):
        VibeAckCounter().feed(bytearray(encode_publish_ack("m0", "q") + error))
    with pytest.raises(BenchError, match="QUEUE_FULL"):
        VibeDeliveryScanner().feed(bytearray(stream([("m0", "q")]) + error))
