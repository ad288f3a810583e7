"""AMQP messages <-> the core's messages (payload bytes + string headers), losslessly.

* The body becomes the core payload as it is, marked ``payloadEncoding: raw``
  (``protocol/payload.py``): no JSON check, no base64; an AMQP or MQTT consumer gets it back
  as it is, a VibeMQ consumer in the VibeMQ form (JSON as it is, else base64).
* The 14 basic properties travel untouched, as their encoded bytes (base64) in the header
  ``amqpProperties``; for VibeMQ consumers the string-valued entries of the AMQP ``headers``
  table are copied as plain headers, and ``content-type`` as ``contentType``.
* ``amqpExchange`` / ``amqpRoutingKey`` keep where it was published, for basic.deliver.
* A message published over another protocol reaches an AMQP consumer with its string headers
  as the ``headers`` table and as content-type its ``contentType`` header, else
  ``application/json`` when it came from a VibeMQ publisher with a non-empty payload (raw
  bytes of MQTT or ZeroMQ get none: they are not checked for JSON); a ZeroMQ multipart
  message: the MME bytes, content-type ``application/x-zmq-mme``.

Headers dicts are shared by messages with the same exchange, key and properties (they are
read-only), so a stream of similar messages costs one dict.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping
from typing import Any, cast

from pamqp import commands

from vibemq_server.adapters.amqp.codec import decode_properties, encode_properties
from vibemq_server.protocol.mme import CONTENT_TYPE
from vibemq_server.protocol.payload import BASE64, PAYLOAD_ENCODING, RAW, from_core, to_core

PROPERTIES = "amqpProperties"
EXCHANGE = "amqpExchange"
ROUTING_KEY = "amqpRoutingKey"
_EMPTY_PROPERTIES = b"\x00\x00"
_INTERNAL = frozenset({PROPERTIES, EXCHANGE, ROUTING_KEY, PAYLOAD_ENCODING})
_CACHE_MAX = 1024
_SHORTSTR_MAX = 255
_a2b = binascii.a2b_base64
#: payload encodings whose body is not known to be JSON (no application/json content-type)
_NOT_JSON = frozenset({BASE64, RAW})

#: what a headers dict says about delivering its messages over AMQP: (the dict itself, which
#: keeps its id from being reused while cached; the properties or None when they depend on
#: the body; base64 payload; exchange or None for the default exchange; routing key or None)
_Delivery = tuple[Mapping[str, str], bytes | None, bool, str | None, str | None]


class MessageMapper:
    def __init__(self) -> None:
        #: (exchange, routing key or "" for the default exchange, properties)
        self._headers: dict[tuple[str, str, bytes], dict[str, str]] = {}
        self._properties: dict[str, bytes] = {}
        self._deliveries: dict[int, _Delivery] = {}
        self._json_properties = encode_properties(
            commands.Basic.Properties(content_type="application/json")
        )

    def to_core(
        self, exchange: str, routing_key: str, properties: bytes, body: bytes
    ) -> tuple[bytes, Mapping[str, str]]:
        payload, encoding = to_core(body)
        key = (exchange, routing_key if exchange else "", properties)
        headers = self._headers.get(key)
        if headers is None:
            if len(self._headers) >= _CACHE_MAX:
                self._headers.clear()
            headers = self._headers[key] = self._build(exchange, routing_key, properties, encoding)
        return payload, headers

    @staticmethod
    def _build(exchange: str, routing_key: str, properties: bytes, encoding: str) -> dict[str, str]:
        headers: dict[str, str] = {PAYLOAD_ENCODING: encoding}
        if exchange:
            headers[EXCHANGE] = exchange
            headers[ROUTING_KEY] = routing_key
        # Always recorded (even empty), so an AMQP consumer gets exactly what was published.
        headers[PROPERTIES] = base64.b64encode(properties or _EMPTY_PROPERTIES).decode()
        if properties and properties != _EMPTY_PROPERTIES:
            props = decode_properties(properties)
            for name, value in (props.headers or {}).items():
                if isinstance(value, str | int | float) and name not in _INTERNAL:
                    headers.setdefault(name, str(value))
            if props.content_type:
                headers.setdefault("contentType", props.content_type)
        return headers

    def from_core(self, msg_payload: bytes, headers: Mapping[str, str]) -> tuple[bytes, bytes]:
        """(encoded properties, body) for an AMQP consumer."""
        body = from_core(msg_payload, headers)
        raw = headers.get(PROPERTIES)
        if raw is not None:
            props = self._properties.get(raw)
            if props is None:
                if len(self._properties) >= _CACHE_MAX:
                    self._properties.clear()
                props = self._properties[raw] = base64.b64decode(raw)
            return props, body
        if not headers:
            return (self._json_properties if body else _EMPTY_PROPERTIES), body
        table = {k: v for k, v in headers.items() if k not in _INTERNAL}
        # A ``contentType`` header (e.g. a ZeroMQ multipart body's application/x-zmq-mme)
        # is the content-type; else JSON bodies say application/json.
        content_type = headers.get(CONTENT_TYPE)
        if content_type is not None and len(content_type.encode()) > _SHORTSTR_MAX:
            content_type = None  # not a shortstr: it stays in the headers table only
        if content_type is None and headers.get(PAYLOAD_ENCODING) not in _NOT_JSON and body:
            content_type = "application/json"
        props_obj = commands.Basic.Properties(
            content_type=content_type,
            headers=cast(Any, table) or None,
        )
        return encode_properties(props_obj), body

    def for_delivery(
        self, payload: bytes, headers: Mapping[str, str], queue: str, left_ms: int = 0
    ) -> tuple[bytes, bytes, str, str]:
        """(properties, body, exchange, routing key) of a message for basic.deliver or
        get-ok: :meth:`from_core` and :meth:`origin` at once. What a headers dict implies is
        cached by the dict (they are shared by similar messages, see to_core).

        ``left_ms``: what is left of the message's own time to live (an MQTT 5 Message
        Expiry Interval, a VibeMQ publish's TTL); a message that did not come from an AMQP
        publisher (whose properties go out as they came) carries it as its ``expiration``."""
        entry = self._deliveries.get(id(headers))
        if entry is None or entry[0] is not headers:
            entry = self._delivery(headers)
        _headers, properties, b64, exchange, routing_key = entry
        if properties is None:
            properties, body = self.from_core(payload, headers)
            if left_ms:
                props = decode_properties(properties)
                props.expiration = str(left_ms)
                properties = encode_properties(props)
        elif not b64:
            body = payload
        elif payload[:1] == b'"' and payload[-1:] == b'"':
            try:
                body = _a2b(payload[1:-1], strict_mode=True)  # (what to_core wrote)
            except (binascii.Error, ValueError):
                body = from_core(payload, headers)
        else:
            body = from_core(payload, headers)
        if exchange is None:
            return properties, body, "", queue
        return properties, body, exchange, queue if routing_key is None else routing_key

    def _delivery(self, headers: Mapping[str, str]) -> _Delivery:
        raw = headers.get(PROPERTIES)
        properties = None
        if raw is not None:
            properties = self._properties.get(raw)
            if properties is None:
                properties = base64.b64decode(raw)
        entry = (
            headers,
            properties,
            headers.get(PAYLOAD_ENCODING) == BASE64,
            headers.get(EXCHANGE),
            headers.get(ROUTING_KEY),
        )
        if len(self._deliveries) >= _CACHE_MAX:
            self._deliveries.clear()
        self._deliveries[id(headers)] = entry
        return entry

    @staticmethod
    def origin(headers: Mapping[str, str], queue: str) -> tuple[str, str]:
        """(exchange, routing key) a message was published with, for basic.deliver."""
        exchange = headers.get(EXCHANGE)
        if exchange is None:
            return "", queue
        return exchange, headers.get(ROUTING_KEY, queue)
