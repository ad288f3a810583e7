"""MQTT 5.0 control packets, properties and reason codes as typed values (OASIS MQTT 5.0).

A v5 packet carries what its 3.1.1 counterpart does plus a reason code (acknowledgements,
DISCONNECT, AUTH) and a :class:`Properties` value; the codec in :mod:`adapters.mqtt.codec5`
turns them into bytes and back. PINGREQ and PINGRESP have no properties and are the 3.1.1
classes. As in :mod:`adapters.mqtt.packets` the dataclasses are slotted and treated as
immutable rather than declared frozen.

``Properties`` holds every property of the standard as an optional field (None: absent); the
only repeatable ones, User Property and Subscription Identifier, are tuples. Which property a
packet may carry, and the type of each, is the table ``PROPERTIES`` (section 2.2.2.2).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from enum import Enum, IntEnum

from vibemq_server.adapters.mqtt.packets import PacketType, Pingreq, Pingresp

PROTOCOL_LEVEL_V5 = 5
#: AUTH exists in v5 only.
AUTH = 15


class ReasonCode(IntEnum):
    """Every reason code of MQTT 5.0 (section 2.4); 0x00 is Success / Normal disconnection /
    Granted QoS 0 depending on the packet."""

    SUCCESS = 0x00
    GRANTED_QOS_1 = 0x01
    GRANTED_QOS_2 = 0x02
    DISCONNECT_WITH_WILL = 0x04
    NO_MATCHING_SUBSCRIBERS = 0x10
    NO_SUBSCRIPTION_EXISTED = 0x11
    CONTINUE_AUTHENTICATION = 0x18
    RE_AUTHENTICATE = 0x19
    UNSPECIFIED_ERROR = 0x80
    MALFORMED_PACKET = 0x81
    PROTOCOL_ERROR = 0x82
    IMPLEMENTATION_SPECIFIC_ERROR = 0x83
    UNSUPPORTED_PROTOCOL_VERSION = 0x84
    CLIENT_IDENTIFIER_NOT_VALID = 0x85
    BAD_USER_NAME_OR_PASSWORD = 0x86
    NOT_AUTHORIZED = 0x87
    SERVER_UNAVAILABLE = 0x88
    SERVER_BUSY = 0x89
    BANNED = 0x8A
    SERVER_SHUTTING_DOWN = 0x8B
    BAD_AUTHENTICATION_METHOD = 0x8C
    KEEP_ALIVE_TIMEOUT = 0x8D
    SESSION_TAKEN_OVER = 0x8E
    TOPIC_FILTER_INVALID = 0x8F
    TOPIC_NAME_INVALID = 0x90
    PACKET_IDENTIFIER_IN_USE = 0x91
    PACKET_IDENTIFIER_NOT_FOUND = 0x92
    RECEIVE_MAXIMUM_EXCEEDED = 0x93
    TOPIC_ALIAS_INVALID = 0x94
    PACKET_TOO_LARGE = 0x95
    MESSAGE_RATE_TOO_HIGH = 0x96
    QUOTA_EXCEEDED = 0x97
    ADMINISTRATIVE_ACTION = 0x98
    PAYLOAD_FORMAT_INVALID = 0x99
    RETAIN_NOT_SUPPORTED = 0x9A
    QOS_NOT_SUPPORTED = 0x9B
    USE_ANOTHER_SERVER = 0x9C
    SERVER_MOVED = 0x9D
    SHARED_SUBSCRIPTIONS_NOT_SUPPORTED = 0x9E
    CONNECTION_RATE_EXCEEDED = 0x9F
    MAXIMUM_CONNECT_TIME = 0xA0
    SUBSCRIPTION_IDENTIFIERS_NOT_SUPPORTED = 0xA1
    WILDCARD_SUBSCRIPTIONS_NOT_SUPPORTED = 0xA2


REASON_CODES = frozenset(int(code) for code in ReasonCode)


class PropType(Enum):
    """The wire type of a property value."""

    BYTE = "byte"
    U16 = "u16"
    U32 = "u32"
    VARINT = "varint"
    UTF8 = "utf8"
    BINARY = "binary"
    PAIR = "pair"


#: Pseudo packet type for the properties of a will (in the CONNECT payload).
WILL = 0


@dataclass(slots=True)
class Properties:
    """The properties of one packet; None (or an empty tuple) is absent."""

    payload_format_indicator: int | None = None
    message_expiry_interval: int | None = None
    content_type: str | None = None
    response_topic: str | None = None
    correlation_data: bytes | None = None
    subscription_identifiers: tuple[int, ...] = ()
    session_expiry_interval: int | None = None
    assigned_client_identifier: str | None = None
    server_keep_alive: int | None = None
    authentication_method: str | None = None
    authentication_data: bytes | None = None
    request_problem_information: int | None = None
    will_delay_interval: int | None = None
    request_response_information: int | None = None
    response_information: str | None = None
    server_reference: str | None = None
    reason_string: str | None = None
    receive_maximum: int | None = None
    topic_alias_maximum: int | None = None
    topic_alias: int | None = None
    maximum_qos: int | None = None
    retain_available: int | None = None
    user_properties: tuple[tuple[str, str], ...] = ()
    maximum_packet_size: int | None = None
    wildcard_subscription_available: int | None = None
    subscription_identifier_available: int | None = None
    shared_subscription_available: int | None = None

    def __bool__(self) -> bool:
        return any(getattr(self, f.name) not in (None, ()) for f in fields(self))


_ALL_ACKS = frozenset(
    {
        PacketType.CONNACK,
        PacketType.PUBACK,
        PacketType.PUBREC,
        PacketType.PUBREL,
        PacketType.PUBCOMP,
        PacketType.SUBACK,
        PacketType.UNSUBACK,
        PacketType.DISCONNECT,
        AUTH,
    }
)
_MESSAGE = frozenset({PacketType.PUBLISH, WILL})
_EVERY = frozenset(int(t) for t in PacketType if t not in (12, 13)) | {AUTH, WILL}


@dataclass(frozen=True, slots=True)
class PropertySpec:
    """One row of the property table: its id, field, wire type, where it may appear, and
    the values it may take (None: any the type allows)."""

    ident: int
    name: str
    kind: PropType
    packets: frozenset[int]
    allowed: frozenset[int] | None = None
    #: 0 is not a valid value (Receive Maximum, Maximum Packet Size, Subscription Identifier)
    nonzero: bool = False
    repeatable: bool = False


_BOOL = frozenset({0, 1})
_PT = PacketType

#: Section 2.2.2.2: every property, by identifier.
PROPERTIES: dict[int, PropertySpec] = {
    spec.ident: spec
    for spec in (
        PropertySpec(0x01, "payload_format_indicator", PropType.BYTE, _MESSAGE, _BOOL),
        PropertySpec(0x02, "message_expiry_interval", PropType.U32, _MESSAGE),
        PropertySpec(0x03, "content_type", PropType.UTF8, _MESSAGE),
        PropertySpec(0x08, "response_topic", PropType.UTF8, _MESSAGE),
        PropertySpec(0x09, "correlation_data", PropType.BINARY, _MESSAGE),
        PropertySpec(
            0x0B,
            "subscription_identifiers",
            PropType.VARINT,
            frozenset({_PT.PUBLISH, _PT.SUBSCRIBE}),
            nonzero=True,
            repeatable=True,
        ),
        PropertySpec(
            0x11,
            "session_expiry_interval",
            PropType.U32,
            frozenset({_PT.CONNECT, _PT.CONNACK, _PT.DISCONNECT}),
        ),
        PropertySpec(0x12, "assigned_client_identifier", PropType.UTF8, frozenset({_PT.CONNACK})),
        PropertySpec(0x13, "server_keep_alive", PropType.U16, frozenset({_PT.CONNACK})),
        PropertySpec(
            0x15,
            "authentication_method",
            PropType.UTF8,
            frozenset({_PT.CONNECT, _PT.CONNACK, AUTH}),
        ),
        PropertySpec(
            0x16,
            "authentication_data",
            PropType.BINARY,
            frozenset({_PT.CONNECT, _PT.CONNACK, AUTH}),
        ),
        PropertySpec(
            0x17, "request_problem_information", PropType.BYTE, frozenset({_PT.CONNECT}), _BOOL
        ),
        PropertySpec(0x18, "will_delay_interval", PropType.U32, frozenset({WILL})),
        PropertySpec(
            0x19, "request_response_information", PropType.BYTE, frozenset({_PT.CONNECT}), _BOOL
        ),
        PropertySpec(0x1A, "response_information", PropType.UTF8, frozenset({_PT.CONNACK})),
        PropertySpec(
            0x1C, "server_reference", PropType.UTF8, frozenset({_PT.CONNACK, _PT.DISCONNECT})
        ),
        PropertySpec(0x1F, "reason_string", PropType.UTF8, _ALL_ACKS),
        PropertySpec(
            0x21,
            "receive_maximum",
            PropType.U16,
            frozenset({_PT.CONNECT, _PT.CONNACK}),
            nonzero=True,
        ),
        PropertySpec(
            0x22, "topic_alias_maximum", PropType.U16, frozenset({_PT.CONNECT, _PT.CONNACK})
        ),
        PropertySpec(0x23, "topic_alias", PropType.U16, frozenset({_PT.PUBLISH})),
        PropertySpec(0x24, "maximum_qos", PropType.BYTE, frozenset({_PT.CONNACK}), _BOOL),
        PropertySpec(0x25, "retain_available", PropType.BYTE, frozenset({_PT.CONNACK}), _BOOL),
        PropertySpec(0x26, "user_properties", PropType.PAIR, _EVERY, repeatable=True),
        PropertySpec(
            0x27,
            "maximum_packet_size",
            PropType.U32,
            frozenset({_PT.CONNECT, _PT.CONNACK}),
            nonzero=True,
        ),
        PropertySpec(
            0x28,
            "wildcard_subscription_available",
            PropType.BYTE,
            frozenset({_PT.CONNACK}),
            _BOOL,
        ),
        PropertySpec(
            0x29,
            "subscription_identifier_available",
            PropType.BYTE,
            frozenset({_PT.CONNACK}),
            _BOOL,
        ),
        PropertySpec(
            0x2A,
            "shared_subscription_available",
            PropType.BYTE,
            frozenset({_PT.CONNACK}),
            _BOOL,
        ),
    )
}

#: field name -> its row
PROPERTY_BY_NAME: dict[str, PropertySpec] = {spec.name: spec for spec in PROPERTIES.values()}

NO_PROPERTIES = Properties()


def _props() -> Properties:
    return Properties()


@dataclass(slots=True)
class Connect5:
    """CONNECT at protocol level 5. A will is present exactly when ``will_topic`` is set."""

    client_id: str
    clean_start: bool = True
    keep_alive: int = 0
    properties: Properties = field(default_factory=_props)
    will_topic: str | None = None
    will_payload: bytes = b""
    will_qos: int = 0
    will_retain: bool = False
    will_properties: Properties = field(default_factory=_props)
    username: str | None = None
    password: bytes | None = None
    protocol_level: int = PROTOCOL_LEVEL_V5

    @property
    def has_will(self) -> bool:
        return self.will_topic is not None


@dataclass(slots=True)
class Connack5:
    reason_code: int = ReasonCode.SUCCESS
    session_present: bool = False
    properties: Properties = field(default_factory=_props)


# The per-message packets write their __init__ out (``init=False``): mypyc leaves a
# dataclass's generated one to the interpreter (as packets.py's 3.1.1 packets do). Without
# ``properties`` each gets a fresh, empty ``Properties`` of its own, as the field's
# default_factory gave.


@dataclass(slots=True, init=False)
class Publish5:
    """PUBLISH; ``topic`` may be empty when ``properties.topic_alias`` names it."""

    topic: str
    payload: bytes
    qos: int
    retain: bool
    dup: bool
    packet_id: int | None
    properties: Properties

    def __init__(
        self,
        topic: str,
        payload: bytes = b"",
        qos: int = 0,
        retain: bool = False,
        dup: bool = False,
        packet_id: int | None = None,
        properties: Properties | None = None,
    ) -> None:
        self.topic = topic
        self.payload = payload
        self.qos = qos
        self.retain = retain
        self.dup = dup
        self.packet_id = packet_id
        self.properties = Properties() if properties is None else properties


@dataclass(slots=True, init=False)
class Ack5:
    """What PUBACK, PUBREC, PUBREL and PUBCOMP share: their fields and ``__init__`` (written
    once, compiled; each subclass only names its packet)."""

    packet_id: int
    reason_code: int
    properties: Properties

    def __init__(
        self,
        packet_id: int,
        reason_code: int = ReasonCode.SUCCESS,
        properties: Properties | None = None,
    ) -> None:
        self.packet_id = packet_id
        self.reason_code = reason_code
        self.properties = Properties() if properties is None else properties


# (Dataclasses of their own: equality and repr are by the packet's class, as before.)
@dataclass(slots=True, init=False)
class Puback5(Ack5):
    """PUBACK: a QoS 1 PUBLISH acknowledged."""


@dataclass(slots=True, init=False)
class Pubrec5(Ack5):
    """PUBREC: a QoS 2 PUBLISH received."""


@dataclass(slots=True, init=False)
class Pubrel5(Ack5):
    """PUBREL: a QoS 2 PUBLISH released."""


@dataclass(slots=True, init=False)
class Pubcomp5(Ack5):
    """PUBCOMP: a QoS 2 PUBLISH complete."""


class RetainHandling(IntEnum):
    """Subscription option bits 4-5: when retained messages are sent on subscribe."""

    SEND = 0
    SEND_IF_NEW = 1
    DONT_SEND = 2


@dataclass(slots=True)
class SubOptions:
    """The options byte of one SUBSCRIBE entry (section 3.8.3.1)."""

    qos: int = 0
    no_local: bool = False
    retain_as_published: bool = False
    retain_handling: int = RetainHandling.SEND


@dataclass(slots=True)
class Subscribe5:
    packet_id: int
    subscriptions: tuple[tuple[str, SubOptions], ...]
    properties: Properties = field(default_factory=_props)


@dataclass(slots=True)
class Suback5:
    packet_id: int
    reason_codes: tuple[int, ...]
    properties: Properties = field(default_factory=_props)


@dataclass(slots=True)
class Unsubscribe5:
    packet_id: int
    topic_filters: tuple[str, ...]
    properties: Properties = field(default_factory=_props)


@dataclass(slots=True)
class Unsuback5:
    packet_id: int
    reason_codes: tuple[int, ...]
    properties: Properties = field(default_factory=_props)


@dataclass(slots=True)
class Disconnect5:
    reason_code: int = ReasonCode.SUCCESS
    properties: Properties = field(default_factory=_props)


@dataclass(slots=True)
class Auth5:
    reason_code: int = ReasonCode.SUCCESS
    properties: Properties = field(default_factory=_props)


Packet5 = (
    Connect5
    | Connack5
    | Publish5
    | Puback5
    | Pubrec5
    | Pubrel5
    | Pubcomp5
    | Subscribe5
    | Suback5
    | Unsubscribe5
    | Unsuback5
    | Pingreq
    | Pingresp
    | Disconnect5
    | Auth5
)

#: The packet type number of each v5 packet class.
PACKET_TYPES5: dict[type[Packet5], int] = {
    Connect5: PacketType.CONNECT,
    Connack5: PacketType.CONNACK,
    Publish5: PacketType.PUBLISH,
    Puback5: PacketType.PUBACK,
    Pubrec5: PacketType.PUBREC,
    Pubrel5: PacketType.PUBREL,
    Pubcomp5: PacketType.PUBCOMP,
    Subscribe5: PacketType.SUBSCRIBE,
    Suback5: PacketType.SUBACK,
    Unsubscribe5: PacketType.UNSUBSCRIBE,
    Unsuback5: PacketType.UNSUBACK,
    Pingreq: PacketType.PINGREQ,
    Pingresp: PacketType.PINGRESP,
    Disconnect5: PacketType.DISCONNECT,
    Auth5: AUTH,
}

#: The reason codes each acknowledgement may carry (sections 3.2.2.2 .. 3.15.2.1).
_PUB_ERRORS = frozenset({0x80, 0x83, 0x87, 0x90, 0x91, 0x97, 0x99})
VALID_REASONS: dict[int, frozenset[int]] = {
    PacketType.PUBACK: frozenset({0x00, 0x10}) | _PUB_ERRORS,
    PacketType.PUBREC: frozenset({0x00, 0x10}) | _PUB_ERRORS,
    PacketType.PUBREL: frozenset({0x00, 0x92}),
    PacketType.PUBCOMP: frozenset({0x00, 0x92}),
    PacketType.SUBACK: frozenset(
        {0x00, 0x01, 0x02, 0x80, 0x83, 0x87, 0x8F, 0x91, 0x97, 0x9E, 0xA1, 0xA2}
    ),
    PacketType.UNSUBACK: frozenset({0x00, 0x11, 0x80, 0x83, 0x87, 0x8F, 0x91}),
    PacketType.DISCONNECT: frozenset(
        c for c in REASON_CODES if c not in (0x01, 0x02, 0x10, 0x11, 0x18, 0x19)
    ),
    AUTH: frozenset({0x00, 0x18, 0x19}),
    PacketType.CONNACK: frozenset({0x00}) | frozenset(c for c in REASON_CODES if c >= 0x80),
}
