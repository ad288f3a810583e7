"""The VibeMQ v1 wire protocol: a pure codec and its error type."""

from vibemq_server.protocol.codec import (
    CommandType,
    FrameDecoder,
    Limits,
    Message,
    decode_body,
    encode,
    encode_body,
    validate_json,
)
from vibemq_server.protocol.errors import ErrorCode, ProtocolError

__all__ = [
    "CommandType",
    "ErrorCode",
    "FrameDecoder",
    "Limits",
    "Message",
    "ProtocolError",
    "decode_body",
    "encode",
    "encode_body",
    "validate_json",
]
