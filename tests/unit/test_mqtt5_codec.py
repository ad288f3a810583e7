"""The sans-IO MQTT 5.0 codec: golden bytes, properties, reason codes, round trips, refusals.

Golden bytes are assembled by hand from the OASIS MQTT 5.0 layouts (the CONNECT variable
header is the standard's own example, section 3.1.2.11), not produced by the encoder.
"""

from __future__ import annotations

import struct
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vibemq_server.adapters.mqtt.codec import MqttErrorCode, MqttProtocolError
from vibemq_server.adapters.mqtt.codec5 import Mqtt5Parser, encode5, encode_properties
from vibemq_server.adapters.mqtt.packets import PacketType, Pingreq, Pingresp
from vibemq_server.adapters.mqtt.packets5 import (
    Auth5,
    Connack5,
    Connect5,
    Disconnect5,
    Packet5,
    Properties,
    Puback5,
    Pubcomp5,
    Publish5,
    Pubrec5,
    Pubrel5,
    ReasonCode,
    Suback5,
    SubOptions,
    Subscribe5,
    Unsuback5,
    Unsubscribe5,
)

E = MqttErrorCode


def s(text: str) -> bytes:
    raw = text.encode()
    return struct.pack(">H", len(raw)) + raw


def frame(first: int, body: bytes) -> bytes:
    assert len(body) < 128
    return bytes((first, len(body))) + body


def parse(data: bytes, max_packet_size: int = 1 << 20) -> list[Packet5]:
    return Mqtt5Parser(max_packet_size).feed(data)


def error_of(data: bytes, max_packet_size: int = 1 << 20) -> MqttProtocolError:
    with pytest.raises(MqttProtocolError) as info:
        Mqtt5Parser(max_packet_size).feed(data)
    return info.value


# The standard's CONNECT variable header example (3.1.2.11): protocol name, level 5, flags
# 0xCE (user name, password, will QoS 1, will, clean start), keep alive 10, properties of 5
# bytes: Session Expiry Interval (0x11) = 10.
_CONNECT_VH = s("MQTT") + b"\x05\xce\x00\x0a" + b"\x05\x11\x00\x00\x00\x0a"

GOLDEN: list[tuple[Packet5, bytes]] = [
    (
        Connect5(
            "c",
            True,
            10,
            Properties(session_expiry_interval=10),
            "w",
            b"x",
            1,
            False,
            Properties(),
            "u",
            b"p",
        ),
        frame(0x10, _CONNECT_VH + s("c") + b"\x00" + s("w") + s("x") + s("u") + s("p")),
    ),
    (Connect5("", keep_alive=0), frame(0x10, s("MQTT") + b"\x05\x02\x00\x00\x00" + s(""))),
    (Connack5(), b"\x20\x03\x00\x00\x00"),
    (
        Connack5(0, True, Properties(receive_maximum=20, assigned_client_identifier="a")),
        frame(0x20, b"\x01\x00\x07\x12" + s("a") + b"\x21\x00\x14"),
    ),
    (Connack5(ReasonCode.BAD_AUTHENTICATION_METHOD), b"\x20\x03\x00\x8c\x00"),
    (
        Connack5(0, False, Properties(response_information="r/c/")),
        frame(0x20, b"\x00\x00\x07\x1a" + s("r/c/")),
    ),
    (
        Connack5(ReasonCode.SERVER_MOVED, False, Properties(server_reference="b:1")),
        frame(0x20, b"\x00\x9d\x06\x1c" + s("b:1")),
    ),
    (Publish5("a/b", b"hi"), frame(0x30, s("a/b") + b"\x00hi")),
    (Publish5("a/b", b"hi", 1, packet_id=0x0203), frame(0x32, s("a/b") + b"\x02\x03\x00hi")),
    (
        Publish5("a/b", b"", 2, True, True, 0xFFFF),
        frame(0x3D, s("a/b") + b"\xff\xff\x00"),
    ),
    (
        Publish5("a", b"", 1, packet_id=7, properties=Properties(message_expiry_interval=60)),
        frame(0x32, s("a") + b"\x00\x07\x05\x02\x00\x00\x00\x3c"),
    ),
    (
        Publish5("", b"z", properties=Properties(topic_alias=3)),
        frame(0x30, s("") + b"\x03\x23\x00\x03z"),
    ),
    (
        Publish5("t", properties=Properties(user_properties=(("k", "v"),))),
        frame(0x30, s("t") + b"\x07\x26" + s("k") + s("v")),
    ),
    (Puback5(1), b"\x40\x02\x00\x01"),
    (Puback5(1, ReasonCode.NO_MATCHING_SUBSCRIBERS), b"\x40\x03\x00\x01\x10"),
    (Pubrec5(2, 0x87), b"\x50\x03\x00\x02\x87"),
    (Pubrel5(3), b"\x62\x02\x00\x03"),
    # the QoS acks' usual form (length 2: success, no properties), decoded inline
    (Pubrec5(0x0102), b"\x50\x02\x01\x02"),
    (Pubcomp5(0xFF00), b"\x70\x02\xff\x00"),
    (Puback5(0x00FF), b"\x40\x02\x00\xff"),
    (Pubcomp5(4, 0x92), b"\x70\x03\x00\x04\x92"),
    (
        Puback5(5, 0x80, Properties(reason_string="no")),
        frame(0x40, b"\x00\x05\x80\x05\x1f" + s("no")),
    ),
    (
        Subscribe5(1, (("a/#", SubOptions(1, True, True, 2)),)),
        frame(0x82, b"\x00\x01\x00" + s("a/#") + bytes((1 | 4 | 8 | 0x20,))),
    ),
    (
        Subscribe5(2, (("x", SubOptions()),), Properties(subscription_identifiers=(200,))),
        frame(0x82, b"\x00\x02\x03\x0b\xc8\x01" + s("x") + b"\x00"),
    ),
    (Suback5(1, (0, 1, 0x80)), b"\x90\x06\x00\x01\x00\x00\x01\x80"),
    (Unsubscribe5(3, ("a", "b")), frame(0xA2, b"\x00\x03\x00" + s("a") + s("b"))),
    (Unsuback5(3, (0, 0x11)), b"\xb0\x05\x00\x03\x00\x00\x11"),
    (Pingreq(), b"\xc0\x00"),
    (Pingresp(), b"\xd0\x00"),
    (Disconnect5(), b"\xe0\x00"),
    (Disconnect5(ReasonCode.SESSION_TAKEN_OVER), b"\xe0\x01\x8e"),
    (
        Disconnect5(0x04, Properties(session_expiry_interval=0)),
        b"\xe0\x07\x04\x05\x11\x00\x00\x00\x00",
    ),
    (
        Disconnect5(ReasonCode.USE_ANOTHER_SERVER, Properties(server_reference="s")),
        b"\xe0\x06\x9c\x04\x1c" + s("s"),
    ),
    (
        Connect5("", keep_alive=0, properties=Properties(request_response_information=1)),
        frame(0x10, s("MQTT") + b"\x05\x02\x00\x00\x02\x19\x01" + s("")),
    ),
    (Auth5(0x18, Properties(authentication_method="m")), frame(0xF0, b"\x18\x04\x15" + s("m"))),
]


@pytest.mark.parametrize(("packet", "wire"), GOLDEN)
def test_golden_encode(packet: Packet5, wire: bytes) -> None:
    assert encode5(packet) == wire


@pytest.mark.parametrize(("packet", "wire"), GOLDEN)
def test_golden_decode(packet: Packet5, wire: bytes) -> None:
    assert parse(wire) == [packet]


def test_publishes_decode_in_place_from_a_read_of_many_packets() -> None:
    """Each PUBLISH is decoded where it lies in the read (the topic known or not, with and
    without properties, among other packets): the packets and payloads of one read."""
    big = bytes(range(256)) * 40  # (over 4 KiB: the payload of a large PUBLISH)
    large = b"\x32\x88\x50" + s("x/y") + b"\x00\x05\x00" + big
    wire = (
        b"\x40\x02\x00\x01"
        + frame(0x30, s("in/place") + b"\x00one")
        + frame(0x32, s("in/place") + b"\x00\x07\x00two")  # (the topic known now)
        + frame(0x30, s("in/place") + b"\x02\x01\x01three")  # (with properties)
        + large
        + large
        + b"\x62\x02\x00\x09"
    )
    assert parse(wire) == [
        Puback5(1),
        Publish5("in/place", b"one"),
        Publish5("in/place", b"two", 1, packet_id=7),
        Publish5("in/place", b"three", properties=Properties(payload_format_indicator=1)),
        Publish5("x/y", big, 1, packet_id=5),
        Publish5("x/y", big, 1, packet_id=5),
        Pubrel5(9),
    ]
    assert all(type(p.payload) is bytes for p in parse(wire) if isinstance(p, Publish5))


@pytest.mark.parametrize(
    ("wire", "code"),
    [
        (b"\x40\x02\x00\x00", E.INVALID_PACKET_ID),
        (b"\x50\x02\x00\x00", E.INVALID_PACKET_ID),
        (b"\x62\x02\x00\x00", E.INVALID_PACKET_ID),
        (b"\x70\x02\x00\x00", E.INVALID_PACKET_ID),
        (b"\x60\x02\x00\x01", E.INVALID_FLAGS),  # PUBREL's flags must be 0010
        (b"\x52\x02\x00\x01", E.INVALID_FLAGS),
        (b"\x41\x02\x00\x01", E.INVALID_FLAGS),
        (b"\x72\x02\x00\x01", E.INVALID_FLAGS),
        (b"\x50\x01\x00", E.MALFORMED),  # shorter than its packet id
    ],
)
def test_qos_acks_refused_as_the_table_refuses_them(wire: bytes, code: MqttErrorCode) -> None:
    assert error_of(wire).code is code
    assert error_of(b"\xc0\x00" + wire).packets == (Pingreq(),)


def test_short_acknowledgements_decode_as_success() -> None:
    """A reason code may be left out (0 then) and the properties too (3.4.2.1)."""
    assert parse(b"\x40\x03\x00\x09\x00") == [Puback5(9)]
    assert parse(b"\xe0\x01\x00") == [Disconnect5()]
    assert parse(b"\xf0\x00") == [Auth5()]


# -- properties --------------------------------------------------------------------------------

_PUB = s("t")


def _publish_with(props: bytes) -> bytes:
    return frame(0x30, _PUB + bytes((len(props),)) + props)


@pytest.mark.parametrize(
    ("props", "code", "reason"),
    [
        # unknown identifier
        (b"\x7f\x00", E.UNKNOWN_PROPERTY, 0x81),
        # a property PUBLISH may not carry (Session Expiry Interval)
        (b"\x11\x00\x00\x00\x01", E.UNKNOWN_PROPERTY, 0x81),
        # the same property twice
        (b"\x02\x00\x00\x00\x01\x02\x00\x00\x00\x02", E.DUPLICATE_PROPERTY, 0x82),
        (b"\x03" + s("a") + b"\x03" + s("b"), E.DUPLICATE_PROPERTY, 0x82),
        # a value of the wrong kind: payload format 2
        (b"\x01\x02", E.INVALID_PROPERTY, 0x82),
        # truncated value
        (b"\x02\x00\x00", E.MALFORMED, 0x81),
        # a string that is not UTF-8
        (b"\x03\x00\x01\xff", E.INVALID_UTF8, 0x81),
        # a subscription identifier from a client
        (b"\x0b\x01", E.PROTOCOL_ERROR, 0x82),
    ],
)
def test_bad_properties(props: bytes, code: MqttErrorCode, reason: int) -> None:
    error = error_of(_publish_with(props))
    assert error.code is code
    assert error.code.reason_code == reason


def test_property_block_longer_than_the_packet() -> None:
    error = error_of(frame(0x30, _PUB + b"\x10\x01\x00"))
    assert error.code is E.MALFORMED


def test_repeatable_properties_keep_their_order() -> None:
    props = b"\x26" + s("a") + s("1") + b"\x26" + s("a") + s("2")
    (packet,) = parse(_publish_with(props))
    assert isinstance(packet, Publish5)
    assert packet.properties.user_properties == (("a", "1"), ("a", "2"))


@pytest.mark.parametrize(
    "props",
    [b"\x21\x00\x00", b"\x27\x00\x00\x00\x00", b"\x17\x02", b"\x19\x05"],
    ids=["receive-maximum-0", "max-packet-size-0", "problem-info-2", "response-info-5"],
)
def test_connect_property_values_out_of_range_are_protocol_errors(props: bytes) -> None:
    body = s("MQTT") + b"\x05\x02\x00\x00" + bytes((len(props),)) + props + s("c")
    error = error_of(frame(0x10, body))
    assert error.code is E.INVALID_PROPERTY
    assert error.code.reason_code == ReasonCode.PROTOCOL_ERROR


def test_encoder_refuses_a_property_the_packet_may_not_carry() -> None:
    with pytest.raises(ValueError, match="not allowed"):
        encode_properties(Properties(topic_alias=1), PacketType.CONNACK)
    with pytest.raises(ValueError):
        encode_properties(Properties(receive_maximum=0), PacketType.CONNECT)


# -- other refusals ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("wire", "code"),
    [
        (frame(0x30, s("") + b"\x00x"), E.PROTOCOL_ERROR),  # empty topic, no alias
        (frame(0x30, s("a/+") + b"\x00"), E.INVALID_TOPIC_NAME),
        (frame(0x82, b"\x00\x01\x00" + s("a") + b"\x30"), E.PROTOCOL_ERROR),  # retain handling 3
        (frame(0x82, b"\x00\x01\x00" + s("a") + b"\x40"), E.MALFORMED),  # reserved option bit
        (frame(0x82, b"\x00\x01\x00" + s("a") + b"\x03"), E.INVALID_QOS),
        (frame(0x82, b"\x00\x01\x00"), E.NO_TOPIC_FILTERS),
        (b"\x40\x03\x00\x01\x05", E.MALFORMED),  # reason code not valid for PUBACK
        (b"\xe0\x01\x01", E.MALFORMED),  # 0x01 is no DISCONNECT reason
        (b"\xf1\x00", E.INVALID_FLAGS),
        (b"\x40\x01\x00", E.MALFORMED),  # PUBACK shorter than its packet id
        (frame(0x10, s("MQTT") + b"\x06\x02\x00\x00\x00" + s("c")), E.UNSUPPORTED_PROTOCOL_LEVEL),
    ],
)
def test_refusals(wire: bytes, code: MqttErrorCode) -> None:
    assert error_of(wire).code is code


def test_packet_over_the_maximum_is_refused_with_0x95_before_its_body() -> None:
    head = b"\x30\xe8\x07"  # a PUBLISH of 1000 bytes announced, none sent
    error = error_of(head, max_packet_size=500)
    assert error.code is E.PACKET_TOO_LARGE
    assert error.code.reason_code == ReasonCode.PACKET_TOO_LARGE


def test_packets_before_an_error_are_kept() -> None:
    error = error_of(b"\xc0\x00" + b"\xe0\x01\x01")
    assert error.packets == (Pingreq(),)


# -- round trips and chunking ------------------------------------------------------------------

_text = st.text(
    st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=8
)
_topic = st.lists(
    st.text(st.sampled_from("abc/XYZ é"), min_size=1, max_size=6), min_size=1, max_size=3
).map("/".join)
_pairs = st.lists(st.tuples(_text, _text), max_size=3).map(tuple)


@st.composite
def message_properties(draw: Any) -> Properties:
    return Properties(
        payload_format_indicator=draw(st.none() | st.sampled_from([0, 1])),
        message_expiry_interval=draw(st.none() | st.integers(0, 2**32 - 1)),
        content_type=draw(st.none() | _text),
        response_topic=draw(st.none() | _topic),
        correlation_data=draw(st.none() | st.binary(max_size=8)),
        user_properties=draw(_pairs),
        topic_alias=draw(st.none() | st.integers(1, 65535)),
    )


_pid = st.integers(1, 65535)


@st.composite
def publishes(draw: Any) -> Publish5:
    qos = draw(st.integers(0, 2))
    return Publish5(
        draw(_topic),
        draw(st.binary(max_size=40)),
        qos,
        draw(st.booleans()),
        draw(st.booleans()) if qos else False,
        draw(_pid) if qos else None,
        draw(message_properties()),
    )


_reasons = st.sampled_from([0x00, 0x10, 0x80, 0x87, 0x97])
_acks = st.one_of(
    st.builds(Puback5, _pid, _reasons, st.just(Properties())),
    st.builds(Pubrec5, _pid, _reasons, st.builds(Properties, reason_string=st.none() | _text)),
    st.builds(Pubrel5, _pid, st.sampled_from([0, 0x92])),
    st.builds(Pubcomp5, _pid, st.sampled_from([0, 0x92])),
)
_options = st.builds(SubOptions, st.integers(0, 2), st.booleans(), st.booleans(), st.integers(0, 2))
_subscribes = st.builds(
    Subscribe5,
    _pid,
    st.lists(st.tuples(_topic, _options), min_size=1, max_size=3).map(tuple),
    st.builds(
        Properties,
        subscription_identifiers=st.lists(st.integers(1, 268_435_455), max_size=1).map(tuple),
        user_properties=_pairs,
    ),
)
_connects = st.builds(
    Connect5,
    _text,
    st.booleans(),
    st.integers(0, 65535),
    st.builds(
        Properties,
        session_expiry_interval=st.none() | st.integers(0, 2**32 - 1),
        receive_maximum=st.none() | st.integers(1, 65535),
        maximum_packet_size=st.none() | st.integers(1, 2**32 - 1),
        topic_alias_maximum=st.none() | st.integers(0, 65535),
        request_problem_information=st.none() | st.sampled_from([0, 1]),
        request_response_information=st.none() | st.sampled_from([0, 1]),
        user_properties=_pairs,
    ),
)
# what the broker answers with Response Information or a Server Reference (section 4.11)
_redirects = st.builds(
    Properties,
    response_information=st.none() | _text,
    server_reference=st.none() | _text,
    reason_string=st.none() | _text,
)
_connacks = st.builds(Connack5, st.just(0), st.booleans(), _redirects) | st.builds(
    Connack5, st.sampled_from([0x9C, 0x9D]), st.just(False), _redirects
)
_disconnects = st.builds(
    Disconnect5,
    st.sampled_from([0x8B, 0x9C, 0x9D]),
    st.builds(Properties, server_reference=st.none() | _text),
)
packets = st.one_of(
    publishes(),
    _acks,
    _subscribes,
    _connects,
    st.builds(Unsubscribe5, _pid, st.lists(_topic, min_size=1, max_size=3).map(tuple)),
    st.builds(Disconnect5, st.sampled_from([0, 4, 0x8E, 0x95])),
    _connacks,
    _disconnects,
    st.just(Pingreq()),
)


@given(packets)
@settings(max_examples=300)
def test_round_trip(packet: Packet5) -> None:
    assert parse(encode5(packet)) == [packet]


@given(st.lists(packets, max_size=6), st.data())
@settings(max_examples=150)
def test_one_shot_equals_byte_at_a_time(items: list[Packet5], data: Any) -> None:
    wire = b"".join(encode5(p) for p in items)
    assert parse(wire) == items
    parser = Mqtt5Parser()
    got: list[Packet5] = []
    for index in range(len(wire)):
        got.extend(parser.feed(wire[index : index + 1]))
    assert got == items
    assert parser.buffered == 0


@given(st.binary(max_size=200))
@settings(max_examples=300)
def test_arbitrary_bytes_raise_only_protocol_errors(data: bytes) -> None:
    try:
        Mqtt5Parser().feed(data)
    except MqttProtocolError as exc:
        assert 0x80 <= exc.code.reason_code <= 0xA2
