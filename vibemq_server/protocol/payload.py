"""How a payload of arbitrary bytes travels in the VibeMQ protocol, whose payloads are JSON.

Bytes published over a byte-oriented protocol (MQTT, ZeroMQ, AMQP) keep their exact value:
when they are a UTF-8 JSON text (or empty) they are the payload as they are; otherwise the
payload is a JSON string holding their base64 and the header ``payloadEncoding: base64``
says so. :func:`from_core` gives the original bytes back; the client library offers the same
as ``ReceivedMessage.payload_bytes``. See docs/mqtt.md.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping

from vibemq_server.protocol.codec import validate_json
from vibemq_server.protocol.errors import ProtocolError

PAYLOAD_ENCODING = "payloadEncoding"
BASE64 = "base64"


#: Bytes a JSON text can start with (after whitespace): anything else is not JSON, and
#: saying so early spares the two parsers (and their exceptions) for binary payloads.
_JSON_STARTS = frozenset(b'{["-0123456789tfn \t\r\n')


def is_json(payload: bytes) -> bool:
    if payload and payload[0] not in _JSON_STARTS:
        return False
    try:
        validate_json(payload)
    except ProtocolError:
        return False
    return True


def to_core(payload: bytes) -> tuple[bytes, str | None]:
    """The VibeMQ payload for ``payload`` and its ``payloadEncoding`` (None: as is)."""
    if is_json(payload):
        return payload, None
    return b'"' + base64.b64encode(payload) + b'"', BASE64


def from_core(payload: bytes, headers: Mapping[str, str]) -> bytes:
    """The original bytes of a VibeMQ payload (undoing :func:`to_core`)."""
    if headers.get(PAYLOAD_ENCODING) != BASE64:
        return payload
    text = payload.strip()
    if len(text) < 2 or text[:1] != b'"' or text[-1:] != b'"':
        return payload  # a VibeMQ publisher set the header on something else: keep it
    try:
        return base64.b64decode(text[1:-1], validate=True)
    except (binascii.Error, ValueError):
        return payload
