"""AMQP 0-9-1 adapter (docs/amqp.md).

* :mod:`adapters.amqp.codec` -- :class:`FrameParser` (bytes -> :class:`ProtocolHeader`,
  :class:`MethodFrame` with a pamqp command, :class:`HeaderFrame` with raw properties,
  :class:`BodyFrame`, :class:`Heartbeat`), raising only :class:`AmqpError`; the ``encode_*``
  functions (hand-written for deliver / get-ok / return / confirms, pamqp for cold methods);
  field tables and basic properties.

* :mod:`adapters.amqp.connection` -- ``AmqpConnection``, the sans-IO session of one
  connection (the transport's ``Session``, over a ``Link``): frames in, dispatch by state
  and handler tables, errors onto connection.close / channel.close, timers;
  :mod:`adapters.amqp.states` -- the connection's and the channels' state tables;
  :mod:`adapters.amqp.base` -- a connection's state, its shared helpers and ``Server`` (what
  it uses of the broker); the handlers: :mod:`adapters.amqp.handshake` (channel 0),
  :mod:`adapters.amqp.declarations` (exchange.*, queue.*), :mod:`adapters.amqp.basic`
  (basic.*, confirm.*, tx.*); :mod:`adapters.amqp.channel` -- consumers, delivery tags,
  content assembly, acks.
* :mod:`adapters.amqp.server` -- listener (the shared ``StreamTransport``), queue arguments,
  routing, dead-lettering, auth; :mod:`adapters.amqp.mapping` -- AMQP messages <-> core
  messages.
"""

from vibemq_server.adapters.amqp.codec import (
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
    PublishHead,
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

__all__ = [
    "EMPTY_PROPERTIES",
    "FRAME_MIN_SIZE",
    "HEARTBEAT",
    "PROTOCOL_HEADER",
    "AmqpError",
    "BodyFrame",
    "DeliverEncoder",
    "Frame",
    "FrameParser",
    "GetOkEncoder",
    "HeaderFrame",
    "Heartbeat",
    "MethodFrame",
    "ProtocolHeader",
    "PublishHead",
    "PublishTriple",
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
