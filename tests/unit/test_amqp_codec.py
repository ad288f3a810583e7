"""The sans-IO AMQP 0-9-1 codec: golden bytes, refusals, and agreement with pamqp.

Golden bytes are the wire spec's own examples (``../shared/specs``: the 36-byte basic.publish,
the 32-byte content header, the heartbeat, body splitting, the field-table types), assembled
by hand rather than by the encoder. pamqp -- the reference codec aiormq uses -- is the oracle
for the hand-written fast paths: they must decode and encode exactly as it does.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import struct
from decimal import Decimal
from typing import Any, cast

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pamqp import base, commands, exceptions, header, heartbeat
from pamqp import body as pamqp_body
from pamqp import decode as pamqp_decode
from pamqp import encode as pamqp_encode
from pamqp import frame as pamqp_frame

from vibemq_server.adapters.amqp import (
    EMPTY_PROPERTIES,
    FRAME_MIN_SIZE,
    HEARTBEAT,
    PROTOCOL_HEADER,
    AmqpError,
    BodyFrame,
    DeliverEncoder,
    Frame,
    FrameParser,
    GetOkEncoder,
    HeaderFrame,
    Heartbeat,
    MethodFrame,
    ProtocolHeader,
    PublishTriple,
    ReplyCode,
    decode_properties,
    decode_table,
    encode_ack,
    encode_content,
    encode_deliver,
    encode_get_ok,
    encode_method,
    encode_nack,
    encode_properties,
    encode_return,
    encode_table,
)

UTC = dt.UTC
EPOCH = dt.datetime(1970, 1, 1, tzinfo=UTC)
MAX_TS = 253402300799  # 9999-12-31T23:59:59Z
Props = commands.Basic.Properties


def frame(frame_type: int, channel: int, payload: bytes, end: bytes = b"\xce") -> bytes:
    """A hand-built frame: type u8, channel u16, size u32, payload, frame-end."""
    return struct.pack(">BHI", frame_type, channel, len(payload)) + payload + end


def sstr(raw: bytes) -> bytes:
    return bytes((len(raw),)) + raw


def lstr(raw: bytes) -> bytes:
    return struct.pack(">I", len(raw)) + raw


def method(channel: int, class_id: int, method_id: int, args: bytes) -> bytes:
    return frame(1, channel, struct.pack(">HH", class_id, method_id) + args)


def parse(data: bytes, max_frame_size: int = 131072) -> list[Frame]:
    """Everything after the protocol header, fed in one piece."""
    frames = FrameParser(max_frame_size).feed(PROTOCOL_HEADER + data)
    assert frames[0] == ProtocolHeader(True, PROTOCOL_HEADER)
    return frames[1:]


def refusal(data: bytes, max_frame_size: int = 131072) -> AmqpError:
    with pytest.raises(AmqpError) as info:
        FrameParser(max_frame_size).feed(PROTOCOL_HEADER + data)
    return info.value


def norm(item: Frame) -> tuple[Any, ...]:
    """A comparable form: pamqp command objects have no __eq__."""
    if isinstance(item, MethodFrame):
        return ("method", item.channel, type(item.method), tuple(item.method))
    # (the dataclass's fields, not its __slots__: a compiled dataclass has none)
    return (type(item).__name__, *(getattr(item, f.name) for f in dataclasses.fields(item)))


def make_props(**values: Any) -> commands.Basic.Properties:
    """Properties without pamqp's validation (delivery_mode 0..255 is fine on the wire)."""
    props = object.__new__(Props)
    for name in Props.__slots__:
        setattr(props, name, values.get(name, "" if name == "cluster_id" else None))
    return props


def pamqp_header_props(raw: bytes) -> commands.Basic.Properties:
    content = header.ContentHeader()
    content.unmarshal(struct.pack(">HHQ", 60, 0, 0) + raw)
    return content.properties


# --------------------------------------------------------------------------------------------
# Golden bytes from the wire spec

PUBLISH_GOLDEN = (
    b"\x01\x00\x01\x00\x00\x00\x1c"  # METHOD, channel 1, size 28
    b"\x00\x3c\x00\x28"  # basic.publish
    b"\x00\x00"  # reserved ticket
    b"\x06events"
    b"\x0dorder.created"
    b"\x00"  # mandatory=0, immediate=0
    b"\xce"
)

# The spec's content header: flags 0x9000, content-type application/json, delivery-mode 2.
JSON_PROPERTIES = b"\x90\x00" + b"\x10application/json" + b"\x02"


def test_publish_frame_golden() -> None:
    assert len(PUBLISH_GOLDEN) == 36
    publish = commands.Basic.Publish(exchange="events", routing_key="order.created")
    assert pamqp_frame.marshal(publish, 1) == PUBLISH_GOLDEN
    assert encode_method(1, publish) == PUBLISH_GOLDEN
    [item] = parse(PUBLISH_GOLDEN)
    assert isinstance(item, MethodFrame)
    assert item.channel == 1
    decoded = item.method
    assert type(decoded) is commands.Basic.Publish
    assert (decoded.ticket, decoded.exchange, decoded.routing_key) == (0, "events", "order.created")
    assert (decoded.mandatory, decoded.immediate) == (False, False)


def test_content_header_golden() -> None:
    body = b'{"order_id":"123456789"}'
    assert len(body) == 24
    payload = b"\x00\x3c" + b"\x00\x00" + struct.pack(">Q", 24) + JSON_PROPERTIES
    assert len(payload) == 32  # 2 + 2 + 8 + 2 + 17 + 1
    props = Props(content_type="application/json", delivery_mode=2)
    assert encode_properties(props) == JSON_PROPERTIES == props.marshal()
    assert decode_properties(JSON_PROPERTIES) == props

    encoded = encode_content(1, PUBLISH_GOLDEN, JSON_PROPERTIES, body, 131072)
    assert encoded == PUBLISH_GOLDEN + frame(2, 1, payload) + frame(3, 1, body)
    assert parse(encoded)[1:] == [HeaderFrame(1, 24, JSON_PROPERTIES), BodyFrame(1, body)]


def test_heartbeat_golden() -> None:
    assert HEARTBEAT == frame(8, 0, b"") == pamqp_frame.marshal(heartbeat.Heartbeat(), 0)
    assert len(HEARTBEAT) == 8
    assert parse(HEARTBEAT * 2) == [Heartbeat(0), Heartbeat(0)]


def test_body_split_at_frame_max_golden() -> None:
    body = bytes(range(256)) * 1953 + b"x" * 32  # 500,000 bytes
    assert len(body) == 500_000
    encoded = encode_content(1, PUBLISH_GOLDEN, JSON_PROPERTIES, body, 131072)
    frames = parse(encoded)
    bodies = [item for item in frames if isinstance(item, BodyFrame)]
    assert [len(item.data) for item in bodies] == [131064, 131064, 131064, 106808]
    assert b"".join(item.data for item in bodies) == body
    # Every frame, 8 framing bytes included, fits frame-max.
    pos, sizes = len(PUBLISH_GOLDEN), []
    while pos < len(encoded):
        size = struct.unpack_from(">I", encoded, pos + 3)[0]
        sizes.append(size + 8)
        pos += size + 8
    assert max(sizes) == 131072

    small = encode_content(1, PUBLISH_GOLDEN, JSON_PROPERTIES, b"y" * 1024, 131072)
    assert small.endswith(frame(3, 1, b"y" * 1024))
    assert len(frame(3, 1, b"y" * 1024)) == 1032


def test_empty_body_has_no_body_frame() -> None:
    encoded = encode_content(1, PUBLISH_GOLDEN, EMPTY_PROPERTIES, b"", 4096)
    assert parse(encoded)[1:] == [HeaderFrame(1, 0, EMPTY_PROPERTIES)]


def test_body_exactly_one_frame_and_one_byte_more() -> None:
    for size, expected in ((4088, [4088]), (4089, [4088, 1]), (8176, [4088, 4088])):
        encoded = encode_content(1, PUBLISH_GOLDEN, EMPTY_PROPERTIES, b"z" * size, 4096)
        sizes = [len(i.data) for i in parse(encoded, 4096) if isinstance(i, BodyFrame)]
        assert sizes == expected


# Every field type of the spec's table section, hand-encoded: (type octet + value, decoded).
FIELD_GOLDEN: list[tuple[str, bytes, Any]] = [
    ("t", b"t\x01", True),
    ("t0", b"t\x00", False),
    ("t2", b"t\x02", True),  # any non-zero octet, as RabbitMQ reads it
    ("b", b"b\xff", -1),
    ("B", b"B\xff", 255),
    ("s", b"s\xff\xfe", -2),  # RabbitMQ's signed short
    ("U", b"U\xff\xfe", -2),  # the 0-9-1 grammar's letter for it
    ("u", b"u\xff\xfe", 65534),
    ("I", b"I\xff\xff\xff\xfd", -3),
    ("i", b"i\xff\xff\xff\xfd", 4294967293),
    ("L", b"L\xff\xff\xff\xff\xff\xff\xff\xfc", -4),  # both l and L: signed 64 (RabbitMQ)
    ("l", b"l\xff\xff\xff\xff\xff\xff\xff\xfc", -4),
    ("f", b"f" + struct.pack(">f", 1.5), 1.5),
    ("d", b"d" + struct.pack(">d", 0.1), 0.1),
    ("D", b"D\x02" + struct.pack(">i", 12345), Decimal("123.45")),
    ("Dneg", b"D\x01" + struct.pack(">i", -5), Decimal("-0.5")),
    ("S", b"S" + lstr("héllo".encode()), "héllo"),
    ("Sbin", b"S" + lstr(b"\xff\xfe"), b"\xff\xfe"),  # not UTF-8: bytes, as pamqp
    ("A", b"A" + lstr(b"I\x00\x00\x00\x01" + b"S" + lstr(b"x") + b"V"), [1, "x", None]),
    ("T", b"T" + struct.pack(">Q", 1_700_000_000), EPOCH + dt.timedelta(seconds=1_700_000_000)),
    ("F", b"F" + lstr(sstr(b"k") + b"t\x01"), {"k": True}),
    ("V", b"V", None),
    ("x", b"x" + lstr(b"\x00\x01"), bytearray(b"\x00\x01")),
]


def test_field_table_every_type_decodes() -> None:
    raw = lstr(b"".join(sstr(key.encode()) + value for key, value, _ in FIELD_GOLDEN))
    assert decode_table(raw) == {key: expected for key, _, expected in FIELD_GOLDEN}
    # pamqp reads the same bytes the same way (it lacks the spec's 'U').
    without_u = [entry for entry in FIELD_GOLDEN if entry[0] != "U"]
    raw = lstr(b"".join(sstr(key.encode()) + value for key, value, _ in without_u))
    assert decode_table(raw) == pamqp_decode.field_table(raw)[1]


def test_field_table_encoding_golden() -> None:
    when = EPOCH + dt.timedelta(seconds=1_700_000_000)
    table = {
        "bool": True,
        "i32": -3,
        "i64": 2**40,
        "dbl": 0.1,
        "dec": Decimal("123.45"),
        "str": "héllo",
        "bin": b"\xff",
        "arr": bytearray(b"\x00"),
        "ts": when,
        "naive": when.replace(tzinfo=None),  # naive datetimes are UTC
        "none": None,
        "list": [1, "x"],
        "tuple": (False,),
        "nested": {"k": 1},
    }
    expected = b"".join(
        [
            sstr(b"bool") + b"t\x01",
            sstr(b"i32") + b"I" + struct.pack(">i", -3),
            sstr(b"i64") + b"l" + struct.pack(">q", 2**40),
            sstr(b"dbl") + b"d" + struct.pack(">d", 0.1),
            sstr(b"dec") + b"D\x02" + struct.pack(">i", 12345),
            sstr(b"str") + b"S" + lstr("héllo".encode()),
            sstr(b"bin") + b"S" + lstr(b"\xff"),
            sstr(b"arr") + b"x" + lstr(b"\x00"),
            sstr(b"ts") + b"T" + struct.pack(">Q", 1_700_000_000),
            sstr(b"naive") + b"T" + struct.pack(">Q", 1_700_000_000),
            sstr(b"none") + b"V",
            sstr(b"list") + b"A" + lstr(b"I\x00\x00\x00\x01" + b"S" + lstr(b"x")),
            sstr(b"tuple") + b"A" + lstr(b"t\x00"),
            sstr(b"nested") + b"F" + lstr(sstr(b"k") + b"I\x00\x00\x00\x01"),
        ]
    )
    assert encode_table(table) == lstr(expected)
    assert encode_table({}) == b"\x00\x00\x00\x00"


@pytest.mark.parametrize(
    "value",
    [2**63, -(2**63) - 1, Decimal("NaN"), Decimal("1E+20"), Decimal("1E-256"), "k" * 0],
    ids=["u64", "i65", "nan", "big-decimal", "small-decimal", "ok"],
)
def test_encode_table_range_errors(value: Any) -> None:
    if value == "":
        assert decode_table(encode_table({"k": value})) == {"k": ""}
        return
    with pytest.raises(ValueError):
        encode_table({"k": value})


def test_encode_table_type_errors() -> None:
    with pytest.raises(TypeError):
        encode_table({"k": object()})
    with pytest.raises(TypeError):
        encode_table({1: 2})  # type: ignore[dict-item]
    with pytest.raises(ValueError):
        encode_table({"k" * 256: 1})
    with pytest.raises(ValueError):
        encode_table({"k": EPOCH - dt.timedelta(seconds=1)})
    loop: dict[str, Any] = {}
    loop["self"] = loop
    with pytest.raises(ValueError):
        encode_table(loop)


def test_properties_every_flag_golden() -> None:
    when = EPOCH + dt.timedelta(seconds=1_600_000_000)
    props = make_props(
        content_type="ct",
        content_encoding="ce",
        headers={"h": 1},
        delivery_mode=1,
        priority=9,
        correlation_id="ci",
        reply_to="rt",
        expiration="60000",
        message_id="mi",
        timestamp=when,
        message_type="mt",
        user_id="ui",
        app_id="ai",
        cluster_id="cl",
    )
    raw = (
        b"\xff\xfc"
        + sstr(b"ct")
        + sstr(b"ce")
        + lstr(sstr(b"h") + b"I\x00\x00\x00\x01")
        + b"\x01\x09"
        + sstr(b"ci")
        + sstr(b"rt")
        + sstr(b"60000")
        + sstr(b"mi")
        + struct.pack(">Q", 1_600_000_000)
        + sstr(b"mt")
        + sstr(b"ui")
        + sstr(b"ai")
        + sstr(b"cl")
    )
    assert encode_properties(props) == raw
    assert decode_properties(raw) == props
    assert pamqp_header_props(raw) == props
    empty = decode_properties(EMPTY_PROPERTIES)
    assert empty == Props() and empty.cluster_id == "" and empty.headers is None


def test_properties_keep_empty_strings_and_any_bytes() -> None:
    # pamqp's marshal drops '' values; ours sends them, so decode(encode(p)) == p exactly.
    props = make_props(content_type="", expiration="")
    assert decode_properties(encode_properties(props)) == props
    # Shortstr properties are pass-through: non-UTF-8 decodes (surrogateescape) and re-encodes.
    raw = b"\x04\x00" + sstr(b"\xff\x00id")
    assert encode_properties(decode_properties(raw)) == raw


def test_timestamp_in_milliseconds_is_read_as_such() -> None:
    millis = 1_700_000_000_123
    props = decode_properties(b"\x00\x40" + struct.pack(">Q", millis))
    assert props.timestamp == EPOCH + dt.timedelta(milliseconds=millis)
    with pytest.raises(AmqpError) as info:
        decode_properties(b"\x00\x40" + struct.pack(">Q", 2**64 - 1))
    assert info.value.code is ReplyCode.SYNTAX_ERROR


@pytest.mark.parametrize(
    "raw",
    [
        b"",
        b"\x80",  # flags truncated
        b"\x80\x00",  # content-type flagged, missing
        b"\x80\x00\x05ab",  # shortstr past the end
        b"\x10\x00\x02\x00",  # trailing byte
        b"\x00\x02",  # unassigned flag bit 1
        b"\x00\x01",  # continuation word missing
        b"\x00\x01\x80\x00",  # a property in a continuation word
        b"\x20\x00\x00\x00\x00\x05\x01kV",  # headers table longer than the data
        b"\x20\x00\x00\x00\x00\x03\x01kZ",  # unknown field type
    ],
)
def test_decode_properties_refuses_garbage(raw: bytes) -> None:
    with pytest.raises(AmqpError) as info:
        decode_properties(raw)
    assert info.value.code is ReplyCode.SYNTAX_ERROR
    assert info.value.fatal


def test_decode_properties_accepts_empty_continuation_word() -> None:
    assert decode_properties(b"\x10\x01\x00\x00\x02") == make_props(delivery_mode=2)


@pytest.mark.parametrize(
    "raw",
    [
        b"\x00\x00\x00",  # length truncated
        b"\x00\x00\x00\x05\x01kV",  # length past the data
        b"\x00\x00\x00\x00\x00",  # trailing byte
        lstr(sstr(b"k")),  # key without a value
        lstr(sstr(b"k") + b"I\x00"),  # value truncated
        lstr(sstr(b"k") + b"S\x00\x00\x00\x09ab"),  # longstr past its table
        lstr(sstr(b"k") + b"A\x00\x00\x00\x02I\x00"),  # array item past the array
        lstr(sstr(b"k") + b"F" + lstr(sstr(b"j") + b"?")),  # unknown type, nested
        lstr(sstr(b"k") + b"\x00"),  # pamqp's undocumented void: RabbitMQ refuses it
    ],
)
def test_decode_table_refuses_garbage(raw: bytes) -> None:
    with pytest.raises(AmqpError) as info:
        decode_table(raw)
    assert info.value.code is ReplyCode.SYNTAX_ERROR


def nested_arrays(depth: int) -> bytes:
    inner = b"V"
    for _ in range(depth):
        inner = b"A" + lstr(inner)
    return inner


def test_deep_nesting_is_a_syntax_error_not_a_recursion_error() -> None:
    with pytest.raises(AmqpError) as info:
        decode_table(lstr(sstr(b"a") + nested_arrays(5000)))
    assert info.value.code is ReplyCode.SYNTAX_ERROR
    assert decode_table(lstr(sstr(b"a") + nested_arrays(10)))["a"] is not None
    # The same table as queue.declare arguments goes through pamqp, which recurses.
    args = b"\x00\x00" + sstr(b"q") + b"\x00" + lstr(sstr(b"a") + nested_arrays(5000))
    error = refusal(method(1, 50, 10, args))
    assert (error.code, error.class_id, error.method_id) == (ReplyCode.SYNTAX_ERROR, 50, 10)


# --------------------------------------------------------------------------------------------
# The parser: protocol header, frames, refusals


def test_protocol_header_across_feeds_then_frames() -> None:
    parser = FrameParser()
    assert parser.feed(b"AMQ") == []
    assert parser.feed(b"P\x00\x00\x09") == []
    out = parser.feed(b"\x01" + HEARTBEAT[:3])
    assert out == [ProtocolHeader(True, PROTOCOL_HEADER)]
    assert parser.feed(HEARTBEAT[3:]) == [Heartbeat(0)]
    assert parser.feed(bytearray(HEARTBEAT)) == [Heartbeat(0)]
    assert parser.feed(memoryview(HEARTBEAT)) == [Heartbeat(0)]
    assert parser.feed(b"") == []


@pytest.mark.parametrize(
    "greeting", [b"AMQP\x01\x01\x00\x09", b"AMQP\x00\x00\x09\x00", b"GET / HTTP/1.1\r\n"]
)
def test_bad_protocol_header_is_reported_then_everything_ignored(greeting: bytes) -> None:
    parser = FrameParser()
    assert parser.feed(greeting + HEARTBEAT) == [ProtocolHeader(False, greeting[:8])]
    assert parser.feed(HEARTBEAT + b"garbage") == []


def test_frames_are_decoded_in_order_with_pamqp_objects() -> None:
    declare = commands.Queue.Declare(queue="q1", durable=True, arguments={"x-max-length": 10})
    stream = (
        encode_method(0, commands.Connection.TuneOk(2047, 131072, 60))
        + encode_method(1, declare)
        + encode_content(1, PUBLISH_GOLDEN, JSON_PROPERTIES, b"abc", 131072)
        + encode_method(1, commands.Basic.Ack(7, True))
        + HEARTBEAT
    )
    frames = parse(stream)
    assert [type(f).__name__ for f in frames] == [
        "MethodFrame",
        "MethodFrame",
        "MethodFrame",
        "HeaderFrame",
        "BodyFrame",
        "MethodFrame",
        "Heartbeat",
    ]
    tune = frames[0]
    assert isinstance(tune, MethodFrame) and isinstance(tune.method, commands.Connection.TuneOk)
    assert (tune.method.channel_max, tune.method.frame_max, tune.method.heartbeat) == (
        2047,
        131072,
        60,
    )
    queue = frames[1]
    assert isinstance(queue, MethodFrame) and isinstance(queue.method, commands.Queue.Declare)
    assert (queue.method.queue, queue.method.durable) == ("q1", True)
    assert queue.method.arguments == {"x-max-length": 10}
    ack = frames[5]
    assert isinstance(ack, MethodFrame) and isinstance(ack.method, commands.Basic.Ack)
    assert (ack.method.delivery_tag, ack.method.multiple) == (7, True)


def test_header_without_flags_word_means_no_properties() -> None:
    # RabbitMQ accepts a 12-byte content header; we hand consumers a valid flags word instead.
    assert parse(frame(2, 1, struct.pack(">HHQ", 60, 0, 5))) == [
        HeaderFrame(1, 5, EMPTY_PROPERTIES)
    ]


RC = ReplyCode
PUBLISH_ARGS = b"\x00\x00" + sstr(b"ex") + sstr(b"rk") + b"\x00"
# (id, bytes after the protocol header, code, channel, class_id, method_id)
REFUSALS: list[tuple[str, bytes, ReplyCode, int, int, int]] = [
    ("frame-end", frame(8, 0, b"", end=b"\x00"), RC.FRAME_ERROR, 0, 0, 0),
    ("frame-end-method", PUBLISH_GOLDEN[:-1] + b"\xcd", RC.FRAME_ERROR, 1, 0, 0),
    ("unknown-type-4", frame(4, 1, b"x"), RC.FRAME_ERROR, 1, 0, 0),
    ("unknown-type-0", frame(0, 0, b""), RC.FRAME_ERROR, 0, 0, 0),
    ("method-too-short", frame(1, 1, b"\x00\x3c\x00"), RC.FRAME_ERROR, 1, 0, 0),
    ("unknown-method", method(2, 60, 999, b""), RC.NOT_IMPLEMENTED, 2, 60, 999),
    ("unknown-class", method(2, 70, 10, b""), RC.NOT_IMPLEMENTED, 2, 70, 10),
    ("publish-truncated", method(1, 60, 40, PUBLISH_ARGS[:-1]), RC.SYNTAX_ERROR, 1, 60, 40),
    ("publish-trailing", method(1, 60, 40, PUBLISH_ARGS + b"\x00"), RC.SYNTAX_ERROR, 1, 60, 40),
    ("publish-exchange-long", method(1, 60, 40, b"\x00\x00\x09ex"), RC.SYNTAX_ERROR, 1, 60, 40),
    ("publish-empty", method(1, 60, 40, b""), RC.SYNTAX_ERROR, 1, 60, 40),
    (
        "publish-not-utf8",
        method(1, 60, 40, b"\x00\x00" + sstr(b"\xff") + sstr(b"") + b"\x00"),
        RC.SYNTAX_ERROR,
        1,
        60,
        40,
    ),
    ("ack-short", method(1, 60, 80, b"\x00" * 8), RC.SYNTAX_ERROR, 1, 60, 80),
    ("nack-long", method(1, 60, 120, b"\x00" * 10), RC.SYNTAX_ERROR, 1, 60, 120),
    ("reject-empty", method(1, 60, 90, b""), RC.SYNTAX_ERROR, 1, 60, 90),
    ("qos-truncated", method(1, 60, 10, b"\x00\x00"), RC.SYNTAX_ERROR, 1, 60, 10),
    ("open-bad-table", method(0, 10, 11, lstr(b"\x01kZ")), RC.SYNTAX_ERROR, 0, 10, 11),
    ("header-short", frame(2, 1, b"\x00\x3c\x00\x00"), RC.FRAME_ERROR, 1, 0, 0),
    (
        "header-13",
        frame(2, 1, struct.pack(">HHQ", 60, 0, 1) + b"\x00"),
        RC.FRAME_ERROR,
        1,
        0,
        0,
    ),
    (
        "header-class",
        frame(2, 1, struct.pack(">HHQ", 50, 0, 1) + EMPTY_PROPERTIES),
        RC.UNEXPECTED_FRAME,
        1,
        0,
        0,
    ),
    (
        "header-weight",
        frame(2, 1, struct.pack(">HHQ", 60, 1, 1) + EMPTY_PROPERTIES),
        RC.UNEXPECTED_FRAME,
        1,
        0,
        0,
    ),
    ("heartbeat-channel", frame(8, 3, b""), RC.FRAME_ERROR, 3, 0, 0),
    ("heartbeat-payload", frame(8, 0, b"x"), RC.FRAME_ERROR, 0, 0, 0),
]


@pytest.mark.parametrize(
    ("data", "code", "channel", "class_id", "method_id"),
    [entry[1:] for entry in REFUSALS],
    ids=[entry[0] for entry in REFUSALS],
)
def test_refusals(
    data: bytes, code: ReplyCode, channel: int, class_id: int, method_id: int
) -> None:
    error = refusal(HEARTBEAT + data + HEARTBEAT)
    assert (error.code, error.channel, error.class_id, error.method_id) == (
        code,
        channel,
        class_id,
        method_id,
    )
    assert error.fatal  # every framing/decoding problem closes the connection
    assert error.text.startswith(f"{code.name} - ")
    assert error.frames == (ProtocolHeader(True, PROTOCOL_HEADER), Heartbeat(0))


def test_oversized_frame_refused_from_its_header_alone() -> None:
    parser = FrameParser(max_frame_size=4096)
    parser.feed(PROTOCOL_HEADER)
    assert parser.feed(frame(3, 1, b"b" * 4096)) == [BodyFrame(1, b"b" * 4096)]
    with pytest.raises(AmqpError) as info:
        parser.feed(struct.pack(">BHI", 3, 1, 4097))  # the 7-byte header, no payload
    assert info.value.code is ReplyCode.FRAME_ERROR
    assert info.value.frames == ()
    with pytest.raises(AmqpError):  # a 4 GiB announcement: refused, not buffered
        FrameParser().feed(PROTOCOL_HEADER + struct.pack(">BHI", 3, 1, 0xFFFFFFFF))


def test_max_frame_size_is_settable_between_feeds() -> None:
    parser = FrameParser()
    parser.feed(PROTOCOL_HEADER + frame(3, 1, b"b" * 10_000))
    parser.max_frame_size = FRAME_MIN_SIZE
    with pytest.raises(AmqpError):
        parser.feed(frame(3, 1, b"b" * 10_000))


def test_parser_is_spent_after_an_error() -> None:
    parser = FrameParser()
    with pytest.raises(AmqpError) as first:
        parser.feed(PROTOCOL_HEADER + HEARTBEAT + method(5, 60, 999, b""))
    assert first.value.frames == (ProtocolHeader(True, PROTOCOL_HEADER), Heartbeat(0))
    with pytest.raises(AmqpError) as again:
        parser.feed(HEARTBEAT)
    assert (again.value.code, again.value.text, again.value.channel) == (
        first.value.code,
        first.value.text,
        first.value.channel,
    )
    assert (again.value.class_id, again.value.method_id) == (60, 999)
    assert again.value.frames == ()


def test_fatal_matches_pamqp_hard_and_soft_errors() -> None:
    for kind, fatal in ((exceptions.AMQPHardError, True), (exceptions.AMQPSoftError, False)):
        for error_class in kind.__subclasses__():
            code = ReplyCode(getattr(error_class, "value"))  # noqa: B009 (not typed by pamqp)
            assert code.name == getattr(error_class, "name").replace("-", "_")  # noqa: B009
            assert AmqpError(code, "x").fatal is fatal
    assert not AmqpError(ReplyCode.SUCCESS, "x").fatal


# --------------------------------------------------------------------------------------------
# Encoders against pamqp


def pamqp_content(
    channel: int, props: commands.Basic.Properties, body: bytes, frame_max: int
) -> bytes:
    out = pamqp_frame.marshal(header.ContentHeader(0, len(body), props), channel)
    step = frame_max - 8
    for offset in range(0, len(body), step):
        out += pamqp_frame.marshal(pamqp_body.ContentBody(body[offset : offset + step]), channel)
    return out


exchange_names = st.text(
    alphabet="abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.:", max_size=127
)
shortstr_text = st.text(max_size=60)  # at most 240 UTF-8 bytes
bodies = st.binary(max_size=9000)
simple_props = st.builds(
    Props,
    content_type=st.none() | st.text(min_size=1, max_size=20),
    delivery_mode=st.none() | st.sampled_from([1, 2]),
    priority=st.none() | st.integers(0, 9),
    message_id=st.none() | st.text(min_size=1, max_size=20),
    expiration=st.none() | st.text(alphabet="0123456789", min_size=1, max_size=8),
)


@settings(max_examples=150, deadline=None)
@given(
    channel=st.integers(1, 65535),
    consumer_tag=shortstr_text,
    delivery_tag=st.integers(0, 2**63 - 1),
    redelivered=st.booleans(),
    exchange=exchange_names,
    routing_key=shortstr_text,
    props=simple_props,
    body=bodies,
    frame_max=st.sampled_from([4096, 5000, 131072]),
)
def test_encode_deliver_equals_pamqp(
    channel: int,
    consumer_tag: str,
    delivery_tag: int,
    redelivered: bool,
    exchange: str,
    routing_key: str,
    props: commands.Basic.Properties,
    body: bytes,
    frame_max: int,
) -> None:
    deliver = commands.Basic.Deliver(consumer_tag, delivery_tag, redelivered, exchange, routing_key)
    expected = pamqp_frame.marshal(deliver, channel) + pamqp_content(
        channel, props, body, frame_max
    )
    encoded = encode_deliver(
        channel,
        consumer_tag.encode(),
        delivery_tag,
        redelivered,
        exchange.encode(),
        routing_key.encode(),
        props.marshal(),
        body,
        frame_max,
    )
    assert encoded == expected


@settings(max_examples=100, deadline=None)
@given(
    channel=st.integers(1, 65535),
    delivery_tag=st.integers(0, 2**63 - 1),
    redelivered=st.booleans(),
    exchange=exchange_names,
    routing_key=shortstr_text,
    message_count=st.integers(0, 2**32 - 1),
    reply_code=st.integers(0, 65535),
    reply_text=shortstr_text,
    props=simple_props,
    body=bodies,
)
def test_encode_get_ok_return_content_equal_pamqp(
    channel: int,
    delivery_tag: int,
    redelivered: bool,
    exchange: str,
    routing_key: str,
    message_count: int,
    reply_code: int,
    reply_text: str,
    props: commands.Basic.Properties,
    body: bytes,
) -> None:
    raw = props.marshal()
    content = pamqp_content(channel, props, body, 4096)
    get_ok = commands.Basic.GetOk(delivery_tag, redelivered, exchange, routing_key, message_count)
    assert encode_get_ok(
        channel,
        delivery_tag,
        redelivered,
        exchange.encode(),
        routing_key.encode(),
        message_count,
        raw,
        body,
        4096,
    ) == (pamqp_frame.marshal(get_ok, channel) + content)
    returned = commands.Basic.Return(reply_code, reply_text, exchange, routing_key)
    assert encode_return(
        channel,
        reply_code,
        reply_text.encode(),
        exchange.encode(),
        routing_key.encode(),
        raw,
        body,
        4096,
    ) == (pamqp_frame.marshal(returned, channel) + content)
    publish = encode_method(channel, commands.Basic.Publish(exchange=exchange))
    assert encode_content(channel, publish, raw, body, 4096) == publish + content


@settings(max_examples=100, deadline=None)
@given(
    channel=st.integers(0, 65535),
    delivery_tag=st.integers(0, 2**63 - 1),
    multiple=st.booleans(),
    requeue=st.booleans(),
)
def test_encode_ack_nack_equal_pamqp(
    channel: int, delivery_tag: int, multiple: bool, requeue: bool
) -> None:
    assert encode_ack(channel, delivery_tag, multiple) == pamqp_frame.marshal(
        commands.Basic.Ack(delivery_tag, multiple), channel
    )
    assert encode_nack(channel, delivery_tag, multiple, requeue) == pamqp_frame.marshal(
        commands.Basic.Nack(delivery_tag, multiple, requeue), channel
    )
    assert encode_nack(channel, delivery_tag, multiple) == encode_nack(
        channel, delivery_tag, multiple, False
    )


def test_encoders_refuse_bad_arguments() -> None:
    with pytest.raises(ValueError):
        encode_deliver(1, b"c" * 256, 1, False, b"", b"", EMPTY_PROPERTIES, b"", 4096)
    with pytest.raises(ValueError):
        encode_deliver(1, b"c", 1, False, b"", b"r" * 256, EMPTY_PROPERTIES, b"", 4096)
    with pytest.raises(ValueError):
        encode_deliver(1, b"c", -1, False, b"", b"", EMPTY_PROPERTIES, b"", 4096)
    with pytest.raises(ValueError):
        encode_get_ok(1, 1, False, b"e" * 256, b"", 0, EMPTY_PROPERTIES, b"", 4096)
    with pytest.raises(ValueError):
        encode_return(1, 312, b"t" * 256, b"", b"", EMPTY_PROPERTIES, b"", 4096)
    with pytest.raises(ValueError):
        encode_ack(1, 2**64, False)
    with pytest.raises(ValueError):
        encode_nack(70000, 1, False)
    with pytest.raises(ValueError):  # a body that needs splitting, frame-max under the minimum
        encode_content(1, PUBLISH_GOLDEN, EMPTY_PROPERTIES, b"b" * 5000, 1000)
    with pytest.raises(ValueError):
        encode_content(1, b"not a frame", EMPTY_PROPERTIES, b"", 4096)
    with pytest.raises(ValueError):
        encode_properties(make_props(delivery_mode=256))
    with pytest.raises(TypeError):
        encode_properties(make_props(content_type=b"bytes"))
    with pytest.raises(ValueError):
        encode_properties(make_props(message_id="m" * 256))


# --------------------------------------------------------------------------------------------
# Fast-path decoders against pamqp


def pamqp_decode_frame(data: bytes) -> base.Frame:
    _, _, value = pamqp_frame.unmarshal(data)
    assert isinstance(value, base.Frame)
    return value


def assert_same_method(data: bytes) -> None:
    [item] = parse(data)
    assert isinstance(item, MethodFrame)
    reference = pamqp_decode_frame(data)
    assert type(item.method) is type(reference)
    assert tuple(item.method) == tuple(reference)


@settings(max_examples=300, deadline=None)
@given(
    channel=st.integers(0, 65535),
    ticket=st.integers(0, 65535),
    queue=shortstr_text,
    bits=st.integers(0, 255),
)
def test_fast_get_agrees_with_pamqp(channel: int, ticket: int, queue: str, bits: int) -> None:
    args = struct.pack(">H", ticket) + sstr(queue.encode()) + bytes((bits,))
    assert_same_method(method(channel, 60, 70, args))
    # Truncated or with bytes after the bits octet: a syntax error, as for any method.
    for bad in (args[:-1], args + b"\x00", args[:2]):
        assert refusal(method(channel, 60, 70, bad)).code is ReplyCode.SYNTAX_ERROR


@settings(max_examples=300, deadline=None)
@given(
    channel=st.integers(0, 65535),
    ticket=st.integers(0, 65535),
    exchange=shortstr_text,
    routing_key=shortstr_text,
    bits=st.integers(0, 255),
)
def test_fast_publish_agrees_with_pamqp(
    channel: int, ticket: int, exchange: str, routing_key: str, bits: int
) -> None:
    args = struct.pack(">H", ticket) + sstr(exchange.encode()) + sstr(routing_key.encode())
    assert_same_method(method(channel, 60, 40, args + bytes((bits,))))


@settings(max_examples=300, deadline=None)
@given(
    channel=st.integers(0, 65535),
    method_id=st.sampled_from([80, 90, 120]),
    delivery_tag=st.integers(0, 2**63 - 1),
    bits=st.integers(0, 255),
)
def test_fast_ack_nack_reject_agree_with_pamqp(
    channel: int, method_id: int, delivery_tag: int, bits: int
) -> None:
    assert_same_method(method(channel, 60, method_id, struct.pack(">QB", delivery_tag, bits)))


def test_fast_ack_reads_delivery_tags_as_unsigned() -> None:
    # pamqp reads longlong as signed; the spec (and RabbitMQ) say unsigned.
    [item] = parse(method(1, 60, 80, struct.pack(">QB", 2**64 - 1, 1)))
    assert isinstance(item, MethodFrame) and isinstance(item.method, commands.Basic.Ack)
    assert item.method.delivery_tag == 2**64 - 1
    # Likewise on the generic path (basic.get-ok: the only way to reach it with a longlong).
    args = struct.pack(">QB", 2**64 - 1, 0) + sstr(b"") + sstr(b"rk") + struct.pack(">I", 3)
    [item] = parse(method(1, 60, 71, args))
    assert isinstance(item, MethodFrame) and isinstance(item.method, commands.Basic.GetOk)
    assert item.method.delivery_tag == 2**64 - 1


def test_large_arguments_table_decodes() -> None:
    # 18,000 entries in one 120 KiB queue.declare: linear here (pamqp: quadratic).
    entries = {str(i): None for i in range(18_000)}
    args = b"\x00\x00" + sstr(b"q") + b"\x00" + encode_table(entries)
    [item] = parse(method(1, 50, 10, args))
    assert isinstance(item, MethodFrame) and isinstance(item.method, commands.Queue.Declare)
    assert item.method.arguments == entries


def test_fast_publish_object_is_a_real_pamqp_publish() -> None:
    [item] = parse(PUBLISH_GOLDEN)
    assert isinstance(item, MethodFrame)
    # Re-encodes like one built by pamqp itself.
    assert encode_method(1, item.method) == PUBLISH_GOLDEN


# --------------------------------------------------------------------------------------------
# Hypothesis: streams, chunking, garbage

publish_frames = st.builds(
    lambda ch, ex, rk, m, i: encode_method(ch, commands.Basic.Publish(0, ex, rk, m, i)),
    st.integers(1, 65535),
    exchange_names,
    shortstr_text,
    st.booleans(),
    st.booleans(),
)
ack_frames = st.builds(
    lambda ch, tag, multiple, requeue, kind: encode_method(
        ch,
        [
            commands.Basic.Ack(tag, multiple),
            commands.Basic.Nack(tag, multiple, requeue),
            commands.Basic.Reject(tag, requeue),
        ][kind],
    ),
    st.integers(1, 65535),
    st.integers(0, 2**63 - 1),
    st.booleans(),
    st.booleans(),
    st.integers(0, 2),
)
cold_frames = st.sampled_from(
    [
        encode_method(0, commands.Connection.TuneOk(2047, 131072, 60)),
        encode_method(0, commands.Connection.Open("/")),
        encode_method(1, commands.Channel.Open()),
        encode_method(1, commands.Basic.Qos(0, 100, False)),
        encode_method(1, commands.Queue.Declare(queue="q", arguments={"x-max-length": 5})),
        encode_method(1, commands.Basic.Consume(queue="q", consumer_tag="c", no_ack=True)),
        encode_method(1, commands.Confirm.Select()),
        encode_method(2, commands.Channel.Close(200, "bye", 0, 0)),
    ]
)
header_frames = st.builds(
    lambda ch, size, props: frame(2, ch, struct.pack(">HHQ", 60, 0, size) + props.marshal()),
    st.integers(1, 65535),
    st.integers(0, 2**64 - 1),
    simple_props,
)
body_frames = st.builds(
    lambda ch, data: frame(3, ch, data), st.integers(1, 65535), st.binary(max_size=300)
)
any_frame = st.one_of(
    publish_frames, ack_frames, cold_frames, header_frames, body_frames, st.just(HEARTBEAT)
)
streams = st.lists(any_frame, max_size=8).map(b"".join)


def feed_in_pieces(data: bytes, cuts: list[int]) -> tuple[list[Frame], AmqpError | None]:
    """Feed ``data`` split at ``cuts``; collect the frames and the error, if any."""
    parser = FrameParser(max_frame_size=4096)
    out: list[Frame] = []
    previous = 0
    for cut in [*sorted(set(cuts)), len(data)]:
        try:
            out.extend(parser.feed(data[previous:cut]))
        except AmqpError as error:
            out.extend(error.frames)
            return out, error
        previous = cut
    return out, None


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(stream=streams)
def test_byte_at_a_time_equals_one_shot(stream: bytes) -> None:
    data = PROTOCOL_HEADER + stream
    one_shot = FrameParser(max_frame_size=4096).feed(data)
    drip, error = feed_in_pieces(data, list(range(1, len(data))))
    assert error is None
    assert [norm(f) for f in drip] == [norm(f) for f in one_shot]


@settings(max_examples=200, deadline=None)
@given(stream=streams, cuts=st.lists(st.integers(0, 4000), max_size=12))
def test_random_chunking_equals_one_shot(stream: bytes, cuts: list[int]) -> None:
    data = PROTOCOL_HEADER + stream
    one_shot = FrameParser(max_frame_size=4096).feed(data)
    pieces, error = feed_in_pieces(data, [c for c in cuts if c < len(data)])
    assert error is None
    assert [norm(f) for f in pieces] == [norm(f) for f in one_shot]


def known_frame_then_garbage() -> st.SearchStrategy[bytes]:
    """A plausible frame header (often a real method id) over a random payload."""
    index = st.sampled_from(sorted(commands.INDEX_MAPPING)).map(lambda i: struct.pack(">I", i))
    payload = st.one_of(
        st.binary(max_size=64), st.tuples(index, st.binary(max_size=64)).map(b"".join)
    )
    return st.builds(
        lambda kind, channel, data, end: struct.pack(">BHI", kind, channel, len(data)) + data + end,
        st.sampled_from([1, 1, 1, 2, 3, 8, 4, 0xCE]),
        st.integers(0, 3),
        payload,
        st.sampled_from([b"\xce", b"\xce", b"\xce", b"\x00"]),
    )


garbage = st.one_of(
    st.binary(max_size=300),
    st.lists(st.one_of(known_frame_then_garbage(), any_frame), max_size=6).map(b"".join),
)


@settings(max_examples=500, deadline=None)
@given(data=garbage, cuts=st.lists(st.integers(0, 400), max_size=6))
def test_garbage_after_header_raises_only_amqp_error(data: bytes, cuts: list[int]) -> None:
    stream = PROTOCOL_HEADER + data
    parser = FrameParser(max_frame_size=4096)
    try:
        one_shot: list[Frame] = parser.feed(stream)
        error: AmqpError | None = None
    except AmqpError as exc:
        one_shot, error = list(exc.frames), exc
    # However it is chunked, the same frames come out and the same error ends them.
    pieces, chunked_error = feed_in_pieces(stream, [c for c in cuts if c < len(stream)])
    assert [norm(f) for f in pieces] == [norm(f) for f in one_shot]
    assert (error is None) == (chunked_error is None)
    if error is not None and chunked_error is not None:
        assert (error.code, error.text) == (chunked_error.code, chunked_error.text)


def whole_publish(channel: int, rk: str, body: bytes, props: bytes, body_channel: int) -> bytes:
    """basic.publish + content header + one body frame (the body's channel may differ)."""
    method = encode_method(channel, commands.Basic.Publish(0, "", rk, False, False))
    head = frame(2, channel, struct.pack(">HHQ", 60, 0, len(body)) + props)
    return method + head + frame(3, body_channel, body)


whole_publishes = st.builds(
    whole_publish,
    st.sampled_from([1, 1, 2]),
    st.sampled_from(["q", "q", "other.queue"]),
    st.sampled_from([b"x" * 64, b"x" * 64, b"", b"{}", b"z" * 4089]),
    st.sampled_from([EMPTY_PROPERTIES, EMPTY_PROPERTIES, JSON_PROPERTIES, b""]),
    st.sampled_from([1, 1, 1, 2]),
)
# Runs of alike publishes (the parser reuses what it read for the last one), other frames
# between them, and garbage.
fusable = st.lists(
    st.one_of(whole_publishes, whole_publishes, any_frame, known_frame_then_garbage()),
    max_size=10,
).map(b"".join)


def feed_fused(data: bytes, cuts: list[int], fuse: bool) -> tuple[list[Any], Any]:
    """Feed ``data`` cut at ``cuts``; the frames (a PublishTriple as the three it stands for,
    compared by ``norm``) and the error's code and text."""
    parser = FrameParser(max_frame_size=4096, fuse_publish=fuse)
    out: list[Frame] = []
    previous, error = 0, None
    for cut in [*sorted(set(cuts)), len(data)]:
        try:
            out.extend(parser.feed(data[previous:cut]))
        except AmqpError as exc:
            out.extend(exc.frames)
            error = (exc.code, exc.text)
            break
        previous = cut
    frames = [part for f in out for part in (f.frames() if isinstance(f, PublishTriple) else [f])]
    return [norm(f) for f in frames], error


@settings(max_examples=400, deadline=None)
@given(data=fusable, cuts=st.lists(st.integers(0, 9000), max_size=6))
def test_fused_publishes_are_the_frames_they_stand_for(data: bytes, cuts: list[int]) -> None:
    stream = PROTOCOL_HEADER + data
    cuts = [c for c in cuts if c < len(stream)]
    assert feed_fused(stream, cuts, fuse=True) == feed_fused(stream, [], fuse=False)


def test_alike_publishes_share_one_head() -> None:
    one = whole_publish(1, "q", b"x" * 64, JSON_PROPERTIES, 1)
    other = whole_publish(1, "q", b"y" * 64, JSON_PROPERTIES, 1)
    frames = FrameParser(fuse_publish=True).feed(PROTOCOL_HEADER + one + other + one)
    triples = [f for f in frames if isinstance(f, PublishTriple)]
    assert [t.body for t in triples] == [b"x" * 64, b"y" * 64, b"x" * 64]
    assert triples[0].head is triples[1].head is triples[2].head
    assert (triples[0].head.routing_key, triples[0].head.properties) == ("q", JSON_PROPERTIES)
    # Split across reads, or with another body size, it is parsed again (and still fused).
    parser = FrameParser(fuse_publish=True)
    parser.feed(PROTOCOL_HEADER + one + other[:10])
    [rest] = parser.feed(other[10:])
    assert isinstance(rest, PublishTriple) and rest.body == b"y" * 64
    [longer] = parser.feed(whole_publish(1, "q", b"z" * 65, JSON_PROPERTIES, 1))
    assert isinstance(longer, PublishTriple) and longer.body == b"z" * 65


@pytest.mark.parametrize("cut", [0, 5, 20, 40])
def test_a_bad_frame_end_is_refused_whole_fused_or_cut(cut: int) -> None:
    """The method frame's frame-end of a publish that would be fused (checked by the fusing
    itself), and a frame cut over reads (checked when it is whole), as the read loop's."""
    good = whole_publish(1, "q", b"x" * 64, EMPTY_PROPERTIES, 1)
    method_end = good.index(b"\xce")
    bad = good[:method_end] + b"\xcd" + good[method_end + 1 :]
    for fuse in (True, False):
        parser = FrameParser(fuse_publish=fuse)
        stream = PROTOCOL_HEADER + good + bad
        at = len(PROTOCOL_HEADER + good) + cut if cut else len(stream)
        with pytest.raises(AmqpError) as info:
            parser.feed(stream[:at])
            parser.feed(stream[at:])
        assert (info.value.code, info.value.text) == (
            RC.FRAME_ERROR,
            "FRAME_ERROR - invalid frame end marker 0xcd",
        )


@settings(max_examples=300, deadline=None)
@given(raw=st.binary(max_size=200))
def test_decoders_raise_only_amqp_error_on_garbage(raw: bytes) -> None:
    for decode in (decode_properties, decode_table):
        try:
            decode(raw)
        except AmqpError as error:
            assert error.code is ReplyCode.SYNTAX_ERROR


# --------------------------------------------------------------------------------------------
# Hypothesis: table and property round trips

datetimes = st.integers(0, MAX_TS).map(lambda s: EPOCH + dt.timedelta(seconds=s))
decimals = st.builds(
    lambda mantissa, scale: Decimal(mantissa).scaleb(-scale),
    st.integers(-(2**31), 2**31 - 1),
    st.integers(0, 255),
)
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**63), 2**63 - 1),
    st.floats(allow_nan=False),
    st.text(max_size=20),
    st.binary(max_size=20),
    st.binary(max_size=20).map(bytearray),
    decimals,
    datetimes,
)
keys = st.text(max_size=12)
field_values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(keys, inner, max_size=4),
    max_leaves=16,
)
tables = st.dictionaries(keys, field_values, max_size=6)


def normalised(value: Any) -> Any:
    """What a value decodes back as: S carries bytes, and valid UTF-8 comes back as str."""
    if isinstance(value, bytes):
        try:
            return value.decode()
        except UnicodeDecodeError:
            return value
    if isinstance(value, dict):
        return {key: normalised(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [normalised(item) for item in value]
    return value


@settings(max_examples=300, deadline=None)
@given(table=tables)
def test_table_round_trip(table: dict[str, Any]) -> None:
    raw = encode_table(table)
    decoded = decode_table(raw)
    assert decoded == normalised(table)
    assert list(decoded) == list(table)  # order kept
    assert encode_table(decoded) == raw  # and the bytes: a relay re-encodes losslessly


# What pamqp can encode and decodes the same way: no bytes, f32 floats, 32-bit timestamps.
pamqp_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**63), 2**63 - 1),
    st.floats(allow_nan=False, allow_infinity=False, width=32),
    st.text(max_size=20),
    st.binary(max_size=20).map(bytearray),
    decimals,
    st.integers(0, 2**32 - 1).map(lambda s: EPOCH + dt.timedelta(seconds=s)),
)
pamqp_tables = st.dictionaries(
    keys,
    st.recursive(
        pamqp_scalars,
        lambda inner: st.lists(inner, max_size=4) | st.dictionaries(keys, inner, max_size=4),
        max_leaves=16,
    ),
    max_size=6,
)


@settings(max_examples=300, deadline=None)
@given(table=pamqp_tables)
def test_tables_interoperate_with_pamqp(table: dict[str, Any]) -> None:
    ours = encode_table(table)
    assert pamqp_decode.field_table(ours) == (len(ours), table)
    theirs = pamqp_encode.field_table(table)
    assert decode_table(theirs) == pamqp_decode.field_table(theirs)[1]


def opt(strategy: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.none() | strategy


all_props = st.builds(
    make_props,
    content_type=opt(shortstr_text),
    content_encoding=opt(shortstr_text),
    headers=opt(tables),
    delivery_mode=opt(st.integers(0, 255)),
    priority=opt(st.integers(0, 255)),
    correlation_id=opt(shortstr_text),
    reply_to=opt(shortstr_text),
    expiration=opt(shortstr_text),
    message_id=opt(shortstr_text),
    timestamp=opt(datetimes),
    message_type=opt(shortstr_text),
    user_id=opt(shortstr_text),
    app_id=opt(shortstr_text),
    cluster_id=shortstr_text,
)


@settings(max_examples=300, deadline=None)
@given(props=all_props)
def test_properties_round_trip(props: commands.Basic.Properties) -> None:
    decoded = decode_properties(encode_properties(props))
    expected = make_props(**{name: getattr(props, name) for name in Props.__slots__})
    expected.headers = None if props.headers is None else normalised(props.headers)
    assert decoded == expected


nonempty = st.text(min_size=1, max_size=40)
pamqp_props = st.builds(
    make_props,
    content_type=opt(nonempty),
    content_encoding=opt(nonempty),
    headers=opt(pamqp_tables),
    delivery_mode=opt(st.sampled_from([1, 2])),
    priority=opt(st.integers(0, 9)),
    correlation_id=opt(nonempty),
    reply_to=opt(nonempty),
    expiration=opt(nonempty),
    message_id=opt(nonempty),
    timestamp=opt(st.integers(0, 2**32 - 1).map(lambda s: EPOCH + dt.timedelta(seconds=s))),
    message_type=opt(nonempty),
    user_id=opt(nonempty),
    app_id=opt(nonempty),
)


@settings(max_examples=300, deadline=None)
@given(props=pamqp_props)
def test_properties_interoperate_with_pamqp(props: commands.Basic.Properties) -> None:
    theirs = props.marshal()
    assert decode_properties(theirs) == pamqp_header_props(theirs)
    ours = encode_properties(props)
    assert pamqp_header_props(ours) == props
    if props.headers is None:  # tables aside (integer widths differ), the bytes are identical
        assert ours == theirs


@settings(max_examples=100, deadline=None)
@given(props=simple_props, body=st.binary(max_size=20_000), frame_max=st.integers(4096, 9000))
def test_content_round_trip_through_parser(
    props: commands.Basic.Properties, body: bytes, frame_max: int
) -> None:
    encoded = encode_content(7, PUBLISH_GOLDEN, encode_properties(props), body, frame_max)
    frames = parse(encoded, frame_max)
    head = frames[1]
    assert isinstance(head, HeaderFrame) and head.body_size == len(body)
    assert decode_properties(head.properties) == props
    chunks = [item.data for item in frames[2:] if isinstance(item, BodyFrame)]
    assert b"".join(chunks) == body
    assert all(len(chunk) == frame_max - 8 for chunk in chunks[:-1])
    assert len(chunks) == -(-len(body) // (frame_max - 8))


ARGUMENT_VALUES: dict[str, st.SearchStrategy[Any]] = {
    "bit": st.booleans(),
    "octet": st.integers(0, 255),
    "short": st.integers(0, 65535),
    "long": st.integers(0, 2**32 - 1),
    "longlong": st.integers(0, 2**63 - 1),  # pamqp reads longlong signed
    "shortstr": st.text(max_size=60),
    "longstr": st.text(max_size=60),
    "table": pamqp_tables,
}


@pytest.mark.filterwarnings("ignore:This command is deprecated:DeprecationWarning")  # pamqp
@settings(max_examples=400, deadline=None)
@given(data=st.data(), index=st.sampled_from(sorted(commands.INDEX_MAPPING)))
def test_every_method_decodes_like_pamqp(data: st.DataObject, index: int) -> None:
    method_class = cast(type[base.Frame], commands.INDEX_MAPPING[index])
    value = object.__new__(method_class)
    for name in method_class.attributes():
        setattr(value, name, data.draw(ARGUMENT_VALUES[method_class.amqp_type(name)], name))
    object.__setattr__(value, "validate", lambda: None)  # random names need not be valid ones
    channel = data.draw(st.integers(0, 65535), "channel")
    raw = pamqp_frame.marshal(value, channel)
    assert_same_method(raw)
    # Exact lengths, as RabbitMQ: a byte less or a byte more is refused.
    payload = raw[7:-1]
    if len(payload) > 4:
        assert refusal(frame(1, channel, payload[:-1])).code is ReplyCode.SYNTAX_ERROR
    assert refusal(frame(1, channel, payload + b"\x00")).code is ReplyCode.SYNTAX_ERROR


@settings(max_examples=200, deadline=None)
@given(
    channel=st.integers(0, 65535),
    tag=st.binary(max_size=255),
    deliveries=st.lists(
        st.tuples(
            st.integers(0, 2**64 - 1),
            st.booleans(),
            st.sampled_from(["", "amq.topic", "ex"]),
            st.sampled_from(["q", "", "a.b"]),
            st.sampled_from([EMPTY_PROPERTIES, JSON_PROPERTIES, b""]),
            st.sampled_from([b"", b"x" * 64, b"y" * 4088, b"z" * 4089]),
        ),
        max_size=8,
    ),
)
def test_deliver_encoder_equals_encode_deliver(
    channel: int, tag: bytes, deliveries: list[tuple[int, bool, str, str, bytes, bytes]]
) -> None:
    encoder = DeliverEncoder(channel, tag, 4096)
    for delivery_tag, redelivered, exchange, key, props, body in deliveries:
        assert encoder.encode(delivery_tag, redelivered, exchange, key, props, body) == (
            encode_deliver(
                channel,
                tag,
                delivery_tag,
                redelivered,
                exchange.encode(),
                key.encode(),
                props,
                body,
                4096,
            )
        )


@settings(max_examples=200, deadline=None)
@given(
    channel=st.integers(0, 65535),
    gets=st.lists(
        st.tuples(
            st.integers(0, 2**64 - 1),
            st.booleans(),
            st.sampled_from(["", "amq.topic", "ex"]),
            st.sampled_from(["q", "", "a.b"]),
            st.integers(0, 2**32 - 1),
            st.sampled_from([EMPTY_PROPERTIES, JSON_PROPERTIES, b""]),
            st.sampled_from([b"", b"x" * 64, b"y" * 4088, b"z" * 4089]),
        ),
        max_size=8,
    ),
)
def test_get_ok_encoder_equals_encode_get_ok(
    channel: int, gets: list[tuple[int, bool, str, str, int, bytes, bytes]]
) -> None:
    encoder = GetOkEncoder(channel, 4096)
    for tag, redelivered, exchange, key, count, props, body in gets:
        assert encoder.encode(tag, redelivered, exchange, key, count, props, body) == (
            encode_get_ok(
                channel, tag, redelivered, exchange.encode(), key.encode(), count, props, body, 4096
            )
        )
