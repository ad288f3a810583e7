"""Sans-IO codec of MQTT 3.1 ("MQIsdp", level 3) and 3.1.1 ("MQTT", level 4).

``encode(packet) -> bytes`` serialises any packet of :mod:`adapters.mqtt.packets`;
:class:`MqttParser` is an incremental decoder: ``feed(data)`` appends bytes and returns every
packet completed by them, in order. Nothing here awaits, reads a clock or touches a socket.

Framing (both versions): a fixed header of one byte (packet type in the high nibble, flags in
the low nibble) and the *remaining length* in 1..4 bytes of 7-bit groups, least significant
first, the high bit meaning "more follows" (0..268,435,455). The variable header and payload
follow the OASIS MQTT 3.1.1 standard, which frames them as 3.1 did.

Errors: every problem with the input raises :class:`MqttProtocolError`, carrying an
:class:`MqttErrorCode`. The stream cannot be resynchronised after any of them, so the adapter
closes the connection; :attr:`MqttErrorCode.connack_code` says which CONNACK to send first when
the spec asks for one (unsupported protocol level -> 1, rejected client identifier -> 2). Checks
happen as early as the bytes allow: a reserved packet type or bad flags on the first byte, a
5th length byte or a packet over ``max_packet_size`` as soon as the length field is complete
(before any of the body is buffered), a wrong length for fixed-size packets likewise.

What the parser does *not* know is connection state: "first packet must be CONNECT", "only
one CONNECT", "a broker does not accept CONNACK/SUBACK/..." and keep-alive timing are the
adapter's job. Topic names (PUBLISH, will) and topic filters (SUBSCRIBE, UNSUBSCRIBE) are
checked with :mod:`adapters.mqtt.topics`; an invalid one is a protocol violation that closes
the connection (as mosquitto does), not a SUBACK 0x80.

``encode`` validates what it is given with ``ValueError`` (a programming error, not a peer's):
ranges of QoS / packet ids / lengths, topic rules, flag consistency. It deliberately lets any
protocol name, level and client id through, so tests and clients can build CONNECTs a broker
must refuse.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from enum import Enum
from struct import Struct
from typing import Any, Final, Protocol, TypeVar, cast

from vibemq_server.adapters.mqtt.packets import (
    MAX_CLIENT_ID_LENGTH_V31,
    PACKET_TYPES,
    PROTOCOL_LEVEL_V31,
    SUBACK_FAILURE,
    SUPPORTED_PROTOCOLS,
    Connack,
    ConnackCode,
    Connect,
    Disconnect,
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
)
from vibemq_server.adapters.mqtt.packets5 import ReasonCode
from vibemq_server.adapters.mqtt.topics import topic_filter_error, topic_name_error

# (bigcopy's join_range: the C one when built, one call instead of an interpreted loop)
from vibemq_server.protocol.bigcopy import Fill, Unjoined, join_range, payload_fill
from vibemq_server.protocol.held import Buffer, Filling, HeldInput, prefix

MAX_REMAINING_LENGTH: Final = 268_435_455
MAX_REMAINING_LENGTH_BYTES: Final = 4
#: The largest possible packet: 1 type byte, 4 length bytes and the largest body.
MAX_PACKET_SIZE: Final = 1 + MAX_REMAINING_LENGTH_BYTES + MAX_REMAINING_LENGTH
MAX_PACKET_ID: Final = 65_535
MAX_STRING_BYTES: Final = 65_535
#: A PUBLISH body at least this long is handed to its decoder as a view of the read (only
#: its payload is copied; MQTT 5, codec5.py; 3.1.1 decodes every PUBLISH in place,
#: ``_decode_publish_at``), and a held one is decoded from its parts (``held_packet``).
_VIEW_BODY: Final = 4096

_U16 = Struct(">H")

_VALID_QOS = frozenset((0, 1, 2))
_VALID_SUBACK_CODES = frozenset((0, 1, 2, SUBACK_FAILURE))
_CONNACK_CODES = frozenset(int(code) for code in ConnackCode)

# CONNECT flags byte.
_CF_RESERVED: Final = 0x01
_CF_CLEAN_SESSION: Final = 0x02
_CF_WILL: Final = 0x04
_CF_WILL_QOS_SHIFT: Final = 3
_CF_WILL_QOS_MASK: Final = 0x18
_CF_WILL_RETAIN: Final = 0x20
_CF_PASSWORD: Final = 0x40
_CF_USERNAME: Final = 0x80

# PUBLISH fixed-header flags.
_PF_RETAIN: Final = 0x01
_PF_QOS_SHIFT: Final = 1
_PF_QOS_MASK: Final = 0x06
_PF_DUP: Final = 0x08


class MqttErrorCode(Enum):
    """Why the input was refused. Every code means "close the connection"."""

    MALFORMED = "malformed"
    RESERVED_PACKET_TYPE = "reserved_packet_type"
    INVALID_FLAGS = "invalid_flags"
    INVALID_QOS = "invalid_qos"
    INVALID_REMAINING_LENGTH = "invalid_remaining_length"
    PACKET_TOO_LARGE = "packet_too_large"
    INVALID_UTF8 = "invalid_utf8"
    INVALID_PACKET_ID = "invalid_packet_id"
    NO_TOPIC_FILTERS = "no_topic_filters"
    INVALID_TOPIC_NAME = "invalid_topic_name"
    INVALID_TOPIC_FILTER = "invalid_topic_filter"
    UNSUPPORTED_PROTOCOL_NAME = "unsupported_protocol_name"
    UNSUPPORTED_PROTOCOL_LEVEL = "unsupported_protocol_level"
    INVALID_CONNECT_FLAGS = "invalid_connect_flags"
    IDENTIFIER_REJECTED = "identifier_rejected"
    # MQTT 5.0 only
    UNKNOWN_PROPERTY = "unknown_property"
    DUPLICATE_PROPERTY = "duplicate_property"
    INVALID_PROPERTY = "invalid_property"
    PROTOCOL_ERROR = "protocol_error"
    TOPIC_ALIAS_INVALID = "topic_alias_invalid"
    RECEIVE_MAXIMUM_EXCEEDED = "receive_maximum_exceeded"
    PAYLOAD_FORMAT_INVALID = "payload_format_invalid"

    @property
    def connack_code(self) -> ConnackCode | None:
        """The CONNACK return code to send before closing, or None to close without one.

        Only meaningful while the error is in a CONNECT; an unknown protocol *name* gets no
        CONNACK (3.1.1 section 3.1.2.1: the server MAY disconnect), nor does a malformed one.
        """
        return _CONNACK_FOR_ERROR.get(self)

    @property
    def reason_code(self) -> int:
        """The MQTT 5.0 reason code a CONNACK or DISCONNECT names this error by."""
        return _REASON_FOR_ERROR.get(self, ReasonCode.MALFORMED_PACKET)


_CONNACK_FOR_ERROR: dict[MqttErrorCode, ConnackCode] = {
    MqttErrorCode.UNSUPPORTED_PROTOCOL_LEVEL: ConnackCode.UNACCEPTABLE_PROTOCOL_VERSION,
    MqttErrorCode.IDENTIFIER_REJECTED: ConnackCode.IDENTIFIER_REJECTED,
}


_REASON_FOR_ERROR: dict[MqttErrorCode, int] = {
    MqttErrorCode.PACKET_TOO_LARGE: ReasonCode.PACKET_TOO_LARGE,
    MqttErrorCode.INVALID_PACKET_ID: ReasonCode.PROTOCOL_ERROR,
    MqttErrorCode.NO_TOPIC_FILTERS: ReasonCode.PROTOCOL_ERROR,
    MqttErrorCode.INVALID_TOPIC_NAME: ReasonCode.TOPIC_NAME_INVALID,
    MqttErrorCode.INVALID_TOPIC_FILTER: ReasonCode.TOPIC_FILTER_INVALID,
    MqttErrorCode.UNSUPPORTED_PROTOCOL_NAME: ReasonCode.UNSUPPORTED_PROTOCOL_VERSION,
    MqttErrorCode.UNSUPPORTED_PROTOCOL_LEVEL: ReasonCode.UNSUPPORTED_PROTOCOL_VERSION,
    MqttErrorCode.IDENTIFIER_REJECTED: ReasonCode.CLIENT_IDENTIFIER_NOT_VALID,
    MqttErrorCode.DUPLICATE_PROPERTY: ReasonCode.PROTOCOL_ERROR,
    MqttErrorCode.INVALID_PROPERTY: ReasonCode.PROTOCOL_ERROR,
    MqttErrorCode.PROTOCOL_ERROR: ReasonCode.PROTOCOL_ERROR,
    MqttErrorCode.TOPIC_ALIAS_INVALID: ReasonCode.TOPIC_ALIAS_INVALID,
    MqttErrorCode.RECEIVE_MAXIMUM_EXCEEDED: ReasonCode.RECEIVE_MAXIMUM_EXCEEDED,
    MqttErrorCode.PAYLOAD_FORMAT_INVALID: ReasonCode.PAYLOAD_FORMAT_INVALID,
}


class MqttProtocolError(Exception):
    """The peer sent something that is not valid MQTT; the connection must be closed.

    ``packets`` holds the packets the same :meth:`MqttParser.feed` call decoded before the bad
    one, in order, so an adapter can still act on them (e.g. a PUBLISH followed by garbage).
    """

    def __init__(self, code: MqttErrorCode, message: str, packets: tuple[Packet, ...] = ()) -> None:
        super().__init__(f"{code.value}: {message}")
        self.code = code
        self.message = message
        self.packets = packets


def _fail(code: MqttErrorCode, message: str) -> MqttProtocolError:
    return MqttProtocolError(code, message)


# --------------------------------------------------------------------------------------------
# Remaining length


def encode_remaining_length(value: int) -> bytes:
    """The 1..4 byte encoding of a remaining length in ``0..268,435,455``."""
    if not 0 <= value <= MAX_REMAINING_LENGTH:
        raise ValueError(f"remaining length {value} outside 0..{MAX_REMAINING_LENGTH}")
    # Spelled out per length (no bytearray grown byte by byte): every large PUBLISH's
    # header needs one (publish_head), beyond the table of the small ones.
    if value < 0x80:
        return bytes((value,))
    if value < 0x4000:
        return bytes((value & 0x7F | 0x80, value >> 7))
    if value < 0x200000:
        return bytes((value & 0x7F | 0x80, (value >> 7) & 0x7F | 0x80, value >> 14))
    return bytes(
        (
            value & 0x7F | 0x80,
            (value >> 7) & 0x7F | 0x80,
            (value >> 14) & 0x7F | 0x80,
            value >> 21,
        )
    )


def decode_remaining_length(data: bytes, offset: int = 0) -> tuple[int, int] | None:
    """Decode the remaining length starting at ``data[offset]``.

    Returns ``(value, number of bytes used)``, or None when ``data`` ends before the field
    does. Raises :class:`MqttProtocolError` (INVALID_REMAINING_LENGTH) when the 4th byte still
    has its continuation bit set. Non-minimal encodings (``0x80 0x00`` for 0) are accepted:
    3.1 and 3.1.1 do not forbid them.
    """
    value = 0
    shift = 0
    end = len(data)
    for index in range(MAX_REMAINING_LENGTH_BYTES):
        if offset + index >= end:
            return None
        digit = data[offset + index]
        value |= (digit & 0x7F) << shift
        if not digit & 0x80:
            return value, index + 1
        shift += 7
    raise _fail(
        MqttErrorCode.INVALID_REMAINING_LENGTH,
        "remaining length has a continuation bit on its 4th byte",
    )


# --------------------------------------------------------------------------------------------
# Encoding


_REMAINING_LENGTHS: Final = [encode_remaining_length(n) for n in range(16_384)]


def encode_publish(
    topic: bytes,
    payload: bytes,
    qos: int = 0,
    packet_id: int = 0,
    *,
    retain: bool = False,
    dup: bool = False,
) -> bytes:
    """A PUBLISH from already-valid parts (the delivery hot path: no dataclass, no checks).

    ``topic`` is the UTF-8 topic name; ``packet_id`` is ignored at QoS 0.
    """
    first = 0x30 | (qos << 1) | (8 if dup else 0) | (1 if retain else 0)
    head = len(topic).to_bytes(2, "big") + topic
    if qos:
        head += packet_id.to_bytes(2, "big")
    size = len(head) + len(payload)
    length = _REMAINING_LENGTHS[size] if size < 16_384 else encode_remaining_length(size)
    return b"".join((bytes((first,)), length, head, payload))


def topic_field(topic: str) -> bytes:
    """A PUBLISH's topic name as it goes on the wire: its length, then its UTF-8 bytes (for
    :func:`encode_publish_qos0`; a publisher repeats its topics, so callers keep these)."""
    raw = topic.encode()
    return len(raw).to_bytes(2, "big") + raw


def encode_publish_qos0(field: bytes, payload: bytes) -> bytes:
    """A QoS 0 PUBLISH (no DUP, no RETAIN) from its ``topic_field`` and payload: what
    :func:`encode_publish` makes, without encoding the topic again."""
    size = len(field) + len(payload)
    length = _REMAINING_LENGTHS[size] if size < 16_384 else encode_remaining_length(size)
    return b"".join((b"\x30", length, field, payload))


#: A payload at least this large is written after its PUBLISH header as a buffer of its own
#: (:func:`publish_head`), not copied into one packet with it.
LARGE_PAYLOAD: Final = 16 * 1024


def publish_head(
    topic: bytes,
    payload_size: int,
    qos: int = 0,
    packet_id: int = 0,
    *,
    retain: bool = False,
    dup: bool = False,
) -> bytes:
    """The bytes of a PUBLISH before its payload of ``payload_size`` bytes: what
    :func:`encode_publish` gives, less the payload (a large one is sent as it is)."""
    first = 0x30 | (qos << 1) | (8 if dup else 0) | (1 if retain else 0)
    size = len(topic)
    if qos:
        length = size + 4 + payload_size
        if 0x4000 <= length < 0x200000:
            # Every large QoS 1/2 delivery (16 KiB to 2 MiB: a 3-byte remaining length): the
            # first byte, the length and the topic's length as one int's six bytes (native
            # arithmetic in the compiled build), then the topic and the packet id.
            fixed = (
                first << 40
                | (length & 0x7F | 0x80) << 32
                | ((length >> 7) & 0x7F | 0x80) << 24
                | (length >> 14) << 16
                | size
            )
            return fixed.to_bytes(6, "big") + topic + packet_id.to_bytes(2, "big")
    head = size.to_bytes(2, "big") + topic
    if qos:
        head += packet_id.to_bytes(2, "big")
    return bytes((first,)) + encode_remaining_length(len(head) + payload_size) + head


def _check_packet_id(packet_id: int) -> bytes:
    if not 1 <= packet_id <= MAX_PACKET_ID:
        raise ValueError(f"packet id {packet_id} outside 1..{MAX_PACKET_ID}")
    return _U16.pack(packet_id)


def _check_qos(qos: int, what: str) -> int:
    if qos not in _VALID_QOS:
        raise ValueError(f"{what} {qos} is not 0, 1 or 2")
    return qos


def _binary(data: bytes) -> bytes:
    if len(data) > MAX_STRING_BYTES:
        raise ValueError(f"field of {len(data)} bytes exceeds {MAX_STRING_BYTES}")
    return _U16.pack(len(data)) + data


def _string(text: str) -> bytes:
    if "\x00" in text:
        raise ValueError("MQTT strings must not contain U+0000")
    return _binary(text.encode("utf-8"))


def _topic_name(topic: str) -> bytes:
    error = topic_name_error(topic)
    if error is not None:
        raise ValueError(error)
    return _string(topic)


def _topic_filter(topic_filter: str) -> bytes:
    error = topic_filter_error(topic_filter)
    if error is not None:
        raise ValueError(error)
    return _string(topic_filter)


def _encode_connect(p: Connect) -> tuple[int, bytes]:
    flags = 0
    if p.clean_session:
        flags |= _CF_CLEAN_SESSION
    if not 0 <= p.keep_alive <= 0xFFFF:
        raise ValueError(f"keep alive {p.keep_alive} outside 0..65535")
    if not 0 <= p.protocol_level <= 0xFF:
        raise ValueError(f"protocol level {p.protocol_level} outside 0..255")
    payload = [_string(p.client_id)]
    if p.will_topic is not None:
        flags |= _CF_WILL | (_check_qos(p.will_qos, "will QoS") << _CF_WILL_QOS_SHIFT)
        if p.will_retain:
            flags |= _CF_WILL_RETAIN
        payload.append(_topic_name(p.will_topic))
        payload.append(_binary(p.will_payload))
    elif p.will_qos or p.will_retain or p.will_payload:
        raise ValueError("will QoS, retain or payload given without a will topic")
    if p.username is not None:
        flags |= _CF_USERNAME
        payload.append(_string(p.username))
    if p.password is not None:
        if p.username is None:
            raise ValueError("a password requires a username")
        flags |= _CF_PASSWORD
        payload.append(_binary(p.password))
    header = _string(p.protocol_name) + bytes((p.protocol_level, flags)) + _U16.pack(p.keep_alive)
    return 0, header + b"".join(payload)


def _encode_connack(p: Connack) -> tuple[int, bytes]:
    if p.return_code not in _CONNACK_CODES:
        raise ValueError(f"CONNACK return code {p.return_code} is reserved")
    if p.session_present and p.return_code != ConnackCode.ACCEPTED:
        raise ValueError("session present requires return code 0")
    return 0, bytes((int(p.session_present), p.return_code))


def _encode_publish(p: Publish) -> tuple[int, bytes]:
    qos = _check_qos(p.qos, "QoS")
    flags = qos << _PF_QOS_SHIFT
    if p.retain:
        flags |= _PF_RETAIN
    if p.dup:
        if qos == 0:
            raise ValueError("DUP must be 0 on a QoS 0 PUBLISH")
        flags |= _PF_DUP
    body = _topic_name(p.topic)
    if qos:
        if p.packet_id is None:
            raise ValueError("a QoS 1/2 PUBLISH needs a packet id")
        body += _check_packet_id(p.packet_id)
    elif p.packet_id is not None:
        raise ValueError("a QoS 0 PUBLISH has no packet id")
    return flags, body + p.payload


def _encode_packet_id_only(p: Puback | Pubrec | Pubcomp | Unsuback) -> tuple[int, bytes]:
    return 0, _check_packet_id(p.packet_id)


def _encode_pubrel(p: Pubrel) -> tuple[int, bytes]:
    return 0b0010, _check_packet_id(p.packet_id)


def _encode_subscribe(p: Subscribe) -> tuple[int, bytes]:
    if not p.subscriptions:
        raise ValueError("SUBSCRIBE needs at least one topic filter")
    parts = [_check_packet_id(p.packet_id)]
    for topic_filter, qos in p.subscriptions:
        parts.append(_topic_filter(topic_filter))
        parts.append(bytes((_check_qos(qos, "requested QoS"),)))
    return 0b0010, b"".join(parts)


def _encode_suback(p: Suback) -> tuple[int, bytes]:
    if not p.return_codes:
        raise ValueError("SUBACK needs at least one return code")
    for code in p.return_codes:
        if code not in _VALID_SUBACK_CODES:
            raise ValueError(f"SUBACK return code {code} is not 0, 1, 2 or 0x80")
    return 0, _check_packet_id(p.packet_id) + bytes(p.return_codes)


def _encode_unsubscribe(p: Unsubscribe) -> tuple[int, bytes]:
    if not p.topic_filters:
        raise ValueError("UNSUBSCRIBE needs at least one topic filter")
    parts = [_check_packet_id(p.packet_id)]
    parts.extend(_topic_filter(topic_filter) for topic_filter in p.topic_filters)
    return 0b0010, b"".join(parts)


def _encode_empty(p: Pingreq | Pingresp | Disconnect) -> tuple[int, bytes]:
    return 0, b""


_ENCODERS: Final[dict[type[Packet], Callable[[Any], tuple[int, bytes]]]] = {
    Connect: _encode_connect,
    Connack: _encode_connack,
    Publish: _encode_publish,
    Puback: _encode_packet_id_only,
    Pubrec: _encode_packet_id_only,
    Pubrel: _encode_pubrel,
    Pubcomp: _encode_packet_id_only,
    Subscribe: _encode_subscribe,
    Suback: _encode_suback,
    Unsubscribe: _encode_unsubscribe,
    Unsuback: _encode_packet_id_only,
    Pingreq: _encode_empty,
    Pingresp: _encode_empty,
    Disconnect: _encode_empty,
}


def encode(packet: Packet) -> bytes:
    """The wire bytes of ``packet``; ``ValueError`` if it is not a valid packet."""
    encoder = _ENCODERS.get(type(packet))
    if encoder is None:
        raise TypeError(f"not an MQTT packet: {packet!r}")
    flags, body = encoder(packet)
    first = (PACKET_TYPES[type(packet)] << 4) | flags
    return bytes((first,)) + encode_remaining_length(len(body)) + body


# --------------------------------------------------------------------------------------------
# Decoding


class _Reader:
    """A cursor over one packet body; running past the end is MALFORMED."""

    __slots__ = ("_data", "_pos", "_what")

    def __init__(self, data: bytes, what: str) -> None:
        self._data = data
        self._pos = 0
        self._what = what

    def _take(self, size: int, field: str) -> bytes:
        end = self._pos + size
        if end > len(self._data):
            raise _fail(MqttErrorCode.MALFORMED, f"{self._what} truncated in {field}")
        chunk = self._data[self._pos : end]
        self._pos = end
        return chunk

    def u8(self, field: str) -> int:
        return self._take(1, field)[0]

    def u16(self, field: str) -> int:
        value: int = _U16.unpack(self._take(2, field))[0]
        return value

    def packet_id(self) -> int:
        packet_id = self.u16("packet id")
        if packet_id == 0:
            raise _fail(MqttErrorCode.INVALID_PACKET_ID, f"{self._what} has packet id 0")
        return packet_id

    def binary(self, field: str) -> bytes:
        return self._take(self.u16(field), field)

    def string(self, field: str) -> str:
        raw = self.binary(field)
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise _fail(
                MqttErrorCode.INVALID_UTF8, f"{self._what} {field} is not valid UTF-8"
            ) from exc
        if "\x00" in text:
            raise _fail(MqttErrorCode.INVALID_UTF8, f"{self._what} {field} contains U+0000")
        return text

    def topic_name(self, field: str) -> str:
        topic = self.string(field)
        error = topic_name_error(topic)
        if error is not None:
            raise _fail(MqttErrorCode.INVALID_TOPIC_NAME, f"{self._what} {field}: {error}")
        return topic

    def topic_filter(self) -> str:
        topic_filter = self.string("topic filter")
        error = topic_filter_error(topic_filter)
        if error is not None:
            raise _fail(MqttErrorCode.INVALID_TOPIC_FILTER, f"{self._what}: {error}")
        return topic_filter

    def at_end(self) -> bool:
        return self._pos >= len(self._data)

    def rest(self) -> bytes:
        chunk = self._data[self._pos :]
        self._pos = len(self._data)
        return chunk

    def end(self) -> None:
        if not self.at_end():
            raise _fail(
                MqttErrorCode.MALFORMED,
                f"{self._what} has {len(self._data) - self._pos} unexpected trailing bytes",
            )


def _decode_connect(flags: int, body: bytes) -> Connect:
    r = _Reader(body, "CONNECT")
    name = r.string("protocol name")
    expected_level = SUPPORTED_PROTOCOLS.get(name)
    if expected_level is None:
        raise _fail(MqttErrorCode.UNSUPPORTED_PROTOCOL_NAME, f"unknown protocol name {name!r}")
    level = r.u8("protocol level")
    if level != expected_level:
        raise _fail(
            MqttErrorCode.UNSUPPORTED_PROTOCOL_LEVEL,
            f"protocol {name!r} level {level} (supported: {expected_level})",
        )
    connect_flags = r.u8("connect flags")
    if connect_flags & _CF_RESERVED:
        raise _fail(MqttErrorCode.INVALID_CONNECT_FLAGS, "reserved CONNECT flag bit 0 is set")
    has_will = bool(connect_flags & _CF_WILL)
    will_qos = (connect_flags & _CF_WILL_QOS_MASK) >> _CF_WILL_QOS_SHIFT
    will_retain = bool(connect_flags & _CF_WILL_RETAIN)
    if not has_will and (will_qos or will_retain):
        raise _fail(
            MqttErrorCode.INVALID_CONNECT_FLAGS, "will QoS or will retain set without a will"
        )
    if will_qos not in _VALID_QOS:
        raise _fail(MqttErrorCode.INVALID_QOS, "will QoS 3")
    has_username = bool(connect_flags & _CF_USERNAME)
    has_password = bool(connect_flags & _CF_PASSWORD)
    if has_password and not has_username:
        raise _fail(MqttErrorCode.INVALID_CONNECT_FLAGS, "password flag set without username")
    clean_session = bool(connect_flags & _CF_CLEAN_SESSION)
    keep_alive = r.u16("keep alive")
    client_id = r.string("client identifier")
    will_topic = r.topic_name("will topic") if has_will else None
    will_payload = r.binary("will message") if has_will else b""
    username = r.string("user name") if has_username else None
    password = r.binary("password") if has_password else None
    r.end()
    # Identifier policy last, so that a malformed CONNECT is reported as malformed.
    if level == PROTOCOL_LEVEL_V31:
        if not 1 <= len(client_id) <= MAX_CLIENT_ID_LENGTH_V31:
            raise _fail(
                MqttErrorCode.IDENTIFIER_REJECTED,
                f"MQTT 3.1 client identifier must be 1..23 characters, got {len(client_id)}",
            )
    elif not client_id and not clean_session:
        raise _fail(
            MqttErrorCode.IDENTIFIER_REJECTED,
            "an empty client identifier requires clean session",
        )
    return Connect(
        client_id=client_id,
        clean_session=clean_session,
        keep_alive=keep_alive,
        protocol_name=name,
        protocol_level=level,
        will_topic=will_topic,
        will_payload=will_payload,
        will_qos=will_qos,
        will_retain=will_retain,
        username=username,
        password=password,
    )


def _decode_connack(flags: int, body: bytes) -> Connack:
    ack_flags, return_code = body  # length checked against _FIXED_LENGTHS
    if ack_flags & 0xFE:
        raise _fail(MqttErrorCode.MALFORMED, "CONNACK reserved acknowledge flag bits are set")
    if return_code not in _CONNACK_CODES:
        raise _fail(MqttErrorCode.MALFORMED, f"CONNACK return code {return_code} is reserved")
    session_present = bool(ack_flags & 0x01)
    if session_present and return_code != ConnackCode.ACCEPTED:
        raise _fail(MqttErrorCode.MALFORMED, "CONNACK session present with a refusal")
    return Connack(return_code=return_code, session_present=session_present)


#: Topic names already decoded and validated (publishers reuse a few topics): bytes -> str.
_TOPICS: Final[dict[bytes, str]] = {}
_TOPICS_MAX: Final = 4096


def _decode_publish(flags: int, body: bytes) -> Publish:
    """A PUBLISH from its body alone (the decoder table's, a held packet's head)."""
    return _decode_publish_at(flags, body, 0, len(body))


def _decode_publish_at(flags: int, buf: bytes, start: int, stop: int) -> Publish:
    """The PUBLISH whose body is ``buf[start:stop]`` (the read it came in), decoded in
    place: its payload is the one copy made (no slice of the body first, no view; in the
    compiled build every index of ``buf`` is native)."""
    # QoS 3 and DUP on QoS 0 were refused with the first byte (_check_first_byte).
    qos = (flags & _PF_QOS_MASK) >> _PF_QOS_SHIFT
    if stop - start < 2:
        raise _fail(MqttErrorCode.MALFORMED, "PUBLISH truncated in topic name")
    end = start + 2 + ((buf[start] << 8) | buf[start + 1])
    # Checked before the cache: a cut topic's bytes may equal a shorter cached topic.
    if end > stop:
        raise _fail(MqttErrorCode.MALFORMED, "PUBLISH truncated in topic name")
    raw = buf[start + 2 : end]
    topic = _TOPICS.get(raw)
    if topic is None:
        topic = _Reader(buf[start:end], "PUBLISH").topic_name("topic name")
        if len(_TOPICS) >= _TOPICS_MAX:
            _TOPICS.clear()
        _TOPICS[raw] = topic
    if qos:
        if end + 2 > stop:
            raise _fail(MqttErrorCode.MALFORMED, "PUBLISH truncated in packet id")
        packet_id = (buf[end] << 8) | buf[end + 1]
        if packet_id == 0:
            raise _fail(MqttErrorCode.INVALID_PACKET_ID, "PUBLISH has packet id 0")
        return Publish(
            topic,
            buf[end + 2 : stop],
            qos,
            bool(flags & _PF_RETAIN),
            bool(flags & _PF_DUP),
            packet_id,
        )
    return Publish(topic, buf[end:stop], 0, bool(flags & _PF_RETAIN), False, None)


def _packet_id_decoder(
    cls: type[Puback | Pubrec | Pubrel | Pubcomp | Unsuback],
) -> Callable[[int, bytes], Packet]:
    name = PACKET_TYPES[cls].name

    def decode(flags: int, body: bytes) -> Packet:
        # The length (2) was checked against _FIXED_LENGTHS.
        packet_id = (body[0] << 8) | body[1]
        if packet_id == 0:
            raise _fail(MqttErrorCode.INVALID_PACKET_ID, f"{name} has packet id 0")
        return cls(packet_id)

    return decode


def _decode_subscribe(flags: int, body: bytes) -> Subscribe:
    r = _Reader(body, "SUBSCRIBE")
    packet_id = r.packet_id()
    subscriptions: list[tuple[str, int]] = []
    while not r.at_end():
        topic_filter = r.topic_filter()
        options = r.u8("requested QoS")
        if options & 0xFC:
            raise _fail(MqttErrorCode.MALFORMED, "SUBSCRIBE reserved bits of requested QoS set")
        if options not in _VALID_QOS:
            raise _fail(MqttErrorCode.INVALID_QOS, "SUBSCRIBE requested QoS 3")
        subscriptions.append((topic_filter, options))
    if not subscriptions:
        raise _fail(MqttErrorCode.NO_TOPIC_FILTERS, "SUBSCRIBE without topic filters")
    return Subscribe(packet_id=packet_id, subscriptions=tuple(subscriptions))


def _decode_suback(flags: int, body: bytes) -> Suback:
    r = _Reader(body, "SUBACK")
    packet_id = r.packet_id()
    codes = tuple(r.rest())
    if not codes:
        raise _fail(MqttErrorCode.MALFORMED, "SUBACK without return codes")
    for code in codes:
        if code not in _VALID_SUBACK_CODES:
            raise _fail(MqttErrorCode.MALFORMED, f"SUBACK return code {code:#04x} is reserved")
    return Suback(packet_id=packet_id, return_codes=codes)


def _decode_unsubscribe(flags: int, body: bytes) -> Unsubscribe:
    r = _Reader(body, "UNSUBSCRIBE")
    packet_id = r.packet_id()
    topic_filters: list[str] = []
    while not r.at_end():
        topic_filters.append(r.topic_filter())
    if not topic_filters:
        raise _fail(MqttErrorCode.NO_TOPIC_FILTERS, "UNSUBSCRIBE without topic filters")
    return Unsubscribe(packet_id=packet_id, topic_filters=tuple(topic_filters))


def _constant(packet: Packet) -> Callable[[int, bytes], Packet]:
    def decode(flags: int, body: bytes) -> Packet:
        return packet

    return decode


_DECODERS: Final[dict[int, Callable[[int, bytes], Packet]]] = {
    PacketType.CONNECT: _decode_connect,
    PacketType.CONNACK: _decode_connack,
    PacketType.PUBLISH: _decode_publish,
    PacketType.PUBACK: _packet_id_decoder(Puback),
    PacketType.PUBREC: _packet_id_decoder(Pubrec),
    PacketType.PUBREL: _packet_id_decoder(Pubrel),
    PacketType.PUBCOMP: _packet_id_decoder(Pubcomp),
    PacketType.SUBSCRIBE: _decode_subscribe,
    PacketType.SUBACK: _decode_suback,
    PacketType.UNSUBSCRIBE: _decode_unsubscribe,
    PacketType.UNSUBACK: _packet_id_decoder(Unsuback),
    PacketType.PINGREQ: _constant(Pingreq()),
    PacketType.PINGRESP: _constant(Pingresp()),
    PacketType.DISCONNECT: _constant(Disconnect()),
}

#: Fixed-header flags of every packet type except PUBLISH, whose flags carry DUP/QoS/RETAIN.
_FIXED_FLAGS: Final[dict[int, int]] = {
    PacketType.CONNECT: 0,
    PacketType.CONNACK: 0,
    PacketType.PUBACK: 0,
    PacketType.PUBREC: 0,
    PacketType.PUBREL: 0b0010,
    PacketType.PUBCOMP: 0,
    PacketType.SUBSCRIBE: 0b0010,
    PacketType.SUBACK: 0,
    PacketType.UNSUBSCRIBE: 0b0010,
    PacketType.UNSUBACK: 0,
    PacketType.PINGREQ: 0,
    PacketType.PINGRESP: 0,
    PacketType.DISCONNECT: 0,
}

#: Remaining length of the packet types whose size is fixed, checked before the body arrives.
_FIXED_LENGTHS: Final[dict[int, int]] = {
    PacketType.CONNACK: 2,
    PacketType.PUBACK: 2,
    PacketType.PUBREC: 2,
    PacketType.PUBREL: 2,
    PacketType.PUBCOMP: 2,
    PacketType.UNSUBACK: 2,
    PacketType.PINGREQ: 0,
    PacketType.PINGRESP: 0,
    PacketType.DISCONNECT: 0,
}


def first_byte_check(fixed_flags: Mapping[int, int]) -> Callable[[int], None]:
    """The check of a fixed header's first byte for one protocol version (3.1.1 here, 5.0 in
    codec5): ``fixed_flags`` holds every packet type but PUBLISH with the flags it must
    carry; any other type than those and PUBLISH is reserved, and a PUBLISH may not have
    QoS 3 or DUP set at QoS 0."""

    def check(first: int) -> None:
        packet_type = first >> 4
        flags = first & 0x0F
        expected = fixed_flags.get(packet_type)
        if expected is not None:
            if flags != expected:
                raise _fail(
                    MqttErrorCode.INVALID_FLAGS,
                    f"{_type_name(packet_type)} flags {flags:#06b}, must be {expected:#06b}",
                )
            return
        if packet_type != PacketType.PUBLISH:
            raise _fail(MqttErrorCode.RESERVED_PACKET_TYPE, f"reserved packet type {packet_type}")
        qos = (flags & _PF_QOS_MASK) >> _PF_QOS_SHIFT
        if qos not in _VALID_QOS:
            raise _fail(MqttErrorCode.INVALID_QOS, "PUBLISH with QoS 3")
        if qos == 0 and flags & _PF_DUP:
            raise _fail(MqttErrorCode.INVALID_FLAGS, "PUBLISH with DUP set on QoS 0")

    return check


def _type_name(packet_type: int) -> str:
    try:
        return PacketType(packet_type).name
    except ValueError:
        return "AUTH" if packet_type == 15 else str(packet_type)


_check_first_byte = first_byte_check(_FIXED_FLAGS)


class _Payloaded(Protocol):
    payload: bytes


_P = TypeVar("_P", bound=_Payloaded)


def _publish_head(
    parts: list[Buffer], decode: Callable[[int, bytes], _P], *, properties: bool, total: int
) -> tuple[_P, int] | None:
    """A large PUBLISH's fixed and variable header decoded from a small copy of the start
    of ``parts`` (``total`` bytes of it held): the packet (its payload empty) and where its
    payload starts; None when the variable header runs past what is held."""
    # (prefix slices the head from the first part, the read's tail, when it is all there)
    head = prefix(parts, 7)
    decoded = decode_remaining_length(head, 1)
    if decoded is None:
        return None
    header = 1 + decoded[1]
    if len(head) < header + 2:
        return None
    end = header + 2 + ((head[header] << 8) | head[header + 1]) + (2 if head[0] & 0x06 else 0)
    if properties:
        head = prefix(parts, end + 4)
        try:
            block = decode_remaining_length(head, end)
        except MqttProtocolError:
            return None  # (the usual path refuses it in MQTT 5's words)
        if block is None:
            return None
        end += block[1] + block[0]
    if end > total:
        return None
    head = prefix(parts, end)
    return decode(head[0] & 0x0F, head[header:end]), end


def publish_from_parts(
    parts: list[Buffer],
    decode: Callable[[int, bytes], _P],
    *,
    properties: bool,
    defer_from: int = 0,
) -> tuple[_P, Unjoined | None] | None:
    """A large PUBLISH held over reads (``parts``: exactly its bytes, its first byte and
    length checked), decoded without joining them: the variable header from a small copy of
    its start, the payload joined straight from the reads (its one copy), or, from
    ``defer_from`` bytes, left to join (the payload empty, an :class:`Unjoined` beside it).
    ``properties``: MQTT 5 (a property block follows the packet id). None when the
    variable header runs past the packet: the caller decodes the joined bytes, which names
    the fault."""
    total = sum(map(len, parts))
    decoded = _publish_head(parts, decode, properties=properties, total=total)
    if decoded is None:
        return None
    packet, end = decoded
    if defer_from and total - end >= defer_from:
        return packet, Unjoined(packet, parts, end, total)
    packet.payload = join_range(parts, end, total)
    return packet, None


def start_fill(
    held: HeldInput, decode: Callable[[int, bytes], _P], *, properties: bool, fill_from: int
) -> None:
    """A PUBLISH held over reads with ``fill_from`` bytes or more still to come: once its
    variable header is in, decode it and copy what is held of the payload into the
    payload's own ``bytes`` (``payload_fill``); the rest goes straight in (the transport
    reads into it, ``Link.read_into``, or ``feed`` copies it in): no join. Left as it is
    (joined when complete, as before) while the header is cut, or when it is malformed
    (the usual path names the fault)."""
    if (
        not fill_from
        or held.filling is not None
        or held.need - held.size < fill_from
        or held.first_byte() >> 4 != 3
    ):
        return
    parts, size = held.parts, held.size
    try:
        decoded = _publish_head(parts, decode, properties=properties, total=size)
    except MqttProtocolError:
        return
    if decoded is None:
        return
    packet, end = decoded
    fill = payload_fill(held.need - end)
    at = 0
    for part in parts:
        stop = at + len(part)
        if stop > end:
            fill.write(part if at >= end else memoryview(part)[end - at :])
        at = stop
    held.clear()
    held.filling = Filling(fill, packet)


def go_on_filling(
    held: HeldInput, data: bytes | bytearray | memoryview, decode: Callable[[int, bytes], _P]
) -> tuple[_P, int] | None:
    """``data`` (what came after the reads straight into it, if any) into the payload being
    filled: the packet, whole, and how much of ``data`` went into it; None while more is
    needed. (``decode``: the parser's, which made the packet.)"""
    filling = held.filling
    assert filling is not None
    fill = filling.fill
    used = fill.write(data) if data else 0
    if not fill.full:
        return None
    held.filling = None
    packet = cast(_P, filling.packet)  # (start_fill's: the parser's own packet type)
    packet.payload = fill.take()
    return packet, used


def held_packet(
    held: HeldInput, decode: Callable[[int, bytes], _P], *, properties: bool, defer_from: int = 0
) -> tuple[_P | None, bytes, int, Unjoined | None]:
    """A packet held over reads, now complete: a large PUBLISH is decoded straight from the
    reads (its payload copied once, or from ``defer_from`` bytes left unjoined: the fourth
    item) and comes back with the last read and where the bytes after it start there (not
    copied); anything else (or a malformed PUBLISH, whose fault the usual path names) comes
    back as bytes to parse from 0, joined once. ``properties``: MQTT 5."""
    if held.need >= _VIEW_BODY and held.first_byte() >> 4 == 3:
        parts, last, start = held.cut()
        decoded = publish_from_parts(parts, decode, properties=properties, defer_from=defer_from)
        if decoded is None:
            return None, b"".join([*parts, memoryview(last)[start:]]), 0, None
        return decoded[0], last, start, decoded[1]
    return None, held.take(), 0, None


def held_bytes(held: HeldInput | None) -> int:
    """Bytes of an incomplete packet a parser holds (a payload being filled included)."""
    if held is None:
        return 0
    filling = held.filling
    return held.size if filling is None else filling.fill.filled


def filling_of(held: HeldInput | None) -> Fill | None:
    filling = held.filling if held is not None else None
    return filling.fill if filling is not None else None


def open_feed(
    error: MqttProtocolError | None,
    held: HeldInput | None,
    data: bytes | bytearray | memoryview,
    decode: Callable[[int, bytes], _P],
    *,
    properties: bool,
    defer_from: int,
    fill_from: int = 0,
) -> tuple[_P | None, bytes, int, Unjoined | None] | None:
    """The opening of an MQTT parser's ``feed`` (3.1.1 and 5 alike): refuse a spent parser;
    with a packet held over reads, add ``data`` to it (None: still not complete) and give
    what :func:`held_packet` gives (a payload being filled: what :func:`go_on_filling`
    gives, the rest of ``data`` to parse after it); else ``data`` as bytes to parse from 0.
    ``fill_from``: :func:`start_fill`'s."""
    if error is not None:
        raise MqttProtocolError(error.code, f"parser already failed: {error.message}")
    if held is not None:
        if held.filling is not None:
            filled = go_on_filling(held, data, decode)
            if filled is None:
                return None
            return filled[0], bytes(data), filled[1], None
        if held.size:
            if not held.add_part(data):
                start_fill(held, decode, properties=properties, fill_from=fill_from)
                return None
            return held_packet(held, decode, properties=properties, defer_from=defer_from)
    return None, bytes(data), 0, None  # (no copy when data is bytes already)


class MqttParser:
    """Incremental MQTT decoder: feed it bytes as they arrive, get whole packets back.

    ``max_packet_size`` bounds a whole packet (fixed header included), like MQTT 5's Maximum
    Packet Size; a packet announcing more is refused as soon as its length field is complete,
    so at most ``max_packet_size`` bytes of one packet are ever buffered. After an error the
    parser is spent: every later :meth:`feed` raises again.
    """

    __slots__ = ("_error", "_held", "defer_from", "fill_from", "max_packet_size", "unjoined")

    def __init__(self, max_packet_size: int = MAX_PACKET_SIZE) -> None:
        #: a PUBLISH with this many bytes or more still to come once its header is in (0:
        #: none) has its payload filled in place (:func:`start_fill`; ``filling`` is then the
        #: buffer a caller may read the rest straight into, then ``feed(b"")``)
        self.fill_from = 0
        #: a PUBLISH payload of this many bytes or more (0: none) that came over many reads is
        #: left unjoined: the PUBLISH comes first in what ``feed`` returns, with an empty
        #: payload, and ``unjoined`` says where its payload lies (the caller joins it)
        self.defer_from = 0
        self.unjoined: Unjoined | None = None
        if max_packet_size < 2:
            raise ValueError("max_packet_size must be at least 2 (the smallest packet)")
        self.max_packet_size = max_packet_size
        # made when a read first ends inside a packet (an idle connection never has one)
        self._held: HeldInput | None = None
        self._error: MqttProtocolError | None = None

    @property
    def buffered(self) -> int:
        """Bytes received but not yet part of a returned packet."""
        return held_bytes(self._held)

    @property
    def filling(self) -> Fill | None:
        """The payload being filled in place, if any (:func:`start_fill`)."""
        return filling_of(self._held)

    def feed(self, data: bytes | bytearray | memoryview) -> list[Packet]:
        """Append ``data``; return every packet now complete, in order (possibly none)."""
        held = self._held
        try:
            opened = open_feed(
                self._error,
                held,
                data,
                _decode_publish,
                properties=False,
                defer_from=self.defer_from,
                fill_from=self.fill_from,
            )
        except MqttProtocolError as exc:
            if self._error is None:
                self._error = exc
            raise
        if opened is None:
            return []
        publish, buf, pos, self.unjoined = opened
        packets: list[Packet] = [] if publish is None else [publish]
        size = len(buf)
        append = packets.append
        max_size = self.max_packet_size
        need = 0
        try:
            while pos < size:
                first = buf[pos]
                packet_type = first >> 4
                # PUBLISH (the hot path) checks its own flags: QoS 3, or DUP at QoS 0; a
                # PUBACK's (the other packet of every QoS 1 message) are right when it is 0x40.
                if first != 0x40 and (
                    packet_type != 3 or (first & 0x06) == 0x06 or (first & 0x0E) == 0x08
                ):
                    _check_first_byte(first)
                if pos + 1 < size and buf[pos + 1] < 0x80:
                    length = buf[pos + 1]
                    header = 2
                else:
                    decoded = decode_remaining_length(buf, pos + 1)
                    if decoded is None:
                        need = size - pos + 1
                        break
                    length, length_size = decoded
                    header = 1 + length_size
                if packet_type != 3:
                    expected_length = _FIXED_LENGTHS.get(packet_type)
                    if expected_length is not None and length != expected_length:
                        raise _fail(
                            MqttErrorCode.MALFORMED,
                            f"{PacketType(packet_type).name} remaining length {length}, "
                            f"must be {expected_length}",
                        )
                total = header + length
                if total > max_size:
                    raise _fail(
                        MqttErrorCode.PACKET_TOO_LARGE,
                        f"packet of {total} bytes exceeds the limit of {max_size}",
                    )
                if size - pos < total:
                    need = total
                    break
                if packet_type == 3:
                    # Decoded in place: only its payload is copied out (a bytes slice of the
                    # body would copy it twice), and no generic call through the table.
                    append(_decode_publish_at(first & 0x0F, buf, pos + header, pos + total))
                elif first == 0x40:
                    # PUBACK inline (its length, 2, was checked): the decoder table's generic
                    # call and body slice cost more than the packet itself.
                    packet_id = (buf[pos + header] << 8) | buf[pos + header + 1]
                    if packet_id == 0:
                        raise _fail(MqttErrorCode.INVALID_PACKET_ID, "PUBACK has packet id 0")
                    append(Puback(packet_id))
                else:
                    append(_DECODERS[packet_type](first & 0x0F, buf[pos + header : pos + total]))
                pos += total
        except MqttProtocolError as exc:
            exc.packets = tuple(packets)
            self._error = exc
            if held is not None:
                held.clear()
            raise
        if pos < size:
            if held is None:
                held = self._held = HeldInput()
            held.hold(buf, pos, need)
            if self.fill_from:
                start_fill(held, _decode_publish, properties=False, fill_from=self.fill_from)
        return packets
