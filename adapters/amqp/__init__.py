"""AMQP 0-9-1 adapter (docs/amqp.md).

* :mod:`adapters.amqp.codec` -- :class:`FrameParser` (bytes -> :class:`ProtocolHeader`,
  :class:`MethodFrame` with a pamqp command, :class:`HeaderFrame` with raw properties,
  :class:`BodyFrame`, :class:`Heartbeat`), raising only :class:`AmqpError`; the ``encode_*``
  functions (hand-written for deliver / get-ok / return / confirms, pamqp for cold methods);
  field tables and basic properties.

* :mod:`adapters.amqp.connection` -- the transport, the connection state machine and the
  method handlers; :mod:`adapters.amqp.channel` -- consumers, delivery tags, confirms, tx.
* :mod:`adapters.amqp.server` -- listener, queue arguments, routing, dead-lettering, auth;
  :mod:`adapters.amqp.mapping` -- AMQP messages <-> core messages.
"""

from vibemq_server.adapters.amqp.codec import (
    EMPTY_PROPERTIES,
    FRAME_MIN_SIZE,
    HEARTBEAT,
    PROTOCOL_HEADER,
    AmqpError,
    BodyFrame,
    Frame,
    FrameParser,
    HeaderFrame,
    Heartbeat,
    MethodFrame,
    ProtocolHeader,
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

__all__ = [
    "EMPTY_PROPERTIES",
    "FRAME_MIN_SIZE",
    "HEARTBEAT",
    "PROTOCOL_HEADER",
    "AmqpError",
    "BodyFrame",
    "Frame",
    "FrameParser",
    "HeaderFrame",
    "Heartbeat",
    "MethodFrame",
    "ProtocolHeader",
    "ReplyCode",
    "decode_properties",
    "decode_table",
    "encode_ack",
    "encode_content",
    "encode_deliver",
    "encode_get_ok",
    "encode_method",
    "encode_nack",
    "encode_properties",
    "encode_return",
    "encode_table",
]
