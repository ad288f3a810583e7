"""The sans-IO MQTT 3.1/3.1.1 codec: golden bytes, remaining length, properties, refusals.

Golden bytes are assembled by hand from the fixed-header spec (``../shared/specs``) and the
OASIS 3.1.1 layouts, not produced by the encoder. The last test runs paho-mqtt (if installed)
against a throwaway socket server built on our parser and encoder, both 3.1 and 3.1.1.
"""

from __future__ import annotations

import itertools
import queue
import socket
import struct
import threading
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vibemq_server.adapters.mqtt import (
    MAX_PACKET_SIZE,
    MAX_REMAINING_LENGTH,
    SUBACK_FAILURE,
    Connack,
    ConnackCode,
    Connect,
    Disconnect,
    MqttErrorCode,
    MqttParser,
    MqttProtocolError,
    Packet,
    PacketType,
    Pingreq,
    Pingresp,
    Puback,
    Pubcomp,
    Publish,
    Pubrec,
    Pubrel,
    Suback,
    Subscribe,
    Unsuback,
    Unsubscribe,
    decode_remaining_length,
    encode,
    encode_remaining_length,
)
from vibemq_server.adapters.mqtt.codec import encode_publish, encode_publish_qos0, topic_field

E = MqttErrorCode


def s(text: str) -> bytes:
    """A hand-built MQTT string: u16 big-endian byte length, then UTF-8."""
    raw = text.encode()
    return struct.pack(">H", len(raw)) + raw


def b16(raw: bytes) -> bytes:
    return struct.pack(">H", len(raw)) + raw


def frame(first: int, body: bytes) -> bytes:
    """Fixed header + body, for bodies under 128 bytes (one length byte)."""
    assert len(body) < 128
    return bytes((first, len(body))) + body


def parse_all(data: bytes, max_packet_size: int = MAX_PACKET_SIZE) -> list[Packet]:
    return MqttParser(max_packet_size).feed(data)


def parse_error(data: bytes, max_packet_size: int = MAX_PACKET_SIZE) -> MqttProtocolError:
    with pytest.raises(MqttProtocolError) as info:
        MqttParser(max_packet_size).feed(data)
    return info.value


def connect_body(
    *,
    name: str = "MQTT",
    level: int = 4,
    flags: int = 0x02,
    keep_alive: int = 60,
    payload: bytes | None = None,
) -> bytes:
    if payload is None:
        payload = s("abc")
    return s(name) + bytes((level, flags)) + struct.pack(">H", keep_alive) + payload


# --------------------------------------------------------------------------------------------
# Golden bytes, every packet type

GOLDEN: list[tuple[str, Packet, bytes]] = [
    (
        "connect-3.1.1-minimal",
        Connect(client_id="abc", clean_session=True, keep_alive=60),
        b"\x10\x0f\x00\x04MQTT\x04\x02\x00\x3c\x00\x03abc",
    ),
    (
        "connect-3.1-minimal",
        Connect(client_id="abc", keep_alive=60, protocol_name="MQIsdp", protocol_level=3),
        b"\x10\x11\x00\x06MQIsdp\x03\x02\x00\x3c\x00\x03abc",
    ),
    (
        "connect-3.1.1-empty-client-id",
        Connect(client_id="", clean_session=True, keep_alive=0),
        b"\x10\x0c\x00\x04MQTT\x04\x02\x00\x00\x00\x00",
    ),
    (
        "connect-3.1.1-everything",
        # flags: username 0x80 | password 0x40 | will retain 0x20 | will QoS 2 0x10 | will 0x04
        Connect(
            client_id="c1",
            clean_session=False,
            keep_alive=0x1234,
            will_topic="w/t",
            will_payload=b"\x00bye",
            will_qos=2,
            will_retain=True,
            username="u",
            password=b"\xffpw",
        ),
        b"\x10\x21\x00\x04MQTT\x04\xf4\x12\x34"
        b"\x00\x02c1\x00\x03w/t\x00\x04\x00bye\x00\x01u\x00\x03\xffpw",
    ),
    (
        "connect-3.1-will-qos1-username-only",
        Connect(
            client_id="x",
            keep_alive=10,
            protocol_name="MQIsdp",
            protocol_level=3,
            will_topic="a",
            will_payload=b"w",
            will_qos=1,
            username="me",
        ),
        # flags: username 0x80 | will QoS 1 0x08 | will 0x04 | clean 0x02
        b"\x10\x19\x00\x06MQIsdp\x03\x8e\x00\x0a\x00\x01x\x00\x01a\x00\x01w\x00\x02me",
    ),
    ("connack-accepted", Connack(), b"\x20\x02\x00\x00"),
    (
        "connack-session-present",
        Connack(return_code=0, session_present=True),
        b"\x20\x02\x01\x00",
    ),
    (
        "connack-identifier-rejected",
        Connack(return_code=ConnackCode.IDENTIFIER_REJECTED),
        b"\x20\x02\x00\x02",
    ),
    ("connack-not-authorized", Connack(return_code=5), b"\x20\x02\x00\x05"),
    ("publish-qos0", Publish(topic="a/b", payload=b"hi"), b"\x30\x07\x00\x03a/bhi"),
    ("publish-qos0-empty-payload", Publish(topic="t"), b"\x30\x03\x00\x01t"),
    (
        "publish-qos0-retain",
        Publish(topic="a/b", payload=b"hi", retain=True),
        b"\x31\x07\x00\x03a/bhi",
    ),
    (
        "publish-qos1-dup-retain",
        Publish(topic="a/b", payload=b"hi", qos=1, retain=True, dup=True, packet_id=10),
        b"\x3b\x09\x00\x03a/b\x00\x0ahi",
    ),
    (
        "publish-qos2",
        Publish(topic="a/b", payload=b"\x00\x01", qos=2, packet_id=0xFFFF),
        b"\x34\x09\x00\x03a/b\xff\xff\x00\x01",
    ),
    (
        "publish-utf8-topic",
        Publish(topic="é/€", payload=b"x"),
        b"\x30\x09\x00\x06\xc3\xa9/\xe2\x82\xacx",
    ),
    ("puback", Puback(1), b"\x40\x02\x00\x01"),
    ("pubrec", Pubrec(0x0102), b"\x50\x02\x01\x02"),
    ("pubrel", Pubrel(0x0102), b"\x62\x02\x01\x02"),
    ("pubcomp", Pubcomp(65535), b"\x70\x02\xff\xff"),
    (
        "subscribe",
        Subscribe(packet_id=10, subscriptions=(("a/+", 1), ("#", 2))),
        b"\x82\x0c\x00\x0a\x00\x03a/+\x01\x00\x01#\x02",
    ),
    (
        "subscribe-one-qos0",
        Subscribe(packet_id=1, subscriptions=(("$SYS/#", 0),)),
        b"\x82\x0b\x00\x01\x00\x06$SYS/#\x00",
    ),
    (
        "suback",
        Suback(packet_id=10, return_codes=(1, 2, SUBACK_FAILURE)),
        b"\x90\x05\x00\x0a\x01\x02\x80",
    ),
    ("suback-one", Suback(packet_id=7, return_codes=(0,)), b"\x90\x03\x00\x07\x00"),
    (
        "unsubscribe",
        Unsubscribe(packet_id=11, topic_filters=("a/b",)),
        b"\xa2\x07\x00\x0b\x00\x03a/b",
    ),
    (
        "unsubscribe-two",
        Unsubscribe(packet_id=11, topic_filters=("a/#", "+")),
        b"\xa2\x0a\x00\x0b\x00\x03a/#\x00\x01+",
    ),
    ("unsuback", Unsuback(11), b"\xb0\x02\x00\x0b"),
    ("pingreq", Pingreq(), b"\xc0\x00"),
    ("pingresp", Pingresp(), b"\xd0\x00"),
    ("disconnect", Disconnect(), b"\xe0\x00"),
]


@pytest.mark.parametrize(("packet", "wire"), [g[1:] for g in GOLDEN], ids=[g[0] for g in GOLDEN])
def test_golden_encode(packet: Packet, wire: bytes) -> None:
    assert encode(packet) == wire


@pytest.mark.parametrize(("packet", "wire"), [g[1:] for g in GOLDEN], ids=[g[0] for g in GOLDEN])
def test_golden_decode(packet: Packet, wire: bytes) -> None:
    assert parse_all(wire) == [packet]


def test_golden_covers_every_packet_type() -> None:
    assert {wire[0] >> 4 for _, _, wire in GOLDEN} == {int(t) for t in PacketType}


def test_golden_stream_decodes_in_order_in_one_feed() -> None:
    stream = b"".join(wire for _, _, wire in GOLDEN)
    assert parse_all(stream) == [packet for _, packet, _ in GOLDEN]


# --------------------------------------------------------------------------------------------
# Remaining length

# (value, encoding) from the spec's table, its two worked examples, and the 0 / max ends.
LENGTHS = [
    (0, b"\x00"),
    (64, b"\x40"),
    (127, b"\x7f"),
    (128, b"\x80\x01"),
    (321, b"\xc1\x02"),
    (16_383, b"\xff\x7f"),
    (16_384, b"\x80\x80\x01"),
    (2_097_151, b"\xff\xff\x7f"),
    (2_097_152, b"\x80\x80\x80\x01"),
    (268_435_455, b"\xff\xff\xff\x7f"),
]


@pytest.mark.parametrize(("value", "wire"), LENGTHS)
def test_remaining_length_encode(value: int, wire: bytes) -> None:
    assert encode_remaining_length(value) == wire


@pytest.mark.parametrize(("value", "wire"), LENGTHS)
def test_remaining_length_decode(value: int, wire: bytes) -> None:
    assert decode_remaining_length(wire) == (value, len(wire))
    # At an offset, with trailing bytes that are not part of the field.
    assert decode_remaining_length(b"\x30" + wire + b"\xff\xff", 1) == (value, len(wire))
    # Every proper prefix is "incomplete", not an error.
    for cut in range(len(wire)):
        assert decode_remaining_length(wire[:cut]) is None


def test_remaining_length_max_is_spec_max() -> None:
    assert MAX_REMAINING_LENGTH == 268_435_455
    assert MAX_PACKET_SIZE == 268_435_455 + 5


@pytest.mark.parametrize("value", [-1, 268_435_456, 2**32])
def test_remaining_length_encode_out_of_range(value: int) -> None:
    with pytest.raises(ValueError):
        encode_remaining_length(value)


@pytest.mark.parametrize("wire", [b"\xff\xff\xff\xff", b"\x80\x80\x80\x80\x01", b"\x80" * 4])
def test_remaining_length_fifth_byte_is_refused(wire: bytes) -> None:
    with pytest.raises(MqttProtocolError) as info:
        decode_remaining_length(wire)
    assert info.value.code is E.INVALID_REMAINING_LENGTH


def test_remaining_length_non_minimal_encoding_is_accepted() -> None:
    # 3.1/3.1.1 do not require the shortest form (MQTT 5 does); a PINGREQ "0x80 0x00".
    assert decode_remaining_length(b"\x80\x00") == (0, 2)
    assert parse_all(b"\xc0\x80\x00") == [Pingreq()]


@given(st.integers(0, MAX_REMAINING_LENGTH))
def test_remaining_length_round_trip(value: int) -> None:
    wire = encode_remaining_length(value)
    assert 1 <= len(wire) <= 4
    assert decode_remaining_length(wire) == (value, len(wire))


@pytest.mark.parametrize("size", [0, 127, 128, 16_383, 16_384])
def test_whole_packets_at_small_length_boundaries(size: int) -> None:
    # A PUBLISH whose remaining length is exactly ``size`` (topic "t" takes 3 bytes).
    if size < 3:
        packet: Packet = Pingreq()
        assert size == 0
    else:
        packet = Publish(topic="t", payload=b"p" * (size - 3))
    wire = encode(packet)
    header = encode_remaining_length(size)
    assert wire[1 : 1 + len(header)] == header
    assert len(wire) == 1 + len(header) + size
    assert parse_all(wire) == [packet]


def test_parser_waits_for_the_largest_possible_packet_without_buffering_it() -> None:
    parser = MqttParser()
    assert parser.feed(b"\x30\xff\xff\xff\x7f\x00\x01t") == []
    assert parser.buffered == 8


# --------------------------------------------------------------------------------------------
# Packet size limit


def test_packet_too_large_is_refused_from_the_header_alone() -> None:
    parser = MqttParser(100)
    with pytest.raises(MqttProtocolError) as info:
        parser.feed(b"\x30\x80\x01")  # announces 128 bytes; no body sent
    assert info.value.code is E.PACKET_TOO_LARGE


def test_packet_size_limit_counts_the_fixed_header() -> None:
    exact = encode(Publish(topic="t", payload=b"x" * 95))  # 2 + 3 + 95 = 100 bytes
    assert len(exact) == 100
    assert parse_all(exact, max_packet_size=100) == [Publish(topic="t", payload=b"x" * 95)]
    over = encode(Publish(topic="t", payload=b"x" * 96))
    assert parse_error(over, max_packet_size=100).code is E.PACKET_TOO_LARGE
    assert parse_error(over[:2], max_packet_size=100).code is E.PACKET_TOO_LARGE


def test_parser_refuses_silly_limits() -> None:
    with pytest.raises(ValueError):
        MqttParser(1)


# --------------------------------------------------------------------------------------------
# Hypothesis strategies: valid packets of every type

_NOT_NUL_OR_SURROGATE = st.characters(blacklist_categories=["Cs"], blacklist_characters="\x00")
_text = st.text(_NOT_NUL_OR_SURROGATE, max_size=20)
_level = st.text(
    st.characters(blacklist_categories=["Cs"], blacklist_characters="\x00+#/"), max_size=6
)
_topic_names = st.lists(_level, min_size=1, max_size=5).map("/".join).filter(bool)
_topic_filters = st.builds(
    lambda levels, hash_tail: "/".join([*levels, "#"] if hash_tail else levels),
    st.lists(st.one_of(_level, st.just("+")), min_size=1, max_size=5),
    st.booleans(),
).filter(bool)
_packet_ids = st.integers(1, 65_535)
_qos = st.integers(0, 2)
_binary = st.binary(max_size=40)


@st.composite
def _connects(draw: st.DrawFn) -> Connect:
    v31 = draw(st.booleans())
    clean = draw(st.booleans())
    if v31:
        client_id = draw(st.text(_NOT_NUL_OR_SURROGATE, min_size=1, max_size=23))
    else:
        client_id = draw(st.text(_NOT_NUL_OR_SURROGATE, min_size=0 if clean else 1, max_size=30))
    will = draw(st.booleans())
    username = draw(st.none() | _text)
    return Connect(
        client_id=client_id,
        clean_session=clean,
        keep_alive=draw(st.integers(0, 65_535)),
        protocol_name="MQIsdp" if v31 else "MQTT",
        protocol_level=3 if v31 else 4,
        will_topic=draw(_topic_names) if will else None,
        will_payload=draw(_binary) if will else b"",
        will_qos=draw(_qos) if will else 0,
        will_retain=draw(st.booleans()) if will else False,
        username=username,
        password=draw(st.none() | _binary) if username is not None else None,
    )


@st.composite
def _connacks(draw: st.DrawFn) -> Connack:
    code = draw(st.integers(0, 5))
    return Connack(return_code=code, session_present=draw(st.booleans()) if code == 0 else False)


@st.composite
def _publishes(draw: st.DrawFn) -> Publish:
    qos = draw(_qos)
    return Publish(
        topic=draw(_topic_names),
        payload=draw(st.binary(max_size=300)),
        qos=qos,
        retain=draw(st.booleans()),
        dup=draw(st.booleans()) if qos else False,
        packet_id=draw(_packet_ids) if qos else None,
    )


packets: st.SearchStrategy[Packet] = st.one_of(
    _connects(),
    _connacks(),
    _publishes(),
    st.builds(Puback, _packet_ids),
    st.builds(Pubrec, _packet_ids),
    st.builds(Pubrel, _packet_ids),
    st.builds(Pubcomp, _packet_ids),
    st.builds(
        Subscribe,
        _packet_ids,
        st.lists(st.tuples(_topic_filters, _qos), min_size=1, max_size=5).map(tuple),
    ),
    st.builds(
        Suback,
        _packet_ids,
        st.lists(st.sampled_from([0, 1, 2, SUBACK_FAILURE]), min_size=1, max_size=5).map(tuple),
    ),
    st.builds(
        Unsubscribe, _packet_ids, st.lists(_topic_filters, min_size=1, max_size=5).map(tuple)
    ),
    st.builds(Unsuback, _packet_ids),
    st.just(Pingreq()),
    st.just(Pingresp()),
    st.just(Disconnect()),
)


@given(packets)
@settings(max_examples=500)
def test_round_trip_every_packet_type(packet: Packet) -> None:
    assert parse_all(encode(packet)) == [packet]


def _feed_in_chunks(data: bytes, cuts: list[int]) -> list[Packet]:
    parser = MqttParser()
    out: list[Packet] = []
    bounds = sorted({0, len(data), *(c % (len(data) + 1) for c in cuts)})
    for start, end in itertools.pairwise(bounds):
        out.extend(parser.feed(data[start:end]))
    assert parser.buffered == 0
    return out


@given(st.lists(packets, max_size=8), st.lists(st.integers(0, 10_000), max_size=10))
def test_one_shot_equals_byte_at_a_time_and_any_chunking(
    stream: list[Packet], cuts: list[int]
) -> None:
    data = b"".join(encode(p) for p in stream)
    one_shot = parse_all(data)
    assert one_shot == stream
    parser = MqttParser()
    byte_at_a_time: list[Packet] = []
    for i in range(len(data)):
        byte_at_a_time.extend(parser.feed(data[i : i + 1]))
    assert byte_at_a_time == stream
    assert _feed_in_chunks(data, cuts) == stream


def _outcome(data: bytes, step: int | None) -> tuple[list[Packet], MqttErrorCode | None]:
    """Packets and error code (if any) when ``data`` arrives whole or ``step`` bytes at a time."""
    parser = MqttParser(4096)
    got: list[Packet] = []
    step = step or len(data) or 1
    try:
        for i in range(0, len(data), step):
            got.extend(parser.feed(data[i : i + step]))
    except MqttProtocolError as exc:
        got.extend(exc.packets)
        return got, exc.code
    return got, None


@given(st.binary(max_size=300))
@settings(max_examples=1000)
def test_arbitrary_bytes_raise_only_protocol_errors(data: bytes) -> None:
    whole = _outcome(data, None)  # any other exception fails the test
    assert _outcome(data, 1) == whole


@given(
    st.lists(packets, min_size=1, max_size=4),
    st.data(),
)
@settings(max_examples=500)
def test_corrupted_streams_raise_only_protocol_errors_and_chunking_agrees(
    stream: list[Packet], data: st.DataObject
) -> None:
    wire = bytearray(b"".join(encode(p) for p in stream))
    for _ in range(data.draw(st.integers(1, 3))):
        index = data.draw(st.integers(0, len(wire) - 1))
        wire[index] = data.draw(st.integers(0, 255))
    wire = wire[: data.draw(st.integers(0, len(wire)))] + data.draw(st.binary(max_size=5))
    whole = _outcome(bytes(wire), None)
    assert _outcome(bytes(wire), 1) == whole
    assert _outcome(bytes(wire), data.draw(st.integers(2, 16))) == whole


# --------------------------------------------------------------------------------------------
# Refusals


@pytest.mark.parametrize("first", [0x00, 0x0F, 0xF0, 0xFF])
def test_reserved_packet_types_are_refused_on_the_first_byte(first: int) -> None:
    assert parse_error(bytes((first,))).code is E.RESERVED_PACKET_TYPE


@pytest.mark.parametrize("first", [0x36, 0x37, 0x3E, 0x3F])
def test_publish_qos3_is_refused_on_the_first_byte(first: int) -> None:
    assert parse_error(bytes((first,))).code is E.INVALID_QOS


def test_publish_dup_on_qos0_is_refused() -> None:
    assert parse_error(b"\x38").code is E.INVALID_FLAGS


_FIXED = {
    PacketType.CONNECT: 0,
    PacketType.CONNACK: 0,
    PacketType.PUBACK: 0,
    PacketType.PUBREC: 0,
    PacketType.PUBREL: 2,
    PacketType.PUBCOMP: 0,
    PacketType.SUBSCRIBE: 2,
    PacketType.SUBACK: 0,
    PacketType.UNSUBSCRIBE: 2,
    PacketType.UNSUBACK: 0,
    PacketType.PINGREQ: 0,
    PacketType.PINGRESP: 0,
    PacketType.DISCONNECT: 0,
}


@pytest.mark.parametrize(
    "first",
    [(t << 4) | f for t, ok in _FIXED.items() for f in range(16) if f != ok],
)
def test_wrong_fixed_header_flags_are_refused(first: int) -> None:
    assert parse_error(bytes((first,))).code is E.INVALID_FLAGS


@pytest.mark.parametrize(
    "wire",
    [
        b"\xc0\x01\x00",  # PINGREQ with a body
        b"\xe0\x01\x00",  # DISCONNECT with a body
        b"\x40\x03\x00\x01\x00",  # PUBACK one byte long
        b"\x62\x01\x00",  # PUBREL one byte short
        b"\x20\x03\x00\x00\x00",  # CONNACK one byte long
        b"\xb0\x00",  # UNSUBACK without packet id
    ],
)
def test_wrong_length_of_fixed_size_packets_is_refused_before_the_body(wire: bytes) -> None:
    assert parse_error(wire[:2]).code is E.MALFORMED


@pytest.mark.parametrize(
    "wire",
    [
        b"\x32\x07\x00\x03a/b\x00\x00",  # PUBLISH QoS 1
        b"\x34\x07\x00\x03a/b\x00\x00",  # PUBLISH QoS 2
        b"\x40\x02\x00\x00",
        b"\x50\x02\x00\x00",
        b"\x62\x02\x00\x00",
        b"\x70\x02\x00\x00",
        b"\x82\x06\x00\x00\x00\x01a\x00",
        b"\x90\x03\x00\x00\x00",
        b"\xa2\x05\x00\x00\x00\x01a",
        b"\xb0\x02\x00\x00",
    ],
)
def test_packet_id_zero_is_refused(wire: bytes) -> None:
    assert parse_error(wire).code is E.INVALID_PACKET_ID


@pytest.mark.parametrize("first", [0x82, 0xA2])
def test_subscribe_and_unsubscribe_without_filters_are_refused(first: int) -> None:
    assert parse_error(bytes((first,)) + b"\x02\x00\x01").code is E.NO_TOPIC_FILTERS


BAD_UTF8 = [
    b"\xff",  # never valid
    b"\xc0\x80",  # overlong encoding of U+0000
    b"\xed\xa0\x80",  # UTF-16 surrogate U+D800
    b"a\xe2\x82",  # truncated sequence
    b"\x00",  # U+0000 itself
    b"a\x00b",
]


@pytest.mark.parametrize("raw", BAD_UTF8)
def test_invalid_utf8_in_publish_topic(raw: bytes) -> None:
    assert parse_error(frame(0x30, b16(raw) + b"payload")).code is E.INVALID_UTF8


@pytest.mark.parametrize("raw", BAD_UTF8)
def test_invalid_utf8_in_connect_strings(raw: bytes) -> None:
    bad_client_id = connect_body(payload=b16(raw))
    bad_username = connect_body(flags=0x82, payload=s("abc") + b16(raw))
    bad_will_topic = connect_body(flags=0x06, payload=s("abc") + b16(raw) + s("msg"))
    for body in (bad_client_id, bad_username, bad_will_topic):
        assert parse_error(frame(0x10, body)).code is E.INVALID_UTF8


@pytest.mark.parametrize("raw", BAD_UTF8)
def test_invalid_utf8_in_topic_filters(raw: bytes) -> None:
    assert parse_error(frame(0x82, b"\x00\x01" + b16(raw) + b"\x00")).code is E.INVALID_UTF8
    assert parse_error(frame(0xA2, b"\x00\x01" + b16(raw))).code is E.INVALID_UTF8


def test_utf8_bom_is_kept_not_stripped() -> None:
    assert parse_all(frame(0x30, s("\ufeffa"))) == [Publish(topic="\ufeffa")]


@pytest.mark.parametrize("topic", ["", "a/+", "#", "a/#", "+"])
def test_publish_topic_must_be_a_valid_topic_name(topic: str) -> None:
    assert parse_error(frame(0x30, s(topic) + b"x")).code is E.INVALID_TOPIC_NAME


def test_will_topic_must_be_a_valid_topic_name() -> None:
    body = connect_body(flags=0x06, payload=s("abc") + s("a/#") + s("msg"))
    assert parse_error(frame(0x10, body)).code is E.INVALID_TOPIC_NAME


@pytest.mark.parametrize("topic_filter", ["", "a/#/b", "a#", "a/b+", "+a"])
def test_subscribe_and_unsubscribe_need_valid_filters(topic_filter: str) -> None:
    sub = frame(0x82, b"\x00\x01" + s(topic_filter) + b"\x00")
    unsub = frame(0xA2, b"\x00\x01" + s(topic_filter))
    assert parse_error(sub).code is E.INVALID_TOPIC_FILTER
    assert parse_error(unsub).code is E.INVALID_TOPIC_FILTER


def test_subscribe_requested_qos_3_and_reserved_bits() -> None:
    assert parse_error(frame(0x82, b"\x00\x01" + s("a") + b"\x03")).code is E.INVALID_QOS
    assert parse_error(frame(0x82, b"\x00\x01" + s("a") + b"\x04")).code is E.MALFORMED
    assert parse_error(frame(0x82, b"\x00\x01" + s("a"))).code is E.MALFORMED  # no QoS byte


@pytest.mark.parametrize("code", [3, 0x7F, 0x81, 0xFF])
def test_suback_reserved_return_codes(code: int) -> None:
    assert parse_error(frame(0x90, bytes((0, 1, code)))).code is E.MALFORMED


def test_suback_without_return_codes() -> None:
    assert parse_error(frame(0x90, b"\x00\x01")).code is E.MALFORMED


@pytest.mark.parametrize("body", [b"\x02\x00", b"\x80\x00", b"\x01\x05", b"\x00\x06"])
def test_bad_connack(body: bytes) -> None:
    assert parse_error(frame(0x20, body)).code is E.MALFORMED


@pytest.mark.parametrize(
    ("name", "level"),
    [("MQTX", 4), ("mqtt", 4), ("MQIsdP", 3), ("", 4), ("MQTT\x00", 4)],
)
def test_connect_with_bad_protocol_name(name: str, level: int) -> None:
    raw = name.encode()
    body = b16(raw) + bytes((level, 0x02)) + b"\x00\x3c" + s("abc")
    error = parse_error(frame(0x10, body))
    assert error.code in (E.UNSUPPORTED_PROTOCOL_NAME, E.INVALID_UTF8)
    assert error.code.connack_code is None  # close without a CONNACK


@pytest.mark.parametrize(("name", "level"), [("MQTT", 3), ("MQTT", 5), ("MQIsdp", 4), ("MQTT", 0)])
def test_connect_with_unsupported_level_maps_to_connack_1(name: str, level: int) -> None:
    # The rest of the CONNECT is not parsed: an MQTT 5 CONNECT has properties we do not know.
    body = s(name) + bytes((level,)) + b"garbage"
    error = parse_error(frame(0x10, body))
    assert error.code is E.UNSUPPORTED_PROTOCOL_LEVEL
    assert error.code.connack_code is ConnackCode.UNACCEPTABLE_PROTOCOL_VERSION
    assert int(ConnackCode.UNACCEPTABLE_PROTOCOL_VERSION) == 1


def test_connect_reserved_flag() -> None:
    error = parse_error(frame(0x10, connect_body(flags=0x03)))
    assert error.code is E.INVALID_CONNECT_FLAGS


@pytest.mark.parametrize("flags", [0x08, 0x10, 0x18, 0x20, 0x2A])
def test_connect_will_qos_or_retain_without_will(flags: int) -> None:
    assert parse_error(frame(0x10, connect_body(flags=flags))).code is E.INVALID_CONNECT_FLAGS


def test_connect_will_qos_3() -> None:
    body = connect_body(flags=0x1E, payload=s("abc") + s("w") + s("m"))
    assert parse_error(frame(0x10, body)).code is E.INVALID_QOS


def test_connect_password_without_username() -> None:
    body = connect_body(flags=0x42, payload=s("abc") + s("pw"))
    assert parse_error(frame(0x10, body)).code is E.INVALID_CONNECT_FLAGS


def test_connect_trailing_and_truncated() -> None:
    assert parse_error(frame(0x10, connect_body() + b"\x00")).code is E.MALFORMED
    assert parse_error(frame(0x10, connect_body()[:-1])).code is E.MALFORMED
    # Username flag set but no username follows.
    assert parse_error(frame(0x10, connect_body(flags=0x82))).code is E.MALFORMED
    assert parse_error(frame(0x10, b"")).code is E.MALFORMED


@pytest.mark.parametrize("client_id", ["", "x" * 24])
def test_mqtt31_client_id_must_be_1_to_23_characters(client_id: str) -> None:
    body = connect_body(name="MQIsdp", level=3, payload=s(client_id))
    error = parse_error(frame(0x10, body))
    assert error.code is E.IDENTIFIER_REJECTED
    assert error.code.connack_code is ConnackCode.IDENTIFIER_REJECTED
    assert int(ConnackCode.IDENTIFIER_REJECTED) == 2


def test_mqtt31_client_id_counts_characters_not_bytes() -> None:
    client_id = "é" * 23  # 46 bytes
    body = connect_body(name="MQIsdp", level=3, payload=s(client_id))
    (packet,) = parse_all(frame(0x10, body))
    assert isinstance(packet, Connect)
    assert packet.client_id == client_id
    assert packet.protocol_level == 3


def test_mqtt311_client_id_rules() -> None:
    # Empty needs clean session; long ids are allowed (the server MAY accept them).
    error = parse_error(frame(0x10, connect_body(flags=0x00, payload=s(""))))
    assert error.code is E.IDENTIFIER_REJECTED
    assert parse_all(frame(0x10, connect_body(flags=0x02, payload=s("")))) == [
        Connect(client_id="", keep_alive=60)
    ]
    long_id = "c" * 100
    assert parse_all(encode(Connect(client_id=long_id))) == [Connect(client_id=long_id)]


def test_malformed_connect_wins_over_identifier_policy() -> None:
    body = connect_body(name="MQIsdp", level=3, payload=s("")) + b"\x00"
    assert parse_error(frame(0x10, body)).code is E.MALFORMED


def test_publish_truncated_topic() -> None:
    assert parse_error(frame(0x30, b"\x00\x05ab")).code is E.MALFORMED
    assert parse_error(frame(0x32, s("a") + b"\x00")).code is E.MALFORMED  # half a packet id


def test_publish_truncated_topic_is_refused_even_when_its_prefix_was_seen() -> None:
    # The decoder caches topic names; a cut topic whose bytes equal a cached one must
    # still be refused (this once made parsing depend on what was parsed before).
    assert parse_all(encode(Publish(topic="ab", payload=b""))) == [Publish("ab", b"")]
    assert parse_error(frame(0x30, b"\x00\x05ab")).code is E.MALFORMED


# --------------------------------------------------------------------------------------------
# Parser behaviour around errors and buffering


def test_packets_before_an_error_are_reported_with_it() -> None:
    parser = MqttParser()
    with pytest.raises(MqttProtocolError) as info:
        parser.feed(b"\xc0\x00" + encode(Publish(topic="a", payload=b"x")) + b"\xf0\x00")
    assert info.value.code is E.RESERVED_PACKET_TYPE
    assert info.value.packets == (Pingreq(), Publish(topic="a", payload=b"x"))


def test_parser_is_spent_after_an_error() -> None:
    parser = MqttParser()
    with pytest.raises(MqttProtocolError):
        parser.feed(b"\x00")
    with pytest.raises(MqttProtocolError) as info:
        parser.feed(b"\xc0\x00")
    assert info.value.code is E.RESERVED_PACKET_TYPE
    assert info.value.packets == ()


def test_partial_packet_stays_buffered() -> None:
    parser = MqttParser()
    wire = encode(Publish(topic="a/b", payload=b"hello", qos=1, packet_id=3))
    assert parser.feed(wire[:4]) == []
    assert parser.buffered == 4
    assert parser.feed(wire[4:] + b"\xc0") == [
        Publish(topic="a/b", payload=b"hello", qos=1, packet_id=3)
    ]
    assert parser.buffered == 1
    assert parser.feed(b"\x00") == [Pingreq()]
    assert parser.buffered == 0


def test_feed_accepts_bytearray_and_memoryview() -> None:
    parser = MqttParser()
    assert parser.feed(bytearray(b"\xc0")) == []
    assert parser.feed(memoryview(b"\x00\xd0\x00")) == [Pingreq(), Pingresp()]


def test_error_code_connack_mapping_is_only_for_connect_refusals() -> None:
    mapped = {code for code in MqttErrorCode if code.connack_code is not None}
    assert mapped == {E.UNSUPPORTED_PROTOCOL_LEVEL, E.IDENTIFIER_REJECTED}


def test_protocol_error_str_has_code_and_message() -> None:
    error = parse_error(b"\x00")
    assert str(error).startswith("reserved_packet_type: ")
    assert error.message in str(error)


# --------------------------------------------------------------------------------------------
# The encoder refuses packets the parser would refuse


@pytest.mark.parametrize(
    "packet",
    [
        Publish(topic="a", qos=3, packet_id=1),
        Publish(topic="a", qos=1),  # no packet id
        Publish(topic="a", qos=1, packet_id=0),
        Publish(topic="a", qos=1, packet_id=65_536),
        Publish(topic="a", packet_id=1),  # QoS 0 with an id
        Publish(topic="a", dup=True),
        Publish(topic="a/+"),
        Publish(topic=""),
        Publish(topic="a\x00"),
        Puback(0),
        Subscribe(packet_id=1, subscriptions=()),
        Subscribe(packet_id=1, subscriptions=(("a/#/b", 0),)),
        Subscribe(packet_id=1, subscriptions=(("a", 3),)),
        Suback(packet_id=1, return_codes=()),
        Suback(packet_id=1, return_codes=(3,)),
        Unsubscribe(packet_id=1, topic_filters=()),
        Connack(return_code=6),
        Connack(return_code=1, session_present=True),
        Connect(client_id="c", password=b"pw"),
        Connect(client_id="c", will_qos=1),
        Connect(client_id="c", will_topic="w", will_qos=3),
        Connect(client_id="c", keep_alive=65_536),
        Connect(client_id="x" * 65_536),
        Connect(client_id="\ud800"),
    ],
)
def test_encode_refuses_invalid_packets(packet: Packet) -> None:
    with pytest.raises(ValueError):
        encode(packet)


def test_encode_refuses_non_packets() -> None:
    with pytest.raises(TypeError):
        encode("PINGREQ")  # type: ignore[arg-type]


def test_encode_lets_any_protocol_name_level_and_client_id_through() -> None:
    wire = encode(Connect(client_id="", protocol_name="MQIsdp", protocol_level=3))
    assert parse_error(wire).code is E.IDENTIFIER_REJECTED


# --------------------------------------------------------------------------------------------
# Cross-check against a real client: paho-mqtt over a socket to a server built on the codec


class _CodecBroker(threading.Thread):
    """Accepts one connection, parses with MqttParser, answers with encode(). Test-only."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.server = socket.create_server(("127.0.0.1", 0))
        self.server.settimeout(10)
        self.port: int = self.server.getsockname()[1]
        self.raw = bytearray()
        self.received: list[Packet] = []
        self.error: BaseException | None = None

    def _replies(self, packet: Packet) -> list[Packet]:
        match packet:
            case Connect():
                return [Connack()]
            case Subscribe(packet_id=pid, subscriptions=subs):
                codes = tuple(SUBACK_FAILURE if f.startswith("refused") else q for f, q in subs)
                return [
                    Suback(pid, codes),
                    Publish("srv/zero", b"0"),
                    Publish("srv/one", b"1", qos=1, packet_id=101),
                    Publish("srv/two", b"2", qos=2, packet_id=102, retain=True),
                ]
            case Publish(qos=1, packet_id=pid) if pid is not None:
                return [Puback(pid)]
            case Publish(qos=2, packet_id=pid) if pid is not None:
                return [Pubrec(pid)]
            case Pubrel(packet_id=pid):
                return [Pubcomp(pid)]
            case Pubrec(packet_id=pid):
                return [Pubrel(pid)]
            case Unsubscribe(packet_id=pid):
                return [Unsuback(pid)]
            case Pingreq():
                return [Pingresp()]
        return []

    def run(self) -> None:
        try:
            conn, _ = self.server.accept()
            conn.settimeout(10)
            parser = MqttParser()
            with conn:
                while True:
                    data = conn.recv(65_536)
                    if not data:
                        return
                    self.raw += data
                    for packet in parser.feed(data):
                        self.received.append(packet)
                        for reply in self._replies(packet):
                            conn.sendall(encode(reply))
                        if isinstance(packet, Disconnect):
                            return
        except BaseException as exc:
            self.error = exc
        finally:
            self.server.close()


@pytest.mark.parametrize("version", ["MQTTv31", "MQTTv311"])
def test_paho_client_against_the_codec(version: str) -> None:
    mqtt: Any = pytest.importorskip("paho.mqtt.client")
    broker = _CodecBroker()
    broker.start()
    connected = threading.Event()
    subscribed: queue.Queue[list[int]] = queue.Queue()
    unsubscribed = threading.Event()
    messages: queue.Queue[tuple[str, bytes, int, bool]] = queue.Queue()

    client = mqtt.Client(
        mqtt.CallbackAPIVersion.VERSION2, client_id="paho-1", protocol=getattr(mqtt, version)
    )
    client.username_pw_set("user", "pässword")
    client.will_set("wills/paho", b"gone", qos=1, retain=True)
    client.on_connect = lambda c, u, flags, rc, props: connected.set()
    client.on_subscribe = lambda c, u, mid, rcs, props: subscribed.put([r.value for r in rcs])
    client.on_unsubscribe = lambda c, u, mid, rcs, props: unsubscribed.set()
    client.on_message = lambda c, u, m: messages.put((m.topic, m.payload, m.qos, m.retain))
    client.connect("127.0.0.1", broker.port, keepalive=30)
    client.loop_start()
    try:
        assert connected.wait(10)
        client.subscribe([("srv/#", 2), ("refused/x", 1)])
        assert subscribed.get(timeout=10) == [2, SUBACK_FAILURE]
        got = sorted(messages.get(timeout=10) for _ in range(3))
        assert got == [
            ("srv/one", b"1", 1, False),
            ("srv/two", b"2", 2, True),
            ("srv/zero", b"0", 0, False),
        ]
        for qos in (0, 1, 2):
            client.publish("up/é", f"m{qos}".encode(), qos=qos, retain=qos == 1).wait_for_publish(
                10
            )
        client.unsubscribe("srv/#")
        assert unsubscribed.wait(10)
    finally:
        client.disconnect()
        client.loop_stop()
    broker.join(10)
    assert not broker.is_alive()
    assert broker.error is None

    received = broker.received
    # Byte-exact: paho's packet builders and our encoder agree on every packet it sent.
    assert b"".join(encode(p) for p in received) == bytes(broker.raw)
    connect = received[0]
    v31 = version == "MQTTv31"
    assert connect == Connect(
        client_id="paho-1",
        clean_session=True,
        keep_alive=30,
        protocol_name="MQIsdp" if v31 else "MQTT",
        protocol_level=3 if v31 else 4,
        will_topic="wills/paho",
        will_payload=b"gone",
        will_qos=1,
        will_retain=True,
        username="user",
        password="pässword".encode(),
    )
    kinds = [type(p) for p in received]
    assert kinds.count(Subscribe) == 1
    assert kinds.count(Puback) == 1  # for our QoS 1
    assert kinds.count(Pubrec) == 1 and kinds.count(Pubcomp) == 1  # for our QoS 2
    assert kinds.count(Pubrel) == 1  # its QoS 2 publish
    assert kinds.count(Unsubscribe) == 1
    assert kinds[-1] is Disconnect
    ups = [p for p in received if isinstance(p, Publish)]
    assert [(p.topic, p.payload, p.qos, p.retain) for p in ups] == [
        ("up/é", b"m0", 0, False),
        ("up/é", b"m1", 1, True),
        ("up/é", b"m2", 2, False),
    ]


@given(
    st.text(st.characters(blacklist_characters="+#\x00", blacklist_categories=("Cs",)), min_size=1),
    st.binary(max_size=20_000),
    st.integers(0, 2),
    st.integers(1, 65_535),
    st.booleans(),
    st.booleans(),
)
def test_fast_publish_encoder_equals_the_codec(
    topic: str, payload: bytes, qos: int, pid: int, retain: bool, dup: bool
) -> None:
    dup = dup and qos > 0  # DUP is only defined with a packet id
    fast = encode_publish(topic.encode(), payload, qos, pid, retain=retain, dup=dup)
    assert fast == encode(Publish(topic, payload, qos, retain, dup, pid if qos else None))
    if qos == 0 and not retain:
        assert encode_publish_qos0(topic_field(topic), payload) == fast
