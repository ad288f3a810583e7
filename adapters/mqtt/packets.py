"""MQTT 3.1 / 3.1.1 control packets as typed, immutable values.

One slotted dataclass per control packet type, treated as immutable (not declared frozen:
a frozen dataclass costs several times more to build, and a broker builds one per message).
They carry exactly what is on the wire after decoding (no connection state): the codec in
:mod:`adapters.mqtt.codec` turns them into bytes and back. Field conventions:

* QoS values are plain ``int`` in ``0..2`` (see :class:`QoS` for names).
* ``packet_id`` is ``1..65535``; a QoS 0 PUBLISH has ``packet_id=None``.
* Payloads, the will message and the password are ``bytes`` (binary data in 3.1.1; 3.1 called
  them strings but frames them identically, with a 2-byte length prefix).
* Protocol versions: MQTT 3.1 is protocol name ``"MQIsdp"`` level 3, MQTT 3.1.1 is ``"MQTT"``
  level 4.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum

PROTOCOL_NAME_V31 = "MQIsdp"
PROTOCOL_LEVEL_V31 = 3
PROTOCOL_NAME_V311 = "MQTT"
PROTOCOL_LEVEL_V311 = 4

#: The protocol level each supported protocol name must come with.
SUPPORTED_PROTOCOLS: dict[str, int] = {
    PROTOCOL_NAME_V31: PROTOCOL_LEVEL_V31,
    PROTOCOL_NAME_V311: PROTOCOL_LEVEL_V311,
}

#: MQTT 3.1 limits the client identifier to 1..23 characters.
MAX_CLIENT_ID_LENGTH_V31 = 23

#: SUBACK return code for a refused subscription (3.1.1; we send it to 3.1 clients too).
SUBACK_FAILURE = 0x80


class PacketType(IntEnum):
    """Control packet type: the high nibble of the first fixed-header byte (0 and 15 reserved)."""

    CONNECT = 1
    CONNACK = 2
    PUBLISH = 3
    PUBACK = 4
    PUBREC = 5
    PUBREL = 6
    PUBCOMP = 7
    SUBSCRIBE = 8
    SUBACK = 9
    UNSUBSCRIBE = 10
    UNSUBACK = 11
    PINGREQ = 12
    PINGRESP = 13
    DISCONNECT = 14


class QoS(IntEnum):
    AT_MOST_ONCE = 0
    AT_LEAST_ONCE = 1
    EXACTLY_ONCE = 2


class ConnackCode(IntEnum):
    """CONNACK return codes (identical in 3.1 and 3.1.1)."""

    ACCEPTED = 0
    UNACCEPTABLE_PROTOCOL_VERSION = 1
    IDENTIFIER_REJECTED = 2
    SERVER_UNAVAILABLE = 3
    BAD_USERNAME_OR_PASSWORD = 4
    NOT_AUTHORIZED = 5


@dataclass(slots=True)
class Connect:
    """CONNECT. A will is present exactly when ``will_topic`` is not None."""

    client_id: str
    clean_session: bool = True
    keep_alive: int = 0
    protocol_name: str = PROTOCOL_NAME_V311
    protocol_level: int = PROTOCOL_LEVEL_V311
    will_topic: str | None = None
    will_payload: bytes = b""
    will_qos: int = 0
    will_retain: bool = False
    username: str | None = None
    password: bytes | None = None

    @property
    def has_will(self) -> bool:
        return self.will_topic is not None


@dataclass(slots=True)
class Connack:
    """CONNACK. ``session_present`` is 3.1.1 only (always False towards a 3.1 client)."""

    return_code: int = ConnackCode.ACCEPTED
    session_present: bool = False


# The packets made once a message (PUBLISH and its acknowledgements) write their __init__
# out: in the compiled build the one dataclasses generates stays interpreted, ~1.3 us a
# PUBLISH and ~1 us a PUBACK against ~0.3 us native (issue 16, 64 KiB: docs/performance.md).
# eq and repr stay the dataclass's.


@dataclass(slots=True, init=False)
class Publish:
    topic: str
    payload: bytes
    qos: int
    retain: bool
    dup: bool
    packet_id: int | None

    def __init__(
        self,
        topic: str,
        payload: bytes = b"",
        qos: int = 0,
        retain: bool = False,
        dup: bool = False,
        packet_id: int | None = None,
    ) -> None:
        self.topic = topic
        self.payload = payload
        self.qos = qos
        self.retain = retain
        self.dup = dup
        self.packet_id = packet_id


@dataclass(slots=True, init=False)
class Puback:
    packet_id: int

    def __init__(self, packet_id: int) -> None:
        self.packet_id = packet_id


@dataclass(slots=True, init=False)
class Pubrec:
    packet_id: int

    def __init__(self, packet_id: int) -> None:
        self.packet_id = packet_id


@dataclass(slots=True, init=False)
class Pubrel:
    packet_id: int

    def __init__(self, packet_id: int) -> None:
        self.packet_id = packet_id


@dataclass(slots=True, init=False)
class Pubcomp:
    packet_id: int

    def __init__(self, packet_id: int) -> None:
        self.packet_id = packet_id


@dataclass(slots=True)
class Subscribe:
    """SUBSCRIBE: at least one ``(topic filter, requested QoS)`` pair."""

    packet_id: int
    subscriptions: tuple[tuple[str, int], ...]


@dataclass(slots=True)
class Suback:
    """SUBACK: one return code per requested filter, the granted QoS or :data:`SUBACK_FAILURE`."""

    packet_id: int
    return_codes: tuple[int, ...]


@dataclass(slots=True)
class Unsubscribe:
    packet_id: int
    topic_filters: tuple[str, ...]


@dataclass(slots=True)
class Unsuback:
    packet_id: int


@dataclass(slots=True)
class Pingreq:
    pass


@dataclass(slots=True)
class Pingresp:
    pass


@dataclass(slots=True)
class Disconnect:
    pass


Packet = (
    Connect
    | Connack
    | Publish
    | Puback
    | Pubrec
    | Pubrel
    | Pubcomp
    | Subscribe
    | Suback
    | Unsubscribe
    | Unsuback
    | Pingreq
    | Pingresp
    | Disconnect
)

#: The packet type of each packet class.
PACKET_TYPES: dict[type[Packet], PacketType] = {
    Connect: PacketType.CONNECT,
    Connack: PacketType.CONNACK,
    Publish: PacketType.PUBLISH,
    Puback: PacketType.PUBACK,
    Pubrec: PacketType.PUBREC,
    Pubrel: PacketType.PUBREL,
    Pubcomp: PacketType.PUBCOMP,
    Subscribe: PacketType.SUBSCRIBE,
    Suback: PacketType.SUBACK,
    Unsubscribe: PacketType.UNSUBSCRIBE,
    Unsuback: PacketType.UNSUBACK,
    Pingreq: PacketType.PINGREQ,
    Pingresp: PacketType.PINGRESP,
    Disconnect: PacketType.DISCONNECT,
}
