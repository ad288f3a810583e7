"""How a payload of arbitrary bytes travels in the VibeMQ protocol, whose payloads are JSON.

Bytes published over a byte-oriented protocol (MQTT, ZeroMQ, AMQP) enter the core as they
are, marked ``payloadEncoding: raw`` (:func:`to_core`): no JSON check, no base64, so an AMQP or
MQTT consumer gets them back (:func:`from_core`) at no cost. Only where the VibeMQ form is
needed -- a VibeMQ consumer's Deliver, the journal record -- :func:`as_vibemq` converts them,
once per use: a UTF-8 JSON text (or empty) is the payload as it is; anything else becomes a JSON
string holding its base64 with the header ``payloadEncoding: base64``. :func:`from_core` gives
the original bytes back from either form; the client library offers the same as
``ReceivedMessage.payload_bytes``. See docs/mqtt.md.

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
#: the payload is a byte protocol's bytes as they came (never seen by a VibeMQ client)
RAW = "raw"


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


def to_core(payload: bytes) -> tuple[bytes, str]:
    """The core payload for a byte protocol's ``payload`` and its ``payloadEncoding``: the
    bytes as they are, marked :data:`RAW` (converted lazily by :func:`as_vibemq`)."""
    return payload, RAW


def to_vibemq(payload: bytes) -> tuple[bytes, str | None]:
    """The VibeMQ payload for ``payload`` and its ``payloadEncoding`` (None: as is)."""
    if is_json(payload):
        return payload, None
    # binascii directly: base64.b64encode's wrapper costs more than the encoding of a
    # small body (this runs for every non-JSON message an AMQP or MQTT client publishes).
    return b'"' + _b2a(payload, newline=False) + b'"', BASE64


#: The journal's record of a raw message holds its VibeMQ form (what recovery and the Spark
#: readers have always read) plus this header, so that recovery gives back the raw form.
JOURNAL_RAW = "payloadRaw"

#: Forms of a raw message's headers by id(headers): (the headers, as JSON, as base64, as JSON
#: in the journal, as base64 in the journal). Adapters share one headers dict among similar
#: messages, so the converted dicts are shared too.
_Forms = tuple[
    Mapping[str, str], Mapping[str, str], Mapping[str, str], Mapping[str, str], Mapping[str, str]
]
_FORMS: dict[int, _Forms] = {}
_FORMS_MAX = 1024
_JSON, _B64, _JOURNAL_JSON, _JOURNAL_B64 = 1, 2, 3, 4


def as_vibemq(payload: bytes, headers: Mapping[str, str]) -> tuple[bytes, Mapping[str, str]]:
    """The VibeMQ form (payload, headers) of a core message: a :data:`RAW` one converted by
    :func:`to_vibemq` (a multipart one always as base64), anything else as it is. Computed
    per call (no cache on the stored message: the core stays protocol-free and compact),
    except that the last result is kept: a message fanned out to several durable queues or
    VibeMQ consumers is converted once for all of them (the same payload object)."""
    if headers.get(PAYLOAD_ENCODING) != RAW:
        return payload, headers
    body, b64, forms = _convert(payload, headers)
    return body, forms[_B64 if b64 else _JSON]


def to_journal(payload: bytes, headers: Mapping[str, str]) -> tuple[bytes, Mapping[str, str]]:
    """The (payload, headers) a journal record holds: :func:`as_vibemq`'s form, plus
    :data:`JOURNAL_RAW` for a raw message (undone by :func:`from_journal`)."""
    if headers.get(PAYLOAD_ENCODING) != RAW:
        return payload, headers
    body, b64, forms = _convert(payload, headers)
    return body, forms[_JOURNAL_B64 if b64 else _JOURNAL_JSON]


def from_journal(payload: bytes, headers: Mapping[str, str]) -> tuple[bytes, Mapping[str, str]]:
    """The message a journal record stored: a raw one (:data:`JOURNAL_RAW`) as it was."""
    if JOURNAL_RAW not in headers:
        return payload, headers
    raw = from_core(payload, headers)
    restored = {k: v for k, v in headers.items() if k != JOURNAL_RAW}
    restored[PAYLOAD_ENCODING] = RAW
    return raw, restored


def _convert(payload: bytes, headers: Mapping[str, str]) -> tuple[bytes, bool, _Forms]:
    """(VibeMQ payload, whether it is base64, the headers' forms) of a raw message."""
    if _LAST:
        last_payload, last_headers, last_out = _LAST[0]
        if last_payload is payload and last_headers is headers:
            return last_out
    forms = _FORMS.get(id(headers))
    if forms is None or forms[0] is not headers:
        forms = _forms(headers)
    if is_multipart(headers):
        out = mme_to_core(payload), True, forms
    else:
        body, encoding = to_vibemq(payload)
        out = body, encoding is not None, forms
    # Kept only when small: the memo pins the payload and its base64 until the next one.
    _LAST[:] = [(payload, headers, out)] if len(payload) <= _MEMO_MAX else []
    return out


#: (payload, headers, their conversion) of the last raw message converted, when its payload
#: is at most _MEMO_MAX bytes
_MEMO_MAX = 1 << 20
_LAST: list[tuple[bytes, Mapping[str, str], tuple[bytes, bool, _Forms]]] = []


def _forms(headers: Mapping[str, str]) -> _Forms:
    plain = {k: v for k, v in headers.items() if k != PAYLOAD_ENCODING}
    b64 = {**plain, PAYLOAD_ENCODING: BASE64}
    forms = (headers, plain, b64, {**plain, JOURNAL_RAW: "1"}, {**b64, JOURNAL_RAW: "1"})
    if len(_FORMS) >= _FORMS_MAX:
        _FORMS.clear()
    _FORMS[id(headers)] = forms
    return forms


def from_core(payload: bytes, headers: Mapping[str, str]) -> bytes:
    """The original bytes of a core payload (undoing :func:`to_vibemq`; a :data:`RAW` one
    is as it is)."""
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

#: Headers of a multipart message in the VibeMQ form: its payload is the base64 of an RFC
#: 50/MME encoding of the parts (always base64, even when the encoding happens to be JSON text,
#: so a VibeMQ consumer always finds a string). Shared and read-only.
MULTIPART_HEADERS: Mapping[str, str] = {
    CONTENT_TYPE: MME_CONTENT_TYPE,
    PAYLOAD_ENCODING: BASE64,
}
#: Headers of a multipart message a byte protocol (ZeroMQ) put in the core: its payload is the
#: MME body itself (:func:`as_vibemq` gives the :data:`MULTIPART_HEADERS` form).
MULTIPART_RAW_HEADERS: Mapping[str, str] = {
    CONTENT_TYPE: MME_CONTENT_TYPE,
    PAYLOAD_ENCODING: RAW,
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
