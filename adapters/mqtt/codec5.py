"""Sans-IO codec of MQTT 5.0 (OASIS MQTT Version 5.0): v5 packets <-> bytes.

``encode5(packet) -> bytes`` serialises any packet of :mod:`adapters.mqtt.packets5`;
:class:`Mqtt5Parser` is the incremental decoder (``feed(data)`` -> completed packets). The
fixed header and remaining length are those of 3.1.1 (:mod:`adapters.mqtt.codec`); what v5
adds is a property block on every packet but PINGREQ/PINGRESP, reason codes on the
acknowledgements, DISCONNECT and AUTH, and the packet type 15 (AUTH).

Properties (section 2.2.2) are checked against the table ``packets5.PROPERTIES``: an unknown
identifier or one that packet may not carry is a malformed packet (0x81); the same property
twice (except User Property and Subscription Identifier), or a value outside what it may take
(a Payload Format Indicator of 2, a Receive Maximum of 0, ...) is a protocol error (0x82).
Errors raise the one :class:`MqttProtocolError` with an :class:`MqttErrorCode` whose
``reason_code`` is what the server's CONNACK or DISCONNECT says.

Left to the session: topic aliases (a PUBLISH with an empty topic must name an alias; the
alias range is negotiated), Receive Maximum, shared subscription syntax, authentication.
"""

from __future__ import annotations

from collections.abc import Callable
from struct import Struct
from typing import Any, Final

from vibemq_server.adapters.mqtt.codec import (
    MAX_PACKET_ID,
    MAX_PACKET_SIZE,
    MAX_STRING_BYTES,
    MqttErrorCode,
    MqttProtocolError,
    _Reader,
    decode_remaining_length,
    encode_remaining_length,
    filling_of,
    first_byte_check,
    held_bytes,
    open_feed,
    start_fill,
)
from vibemq_server.adapters.mqtt.packets import PacketType, Pingreq, Pingresp
from vibemq_server.adapters.mqtt.packets5 import (
    AUTH,
    NO_PROPERTIES,
    PACKET_TYPES5,
    PROPERTIES,
    PROTOCOL_LEVEL_V5,
    VALID_REASONS,
    WILL,
    Ack5,
    Auth5,
    Connack5,
    Connect5,
    Disconnect5,
    Packet5,
    Properties,
    PropType,
    Puback5,
    Pubcomp5,
    Publish5,
    Pubrec5,
    Pubrel5,
    ReasonCode,
    RetainHandling,
    Suback5,
    SubOptions,
    Subscribe5,
    Unsuback5,
    Unsubscribe5,
)
from vibemq_server.adapters.mqtt.topics import topic_filter_error, topic_name_error
from vibemq_server.protocol.bigcopy import Fill, Unjoined
from vibemq_server.protocol.held import HeldInput

E = MqttErrorCode
MAX_VARINT = 268_435_455
_U16 = Struct(">H")
_U32 = Struct(">I")
_VALID_QOS = frozenset((0, 1, 2))
_EMPTY: Final = NO_PROPERTIES  # (shared: treated as immutable)


def _fail(code: MqttErrorCode, message: str) -> MqttProtocolError:
    return MqttProtocolError(code, message)


# --------------------------------------------------------------------------------------------
# Properties


def _varint(value: int) -> bytes:
    return encode_remaining_length(value)


def _string(text: str) -> bytes:
    raw = text.encode("utf-8")
    if "\x00" in text or len(raw) > MAX_STRING_BYTES:
        raise ValueError(f"not an MQTT string: {text[:40]!r}")
    return _U16.pack(len(raw)) + raw


def _binary(data: bytes) -> bytes:
    if len(data) > MAX_STRING_BYTES:
        raise ValueError(f"binary field of {len(data)} bytes exceeds {MAX_STRING_BYTES}")
    return _U16.pack(len(data)) + data


def _encode_value(kind: PropType, value: Any) -> bytes:
    if kind is PropType.BYTE:
        return bytes((value,))
    if kind is PropType.U16:
        return _U16.pack(value)
    if kind is PropType.U32:
        return _U32.pack(value)
    if kind is PropType.VARINT:
        return _varint(value)
    if kind is PropType.UTF8:
        return _string(value)
    if kind is PropType.BINARY:
        return _binary(value)
    key, val = value
    return _string(key) + _string(val)


def property_entries(props: Properties, packet_type: int) -> bytes:
    """The properties of ``props`` as the bytes of a property block without its length;
    ValueError for a property that packet may not carry or a value it may not take."""
    parts: list[bytes] = []
    for ident, spec in PROPERTIES.items():
        value = getattr(props, spec.name)
        if value is None or value == ():
            continue
        if packet_type not in spec.packets:
            raise ValueError(f"property {spec.name} not allowed in packet type {packet_type}")
        for item in value if spec.repeatable else (value,):
            if spec.allowed is not None and item not in spec.allowed:
                raise ValueError(f"property {spec.name} = {item!r} is not allowed")
            if spec.nonzero and item == 0:
                raise ValueError(f"property {spec.name} must not be 0")
            parts.append(bytes((ident,)) + _encode_value(spec.kind, item))
    return b"".join(parts)


def property_block(entries: bytes) -> bytes:
    """A property block of already encoded entries: their length, then them."""
    return _varint(len(entries)) + entries if entries else b"\x00"


def encode_properties(props: Properties, packet_type: int) -> bytes:
    """The property block (its varint length first) of ``props`` for ``packet_type``."""
    if props is _EMPTY or not props:
        return b"\x00"
    body = property_entries(props, packet_type)
    return _varint(len(body)) + body


class _Reader5(_Reader):
    """The 3.1.1 reader plus the v5 field types."""

    __slots__ = ()

    def varint(self, field: str) -> int:
        value = 0
        for shift in (0, 7, 14, 21):
            digit = self.u8(field)
            value |= (digit & 0x7F) << shift
            if not digit & 0x80:
                return value
        raise _fail(E.MALFORMED, f"{self._what} {field}: variable byte integer over 4 bytes")

    def u32(self, field: str) -> int:
        value: int = _U32.unpack(self._take(4, field))[0]
        return value

    def properties(self, packet_type: int) -> Properties:
        size = self.varint("property length")
        if size == 0:
            return _EMPTY
        end = self._pos + size
        if end > len(self._data):
            raise _fail(E.MALFORMED, f"{self._what} property length {size} beyond the packet")
        values: dict[str, Any] = {}
        while self._pos < end:
            ident = self.varint("property identifier")
            spec = PROPERTIES.get(ident)
            if spec is None:
                raise _fail(E.UNKNOWN_PROPERTY, f"{self._what}: unknown property {ident:#04x}")
            if packet_type not in spec.packets:
                raise _fail(
                    E.UNKNOWN_PROPERTY, f"{self._what} may not carry the property {spec.name}"
                )
            value = self._value(spec.kind, spec.name)
            if self._pos > end:
                raise _fail(E.MALFORMED, f"{self._what} property {spec.name} overruns its block")
            if (spec.allowed is not None and value not in spec.allowed) or (
                spec.nonzero and value == 0
            ):
                raise _fail(E.INVALID_PROPERTY, f"{self._what} {spec.name} = {value!r}")
            if spec.repeatable:
                values[spec.name] = (*values.get(spec.name, ()), value)
            elif spec.name in values:
                raise _fail(E.DUPLICATE_PROPERTY, f"{self._what}: {spec.name} more than once")
            else:
                values[spec.name] = value
        return Properties(**values)

    def _value(self, kind: PropType, name: str) -> Any:
        if kind is PropType.BYTE:
            return self.u8(name)
        if kind is PropType.U16:
            return self.u16(name)
        if kind is PropType.U32:
            return self.u32(name)
        if kind is PropType.VARINT:
            return self.varint(name)
        if kind is PropType.UTF8:
            return self.string(name)
        if kind is PropType.BINARY:
            return self.binary(name)
        return (self.string(name), self.string(name))

    def reason(self, packet_type: int) -> int:
        code = self.u8("reason code")
        if code not in VALID_REASONS[packet_type]:
            raise _fail(E.MALFORMED, f"{self._what} reason code {code:#04x} is not valid here")
        return code


# --------------------------------------------------------------------------------------------
# Encoding


def _check_pid(packet_id: int | None) -> bytes:
    if packet_id is None or not 1 <= packet_id <= MAX_PACKET_ID:
        raise ValueError(f"packet id {packet_id} outside 1..{MAX_PACKET_ID}")
    return _U16.pack(packet_id)


def _check_reason(packet_type: int, code: int) -> int:
    if code not in VALID_REASONS[packet_type]:
        raise ValueError(f"reason code {code:#04x} not valid in packet type {packet_type}")
    return code


def _encode_connect(p: Connect5) -> tuple[int, bytes]:
    flags = 0x02 if p.clean_start else 0
    payload = [_string(p.client_id)]
    if p.will_topic is not None:
        if p.will_qos not in _VALID_QOS:
            raise ValueError(f"will QoS {p.will_qos}")
        flags |= 0x04 | (p.will_qos << 3) | (0x20 if p.will_retain else 0)
        payload.append(encode_properties(p.will_properties, WILL))
        payload.append(_string(p.will_topic))
        payload.append(_binary(p.will_payload))
    if p.username is not None:
        flags |= 0x80
        payload.append(_string(p.username))
    if p.password is not None:
        flags |= 0x40
        payload.append(_binary(p.password))
    if not 0 <= p.keep_alive <= 0xFFFF:
        raise ValueError(f"keep alive {p.keep_alive}")
    header = (
        _string("MQTT")
        + bytes((p.protocol_level, flags))
        + _U16.pack(p.keep_alive)
        + encode_properties(p.properties, PacketType.CONNECT)
    )
    return 0, header + b"".join(payload)


def _encode_connack(p: Connack5) -> tuple[int, bytes]:
    code = _check_reason(PacketType.CONNACK, p.reason_code)
    if p.session_present and code:
        raise ValueError("session present requires reason code 0")
    props = encode_properties(p.properties, PacketType.CONNACK)
    return 0, bytes((int(p.session_present), code)) + props


def _encode_publish(p: Publish5) -> tuple[int, bytes]:
    if p.qos not in _VALID_QOS:
        raise ValueError(f"QoS {p.qos}")
    if p.topic:
        error = topic_name_error(p.topic)
        if error is not None:
            raise ValueError(error)
    elif p.properties.topic_alias is None:
        raise ValueError("an empty topic needs a topic alias")
    if p.dup and not p.qos:
        raise ValueError("DUP must be 0 on a QoS 0 PUBLISH")
    flags = (p.qos << 1) | (8 if p.dup else 0) | (1 if p.retain else 0)
    body = _string(p.topic)
    if p.qos:
        body += _check_pid(p.packet_id)
    elif p.packet_id is not None:
        raise ValueError("a QoS 0 PUBLISH has no packet id")
    return flags, body + encode_properties(p.properties, PacketType.PUBLISH) + p.payload


def _ack_encoder(packet_type: int, flags: int) -> Callable[[Ack5], tuple[int, bytes]]:
    def encode(p: Ack5) -> tuple[int, bytes]:
        pid = _check_pid(p.packet_id)
        code = _check_reason(packet_type, p.reason_code)
        if not p.properties:
            # Section 3.4.2.1: the reason code may be left out when it is 0 and there are
            # no properties.
            return flags, pid if code == 0 else pid + bytes((code,))
        return flags, pid + bytes((code,)) + encode_properties(p.properties, packet_type)

    return encode


def _options_byte(o: SubOptions) -> int:
    if o.qos not in _VALID_QOS or o.retain_handling not in (0, 1, 2):
        raise ValueError(f"subscription options {o!r}")
    return (
        o.qos
        | (0x04 if o.no_local else 0)
        | (0x08 if o.retain_as_published else 0)
        | (o.retain_handling << 4)
    )


def _encode_subscribe(p: Subscribe5) -> tuple[int, bytes]:
    if not p.subscriptions:
        raise ValueError("SUBSCRIBE needs at least one topic filter")
    parts = [_check_pid(p.packet_id), encode_properties(p.properties, PacketType.SUBSCRIBE)]
    for topic_filter, options in p.subscriptions:
        error = topic_filter_error(topic_filter)
        if error is not None:
            raise ValueError(error)
        parts.append(_string(topic_filter) + bytes((_options_byte(options),)))
    return 0b0010, b"".join(parts)


def _encode_codes(
    packet_type: int,
) -> Callable[[Suback5 | Unsuback5], tuple[int, bytes]]:
    def encode(p: Suback5 | Unsuback5) -> tuple[int, bytes]:
        if not p.reason_codes:
            raise ValueError("at least one reason code")
        codes = bytes(_check_reason(packet_type, c) for c in p.reason_codes)
        return 0, _check_pid(p.packet_id) + encode_properties(p.properties, packet_type) + codes

    return encode


def _encode_unsubscribe(p: Unsubscribe5) -> tuple[int, bytes]:
    if not p.topic_filters:
        raise ValueError("UNSUBSCRIBE needs at least one topic filter")
    parts = [_check_pid(p.packet_id), encode_properties(p.properties, PacketType.UNSUBSCRIBE)]
    for topic_filter in p.topic_filters:
        error = topic_filter_error(topic_filter)
        if error is not None:
            raise ValueError(error)
        parts.append(_string(topic_filter))
    return 0b0010, b"".join(parts)


def _reason_only(packet_type: int) -> Callable[[Disconnect5 | Auth5], tuple[int, bytes]]:
    def encode(p: Disconnect5 | Auth5) -> tuple[int, bytes]:
        code = _check_reason(packet_type, p.reason_code)
        if not p.properties:
            return 0, b"" if code == 0 else bytes((code,))
        return 0, bytes((code,)) + encode_properties(p.properties, packet_type)

    return encode


def _encode_empty(p: Pingreq | Pingresp) -> tuple[int, bytes]:
    return 0, b""


_ENCODERS: dict[type, Callable[[Any], tuple[int, bytes]]] = {
    Connect5: _encode_connect,
    Connack5: _encode_connack,
    Publish5: _encode_publish,
    Puback5: _ack_encoder(PacketType.PUBACK, 0),
    Pubrec5: _ack_encoder(PacketType.PUBREC, 0),
    Pubrel5: _ack_encoder(PacketType.PUBREL, 0b0010),
    Pubcomp5: _ack_encoder(PacketType.PUBCOMP, 0),
    Subscribe5: _encode_subscribe,
    Suback5: _encode_codes(PacketType.SUBACK),
    Unsubscribe5: _encode_unsubscribe,
    Unsuback5: _encode_codes(PacketType.UNSUBACK),
    Pingreq: _encode_empty,
    Pingresp: _encode_empty,
    Disconnect5: _reason_only(PacketType.DISCONNECT),
    Auth5: _reason_only(AUTH),
}


def encode5(packet: Packet5) -> bytes:
    """The wire bytes of a v5 ``packet``; ValueError if it is not a valid one."""
    encoder = _ENCODERS.get(type(packet))
    if encoder is None:
        raise TypeError(f"not an MQTT 5 packet: {packet!r}")
    flags, body = encoder(packet)
    first = (PACKET_TYPES5[type(packet)] << 4) | flags
    return bytes((first,)) + encode_remaining_length(len(body)) + body


def encode_publish5(
    topic: bytes,
    payload: bytes,
    qos: int,
    packet_id: int,
    props: bytes,
    *,
    retain: bool = False,
    dup: bool = False,
) -> bytes:
    """A PUBLISH from valid parts (the delivery path): ``topic`` UTF-8 (empty with an alias
    in ``props``), ``props`` an encoded property block (``encode_properties``)."""
    first = 0x30 | (qos << 1) | (8 if dup else 0) | (1 if retain else 0)
    head = len(topic).to_bytes(2, "big") + topic
    if qos:
        head += packet_id.to_bytes(2, "big")
    size = len(head) + len(props) + len(payload)
    length = _REMAINING_LENGTHS[size] if size < 16_384 else encode_remaining_length(size)
    return b"".join((_FIRST[first], length, head, props, payload))


_REMAINING_LENGTHS = [encode_remaining_length(n) for n in range(16_384)]
_FIRST = [bytes((n,)) for n in range(256)]


# --------------------------------------------------------------------------------------------
# Decoding


def _decode_connect(flags: int, body: bytes) -> Connect5:
    r = _Reader5(body, "CONNECT")
    name = r.string("protocol name")
    level = r.u8("protocol level")
    if name != "MQTT" or level != PROTOCOL_LEVEL_V5:
        raise _fail(E.UNSUPPORTED_PROTOCOL_LEVEL, f"protocol {name!r} level {level}")
    cf = r.u8("connect flags")
    if cf & 0x01:
        raise _fail(E.INVALID_CONNECT_FLAGS, "reserved CONNECT flag bit 0 is set")
    has_will = bool(cf & 0x04)
    will_qos = (cf & 0x18) >> 3
    will_retain = bool(cf & 0x20)
    if not has_will and (will_qos or will_retain):
        raise _fail(E.INVALID_CONNECT_FLAGS, "will QoS or will retain set without a will")
    if will_qos == 3:
        raise _fail(E.INVALID_QOS, "will QoS 3")
    keep_alive = r.u16("keep alive")
    props = r.properties(PacketType.CONNECT)
    client_id = r.string("client identifier")
    will_props = _EMPTY
    will_topic: str | None = None
    will_payload = b""
    if has_will:
        will_props = r.properties(WILL)
        will_topic = r.topic_name("will topic")
        will_payload = r.binary("will payload")
    username = r.string("user name") if cf & 0x80 else None
    password = r.binary("password") if cf & 0x40 else None
    r.end()
    return Connect5(
        client_id,
        bool(cf & 0x02),
        keep_alive,
        props,
        will_topic,
        will_payload,
        will_qos,
        will_retain,
        will_props,
        username,
        password,
    )


def _decode_connack(flags: int, body: bytes) -> Connack5:
    r = _Reader5(body, "CONNACK")
    ack_flags = r.u8("acknowledge flags")
    if ack_flags & 0xFE:
        raise _fail(E.MALFORMED, "CONNACK reserved acknowledge flag bits are set")
    code = r.reason(PacketType.CONNACK)
    props = r.properties(PacketType.CONNACK)
    r.end()
    return Connack5(code, bool(ack_flags & 1), props)


#: Topic names already decoded and validated (publishers reuse a few topics): bytes -> str.
_TOPICS: Final[dict[bytes, str]] = {}
_TOPICS_MAX: Final = 4096


def _decode_publish(flags: int, body: bytes) -> Publish5:
    """A PUBLISH from its body alone (the decoder table's, a held packet's head)."""
    return _decode_publish_at(flags, body, 0, len(body))


def _decode_publish_at(flags: int, buf: bytes, start: int, stop: int) -> Publish5:
    """The PUBLISH whose body is ``buf[start:stop]`` (the read it came in), decoded in place
    as 3.1.1's (``codec._decode_publish_at``): with a known topic and no properties, its
    payload is the one copy made (no slice of the body first, no view)."""
    qos = (flags & 0x06) >> 1
    # Fast path (most publishes): a known topic and no properties.
    if stop - start >= 3:
        end = start + 2 + ((buf[start] << 8) | buf[start + 1])
        known = _TOPICS.get(buf[start + 2 : end]) if end <= stop else None
        if known is not None:
            if not qos:
                if end < stop and buf[end] == 0:
                    return Publish5(
                        known, buf[end + 1 : stop], 0, bool(flags & 1), False, None, _EMPTY
                    )
            elif end + 2 < stop and buf[end + 2] == 0:
                pid = (buf[end] << 8) | buf[end + 1]
                if pid:
                    return Publish5(
                        known,
                        buf[end + 3 : stop],
                        qos,
                        bool(flags & 1),
                        bool(flags & 8),
                        pid,
                        _EMPTY,
                    )
    # (with properties, a large body is copied once more here: the reader wants its bytes)
    r = _Reader5(buf[start:stop], "PUBLISH")  # (buf itself when it is the whole body)
    topic = r.string("topic name")
    if topic:
        error = topic_name_error(topic)
        if error is not None:
            raise _fail(E.INVALID_TOPIC_NAME, f"PUBLISH topic name: {error}")
        if len(_TOPICS) >= _TOPICS_MAX:
            _TOPICS.clear()
        _TOPICS[topic.encode()] = topic
    packet_id = r.packet_id() if qos else None
    props = r.properties(PacketType.PUBLISH)
    if not topic and props.topic_alias is None:
        raise _fail(E.PROTOCOL_ERROR, "PUBLISH with an empty topic and no topic alias")
    if props.subscription_identifiers:
        raise _fail(E.PROTOCOL_ERROR, "a client PUBLISH may not carry a subscription identifier")
    payload = r.rest()
    return Publish5(topic, payload, qos, bool(flags & 1), bool(flags & 8), packet_id, props)


def _ack_decoder(
    cls: type[Puback5 | Pubrec5 | Pubrel5 | Pubcomp5], packet_type: int
) -> Callable[[int, bytes], Packet5]:
    name = PacketType(packet_type).name

    def decode(flags: int, body: bytes) -> Packet5:
        if len(body) == 2 and (body[0] or body[1]):  # (the usual: success, no properties)
            return cls((body[0] << 8) | body[1], 0, _EMPTY)
        r = _Reader5(body, name)
        pid = r.packet_id()
        if r.at_end():
            return cls(pid)
        code = r.reason(packet_type)
        props = _EMPTY if r.at_end() else r.properties(packet_type)
        r.end()
        return cls(pid, code, props)

    return decode


def _decode_subscribe(flags: int, body: bytes) -> Subscribe5:
    r = _Reader5(body, "SUBSCRIBE")
    pid = r.packet_id()
    props = r.properties(PacketType.SUBSCRIBE)
    if len(props.subscription_identifiers) > 1:
        raise _fail(E.DUPLICATE_PROPERTY, "SUBSCRIBE: subscription identifier more than once")
    subs: list[tuple[str, SubOptions]] = []
    while not r.at_end():
        topic_filter = r.topic_filter()
        options = r.u8("subscription options")
        if options & 0xC0:
            raise _fail(E.MALFORMED, "SUBSCRIBE reserved bits of the options are set")
        if options & 0x03 == 3:
            raise _fail(E.INVALID_QOS, "SUBSCRIBE requested QoS 3")
        handling = (options >> 4) & 0x03
        if handling == 3:
            raise _fail(E.PROTOCOL_ERROR, "SUBSCRIBE retain handling 3")
        subs.append(
            (
                topic_filter,
                SubOptions(options & 3, bool(options & 4), bool(options & 8), handling),
            )
        )
    if not subs:
        raise _fail(E.NO_TOPIC_FILTERS, "SUBSCRIBE without topic filters")
    return Subscribe5(pid, tuple(subs), props)


def _decode_codes(
    cls: type[Suback5 | Unsuback5], packet_type: int
) -> Callable[[int, bytes], Packet5]:
    name = PacketType(packet_type).name

    def decode(flags: int, body: bytes) -> Packet5:
        r = _Reader5(body, name)
        pid = r.packet_id()
        props = r.properties(packet_type)
        codes = []
        while not r.at_end():
            codes.append(r.reason(packet_type))
        if not codes:
            raise _fail(E.PROTOCOL_ERROR, f"{name} without reason codes")
        return cls(pid, tuple(codes), props)

    return decode


def _decode_unsubscribe(flags: int, body: bytes) -> Unsubscribe5:
    r = _Reader5(body, "UNSUBSCRIBE")
    pid = r.packet_id()
    props = r.properties(PacketType.UNSUBSCRIBE)
    filters: list[str] = []
    while not r.at_end():
        filters.append(r.topic_filter())
    if not filters:
        raise _fail(E.NO_TOPIC_FILTERS, "UNSUBSCRIBE without topic filters")
    return Unsubscribe5(pid, tuple(filters), props)


def _reason_decoder(
    cls: type[Disconnect5 | Auth5], packet_type: int
) -> Callable[[int, bytes], Packet5]:
    name = "AUTH" if packet_type == AUTH else PacketType(packet_type).name

    def decode(flags: int, body: bytes) -> Packet5:
        if not body:
            return cls()
        r = _Reader5(body, name)
        code = r.reason(packet_type)
        props = _EMPTY if r.at_end() else r.properties(packet_type)
        r.end()
        return cls(code, props)

    return decode


def _constant(packet: Packet5) -> Callable[[int, bytes], Packet5]:
    def decode(flags: int, body: bytes) -> Packet5:
        return packet

    return decode


_DECODERS: dict[int, Callable[[int, bytes], Packet5]] = {
    PacketType.CONNECT: _decode_connect,
    PacketType.CONNACK: _decode_connack,
    PacketType.PUBLISH: _decode_publish,
    PacketType.PUBACK: _ack_decoder(Puback5, PacketType.PUBACK),
    PacketType.PUBREC: _ack_decoder(Pubrec5, PacketType.PUBREC),
    PacketType.PUBREL: _ack_decoder(Pubrel5, PacketType.PUBREL),
    PacketType.PUBCOMP: _ack_decoder(Pubcomp5, PacketType.PUBCOMP),
    PacketType.SUBSCRIBE: _decode_subscribe,
    PacketType.SUBACK: _decode_codes(Suback5, PacketType.SUBACK),
    PacketType.UNSUBSCRIBE: _decode_unsubscribe,
    PacketType.UNSUBACK: _decode_codes(Unsuback5, PacketType.UNSUBACK),
    PacketType.PINGREQ: _constant(Pingreq()),
    PacketType.PINGRESP: _constant(Pingresp()),
    PacketType.DISCONNECT: _reason_decoder(Disconnect5, PacketType.DISCONNECT),
    AUTH: _reason_decoder(Auth5, AUTH),
}

_FIXED_FLAGS: dict[int, int] = {
    t: (0b0010 if t in (PacketType.PUBREL, PacketType.SUBSCRIBE, PacketType.UNSUBSCRIBE) else 0)
    for t in _DECODERS
    if t != PacketType.PUBLISH
}
#: exact remaining lengths (PINGREQ/PINGRESP) and least ones (the acknowledgements)
_EXACT_LENGTHS: dict[int, int] = {PacketType.PINGREQ: 0, PacketType.PINGRESP: 0}
_LEAST_LENGTHS: dict[int, int] = {
    PacketType.CONNACK: 2,
    PacketType.PUBACK: 2,
    PacketType.PUBREC: 2,
    PacketType.PUBREL: 2,
    PacketType.PUBCOMP: 2,
    PacketType.SUBACK: 3,
    PacketType.UNSUBACK: 3,
}


_check_first_byte = first_byte_check(_FIXED_FLAGS)


class Mqtt5Parser:
    """Incremental MQTT 5.0 decoder, as :class:`codec.MqttParser` for 3.1.1.

    ``max_packet_size`` is what the server's CONNACK announces as Maximum Packet Size: a
    larger packet is refused (PACKET_TOO_LARGE, reason 0x95) as soon as its length is read.
    After an error the parser is spent.
    """

    __slots__ = ("_error", "_held", "defer_from", "fill_from", "max_packet_size", "unjoined")

    def __init__(self, max_packet_size: int = MAX_PACKET_SIZE) -> None:
        #: as :class:`codec.MqttParser`'s: a large PUBLISH payload filled in place
        self.fill_from = 0
        #: as :class:`codec.MqttParser`'s: a large PUBLISH payload left for the caller to join
        self.defer_from = 0
        self.unjoined: Unjoined | None = None
        if max_packet_size < 2:
            raise ValueError("max_packet_size must be at least 2")
        self.max_packet_size = max_packet_size
        # made when a read first ends inside a packet (an idle connection never has one)
        self._held: HeldInput | None = None
        self._error: MqttProtocolError | None = None

    @property
    def buffered(self) -> int:
        return held_bytes(self._held)

    @property
    def filling(self) -> Fill | None:
        return filling_of(self._held)

    def feed(self, data: bytes | bytearray | memoryview) -> list[Packet5]:
        held = self._held
        try:
            opened = open_feed(
                self._error,
                held,
                data,
                _decode_publish,
                properties=True,
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
        packets: list[Packet5] = [] if publish is None else [publish]
        size = len(buf)
        need = 0
        try:
            while pos < size:
                first = buf[pos]
                packet_type = first >> 4
                # PUBLISH (the hot path) checks its own flags: QoS 3, or DUP at QoS 0; the
                # QoS acks' (PUBACK, PUBREC, PUBREL, PUBCOMP) are right when they are these.
                if (
                    (packet_type != 3 or (first & 0x06) == 0x06 or (first & 0x0E) == 0x08)
                    and first != 0x40
                    and first != 0x50
                    and first != 0x62
                    and first != 0x70
                ):
                    _check_first_byte(first)
                if pos + 1 < size and buf[pos + 1] < 0x80:
                    length = buf[pos + 1]
                    length_size = 1
                else:
                    decoded = decode_remaining_length(buf, pos + 1)
                    if decoded is None:
                        need = size - pos + 1
                        break
                    length, length_size = decoded
                if packet_type != 3:
                    exact = _EXACT_LENGTHS.get(packet_type)
                    if (exact is not None and length != exact) or length < _LEAST_LENGTHS.get(
                        packet_type, 0
                    ):
                        raise _fail(
                            E.MALFORMED, f"packet type {packet_type} remaining length {length}"
                        )
                header = 1 + length_size
                total = header + length
                if total > self.max_packet_size:
                    raise _fail(
                        E.PACKET_TOO_LARGE,
                        f"packet of {total} bytes exceeds the limit of {self.max_packet_size}",
                    )
                if size - pos < total:
                    need = total
                    break
                at = pos + header
                if packet_type == 3:
                    # Decoded in place: only its payload is copied out (a bytes slice of the
                    # body would copy it twice), and no generic call through the table.
                    packets.append(_decode_publish_at(first & 0x0F, buf, at, pos + total))
                elif length == 2 and 4 <= packet_type <= 7 and (buf[at] or buf[at + 1]):
                    # A QoS ack (success, no properties; a packet id 0 is the table's to
                    # refuse; its first byte was checked) inline, each class called directly:
                    # the table's generic call, the body slice and the class's generic call
                    # cost more than the packet itself.
                    pid = (buf[at] << 8) | buf[at + 1]
                    if packet_type == 4:
                        packets.append(Puback5(pid, 0, _EMPTY))
                    elif packet_type == 5:
                        packets.append(Pubrec5(pid, 0, _EMPTY))
                    elif packet_type == 6:
                        packets.append(Pubrel5(pid, 0, _EMPTY))
                    else:
                        packets.append(Pubcomp5(pid, 0, _EMPTY))
                else:
                    packets.append(_DECODERS[packet_type](first & 0x0F, buf[at : pos + total]))
                pos += total
        except MqttProtocolError as exc:
            exc.packets = tuple(packets)  # type: ignore[arg-type]
            self._error = exc
            if held is not None:
                held.clear()
            raise
        if pos < size:
            if held is None:
                held = self._held = HeldInput()
            held.hold(buf, pos, need)
            if self.fill_from:
                start_fill(held, _decode_publish, properties=True, fill_from=self.fill_from)
        return packets


__all__ = [
    "MAX_VARINT",
    "Mqtt5Parser",
    "ReasonCode",
    "RetainHandling",
    "encode5",
    "encode_properties",
    "encode_publish5",
    "property_block",
    "property_entries",
]
