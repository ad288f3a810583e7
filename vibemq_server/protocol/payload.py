"""How a payload of arbitrary bytes travels in the VibeMQ protocol, whose payloads are JSON.

Bytes published over a byte-oriented protocol (MQTT, ZeroMQ, AMQP) keep their exact value:
when they are a UTF-8 JSON text (or empty) they are the payload as they are; otherwise the
payload is a JSON string holding their base64 and the header ``payloadEncoding: base64``
says so. :func:`from_core` gives the original bytes back; the client library offers the same
as ``ReceivedMessage.payload_bytes``. See docs/mqtt.md.

A multipart (ZeroMQ) message is one payload too: the RFC 50/MME encoding of its parts, as
base64, with ``contentType: application/x-zmq-mme`` (:func:`multipart_to_core`,
:func:`multipart_from_core`; docs/zmq.md).
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Iterable, Mapping

from vibemq_server.protocol import mme
from vibemq_server.protocol.codec import validate_json
from vibemq_server.protocol.errors import ProtocolError
from vibemq_server.protocol.mme import CONTENT_TYPE, MME_CONTENT_TYPE

_b2a = binascii.b2a_base64
_a2b = binascii.a2b_base64

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
    # binascii directly: base64.b64encode's wrapper costs more than the encoding of a
    # small body (this runs for every non-JSON message an AMQP or MQTT client publishes).
    return b'"' + _b2a(payload, newline=False) + b'"', BASE64


def from_core(payload: bytes, headers: Mapping[str, str]) -> bytes:
    """The original bytes of a VibeMQ payload (undoing :func:`to_core`)."""
    if headers.get(PAYLOAD_ENCODING) != BASE64:
        return payload
    text = payload.strip()
    if len(text) < 2 or text[:1] != b'"' or text[-1:] != b'"':
        return payload  # a VibeMQ publisher set the header on something else: keep it
    try:
        # Strict mode accepts a subset of what b64decode(validate=True) does, with the same
        # result, at a fraction of the cost; anything it refuses takes the general path.
        return _a2b(text[1:-1], strict_mode=True)
    except (binascii.Error, ValueError):
        pass
    try:
        return base64.b64decode(text[1:-1], validate=True)
    except (binascii.Error, ValueError):
        return payload


# -- multipart (ZeroMQ) messages -------------------------------------------------------------------

#: Headers of a multipart message in the core: its payload is the base64 of an RFC 50/MME
#: encoding of the parts (always base64, even when the encoding happens to be JSON text, so a
#: VibeMQ consumer always finds a string). Shared and read-only.
MULTIPART_HEADERS: Mapping[str, str] = {
    CONTENT_TYPE: MME_CONTENT_TYPE,
    PAYLOAD_ENCODING: BASE64,
}


def multipart_to_core(parts: Iterable[bytes | bytearray | memoryview]) -> bytes:
    """The VibeMQ payload carrying ``parts``; its headers are :data:`MULTIPART_HEADERS`.
    ``MmeError`` when a part is over 4 GiB."""
    return mme_to_core(mme.encode(parts))


def mme_to_core(body: bytes) -> bytes:
    """The VibeMQ payload carrying an MME ``body`` already encoded."""
    return b'"' + base64.b64encode(body) + b'"'


def is_multipart(headers: Mapping[str, str]) -> bool:
    return headers.get(CONTENT_TYPE) == MME_CONTENT_TYPE


def multipart_from_core(payload: bytes, headers: Mapping[str, str]) -> list[bytes]:
    """The parts of a message: those of its MME body when its ``contentType`` says so, else
    its original bytes as the one part. ``MmeError`` when an MME body is malformed."""
    body = from_core(payload, headers)
    if is_multipart(headers):
        return mme.decode(body)
    return [body]
