"""The sans-IO VibeMQ codec: golden bytes from the spec, both decode forms, property tests."""

from __future__ import annotations

import contextlib
import json
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vibemq_server.protocol import (
    CommandType,
    ErrorCode,
    FrameDecoder,
    Limits,
    Message,
    ProtocolError,
    decode_body,
    encode,
    encode_body,
    jsoncheck,
    validate_json,
)
from vibemq_server.protocol.bigcopy import read_into_fill, read_through
from vibemq_server.protocol.codec import Split, encode_deliver, encode_publish_ack


def s16(text: str) -> bytes:
    raw = text.encode()
    return struct.pack(">H", len(raw)) + raw


def test_length_prefix_is_big_endian_like_the_spec_example() -> None:
    # The spec's frame example: a 90-byte body is prefixed 0x00 0x00 0x00 0x5A.
    body = encode_body(Message(CommandType.PUBLISH, "m", "q", b'"' + b"x" * 74 + b'"'))
    assert len(body) == 90
    assert encode(Message(CommandType.PUBLISH, "m", "q", b'"' + b"x" * 74 + b'"'))[:4] == (
        b"\x00\x00\x00\x5a"
    )


def test_golden_ping() -> None:
    expected = b"\x01\x0a" + s16("ping_123") + b"\x00\x00" + b"\x00\x00\x00\x00" + b"\x00\x00"
    assert encode_body(Message(CommandType.PING, "ping_123")) == expected
    assert encode(Message(CommandType.PING, "ping_123")) == struct.pack(">I", 20) + expected


def test_golden_publish_from_the_spec() -> None:
    payload = b'{"title":"Hello","body":"World"}'
    expected = (
        b"\x01\x14"
        + s16("msg_123")
        + s16("notifications")
        + struct.pack(">I", len(payload))
        + payload
        + b"\x00\x03"
        + s16("priority")
        + s16("high")
        + s16("correlationId")
        + s16("corr_456")
        + s16("timestamp")
        + s16("2026-02-18T10:30:00Z")
    )
    msg = Message(
        CommandType.PUBLISH,
        "msg_123",
        "notifications",
        payload,
        {"priority": "high", "correlationId": "corr_456", "timestamp": "2026-02-18T10:30:00Z"},
    )
    assert encode_body(msg) == expected
    assert decode_body(expected) == msg


def test_golden_error_has_error_fields_only_on_error_type() -> None:
    body = encode_body(
        Message(
            CommandType.ERROR,
            "err_123",
            error_code="AUTH_FAILED",
            error_message="Invalid authentication token",
        )
    )
    assert body == (
        b"\x01\x63"
        + s16("err_123")
        + b"\x00\x00\x00\x00\x00\x00\x00\x00"
        + s16("AUTH_FAILED")
        + s16("Invalid authentication token")
    )
    # Non-Error types end right after the headers, as the original writes them.
    assert encode_body(Message(CommandType.PONG, "p")).endswith(b"\x00\x00\x00\x00\x00\x00")


def test_decoder_accepts_trailing_empty_error_fields_on_any_type() -> None:
    body = encode_body(Message(CommandType.PING, "p1")) + b"\x00\x00\x00\x00"
    assert decode_body(body) == Message(CommandType.PING, "p1")


def test_null_header_pairs_are_dropped() -> None:
    body = b"\x01\x0a" + s16("p") + b"\x00\x00" + b"\x00" * 4 + b"\x00\x02"
    body += s16("") + s16("v") + s16("k") + s16("")
    assert decode_body(body).headers == {}


def test_deliver_fast_path_equals_generic_encoder() -> None:
    headers = {"priority": "High", "deliveryAttempts": "7"}
    fast = encode_deliver("m1", "q", b"{}", headers, 2)
    generic = encode(
        Message(
            CommandType.DELIVER, "m1", "q", b"{}", {"priority": "High", "deliveryAttempts": "2"}
        )
    )
    assert fast == generic
    assert decode_body(encode_deliver("m1", "q", b"", {}, 1)[4:]).headers == {
        "deliveryAttempts": "1"
    }


@pytest.mark.parametrize(
    ("body", "code"),
    [
        (b"\x01", ErrorCode.INVALID_MESSAGE),
        (b"\x02\x0a" + s16("p") + b"\x00" * 8, ErrorCode.INVALID_MESSAGE),
        (b"\x01\x05" + s16("p") + b"\x00" * 8, ErrorCode.UNKNOWN_COMMAND),
        (b"\x01\x0a" + s16("p") + b"\x00\x05ab", ErrorCode.INVALID_MESSAGE),
        (b"\x01\x0a\x00\x02\xff\xfe" + b"\x00" * 8, ErrorCode.INVALID_MESSAGE),
        (b"\x01\x0a\x00\x00" + b"\x00" * 8, ErrorCode.INVALID_MESSAGE),
        (b"\x01\x0a" + s16("p") + b"\x00\x00\x00\x00\x00\x10" + b"{}", ErrorCode.INVALID_MESSAGE),
        (encode_body(Message(CommandType.PING, "p")) + b"\x00", ErrorCode.INVALID_MESSAGE),
    ],
    ids=[
        "short",
        "version",
        "unknown-type",
        "truncated-queue",
        "bad-utf8",
        "no-id",
        "truncated-payload",
        "trailing",
    ],
)
def test_malformed_bodies(body: bytes, code: ErrorCode) -> None:
    with pytest.raises(ProtocolError) as info:
        decode_body(body)
    assert info.value.code == code
    assert not info.value.fatal


def test_error_carries_the_id_when_it_can_be_read() -> None:
    body = b"\x01\x05" + s16("abc") + b"\x00" * 8
    with pytest.raises(ProtocolError) as info:
        decode_body(body)
    assert info.value.message_id == "abc"


def test_header_limits() -> None:
    many = Message(CommandType.PUBLISH, "m", "q", headers={f"k{i}": "v" for i in range(51)})
    with pytest.raises(ProtocolError, match="51 headers"):
        decode_body(encode_body(many))
    decode_body(encode_body(many), Limits(max_headers=51))
    long_value = Message(CommandType.PUBLISH, "m", "q", headers={"k": "x" * 4097})
    with pytest.raises(ProtocolError, match="4097"):
        decode_body(encode_body(long_value))


def test_invalid_json_payload() -> None:
    validate_json(b'{"a": [1, 2]}')
    validate_json(b"")
    for bad in (b"{", b"\xff", b"nope"):
        with pytest.raises(ProtocolError) as info:
            validate_json(bad, "m1")
        assert info.value.code == ErrorCode.INVALID_PAYLOAD
        assert info.value.message_id == "m1"


def test_frame_decoder_split_and_fatal_lengths() -> None:
    frames = encode(Message(CommandType.PING, "a")) + encode(Message(CommandType.PING, "b"))
    dec = FrameDecoder()
    assert dec.feed(frames[:5]) == []
    assert dec.buffered == 5
    bodies = dec.feed(frames[5:])
    assert [decode_body(b).id for b in bodies] == ["a", "b"]
    assert dec.buffered == 0

    zero = FrameDecoder()
    with pytest.raises(ProtocolError) as info:
        zero.feed(b"\x00\x00\x00\x00")
    assert info.value.fatal

    big = FrameDecoder(max_message_size=100)
    good = encode(Message(CommandType.PING, "ok"))
    assert len(big.feed(good + struct.pack(">I", 101) + b"x")) == 1  # frames before still count
    assert big.error is not None and big.error.fatal
    with pytest.raises(ProtocolError):
        big.feed(b"more")


# -- property tests ------------------------------------------------------------------------------

text = st.text(min_size=1, max_size=40)
messages = st.builds(
    Message,
    type=st.sampled_from(list(CommandType)),
    id=text,
    queue=st.one_of(st.just(""), text),
    payload=st.one_of(
        st.just(b""),
        st.recursive(
            st.none() | st.booleans() | st.integers() | st.text(max_size=20),
            lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=8), c, max_size=4),
            max_leaves=10,
        ).map(lambda v: json.dumps(v).encode()),
    ),
    headers=st.dictionaries(text, text, max_size=8),
)


@given(messages)
def test_round_trip(msg: Message) -> None:
    if msg.type == CommandType.ERROR:
        msg.error_code, msg.error_message = "X", "y"
    frame = encode(msg)
    [body] = FrameDecoder().feed(frame)
    assert decode_body(body) == msg


@given(st.lists(messages, min_size=1, max_size=6))
def test_one_shot_equals_byte_at_a_time(msgs: list[Message]) -> None:
    stream = b"".join(encode(m) for m in msgs)
    one_shot = FrameDecoder().feed(stream)
    dec = FrameDecoder()
    trickled: list[bytes] = []
    for i in range(len(stream)):
        trickled.extend(dec.feed(stream[i : i + 1]))
    assert trickled == one_shot
    assert len(one_shot) == len(msgs)


def _frames(frames: list[bytes | Split]) -> list[object]:
    return [(f.skeleton, f.payload) if isinstance(f, Split) else f for f in frames]


@given(st.lists(messages, min_size=1, max_size=6), st.booleans())
def test_one_shot_equals_byte_at_a_time_filled_in_place(msgs: list[Message], into: bool) -> None:
    """With every payload split out and filled in place from its first byte still to come
    (``fill_from=1``): one byte at a time, fed or read straight into the fill as the
    transport does, gives the frames the whole stream gives at once."""
    stream = b"".join(encode(m) for m in msgs)
    one_shot = FrameDecoder(split_from=1, fill_from=1).feed_frames(stream)
    dec = FrameDecoder(split_from=1, fill_from=1)
    trickled: list[bytes | Split] = []

    def feed(data: bytes) -> None:
        trickled.extend(dec.feed_frames(data))

    for i in range(len(stream)):
        if into:
            read_through(stream[i : i + 1], lambda: dec.filling, feed)
        else:
            feed(stream[i : i + 1])
    assert _frames(trickled) == _frames(one_shot)
    assert dec.buffered == 0 and dec.filling is None


#: payloads JSON or not: JSON texts, the same with a byte changed, any bytes
_any_payloads = st.one_of(
    st.recursive(
        st.none() | st.booleans() | st.floats(allow_nan=False) | st.text(max_size=20),
        lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=8), c, max_size=4),
        max_leaves=10,
    )
    .map(lambda v: json.dumps(v, ensure_ascii=False).encode())
    .flatmap(
        lambda doc: st.tuples(
            st.integers(min_value=0, max_value=len(doc) - 1), st.integers(0, 255), st.booleans()
        ).map(lambda m: doc[: m[0]] + bytes([m[1]]) + doc[m[0] + 1 :] if m[2] else doc)
    ),
    st.binary(min_size=1, max_size=60),
)


@settings(max_examples=300)
@given(
    st.lists(st.tuples(text, _any_payloads), min_size=1, max_size=4),
    st.lists(st.integers(min_value=1, max_value=40), min_size=1, max_size=5),
    st.booleans(),
)
def test_a_filled_payload_is_checked_as_its_parts_land(
    items: list[tuple[str, bytes]], chunks: list[int], into: bool
) -> None:
    """A payload filled in place is checked part by part (the first part where it is
    copied in, the rest as reads land in the fill or are copied in): the verdict it comes out
    with is ``valid`` of the whole payload, however the reads cut it; every payload filled
    from its first byte (one byte a read) has one when the checker is compiled."""
    stream = b"".join(encode(Message(CommandType.PUBLISH, i, "q", p)) for i, p in items)
    for sizes in (chunks, [1]):
        dec = FrameDecoder(split_from=1, fill_from=1)
        out: list[bytes | Split] = []
        at = turn = 0
        while at < len(stream):
            size = sizes[turn % len(sizes)]
            turn += 1
            fill = dec.filling
            if into and fill is not None:
                size = read_into_fill(fill, stream[at : at + size])[0]
                out += dec.feed_frames(b"")
            else:
                out += dec.feed_frames(stream[at : at + size])
            at += size
        assert [f.payload for f in out if isinstance(f, Split)] == [p for _, p in items]
        for split in out:
            assert isinstance(split, Split)
            if split.json_ok is not None:
                assert split.json_ok == jsoncheck.valid(split.payload)
            else:
                assert sizes != [1] or not jsoncheck.COMPILED


@settings(max_examples=300)
@given(st.binary(max_size=300), st.integers(min_value=1, max_value=50))
def test_arbitrary_bytes_raise_only_protocol_error(data: bytes, chunk: int) -> None:
    dec = FrameDecoder(max_message_size=200)
    try:
        for i in range(0, len(data), chunk):
            for body in dec.feed(data[i : i + chunk]):
                with contextlib.suppress(ProtocolError):
                    decode_body(body)
    except ProtocolError as exc:
        assert exc.fatal
    # the same with every payload split out and filled in place: what comes out, whole
    # or split, is what the stream at once gives (bad lengths left to the body's decoder)
    filled = FrameDecoder(max_message_size=200, split_from=1, fill_from=1)
    whole = FrameDecoder(max_message_size=200, split_from=1)
    got: list[bytes | Split] = []
    try:
        for i in range(0, len(data), chunk):
            got += filled.feed_frames(data[i : i + chunk])
    except ProtocolError as exc:
        assert exc.fatal
    try:
        expected = whole.feed_frames(data)
    except ProtocolError:
        expected = []
    assert _frames(got) == _frames(expected)[: len(got)]


@given(messages, st.data())
def test_truncated_bodies_raise_protocol_error(msg: Message, data: st.DataObject) -> None:
    body = encode_body(msg)
    cut = data.draw(st.integers(min_value=0, max_value=len(body) - 1))
    try:
        decode_body(body[:cut])
    except ProtocolError:
        return
    # A cut exactly after the headers is a complete non-Error message; anything else must fail.
    assert msg.type == CommandType.ERROR


def test_publish_ack_fast_path_equals_generic_encoder() -> None:
    generic = encode(
        Message(CommandType.PUBLISH_ACK, "m1", "q", headers={"messageId": "m1", "queueName": "q"})
    )
    assert encode_publish_ack("m1", "q") == generic


@settings(max_examples=300)
@given(st.one_of(messages.map(encode_body), st.binary(max_size=120)), st.data())
def test_fast_decoder_agrees_with_careful_decoder(body: bytes, data: st.DataObject) -> None:
    from vibemq_server.protocol.codec import DEFAULT_LIMITS, _decode_body, _fast_decode

    if body and data.draw(st.booleans()):
        i = data.draw(st.integers(0, len(body) - 1))
        body = body[:i] + bytes([data.draw(st.integers(0, 255))]) + body[i + 1 :]
    fast = _fast_decode(body, DEFAULT_LIMITS)
    try:
        careful = _decode_body(body, DEFAULT_LIMITS)
    except ProtocolError:
        assert fast is None
        return
    assert fast is None or fast == careful


@settings(max_examples=400)
@given(
    st.one_of(
        messages.map(lambda m: Message(CommandType.ACK, m.id, m.queue, m.payload, m.headers)),
        messages,
    ).map(encode_body),
    st.data(),
)
def test_ack_peek_agrees_with_the_decoder(body: bytes, data: st.DataObject) -> None:
    """The Ack fast path answers exactly what decoding would, or steps aside (None)."""
    from vibemq_server.protocol.codec import peek_ack_target

    if data.draw(st.booleans()):
        i = data.draw(st.integers(0, len(body) - 1))
        body = body[:i] + bytes([data.draw(st.integers(0, 255))]) + body[i + 1 :]
    peeked = peek_ack_target(body)
    try:
        msg = decode_body(body)
    except ProtocolError:
        assert peeked is None
        return
    if msg.type != CommandType.ACK:
        assert peeked is None
    elif peeked is not None:
        assert peeked == (msg.headers.get("messageId") or msg.id)


@pytest.mark.parametrize("attempts", [1, 63, 64, 1000])
def test_deliver_golden_bytes(attempts: int) -> None:
    a = str(attempts).encode()
    body = (
        b"\x01\x1a\x00\x02m1\x00\x01q\x00\x00\x00\x02{}\x00\x01"
        + b"\x00\x10deliveryAttempts"
        + len(a).to_bytes(2, "big")
        + a
    )
    assert encode_deliver("m1", "q", b"{}", {}, attempts) == len(body).to_bytes(4, "big") + body
    with_header = (
        b"\x01\x1a\x00\x02m1\x00\x01q\x00\x00\x00\x00\x00\x02\x00\x01k\x00\x01v"
        + b"\x00\x10deliveryAttempts"
        + len(a).to_bytes(2, "big")
        + a
    )
    framed = len(with_header).to_bytes(4, "big") + with_header
    assert encode_deliver("m1", "q", b"", {"k": "v", "deliveryAttempts": "9"}, attempts) == framed


@given(st.lists(messages, min_size=1, max_size=5), st.data())
def test_frame_decoder_any_split(msgs: list[Message], data: st.DataObject) -> None:
    """However a stream is cut into reads, the same bodies come out in order."""
    stream = b"".join(encode(m) for m in msgs)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=6)))
    decoder = FrameDecoder()
    bodies: list[bytes] = []
    last = 0
    for cut in [*cuts, len(stream)]:
        bodies += decoder.feed(stream[last:cut])
        last = cut
    assert bodies == [encode_body(m) for m in msgs]
    assert decoder.buffered == 0


@given(st.text(max_size=20), st.text(max_size=20))
def test_publish_ack_fast_path_for_any_id_and_queue(msg_id: str, queue: str) -> None:
    headers = {"messageId": msg_id, "queueName": queue}
    generic = encode(Message(CommandType.PUBLISH_ACK, msg_id, queue, b"", headers))
    assert encode_publish_ack(msg_id, queue) == generic


@pytest.mark.parametrize(("id_len", "queue_len"), [(255, 255), (256, 3), (3, 256), (300, 1000)])
def test_publish_ack_of_a_long_id_or_queue(id_len: int, queue_len: int) -> None:
    # Lengths of 256 bytes and more take the fast path's other branch (no tables for them).
    msg_id, queue = "i" * id_len, "é" * (queue_len // 2) + "q" * (queue_len % 2)
    headers = {"messageId": msg_id, "queueName": queue}
    generic = encode(Message(CommandType.PUBLISH_ACK, msg_id, queue, b"", headers))
    assert encode_publish_ack(msg_id, queue) == generic
