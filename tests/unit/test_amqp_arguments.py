"""Queue redeclaration rules and wording (adapters/amqp/arguments.py) and the codec's wire types
of method argument tables, without a broker. The expected texts are rabbitmq-server 3.10's
(tests/integration/test_amqp_parity.py checks the same against real clients)."""

from __future__ import annotations

import struct
from typing import Any

import pytest
from pamqp import commands
from pamqp import frame as pamqp_frame

from vibemq_server.adapters.amqp.arguments import (
    InvalidQueueArgument,
    QueueMismatch,
    check_arguments,
    check_flags,
    infer_type,
    typed_arguments,
    validate_arguments,
)
from vibemq_server.adapters.amqp.codec import FieldTable, FrameParser, MethodFrame

pytestmark = pytest.mark.timeout(30)


def declared_arguments(table: bytes) -> Any:
    """The arguments of a queue.declare whose table is ``table``, as the parser decodes it."""
    args = struct.pack(">HB", 0, 1) + b"q" + b"\x00" + table
    payload = struct.pack(">HH", 50, 10) + args
    parser = FrameParser(131072)
    frames = parser.feed(
        b"AMQP\x00\x00\x09\x01" + struct.pack(">BHI", 1, 1, len(payload)) + payload + b"\xce"
    )
    method = frames[-1]
    assert isinstance(method, MethodFrame)
    return method.method.arguments  # type: ignore[attr-defined]


def table(*items: tuple[str, bytes]) -> bytes:
    body = b"".join(struct.pack(">B", len(k)) + k.encode() + v for k, v in items)
    return struct.pack(">I", len(body)) + body


def test_codec_keeps_the_wire_type_of_each_argument() -> None:
    args = declared_arguments(
        table(
            ("a", b"b\x0a"),
            ("b", b"s" + struct.pack(">h", 300)),
            ("c", b"I" + struct.pack(">i", 10)),
            ("d", b"l" + struct.pack(">q", 10)),
            ("e", b"S\x00\x00\x00\x02hi"),
            ("f", b"x\x00\x00\x00\x02hi"),
            ("g", b"t\x01"),
            ("h", b"d" + struct.pack(">d", 1.5)),
        )
    )
    assert isinstance(args, FieldTable)
    assert args == {"a": 10, "b": 300, "c": 10, "d": 10, "e": "hi", "f": b"hi", "g": True, "h": 1.5}
    assert args.types == {
        "a": "byte",
        "b": "short",
        "c": "signedint",
        "d": "long",
        "e": "longstr",
        "f": "binary",
        "g": "bool",
        "h": "double",
    }


def test_pamqp_encoded_declare_round_trips_with_types() -> None:
    """aio-pika's encoder (pamqp) picks the smallest integer type."""
    raw = pamqp_frame.marshal(
        commands.Queue.Declare(queue="q", arguments={"x-max-length": 10, "x-expires": 60000}), 1
    )
    parser = FrameParser(131072)
    method = parser.feed(b"AMQP\x00\x00\x09\x01" + raw)[-1]
    assert isinstance(method, MethodFrame)
    args = method.method.arguments  # type: ignore[attr-defined]
    assert typed_arguments(args) == {
        "x-expires": ("unsignedshort", 60000),
        "x-max-length": ("byte", 10),
    }


@pytest.mark.parametrize(
    ("value", "kind"),
    [
        (True, "bool"),
        (10, "signedint"),
        (2**40, "long"),
        ("s", "longstr"),
        (b"b", "binary"),
        (1.5, "double"),
        ({}, "table"),
        ([1], "array"),
        (None, "void"),
    ],
)
def test_inferred_types_are_what_pika_sends(value: Any, kind: str) -> None:
    assert infer_type(value) == kind


def mismatch(current: dict[str, Any], received: dict[str, Any]) -> str | None:
    try:
        check_arguments("q", typed_arguments(current), typed_arguments(received))
    except QueueMismatch as err:
        return str(err)
    return None


PREFIX = "inequivalent arg '{}' for queue 'q' in vhost '/': received "


def test_argument_mismatch_wording() -> None:
    assert mismatch({}, {"x-max-length": 10}) == (
        PREFIX.format("x-max-length") + "the value '10' of type 'signedint' but current is none"
    )
    assert mismatch({"x-dead-letter-exchange": "d"}, {}) == (
        PREFIX.format("x-dead-letter-exchange")
        + "none but current is the value 'd' of type 'longstr'"
    )
    assert mismatch({"x-single-active-consumer": True}, {"x-single-active-consumer": False}) == (
        PREFIX.format("x-single-active-consumer") + "'false' but current is 'true'"
    )
    # RabbitMQ's order decides which difference is named.
    assert mismatch(
        {"x-max-priority": 1, "x-expires": 5}, {"x-max-priority": 2, "x-expires": 6}
    ) == (PREFIX.format("x-expires") + "'6' but current is '5'")


def test_argument_equivalence() -> None:
    assert mismatch({"x-foo": 1}, {"x-foo": 2}) is None  # not compared
    assert mismatch({}, {"x-queue-type": "classic"}) is None  # the default
    assert mismatch({"x-max-length": 10}, {"x-max-length": 10}) is None
    assert mismatch({"x-dead-letter-exchange": "a"}, {"x-dead-letter-exchange": b"a"}) is None
    assert mismatch({"x-message-ttl": 5}, {"x-message-ttl": 5.0}) == (
        PREFIX.format("x-message-ttl") + "'5.0' but current is '5'"
    )
    assert mismatch({"x-max-length": 10}, {"x-max-length": "10"}) == (
        PREFIX.format("x-max-length") + "'10' but current is '10'"
    )
    assert mismatch({"x-single-active-consumer": True}, {"x-single-active-consumer": 1}) == (
        PREFIX.format("x-single-active-consumer") + "'1' but current is 'true'"
    )


def test_flag_mismatch_wording() -> None:
    check_flags("q", (True, True), (False, False))
    with pytest.raises(QueueMismatch) as info:
        check_flags("q", (False, True), (False, True))
    assert str(info.value) == PREFIX.format("durable") + "'true' but current is 'false'"
    with pytest.raises(QueueMismatch) as info:
        check_flags("q", (True, True), (True, False))
    assert str(info.value) == PREFIX.format("auto_delete") + "'false' but current is 'true'"


@pytest.mark.parametrize(
    ("args", "error"),
    [
        ({"x-max-length": -1}, "{value_negative,-1}"),
        ({"x-max-length-bytes": "x"}, '"expected integer, got longstr"'),
        ({"x-message-ttl": 1.5}, '"expected integer, got double"'),
        ({"x-expires": 0}, "{value_zero,0}"),
        ({"x-max-priority": 256}, "{max_value_exceeded,256}"),
        ({"x-overflow": "nope"}, "invalid_overflow"),
        ({"x-overflow": 1}, "{unacceptable_type,signedint}"),
        ({"x-dead-letter-routing-key": "k"}, "routing_key_but_no_dlx_defined"),
    ],
)
def test_validation_wording(args: dict[str, Any], error: str) -> None:
    with pytest.raises(InvalidQueueArgument) as info:
        validate_arguments("q", args)
    key = next(iter(args))
    assert str(info.value) == f"invalid arg '{key}' for queue 'q' in vhost '/': {error}"


def test_validation_accepts_rabbitmqs_valid_arguments() -> None:
    validate_arguments(
        "q",
        {
            "x-expires": 1,
            "x-message-ttl": 0,
            "x-dead-letter-exchange": "",
            "x-dead-letter-routing-key": "k",
            "x-max-length": 0,
            "x-max-length-bytes": 10,
            "x-max-priority": 255,
            "x-overflow": "reject-publish-dlx",
            "x-foo": object(),
        },
    )
    with pytest.raises(InvalidQueueArgument) as info:
        validate_arguments("q", {"x-dead-letter-exchange": 5, "x-max-length": -1})
    assert str(info.value) == (
        "invalid type 'signedint' for arg 'x-dead-letter-exchange' in queue 'q' in vhost '/'"
    )
