"""MQTT 3.1 / 3.1.1 adapter (docs/mqtt.md).

* :mod:`adapters.mqtt.packets` -- one dataclass per control packet.
* :mod:`adapters.mqtt.codec` -- ``encode(packet)`` and the incremental :class:`MqttParser`,
  which raises only :class:`MqttProtocolError` (with an :class:`MqttErrorCode`).
* :mod:`adapters.mqtt.topics` -- topic name / filter validation, ``matches`` and the
  ``a/b/c`` <-> ``a.b.c`` address mapping.

* :mod:`adapters.mqtt.states` -- the connection state machine: one transition table.
* :mod:`adapters.mqtt.session` -- per-client state: subscriptions, packet-id flows, queue.
* :mod:`adapters.mqtt.connection` -- one connection, sans-IO: bytes to packets, the packet
  handlers, bytes out through the shared transport's ``Link``.
* :mod:`adapters.mqtt.server` -- listener (the shared ``StreamTransport``), session registry,
  routing, retained messages, auth.

Imports go one way, in the order above (codec < session < connection < server).
"""

from vibemq_server.adapters.mqtt.codec import (
    MAX_PACKET_SIZE,
    MAX_REMAINING_LENGTH,
    MqttErrorCode,
    MqttParser,
    MqttProtocolError,
    decode_remaining_length,
    encode,
    encode_remaining_length,
)
from vibemq_server.adapters.mqtt.packets import (
    PROTOCOL_LEVEL_V31,
    PROTOCOL_LEVEL_V311,
    PROTOCOL_NAME_V31,
    PROTOCOL_NAME_V311,
    SUBACK_FAILURE,
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
    QoS,
    Suback,
    Subscribe,
    Unsuback,
    Unsubscribe,
)
from vibemq_server.adapters.mqtt.topics import (
    InvalidTopicError,
    address_to_topic,
    filter_to_pattern,
    is_valid_topic_filter,
    is_valid_topic_name,
    matches,
    queue_address,
    topic_to_address,
    validate_topic_filter,
    validate_topic_name,
)

__all__ = [
    "MAX_PACKET_SIZE",
    "MAX_REMAINING_LENGTH",
    "PROTOCOL_LEVEL_V31",
    "PROTOCOL_LEVEL_V311",
    "PROTOCOL_NAME_V31",
    "PROTOCOL_NAME_V311",
    "SUBACK_FAILURE",
    "Connack",
    "ConnackCode",
    "Connect",
    "Disconnect",
    "InvalidTopicError",
    "MqttErrorCode",
    "MqttParser",
    "MqttProtocolError",
    "Packet",
    "PacketType",
    "Pingreq",
    "Pingresp",
    "Puback",
    "Pubcomp",
    "Publish",
    "Pubrec",
    "Pubrel",
    "QoS",
    "Suback",
    "Subscribe",
    "Unsuback",
    "Unsubscribe",
    "address_to_topic",
    "decode_remaining_length",
    "encode",
    "encode_remaining_length",
    "filter_to_pattern",
    "is_valid_topic_filter",
    "is_valid_topic_name",
    "matches",
    "queue_address",
    "topic_to_address",
    "validate_topic_filter",
    "validate_topic_name",
]
