"""A large payload's one copy made off the loop (vibemq_server/protocol/bigcopy.py, issue 16):
the compiled join equals the pure one on any buffers and range; the decoders that leave a big
payload unjoined (native ``FrameDecoder(big_from=)``, MQTT ``defer_from``) give back, once it
is joined, what they decode whole, cut anywhere over reads."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vibemq_server.adapters.mqtt.codec import MqttParser, MqttProtocolError, encode
from vibemq_server.adapters.mqtt.codec5 import Mqtt5Parser, encode5
from vibemq_server.adapters.mqtt.packets import Pingreq, Publish
from vibemq_server.adapters.mqtt.packets5 import Properties, Publish5
from vibemq_server.protocol import bigcopy
from vibemq_server.protocol.codec import (
    BigFrame,
    CommandType,
    FrameDecoder,
    Message,
    decode_body,
)
from vibemq_server.protocol.codec import encode as encode_native
from vibemq_server.protocol.held import Buffer, join_range

SIZE = 300_000
BIG_FROM = 100_000


def _payload(size: int = SIZE) -> bytes:
    """A JSON text of ``size`` bytes whose bytes differ along it (a shifted copy would show)."""
    head = b'{"data":"'
    digits = (b"0123456789abcdef" * (size // 16 + 1))[: size - len(head) - 2]
    return head + digits + b'"}'


def _chunked(data: bytes, step: int) -> Iterator[bytes]:
    for at in range(0, len(data), step):
        yield data[at : at + step]


def _splits(data: bytes) -> Iterator[list[bytes]]:
    """Cut at the edges of headers and payloads, and in even chunks."""
    for cut in (*range(1, 60), *range(len(data) - 60, len(data))):
        yield [data[:cut], data[cut:]]
    yield list(_chunked(data, 65_536))
    yield list(_chunked(data, 7_919))


def test_the_compiled_join_is_built() -> None:
    assert bigcopy.COMPILED, "build it: pip install -e . or scripts/build_ext.sh"
    assert bigcopy.BIG_FROM == bigcopy.OFFLOAD_FROM


def _compiled(parts: list[Buffer], start: int, stop: int) -> bytes:
    from vibemq_server.protocol._bigcopy import join_range as compiled

    return compiled(parts, start, stop)


_PART = st.binary(max_size=40).flatmap(
    lambda b: st.sampled_from([b, bytearray(b), memoryview(b"<" + b + b">")[1:-1]])
)


@settings(max_examples=400, deadline=None)
@given(st.lists(_PART, max_size=8), st.integers(-5, 400), st.integers(-5, 400))
def test_the_compiled_join_equals_the_pure_one(parts: list[Buffer], start: int, stop: int) -> None:
    expected = join_range(parts, start, stop)
    assert _compiled(parts, start, stop) == expected
    assert _compiled(tuple(parts), start, stop) == expected  # type: ignore[arg-type]
    if start >= 0 and stop >= 0:
        assert expected == b"".join(parts)[start:stop]


@settings(max_examples=20, deadline=None)
@given(st.integers(1, 9), st.integers(0, 70_000), st.integers(0, 70_000))
def test_a_copy_without_the_gil_equals_the_join(count: int, lo: int, hi: int) -> None:
    from vibemq_server.protocol._bigcopy import NOGIL_FROM

    parts: list[Buffer] = [bytes([i]) * 40_000 + _payload(20_000) for i in range(count)]
    total = sum(map(len, parts))
    start, stop = lo, max(total - hi, 0)  # (not negative: a slice would count from the end)
    expected = b"".join(parts)[start:stop]
    assert _compiled(parts, start, stop) == expected
    assert len(expected) < NOGIL_FROM or expected  # (large ones take the GIL-free path)


def test_not_a_buffer_is_a_type_error() -> None:
    with pytest.raises(TypeError):
        _compiled(["text"], 0, 4)  # type: ignore[list-item]
    with pytest.raises(TypeError):
        _compiled(5, 0, 4)  # type: ignore[arg-type]


def _native_stream() -> tuple[list[Message], bytes]:
    big = Message(CommandType.PUBLISH, "m1", "big-queue", _payload(), {"k": "v", "x": "y"})
    small = Message(CommandType.PING, "p1")
    return [big, small, big], encode_native(big) + encode_native(small) + encode_native(big)


def _native_events(decoder: FrameDecoder, pieces: list[bytes]) -> list[Message]:
    """What a session does: a big frame's head decoded, its payload joined from the reads."""
    out: list[Message] = []
    for piece in pieces:
        bodies = decoder.feed(piece)
        big = decoder.big
        if big is not None:
            decoder.big = None
            cut = big.split()
            assert cut is not None
            skeleton, start, stop = cut
            head = decode_body(skeleton)
            assert head.payload == b""
            payload = bigcopy.join_range(big.parts, start, stop)
            out.append(
                Message(head.type, head.id, head.queue, payload, head.headers, version=head.version)
            )
        out.extend(decode_body(body) for body in bodies)
    return out


def test_native_big_frames_cut_anywhere_come_as_their_reads() -> None:
    expected, stream = _native_stream()
    for pieces in _splits(stream):
        decoder = FrameDecoder(1024 * 1024, BIG_FROM)
        assert _native_events(decoder, pieces) == expected
        assert decoder.buffered == 0
    # (the frames come as their reads: counted where the decoder hands one over)
    decoder = FrameDecoder(1024 * 1024, BIG_FROM)
    decoder.feed(stream[:100])
    decoder.feed(stream[100:])
    assert decoder.big is not None


def test_native_small_frames_are_not_left_unjoined() -> None:
    msg = Message(CommandType.PUBLISH, "m1", "q", _payload(BIG_FROM // 2))
    decoder = FrameDecoder(1024 * 1024, BIG_FROM)
    stream = encode_native(msg)
    bodies = [body for piece in _chunked(stream, 4_096) for body in decoder.feed(piece)]
    assert decoder.big is None
    assert [decode_body(b) for b in bodies] == [msg]


def test_a_big_frame_whose_lengths_do_not_add_up_is_decoded_whole() -> None:
    stream = bytearray(encode_native(Message(CommandType.PUBLISH, "m1", "q", _payload())))
    plen_at = 4 + 4 + 2 + 2 + 1  # frame length, version+type, id "m1", queue "q"
    stream[plen_at : plen_at + 4] = (SIZE * 2).to_bytes(4, "big")  # past the frame's end
    frame = BigFrame([bytes(stream[:1000]), bytes(stream[1000:])])
    assert frame.split() is None
    assert frame.body() == bytes(stream[4:])


Parser = MqttParser | Mqtt5Parser


def _big_publish(qos: int = 1, packet_id: int = 3) -> Publish:
    return Publish("big/topic", _payload(), qos, packet_id=packet_id if qos else None)


def _mqtt_case(version: int, qos: int) -> tuple[type[Parser], bytes, list[object]]:
    """A parser class, a stream of two big PUBLISHes (a PINGREQ between them in 3.1.1) and
    the packets it decodes to."""
    if version == 5:
        publish5 = Publish5(
            "big/topic", _payload(), qos, packet_id=9, properties=Properties(content_type="a/b")
        )
        return Mqtt5Parser, encode5(publish5) * 2, [publish5, publish5]
    publish = _big_publish(qos, packet_id=7)
    stream = encode(publish) + encode(Pingreq()) + encode(publish)
    return MqttParser, stream, [publish, Pingreq(), publish]


def _parser(new: type[Parser] = MqttParser, *, defer_from: int = 0, fill_from: int = 0) -> Parser:
    parser = new()
    parser.defer_from = defer_from
    parser.fill_from = fill_from
    return parser


_MQTT_CASES = pytest.mark.parametrize(("version", "qos"), [(4, 0), (4, 1), (5, 1)])


@_MQTT_CASES
def test_mqtt_big_publish_left_unjoined_then_joined(version: int, qos: int) -> None:
    new_parser, stream, expected = _mqtt_case(version, qos)
    for pieces in _splits(stream):
        parser = _parser(new_parser, defer_from=BIG_FROM)
        got: list[object] = []
        deferred = 0
        for piece in pieces:
            packets = parser.feed(piece)
            unjoined = parser.unjoined
            if unjoined is not None:
                deferred += 1
                parser.unjoined = None
                assert unjoined.packet is packets[0]
                assert unjoined.packet.payload == b""
                unjoined.fill()
            got.extend(packets)
        assert got == expected
        assert deferred or len(pieces) == 2  # (in even chunks every one comes over reads)


# -- a large payload filled in place (payload_fill, the parsers' fill_from) --------------------


def _drive_fill(fill: bigcopy.Fill, steps: list[tuple[bool, bytes]]) -> tuple[list[object], int]:
    """Feed ``steps`` into ``fill``: written (``write``) or read into its exported rest
    (``advance``), as far as there is room; what each step gave and the bytes used in all."""
    seen: list[object] = []
    used = 0
    for read, data in steps:
        if read:
            n, full = bigcopy.read_into_fill(fill, data)
            seen.append(full)
        else:
            n = fill.write(data)
            seen.append(n)
        used += n
        seen.append((fill.filled, fill.full, len(fill)))
    return seen, used


@settings(max_examples=200, deadline=None)
@given(
    size=st.integers(0, 3000),
    steps=st.lists(st.tuples(st.booleans(), st.binary(max_size=700)), max_size=12),
)
def test_the_compiled_fill_is_the_pure_one(size: int, steps: list[tuple[bool, bytes]]) -> None:
    from vibemq_server.protocol._bigcopy import PayloadFill

    compiled, pure = PayloadFill(size), bigcopy.PureFill(size)
    assert _drive_fill(compiled, steps) == _drive_fill(pure, steps)
    if pure.full:
        assert compiled.take() == pure.take()
        for spent in (compiled, pure):
            with pytest.raises(ValueError):
                spent.take()
    else:
        for open_ in (compiled, pure):
            with pytest.raises(ValueError):
                open_.take()
            with pytest.raises(ValueError):
                open_.advance(len(open_) + 1)


def test_a_fill_refuses_a_write_during_a_read() -> None:
    from vibemq_server.protocol._bigcopy import PayloadFill

    fill = PayloadFill(10)
    with memoryview(fill) as view:
        assert len(view) == 10
        with pytest.raises(BufferError):
            fill.write(b"x")
    assert fill.write(b"abc") == 3
    with memoryview(fill) as view:
        assert len(view) == 7  # the unfilled rest


def _fill_feed(parser: Parser, pieces: list[bytes], into: bool) -> list[object]:
    """``pieces`` as reads; with ``into``, while the parser fills a payload the reads go
    straight into it (as the transport does) and the parser is fed ``b""`` after each."""
    got: list[object] = []

    def feed(data: bytes) -> None:
        got.extend(parser.feed(data))

    for piece in pieces:
        if into:
            bigcopy.read_through(piece, lambda: parser.filling, feed)
        else:
            feed(piece)
    assert parser.buffered == 0 and parser.filling is None
    return got


@pytest.mark.parametrize("into", [False, True])
@_MQTT_CASES
def test_mqtt_big_publish_filled_in_place(version: int, qos: int, into: bool) -> None:
    new_parser, stream, expected = _mqtt_case(version, qos)
    for pieces in _splits(stream):
        parser = _parser(new_parser, fill_from=BIG_FROM)
        assert _fill_feed(parser, pieces, into) == expected


def test_a_fill_starts_once_the_header_is_in() -> None:
    publish = _big_publish()
    data = encode(publish)
    parser = _parser(fill_from=BIG_FROM)
    assert parser.feed(data[:3]) == [] and parser.filling is None  # (the topic is cut)
    assert parser.feed(data[3:1000]) == []
    fill = parser.filling
    assert fill is not None and len(fill) == len(data) - 1000
    assert parser.buffered == fill.filled
    assert parser.feed(data[1000:] + encode(Pingreq())) == [publish, Pingreq()]


def test_a_malformed_big_publish_is_refused_as_before() -> None:
    data = bytearray(encode(_big_publish()))
    at = data.index(b"big/topic")
    data[at + 3] = ord("#")  # a wildcard in a topic name
    parser = _parser(fill_from=BIG_FROM)
    assert parser.feed(bytes(data[:2000])) == [] and parser.filling is None
    with pytest.raises(MqttProtocolError):
        parser.feed(bytes(data[2000:]))
