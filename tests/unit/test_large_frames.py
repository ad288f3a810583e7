"""Large messages cut anywhere over reads decode to what they decode to whole, per protocol
(issue 16: the decoders hold a cut frame as chunks and join it once), the AMQP encoders'
pieces equal the reference encoders', and the transport writes a header and a large payload
given apart (``send`` pieces, ``send_parts`` views) as one intact stream."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import pytest
import structlog
from hypothesis import given
from hypothesis import strategies as st

from vibemq_server.adapters.amqp.codec import (
    PROTOCOL_HEADER,
    AmqpError,
    BodyFrame,
    DeliverEncoder,
    FrameParser,
    GetOkEncoder,
    PublishTriple,
    ReplyCode,
    encode_content,
    encode_deliver,
    encode_get_ok,
    encode_method,
)
from vibemq_server.adapters.mqtt.codec import MqttParser, encode, publish_head
from vibemq_server.adapters.mqtt.codec5 import Mqtt5Parser, encode5
from vibemq_server.adapters.mqtt.packets import Pingreq, Publish
from vibemq_server.adapters.mqtt.packets5 import Properties, Publish5
from vibemq_server.protocol import jsoncheck
from vibemq_server.protocol.bigcopy import (
    FILL_FROM,
    CopiedRead,
    read_buffer,
    read_through,
)
from vibemq_server.protocol.codec import (
    LARGE_PAYLOAD,
    CommandType,
    FrameDecoder,
    Message,
    Split,
    decode_body,
    deliver_around,
)
from vibemq_server.protocol.codec import encode as encode_native
from vibemq_server.protocol.codec import encode_deliver as encode_native_deliver
from vibemq_server.protocol.errors import ProtocolError
from vibemq_server.protocol.held import HeldInput, prefix
from vibemq_server.server.transport import (
    COPY_BELOW,
    ListenerContexts,
    ReadBatch,
    Session,
    SessionInfo,
    StreamTransport,
    TransportContext,
)

SIZE = 300_000


def _payload(size: int = SIZE) -> bytes:
    """A JSON text of ``size`` bytes whose bytes differ along it (a shifted copy would show)."""
    head = b'{"data":"'
    digits = (b"0123456789abcdef" * (size // 16 + 1))[: size - len(head) - 2]
    return head + digits + b'"}'


def _cuts(size: int) -> Iterator[int]:
    """Where to cut a stream of ``size`` bytes in two: every place in its first and last
    100 bytes (headers, the payload's edges, the frame after it), a stride through the rest."""
    yield from range(1, min(100, size))
    yield from range(100, size - 100, 4_999)
    yield from range(max(100, size - 100), size)


def _chunked(data: bytes, step: int) -> Iterator[bytes]:
    for at in range(0, len(data), step):
        yield data[at : at + step]


def _splits(data: bytes) -> Iterator[list[bytes]]:
    for cut in _cuts(len(data)):
        yield [data[:cut], data[cut:]]
    yield list(_chunked(data, 64 * 1024))
    yield list(_chunked(data, 65_537))
    yield list(_chunked(data, 1))


def _feed_all(feed: Callable[[bytes], list[Any]], pieces: list[bytes]) -> list[Any]:
    events: list[Any] = []
    for piece in pieces:
        events.extend(feed(piece))
    return events


@pytest.mark.parametrize("qos", [0, 1])
def test_mqtt_publish_cut_anywhere(qos: int) -> None:
    publish = Publish("big/topic", _payload(), qos, packet_id=7 if qos else None)
    stream = encode(publish) + encode(Pingreq())
    expected = [publish, Pingreq()]
    assert MqttParser().feed(stream) == expected
    for pieces in _splits(stream):
        parser = MqttParser()
        assert _feed_all(parser.feed, pieces) == expected
        assert parser.buffered == 0


@pytest.mark.parametrize(
    "properties", [Properties(), Properties(content_type="application/json", user_properties=())]
)
def test_mqtt5_publish_cut_anywhere(properties: Properties) -> None:
    publish = Publish5("big/topic", _payload(), 1, packet_id=9, properties=properties)
    stream = encode5(publish) + encode5(publish)
    assert Mqtt5Parser().feed(stream) == [publish, publish]
    for pieces in _splits(stream):
        parser = Mqtt5Parser()
        assert _feed_all(parser.feed, pieces) == [publish, publish]
        assert parser.buffered == 0


def test_mqtt_publish_head_is_encode_publish_less_the_payload() -> None:
    # (around the edges of the 3-byte remaining length publish_head spells out at once)
    for size in (100, 16_370, 16_380, 16_384, 65_536, SIZE, 2_097_140, 2_097_152):
        payload = b"p" * size
        for topic, qos, pid, flags in (
            ("a/b", 0, 0, {}),
            ("a/b", 1, 3, {}),
            ("a/b", 2, 65_535, {"retain": True, "dup": True}),
            ("t" * 300, 1, 258, {"retain": True}),
        ):
            whole = encode(Publish(topic, payload, qos, packet_id=pid or None, **flags))
            head = publish_head(topic.encode(), size, qos, pid, **flags)
            assert head + payload == whole


def _native(frames: list[bytes | Split], split_from: int = 0) -> list[Message]:
    """The messages of a native decoder's frames, a :class:`Split` one put back together (and
    every frame with a payload of ``split_from`` bytes or more came as one)."""
    out = []
    for frame in frames:
        if isinstance(frame, Split):
            assert split_from and len(frame.payload) >= split_from
            msg = decode_body(frame.skeleton)
            assert msg.payload == b""
            msg.payload = frame.payload
        else:
            msg = decode_body(frame)
            assert not split_from or len(msg.payload) < split_from
        out.append(msg)
    return out


@pytest.mark.parametrize("split_from", [0, LARGE_PAYLOAD])
def test_native_publish_cut_anywhere(split_from: int) -> None:
    msg = Message(CommandType.PUBLISH, "m1", "big-queue", _payload(), {"k": "v"})
    small = Message(CommandType.PING, "p1")
    stream = encode_native(msg) + encode_native(small)
    for pieces in _splits(stream):
        decoder = FrameDecoder(1024 * 1024, split_from=split_from)
        frames = _feed_all(decoder.feed_frames, pieces)
        assert _native(frames, split_from) == [msg, small]
        assert decoder.buffered == 0


def _native_fill_feed(
    decoder: FrameDecoder, pieces: list[bytes], into: bool
) -> tuple[list[Any], bool]:
    """``pieces`` as reads; with ``into``, while the decoder fills a payload the reads go
    straight into it (as the transport does, ``Link.read_into``) and it is fed ``b""``.
    The frames, and whether a payload was filled in place at all."""
    got: list[Any] = []
    filled = False

    def feed(data: bytes) -> None:
        got.extend(decoder.feed_frames(data))

    for piece in pieces:
        if into:
            read_through(piece, lambda: decoder.filling, feed)
        else:
            feed(piece)
        filled = filled or decoder.filling is not None
    assert decoder.buffered == 0 and decoder.filling is None
    return got, filled


@pytest.mark.parametrize("into", [False, True])
@pytest.mark.parametrize("fill_from", [1, FILL_FROM])
def test_native_publish_filled_in_place_cut_anywhere(fill_from: int, into: bool) -> None:
    """A frame whose payload is filled in place (the rest read straight into it, or copied
    in) comes out as the Split it comes out as whole, its headers after the payload and
    the frames after it intact, however the stream is cut."""
    msg = Message(CommandType.PUBLISH, "m1", "big-queue", _payload(), {"k": "v" * 300})
    small = Message(CommandType.PING, "p1")
    bare = Message(CommandType.PUBLISH, "m2", "q", _payload(SIZE - 7))
    stream = encode_native(msg) + encode_native(small) + encode_native(bare)
    filled = 0
    for pieces in _splits(stream):
        decoder = FrameDecoder(1024 * 1024, split_from=LARGE_PAYLOAD, fill_from=fill_from)
        frames, any_fill = _native_fill_feed(decoder, pieces, into)
        assert _native(frames, LARGE_PAYLOAD) == [msg, small, bare]
        filled += any_fill
    assert filled >= len(list(_cuts(len(stream)))) // 2


def _spoilt(at: int, bad: bytes) -> bytes:
    """The test payload with ``bad`` in its string at ``at``: no longer JSON."""
    payload = _payload()
    return payload[:at] + bad + payload[at + len(bad) :]


@pytest.mark.parametrize("into", [False, True])
def test_native_filled_payload_checked_as_it_lands_cut_anywhere(into: bool) -> None:
    """A payload filled in place is checked as its parts land: the verdict a frame comes
    out with (``Split.json_ok``) is the whole payload's, valid or not, wherever the reads cut
    it (a bad UTF-8 byte, a control character, a bad escape, a cut ``\\u`` escape or UTF-8
    sequence at the edge of a part); the compiled checker gives one to every filled payload."""
    payloads = [
        _payload(),
        _spoilt(150_000, b"\xff"),
        _spoilt(SIZE - 40, b"\x01"),
        _spoilt(100, b"\\x"),
        _spoilt(65_530, b"\\u00e9\xe2\x82\xac"),  # valid, at a 64 KiB read's edge
        _spoilt(65_533, b"\\u00g9"),
        _payload()[:-1],  # the object never closed
    ]
    for payload in payloads:
        msg = Message(CommandType.PUBLISH, "m1", "big-queue", payload, {"k": "v"})
        stream = encode_native(msg) + encode_native(Message(CommandType.PING, "p1"))
        whole = jsoncheck.valid(payload)
        for pieces in _splits(stream):
            decoder = FrameDecoder(1024 * 1024, split_from=LARGE_PAYLOAD, fill_from=1)
            frames, any_fill = _native_fill_feed(decoder, pieces, into)
            split = frames[0]
            assert isinstance(split, Split) and split.payload == payload
            if any_fill and jsoncheck.COMPILED:
                assert split.json_ok is whole
            else:
                assert split.json_ok is None


@pytest.mark.parametrize("fill_from", [0, 1])
def test_native_split_falls_back_to_the_whole_body(fill_from: int) -> None:
    """What a split cannot take apart comes as the body, whose decoder names the defect as
    before: a payload longer than its frame, a payload under ``split_from`` among large
    headers, an id too long for the head looked at when the frame came in several reads."""
    bad = bytearray(encode_native(Message(CommandType.PUBLISH, "m1", "q", _payload(40_000))))
    bad[13:17] = (50_000).to_bytes(4, "big")  # the payload's length, past the frame's end
    small = Message(CommandType.PUBLISH, "m2", "q", b"[1]", {"h": "v" * 4000, "i": "w" * 4000})
    long_id = encode_native(Message(CommandType.PUBLISH, "m" * 600, "q", _payload(40_000)))
    cases = [(bytes(bad), True), (encode_native(small), True), (long_id, False)]
    for stream, whole_too in cases:
        for pieces in ([stream], [stream[:100], stream[100:]])[0 if whole_too else 1 :]:
            decoder = FrameDecoder(1024 * 1024, split_from=LARGE_PAYLOAD, fill_from=fill_from)
            frames = _feed_all(decoder.feed_frames, pieces)
            assert [type(f) for f in frames] == [bytes]
            assert frames == [stream[4:]]
    with pytest.raises(ProtocolError) as caught:
        decode_body(bytes(bad)[4:])
    assert caught.value.message_id == "m1"


def test_native_deliver_around_is_encode_deliver_less_the_payload() -> None:
    payload = _payload()
    for headers in ({}, {"a": "b"}):
        head, tail = deliver_around("m1", "q", len(payload), headers, 2)
        assert head + payload + tail == encode_native_deliver("m1", "q", payload, headers, 2)


def _amqp_publish(body: bytes, frame_max: int) -> bytes:
    from pamqp import commands

    method = encode_method(1, commands.Basic.Publish(exchange="", routing_key="q"))
    return encode_content(1, method, b"\x00\x00", body, frame_max)


@pytest.mark.parametrize("fuse", [False, True])
def test_amqp_publish_cut_anywhere(fuse: bool) -> None:
    body = _payload()
    stream = PROTOCOL_HEADER + _amqp_publish(body, 131_072) + _amqp_publish(b"{}", 131_072)

    def shape(frames: list[Any]) -> tuple[list[str], bytes]:
        """The frames but bodies, and the bodies' bytes (a fused publish as its three)."""
        kinds: list[str] = []
        data = bytearray()
        for f in frames:
            for g in f.frames() if isinstance(f, PublishTriple) else (f,):
                if isinstance(g, BodyFrame):
                    data += g.data
                else:
                    kinds.append(type(g).__name__)
        return kinds, bytes(data)

    expected = shape(FrameParser(fuse_publish=fuse).feed(stream))
    assert expected[1] == body + b"{}"
    for pieces in _splits(stream):
        assert shape(_feed_all(FrameParser(fuse_publish=fuse).feed, pieces)) == expected


def test_amqp_cut_body_frame_is_views_of_its_reads() -> None:
    """A large body frame cut over reads is not joined: one BodyFrame per read, each a view,
    and the frames after it in the last read are parsed from that read."""
    body = _payload()
    stream = PROTOCOL_HEADER + _amqp_publish(body, 131_072) + _amqp_publish(b"{}", 131_072)
    frames = _feed_all(FrameParser().feed, list(_chunked(stream, 100_003)))
    bodies = [f.data for f in frames if isinstance(f, BodyFrame)]
    assert b"".join(bodies) == body + b"{}"
    # 300,000 bytes in frames of 131,064 over reads of 100,003: every frame is cut
    assert len(bodies) > 4
    assert all(type(b) is memoryview for b in bodies if len(b) >= 4096)


def test_amqp_cut_body_frame_with_a_bad_frame_end_is_refused() -> None:
    """The frame-end of a cut large body frame is checked as a whole frame's is."""
    broken = PROTOCOL_HEADER + _amqp_publish(b"x" * 50_000, 131_072)[:-1] + b"\x00"
    parser = FrameParser()
    parser.feed(broken[:30_000])
    with pytest.raises(AmqpError) as caught:
        parser.feed(broken[30_000:])
    assert caught.value.code == ReplyCode.FRAME_ERROR
    with pytest.raises(AmqpError):  # spent
        parser.feed(b"\xce")


@pytest.mark.parametrize("size", [0, 1, 131_064, 131_065, SIZE, 2 * 131_064])
@pytest.mark.parametrize("frame_max", [4096, 131_072])
def test_amqp_encoders_equal_the_reference(size: int, frame_max: int) -> None:
    body = _payload(size) if size >= 16 else b"x" * size
    props = b"\x80\x00\x10application/json"
    deliver = DeliverEncoder(3, b"ctag", frame_max)
    get_ok = GetOkEncoder(3, frame_max)
    for tag in (1, 2):  # the second one from the caches
        reference = encode_deliver(3, b"ctag", tag, True, b"ex", b"key", props, body, frame_max)
        assert deliver.encode(tag, True, "ex", "key", props, body) == reference
        parts = deliver.parts(tag, True, "ex", "key", props, body)
        assert b"".join(parts) == reference
        reference = encode_get_ok(3, tag, False, b"ex", b"key", 5, props, body, frame_max)
        assert get_ok.encode(tag, False, "ex", "key", 5, props, body) == reference
        assert b"".join(get_ok.parts(tag, False, "ex", "key", 5, props, body)) == reference


class _Sender:
    """A session that, asked with ``go``, writes a large payload three ways: as ``send``
    pieces around it, as ``send_parts`` with views, and among small sends."""

    def __init__(self, link: StreamTransport, payload: bytes) -> None:
        self.link = link
        self.payload = payload

    def data_received(self, data: bytes) -> None:
        link, payload = self.link, self.payload
        view = memoryview(payload)
        link.send(b"<head>")
        link.send(payload)
        link.send(b"<tail>")
        link.send_parts([b"[", view[:100_000], b"|", view[100_000:], b"]"])
        for i in range(50):
            link.send(b"%03d" % i)
        link.send(payload)

    def writable_again(self) -> None:
        pass

    def connection_lost(self, exc: Exception | None) -> None:
        pass

    def check_timers(self, now: float, keepalive: float, frame_timeout: float) -> None:
        pass

    def shutdown(self, reason: str) -> None:
        pass

    def describe(self) -> SessionInfo:
        return SessionInfo("test", None, None, "open")

    def close_by_operator(self, reason: str) -> None:
        pass


def _context() -> TransportContext:
    """A plain listener's context with no broker behind it (every connection let in)."""
    return ListenerContexts(
        log=structlog.get_logger("test"),
        out_limit=64 * 1024,
        batch=ReadBatch(),
        register=lambda t: True,
        unregister=lambda t: None,
    ).get(None)


@contextlib.asynccontextmanager
async def _connected(
    session: Callable[[StreamTransport], Session], context: TransportContext
) -> AsyncIterator[tuple[asyncio.StreamReader, asyncio.StreamWriter]]:
    """A client connected over loopback to a listener whose connections are StreamTransports
    with ``session`` behind them; listener and client closed after."""
    loop = asyncio.get_running_loop()
    server = await loop.create_server(
        lambda: StreamTransport(session, conn_id="t1", context=context), "127.0.0.1", 0
    )
    try:
        port = server.sockets[0].getsockname()[1]
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            yield reader, writer
        finally:
            writer.close()
    finally:
        server.close()


async def test_transport_writes_header_and_payload_intact() -> None:
    payload = _payload(1_000_003)
    expected = (
        b"<head>"
        + payload
        + b"<tail>["
        + payload[:100_000]
        + b"|"
        + payload[100_000:]
        + b"]"
        + b"".join(b"%03d" % i for i in range(50))
        + payload
    )
    async with _connected(lambda link: _Sender(link, payload), _context()) as (reader, writer):
        writer.write(b"go")
        got = await asyncio.wait_for(reader.readexactly(len(expected)), 30)
    assert hashlib.sha256(got).hexdigest() == hashlib.sha256(expected).hexdigest()
    assert json.loads(got[6 : 6 + len(payload)]) == json.loads(payload)


class _Recorder(_Sender):
    """A session that keeps what it is given (and its type), and answers each read's size
    once the input is all in."""

    def __init__(self, link: StreamTransport, payload: bytes) -> None:
        super().__init__(link, payload)
        self.got: list[bytes] = []
        self.size = 0

    def data_received(self, data: bytes) -> None:
        assert type(data) is bytes
        self.got.append(data)
        self.size += len(data)
        if self.size == len(self.payload):
            self.link.send(hashlib.sha256(b"".join(self.got)).digest())


@pytest.mark.parametrize("copied", [False, True])
async def test_transport_reads_into_the_bytes_it_hands_on(copied: bool) -> None:
    """Reads land in the ``bytes`` the session gets (``ReadBuffer``: the read's own object,
    cut to its length; without the extension ``CopiedRead``, one copy): a large stream in
    reads of any size, small writes among them, arrives whole and in order."""
    payload = _payload(3_000_017)
    context = _context()
    if copied:
        context.reader = CopiedRead()
    else:
        assert type(context.reader) is not CopiedRead, "build it: scripts/build_ext.sh"
        context.reader = read_buffer(COPY_BELOW)  # (as with the broker's allocator thresholds)
    async with _connected(lambda link: _Recorder(link, payload), context) as (reader, writer):
        at = 0
        for step in (1, 2, 100, 70_000, 1, 300_000, 5, 1_000_000):
            writer.write(payload[at : at + step])
            await writer.drain()
            at += step
        writer.write(payload[at:])
        got = await asyncio.wait_for(reader.readexactly(32), 30)
    assert got == hashlib.sha256(payload).digest()


@pytest.mark.parametrize("copy_below", [0, 6, 100_000])
def test_read_buffer_hands_over_what_was_read(copy_below: int) -> None:
    """``ReadBuffer``: a writable buffer for one read, then its first n bytes as bytes (the
    buffer's own object cut to n, or below ``copy_below`` a copy, the buffer kept)."""
    from vibemq_server.protocol._bigcopy import ReadBuffer

    reads = ReadBuffer(copy_below)
    for size, data in ((16, b"hello"), (16, b""), (8, b"abcdefgh"), (100_000, b"x" * 99_999)):
        target = reads.get(size)
        assert len(target) == size
        with memoryview(target) as view:
            view[: len(data)] = data
        got = reads.take(len(data))
        assert type(got) is bytes and got == data and hash(got) == hash(bytes(data))
        if len(data) < copy_below:
            assert reads.get(size) is target and len(target) == size  # kept
            assert reads.take(len(data)) == data
        else:
            with pytest.raises(ValueError):
                reads.take(0)  # (taken: the next read needs get first)
    reads.get(4)
    with pytest.raises(ValueError):
        reads.take(5)
    for bad in (0, -1):
        with pytest.raises(ValueError):
            reads.get(bad)


@pytest.mark.parametrize("make", [MqttParser, Mqtt5Parser])
def test_mqtt_malformed_large_publish_cut_fails_as_whole(make: Callable[[], Any]) -> None:
    """A large PUBLISH whose topic length runs past the packet: refused alike whole or cut
    (the cut path hands such a packet to the usual decoder, which names the fault)."""
    from vibemq_server.adapters.mqtt.codec import MqttProtocolError, encode_remaining_length

    body = b"\xff\xff" + b"t" * 6000
    stream = b"\x32" + encode_remaining_length(len(body)) + body
    with pytest.raises(MqttProtocolError) as whole:
        make().feed(stream)
    for cut in (1, 2, 3, 4, 5, 100, 5000):
        parser = make()
        with pytest.raises(MqttProtocolError) as split:
            _feed_all(parser.feed, [stream[:cut], stream[cut:]])
        assert split.value.code == whole.value.code


def _train() -> tuple[list[Any], list[Any], list[Message]]:
    """64 KiB messages with small ones between them, per protocol (the bench's shape)."""
    mqtt: list[Any] = []
    mqtt5: list[Any] = []
    native: list[Message] = []
    for i in range(12):
        payload = _payload(65_536 + i * 7)
        mqtt += [Publish("t/64k", payload, 1, packet_id=i + 1), Pingreq()]
        mqtt5.append(Publish5("t/64k", payload, 1, packet_id=i + 1, properties=Properties()))
        native += [
            Message(CommandType.PUBLISH, f"m{i}", "q", payload, {}),
            Message(CommandType.PING, f"p{i}"),
        ]
    return mqtt, mqtt5, native


@pytest.mark.parametrize("read", [256 * 1024, 100_003, 65_536, 4_099])
def test_frames_after_a_cut_one_parse_from_its_last_read(read: int) -> None:
    """A frame completed by a read leaves the rest of that read to be parsed where it lies
    (``HeldInput.cut`` gives the read and an offset, no copy of its tail): every frame after
    it, whole or cut again, comes out as it went in, in 256 KiB reads as in odd ones."""
    mqtt, mqtt5, native = _train()
    parser = MqttParser()
    assert _feed_all(parser.feed, list(_chunked(b"".join(map(encode, mqtt)), read))) == mqtt
    assert parser.buffered == 0
    parser5 = Mqtt5Parser()
    stream5 = b"".join(map(encode5, mqtt5))
    assert _feed_all(parser5.feed, list(_chunked(stream5, read))) == mqtt5
    assert parser5.buffered == 0
    stream = b"".join(map(encode_native, native))
    for split_from in (0, LARGE_PAYLOAD):
        decoder = FrameDecoder(1024 * 1024, split_from=split_from)
        frames = _feed_all(decoder.feed_frames, list(_chunked(stream, read)))
        assert _native(frames, split_from) == native
        assert decoder.buffered == 0


def test_held_cut_gives_the_last_read_itself() -> None:
    held = HeldInput()
    first = b"a" * 100
    held.hold(first, 40, 100)
    last = b"b" * 70
    assert held.add_part(last)
    parts, rest, start = held.cut()
    assert rest is last and start == 40  # (60 held + 40 of it = the 100 needed)
    assert b"".join(parts) == b"a" * 60 + b"b" * 40
    assert held.size == 0
    held.hold(first, 0, 170)
    assert held.add_part(last)
    parts, rest, start = held.cut()
    assert b"".join(parts) == first + last and rest[start:] == b""


@given(
    st.lists(
        st.tuples(st.binary(max_size=40), st.sampled_from([bytes, bytearray, memoryview])),
        max_size=5,
    ),
    st.integers(0, 120),
)
def test_prefix_is_the_first_bytes_of_the_parts(
    pieces: list[tuple[bytes, type[bytes | bytearray | memoryview]]], n: int
) -> None:
    """The head of a held frame, sliced from its first part when that holds all of it or
    gathered over the parts, is the first ``n`` bytes of them all (all, when fewer)."""
    parts: list[bytes | bytearray | memoryview] = [kind(data) for data, kind in pieces]
    head = prefix(parts, n)
    assert type(head) is bytes
    assert head == b"".join(parts)[:n]


def test_amqp_cut_body_frame_over_a_lowered_frame_max_is_refused() -> None:
    """frame-max lowered while a large body frame is held: the frame is refused when whole,
    as it would be had it come in one read."""
    stream = PROTOCOL_HEADER + _amqp_publish(b"x" * 50_000, 131_072)
    parser = FrameParser()
    parser.feed(stream[:30_000])
    parser.max_frame_size = 32_768
    with pytest.raises(AmqpError) as caught:
        parser.feed(stream[30_000:])
    assert caught.value.code == ReplyCode.FRAME_ERROR
    assert "exceeds frame-max" in caught.value.text
