"""MQTT 5.0 message properties <-> the core's string headers, both ways.

A v5 PUBLISH's application properties travel through the core (into VibeMQ queues, to AMQP
consumers, in a persistent session's queue) as plain string headers, and come back as
properties when the message reaches a v5 subscriber:

| v5 property | core header |
| --- | --- |
| User Property ``k: v`` | ``k: v`` (a plain header; AMQP consumers see it in the headers table) |
| Content Type | ``contentType`` (AMQP's content-type) |
| Response Topic | ``responseTopic`` |
| Correlation Data | ``correlationData`` (base64) |
| Payload Format Indicator 1 | ``payloadFormat: utf-8`` |
| Message Expiry Interval | the core message's TTL (its ``expires_at``), not a header |

Headers the broker uses itself (``mqttTopic``, ``payloadEncoding``, ``amqp*``, ...) are never
user properties. A user property named like one of them is not carried (logged nowhere: the
name is reserved); a repeated user property name keeps its last value in the core.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping

from vibemq_server.adapters.mqtt.codec5 import property_entries
from vibemq_server.adapters.mqtt.packets import PacketType
from vibemq_server.adapters.mqtt.packets5 import Properties
from vibemq_server.protocol.payload import PAYLOAD_ENCODING

CONTENT_TYPE = "contentType"
RESPONSE_TOPIC = "responseTopic"
CORRELATION_DATA = "correlationData"
PAYLOAD_FORMAT = "payloadFormat"
UTF8 = "utf-8"
#: the subscription's identifiers of a message in a persistent session's queue (v5 only)
SUBSCRIPTION_IDS = "mqttSubscriptionIds"

_MAPPED = frozenset({CONTENT_TYPE, RESPONSE_TOPIC, CORRELATION_DATA, PAYLOAD_FORMAT})
#: headers that are the broker's, never a user property
INTERNAL = frozenset(
    {
        "mqttTopic",
        "mqttQos",
        "mqttRetain",
        SUBSCRIPTION_IDS,
        PAYLOAD_ENCODING,
        "amqpProperties",
        "amqpExchange",
        "amqpRoutingKey",
    }
)
_NOT_USER = _MAPPED | INTERNAL
_PUBLISH = PacketType.PUBLISH


def props_to_headers(props: Properties) -> dict[str, str]:
    """The core headers of a v5 PUBLISH's application properties."""
    headers: dict[str, str] = {}
    for key, value in props.user_properties:
        if key not in _NOT_USER:
            headers[key] = value
    if props.content_type is not None:
        headers[CONTENT_TYPE] = props.content_type
    if props.response_topic is not None:
        headers[RESPONSE_TOPIC] = props.response_topic
    if props.correlation_data is not None:
        headers[CORRELATION_DATA] = base64.b64encode(props.correlation_data).decode()
    if props.payload_format_indicator == 1:
        headers[PAYLOAD_FORMAT] = UTF8
    return headers


def headers_to_properties(headers: Mapping[str, str]) -> Properties:
    """The v5 application properties of a core message's headers (a persistent session's
    queue, another protocol's publish)."""
    correlation: bytes | None = None
    raw = headers.get(CORRELATION_DATA)
    if raw is not None:
        try:
            correlation = base64.b64decode(raw, validate=True)
        except (binascii.Error, ValueError):
            correlation = raw.encode()
    return Properties(
        payload_format_indicator=1 if headers.get(PAYLOAD_FORMAT) == UTF8 else None,
        content_type=headers.get(CONTENT_TYPE),
        response_topic=headers.get(RESPONSE_TOPIC),
        correlation_data=correlation,
        user_properties=tuple((k, v) for k, v in headers.items() if k not in _NOT_USER),
    )


def message_entries(props: Properties) -> bytes:
    """The application properties of a PUBLISH as it goes out to v5 subscribers (property
    entries without the block's length; expiry, alias and subscription ids are added per
    subscriber)."""
    if not (
        props.user_properties
        or props.content_type is not None
        or props.response_topic is not None
        or props.correlation_data is not None
        or props.payload_format_indicator is not None
    ):
        return b""
    return property_entries(
        Properties(
            payload_format_indicator=props.payload_format_indicator,
            content_type=props.content_type,
            response_topic=props.response_topic,
            correlation_data=props.correlation_data,
            user_properties=props.user_properties,
        ),
        _PUBLISH,
    )


def header_entries(headers: Mapping[str, str]) -> bytes:
    """``message_entries`` of a core message's headers."""
    for key in headers:
        if key not in INTERNAL:
            return message_entries(headers_to_properties(headers))
    return b""  # (the usual: only the broker's own headers)
